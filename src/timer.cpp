// Per-socket deadlines: libev timers the loop knows about, so that ibmsg_event_loop_timeout()
// can tell a foreign event loop when the next one is due.
#include "timer.hpp"

#include "internal.hpp"

namespace ibmsg {
namespace {

void on_timer(struct ev_loop *, ev_timer *w, int) {
  Timer *t = static_cast<Timer *>(w->data);
  t->loop->timers.remove(t);
  LoopEntered entered(t->loop);
  t->fn(t);
}

}  // namespace

void timer_init(Timer *t, Loop *loop, void (*fn)(Timer *), void *data) {
  ev_timer_init(&t->w, on_timer, 0., 0.);
  t->w.data = t;
  t->loop = loop;
  t->fn = fn;
  t->data = data;
  t->node = ListNode();
}

void timer_start(Timer *t, double seconds) {
  timer_stop(t);
  ev_timer_set(&t->w, seconds, 0.);
  ev_timer_start(t->loop->ev, &t->w);
  t->loop->timers.push_back(t);
}

void timer_stop(Timer *t) {
  if (!t->node.linked()) return;
  ev_timer_stop(t->loop->ev, &t->w);
  t->loop->timers.remove(t);
}

double timers_next(Loop *loop) {
  double next = -1;
  for (Timer *t = loop->timers.front(); t; t = loop->timers.next(t)) {
    double r = ev_timer_remaining(loop->ev, &t->w);
    if (next < 0 || r < next) next = r;
  }
  return next;
}

}  // namespace ibmsg
