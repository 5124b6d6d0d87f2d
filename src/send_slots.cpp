// Send buffers: slots of a device's slabs, one list per slot size, shared by the device's
// connections. A connection takes a slot per message it allocates (at most IBMSG_OPT_SEND_DEPTH
// at once) and the slot goes back to the device when the application frees the message, so an
// idle connection holds none. Slabs are registered once and kept while the device's connections
// use them or a message of them is allocated; the list goes with the last of them.
#include "send_slots.hpp"

#include <new>

#include "internal.hpp"
#include "memory.hpp"
#include "recv.hpp"

namespace ibmsg {
namespace {

void send_maybe_destroy(SharedSend *p) {
  if (p->conns || p->out) return;
  Device *dev = p->dev;
  dev->sends.remove(p);
  while (Pool *slab = p->slabs.pop_front()) slab_destroy(slab);
  delete p;
  device_put(dev);
}

// Another slab of free slots; false if it cannot be had.
bool send_grow(SharedSend *p) {
  int err = IBMSG_OK;
  Pool *slab = slab_create(p->dev, false, slab_count(p->slot_size), p->slot_size, &err);
  if (!slab) return false;
  slab->sends = p;
  while (Slot *s = slab->free_list.pop_front()) p->free.push_back(s);
  p->slabs.push_back(slab);
  p->bytes += slab->bytes;
  return true;
}

}  // namespace

int send_join(Socket *s) {
  Device *dev = s->dev;
  const size_t size = (msg_slot_size(s) + 63) & ~size_t(63);
  SharedSend *p = dev->sends.front();
  while (p && p->slot_size != size) p = dev->sends.next(p);
  if (!p) {
    p = new (std::nothrow) SharedSend();
    if (!p) return IBMSG_ENOMEM;
    p->dev = dev;
    p->slot_size = size;
    ++dev->refs;
    dev->sends.push_back(p);
  }
  ++p->conns;
  s->sendbuf.shared = p;
  return IBMSG_OK;
}

void send_leave(Socket *s) {
  SharedSend *p = s->sendbuf.shared;
  if (!p) return;
  // Its messages the application still holds belong to no connection now. (out counts the
  // slots that name it: without any, the walk over every slab of the device is skipped, which
  // made closing n connections cost n^2 at thousands of them.)
  for (Pool *slab = p->slabs.front(); s->sendbuf.out && slab; slab = p->slabs.next(slab))
    for (uint32_t i = 0; i < slab->count; ++i)
      if (slab->slots[i].sock == s) slab->slots[i].sock = nullptr;
  s->sendbuf.shared = nullptr;
  s->sendbuf.out = 0;
  --p->conns;
  send_maybe_destroy(p);
}

Slot *send_get(Socket *s, int *err) {
  SharedSend *p = s->sendbuf.shared;
  if (!p || s->sendbuf.out >= uint32_t(s->opts.send_depth)) {
    *err = IBMSG_EAGAIN;
    return nullptr;
  }
  if (p->free.empty() && !send_grow(p)) {
    *err = IBMSG_ENOMEM;
    return nullptr;
  }
  Slot *slot = p->free.pop_front();
  slot->state = SlotState::Allocated;
  slot->sock = s;
  ++s->sendbuf.out;
  ++p->out;
  return slot;
}

void send_put(Slot *slot) {
  SharedSend *p = slot->pool->sends;
  if (Socket *s = slot->sock) --s->sendbuf.out;
  slot->sock = nullptr;
  slot->state = SlotState::Free;
  slot->msg = nullptr;
  p->free.push_front(slot);
  --p->out;
  send_maybe_destroy(p);
}

void send_free(Slot *slot) {
  if (slot->large) large_put(slot->large);
  if (slot->src.region) --slot->src.region->busy;  // the application's region, free again
  slot->large = nullptr;
  slot->src.region = nullptr;
  send_put(slot);
}

void send_memory(const Device *dev, ibmsg_memory *out) {
  for (const SharedSend *p = dev->sends.front(); p; p = dev->sends.next(p)) out->buffers += p->bytes;
}

}  // namespace ibmsg
