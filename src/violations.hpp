// Remote access violations (violations.cpp): a peer that made a remote access our queue pair
// refused (a bad key, range or right). The granting side learns of it only through its queue
// pair's state (tp::qp_failed); the loop counts violations, logs them, and remembers the
// addresses they came from so that listeners can refuse those for IBMSG_OPT_VIOLATION_BAN.
#pragma once
#include <sys/socket.h>

#include <cstddef>
#include <cstdint>

#include "handles.hpp"
#include "ibmsg.h"

namespace ibmsg {

// The addresses of recent violators: bounded, the oldest entry makes room for a new one (an
// attacker with many addresses can push one out, but each address still pays one reconnection
// and one ban per violation).
constexpr int kViolators = 256;

struct Violations {
  uint64_t count = 0;   // since the loop began (ibmsg_loop_stats)
  uint64_t banned = 0;  // connection requests refused for a ban
  struct Entry {
    sockaddr_storage addr;  // the peer's IP, port zeroed
    double at;              // loop time of its latest violation
    bool used;
  };
  Entry table[kViolators]{};
};

// Closing for a reset while connected: whether the queue pair is in the error state although
// nothing of ours failed (the peer made a remote access it refused; it closes with
// IBMSG_EREMOTEACCESS then).
bool violation_seen(Socket *s);
void violation_note(Socket *s);  // counted, logged at warning, its address remembered
int violations_counters(Loop *loop, ibmsg_loop_counters *out, size_t size);  // ibmsg_loop_stats
// Seconds a listener with IBMSG_OPT_VIOLATION_BAN ban_ms still refuses peer's address (0: none;
// otherwise the request is counted as refused).
double violation_ban_left(Loop *loop, const sockaddr *peer, int ban_ms);

}  // namespace ibmsg
