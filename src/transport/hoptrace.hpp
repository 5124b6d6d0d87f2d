// The hop trace, a diagnostic build only (configure --enable-hop-trace, which defines
// IBMSG_HOP_TRACE; without it every function here is empty and inline, and costs nothing): the
// time stamp counter at each doorbell (before and after ibv_post_send), at each receive
// completion polled and at the last empty poll before it, written when the process exits to
// $IBMSG_HOP_TRACE/hops-PID.bin (nothing is recorded without that variable). test/perf/hops
// runs a busy-polled ping-pong with it and splits each hop into the device's part (a doorbell to
// the peer's completion polled, Soft-RoCE's work included), the poller's spin and ibmsg's own
// part (a receive completion polled to the next doorbell). One loop per process: the records
// are not locked.
#pragma once

namespace ibmsg::tp::hoptrace {

#ifdef IBMSG_HOP_TRACE
void post_begin();
void post_end();
void recv_found();
void poll_empty();
#else
inline void post_begin() {}
inline void post_end() {}
inline void recv_found() {}
inline void poll_empty() {}
#endif

}  // namespace ibmsg::tp::hoptrace
