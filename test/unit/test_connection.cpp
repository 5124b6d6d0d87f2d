// test_connection.cpp - the core over the fake transport (test/fake), through the public C API:
// the handshake and the hello, credits end to end, peers that break the protocol, every close
// path with its exactly-once callbacks, and the lifetime of devices and registered memory.
//
// Every test runs on a fresh loop and a reset fake (test/fake/harness.hpp). The teardown closes what the test left open
// and then checks what must hold after any scenario: each socket that was set up closed exactly
// once, no callback after its closed callback, one message_sent per posted message, messages in
// order, everything released in the fake (no device, CQ, QP, registration or CM id left), no
// RNR and no misuse of the transport, and no invalid state transition.
//
// FAKE_SEED=n runs the randomized tests with another seed; FAKE_DEBUG=1 prints what they did.
#include "harness.hpp"  // the fixture: H, Conn, the callbacks, run_until, setup and teardown

#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>

#include "internal.hpp"  // the core's state
#include "errors.hpp"    // ibmsg::invalid_transitions

namespace fake = ibmsg::fake;
namespace wire = ibmsg::wire;
using namespace ibmsg::fake::harness;

namespace {

// --- what this file adds to the harness (test/fake/harness.hpp) ---------------------------------

std::vector<uint8_t> hello_bytes(const wire::Hello &h) {
  std::vector<uint8_t> b(wire::kHelloSize);
  wire::encode_hello(h, b.data());
  return b;
}

std::string reject_text_of(const Raw *r) {
  char text[wire::kRejectTextMax + 1];
  if (!wire::decode_reject(r->event_pdata().data(), r->event_pdata().size(), text, sizeof text))
    fail_msg("the rejection carries no ibmsg reject text");
  return text;
}

// Seq payloads, checked byte for byte; ibmsg_disconnect is called (and checked) in every closed
// callback.
int setup(void **state) {
  return fixture_setup(state, [](H *h) {
    h->disconnect_in_closed = true;
    return 0;
  });
}

// === 1. handshake =============================================================================

void connect_and_accept_establish_both_sides_once(void **state) {
  H *h = h_of(state);
  Pair p = connected(h);
  settle(h);
  assert_int_equal(p.c->established, 1);
  assert_int_equal(p.a->established, 1);
  assert_int_equal(h->requests, 1);
  assert_int_equal(p.c->s.status, IBMSG_CONNECTED);
  assert_int_equal(p.a->s.status, IBMSG_CONNECTED);
  assert_int_equal(p.l->s.status, IBMSG_LISTENING);
  assert_string_equal(ibmsg_socket_device(&p.c->s), "fake0");
}

void a_message_arrives_with_its_payload(void **state) {
  H *h = h_of(state);
  Pair p = connected(h);
  expect_code(send_msg(*p.c, 100), IBMSG_OK);
  RUN_UNTIL(h, p.a->received == 1 && p.c->sent_ok == 1);
  assert_int_equal(p.a->last_payload.size(), 100);
  expect_code(send_msg(*p.a, 0), IBMSG_OK);  // empty messages are messages too
  RUN_UNTIL(h, p.c->received == 1);
  assert_int_equal(p.c->last_payload.size(), 0);
}

void max_msg_size_is_the_smaller_of_both_sides(void **state) {
  H *h = h_of(state);
  ibmsg_options *lo = options(h, {{IBMSG_OPT_MAX_MSG_SIZE, 3000}});
  ibmsg_options *co = options(h, {{IBMSG_OPT_MAX_MSG_SIZE, 8000}});
  Pair p = connected(h, lo, co);
  // 3000 on both sides also shows that the accepted socket took the listener's options (the
  // loop's default is 65536).
  assert_int_equal(ibmsg_socket_max_msg_size(&p.c->s), 3000);
  assert_int_equal(ibmsg_socket_max_msg_size(&p.a->s), 3000);
  ibmsg_buffer m;
  expect_code(ibmsg_alloc_msg(&m, &p.c->s, 3001), IBMSG_EMSGSIZE);
  expect_code(send_msg(*p.c, 3000), IBMSG_OK);
  RUN_UNTIL(h, p.a->received == 1);
}

void accepted_socket_sends_the_listeners_options_in_its_hello(void **state) {
  H *h = h_of(state);
  ibmsg_options *lo = options(h, {{IBMSG_OPT_RECV_DEPTH, 7}, {IBMSG_OPT_MAX_MSG_SIZE, 3000}});
  Conn &l = listener(h, lo);
  Raw *r = new_raw(h);
  expect_code(r->connect(port_of(l), fake::hello(8)), IBMSG_OK);
  RUN_UNTIL(h, r->state() == Raw::State::Established);
  wire::Hello got;
  if (wire::decode_hello(r->event_pdata().data(), r->event_pdata().size(), &got) !=
      wire::HelloResult::Ok)
    fail_msg("the accepting side's private data is no valid hello");
  assert_int_equal(got.major, wire::kMajor);
  assert_int_equal(got.recv_depth, 7);
  assert_int_equal(got.ctrl_depth, ibmsg::kCtrlDepth);
  assert_int_equal(got.max_msg_size, 3000);
}

void accept_opts_override_the_listeners_options(void **state) {
  H *h = h_of(state);
  ibmsg_options *lo = options(h, {{IBMSG_OPT_MAX_MSG_SIZE, 3000}});
  h->accept_opts = options(h, {{IBMSG_OPT_MAX_MSG_SIZE, 2000}});
  Pair p = connected(h, lo);
  assert_int_equal(ibmsg_socket_max_msg_size(&p.c->s), 2000);
  assert_int_equal(ibmsg_socket_max_msg_size(&p.a->s), 2000);
}

void data_overtaking_the_established_event_establishes_once(void **state) {
  H *h = h_of(state);
  fake::hold_established(true);  // the accepting side's ESTABLISHED comes late
  Conn &l = listener(h);
  Raw *r = new_raw(h);
  expect_code(r->connect(port_of(l), fake::hello(8)), IBMSG_OK);
  RUN_UNTIL(h, r->state() == Raw::State::Established && !h->accepted.empty());
  Conn *a = h->accepted.back();
  assert_int_equal(a->established, 0);
  const unsigned long notifies = fake::stats().cm_notifies;
  expect_code(r->send(fake::imm(0), "1234", 4), IBMSG_OK);
  RUN_UNTIL(h, a->received == 1);
  assert_int_equal(a->established, 1);  // before the message, and once
  // The CM is told (rdma_notify): else it times the connection out underneath, data or not.
  assert_int_equal(fake::stats().cm_notifies, notifies + 1);
  fake::release_established();
  settle(h);
  assert_int_equal(a->established, 1);
  assert_int_equal(a->s.status, IBMSG_CONNECTED);
}

void loop_fd_and_process_drive_a_connection(void **state) {
  H *h = h_of(state);
  int fd = ibmsg_event_loop_fd(&h->loop);
  assert_true(fd >= 0);
  Conn &l = listener(h);
  Conn &c = client(h, port_of(l));
  for (int i = 0;
       i < 100 && !(c.established && !h->accepted.empty() && h->accepted.back()->established);
       ++i) {
    struct pollfd pfd = {fd, POLLIN, 0};
    int t = ibmsg_event_loop_timeout(&h->loop);
    poll(&pfd, 1, t < 0 || t > 10 ? 10 : t);
    expect_code(ibmsg_event_loop_process(&h->loop), IBMSG_OK);
  }
  assert_int_equal(c.established, 1);
  Conn *a = h->accepted.back();
  expect_code(send_msg(c, 16), IBMSG_OK);
  for (int i = 0; i < 100 && a->received == 0; ++i) {
    struct pollfd pfd = {fd, POLLIN, 0};
    poll(&pfd, 1, 10);  // the device's channel was added when the connection opened it
    expect_code(ibmsg_event_loop_process(&h->loop), IBMSG_OK);
  }
  assert_int_equal(a->received, 1);
}

// === 2. the hello =============================================================================

// A raw client's request with pdata is refused before the application sees it, with text.
void expect_refused(H *h, const std::vector<uint8_t> &pdata, const char *text_start) {
  Conn &l = listener(h);
  Raw *r = new_raw(h);
  expect_code(r->connect(port_of(l), pdata.data(), pdata.size()), IBMSG_OK);
  RUN_UNTIL(h, r->state() == Raw::State::Rejected);
  assert_int_equal(r->event_status(), ibmsg::tp::kRejectConsumer);
  std::string text = reject_text_of(r);
  if (text.compare(0, strlen(text_start), text_start) != 0)
    fail_msg("reject text \"%s\", expected \"%s...\"", text.c_str(), text_start);
  if (h->requests) fail_msg("connection_request ran for a request the library must refuse");
  assert_int_equal(l.s.status, IBMSG_LISTENING);
  assert_int_equal(fake::open_objects().devices, 1);  // the raw peer's: nothing was set up for it
}

void hello_of_another_major_is_rejected_naming_both_versions(void **state) {
  wire::Hello hh = fake::hello(8);
  hh.major = 2;
  hh.minor = 0;
  expect_refused(h_of(state), hello_bytes(hh),
                 "incompatible ibmsg protocol: peer speaks 2.0, this side 1.5");
}

void hello_of_a_higher_minor_with_unknown_features_connects(void **state) {
  H *h = h_of(state);
  wire::Hello hh = fake::hello(8);
  hh.minor = 9;
  hh.features = 0xfff00000u;
  RawPair p = raw_client(h, hh);
  assert_int_equal(h->requests, 1);
  expect_code(send_msg(*p.a, 32), IBMSG_OK);
  RUN_UNTIL(h, p.r->received.size() == 1);
  assert_int_equal(p.r->received[0].data.size(), 32);
  wire::Hello got;
  assert_true(wire::decode_hello(p.r->event_pdata().data(), p.r->event_pdata().size(), &got) ==
              wire::HelloResult::Ok);
  // It offers its own features, never the unknown ones the peer offered.
  assert_int_equal(got.features, wire::kFeatures);
}

void hello_with_zero_max_msg_size_is_rejected(void **state) {
  expect_refused(h_of(state), hello_bytes(fake::hello(8, 4, 0)), "invalid ibmsg hello");
}

void hello_with_zero_recv_depth_is_rejected(void **state) {
  expect_refused(h_of(state), hello_bytes(fake::hello(0, 4)), "invalid ibmsg hello");
}

void hello_with_zero_ctrl_depth_is_rejected(void **state) {
  expect_refused(h_of(state), hello_bytes(fake::hello(8, 0)), "invalid ibmsg hello");
}

void hello_with_recv_depth_beyond_65535_is_rejected(void **state) {
  expect_refused(h_of(state), hello_bytes(fake::hello(65536, 4)), "invalid ibmsg hello");
}

void hello_with_ctrl_depth_beyond_255_is_rejected(void **state) {
  expect_refused(h_of(state), hello_bytes(fake::hello(8, 256)), "invalid ibmsg hello");
}

void garbage_private_data_is_rejected_as_not_ibmsg(void **state) {
  const char *g = "GET / HTTP/1.1\r\nHost: x\r\n";
  expect_refused(h_of(state), std::vector<uint8_t>(g, g + strlen(g)), "not an ibmsg peer");
}

void request_without_private_data_is_rejected_as_not_ibmsg(void **state) {
  expect_refused(h_of(state), {}, "not an ibmsg peer");
}

// IB pads the private data with zeros, so the missing fields read as zero depths: refused as
// invalid (on a transport without padding it would be "not an ibmsg peer").
void truncated_hello_is_refused(void **state) {
  std::vector<uint8_t> b = hello_bytes(fake::hello(8));
  b.resize(12);
  expect_refused(h_of(state), b, "invalid ibmsg hello");
}

// An ibmsg client whose (raw) listener answers with pdata in its accept.
void expect_connector_eproto(H *h, const std::vector<uint8_t> &pdata) {
  Raw *r = new_raw(h);
  expect_code(r->listen(), IBMSG_OK);
  Conn &c = client(h, r->port());
  RUN_UNTIL(h, r->state() == Raw::State::Requested);
  wire::Hello mine;
  assert_true(wire::decode_hello(r->event_pdata().data(), r->event_pdata().size(), &mine) ==
              wire::HelloResult::Ok);
  expect_code(r->accept(pdata.data(), pdata.size()), IBMSG_OK);
  RUN_UNTIL(h, c.closed);
  expect_code(c.close_reason, IBMSG_EPROTO);
  assert_int_equal(c.established, 0);
  assert_int_equal(c.status_at_close, IBMSG_ERROR);
  RUN_UNTIL(h, r->state() == Raw::State::Disconnected);  // the peer learns it is over
}

void invalid_hello_in_the_accept_closes_the_connector_with_eproto(void **state) {
  const char *g = "nonsense";
  expect_connector_eproto(h_of(state), std::vector<uint8_t>(g, g + strlen(g)));
}

void accept_hello_with_zero_depth_closes_the_connector_with_eproto(void **state) {
  expect_connector_eproto(h_of(state), hello_bytes(fake::hello(0)));
}

// === 3. credits between two ibmsg peers =======================================================

void many_messages_each_way_arrive_in_order_exactly_once(void **state) {
  H *h = h_of(state);
  ibmsg_options *o = options(h, {{IBMSG_OPT_RECV_DEPTH, 8},
                                 {IBMSG_OPT_SEND_DEPTH, 16},
                                 {IBMSG_OPT_SEND_QUEUE, 16},
                                 {IBMSG_OPT_MAX_MSG_SIZE, 256}});
  Pair p = connected(h, o, o);
  p.c->hold = p.a->hold = true;
  const uint64_t kN = 10000;
  std::mt19937 rng(7);
  auto feed = [&](Conn *x) {
    while (x->next_send_seq < kN) {
      int rc = send_msg(*x, 8 + rng() % 249);
      if (rc == IBMSG_EAGAIN) return;
      if (rc) fail_msg("%s: sending failed with %s", x->name, ibmsg_err_name(rc));
    }
  };
  auto release = [&](Conn *x) {  // the application holds messages for a while
    if (x->held.empty() || rng() % 3) return;
    free_held(*x, 1 + rng() % x->held.size());
  };
  bool done = run_until(
      h,
      [&] {
        feed(p.c);
        feed(p.a);
        release(p.c);
        release(p.a);
        return p.c->received == kN && p.a->received == kN && p.c->sent_ok == int(kN) &&
               p.a->sent_ok == int(kN);
      },
      400000, 0);
  if (!done)
    fail_msg("stalled: client got %llu, server got %llu, sent ok %d / %d",
             (unsigned long long)p.c->received, (unsigned long long)p.a->received, p.c->sent_ok,
             p.a->sent_ok);
  assert_int_equal(p.c->next_seq, kN);
  assert_int_equal(p.a->next_seq, kN);
  assert_int_equal(p.c->bad_order + p.a->bad_order, 0);
  assert_int_equal(p.c->sent_other + p.a->sent_other + p.c->sent_canceled + p.a->sent_canceled, 0);
  assert_int_equal(fake::stats().rnr_errors, 0);
  assert_true(fake::stats().delivered >= 2 * kN);
  assert_int_equal(p.c->s.status, IBMSG_CONNECTED);
  if (getenv("FAKE_DEBUG"))
    fprintf(stderr, "delivered %lu (credit-only: %lu)\n", fake::stats().delivered,
            fake::stats().delivered - 2 * kN);
}

void sender_without_credits_queues_up_to_the_bound_then_eagain(void **state) {
  H *h = h_of(state);
  ibmsg_options *o = options(
      h, {{IBMSG_OPT_RECV_DEPTH, 4}, {IBMSG_OPT_SEND_DEPTH, 16}, {IBMSG_OPT_SEND_QUEUE, 3}});
  h->hold_accepted = true;
  Pair p = connected(h, o, o);
  for (int i = 0; i < 7; ++i) expect_code(send_msg(*p.c, 64), IBMSG_OK);  // 4 credits + 3 queued
  expect_code(send_msg(*p.c, 64), IBMSG_EAGAIN);
  settle(h);
  assert_int_equal(p.a->received, 4);  // no more than the credits
  assert_int_equal(p.c->sent_ok, 4);
  assert_int_equal(p.c->s.status, IBMSG_CONNECTED);
  free_held(*p.a);  // credits go back; the queue drains
  RUN_UNTIL(h, p.a->received == 7 && p.c->sent_ok == 7);
  assert_int_equal(p.c->sent_other + p.c->sent_canceled, 0);
  free_held(*p.a);
}

// A receiver that holds all but one of its buffers and waits for the next message before freeing
// more must still get it: the one freed credit goes back although less than half are owed.
void receiver_holding_messages_still_gets_the_credit_it_freed(void **state) {
  H *h = h_of(state);
  ibmsg_options *o = options(h, {{IBMSG_OPT_RECV_DEPTH, 4}});
  h->hold_accepted = true;
  Pair p = connected(h, o, o);
  for (int i = 0; i < 4; ++i) expect_code(send_msg(*p.c, 16), IBMSG_OK);
  RUN_UNTIL(h, p.a->received == 4);
  free_held(*p.a, 1);  // holds 3
  expect_code(send_msg(*p.c, 16), IBMSG_OK);
  RUN_UNTIL(h, p.a->received == 5);
}

// A connection that re-posts from every message_sent keeps the loop busy all the time.
Conn *g_streaming = nullptr;
void resend_on_sent(ibmsg_socket *s, ibmsg_buffer *m, int status) {
  on_sent(s, m, status);
  Conn *c = static_cast<Conn *>(s->user_data);
  if (c == g_streaming && status == IBMSG_OK) send_msg(*c, 16);
}

void a_busy_connection_does_not_hold_back_another_ones_close(void **state) {
  H *h = h_of(state);
  Pair busy = connected(h);
  Pair other = connected(h);
  h->loop.message_sent = resend_on_sent;
  g_streaming = busy.c;
  expect_code(send_msg(*busy.c, 16), IBMSG_OK);
  settle(h, 5);
  expect_code(ibmsg_disconnect(&other.c->s), IBMSG_OK);
  bool closed = run_until(h, [&] { return other.c->closed > 0; }, 200, 1);
  g_streaming = nullptr;
  if (!closed)
    fail_msg("a socket did not close in 200 rounds of the loop while another connection "
             "streamed: teardowns are starved by traffic");
  RUN_UNTIL(h, other.a->closed);
}

// === credits against a raw peer ===

void ibmsg_sends_no_more_than_the_peer_granted(void **state) {
  H *h = h_of(state);
  RawPair p = raw_client(h, fake::hello(2, 1));  // 2 data credits, 1 control credit
  for (int i = 0; i < 6; ++i) expect_code(send_msg(*p.a, 16), IBMSG_OK);
  settle(h);
  assert_int_equal(p.r->received.size(), 2);
  for (const fake::RawMsg &m : p.r->received) {
    assert_true(m.has_imm);
    assert_int_equal(m.imm, fake::imm(0));  // data, nothing to return yet
  }
  expect_code(p.r->send(fake::imm(1, 2)), IBMSG_OK);  // both data credits back
  RUN_UNTIL(h, p.r->received.size() == 4);
  settle(h);
  assert_int_equal(p.r->received.size(), 4);
  // The credit-only message used one of ibmsg's control buffers: the next message returns it.
  assert_int_equal(p.r->received[2].imm, fake::imm(0, 0, 1));
  assert_int_equal(p.r->received[3].imm, fake::imm(0));
  assert_int_equal(p.a->sent_ok, 4);
  assert_int_equal(p.a->s.status, IBMSG_CONNECTED);
}

void freed_messages_return_credits_in_credit_only_messages(void **state) {
  H *h = h_of(state);
  RawPair p = raw_client(h, fake::hello(8, 4), 4);
  for (int i = 0; i < 4; ++i) expect_code(p.r->send(fake::imm(0), "abcd", 4), IBMSG_OK);
  RUN_UNTIL(h, p.a->received == 4);
  settle(h);
  assert_int_equal(p.r->received.size(), 0);  // nothing freed, nothing owed
  free_held(*p.a);
  settle(h);
  unsigned credits = 0;
  for (const fake::RawMsg &m : p.r->received) {
    assert_true(m.has_imm);
    assert_int_equal(m.imm >> 28, 1);          // credit-only
    assert_int_equal(m.imm & 0x0f000000u, 0);  // reserved bits clear
    assert_int_equal(m.data.size(), 0);
    credits += m.imm & 0xffff;
  }
  // At most half the depth may stay owed (ibmsg.h: "at the latest when half of them are owed").
  if (credits < 3 || credits > 4)
    fail_msg("%u data credits came back for 4 freed buffers", credits);
  assert_int_equal(p.a->s.status, IBMSG_CONNECTED);
}

// A peer may grant up to 255 control credits; ibmsg's send queue has room for kCtrlDepth
// credit-only messages besides its data. When acknowledgements lag behind the peer's answers,
// ibmsg must still not post more than its send queue holds.
void many_control_credits_from_the_peer_never_overflow_the_send_queue(void **state) {
  H *h = h_of(state);
  RawPair p = raw_client(h, fake::hello(64, 255), 2, {{IBMSG_OPT_SEND_DEPTH, 1}});
  p.a->hold = false;  // every message is freed at once: a credit-only message each (threshold 1)
  fake::delay_send_completions(true, port_of(*p.l));  // ibmsg's acknowledgements lag
  unsigned credits = 2, sent = 0;  // the raw peer keeps to the credits ibmsg gave it
  size_t seen = 0;
  for (int i = 0; i < 40 && !p.a->closed; ++i) {
    for (; seen < p.r->received.size(); ++seen) credits += p.r->received[seen].imm & 0xffff;
    if (credits) {
      expect_code(p.r->send(fake::imm(0), "1234", 4), IBMSG_OK);
      --credits;
      ++sent;
    }
    settle(h, 2);
  }
  fake::delay_send_completions(false);
  settle(h);
  if (p.a->closed)
    fail_msg("ibmsg closed the connection with %s after %llu messages (%lu transport misuses)",
             ibmsg_err_name(p.a->close_reason), (unsigned long long)p.a->received,
             fake::stats().misuses);
  assert_int_equal(p.a->received, sent);
  assert_true(sent >= 6);  // more than the send queue holds
}

// Two ibmsg peers (4 control credits each way). A control credit comes back as soon as the peer
// consumed the credit-only message, but that message keeps its slot in the sender's send queue
// until its completion is polled; with acknowledgements lagging, ibmsg must still never post
// more work requests than its send queue holds (send_depth + kCtrlDepth).
void lagging_acknowledgements_never_overflow_the_send_queue(void **state) {
  H *h = h_of(state);
  ibmsg_options *o = options(h, {{IBMSG_OPT_RECV_DEPTH, 2}, {IBMSG_OPT_SEND_DEPTH, 1}});
  Pair p = connected(h, o, o);  // the accepted side frees every message at once
  fake::delay_send_completions(true, port_of(*p.l));  // the server's acknowledgements lag
  for (int i = 0; i < 20 && !p.a->closed && !p.c->closed; ++i) {
    int rc = send_msg(*p.c, 16);  // each one gets a credit-only message back
    if (rc != IBMSG_OK && rc != IBMSG_EAGAIN) fail_msg("sending: %s", ibmsg_err_name(rc));
    settle(h, 2);
  }
  fake::delay_send_completions(false);
  RUN_UNTIL(h, p.a->closed || p.c->closed || uint64_t(p.c->sent_ok) == p.c->next_send_seq);
  if (p.a->closed || p.c->closed)
    fail_msg("the connection closed (server: %s, client: %s) after %llu messages",
             p.a->closed ? ibmsg_err_name(p.a->close_reason) : "open",
             p.c->closed ? ibmsg_err_name(p.c->close_reason) : "open",
             (unsigned long long)p.a->received);
  assert_int_equal(p.a->received, p.c->next_send_seq);
  assert_true(p.c->next_send_seq >= 6);  // more than the server's send queue holds
}

// === 4. peers that break the credit protocol ==================================================

void peer_using_all_its_credits_stays_connected(void **state) {
  H *h = h_of(state);
  RawPair p = raw_client(h, fake::hello(8), 4);
  for (int i = 0; i < 4; ++i) expect_code(p.r->send(fake::imm(0), "data", 4), IBMSG_OK);
  for (int i = 0; i < 4; ++i) expect_code(p.r->send(fake::imm(1)), IBMSG_OK);  // 4 control credits
  settle(h);
  assert_int_equal(p.a->received, 4);
  assert_int_equal(p.a->closed, 0);
  assert_int_equal(p.a->s.status, IBMSG_CONNECTED);
}

// Sends what the raw peer sends and expects the accepted socket to close with EPROTO, the
// listener to stay up and a new connection to work.
void expect_eproto_only_there(H *h, RawPair p) {
  RUN_UNTIL(h, p.a->closed);
  expect_code(p.a->close_reason, IBMSG_EPROTO);
  assert_int_equal(p.a->status_at_close, IBMSG_ERROR);
  RUN_UNTIL(h, p.r->state() == Raw::State::Disconnected);
  assert_int_equal(p.l->s.status, IBMSG_LISTENING);
  h->hold_accepted = false;
  Conn &c = client(h, port_of(*p.l));
  RUN_UNTIL(h, c.established && h->accepted.back() != p.a && h->accepted.back()->established);
  expect_code(send_msg(c, 8), IBMSG_OK);
  RUN_UNTIL(h, h->accepted.back()->received == 1);
}

void peer_sending_beyond_its_data_credits_is_closed_with_eproto(void **state) {
  H *h = h_of(state);
  RawPair p = raw_client(h, fake::hello(8), 4);
  for (int i = 0; i < 5; ++i) expect_code(p.r->send(fake::imm(0), "data", 4), IBMSG_OK);
  expect_eproto_only_there(h, p);
  assert_int_equal(p.a->received, 4);  // the fifth is not handed to the application
}

// A credit ibmsg grants while it handles the completions of one poll (here on the reply that
// message_received posts) was not on the wire when the later completions of that poll arrived:
// one of them sent beyond the credits the peer had is still a violation, not a message that
// used the credit granted after it landed (found by fuzz_receive, where the grant came from a
// rendezvous message completed in the same poll as an RDMA write with immediate).
void credit_granted_within_a_poll_does_not_cover_a_message_of_that_poll(void **state) {
  H *h = h_of(state);
  RawPair p = raw_client(h, fake::hello(8), 4);
  expect_code(p.r->send(fake::imm(0), "data", 4), IBMSG_OK);
  RUN_UNTIL(h, p.a->received == 1);
  p.a->hold = false;
  free_held(*p.a);
  settle(h);  // freed: ibmsg owes a credit, below the threshold of a message of its own
  assert_int_equal(p.a->s.impl->tx.credits.owed(), 1);
  p.r->pump();
  assert_int_equal(p.r->received.size(), 0);
  int replies = 0;
  h->rx_probe = [&replies](Conn &c, ibmsg_buffer *) {
    if (c.received == 2) replies += send_msg(c, 8) == IBMSG_OK;  // carries the owed credit
  };
  // Three messages on the three credits left, and a fifth beyond them; one poll takes all four.
  for (int i = 0; i < 4; ++i) expect_code(p.r->send(fake::imm(0), "data", 4), IBMSG_OK);
  expect_eproto_only_there(h, p);
  h->rx_probe = nullptr;
  assert_int_equal(replies, 1);
  assert_int_equal(p.a->received, 4);  // the fifth is not handed to the application
}

void credit_only_message_with_payload_is_eproto(void **state) {
  H *h = h_of(state);
  RawPair p = raw_client(h, fake::hello(8));
  expect_code(p.r->send(fake::imm(1), "payload", 7), IBMSG_OK);
  expect_eproto_only_there(h, p);
  assert_int_equal(p.a->received, 0);
}

void more_credit_only_messages_than_control_credits_is_eproto(void **state) {
  H *h = h_of(state);
  RawPair p = raw_client(h, fake::hello(8));
  for (int i = 0; i < 5; ++i) expect_code(p.r->send(fake::imm(1)), IBMSG_OK);
  expect_eproto_only_there(h, p);
}

void reserved_opcode_is_eproto(void **state) {
  H *h = h_of(state);
  RawPair p = raw_client(h, fake::hello(8));
  expect_code(p.r->send(fake::imm(4)), IBMSG_OK);  // RDMA notice: no feature uses it yet
  expect_eproto_only_there(h, p);
}

void credits_returned_beyond_what_ibmsg_spent_are_eproto(void **state) {
  H *h = h_of(state);
  RawPair p = raw_client(h, fake::hello(8));
  // ibmsg sent nothing yet: it holds all 8 data credits, so the peer has none to return.
  expect_code(p.r->send(fake::imm(0, 1), "data", 4), IBMSG_OK);
  expect_eproto_only_there(h, p);
  assert_int_equal(p.a->received, 0);
}

void control_credits_returned_beyond_what_ibmsg_spent_are_eproto(void **state) {
  H *h = h_of(state);
  RawPair p = raw_client(h, fake::hello(8));
  expect_code(p.r->send(fake::imm(0, 0, 1), "data", 4), IBMSG_OK);
  expect_eproto_only_there(h, p);
}

void reserved_immediate_bits_are_eproto(void **state) {
  H *h = h_of(state);
  RawPair p = raw_client(h, fake::hello(8));
  expect_code(p.r->send(fake::imm(0) | 1u << 24, "data", 4), IBMSG_OK);
  expect_eproto_only_there(h, p);
  assert_int_equal(p.a->received, 0);
}

void message_without_immediate_is_eproto(void **state) {
  H *h = h_of(state);
  RawPair p = raw_client(h, fake::hello(8));
  expect_code(p.r->send_without_imm("data", 4), IBMSG_OK);
  expect_eproto_only_there(h, p);
  assert_int_equal(p.a->received, 0);
}

// --- requests and replies on the wire (protocol 1.5): a raw peer as the requester ---------------

wire::Hello req_hello(uint32_t depth = 8) {
  wire::Hello h = fake::hello(depth);
  h.session = 0x5e5510;  // a requester has a session
  return h;
}

// A Request's payload: the application's bytes, then the trailer.
std::vector<uint8_t> req_bytes(const char *payload, uint64_t id, bool retry = false,
                               uint64_t floor = 0) {
  const size_t n = strlen(payload);
  std::vector<uint8_t> b(n + wire::kReqTrailer);
  memcpy(b.data(), payload, n);
  wire::ReqTrailer t;
  t.id = id;
  t.retry = retry;
  t.floor = floor;
  wire::encode_req_trailer(t, b.data() + n);
  return b;
}

int send_req(Raw *r, const std::vector<uint8_t> &b, uint32_t opcode = 7) {
  return r->send(fake::imm(opcode), b.data(), b.size());
}

void request_from_a_peer_without_a_session_is_eproto(void **state) {
  H *h = h_of(state);
  RawPair p = raw_client(h, fake::hello(8));  // features say requests, but no session: not agreed
  expect_code(send_req(p.r, req_bytes("get", 1)), IBMSG_OK);
  expect_eproto_only_there(h, p);
  assert_int_equal(p.a->received, 0);
}

void request_with_a_broken_trailer_is_eproto(void **state) {
  H *h = h_of(state);
  for (int kind = 0; kind < 5; ++kind) {
    RawPair p = raw_client(h, req_hello());
    std::vector<uint8_t> b = req_bytes("get", 9);
    if (kind == 0) b.resize(wire::kReqTrailer - 1);    // no room for it
    if (kind == 1) b[3 + 8] |= 0x80;                   // a reserved flag
    if (kind == 2) b = req_bytes("get", 0);            // id 0
    if (kind == 3) b = req_bytes("get", 5, false, 6);  // floor above the id
    if (kind == 4) b = req_bytes("get", 5, true);      // a reply flagged as a retry
    expect_code(send_req(p.r, b, kind == 4 ? 8 : 7), IBMSG_OK);
    expect_eproto_only_there(h, p);
    if (p.a->received) fail_msg("kind %d: a broken request was delivered", kind);
  }
}

void request_is_delivered_once_and_its_copies_get_the_kept_reply(void **state) {
  H *h = h_of(state);
  RawPair p = raw_client(h, req_hello());
  p.a->hold = true;
  expect_code(send_req(p.r, req_bytes("query", 42, false, 1)), IBMSG_OK);
  RUN_UNTIL(h, p.a->received == 1);
  ibmsg_buffer *q = p.a->held.front();
  assert_int_equal(q->size, 5);  // the trailer is not the application's
  assert_true(q->flags & IBMSG_MSG_REQUEST);
  assert_string_equal(p.a->last_payload.c_str(), "query");
  // A retry while the application still works on it: not delivered again.
  expect_code(send_req(p.r, req_bytes("query", 42, true, 1)), IBMSG_OK);
  settle(h);
  assert_int_equal(p.a->received, 1);
  assert_int_equal(p.r->received.size(), 0u);
  // (the harness's message_sent frees what was sent: each reply is an Out of the connection's)
  auto new_reply = [&](const char *text) -> ibmsg_buffer * {
    Out &o = p.a->outs.emplace_back();
    expect_code(ibmsg_alloc_msg(&o.m, &p.a->s, strlen(text)), IBMSG_OK);
    o.allocated = true;
    o.m.user_data = &o;
    memcpy(o.m.data, text, strlen(text));
    return &o.m;
  };
  ibmsg_buffer *reply = new_reply("answer");
  expect_code(ibmsg_post_reply(&p.a->s, q, reply), IBMSG_OK);
  ++p.a->outs.back().posts;
  ibmsg_buffer *other = new_reply("again!");
  expect_code(ibmsg_post_reply(&p.a->s, q, other), IBMSG_EALREADY);
  RUN_UNTIL(h, p.r->received.size() >= 1);
  // One Reply (the copy that came while it was in progress shares it: same connection).
  auto check_reply = [&](const fake::RawMsg &m) {
    wire::Imm imm;
    wire::decode_imm(m.imm, &imm);
    assert_true(imm.op == wire::Opcode::Reply);
    assert_int_equal(m.data.size(), 6 + wire::kReqTrailer);
    wire::ReqTrailer t;
    assert_true(wire::decode_req_trailer(m.data.data(), m.data.size(), &t));
    assert_true(t.id == 42 && !t.retry && t.floor == 0);
    assert_memory_equal(m.data.data(), "answer", 6);
  };
  check_reply(p.r->received.front());
  // Another retry after the reply: the kept reply again, still no second delivery.
  expect_code(send_req(p.r, req_bytes("query", 42, true, 1)), IBMSG_OK);
  RUN_UNTIL(h, p.r->received.size() >= 2);
  check_reply(p.r->received.back());
  assert_int_equal(p.a->received, 1);
  ibmsg_stats st{};
  expect_code(ibmsg_socket_stats(&p.a->s, &st, sizeof st), IBMSG_OK);
  assert_int_equal(st.replies_resent, 1);
  // A plain message is no request: replying to it is refused.
  expect_code(p.r->send(fake::imm(0), "plain", 5), IBMSG_OK);
  RUN_UNTIL(h, p.a->received == 2);
  expect_code(ibmsg_post_reply(&p.a->s, p.a->held.back(), other), IBMSG_EINVAL);
  // A retry below the floor the requester declared is forgotten: not delivered, not answered.
  expect_code(send_req(p.r, req_bytes("new", 50, false, 50)), IBMSG_OK);
  RUN_UNTIL(h, p.a->received == 3);
  expect_code(send_req(p.r, req_bytes("query", 42, true, 50)), IBMSG_OK);
  settle(h);
  assert_int_equal(p.a->received, 3);
  assert_int_equal(p.a->sent_ok, 1);  // the reply's message_sent (the kept copy has none)
  free_held(*p.a);
}

void reply_for_no_posted_request_is_dropped_and_counted(void **state) {
  H *h = h_of(state);
  RawPair p = raw_client(h, req_hello());
  expect_code(send_req(p.r, req_bytes("stray", 77), 8), IBMSG_OK);
  expect_code(p.r->send(fake::imm(0), "after", 5), IBMSG_OK);
  RUN_UNTIL(h, p.a->received == 1);  // only the plain message reaches message_received
  assert_string_equal(p.a->last_payload.c_str(), "after");
  ibmsg_stats st{};
  expect_code(ibmsg_socket_stats(&p.a->s, &st, sizeof st), IBMSG_OK);
  assert_int_equal(st.replies_dropped, 1);
  assert_int_equal(p.a->s.status, IBMSG_CONNECTED);
}

// The ibmsg side as the requester, a raw peer answering by hand.
struct ReqSeen {
  int calls = 0;
  int status = -1;
  std::string reply;
};

void on_reply(ibmsg_socket *, ibmsg_request *req, ibmsg_buffer *reply, int status) {
  ReqSeen *seen = static_cast<ReqSeen *>(req->user_data);
  ++seen->calls;
  seen->status = status;
  if ((status == IBMSG_OK) != (reply != nullptr)) seen->status = -2;  // the contract broken
  if (reply) {
    seen->reply.assign(static_cast<const char *>(reply->data), reply->size);
    expect_code(ibmsg_free_msg(reply), IBMSG_OK);
  }
}

// Posts an Out of c as a request (message_sent frees it, as for any message of the harness).
int post_req(Conn &c, ibmsg_request *req, const char *text, int timeout_ms, bool retry = false) {
  Out &o = c.outs.emplace_back();
  expect_code(ibmsg_alloc_msg(&o.m, &c.s, strlen(text)), IBMSG_OK);
  o.allocated = true;
  o.m.user_data = &o;
  memcpy(o.m.data, text, strlen(text));
  int rc = retry ? ibmsg_retry_request(&c.s, &o.m, req, timeout_ms)
                 : ibmsg_post_request(&c.s, &o.m, req, timeout_ms);
  if (rc == IBMSG_OK) ++o.posts;
  return rc;
}

// The last Request the raw peer got: its trailer.
wire::ReqTrailer last_request(Raw *r) {
  const fake::RawMsg &m = r->received.back();
  wire::Imm imm;
  wire::decode_imm(m.imm, &imm);
  assert_true(imm.op == wire::Opcode::Request);
  wire::ReqTrailer t;
  assert_true(wire::decode_req_trailer(m.data.data(), m.data.size(), &t));
  return t;
}

void request_to_a_peer_without_requests_is_eopnotsupp(void **state) {
  H *h = h_of(state);
  RawPair p = raw_client(h, fake::hello(8));  // no session: a peer before 1.5
  wire::Hello got;
  assert_true(wire::decode_hello(p.r->event_pdata().data(), p.r->event_pdata().size(), &got) ==
              wire::HelloResult::Ok);
  assert_true(got.session != 0);  // ibmsg's own hello names its session
  ibmsg_request req{};
  ReqSeen seen;
  req.done = on_reply;
  req.user_data = &seen;
  expect_code(post_req(*p.a, &req, "q", 100), IBMSG_EOPNOTSUPP);
  settle(h);
  assert_int_equal(p.r->received.size(), 0u);  // nothing went
  assert_int_equal(seen.calls, 0);
}

void request_gets_its_reply_timeout_retry_and_close_each_once(void **state) {
  H *h = h_of(state);
  RawPair p = raw_client(h, req_hello());
  Conn &c = *p.a;
  ibmsg_request req{};
  ReqSeen seen;
  req.done = on_reply;
  req.user_data = &seen;
  // Bad arguments: nothing goes, no callback.
  expect_code(post_req(c, &req, "q", 0), IBMSG_EINVAL);
  expect_code(post_req(c, &req, "q", -1), IBMSG_EINVAL);
  expect_code(ibmsg_post_request(&c.s, nullptr, &req, 10), IBMSG_EINVAL);
  expect_code(post_req(c, &req, "q", 100, true), IBMSG_ESTATE);  // never posted: no retry
  // Answered.
  expect_code(post_req(c, &req, "q1", 5000), IBMSG_OK);
  assert_int_equal(req.status, IBMSG_EINPROGRESS);
  expect_code(post_req(c, &req, "q1", 5000), IBMSG_EBUSY);  // still posted
  RUN_UNTIL(h, p.r->received.size() == 1);
  wire::ReqTrailer t = last_request(p.r);
  assert_true(t.id == req.id && !t.retry && t.floor == t.id);
  assert_memory_equal(p.r->received.back().data.data(), "q1", 2);
  expect_code(send_req(p.r, req_bytes("a1", t.id), 8), IBMSG_OK);
  RUN_UNTIL(h, seen.calls == 1);
  expect_code(seen.status, IBMSG_OK);
  assert_string_equal(seen.reply.c_str(), "a1");
  expect_code(post_req(c, &req, "q1", 100, true), IBMSG_ESTATE);  // it has its reply
  // Timed out: once, then the late reply is dropped and counted.
  expect_code(post_req(c, &req, "q2", 30), IBMSG_OK);
  const uint64_t id2 = req.id;
  assert_true(id2 > t.id);
  RUN_UNTIL(h, seen.calls == 2);
  expect_code(seen.status, IBMSG_ETIMEDOUT);
  expect_code(send_req(p.r, req_bytes("late", id2), 8), IBMSG_OK);
  settle(h);
  assert_int_equal(seen.calls, 2);
  assert_int_equal(c.received, 0);  // not delivered as a message either
  ibmsg_stats st{};
  expect_code(ibmsg_socket_stats(&c.s, &st, sizeof st), IBMSG_OK);
  assert_int_equal(st.replies_dropped, 1);
  assert_int_equal(st.requests_timed_out, 1);
  // Retried: the same id, flagged; the floor stays at it while it may be retried.
  expect_code(post_req(c, &req, "q2", 5000, true), IBMSG_OK);
  assert_true(req.id == id2);
  assert_int_equal(req.retries, 1);
  RUN_UNTIL(h, p.r->received.size() == 3);
  t = last_request(p.r);
  assert_true(t.id == id2 && t.retry && t.floor == id2);
  expect_code(send_req(p.r, req_bytes("a2", id2), 8), IBMSG_OK);
  RUN_UNTIL(h, seen.calls == 3);
  expect_code(seen.status, IBMSG_OK);
  assert_string_equal(seen.reply.c_str(), "a2");
  // Outstanding when the peer goes: the close reason, once.
  expect_code(post_req(c, &req, "q3", 5000), IBMSG_OK);
  RUN_UNTIL(h, p.r->received.size() == 4);
  expect_code(p.r->disconnect(), IBMSG_OK);
  RUN_UNTIL(h, c.closed == 1);
  assert_int_equal(seen.calls, 4);
  expect_code(seen.status, IBMSG_ECONNRESET);
}

// === 5. close paths ===========================================================================

ibmsg_options *small_queues(H *h) {
  return options(
      h, {{IBMSG_OPT_RECV_DEPTH, 4}, {IBMSG_OPT_SEND_DEPTH, 16}, {IBMSG_OPT_SEND_QUEUE, 8}});
}

void disconnect_confirms_delivered_and_cancels_in_flight_and_queued(void **state) {
  H *h = h_of(state);
  ibmsg_options *o = small_queues(h);
  h->hold_accepted = true;
  Pair p = connected(h, o, o);
  for (int i = 0; i < 2; ++i) expect_code(send_msg(*p.c, 32), IBMSG_OK);  // delivered
  fake::pause_wire(true);
  for (int i = 0; i < 10; ++i) expect_code(send_msg(*p.c, 32), IBMSG_OK);  // 2 in flight, 8 queued
  expect_code(ibmsg_disconnect(&p.c->s), IBMSG_OK);
  expect_code(ibmsg_disconnect(&p.c->s), IBMSG_ESTATE);
  RUN_UNTIL(h, p.c->closed && p.a->closed);
  expect_code(p.c->close_reason, IBMSG_OK);
  expect_code(p.a->close_reason, IBMSG_ECONNRESET);
  assert_int_equal(p.c->status_at_close, IBMSG_UNCONNECTED);
  assert_int_equal(p.c->sent_ok, 2);
  assert_int_equal(p.c->sent_canceled, 10);
  assert_int_equal(p.c->sent_other, 0);
  assert_int_equal(p.c->sent_at_close, 12);  // every message_sent before connection_closed
  fake::pause_wire(false);
  settle(h);
  assert_int_equal(p.a->received, 2);  // flushed sends never arrive
  assert_int_equal(p.l->s.status, IBMSG_LISTENING);
}

// ECANCELED means "not delivered": a message the peer has when its socket closes is confirmed,
// even when the close follows at once (here: from another socket's closed callback, so the
// teardown runs before the loop looked at the completion queue again).
void message_delivered_just_before_the_close_is_confirmed_not_canceled(void **state) {
  H *h = h_of(state);
  Pair p1 = connected(h);
  Pair p2 = connected(h);
  Conn *c2 = p2.c;
  p1.c->when_closed = [c2] {
    expect_code(send_msg(*c2, 16), IBMSG_OK);
    expect_code(ibmsg_disconnect(&c2->s), IBMSG_OK);
  };
  expect_code(ibmsg_disconnect(&p1.c->s), IBMSG_OK);
  RUN_UNTIL(h, c2->closed && p2.a->closed);
  assert_int_equal(p2.a->received, 1);
  assert_int_equal(c2->sent_canceled, 0);
  assert_int_equal(c2->sent_ok, 1);
}

// Batching: on an idle connection the first post from a callback goes at once (the wire is
// idle); what the round posts behind it goes to the QP as one post list with one signaled
// completion, and every message_sent still comes once, with IBMSG_OK.
void posts_from_callbacks_go_as_one_list_with_one_completion(void **state) {
  H *h = h_of(state);
  Pair p1 = connected(h);
  Pair p2 = connected(h);
  Conn *c2 = p2.c;
  settle(h);
  const unsigned long lists = fake::stats().post_lists, cqes = fake::stats().send_cqes;
  p1.c->when_closed = [c2] {
    for (int i = 0; i < 8; ++i) expect_code(send_msg(*c2, 16), IBMSG_OK);
  };
  expect_code(ibmsg_disconnect(&p1.c->s), IBMSG_OK);
  RUN_UNTIL(h, c2->sent_ok == 8 && p2.a->received == 8);
  settle(h);
  // p1's close sends nothing (fake disconnects make no work requests): the first message, then
  // a list of seven.
  assert_int_equal(fake::stats().post_lists - lists, 2);
  assert_int_equal(fake::stats().send_cqes - cqes, 2);
  assert_int_equal(p2.a->bad_order, 0);
  for (const Out &o : c2->outs) assert_int_equal(o.sent_cbs, o.posts);
  assert_int_equal(c2->sent_canceled + c2->sent_other, 0);
}

// Outside the callbacks a post goes to the QP at once: nothing waits for the loop.
void posts_outside_callbacks_go_at_once(void **state) {
  H *h = h_of(state);
  Pair p = connected(h);
  settle(h);
  const unsigned long lists = fake::stats().post_lists, delivered = fake::stats().delivered;
  for (int i = 0; i < 3; ++i) expect_code(send_msg(*p.c, 16), IBMSG_OK);
  assert_int_equal(fake::stats().post_lists - lists, 3);
  assert_int_equal(fake::stats().delivered - delivered, 3);
  RUN_UNTIL(h, p.c->sent_ok == 3 && p.a->received == 3);
}

// Receive buffers freed in one round go back to the receive queue as one list.
void receives_freed_in_one_round_are_reposted_as_one_list(void **state) {
  H *h = h_of(state);
  Pair p = connected(h);
  settle(h);
  for (int i = 0; i < 8; ++i) expect_code(send_msg(*p.c, 16), IBMSG_OK);
  const unsigned long lists = fake::stats().recv_lists;
  RUN_UNTIL(h, p.a->received == 8);  // freed in message_received
  assert_int_equal(fake::stats().recv_lists - lists, 1);
  RUN_UNTIL(h, p.c->sent_ok == 8);
  assert_int_equal(p.a->bad_order, 0);
}

// A post list the device refuses closes the connection with IBMSG_EIO: each message in it comes
// back once, canceled, and none arrives. (The first message went at once, alone, and arrives.)
void refused_post_list_cancels_each_message_once_and_closes_with_eio(void **state) {
  H *h = h_of(state);
  Pair p1 = connected(h);
  Pair p2 = connected(h);
  Conn *c2 = p2.c;
  settle(h);
  p1.c->when_closed = [c2] {
    fake::fail_call(fake::Call::PostFlush, IBMSG_EIO, 1);
    for (int i = 0; i < 4; ++i) expect_code(send_msg(*c2, 16), IBMSG_OK);
  };
  expect_code(ibmsg_disconnect(&p1.c->s), IBMSG_OK);
  RUN_UNTIL(h, c2->closed && p2.a->closed);
  expect_code(c2->close_reason, IBMSG_EIO);
  assert_int_equal(c2->sent_ok, 1);
  assert_int_equal(c2->sent_canceled, 3);
  assert_int_equal(c2->sent_other, 0);
  for (const Out &o : c2->outs) assert_int_equal(o.sent_cbs, o.posts);
  assert_int_equal(p2.a->received, 1);
  assert_int_equal(p2.a->bad_order, 0);
}

// Small payloads go inline (the device copies them at posting), larger ones by reference.
void small_messages_are_sent_inline(void **state) {
  H *h = h_of(state);
  Pair p = connected(h);
  expect_code(send_msg(*p.c, 32), IBMSG_OK);
  assert_int_equal(int(fake::posts().back().op), int(ibmsg::tp::Op::Send));
  assert_true(fake::posts().back().inlined);
  expect_code(send_msg(*p.c, 4096), IBMSG_OK);
  assert_false(fake::posts().back().inlined);
  RUN_UNTIL(h, p.c->sent_ok == 2 && p.a->received == 2);
}

void peer_disconnect_cancels_queued_messages_and_reports_econnreset(void **state) {
  H *h = h_of(state);
  ibmsg_options *o = small_queues(h);
  h->hold_accepted = true;
  Pair p = connected(h, o, o);
  for (int i = 0; i < 12; ++i) expect_code(send_msg(*p.c, 32), IBMSG_OK);  // 4 sent, 8 queued
  RUN_UNTIL(h, p.c->sent_ok == 4);
  fake::pause_wire(true);
  expect_code(send_msg(*p.a, 32), IBMSG_OK);  // in flight the other way
  expect_code(ibmsg_disconnect(&p.a->s), IBMSG_OK);
  RUN_UNTIL(h, p.c->closed && p.a->closed);
  expect_code(p.a->close_reason, IBMSG_OK);
  expect_code(p.c->close_reason, IBMSG_ECONNRESET);
  assert_int_equal(p.c->status_at_close, IBMSG_UNCONNECTED);
  assert_int_equal(p.c->sent_canceled, 8);
  assert_int_equal(p.c->sent_at_close, 12);
  assert_int_equal(p.a->sent_canceled, 1);
  assert_int_equal(p.a->sent_at_close, 1);
  assert_int_equal(p.a->held.size(), 4);  // still lent after the close; freed in the teardown
}

void connect_times_out_when_the_listener_never_answers(void **state) {
  H *h = h_of(state);
  Raw *r = new_raw(h);
  expect_code(r->listen(), IBMSG_OK);
  ibmsg_options *o = options(h, {{IBMSG_OPT_CONNECT_TIMEOUT, 30}});
  Conn &c = client(h, r->port(), o);
  auto closed = [&] { return c.closed != 0; };
  if (!run_until(h, closed, 200, 5)) fail_msg("the connect never timed out");
  expect_code(c.close_reason, IBMSG_ETIMEDOUT);
  assert_int_equal(c.status_at_close, IBMSG_ERROR);
  assert_int_equal(c.established, 0);
  assert_int_equal(r->requests, 1);
}

void accepted_connection_whose_handshake_never_completes_times_out(void **state) {
  H *h = h_of(state);
  fake::hold_established(true);
  ibmsg_options *o = options(h, {{IBMSG_OPT_CONNECT_TIMEOUT, 30}});
  Conn &l = listener(h, o);
  Raw *r = new_raw(h);
  expect_code(r->connect(port_of(l), fake::hello(8)), IBMSG_OK);
  auto closed = [&] { return !h->accepted.empty() && h->accepted.back()->closed; };
  if (!run_until(h, closed, 200, 5)) fail_msg("the accepted connection never timed out");
  expect_code(h->accepted.back()->close_reason, IBMSG_ETIMEDOUT);
  assert_int_equal(l.s.status, IBMSG_LISTENING);
}

void rejection_reports_erejected_with_the_reason(void **state) {
  H *h = h_of(state);
  h->policy = Policy::Reject;
  h->reject_text = "go away";
  Conn &l = listener(h);
  Conn &c = client(h, port_of(l));
  RUN_UNTIL(h, c.closed);
  expect_code(c.close_reason, IBMSG_EREJECTED);
  assert_string_equal(c.s.reject_reason, "go away");
  assert_int_equal(h->requests, 1);
  assert_int_equal(l.s.status, IBMSG_LISTENING);
}

void undecided_request_is_rejected_when_the_callback_returns(void **state) {
  H *h = h_of(state);
  h->policy = Policy::Leave;
  Conn &l = listener(h);
  Conn &c = client(h, port_of(l));
  RUN_UNTIL(h, c.closed);
  expect_code(c.close_reason, IBMSG_EREJECTED);
  assert_string_equal(c.s.reject_reason, "not accepted");
}

void rejection_without_reason_text_is_still_erejected(void **state) {
  H *h = h_of(state);
  Raw *r = new_raw(h);
  expect_code(r->listen(), IBMSG_OK);
  Conn &c = client(h, r->port());
  RUN_UNTIL(h, r->state() == Raw::State::Requested);
  expect_code(r->reject(nullptr, 0), IBMSG_OK);  // a peer application said no, without words
  RUN_UNTIL(h, c.closed);
  expect_code(c.close_reason, IBMSG_EREJECTED);
  assert_string_equal(c.s.reject_reason, "");
}

void connect_without_listener_is_refused(void **state) {
  H *h = h_of(state);
  Conn &c = client(h, 9);
  RUN_UNTIL(h, c.closed);
  expect_code(c.close_reason, IBMSG_ECONNREFUSED);
  assert_int_equal(c.status_at_close, IBMSG_ERROR);
}

void connect_to_an_unreachable_host_fails_with_ehostunreach(void **state) {
  H *h = h_of(state);
  Conn &c = client(h, 7000, nullptr, "192.0.2.1");
  RUN_UNTIL(h, c.closed);
  expect_code(c.close_reason, IBMSG_EHOSTUNREACH);
}

void disconnect_while_connecting_closes_with_ok(void **state) {
  H *h = h_of(state);
  Conn &l = listener(h);
  Conn &c = client(h, port_of(l));
  expect_code(ibmsg_disconnect(&c.s), IBMSG_OK);
  RUN_UNTIL(h, c.closed);
  expect_code(c.close_reason, IBMSG_OK);
  assert_int_equal(c.established, 0);
  settle(h);
  assert_int_equal(h->requests, 0);
}

void failed_post_returns_eio_keeps_the_message_and_closes(void **state) {
  H *h = h_of(state);
  Pair p = connected(h);
  ibmsg_buffer m;
  expect_code(ibmsg_alloc_msg(&m, &p.c->s, 16), IBMSG_OK);
  fake::fail_call(fake::Call::PostSend, IBMSG_EIO);
  expect_code(ibmsg_post_send(&p.c->s, &m), IBMSG_EIO);
  assert_int_equal(m.status, IBMSG_WAITING);  // still the application's
  // A queue pair that refuses a work request is broken: the connection closes, as it does when
  // a queued message cannot go out.
  RUN_UNTIL(h, p.c->closed && p.a->closed);
  expect_code(p.c->close_reason, IBMSG_EIO);
  assert_int_equal(p.c->sent_ok + p.c->sent_canceled + p.c->sent_other, 0);  // no callback for it
  expect_code(ibmsg_free_msg(&m), IBMSG_OK);
}

void failed_post_from_the_queue_closes_with_eio(void **state) {
  H *h = h_of(state);
  Raw *r = new_raw(h);
  expect_code(r->listen(), IBMSG_OK);
  Conn &c = client(h, r->port());
  RUN_UNTIL(h, r->state() == Raw::State::Requested);
  expect_code(r->accept(fake::hello(1)), IBMSG_OK);  // one data credit
  RUN_UNTIL(h, c.established);
  expect_code(send_msg(c, 16), IBMSG_OK);
  expect_code(send_msg(c, 16), IBMSG_OK);  // queued
  RUN_UNTIL(h, r->received.size() == 1 && c.sent_ok == 1);
  fake::fail_call(fake::Call::PostSend, IBMSG_EIO);
  expect_code(r->send(fake::imm(1, 1)), IBMSG_OK);  // the credit comes back: the post fails
  RUN_UNTIL(h, c.closed);
  expect_code(c.close_reason, IBMSG_EIO);
  assert_int_equal(c.sent_canceled, 1);
  assert_int_equal(c.sent_at_close, 2);
}

void failed_credit_message_post_closes_with_eio(void **state) {
  H *h = h_of(state);
  RawPair p = raw_client(h, fake::hello(8), 2);
  for (int i = 0; i < 2; ++i) expect_code(p.r->send(fake::imm(0), "data", 4), IBMSG_OK);
  RUN_UNTIL(h, p.a->received == 2);
  fake::fail_call(fake::Call::PostSend, IBMSG_EIO);
  free_held(*p.a);  // owes credits: the credit-only message fails
  RUN_UNTIL(h, p.a->closed);
  expect_code(p.a->close_reason, IBMSG_EIO);
}

void failed_receive_repost_closes_with_eio(void **state) {
  H *h = h_of(state);
  RawPair p = raw_client(h, fake::hello(8), 4);
  expect_code(p.r->send(fake::imm(0), "data", 4), IBMSG_OK);
  RUN_UNTIL(h, p.a->received == 1);
  fake::fail_call(fake::Call::PostRecv, IBMSG_EIO);
  free_held(*p.a);  // the buffer cannot go back: the message is still freed
  RUN_UNTIL(h, p.a->closed);
  expect_code(p.a->close_reason, IBMSG_EIO);
}

void failing_completion_queue_closes_with_eio(void **state) {
  H *h = h_of(state);
  Pair p = connected(h);
  fake::fail_call(fake::Call::CqPoll, -1);
  expect_code(send_msg(*p.c, 16), IBMSG_OK);
  RUN_UNTIL(h, p.c->closed && p.a->closed);
  // Both ends are on one loop and one device, so on one CQ: every connection on it closes with
  // EIO.
  expect_code(p.c->close_reason, IBMSG_EIO);
  expect_code(p.a->close_reason, IBMSG_EIO);
  assert_int_equal(p.c->sent_at_close, 1);
}

void failed_cq_create_closes_the_connect_with_its_error(void **state) {
  H *h = h_of(state);
  Conn &l = listener(h);
  fake::fail_call(fake::Call::CqCreate, IBMSG_ENOMEM);
  Conn &c = client(h, port_of(l));
  RUN_UNTIL(h, c.closed);
  expect_code(c.close_reason, IBMSG_ENOMEM);
  assert_int_equal(h->requests, 0);
}

// One CQ per device and loop: every connection's completions land in it, it grows as
// connections come, and they all keep working.
void connections_share_one_cq_that_grows_with_them(void **state) {
  H *h = h_of(state);
  std::vector<Pair> pairs;
  for (int i = 0; i < 6; ++i) pairs.push_back(connected(h));
  const ibmsg::tp::Cq *cq = pairs[0].c->s.impl->res.cq;
  assert_non_null(cq);
  for (Pair &p : pairs) {
    assert_ptr_equal(p.c->s.impl->res.cq, cq);
    assert_ptr_equal(p.a->s.impl->res.cq, cq);
  }
  assert_int_equal(fake::open_objects().cqs, 1);
  assert_true(fake::stats().cq_resizes >= 1);  // 12 connections outgrow the first size
  for (Pair &p : pairs) expect_code(send_msg(*p.c, 16), IBMSG_OK);
  for (Pair &p : pairs) expect_code(send_msg(*p.a, 16), IBMSG_OK);
  RUN_UNTIL(h, std::all_of(pairs.begin(), pairs.end(), [](const Pair &p) {
              return p.a->received == 1 && p.c->received == 1 && p.c->sent_ok == 1 &&
                     p.a->sent_ok == 1;
            }));
  for (Pair &p : pairs) assert_int_equal(p.a->bad_order + p.c->bad_order, 0);
}

// A connection that does not fit in the device's largest CQ gets another CQ on the device: the
// poller and the wake-ups serve both, and every connection keeps working.
void connections_beyond_the_largest_cq_get_another_cq(void **state) {
  H *h = h_of(state);
  fake::set_max_cqe(220);  // room for one pair with the default depths (208), not for two
  Pair p = connected(h);
  Pair q = connected(h);
  assert_int_equal(fake::open_objects().cqs, 2);
  assert_ptr_equal(p.c->s.impl->res.cq, p.a->s.impl->res.cq);
  assert_ptr_not_equal(p.c->s.impl->res.cq, q.c->s.impl->res.cq);
  for (Pair *x : {&p, &q}) expect_code(send_msg(*x->c, 16), IBMSG_OK);
  RUN_UNTIL(h, p.a->received == 1 && q.a->received == 1 && p.c->sent_ok == 1 &&
                   q.c->sent_ok == 1);
  expect_code(ibmsg_disconnect(&p.c->s), IBMSG_OK);
  RUN_UNTIL(h, p.c->closed && p.a->closed);
  expect_code(send_msg(*q.a, 16), IBMSG_OK);
  RUN_UNTIL(h, q.c->received == 1 && q.a->sent_ok == 1);
}

// A CQ that failed to arm would never wake the loop: its connections close with IBMSG_EIO, and a
// connection made while the device is still held (here by a message the application keeps) gets
// another CQ instead of joining the dead one.
void failed_arm_retires_the_cq_and_new_connections_get_another(void **state) {
  H *h = h_of(state);
  h->hold_accepted = true;
  Pair p = connected(h);
  expect_code(send_msg(*p.c, 16), IBMSG_OK);
  RUN_UNTIL(h, p.a->held.size() == 1);
  fake::fail_call(fake::Call::CqArm, IBMSG_EIO);
  expect_code(send_msg(*p.c, 16), IBMSG_OK);
  RUN_UNTIL(h, p.c->closed && p.a->closed);
  expect_code(p.c->close_reason, IBMSG_EIO);
  expect_code(p.a->close_reason, IBMSG_EIO);
  h->hold_accepted = false;
  Pair q = connected(h);
  assert_int_equal(fake::open_objects().cqs, 2);
  expect_code(send_msg(*q.c, 16), IBMSG_OK);
  expect_code(send_msg(*q.a, 16), IBMSG_OK);
  RUN_UNTIL(h, q.a->received == 1 && q.c->received == 1);
  free_held(*p.a);
}

// Soft-RoCE leaves a destroyed QP's completions in the shared CQ (the fake does too): the
// teardown polls them while the socket's memory is still there, so none is left behind.
void completions_left_by_a_destroyed_qp_are_polled_in_its_teardown(void **state) {
  H *h = h_of(state);
  Pair p = connected(h);
  Pair other = connected(h);
  unsigned long orphans_at_close = 0;
  p.c->when_closed = [&orphans_at_close] { orphans_at_close = fake::stats().orphan_cqes; };
  expect_code(ibmsg_disconnect(&p.c->s), IBMSG_OK);
  RUN_UNTIL(h, p.c->closed && p.a->closed);
  // Its receives were flushed when its QP went to the error state; the teardown polled them
  // after destroying the QP, before the closed callback (and before freeing the socket).
  assert_true(orphans_at_close > 0);
  settle(h);
  expect_code(send_msg(*other.c, 16), IBMSG_OK);
  RUN_UNTIL(h, other.a->received == 1 && other.c->sent_ok == 1);
}

void failed_receive_post_during_setup_closes_the_connect(void **state) {
  H *h = h_of(state);
  Conn &l = listener(h);
  fake::fail_call(fake::Call::PostRecv, IBMSG_EIO, 5);
  Conn &c = client(h, port_of(l));
  RUN_UNTIL(h, c.closed);
  expect_code(c.close_reason, IBMSG_EIO);
}

void failed_qp_create_closes_the_connect_with_its_error(void **state) {
  H *h = h_of(state);
  Conn &l = listener(h);
  fake::fail_call(fake::Call::QpCreate, IBMSG_ENOMEM);
  Conn &c = client(h, port_of(l));
  RUN_UNTIL(h, c.closed);
  expect_code(c.close_reason, IBMSG_ENOMEM);
}

void failed_qp_create_on_accept_rejects_the_peer(void **state) {
  H *h = h_of(state);
  Conn &l = listener(h);
  fake::fail_call(fake::Call::QpCreate, IBMSG_ENOMEM, 1);  // the client's goes through
  Conn &c = client(h, port_of(l));
  RUN_UNTIL(h, c.closed);
  expect_code(h->accept_rc, IBMSG_ENOMEM);
  expect_code(c.close_reason, IBMSG_EREJECTED);
}

void failed_device_open_on_accept_returns_its_error(void **state) {
  H *h = h_of(state);
  Conn &l = listener(h);
  Raw *r = new_raw(h);
  fake::fail_call(fake::Call::DeviceOpen, IBMSG_ENOMEM);
  expect_code(r->connect(port_of(l), fake::hello(8)), IBMSG_OK);
  RUN_UNTIL(h, h->accept_rc != -1);
  expect_code(h->accept_rc, IBMSG_ENOMEM);
}

void failed_connect_or_route_closes_the_connect_with_its_error(void **state) {
  H *h = h_of(state);
  Conn &l = listener(h);
  fake::fail_call(fake::Call::CmConnect, IBMSG_EIO);
  Conn &c1 = client(h, port_of(l));
  RUN_UNTIL(h, c1.closed);
  expect_code(c1.close_reason, IBMSG_EIO);
  fake::fail_call(fake::Call::CmResolveRoute, IBMSG_EHOSTUNREACH);
  Conn &c2 = client(h, port_of(l));
  RUN_UNTIL(h, c2.closed);
  expect_code(c2.close_reason, IBMSG_EHOSTUNREACH);
}

void failed_listen_bind_or_id_returns_the_error_and_opens_nothing(void **state) {
  H *h = h_of(state);
  Conn &l = new_conn(h, "listener");
  fake::fail_call(fake::Call::CmListen, IBMSG_EADDRINUSE);
  expect_code(ibmsg_listen(&h->loop, &l.s, nullptr, 0, 4), IBMSG_EADDRINUSE);
  fake::fail_call(fake::Call::CmBind, IBMSG_EADDRNOTAVAIL);
  expect_code(ibmsg_listen(&h->loop, &l.s, nullptr, 0, 4), IBMSG_EADDRNOTAVAIL);
  fake::fail_call(fake::Call::CmIdCreate, IBMSG_ENOMEM);
  expect_code(ibmsg_listen(&h->loop, &l.s, nullptr, 0, 4), IBMSG_ENOMEM);
  assert_int_equal(fake::open_objects().ids, 0);
}

void failed_registration_on_connect_closes_with_its_error(void **state) {
  H *h = h_of(state);
  Conn &l = listener(h);
  // The receive pool's (send buffers are registered by the device when a message needs one).
  fake::fail_call(fake::Call::MrRegister, IBMSG_ENOMEM);
  Conn &c = client(h, port_of(l));
  RUN_UNTIL(h, c.closed);
  expect_code(c.close_reason, IBMSG_ENOMEM);
}

void freeing_a_held_message_inside_the_closed_callback_works(void **state) {
  H *h = h_of(state);
  RawPair p = raw_client(h, fake::hello(8), 4);
  expect_code(p.r->send(fake::imm(0), "data", 4), IBMSG_OK);
  RUN_UNTIL(h, p.a->received == 1);
  Conn *a = p.a;
  a->when_closed = [a] { free_held(*a); };
  expect_code(ibmsg_disconnect(&a->s), IBMSG_OK);
  RUN_UNTIL(h, a->closed);
  assert_true(a->held.empty());
}

void failed_registration_on_accept_rejects_the_peer(void **state) {
  H *h = h_of(state);
  Conn &l = listener(h);
  // The client registers its receive pool first (route resolution comes before the request).
  fake::fail_call(fake::Call::MrRegister, IBMSG_ENOMEM, 1);
  Conn &c = client(h, port_of(l));
  RUN_UNTIL(h, c.closed);
  expect_code(h->accept_rc, IBMSG_ENOMEM);
  expect_code(c.close_reason, IBMSG_EREJECTED);
  assert_string_equal(c.s.reject_reason, "the server could not set up the connection");
  assert_int_equal(l.s.status, IBMSG_LISTENING);
}

void accept_when_the_peer_went_away_returns_econnreset(void **state) {
  H *h = h_of(state);
  Conn &l = listener(h);
  Raw *r = new_raw(h);
  expect_code(r->connect(port_of(l), fake::hello(8)), IBMSG_OK);
  r->close();  // gone before the listener saw the request
  settle(h);
  assert_int_equal(h->requests, 1);
  expect_code(h->accept_rc, IBMSG_ECONNRESET);
  assert_int_equal(h->accepted.size(), 0);
  assert_int_equal(l.s.status, IBMSG_LISTENING);
}

void failed_cm_accept_rejects_the_peer(void **state) {
  H *h = h_of(state);
  Conn &l = listener(h);
  fake::fail_call(fake::Call::CmAccept, IBMSG_ECONNRESET);
  Conn &c = client(h, port_of(l));
  RUN_UNTIL(h, c.closed);
  expect_code(h->accept_rc, IBMSG_ECONNRESET);
  expect_code(c.close_reason, IBMSG_EREJECTED);
}

// Only the last message of a post list is signaled. When it fails, the unsignaled ones before it
// that made it are still confirmed, first and in order: here the peer lied about its buffer size,
// so the list's second message fails at the device after the first was delivered.
void failing_last_message_of_a_list_confirms_the_ones_before_it(void **state) {
  H *h = h_of(state);
  RawPair p = raw_client(h, fake::hello(8, 4, 65536));  // its buffers take 4096 bytes
  h->length_errors_expected = 1;
  Pair other = connected(h);
  Conn *a = p.a;
  other.c->when_closed = [a] {
    expect_code(send_msg(*a, 16), IBMSG_OK);    // nothing in flight: goes at once
    expect_code(send_msg(*a, 16), IBMSG_OK);    // these two: one list,
    expect_code(send_msg(*a, 8192), IBMSG_OK);  // this one signaled
  };
  expect_code(ibmsg_disconnect(&other.c->s), IBMSG_OK);
  RUN_UNTIL(h, a->closed);
  expect_code(a->close_reason, IBMSG_EIO);
  assert_int_equal(a->sent_ok, 2);
  assert_int_equal(a->sent_other, 1);  // IBMSG_EIO
  assert_int_equal(a->sent_canceled, 0);
  assert_int_equal(p.r->received.size(), 2);
}

// A failed accept leaves its flushed receives in the device's CQ (librdmacm moves the QP to the
// error state): their pool stays until the loop has polled them, then goes; connections on the
// same CQ are not disturbed.
void failed_accept_keeps_its_receive_pool_until_the_cq_is_polled(void **state) {
  H *h = h_of(state);
  Pair p = connected(h);
  const unsigned long mrs = fake::open_objects().mrs, orphans = fake::stats().orphan_cqes;
  fake::fail_call(fake::Call::CmAccept, IBMSG_ECONNRESET);
  Conn &c = client(h, port_of(*p.l));
  RUN_UNTIL(h, c.closed);
  expect_code(h->accept_rc, IBMSG_ECONNRESET);
  settle(h);
  assert_true(fake::stats().orphan_cqes > orphans);  // polled by the loop, after the accept
  assert_int_equal(fake::open_objects().mrs, mrs);   // every pool of the failed accept went
  expect_code(send_msg(*p.c, 16), IBMSG_OK);
  RUN_UNTIL(h, p.a->received == 1 && p.c->sent_ok == 1);
}

void closing_the_listener_keeps_accepted_connections(void **state) {
  H *h = h_of(state);
  Pair p = connected(h);
  unsigned short port = port_of(*p.l);
  expect_code(ibmsg_disconnect(&p.l->s), IBMSG_OK);
  RUN_UNTIL(h, p.l->closed);
  expect_code(p.l->close_reason, IBMSG_OK);
  settle(h);
  assert_int_equal(p.c->closed + p.a->closed, 0);
  expect_code(send_msg(*p.c, 16), IBMSG_OK);
  expect_code(send_msg(*p.a, 16), IBMSG_OK);
  RUN_UNTIL(h, p.a->received == 1 && p.c->received == 1);
  Conn &late = client(h, port);
  RUN_UNTIL(h, late.closed);
  expect_code(late.close_reason, IBMSG_ECONNREFUSED);
  assert_int_equal(p.c->s.status, IBMSG_CONNECTED);
}

void closed_listener_refuses_new_connections(void **state) {
  H *h = h_of(state);
  Conn &l = listener(h);
  unsigned short port = port_of(l);
  expect_code(ibmsg_disconnect(&l.s), IBMSG_OK);
  RUN_UNTIL(h, l.closed);
  Conn &c = client(h, port);
  RUN_UNTIL(h, c.closed);
  expect_code(c.close_reason, IBMSG_ECONNREFUSED);
}

void closing_the_listener_with_a_request_pending_rejects_it(void **state) {
  H *h = h_of(state);
  Conn &l = listener(h);
  Raw *r = new_raw(h);
  expect_code(r->connect(port_of(l), fake::hello(8)),
              IBMSG_OK);  // the request waits in the channel
  expect_code(ibmsg_disconnect(&l.s), IBMSG_OK);
  RUN_UNTIL(h, l.closed && r->state() == Raw::State::Rejected);
  assert_int_equal(h->requests, 0);
}

void too_many_connections_are_rejected(void **state) {
  H *h = h_of(state);
  Conn &l = listener(h, nullptr, 1);
  Conn &c1 = client(h, port_of(l));
  RUN_UNTIL(h, c1.established);
  Conn &c2 = client(h, port_of(l));
  RUN_UNTIL(h, c2.closed);
  expect_code(c2.close_reason, IBMSG_EREJECTED);
  assert_string_equal(c2.s.reject_reason, "too many connections");
  expect_code(ibmsg_disconnect(&c1.s), IBMSG_OK);
  RUN_UNTIL(h, c1.closed && h->accepted.back()->closed);
  Conn &c3 = client(h, port_of(l));  // room again
  RUN_UNTIL(h, c3.established);
}

void disconnect_inside_the_closed_callback_returns_enotconn(void **state) {
  H *h = h_of(state);
  Pair p = connected(h);
  expect_code(ibmsg_disconnect(&p.c->s), IBMSG_OK);
  RUN_UNTIL(h, p.c->closed && p.a->closed);
  expect_code(p.c->disconnect_in_closed, IBMSG_ENOTCONN);
  expect_code(p.a->disconnect_in_closed, IBMSG_ENOTCONN);
  expect_code(ibmsg_disconnect(&p.c->s), IBMSG_ENOTCONN);  // and afterwards
}

void listen_and_connect_on_an_open_socket_return_estate_and_leave_it_working(void **state) {
  H *h = h_of(state);
  Pair p = connected(h);
  unsigned short port = port_of(*p.l);
  expect_code(ibmsg_listen(&h->loop, &p.c->s, nullptr, 0, 1), IBMSG_ESTATE);
  expect_code(ibmsg_connect(&h->loop, &p.c->s, "127.0.0.1", port), IBMSG_ESTATE);
  expect_code(ibmsg_connect(&h->loop, &p.l->s, "127.0.0.1", port), IBMSG_ESTATE);
  expect_code(ibmsg_listen(&h->loop, &p.l->s, nullptr, 0, 1), IBMSG_ESTATE);
  assert_int_equal(p.c->s.status, IBMSG_CONNECTED);
  assert_int_equal(p.l->s.status, IBMSG_LISTENING);
  expect_code(send_msg(*p.c, 16), IBMSG_OK);
  RUN_UNTIL(h, p.a->received == 1 && p.c->sent_ok == 1);
  Conn &c2 = client(h, port);  // the listener still listens
  RUN_UNTIL(h, c2.established);
}

void accept_into_an_open_socket_returns_estate(void **state) {
  H *h = h_of(state);
  Pair p = connected(h);
  h->policy = Policy::AcceptInto;
  h->accept_into = p.c;
  Conn &c2 = client(h, port_of(*p.l));
  RUN_UNTIL(h, c2.closed);
  expect_code(h->accept_rc, IBMSG_ESTATE);
  expect_code(c2.close_reason, IBMSG_EREJECTED);
  assert_int_equal(p.c->s.status, IBMSG_CONNECTED);
  expect_code(send_msg(*p.c, 16), IBMSG_OK);
  RUN_UNTIL(h, p.a->received == 1);
}

void iwarp_device_fails_the_connect_with_enodev(void **state) {
  H *h = h_of(state);
  fake::set_iwarp(true);
  Conn &l = listener(h);
  Conn &c = client(h, port_of(l));
  RUN_UNTIL(h, c.closed);
  expect_code(c.close_reason, IBMSG_ENODEV);
  assert_int_equal(h->requests, 0);
}

void iwarp_device_fails_the_accept_with_enodev(void **state) {
  H *h = h_of(state);
  fake::set_iwarp(true);
  Conn &l = listener(h);
  Raw *r = new_raw(h);
  expect_code(r->connect(port_of(l), fake::hello(8)), IBMSG_OK);
  RUN_UNTIL(h, r->state() == Raw::State::Rejected);
  expect_code(h->accept_rc, IBMSG_ENODEV);
  assert_string_equal(reject_text_of(r).c_str(), "the server could not set up the connection");
}

void device_option_naming_another_device_fails_with_enodev(void **state) {
  H *h = h_of(state);
  Conn &l = listener(h);
  ibmsg_options *o = ibmsg_options_new(&h->loop);
  h->opts.push_back(o);
  expect_code(ibmsg_options_set(o, IBMSG_OPT_DEVICE, "mlx5_0", 6), IBMSG_OK);
  Conn &c = client(h, port_of(l), o);
  RUN_UNTIL(h, c.closed);
  expect_code(c.close_reason, IBMSG_ENODEV);
  Conn &l2 = new_conn(h, "listener on 127.0.0.1");
  expect_code(ibmsg_listen_opts(&h->loop, &l2.s, "127.0.0.1", 0, 1, o), IBMSG_ENODEV);
}

void socket_can_connect_again_from_its_own_closed_callback(void **state) {
  H *h = h_of(state);
  Conn &l = listener(h);
  unsigned short port = port_of(l);
  Conn &c = client(h, port);
  RUN_UNTIL(h, c.established == 1);
  Conn *cp = &c;
  c.when_closed = [h, cp, port] {  // the struct is the application's again: set it up anew
    if (cp->lives > 1) return;
    expect_code(ibmsg_connect(&h->loop, &cp->s, "127.0.0.1", port), IBMSG_OK);
    ++cp->lives;
  };
  expect_code(ibmsg_disconnect(&c.s), IBMSG_OK);
  RUN_UNTIL(h, c.closed == 1 && c.established == 2);
  assert_int_equal(c.s.status, IBMSG_CONNECTED);
  expect_code(send_msg(c, 16), IBMSG_OK);
  RUN_UNTIL(h, h->accepted.back()->received == 1);
}

void loop_calls_from_inside_a_callback_return_ebusy(void **state) {
  H *h = h_of(state);
  Pair p = connected(h);
  p.c->when_closed = [h] {
    h->inner_dispatch = ibmsg_dispatch_event_loop_timeout(&h->loop, 0);
    h->inner_destroy = ibmsg_destroy_event_loop(&h->loop);
  };
  expect_code(ibmsg_disconnect(&p.c->s), IBMSG_OK);
  RUN_UNTIL(h, p.c->closed && p.a->closed);
  expect_code(h->inner_dispatch, IBMSG_EBUSY);
  expect_code(h->inner_destroy, IBMSG_EBUSY);
}

// Many connections on one listener, random traffic in both directions, receivers holding
// messages for a while, a wire that stalls and acknowledgements that lag, connections closing
// from either side: every guarantee the teardown checks must hold, and a confirmed message must
// have arrived.
void random_traffic(H *h, bool lagging_acks) {
  ibmsg_options *o = options(h, {{IBMSG_OPT_RECV_DEPTH, 4},
                                 {IBMSG_OPT_SEND_DEPTH, 8},
                                 {IBMSG_OPT_SEND_QUEUE, 4},
                                 {IBMSG_OPT_MAX_MSG_SIZE, 128}});
  Conn *l = &listener(h, o, 16);
  unsigned short port = port_of(*l);
  h->hold_accepted = true;
  const char *seed = getenv("FAKE_SEED");  // to explore other runs
  std::mt19937 rng(seed ? unsigned(atoi(seed)) : 42u);
  bool paused = false, delayed = false;
  int results[4] = {0, 0, 0, 0};  // ok, EAGAIN, ENOTCONN, other
  for (int step = 0; step < 5000; ++step) {
    std::vector<Conn *> &up = h->up, &open = h->open, &holding = h->holding;
    up.clear();
    open.clear();
    holding.clear();
    for (Conn &c : h->conns) {
      if (strcmp(c.name, "listener") == 0) continue;
      if (c.opened && !c.closed && c.established) up.push_back(&c);
      if (c.opened && !c.closed) open.push_back(&c);
      if (!c.held.empty()) holding.push_back(&c);
    }
    unsigned op = rng() % 1000;
    if (op < 40) {  // about 8 connections up at a time
      if (up.size() < 16) client(h, port, o).hold = true;
    } else if (op < 500) {
      if (up.empty()) goto next;
      Conn *c = up[rng() % up.size()];
      int rc = send_msg(*c, 8 + rng() % 121);
      ++results[rc == IBMSG_OK ? 0 : rc == IBMSG_EAGAIN ? 1 : rc == IBMSG_ENOTCONN ? 2 : 3];
      if (rc != IBMSG_OK && rc != IBMSG_EAGAIN && rc != IBMSG_ENOTCONN)
        fail_msg("step %d: sending on the %s socket: %s", step, c->name, ibmsg_err_name(rc));
    } else if (op < 900) {
      if (holding.empty()) goto next;
      Conn *c = holding[rng() % holding.size()];
      free_held(*c, 1 + rng() % c->held.size());
    } else if (op < 905) {  // any open connection, also one still connecting
      if (open.empty()) goto next;
      Conn *c = open[rng() % open.size()];
      int rc = ibmsg_disconnect(&c->s);
      if (rc != IBMSG_OK && rc != IBMSG_ESTATE)
        fail_msg("step %d: disconnecting the %s socket: %s", step, c->name, ibmsg_err_name(rc));
    } else if (op < 915) {
      fake::pause_wire(paused = !paused);
    } else if (op < 925) {
      if (lagging_acks) fake::delay_send_completions(delayed = !delayed);
    } else if (op < 927) {  // a new listener; the old one's connections stay
      expect_code(ibmsg_disconnect(&l->s), IBMSG_OK);
      l = &listener(h, o, 16);
      port = port_of(*l);
    }
  next:
    ibmsg_dispatch_event_loop_timeout(&h->loop, 0);
  }
  fake::pause_wire(false);
  fake::delay_send_completions(false);
  // Quiet down: every posted message gets its message_sent.
  bool quiet = run_until(h, [h] {
    for (Conn &c : h->conns) free_held(c);
    for (Conn &c : h->conns)
      for (Out &x : c.outs)
        if (x.posts != x.sent_cbs) return false;
    return true;
  });
  if (!quiet) {
    for (Conn &c : h->conns) {
      int pending = 0;
      for (Out &x : c.outs) pending += x.posts - x.sent_cbs;
      if (!pending || !c.s.impl) continue;
      const ibmsg::Credits &cr = c.s.impl->tx.credits;
      fprintf(stderr,
              "%s :%u->:%u: %d unconfirmed, queue %zu, flight %zu, state %s; credits data %u "
              "ctrl %u owed %u owed_ctrl %u held %u granted %u\n",
              c.name, c.local_port, c.peer_port, pending, c.s.impl->tx.queue.size(),
              c.s.impl->tx.flight.size(), ibmsg::state_name(c.s.impl->state), cr.data(), cr.ctrl(),
              cr.owed(), cr.owed_ctrl(), cr.held(), cr.granted());
      for (Conn &a : h->conns) {
        if (&a == &c || a.peer_port != c.local_port || a.local_port != c.peer_port || !a.s.impl)
          continue;
        const ibmsg::Credits &ar = a.s.impl->tx.credits;
        fprintf(stderr,
                "   peer %s: state %s held-by-app %zu; credits data %u ctrl %u owed %u owed_ctrl "
                "%u held %u granted %u granted_ctrl %u\n",
                a.name, ibmsg::state_name(a.s.impl->state), a.held.size(), ar.data(), ar.ctrl(),
                ar.owed(), ar.owed_ctrl(), ar.held(), ar.granted(), ar.granted_ctrl());
      }
    }
    fail_msg("some posted messages never got their message_sent");
  }
  int pairs = 0;
  for (Conn &c : h->conns) {
    if (strcmp(c.name, "client") != 0 || !c.established) continue;
    for (Conn &a : h->conns) {
      if (strcmp(a.name, "accepted") != 0 || a.peer_port != c.local_port) continue;
      ++pairs;
      if (uint64_t(c.sent_ok) > a.received || uint64_t(a.sent_ok) > c.received)
        fail_msg("confirmed but not received: client %d/%llu, server %d/%llu", c.sent_ok,
                 (unsigned long long)a.received, a.sent_ok, (unsigned long long)c.received);
      if (!c.closed && !a.closed &&
          (uint64_t(c.sent_ok) != a.received || uint64_t(a.sent_ok) != c.received))
        fail_msg(
            "an open connection lost messages: client sent %d, server got %llu; server sent %d, "
            "client got %llu",
            c.sent_ok, (unsigned long long)a.received, a.sent_ok, (unsigned long long)c.received);
    }
  }
  assert_true(pairs >= 8);
  assert_true(results[0] > 500);
  if (getenv("FAKE_DEBUG")) {
    int closed = 0, ok = 0, canceled = 0, other = 0;
    uint64_t received = 0;
    for (Conn &c : h->conns) {
      closed += c.closed;
      ok += c.sent_ok;
      canceled += c.sent_canceled;
      other += c.sent_other;
      received += c.received;
    }
    std::map<std::string, int> reasons;
    for (Conn &c : h->conns)
      if (c.closed) ++reasons[std::string(c.name) + ":" + ibmsg_err_name(c.close_reason)];
    for (auto &r : reasons) fprintf(stderr, "  %s %d\n", r.first.c_str(), r.second);
    fprintf(stderr,
            "%d pairs, %d closed, %d sent ok, %d canceled, %d failed, %llu received; posts: %d ok, "
            "%d EAGAIN, %d ENOTCONN\n",
            pairs, closed, ok, canceled, other, (unsigned long long)received, results[0],
            results[1], results[2]);
  }
}

void random_traffic_and_closes_keep_every_guarantee(void **state) {
  random_traffic(h_of(state), false);
}

// The same with acknowledgements that lag behind the peer's answers (IB allows coalesced ACKs,
// and a lost ACK is only repaired by a later one): a send's queue slot stays taken until its
// completion is polled, while the peer already returned the credit it spent.
void random_traffic_with_lagging_acknowledgements_keeps_every_guarantee(void **state) {
  random_traffic(h_of(state), true);
}

// === 7. device and memory lifetime ============================================================

void everything_is_released_once_the_sockets_close(void **state) {
  H *h = h_of(state);
  Pair p = connected(h);
  expect_code(send_msg(*p.c, 16), IBMSG_OK);
  expect_code(send_msg(*p.a, 16), IBMSG_OK);
  RUN_UNTIL(h, p.a->received == 1 && p.c->received == 1);
  assert_int_equal(fake::open_objects().devices, 1);  // one loop, one device for both sides
  expect_code(ibmsg_disconnect(&p.c->s), IBMSG_OK);
  expect_code(ibmsg_disconnect(&p.l->s), IBMSG_OK);
  RUN_UNTIL(h, p.c->closed && p.a->closed && p.l->closed);
  RUN_UNTIL(h, fake::open_objects().devices == 0);
  fake::Counts n = fake::open_objects();
  assert_int_equal(n.ids + n.cqs + n.qps + n.mrs, 0);
  assert_int_equal(n.channels, 1);  // the loop's, until it is destroyed
}

void held_message_keeps_the_device_and_blocks_loop_destroy(void **state) {
  H *h = h_of(state);
  h->hold_accepted = true;
  Pair p = connected(h);
  expect_code(send_msg(*p.c, 16), IBMSG_OK);
  RUN_UNTIL(h, p.a->held.size() == 1);
  expect_code(ibmsg_disconnect(&p.c->s), IBMSG_OK);
  expect_code(ibmsg_disconnect(&p.l->s), IBMSG_OK);
  RUN_UNTIL(h, p.c->closed && p.a->closed && p.l->closed);
  settle(h);
  fake::Counts n = fake::open_objects();
  assert_int_equal(n.devices, 1);  // the held message's registration needs it
  assert_int_equal(n.mrs, 1);
  assert_int_equal(n.cqs, 1);  // the device's, which goes with it
  assert_int_equal(n.ids + n.qps, 0);
  expect_code(ibmsg_destroy_event_loop(&h->loop), IBMSG_EBUSY);
  free_held(*p.a);
  settle(h, 2);
  n = fake::open_objects();
  assert_int_equal(n.devices + n.mrs, 0);
  expect_code(ibmsg_destroy_event_loop(&h->loop), IBMSG_OK);
  h->loop_alive = false;
}

void device_removed_while_its_sockets_close_is_still_rescanned(void **state) {
  H *h = h_of(state);
  Pair p = connected(h);
  expect_code(ibmsg_disconnect(&p.c->s), IBMSG_OK);
  expect_code(ibmsg_disconnect(&p.a->s), IBMSG_OK);
  fake::remove_device();  // heard by sockets that are closing already
  RUN_UNTIL(h, p.c->closed && p.a->closed);
  RUN_UNTIL(h, fake::open_objects().devices == 0);
  if (fake::stats().rescans == 0)
    fail_msg("the device went away while its sockets closed, and rdma-core was never told to "
             "rescan: it keeps the removed device open");
}

void device_removal_closes_connections_with_enodev_and_lets_the_device_go(void **state) {
  H *h = h_of(state);
  h->hold_accepted = true;
  Pair p = connected(h);
  const int epfd = ibmsg_event_loop_fd(&h->loop);  // watches the device's channel too
  assert_true(epfd >= 0);
  expect_code(send_msg(*p.c, 16), IBMSG_OK);
  RUN_UNTIL(h, p.a->held.size() == 1);
  fake::remove_device();
  RUN_UNTIL(h, p.c->closed && p.a->closed);
  expect_code(p.c->close_reason, IBMSG_ENODEV);
  expect_code(p.a->close_reason, IBMSG_ENODEV);
  assert_int_equal(p.l->closed, 0);  // a wildcard listener is on no device
  settle(h);
  assert_int_equal(fake::open_objects().devices, 1);  // the held message still needs it
  // Its channel stays readable and reading it fails: it is no longer watched, so the loop does
  // not spin while the device waits for the held message (nor does a foreign loop on the fd).
  const unsigned long takes = fake::stats().take_events;
  timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  int rounds = 0;
  do {
    expect_code(ibmsg_dispatch_event_loop_timeout(&h->loop, 10), IBMSG_OK);
    ++rounds;
    clock_gettime(CLOCK_MONOTONIC, &t1);
  } while ((t1.tv_sec - t0.tv_sec) * 1000 + (t1.tv_nsec - t0.tv_nsec) / 1000000 < 60);
  assert_int_equal(fake::stats().take_events, takes);
  if (rounds > 10) fail_msg("%d rounds of the loop in 60 ms with nothing to do", rounds);
  pollfd pfd{epfd, POLLIN, 0};
  assert_int_equal(poll(&pfd, 1, 0), 0);
  free_held(*p.a);
  RUN_UNTIL(h, fake::open_objects().devices == 0);
  assert_true(fake::stats().rescans > 0);  // rdma-core is told to let go of it
  Conn &c2 = client(h, port_of(*p.l));
  RUN_UNTIL(h, c2.closed);
  expect_code(c2.close_reason, IBMSG_EHOSTUNREACH);
}

// A completion channel that fails on its own (no CM event): the core alone closes the device's
// connections, leaves the fd out of ibmsg_event_loop_fd's set, and a new connection opens the
// device anew while a held message keeps the broken device object.
void failed_channel_closes_its_connections_and_a_new_one_opens_the_device_anew(void **state) {
  H *h = h_of(state);
  h->hold_accepted = true;
  Pair p = connected(h);
  expect_code(send_msg(*p.c, 16), IBMSG_OK);
  RUN_UNTIL(h, p.a->held.size() == 1);
  fake::fail_channels();
  RUN_UNTIL(h, p.c->closed && p.a->closed);
  expect_code(p.c->close_reason, IBMSG_ENODEV);
  expect_code(p.a->close_reason, IBMSG_ENODEV);
  settle(h);
  assert_int_equal(fake::open_objects().devices, 1);  // the held message keeps it
  const int epfd = ibmsg_event_loop_fd(&h->loop);     // made after the failure
  assert_true(epfd >= 0);
  pollfd pfd{epfd, POLLIN, 0};
  assert_int_equal(poll(&pfd, 1, 0), 0);  // the failed channel is not in it
  Conn &c2 = client(h, port_of(*p.l));
  RUN_UNTIL(h, c2.established && h->accepted.size() == 2 && h->accepted.back()->established);
  Conn &a2 = *h->accepted.back();
  assert_int_equal(fake::open_objects().devices, 2);  // a new device object
  expect_code(send_msg(c2, 16), IBMSG_OK);
  RUN_UNTIL(h, a2.held.size() == 1);
  free_held(a2);
  free_held(*p.a);
  RUN_UNTIL(h, fake::open_objects().devices == 1);  // the broken one went
}

void allocated_send_buffer_keeps_the_device_until_freed(void **state) {
  H *h = h_of(state);
  Pair p = connected(h);
  ibmsg_buffer m;
  expect_code(ibmsg_alloc_msg(&m, &p.c->s, 16), IBMSG_OK);
  expect_code(ibmsg_disconnect(&p.c->s), IBMSG_OK);
  expect_code(ibmsg_disconnect(&p.l->s), IBMSG_OK);
  RUN_UNTIL(h, p.c->closed && p.a->closed && p.l->closed);
  settle(h);
  assert_int_equal(fake::open_objects().devices, 1);
  assert_int_equal(fake::open_objects().mrs, 1);
  expect_code(ibmsg_destroy_event_loop(&h->loop), IBMSG_EBUSY);
  expect_code(ibmsg_free_msg(&m), IBMSG_OK);
  expect_code(ibmsg_destroy_event_loop(&h->loop), IBMSG_OK);  // releases the device itself
  h->loop_alive = false;
  assert_int_equal(fake::open_objects().devices, 0);
}


// --- keepalive (protocol 1.4) ---------------------------------------------------------------

double now_ms() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return double(ts.tv_sec) * 1e3 + double(ts.tv_nsec) / 1e6;
}

// Runs the loop (and the raw peers) for ms milliseconds, or until done().
template <class F>
bool run_for(H *h, double ms, F done) {
  const double end = now_ms() + ms;
  while (now_ms() < end) {
    for (auto &r : h->raws) r->pump();
    if (done()) return true;
    ibmsg_dispatch_event_loop_timeout(&h->loop, 1);
  }
  return done();
}
void run_ms(H *h, double ms) {
  run_for(h, ms, [] { return false; });
}

std::vector<std::pair<int, std::string>> log_lines;
void collect_log(ibmsg_event_loop *, ibmsg_socket *, int level, const char *text) {
  log_lines.emplace_back(level, text);
}

ibmsg_options *ka_options(H *h, int ms, int count = 3) {
  return options(h, {{IBMSG_OPT_KEEPALIVE, ms}, {IBMSG_OPT_KEEPALIVE_COUNT, count}});
}

ibmsg_stats stats_of(Conn &c) {
  ibmsg_stats st;
  memset(&st, 0xff, sizeof st);
  expect_code(ibmsg_socket_stats(&c.s, &st, sizeof st), IBMSG_OK);
  return st;
}

void keepalive_options_have_limits_and_defaults(void **state) {
  H *h = h_of(state);
  ibmsg_options *o = options(h, {});
  struct {
    int opt, def, bad1, bad2, good;
  } cases[] = {{IBMSG_OPT_KEEPALIVE, 10000, -1, 24 * 3600 * 1000 + 1, 0},
               {IBMSG_OPT_KEEPALIVE_COUNT, 3, 1, 256, 2},
               {IBMSG_OPT_ACK_TIMEOUT, 18, -1, 32, 0},
               {IBMSG_OPT_RETRY_COUNT, 7, -1, 8, 0}};
  for (auto &c : cases) {
    int v = -5;
    size_t len = sizeof v;
    expect_code(ibmsg_options_get(o, c.opt, &v, &len), IBMSG_OK);
    assert_int_equal(v, c.def);
    expect_code(ibmsg_options_set(o, c.opt, &c.bad1, sizeof(int)), IBMSG_EINVAL);
    expect_code(ibmsg_options_set(o, c.opt, &c.bad2, sizeof(int)), IBMSG_EINVAL);
    expect_code(ibmsg_options_set(o, c.opt, &c.good, sizeof(int)), IBMSG_OK);
    len = sizeof v;
    expect_code(ibmsg_options_get(o, c.opt, &v, &len), IBMSG_OK);
    assert_int_equal(v, c.good);
  }
}

void idle_connection_with_keepalive_stays_up_and_probes(void **state) {
  H *h = h_of(state);
  ibmsg_options *o = ka_options(h, 20);
  h->accept_opts = o;
  Pair p = connected(h, o, o);
  run_ms(h, 400);  // 20 intervals, silent but for the probes
  assert_int_equal(p.c->closed, 0);
  assert_int_equal(p.a->closed, 0);
  ibmsg_stats c = stats_of(*p.c), a = stats_of(*p.a);
  assert_true(c.keepalives_sent + a.keepalives_sent >= 5);
  // every probe arrived (but one may be on its way now)
  assert_true(a.keepalives_received + 1 >= c.keepalives_sent);
  assert_true(c.keepalives_received + 1 >= a.keepalives_sent);
  assert_int_equal(c.keepalive_misses + a.keepalive_misses, 0);
  assert_int_equal(fake::stats().rnr_errors, 0);
  expect_code(send_msg(*p.c, 100), IBMSG_OK);
  RUN_UNTIL(h, p.a->received == 1 && p.c->sent_ok == 1);
  assert_int_equal(stats_of(*p.c).msgs_sent, 1);
  assert_int_equal(stats_of(*p.c).bytes_sent, 100);
  assert_int_equal(stats_of(*p.a).msgs_received, 1);
  assert_int_equal(stats_of(*p.a).bytes_received, 100);
}

void a_peer_that_stops_answering_closes_both_sides_with_etimedout(void **state) {
  H *h = h_of(state);
  ibmsg_options *o = ka_options(h, 20, 3);
  h->accept_opts = o;
  Pair p = connected(h, o, o);
  ibmsg_stats cst, ast;
  memset(&cst, 0xff, sizeof cst);
  memset(&ast, 0xff, sizeof ast);
  p.c->when_closed = [&] { expect_code(ibmsg_socket_stats(&p.c->s, &cst, sizeof cst), IBMSG_OK); };
  p.a->when_closed = [&] { expect_code(ibmsg_socket_stats(&p.a->s, &ast, sizeof ast), IBMSG_OK); };
  expect_code(send_msg(*p.c, 64), IBMSG_OK);
  RUN_UNTIL(h, p.c->sent_ok == 1);
  fake::pause_wire(true);  // nothing arrives any more, nothing completes: a cut link
  const double t0 = now_ms();
  expect_code(send_msg(*p.c, 64), IBMSG_OK);  // in flight when the link went
  run_for(h, 1000, [&] { return p.c->closed && p.a->closed; });
  const double took = now_ms() - t0;
  fake::pause_wire(false);
  assert_int_equal(p.c->closed, 1);
  assert_int_equal(p.a->closed, 1);
  // The first to give up closes with IBMSG_ETIMEDOUT; the fake's CM still carries its disconnect
  // (a real partition does not), which may reach the other side first.
  expect_code(p.c->close_reason == IBMSG_ETIMEDOUT ? p.c->close_reason : p.a->close_reason,
              IBMSG_ETIMEDOUT);
  assert_true(p.a->close_reason == IBMSG_ETIMEDOUT || p.a->close_reason == IBMSG_ECONNRESET);
  assert_true(p.c->close_reason == IBMSG_ETIMEDOUT || p.c->close_reason == IBMSG_ECONNRESET);
  // interval x count after the last message heard (just before the pause), plus at most a tick
  // (an eighth) and the fake's scheduling: not after the first or second silent interval
  assert_true(took >= 40);
  assert_true(took <= 60 + 2.5 + 60);
  assert_int_equal(p.c->sent_ok, 1);
  assert_int_equal(p.c->sent_canceled + p.c->sent_other, 1);  // exactly one callback
  assert_int_equal(p.c->sent_at_close, 2);
  // A miss per silent interval after the first, whether or not a probe could go out (nothing
  // completes: the first probe holds its control credit), and the close: at most count.
  assert_true(cst.keepalive_misses <= 3);
  assert_true(ast.keepalive_misses <= 3);
  assert_true(cst.keepalive_misses + ast.keepalive_misses >= 1);
}

void misses_count_once_per_interval_when_no_probe_can_go(void **state) {
  H *h = h_of(state);
  ibmsg_options *o = ka_options(h, 20, 8);  // more intervals than control credits for probes
  h->accept_opts = o;
  Pair p = connected(h, o, o);
  ibmsg_stats cst;
  memset(&cst, 0xff, sizeof cst);
  p.c->when_closed = [&] { expect_code(ibmsg_socket_stats(&p.c->s, &cst, sizeof cst), IBMSG_OK); };
  log_lines.clear();
  h->loop.log = collect_log;
  fake::pause_wire(true);  // a cut link: the probes never complete, their credits never return
  run_for(h, 2000, [&] { return p.c->closed && p.a->closed; });
  fake::pause_wire(false);
  h->loop.log = nullptr;
  assert_int_equal(p.c->closed, 1);
  assert_true(cst.keepalives_sent < 8);  // some intervals found no credit for a probe
  // One miss per interval after the first, sent or not, and the close: 7, however late the
  // ticks come within an interval. Only a loop held up for half an interval (a machine too busy
  // to run this process for 10 ms) gives the peer a new interval and so counts more.
  int late = 0;
  for (auto &l : log_lines) late += l.second.find("loop not run for") != std::string::npos;
  if (late == 0) assert_int_equal(cst.keepalive_misses, 7);
  assert_true(cst.keepalive_misses >= 7);
  assert_true(cst.keepalive_misses <= 7u * (late + 1u));
}

void a_loop_not_run_for_longer_than_the_bound_probes_before_it_judges(void **state) {
  H *h = h_of(state);
  ibmsg_options *o = ka_options(h, 20, 3);
  h->accept_opts = o;
  Pair p = connected(h, o, o);
  run_ms(h, 50);
  usleep(200 * 1000);  // the application did not run the loop: 10 intervals
  run_ms(h, 200);
  assert_int_equal(p.c->closed + p.a->closed, 0);
  assert_true(stats_of(*p.c).keepalives_sent + stats_of(*p.a).keepalives_sent >= 2);
}

void a_silent_raw_peer_is_probed_then_timed_out(void **state) {
  H *h = h_of(state);
  wire::Hello hello = fake::hello(8);
  RawPair rp = raw_client(h, hello, 4, {{IBMSG_OPT_KEEPALIVE, 20}, {IBMSG_OPT_KEEPALIVE_COUNT, 4}});
  RUN_UNTIL(h, rp.a->closed);  // at most 400 rounds of 1 ms... keepalive needs 80
  expect_code(rp.a->close_reason, IBMSG_ETIMEDOUT);
  int probes = 0;
  for (auto &m : rp.r->received) {
    assert_true(m.has_imm);
    if (m.imm >> 28 == 2) ++probes;
    assert_int_equal(m.data.size(), 0);
  }
  assert_int_equal(probes, 3);  // at 1, 2 and 3 intervals; closed at 4
}

void a_peer_without_the_feature_gets_no_probes_and_is_never_timed_out(void **state) {
  H *h = h_of(state);
  wire::Hello hello = fake::hello(8);
  hello.features &= ~wire::kFeatureKeepalive;
  RawPair rp = raw_client(h, hello, 4, {{IBMSG_OPT_KEEPALIVE, 10}, {IBMSG_OPT_KEEPALIVE_COUNT, 2}});
  run_ms(h, 200);
  assert_int_equal(rp.a->closed, 0);
  assert_int_equal(rp.r->received.size(), 0);
  // and a probe from it is a protocol error: it did not offer the feature
  expect_code(rp.r->send(fake::imm(2)), IBMSG_OK);
  RUN_UNTIL(h, rp.a->closed);
  expect_code(rp.a->close_reason, IBMSG_EPROTO);
}

void a_probe_is_answered_at_once_returning_its_control_credit(void **state) {
  H *h = h_of(state);
  RawPair rp = raw_client(h, fake::hello(8), 4, {{IBMSG_OPT_KEEPALIVE, 0}});
  for (int i = 0; i < 10; ++i) {  // more than the control depth: each answer returns the credit
    const size_t before = rp.r->received.size();
    expect_code(rp.r->send(fake::imm(2, 0, i ? 1 : 0)), IBMSG_OK);
    RUN_UNTIL(h, rp.r->received.size() == before + 1);
    const fake::RawMsg &m = rp.r->received.back();
    assert_int_equal(m.imm >> 28, 1);               // credit-only
    assert_int_equal((m.imm >> 16) & 0xff, 1);      // the probe's control credit
    assert_int_equal(m.data.size(), 0);
  }
  assert_int_equal(rp.a->closed, 0);
  assert_int_equal(stats_of(*rp.a).keepalives_received, 10);
  assert_int_equal(stats_of(*rp.a).keepalives_sent, 0);  // off on this side: answers all the same
}

void a_sender_stalled_on_credits_keeps_a_live_peer(void **state) {
  H *h = h_of(state);
  ibmsg_options *o = options(h, {{IBMSG_OPT_KEEPALIVE, 20}, {IBMSG_OPT_RECV_DEPTH, 4},
                                 {IBMSG_OPT_SHARED_RECV, 0}});
  h->accept_opts = o;
  h->hold_accepted = true;
  Pair p = connected(h, o, o);
  for (int i = 0; i < 10; ++i) expect_code(send_msg(*p.c, 64), IBMSG_OK);
  RUN_UNTIL(h, p.a->received == 4);
  run_ms(h, 300);  // 15 intervals stalled on credits: the receiver answers the probes
  assert_int_equal(p.c->closed + p.a->closed, 0);
  assert_int_equal(p.a->received, 4);
  assert_int_equal(stats_of(*p.c).credit_stalls, 1);
  assert_true(stats_of(*p.c).keepalives_sent >= 3);
  free_held(*p.a);
  p.a->hold = false;
  RUN_UNTIL(h, p.a->received == 10 && p.c->sent_ok == 10);
  assert_int_equal(p.a->bad_order, 0);
}

// A listen or connect refused at once says why in an error line too (an application that logs
// gets the address and the reason, not just a code).
void a_refused_listen_or_connect_says_why_in_an_error_line(void **state) {
  H *h = h_of(state);
  log_lines.clear();
  h->loop.log = collect_log;
  Conn &l = new_conn(h, "listener");
  fake::fail_call(fake::Call::CmBind, IBMSG_EADDRNOTAVAIL);
  expect_code(ibmsg_listen(&h->loop, &l.s, "10.9.8.7", 4791, 4), IBMSG_EADDRNOTAVAIL);
  Conn &c = new_conn(h, "client");
  fake::fail_call(fake::Call::CmResolveAddr, IBMSG_EADDRNOTAVAIL);
  expect_code(ibmsg_connect(&h->loop, &c.s, "10.9.8.6", 4792), IBMSG_EADDRNOTAVAIL);
  int listen_lines = 0, connect_lines = 0;
  for (auto &line : log_lines) {
    if (line.first != IBMSG_LOG_ERROR) continue;
    listen_lines += line.second.find("cannot listen on 10.9.8.7 port 4791") != std::string::npos &&
                    line.second.find("no RDMA device on this host has that address") !=
                        std::string::npos;
    connect_lines += line.second.find("cannot connect to 10.9.8.6 port 4792") != std::string::npos;
  }
  assert_int_equal(listen_lines, 1);
  assert_int_equal(connect_lines, 1);
  h->loop.log = nullptr;
}

// Without an RDMA driver the loop cannot be made: IBMSG_ENODEV, and with IBMSG_DEBUG set a line
// on stderr saying so (there is no loop yet whose log callback could hear it).
void a_loop_without_rdma_device_fails_with_enodev_and_says_so_on_stderr(void **) {
  char path[] = "/tmp/ibmsg-test-stderr-XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  unlink(path);
  fflush(stderr);
  int saved = dup(2);
  assert_true(saved >= 0);
  assert_int_equal(dup2(fd, 2), 2);
  const char *before = getenv("IBMSG_DEBUG");
  std::string old = before ? before : "";
  setenv("IBMSG_DEBUG", "1", 1);
  fake::fail_call(fake::Call::CmChannelCreate, IBMSG_ENODEV);
  ibmsg_event_loop loop;
  int rc = ibmsg_init_event_loop(&loop);
  fflush(stderr);
  dup2(saved, 2);
  close(saved);
  if (before) setenv("IBMSG_DEBUG", old.c_str(), 1);
  else unsetenv("IBMSG_DEBUG");
  expect_code(rc, IBMSG_ENODEV);
  char text[1024] = {0};
  ssize_t n = pread(fd, text, sizeof text - 1, 0);
  close(fd);
  assert_true(n > 0);
  assert_non_null(strstr(text, "error: no RDMA device"));
  assert_non_null(strstr(text, "/dev/infiniband/rdma_cm"));
}

void the_log_callback_hears_establishment_and_close_and_stats_last_into_closed(void **state) {
  H *h = h_of(state);
  log_lines.clear();
  h->loop.log = collect_log;
  Pair p = connected(h);
  int established = 0;
  for (auto &l : log_lines)
    if (l.first == IBMSG_LOG_INFO && l.second.find("established") != std::string::npos) ++established;
  assert_int_equal(established, 2);
  bool cm = false;
  for (auto &l : log_lines) cm |= l.first == IBMSG_LOG_DEBUG && l.second.find("CM event") != std::string::npos;
  assert_true(cm);
  for (int i = 0; i < 3; ++i) expect_code(send_msg(*p.c, 10), IBMSG_OK);
  RUN_UNTIL(h, p.c->sent_ok == 3);
  ibmsg_stats in_closed{};
  int rc = -1;
  p.c->when_closed = [&] { rc = ibmsg_socket_stats(&p.c->s, &in_closed, sizeof in_closed); };
  expect_code(ibmsg_disconnect(&p.c->s), IBMSG_OK);
  RUN_UNTIL(h, p.c->closed && p.a->closed);
  expect_code(rc, IBMSG_OK);
  assert_int_equal(in_closed.msgs_sent, 3);
  assert_int_equal(in_closed.bytes_sent, 30);
  ibmsg_stats after;
  expect_code(ibmsg_socket_stats(&p.c->s, &after, sizeof after), IBMSG_EINVAL);  // gone now
  expect_code(ibmsg_socket_stats(&p.l->s, &after, sizeof after), IBMSG_ESTATE);  // a listener
  h->loop.log = nullptr;
}


// --- connect pacing (IBMSG_OPT_CONNECT_LIMIT) ---

void set_connect_limit(H *h, int limit) {
  expect_code(ibmsg_setopt(&h->loop, IBMSG_OPT_CONNECT_LIMIT, &limit, sizeof limit), IBMSG_OK);
}

bool waiting_turn(const Conn &c) {
  return c.s.impl && c.s.impl->pace == ibmsg::PaceState::Waiting;
}

void connects_beyond_the_limit_wait_their_turn_in_order(void **state) {
  H *h = h_of(state);
  int v = 0;
  size_t len = sizeof v;
  expect_code(ibmsg_getopt(&h->loop, IBMSG_OPT_CONNECT_LIMIT, &v, &len), IBMSG_OK);
  assert_int_equal(v, 16);  // the default
  set_connect_limit(h, 4);
  v = 0;
  expect_code(ibmsg_setopt(&h->loop, IBMSG_OPT_CONNECT_LIMIT, &v, sizeof v), IBMSG_EINVAL);
  Conn &l = listener(h, nullptr, 100);
  std::vector<Conn *> cs;
  for (int i = 0; i < 20; ++i) cs.push_back(&client(h, port_of(l)));
  // Four under way, sixteen waiting; the application sees no difference.
  int waiting = 0;
  for (Conn *c : cs) {
    waiting += waiting_turn(*c);
    assert_int_equal(c->s.status, IBMSG_UNCONNECTED);  // as while an address is resolved
  }
  assert_int_equal(waiting, 16);
  assert_int_equal(h->loop.impl->pace_under_way, 4u);
  // The round in which each one started: in the order of the calls, never more than four.
  std::vector<int> started(cs.size(), -1);
  int round = 0;
  uint32_t most = 0;
  auto all_up = [&] {
    ++round;
    most = std::max(most, h->loop.impl->pace_under_way);
    for (size_t i = 0; i < cs.size(); ++i)
      if (started[i] < 0 && !waiting_turn(*cs[i])) started[i] = round;
    return std::all_of(cs.begin(), cs.end(), [](Conn *c) { return c->established == 1; });
  };
  RUN_UNTIL(h, all_up());
  assert_true(most <= 4);
  for (size_t i = 1; i < cs.size(); ++i)
    if (started[i] < started[i - 1])
      fail_msg("connect %zu started in round %d, before connect %zu (round %d)", i, started[i],
               i - 1, started[i - 1]);
  assert_int_equal(h->loop.impl->pace_under_way, 0u);
  assert_true(h->loop.impl->pace_waiting.empty());
  for (Conn *c : cs) expect_code(send_msg(*c, 16), IBMSG_OK);
  RUN_UNTIL(h, std::all_of(h->accepted.begin(), h->accepted.end(),
                           [](Conn *a) { return a->received == 1; }) &&
                   h->accepted.size() == cs.size());
}

void a_waiting_connect_closed_by_the_application_gives_its_turn_on(void **state) {
  H *h = h_of(state);
  set_connect_limit(h, 1);
  Conn &l = listener(h);
  Conn &a = client(h, port_of(l));
  Conn &b = client(h, port_of(l));
  Conn &c = client(h, port_of(l));
  assert_false(waiting_turn(a));
  assert_true(waiting_turn(b) && waiting_turn(c));
  expect_code(ibmsg_disconnect(&b.s), IBMSG_OK);
  RUN_UNTIL(h, b.closed && a.established && c.established);
  expect_code(b.close_reason, IBMSG_OK);
  assert_int_equal(b.established, 0);
  assert_int_equal(h->requests, 2);  // b never reached the listener
  // A waiting one closed by its loop's end: covered by the teardown's checks (every socket
  // closes once).
  Conn &d = client(h, port_of(l));
  Conn &e = client(h, port_of(l));
  assert_true(waiting_turn(e));
  (void)d;
}

void a_waiting_connects_timeout_counts_from_the_start_of_its_attempt(void **state) {
  H *h = h_of(state);
  set_connect_limit(h, 1);
  Raw *r = new_raw(h);  // accepts nothing: the first attempt times out
  expect_code(r->listen(), IBMSG_OK);
  Conn &l = listener(h);
  ibmsg_options *o = options(h, {{IBMSG_OPT_CONNECT_TIMEOUT, 150}});
  Conn &a = client(h, r->port(), o);
  Conn &b = client(h, port_of(l), o);
  assert_true(waiting_turn(b));
  const double t0 = now_ms();
  auto done = [&] { return a.closed && (b.established || b.closed); };
  if (!run_until(h, done, 2000, 5)) fail_msg("the connects never ended");
  expect_code(a.close_reason, IBMSG_ETIMEDOUT);
  // b waited about 150 ms for its turn: with its timeout counted from the call it would have
  // timed out with a; counted from its start it is established.
  assert_true(now_ms() - t0 >= 150);
  assert_int_equal(b.closed, 0);
  assert_int_equal(b.established, 1);
}

void a_waiting_connect_whose_start_fails_closes_with_the_error(void **state) {
  H *h = h_of(state);
  set_connect_limit(h, 1);
  Conn &l = listener(h);
  Conn &a = client(h, port_of(l));
  Conn &b = client(h, port_of(l));
  Conn &c = client(h, port_of(l));
  assert_true(waiting_turn(b) && waiting_turn(c));
  fake::fail_call(fake::Call::CmResolveAddr, IBMSG_EADDRNOTAVAIL);  // b's start, when its turn comes
  RUN_UNTIL(h, a.established && b.closed && c.established);
  expect_code(b.close_reason, IBMSG_EADDRNOTAVAIL);
  assert_int_equal(b.status_at_close, IBMSG_ERROR);
  assert_int_equal(b.established, 0);
}

void raising_the_connect_limit_starts_the_waiting_ones_first(void **state) {
  H *h = h_of(state);
  set_connect_limit(h, 1);
  Raw *r = new_raw(h);  // holds the first attempt
  expect_code(r->listen(), IBMSG_OK);
  Conn &l = listener(h);
  Conn &a = client(h, r->port());
  Conn &b = client(h, port_of(l));
  assert_true(waiting_turn(b));
  set_connect_limit(h, 8);
  Conn &c = client(h, port_of(l));  // b goes before it
  assert_false(waiting_turn(b));
  assert_false(waiting_turn(c));
  RUN_UNTIL(h, b.established && c.established);
  expect_code(ibmsg_disconnect(&a.s), IBMSG_OK);
  RUN_UNTIL(h, a.closed);
}
}  // namespace

#define T(name) cmocka_unit_test_setup_teardown(name, setup, teardown)

int main(void) {
  const struct CMUnitTest tests[] = {
      // connect pacing
      T(connects_beyond_the_limit_wait_their_turn_in_order),
      T(a_waiting_connect_closed_by_the_application_gives_its_turn_on),
      T(a_waiting_connects_timeout_counts_from_the_start_of_its_attempt),
      T(a_waiting_connect_whose_start_fails_closes_with_the_error),
      T(raising_the_connect_limit_starts_the_waiting_ones_first),
      // keepalive
      T(keepalive_options_have_limits_and_defaults),
      T(idle_connection_with_keepalive_stays_up_and_probes),
      T(misses_count_once_per_interval_when_no_probe_can_go),
      T(a_peer_that_stops_answering_closes_both_sides_with_etimedout),
      T(a_silent_raw_peer_is_probed_then_timed_out),
      T(a_loop_not_run_for_longer_than_the_bound_probes_before_it_judges),
      T(a_peer_without_the_feature_gets_no_probes_and_is_never_timed_out),
      T(a_probe_is_answered_at_once_returning_its_control_credit),
      T(a_sender_stalled_on_credits_keeps_a_live_peer),
      T(a_refused_listen_or_connect_says_why_in_an_error_line),
      T(a_loop_without_rdma_device_fails_with_enodev_and_says_so_on_stderr),
      T(the_log_callback_hears_establishment_and_close_and_stats_last_into_closed),
      // handshake
      T(connect_and_accept_establish_both_sides_once),
      T(a_message_arrives_with_its_payload),
      T(max_msg_size_is_the_smaller_of_both_sides),
      T(accepted_socket_sends_the_listeners_options_in_its_hello),
      T(accept_opts_override_the_listeners_options),
      T(data_overtaking_the_established_event_establishes_once),
      T(loop_fd_and_process_drive_a_connection),
      // hello
      T(hello_of_another_major_is_rejected_naming_both_versions),
      T(hello_of_a_higher_minor_with_unknown_features_connects),
      T(hello_with_zero_max_msg_size_is_rejected),
      T(hello_with_zero_recv_depth_is_rejected),
      T(hello_with_zero_ctrl_depth_is_rejected),
      T(hello_with_recv_depth_beyond_65535_is_rejected),
      T(hello_with_ctrl_depth_beyond_255_is_rejected),
      T(garbage_private_data_is_rejected_as_not_ibmsg),
      T(request_without_private_data_is_rejected_as_not_ibmsg),
      T(truncated_hello_is_refused),
      T(invalid_hello_in_the_accept_closes_the_connector_with_eproto),
      T(accept_hello_with_zero_depth_closes_the_connector_with_eproto),
      // credits
      T(many_messages_each_way_arrive_in_order_exactly_once),
      T(sender_without_credits_queues_up_to_the_bound_then_eagain),
      T(receiver_holding_messages_still_gets_the_credit_it_freed),
      T(ibmsg_sends_no_more_than_the_peer_granted),
      T(freed_messages_return_credits_in_credit_only_messages),
      T(many_control_credits_from_the_peer_never_overflow_the_send_queue),
      T(lagging_acknowledgements_never_overflow_the_send_queue),
      // protocol violations
      T(peer_using_all_its_credits_stays_connected),
      T(peer_sending_beyond_its_data_credits_is_closed_with_eproto),
      T(credit_granted_within_a_poll_does_not_cover_a_message_of_that_poll),
      T(credit_only_message_with_payload_is_eproto),
      T(more_credit_only_messages_than_control_credits_is_eproto),
      T(reserved_opcode_is_eproto),
      T(request_from_a_peer_without_a_session_is_eproto),
      T(request_with_a_broken_trailer_is_eproto),
      T(request_is_delivered_once_and_its_copies_get_the_kept_reply),
      T(reply_for_no_posted_request_is_dropped_and_counted),
      T(request_to_a_peer_without_requests_is_eopnotsupp),
      T(request_gets_its_reply_timeout_retry_and_close_each_once),
      T(credits_returned_beyond_what_ibmsg_spent_are_eproto),
      T(control_credits_returned_beyond_what_ibmsg_spent_are_eproto),
      T(reserved_immediate_bits_are_eproto),
      T(message_without_immediate_is_eproto),
      // close paths
      T(disconnect_confirms_delivered_and_cancels_in_flight_and_queued),
      T(message_delivered_just_before_the_close_is_confirmed_not_canceled),
      T(posts_from_callbacks_go_as_one_list_with_one_completion),
      T(posts_outside_callbacks_go_at_once),
      T(receives_freed_in_one_round_are_reposted_as_one_list),
      T(refused_post_list_cancels_each_message_once_and_closes_with_eio),
      T(small_messages_are_sent_inline),
      T(peer_disconnect_cancels_queued_messages_and_reports_econnreset),
      T(connect_times_out_when_the_listener_never_answers),
      T(accepted_connection_whose_handshake_never_completes_times_out),
      T(rejection_reports_erejected_with_the_reason),
      T(undecided_request_is_rejected_when_the_callback_returns),
      T(rejection_without_reason_text_is_still_erejected),
      T(connect_without_listener_is_refused),
      T(connect_to_an_unreachable_host_fails_with_ehostunreach),
      T(disconnect_while_connecting_closes_with_ok),
      T(failed_post_returns_eio_keeps_the_message_and_closes),
      T(failed_post_from_the_queue_closes_with_eio),
      T(failed_credit_message_post_closes_with_eio),
      T(failed_receive_repost_closes_with_eio),
      T(failing_completion_queue_closes_with_eio),
      T(failed_cq_create_closes_the_connect_with_its_error),
      T(connections_share_one_cq_that_grows_with_them),
      T(connections_beyond_the_largest_cq_get_another_cq),
      T(completions_left_by_a_destroyed_qp_are_polled_in_its_teardown),
      T(failed_arm_retires_the_cq_and_new_connections_get_another),
      T(failed_receive_post_during_setup_closes_the_connect),
      T(failed_registration_on_accept_rejects_the_peer),
      T(failed_qp_create_closes_the_connect_with_its_error),
      T(failed_qp_create_on_accept_rejects_the_peer),
      T(failed_device_open_on_accept_returns_its_error),
      T(failed_connect_or_route_closes_the_connect_with_its_error),
      T(failed_listen_bind_or_id_returns_the_error_and_opens_nothing),
      T(failed_registration_on_connect_closes_with_its_error),
      T(freeing_a_held_message_inside_the_closed_callback_works),
      T(a_busy_connection_does_not_hold_back_another_ones_close),
      T(device_removed_while_its_sockets_close_is_still_rescanned),
      T(accept_when_the_peer_went_away_returns_econnreset),
      T(failed_cm_accept_rejects_the_peer),
      T(failed_accept_keeps_its_receive_pool_until_the_cq_is_polled),
      T(failing_last_message_of_a_list_confirms_the_ones_before_it),
      T(closing_the_listener_keeps_accepted_connections),
      T(closed_listener_refuses_new_connections),
      T(closing_the_listener_with_a_request_pending_rejects_it),
      T(too_many_connections_are_rejected),
      T(disconnect_inside_the_closed_callback_returns_enotconn),
      T(listen_and_connect_on_an_open_socket_return_estate_and_leave_it_working),
      T(accept_into_an_open_socket_returns_estate),
      T(iwarp_device_fails_the_connect_with_enodev),
      T(iwarp_device_fails_the_accept_with_enodev),
      T(device_option_naming_another_device_fails_with_enodev),
      T(socket_can_connect_again_from_its_own_closed_callback),
      T(loop_calls_from_inside_a_callback_return_ebusy),
      T(random_traffic_and_closes_keep_every_guarantee),
      T(random_traffic_with_lagging_acknowledgements_keeps_every_guarantee),
      // lifetime
      T(device_removal_closes_connections_with_enodev_and_lets_the_device_go),
      T(everything_is_released_once_the_sockets_close),
      T(held_message_keeps_the_device_and_blocks_loop_destroy),
      T(failed_channel_closes_its_connections_and_a_new_one_opens_the_device_anew),
      T(allocated_send_buffer_keeps_the_device_until_freed),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
