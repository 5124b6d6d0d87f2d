// Busy polling (IBMSG_OPT_BUSY_POLL): a connection with activity has its device's CQ polled from
// the loop instead of sleeping on the completion channel, for the option's time after its last
// activity (or always); then, once no connection on the device polls, the CQ is armed and polled
// once more, so no completion that arrived in between is lost, and the loop sleeps again.
//
// The CQ is the device's (one per device and loop, shared by its connections): while any of them
// polls, it is polled, and the other connections on it get their completions from the poller too.
// The poller is an ev_idle watcher: while it runs, ev_run does not block. Each of its rounds
// spins over the polling devices for up to kSliceNs before it gives the loop back (CM events,
// timers and the application's own watchers wait at most that long), so that a stream of
// completions costs no system call per completion.
#include <cstdint>
#include <ctime>

#include "internal.hpp"

namespace ibmsg {
namespace {

constexpr uint64_t kSliceNs = 1000 * 1000;  // one round of spinning: 1 ms
constexpr uint64_t kJustNow = UINT64_MAX;   // poll_last_ns of a connection touched since the
                                            // poller last read the clock

uint64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
}

// Stops polling s if it has been quiet long enough; the last one on its device arms the CQ.
void maybe_sleep(Socket *s, uint64_t now) {
  const int us = s->opts.busy_poll_us;
  // A post since the poller's last clock reading (poll_touch) is kJustNow: later than now.
  if (us < 0 || now < s->poll_last_ns || now - s->poll_last_ns < uint64_t(us) * 1000) return;
  Device *dev = s->dev;
  poll_stop(s);
  if (dev->rearm) poll_rearm(dev);
}

void on_poll(struct ev_loop *ev, ev_idle *w, int) {
  Loop *loop = static_cast<Loop *>(w->data);
  LoopEntered entered(loop);
  const uint64_t start = now_ns();
  uint64_t now = start;
  unsigned spins = 0;
  while (loop->polling > 0 && now - start < kSliceNs) {
    // Devices and sockets leave their lists only in teardowns and releases, which run from
    // another watcher: the lists may grow here (a callback connects or accepts), never shrink.
    for (Device *d = loop->devices.front(); d; d = loop->devices.next(d))
      if (d->polling > 0) drain_device(d);
    for (Socket *s = loop->sockets.front(); s; s = loop->sockets.next(s)) {
      if (!s->poll_active) continue;
      if (s->poll_last_ns == kJustNow) {
        // Activity: an adaptive connection's quiet time starts now (one clock read per batch of
        // completions, none per message posted).
        if (s->opts.busy_poll_us > 0) s->poll_last_ns = now = now_ns();
      } else if ((spins & 63) == 0) {
        maybe_sleep(s, now);
      }
    }
    // Something to tear down: let the loop run it.
    if (!loop->closing.empty()) break;
    if ((++spins & 63) == 0) now = now_ns();
  }
  if (loop->polling == 0) ev_idle_stop(ev, w);
}

}  // namespace

void poll_init(Loop *loop) {
  ev_idle_init(&loop->poller, on_poll);
  loop->poller.data = loop;
}

void poll_touch(Socket *s) {
  if (s->opts.busy_poll_us == 0 || !s->cq || s->state == State::Closing) return;
  s->poll_last_ns = kJustNow;  // the poller reads the clock for it
  if (s->poll_active) return;
  s->poll_active = true;
  ++s->dev->polling;
  if (s->loop->polling++ == 0) ev_idle_start(s->loop->ev, &s->loop->poller);
}

void poll_cq_ready(Device *dev) {
  // The caller polled the CQ just before reading the event: a busy-polling connection it woke
  // takes the CQ over without arming it. Otherwise it is armed and polled once more, for what
  // completed since.
  if (dev->polling == 0) poll_rearm(dev);
}

void poll_stop(Socket *s) {
  if (!s->poll_active) return;
  s->poll_active = false;
  --s->loop->polling;
  // The last one: the CQ was left unarmed for the poller, and must be armed (and polled once
  // more) before the loop sleeps: by maybe_sleep at once, or, when a teardown stopped it, by the
  // idle watcher that runs the teardowns, right after them.
  if (--s->dev->polling == 0) s->dev->rearm = true;
}

void poll_rearm(Device *dev) {
  dev->rearm = false;
  if (dev->polling > 0) return;
  for (DevCq *q = dev->cqs.front(); q; q = dev->cqs.next(q)) {
    if (q->dead) continue;
    if (tp::cq_arm(q->cq)) {
      q->dead = true;  // it would never signal: no connection joins it again
      device_cq_failed(dev, IBMSG_EIO);
      return;
    }
  }
  // What completed before the arming: handed out now (and a busy-polling connection it belongs
  // to polls again).
  drain_device(dev);
}

}  // namespace ibmsg
