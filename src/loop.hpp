// The loop (loop.cpp): libev, the CM channel, the idle work, the fd and timeout for other loops.
#pragma once
#include "internal.hpp"  // (the handles' checks below read the socket and the loop)
#include "ibmsg.h"

struct ev_loop;

namespace ibmsg {

// With IBMSG_DEBUG: whether another thread runs the loop now (says so on stderr).
bool other_thread_runs(Loop *loop);
inline bool from_other_thread(Loop *loop) { return loop->debug && other_thread_runs(loop); }

// The handles' validated impls, or nullptr; with IBMSG_DEBUG also when another thread runs the
// loop now (a call from it is a data race). Inline: every API call starts with one.
inline Loop *loop_of_any_thread(ibmsg_event_loop *l) {
  if (!l || !l->impl || l->impl->magic != kLoopMagic || l->impl->pub != l) return nullptr;
  return l->impl;
}
inline Loop *loop_of(ibmsg_event_loop *l) {
  Loop *loop = loop_of_any_thread(l);
  return loop && !from_other_thread(loop) ? loop : nullptr;
}
inline Socket *socket_of(const ibmsg_socket *pub) {
  if (!pub || !pub->impl) return nullptr;
  Socket *s = pub->impl;
  if (s->magic != kSocketMagic || s->pub != pub) return nullptr;
  return from_other_thread(s->loop) ? nullptr : s;
}
int loop_init(ibmsg_event_loop *pub, struct ev_loop *ev);
int loop_destroy(Loop *loop);
int loop_run(Loop *loop, int flags, double timeout_s);
int loop_fd(Loop *loop);
int loop_timeout_ms(Loop *loop);

}  // namespace ibmsg
