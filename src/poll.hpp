// Busy polling, the connections' side (poll.cpp); the poller itself is completion.cpp's.
#pragma once
#include <cstdint>

struct ibmsg__socket;

namespace ibmsg {

// Socket::poll_last_ns of a connection touched since the poller last read the clock.
constexpr uint64_t kJustNow = UINT64_MAX;
// Activity on s: with IBMSG_OPT_BUSY_POLL, its CQ is polled (not armed) until quiet long enough.
void poll_touch(::ibmsg__socket *s);
// s stops polling (quiet, or it releases its CQ); the last one on its device sets Device::rearm.
void poll_stop(::ibmsg__socket *s);

}  // namespace ibmsg
