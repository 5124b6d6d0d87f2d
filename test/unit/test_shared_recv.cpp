// test_shared_recv.cpp - receive buffers shared by a device's connections (protocol 1.3) over
// the fake transport with shared receive queues (set_max_srq_wr): the hello (base 2, cap
// IBMSG_OPT_RECV_DEPTH), ibmsg_socket_memory, streams, the cap counting held messages, credits
// moving to a busy connection and given back (Return), hostile and older raw peers, buffers of
// its own, closing while messages are held. The fixture is test/fake/harness.hpp's (Stream payloads); raw peers
// keep a book of their credits (RawBook); some checks read the core's book through
// ibmsg_socket.impl. The teardown checks: each socket closed once, one message_sent per post
// before its closed callback, received messages intact, loops destroyed, nothing left open in
// the fake, no RNR, length error, misuse or invalid state transition.
#include "harness.hpp"  // the fixture: H, Conn, the Stream payload, the callbacks, setup, teardown

#include <algorithm>
#include <map>
#include <string>
#include <cstdio>

#include "internal.hpp"  // the core's book: Socket::share, SharedRecv
#include "errors.hpp"    // ibmsg::invalid_transitions
#include "recv.hpp"      // ibmsg::eager_recv_size

namespace fake = ibmsg::fake;
namespace wire = ibmsg::wire;
using namespace ibmsg::fake::harness;

namespace {

constexpr size_t kSlot = 16448;  // a shared buffer: the eager size 16384 + 4, rounded up to 64
constexpr size_t kIdle = (2 + 4) * kSlot;  // an idle connection: its base and control buffers
constexpr uint32_t kOpData = 0, kOpCredit = 1, kOpReturn = 6;
constexpr uint32_t kWants = wire::kWantsBit;

// --- what this file adds to the harness (test/fake/harness.hpp) ---------------------------------

// Posts messages until the connection posted total of them or has no room now (IBMSG_EAGAIN).
void top_up(Conn &c, uint64_t total) {
  while (c.next_send_seq < total) {
    int rc = send_next(c);
    if (rc == IBMSG_EAGAIN) return;
    if (rc) fail_msg("%s: posting: %s", c.name, ibmsg_err_name(rc));
  }
}

// Streams n more messages from one side (to a peer that frees them) until all went and arrived.
void stream(H *h, Conn &from, Conn &to, uint64_t n) {
  const uint64_t total = from.next_send_seq + n, want = to.received + n;
  RUN_UNTIL(h, (top_up(from, total), to.received == want && from.sent_ok == from.msgs_posted));
  if (to.bad_payload) fail_msg("%s: %s", to.name, to.first_bad.c_str());
}

// n more messages each way at the same time.
void stream_both(H *h, Pair p, uint64_t n) {
  const uint64_t tc = p.c->next_send_seq + n, ta = p.a->next_send_seq + n;
  const uint64_t rc = p.c->received + n, ra = p.a->received + n;
  RUN_UNTIL(h, (top_up(*p.c, tc), top_up(*p.a, ta),
                p.a->received == ra && p.c->received == rc &&
                    p.c->sent_ok == p.c->msgs_posted && p.a->sent_ok == p.a->msgs_posted));
  assert_int_equal(p.a->bad_payload + p.c->bad_payload, 0);
}
size_t shared_mem(Conn &c) {
  ibmsg_memory m;
  expect_code(ibmsg_socket_memory(&c.s, &m), IBMSG_OK);
  return m.shared;
}

ibmsg__socket *core(Conn &c) { return c.s.impl; }

// The pool's book adds up (nothing in transit): its buffers are the free ones, the control
// buffers its connections reserve and the ones the application holds; its credits are exactly
// what its connected sockets hold and are owed, no more than the free buffers.
void expect_pool_balanced(H *h, Conn &any, uint32_t lent) {
  ibmsg::SharedRecv *r = core(any)->rx.shared;
  if (!r) fail_msg("%s has no shared receive buffers", any.name);
  uint64_t total = 0;
  uint32_t conns = 0;
  for (Conn &c : h->conns)
    if (c.opened && !c.closed && c.s.status == IBMSG_CONNECTED && core(c)->rx.shared == r) {
      total += core(c)->rx.share.total();
      ++conns;
    }
  assert_int_equal(r->conns, conns);
  assert_int_equal(r->lent, lent);
  assert_int_equal(r->credits.assigned(), total);
  assert_int_equal(r->credits.free_buffers() + ibmsg::kCtrlDepth * r->conns + lent, r->buffers);
  assert_true(r->credits.assigned() <= r->credits.free_buffers());
}

// --- raw peers ---

wire::Hello decode(const std::vector<uint8_t> &pdata) {
  wire::Hello hh;
  if (wire::decode_hello(pdata.data(), pdata.size(), &hh) != wire::HelloResult::Ok)
    fail_msg("the private data is no valid hello");
  return hh;
}

// The hello an ibmsg connect sends a raw listener.
wire::Hello hello_of_client(H *h, const ibmsg_options *o, ibmsg_event_loop *loop = nullptr) {
  Raw *r = new_raw(h);
  expect_code(r->listen(), IBMSG_OK);
  client(h, r->port(), o, loop);
  RUN_UNTIL(h, r->state() == Raw::State::Requested);
  return decode(r->event_pdata());
}

// A 1.3 hello offering shared buffers (the raw peer takes the wants bit and Return messages).
wire::Hello hello13(uint32_t recv_depth, uint32_t cap) {
  wire::Hello hh = fake::hello(recv_depth);
  hh.features = wire::kFeatures;
  hh.cap = cap;
  return hh;
}

// What a raw peer connected to an ibmsg socket holds and owes: data and control credits (from
// the ibmsg side's hello and its messages), the credits to return for the ibmsg side's messages
// (the raw peer re-posts its buffers at once), and what it saw.
struct RawBook {
  Raw *r;
  bool shared;      // kFeatureShared agreed: bit 15 of the credits field is the wants bit
  size_t seen = 0;  // of r->received
  int64_t data = 0, ctrl = 0, max_data = 0;
  uint32_t owe_data = 0, owe_ctrl = 0;
  int wants_seen = 0, returns_seen = 0;
  uint32_t last_return = 0;

  void take() {
    r->pump();
    for (; seen < r->received.size(); ++seen) {
      const uint32_t imm = r->received[seen].imm, op = imm >> 28;
      uint32_t credits = imm & 0xffff;
      if (credits & kWants) ++wants_seen;  // (to an older peer: never)
      if (shared) credits &= wire::kMaxSharedCreditsPerMsg;
      if (op == kOpReturn) {
        ++returns_seen;
        last_return = credits;
        credits = 0;
      }
      data += credits;
      ctrl += (imm >> 16) & 0xff;
      if (op == kOpCredit || op == kOpReturn) ++owe_ctrl;
      else ++owe_data;
    }
    max_data = std::max(max_data, data);
  }
  // A message (len bytes of value k; a credit-only one if op says so) returning what it owes.
  void send(uint32_t op, size_t len = 0, uint8_t k = 0, bool wants = false) {
    take();
    int64_t &credit = op == kOpData ? data : ctrl;
    if (credit-- <= 0) fail_msg("the raw peer has no credit for it");
    std::vector<uint8_t> b(len, k);
    const uint32_t imm = fake::imm(op, owe_data, owe_ctrl) | (wants ? kWants : 0);
    expect_code(r->send(imm, b.data(), len), IBMSG_OK);
    owe_data = owe_ctrl = 0;
  }
};

// A raw client with hello hh (len bytes of it) connected to an ibmsg listener (options o).
RawPair raw_client_with(H *h, const wire::Hello &hh, const ibmsg_options *o = nullptr,
                        size_t len = wire::kHelloSize) {
  uint8_t b[wire::kHelloSize];
  wire::encode_hello(hh, b);
  RawPair p = raw_connect(h, listener(h, o), b, len);
  p.mine = decode(p.r->event_pdata());
  return p;
}

RawBook book_of(const RawPair &p, bool shared) {
  RawBook b{p.r, shared};
  b.data = b.max_data = p.mine.recv_depth;
  b.ctrl = p.mine.ctrl_depth;
  return b;
}

// The accepted socket closes with EPROTO; the raw peer learns it.
void expect_eproto(H *h, const RawPair &p) {
  RUN_UNTIL(h, p.a->closed);
  expect_code(p.a->close_reason, IBMSG_EPROTO);
  RUN_UNTIL(h, p.r->state() == Raw::State::Disconnected);
}

// Stream payloads; every message_sent before connection_closed; a device with shared receive
// queues, raw peers with 40 receive buffers.
int setup(void **state) {
  return fixture_setup(state, [](H *h) {
    fake::set_max_srq_wr(16384);
    h->payload = Payload::Stream;
    h->sent_before_closed = true;
    h->max_rounds = 2000;
    h->settle_rounds = 30;
    h->backlog = 32;
    h->raw_recv_bufs = 40;
    return 0;
  });
}

// === 1. ibmsg to ibmsg ========================================================================

// Both hellos (connect and accept) offer shared buffers: a base of 2, the cap the option says.
void hellos_offer_a_base_of_2_and_the_cap(void **state) {
  H *h = h_of(state);
  for (int depth : {32, 8, 1}) {  // the connecting side's
    wire::Hello mine = hello_of_client(h, options(h, {{IBMSG_OPT_RECV_DEPTH, depth}}));
    assert_int_equal(mine.minor, wire::kMinor);
    assert_true(mine.features & wire::kFeatureShared);
    assert_int_equal(mine.recv_depth, depth < 2 ? depth : 2);
    assert_int_equal(mine.cap, depth);
    assert_int_equal(mine.ctrl_depth, 4);
  }
  RawPair p = raw_client_with(h, hello13(8, 8));  // the accepting side's
  assert_int_equal(p.mine.minor, wire::kMinor);
  assert_true(p.mine.features & wire::kFeatureShared);
  assert_int_equal(p.mine.recv_depth, 2);
  assert_int_equal(p.mine.cap, 32);
  assert_true(core(*p.a)->peer.features & wire::kFeatureShared);
  assert_int_equal(shared_mem(*p.a), kIdle);
}

void ibmsg_pair_agrees_and_streams_both_ways(void **state) {
  H *h = h_of(state);
  Pair p = connected(h);
  for (Conn *c : {p.c, p.a}) {
    assert_true(core(*c)->peer.features & wire::kFeatureShared);
    assert_int_equal(shared_mem(*c), kIdle);
    assert_int_equal(core(*c)->tx.credits.data(), 2);  // the base of the other's pool
  }
  stream_both(h, p, 600);  // 600 messages each way, at the same time
  settle(h);
  // Idle again: the surplus went back, each holds its base again and costs its base.
  for (Conn *c : {p.c, p.a}) {
    assert_int_equal(core(*c)->tx.credits.data(), 2);
    assert_int_equal(core(*c)->rx.share.granted, 2);
    assert_int_equal(shared_mem(*c), kIdle);
  }
  expect_pool_balanced(h, *p.a, 0);
  assert_int_equal(fake::stats().rnr_errors, 0);
  assert_int_equal(fake::open_objects().srqs, 1);
}

// Replies posted in message_received before each request is freed (as an echo server does), two
// requests (the client's base of credits) landing at once: the first reply goes at once (the
// wire was idle), the second waits for the end of the round, and what the frees made due after
// it rides on it: no credit-only message goes (before, each freed request's credit went alone).
void replies_queued_in_a_round_carry_the_credits_freed_after_them(void **state) {
  H *h = h_of(state);
  h->payload = Payload::Seq;  // each side's messages numbered, 16 bytes
  Pair p = connected(h);
  settle(h);
  Conn *a = p.a;
  a->on_msg = [a](ibmsg_buffer *) {
    if (send_msg(*a, 16) != IBMSG_OK) ++a->reply_errors;
  };
  for (int round = 0; round < 5; ++round) {
    const size_t posts0 = fake::posts().size();
    const uint64_t a0 = a->received, c0 = p.c->received;
    fake::pause_wire(true);
    for (int i = 0; i < 2; ++i) expect_code(send_msg(*p.c, 16), IBMSG_OK);  // the client's base
    fake::pause_wire(false);
    RUN_UNTIL(h, a->received == a0 + 2 && p.c->received == c0 + 2);
    settle(h);
    size_t ctrl = 0, data = 0;
    for (size_t i = posts0; i < fake::posts().size(); ++i) {
      const fake::Post &x = fake::posts()[i];
      if (x.port == a->local_port) (x.op == ibmsg::tp::Op::Ctrl ? ctrl : data) += 1;
    }
    if (data != 2 || ctrl != 0)
      fail_msg("round %d: the server posted %zu data and %zu credit-only messages", round, data,
               ctrl);
  }
  a->on_msg = nullptr;
  assert_int_equal(a->reply_errors, 0);
  settle(h);
  // Each holds its base, or all but the one its peer owes it.
  assert_int_equal(core(*p.c)->tx.credits.data() + core(*p.a)->tx.credits.owed(), 2);
  assert_int_equal(core(*p.a)->tx.credits.data() + core(*p.c)->tx.credits.owed(), 2);
  expect_pool_balanced(h, *p.a, 0);
}

// A busy-polled ping-pong whose server posts its reply in message_received before it frees the
// request (as an echo server does) and whose client frees first, then posts: each side's post to
// the idle wire goes at once, inside the callback, and the message it answers goes back to the
// shared queue after it, at the end of the round; its credit rides on the next message. No
// credit-only message goes either way (the peer holds as many credits as it is owed).
void a_reply_goes_before_the_message_it_answers_goes_back(void **state) {
  H *h = h_of(state);
  h->payload = Payload::Seq;  // each side's messages numbered, 16 bytes
  ibmsg_options *o = options(h, {{IBMSG_OPT_BUSY_POLL, IBMSG_BUSY_POLL_ALWAYS}});
  h->accept_opts = o;
  Pair p = connected(h, o, o);
  settle(h);
  Conn *a = p.a;
  unsigned long lists_in_callback = 0, back_later[2] = {0, 0};
  a->on_msg = [a, &lists_in_callback](ibmsg_buffer *) {
    const unsigned long lists = fake::stats().post_lists;
    if (send_msg(*a, 16) != IBMSG_OK) ++a->reply_errors;
    lists_in_callback += fake::stats().post_lists - lists;  // the reply: at once
  };
  // After each callback (the harness freed the message, the client then posted): the message
  // freed waits for the end of the round.
  a->on_rx = [&] { back_later[1] += core(*a)->rx.freed_later == 1; };
  p.c->on_rx = [&] { back_later[0] += core(*p.c)->rx.freed_later == 1; };
  p.c->replies_left = 99;  // the client: free, then post the next
  const size_t posts0 = fake::posts().size();
  expect_code(send_msg(*p.c, 16), IBMSG_OK);
  RUN_UNTIL(h, a->received == 100 && p.c->received == 100);
  settle(h);
  a->on_msg = nullptr;
  a->on_rx = p.c->on_rx = nullptr;
  assert_int_equal(a->reply_errors + p.c->reply_errors, 0);
  assert_int_equal(lists_in_callback, 100);
  assert_int_equal(back_later[0], 100);
  assert_int_equal(back_later[1], 100);
  for (Conn *c : {p.c, p.a}) assert_int_equal(core(*c)->rx.freed_later, 0);
  // The server's posts: its 100 replies, nothing else. The client's: its 100 messages, and after
  // the last reply (which it frees, posting nothing) one credit-only message at most.
  size_t ctrl[2] = {0, 0}, data[2] = {0, 0};
  for (size_t i = posts0; i < fake::posts().size(); ++i) {
    const fake::Post &x = fake::posts()[i];
    const int server = x.port == a->local_port;
    (x.op == ibmsg::tp::Op::Ctrl ? ctrl : data)[server] += 1;
  }
  if (data[1] != 100 || ctrl[1] != 0 || data[0] != 100 || ctrl[0] > 1)
    fail_msg("server: %zu data messages, %zu credit-only; client: %zu, %zu", data[1], ctrl[1],
             data[0], ctrl[0]);
  // Each holds its base, or all but the one its peer owes it.
  assert_int_equal(core(*p.c)->tx.credits.data() + core(*p.a)->tx.credits.owed(), 2);
  assert_int_equal(core(*p.a)->tx.credits.data() + core(*p.c)->tx.credits.owed(), 2);
  expect_pool_balanced(h, *p.a, 0);
}

// Busy polling, messages freed in the round in which their connection closes: the server frees
// each message in its message_received (it goes back at the end of the round), disconnects in
// the callback of the fifth, and holds the sixth to the eighth until its closed callback, where it
// frees them (the connection is gone: they go back at once). Every buffer is back in the pool,
// nothing is lent, and another connection on the pool still streams.
void busy_polled_messages_freed_as_their_connection_closes_go_back(void **state) {
  H *h = h_of(state);
  h->payload = Payload::Seq;  // numbered, 16 bytes
  ibmsg_options *o = options(h, {{IBMSG_OPT_BUSY_POLL, IBMSG_BUSY_POLL_ALWAYS}});
  h->accept_opts = o;
  Conn &l = listener(h);
  Pair other = connect_to(h, l, o);
  Pair p = connect_to(h, l, o);
  settle(h);
  ibmsg::SharedRecv *r = core(*p.a)->rx.shared;
  Conn *a = p.a;
  unsigned long waiting_at_close = 0, disconnects = 0;
  a->on_msg = [a, &disconnects](ibmsg_buffer *) {
    if (a->received == 5) {
      disconnects += ibmsg_disconnect(&a->s) == IBMSG_OK;
      a->hold = true;  // the rest is kept until the closed callback
    }
  };
  a->on_rx = [&] {
    if (a->received == 5) waiting_at_close = core(*a)->rx.freed_later;
  };
  a->when_closed = [a] { free_held(*a); };
  fake::pause_wire(true);
  for (int i = 0; i < 8; ++i) expect_code(send_msg(*p.c, 16), IBMSG_OK);
  fake::pause_wire(false);
  RUN_UNTIL(h, a->closed && p.c->closed);
  settle(h);
  assert_int_equal(disconnects, 1);
  assert_true(waiting_at_close >= 1);  // the fifth, freed in its callback, waited for the round's end
  assert_true(a->received >= 5);
  assert_true(a->held.empty());
  assert_int_equal(a->bad_order, 0);
  assert_int_equal(r->lent, 0);
  expect_pool_balanced(h, *other.a, 0);
  h->payload = Payload::Pattern;  // (what stream sends and checks)
  stream(h, *other.c, *other.a, 50);
  settle(h);
  assert_int_equal(other.a->bad_payload + other.a->bad_order, 0);
  expect_pool_balanced(h, *other.a, 0);
}

// === 2. a receiver holding messages ===========================================================

void held_messages_stop_the_peer_at_the_cap(void **state) {
  H *h = h_of(state);
  h->hold_accepted = true;
  Pair p = connected(h);
  RUN_UNTIL(h, (top_up(*p.c, 40), p.a->received == 32));
  settle(h, 100);
  assert_int_equal(p.a->received, 32);  // the cap: no more while it holds them
  assert_int_equal(p.c->sent_ok, 32);
  assert_int_equal(core(*p.c)->tx.credits.data(), 0);
  assert_int_equal(core(*p.a)->rx.share.total(), 0);
  assert_int_equal(core(*p.a)->rx.share.held, 32);
  assert_int_equal(shared_mem(*p.a), (32 + 4) * kSlot);
  // Each one freed lets exactly one more come.
  free_held(*p.a, 5);
  RUN_UNTIL(h, p.a->received == 37);
  settle(h, 100);
  assert_int_equal(p.a->received, 37);
  assert_int_equal(shared_mem(*p.a), (32 + 4) * kSlot);
  p.a->hold = false;
  free_held(*p.a);
  RUN_UNTIL(h, (top_up(*p.c, 40), p.a->received == 40 && p.c->sent_ok == 40));
  settle(h);
  assert_int_equal(shared_mem(*p.a), kIdle);
  assert_int_equal(p.a->bad_payload, 0);
  expect_pool_balanced(h, *p.a, 0);
}

// The application frees all 32 it held at once; the rest of the burst goes, and the connection
// is idle again: the sender gave back its surplus, the receiver keeps nothing above the base.
void full_cap_freed_at_once_then_idle_again(void **state) {
  H *h = h_of(state);
  h->hold_accepted = true;
  Pair p = connected(h);
  RUN_UNTIL(h, (top_up(*p.c, 40), p.a->received == 32));
  p.a->hold = false;
  free_held(*p.a);
  RUN_UNTIL(h, (top_up(*p.c, 40), p.a->received == 40 && p.c->sent_ok == 40));
  settle(h, 100);
  assert_int_equal(core(*p.c)->tx.credits.data(), 2);
  assert_int_equal(shared_mem(*p.a), kIdle);
  expect_pool_balanced(h, *p.a, 0);
}

// === 3. credits move to the busy connection and back ==========================================

void busy_connection_of_20_gets_more_than_the_base_and_gives_it_back(void **state) {
  H *h = h_of(state);
  Conn &l = listener(h);
  std::vector<Pair> ps;
  for (int i = 0; i < 20; ++i) ps.push_back(connect_to(h, l));
  Pair &busy = ps[7];
  size_t most = 0;
  uint32_t most_credits = 0;
  busy.a->on_msg = [&](ibmsg_buffer *) {
    most = std::max(most, shared_mem(*busy.a));
    most_credits = std::max(most_credits, core(*busy.a)->rx.share.granted);
  };
  stream(h, *busy.c, *busy.a, 400);
  settle(h);
  assert_true(most > kIdle);      // the pool gave it more than its base
  assert_true(most_credits > 2);  // and granted them
  assert_true(most <= (32 + 4) * kSlot);
  // Its burst over, the surplus went back: every connection holds its base again (or all but
  // one, owed to it: the receiver sends it on its next message, or once the sender holds none).
  assert_int_equal(core(*busy.c)->tx.credits.data() + core(*busy.a)->tx.credits.owed(), 2);
  assert_true(core(*busy.c)->tx.credits.data() >= 1);
  for (Pair &q : ps) {
    assert_int_equal(shared_mem(*q.a), kIdle);
    assert_int_equal(shared_mem(*q.c), kIdle);
    assert_int_equal(q.c->s.status, IBMSG_CONNECTED);
  }
  expect_pool_balanced(h, *busy.a, 0);
  stream(h, *ps[12].a, *ps[12].c, 200);  // another one, the other way
  settle(h);
  assert_int_equal(shared_mem(*ps[12].c), kIdle);
  expect_pool_balanced(h, *busy.a, 0);
}

// The sender's side on the wire, seen by a raw receiver of protocol 1.3: the wants bit on every
// message that has more behind it, a credit-only message with the wants bit once it runs out,
// and a Return of exactly what it holds above the base once its queue is empty.
void sender_sets_wants_and_returns_its_surplus(void **state) {
  H *h = h_of(state);
  const wire::Hello mine = hello_of_client(h, nullptr);
  Raw *r = h->raws.back().get();
  Conn &c = h->conns.back();
  expect_code(r->accept(hello13(2, 32)), IBMSG_OK);
  RUN_UNTIL(h, c.established);
  RawBook b{r, true};
  b.data = mine.recv_depth;
  b.ctrl = mine.ctrl_depth;
  for (int i = 0; i < 10; ++i) expect_code(send_next(c), IBMSG_OK);
  RUN_UNTIL(h, r->received.size() >= 3);
  settle(h);
  b.take();
  // Two data messages, each sent as it was posted (nothing behind it then: no wants bit), then
  // "wants" on a credit-only message once the third waits without a credit.
  assert_int_equal(r->received.size(), 3);
  for (int i = 0; i < 2; ++i) {
    assert_int_equal(r->received[i].imm >> 28, kOpData);
    assert_false(r->received[i].imm & kWants);
  }
  assert_int_equal(r->received[2].imm >> 28, kOpCredit);
  assert_true(r->received[2].imm & kWants);
  assert_int_equal(r->received[2].data.size(), 0);
  // The raw peer grants 8: the 2 it consumed and 6 more (its cap allows 32).
  b.owe_data += 6;
  b.send(kOpCredit);
  RUN_UNTIL(h, (b.take(), b.seen == 11));
  for (size_t i = 3; i < 11; ++i) {
    assert_int_equal(r->received[i].imm >> 28, kOpData);
    assert_int_equal(bool(r->received[i].imm & kWants), i != 10);  // more behind all but the last
  }
  assert_int_equal(core(c)->tx.credits.data(), 0);
  // It returns the 8 it consumed: the sender holds 8 with nothing to send, 6 above the base.
  b.send(kOpCredit);
  RUN_UNTIL(h, (b.take(), b.returns_seen == 1));
  settle(h);
  b.take();
  assert_int_equal(b.returns_seen, 1);
  assert_int_equal(b.last_return, 6);
  const fake::RawMsg &ret = r->received[11];
  assert_int_equal(ret.imm >> 28, kOpReturn);
  assert_int_equal(ret.imm & 0xffff, 6);  // no wants bit on a Return
  assert_int_equal(ret.data.size(), 0);
  assert_int_equal(core(c)->tx.credits.data(), 2);
  assert_int_equal(c.sent_ok, 10);
  assert_int_equal(c.s.status, IBMSG_CONNECTED);
}

// === 4. hostile raw peers of protocol 1.3 =====================================================

// A raw peer gets credits above the base by sending data with the wants bit (the accepted side
// frees at once); returns what it holds then.
int64_t earn_credits(H *h, RawBook &b, int msgs) {
  for (int i = 0; i < msgs; ++i) {
    RUN_UNTIL(h, (b.take(), b.data > 0));
    b.send(kOpData, 16, uint8_t(i), true);
  }
  settle(h);
  b.take();
  return b.data;
}

void return_above_the_base_is_eproto_for_that_connection_only(void **state) {
  H *h = h_of(state);
  Pair other = connected(h);
  RawPair p = raw_client_with(h, hello13(8, 8));
  RawBook b = book_of(p, true);
  // A Return of what it holds above the base is fine.
  const int64_t held = earn_credits(h, b, 4);
  assert_true(held > 2);
  expect_code(p.r->send(fake::imm(kOpReturn, uint32_t(held - 2))), IBMSG_OK);
  settle(h);
  assert_int_equal(p.a->s.status, IBMSG_CONNECTED);
  assert_int_equal(core(*p.a)->rx.share.granted, 2);
  assert_int_equal(p.a->received, 4);
  // One more than it holds above the base now: EPROTO.
  expect_code(p.r->send(fake::imm(kOpReturn, 1)), IBMSG_OK);
  expect_eproto(h, p);
  assert_int_equal(p.l->s.status, IBMSG_LISTENING);
  assert_int_equal(other.c->s.status, IBMSG_CONNECTED);
  assert_int_equal(other.a->s.status, IBMSG_CONNECTED);
  stream_both(h, other, 100);
  settle(h);
  expect_pool_balanced(h, *other.a, 0);
}

// A Return with a payload, with the wants bit, of nothing, or without kFeatureShared agreed.
void malformed_or_unagreed_return_is_eproto(void **state) {
  H *h = h_of(state);
  for (int variant = 0; variant < 4; ++variant) {
    RawPair p = raw_client_with(h, variant == 3 ? fake::hello(8) : hello13(8, 8));
    RawBook b = book_of(p, variant != 3);
    assert_int_equal(bool(core(*p.a)->peer.features & wire::kFeatureShared), variant != 3);
    if (variant != 3) assert_true(earn_credits(h, b, 4) > 2);  // a plain Return of 1 is fine
    const uint8_t junk[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    const uint32_t ret = fake::imm(kOpReturn, variant == 2 ? 0 : 1) | (variant == 1 ? kWants : 0);
    expect_code(p.r->send(ret, junk, variant == 0 ? sizeof junk : 0), IBMSG_OK);
    expect_eproto(h, p);
  }
}

// A credit-only message with the wants bit from a peer without data credits: a credit back at
// once if its cap allows, else once the application frees one.
void wants_on_a_credit_message_gets_a_credit(void **state) {
  H *h = h_of(state);
  h->hold_accepted = true;
  for (int cap : {32, 2}) {
    RawPair p = raw_client_with(h, hello13(8, 8), options(h, {{IBMSG_OPT_RECV_DEPTH, cap}}));
    assert_int_equal(p.mine.recv_depth, 2);
    assert_int_equal(p.mine.cap, cap);
    RawBook b = book_of(p, true);
    b.send(kOpData, 10, 1);
    b.send(kOpData, 10, 2);
    RUN_UNTIL(h, p.a->received == 2);
    settle(h);
    b.take();
    assert_int_equal(b.data, 0);  // both held: nothing came back
    const size_t before = b.seen;
    b.send(kOpCredit, 0, 0, true);
    settle(h);
    b.take();
    if (cap == 32) {
      assert_int_equal(b.seen, before + 1);
      assert_int_equal(p.r->received[before].imm >> 28, kOpCredit);
      assert_int_equal(b.data, 1);
    } else {
      assert_int_equal(b.data, 0);  // at its cap: the two held count
      free_held(*p.a, 1);
      RUN_UNTIL(h, (b.take(), b.data == 1));
    }
    b.send(kOpData, 10, 3);
    RUN_UNTIL(h, p.a->received == 3);
    assert_int_equal(p.a->s.status, IBMSG_CONNECTED);
    assert_int_equal(p.a->rx_sizes[2], 10);
  }
}

void data_beyond_the_credits_is_eproto_and_others_go_on(void **state) {
  H *h = h_of(state);
  Pair other = connected(h);
  h->hold_accepted = true;
  RawPair p = raw_client_with(h, hello13(8, 8));
  RawBook b = book_of(p, true);
  b.send(kOpData, 10, 1);
  b.send(kOpData, 10, 2);
  b.data = 1;  // (it has none: sent anyway)
  b.send(kOpData, 10, 3);
  expect_eproto(h, p);
  assert_int_equal(p.a->received, 2);  // the two it had credits for
  free_held(*p.a);
  settle(h);
  assert_int_equal(other.c->s.status, IBMSG_CONNECTED);
  stream_both(h, other, 100);
  settle(h);
  expect_pool_balanced(h, *other.a, 0);
}

// === 5. a peer without kFeatureShared ========================================================

void peer_of_protocol_1_2_gets_at_most_the_base_and_no_wants_bit(void **state) {
  H *h = h_of(state);
  wire::Hello hh = fake::hello(4);
  hh.minor = 2;
  hh.features = wire::kFeatureRdma | wire::kFeatureImm | wire::kFeatureRndv;
  RawPair p = raw_client_with(h, hh, nullptr, 28);
  assert_false(core(*p.a)->peer.features & wire::kFeatureShared);
  assert_int_equal(p.mine.recv_depth, 2);
  RawBook b = book_of(p, false);
  // The raw peer sends 60 messages as fast as its credits let it (message k: k + 1 bytes); the
  // accepted side sends it 40 with at most 4 credits at a time.
  const int n = 60;
  int sent = 0;
  RUN_UNTIL(h, (top_up(*p.a, 40), b.take(), [&] {
                  for (; sent < n && b.data > 0; ++sent) b.send(kOpData, size_t(sent + 1));
                  if ((b.owe_data || b.owe_ctrl >= 2) && b.ctrl > 1) b.send(kOpCredit);
                }(), p.a->received == uint64_t(n) && p.a->sent_ok == 40));
  assert_int_equal(b.max_data, 2);  // never more than the hello's recv_depth
  assert_int_equal(b.wants_seen, 0);
  assert_int_equal(b.returns_seen, 0);
  for (int k = 0; k < n; ++k) assert_int_equal(p.a->rx_sizes[size_t(k)], size_t(k + 1));
  assert_int_equal(p.a->s.status, IBMSG_CONNECTED);
}

// === 6. buffers of its own =====================================================================

void shared_recv_option_0_gives_buffers_of_its_own(void **state) {
  H *h = h_of(state);
  ibmsg_options *own = options(h, {{IBMSG_OPT_SHARED_RECV, 0}});
  wire::Hello mine = hello_of_client(h, own);  // all 32 at once
  assert_int_equal(mine.recv_depth, 32);
  assert_int_equal(mine.cap, 32);
  for (int variant = 0; variant < 2; ++variant) {  // with a shared peer, either side accepting
    Pair p = variant == 0 ? connected(h, own, nullptr) : connected(h, nullptr, own);
    Conn &its_own = variant == 0 ? *p.a : *p.c;
    Conn &shared = variant == 0 ? *p.c : *p.a;
    for (int round = 0; round < 2; ++round) {  // before and after streams both ways
      if (round) stream_both(h, p, 300), settle(h);
      assert_int_equal(shared_mem(its_own), 0);
      assert_null(core(its_own)->rx.shared);
      assert_int_equal(shared_mem(shared), kIdle);
      assert_int_equal(core(shared)->tx.credits.data(), 32);
      // Its base, or all but the one the shared side owes it (it goes on the next message).
      assert_int_equal(core(its_own)->tx.credits.data() + core(shared)->tx.credits.owed(), 2);
    }
  }
}

void device_without_srq_gives_buffers_of_its_own(void **state) {
  H *h = h_of(state);
  Conn &l = listener(h);
  Pair first = connect_to(h, l);  // the first loop's device: with shared receive queues
  fake::set_max_srq_wr(0);        // the second loop's: without
  init_loop(h, &h->loop2);
  Pair p = connect_to(h, l, nullptr, &h->loop2);
  assert_int_equal(fake::open_objects().srqs, 1);
  for (int round = 0; round < 2; ++round) {  // before and after streams both ways
    if (round) stream_both(h, p, 300), settle(h);
    assert_int_equal(shared_mem(*p.c), 0);
    assert_null(core(*p.c)->rx.shared);
    assert_int_equal(shared_mem(*p.a), kIdle);
    assert_int_equal(core(*p.a)->tx.credits.data(), 32);
    // Its base, or all but the one the shared side owes it (it goes on the next message).
    assert_int_equal(core(*p.c)->tx.credits.data() + core(*p.a)->tx.credits.owed(), 2);
  }
  assert_int_equal(hello_of_client(h, nullptr, &h->loop2).recv_depth, 32);  // its 32 buffers at once
  stream(h, *first.c, *first.a, 50);
}

// A shared queue is full (here the device's limit, 64 receives: ten connections' base and
// control buffers): the next connection opens another pool with a queue of its own instead of
// falling back to buffers of its own, so every connection costs an idle one's share however
// many there are (before, each one past the first queue's worth cost its 36 buffers of its own).
void a_full_shared_queue_opens_another_instead_of_buffers_of_their_own(void **state) {
  H *h = h_of(state);
  fake::set_max_srq_wr(64);  // before the device opens: its limit
  Conn &l = listener(h);
  std::vector<Pair> pairs;
  for (int i = 0; i < 15; ++i) pairs.push_back(connect_to(h, l));  // 30 ends on one device
  settle(h);
  for (Pair &p : pairs) {
    for (Conn *c : {p.c, p.a}) {
      ibmsg_memory m;
      expect_code(ibmsg_socket_memory(&c->s, &m), IBMSG_OK);
      assert_int_equal(m.buffers, 0);  // none of its own
      assert_int_equal(m.shared, kIdle);
      assert_non_null(core(*c)->rx.shared);
      assert_true(core(*c)->rx.shared->buffers <= 64);
    }
  }
  const int srqs = fake::open_objects().srqs;
  print_message("30 connection ends on %d shared queues of at most 64 receives\n", srqs);
  assert_true(srqs >= 3);  // ten ends' reservations each at most
  assert_true(core(*pairs.front().a)->rx.shared != core(*pairs.back().a)->rx.shared);
  // Messages go both ways on connections of the first pool and of the last.
  stream_both(h, pairs.front(), 100);
  stream_both(h, pairs.back(), 100);
  settle(h);
  assert_int_equal(fake::stats().rnr_errors, 0);
  for (Pair &p : pairs) expect_code(ibmsg_disconnect(&p.c->s), IBMSG_OK);
  expect_code(ibmsg_disconnect(&l.s), IBMSG_OK);
  RUN_UNTIL(h, l.closed && [&] {
    for (Pair &p : pairs)
      if (!p.c->closed || !p.a->closed) return false;
    return true;
  }());
  settle(h);
  assert_int_equal(fake::open_objects().srqs, 0);  // each pool went with its last connection
}


// IBMSG_OPT_SHARED_RECV_BUDGET (issue 27): a device's new connections get half the eager size,
// and half again, while their 6 reserved buffers would take the device's connections past the
// budget; their peers send larger messages by rendezvous, requests and replies too. Without a
// budget (0), the option's size; 32 MiB by default.
size_t slot_of(uint32_t eager) { return (eager + wire::kMaxTrailer + 63) & ~size_t(63); }

// A request's done callback (budget test): counts, and checks the reply's size and pattern.
struct BudgetReq {
  int calls = 0, ok = 0, bad = 0;
};
void on_budget_req_done(ibmsg_socket *, ibmsg_request *req, ibmsg_buffer *reply, int status) {
  BudgetReq *d = static_cast<BudgetReq *>(req->user_data);
  ++d->calls;
  if (status == IBMSG_OK && reply && reply->size == 12000 &&
      pattern_mismatch(reply->data, reply->size, 3) == reply->size)  // the responder's message 3
    ++d->ok;
  else
    ++d->bad;
  if (reply) expect_code(ibmsg_free_msg(reply), IBMSG_OK);
}

void a_shared_recv_budget_scales_the_eager_size_of_new_connections(void **state) {
  H *h = h_of(state);
  h->payload = Payload::Pattern;  // messages of any size, checked byte for byte
  uint64_t v = 1;
  size_t len = sizeof v;
  expect_code(ibmsg_getopt(&h->loop, IBMSG_OPT_SHARED_RECV_BUDGET, &v, &len), IBMSG_OK);
  assert_int_equal(v, 32u << 20);  // 32 MiB by default
  const uint64_t none = 0;
  expect_code(ibmsg_setopt(&h->loop, IBMSG_OPT_SHARED_RECV_BUDGET, &none, sizeof none), IBMSG_OK);
  Conn &l = listener(h);
  Pair plain = connect_to(h, l);
  assert_int_equal(ibmsg::eager_recv_size(core(*plain.a)), 16384);
  assert_int_equal(ibmsg::eager_recv_size(core(*plain.c)), 16384);
  expect_code(ibmsg_disconnect(&plain.c->s), IBMSG_OK);
  RUN_UNTIL(h, plain.c->closed && plain.a->closed);
  settle(h);
  // Three ends at 16 KiB; the 4th to 6th fit at 8 KiB (6 x 6 x 8192 is the budget), the 7th to
  // 12th at 4 KiB.
  const uint64_t budget = 6ull * 16384 * 3;
  expect_code(ibmsg_setopt(&h->loop, IBMSG_OPT_SHARED_RECV_BUDGET, &budget, sizeof budget),
              IBMSG_OK);
  std::vector<Pair> pairs;
  for (int i = 0; i < 5; ++i) pairs.push_back(connect_to(h, l));
  settle(h);
  std::map<uint32_t, int> ends;  // eager size -> connection ends
  for (Pair &p : pairs) {
    const uint32_t ec = ibmsg::eager_recv_size(core(*p.c)), ea = ibmsg::eager_recv_size(core(*p.a));
    for (Conn *c : {p.c, p.a}) {
      const uint32_t e = ibmsg::eager_recv_size(core(*c));
      ++ends[e];
      assert_int_equal(shared_mem(*c), 6 * slot_of(e));  // its reservation, of its size
      assert_int_equal(core(*c)->peer.eager, std::min(ec, ea));  // both send the smaller
    }
  }
  const std::map<uint32_t, int> want = {{16384, 3}, {8192, 3}, {4096, 4}};
  if (ends != want) {
    std::string got;
    for (auto &e : ends) got += " " + std::to_string(e.first) + " x" + std::to_string(e.second);
    fail_msg("eager sizes of the 10 ends:%s (want 16384 x3 8192 x3 4096 x4)", got.c_str());
  }
  // Every pair carries messages above its eager size (by rendezvous) and below it, intact and
  // in order, both ways.
  const unsigned long reads = fake::stats().rdma_ops;
  for (Pair &p : pairs)
    for (Conn *c : {p.c, p.a})
      for (size_t size : {size_t(12000), size_t(100), size_t(5000)})
        expect_code(send_msg(*c, size), IBMSG_OK);
  RUN_UNTIL(h, std::all_of(pairs.begin(), pairs.end(), [](const Pair &p) {
              return p.a->received == 3 && p.c->received == 3 && p.a->sent_ok == 3 &&
                     p.c->sent_ok == 3;
            }));
  for (Pair &p : pairs) assert_int_equal(p.a->bad_payload + p.c->bad_payload, 0);
  assert_true(fake::stats().rdma_ops > reads);  // rendezvous reads went
  // Requests of 5000 bytes answered with 12000 bytes: above the eager size of every scaled pair
  // (by rendezvous), intact.
  std::vector<ibmsg_request> reqs(pairs.size());
  BudgetReq done;
  for (size_t i = 0; i < pairs.size(); ++i) {
    Pair &p = pairs[i];
    p.a->on_msg = [&done, a = p.a](ibmsg_buffer *m) {
      if (!(m->flags & IBMSG_MSG_REQUEST)) return;
      int rc;
      Out *o = alloc_out(*a, 12000, &rc);
      if (!o) {
        ++done.bad;
        return;
      }
      rc = ibmsg_post_reply(&a->s, m, &o->m);
      if (rc) {
        ++done.bad;
        return;
      }
      note_post(*a, *o);
    };
    int rc;
    Out *o = alloc_out(*p.c, 5000, &rc);
    expect_code(rc, IBMSG_OK);
    reqs[i].done = on_budget_req_done;
    reqs[i].user_data = &done;
    expect_code(ibmsg_post_request(&p.c->s, &o->m, &reqs[i], 10000), IBMSG_OK);
    note_post(*p.c, *o);
  }
  RUN_UNTIL(h, done.calls == int(pairs.size()) || done.bad > 0);
  assert_int_equal(done.bad, 0);
  assert_int_equal(done.ok, int(pairs.size()));
  for (Pair &p : pairs) assert_int_equal(p.a->bad_payload + p.c->bad_payload, 0);
  assert_int_equal(fake::stats().rnr_errors, 0);
  // Closed connections make room: the next ones get the size their count allows.
  for (Pair &p : pairs) expect_code(ibmsg_disconnect(&p.c->s), IBMSG_OK);
  RUN_UNTIL(h, std::all_of(pairs.begin(), pairs.end(),
                           [](const Pair &p) { return p.c->closed && p.a->closed; }));
  settle(h);
  Pair again = connect_to(h, l);
  assert_int_equal(ibmsg::eager_recv_size(core(*again.c)), 16384);
  assert_int_equal(ibmsg::eager_recv_size(core(*again.a)), 16384);
}

// An accepted connection from a peer that takes no rendezvous (no kFeatureRndv, or no
// rndv_max_size, as from ibmsg 1.1) keeps the full eager size under any budget: that peer could
// send it nothing larger. One from a peer with rendezvous is scaled down.
void a_peer_without_rendezvous_keeps_the_full_eager_size_under_a_budget(void **state) {
  H *h = h_of(state);
  const uint64_t budget = 1;  // every scalable connection as far down as it goes
  expect_code(ibmsg_setopt(&h->loop, IBMSG_OPT_SHARED_RECV_BUDGET, &budget, sizeof budget),
              IBMSG_OK);
  wire::Hello with = hello13(8, 8);
  with.rndv_max_size = 1u << 20;
  RawPair scaled = raw_client_with(h, with);
  assert_int_equal(scaled.mine.max_msg_size, ibmsg::kMinScaledEager);
  for (int variant = 0; variant < 2; ++variant) {
    wire::Hello without = hello13(8, 8);
    if (variant == 0) without.rndv_max_size = 1u << 20;
    without.features &= ~wire::kFeatureRndv;
    if (variant == 1) without.features |= wire::kFeatureRndv;  // the bit, but no size
    RawPair kept = raw_client_with(h, without);
    assert_int_equal(kept.mine.max_msg_size, 16384);
    assert_int_equal(ibmsg::eager_recv_size(core(*kept.a)), 16384);
    assert_int_equal(shared_mem(*kept.a), 6 * slot_of(16384));
  }
}

// === 7. closing while the application holds messages ==========================================

void close_while_messages_are_held(void **state) {
  H *h = h_of(state);
  for (int variant = 0; variant < 2; ++variant) {
    Conn &l = listener(h);
    Pair other = connect_to(h, l);
    h->hold_accepted = true;
    Pair p = connect_to(h, l);
    h->hold_accepted = false;
    RUN_UNTIL(h, (top_up(*p.c, 20), p.a->received == 20 && p.c->sent_ok == 20));
    assert_int_equal(core(*p.a)->rx.share.held, 20);
    ibmsg::SharedRecv *r = core(*p.a)->rx.shared;
    const uint32_t conns = r->conns;
    // The holder closes, or its peer does.
    expect_code(ibmsg_disconnect(variant == 0 ? &p.a->s : &p.c->s), IBMSG_OK);
    RUN_UNTIL(h, p.a->closed && p.c->closed);
    settle(h);
    assert_int_equal(r->conns, conns - 2);
    assert_int_equal(r->lent, 20);
    ibmsg_memory lm;
    expect_code(ibmsg_loop_memory(&h->loop, &lm), IBMSG_OK);
    assert_true(lm.shared >= r->buffers * kSlot);
    // Freed after the close: intact, and their buffers back in the pool.
    free_held(*p.a);
    assert_int_equal(p.a->bad_payload, 0);
    settle(h);
    expect_pool_balanced(h, *other.a, 0);
    // The other connection can still take the pool up to its cap.
    other.a->hold = true;
    RUN_UNTIL(h, (top_up(*other.c, 40), other.a->received == 32));
    settle(h, 100);
    assert_int_equal(other.a->received, 32);
    other.a->hold = false;
    free_held(*other.a);
    RUN_UNTIL(h, (top_up(*other.c, 40), other.a->received == 40 && other.c->sent_ok == 40));
    settle(h);
    expect_pool_balanced(h, *other.a, 0);
    expect_code(ibmsg_disconnect(&other.c->s), IBMSG_OK);
    expect_code(ibmsg_disconnect(&l.s), IBMSG_OK);
    RUN_UNTIL(h, other.a->closed && other.c->closed && l.closed);
  }
  settle(h);
  assert_int_equal(fake::open_objects().srqs, 0);  // the pool went with its last connection
}

}  // namespace

#define T(name) cmocka_unit_test_setup_teardown(name, setup, teardown)

int main(void) {
  const struct CMUnitTest tests[] = {
      T(hellos_offer_a_base_of_2_and_the_cap),
      T(ibmsg_pair_agrees_and_streams_both_ways),
      T(replies_queued_in_a_round_carry_the_credits_freed_after_them),
      T(a_reply_goes_before_the_message_it_answers_goes_back),
      T(busy_polled_messages_freed_as_their_connection_closes_go_back),
      T(held_messages_stop_the_peer_at_the_cap),
      T(full_cap_freed_at_once_then_idle_again),
      T(busy_connection_of_20_gets_more_than_the_base_and_gives_it_back),
      T(sender_sets_wants_and_returns_its_surplus),
      T(return_above_the_base_is_eproto_for_that_connection_only),
      T(malformed_or_unagreed_return_is_eproto),
      T(wants_on_a_credit_message_gets_a_credit),
      T(data_beyond_the_credits_is_eproto_and_others_go_on),
      T(peer_of_protocol_1_2_gets_at_most_the_base_and_no_wants_bit),
      T(shared_recv_option_0_gives_buffers_of_its_own),
      T(device_without_srq_gives_buffers_of_its_own),
      T(a_full_shared_queue_opens_another_instead_of_buffers_of_their_own),
      T(a_shared_recv_budget_scales_the_eager_size_of_new_connections),
      T(a_peer_without_rendezvous_keeps_the_full_eager_size_under_a_budget),
      T(close_while_messages_are_held),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
