// A loop's RDMA devices and the memory they own (device.cpp, cq.cpp, memory.cpp).
#pragma once
#include <ev.h>

#include <cstddef>
#include <cstdint>

#include "ibmsg.h"
#include "largebuf.hpp"
#include "list.hpp"
#include "pool.hpp"
#include "qpmap.hpp"
#include "shared_credits.hpp"
#include "transport/transport.hpp"

struct ibmsg__loop;

namespace ibmsg {

using Loop = ::ibmsg__loop;
constexpr size_t kLargeCacheBytes = size_t(64) << 20;  // free large buffers kept per device

// A device's shared receive buffers of one size (recv.cpp): a shared receive queue that the
// queue pairs of its connections take their receives from, the slabs of registered buffers
// posted to it, and the data credits they back (SharedCredits). Each connection reserves its
// control buffers and its base of data credits when it joins; the rest goes where the traffic
// is. It lives while a connection uses it or a buffer of it is lent, and holds a device
// reference meanwhile. A posted buffer cannot be taken back: it never shrinks while it lives.
struct SharedRecv {
  SharedRecv(uint32_t base, uint32_t cap) : credits(base, cap) {}
  Device *dev = nullptr;
  size_t slot_size = 0;  // of its buffers
  uint32_t cap = 0;      // the most data credits a connection gets (IBMSG_OPT_RECV_DEPTH)
  tp::Srq *srq = nullptr;
  uint32_t max_wr = 0;   // its shared receive queue's size
  uint32_t buffers = 0;  // in its slabs
  uint32_t conns = 0;    // joined
  uint32_t lent = 0;     // buffers holding a message (not posted)
  SharedCredits credits;
  QpMap<::ibmsg__socket> by_qp;  // its connections by queue pair number
  // The connection the last receive went to (a stream or a ping-pong: the next one goes there
  // too): by_qp is asked only when another QP's message comes. Cleared when it leaves.
  uint32_t last_qp = 0;
  ::ibmsg__socket *last_sock = nullptr;
  List<Pool, &Pool::dev_node> slabs;
  ListNode node;  // in the device's list
};

// A device's send buffers of one size (send_slots.cpp): slabs of registered slots, taken by its
// connections' messages and given back when the application frees them.
struct SharedSend {
  Device *dev = nullptr;
  size_t slot_size = 0;
  uint32_t conns = 0;  // connections that take slots from it
  uint32_t out = 0;    // slots allocated
  size_t bytes = 0;    // of its slabs
  List<Slot, &Slot::link> free;
  List<Pool, &Pool::dev_node> slabs;
  ListNode node;  // in the device's list
};

struct DevCq {  // a completion queue of a device's connections on one loop (cq.cpp)
  tp::Cq *cq;
  uint32_t size, need;  // completions it holds; its connections' work requests together
  bool dead;            // a poll or an arm failed: not polled, armed or joined again
  ListNode node;
};
// An RDMA device as one loop uses it. Every connection on it and every pool registered on it
// holds a reference; at zero the device is released (from the loop): an idle program holds none.
struct Device {
  Loop *loop;
  tp::DeviceKey key;
  tp::Device *tp;
  ev_io watcher;
  int refs;
  bool removed;  // the device went away (a CM event said so) or its channel failed
  ListNode node;                        // in the loop's devices
  List<Pool, &Pool::dev_node> pools;    // registered on this device
  List<SharedRecv, &SharedRecv::node> shared;  // shared receive buffers, by size
  List<SharedSend, &SharedSend::node> sends;   // send buffers, by size
  List<DevCq, &DevCq::node> cqs;  // shared by its connections; another when they are full
  int polling;  // its connections with poll_active: the CQs are polled, not armed
  bool rearm;   // polling stopped outside the poller: arm and drain from the loop
  int parked;   // its pools in Pool::parked_cq: released after the loop polled the CQs
  // Free large buffers (memory.cpp), registered: a peer may read the senders' ones; the
  // destinations of rendezvous reads are local only. Lent ones hold a device reference.
  LargeCache large_send{kLargeCacheBytes};
  LargeCache large_recv{kLargeCacheBytes};
  size_t large_lent = 0;  // bytes of the large buffers in use
};
Device *device_get(Loop *loop, tp::DeviceKey key, int *err);  // takes a reference
void device_put(Device *dev);

}  // namespace ibmsg
