// Credit-based flow control for one connection (pure logic, no verbs).
//
// Each side posts recv_depth + ctrl_depth receive buffers. The peer may send one data message per
// data credit and one credit-only control message per control credit, so it never sends into a
// receive queue without a posted buffer and RNR retries are never needed.
// Credits flow back in the immediate data of every message: data credits when the application
// frees a received buffer (it is re-posted), control credits as soon as a control message was
// consumed (its buffer is re-posted at once).
//
// When to send a control message (a credit update without payload): when the owed data credits
// reach half the depth, or when the peer has none left (everything is held by the application or
// owed), so a peer never waits for credits that exist (shared buffers: ctrl_needed). Such a
// message, or one carrying news (the done counts of rendezvous messages), keeps the last control
// credit for returning control credits (ctrl_due); a peer that waits for us returns the control
// credits it owes from half of them. Each message of the peer returns all it owes, so a control
// message never waits long (kCtrlDepth 4).
//
// Shared receive buffers (kFeatureShared, src/shared_credits.hpp): a receiver whose buffers are
// shared by its device's connections starts its peer with a small base (the hello's recv_depth)
// and grants more, up to the hello's cap, while the peer says it wants them; the data credits it
// granted and owes are then the pool's book of the connection (ShareConn), which the pool moves.
// The sender keeps the wants bit on while more waits behind a message, and gives back what it
// holds above the base once it has nothing to send (a Return message: Spend::Return).
//
// The receiver also counts the credits it granted: a peer that sends a data message without a
// data credit (or a credit-only message without a control credit) breaks the protocol, and the
// connection closes with IBMSG_EPROTO instead of the message taking a buffer it was not given.
// Credits granted while more completions of the poll being handled are still to come were not
// on the wire when those arrived: they are held back from them (hold, fresh_*) until the poll's
// end (release_fresh), or a message sent without a credit would pass whenever an earlier
// completion of its poll made us grant one. (A gap stays: credits granted during one poll whose
// message waits for the end of the drain to be posted, batch.cpp, count for the completions of
// the drain's next poll, which may have arrived before they went out.)
#pragma once
#include <cstdint>

#include "shared_credits.hpp"
#include "wire.hpp"

namespace ibmsg {

constexpr uint32_t kCtrlDepth = 4;

class Credits {
 public:
  // peer_*: what the peer's hello said it posted; my_recv_depth: what we posted for data.
  // peer_cap: the most data credits the peer grants (its hello's cap: peer_recv_depth before
  // protocol 1.3); shares: the pool's book of this connection when our receive buffers are
  // shared (it starts with my_recv_depth granted), nullptr for buffers of its own; shared_wire:
  // kFeatureShared agreed (the wants bit and Return messages).
  void init(uint32_t peer_recv_depth, uint32_t peer_ctrl_depth, uint32_t my_recv_depth,
            uint32_t peer_cap = 0, ShareConn *shares = nullptr, bool shared_wire = false) {
    data_ = base_ = peer_recv_depth;
    limit_ = shared_wire && peer_cap > peer_recv_depth ? peer_cap : peer_recv_depth;
    ctrl_ = ctrl_limit_ = peer_ctrl_depth;
    depth_ = my_recv_depth;
    threshold_ = my_recv_depth / 2 ? my_recv_depth / 2 : 1;
    owed_ = owed_ctrl_ = held_ = 0;
    granted_ = my_recv_depth;
    granted_ctrl_ = kCtrlDepth;
    sc_ = shares;
    wire_shared_ = shared_wire;
    fresh_data_ = fresh_ctrl_ = 0;
  }

  // --- sending ---
  bool can_send_data() const { return data_ > 0; }
  bool can_send_ctrl() const { return ctrl_ > 0; }
  // A message takes its credits in two steps, so that a post that fails changes nothing:
  // carry says what its immediate carries now (a data or credit-only message: everything owed,
  // up to the fields' maxima; a Return: the give_back data credits it gives back, and the
  // control credits owed), and once the post succeeded, taken spends the message's credit (a
  // data credit, or a control one) and grants what the immediate carried.
  // hold: completions of the poll being handled are still to come (the credits granted now are
  // fresh for them).
  enum class Spend : uint8_t { Data, Ctrl, Return };
  wire::Imm carry(Spend spend, uint32_t give_back = 0) const {
    wire::Imm imm;
    imm.op = spend == Spend::Data   ? wire::Opcode::Data
             : spend == Spend::Ctrl ? wire::Opcode::Credit
                                    : wire::Opcode::Return;
    const uint32_t max = wire_shared_ ? wire::kMaxSharedCreditsPerMsg : wire::kMaxCreditsPerMsg;
    imm.credits = spend == Spend::Return ? give_back : owed() > max ? max : owed();
    imm.ctrl_credits =
        owed_ctrl_ > wire::kMaxCtrlCreditsPerMsg ? wire::kMaxCtrlCreditsPerMsg : owed_ctrl_;
    return imm;
  }
  void taken(const wire::Imm &imm, Spend spend, bool hold = false) {
    if (spend == Spend::Data) {
      --data_;
    } else {
      --ctrl_;
      if (spend == Spend::Return) data_ -= imm.credits;  // given back, not granted
    }
    if (spend != Spend::Return) {
      ow() -= imm.credits;
      gr() += imm.credits;
      if (hold) fresh_data_ += imm.credits;
    }
    owed_ctrl_ -= imm.ctrl_credits;
    granted_ctrl_ += imm.ctrl_credits;
    if (hold) fresh_ctrl_ += imm.ctrl_credits;
  }
  // Both steps at once (the unit tests' shorthand; the library posts between them).
  wire::Imm take_data(bool hold = false) { return take(Spend::Data, 0, hold); }
  wire::Imm take_ctrl(bool hold = false) { return take(Spend::Ctrl, 0, hold); }
  wire::Imm take_return(uint32_t n, bool hold = false) { return take(Spend::Return, n, hold); }
  // What became owed since a data message took its credits (taken) and before it went to the
  // wire rides on it too: its data and control credit fields are filled up to their maxima.
  void top_up(wire::Imm *imm, bool hold = false) {
    const uint32_t max = wire_shared_ ? wire::kMaxSharedCreditsPerMsg : wire::kMaxCreditsPerMsg;
    const uint32_t room = imm->credits < max ? max - imm->credits : 0;
    const uint32_t add = ow() > room ? room : ow();
    const uint32_t croom = imm->ctrl_credits < wire::kMaxCtrlCreditsPerMsg
                               ? wire::kMaxCtrlCreditsPerMsg - imm->ctrl_credits : 0;
    const uint32_t cadd = owed_ctrl_ > croom ? croom : owed_ctrl_;
    imm->credits += add;
    imm->ctrl_credits += cadd;
    ow() -= add;
    owed_ctrl_ -= cadd;
    gr() += add;
    granted_ctrl_ += cadd;
    if (hold) {
      fresh_data_ += add;
      fresh_ctrl_ += cadd;
    }
  }
  // With kFeatureShared: data credits held above the peer's base (give them back when nothing
  // waits for them, in a Return message: Spend::Return, a control credit; the credits field
  // says what is given back, owed data credits wait).
  uint32_t surplus() const { return wire_shared_ && data_ > base_ ? data_ - base_ : 0; }
  bool shared_wire() const { return wire_shared_; }
  // Spends one data credit on something that returns no credits (an RDMA write with immediate:
  // its immediate is the application's).
  void spend_data() { --data_; }
  // The peer returned credits (any message from it). false if it returned more than we spent
  // (a protocol violation: we would overrun its receive queue).
  bool on_returned(const wire::Imm &imm) {
    if (imm.credits > limit_ - data_ || imm.ctrl_credits > ctrl_limit_ - ctrl_) return false;
    data_ += imm.credits;
    ctrl_ += imm.ctrl_credits;
    return true;
  }

  // --- receiving ---
  // A data message arrived: false if the peer had no data credit for it (a protocol violation).
  // Shared buffers: the pool's on_arrival counts the credit instead (data_lent), once
  // data_usable said the peer had one.
  bool on_data_arrived() {
    if (gr() <= fresh_data_) return false;
    --gr();
    ++held_;  // lent to the application
    return true;
  }
  bool data_usable() const { return granted() > fresh_data_; }
  void data_lent() { ++held_; }
  // The peer gave n data credits back (a Return message): false if it holds fewer above the base
  // we always grant (a protocol violation). Shared buffers: the pool's on_given_back instead.
  bool on_given_back(uint32_t n) {
    if (n > granted_ || granted_ - n < depth_) return false;
    granted_ -= n;
    return true;
  }
  // A credit-only message arrived: false if the peer had no control credit for it.
  bool on_ctrl_arrived() {
    if (granted_ctrl_ <= fresh_ctrl_) return false;
    --granted_ctrl_;
    return true;
  }
  void on_data_freed() {                 // the application freed it; the buffer is re-posted
    --held_;
    ++owed_;  // (shared buffers: the pool decides whose credit it becomes, on_data_dropped)
  }
  void on_data_dropped() { --held_; }    // freed after the connection closed: nothing to return
  void on_ctrl_received() { ++owed_ctrl_; }  // control buffer re-posted at once
  void release_fresh() { fresh_data_ = fresh_ctrl_ = 0; }  // the poll's completions are handled

  // Whether to send a credit-only message now (when no data message can carry the credits).
  // Shared buffers: when the peer holds no more than we owe it; on a busy-polling connection
  // (polling) when it holds fewer, and so at the latest when it holds none: while it holds as
  // many as we owe, it sends with those and gets ours on our next message (the reply of a
  // ping-pong, whose request goes back after it: message.cpp), not in a message of their own.
  // (With completion events the earlier message measured faster: PERFORMANCE.md.)
  bool ctrl_needed(bool polling = false) const {
    if (owed() == 0) return false;
    if (sc_) return polling ? owed() > granted() : owed() >= granted();
    return owed_ >= threshold_ || held_ + owed_ >= depth_;
  }
  // Whether n of the held buffers, given back after a message that carries what is owed now,
  // would make a credit-only message due on a busy-polling connection (ctrl_needed then).
  bool ctrl_needed_after_carry(uint32_t n) const {
    if (n == 0) return false;
    if (sc_) return n > granted() + owed();
    return n >= threshold_ || held_ >= depth_;
  }

  // Whether to send a credit-only message now (when no data message can carry it): to return
  // the control credits we owe while this side waits for something from the peer (waiting: the
  // peer may need them to send it; from half the control depth, so that two waiting sides do not
  // ping-pong), or for owed data credits (ctrl_needed) or news (rendezvous done counts) while that
  // leaves a control credit for returning control credits. Without that reserve both sides could
  // spend all of theirs at once and then owe each other the control credits that neither can send.
  bool ctrl_due(bool waiting, bool news, bool polling = false) const {
    if (ctrl_ == 0) return false;
    if (waiting && owed_ctrl_ >= kCtrlDepth / 2) return true;
    // Shared buffers: a peer that holds data credits above its base is down to the control
    // credit it keeps for returning ours, so it cannot give them back (a Return) until we return
    // the control credits we owe.
    // (It returns control credits, as the waiting rule does: the last one may go on it.)
    if (sc_ && wire_shared_ && sc_->granted > depth_ && granted_ctrl_ <= 1 &&
        owed_ctrl_ >= kCtrlDepth / 2)
      return true;
    return (ctrl_needed(polling) || news) && (ctrl_ >= 2 || ctrl_limit_ < 2);
  }

  uint32_t data() const { return data_; }
  uint32_t ctrl() const { return ctrl_; }
  uint32_t owed() const { return sc_ ? sc_->owed : owed_; }
  uint32_t owed_ctrl() const { return owed_ctrl_; }
  uint32_t held() const { return held_; }
  uint32_t granted() const { return sc_ ? sc_->granted : granted_; }
  uint32_t granted_ctrl() const { return granted_ctrl_; }

 private:
  uint32_t &ow() { return sc_ ? sc_->owed : owed_; }
  uint32_t &gr() { return sc_ ? sc_->granted : granted_; }

  wire::Imm take(Spend spend, uint32_t give_back, bool hold) {
    const wire::Imm imm = carry(spend, give_back);
    taken(imm, spend, hold);
    return imm;
  }

  ShareConn *sc_ = nullptr;  // shared receive buffers: the pool's granted and owed
  bool wire_shared_ = false;
  uint32_t base_ = 0;       // the peer's hello's recv_depth: what it always grants us
  uint32_t limit_ = 0;      // its cap: we never hold more data credits
  uint32_t ctrl_limit_ = 0;
  uint32_t data_ = 0;       // data messages we may send
  uint32_t ctrl_ = 0;       // control messages we may send
  uint32_t owed_ = 0;       // data credits to return to the peer
  uint32_t owed_ctrl_ = 0;  // control credits to return
  uint32_t held_ = 0;       // received messages lent to the application
  uint32_t granted_ = 0;    // data messages the peer may still send us
  uint32_t granted_ctrl_ = 0;  // control messages likewise
  uint32_t depth_ = 0;
  uint32_t threshold_ = 1;
  uint32_t fresh_data_ = 0;  // granted while completions of the poll were to come (in granted())
  uint32_t fresh_ctrl_ = 0;  // likewise of granted_ctrl_
};

}  // namespace ibmsg
