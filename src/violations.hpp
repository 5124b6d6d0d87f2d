// Remote access violations (violations.cpp): a peer that made a remote access our queue pair
// refused (a bad key, range or right). The granting side learns of it only through its queue
// pair's state (tp::qp_failed); the loop counts violations, logs them, and remembers the
// addresses they came from so that listeners can refuse those for IBMSG_OPT_VIOLATION_BAN.
#pragma once
#include <sys/socket.h>

#include <cstdint>

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

}  // namespace ibmsg
