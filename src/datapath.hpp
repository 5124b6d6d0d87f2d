// The send path (datapath.cpp).
#pragma once
#include <cstdint>

#include "handles.hpp"
#include "ibmsg.h"
#include "transport/transport.hpp"
#include "wire.hpp"

namespace ibmsg {

void send_on_wc(Socket *s, Slot *slot, const tp::Completion &wc);  // a send's completion
// Posts one message with a data credit; on failure the credits are as before.
int send_now(Socket *s, Slot *slot);
// msg_post's message that goes at once (eager, in its slot's buffer): send_now, then WAITING and
// polled for; a refusal closes the connection (the message stays the application's).
int send_first(Socket *s, Slot *slot);
// msg_post's message that waits (no data credit, or messages before it): queued, WAITING and
// polled for; a credit-only message goes if the credits it waits for need one.
int send_later(Socket *s, Slot *slot);
// A posted message is the library's until message_sent: WAITING, and its connection polls for
// the completion (and the answer). Returns IBMSG_OK.
int send_waiting(Socket *s, Slot *slot);
void notify_front(Socket *s);  // the callbacks of the done work at the front of the flight list
void notify_work(Socket *s, Work *w, int status);  // message_sent, or the operation's done
void flush_sends(Socket *s);  // the queue's head to the QP while it can go; a refusal closes
// w completed with status, and the work before it too: callbacks in order (close_reason: closes
void work_done(Socket *s, Work *w, int status, int close_reason = IBMSG_OK);  // before w's)
bool work_can_go(const Socket *s, const Work *w);  // whether the queue's head could go now
void maybe_send_ctrl(Socket *s);  // a credit-only message, if owed and nothing carries them
// Credits became due (hooks.hpp: ctrl_due): maybe_send_ctrl now outside callbacks, else at the
// end of the round, so that a message the callbacks post (a reply) carries them instead.
void ctrl_due(Socket *s);
// The end of the round for a connection whose credits became due in it (hooks.hpp: ctrl_send):
// they ride on the data message the round queued last, if it has not gone yet; what is still
// due goes as maybe_send_ctrl decides.
void ctrl_round_end(Socket *s);
// Posts a credit-only message carrying what is owed (and whether data waits for credits), a
// Return giving back data credits, or a Keepalive probe; false if it failed (the socket closes).
bool post_ctrl(Socket *s, uint32_t give_back = 0, bool wants = false,
               wire::Opcode op = wire::Opcode::Credit);
// The application closes: the done counts it owes go now, so that the peer's messages it has
// read (and delivered) are confirmed.
void send_last_done(Socket *s);
// Rendezvous, the sender's side: the RTS of slot's message (its work.rndv) into slot->buf (its
// length); the peer read n of our RTSs (an immediate's done count; false if it never had them);
// w was read (IBMSG_OK) or declined; the done counts an immediate carries.
uint32_t rndv_fill_rts(Socket *s, Slot *slot);
bool rndv_on_done(Socket *s, uint32_t n);
void rndv_read_done(Work *w, int status);
uint32_t rndv_done_due(const Socket *s);  // (done_owed goes down once the message is posted)
// One-sided operations in the send queue: posts a queued one (flush_sends); its done callback
// (from work_done, teardown); gives the table entry back and detaches the application's struct.
int op_send_now(Socket *s, Op *op);
void op_finish(Socket *s, Op *op, int status);
ibmsg_op *op_release(Socket *s, Op *op, int status);

}  // namespace ibmsg
