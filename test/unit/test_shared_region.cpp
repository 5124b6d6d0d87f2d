// test_shared_region.cpp - one region for every loop of the process on a device (issue 25), over
// the fake transport (test/fake), through the public C API: the loops' device objects share the
// device's protection domain; a region registered once on loop A serves the connections of loop
// B (messages from it, rendezvous into it, operations, descriptors granted on B's connections)
// with one registration; deregistration on A waits for B's grants; the domain outlives the loops'
// device objects while a registration holds it, and goes with the last one.
//
// Both loops run on the test's thread (the fake is single-threaded); the threads are
// test/integration/test_shared_region's. The teardown is test/fake/harness.hpp's.
#include "harness.hpp"  // the fixture: H, Conn, OpRec, Reg, the callbacks, setup and teardown

#include <cstring>

namespace fake = ibmsg::fake;
using namespace ibmsg::fake::harness;

namespace {

constexpr unsigned kR = IBMSG_ACCESS_REMOTE_READ;
constexpr unsigned kW = IBMSG_ACCESS_REMOTE_WRITE;
constexpr unsigned kLW = IBMSG_ACCESS_LOCAL_WRITE;
constexpr size_t kMiB = size_t(1) << 20;

int setup(void **state) {
  return fixture_setup(state, [](H *h) {
    h->payload = Payload::SeqNumber;
    h->sent_in_order = true;
    h->sent_before_closed = true;
    return 0;
  });
}

Reg &region_on(H *h, ibmsg_event_loop *loop, size_t len, unsigned access) {
  h->regs.emplace_back();
  Reg &g = h->regs.back();
  expect_code(ibmsg_alloc_region(loop, &g.r, len, access), IBMSG_OK);
  g.live = true;
  return g;
}

// A connection of loop B (the client, on h->loop2) to a listener of loop A (h->loop).
Pair cross_pair(H *h) {
  init_loop(h, &h->loop2);
  return connected(h, nullptr, nullptr, &h->loop2);
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

// Sends the connection's next message from region bytes [off, off + size) (filled as it).
int send_from(Conn &c, Reg &r, size_t off, size_t size) {
  Out &o = c.outs.emplace_back();
  int rc = ibmsg_msg_from_region(&o.m, &c.s, &r.r, off, size);
  if (rc) return rc;
  o.allocated = true;
  o.m.user_data = &o;
  fill(&o.m, c.next_send_seq, c.h->payload);
  return post_out(c, o);
}

unsigned long registrations() { return fake::stats().registrations; }

// === the region of loop A on loop B's connection ==============================================

void a_region_of_loop_a_serves_a_connection_of_loop_b(void **state) {
  H *h = h_of(state);
  Reg &shared = region_on(h, &h->loop, 64 * 1024, kLW | kR | kW);  // before any device opened
  Pair p = cross_pair(h);  // p.c on loop B, p.a on loop A
  // Two loops, two device objects, one protection domain.
  assert_int_equal(fake::open_objects().devices, 2);
  assert_int_equal(fake::open_objects().domains, 1);
  // (the connections' own send buffers first: registered on their devices)
  expect_code(send_msg(*p.c, 64), IBMSG_OK);
  expect_code(send_msg(*p.a, 64), IBMSG_OK);
  RUN_UNTIL(h, p.a->received == 1 && p.c->received == 1);
  const unsigned long regs0 = registrations();
  // Messages from it on B's connection, and on A's: registered once, lazily, on the shared
  // domain.
  expect_code(send_from(*p.c, shared, 0, 100), IBMSG_OK);
  expect_code(send_from(*p.c, shared, 4096, 300), IBMSG_OK);
  expect_code(send_from(*p.a, shared, 8192, 200), IBMSG_OK);
  expect_code(ibmsg_deregister_region(&shared.r), IBMSG_EBUSY);  // B's messages point into it
  RUN_UNTIL(h, p.a->received == 3 && p.c->sent_ok == 3 && p.c->received == 2);
  assert_int_equal(registrations() - regs0, 1);
  // A write from it on B's connection, into a region of loop A that A's connection granted.
  Reg &dst = region_on(h, &h->loop, 4096, kW);
  ibmsg_descriptor d;
  expect_code(ibmsg_region_descriptor(&dst.r, &p.a->s, 0, 4096, kW, &d), IBMSG_OK);
  memset(shared.p() + 8192, 0x5c, 512);
  OpRec &w = new_op(h);
  expect_code(counted(w, *p.c, ibmsg_rdma_write(&p.c->s, &w.op, &shared.r, 8192, 512, &d, 64)),
              IBMSG_OK);
  RUN_UNTIL(h, w.dones == 1);
  expect_code(w.status, IBMSG_OK);
  assert_memory_equal(dst.p() + 64, shared.p() + 8192, 512);
  // A's connection uses the same registration: nothing registered for the local side.
  const unsigned long regs1 = registrations();
  Reg &back = region_on(h, &h->loop2, 4096, kLW | kW);  // and a region of B, granted on B
  ibmsg_descriptor db;
  expect_code(ibmsg_region_descriptor(&back.r, &p.c->s, 0, 4096, kW, &db), IBMSG_OK);
  OpRec &w2 = new_op(h);
  expect_code(counted(w2, *p.a, ibmsg_rdma_write(&p.a->s, &w2.op, &shared.r, 8192, 512, &db, 0)),
              IBMSG_OK);
  RUN_UNTIL(h, w2.dones == 1);
  expect_code(w2.status, IBMSG_OK);
  assert_memory_equal(back.p(), shared.p() + 8192, 512);
  assert_int_equal(registrations() - regs1, 2);  // back's own and its grant's, none of shared's
  assert_int_equal(fake::open_objects().domains, 1);
}

void a_descriptor_granted_on_loop_b_holds_deregistration_on_loop_a(void **state) {
  H *h = h_of(state);
  Pair p = cross_pair(h);
  Reg &shared = region_on(h, &h->loop, 4096, kLW | kR);
  for (size_t i = 0; i < 4096; ++i) shared.p()[i] = uint8_t(i * 13 + 1);
  // Granted to the peer of B's connection (bound on its queue pair), read by that peer.
  ibmsg_descriptor d;
  expect_code(ibmsg_region_descriptor(&shared.r, &p.c->s, 1024, 256, kR, &d), IBMSG_OK);
  Reg &dst = region_on(h, &h->loop, 4096, kLW);
  OpRec &r = new_op(h);
  expect_code(counted(r, *p.a, ibmsg_rdma_read(&p.a->s, &r.op, &dst.r, 0, 256, &d, 0)), IBMSG_OK);
  RUN_UNTIL(h, r.dones == 1);
  expect_code(r.status, IBMSG_OK);
  assert_memory_equal(dst.p(), shared.p() + 1024, 256);
  // Loop A cannot drop a grant of loop B's connection: deregistration waits for it.
  expect_code(ibmsg_deregister_region(&shared.r), IBMSG_EBUSY);
  expect_code(ibmsg_revoke_descriptor(&shared.r, &d), IBMSG_OK);  // (loop B's thread)
  expect_code(ibmsg_deregister_region(&shared.r), IBMSG_OK);
  shared.live = false;
  // A device-wide grant made through B's connection holds only the shared domain: loop A's
  // deregistration drops it (its key then fails); B's connection closing drops a grant of its
  // own connection.
  Reg &wide = region_on(h, &h->loop, 4096, kR);
  expect_code(ibmsg_region_descriptor(&wide.r, &p.c->s, 0, 64, kR | IBMSG_ACCESS_DEVICE_WIDE, &d),
              IBMSG_OK);
  const int before = fake::open_objects().mrs;
  expect_code(ibmsg_deregister_region(&wide.r), IBMSG_OK);
  wide.live = false;
  assert_int_equal(before - fake::open_objects().mrs, 2);  // the region's and the grant's
  Reg &again = region_on(h, &h->loop, 4096, kR);
  expect_code(ibmsg_region_descriptor(&again.r, &p.c->s, 0, 64, kR, &d), IBMSG_OK);
  expect_code(ibmsg_deregister_region(&again.r), IBMSG_EBUSY);
  expect_code(ibmsg_disconnect(&p.c->s), IBMSG_OK);
  RUN_UNTIL(h, p.c->closed && p.a->closed);
  expect_code(ibmsg_deregister_region(&again.r), IBMSG_OK);
  again.live = false;
}

void a_rendezvous_of_loop_b_lands_in_a_region_of_loop_a(void **state) {
  H *h = h_of(state);
  static ibmsg_region *target;
  static int rc;
  Reg &shared = region_on(h, &h->loop, 2 * kMiB, kLW);
  target = &shared.r;
  rc = -1;
  init_loop(h, &h->loop2);
  h->loop2.message_incoming = [](ibmsg_socket *, ibmsg_incoming *in) {
    rc = ibmsg_incoming_to_region(in, target, 4096);
  };
  Pair p = connected(h, nullptr, nullptr, &h->loop2);  // the receiver p.c on loop B
  p.c->hold = true;
  expect_code(send_msg(*p.a, 300000), IBMSG_OK);
  RUN_UNTIL(h, p.c->received == 1 && p.a->sent_ok == 1);
  expect_code(rc, IBMSG_OK);
  assert_true(p.c->held[0].m->data == shared.p() + 4096);
  assert_true(p.c->held[0].m->flags & IBMSG_MSG_REGION);
  expect_code(ibmsg_deregister_region(&shared.r), IBMSG_EBUSY);  // B holds the message
  free_held(*p.c);
  expect_code(ibmsg_deregister_region(&shared.r), IBMSG_OK);
  shared.live = false;
}

// === the shared protection domain's lifetime ==================================================

void the_domain_outlives_the_loops_devices_while_a_region_holds_it(void **state) {
  H *h = h_of(state);
  Reg &shared = region_on(h, &h->loop, 4096, kLW);
  assert_int_equal(fake::open_objects().domains, 0);  // no device yet: registered lazily
  Pair p = cross_pair(h);
  expect_code(send_from(*p.c, shared, 0, 64), IBMSG_OK);
  RUN_UNTIL(h, p.a->received == 1 && p.c->sent_ok == 1);
  expect_code(ibmsg_disconnect(&p.c->s), IBMSG_OK);
  expect_code(ibmsg_disconnect(&p.l->s), IBMSG_OK);
  RUN_UNTIL(h, p.c->closed && p.a->closed && p.l->closed);
  RUN_UNTIL(h, fake::open_objects().devices == 0);
  // Loop B goes although its connection used A's region; A's region keeps the domain.
  expect_code(ibmsg_destroy_event_loop(&h->loop2), IBMSG_OK);
  h->loop2_alive = false;
  assert_int_equal(fake::open_objects().domains, 1);
  assert_int_equal(fake::open_objects().mrs, 1);
  expect_code(ibmsg_destroy_event_loop(&h->loop), IBMSG_EBUSY);  // its region is registered
  expect_code(ibmsg_deregister_region(&shared.r), IBMSG_OK);
  shared.live = false;
  assert_int_equal(fake::open_objects().domains, 0);
  assert_int_equal(fake::open_objects().mrs, 0);
}

void a_removed_device_keeps_its_domain_until_the_region_goes(void **state) {
  H *h = h_of(state);
  Reg &shared = region_on(h, &h->loop, 4096, kLW);
  Pair p = cross_pair(h);
  expect_code(send_from(*p.c, shared, 0, 64), IBMSG_OK);
  RUN_UNTIL(h, p.a->received == 1 && p.c->sent_ok == 1);
  fake::remove_device();
  RUN_UNTIL(h, p.c->closed && p.a->closed);
  expect_code(ibmsg_disconnect(&p.l->s), IBMSG_OK);
  RUN_UNTIL(h, p.l->closed);
  RUN_UNTIL(h, fake::open_objects().devices == 0);
  assert_int_equal(fake::open_objects().domains, 1);
  const unsigned long rescans = fake::stats().rescans;
  expect_code(ibmsg_deregister_region(&shared.r), IBMSG_OK);
  shared.live = false;
  assert_int_equal(fake::open_objects().domains, 0);
  assert_true(fake::stats().rescans > rescans);  // the removal completes now
}

}  // namespace

int main() {
#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)
  const struct CMUnitTest tests[] = {
      T(a_region_of_loop_a_serves_a_connection_of_loop_b),
      T(a_descriptor_granted_on_loop_b_holds_deregistration_on_loop_a),
      T(a_rendezvous_of_loop_b_lands_in_a_region_of_loop_a),
      T(the_domain_outlives_the_loops_devices_while_a_region_holds_it),
      T(a_removed_device_keeps_its_domain_until_the_region_goes),
  };
#undef T
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
