// test_state.cpp - the socket state machine (src/state.hpp): every valid transition, every
// invalid one rejected, and what the application sees in ibmsg_socket.status.
#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <csetjmp>
extern "C" {  // cmocka.h 1.1 has no extern "C" of its own
#include <cmocka.h>
}

#include <cstring>
#include <initializer_list>

#include "state.hpp"

using ibmsg::Event;
using ibmsg::State;

namespace {

const State kStates[] = {
    State::Idle,       State::Listening, State::ResolvingAddr, State::ResolvingRoute,
    State::Connecting, State::Accepting, State::Connected,     State::Lingering,
    State::Closing,    State::Closed,
};
const Event kEvents[] = {
    Event::Listen,      Event::Connect,    Event::AddrResolved,     Event::RouteResolved,
    Event::Accept,      Event::Established, Event::Disconnect,      Event::PeerDisconnected,
    Event::Failed,      Event::TornDown,    Event::Linger,
};

const char *event_name(Event e) {
  switch (e) {
    case Event::Listen: return "Listen";
    case Event::Connect: return "Connect";
    case Event::AddrResolved: return "AddrResolved";
    case Event::RouteResolved: return "RouteResolved";
    case Event::Accept: return "Accept";
    case Event::Established: return "Established";
    case Event::Disconnect: return "Disconnect";
    case Event::PeerDisconnected: return "PeerDisconnected";
    case Event::Failed: return "Failed";
    case Event::TornDown: return "TornDown";
    case Event::Linger: return "Linger";
  }
  return "?";
}

struct Transition {
  State from;
  Event ev;
  State to;
};

// The machine of state.hpp. PeerDisconnected is valid from Connected only: the transition
// function rejects it before the connection is established (state.cpp), although the diagram in
// state.hpp lists it for "any open state".
const Transition kValid[] = {
    // listen
    {State::Idle, Event::Listen, State::Listening},
    {State::Listening, Event::Disconnect, State::Closing},
    {State::Listening, Event::Failed, State::Closing},
    // connect
    {State::Idle, Event::Connect, State::ResolvingAddr},
    {State::ResolvingAddr, Event::AddrResolved, State::ResolvingRoute},
    {State::ResolvingRoute, Event::RouteResolved, State::Connecting},
    {State::Connecting, Event::Established, State::Connected},
    {State::ResolvingAddr, Event::Disconnect, State::Closing},
    {State::ResolvingAddr, Event::Failed, State::Closing},
    {State::ResolvingRoute, Event::Disconnect, State::Closing},
    {State::ResolvingRoute, Event::Failed, State::Closing},
    {State::Connecting, Event::Disconnect, State::Closing},
    {State::Connecting, Event::Failed, State::Closing},
    // accept
    {State::Idle, Event::Accept, State::Accepting},
    {State::Accepting, Event::Established, State::Connected},
    {State::Accepting, Event::Disconnect, State::Closing},
    {State::Accepting, Event::Failed, State::Closing},
    // connected
    {State::Connected, Event::Disconnect, State::Closing},
    {State::Connected, Event::PeerDisconnected, State::Closing},
    {State::Connected, Event::Failed, State::Closing},
    // an orderly disconnect that first sends the done counts it owes
    {State::Connected, Event::Linger, State::Lingering},
    {State::Lingering, Event::Disconnect, State::Closing},
    {State::Lingering, Event::Failed, State::Closing},
    {State::Lingering, Event::PeerDisconnected, State::Closing},
    // teardown
    {State::Closing, Event::TornDown, State::Closed},
};

const Transition *find_valid(State from, Event ev) {
  for (const Transition &t : kValid)
    if (t.from == from && t.ev == ev) return &t;
  return nullptr;
}

// Applies ev in from and checks that it is accepted and leads to `to`.
void assert_transition(State from, Event ev, State to) {
  State out = to == State::Closed ? State::Idle : State::Closed;  // so a missing write shows
  if (!ibmsg::transition(from, ev, &out))
    fail_msg("%s in state %s was rejected, expected %s", event_name(ev), ibmsg::state_name(from),
             ibmsg::state_name(to));
  if (out != to)
    fail_msg("%s in state %s led to %s, expected %s", event_name(ev), ibmsg::state_name(from),
             ibmsg::state_name(out), ibmsg::state_name(to));
}

// Runs a sequence of events from Idle and checks each step.
void assert_path(const Event *evs, const State *expected, size_t n) {
  State s = State::Idle;
  for (size_t i = 0; i < n; ++i) {
    assert_transition(s, evs[i], expected[i]);
    ibmsg::transition(s, evs[i], &s);
  }
}

// --- valid transitions --------------------------------------------------------------------------

void listen_path_goes_through_listening_to_closed(void **) {
  const Event evs[] = {Event::Listen, Event::Disconnect, Event::TornDown};
  const State to[] = {State::Listening, State::Closing, State::Closed};
  assert_path(evs, to, 3);
}

void connect_path_resolves_address_then_route_then_connects(void **) {
  const Event evs[] = {Event::Connect,     Event::AddrResolved, Event::RouteResolved,
                       Event::Established, Event::Disconnect,   Event::TornDown};
  const State to[] = {State::ResolvingAddr, State::ResolvingRoute, State::Connecting,
                      State::Connected,     State::Closing,        State::Closed};
  assert_path(evs, to, 6);
}

void accept_path_goes_through_accepting_to_connected(void **) {
  const Event evs[] = {Event::Accept, Event::Established, Event::PeerDisconnected, Event::TornDown};
  const State to[] = {State::Accepting, State::Connected, State::Closing, State::Closed};
  assert_path(evs, to, 4);
}

void disconnect_closes_every_open_state(void **) {
  const State open[] = {State::Listening,  State::ResolvingAddr, State::ResolvingRoute,
                        State::Connecting, State::Accepting,     State::Connected,
                        State::Lingering};
  for (State s : open) assert_transition(s, Event::Disconnect, State::Closing);
}

void failure_closes_every_open_state(void **) {
  const State open[] = {State::Listening,  State::ResolvingAddr, State::ResolvingRoute,
                        State::Connecting, State::Accepting,     State::Connected,
                        State::Lingering};
  for (State s : open) assert_transition(s, Event::Failed, State::Closing);
}

void peer_disconnect_closes_a_connection(void **) {
  assert_transition(State::Connected, Event::PeerDisconnected, State::Closing);
}

void a_lingering_disconnect_closes_whatever_ends_it(void **) {
  // ibmsg_disconnect while done counts are owed: Lingering until they went (Disconnect), the
  // linger time ran out (Disconnect), the connection failed (Failed) or the peer disconnected.
  const Event evs[] = {Event::Accept, Event::Established, Event::Linger, Event::Disconnect,
                       Event::TornDown};
  const State to[] = {State::Accepting, State::Connected, State::Lingering, State::Closing,
                      State::Closed};
  assert_path(evs, to, 5);
  assert_transition(State::Lingering, Event::Failed, State::Closing);
  assert_transition(State::Lingering, Event::PeerDisconnected, State::Closing);
  State out = State::Idle;
  assert_false(ibmsg::transition(State::Lingering, Event::Linger, &out));  // lingers once
  assert_false(ibmsg::transition(State::Accepting, Event::Linger, &out));  // only when connected
}

void torn_down_closes_a_closing_socket(void **) {
  assert_transition(State::Closing, Event::TornDown, State::Closed);
}

void every_listed_transition_is_accepted(void **) {
  for (const Transition &t : kValid) assert_transition(t.from, t.ev, t.to);
}

// --- invalid transitions ------------------------------------------------------------------------

void every_other_state_event_pair_is_rejected_and_leaves_the_output(void **) {
  unsigned rejected = 0;
  for (State from : kStates) {
    for (Event ev : kEvents) {
      if (find_valid(from, ev)) continue;
      // Two different sentinels: an implementation that writes any state shows with one of them.
      for (State sentinel : {State::Connected, State::Idle}) {
        State out = sentinel;
        if (ibmsg::transition(from, ev, &out))
          fail_msg("%s in state %s was accepted (leading to %s), expected it to be rejected",
                   event_name(ev), ibmsg::state_name(from), ibmsg::state_name(out));
        if (out != sentinel)
          fail_msg("rejected %s in state %s still wrote %s to the output", event_name(ev),
                   ibmsg::state_name(from), ibmsg::state_name(out));
      }
      ++rejected;
    }
  }
  // 10 states x 11 events, less the valid ones: guards against an empty loop.
  assert_int_equal(rejected, 10 * 11 - sizeof kValid / sizeof kValid[0]);
}

void closed_is_final(void **) {
  for (Event ev : kEvents) {
    State out = State::Closed;
    if (ibmsg::transition(State::Closed, ev, &out))
      fail_msg("%s reopened a closed socket (to %s)", event_name(ev), ibmsg::state_name(out));
  }
}

void closing_twice_is_rejected(void **) {
  // ibmsg_disconnect() on a closing socket is IBMSG_ESTATE; a second failure must not restart
  // the teardown either.
  State out = State::Idle;
  assert_false(ibmsg::transition(State::Closing, Event::Disconnect, &out));
  assert_false(ibmsg::transition(State::Closing, Event::Failed, &out));
  assert_false(ibmsg::transition(State::Closing, Event::PeerDisconnected, &out));
}

void a_socket_is_set_up_only_once(void **) {
  // Listen, Connect and Accept are valid in Idle only.
  for (State from : kStates) {
    if (from == State::Idle) continue;
    for (Event ev : {Event::Listen, Event::Connect, Event::Accept}) {
      State out = from;
      if (ibmsg::transition(from, ev, &out))
        fail_msg("%s accepted in state %s", event_name(ev), ibmsg::state_name(from));
    }
  }
}

// --- what the application sees ------------------------------------------------------------------

void assert_status(State s, int reason, ibmsg_socket_status expected) {
  ibmsg_socket_status got = ibmsg::public_status(s, reason);
  if (got != expected)
    fail_msg("public_status(%s, %d) is %d, expected %d", ibmsg::state_name(s), reason, int(got),
             int(expected));
}

void public_status_of_each_open_state(void **) {
  assert_status(State::Idle, IBMSG_OK, IBMSG_UNCONNECTED);
  assert_status(State::Listening, IBMSG_OK, IBMSG_LISTENING);
  assert_status(State::ResolvingAddr, IBMSG_OK, IBMSG_UNCONNECTED);  // not resolved yet
  assert_status(State::ResolvingRoute, IBMSG_OK, IBMSG_ADDRESS_RESOLVED);
  assert_status(State::Connecting, IBMSG_OK, IBMSG_ROUTE_RESOLVED);
  assert_status(State::Accepting, IBMSG_OK, IBMSG_ROUTE_RESOLVED);
  assert_status(State::Connected, IBMSG_OK, IBMSG_CONNECTED);
  assert_status(State::Lingering, IBMSG_OK, IBMSG_DISCONNECTING);  // the application closed it
  assert_status(State::Closing, IBMSG_OK, IBMSG_DISCONNECTING);
}

void public_status_of_an_orderly_close_is_unconnected(void **) {
  assert_status(State::Closed, IBMSG_OK, IBMSG_UNCONNECTED);          // ibmsg_disconnect()
  assert_status(State::Closed, IBMSG_ECONNRESET, IBMSG_UNCONNECTED);  // the peer disconnected
}

void public_status_of_a_close_for_any_error_is_error(void **) {
  const int reasons[] = {
#define REASON(name, value, text) IBMSG_##name,
      IBMSG_ERRNO_MAP(REASON) IBMSG_ERROR_MAP(REASON)
#undef REASON
      -1, 9999};
  for (int r : reasons) {
    if (r == IBMSG_ECONNRESET) continue;
    assert_status(State::Closed, r, IBMSG_ERROR);
  }
}

void public_status_ignores_the_reason_until_closed(void **) {
  // close_reason is set before the teardown finishes; the socket is still closing, not failed.
  assert_status(State::Closing, IBMSG_EIO, IBMSG_DISCONNECTING);
  assert_status(State::Connected, IBMSG_EIO, IBMSG_CONNECTED);
  assert_status(State::Listening, IBMSG_ENODEV, IBMSG_LISTENING);
}

void state_can_post_only_when_connected(void **) {
  for (State s : kStates)
    if (ibmsg::state_can_post(s) != (s == State::Connected))
      fail_msg("state_can_post(%s) is %d", ibmsg::state_name(s), ibmsg::state_can_post(s));
}

void state_has_buffers_from_connecting_or_accepting_until_closing(void **) {
  for (State s : kStates) {
    // (lingering: a message may still be allocated, not posted)
    bool expected = s == State::Connecting || s == State::Accepting || s == State::Connected ||
                    s == State::Lingering;
    if (ibmsg::state_has_buffers(s) != expected)
      fail_msg("state_has_buffers(%s) is %d", ibmsg::state_name(s), ibmsg::state_has_buffers(s));
  }
}

void state_names_are_distinct(void **) {
  for (State a : kStates) {
    const char *na = ibmsg::state_name(a);
    assert_non_null(na);
    assert_true(na[0] != '\0');
    assert_string_not_equal(na, "?");  // every state must have its own name
    for (State b : kStates)
      if (a != b && strcmp(na, ibmsg::state_name(b)) == 0)
        fail_msg("two states are both called \"%s\"", na);
  }
}

}  // namespace

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(listen_path_goes_through_listening_to_closed),
      cmocka_unit_test(connect_path_resolves_address_then_route_then_connects),
      cmocka_unit_test(accept_path_goes_through_accepting_to_connected),
      cmocka_unit_test(disconnect_closes_every_open_state),
      cmocka_unit_test(failure_closes_every_open_state),
      cmocka_unit_test(peer_disconnect_closes_a_connection),
      cmocka_unit_test(a_lingering_disconnect_closes_whatever_ends_it),
      cmocka_unit_test(torn_down_closes_a_closing_socket),
      cmocka_unit_test(every_listed_transition_is_accepted),
      cmocka_unit_test(every_other_state_event_pair_is_rejected_and_leaves_the_output),
      cmocka_unit_test(closed_is_final),
      cmocka_unit_test(closing_twice_is_rejected),
      cmocka_unit_test(a_socket_is_set_up_only_once),
      cmocka_unit_test(public_status_of_each_open_state),
      cmocka_unit_test(public_status_of_an_orderly_close_is_unconnected),
      cmocka_unit_test(public_status_of_a_close_for_any_error_is_error),
      cmocka_unit_test(public_status_ignores_the_reason_until_closed),
      cmocka_unit_test(state_can_post_only_when_connected),
      cmocka_unit_test(state_has_buffers_from_connecting_or_accepting_until_closing),
      cmocka_unit_test(state_names_are_distinct),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
