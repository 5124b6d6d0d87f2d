// Waking the loop (wake.cpp): the idle work it runs soon, and the fds a foreign loop watches.
#pragma once

struct ibmsg__loop;

namespace ibmsg {

// Runs the loop's idle work (teardowns, device release) soon.
void loop_kick(::ibmsg__loop *loop);
// Adds fd to (or removes it from) the epoll set of ibmsg_event_loop_fd, if there is one.
void loop_watch_fd(::ibmsg__loop *loop, int fd, bool watch = true);

}  // namespace ibmsg
