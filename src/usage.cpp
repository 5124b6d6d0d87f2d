// What memory a connection or a loop holds (ibmsg_socket_memory, ibmsg_loop_memory): read from
// the device's pools, shared buffers and large-buffer caches; it changes nothing.
#include "usage.hpp"

#include "internal.hpp"
#include "memory.hpp"
#include "recv.hpp"
#include "send_slots.hpp"

namespace ibmsg {

void memory_of_socket(const Socket *s, ibmsg_memory *out) {
  *out = ibmsg_memory{};
  if (const Pool *p = s->rx.pool) {
    out->buffers += p->bytes;
    for (uint32_t i = 0; i < p->count; ++i)
      if (const LargeMem *m = p->slots[i].large) out->large += m->bytes;
  }
  // Its messages: send buffers it holds, and the large buffers of theirs.
  if (const SharedSend *ss = s->sendbuf.shared) {
    out->buffers += size_t(s->sendbuf.out) * ss->slot_size;
    for (const Pool *p = ss->slabs.front(); p; p = ss->slabs.next(p))
      for (uint32_t i = 0; i < p->count; ++i)
        if (p->slots[i].sock == s && p->slots[i].large) out->large += p->slots[i].large->bytes;
  }
  if (const SharedRecv *r = s->rx.shared)  // received rendezvous messages' destinations
    for (const Pool *p = r->slabs.front(); p; p = r->slabs.next(p))
      for (uint32_t i = 0; i < p->count; ++i)
        if (p->slots[i].sock == s && p->slots[i].large) out->large += p->slots[i].large->bytes;
  // Its part of the device's shared receive buffers: reserved for its peer's messages (credits
  // and control buffers) or holding them.
  if (const SharedRecv *r = s->rx.shared)
    out->shared = (size_t(s->rx.share.total()) + kCtrlDepth + s->tx.credits.held()) * r->slot_size;
}

void memory_of_loop(const Loop *loop, ibmsg_memory *out) {
  *out = ibmsg_memory{};
  for (const Device *d = loop->devices.front(); d; d = loop->devices.next(d)) {
    for (const Pool *p = d->pools.front(); p; p = d->pools.next(p)) out->buffers += p->bytes;
    out->shared += d->large_send.bytes() + d->large_recv.bytes();
    recv_memory(d, out);
    send_memory(d, out);
    out->large += d->large_lent;
  }
}

}  // namespace ibmsg
