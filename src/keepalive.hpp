// Keepalive (keepalive.cpp): what a connection knows of its peer's liveness.
#pragma once
#include <cstdint>

struct ibmsg__socket;

namespace ibmsg {

struct Liveness {
  uint32_t heard = 0;        // messages received (any: the peer's loop sent them)
  uint32_t seen = 0;         // heard, when the loop's tick last looked
  double heard_at = 0;       // loop time the tick last saw news from the peer
  double probed_at = 0;      // ... and this side last probed
  bool answer_due = false;   // the peer probed: the next message (any) answers
  bool stalled = false;      // the queue's head waits for a data credit (counted once)
};

void keepalive_start(::ibmsg__socket *s);  // established: joins the loop's keepalive (both sides
                                           // have the feature and the option is on)
void keepalive_stop(::ibmsg__socket *s);   // teardown

}  // namespace ibmsg
