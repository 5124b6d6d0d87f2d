// The event loop: one libev loop watching the RDMA CM event channel and the completion channel of
// each device, plus the idle work (teardowns, device release); and the fd/timeout interface for
// foreign event loops.
#include "loop.hpp"

#include <sys/epoll.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <new>

#include "internal.hpp"
#include "close.hpp"
#include "cm.hpp"
#include "completion.hpp"
#include "datapath.hpp"
#include "device_release.hpp"
#include "errors.hpp"
#include "handover.hpp"
#include "message.hpp"
#include "wake.hpp"

namespace ibmsg {
namespace {

// All CM events until there is none; each is copied out and acked by the transport before it is
// handled, so that destroying an id in a handler never waits for an unacked event.
void on_cm_readable(struct ev_loop *, ev_io *w, int) {
  Loop *loop = static_cast<Loop *>(w->data);
  LoopEntered entered(loop);
  tp::CmEvent ev;
  while (tp::cm_get_event(loop->cm, &ev) == IBMSG_OK) on_cm_event(loop, ev);
}

void on_idle(struct ev_loop *ev, ev_idle *w, int) {
  Loop *loop = static_cast<Loop *>(w->data);
  LoopEntered entered(loop);
  run_teardowns(loop);
  for (Device *d = loop->devices.front(); d; d = loop->devices.next(d))
    if (d->rearm) poll_rearm(d);
  devices_unpark(loop);
  devices_collect(loop);
  if (loop->closing.empty() && !loop->devices_dirty) ev_idle_stop(ev, w);
}

void on_wakeup(struct ev_loop *, ev_timer *, int) {}

void data_established(Socket *s) { establish(s, true); }

// The upward calls of the lower tiers (hooks.hpp).
constexpr Hooks kHooks = {close_begin,      ctrl_due,     ctrl_round_end,
                          data_established, device_ready, msgs_freed_back};

}  // namespace

// A call from another thread while this one runs the loop is a data race: refused (loop.hpp),
// and said on stderr, not through the log callback, which is the loop thread's.
bool other_thread_runs(Loop *loop) {
  const long runner = loop->runner.load(std::memory_order_relaxed);
  const long me = current_tid();
  if (runner == 0 || runner == me) return false;
  fprintf(stderr,
          "ibmsg: error: an ibmsg function was called from thread %ld while thread %ld runs "
          "the loop; only ibmsg_event_loop_call() may be called from other threads (the call "
          "fails)\n",
          me, runner);
  return true;
}

int loop_run(Loop *loop, int flags, double timeout_s) {
  // Running the loop from inside one of its callbacks would tear sockets down under the feet of
  // the callback's caller.
  if (loop->depth) return IBMSG_EBUSY;
  LoopThread thread(loop);
  if (timeout_s > 0) {
    ev_timer_set(&loop->wakeup, timeout_s, 0.);
    ev_timer_start(loop->ev, &loop->wakeup);
  }
  ev_run(loop->ev, flags);
  if (timeout_s > 0) ev_timer_stop(loop->ev, &loop->wakeup);
  return IBMSG_OK;
}

int loop_init(ibmsg_event_loop *pub, struct ev_loop *ev) {
  memset(pub, 0, sizeof *pub);
  Loop *loop = new (std::nothrow) Loop();
  if (!loop) return IBMSG_ENOMEM;
  loop->pub = pub;
  loop->hooks = &kHooks;
  if (ev) {
    loop->ev = ev;
  } else {
    loop->ev = ev_loop_new(EVBACKEND_EPOLL);
    if (!loop->ev) loop->ev = ev_loop_new(EVFLAG_AUTO);
    if (!loop->ev) {
      delete loop;
      return IBMSG_ESYS;
    }
    loop->own_ev = true;
  }
  log_init(loop);
  int err = tp::cm_channel_create(&loop->cm);
  if (err) {
    // The application has had no chance to set a log callback yet: the line goes to stderr
    // with IBMSG_DEBUG set.
    if (err == IBMSG_ENODEV)
      log_write(loop, nullptr, IBMSG_LOG_ERROR,
                "no RDMA device: the RDMA connection manager (/dev/infiniband/rdma_cm) is not "
                "there (no RDMA driver loaded, e.g. rdma_rxe for Soft-RoCE on an Ethernet port)");
    else
      log_write(loop, nullptr, IBMSG_LOG_ERROR,
                "cannot open the RDMA connection manager: %s", error_text(err));
    if (loop->own_ev) ev_loop_destroy(loop->ev);
    delete loop;
    return err;
  }
  ev_io_init(&loop->cm_watcher, on_cm_readable, tp::cm_channel_fd(loop->cm), EV_READ);
  loop->cm_watcher.data = loop;
  // Connection events before completions and timers of the same round: after a stall (a
  // process stopped and resumed), a peer's disconnect is seen before the posts it makes fail.
  ev_set_priority(&loop->cm_watcher, 1);
  if ((err = handover_init(loop))) {
    log_write(loop, nullptr, IBMSG_LOG_ERROR, "cannot create the loop's eventfd: %s",
              error_text(err));
    tp::cm_channel_destroy(loop->cm);
    if (loop->own_ev) ev_loop_destroy(loop->ev);
    delete loop;
    return err;
  }
  ev_io_start(loop->ev, &loop->cm_watcher);
  ev_idle_init(&loop->idle, on_idle);
  // libev runs an idle watcher only when nothing of its priority or higher is pending: at the
  // default priority, a busy connection would hold back every teardown.
  ev_set_priority(&loop->idle, EV_MAXPRI);
  poll_init(loop);
  loop->idle.data = loop;
  ev_timer_init(&loop->wakeup, on_wakeup, 0., 0.);
  requests_init(loop);
  pub->impl = loop;
  return IBMSG_OK;
}

int loop_destroy(Loop *loop) {
  if (loop->depth || !loop->sockets.empty() || !loop->closing.empty() || !loop->regions.empty() ||
      handover_pending(loop))
    return IBMSG_EBUSY;
  devices_collect(loop);
  if (!loop->devices.empty()) return IBMSG_EBUSY;  // the application still holds messages
  devices_stop_rescans(loop);
  ev_io_stop(loop->ev, &loop->cm_watcher);
  ev_idle_stop(loop->ev, &loop->idle);
  ev_idle_stop(loop->ev, &loop->poller);
  ev_timer_stop(loop->ev, &loop->wakeup);
  handover_destroy(loop);
  tp::cm_channel_destroy(loop->cm);
  if (loop->epfd >= 0) close(loop->epfd);
  if (loop->own_ev) ev_loop_destroy(loop->ev);
  requests_destroy(loop);
  loop->pub->impl = nullptr;
  loop->magic = 0;
  delete loop;
  return IBMSG_OK;
}

int loop_fd(Loop *loop) {
  if (loop->epfd < 0) {
    loop->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (loop->epfd < 0) return -1;
    loop_watch_fd(loop, tp::cm_channel_fd(loop->cm));
    loop_watch_fd(loop, handover_fd(loop));
    for (Device *d = loop->devices.front(); d; d = loop->devices.next(d))
      if (ev_is_active(&d->watcher)) loop_watch_fd(loop, tp::device_fd(d->tp));  // not a failed one
  }
  return loop->epfd;
}

int loop_timeout_ms(Loop *loop) {
  if (!loop->closing.empty() || loop->devices_dirty || !loop->pollers.empty()) return 0;
  for (Device *d = loop->devices.front(); d; d = loop->devices.next(d))
    if (d->rearm || d->parked) return 0;  // CQs to arm or poll (poll_rearm, devices_unpark)
  double next = timers_next(loop);
  if (next < 0) return -1;
  return int(next * 1000) + 1;
}

}  // namespace ibmsg
