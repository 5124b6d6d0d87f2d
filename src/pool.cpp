#include "pool.hpp"

#include <cstdlib>
#include <cstring>
#include <new>

namespace ibmsg {

Pool *pool_create(bool recv, uint32_t count, size_t slot_size) {
  Pool *p = new (std::nothrow) Pool();
  if (!p) return nullptr;
  p->recv = recv;
  p->count = count;
  p->slot_size = (slot_size + 63) & ~size_t(63);
  if (p->slot_size == 0) p->slot_size = 64;  // zero-byte maximum: still one line per slot
  p->bytes = p->slot_size * count;
  void *mem = nullptr;
  if (posix_memalign(&mem, 4096, p->bytes) != 0) {
    delete p;
    return nullptr;
  }
  p->mem = static_cast<uint8_t *>(mem);
  p->slots = new (std::nothrow) Slot[count]();
  if (!p->slots) {
    free(p->mem);
    delete p;
    return nullptr;
  }
  for (uint32_t i = 0; i < count; ++i) {
    Slot &s = p->slots[i];
    s.magic = kSlotMagic;
    s.state = SlotState::Free;
    s.pool = p;
    s.buf = p->mem + i * p->slot_size;
    s.msg = recv ? &s.own : nullptr;
    s.own.impl = &s;
    s.own.status = IBMSG_FREED;
    s.work.wr.op = recv ? tp::Op::Recv : tp::Op::Send;
    s.work.wr.owner = &s;
    s.in.wr.owner = &s;
    s.in.fin_wr.owner = &s;
    if (!recv) p->free_list.push_back(&s);
  }
  return p;
}

void pool_destroy(Pool *p) {
  if (!p) return;
  for (uint32_t i = 0; i < p->count; ++i) p->slots[i].magic = 0;
  delete[] p->slots;
  free(p->mem);
  delete p;
}

Slot *pool_get(Pool *p) {
  Slot *s = p->free_list.pop_front();
  if (!s) return nullptr;
  s->state = SlotState::Allocated;
  ++p->out;
  return s;
}

void pool_put(Pool *p, Slot *s) {
  s->state = SlotState::Free;
  s->msg = nullptr;
  p->free_list.push_front(s);
  --p->out;
}

}  // namespace ibmsg
