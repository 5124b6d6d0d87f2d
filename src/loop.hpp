// The loop (loop.cpp): libev, the CM channel, the idle work, the fd and timeout for other loops.
#pragma once
#include "handles.hpp"
#include "ibmsg.h"

struct ev_loop;

namespace ibmsg {

Loop *loop_of(ibmsg_event_loop *l);  // validated impl or nullptr
Socket *socket_of(const ibmsg_socket *pub);  // validated impl or nullptr
int loop_init(ibmsg_event_loop *pub, struct ev_loop *ev);
int loop_destroy(Loop *loop);
int loop_run(Loop *loop, int flags, double timeout_s);
int loop_fd(Loop *loop);
int loop_timeout_ms(Loop *loop);

}  // namespace ibmsg
