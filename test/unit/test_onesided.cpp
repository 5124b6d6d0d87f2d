// test_onesided.cpp - one-sided RDMA and message immediates in the core, over the fake transport
// (test/fake), through the public C API: regions and their registrations, descriptors (grants),
// write / read / write-immediate / atomics and where they go in a connection's send order,
// exactly-once done callbacks on every close path, remote access errors, the checks before
// posting, and the features both hellos must offer.
//
// The fixture is test/fake/harness.hpp's, with operations and regions. Every test runs on a fresh
// loop and a reset fake. The teardown closes what the test left open and then checks what must hold after
// any scenario: each socket that was set up closed exactly once, no callback after its closed
// callback, exactly one done per posted operation and one message_sent per posted message, all
// of them before connection_closed and in posting order per connection, every region
// deregisters (nothing left busy), the loop destroys, nothing left open in the fake, no RNR, no
// length error and no misuse of the transport, and no invalid state transition.
//
// FAKE_SEED=n runs the randomized test with another seed.
#include "harness.hpp"  // the fixture: H, Conn, OpRec, Reg, the callbacks, setup and teardown

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>

#include "internal.hpp"
#include "errors.hpp"    // ibmsg::invalid_transitions

namespace fake = ibmsg::fake;
namespace wire = ibmsg::wire;
using namespace ibmsg::fake::harness;
using TpOp = ibmsg::tp::Op;

namespace {

// Listeners of the loop refuse no address after a violation (tests that reconnect at once).
void no_ban(H *h) {
  int zero = 0;
  expect_code(ibmsg_setopt(&h->loop, IBMSG_OPT_VIOLATION_BAN, &zero, sizeof zero), IBMSG_OK);
}

// The loop's count of its peers' remote access violations.
uint64_t loop_violations(H *h) {
  ibmsg_loop_counters c;
  expect_code(ibmsg_loop_stats(&h->loop, &c, sizeof c), IBMSG_OK);
  return c.remote_access_violations;
}

// --- regions, descriptors, operations ---

Reg &alloc_region(H *h, size_t len, unsigned access) {
  h->regs.emplace_back();
  Reg &g = h->regs.back();
  expect_code(ibmsg_alloc_region(&h->loop, &g.r, len, access), IBMSG_OK);
  g.live = true;
  return g;
}

// A region over memory the test owns (zeroed).
Reg &user_region(H *h, size_t len, unsigned access) {
  h->regs.emplace_back();
  Reg &g = h->regs.back();
  g.own.assign(len, 0);
  expect_code(ibmsg_register_region(&h->loop, &g.r, g.own.data(), len, access), IBMSG_OK);
  g.live = true;
  return g;
}

void deregister(Reg &g) {
  expect_code(ibmsg_deregister_region(&g.r), IBMSG_OK);
  g.live = false;
}

ibmsg_descriptor grant(Reg &g, Conn &c, size_t off, size_t len, unsigned access) {
  ibmsg_descriptor d;
  expect_code(ibmsg_region_descriptor(&g.r, &c.s, off, len, access, &d), IBMSG_OK);
  return d;
}

wire::Descriptor decoded(const ibmsg_descriptor &d) {
  wire::Descriptor x;
  if (!wire::decode_descriptor(d.bytes, &x)) fail_msg("a descriptor ibmsg made does not decode");
  return x;
}

// A well-formed descriptor (its check is right) with fields the owner never granted.
ibmsg_descriptor forge(const ibmsg_descriptor &d,
                       const std::function<void(wire::Descriptor &)> &f) {
  wire::Descriptor x = decoded(d);
  f(x);
  ibmsg_descriptor out;
  wire::encode_descriptor(x, out.bytes);
  return out;
}

OpRec &new_op(H *h) {
  h->ops.emplace_back();
  OpRec &o = h->ops.back();
  o.id = int(h->ops.size() - 1);
  o.op.done = on_done;
  o.op.user_data = &o;
  return o;
}

int counted(OpRec &o, Conn &c, int rc) {
  if (rc == IBMSG_OK) {
    ++o.posts;
    ++c.ops_posted;
    o.conn = &c;
    o.seq = take_post(c);
  }
  return rc;
}

int op_write(OpRec &o, Conn &c, Reg &l, size_t loff, size_t len, const ibmsg_descriptor &d,
             size_t roff) {
  return counted(o, c, ibmsg_rdma_write(&c.s, &o.op, &l.r, loff, len, &d, roff));
}

int op_read(OpRec &o, Conn &c, Reg &l, size_t loff, size_t len, const ibmsg_descriptor &d,
            size_t roff) {
  return counted(o, c, ibmsg_rdma_read(&c.s, &o.op, &l.r, loff, len, &d, roff));
}

int op_write_imm(OpRec &o, Conn &c, Reg &l, size_t loff, size_t len, const ibmsg_descriptor &d,
                 size_t roff, uint32_t imm) {
  return counted(o, c, ibmsg_rdma_write_imm(&c.s, &o.op, &l.r, loff, len, &d, roff, imm));
}

int op_cas(OpRec &o, Conn &c, Reg &l, size_t loff, const ibmsg_descriptor &d, size_t roff,
           uint64_t compare, uint64_t swap) {
  return counted(o, c, ibmsg_atomic_cas(&c.s, &o.op, &l.r, loff, &d, roff, compare, swap));
}

int op_fadd(OpRec &o, Conn &c, Reg &l, size_t loff, const ibmsg_descriptor &d, size_t roff,
            uint64_t add) {
  return counted(o, c, ibmsg_atomic_fadd(&c.s, &o.op, &l.r, loff, &d, roff, add));
}

uint64_t word_at(const Reg &g, size_t off) {
  uint64_t v;
  memcpy(&v, g.p() + off, 8);
  return v;
}

void set_word(Reg &g, size_t off, uint64_t v) { memcpy(g.p() + off, &v, 8); }

void pattern(Reg &g, size_t off, size_t len, uint8_t seed) {
  for (size_t i = 0; i < len; ++i) g.p()[off + i] = uint8_t(seed + i * 7);
}

bool all_zero(const Reg &g, size_t off, size_t len) {
  for (size_t i = 0; i < len; ++i)
    if (g.p()[off + i]) return false;
  return true;
}

std::string ops_text(const std::vector<TpOp> &v) {
  std::string s;
  for (TpOp op : v) {
    if (!s.empty()) s += ' ';
    switch (op) {
      case TpOp::Send: s += "send"; break;
      case TpOp::Ctrl: s += "ctrl"; break;
      case TpOp::RdmaWrite: s += "write"; break;
      case TpOp::RdmaRead: s += "read"; break;
      case TpOp::WriteImm: s += "write_imm"; break;
      case TpOp::Atomic: s += "atomic"; break;
      default: s += "?"; break;
    }
  }
  return s;
}

// What the core posted on c's QP (credit-only messages left out), as text.
std::string posted(Conn &c) { return ops_text(fake::posts_of(c.local_port)); }

// Seq payloads (only the number checked); message_sent and done in posting order and before
// connection_closed; write-immediates reported.
int setup(void **state) {
  return fixture_setup(state, [](H *h) {
    h->payload = Payload::SeqNumber;
    h->sent_in_order = true;
    h->sent_before_closed = true;
    h->loop.write_received = on_write_received;
    return 0;
  });
}

constexpr unsigned kR = IBMSG_ACCESS_REMOTE_READ;
constexpr unsigned kW = IBMSG_ACCESS_REMOTE_WRITE;
constexpr unsigned kA = IBMSG_ACCESS_REMOTE_ATOMIC;
constexpr unsigned kLW = IBMSG_ACCESS_LOCAL_WRITE;

// === 1. the operations ========================================================================

void write_lands_in_the_granted_bytes_only(void **state) {
  H *h = h_of(state);
  Pair p = connected(h);
  Reg &dst = alloc_region(h, 4096, kW);
  Reg &src = user_region(h, 4096, 0);  // the source of a write needs no right
  pattern(src, 0, 4096, 1);
  ibmsg_descriptor d = grant(dst, *p.a, 1024, 1024, kW);
  OpRec &o = new_op(h);
  expect_code(op_write(o, *p.c, src, 100, 512, d, 256), IBMSG_OK);
  assert_int_equal(o.op.type, IBMSG_OP_WRITE);
  RUN_UNTIL(h, o.dones == 1);
  expect_code(o.status, IBMSG_OK);
  expect_code(o.op.status, IBMSG_OK);
  expect_code(o.status_field, IBMSG_OK);
  assert_memory_equal(dst.p() + 1024 + 256, src.p() + 100, 512);
  assert_true(all_zero(dst, 0, 1024 + 256));
  assert_true(all_zero(dst, 1024 + 256 + 512, 4096 - (1024 + 256 + 512)));
  assert_string_equal(posted(*p.c).c_str(), "write");
  assert_int_equal(fake::stats().rdma_ops, 1);
  assert_int_equal(p.c->s.status, IBMSG_CONNECTED);
  assert_int_equal(p.a->s.status, IBMSG_CONNECTED);
  // The same op struct may be posted again after its done callback; the whole grant at once.
  pattern(src, 0, 1024, 99);
  expect_code(op_write(o, *p.c, src, 0, 1024, d, 0), IBMSG_OK);
  RUN_UNTIL(h, o.dones == 2);
  expect_code(o.status, IBMSG_OK);
  assert_memory_equal(dst.p() + 1024, src.p(), 1024);
}

void op_status_is_einprogress_while_posted(void **state) {
  H *h = h_of(state);
  Pair p = connected(h);
  Reg &dst = alloc_region(h, 64, kW);
  Reg &src = alloc_region(h, 64, 0);
  ibmsg_descriptor d = grant(dst, *p.a, 0, 64, kW);
  fake::pause_wire(true);
  OpRec &o = new_op(h);
  expect_code(op_write(o, *p.c, src, 0, 64, d, 0), IBMSG_OK);
  settle(h, 3);
  expect_code(o.op.status, IBMSG_EINPROGRESS);
  assert_int_equal(o.dones, 0);
  fake::pause_wire(false);
  RUN_UNTIL(h, o.dones == 1);
  expect_code(o.op.status, IBMSG_OK);
}

void read_brings_the_peers_bytes(void **state) {
  H *h = h_of(state);
  Pair p = connected(h);
  Reg &remote = alloc_region(h, 2048, kR);
  pattern(remote, 0, 2048, 5);
  Reg &local = user_region(h, 1024, kLW);
  ibmsg_descriptor d = grant(remote, *p.a, 512, 1024, kR);
  OpRec &o = new_op(h);
  expect_code(op_read(o, *p.c, local, 10, 300, d, 20), IBMSG_OK);
  assert_int_equal(o.op.type, IBMSG_OP_READ);
  RUN_UNTIL(h, o.dones == 1);
  expect_code(o.status, IBMSG_OK);
  assert_memory_equal(local.p() + 10, remote.p() + 512 + 20, 300);
  assert_true(all_zero(local, 0, 10));
  assert_true(all_zero(local, 310, 1024 - 310));
  assert_string_equal(posted(*p.c).c_str(), "read");
}

void atomics_compare_swap_and_fetch_add_host_order_words(void **state) {
  H *h = h_of(state);
  Pair p = connected(h);
  Reg &remote = alloc_region(h, 64, kA);
  set_word(remote, 8, 5);
  set_word(remote, 16, 0x0102030405060708ull);
  Reg &local = alloc_region(h, 64, kLW);
  ibmsg_descriptor d = grant(remote, *p.a, 0, 64, kA);
  OpRec &hit = new_op(h), &miss = new_op(h), &add = new_op(h), &wrap = new_op(h);
  expect_code(op_cas(hit, *p.c, local, 0, d, 8, 5, 9), IBMSG_OK);     // 5 -> 9
  expect_code(op_cas(miss, *p.c, local, 8, d, 8, 5, 11), IBMSG_OK);   // stays 9
  expect_code(op_fadd(add, *p.c, local, 16, d, 8, 3), IBMSG_OK);      // 9 -> 12
  expect_code(op_fadd(wrap, *p.c, local, 24, d, 16, ~0ull), IBMSG_OK);  // minus one, wrapping
  assert_int_equal(hit.op.type, IBMSG_OP_CAS);
  assert_int_equal(add.op.type, IBMSG_OP_FADD);
  RUN_UNTIL(h, hit.dones && miss.dones && add.dones && wrap.dones);
  for (OpRec *o : {&hit, &miss, &add, &wrap}) expect_code(o->status, IBMSG_OK);
  assert_int_equal(word_at(local, 0), 5);   // the previous values
  assert_int_equal(word_at(local, 8), 9);
  assert_int_equal(word_at(local, 16), 9);
  assert_int_equal(word_at(local, 24), 0x0102030405060708ull);
  assert_int_equal(word_at(remote, 8), 12);
  assert_int_equal(word_at(remote, 16), 0x0102030405060707ull);
  assert_string_equal(posted(*p.c).c_str(), "atomic atomic atomic atomic");
  assert_string_equal(p.c->trace.c_str(), "op0=OK op1=OK op2=OK op3=OK");
}

// "Write then message: when the peer's message_received runs, the bytes of every write posted
// before it on that connection are visible"; likewise for write_received.
void bytes_of_earlier_writes_are_visible_when_a_message_or_write_imm_arrives(void **state) {
  H *h = h_of(state);
  Pair p = connected(h);
  Reg &dst = alloc_region(h, 256, kW);
  Reg &src = alloc_region(h, 256, 0);
  pattern(src, 0, 256, 3);
  ibmsg_descriptor d = grant(dst, *p.a, 0, 256, kW);
  int seen_msg = -1, seen_imm = -1;
  p.a->on_msg = [&](ibmsg_buffer *) { seen_msg = memcmp(dst.p(), src.p(), 128) == 0; };
  p.a->on_write = [&](uint32_t, size_t) {
    seen_imm = memcmp(dst.p() + 128, src.p() + 128, 64) == 0;
  };
  OpRec &w1 = new_op(h), &w2 = new_op(h), &wi = new_op(h);
  expect_code(op_write(w1, *p.c, src, 0, 128, d, 0), IBMSG_OK);
  expect_code(send_msg(*p.c, 16), IBMSG_OK);
  expect_code(op_write(w2, *p.c, src, 128, 64, d, 128), IBMSG_OK);
  expect_code(op_write_imm(wi, *p.c, src, 192, 64, d, 192, 77), IBMSG_OK);
  RUN_UNTIL(h, p.a->received == 1 && p.a->write_imms.size() == 1 && wi.dones == 1);
  assert_int_equal(seen_msg, 1);
  assert_int_equal(seen_imm, 1);
  assert_int_equal(p.a->write_imms[0], 77);
  assert_int_equal(p.a->write_lens[0], 64);
  assert_memory_equal(dst.p(), src.p(), 256);
  assert_string_equal(posted(*p.c).c_str(), "write send write write_imm");
  assert_string_equal(p.c->trace.c_str(), "op0=OK msg0=OK op1=OK op2=OK");
}

// The done callback may post the next operation (even with the same op struct).
void an_operation_can_be_posted_again_from_its_own_done_callback(void **state) {
  H *h = h_of(state);
  Pair p = connected(h);
  Reg &remote = alloc_region(h, 8, kA);
  Reg &local = alloc_region(h, 8, kLW);
  ibmsg_descriptor d = grant(remote, *p.a, 0, 8, kA);
  OpRec &o = new_op(h);
  Conn *c = p.c;
  o.when_done = [&o, c, &local, d] {
    if (o.posts < 10) expect_code(op_fadd(o, *c, local, 0, d, 0, 1), IBMSG_OK);
  };
  expect_code(op_fadd(o, *c, local, 0, d, 0, 1), IBMSG_OK);
  RUN_UNTIL(h, o.dones == 10);
  assert_int_equal(word_at(remote, 0), 10);
  assert_int_equal(word_at(local, 0), 9);
}

// === 2. the send order of a connection ========================================================

void operation_posted_while_a_message_waits_for_credits_goes_after_it(void **state) {
  H *h = h_of(state);
  ibmsg_options *so = options(h, {{IBMSG_OPT_RECV_DEPTH, 2}});
  h->hold_accepted = true;
  Pair p = connected(h, so);
  Reg &dst = alloc_region(h, 64, kW);
  Reg &src = alloc_region(h, 64, 0);
  ibmsg_descriptor d = grant(dst, *p.a, 0, 64, kW);
  for (int i = 0; i < 3; ++i) expect_code(send_msg(*p.c, 16), IBMSG_OK);  // 2 credits, 1 waits
  OpRec &o = new_op(h);
  expect_code(op_write(o, *p.c, src, 0, 64, d, 0), IBMSG_OK);  // could go, but waits behind it
  settle(h);
  assert_string_equal(posted(*p.c).c_str(), "send send");
  assert_int_equal(o.dones, 0);
  assert_int_equal(p.a->received, 2);
  free_held(*p.a);  // credits return: the message goes, then the write
  RUN_UNTIL(h, p.a->received == 3 && o.dones == 1);
  assert_string_equal(posted(*p.c).c_str(), "send send send write");
  assert_string_equal(p.c->trace.c_str(), "msg0=OK msg1=OK msg2=OK op0=OK");
  free_held(*p.a);
}

void messages_wait_behind_operations_waiting_for_room_in_flight(void **state) {
  H *h = h_of(state);
  ibmsg_options *co = options(h, {{IBMSG_OPT_RDMA_DEPTH, 1}});
  Pair p = connected(h, nullptr, co);
  Reg &dst = alloc_region(h, 64, kW);
  Reg &src = alloc_region(h, 64, 0);
  ibmsg_descriptor d = grant(dst, *p.a, 0, 64, kW);
  fake::pause_wire(true);
  OpRec &w1 = new_op(h), &w2 = new_op(h);
  expect_code(op_write(w1, *p.c, src, 0, 32, d, 0), IBMSG_OK);   // in flight
  expect_code(op_write(w2, *p.c, src, 32, 32, d, 32), IBMSG_OK);  // no room in flight: waits
  expect_code(send_msg(*p.c, 16), IBMSG_OK);  // has credits, but waits behind w2
  settle(h);
  assert_string_equal(posted(*p.c).c_str(), "write");
  fake::pause_wire(false);
  RUN_UNTIL(h, w2.dones == 1 && p.c->sent_ok == 1 && p.a->received == 1);
  assert_string_equal(posted(*p.c).c_str(), "write write send");
  assert_string_equal(p.c->trace.c_str(), "op0=OK op1=OK msg0=OK");
}

void send_queue_bound_counts_messages_and_operations_together(void **state) {
  H *h = h_of(state);
  ibmsg_options *co = options(h, {{IBMSG_OPT_RDMA_DEPTH, 1}, {IBMSG_OPT_SEND_QUEUE, 2}});
  Pair p = connected(h, nullptr, co);
  Reg &dst = alloc_region(h, 64, kW);
  Reg &src = alloc_region(h, 64, 0);
  ibmsg_descriptor d = grant(dst, *p.a, 0, 64, kW);
  fake::pause_wire(true);
  OpRec &w1 = new_op(h), &w2 = new_op(h), &w3 = new_op(h);
  expect_code(op_write(w1, *p.c, src, 0, 8, d, 0), IBMSG_OK);   // in flight
  expect_code(op_write(w2, *p.c, src, 0, 8, d, 8), IBMSG_OK);   // queued (1)
  expect_code(send_msg(*p.c, 16), IBMSG_OK);                    // queued (2)
  expect_code(op_write(w3, *p.c, src, 0, 8, d, 16), IBMSG_EAGAIN);
  expect_code(send_msg(*p.c, 16), IBMSG_EAGAIN);
  expect_code(w3.op.status, 0);  // untouched by a refused call
  fake::pause_wire(false);
  RUN_UNTIL(h, w2.dones == 1 && p.c->sent_ok == 1);
  assert_int_equal(w3.dones, 0);  // a refused call gets no callback
  expect_code(op_write(w3, *p.c, src, 0, 8, d, 16), IBMSG_OK);  // room again
  RUN_UNTIL(h, w3.dones == 1);
  assert_string_equal(p.c->trace.c_str(), "op0=OK op1=OK msg0=OK op2=OK");
}

// === 3. close paths ===========================================================================

void disconnect_cancels_every_operation_once_before_connection_closed(void **state) {
  H *h = h_of(state);
  ibmsg_options *co = options(h, {{IBMSG_OPT_RDMA_DEPTH, 2}, {IBMSG_OPT_SEND_QUEUE, 8}});
  Pair p = connected(h, nullptr, co);
  Reg &dst = alloc_region(h, 256, kW | kR);
  Reg &src = alloc_region(h, 256, kLW);
  ibmsg_descriptor d = grant(dst, *p.a, 0, 256, kW | kR);
  fake::pause_wire(true);
  OpRec *o[5];
  for (OpRec *&x : o) x = &new_op(h);
  expect_code(op_write(*o[0], *p.c, src, 0, 16, d, 0), IBMSG_OK);  // in flight
  expect_code(op_read(*o[1], *p.c, src, 16, 16, d, 16), IBMSG_OK);  // in flight
  expect_code(op_write(*o[2], *p.c, src, 0, 16, d, 32), IBMSG_OK);  // queued
  expect_code(send_msg(*p.c, 16), IBMSG_OK);                        // queued
  expect_code(op_write_imm(*o[3], *p.c, src, 0, 16, d, 48, 1), IBMSG_OK);
  expect_code(op_write(*o[4], *p.c, src, 0, 16, d, 64), IBMSG_OK);
  expect_code(ibmsg_deregister_region(&src.r), IBMSG_EBUSY);
  expect_code(ibmsg_disconnect(&p.c->s), IBMSG_OK);
  RUN_UNTIL(h, p.c->closed && p.a->closed);
  assert_string_equal(p.c->trace.c_str(),
                      "op0=ECANCELED op1=ECANCELED op2=ECANCELED msg0=ECANCELED op3=ECANCELED "
                      "op4=ECANCELED closed=OK");
  for (OpRec *x : o) expect_code(x->op.status, IBMSG_ECANCELED);
  expect_code(p.a->close_reason, IBMSG_ECONNRESET);
  assert_int_equal(p.a->write_imms.size(), 0);
  deregister(src);  // nothing of it is queued or in flight any more
  fake::pause_wire(false);
  settle(h);
  assert_true(all_zero(dst, 0, 256));  // flushed operations never execute
}

void peer_disconnect_cancels_operations_and_reports_econnreset(void **state) {
  H *h = h_of(state);
  ibmsg_options *co = options(h, {{IBMSG_OPT_RDMA_DEPTH, 1}});
  Pair p = connected(h, nullptr, co);
  Reg &dst = alloc_region(h, 64, kW);
  Reg &src = alloc_region(h, 64, 0);
  ibmsg_descriptor d = grant(dst, *p.a, 0, 64, kW);
  fake::pause_wire(true);
  OpRec &w1 = new_op(h), &w2 = new_op(h);
  expect_code(op_write(w1, *p.c, src, 0, 8, d, 0), IBMSG_OK);
  expect_code(op_write(w2, *p.c, src, 0, 8, d, 8), IBMSG_OK);
  expect_code(ibmsg_disconnect(&p.a->s), IBMSG_OK);
  RUN_UNTIL(h, p.c->closed && p.a->closed);
  assert_string_equal(p.c->trace.c_str(), "op0=ECANCELED op1=ECANCELED closed=ECONNRESET");
}


// A remote access error closes that connection (RDMA moves both queue pairs to the error state):
// the operation gets IBMSG_EREMOTEACCESS, the connection closes with it, what followed it is
// canceled, the granting side closes with IBMSG_EREMOTEACCESS too (a violation of its peer,
// counted), and other connections go on.
void remote_access_error_closes_only_that_connection(void **state) {
  H *h = h_of(state);
  Pair p1 = connected(h);
  Pair p2 = connected(h);
  Reg &dst = alloc_region(h, 4096, kW);
  Reg &src = alloc_region(h, 4096, 0);
  pattern(src, 0, 4096, 9);
  ibmsg_descriptor d1 = grant(dst, *p1.a, 0, 1024, kW);
  ibmsg_descriptor d2 = grant(dst, *p2.a, 1024, 1024, kW);
  // A forged descriptor (its check is right, it is longer than granted) passes the checks before
  // posting; the registration of exactly the granted bytes refuses it.
  ibmsg_descriptor longer = forge(d1, [](wire::Descriptor &x) { x.length = 4096; });
  OpRec &bad = new_op(h), &after = new_op(h);
  expect_code(op_write(bad, *p1.c, src, 0, 100, longer, 1500), IBMSG_OK);
  expect_code(op_write(after, *p1.c, src, 0, 100, d1, 0), IBMSG_OK);
  RUN_UNTIL(h, p1.c->closed && p1.a->closed);
  assert_string_equal(p1.c->trace.c_str(), "op0=EREMOTEACCESS op1=ECANCELED closed=EREMOTEACCESS");
  expect_code(bad.op.status, IBMSG_EREMOTEACCESS);
  expect_code(p1.a->close_reason, IBMSG_EREMOTEACCESS);
  assert_int_equal(fake::stats().remote_access_errors, 1);
  assert_int_equal(loop_violations(h), 1);
  assert_true(all_zero(dst, 0, 4096));  // neither the refused write nor the one after it
  assert_int_equal(p1.l->s.status, IBMSG_LISTENING);
  assert_int_equal(p2.c->s.status, IBMSG_CONNECTED);
  assert_int_equal(p2.a->s.status, IBMSG_CONNECTED);
  OpRec &ok = new_op(h);
  expect_code(op_write(ok, *p2.c, src, 0, 1024, d2, 0), IBMSG_OK);
  RUN_UNTIL(h, ok.dones == 1);
  expect_code(ok.status, IBMSG_OK);
  assert_memory_equal(dst.p() + 1024, src.p(), 1024);
}

// Descriptors with a right check but fields the owner never granted: each is refused by the
// peer's registration, each closes its connection with IBMSG_EREMOTEACCESS.
void forged_descriptors_are_refused_by_the_peer(void **state) {
  H *h = h_of(state);
  no_ban(h);  // it reconnects after each violation
  Reg &dst = alloc_region(h, 256, kW | kR | kA);
  Reg &local = alloc_region(h, 256, kLW);
  pattern(local, 0, 256, 1);
  struct Variant {
    const char *what;
    char kind;  // w write, r read, a atomic
    size_t roff;
    std::function<void(wire::Descriptor &)> change;
  };
  const Variant variants[] = {
      {"beyond the end", 'w', 64, [](wire::Descriptor &x) { x.length += 8; }},
      {"before the start", 'w', 0, [](wire::Descriptor &x) { x.addr -= 8; x.length += 8; }},
      {"a read right not granted", 'r', 0, [](wire::Descriptor &x) { x.access |= kR; }},
      {"an atomic right not granted", 'a', 8, [](wire::Descriptor &x) { x.access |= kA; }},
      {"an unknown key", 'w', 0, [](wire::Descriptor &x) { x.rkey ^= 0x5a5a0000u; }},
  };
  unsigned long n = 0;
  for (const Variant &v : variants) {
    Pair p = connected(h);
    ibmsg_descriptor d = grant(dst, *p.a, 64, 64, kW);  // write only, bytes 64..127
    ibmsg_descriptor f = forge(d, v.change);
    OpRec &o = new_op(h);
    int rc = v.kind == 'w'   ? op_write(o, *p.c, local, 0, 8, f, v.roff)
             : v.kind == 'r' ? op_read(o, *p.c, local, 0, 8, f, v.roff)
                             : op_fadd(o, *p.c, local, 0, f, v.roff, 1);
    if (rc != IBMSG_OK) fail_msg("%s: posting returned %s", v.what, ibmsg_err_name(rc));
    RUN_UNTIL(h, p.c->closed && o.dones == 1);
    if (o.status != IBMSG_EREMOTEACCESS || p.c->close_reason != IBMSG_EREMOTEACCESS)
      fail_msg("%s: the operation got %s, the connection closed with %s", v.what,
               ibmsg_err_name(o.status), ibmsg_err_name(p.c->close_reason));
    assert_int_equal(fake::stats().remote_access_errors, ++n);
  }
  assert_true(all_zero(dst, 0, 256));
}

void revoked_descriptor_makes_the_peers_next_operation_fail(void **state) {
  H *h = h_of(state);
  Pair p = connected(h);
  Reg &dst = alloc_region(h, 256, kW);
  Reg &src = alloc_region(h, 256, 0);
  pattern(src, 0, 256, 4);
  ibmsg_descriptor d = grant(dst, *p.a, 0, 128, kW);
  OpRec &w1 = new_op(h), &w2 = new_op(h);
  expect_code(op_write(w1, *p.c, src, 0, 64, d, 0), IBMSG_OK);
  RUN_UNTIL(h, w1.dones == 1);
  expect_code(w1.status, IBMSG_OK);
  int mrs = fake::open_objects().mrs;
  expect_code(ibmsg_revoke_descriptor(&dst.r, &d), IBMSG_OK);
  assert_int_equal(fake::open_objects().mrs, mrs - 1);  // the grant's registration is gone
  expect_code(ibmsg_revoke_descriptor(&dst.r, &d), IBMSG_EBADDESC);  // no live grant any more
  Reg &other = alloc_region(h, 64, kW);
  ibmsg_descriptor od = grant(other, *p.a, 0, 64, kW);
  expect_code(ibmsg_revoke_descriptor(&dst.r, &od), IBMSG_EBADDESC);  // not dst's
  expect_code(op_write(w2, *p.c, src, 64, 64, d, 64), IBMSG_OK);  // well-formed, so it is posted
  RUN_UNTIL(h, p.c->closed && w2.dones == 1);
  expect_code(w2.status, IBMSG_EREMOTEACCESS);
  expect_code(p.c->close_reason, IBMSG_EREMOTEACCESS);
  assert_memory_equal(dst.p(), src.p(), 64);
  assert_true(all_zero(dst, 64, 192));
}

void deregistering_a_region_revokes_its_descriptors(void **state) {
  H *h = h_of(state);
  Pair p = connected(h);
  Reg &dst = alloc_region(h, 256, kW | kR);
  Reg &src = alloc_region(h, 256, kLW);
  ibmsg_descriptor dw = grant(dst, *p.a, 0, 256, kW);
  ibmsg_descriptor dr = grant(dst, *p.a, 0, 256, kR);
  int mrs = fake::open_objects().mrs;
  // Busy while the grants' windows are being bound (until the loop polled their completions).
  expect_code(ibmsg_deregister_region(&dst.r), IBMSG_EBUSY);
  settle(h);
  deregister(dst);  // no operation of this side uses it
  assert_int_equal(fake::open_objects().mrs, mrs - 3);  // its registration and both grants
  assert_int_equal(fake::open_objects().mws, 0);        // and their windows
  OpRec &o = new_op(h);
  expect_code(op_read(o, *p.c, src, 0, 64, dr, 0), IBMSG_OK);
  RUN_UNTIL(h, p.c->closed && o.dones == 1);
  expect_code(o.status, IBMSG_EREMOTEACCESS);
  expect_code(p.c->close_reason, IBMSG_EREMOTEACCESS);
  assert_true(all_zero(src, 0, 256));
  (void)dw;
}

// === 3b. grants bound to their connection =====================================================

// A descriptor is a window bound to its connection's queue pair: its key used on another
// connection of the device (the right key, or a guess) fails there and closes that connection on
// both sides with IBMSG_EREMOTEACCESS, counted by the granting loop; the connection it was made
// for goes on using it.
void window_key_fails_on_another_connection(void **state) {
  H *h = h_of(state);
  no_ban(h);
  Pair pa = connected(h);
  Reg &dst = alloc_region(h, 256, kW);
  Reg &src = alloc_region(h, 256, 0);
  pattern(src, 0, 256, 3);
  ibmsg_descriptor d = grant(dst, *pa.a, 0, 256, kW);
  assert_int_equal(fake::open_objects().mws, 1);
  for (int i = 0; i < 3; ++i) {
    Pair pb = connected(h);
    OpRec &o = new_op(h);
    expect_code(op_write(o, *pb.c, src, 0, 64, d, 0), IBMSG_OK);
    RUN_UNTIL(h, pb.c->closed && pb.a->closed && o.dones == 1);
    expect_code(o.status, IBMSG_EREMOTEACCESS);
    expect_code(pb.c->close_reason, IBMSG_EREMOTEACCESS);
    expect_code(pb.a->close_reason, IBMSG_EREMOTEACCESS);
    assert_int_equal(loop_violations(h), uint64_t(i + 1));
  }
  assert_true(all_zero(dst, 0, 256));
  OpRec &ok = new_op(h);
  expect_code(op_write(ok, *pa.c, src, 0, 64, d, 0), IBMSG_OK);
  RUN_UNTIL(h, ok.dones == 1);
  expect_code(ok.status, IBMSG_OK);
  assert_int_equal(pa.a->s.status, IBMSG_CONNECTED);
}

// A device-wide grant is a registration with the rights: every connection of the device may use
// it, and it makes no window.
void device_wide_grant_works_on_every_connection(void **state) {
  H *h = h_of(state);
  Pair pa = connected(h);
  Pair pb = connected(h);
  Reg &dst = alloc_region(h, 256, kW);
  Reg &src = alloc_region(h, 256, 0);
  pattern(src, 0, 256, 5);
  int mws = fake::open_objects().mws;
  ibmsg_descriptor d = grant(dst, *pa.a, 0, 256, kW | IBMSG_ACCESS_DEVICE_WIDE);
  assert_int_equal(fake::open_objects().mws, mws);
  OpRec &o = new_op(h);
  expect_code(op_write(o, *pb.c, src, 0, 64, d, 0), IBMSG_OK);
  RUN_UNTIL(h, o.dones == 1);
  expect_code(o.status, IBMSG_OK);
  assert_int_equal(loop_violations(h), 0);
  expect_code(ibmsg_revoke_descriptor(&dst.r, &d), IBMSG_OK);
}

// Revoked while its bind is in flight: the descriptor is gone at once (EBADDESC again), the
// window once the bind completed; the peer's use fails.
void revoke_while_binding_drops_the_window_after_the_bind(void **state) {
  H *h = h_of(state);
  Pair p = connected(h);
  Reg &dst = alloc_region(h, 256, kW);
  Reg &src = alloc_region(h, 256, 0);
  int mws = fake::open_objects().mws;
  ibmsg_descriptor d = grant(dst, *p.a, 0, 256, kW);
  expect_code(ibmsg_revoke_descriptor(&dst.r, &d), IBMSG_OK);
  expect_code(ibmsg_revoke_descriptor(&dst.r, &d), IBMSG_EBADDESC);
  assert_int_equal(fake::open_objects().mws, mws + 1);  // its bind is in flight still
  settle(h);
  assert_int_equal(fake::open_objects().mws, mws);
  assert_int_equal(fake::stats().misuses, 0);
  OpRec &o = new_op(h);
  expect_code(op_write(o, *p.c, src, 0, 64, d, 0), IBMSG_OK);
  RUN_UNTIL(h, p.c->closed && p.a->closed && o.dones == 1);
  expect_code(o.status, IBMSG_EREMOTEACCESS);
  expect_code(p.a->close_reason, IBMSG_EREMOTEACCESS);
}

// A connection's close releases its windows and their registrations (a revoke then finds no
// grant); the region's other grants stay.
void close_releases_the_connections_windows(void **state) {
  H *h = h_of(state);
  Pair pa = connected(h);
  Pair pb = connected(h);
  Reg &dst = alloc_region(h, 256, kW);
  int mws = fake::open_objects().mws;
  ibmsg_descriptor da = grant(dst, *pa.a, 0, 256, kW);
  ibmsg_descriptor db = grant(dst, *pb.a, 0, 256, kW);
  assert_int_equal(fake::open_objects().mws, mws + 2);
  expect_code(ibmsg_disconnect(&pa.a->s), IBMSG_OK);  // its bind may be in flight still
  RUN_UNTIL(h, pa.a->closed && pa.c->closed);
  assert_int_equal(fake::open_objects().mws, mws + 1);
  expect_code(ibmsg_revoke_descriptor(&dst.r, &da), IBMSG_EBADDESC);
  settle(h);  // (db's bind completed)
  const int before = fake::open_objects().mrs;
  expect_code(ibmsg_revoke_descriptor(&dst.r, &db), IBMSG_OK);
  assert_int_equal(fake::open_objects().mws, mws);
  assert_int_equal(fake::open_objects().mrs, before - 1);
  assert_int_equal(fake::stats().misuses, 0);
  assert_int_equal(pa.a->close_reason, IBMSG_OK);
  assert_int_equal(loop_violations(h), 0);  // a disconnect is no violation
}

// A grant made before the connection is up is bound once it is, ahead of the messages queued
// meanwhile: the peer that reads the descriptor from such a message can use it at once.
void grant_before_established_is_bound_when_up(void **state) {
  H *h = h_of(state);
  Conn &l = listener(h);
  Reg &dst = alloc_region(h, 256, kW);
  Reg &src = alloc_region(h, 256, 0);
  fake::hold_established(true);
  Conn &c = client(h, port_of(l));
  RUN_UNTIL(h, c.established && !h->accepted.empty());
  Conn &a = *h->accepted.back();
  assert_int_equal(a.established, 0);
  ibmsg_descriptor d = grant(dst, a, 0, 256, kW);
  assert_int_equal(fake::stats().binds, 0);
  fake::hold_established(false);
  fake::release_established();
  RUN_UNTIL(h, a.established == 1);
  settle(h);
  assert_int_equal(fake::stats().binds, 1);
  OpRec &o = new_op(h);
  expect_code(op_write(o, c, src, 0, 64, d, 0), IBMSG_OK);
  RUN_UNTIL(h, o.dones == 1);
  expect_code(o.status, IBMSG_OK);
}

// At most kBindDepth binds in flight per connection: beyond, IBMSG_EAGAIN until the loop ran.
void grants_beyond_the_binds_in_flight_are_eagain(void **state) {
  H *h = h_of(state);
  Pair p = connected(h);
  Reg &dst = alloc_region(h, 4096, kW);
  ibmsg_descriptor d;
  int n = 0;
  while (n < 64 && ibmsg_region_descriptor(&dst.r, &p.a->s, size_t(n) * 64, 64, kW, &d) == IBMSG_OK)
    ++n;
  assert_int_equal(n, int(ibmsg::kBindDepth));
  expect_code(ibmsg_region_descriptor(&dst.r, &p.a->s, size_t(n) * 64, 64, kW, &d), IBMSG_EAGAIN);
  // device-wide grants make no window: not limited
  expect_code(ibmsg_region_descriptor(&dst.r, &p.a->s, 0, 64, kW | IBMSG_ACCESS_DEVICE_WIDE, &d),
              IBMSG_OK);
  settle(h);
  expect_code(ibmsg_region_descriptor(&dst.r, &p.a->s, size_t(n) * 64, 64, kW, &d), IBMSG_OK);
}

// A device without type-2 windows makes device-wide grants only.
void without_type2_windows_only_device_wide_grants(void **state) {
  H *h = h_of(state);
  fake::set_mw_type2(false);
  Pair p = connected(h);
  Reg &dst = alloc_region(h, 256, kW);
  ibmsg_descriptor d;
  expect_code(ibmsg_region_descriptor(&dst.r, &p.a->s, 0, 256, kW, &d), IBMSG_EOPNOTSUPP);
  expect_code(ibmsg_region_descriptor(&dst.r, &p.a->s, 0, 256, kW | IBMSG_ACCESS_DEVICE_WIDE, &d),
              IBMSG_OK);
}

// With IBMSG_OPT_VIOLATION_BAN, a listener refuses requests from a violator's address for that
// long (with a reason), then takes them again.
void listener_refuses_a_violators_address_while_banned(void **state) {
  H *h = h_of(state);
  int ban = 300;
  expect_code(ibmsg_setopt(&h->loop, IBMSG_OPT_VIOLATION_BAN, &ban, sizeof ban), IBMSG_OK);
  Pair pa = connected(h);
  Reg &dst = alloc_region(h, 256, kW);
  Reg &src = alloc_region(h, 256, 0);
  ibmsg_descriptor d = grant(dst, *pa.a, 0, 256, kW);
  Conn &b = client(h, port_of(*pa.l));
  RUN_UNTIL(h, b.established && h->accepted.back()->established);
  Conn &sb = *h->accepted.back();
  OpRec &o = new_op(h);
  expect_code(op_write(o, b, src, 0, 64, d, 0), IBMSG_OK);
  RUN_UNTIL(h, b.closed && sb.closed);
  expect_code(sb.close_reason, IBMSG_EREMOTEACCESS);
  Conn &c = client(h, port_of(*pa.l));
  RUN_UNTIL(h, c.closed);
  expect_code(c.close_reason, IBMSG_EREJECTED);
  assert_non_null(strstr(c.s.reject_reason, "violation"));
  ibmsg_loop_counters lc;
  expect_code(ibmsg_loop_stats(&h->loop, &lc, sizeof lc), IBMSG_OK);
  assert_int_equal(lc.requests_banned, 1);
  assert_int_equal(lc.remote_access_violations, 1);
  usleep(350 * 1000);
  Conn &c2 = client(h, port_of(*pa.l));
  RUN_UNTIL(h, c2.established);
  expect_code(ibmsg_loop_stats(nullptr, &lc, sizeof lc), IBMSG_EINVAL);
  expect_code(ibmsg_loop_stats(&h->loop, nullptr, sizeof lc), IBMSG_EINVAL);
}

// === 4. write with immediate and its credit ===================================================

void write_imm_waits_for_a_data_credit_like_a_message(void **state) {
  H *h = h_of(state);
  ibmsg_options *so = options(h, {{IBMSG_OPT_RECV_DEPTH, 2}});
  Pair p = connected(h, so);
  Reg &dst = alloc_region(h, 64, kW);
  Reg &src = alloc_region(h, 64, 0);
  ibmsg_descriptor d = grant(dst, *p.a, 0, 64, kW);
  fake::pause_wire(true);
  OpRec &w1 = new_op(h), &w2 = new_op(h), &w3 = new_op(h);
  expect_code(op_write_imm(w1, *p.c, src, 0, 8, d, 0, 1), IBMSG_OK);
  expect_code(op_write_imm(w2, *p.c, src, 8, 8, d, 8, 2), IBMSG_OK);
  expect_code(op_write_imm(w3, *p.c, src, 16, 8, d, 16, 3), IBMSG_OK);  // no credit left
  expect_code(send_msg(*p.c, 16), IBMSG_OK);                              // nor for this
  settle(h);
  assert_string_equal(posted(*p.c).c_str(), "write_imm write_imm");
  fake::pause_wire(false);  // the receiver returns the credits once it took the write-imms
  RUN_UNTIL(h, w3.dones == 1 && p.a->received == 1 && p.c->sent_ok == 1);
  assert_string_equal(posted(*p.c).c_str(), "write_imm write_imm write_imm send");
  assert_string_equal(p.c->trace.c_str(), "op0=OK op1=OK op2=OK msg0=OK");
  assert_true(p.a->write_imms == std::vector<uint32_t>({1, 2, 3}));
}

// Many write-immediates into a receiver with two receive buffers for data: each spends a credit,
// the receiver returns it after write_received, so all arrive in order and none meets an empty
// receive queue (the fake counts RNR; the teardown requires none).
void many_write_imms_through_two_receive_buffers_all_arrive(void **state) {
  H *h = h_of(state);
  ibmsg_options *so = options(h, {{IBMSG_OPT_RECV_DEPTH, 2}});
  ibmsg_options *co = options(h, {{IBMSG_OPT_SEND_QUEUE, 8}});
  Pair p = connected(h, so, co);
  const int kN = 200;
  Reg &dst = alloc_region(h, 8 * kN, kW);
  Reg &src = alloc_region(h, 8 * kN, 0);
  for (int i = 0; i < kN; ++i) set_word(src, 8 * size_t(i), uint64_t(i) * 3 + 1);
  ibmsg_descriptor d = grant(dst, *p.a, 0, 8 * kN, kW);
  int bad = 0;
  uint32_t next = 0;
  p.a->on_write = [&](uint32_t imm, size_t len) {
    // The write's bytes are visible when write_received runs.
    if (imm != 1000 + next || len != 8 || word_at(dst, 8 * size_t(next)) != uint64_t(next) * 3 + 1)
      ++bad;
    ++next;
  };
  const size_t base = h->ops.size();  // (no vector here: a failure must leave nothing to free)
  for (int i = 0; i < kN; ++i) new_op(h);
  auto o = [h, base](int i) -> OpRec & { return h->ops[base + size_t(i)]; };
  int n = 0;
  bool done = run_until(
      h,
      [&] {
        while (n < kN) {
          int rc = op_write_imm(o(n), *p.c, src, 8 * size_t(n), 8, d, 8 * size_t(n),
                                uint32_t(1000 + n));
          if (rc == IBMSG_EAGAIN) break;
          if (rc) fail_msg("write_imm %d: %s", n, ibmsg_err_name(rc));
          ++n;
        }
        return p.a->write_imms.size() == size_t(kN) && o(kN - 1).dones == 1;
      },
      20000, 0);
  p.a->on_write = nullptr;
  if (!done)
    fail_msg("stalled: %d posted, %zu arrived", n, p.a->write_imms.size());
  assert_int_equal(bad, 0);
  for (int i = 0; i < kN; ++i) expect_code(o(i).status, IBMSG_OK);
  assert_int_equal(fake::stats().rnr_errors, 0);
  assert_int_equal(p.c->s.status, IBMSG_CONNECTED);
  assert_int_equal(p.a->s.status, IBMSG_CONNECTED);
}

void write_imm_from_a_raw_peer_reports_imm_and_length_and_returns_the_credit(void **state) {
  H *h = h_of(state);
  RawPair rp = raw_client(h, fake::hello(8), 4);
  Reg &dst = alloc_region(h, 64, kW);
  wire::Descriptor x = decoded(grant(dst, *rp.a, 0, 64, kW));
  expect_code(rp.r->write_imm(0xabcdef01u, x.addr + 16, x.rkey, "hello", 5), IBMSG_OK);
  RUN_UNTIL(h, rp.a->write_imms.size() == 1);
  assert_int_equal(rp.a->write_imms[0], 0xabcdef01u);
  assert_int_equal(rp.a->write_lens[0], 5);
  assert_memory_equal(dst.p() + 16, "hello", 5);
  assert_int_equal(rp.a->received, 0);  // not a message
  expect_code(rp.r->write_imm(2, x.addr, x.rkey, "x", 1), IBMSG_OK);
  RUN_UNTIL(h, rp.a->write_imms.size() == 2);
  // Half the depth (2 of 4) owed: a credit-only message gives both back at once.
  RUN_UNTIL(h, !rp.r->received.empty());
  unsigned credits = 0;
  for (const fake::RawMsg &m : rp.r->received) {
    assert_int_equal(m.imm >> 28, 1);  // credit-only
    credits += m.imm & 0xffff;
  }
  assert_int_equal(credits, 2);
  assert_int_equal(rp.r->rdma_ok, 2);
  assert_int_equal(rp.a->s.status, IBMSG_CONNECTED);
}

// Sends what the raw peer sent and expects the accepted socket to close with EPROTO.
void expect_eproto(H *h, RawPair p) {
  RUN_UNTIL(h, p.a->closed);
  expect_code(p.a->close_reason, IBMSG_EPROTO);
  assert_int_equal(p.a->write_imms.size(), 0);
  RUN_UNTIL(h, p.r->state() == Raw::State::Disconnected);
  assert_int_equal(p.l->s.status, IBMSG_LISTENING);
}

void write_imm_to_a_side_whose_peer_did_not_offer_rdma_is_eproto(void **state) {
  H *h = h_of(state);
  wire::Hello hh = fake::hello(8);
  hh.features = wire::kFeatureImm;  // no one-sided RDMA offered
  RawPair rp = raw_client(h, hh);
  Reg &dst = alloc_region(h, 64, kW);
  wire::Descriptor x = decoded(grant(dst, *rp.a, 0, 64, kW));
  expect_code(rp.r->write_imm(5, x.addr, x.rkey, "abcd", 4), IBMSG_OK);
  expect_eproto(h, rp);
}

void write_imm_to_a_side_with_rdma_off_is_eproto(void **state) {
  H *h = h_of(state);
  RawPair rp = raw_client(h, fake::hello(8), 4, {{IBMSG_OPT_RDMA, 0}});
  Reg &dst = alloc_region(h, 64, kW);
  ibmsg_descriptor d;
  expect_code(ibmsg_region_descriptor(&dst.r, &rp.a->s, 0, 64, kW, &d), IBMSG_EOPNOTSUPP);
  expect_code(rp.r->write_imm(5, 0, 0, nullptr, 0), IBMSG_OK);  // zero bytes: no key needed
  expect_eproto(h, rp);
}

void write_imm_beyond_the_data_credits_is_eproto(void **state) {
  H *h = h_of(state);
  RawPair rp = raw_client(h, fake::hello(8), 4);
  for (int i = 0; i < 4; ++i) expect_code(rp.r->send(fake::imm(0), "data", 4), IBMSG_OK);
  RUN_UNTIL(h, rp.a->received == 4);  // all held: no credit owed, none granted
  Reg &dst = alloc_region(h, 64, kW);
  wire::Descriptor x = decoded(grant(dst, *rp.a, 0, 64, kW));
  expect_code(rp.r->write_imm(9, x.addr, x.rkey, "x", 1), IBMSG_OK);  // takes a control buffer
  expect_eproto(h, rp);
}

// === 5. message immediates ====================================================================

void message_immediates_round_trip(void **state) {
  H *h = h_of(state);
  ibmsg_options *o = options(h, {{IBMSG_OPT_MAX_MSG_SIZE, 256}});
  Pair p = connected(h, o, o);
  expect_code(send_msg(*p.c, 10, true, 0xdeadbeefu), IBMSG_OK);
  expect_code(send_msg(*p.c, 12), IBMSG_OK);
  expect_code(send_msg(*p.c, 0, true, 0), IBMSG_OK);
  expect_code(send_msg(*p.c, 256, true, 0x80000001u), IBMSG_OK);  // the largest size too
  RUN_UNTIL(h, p.a->received == 4 && p.c->sent_ok == 4);
  using FI = std::pair<unsigned, uint32_t>;
  assert_true(p.a->rx_imm[0] == FI(IBMSG_MSG_IMM, 0xdeadbeefu));
  assert_true(p.a->rx_imm[1] == FI(0, 0));
  assert_true(p.a->rx_imm[2] == FI(IBMSG_MSG_IMM, 0));
  assert_true(p.a->rx_imm[3] == FI(IBMSG_MSG_IMM, 0x80000001u));
  assert_true(p.a->rx_sizes == std::vector<size_t>({10, 12, 0, 256}));
}

void message_immediate_travels_as_opcode_5_with_a_little_endian_trailer(void **state) {
  H *h = h_of(state);
  RawPair rp = raw_client(h, fake::hello(8));
  expect_code(send_msg(*rp.a, 10), IBMSG_OK);
  expect_code(send_msg(*rp.a, 10, true, 0x01020304u), IBMSG_OK);
  RUN_UNTIL(h, rp.r->received.size() == 2);
  const fake::RawMsg &plain = rp.r->received[0], &with = rp.r->received[1];
  assert_true(plain.has_imm && with.has_imm);
  assert_int_equal(plain.imm >> 28, 0);
  assert_int_equal(plain.data.size(), 10);
  assert_int_equal(with.imm >> 28, 5);
  assert_int_equal(with.imm & 0x0fffffffu, 0);  // nothing owed yet
  const uint8_t expect[14] = {1, 0, 0, 0, 0, 0, 0, 0, 1, 1, 4, 3, 2, 1};  // seq 1, then the imm
  assert_int_equal(with.data.size(), 14);
  assert_memory_equal(with.data.data(), expect, 14);
}

void message_immediate_from_a_raw_peer_arrives(void **state) {
  H *h = h_of(state);
  RawPair rp = raw_client(h, fake::hello(8));
  const uint8_t bytes[6] = {'h', 'i', 0x78, 0x56, 0x34, 0x12};
  expect_code(rp.r->send(fake::imm(5), bytes, 6), IBMSG_OK);
  RUN_UNTIL(h, rp.a->received == 1);
  assert_int_equal(rp.a->rx_sizes[0], 2);
  assert_string_equal(rp.a->last_payload.c_str(), "hi");
  assert_int_equal(rp.a->rx_imm[0].first, IBMSG_MSG_IMM);
  assert_int_equal(rp.a->rx_imm[0].second, 0x12345678u);
}

void message_immediate_without_room_for_its_trailer_is_eproto(void **state) {
  H *h = h_of(state);
  RawPair rp = raw_client(h, fake::hello(8));
  expect_code(rp.r->send(fake::imm(5), "abc", 3), IBMSG_OK);
  expect_eproto(h, rp);
  assert_int_equal(rp.a->received, 0);
}

void message_immediate_from_a_peer_that_did_not_offer_it_is_eproto(void **state) {
  H *h = h_of(state);
  wire::Hello hh = fake::hello(8);
  hh.features = 0;
  RawPair rp = raw_client(h, hh);
  expect_code(rp.r->send(fake::imm(5), "abcdefgh", 8), IBMSG_OK);
  expect_eproto(h, rp);
  assert_int_equal(rp.a->received, 0);
}

void post_send_imm_to_a_peer_without_immediates_is_eopnotsupp(void **state) {
  H *h = h_of(state);
  wire::Hello hh = fake::hello(8);
  hh.features = wire::kFeatureRdma;  // an ibmsg without message immediates
  RawPair rp = raw_client(h, hh);
  ibmsg_buffer m;
  expect_code(ibmsg_alloc_msg(&m, &rp.a->s, 8), IBMSG_OK);
  expect_code(ibmsg_post_send_imm(&rp.a->s, &m, 1), IBMSG_EOPNOTSUPP);
  assert_int_equal(m.status, IBMSG_WAITING);  // still the application's, no callback
  expect_code(ibmsg_free_msg(&m), IBMSG_OK);
  expect_code(send_msg(*rp.a, 8), IBMSG_OK);  // plain messages go
  RUN_UNTIL(h, rp.r->received.size() == 1 && rp.a->sent_ok == 1);
  assert_int_equal(rp.r->received[0].imm >> 28, 0);
  assert_int_equal(rp.r->received[0].data.size(), 8);
}

// === 6. negotiation ===========================================================================

void operations_to_a_peer_without_rdma_are_eopnotsupp(void **state) {
  H *h = h_of(state);
  wire::Hello hh = fake::hello(8);
  hh.features = wire::kFeatureImm;
  RawPair rp = raw_client(h, hh);
  Reg &mine = alloc_region(h, 64, kW | kR | kA);
  Reg &local = alloc_region(h, 64, kLW);
  ibmsg_descriptor d = grant(mine, *rp.a, 0, 64, kW | kR | kA);  // well-formed
  OpRec &o = new_op(h);
  Conn &a = *rp.a;
  expect_code(op_write(o, a, local, 0, 8, d, 0), IBMSG_EOPNOTSUPP);
  expect_code(op_read(o, a, local, 0, 8, d, 0), IBMSG_EOPNOTSUPP);
  expect_code(op_write_imm(o, a, local, 0, 8, d, 0, 1), IBMSG_EOPNOTSUPP);
  expect_code(op_cas(o, a, local, 0, d, 0, 0, 1), IBMSG_EOPNOTSUPP);
  expect_code(op_fadd(o, a, local, 0, d, 0, 1), IBMSG_EOPNOTSUPP);
  for (ibmsg::tp::Op x : fake::posts_of(port_of(*rp.l))) {  // the grant's bind only
    assert_int_equal(int(x), int(ibmsg::tp::Op::Bind));
  }
  settle(h);
  assert_int_equal(o.dones, 0);
  assert_int_equal(a.s.status, IBMSG_CONNECTED);
  expect_code(send_msg(a, 8, true, 7), IBMSG_OK);  // immediates were offered
  RUN_UNTIL(h, rp.r->received.size() == 1);
}

void rdma_off_on_either_side_turns_operations_off_and_offers_no_read_resources(void **state) {
  H *h = h_of(state);
  // Without rendezvous too (the maximum size is the eager size): the peer reads nothing.
  ibmsg_options *off = options(h, {{IBMSG_OPT_RDMA, 0}, {IBMSG_OPT_MAX_MSG_SIZE, 16384}});
  Reg &dst = alloc_region(h, 64, kW);
  Reg &src = alloc_region(h, 64, 0);
  OpRec &o = new_op(h);
  ibmsg_descriptor d;

  const fake::Stats &st = fake::stats();
  connected(h);  // both on: the device's limits (the fake's: 16) both ways
  assert_int_equal(st.connect_responder_resources, 16);
  assert_int_equal(st.connect_initiator_depth, 16);
  assert_int_equal(st.accept_responder_resources, 16);
  assert_int_equal(st.accept_initiator_depth, 16);

  Pair p = connected(h, nullptr, off);  // the client has it off
  assert_int_equal(st.connect_responder_resources, 0);
  assert_int_equal(st.connect_initiator_depth, 0);
  assert_int_equal(st.accept_responder_resources, 0);  // no more than the client asked for
  assert_int_equal(st.accept_initiator_depth, 0);
  expect_code(ibmsg_region_descriptor(&dst.r, &p.c->s, 0, 64, kW, &d), IBMSG_EOPNOTSUPP);
  d = grant(dst, *p.a, 0, 64, kW);
  expect_code(op_write(o, *p.c, src, 0, 8, d, 0), IBMSG_EOPNOTSUPP);  // this side off
  expect_code(op_write(o, *p.a, src, 0, 8, d, 0), IBMSG_EOPNOTSUPP);  // the peer off
  expect_code(send_msg(*p.c, 8, true, 3), IBMSG_OK);  // messages and immediates still work
  RUN_UNTIL(h, p.a->received == 1);

  Pair q = connected(h, off, nullptr);  // the server has it off
  assert_int_equal(st.connect_responder_resources, 16);
  assert_int_equal(st.connect_initiator_depth, 16);
  assert_int_equal(st.accept_responder_resources, 0);
  assert_int_equal(st.accept_initiator_depth, 0);
  d = grant(dst, *q.c, 0, 64, kW);
  expect_code(op_write(o, *q.c, src, 0, 8, d, 0), IBMSG_EOPNOTSUPP);
  expect_code(op_write(o, *q.a, src, 0, 8, d, 0), IBMSG_EOPNOTSUPP);
  assert_int_equal(o.posts, 0);

  // RDMA off with rendezvous (the default maximum size): reads for the large messages only.
  ibmsg_options *off_rndv = options(h, {{IBMSG_OPT_RDMA, 0}});
  Pair r = connected(h, off_rndv, nullptr);
  assert_int_equal(st.connect_responder_resources, 16);
  assert_int_equal(st.connect_initiator_depth, 16);
  expect_code(op_write(o, *r.c, src, 0, 8, d, 0), IBMSG_EOPNOTSUPP);
  assert_int_equal(o.posts, 0);
}

void atomics_on_a_device_without_them_are_eopnotsupp(void **state) {
  H *h = h_of(state);
  fake::set_atomics(false);
  Pair p = connected(h);
  Reg &dst = alloc_region(h, 64, kW | kA);
  Reg &local = alloc_region(h, 64, kLW);
  ibmsg_descriptor d = grant(dst, *p.a, 0, 64, kW | kA);
  OpRec &o = new_op(h);
  expect_code(op_cas(o, *p.c, local, 0, d, 0, 0, 1), IBMSG_EOPNOTSUPP);
  expect_code(op_fadd(o, *p.c, local, 0, d, 0, 1), IBMSG_EOPNOTSUPP);
  expect_code(op_write(o, *p.c, local, 0, 8, d, 8), IBMSG_OK);
  RUN_UNTIL(h, o.dones == 1);
  expect_code(o.status, IBMSG_OK);
}

// === 7. transport failures ====================================================================

void failed_post_rdma_returns_the_error_without_callback_and_closes(void **state) {
  H *h = h_of(state);
  Pair p = connected(h);
  Reg &dst = alloc_region(h, 64, kW);
  Reg &src = alloc_region(h, 64, 0);
  ibmsg_descriptor d = grant(dst, *p.a, 0, 64, kW);
  fake::fail_call(fake::Call::PostRdma, IBMSG_EIO);
  OpRec &o = new_op(h);
  expect_code(op_write(o, *p.c, src, 0, 8, d, 0), IBMSG_EIO);
  assert_true(o.op.status != IBMSG_EINPROGRESS);
  deregister(src);  // it was never posted: not busy
  RUN_UNTIL(h, p.c->closed && p.a->closed);
  expect_code(p.c->close_reason, IBMSG_EIO);
  assert_int_equal(o.dones, 0);
  assert_string_equal(posted(*p.c).c_str(), "");
}

void failed_post_rdma_from_the_queue_cancels_it_and_closes_with_eio(void **state) {
  H *h = h_of(state);
  ibmsg_options *co = options(h, {{IBMSG_OPT_RDMA_DEPTH, 1}});
  Pair p = connected(h, nullptr, co);
  Reg &dst = alloc_region(h, 64, kW);
  Reg &src = alloc_region(h, 64, 0);
  ibmsg_descriptor d = grant(dst, *p.a, 0, 64, kW);
  fake::pause_wire(true);
  OpRec &w1 = new_op(h), &w2 = new_op(h);
  expect_code(op_write(w1, *p.c, src, 0, 8, d, 0), IBMSG_OK);
  expect_code(op_write(w2, *p.c, src, 0, 8, d, 8), IBMSG_OK);  // waits for room in flight
  fake::fail_call(fake::Call::PostRdma, IBMSG_EIO);
  fake::pause_wire(false);  // w1 completes, w2's post fails
  RUN_UNTIL(h, p.c->closed);
  assert_string_equal(p.c->trace.c_str(), "op0=OK op1=ECANCELED closed=EIO");
}

// === 8. regions and descriptors ===============================================================

void deregister_is_ebusy_while_an_operation_uses_the_region(void **state) {
  H *h = h_of(state);
  ibmsg_options *co = options(h, {{IBMSG_OPT_RDMA_DEPTH, 1}});
  Pair p = connected(h, nullptr, co);
  Reg &dst = alloc_region(h, 64, kW);
  Reg &s1 = alloc_region(h, 64, 0);
  Reg &s2 = user_region(h, 64, 0);
  Reg &idle = alloc_region(h, 64, 0);
  ibmsg_descriptor d = grant(dst, *p.a, 0, 64, kW);
  fake::pause_wire(true);
  OpRec &w1 = new_op(h), &w2 = new_op(h);
  expect_code(op_write(w1, *p.c, s1, 0, 8, d, 0), IBMSG_OK);  // in flight
  expect_code(op_write(w2, *p.c, s2, 0, 8, d, 8), IBMSG_OK);  // queued
  expect_code(ibmsg_deregister_region(&s1.r), IBMSG_EBUSY);
  expect_code(ibmsg_deregister_region(&s2.r), IBMSG_EBUSY);
  expect_code(op_write(w1, *p.c, s1, 0, 8, d, 0), IBMSG_EINVAL);  // w1 is still posted
  deregister(idle);
  fake::pause_wire(false);
  RUN_UNTIL(h, w2.dones == 1);
  deregister(s1);
  deregister(s2);
  expect_code(ibmsg_deregister_region(&s1.r), IBMSG_EINVAL);  // not registered any more
}

void descriptors_are_cached_per_range_rights_and_connection(void **state) {
  H *h = h_of(state);
  Pair p1 = connected(h);
  Pair p2 = connected(h);  // the same loop: the same device
  Reg &r = alloc_region(h, 8192, kR | kW);
  int mrs = fake::open_objects().mrs;
  unsigned long regs = fake::stats().registrations;
  ibmsg_descriptor d1 = grant(r, *p1.a, 0, 4096, kW);
  assert_int_equal(fake::open_objects().mrs, mrs + 1);
  assert_int_equal(fake::stats().registrations, regs + 1);
  ibmsg_descriptor again = grant(r, *p1.a, 0, 4096, kW);
  assert_memory_equal(again.bytes, d1.bytes, sizeof d1.bytes);
  assert_int_equal(fake::stats().registrations, regs + 1);  // no new registration
  // Another connection of the device gets a window of its own; a device-wide grant is one for
  // every connection of the device.
  ibmsg_descriptor other_conn = grant(r, *p2.c, 0, 4096, kW);
  assert_memory_not_equal(other_conn.bytes, d1.bytes, sizeof d1.bytes);
  ibmsg_descriptor wide1 = grant(r, *p1.a, 0, 4096, kW | IBMSG_ACCESS_DEVICE_WIDE);
  ibmsg_descriptor wide2 = grant(r, *p2.c, 0, 4096, kW | IBMSG_ACCESS_DEVICE_WIDE);
  assert_memory_equal(wide1.bytes, wide2.bytes, sizeof wide1.bytes);
  assert_memory_not_equal(wide1.bytes, d1.bytes, sizeof d1.bytes);
  assert_int_equal(fake::stats().registrations, regs + 3);
  mrs += 2;
  regs += 2;
  ibmsg_descriptor by_right = grant(r, *p1.a, 0, 4096, kR);
  ibmsg_descriptor by_range = grant(r, *p1.a, 4096, 4096, kW);
  ibmsg_descriptor by_both = grant(r, *p1.a, 0, 4096, kR | kW);
  for (const ibmsg_descriptor *x : {&by_right, &by_range, &by_both})
    assert_memory_not_equal(x->bytes, d1.bytes, sizeof d1.bytes);
  assert_int_equal(fake::stats().registrations, regs + 4);
  assert_int_equal(fake::open_objects().mrs, mrs + 4);
  size_t len = 0;
  unsigned access = 0;
  expect_code(ibmsg_descriptor_info(&by_range, &len, &access), IBMSG_OK);
  assert_int_equal(len, 4096);
  assert_int_equal(access, kW);
  expect_code(ibmsg_descriptor_info(&by_both, nullptr, &access), IBMSG_OK);
  assert_int_equal(access, kR | kW);
  settle(h);  // the windows are bound
  expect_code(ibmsg_revoke_descriptor(&r.r, &d1), IBMSG_OK);
  assert_int_equal(fake::open_objects().mrs, mrs + 3);
  ibmsg_descriptor fresh = grant(r, *p1.a, 0, 4096, kW);  // a new grant, a new key
  assert_int_equal(fake::stats().registrations, regs + 5);
  assert_memory_not_equal(fresh.bytes, d1.bytes, sizeof d1.bytes);
}

void region_descriptor_refuses_bad_arguments(void **state) {
  H *h = h_of(state);
  Pair p = connected(h);
  Reg &r = alloc_region(h, 8192, kR | kW);
  ibmsg_descriptor d;
  expect_code(ibmsg_region_descriptor(&r.r, &p.a->s, 8000, 200, kW, &d), IBMSG_ERANGE);
  expect_code(ibmsg_region_descriptor(&r.r, &p.a->s, 8193, 1, kW, &d), IBMSG_ERANGE);
  expect_code(ibmsg_region_descriptor(&r.r, &p.a->s, SIZE_MAX, 2, kW, &d), IBMSG_ERANGE);
  expect_code(ibmsg_region_descriptor(&r.r, &p.a->s, 0, 0, kW, &d), IBMSG_EINVAL);
  expect_code(ibmsg_region_descriptor(&r.r, &p.a->s, 0, 8, 0, &d), IBMSG_EINVAL);
  expect_code(ibmsg_region_descriptor(&r.r, &p.a->s, 0, 8, kLW, &d), IBMSG_EINVAL);
  expect_code(ibmsg_region_descriptor(&r.r, &p.a->s, 0, 8, kW, nullptr), IBMSG_EINVAL);
  expect_code(ibmsg_region_descriptor(&r.r, &p.a->s, 0, 8, kA, &d), IBMSG_EACCES);
  expect_code(ibmsg_region_descriptor(nullptr, &p.a->s, 0, 8, kW, &d), IBMSG_EINVAL);
  expect_code(ibmsg_region_descriptor(&r.r, &p.l->s, 0, 8, kW, &d), IBMSG_ESTATE);  // listener
  ibmsg_socket never{};
  expect_code(ibmsg_region_descriptor(&r.r, &never, 0, 8, kW, &d), IBMSG_ENOTCONN);
  ibmsg_descriptor bad{};
  expect_code(ibmsg_descriptor_info(&bad, nullptr, nullptr), IBMSG_EBADDESC);
  expect_code(ibmsg_descriptor_info(nullptr, nullptr, nullptr), IBMSG_EINVAL);
}

// A listener given to any function made for connections is the wrong state: IBMSG_ESTATE from
// every one of them (1.7: some said IBMSG_EINVAL or IBMSG_ENOTCONN), with nothing written or
// posted; the connection beside it keeps working.
void every_connection_function_refuses_a_listener_with_estate(void **state) {
  H *h = h_of(state);
  Pair p = connected(h);
  Reg &r = alloc_region(h, 8192, kR | kW);
  ibmsg_socket *l = &p.l->s;
  ibmsg_buffer msg{}, from{};
  expect_code(ibmsg_alloc_msg(&msg, l, 10), IBMSG_ESTATE);
  assert_null(msg.impl);
  expect_code(ibmsg_msg_from_region(&from, l, &r.r, 0, 10), IBMSG_ESTATE);
  assert_null(from.impl);
  ibmsg_descriptor d{};
  expect_code(ibmsg_region_descriptor(&r.r, l, 0, 8, kW, &d), IBMSG_ESTATE);
  ibmsg_memory m{};
  expect_code(ibmsg_socket_memory(l, &m), IBMSG_ESTATE);
  expect_code(ibmsg_socket_memory_info(l, &m, sizeof m), IBMSG_ESTATE);
  ibmsg_stats st{};
  expect_code(ibmsg_socket_stats(l, &st, sizeof st), IBMSG_ESTATE);
  char buf[64] = "untouched";
  unsigned short port = 7;
  expect_code(ibmsg_socket_peer_address(l, buf, sizeof buf, &port), IBMSG_ESTATE);
  assert_string_equal(buf, "untouched");
  assert_int_equal(port, 7);
  expect_code(ibmsg_socket_local_address(l, buf, sizeof buf, &port), IBMSG_OK);  // its own
  // A message of the connection, posted on the listener: refused, still the application's,
  // then posted on its connection.
  int rc = IBMSG_OK;
  Out *o1 = alloc_out(*p.c, 10, &rc);
  expect_code(rc, IBMSG_OK);
  assert_non_null(o1);
  expect_code(ibmsg_post_send(l, &o1->m), IBMSG_ESTATE);
  ibmsg_request req{};
  expect_code(ibmsg_post_request(l, &o1->m, &req, 1000), IBMSG_ESTATE);
  assert_int_equal(o1->m.status, IBMSG_WAITING);
  OpRec &o = new_op(h);
  ibmsg_descriptor mine = grant(r, *p.a, 0, 4096, kW);
  expect_code(ibmsg_rdma_write(l, &o.op, &r.r, 0, 8, &mine, 0), IBMSG_ESTATE);
  expect_code(ibmsg_rdma_read(l, &o.op, &r.r, 0, 8, &mine, 0), IBMSG_ESTATE);
  assert_int_equal(ibmsg_socket_max_msg_size(l), 0);  // (a size: 0 for a listener)
  expect_code(post_out(*p.c, *o1), IBMSG_OK);
  RUN_UNTIL(h, p.a->received == 1 && o.dones == 0);
}

void region_registered_before_any_connection_is_registered_lazily(void **state) {
  H *h = h_of(state);
  Reg &early = alloc_region(h, 4096, kLW | kR);
  assert_int_equal(fake::open_objects().devices, 0);  // no device to register on yet
  assert_int_equal(fake::open_objects().mrs, 0);
  Pair p = connected(h);
  unsigned long regs = fake::stats().registrations;
  Reg &dst = alloc_region(h, 256, kW | kR);  // a device is open: registered at once
  assert_int_equal(fake::stats().registrations, regs + 1);
  ibmsg_descriptor d = grant(dst, *p.a, 0, 256, kW | kR);
  regs = fake::stats().registrations;
  pattern(early, 0, 256, 7);
  OpRec &w = new_op(h), &r = new_op(h);
  expect_code(op_write(w, *p.c, early, 0, 128, d, 0), IBMSG_OK);  // registers early now
  assert_int_equal(fake::stats().registrations, regs + 1);
  expect_code(op_read(r, *p.c, early, 1024, 128, d, 0), IBMSG_OK);  // and only once
  assert_int_equal(fake::stats().registrations, regs + 1);
  RUN_UNTIL(h, w.dones && r.dones);
  expect_code(w.status, IBMSG_OK);
  expect_code(r.status, IBMSG_OK);
  assert_memory_equal(dst.p(), early.p(), 128);
  assert_memory_equal(early.p() + 1024, early.p(), 128);
  ibmsg_descriptor e = grant(early, *p.c, 0, 64, kR);  // and it grants
  OpRec &back = new_op(h);
  expect_code(op_read(back, *p.a, dst, 128, 64, e, 0), IBMSG_OK);
  RUN_UNTIL(h, back.dones == 1);
  expect_code(back.status, IBMSG_OK);
  assert_memory_equal(dst.p() + 128, early.p(), 64);
  // Once every socket closed the loop's device goes; the regions' registrations keep the
  // device's protection domain until they are deregistered.
  expect_code(ibmsg_disconnect(&p.c->s), IBMSG_OK);
  expect_code(ibmsg_disconnect(&p.l->s), IBMSG_OK);
  RUN_UNTIL(h, p.c->closed && p.a->closed && p.l->closed);
  RUN_UNTIL(h, fake::open_objects().devices == 0);
  assert_int_equal(fake::open_objects().domains, 1);
  assert_int_equal(fake::open_objects().mrs, 2);
  deregister(early);
  assert_int_equal(fake::open_objects().domains, 1);
  deregister(dst);
  assert_int_equal(fake::open_objects().domains, 0);
  assert_int_equal(fake::open_objects().mrs, 0);
}

void destroy_event_loop_with_a_registered_region_is_ebusy(void **state) {
  H *h = h_of(state);
  Reg &r = user_region(h, 64, 0);
  expect_code(ibmsg_register_region(&h->loop, &r.r, r.own.data(), 64, 0), IBMSG_ESTATE);
  expect_code(ibmsg_destroy_event_loop(&h->loop), IBMSG_EBUSY);
  deregister(r);
  expect_code(ibmsg_destroy_event_loop(&h->loop), IBMSG_OK);
  h->loop_alive = false;
}

// Every check before posting: the call fails, nothing reaches the transport, no callback.
void checks_before_posting_refuse_and_post_nothing(void **state) {
  H *h = h_of(state);
  Pair p = connected(h);
  Reg &dst = alloc_region(h, 256, kW | kR | kA);
  Reg &lw = alloc_region(h, 256, kLW);
  Reg &ro = alloc_region(h, 256, 0);
  ibmsg_descriptor dw = grant(dst, *p.a, 0, 128, kW);
  ibmsg_descriptor dall = grant(dst, *p.a, 0, 256, kW | kR | kA);
  ibmsg_descriptor corrupt = dall;
  corrupt.bytes[9] ^= 0x10;
  OpRec &o = new_op(h);
  Conn &c = *p.c;
  const size_t posts = fake::posts().size();
  ibmsg_socket *s = &c.s;
  ibmsg_op *op = &o.op;
  // NULLs and length 0
  expect_code(ibmsg_rdma_write(nullptr, op, &lw.r, 0, 8, &dall, 0), IBMSG_EINVAL);
  expect_code(ibmsg_rdma_write(s, nullptr, &lw.r, 0, 8, &dall, 0), IBMSG_EINVAL);
  expect_code(ibmsg_rdma_write(s, op, nullptr, 0, 8, &dall, 0), IBMSG_EINVAL);
  expect_code(ibmsg_rdma_write(s, op, &lw.r, 0, 8, nullptr, 0), IBMSG_EINVAL);
  expect_code(ibmsg_rdma_read(s, op, &lw.r, 0, 0, &dall, 0), IBMSG_EINVAL);
  ibmsg_region unregistered{};
  expect_code(ibmsg_rdma_write(s, op, &unregistered, 0, 8, &dall, 0), IBMSG_EINVAL);
  // ranges
  expect_code(ibmsg_rdma_write(s, op, &lw.r, 200, 100, &dall, 0), IBMSG_ERANGE);
  expect_code(ibmsg_rdma_write(s, op, &lw.r, 257, 1, &dall, 0), IBMSG_ERANGE);
  expect_code(ibmsg_rdma_write(s, op, &lw.r, 0, 50, &dw, 100), IBMSG_ERANGE);
  expect_code(ibmsg_rdma_write(s, op, &lw.r, 0, 8, &dw, SIZE_MAX), IBMSG_ERANGE);
  expect_code(ibmsg_atomic_fadd(s, op, &lw.r, 252, &dall, 0, 1), IBMSG_ERANGE);
  expect_code(ibmsg_atomic_fadd(s, op, &lw.r, 0, &dall, 256, 1), IBMSG_ERANGE);
  // rights
  expect_code(ibmsg_rdma_read(s, op, &lw.r, 0, 8, &dw, 0), IBMSG_EACCES);
  expect_code(ibmsg_atomic_cas(s, op, &lw.r, 0, &dw, 0, 0, 1), IBMSG_EACCES);
  expect_code(ibmsg_rdma_read(s, op, &ro.r, 0, 8, &dall, 0), IBMSG_EACCES);  // no local write
  expect_code(ibmsg_atomic_fadd(s, op, &ro.r, 0, &dall, 0, 1), IBMSG_EACCES);
  // a corrupted descriptor, an unaligned atomic
  expect_code(ibmsg_rdma_write(s, op, &lw.r, 0, 8, &corrupt, 0), IBMSG_EBADDESC);
  expect_code(ibmsg_atomic_fadd(s, op, &lw.r, 0, &dall, 4, 1), IBMSG_EINVAL);
  expect_code(ibmsg_atomic_cas(s, op, &lw.r, 0, &dall, 9, 0, 1), IBMSG_EINVAL);
  // sockets: a listener, one still connecting, one never set up
  expect_code(ibmsg_rdma_write(&p.l->s, op, &lw.r, 0, 8, &dall, 0), IBMSG_ESTATE);
  Conn &connecting = client(h, port_of(*p.l));
  expect_code(ibmsg_rdma_write(&connecting.s, op, &lw.r, 0, 8, &dall, 0), IBMSG_ENOTCONN);
  ibmsg_socket never{};
  expect_code(ibmsg_rdma_write(&never, op, &lw.r, 0, 8, &dall, 0), IBMSG_ENOTCONN);
  // (a region of another loop works: test_shared_region)
  assert_int_equal(fake::posts().size(), posts);
  settle(h);
  assert_int_equal(o.dones, 0);
  assert_int_equal(o.op.status, 0);  // no refused call touched it
  assert_int_equal(c.s.status, IBMSG_CONNECTED);
  // And the same arguments, corrected, go.
  expect_code(op_write(o, c, ro, 0, 8, dw, 120), IBMSG_OK);
  RUN_UNTIL(h, o.dones == 1);
  expect_code(o.status, IBMSG_OK);
}

// === 9. random traffic ========================================================================

// Random operations and messages over a few connections, with the wire pausing, receivers
// holding messages, forged descriptors and disconnects: the teardown's checks (exactly one
// callback each, in posting order, all before connection_closed, nothing left busy or open)
// must hold whatever happened.
void random_operations_messages_and_closes_keep_every_guarantee(void **state) {
  H *h = h_of(state);
  unsigned seed = getenv("FAKE_SEED") ? unsigned(atoi(getenv("FAKE_SEED"))) : 1;
  std::mt19937 rng(seed);
  no_ban(h);  // it reconnects after violations
  ibmsg_options *o = options(h, {{IBMSG_OPT_RECV_DEPTH, 3},
                                 {IBMSG_OPT_SEND_DEPTH, 6},
                                 {IBMSG_OPT_SEND_QUEUE, 5},
                                 {IBMSG_OPT_RDMA_DEPTH, 2},
                                 {IBMSG_OPT_MAX_MSG_SIZE, 64}});
  Reg &dst = alloc_region(h, 4096, kW | kR | kA);
  Reg &src = alloc_region(h, 4096, kLW);
  std::vector<OpRec *> pool;
  auto free_op = [&]() -> OpRec * {
    for (OpRec *x : pool)
      if (x->posts == x->dones) return x;
    pool.push_back(&new_op(h));
    return pool.back();
  };
  std::map<int, int> refused;  // by code
  int posted_ops = 0, posted_msgs = 0;
  for (int round = 0; round < 6; ++round) {
    Pair p = connected(h, o, o);
    p.a->hold = rng() % 2;
    ibmsg_descriptor d = grant(dst, *p.a, 0, 4096, kW | kR | kA);
    ibmsg_descriptor forged = forge(d, [](wire::Descriptor &x) { x.length = 8192; });
    for (int step = 0; step < 300 && !p.c->closed; ++step) {
      OpRec &x = *free_op();
      size_t off = 8 * (rng() % 500), len = 1 + rng() % 64;
      int rc = IBMSG_OK;
      const int ops_before = p.c->ops_posted, msgs_before = p.c->msgs_posted + p.a->msgs_posted;
      switch (rng() % 12) {
        case 0:
        case 1: rc = op_write(x, *p.c, src, off, len, d, off); break;
        case 2: rc = op_read(x, *p.c, src, off, len, d, (off + 64) % 4000); break;
        case 3: rc = op_write_imm(x, *p.c, src, off, len, d, off, uint32_t(rng())); break;
        case 4: rc = op_fadd(x, *p.c, src, off, d, off, 1); break;
        case 5: rc = op_cas(x, *p.c, src, off, d, off, 0, 1); break;
        case 6:
        case 7:
          rc = send_msg(rng() % 2 ? *p.c : *p.a, rng() % 65, rng() % 2, uint32_t(rng()));
          break;
        case 8: fake::pause_wire(rng() % 3 == 0); break;
        case 9: free_held(*p.a, rng() % 3); settle(h, 1); break;
        case 10: settle(h, 1 + rng() % 3); break;
        case 11:
          switch (rng() % 40) {
            case 0: ibmsg_disconnect(&p.c->s); break;
            case 1: ibmsg_disconnect(&p.a->s); break;
            case 2: rc = op_write(x, *p.c, src, 0, 8, forged, 4096); break;
            default: break;
          }
          break;
      }
      posted_ops += p.c->ops_posted - ops_before;
      posted_msgs += p.c->msgs_posted + p.a->msgs_posted - msgs_before;
      if (rc != IBMSG_OK) {
        if (rc != IBMSG_EAGAIN && rc != IBMSG_ENOTCONN)
          fail_msg("round %d step %d: %s (seed %u)", round, step, ibmsg_err_name(rc), seed);
        ++refused[rc];
      }
    }
    fake::pause_wire(false);
    free_held(*p.a);
    p.a->hold = false;
  }
  fake::pause_wire(false);
  settle(h, 20);
  std::map<int, int> statuses;
  for (OpRec *x : pool) ++statuses[x->status];
  if (getenv("FAKE_DEBUG")) {
    fprintf(stderr, "seed %u: %d operations and %d messages posted, %lu executed; refused:", seed,
            posted_ops, posted_msgs, fake::stats().rdma_ops);
    for (auto &r : refused) fprintf(stderr, " %s %d", ibmsg_err_name(r.first), r.second);
    fprintf(stderr, "; closes:");
    for (Conn &c : h->conns)
      if (c.closed) fprintf(stderr, " %s", short_name(c.close_reason).c_str());
    fprintf(stderr, "\n");
  }
  // The run must have done something of each kind to mean anything.
  assert_true(posted_ops > 60);
  assert_true(posted_msgs > 30);
  assert_true(fake::stats().rdma_ops > 50);
}

}  // namespace

#define T(name) cmocka_unit_test_setup_teardown(name, setup, teardown)

int main(void) {
  const struct CMUnitTest tests[] = {
      // the operations
      T(write_lands_in_the_granted_bytes_only),
      T(op_status_is_einprogress_while_posted),
      T(read_brings_the_peers_bytes),
      T(atomics_compare_swap_and_fetch_add_host_order_words),
      T(bytes_of_earlier_writes_are_visible_when_a_message_or_write_imm_arrives),
      T(an_operation_can_be_posted_again_from_its_own_done_callback),
      // send order
      T(operation_posted_while_a_message_waits_for_credits_goes_after_it),
      T(messages_wait_behind_operations_waiting_for_room_in_flight),
      T(send_queue_bound_counts_messages_and_operations_together),
      // close paths and remote access errors
      T(disconnect_cancels_every_operation_once_before_connection_closed),
      T(peer_disconnect_cancels_operations_and_reports_econnreset),
      T(remote_access_error_closes_only_that_connection),
      T(forged_descriptors_are_refused_by_the_peer),
      T(revoked_descriptor_makes_the_peers_next_operation_fail),
      T(deregistering_a_region_revokes_its_descriptors),
      T(window_key_fails_on_another_connection),
      T(device_wide_grant_works_on_every_connection),
      T(revoke_while_binding_drops_the_window_after_the_bind),
      T(close_releases_the_connections_windows),
      T(grant_before_established_is_bound_when_up),
      T(grants_beyond_the_binds_in_flight_are_eagain),
      T(without_type2_windows_only_device_wide_grants),
      T(listener_refuses_a_violators_address_while_banned),
      // write with immediate
      T(write_imm_waits_for_a_data_credit_like_a_message),
      T(many_write_imms_through_two_receive_buffers_all_arrive),
      T(write_imm_from_a_raw_peer_reports_imm_and_length_and_returns_the_credit),
      T(write_imm_to_a_side_whose_peer_did_not_offer_rdma_is_eproto),
      T(write_imm_to_a_side_with_rdma_off_is_eproto),
      T(write_imm_beyond_the_data_credits_is_eproto),
      // message immediates
      T(message_immediates_round_trip),
      T(message_immediate_travels_as_opcode_5_with_a_little_endian_trailer),
      T(message_immediate_from_a_raw_peer_arrives),
      T(message_immediate_without_room_for_its_trailer_is_eproto),
      T(message_immediate_from_a_peer_that_did_not_offer_it_is_eproto),
      T(post_send_imm_to_a_peer_without_immediates_is_eopnotsupp),
      // negotiation
      T(operations_to_a_peer_without_rdma_are_eopnotsupp),
      T(rdma_off_on_either_side_turns_operations_off_and_offers_no_read_resources),
      T(atomics_on_a_device_without_them_are_eopnotsupp),
      // transport failures
      T(failed_post_rdma_returns_the_error_without_callback_and_closes),
      T(failed_post_rdma_from_the_queue_cancels_it_and_closes_with_eio),
      // regions and descriptors
      T(deregister_is_ebusy_while_an_operation_uses_the_region),
      T(descriptors_are_cached_per_range_rights_and_connection),
      T(region_descriptor_refuses_bad_arguments),
      T(every_connection_function_refuses_a_listener_with_estate),
      T(region_registered_before_any_connection_is_registered_lazily),
      T(destroy_event_loop_with_a_registered_region_is_ebusy),
      T(checks_before_posting_refuse_and_post_nothing),
      // random
      T(random_operations_messages_and_closes_keep_every_guarantee),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
