// Registered pools and large buffers, owned by a device (memory.cpp).
#pragma once
#include <cstddef>
#include <cstdint>

#include "handles.hpp"
#include "largebuf.hpp"
#include "transport/transport.hpp"

namespace ibmsg {

// A slab: count slots of slot_size bytes (a receive pool if recv), registered on dev for local
// access, in no list (its owner keeps it); nullptr with *err. slab_destroy deregisters and frees.
Pool *slab_create(Device *dev, bool recv, uint32_t count, size_t slot_size, int *err);
void slab_destroy(Pool *p);
// count slots of slot_size bytes, registered on dev for local access, lent to user.
Pool *pool_acquire(Device *dev, Socket *user, bool recv, uint32_t count, size_t slot_size, int *err);
// The user closed: slots it still posted are free again; the pool goes once no slot is out.
void pool_disown(Pool *p);
// A slot came back from the application (p->out dropped): frees an orphaned pool at zero.
void pool_maybe_release(Pool *p);
// A large buffer of at least size bytes (from the device's cache, else mapped and registered
// now), or nullptr with *err. A sender's is readable by the peer of the connection numbered peer
// (Socket::serial): given to another connection, it is registered anew, so that the key an
// earlier peer learned no longer reaches it.
// A destination of rendezvous reads (not send) is registered in pieces of kLargePiece bytes, each
// when the first read into it is posted (large_piece): its address space is reserved at once,
// but memory is pinned only as far as the peer's data has been read, so a peer that announces
// a large message with a key that does not work costs one piece, and no step registers more
// than a piece.
constexpr size_t kLargePiece = size_t(4) << 20;
struct LargeMem : LargeBuf {
  Device *dev = nullptr;
  bool send = false;
  uint64_t peer = 0;  // the connection whose peer may know its key (send)
  uint8_t *mem = nullptr;
  tp::Mr *mr = nullptr;       // send: the whole buffer's registration
  tp::Mr **pieces = nullptr;  // recv: each piece's (nullptr while none was needed)
};
LargeMem *large_get(Device *dev, bool send, uint64_t peer, size_t size, int *err);
// The registration of the piece of a destination m (not send) that holds byte off, made now if
// there is none yet, and in *room the bytes from off to the piece's end; nullptr with *err.
const tp::Mr *large_piece(LargeMem *m, size_t off, size_t *room, int *err);
void large_put(LargeMem *m);          // back to its device's cache (or released)
void device_large_clear(Device *dev);  // releases the cached ones (the device goes)

}  // namespace ibmsg
