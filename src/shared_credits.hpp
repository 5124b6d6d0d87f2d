// Data credits from a shared receive queue (pure logic, no verbs): the receiving side of many
// connections that share one pool of posted receive buffers (an SRQ per device and loop), so
// that memory does not grow with connections x depth, while no message ever finds no buffer
// (never RNR) and credits go where the traffic is.
//
// The rules (ibmsg(7) will say the same):
// - Every message a peer sends consumes one buffer of the pool. Credit-only messages have their
//   own, fixed, per-connection credits (re-granted as soon as one is consumed, as today) and are
//   left out here: the pool holds ctrl_depth buffers per connection for them on top.
// - Invariant: the credits granted to the peers and not yet used, plus those reserved for them
//   and not yet sent (owed), never exceed the posted buffers not yet consumed. An arrival consumes
//   one of each; a buffer the application frees is posted again and becomes one unit to give.
// - Each connection keeps a base of credits it always gets back; beyond that, up to its cap,
//   credits go to connections that say they have more to send ("wants": a bit on each message),
//   first-come first-served among those waiting, and otherwise stay with the connection that
//   used them while it keeps wanting. The cap counts the buffers of its messages that the
//   application holds too: a peer whose messages are not consumed stops at the cap, as with
//   buffers of its own, instead of taking the whole pool.
// - A peer gives back credits above the base that it does not use (its send queue emptied): a
//   return message. So an idle connection holds at most its base, and a connection that sent a
//   burst once does not keep buffers from the others.
// The sending side's counterpart (keeping the wants bit and giving back) is Credits' job.
#pragma once
#include <cstdint>

#include "list.hpp"

namespace ibmsg {

// One connection's share of the pool (embedded in the connection).
struct ShareConn {
  uint32_t granted = 0;  // credits its peer holds: messages it may still send
  uint32_t owed = 0;     // reserved for it, sent with its next message (take_owed)
  uint32_t held = 0;     // its messages the application holds (their buffers count to its cap)
  bool wants = false;    // its last message said more wait behind it
  bool joined = false;
  ListNode wait_node;    // in the pool's queue of connections waiting for credits
  void *user = nullptr;  // the connection (the core's)
  uint32_t total() const { return granted + owed; }
};

class SharedCredits {
 public:
  SharedCredits(uint32_t base, uint32_t cap) : base_(base ? base : 1), cap_(cap < base_ ? base_ : cap) {}
  SharedCredits(const SharedCredits &) = delete;
  SharedCredits &operator=(const SharedCredits &) = delete;

  // Buffers added to the pool (posted): units to give.
  void add_buffers(uint32_t n) { free_ += n; }
  // A buffer that c's message used could not be posted again (the device refused it): lost to
  // the pool, and no longer held by c.
  void on_lost(ShareConn *c) {
    if (c && c->joined && c->held) --c->held;
  }
  // A buffer that took no credit (a violation, a failed receive) could not be posted again.
  void lose() {
    if (free_) --free_;
  }
  // c closes: it waits for nothing any more (what it holds goes at leave).
  void stop_waiting(ShareConn *c) {
    c->wants = false;
    unwait(c);
  }
  // Takes n unassigned buffers out of the pool (for another use: control messages); false if it
  // has fewer.
  bool take_buffers(uint32_t n) {
    if (unassigned() < n) return false;
    free_ -= n;
    return true;
  }
  // A new connection: reserves its base (owed, sent in its hello). false if the pool has no
  // base left for it: add buffers first.
  bool join(ShareConn *c);
  // The connection closed and can receive nothing more: what it held returns to the pool.
  void leave(ShareConn *c);

  // A message of c's peer arrived, saying whether more wait behind it. false if the peer had no
  // credit (a protocol violation: the connection closes).
  bool on_arrival(ShareConn *c, bool wants);
  // c's peer has data waiting and no credit to send it (a credit-only message with the wants bit):
  // a unit now if the pool has one, else it waits for one.
  void on_wants(ShareConn *c);
  // c's peer gave back n unused credits (at most those above the base it holds; false if more).
  bool on_given_back(ShareConn *c, uint32_t n);
  // The application freed a buffer that c's message used (c nullptr: its connection closed) and
  // it was posted again. Returns the connection that gets the unit (owed one more: send it the
  // credit), or nullptr if it stays in the pool.
  ShareConn *on_freed(ShareConn *c);
  // The credits to send c's peer now (they become granted).
  uint32_t take_owed(ShareConn *c);
  // One unit of the pool to the first connection waiting for credits (after a give-back, a
  // connection leaving, or buffers added): the connection, or nullptr if none waits or the pool
  // has nothing left. Call until nullptr.
  ShareConn *serve_waiting();

  uint32_t base() const { return base_; }
  uint32_t cap() const { return cap_; }
  uint32_t free_buffers() const { return free_; }     // posted, not consumed
  uint64_t assigned() const { return assigned_; }     // granted + owed, all connections
  uint64_t unassigned() const { return free_ > assigned_ ? free_ - assigned_ : 0; }
  size_t waiting() const { return waiting_.size(); }

 private:
  void give(ShareConn *c) {
    ++c->owed;
    ++assigned_;
  }
  void unwait(ShareConn *c) { waiting_.remove(c); }
  // At its cap: its credits and the buffers its messages hold.
  bool full(const ShareConn *c) const { return c->total() + c->held >= cap_; }

  uint32_t base_, cap_;
  uint64_t free_ = 0;
  uint64_t assigned_ = 0;
  List<ShareConn, &ShareConn::wait_node> waiting_;  // wanting more, first come first served
};

}  // namespace ibmsg
