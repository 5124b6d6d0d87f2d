// Registered memory: pools belong to a device (its protection domain), which they keep alive;
// a connection borrows its pools and gives them back when it closes. A pool whose slots the
// application still holds outlives its connection until the last slot comes back.
// Large buffers (rendezvous) belong to a device too: mapped and registered when none of their
// size class is free, then kept in the device's cache between messages.
#include "memory.hpp"

#include <sys/mman.h>

#include <initializer_list>
#include <new>

#include "internal.hpp"
#include "largebuf.hpp"

namespace ibmsg {
namespace {

void release(Pool *p) {
  Device *dev = p->dev;
  dev->pools.remove(p);
  slab_destroy(p);
  device_put(dev);
}

size_t piece_count(size_t bytes) { return (bytes + kLargePiece - 1) / kLargePiece; }

void large_release(LargeMem *m) {
  tp::mr_deregister(m->mr);
  if (m->pieces)
    for (size_t i = 0, n = piece_count(m->bytes); i < n; ++i) tp::mr_deregister(m->pieces[i]);
  delete[] m->pieces;
  munmap(m->mem, m->bytes);
  delete m;
}

void release_evicted(LargeList *evicted) {
  while (LargeBuf *b = evicted->pop_front()) large_release(static_cast<LargeMem *>(b));
}

}  // namespace

LargeMem *large_get(Device *dev, bool send, uint64_t peer, size_t size, int *err) {
  LargeCache &cache = send ? dev->large_send : dev->large_recv;
  LargeMem *m = static_cast<LargeMem *>(cache.take(size));
  if (m && send && m->peer != peer) {
    // Another peer may know its key: a new registration (a new key) before this one gets it.
    tp::mr_deregister(m->mr);
    m->mr = nullptr;
    *err = tp::mr_register(dev->tp, m->mem, m->bytes, tp::kRemoteRead, &m->mr);
    if (*err) {
      munmap(m->mem, m->bytes);
      delete m;
      return nullptr;
    }
  }
  if (!m) {
    unsigned index;
    size_t bytes;
    if (!large_class(size, &index, &bytes)) {
      *err = IBMSG_EMSGSIZE;
      return nullptr;
    }
    m = new (std::nothrow) LargeMem();
    // A destination only reserves its address space (no swap either: MAP_NORESERVE); its
    // pages come as the reads fill them.
    const int flags = MAP_PRIVATE | MAP_ANONYMOUS | (send ? 0 : MAP_NORESERVE);
    void *mem = m ? mmap(nullptr, bytes, PROT_READ | PROT_WRITE, flags, -1, 0) : MAP_FAILED;
    if (m && mem != MAP_FAILED && !send) {
      m->pieces = new (std::nothrow) tp::Mr *[piece_count(bytes)]();
      if (!m->pieces) {
        munmap(mem, bytes);
        mem = MAP_FAILED;
      }
    }
    if (mem == MAP_FAILED) {
      delete m;
      *err = IBMSG_ENOMEM;
      return nullptr;
    }
    m->mem = static_cast<uint8_t *>(mem);
    m->bytes = bytes;
    m->index = index;
    m->dev = dev;
    m->send = send;
    m->peer = 0;
    m->mr = nullptr;
    // A sender's has its own registration: the key a peer gets for it reaches this buffer only.
    *err = send ? tp::mr_register(dev->tp, m->mem, bytes, tp::kRemoteRead, &m->mr) : IBMSG_OK;
    if (*err) {
      munmap(m->mem, bytes);
      delete m;
      return nullptr;
    }
  }
  m->peer = peer;
  ++dev->refs;
  dev->large_lent += m->bytes;
  return m;
}

const tp::Mr *large_piece(LargeMem *m, size_t off, size_t *room, int *err) {
  const size_t i = off / kLargePiece, start = i * kLargePiece;
  const size_t len = m->bytes - start < kLargePiece ? m->bytes - start : kLargePiece;
  *room = start + len - off;
  if (!m->pieces[i]) {
    *err = tp::mr_register(m->dev->tp, m->mem + start, len, tp::kLocal, &m->pieces[i]);
    if (*err) return nullptr;
  }
  return m->pieces[i];
}

void large_put(LargeMem *m) {
  Device *dev = m->dev;
  dev->large_lent -= m->bytes;
  LargeList evicted;
  if (dev->removed) evicted.push_back(m);
  else (m->send ? dev->large_send : dev->large_recv).give(m, &evicted);
  release_evicted(&evicted);
  device_put(dev);
}

void device_large_clear(Device *dev) {
  LargeList evicted;
  dev->large_send.clear(&evicted);
  dev->large_recv.clear(&evicted);
  release_evicted(&evicted);
}

Pool *slab_create(Device *dev, bool recv, uint32_t count, size_t slot_size, int *err) {
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
  return p;
}

void slab_destroy(Pool *p) {
  tp::mr_deregister(p->mr);
  pool_destroy(p);
}

Pool *pool_acquire(Device *dev, Socket *user, bool recv, uint32_t count, size_t slot_size, int *err) {
  Pool *p = slab_create(dev, recv, count, slot_size, err);
  if (!p) return nullptr;
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
