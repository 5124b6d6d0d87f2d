// test_poll.cpp - busy polling (IBMSG_OPT_BUSY_POLL) in the core, over the fake transport
// (test/fake), through the public C API: a polling connection's CQ stays unarmed and its
// completions never signal the device's fd; an adaptive one polls through a burst, then arms its
// CQ, polls once more (a completion that arrived just before the arming is found) and sleeps until
// the fd wakes it; event mode arms after every wake-up, polling before it reads the event; ibmsg_event_loop_timeout() is 0 exactly
// while something polls; a failing arm closes only its connection; closing stops the polling;
// the option per socket; credits due in a callback ride on the message it posts.
//
// The fixture is test/fake/harness.hpp's, with replies sent from the callbacks and the CQ's arming
// recorded there (rx_probe).
// Every test runs on a fresh loop and a reset fake. The teardown closes what the test left open
// and then checks what must hold after any scenario: each socket that was set up closed exactly
// once, no callback after its closed callback, one message_sent per posted message, messages in
// order, no reply that failed to go out, the loop destroys, everything released in the fake, no
// RNR and no misuse of the transport, and no invalid state transition.
//
// The arming is read from the fake (fake::cq_info on the connection's CQ) and whether the loop
// polls from the core's loop (internal.hpp): white-box, as the property is about them.
#include "harness.hpp"  // the fixture: H, Conn, the callbacks, run_until, setup and teardown

#include <poll.h>
#include <time.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "internal.hpp"  // the socket's CQ, the loop's poller
#include "errors.hpp"    // ibmsg::invalid_transitions

namespace fake = ibmsg::fake;
using namespace ibmsg::fake::harness;

namespace {

// --- what this file adds to the harness (test/fake/harness.hpp) ---------------------------------

ibmsg_options *busy_poll(H *h, int value) { return options(h, {{IBMSG_OPT_BUSY_POLL, value}}); }

void set_loop_busy_poll(H *h, int value) {
  expect_code(ibmsg_setopt(&h->loop, IBMSG_OPT_BUSY_POLL, &value, sizeof value), IBMSG_OK);
}

ibmsg::tp::Cq *cq_of(const Conn &c) { return c.s.impl ? c.s.impl->res.cq : nullptr; }
fake::CqInfo cq(const Conn &c) { return fake::cq_info(cq_of(c)); }
bool polls(const Conn &c) { return c.s.impl && c.s.impl->poll_node.linked(); }
int loop_polling(H *h) { return int(h->loop.impl->pollers.size()); }
bool poller_running(H *h) { return ev_is_active(&h->loop.impl->poller); }
// ibmsg_event_loop_timeout(), checked against ibmsg_event_loop_next_timeout(): both give the
// same answer for a valid loop (-1 for none as well), the latter with IBMSG_OK.
int loop_timeout(H *h) {
  int ms = -77;
  const int t = ibmsg_event_loop_timeout(&h->loop);
  expect_code(ibmsg_event_loop_next_timeout(&h->loop, &ms), IBMSG_OK);
  assert_int_equal(ms, t);
  expect_code(ibmsg_event_loop_next_timeout(&h->loop, nullptr), IBMSG_EINVAL);
  return t;
}

// Drives the loop as a foreign event loop would (ibmsg_event_loop_process while
// ibmsg_event_loop_timeout() says 0) until the timeout is no longer 0; the milliseconds that
// took, or -1 if it still was 0 after limit_ms.
double process_while_polling(H *h, double limit_ms = 3000) {
  double start = now_ms();
  while (loop_timeout(h) == 0) {
    if (now_ms() - start > limit_ms) return -1;
    expect_code(ibmsg_event_loop_process(&h->loop), IBMSG_OK);
  }
  return now_ms() - start;
}

// Whether the loop's fd (ibmsg_event_loop_fd) is readable now.
bool loop_fd_readable(H *h) {
  pollfd p{ibmsg_event_loop_fd(&h->loop), POLLIN, 0};
  return poll(&p, 1, 0) == 1 && (p.revents & POLLIN);
}

// One message each way, so that each CQ has had its first completion.
void exchange(H *h, Pair p) {
  uint64_t a0 = p.a->received, c0 = p.c->received;
  expect_code(send_msg(*p.c, 16), IBMSG_OK);
  RUN_UNTIL(h, p.a->received == a0 + 1);
  expect_code(send_msg(*p.a, 16), IBMSG_OK);
  RUN_UNTIL(h, p.c->received == c0 + 1);
}

// n round trips started by the client, each answered from message_received on both sides.
void ping_pong(H *h, Pair p, int n) {
  uint64_t a0 = p.a->received, c0 = p.c->received;
  p.a->replies_left = n;
  p.c->replies_left = n - 1;
  expect_code(send_msg(*p.c, 16), IBMSG_OK);
  RUN_UNTIL(h, p.a->received == a0 + uint64_t(n) && p.c->received == c0 + uint64_t(n));
  assert_int_equal(p.a->reply_errors, 0);
  assert_int_equal(p.c->reply_errors, 0);
}

void reset_rx(Conn &c) {
  c.rx_armed = 0;
  c.rx_seen = false;
  c.rx_polling = 0;
  c.rx_unread = 0;
}

// Seq payloads, checked byte for byte; ibmsg_disconnect is called (and checked) in every closed
// callback; each received message records how it found its CQ (armed, signalled, polling).
int setup(void **state) {
  return fixture_setup(state, [](H *h) {
    // No keepalive timer: these tests check that nothing but polling sets the loop's timeout.
    int off = 0;
    if (ibmsg_setopt(&h->loop, IBMSG_OPT_KEEPALIVE, &off, sizeof off) != IBMSG_OK) return -1;
    h->disconnect_in_closed = true;
    h->max_rounds = 2000;
    h->rx_probe = [](Conn &c, ibmsg_buffer *) {
      fake::CqInfo info = cq(c);
      if (info.armed) ++c.rx_armed;
      if (info.signals > info.taken) ++c.rx_unread;
      if (!c.rx_seen) c.rx_first = info;
      c.rx_seen = true;
      c.rx_last = info;
      if (polls(c)) ++c.rx_polling;
    };
    h->extra_checks = [](H *hh, std::string *errs) {
      if (loop_polling(hh) != 0)
        *errs += "\n  the loop still counts " + std::to_string(loop_polling(hh)) +
                 " polling connections";
    };
    return 0;
  });
}

// === the option ===============================================================================

void busy_poll_option_takes_always_zero_and_microseconds(void **state) {
  H *h = h_of(state);
  int v = 12345;
  size_t len = sizeof v;
  expect_code(ibmsg_getopt(&h->loop, IBMSG_OPT_BUSY_POLL, &v, &len), IBMSG_OK);
  assert_int_equal(v, 0);  // events by default
  for (int ok : {IBMSG_BUSY_POLL_ALWAYS, 0, 1, 2000, 10 * 1000 * 1000}) {
    expect_code(ibmsg_setopt(&h->loop, IBMSG_OPT_BUSY_POLL, &ok, sizeof ok), IBMSG_OK);
    len = sizeof v;
    expect_code(ibmsg_getopt(&h->loop, IBMSG_OPT_BUSY_POLL, &v, &len), IBMSG_OK);
    assert_int_equal(v, ok);
  }
  ibmsg_options *o = busy_poll(h, 2000);
  for (int bad : {-2, INT32_MIN, 10 * 1000 * 1000 + 1}) {
    expect_code(ibmsg_setopt(&h->loop, IBMSG_OPT_BUSY_POLL, &bad, sizeof bad), IBMSG_EINVAL);
    expect_code(ibmsg_options_set(o, IBMSG_OPT_BUSY_POLL, &bad, sizeof bad), IBMSG_EINVAL);
  }
  len = sizeof v;
  expect_code(ibmsg_options_get(o, IBMSG_OPT_BUSY_POLL, &v, &len), IBMSG_OK);
  assert_int_equal(v, 2000);  // a refused value changes nothing
}

// === always ===================================================================================

void always_polling_ping_pongs_without_arming_or_signalling(void **state) {
  H *h = h_of(state);
  ibmsg_options *o = busy_poll(h, IBMSG_BUSY_POLL_ALWAYS);
  Pair p = connected(h, o, o);
  int epfd = ibmsg_event_loop_fd(&h->loop);
  assert_true(epfd >= 0);
  exchange(h, p);
  settle(h);
  // The CQ is created armed: its first completion may have signalled once, never again.
  fake::CqInfo c0 = cq(*p.c), a0 = cq(*p.a);
  assert_false(c0.armed);
  assert_false(a0.armed);
  assert_true(c0.signals <= 1);
  assert_true(a0.signals <= 1);
  assert_int_equal(c0.arms, 0);
  assert_int_equal(a0.arms, 0);
  assert_true(polls(*p.c) && polls(*p.a));
  assert_int_equal(loop_polling(h), 2);
  assert_int_equal(loop_timeout(h), 0);

  reset_rx(*p.c);
  reset_rx(*p.a);
  ping_pong(h, p, 1000);
  settle(h);
  for (Conn *c : {p.c, p.a}) {
    fake::CqInfo now = cq(*c);
    assert_false(now.armed);
    assert_int_equal(now.arms, 0);
    assert_int_equal(now.signals, (c == p.c ? c0 : a0).signals);
    assert_int_equal(c->rx_armed, 0);
    assert_int_equal(c->rx_polling, 1000);
    assert_int_equal(c->received, 1001);
    assert_int_equal(c->sent_ok, 1001);
  }
  assert_false(loop_fd_readable(h));  // nothing for the fd: the completions were polled
  assert_int_equal(loop_timeout(h), 0);
  assert_true(poller_running(h));
  // The loop does not sleep while a connection polls: a round is one slice of spinning.
  double t = now_ms();
  expect_code(ibmsg_dispatch_event_loop_timeout(&h->loop, 2000), IBMSG_OK);
  assert_true(now_ms() - t < 1000);
  assert_int_equal(fake::stats().cq_arms, 0);
}

// === adaptive =================================================================================

void adaptive_polls_through_a_burst_then_arms_and_sleeps(void **state) {
  H *h = h_of(state);
  const int us = 10000;
  set_loop_busy_poll(h, us);
  Pair p = connected(h);
  exchange(h, p);
  reset_rx(*p.c);
  reset_rx(*p.a);
  ping_pong(h, p, 500);
  // During the burst every message was found by polling: no CQ armed, no fd signal after the
  // burst's first message (which may have woken a sleeping side).
  for (Conn *c : {p.c, p.a}) {
    assert_int_equal(c->rx_armed, 0);
    assert_int_equal(c->rx_polling, 500);
    assert_int_equal(c->rx_last.arms, c->rx_first.arms);
    assert_int_equal(c->rx_last.signals, c->rx_first.signals);
  }
  fake::CqInfo c_burst = cq(*p.c), a_burst = cq(*p.a);
  double last = p.c->last_rx_ms;
  // While polling, a foreign loop is told to come back at once; the time after the last
  // activity, both sides arm their CQs and the timeout says to wait for the fd.
  assert_int_equal(loop_timeout(h), 0);
  double took = process_while_polling(h);
  assert_true(took >= 0);
  double quiet = now_ms() - last;
  if (quiet < us / 1000.0 / 2)
    fail_msg("stopped polling %.2f ms after the last activity, the option says %d us", quiet, us);
  assert_int_equal(loop_timeout(h), -1);  // no timer runs
  assert_int_equal(loop_polling(h), 0);
  assert_false(poller_running(h));
  assert_false(polls(*p.c));
  assert_false(polls(*p.a));
  for (auto &x : {std::make_pair(p.c, c_burst), std::make_pair(p.a, a_burst)}) {
    fake::CqInfo now = cq(*x.first);
    assert_true(now.armed);
    assert_int_equal(now.arms, x.second.arms + 1);
    assert_int_equal(now.signals, x.second.signals);
  }
  // Asleep: a round waits for the fd (or its timeout) instead of spinning.
  double t = now_ms();
  expect_code(ibmsg_dispatch_event_loop_timeout(&h->loop, 40), IBMSG_OK);
  assert_true(now_ms() - t >= 30);
  assert_int_equal(loop_timeout(h), -1);
  // A second burst polls again.
  reset_rx(*p.c);
  reset_rx(*p.a);
  ping_pong(h, p, 100);
  assert_int_equal(p.a->rx_armed, 0);
  assert_int_equal(p.c->rx_armed, 0);
  assert_int_equal(p.c->received, 601);
  assert_int_equal(p.a->received, 601);
}

// A sleeping adaptive connection next to an event-mode peer: what arrives signals the fd, a
// blocking dispatch wakes for it, and the message makes the connection poll again.
void sleeping_adaptive_connection_wakes_through_the_fd(void **state) {
  H *h = h_of(state);
  ibmsg_options *o = busy_poll(h, 2000);
  Pair p = connected(h, o, nullptr);  // the accepted side polls, the client does not
  exchange(h, p);
  assert_true(process_while_polling(h) >= 0);
  assert_int_equal(loop_timeout(h), -1);
  assert_false(polls(*p.a));
  fake::CqInfo before = cq(*p.a);
  assert_true(before.armed);
  settle(h, 2);
  assert_false(loop_fd_readable(h));

  expect_code(send_msg(*p.c, 16), IBMSG_OK);  // delivered at once by the fake
  fake::CqInfo after = cq(*p.a);
  assert_int_equal(after.signals, before.signals + 1);
  assert_false(after.armed);
  assert_true(loop_fd_readable(h));
  assert_int_equal(loop_timeout(h), -1);  // an event-mode sender starts no polling
  double t = now_ms();
  for (int i = 0; i < 10 && p.a->received < 2; ++i)
    expect_code(ibmsg_dispatch_event_loop_timeout(&h->loop, 5000), IBMSG_OK);
  assert_true(now_ms() - t < 2000);
  assert_int_equal(p.a->received, 2);
  // Woken by a completion: it polls again, then sleeps again.
  assert_true(polls(*p.a));
  assert_int_equal(loop_timeout(h), 0);
  assert_true(process_while_polling(h) >= 0);
  assert_true(cq(*p.a).armed);
  assert_int_equal(cq(*p.a).arms, before.arms + 1);
  assert_int_equal(loop_timeout(h), -1);
}

// Posting is activity: a sleeping adaptive connection polls from the post on (the completion and
// the answer will come soon), before anything completed.
void posting_on_a_sleeping_adaptive_connection_polls_at_once(void **state) {
  H *h = h_of(state);
  ibmsg_options *o = busy_poll(h, 2000);
  Pair p = connected(h, nullptr, o);  // the client polls, the accepted side does not
  exchange(h, p);
  assert_true(process_while_polling(h) >= 0);
  assert_false(polls(*p.c));
  assert_int_equal(loop_timeout(h), -1);
  fake::pause_wire(true);
  expect_code(send_msg(*p.c, 16), IBMSG_OK);  // stays in flight: nothing completes
  assert_true(polls(*p.c));
  assert_int_equal(loop_timeout(h), 0);
  assert_int_equal(loop_polling(h), 1);
  fake::pause_wire(false);
  RUN_UNTIL(h, p.a->received == 2 && p.c->sent_ok == 2);
  assert_true(process_while_polling(h) >= 0);
  assert_int_equal(loop_timeout(h), -1);
}

// A post from another connection's callback, which the poller runs: the connection posted on
// polls for its time from then on, although nothing of it has completed yet (a relay).
void post_from_a_polled_callback_keeps_the_other_connection_polling(void **state) {
  H *h = h_of(state);
  ibmsg_options *o = busy_poll(h, 10 * 1000 * 1000);  // 10 s: nothing goes to sleep here
  Pair p1 = connected(h, o, o);
  Pair p2 = connected(h, o, o);  // opened after p1: later in the loop's sockets
  exchange(h, p1);
  exchange(h, p2);
  settle(h);
  for (Conn *c : {p1.c, p1.a, p2.c, p2.a}) {
    assert_true(polls(*c));
    assert_int_equal(cq(*c).arms, 0);
  }
  int relay_rc = -1;
  Conn *relay_to = p2.c;
  p1.a->on_rx = [&relay_rc, relay_to] {
    // The wire lags: the relayed message has not completed when the poller looks at p2's client.
    fake::pause_wire(true);
    relay_rc = send_msg(*relay_to, 16);
  };
  expect_code(send_msg(*p1.c, 16), IBMSG_OK);
  RUN_UNTIL(h, p1.a->received == 2);
  p1.a->on_rx = nullptr;
  expect_code(relay_rc, IBMSG_OK);
  settle(h);
  assert_true(polls(*p2.c));
  assert_int_equal(cq(*p2.c).arms, 0);
  fake::pause_wire(false);
  RUN_UNTIL(h, p2.a->received == 2 && p2.c->sent_ok == 2);
}

// One CQ per device: an adaptive connection goes quiet while another one on the device polls
// always. It stops polling; the CQ stays unarmed (the poller keeps polling it for the other one)
// and a message for the quiet one is found by the poller, with no signal, and makes it poll again.
void adaptive_connection_sleeps_while_another_polls_always(void **state) {
  H *h = h_of(state);
  ibmsg_options *always = busy_poll(h, IBMSG_BUSY_POLL_ALWAYS);
  Pair p1 = connected(h, always, always);
  Pair p2 = connected(h, busy_poll(h, 2000), nullptr);  // the accepted side is adaptive
  exchange(h, p1);
  exchange(h, p2);
  assert_ptr_equal(cq_of(*p1.c), cq_of(*p2.a));  // one device, one loop: one CQ
  assert_true(polls(*p2.a));
  double start = now_ms();
  while (polls(*p2.a) && now_ms() - start < 3000)
    expect_code(ibmsg_event_loop_process(&h->loop), IBMSG_OK);
  assert_false(polls(*p2.a));
  assert_false(cq(*p2.a).armed);
  assert_int_equal(cq(*p2.a).arms, 0);
  assert_int_equal(loop_polling(h), 2);
  assert_int_equal(loop_timeout(h), 0);  // the other connection still polls
  uint64_t before = cq(*p2.a).signals;
  reset_rx(*p2.a);
  expect_code(send_msg(*p2.c, 16), IBMSG_OK);
  RUN_UNTIL(h, p2.a->received == 2);
  assert_int_equal(cq(*p2.a).signals, before);
  assert_int_equal(p2.a->rx_polling, 1);
  assert_true(polls(*p2.a));
  ping_pong(h, p1, 100);
  assert_int_equal(cq(*p1.c).arms, 0);
}

// The race the arming must not lose: a message lands in the CQ after the poller's last poll and
// before the CQ is armed (fake::before_cq_arm delivers it from inside cq_arm), so it signals
// nothing. Only the poll after the arming can find it.
struct RaceResult {
  bool hook_ran = false;
  fake::CqInfo at_hook{};
};

RaceResult race_a_message_into_the_arming(H *h, Pair p) {
  RaceResult r;
  exchange(h, p);
  assert_true(polls(*p.a));
  fake::pause_wire(true);
  expect_code(send_msg(*p.c, 16), IBMSG_OK);  // in flight until the wire resumes
  Conn *a = p.a;
  fake::before_cq_arm(cq_of(*a), [&r, a] {
    r.hook_ran = true;
    r.at_hook = cq(*a);
    fake::pause_wire(false);
  });
  double start = now_ms();
  while (!(r.hook_ran && p.a->received == 2) && now_ms() - start < 3000)
    expect_code(ibmsg_dispatch_event_loop_timeout(&h->loop, 1), IBMSG_OK);
  if (!r.hook_ran) fake::before_cq_arm(nullptr, nullptr);  // it refers to r
  return r;
}

void message_arriving_just_before_the_arming_is_not_lost(void **state) {
  H *h = h_of(state);
  ibmsg_options *o = busy_poll(h, 2000);
  Pair p = connected(h, o, nullptr);
  RaceResult r = race_a_message_into_the_arming(h, p);
  assert_true(r.hook_ran);
  assert_false(r.at_hook.armed);
  assert_int_equal(p.a->received, 2);
  // It signalled nothing: the poll after the arming found it.
  assert_int_equal(cq(*p.a).signals, r.at_hook.signals);
  RUN_UNTIL(h, p.c->sent_ok == 2);
  // And the connection still works both ways.
  exchange(h, p);
  assert_int_equal(p.a->received, 3);
}

// The message found by the poll after the arming is the connection's activity: the option says
// it keeps polling for its time after that.
void message_found_at_the_arming_makes_the_connection_poll_again(void **state) {
  H *h = h_of(state);
  ibmsg_options *o = busy_poll(h, 10000);
  Pair p = connected(h, o, nullptr);
  RaceResult r = race_a_message_into_the_arming(h, p);
  assert_true(r.hook_ran);
  assert_int_equal(p.a->received, 2);
  assert_true(polls(*p.a));
  assert_int_equal(loop_timeout(h), 0);
}

// === event mode ===============================================================================

void event_mode_arms_after_every_wakeup_and_never_polls(void **state) {
  H *h = h_of(state);
  Pair p = connected(h);
  int zero_timeouts = 0, polling_rounds = 0;
  auto check = [&] {
    if (loop_timeout(h) == 0) ++zero_timeouts;
    if (loop_polling(h) != 0 || poller_running(h)) ++polling_rounds;
  };
  p.a->replies_left = 200;
  p.c->replies_left = 199;
  expect_code(send_msg(*p.c, 16), IBMSG_OK);
  RUN_UNTIL(h, (check(), p.a->received == 200 && p.c->received == 200));
  settle(h);
  assert_int_equal(zero_timeouts, 0);
  assert_int_equal(polling_rounds, 0);
  assert_int_equal(loop_timeout(h), -1);
  for (Conn *c : {p.c, p.a}) {
    fake::CqInfo i = cq(*c);
    assert_true(i.armed);
    assert_int_equal(i.arms, i.signals);  // each wake-up re-armed once
    assert_true(i.signals >= 100);        // woken by the fd, not polled
    assert_int_equal(i.taken, i.signals);
    assert_int_equal(c->rx_polling, 0);
    assert_false(polls(*c));
  }
  double t = now_ms();
  expect_code(ibmsg_dispatch_event_loop_timeout(&h->loop, 40), IBMSG_OK);
  assert_true(now_ms() - t >= 30);
}

// A message that arrives while the loop sleeps is handed out before the loop reads the event
// that woke it (so that a reply goes out one system call sooner); the event is read and the CQ
// armed again in the same wake-up.
void event_mode_hands_out_a_completion_before_reading_its_event(void **state) {
  H *h = h_of(state);
  Pair p = connected(h);
  exchange(h, p);
  settle(h);
  reset_rx(*p.a);
  for (int i = 0; i < 20; ++i) {
    fake::pause_wire(true);
    expect_code(send_msg(*p.c, 16), IBMSG_OK);
    settle(h);  // the loop sleeps, its CQ armed
    assert_true(cq(*p.a).armed);
    uint64_t before = p.a->received;
    fake::pause_wire(false);  // the message lands and signals the fd
    assert_true(loop_fd_readable(h));
    RUN_UNTIL(h, p.a->received == before + 1);
    settle(h);
    fake::CqInfo info = cq(*p.a);
    assert_true(info.armed);
    assert_int_equal(info.taken, info.signals);
  }
  assert_int_equal(p.a->rx_unread, 20);
  assert_int_equal(p.a->rx_polling, 0);
}

// Event mode polls before reading the event and again after arming: a message that lands between
// the two (here: from inside the arming, the CQ not yet armed, so it signals nothing) is found by
// the poll after the arming, in the same wake-up.
void event_mode_message_arriving_just_before_the_arming_is_not_lost(void **state) {
  H *h = h_of(state);
  Pair p = connected(h);
  exchange(h, p);
  settle(h);
  assert_true(cq(*p.a).armed);
  expect_code(send_msg(*p.c, 16), IBMSG_OK);  // lands at once and signals: the wake-up
  fake::pause_wire(true);
  expect_code(send_msg(*p.c, 16), IBMSG_OK);  // held until the arming
  bool hook_ran = false;
  fake::CqInfo at_hook{};
  Conn *a = p.a;
  fake::before_cq_arm(cq_of(*a), [&hook_ran, &at_hook, a] {
    hook_ran = true;
    at_hook = cq(*a);
    fake::pause_wire(false);
  });
  uint64_t before = p.a->received;
  double start = now_ms();
  while (!(hook_ran && p.a->received == before + 2) && now_ms() - start < 3000)
    expect_code(ibmsg_dispatch_event_loop_timeout(&h->loop, 1), IBMSG_OK);
  if (!hook_ran) fake::before_cq_arm(nullptr, nullptr);  // it refers to locals
  assert_true(hook_ran);
  assert_false(at_hook.armed);
  assert_int_equal(p.a->received, before + 2);
  assert_int_equal(p.a->rx_polling, 0);
  // The second message signalled nothing: the poll after the arming found it.
  assert_int_equal(cq(*p.a).signals, at_hook.signals);
  assert_true(cq(*p.a).armed);
  exchange(h, p);
}

// === credit-only messages ======================================================================

// The server's posts since posts[from], as kinds (credit-only messages included).
std::vector<ibmsg::tp::Op> posts_since(size_t from, unsigned short port) {
  std::vector<ibmsg::tp::Op> out;
  const auto &all = fake::posts();
  for (size_t i = from; i < all.size(); ++i)
    if (all[i].port == port) out.push_back(all[i].op);
  return out;
}

// Credits that become due in a callback are decided at the end of the round: a message the
// callbacks posted (a reply) carries them and no credit-only message goes (a ping-pong sends one
// message each way, not two); with nothing posted, a credit-only message goes, signaled, and its
// control slot comes back, so that more rounds than there are control slots (kCtrlDepth) go on.
void credits_due_in_a_callback_ride_on_the_message_it_posts(void **state) {
  H *h = h_of(state);
  using ibmsg::tp::Op;
  ibmsg_options *o = options(h, {{IBMSG_OPT_RECV_DEPTH, 8}});  // credits return after 4
  h->accept_opts = o;
  Pair p = connected(h, o);
  exchange(h, p);
  settle(h);
  const unsigned short port = port_of(*p.l);
  for (int round = 0; round < 3 * int(ibmsg::kCtrlDepth); ++round) {
    const bool reply = round % 3 != 2;
    uint64_t a0 = p.a->received, c0 = p.c->received;
    size_t posts0 = fake::posts().size();
    unsigned long ctrl0 = fake::stats().ctrl_cqes;
    // Four messages land at once; the server frees them in message_received (the credits of the
    // fourth are due) and then (two rounds in three) replies: the reply carries them.
    fake::pause_wire(true);
    for (int i = 0; i < 4; ++i) expect_code(send_msg(*p.c, 16), IBMSG_OK);
    p.a->on_rx = [&] {
      if (reply && p.a->received == a0 + 4 && send_msg(*p.a, 16) != IBMSG_OK) ++p.a->reply_errors;
    };
    fake::pause_wire(false);
    RUN_UNTIL(h, p.a->received == a0 + 4 && p.c->received == c0 + (reply ? 1 : 0));
    settle(h);
    p.a->on_rx = nullptr;
    std::vector<Op> want = reply ? std::vector<Op>{Op::Send} : std::vector<Op>{Op::Ctrl};
    if (posts_since(posts0, port) != want) fail_msg("round %d: unexpected posts", round);
    assert_int_equal(fake::stats().ctrl_cqes - ctrl0, reply ? 0 : 1);
    assert_int_equal(p.a->s.impl->tx.credits.owed(), 0);
    assert_int_equal(p.a->s.impl->tx.ctrl_in_flight, 0);
  }
  assert_int_equal(p.a->reply_errors, 0);
}

// === a failing arm ============================================================================

// Going to sleep, the last polling connection on the device arms its CQ: when that fails, every
// connection on the CQ closes with IBMSG_EIO (here both ends, on one loop), each message getting
// its callback first; a new connection works.
void failing_arm_when_going_to_sleep_closes_the_connections_on_that_cq(void **state) {
  H *h = h_of(state);
  Pair p = connected(h, nullptr, busy_poll(h, 2000));  // the client is adaptive
  exchange(h, p);
  assert_true(polls(*p.c));
  fake::fail_call(fake::Call::CqArm, IBMSG_EIO);
  fake::pause_wire(true);
  for (int i = 0; i < 3; ++i) expect_code(send_msg(*p.c, 16), IBMSG_OK);
  RUN_UNTIL(h, p.c->closed && p.a->closed);
  fake::pause_wire(false);
  expect_code(p.c->close_reason, IBMSG_EIO);
  expect_code(p.a->close_reason, IBMSG_EIO);
  // Every posted message got its callback before the closed one: the first delivered, the three
  // still on the wire canceled.
  assert_int_equal(p.c->sent_ok, 1);
  assert_int_equal(p.c->sent_canceled, 3);
  assert_int_equal(p.c->sent_at_close, 4);
  assert_int_equal(p.a->sent_at_close, 1);
  settle(h);
  assert_int_equal(p.l->closed, 0);
  assert_int_equal(loop_polling(h), 0);
  Pair q = connected(h);
  ping_pong(h, q, 20);
}

// Event mode arms the CQ after each wake-up: a failing arm closes the connections on the CQ
// with IBMSG_EIO after the completions it found were delivered.
void failing_arm_after_a_wakeup_closes_that_connection_with_eio(void **state) {
  H *h = h_of(state);
  Pair p = connected(h);
  settle(h);
  fake::fail_call(fake::Call::CqArm, IBMSG_EIO);
  expect_code(send_msg(*p.c, 16), IBMSG_OK);
  RUN_UNTIL(h, p.c->closed && p.a->closed);
  expect_code(p.c->close_reason, IBMSG_EIO);
  expect_code(p.a->close_reason, IBMSG_EIO);
  assert_int_equal(p.c->sent_ok, 1);  // it completed before the arm failed
  assert_int_equal(p.c->sent_at_close, 1);
  assert_int_equal(p.a->received, 1);
  settle(h);
  Pair q = connected(h);
  ping_pong(h, q, 20);
}

// === closing stops the polling ================================================================

void disconnecting_polling_connections_stops_the_poller(void **state) {
  H *h = h_of(state);
  ibmsg_options *o = busy_poll(h, IBMSG_BUSY_POLL_ALWAYS);
  Pair p1 = connected(h, o, o);
  Pair p2 = connected(h, o, o);
  exchange(h, p1);
  exchange(h, p2);
  assert_int_equal(loop_polling(h), 4);
  // In flight when it closes: canceled, once each.
  fake::pause_wire(true);
  for (int i = 0; i < 3; ++i) expect_code(send_msg(*p1.c, 16), IBMSG_OK);
  expect_code(ibmsg_disconnect(&p1.c->s), IBMSG_OK);
  RUN_UNTIL(h, p1.c->closed && p1.a->closed);
  fake::pause_wire(false);
  expect_code(p1.c->close_reason, IBMSG_OK);
  expect_code(p1.a->close_reason, IBMSG_ECONNRESET);
  assert_int_equal(p1.c->sent_canceled, 3);
  assert_int_equal(p1.c->sent_at_close, 4);
  // The other connection still polls.
  settle(h);
  assert_int_equal(loop_polling(h), 2);
  assert_int_equal(loop_timeout(h), 0);
  ping_pong(h, p2, 100);
  // Closing from inside a callback the poller runs.
  p2.a->disconnect_at = p2.a->received + 1;
  expect_code(send_msg(*p2.c, 16), IBMSG_OK);
  RUN_UNTIL(h, p2.c->closed && p2.a->closed);
  expect_code(p2.a->disconnect_rc, IBMSG_OK);
  expect_code(p2.a->close_reason, IBMSG_OK);
  expect_code(p2.c->close_reason, IBMSG_ECONNRESET);
  settle(h);
  assert_int_equal(loop_polling(h), 0);
  assert_false(poller_running(h));
  assert_int_equal(loop_timeout(h), -1);
  double t = now_ms();
  expect_code(ibmsg_dispatch_event_loop_timeout(&h->loop, 40), IBMSG_OK);
  assert_true(now_ms() - t >= 30);
  expect_code(ibmsg_disconnect(&p1.l->s), IBMSG_OK);
  expect_code(ibmsg_disconnect(&p2.l->s), IBMSG_OK);
  RUN_UNTIL(h, p1.l->closed && p2.l->closed);
  settle(h);
  assert_int_equal(loop_timeout(h), -1);
  expect_code(ibmsg_destroy_event_loop(&h->loop), IBMSG_OK);
  h->loop_alive = false;
}

void peer_disconnect_stops_polling_always_and_adaptive(void **state) {
  H *h = h_of(state);
  Pair p1 = connected(h, busy_poll(h, IBMSG_BUSY_POLL_ALWAYS), nullptr);
  Pair p2 = connected(h, busy_poll(h, 10 * 1000 * 1000), nullptr);  // 10 s: polls throughout
  exchange(h, p1);
  exchange(h, p2);
  assert_true(polls(*p1.a));
  assert_true(polls(*p2.a));
  assert_int_equal(loop_polling(h), 2);
  expect_code(ibmsg_disconnect(&p1.c->s), IBMSG_OK);
  expect_code(ibmsg_disconnect(&p2.c->s), IBMSG_OK);
  RUN_UNTIL(h, p1.a->closed && p2.a->closed && p1.c->closed && p2.c->closed);
  expect_code(p1.a->close_reason, IBMSG_ECONNRESET);
  expect_code(p2.a->close_reason, IBMSG_ECONNRESET);
  settle(h);
  assert_int_equal(loop_polling(h), 0);
  assert_false(poller_running(h));
  assert_int_equal(loop_timeout(h), -1);
  expect_code(ibmsg_disconnect(&p1.l->s), IBMSG_OK);
  expect_code(ibmsg_disconnect(&p2.l->s), IBMSG_OK);
  RUN_UNTIL(h, p1.l->closed && p2.l->closed);
  settle(h);
  expect_code(ibmsg_destroy_event_loop(&h->loop), IBMSG_OK);
  h->loop_alive = false;
}

void device_removal_closes_polling_connections_with_enodev(void **state) {
  H *h = h_of(state);
  ibmsg_options *o = busy_poll(h, IBMSG_BUSY_POLL_ALWAYS);
  Pair p = connected(h, o, o);
  exchange(h, p);
  fake::remove_device();
  RUN_UNTIL(h, p.c->closed && p.a->closed);
  expect_code(p.c->close_reason, IBMSG_ENODEV);
  expect_code(p.a->close_reason, IBMSG_ENODEV);
  settle(h);
  assert_int_equal(loop_polling(h), 0);
  RUN_UNTIL(h, fake::open_objects().devices == 0);
}

// === the option per socket ====================================================================

// The option is per connection: only the connections that have it poll (and count for the
// poller); while one of them polls, the device's CQ is polled, not armed, and the event-mode
// connections on it get their completions from the poller too, without a signal. Once the
// polling ones close, the CQ is armed again and the others wake through the fd.
void per_socket_option_polls_only_that_connection(void **state) {
  H *h = h_of(state);
  ibmsg_options *always = busy_poll(h, IBMSG_BUSY_POLL_ALWAYS);
  Pair p1 = connected(h, nullptr, always);  // the client polls, the accepted side does not
  h->accept_opts = always;
  Pair p2 = connected(h);  // the accepted side polls (ibmsg_accept_opts), the client does not
  h->accept_opts = nullptr;
  exchange(h, p1);
  exchange(h, p2);
  settle(h);
  assert_int_equal(loop_polling(h), 2);
  Conn *polling[] = {p1.c, p2.a}, *events[] = {p1.a, p2.c};
  fake::CqInfo before = cq(*p1.c);
  for (Conn *c : events) reset_rx(*c);
  // Both connections at once.
  p1.a->replies_left = 100;
  p1.c->replies_left = 99;
  p2.a->replies_left = 100;
  p2.c->replies_left = 99;
  expect_code(send_msg(*p1.c, 16), IBMSG_OK);
  expect_code(send_msg(*p2.c, 16), IBMSG_OK);
  RUN_UNTIL(h, p1.a->received == 101 && p1.c->received == 101 && p2.a->received == 101 &&
                   p2.c->received == 101);
  settle(h);
  fake::CqInfo now = cq(*p1.c);
  assert_false(now.armed);
  assert_int_equal(now.arms, before.arms);
  assert_int_equal(now.signals, before.signals);
  for (Conn *c : polling) assert_true(polls(*c));
  for (Conn *c : events) {
    assert_false(polls(*c));
    assert_int_equal(c->rx_armed, 0);
  }
  assert_int_equal(loop_timeout(h), 0);
  // The polling sides close: the loop sleeps again, the event-mode ones keep working.
  expect_code(ibmsg_disconnect(&p1.c->s), IBMSG_OK);
  expect_code(ibmsg_disconnect(&p2.a->s), IBMSG_OK);
  RUN_UNTIL(h, p1.c->closed && p1.a->closed && p2.c->closed && p2.a->closed);
  settle(h);
  assert_int_equal(loop_polling(h), 0);
  assert_int_equal(loop_timeout(h), -1);
  Pair p3 = connected(h);
  before = cq(*p3.c);
  assert_true(before.armed);
  ping_pong(h, p3, 20);
  assert_true(cq(*p3.c).signals > before.signals);
  assert_int_equal(loop_timeout(h), -1);
}

// === one-sided operations =====================================================================

int g_done_calls = 0, g_done_status = -1;
uint32_t g_write_imm = 0;
int g_writes_received = 0;

void on_done(ibmsg_socket *, ibmsg_op *, int status) {
  ++g_done_calls;
  g_done_status = status;
}

void on_write_received(ibmsg_socket *, uint32_t imm, size_t) {
  ++g_writes_received;
  g_write_imm = imm;
}

void rdma_write_imm_on_polling_connections_completes_without_a_signal(void **state) {
  H *h = h_of(state);
  h->loop.write_received = on_write_received;
  g_done_calls = g_writes_received = 0;
  ibmsg_options *o = busy_poll(h, IBMSG_BUSY_POLL_ALWAYS);
  Pair p = connected(h, o, o);
  exchange(h, p);
  settle(h);
  fake::CqInfo c0 = cq(*p.c), a0 = cq(*p.a);
  h->regions.resize(2);
  ibmsg_region &dst = h->regions[0], &src = h->regions[1];
  expect_code(ibmsg_alloc_region(&h->loop, &dst, 4096, IBMSG_ACCESS_REMOTE_WRITE), IBMSG_OK);
  expect_code(ibmsg_alloc_region(&h->loop, &src, 4096, 0), IBMSG_OK);
  ibmsg_descriptor d;
  expect_code(ibmsg_region_descriptor(&dst, &p.a->s, 0, 4096, IBMSG_ACCESS_REMOTE_WRITE, &d),
              IBMSG_OK);
  memset(src.addr, 0x5a, 100);
  ibmsg_op op{};
  op.done = on_done;
  expect_code(ibmsg_rdma_write_imm(&p.c->s, &op, &src, 0, 100, &d, 0, 77), IBMSG_OK);
  RUN_UNTIL(h, g_done_calls == 1 && g_writes_received == 1);
  expect_code(g_done_status, IBMSG_OK);
  assert_int_equal(g_write_imm, 77);
  assert_int_equal(static_cast<uint8_t *>(dst.addr)[99], 0x5a);
  settle(h);
  assert_int_equal(g_done_calls, 1);
  assert_int_equal(cq(*p.c).signals, c0.signals);
  assert_int_equal(cq(*p.a).signals, a0.signals);
  assert_false(cq(*p.c).armed);
  assert_false(cq(*p.a).armed);
}

}  // namespace

#define T(name) cmocka_unit_test_setup_teardown(name, setup, teardown)

int main(void) {
  const struct CMUnitTest tests[] = {
      T(busy_poll_option_takes_always_zero_and_microseconds),
      T(always_polling_ping_pongs_without_arming_or_signalling),
      T(adaptive_polls_through_a_burst_then_arms_and_sleeps),
      T(sleeping_adaptive_connection_wakes_through_the_fd),
      T(posting_on_a_sleeping_adaptive_connection_polls_at_once),
      T(post_from_a_polled_callback_keeps_the_other_connection_polling),
      T(adaptive_connection_sleeps_while_another_polls_always),
      T(message_arriving_just_before_the_arming_is_not_lost),
      T(message_found_at_the_arming_makes_the_connection_poll_again),
      T(event_mode_arms_after_every_wakeup_and_never_polls),
      T(event_mode_hands_out_a_completion_before_reading_its_event),
      T(event_mode_message_arriving_just_before_the_arming_is_not_lost),
      T(credits_due_in_a_callback_ride_on_the_message_it_posts),
      T(failing_arm_when_going_to_sleep_closes_the_connections_on_that_cq),
      T(failing_arm_after_a_wakeup_closes_that_connection_with_eio),
      T(disconnecting_polling_connections_stops_the_poller),
      T(peer_disconnect_stops_polling_always_and_adaptive),
      T(device_removal_closes_polling_connections_with_enodev),
      T(per_socket_option_polls_only_that_connection),
      T(rdma_write_imm_on_polling_connections_completes_without_a_signal),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
