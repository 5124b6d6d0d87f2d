// The one close path. Whatever closes a socket (ibmsg_disconnect, the peer, an error, a timeout,
// the device going away) calls socket_close(); the teardown then runs from the loop, delivers
// what already completed, cancels the rest, releases everything and calls connection_closed
// exactly once, last.
#include "close.hpp"

#include <initializer_list>

#include "internal.hpp"
#include "completion.hpp"
#include "conn.hpp"
#include "datapath.hpp"
#include "dedup.hpp"
#include "errors.hpp"
#include "pace.hpp"
#include "recv.hpp"
#include "wake.hpp"

namespace ibmsg {

void cancel_sends(Socket *s) {
  // The peer drops the messages that came behind a rendezvous it has not read (they would
  // overtake it): behind one that is not done, a message is not done either.
  bool gap = false;
  for (auto *list : {&s->tx.flight, &s->tx.queue}) {
    while (Work *w = list->pop_front()) {
      // In flight and completed (waiting for an earlier one): its own status. A rendezvous
      // message the peer read was delivered there (everything before it was), whether or not
      // its own send completion came.
      const bool read = w->rndv && w->read;
      const bool done = list == &s->tx.flight && (w->done || read) &&
                        !(gap && w->wr.op == tp::Op::Send && !read);
      if (w->rndv && !done) gap = true;
      if (read && !w->done) w->status = w->read_status;
      if (w->wr.op != tp::Op::Send && list == &s->tx.flight && !w->done && s->tx.ops_in_flight)
        --s->tx.ops_in_flight;
      notify_work(s, w, done ? w->status : IBMSG_ECANCELED);
    }
  }
}

namespace {

Event close_event(const Socket *s) {
  if (s->close_reason == IBMSG_OK) return Event::Disconnect;
  if (s->close_reason == IBMSG_ECONNRESET &&
      (s->state == State::Connected || s->state == State::Lingering))
    return Event::PeerDisconnected;
  return Event::Failed;
}

void teardown(Socket *s) {
  Loop *loop = s->loop;
  timer_stop(&s->connect_timer);
  keepalive_stop(s);
  // What already completed is delivered (data received, sends confirmed) before anything is
  // canceled; callbacks may run here, and may call the API (posting now fails: closing).
  posts_flush(loop);  // what a callback posted before it closed the socket goes out first
  if (s->res.cq) drain_device(s->dev);
  if (s->was_connected && s->id) tp::cm_disconnect(s->id);
  grants_unbind(s);       // windows bound to the QP go before it (rxe holds the QP for them)
  conn_release(s, true);  // the pools stay while the canceled messages below are the application's
  grants_closed(s);
  cancel_sends(s);
  requests_closed(s, s->close_reason);  // each posted request's done, with the reason
  answers_closed(s);
  if (s->id) tp::cm_id_destroy(s->id);
  s->id = nullptr;
  while (Socket *c = s->accepted.pop_front()) c->from_listener = nullptr;
  if (s->from_listener) s->from_listener->accepted.remove(s);
  away_closed(s->away, s->spread, s->listener);
  if (s->dev) device_put(s->dev);
  loop->sockets.remove(s);
  loop->unflushed.remove(s);  // (a completion handed out above may have queued it: batch.cpp)
  socket_unregister(s);

  ibmsg_socket *pub = s->pub;
  int reason = s->close_reason;
  const ibmsg_stats stats = s->stats;
  set_state(s, Event::TornDown);
  pub->close_reason = reason;
  pub->impl = nullptr;
  s->magic = 0;
  delete s;
  closed_callback(loop, pub, reason, stats);
}

}  // namespace

void closed_callback(Loop *loop, ibmsg_socket *pub, int reason, const ibmsg_stats &stats) {
  // Last: after the callback the application may free pub; nothing here touches it again. During
  // it, ibmsg_socket_stats still reads the connection's counters.
  if (auto cb = loop->pub->connection_closed) {
    const ibmsg_socket *outer = loop->closed_pub;
    const ibmsg_stats outer_stats = loop->closed_stats;
    loop->closed_pub = pub;
    loop->closed_stats = stats;
    cb(pub, reason);
    loop->closed_pub = outer;
    loop->closed_stats = outer_stats;
  }
}

void close_begin(Socket *s, int reason) {
  if (s->state == State::Closing || s->state == State::Closed) return;
  if (reason == IBMSG_OK && s->state == State::Connected) {
    // The application disconnects: the done counts it owes for the peer's rendezvous messages
    // go first, so that the peer learns they arrived. Without a control credit for them now,
    // the close waits for one (a peer waiting for done counts returns them), at most kLingerS.
    send_last_done(s);
    if (s->state != State::Connected) return;  // a failed post closed it meanwhile
    if (s->rndv.done_owed) {
      set_state(s, Event::Linger);  // the application sees it closing
      timer_init(&s->connect_timer, s->loop, on_linger_end, s);
      timer_start(&s->connect_timer, kLingerS);
      return;
    }
  }
  // A peer's access our queue pair refused looks like a reset otherwise.
  const bool violated = reason == IBMSG_ECONNRESET && violation_seen(s);
  if (violated) reason = IBMSG_EREMOTEACCESS;
  s->close_reason = reason;
  pace_done(s);  // its connect's turn (or its place in the line) goes to the next one
  recv_closing(s);
  set_state(s, close_event(s));
  if (violated) violation_note(s);
  // (after the state changed: a log callback that calls the API finds the socket closing)
  if (reason != IBMSG_OK)
    IBMSG_LOG(s, reason == IBMSG_ECONNRESET ? IBMSG_LOG_INFO : IBMSG_LOG_ERROR, "closing: %s (%s)",
              error_text(reason), error_name(reason));
  else IBMSG_LOG(s, IBMSG_LOG_INFO, "closing");
  s->loop->closing.push_back(s);
  loop_kick(s->loop);
}

void on_linger_end(Timer *t) { socket_close(static_cast<Socket *>(t->data), IBMSG_OK); }

void run_teardowns(Loop *loop) {
  // A closed callback may close more sockets: they run in this round too.
  while (Socket *s = loop->closing.pop_front()) teardown(s);
}

}  // namespace ibmsg
