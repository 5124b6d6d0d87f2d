// Message pools (pure logic): one block of equal slots (slot.hpp) and their bookkeeping. memory.cpp registers
// pools with a device and hands them to connections; the send/receive path never allocates or
// registers memory.
#pragma once
#include <cstddef>
#include <cstdint>

#include "handles.hpp"  // the core's short names of the private types ibmsg__*
#include "ibmsg.h"
#include "list.hpp"
#include "slot.hpp"
#include "work.hpp"

namespace ibmsg {

struct Pool {
  bool recv;           // receive pool (else send)
  size_t slot_size;    // bytes per slot
  uint32_t count;
  uint32_t out;        // slots the application holds (allocated/queued/in flight or lent)
  uint8_t *mem;
  size_t bytes;
  Slot *slots;
  List<Slot, &Slot::link> free_list;  // send pools only
  // Set by memory.cpp:
  Device *dev;         // owns the pool and its registration
  tp::Mr *mr;
  Socket *user;        // the connection that uses it; nullptr once it closed
  SharedRecv *shared;  // a slab of a device's shared receive buffers (user unused), or nullptr
  SharedSend *sends;   // a slab of a device's send buffers (user unused), or nullptr
  ListNode dev_node;   // in the device's list of pools
  // A failed accept's receive pool, whose flushed receives may still be in a CQ: held (one slot
  // counted out) with the connection's share of that CQ until the loop has polled it.
  DevCq *parked_cq;
  uint32_t parked_need;
};

// nullptr on allocation failure. Memory is page-aligned; slots are slot_size apart (rounded up to
// 64 bytes so each payload starts on a cache line).
Pool *pool_create(bool recv, uint32_t count, size_t slot_size);
void pool_destroy(Pool *p);
// Send pools: takes a free slot (nullptr when all are out) / returns one.
Slot *pool_get(Pool *p);
void pool_put(Pool *p, Slot *s);

}  // namespace ibmsg
