// Completions: where they come from and where each goes. A device's completion channel wakes the
// loop (device_ready), the busy poller spins over the devices that connections poll (IBMSG_OPT_
// BUSY_POLL; poll.cpp marks the connections), and teardowns drain a device's CQs; every
// completion goes to the connection whose work request it names and there to the handler of its
// kind: a send, a receive, a credit-only message, a one-sided operation, a rendezvous read or
// FIN, a window bind.
//
// The poller is an ev_idle watcher: while it runs, ev_run does not block. Each of its rounds
// spins over the polling devices for up to kSliceNs before it gives the loop back (CM events,
// timers and the application's own watchers wait at most that long), so that a stream of
// completions costs no system call per completion. Once no connection on a device polls, its CQ
// is armed and polled once more, so no completion that arrived in between is lost.
#include "completion.hpp"

#include <cstdint>
#include <ctime>

#include "internal.hpp"
#include "datapath.hpp"
#include "deliver.hpp"
#include "inbound.hpp"
#include "memory.hpp"
#include "poll.hpp"
#include "recv.hpp"
#include "rndv.hpp"
#include "wake.hpp"

namespace ibmsg {
namespace {

// The connection a completed work request belongs to.
Socket *socket_of(const tp::Completion &wc) {
  const tp::WorkCtx *ctx = wc.ctx;
  switch (ctx->op) {
    case tp::Op::Recv: return recv_route(static_cast<Slot *>(ctx->owner), wc.qp_num);
    case tp::Op::Send: return static_cast<Slot *>(ctx->owner)->sock;
    case tp::Op::RndvRead:
    case tp::Op::RndvFin: return recv_owner(static_cast<Slot *>(ctx->owner));
    case tp::Op::Ctrl: return static_cast<Socket *>(ctx->owner);
    case tp::Op::RdmaWrite:
    case tp::Op::RdmaRead:
    case tp::Op::WriteImm:
    case tp::Op::Atomic: return static_cast<Op *>(ctx->owner)->sock;
    case tp::Op::Bind: return static_cast<Grant *>(ctx->owner)->conn;
    default: return nullptr;  // nothing else is posted
  }
}

constexpr uint64_t kSliceNs = 1000 * 1000;  // one round of spinning: 1 ms

uint64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
}

// Stops polling s if it has been quiet long enough; the last one on its device arms the CQ.
void maybe_sleep(Socket *s, uint64_t now) {
  const int us = s->opts.busy_poll_us;
  // A post since the poller's last clock reading (poll_touch) is kJustNow: later than now.
  if (us < 0 || now < s->poll.last_ns || now - s->poll.last_ns < uint64_t(us) * 1000) return;
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
  while (!loop->pollers.empty() && now - start < kSliceNs) {
    // Devices and sockets leave their lists only in teardowns and releases, which run from
    // another watcher: the lists may grow here (a callback connects or accepts), never shrink.
    for (Device *d = loop->devices.front(); d; d = loop->devices.next(d))
      if (d->polling > 0) drain_device(d);
    // Only the polling connections: a spin costs nothing per idle connection. maybe_sleep may
    // take s off the list: its successor is read first.
    Socket *next = nullptr;
    for (Socket *s = loop->pollers.front(); s; s = next) {
      next = loop->pollers.next(s);
      if (s->poll.last_ns == kJustNow) {
        // Activity: an adaptive connection's quiet time starts now (one clock read per batch of
        // completions, none per message posted).
        if (s->opts.busy_poll_us > 0) s->poll.last_ns = now = now_ns();
      } else if ((spins & 63) == 0) {
        maybe_sleep(s, now);
      }
    }
    // Something to tear down: let the loop run it.
    if (!loop->closing.empty()) break;
    if ((++spins & 63) == 0) now = now_ns();
  }
  if (loop->pollers.empty()) ev_idle_stop(ev, w);
}

}  // namespace

void on_completion(Socket *s, const tp::Completion &wc) {
  // The unsignaled credit-only messages posted before this work request (tp::post_flush): done
  // if it succeeded; a failure closes the connection, and a flushed one completes on its own.
  uint32_t carried = wc.ctx->carried;
  if (carried) {
    wc.ctx->carried = 0;
    if (wc.status != tp::WcStatus::Ok || carried > s->tx.ctrl_in_flight) carried = 0;
    s->tx.ctrl_in_flight -= carried;
  }
  if (wc.status != tp::WcStatus::Ok && wc.status != tp::WcStatus::Flushed &&
      s->state != State::Closing)
    IBMSG_LOG(s, IBMSG_LOG_INFO, "a work request failed: %s",
              wc.status_text ? wc.status_text : "transport error");
  switch (wc.ctx->op) {
    case tp::Op::Recv: on_recv_wc(s, static_cast<Slot *>(wc.ctx->owner), wc); break;
    case tp::Op::Send: send_on_wc(s, static_cast<Slot *>(wc.ctx->owner), wc); break;
    case tp::Op::Ctrl:
      --s->tx.ctrl_in_flight;
      if (wc.status != tp::WcStatus::Ok) socket_close(s, tp::wc_error(wc.status));
      else maybe_send_ctrl(s);  // it may have waited for room in the send queue
      break;
    case tp::Op::RdmaWrite:
    case tp::Op::RdmaRead:
    case tp::Op::WriteImm:
    case tp::Op::Atomic: op_on_wc(s, static_cast<Op *>(wc.ctx->owner), wc); break;
    case tp::Op::RndvRead: {
      const int r = rndv_on_read(s, static_cast<Slot *>(wc.ctx->owner), wc);
      if (r > 0) deliver_ready(s);  // a message complete: delivered before more reads go
      if (r >= 0) rndv_read_more(s);
      break;
    }
    case tp::Op::RndvFin: rndv_on_fin_sent(s, static_cast<Slot *>(wc.ctx->owner), wc); break;
    case tp::Op::Bind: grant_on_bind(s, static_cast<Grant *>(wc.ctx->owner), wc); break;
    default: socket_close(s, IBMSG_EIO); break;  // nothing else is posted
  }
  if (carried) maybe_send_ctrl(s);  // one may have waited for a control slot
}

int drain_device(Device *dev) {
  tp::Completion wc[32];
  int total = 0;
  for (DevCq *q = dev->cqs.front(); q; q = dev->cqs.next(q)) {
    while (!q->dead) {
      int n = tp::cq_poll(q->cq, wc, 32);
      if (n < 0) {
        q->dead = true;
        device_cq_failed(dev, IBMSG_EIO);
        break;
      }
      // A drain never runs inside another (the loop refuses re-entry, and teardowns drain from
      // the idle watcher): poll_rest and the credits held back belong to this poll alone.
      for (int i = 0; i < n; ++i) {
        // Credits granted from here on were not on the wire when the rest of them arrived.
        dev->loop->poll_rest = uint32_t(n - 1 - i);
        Socket *s = socket_of(wc[i]);
        // A slot whose pool has no connection any more: cannot happen, since a teardown polls
        // the CQ after destroying the QP and before giving the pools back (a shared receive
        // buffer whose connection is gone went back into its queue).
        if (!s) continue;
        poll_touch(s);  // activity: a busy-polling connection polls (again)
        on_completion(s, wc[i]);
      }
      if (!dev->loop->fresh.empty()) recv_grants_release(dev->loop);
      total += n;
      if (n < 32) break;
    }
  }
  // What the callbacks posted goes out now, one list per connection (no completion, no
  // callback: a spin of the poller that found nothing posted nothing).
  if (total) posts_flush(dev->loop);
  return total;
}

void devices_unpark(Loop *loop) {
  for (Device *d = loop->devices.front(); d; d = loop->devices.next(d)) {
    if (d->parked == 0) continue;
    drain_device(d);
    Pool *p = d->pools.front();
    while (p) {
      Pool *next = d->pools.next(p);  // releasing p may release the device: not before the end
      if (p->parked_cq) {
        p->parked_cq->need -= p->parked_need;
        p->parked_cq = nullptr;
        --d->parked;
        --p->out;
        pool_maybe_release(p);
      }
      p = next;
    }
  }
}

// Marks nothing itself: the caller marks the CQ that failed dead first.
void device_cq_failed(Device *dev, int reason) {
  for (Socket *s = dev->loop->sockets.front(); s; s = dev->loop->sockets.next(s))
    if (s->dev == dev && s->res.cq) socket_close(s, reason);
}

void on_cq_ready(void *cq_user, void *) { poll_cq_ready(static_cast<Device *>(cq_user)); }

// A completion-channel event. The device's CQs are polled first, so that what woke the loop is
// handed out (and a reply posted) before the system call that reads the event; then the
// transport reads and acks it, and the core arms the CQ and polls it once more, unless a
// connection busy-polls (poll.cpp), so nothing that completes in between is missed.
//
// A channel that fails (a removed device's stays readable, and reading it fails) would wake the
// loop for ever: it is no longer watched, its CQs are not used again, the device's connections on
// this loop close, and later connections open the device anew.
void device_ready(Device *dev) {
  drain_device(dev);
  int err = tp::device_take_events(dev->tp, on_cq_ready, nullptr);
  if (err == IBMSG_OK) return;
  ev_io_stop(dev->loop->ev, &dev->watcher);
  loop_watch_fd(dev->loop, dev->watcher.fd, false);
  dev->removed = true;
  for (DevCq *q = dev->cqs.front(); q; q = dev->cqs.next(q)) q->dead = true;
  // Every connection on it, also one still being set up (it would join a CQ nobody watches).
  Loop *loop = dev->loop;
  for (Socket *s = loop->sockets.front(); s; s = loop->sockets.next(s))
    if (s->dev == dev) socket_close(s, err);
}

void poll_init(Loop *loop) {
  ev_idle_init(&loop->poller, on_poll);
  loop->poller.data = loop;
}

void poll_cq_ready(Device *dev) {
  // The caller polled the CQ just before reading the event: a busy-polling connection it woke
  // takes the CQ over without arming it. Otherwise it is armed and polled once more, for what
  // completed since.
  if (dev->polling == 0) poll_rearm(dev);
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
