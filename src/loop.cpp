// The event loop: one libev loop watching the RDMA CM event channel and one completion channel
// per device, plus deferred teardowns; and the fd/process interface for foreign event loops.
#include <fcntl.h>
#include <sys/epoll.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <new>

#include "internal.hpp"

namespace ibmsg {
namespace {

int set_nonblocking(int fd) {
  int flags = fcntl(fd, F_GETFL);
  return flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0 ? -1 : 0;
}

void epoll_watch(Loop *loop, int fd) {
  if (loop->epfd < 0) return;
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = fd;
  epoll_ctl(loop->epfd, EPOLL_CTL_ADD, fd, &ev);
}

// All CM events until EAGAIN; each is copied and acked before it is handled, so that
// rdma_destroy_id() in a handler never waits for an unacked event.
void on_cm_readable(struct ev_loop *, ev_io *w, int) {
  Loop *loop = static_cast<Loop *>(w->data);
  rdma_cm_event *ev;
  ++loop->depth;
  while (rdma_get_cm_event(loop->cm, &ev) == 0) on_cm_event(loop, ev);
  --loop->depth;
}

// All completion-channel events until EAGAIN, acked per CQ and re-armed, then every CQ that
// signalled is polled until empty (re-arm before polling: nothing slips between the two).
void on_channel_readable(struct ev_loop *, ev_io *w, int) {
  Device *dev = static_cast<Device *>(w->data);
  Loop *loop = dev->loop;
  Socket *ready = nullptr;
  ++loop->depth;
  ibv_cq *cq;
  void *ctx;
  while (ibv_get_cq_event(dev->channel, &cq, &ctx) == 0) {
    Socket *s = static_cast<Socket *>(ctx);
    ++s->cq_events;
    if (!s->cq_ready) {
      s->cq_ready = true;
      s->ready_next = ready;
      ready = s;
    }
  }
  for (Socket *s = ready; s; s = s->ready_next) {
    ibv_ack_cq_events(s->cq, s->cq_events);
    s->cq_events = 0;
    ibv_req_notify_cq(s->cq, 0);
  }
  while (ready) {
    Socket *s = ready;
    ready = s->ready_next;
    s->cq_ready = false;
    drain_cq(s);
  }
  --loop->depth;
}

void on_idle(struct ev_loop *ev, ev_idle *w, int) {
  Loop *loop = static_cast<Loop *>(w->data);
  ++loop->depth;
  // Teardowns queued by API calls; a closed callback may queue more, which run next round.
  Socket *list = loop->pending_head;
  loop->pending_head = loop->pending_tail = nullptr;
  while (list) {
    Socket *s = list;
    list = s->pending_next;
    s->pending_next = nullptr;
    teardown(s);
  }
  if (!loop->pending_head) ev_idle_stop(ev, w);
  --loop->depth;
}

void on_wakeup(struct ev_loop *, ev_timer *, int) {}

}  // namespace

Loop *loop_of(ibmsg_event_loop *l) {
  if (!l || !l->impl || l->impl->magic != kLoopMagic || l->impl->pub != l) return nullptr;
  return l->impl;
}

Device *device_get(Loop *loop, ibv_context *ctx, int *err) {
  for (int i = 0; i < loop->ndevices; ++i)
    if (loop->devices[i].ctx == ctx) return &loop->devices[i];
  if (loop->ndevices == kMaxDevices) {
    *err = IBMSG_ENOMEM;
    return nullptr;
  }
  Device *dev = &loop->devices[loop->ndevices];
  dev->loop = loop;
  dev->ctx = ctx;
  dev->pd = ibv_alloc_pd(ctx);
  if (!dev->pd) {
    *err = IBMSG_ESYS;
    return nullptr;
  }
  dev->channel = ibv_create_comp_channel(ctx);
  if (!dev->channel || set_nonblocking(dev->channel->fd)) {
    if (dev->channel) ibv_destroy_comp_channel(dev->channel);
    ibv_dealloc_pd(dev->pd);
    *err = IBMSG_ESYS;
    return nullptr;
  }
  ev_io_init(&dev->watcher, on_channel_readable, dev->channel->fd, EV_READ);
  dev->watcher.data = dev;
  ev_io_start(loop->ev, &dev->watcher);
  epoll_watch(loop, dev->channel->fd);
  ++loop->ndevices;
  return dev;
}

void loop_link(Loop *loop, Socket *s) {
  s->loop = loop;
  s->prev = nullptr;
  s->next = loop->sockets;
  if (loop->sockets) loop->sockets->prev = s;
  loop->sockets = s;
}

void loop_unlink(Loop *loop, Socket *s) {
  if (s->prev) s->prev->next = s->next;
  else loop->sockets = s->next;
  if (s->next) s->next->prev = s->prev;
  s->prev = s->next = nullptr;
}

void schedule_close(Socket *s, int reason) {
  if (s->close_pending) return;
  s->close_pending = true;
  if (s->close_reason == IBMSG_OK) s->close_reason = reason;
  Loop *loop = s->loop;
  s->pending_next = nullptr;
  if (loop->pending_tail) loop->pending_tail->pending_next = s;
  else loop->pending_head = s;
  loop->pending_tail = s;
  ev_idle_start(loop->ev, &loop->idle);
}

int loop_run(Loop *loop, int flags, double timeout_s) {
  // Running the loop from inside one of its callbacks would tear sockets down under the feet of
  // the callback's caller.
  if (loop->depth) return IBMSG_EBUSY;
  if (timeout_s > 0) {
    ev_timer_set(&loop->wakeup, timeout_s, 0.);
    ev_timer_start(loop->ev, &loop->wakeup);
  }
  ev_run(loop->ev, flags);
  if (timeout_s > 0) ev_timer_stop(loop->ev, &loop->wakeup);
  return IBMSG_OK;
}

static int loop_init(ibmsg_event_loop *pub, struct ev_loop *ev) {
  if (!pub) return IBMSG_EINVAL;
  memset(pub, 0, sizeof *pub);
  Loop *loop = new (std::nothrow) Loop();
  if (!loop) return IBMSG_ENOMEM;
  loop->pub = pub;
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
  loop->cm = rdma_create_event_channel();
  if (!loop->cm || set_nonblocking(loop->cm->fd)) {
    int err = loop->cm ? IBMSG_ESYS : (errno == ENODEV || errno == ENOENT ? IBMSG_ENODEV : IBMSG_ESYS);
    if (loop->cm) rdma_destroy_event_channel(loop->cm);
    if (loop->own_ev) ev_loop_destroy(loop->ev);
    delete loop;
    return err;
  }
  ev_io_init(&loop->cm_watcher, on_cm_readable, loop->cm->fd, EV_READ);
  loop->cm_watcher.data = loop;
  ev_io_start(loop->ev, &loop->cm_watcher);
  ev_idle_init(&loop->idle, on_idle);
  loop->idle.data = loop;
  ev_timer_init(&loop->wakeup, on_wakeup, 0., 0.);
  pub->impl = loop;
  return IBMSG_OK;
}

}  // namespace ibmsg

using namespace ibmsg;

extern "C" {

int ibmsg_init_event_loop(ibmsg_event_loop *loop) { return loop_init(loop, nullptr); }

int ibmsg_init_event_loop_ev(ibmsg_event_loop *loop, struct ev_loop *ev) {
  if (!ev) return IBMSG_EINVAL;
  return loop_init(loop, ev);
}

int ibmsg_destroy_event_loop(ibmsg_event_loop *pub) {
  Loop *loop = loop_of(pub);
  if (!loop) return IBMSG_EINVAL;
  if (loop->depth || loop->sockets || loop->pending_head || loop->live_pools) return IBMSG_EBUSY;
  ev_io_stop(loop->ev, &loop->cm_watcher);
  ev_idle_stop(loop->ev, &loop->idle);
  ev_timer_stop(loop->ev, &loop->wakeup);
  for (int i = 0; i < loop->ndevices; ++i) {
    Device *dev = &loop->devices[i];
    ev_io_stop(loop->ev, &dev->watcher);
    ibv_destroy_comp_channel(dev->channel);
    ibv_dealloc_pd(dev->pd);
  }
  rdma_destroy_event_channel(loop->cm);
  if (loop->epfd >= 0) close(loop->epfd);
  if (loop->own_ev) ev_loop_destroy(loop->ev);
  loop->magic = 0;
  delete loop;
  pub->impl = nullptr;
  return IBMSG_OK;
}

int ibmsg_dispatch_event_loop(ibmsg_event_loop *pub) {
  Loop *loop = loop_of(pub);
  if (!loop) return IBMSG_EINVAL;
  return loop_run(loop, EVRUN_ONCE, 0);
}

int ibmsg_dispatch_event_loop_timeout(ibmsg_event_loop *pub, int timeout_ms) {
  Loop *loop = loop_of(pub);
  if (!loop || timeout_ms < 0) return IBMSG_EINVAL;
  if (timeout_ms == 0) return loop_run(loop, EVRUN_NOWAIT, 0);
  return loop_run(loop, EVRUN_ONCE, timeout_ms / 1000.0);
}

int ibmsg_event_loop_fd(ibmsg_event_loop *pub) {
  Loop *loop = loop_of(pub);
  if (!loop) return -1;
  if (loop->epfd < 0) {
    loop->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (loop->epfd < 0) return -1;
    epoll_watch(loop, loop->cm->fd);
    for (int i = 0; i < loop->ndevices; ++i) epoll_watch(loop, loop->devices[i].channel->fd);
  }
  return loop->epfd;
}

int ibmsg_event_loop_process(ibmsg_event_loop *pub) {
  Loop *loop = loop_of(pub);
  if (!loop) return IBMSG_EINVAL;
  return loop_run(loop, EVRUN_NOWAIT, 0);
}

int ibmsg_event_loop_timeout(ibmsg_event_loop *pub) {
  Loop *loop = loop_of(pub);
  if (!loop) return -1;
  if (loop->pending_head) return 0;
  double next = -1;
  for (Socket *s = loop->sockets; s; s = s->next) {
    if (!s->timer_active) continue;
    double r = ev_timer_remaining(loop->ev, &s->connect_timer);
    if (next < 0 || r < next) next = r;
  }
  if (next < 0) return -1;
  return int(next * 1000) + 1;
}

// --- options ---

static int *int_option(Options *o, int option) {
  switch (option) {
    case IBMSG_OPT_RECV_DEPTH: return &o->recv_depth;
    case IBMSG_OPT_SEND_DEPTH: return &o->send_depth;
    case IBMSG_OPT_SEND_QUEUE: return &o->send_queue;
    case IBMSG_OPT_MAX_MSG_SIZE: return &o->max_msg_size;
    case IBMSG_OPT_CONNECT_TIMEOUT: return &o->connect_timeout_ms;
    case IBMSG_OPT_RNR_RETRY: return &o->rnr_retry;
    default: return nullptr;
  }
}

static char *string_option(Options *o, int option) {
  switch (option) {
    case IBMSG_OPT_SOURCE_ADDR: return o->source_addr;
    case IBMSG_OPT_DEVICE: return o->device;
    default: return nullptr;
  }
}

static bool int_option_valid(int option, int v) {
  switch (option) {
    case IBMSG_OPT_RECV_DEPTH: return v >= 1 && v <= 16384;
    case IBMSG_OPT_SEND_DEPTH: return v >= 1 && v <= 16384;
    case IBMSG_OPT_SEND_QUEUE: return v >= 0 && v <= 1 << 20;
    case IBMSG_OPT_MAX_MSG_SIZE: return v >= 0 && v <= 1 << 30;
    case IBMSG_OPT_CONNECT_TIMEOUT: return v >= 1 && v <= 3600 * 1000;
    case IBMSG_OPT_RNR_RETRY: return v >= 0 && v <= 7;
    default: return false;
  }
}

int ibmsg_setopt(ibmsg_event_loop *pub, int option, const void *value, size_t len) {
  Loop *loop = loop_of(pub);
  if (!loop || !value) return IBMSG_EINVAL;
  if (int *p = int_option(&loop->opts, option)) {
    int v;
    if (len != sizeof v) return IBMSG_EINVAL;
    memcpy(&v, value, sizeof v);
    if (!int_option_valid(option, v)) return IBMSG_EINVAL;
    *p = v;
    return IBMSG_OK;
  }
  if (char *p = string_option(&loop->opts, option)) {
    const char *s = static_cast<const char *>(value);
    size_t n = strnlen(s, len);
    if (n >= kNameMax) return IBMSG_EINVAL;
    memcpy(p, s, n);
    p[n] = '\0';
    return IBMSG_OK;
  }
  return IBMSG_EINVAL;
}

int ibmsg_getopt(ibmsg_event_loop *pub, int option, void *value, size_t *len) {
  Loop *loop = loop_of(pub);
  if (!loop || !value || !len) return IBMSG_EINVAL;
  if (int *p = int_option(&loop->opts, option)) {
    if (*len < sizeof(int)) return IBMSG_EINVAL;
    memcpy(value, p, sizeof(int));
    *len = sizeof(int);
    return IBMSG_OK;
  }
  if (char *p = string_option(&loop->opts, option)) {
    size_t n = strlen(p);
    if (*len < n) return IBMSG_EINVAL;
    memcpy(value, p, n);
    if (*len > n) static_cast<char *>(value)[n] = '\0';
    *len = n;
    return IBMSG_OK;
  }
  return IBMSG_EINVAL;
}

}  // extern "C"
