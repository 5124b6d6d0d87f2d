#include "state.hpp"

namespace ibmsg {

bool transition(State from, Event ev, State *to) {
  State next = from;
  switch (ev) {
    case Event::Listen:
      if (from != State::Idle) return false;
      next = State::Listening;
      break;
    case Event::Connect:
      if (from != State::Idle) return false;
      next = State::ResolvingAddr;
      break;
    case Event::AddrResolved:
      if (from != State::ResolvingAddr) return false;
      next = State::ResolvingRoute;
      break;
    case Event::RouteResolved:
      if (from != State::ResolvingRoute) return false;
      next = State::Connecting;
      break;
    case Event::Accept:
      if (from != State::Idle) return false;
      next = State::Accepting;
      break;
    case Event::Established:
      if (from != State::Connecting && from != State::Accepting) return false;
      next = State::Connected;
      break;
    case Event::Disconnect:
    case Event::PeerDisconnected:
    case Event::Failed:
      if (from == State::Idle || from == State::Closing || from == State::Closed) return false;
      if (ev == Event::PeerDisconnected && from != State::Connected) return false;
      next = State::Closing;
      break;
    case Event::TornDown:
      if (from != State::Closing) return false;
      next = State::Closed;
      break;
  }
  *to = next;
  return true;
}

ibmsg_socket_status public_status(State s, int close_reason) {
  switch (s) {
    case State::Idle: return IBMSG_UNCONNECTED;
    case State::Listening: return IBMSG_LISTENING;
    case State::ResolvingAddr: return IBMSG_UNCONNECTED;
    case State::ResolvingRoute: return IBMSG_ADDRESS_RESOLVED;
    case State::Connecting:
    case State::Accepting: return IBMSG_ROUTE_RESOLVED;
    case State::Connected: return IBMSG_CONNECTED;
    case State::Closing: return IBMSG_DISCONNECTING;
    case State::Closed:
      return close_reason == IBMSG_OK || close_reason == IBMSG_ECONNRESET ? IBMSG_UNCONNECTED
                                                                          : IBMSG_ERROR;
  }
  return IBMSG_ERROR;
}

const char *state_name(State s) {
  switch (s) {
    case State::Idle: return "idle";
    case State::Listening: return "listening";
    case State::ResolvingAddr: return "resolving address";
    case State::ResolvingRoute: return "resolving route";
    case State::Connecting: return "connecting";
    case State::Accepting: return "accepting";
    case State::Connected: return "connected";
    case State::Closing: return "closing";
    case State::Closed: return "closed";
  }
  return "?";
}

}  // namespace ibmsg
