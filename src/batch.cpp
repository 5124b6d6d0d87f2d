// Batching: the work requests a round of the loop posts on a connection go to its QP in one list
// (one doorbell), at the end of the round (LoopEntered) or sooner; what is posted outside the
// loop's callbacks, or to a connection with nothing in flight, goes at once.
#include "batch.hpp"

#include "internal.hpp"

namespace ibmsg {

void flush_later(Socket *s) {
  if (!s->post_node.linked()) s->loop->unflushed.push_back(s);
}

int posted(Socket *s, bool send_queue) {
  // Outside callbacks nothing would flush it soon; and a send to a connection with nothing in
  // flight goes at once, since batching only adds latency while the wire is idle (as TCP
  // autocorking holds back only while earlier packets wait to go out). Inside message_received
  // it goes when the callback returns: the request the callback frees after posting its reply
  // is back in the receive queue, and its credit in the reply, before the reply goes.
  if (s->loop->depth == 0) return tp::post_flush(s->id);
  if (send_queue && s->tx.flight.empty() && s->tx.ctrl_in_flight == 0) {
    if (!s->tx.holding) return tp::post_flush(s->id);
    s->tx.held = true;
  }
  flush_later(s);
  return IBMSG_OK;
}

void flush_now(Socket *s) {
  Loop *loop = s->loop;
  loop->unflushed.remove(s);
  if (s->tx.ctrl_check) {
    // Credits that became due in the round and that no message of the round carried.
    s->tx.ctrl_check = false;
    loop->hooks->ctrl_send(s);
    loop->unflushed.remove(s);  // (it may have queued itself again: flushed right here)
  }
  // A refused list closes its connection: what it carried is canceled with the rest.
  if (s->res.has_qp && tp::post_flush(s->id)) socket_close(s, IBMSG_EIO);
}

void posts_flush(Loop *loop) {
  while (Socket *s = loop->unflushed.front()) flush_now(s);
}

}  // namespace ibmsg
