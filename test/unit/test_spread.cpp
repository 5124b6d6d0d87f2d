// test_spread.cpp - connections accepted onto another loop (ibmsg_accept_on) and a listener
// that spreads its connections over loops (ibmsg_listen_spread), issue 25, over the fake
// transport: both loops run on this thread here (the fake is not thread-safe); the hand-over
// between them is the real one (handover.cpp, an eventfd). What must hold: the connection lives
// on the other loop (its callbacks are that loop's, its socket names it), messages flow both
// ways in order, it closes once; round robin alternates exactly; the listener's max_connections
// counts the connections on other loops and frees their places when they close; a set-up that
// fails on the other loop reaches that loop's connection_closed once and rejects the peer; bad
// arguments are refused. The fixture's teardown checks every socket closed exactly once.
#include <csetjmp>
#include <cstdarg>
#include <cstddef>
#include <cstring>
#include <string>
#include <vector>

#include "harness.hpp"
#include "ibmsg.hpp"

namespace fake = ibmsg::fake;
using namespace ibmsg::fake::harness;

namespace {

int setup(void **state) {
  return fixture_setup(state, [](H *h) {
    h->disconnect_in_closed = true;
    init_loop(h, &h->loop2);
    h->loop2_alive = true;
    return 0;
  });
}

void accepted_on_another_loop_lives_there_and_carries_messages_both_ways(void **state) {
  H *h = h_of(state);
  h->accept_on = &h->loop2;
  Pair p = connected(h);
  expect_code(h->accept_rc, IBMSG_OK);
  assert_ptr_equal(p.a->s.loop, &h->loop2);   // the accepted socket names its loop
  assert_ptr_equal(p.c->s.loop, &h->loop);
  assert_int_equal(p.a->established, 1);
  for (int i = 0; i < 20; ++i) {
    expect_code(send_msg(*p.c, 100), IBMSG_OK);
    expect_code(send_msg(*p.a, 200), IBMSG_OK);
  }
  RUN_UNTIL(h, p.a->received == 20 && p.c->received == 20);
  assert_int_equal(p.a->bad_order + p.c->bad_order, 0);
  // Its calls are its loop's: the stats of the accepted socket are there.
  ibmsg_stats st;
  expect_code(ibmsg_socket_stats(&p.a->s, &st, sizeof st), IBMSG_OK);
  assert_int_equal(st.msgs_received, 20);
  expect_code(ibmsg_disconnect(&p.a->s), IBMSG_OK);
  RUN_UNTIL(h, p.a->closed && p.c->closed);
  expect_code(p.a->close_reason, IBMSG_OK);
}

void accept_on_the_listeners_own_loop_or_null_is_a_plain_accept(void **state) {
  H *h = h_of(state);
  h->accept_on = &h->loop;
  Pair p = connected(h);
  assert_ptr_equal(p.a->s.loop, &h->loop);
  Conn &l2 = listener(h);
  h->accept_on = nullptr;  // (the harness's plain ibmsg_accept_opts)
  Pair q = connect_to(h, l2);
  assert_ptr_equal(q.a->s.loop, &h->loop);
}

void a_spreading_listener_alternates_its_loops(void **state) {
  H *h = h_of(state);
  Conn &l = listener(h);
  ibmsg_event_loop *loops[] = {&h->loop2, &h->loop};
  expect_code(ibmsg_listen_spread(&l.s, loops, 2), IBMSG_OK);
  for (int i = 0; i < 6; ++i) connect_to(h, l);
  assert_int_equal(h->accepted.size(), 6);
  for (size_t i = 0; i < 6; ++i)
    assert_ptr_equal(h->accepted[i]->s.loop, i % 2 == 0 ? &h->loop2 : &h->loop);
  for (Conn *a : h->accepted) expect_code(send_msg(*a, 64), IBMSG_OK);
  RUN_UNTIL(h, [&] {
    for (Conn &c : h->conns)
      if (std::strcmp(c.name, "client") == 0 && c.received != 1) return false;
    return true;
  }());
  // Count 0 ends the spreading: the next one stays on the listener's loop.
  expect_code(ibmsg_listen_spread(&l.s, nullptr, 0), IBMSG_OK);
  Pair p = connect_to(h, l);
  assert_ptr_equal(p.a->s.loop, &h->loop);
}

void max_connections_counts_the_connections_on_other_loops(void **state) {
  H *h = h_of(state);
  h->accept_on = &h->loop2;
  Conn &l = listener(h, nullptr, 2);
  Pair a = connect_to(h, l);
  connect_to(h, l);
  Conn &third = client(h, port_of(l));
  RUN_UNTIL(h, third.closed);
  expect_code(third.close_reason, IBMSG_EREJECTED);
  assert_string_equal(third.s.reject_reason, "too many connections");
  // One of them closes on its loop: its place is free again.
  expect_code(ibmsg_disconnect(&a.a->s), IBMSG_OK);
  RUN_UNTIL(h, a.a->closed && a.c->closed);
  Pair d = connect_to(h, l);
  assert_ptr_equal(d.a->s.loop, &h->loop2);
  // The listener closes first: its connections on the other loop stay up and close later.
  expect_code(ibmsg_disconnect(&l.s), IBMSG_OK);
  RUN_UNTIL(h, l.closed);
  expect_code(send_msg(*d.c, 10), IBMSG_OK);
  RUN_UNTIL(h, d.a->received == 1);
}

void a_set_up_that_fails_on_the_other_loop_closes_there_once_and_rejects_the_peer(void **state) {
  H *h = h_of(state);
  h->accept_on = &h->loop2;
  Conn &l = listener(h);
  fake::fail_call(fake::Call::CmAccept, IBMSG_ECONNRESET);
  Conn &c = client(h, port_of(l));
  RUN_UNTIL(h, c.closed && h->accepted.size() == 1 && h->accepted[0]->closed);
  Conn *a = h->accepted[0];
  expect_code(h->accept_rc, IBMSG_OK);  // handed over: the failure comes later, on loop2
  expect_code(a->close_reason, IBMSG_ECONNRESET);
  assert_int_equal(a->established, 0);
  assert_int_equal(a->s.status, IBMSG_ERROR);
  assert_ptr_equal(a->s.loop, &h->loop2);
  expect_code(c.close_reason, IBMSG_EREJECTED);
  // The listener's count is back: another connection is accepted.
  Pair p = connect_to(h, l);
  assert_ptr_equal(p.a->s.loop, &h->loop2);
}

// A struct handed to a loop that has not set it up yet is open: a second accept of it is
// refused (IBMSG_ESTATE), so that no connection is lost under another.
Conn *same_struct = nullptr;
std::vector<int> same_struct_rcs;

void accept_all_into_one_struct(ibmsg_connection_request *req) {
  H *h = static_cast<H *>(req->loop->user_data);
  const int rc = ibmsg_accept_on(req, &h->loop2, &same_struct->s, nullptr);
  same_struct_rcs.push_back(rc);
  if (rc == IBMSG_OK) {
    same_struct->opened = true;
    h->accepted.push_back(same_struct);
  }
}

void a_struct_waiting_for_its_loop_cannot_be_accepted_again(void **state) {
  H *h = h_of(state);
  Conn &l = listener(h);
  same_struct = &new_conn(h, "accepted");
  same_struct_rcs.clear();
  h->loop.connection_request = accept_all_into_one_struct;
  h->loop2_alive = false;  // loop 2 does not run: the first hand-over waits
  Conn &c1 = client(h, port_of(l));
  Conn &c2 = client(h, port_of(l));
  RUN_UNTIL(h, same_struct_rcs.size() == 2 && c2.closed);
  expect_code(same_struct_rcs[0], IBMSG_OK);
  expect_code(same_struct_rcs[1], IBMSG_ESTATE);
  expect_code(c2.close_reason, IBMSG_EREJECTED);
  assert_false(same_struct->established);
  h->loop2_alive = true;
  RUN_UNTIL(h, c1.established && same_struct->established);
  assert_ptr_equal(same_struct->s.loop, &h->loop2);
  h->loop.connection_request = on_request;
}

int bad_on_rc = -1, bad_own_socket_rc = -1, decided_rc = -1;
ibmsg_socket bad_sock;

void request_trying_bad_calls(ibmsg_connection_request *req) {
  H *h = static_cast<H *>(req->loop->user_data);
  ibmsg_event_loop bogus;
  std::memset(&bogus, 0, sizeof bogus);
  bad_on_rc = ibmsg_accept_on(req, &bogus, &bad_sock, nullptr);
  Conn &c = new_conn(h, "accepted");
  h->accept_rc = ibmsg_accept_on(req, &h->loop2, &c.s, nullptr);
  if (h->accept_rc == IBMSG_OK) {
    c.opened = true;
    h->accepted.push_back(&c);
  }
  decided_rc = ibmsg_accept_on(req, &h->loop2, &bad_sock, nullptr);
  bad_own_socket_rc = ibmsg_accept_on(req, &h->loop2, nullptr, nullptr);
}

void bad_arguments_are_refused(void **state) {
  H *h = h_of(state);
  Conn &l = listener(h);
  ibmsg_event_loop *loops[65];
  for (auto &x : loops) x = &h->loop2;
  expect_code(ibmsg_listen_spread(&l.s, loops, 65), IBMSG_EINVAL);
  expect_code(ibmsg_listen_spread(&l.s, loops, -1), IBMSG_EINVAL);
  expect_code(ibmsg_listen_spread(&l.s, nullptr, 1), IBMSG_EINVAL);
  expect_code(ibmsg_listen_spread(nullptr, loops, 1), IBMSG_EINVAL);
  ibmsg_event_loop bogus;
  std::memset(&bogus, 0, sizeof bogus);
  ibmsg_event_loop *bad[] = {&h->loop2, &bogus};
  expect_code(ibmsg_listen_spread(&l.s, bad, 2), IBMSG_EINVAL);
  // Not a listener.
  Pair p = connect_to(h, l);
  expect_code(ibmsg_listen_spread(&p.c->s, loops, 1), IBMSG_ESTATE);  // not a listener
  // Outside the callback: no request to accept.
  ibmsg_connection_request none;
  std::memset(&none, 0, sizeof none);
  expect_code(ibmsg_accept_on(&none, &h->loop2, &bad_sock, nullptr), IBMSG_EINVAL);
  expect_code(ibmsg_accept_on(nullptr, &h->loop2, &bad_sock, nullptr), IBMSG_EINVAL);
  // In the callback: an invalid loop, then accepted, then decided already.
  h->loop.connection_request = request_trying_bad_calls;
  Conn &c = client(h, port_of(l));
  RUN_UNTIL(h, c.established && h->accepted.size() == 2 && h->accepted[1]->established);
  expect_code(bad_on_rc, IBMSG_EINVAL);
  expect_code(h->accept_rc, IBMSG_OK);
  expect_code(decided_rc, IBMSG_ESTATE);
  expect_code(bad_own_socket_rc, IBMSG_EINVAL);
  assert_ptr_equal(h->accepted[1]->s.loop, &h->loop2);
  h->loop.connection_request = on_request;
}

// The C++ wrapper: socket::spread and connection_request::accept_on; the accepted socket's
// callbacks come from the loop it lives on, with the socket object the application gave.
void cxx_spread_and_accept_on_deliver_to_the_other_loops_handlers(void **state) {
  (void)state;
  ibmsg::loop a, b;
  ibmsg::socket listener, client, spread_in, explicit_in;
  ibmsg::socket *on_b_established = nullptr;
  int b_received = 0, a_requests = 0, a_established = 0;
  std::string got;
  a.on_connection_request([&](ibmsg::connection_request &r) {
    ++a_requests;
    if (a_requests == 1) r.accept(spread_in);  // the listener spreads onto b
    else r.accept_on(b, explicit_in);
  });
  a.on_connection_established([&](ibmsg::socket &) { ++a_established; });
  b.on_connection_established([&](ibmsg::socket &s) { on_b_established = &s; });
  b.on_message_received([&](ibmsg::socket &, ibmsg::message m) {
    ++b_received;
    got.assign(static_cast<const char *>(m.data()), m.size());
  });
  listener.listen(a, nullptr, 0, 8);
  listener.spread({&b});
  client.connect(a, "127.0.0.1", listener.local_port());
  auto run = [&](const std::function<bool()> &done) {
    for (int i = 0; i < 400 && !done(); ++i) {
      a.dispatch(1);
      b.dispatch(0);
    }
    return done();
  };
  assert_true(run([&] { return on_b_established == &spread_in && a_established == 1; }));
  assert_ptr_equal(spread_in.handle()->loop, b.handle());
  ibmsg::message m;
  assert_true(m.alloc(client, 5));
  std::memcpy(m.data(), "hello", 5);
  assert_true(m.post(client));
  assert_true(run([&] { return b_received == 1; }));
  assert_string_equal(got.c_str(), "hello");
  // No more spreading: accept_on says where (b again), explicitly.
  listener.spread({});
  ibmsg::socket client2;
  client2.connect(a, "127.0.0.1", listener.local_port());
  assert_true(run([&] { return on_b_established == &explicit_in && a_established == 2; }));
  assert_ptr_equal(explicit_in.handle()->loop, b.handle());
  // A listener that is not one: spread refuses.
  try {
    client.spread({&b});
    fail_msg("spread on a connection did not throw");
  } catch (const ibmsg::error &e) {
    expect_code(e.code(), IBMSG_ESTATE);
  }
  client.disconnect();
  client2.disconnect();
  listener.disconnect();
  assert_true(run([&] { return !spread_in.is_open() && !explicit_in.is_open() && !listener.is_open(); }));
}

}  // namespace

#define T(name) cmocka_unit_test_setup_teardown(name, setup, teardown)

int main(void) {
  const struct CMUnitTest tests[] = {
      T(accepted_on_another_loop_lives_there_and_carries_messages_both_ways),
      T(accept_on_the_listeners_own_loop_or_null_is_a_plain_accept),
      T(a_spreading_listener_alternates_its_loops),
      T(max_connections_counts_the_connections_on_other_loops),
      T(a_set_up_that_fails_on_the_other_loop_closes_there_once_and_rejects_the_peer),
      T(bad_arguments_are_refused),
      T(a_struct_waiting_for_its_loop_cannot_be_accepted_again),
      T(cxx_spread_and_accept_on_deliver_to_the_other_loops_handlers),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
