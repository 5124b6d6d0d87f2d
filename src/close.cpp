// The one close path. Whatever closes a socket (ibmsg_disconnect, the peer, an error, a timeout,
// the device going away) calls socket_close(); the teardown then runs from the loop, delivers
// what already completed, cancels the rest, releases everything and calls connection_closed
// exactly once, last.
#include "internal.hpp"

namespace ibmsg {
namespace {

Event close_event(const Socket *s) {
  if (s->close_reason == IBMSG_OK) return Event::Disconnect;
  if (s->close_reason == IBMSG_ECONNRESET && s->state == State::Connected)
    return Event::PeerDisconnected;
  return Event::Failed;
}

void teardown(Socket *s) {
  Loop *loop = s->loop;
  timer_stop(&s->connect_timer);
  // What already completed is delivered (data received, sends confirmed) before anything is
  // canceled; callbacks may run here, and may call the API (posting now fails: closing).
  posts_flush(loop);  // what a callback posted before it closed the socket goes out first
  if (s->cq) drain_device(s->dev);
  if (s->was_connected && s->id) tp::cm_disconnect(s->id);
  conn_release(s, true);  // the pools stay while the canceled messages below are the application's
  cancel_sends(s);
  if (s->id) tp::cm_id_destroy(s->id);
  s->id = nullptr;
  while (Socket *c = s->accepted.pop_front()) c->from_listener = nullptr;
  if (s->from_listener) s->from_listener->accepted.remove(s);
  if (s->dev) device_put(s->dev);
  loop->sockets.remove(s);
  socket_unregister(s);

  ibmsg_socket *pub = s->pub;
  int reason = s->close_reason;
  set_state(s, Event::TornDown);
  pub->close_reason = reason;
  pub->impl = nullptr;
  s->magic = 0;
  delete s;
  // Last: after the callback the application may free pub; nothing here touches it again.
  if (auto cb = loop->pub->connection_closed) cb(pub, reason);
}

}  // namespace

void socket_close(Socket *s, int reason) {
  if (s->state == State::Closing || s->state == State::Closed) return;
  if (reason == IBMSG_OK && s->state == State::Connected && !s->lingering) {
    // The application disconnects: the done counts it owes for the peer's rendezvous messages
    // go first, so that the peer learns they arrived. Without a control credit for them now,
    // the close waits for one (a peer waiting for done counts returns them), at most kLingerS.
    send_last_done(s);
    if (s->state != State::Connected) return;  // a failed post closed it meanwhile
    if (s->done_owed) {
      s->lingering = true;
      s->pub->status = IBMSG_DISCONNECTING;  // as the application sees it: closing
      timer_init(&s->connect_timer, s->loop, on_linger_end, s);
      timer_start(&s->connect_timer, kLingerS);
      return;
    }
  }
  s->close_reason = reason;
  recv_closing(s);
  set_state(s, close_event(s));
  s->loop->closing.push_back(s);
  loop_kick(s->loop);
}

void on_linger_end(Timer *t) { socket_close(static_cast<Socket *>(t->data), IBMSG_OK); }

void run_teardowns(Loop *loop) {
  // A closed callback may close more sockets: they run in this round too.
  while (Socket *s = loop->closing.pop_front()) teardown(s);
}

}  // namespace ibmsg
