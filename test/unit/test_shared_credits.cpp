// test_shared_credits.cpp - data credits from a shared receive queue (src/shared_credits.hpp),
// proven by a randomized simulation: many peers stream bursts at one receiver whose application
// holds and frees buffers at random, with messages and credit updates in flight both ways (in
// order per connection, as on an RC queue pair), connections closing midway. After every step:
// no arrival without a posted buffer or without a credit (never RNR, never a protocol error),
// the receiver's count of each peer's credits matches what the peer holds plus what is in
// flight, and the pool never promises more than it has. At the end every stream has gone through
// (no starvation, no deadlock) and every connection holds exactly its base again.
#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <csetjmp>
extern "C" {  // cmocka.h 1.1 has no extern "C" of its own
#include <cmocka.h>
}

#include <algorithm>
#include <deque>
#include <random>
#include <vector>

#include "shared_credits.hpp"

using ibmsg::ShareConn;
using ibmsg::SharedCredits;

namespace {

void join_reserves_the_base_and_fails_without_it(void **) {
  SharedCredits pool(2, 8);
  ShareConn a, b;
  assert_false(pool.join(&a));  // no buffers yet
  pool.add_buffers(3);
  assert_true(pool.join(&a));
  assert_int_equal(a.owed, 2);
  assert_false(pool.join(&b));  // one left, base is 2
  pool.add_buffers(1);
  assert_true(pool.join(&b));
  assert_int_equal(pool.unassigned(), 0);
  assert_int_equal(pool.take_owed(&a), 2);
  assert_int_equal(a.granted, 2);
  // An arrival beyond the credits is refused.
  assert_true(pool.on_arrival(&a, false));
  assert_true(pool.on_arrival(&a, false));
  assert_false(pool.on_arrival(&a, false));
  assert_false(pool.on_arrival(&b, false));  // b's credits were never sent
  // Freed buffers go back to a first (its base), then stay in the pool.
  assert_ptr_equal(pool.on_freed(&a), &a);
  assert_ptr_equal(pool.on_freed(&a), &a);
  assert_int_equal(a.owed, 2);
  pool.leave(&a);
  assert_int_equal(pool.unassigned(), 2);
  assert_null(pool.on_freed(nullptr));  // not a connection any more: nothing happens
}

void wants_without_a_message_gets_a_unit_or_waits(void **) {
  SharedCredits pool(1, 3);
  ShareConn a, b;
  pool.add_buffers(3);
  assert_true(pool.join(&a));
  assert_true(pool.join(&b));
  pool.take_owed(&a);
  pool.take_owed(&b);
  // a's peer used its credit and says (a credit-only message) that more waits: a free unit.
  assert_true(pool.on_arrival(&a, false));
  pool.on_wants(&a);
  assert_int_equal(a.owed, 1);
  assert_int_equal(pool.unassigned(), 0);
  // b's the same, with the pool empty: b waits, and gets the next unit that is free.
  assert_true(pool.on_arrival(&b, false));
  pool.on_wants(&b);
  assert_int_equal(b.owed, 0);
  assert_int_equal(pool.waiting(), 1);
  // a's buffer comes back: a holds its base (the unit it got), so the unit goes to b.
  assert_ptr_equal(pool.on_freed(&a), &b);
  assert_int_equal(b.owed, 1);
  assert_int_equal(pool.waiting(), 1);  // b still wants more: in turn, up to its cap
  // Up to the cap and no further.
  pool.take_owed(&a);
  pool.add_buffers(5);
  for (int i = 0; i < 4; ++i) pool.on_wants(&a);
  assert_int_equal(a.total(), pool.cap());
  assert_int_equal(pool.unassigned(), 3);
}

void waiting_connections_are_served_in_turn(void **) {
  SharedCredits pool(1, 4);
  ShareConn a, b, c;
  pool.add_buffers(3);
  for (ShareConn *x : {&a, &b, &c}) {
    assert_true(pool.join(x));
    pool.take_owed(x);
  }
  // All three send, wanting more; the pool is empty: they wait, in order.
  assert_true(pool.on_arrival(&a, true));
  assert_true(pool.on_arrival(&b, true));
  assert_true(pool.on_arrival(&c, true));
  assert_int_equal(pool.waiting(), 3);
  // Each freed buffer first refills its own connection to the base...
  assert_ptr_equal(pool.on_freed(&a), &a);
  assert_ptr_equal(pool.on_freed(&b), &b);
  assert_ptr_equal(pool.on_freed(&c), &c);
  // ...and extra buffers go to the waiting ones in turn.
  pool.add_buffers(4);
  assert_ptr_equal(pool.serve_waiting(), &a);
  assert_ptr_equal(pool.serve_waiting(), &b);
  assert_ptr_equal(pool.serve_waiting(), &c);
  assert_ptr_equal(pool.serve_waiting(), &a);
  assert_null(pool.serve_waiting());  // the pool is empty
  assert_int_equal(a.total(), 3);
  // A connection that says it wants no more leaves the queue; one that gives back too.
  pool.take_owed(&b);
  assert_true(pool.on_arrival(&b, false));
  pool.take_owed(&c);
  assert_true(pool.on_given_back(&c, 1));
  assert_false(pool.on_given_back(&c, 1));  // below its base
  assert_int_equal(pool.waiting(), 1);  // a
}

void give_back_beyond_what_was_granted_is_refused(void **) {
  SharedCredits pool(2, 8);
  ShareConn a;
  pool.add_buffers(10);
  assert_true(pool.join(&a));
  pool.take_owed(&a);
  assert_false(pool.on_given_back(&a, 1));  // it holds only its base
  assert_true(pool.on_arrival(&a, true));  // wants: gets one at once (the pool has units)
  assert_int_equal(a.owed, 1);
  pool.take_owed(&a);
  assert_true(pool.on_given_back(&a, 0));
  assert_false(pool.on_given_back(&a, 3));
  assert_false(pool.on_given_back(&a, 1));  // granted 2: it would go below its base
  assert_true(pool.on_arrival(&a, true));
  pool.take_owed(&a);  // 2 granted + the one it got
  assert_int_equal(a.granted, 2);
  // Wanting more, it is owed more; a give-back says nothing waits: what it is owed above the
  // base goes back to the pool, and it wants nothing any more.
  pool.on_wants(&a);
  pool.on_wants(&a);
  assert_int_equal(a.owed, 2);
  pool.take_owed(&a);
  pool.on_wants(&a);  // owed 1, granted 4
  assert_int_equal(a.owed, 1);
  const uint64_t before = pool.unassigned();
  assert_true(pool.on_given_back(&a, 2));
  assert_int_equal(a.granted, 2);
  assert_int_equal(a.owed, 0);
  assert_false(a.wants);
  assert_int_equal(pool.unassigned(), before + 3);
  assert_null(pool.on_freed(&a));  // not wanting, at its base: the unit stays in the pool
}

// --- the simulation -----------------------------------------------------------------------------

struct ToRx {
  bool data;       // a data message (else a give-back)
  bool wants;      // data: more wait behind it
  uint32_t n = 0;  // give-back: credits given back
};

struct Peer {
  ShareConn share;
  bool open = true;
  uint32_t data = 0;       // credits the peer holds
  uint64_t to_send = 0;    // messages of its stream not yet queued
  uint32_t queued = 0;     // messages in its send queue
  std::deque<ToRx> to_rx;  // in flight to the receiver, in order
  std::deque<uint32_t> to_peer;  // credit updates in flight to the peer, in order
  uint64_t delivered = 0;
};

struct Sim {
  std::mt19937 rng;
  SharedCredits pool;
  std::vector<Peer> peers;
  std::vector<int> held;  // the connection of each message the application holds (-1: closed)
  uint64_t buffers = 0;   // ever added
  uint32_t base, cap;
  int hold_max;           // the application holds at most this many
  Sim(unsigned seed, uint32_t b, uint32_t c, int n, uint64_t extra, uint64_t per_peer, int hmax)
      : rng(seed), pool(b, c), peers(size_t(n)), base(b), cap(c), hold_max(hmax) {
    pool.add_buffers(uint32_t(extra));
    buffers = extra;
    for (Peer &p : peers) {
      pool.add_buffers(b);  // the pool grows by the base with each connection
      buffers += b;
      assert_true(pool.join(&p.share));
      p.to_peer.push_back(pool.take_owed(&p.share));  // in the hello
      p.to_send = per_peer;
    }
  }
  uint32_t r(uint32_t n) { return uint32_t(rng() % n); }

  void peer_give_back(Peer &p) {
    if (p.queued == 0 && p.data > base) {
      p.to_rx.push_back(ToRx{false, false, p.data - base});
      p.data = base;
    }
  }
  void send_credits(Peer &p) {
    uint32_t n = pool.take_owed(&p.share);
    if (n) p.to_peer.push_back(n);
  }
  void serve() {
    while (ShareConn *w = pool.serve_waiting()) (void)w;
  }

  Peer *last = nullptr;  // the peer of the last step

  // One random step; false if nothing could happen.
  bool step() {
    const uint32_t kind = r(7);
    Peer &p = peers[r(uint32_t(peers.size()))];
    last = &p;
    switch (kind) {
      case 0:  // a peer starts a burst
        if (!p.open || p.queued || !p.to_send) return false;
        p.queued = uint32_t(std::min<uint64_t>(p.to_send, 1 + r(r(2) ? 4 : 64)));
        p.to_send -= p.queued;
        return true;
      case 1:  // a peer sends what its credits allow
        if (!p.open || !p.queued || !p.data) return false;
        --p.data;
        --p.queued;
        p.to_rx.push_back(ToRx{true, p.queued > 0, 0});
        peer_give_back(p);
        return true;
      case 2: {  // the receiver gets a peer's next message
        if (!p.open || p.to_rx.empty()) return false;
        ToRx m = p.to_rx.front();
        p.to_rx.pop_front();
        if (m.data) {
          if (pool.free_buffers() == 0) fail_msg("RNR: a message found no posted buffer");
          if (!pool.on_arrival(&p.share, m.wants)) fail_msg("a message without a credit");
          held.push_back(int(&p - &peers[0]));
          ++p.delivered;
        } else {
          if (!pool.on_given_back(&p.share, m.n)) fail_msg("a give-back of %u refused", m.n);
          serve();
        }
        return true;
      }
      case 3: {  // the application frees a buffer (more eagerly when it holds many)
        if (held.empty()) return false;
        if (int(held.size()) < hold_max && r(3) != 0) return false;
        size_t i = r(uint32_t(held.size()));
        int who = held[i];
        held[i] = held.back();
        held.pop_back();
        ShareConn *c = who >= 0 && peers[size_t(who)].open ? &peers[size_t(who)].share : nullptr;
        pool.on_freed(c);
        return true;
      }
      case 4:  // the receiver sends a peer the credits it owes it
        if (!p.open || !p.share.owed) return false;
        send_credits(p);
        return true;
      case 5: {  // a credit update reaches the peer
        if (!p.open || p.to_peer.empty()) return false;
        p.data += p.to_peer.front();
        p.to_peer.pop_front();
        if (p.data > cap) fail_msg("a peer holds %u credits, above the cap %u", p.data, cap);
        peer_give_back(p);
        return true;
      }
      default:  // rarely, a connection closes (its QP gone: nothing in flight arrives)
        if (!p.open || r(2000)) return false;
        p.open = false;
        p.to_rx.clear();
        p.to_peer.clear();
        pool.leave(&p.share);
        for (int &h : held)
          if (h == int(&p - &peers[0])) h = -1;
        serve();
        return true;
    }
  }

  // The pool's invariants, and one peer's book against what the peer holds and what is in flight.
  void check_pool() {
    if (pool.assigned() > pool.free_buffers())
      fail_msg("the pool promised %llu credits with %llu buffers posted",
               (unsigned long long)pool.assigned(), (unsigned long long)pool.free_buffers());
    if (pool.free_buffers() + held.size() != buffers)
      fail_msg("buffers: %llu posted + %zu held != %llu",
               (unsigned long long)pool.free_buffers(), held.size(), (unsigned long long)buffers);
  }
  void check_peer(const Peer &p) {
    if (!p.open) return;
    uint64_t peer_side = p.data;
    for (uint32_t n : p.to_peer) peer_side += n;
    for (const ToRx &m : p.to_rx) peer_side += m.data ? 1 : m.n;
    if (peer_side != p.share.granted)
      fail_msg("the receiver counts %u credits granted, the peer side %llu", p.share.granted,
               (unsigned long long)peer_side);
    if (p.share.total() > cap) fail_msg("a connection has %u credits, above the cap", p.share.total());
  }
  void check() {
    check_pool();
    for (const Peer &p : peers) check_peer(p);
  }

  bool done() const {
    for (const Peer &p : peers)
      if (p.open && (p.to_send || p.queued || !p.to_rx.empty() || !p.to_peer.empty() || p.share.owed))
        return false;
    return held.empty();
  }
};

// many: thousands of peers. A step changes the pool and one peer, so after each step the pool
// and that peer are checked, and every peer every 65536 steps and at the end (checking all of
// them after each step would cost peers x steps); whether all is done is asked every 1024 steps
// and before calling the run stuck. The steps a peer with nothing to do draws are many more
// with many peers: the limits grow with them.
void simulate(unsigned seed, uint32_t base, uint32_t cap, int n, uint64_t extra, uint64_t per_peer,
              int hold_max, bool many = false) {
  Sim s(seed, base, cap, n, extra, per_peer, hold_max);
  uint64_t steps = 0, idle = 0;
  const uint64_t max_steps = many ? 2000000000ull : 50000000, max_idle = many ? 100000000 : 1000000;
  for (;;) {
    if ((!many || (steps & 1023) == 0) && s.done()) break;
    if (++steps > max_steps) fail_msg("seed %u: no end after %llu steps", seed, (unsigned long long)steps);
    if (s.step()) {
      idle = 0;
      if (!many) {
        s.check();
      } else {
        s.check_pool();
        s.check_peer(*s.last);
        if ((steps & 65535) == 0) s.check();
      }
    } else if (++idle > max_idle) {
      if (s.done()) break;
      fail_msg("seed %u: stuck (deadlock) after %llu steps", seed, (unsigned long long)steps);
    }
  }
  s.check();
  if (many) {
    uint64_t delivered = 0, open = 0;
    for (const Peer &p : s.peers) {
      delivered += p.delivered;
      open += p.open;
    }
    print_message("seed %u: %d peers (%llu open at the end), %llu messages delivered in %llu steps\n",
                  seed, n, (unsigned long long)open, (unsigned long long)delivered,
                  (unsigned long long)steps);
  }
  // Every open stream went through, and every connection is back to its base.
  for (const Peer &p : s.peers) {
    if (!p.open) continue;
    assert_true(p.delivered == per_peer);
    if (p.share.total() != base || p.data != base)
      fail_msg("seed %u: a connection ends with %u credits (the peer holds %u), base %u", seed,
               p.share.total(), p.data, base);
  }
  assert_int_equal(s.pool.waiting(), 0);
}

void simulation_many_peers_small_pool(void **) {
  for (unsigned seed = 1; seed <= 20; ++seed) simulate(seed, 2, 16, 50, 32, 300, 40);
}

void simulation_application_holds_much(void **) {
  for (unsigned seed = 100; seed < 110; ++seed) simulate(seed, 1, 32, 20, 64, 500, 80);
}

void simulation_base_only_pool(void **) {
  // No buffers beyond the bases: every connection lives on its base.
  for (unsigned seed = 200; seed < 210; ++seed) simulate(seed, 2, 8, 10, 0, 300, 5);
}

void simulation_large_pool_few_peers(void **) {
  for (unsigned seed = 300; seed < 305; ++seed) simulate(seed, 4, 64, 3, 512, 3000, 400);
}

// Ten thousand connections of one pool (issue 27): the base of 2 each, the spare of 8 connections'
// cap (32) as the pool keeps it (recv.cpp, shared_limit), the application holding up to 500 of
// their messages; each peer sends 4 messages in bursts. Every message arrives on a credit and
// a posted buffer, and every connection ends on its base.
void simulation_ten_thousand_peers(void **) {
  for (unsigned seed = 400; seed < 402; ++seed) simulate(seed, 2, 32, 10000, 8 * 32, 4, 500, true);
}

}  // namespace

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(join_reserves_the_base_and_fails_without_it),
      cmocka_unit_test(waiting_connections_are_served_in_turn),
      cmocka_unit_test(wants_without_a_message_gets_a_unit_or_waits),
      cmocka_unit_test(give_back_beyond_what_was_granted_is_refused),
      cmocka_unit_test(simulation_many_peers_small_pool),
      cmocka_unit_test(simulation_application_holds_much),
      cmocka_unit_test(simulation_base_only_pool),
      cmocka_unit_test(simulation_large_pool_few_peers),
      cmocka_unit_test(simulation_ten_thousand_peers),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
