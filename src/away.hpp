// A listener's connections on other loops (spread.cpp): their count, which the listener's thread
// raises and theirs lower as they close (an atomic, reference-counted: it lives while the
// listener or any of them does), and the loops a spreading listener's accepts go to in turn.
// Inline: the connection manager reads the count and the teardown lets go, without calling up
// into spread.cpp.
#pragma once
#include <atomic>

struct ibmsg__loop;

namespace ibmsg {

struct AwayCount {
  std::atomic<int> open{0};
  std::atomic<int> refs{1};
};

constexpr int kSpreadMax = 64;  // ibmsg_listen_spread's limit (ibmsg.h)

struct Spread {
  ::ibmsg__loop *loops[kSpreadMax];
  int count;
  int next;  // the loop of the next accept
};

inline int away_open(const AwayCount *a) {
  return a ? a->open.load(std::memory_order_relaxed) : 0;
}

inline void away_release(AwayCount *a) {
  if (a->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) delete a;
}

// A socket closes: a connection on another loop leaves its listener's count; a listener lets go
// of it (and of its spread).
inline void away_closed(AwayCount *&away, Spread *&spread, bool listener) {
  if (away && !listener) away->open.fetch_sub(1, std::memory_order_relaxed);
  if (away) away_release(away);
  away = nullptr;
  delete spread;
  spread = nullptr;
}

}  // namespace ibmsg
