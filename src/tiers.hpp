// The tiers of src/: each file calls only files of its own tier or of the tiers below it.
// test/layers/check reads the "tier" lines below and checks them against the call graph of the
// built objects (nm): no call from a lower tier to a higher one, no call cycle across more than
// 4 files, and at most 4 pairs of files that call each other (today: one, datapath <-> rndv: a
// FIN goes in the turn of a control message, and the reads behind it follow). Where a lower tier
// must tell a higher one something, it returns a status or calls through the hooks the loop
// registers (hooks.hpp) -- never a higher function by name. HACKING.md's source layout names
// the same files.
//
// tier 6 api: api
// tier 5 loop: loop
// tier 4 lifecycle: setup pace spread cm keepalive close violations conn
// tier 3 engine: completion rdma inbound deliver requests dedup message incoming rndv datapath
// tier 2 resources: device_release usage device cq memory send_slots recv region poll timer batch wake handover internal
// tier 1 transport: transport/cm transport/device transport/hoptrace transport/qp transport/srq transport/transport transport/verbs
// tier 0 pure: away wire state credits shared_credits pool largebuf list qpmap deadlines errors log options rndv_memory hooks handles slot work tiers
//
// api         every extern "C" entry point: checks the handles and arguments, calls the core
// loop        the libev loop: CM channel, idle work, foreign-loop fd and timeout; registers the hooks
// setup       listen / connect / accept / reject (the application's side of set-up)
// pace        connects under way at once (IBMSG_OPT_CONNECT_LIMIT), the others wait their turn
// spread      connections accepted onto other loops (ibmsg_accept_on, ibmsg_listen_spread)
// cm          connection-manager events, the hello, establishment, connect timeouts
// keepalive   probes of a silent peer, and closing a dead one
// close       the one close path (close_begin) and the teardown (run_teardowns)
// violations  peers' remote access violations: counted, logged, their addresses banned a while
// conn        a connection's resources and parameters (QP, CQ share, buffers, hello), its state
//             changes, the registry of open sockets
// completion  where completions come from (channel, busy poller, drains) and where each goes
// rdma        one-sided operations: checks and queueing; their completions
// inbound     what arrives: data, credit-only, Return, keepalive, RTS and FIN messages
// deliver     received messages to the application in order; ibmsg_free_msg's answer
// requests    the requester's side of requests and replies (timeouts, retries)
// dedup       the responder's side: kept answers, copies of requests
// message     ibmsg_alloc_msg / ibmsg_post_send / giving a message back
// incoming    message_incoming's choice for a large message (region, decline, the cap)
// rndv        rendezvous, the receiver's side: reads, destinations, FINs
// datapath    the send path: queue, in flight, credits on the wire, the RTS, completion order
// device_release  releasing unused devices; rescans after a removed one
// usage       what memory a connection or a loop holds (ibmsg_*_memory)
// device      a loop's devices, reference-counted, and their completion channels
// cq          a device's completion queues, shared by its connections
// memory      registered pools and large buffers, owned by a device
// send_slots  send buffers: slots of the device's slabs
// recv        receive buffers (a connection's own or the shared queue's) and their credits
// region      application memory regions, their registrations, grants and windows
// poll        busy polling, the connections' side (activity, stop)
// timer       per-socket deadlines on the loop
// batch       work requests posted now or at the end of the loop's round
// wake        the loop's idle work and the fd set for foreign loops
// handover    calls other threads hand the loop (ibmsg_event_loop_call): a locked list, an eventfd
// internal    the shared handles: socket, loop, options set, connection request
// transport/  the only code that calls rdma-core: transport.hpp (the interface), cm (librdmacm),
//             device (protection domain, completion channel and queues, registrations, windows),
//             qp (queue pairs and work requests), srq (shared receive queues), verbs (theirs),
//             hoptrace (times of doorbells and completions, in a diagnostic build only)
// pure: away (a listener's count of its connections on other loops, shared across threads, and
// its spread), wire (the protocol's encodings), state (the socket state table), credits and
// shared_credits (flow control), pool, largebuf, list, qpmap, deadlines, errors, log, options,
// rndv_memory (the loop's cap on rendezvous buffers), hooks, handles, slot (a message buffer
// slot, by concern), work (what a work request carries), tiers (this map)
#pragma once
