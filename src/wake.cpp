// Waking the loop: the idle watcher that runs teardowns and releases devices, and the epoll set
// a foreign event loop watches (ibmsg_event_loop_fd), which every fd the loop watches joins.
#include "wake.hpp"

#include <sys/epoll.h>

#include "internal.hpp"

namespace ibmsg {

void loop_kick(Loop *loop) { ev_idle_start(loop->ev, &loop->idle); }

void loop_watch_fd(Loop *loop, int fd, bool watch) {
  if (loop->epfd < 0) return;
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = fd;
  epoll_ctl(loop->epfd, watch ? EPOLL_CTL_ADD : EPOLL_CTL_DEL, fd, &ev);
}

}  // namespace ibmsg
