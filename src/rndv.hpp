// Rendezvous: messages larger than the eager size (rndv.cpp; how they travel is told there).
#pragma once
#include "handles.hpp"
#include "transport/transport.hpp"
#include <cstddef>
#include <cstdint>

namespace ibmsg {

// A connection's rendezvous reads in flight (with kReadAhead bytes at most: four reads of up to
// a chunk keep a message's reads going; 8 made the send queue outgrow 64: conn.cpp, conn_open).
constexpr uint32_t kRndvReads = 4;
// A read completed: -1 if the connection closes, 1 if its message is complete (the caller
// delivers it: deliver_ready), else 0; then (unless -1) rndv_read_more.
int rndv_on_read(Socket *s, Slot *slot, const tp::Completion &wc);
void rndv_read_more(Socket *s);  // the reads that can go now, and the counts owed
// A slot the rendezvous held (declined, undelivered at a close, or freed by the application)
// goes back: its destination, its region's hold, its receive buffer.
void rndv_drop(Socket *s, Slot *slot);
bool rndv_fin_due(const Socket *s);  // a declined message's FIN is next in order
bool rndv_send_fin(Socket *s);       // sends it (a control credit); false: closing
void rndv_on_fin_sent(Socket *s, Slot *slot, const tp::Completion &wc);
void rndv_pump(Socket *s);  // posts the reads it can (connected)
// Closing, the QP gone: undelivered messages and their destinations go; nothing waits.
void rndv_release(Socket *s);
// A received message's destination goes back (ibmsg_free_msg, or undelivered): its device's cache
// takes it, and the connections waiting for rendezvous memory get their turn.
void rndv_dest_put(Slot *slot);

}  // namespace ibmsg
