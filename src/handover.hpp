// The hand-over (handover.cpp): calls another thread gives a loop to run on the loop's own
// thread, in the order they were posted (ibmsg_event_loop_call), and the eventfd that wakes the
// loop for them.
#pragma once
#include <ev.h>

#include <mutex>

struct ibmsg__loop;

namespace ibmsg {

struct HandoverCall;  // one posted call (handover.cpp)

// A loop's waiting calls: posted under the lock by any thread, taken and run by the loop's.
struct Handover {
  std::mutex mu;
  HandoverCall *head = nullptr;  // under mu: the oldest waiting call
  HandoverCall *tail = nullptr;  // under mu: the newest
  int fd = -1;                   // an eventfd, readable while a posting has not been taken
  ev_io watcher;
};

// The eventfd and its watcher on the loop; IBMSG_ESYS if the fd cannot be had.
int handover_init(::ibmsg__loop *loop);
// Whether calls wait (ibmsg_destroy_event_loop refuses to drop them).
bool handover_pending(::ibmsg__loop *loop);
// Stops the watcher and closes the fd (no call waits: handover_pending).
void handover_destroy(::ibmsg__loop *loop);
// Posts fn(arg) to run on the loop's thread at its next iteration; any thread. IBMSG_ENOMEM.
int handover_post(::ibmsg__loop *loop, void (*fn)(void *), void *arg);
// The eventfd, for the foreign-loop epoll set.
int handover_fd(const ::ibmsg__loop *loop);

}  // namespace ibmsg
