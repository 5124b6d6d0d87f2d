// What a work request carries (pure): the core embeds a WorkCtx in the object a work request
// belongs to and the transport (transport/transport.hpp) hands it back in the completion.
#pragma once
#include <cstdint>

namespace ibmsg::tp {

struct Mr;  // a memory registration (the transport's)

// What a work request was for. The core embeds a WorkCtx in the object a work request belongs to
// (a buffer slot, a connection's control context, a one-sided operation) and gets it back in the
// completion; Keepalive is reserved.
enum class Op : uint8_t {
  Recv,        // a receive buffer
  Send,        // a data message
  Ctrl,        // a credit-only message
  RdmaWrite,
  RdmaRead,
  WriteImm,
  Atomic,
  Keepalive,
  RndvRead,    // an RDMA read of a rendezvous message's data (post_rdma, signaled)
  RndvFin,     // a rendezvous FIN (post_send_imm, always signaled)
  Bind,        // a memory window's bind (post_bind, always signaled)
};

struct WorkCtx {
  Op op;
  // Set by post_flush on a signaled data message: the unsignaled credit-only messages before it
  // in its list, whose completion its own stands for (the core zeroes it).
  uint8_t carried;
  void *owner;  // the core's object (a slot, a connection)
};

}  // namespace ibmsg::tp
