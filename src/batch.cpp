// Batching: the work requests a round of the loop posts on a connection go to its QP in one list
// (one doorbell), at the end of the round (LoopEntered) or sooner; what is posted outside the
// loop's callbacks, or to a connection with nothing in flight, goes at once. The received
// messages the round's callbacks freed go back at its end too, before its posts go.
#include "batch.hpp"

#include "internal.hpp"

namespace ibmsg {

void flush_later(Socket *s) {
  if (!s->post_node.linked()) s->loop->unflushed.push_back(s);
}

int posted(Socket *s, bool send_queue) {
  // Outside callbacks nothing would flush it soon; and a send to a connection with nothing in
  // flight goes at once, since batching only adds latency while the wire is idle (as TCP
  // autocorking holds back only while earlier packets wait to go out).
  if (s->loop->depth == 0 || (send_queue && s->tx.flight.empty() && s->tx.ctrl_in_flight == 0))
    return tp::post_flush(s->id);
  flush_later(s);
  return IBMSG_OK;
}

void posts_flush(Loop *loop) {
  // The received messages the round's callbacks freed go back first (the hook: message.cpp):
  // their buffers into the receive queues, their credits onto what the round queued.
  if (!loop->freed.empty()) loop->hooks->freed(loop);
  // A refused list closes its connection: what it carried is canceled with the rest.
  while (Socket *s = loop->unflushed.pop_front()) {
    if (s->tx.ctrl_check) {
      // Credits that became due in the round and that no message of the round carried.
      s->tx.ctrl_check = false;
      loop->hooks->ctrl_send(s);
      loop->unflushed.remove(s);  // (it may have queued itself again: flushed right here)
    }
    if (s->res.has_qp && tp::post_flush(s->id)) socket_close(s, IBMSG_EIO);
  }
}

}  // namespace ibmsg
