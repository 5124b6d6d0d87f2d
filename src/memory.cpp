// Registered memory: pools belong to a device (its protection domain), which they keep alive;
// a connection borrows its pools and gives them back when it closes. A pool whose slots the
// application still holds outlives its connection until the last slot comes back.
#include "internal.hpp"

namespace ibmsg {
namespace {

void release(Pool *p) {
  Device *dev = p->dev;
  dev->pools.remove(p);
  tp::mr_deregister(p->mr);
  pool_destroy(p);
  device_put(dev);
}

}  // namespace

Pool *pool_acquire(Device *dev, Socket *user, bool recv, uint32_t count, size_t slot_size, int *err) {
  Pool *p = pool_create(recv, count, slot_size);
  if (!p) {
    *err = IBMSG_ENOMEM;
    return nullptr;
  }
  *err = tp::mr_register(dev->tp, p->mem, p->bytes, tp::kLocal, &p->mr);
  if (*err) {
    pool_destroy(p);
    return nullptr;
  }
  p->dev = dev;
  p->user = user;
  ++dev->refs;
  dev->pools.push_back(p);
  return p;
}

void pool_disown(Pool *p) {
  if (!p) return;
  p->user = nullptr;
  for (uint32_t i = 0; i < p->count; ++i)
    if (p->slots[i].state == SlotState::Posted) p->slots[i].state = SlotState::Free;
  pool_maybe_release(p);
}

void pool_maybe_release(Pool *p) {
  if (!p->user && p->out == 0) release(p);
}

}  // namespace ibmsg
