// The socket state machine (pure logic): which event moves a socket from which state to which,
// and what the application sees in ibmsg_socket.status.
//
//   listen:  Idle -Listen-> Listening -Disconnect-> Closing -TornDown-> Closed
//   connect: Idle -Connect-> ResolvingAddr -AddrResolved-> ResolvingRoute -RouteResolved->
//            Connecting -Established-> Connected
//   accept:  Idle -Accept-> Accepting -Established-> Connected
//   any open state -Disconnect/Failed-> Closing;  Connected -PeerDisconnected-> Closing
//   Connected -Linger-> Lingering (ibmsg_disconnect while done counts are owed: they go first)
//   Lingering -Disconnect/Failed/PeerDisconnected-> Closing
//   Closing -TornDown-> Closed
#pragma once
#include <cstdint>

#include "ibmsg.h"

namespace ibmsg {

enum class State : uint8_t {
  Idle,
  Listening,
  ResolvingAddr,
  ResolvingRoute,
  Connecting,
  Accepting,
  Connected,
  Lingering,  // disconnecting: sends the done counts it owes, then closes (close.cpp)
  Closing,
  Closed,
};

enum class Event : uint8_t {
  Listen,
  Connect,
  AddrResolved,
  RouteResolved,
  Accept,
  Established,
  Disconnect,        // ibmsg_disconnect()
  PeerDisconnected,  // RDMA_CM_EVENT_DISCONNECTED
  Failed,            // any error, timeout or rejection
  TornDown,          // resources released, closed callback due
  Linger,            // ibmsg_disconnect() while done counts are owed
};

// Stores the next state in *to and returns true if ev is valid in from; false (and *to
// untouched) otherwise.
bool transition(State from, Event ev, State *to);

// The ibmsg_socket.status the application sees. close_reason matters only for Closed.
ibmsg_socket_status public_status(State s, int close_reason);

// Messages can be allocated (buffers exist) / posted in these states.
inline bool state_has_buffers(State s) {
  return s == State::Connecting || s == State::Accepting || s == State::Connected ||
         s == State::Lingering;
}
inline bool state_can_post(State s) { return s == State::Connected; }

const char *state_name(State s);

}  // namespace ibmsg
