// Delivery: received messages go to the application in the order they came (message_received),
// an eager one behind a rendezvous still being read waits for it; a reply goes to its request's
// done callback instead, a copy of a request delivered before to its kept answer. And back:
// ibmsg_free_msg gives a message (sent or received) back; a received request freed unanswered
// answers it with nothing.
#include "deliver.hpp"

#include "internal.hpp"
#include "dedup.hpp"
#include "message.hpp"

namespace ibmsg {

namespace {

// A complete message to the application's message_received (or back, without one).
void deliver_app(Socket *s, Slot *slot) {
  ibmsg_buffer *msg = &slot->own;
  ++s->stats.msgs_received;
  s->stats.bytes_received += msg->size;
  if (auto cb = s->loop->pub->message_received) cb(s->pub, msg);
  else msg_free(msg);
}

// A complete request or reply: a reply to its request's done callback (or dropped: late), a
// request to the application unless it is a copy of one delivered before (answered with the
// kept reply, if any).
[[gnu::noinline]] void deliver_req(Socket *s, Slot *slot) {
  if (slot->req.kind == uint8_t(MsgKind::Reply)) {
    req_on_reply(s, slot);
    return;
  }
  if (answer_on_request(s, slot)) deliver_app(s, slot);
}

// One complete message, out of the queue (or never in it): to the application. (Requests and
// replies apart: a plain message's path then saves no registers, and ends in a jump to the
// callback.)
void deliver_one(Socket *s, Slot *slot) {
  if (slot->req.kind != uint8_t(MsgKind::Plain)) deliver_req(s, slot);
  else deliver_app(s, slot);
}

}  // namespace

// Hands the messages at the front of the delivery queue to the application while they are
// complete. A callback may close the connection: what is complete is still delivered (as
// messages that arrive while it closes), the rest goes at the teardown.
void deliver_ready(Socket *s) {
  for (Slot *slot = s->deliver.front(); slot && slot->in.ready; slot = s->deliver.front()) {
    s->deliver.pop_front();
    slot->in.ready = false;
    deliver_one(s, slot);
  }
}

void deliver_msg(Socket *s, Slot *slot) {
  // Nothing before it (no rendezvous being read): it goes at once, without the queue.
  if (s->deliver.empty()) {
    deliver_one(s, slot);
    return;
  }
  slot->in.ready = true;
  s->deliver.push_back(slot);
  deliver_ready(s);
}

int msg_free(ibmsg_buffer *msg) {
  // A request it did not answer: its retries get no answer (before the buffer goes back).
  if (!msg_lent(msg)) return msg_release(msg);  // a message to send, or an error
  answer_on_free(msg->impl);
  return msg_give_back(msg);
}

}  // namespace ibmsg
