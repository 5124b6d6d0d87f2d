// Rendezvous: messages larger than the eager size (rndv.cpp; how they travel is told there).
#pragma once
#include <cstddef>
#include <cstdint>

namespace ibmsg {

constexpr uint32_t kRndvReads = 8;  // a connection's rendezvous reads in flight
uint32_t eager_recv_size(const Socket *s);  // the largest message its pools take
bool rndv_offered(const Socket *s);         // whether its hello offers rendezvous
// The RTS of slot's message (its work.rndv) into slot->buf; returns its length.
uint32_t rndv_fill_rts(Socket *s, Slot *slot);
// The peer read n of our RTSs (an immediate's done count); false if it never had them.
bool rndv_on_done(Socket *s, uint32_t n);
// A Rendezvous message arrived: an RTS (a data credit) or a FIN (a control credit).
void rndv_on_msg(Socket *s, Slot *slot, const tp::Completion &wc, const wire::Imm &imm);
void rndv_on_read(Socket *s, Slot *slot, const tp::Completion &wc);
bool rndv_fin_due(const Socket *s);  // a declined message's FIN is next in order
bool rndv_send_fin(Socket *s);       // sends it (a control credit); false: closing
void rndv_on_fin_sent(Socket *s, Slot *slot, const tp::Completion &wc);
void rndv_pump(Socket *s);  // posts the reads it can (connected)
// A received message (slot lent, msg filled in) goes to the application, or waits in order
// behind a rendezvous still being read.
void deliver_msg(Socket *s, Slot *slot);
uint32_t rndv_take_done(Socket *s);  // for an immediate
// Closing, the QP gone: undelivered messages and their destinations go; nothing waits.
void rndv_release(Socket *s);
// A received message's destination goes back (ibmsg_free_msg, or undelivered): its device's cache
// takes it, and the connections waiting for rendezvous memory get their turn.
void rndv_dest_put(Slot *slot);

}  // namespace ibmsg
