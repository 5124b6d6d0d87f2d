// The hand-over: ibmsg_event_loop_call, the one function another thread may call. The calls wait
// in a list under a mutex; the first one posted to an empty list writes the loop's eventfd, which
// the loop watches (also through ibmsg_event_loop_fd's epoll set, for foreign loops). The loop's
// thread reads the eventfd first and then takes the whole list, so that a call posted after the
// take writes the fd again and none is left waiting unseen; it runs them in the order posted,
// as one round of callbacks (what they post goes out at its end). A call that posts another
// runs it at the next iteration, not within itself.
#include "handover.hpp"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <new>

#include "internal.hpp"
#include "wake.hpp"

namespace ibmsg {

struct HandoverCall {
  HandoverCall *next;
  void (*fn)(void *);
  void *arg;
};

namespace {

void on_handover(struct ev_loop *, ev_io *w, int) {
  Loop *loop = static_cast<Loop *>(w->data);
  Handover &h = loop->handover;
  LoopEntered entered(loop);
  uint64_t count;
  while (read(h.fd, &count, sizeof count) < 0 && errno == EINTR) continue;  // (EAGAIN: none)
  HandoverCall *c;
  {
    std::lock_guard<std::mutex> lock(h.mu);
    c = h.head;
    h.head = h.tail = nullptr;
  }
  while (c) {
    HandoverCall *next = c->next;
    c->fn(c->arg);
    delete c;
    c = next;
  }
}

}  // namespace

int handover_init(Loop *loop) {
  Handover &h = loop->handover;
  h.fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (h.fd < 0) return IBMSG_ESYS;
  ev_io_init(&h.watcher, on_handover, h.fd, EV_READ);
  h.watcher.data = loop;
  ev_io_start(loop->ev, &h.watcher);  // (ibmsg_event_loop_fd's set, made later, adds the fd)
  return IBMSG_OK;
}

bool handover_pending(Loop *loop) {
  std::lock_guard<std::mutex> lock(loop->handover.mu);
  return loop->handover.head != nullptr;
}

void handover_destroy(Loop *loop) {
  Handover &h = loop->handover;
  if (h.fd < 0) return;
  ev_io_stop(loop->ev, &h.watcher);
  loop_watch_fd(loop, h.fd, false);
  close(h.fd);
  h.fd = -1;
}

int handover_post(Loop *loop, void (*fn)(void *), void *arg) {
  HandoverCall *c = new (std::nothrow) HandoverCall{nullptr, fn, arg};
  if (!c) return IBMSG_ENOMEM;
  Handover &h = loop->handover;
  bool first;
  {
    std::lock_guard<std::mutex> lock(h.mu);
    first = h.head == nullptr;
    if (h.tail) h.tail->next = c;
    else h.head = c;
    h.tail = c;
  }
  if (first) {
    const uint64_t one = 1;
    while (write(h.fd, &one, sizeof one) < 0 && errno == EINTR) continue;
  }
  return IBMSG_OK;
}

int handover_fd(const Loop *loop) { return loop->handover.fd; }

}  // namespace ibmsg
