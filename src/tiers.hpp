// The tiers of src/: each file calls only files of its own tier or of the tiers below it.
// test/layers/check reads the "tier" lines below and checks them against the call graph of the
// built objects (nm): no call from a lower tier to a higher one, no call cycle across more than
// 4 files, and at most 4 pairs of files that call each other. The README's source layout names
// the same files. Where a lower tier must tell a higher one something, it returns a status or
// calls through the hooks the higher tier registers (hooks.hpp) -- never a higher function by name.
//
// tier 6 api: api
// tier 5 loop: loop
// tier 4 lifecycle: setup cm keepalive requests dedup close violations
// tier 3 engine: datapath inbound message rndv rdma incoming poll
// tier 2 resources: device cq memory send_slots recv region timer
// tier 1 transport: transport/cm transport/device transport/qp transport/srq transport/transport transport/verbs
// tier 0 pure: wire state credits shared_credits pool largebuf list qpmap deadlines errors log options rndv_memory tiers
#pragma once
