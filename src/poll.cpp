// Busy polling (IBMSG_OPT_BUSY_POLL), the connections' side: activity on a connection makes its
// device's CQ polled from the loop (the poller, completion.cpp) instead of armed, until the
// connection has been quiet for the option's time; the last connection of a device to stop
// leaves the CQ to be armed again (Device::rearm).
#include "poll.hpp"

#include "internal.hpp"

namespace ibmsg {

void poll_touch(Socket *s) {
  if (s->poll_node.linked()) {  // polling already (so with the option and a CQ)
    if (s->state != State::Closing) s->poll.last_ns = kJustNow;  // the poller reads the clock
    return;
  }
  if (s->opts.busy_poll_us == 0 || !s->res.cq || s->state == State::Closing) return;
  s->poll.last_ns = kJustNow;
  if (s->loop->pollers.empty()) ev_idle_start(s->loop->ev, &s->loop->poller);
  s->loop->pollers.push_back(s);
  ++s->dev->polling;
}

void poll_stop(Socket *s) {
  if (!s->poll_node.linked()) return;
  s->loop->pollers.remove(s);
  // The last one: the CQ was left unarmed for the poller, and must be armed (and polled once
  // more) before the loop sleeps: by the poller at once, or, when a teardown stopped it, by the
  // idle watcher that runs the teardowns, right after them.
  if (--s->dev->polling == 0) s->dev->rearm = true;
}

}  // namespace ibmsg
