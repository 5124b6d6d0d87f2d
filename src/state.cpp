#include "state.hpp"

namespace ibmsg {

namespace {

struct Row {
  State from;
  Event ev;
  State to;
};

// The whole machine: a (state, event) pair that is not here is a bug in the caller.
constexpr Row kTable[] = {
    {State::Idle, Event::Listen, State::Listening},
    {State::Idle, Event::Connect, State::ResolvingAddr},
    {State::Idle, Event::Accept, State::Accepting},
    {State::ResolvingAddr, Event::AddrResolved, State::ResolvingRoute},
    {State::ResolvingRoute, Event::RouteResolved, State::Connecting},
    {State::Connecting, Event::Established, State::Connected},
    {State::Accepting, Event::Established, State::Connected},
    {State::Connected, Event::PeerDisconnected, State::Closing},
    {State::Connected, Event::Linger, State::Lingering},
    {State::Lingering, Event::PeerDisconnected, State::Closing},
    {State::Closing, Event::TornDown, State::Closed},
};

// Disconnect and Failed are valid in every open state.
bool is_open(State s) { return s != State::Idle && s != State::Closing && s != State::Closed; }

}  // namespace

bool transition(State from, Event ev, State *to) {
  if ((ev == Event::Disconnect || ev == Event::Failed) && is_open(from)) {
    *to = State::Closing;
    return true;
  }
  for (const Row &r : kTable) {
    if (r.from == from && r.ev == ev) {
      *to = r.to;
      return true;
    }
  }
  return false;
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
    case State::Lingering: return IBMSG_DISCONNECTING;  // as the application sees it: closing
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
    case State::Lingering: return "lingering";
    case State::Closing: return "closing";
    case State::Closed: return "closed";
  }
  return "?";
}

}  // namespace ibmsg
