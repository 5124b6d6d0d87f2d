// Receive buffers and the credits they back (recv.cpp).
#pragma once
#include <cstddef>
#include <cstdint>

#include "handles.hpp"
#include "ibmsg.h"
#include "transport/transport.hpp"
#include "wire.hpp"

namespace ibmsg {

constexpr uint32_t kShareBase = 2;  // data credits a connection on shared buffers always has
// The smallest eager size IBMSG_OPT_SHARED_RECV_BUDGET scales a connection's down to.
constexpr uint32_t kMinScaledEager = 1024;
// Buffers registered at once: a slab of about 1 MiB, 4 to 64 buffers.
inline uint32_t slab_count(size_t slot_size) {
  const size_t n = ((size_t(1) << 20) + slot_size - 1) / (slot_size ? slot_size : 1);
  return n < 4 ? 4 : n > 64 ? 64 : uint32_t(n);
}
// Receive buffers of a connection's own or shared by its device (device.hpp, SharedRecv).
size_t msg_slot_size(const Socket *s);  // bytes of a message buffer (eager size, immediate, RTS)
// Before its QP is created: joins the device's shared buffers if it can (caps->srq set), else it
// gets buffers of its own in recv_open, after the QP was created.
void recv_join(Socket *s, tp::QpCaps *caps);
int recv_open(Socket *s);
void recv_leave(Socket *s);  // conn_release, once the CQ was polled
Socket *recv_owner(const Slot *slot);  // the connection of a received message (nullptr: closed)
// The connection a receive completion of slot is for (a shared buffer: by the QP number; one
// whose connection is gone goes back into the shared queue: nullptr).
Socket *recv_route(Slot *slot, uint32_t qp_num);
// A data message took slot: false if the peer had no data credit for it (a protocol violation).
bool recv_arrived(Socket *s, Slot *slot, bool wants);
// Whether credits granted to s's peer now are held back (credits.hpp): completions of the poll
// being handled are still to come (Loop::poll_rest), which arrived before the credits went. They
// count from the poll's end on (recv_grants_release).
bool recv_grants_held(Socket *s);
void recv_grants_release(Loop *loop);  // the poll's completions are handled
// The message that took slot goes to the application (or waits for its rendezvous reads): its
// struct says what it is.
void recv_lend(Socket *s, Slot *slot, uint8_t *data, size_t size, bool has_imm, uint32_t imm);
// The buffer of a data message is free again (s: its connection, nullptr once closed): posted
// again, its credit to the peer that the pool chooses (a connection's own: to its peer).
void recv_back(Socket *s, Slot *slot);
void recv_unlent(Socket *s, Slot *slot);  // the same for a lent one (freed by the application)
void recv_ctrl_back(Socket *s, Slot *slot);  // a control message's buffer: posted again at once
// A message that breaks the protocol, or a failed receive: the buffer is not used, s closes.
void recv_drop(Socket *s, Slot *slot, int reason);
bool recv_given_back(Socket *s, uint32_t n);  // a Return message: false if it had fewer
void recv_wants(Socket *s);  // a credit-only message with the wants bit
void recv_closing(Socket *s);  // it closes: the pool's credits go to the others
void recv_memory(const Device *dev, ibmsg_memory *out);  // its shared buffers
uint32_t eager_recv_size(const Socket *s);  // the largest message its pools take
bool rndv_offered(const Socket *s);         // whether its hello offers rendezvous
// The lent message in slot is a Request (request) or a Reply with trailer tr.
void recv_mark_request(Socket *s, Slot *slot, bool request, const wire::ReqTrailer &tr);

}  // namespace ibmsg
