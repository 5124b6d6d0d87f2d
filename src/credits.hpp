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
// owed), so a peer never waits for credits that exist. Such a message, or one carrying news (the
// done counts of rendezvous messages), keeps the last control credit for returning control credits
// (ctrl_due); a peer that waits for us returns the control credits it owes from half of them. Each
// message of the peer returns all it owes, so a control message never waits long (kCtrlDepth 4).
//
// The receiver also counts the credits it granted: a peer that sends a data message without a
// data credit (or a credit-only message without a control credit) breaks the protocol, and the
// connection closes with IBMSG_EPROTO instead of the message taking a buffer it was not given.
#pragma once
#include <cstdint>

#include "wire.hpp"

namespace ibmsg {

constexpr uint32_t kCtrlDepth = 4;

class Credits {
 public:
  // peer_*: what the peer's hello said it posted; my_recv_depth: what we posted for data.
  void init(uint32_t peer_recv_depth, uint32_t peer_ctrl_depth, uint32_t my_recv_depth) {
    data_ = limit_ = peer_recv_depth;
    ctrl_ = ctrl_limit_ = peer_ctrl_depth;
    depth_ = my_recv_depth;
    threshold_ = my_recv_depth / 2 ? my_recv_depth / 2 : 1;
    owed_ = owed_ctrl_ = held_ = 0;
    granted_ = my_recv_depth;
    granted_ctrl_ = kCtrlDepth;
  }

  // --- sending ---
  bool can_send_data() const { return data_ > 0; }
  bool can_send_ctrl() const { return ctrl_ > 0; }
  // Spends one data credit; returns the immediate to send, carrying everything owed.
  wire::Imm take_data() {
    --data_;
    return take_owed(false);
  }
  // Spends one data credit on something that returns no credits (an RDMA write with immediate:
  // its immediate is the application's).
  void spend_data() { --data_; }
  // Spends one control credit for a credit-only message.
  wire::Imm take_ctrl() {
    --ctrl_;
    return take_owed(true);
  }
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
  bool on_data_arrived() {
    if (granted_ == 0) return false;
    --granted_;
    ++held_;  // lent to the application
    return true;
  }
  // A credit-only message arrived: false if the peer had no control credit for it.
  bool on_ctrl_arrived() {
    if (granted_ctrl_ == 0) return false;
    --granted_ctrl_;
    return true;
  }
  void on_data_freed() {                 // the application freed it; the buffer is re-posted
    --held_;
    ++owed_;
  }
  void on_data_dropped() { --held_; }    // freed after the connection closed: nothing to return
  void on_ctrl_received() { ++owed_ctrl_; }  // control buffer re-posted at once

  // Whether to send a credit-only message now (when no data message can carry the credits).
  bool ctrl_needed() const {
    if (owed_ == 0) return false;
    return owed_ >= threshold_ || held_ + owed_ >= depth_;
  }

  // Whether to send a credit-only message now (when no data message can carry it): to return
  // the control credits we owe while this side waits for something from the peer (waiting: the
  // peer may need them to send it; from half the control depth, so that two waiting sides do not
  // ping-pong), or for owed data credits (ctrl_needed) or news (rendezvous done counts) while that
  // leaves a control credit for returning control credits. Without that reserve both sides could
  // spend all of theirs at once and then owe each other the control credits that neither can send.
  bool ctrl_due(bool waiting, bool news) const {
    if (ctrl_ == 0) return false;
    if (waiting && owed_ctrl_ >= kCtrlDepth / 2) return true;
    return (ctrl_needed() || news) && ctrl_ >= 2;
  }

  uint32_t data() const { return data_; }
  uint32_t ctrl() const { return ctrl_; }
  uint32_t owed() const { return owed_; }
  uint32_t owed_ctrl() const { return owed_ctrl_; }
  uint32_t held() const { return held_; }
  uint32_t granted() const { return granted_; }
  uint32_t granted_ctrl() const { return granted_ctrl_; }

 private:
  wire::Imm take_owed(bool ctrl) {
    wire::Imm imm;
    imm.op = ctrl ? wire::Opcode::Credit : wire::Opcode::Data;
    imm.credits = owed_ > wire::kMaxCreditsPerMsg ? wire::kMaxCreditsPerMsg : owed_;
    imm.ctrl_credits = owed_ctrl_ > wire::kMaxCtrlCreditsPerMsg ? wire::kMaxCtrlCreditsPerMsg : owed_ctrl_;
    owed_ -= imm.credits;
    owed_ctrl_ -= imm.ctrl_credits;
    granted_ += imm.credits;
    granted_ctrl_ += imm.ctrl_credits;
    return imm;
  }

  uint32_t limit_ = 0;      // the peer's receive depth: we never hold more data credits
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
};

}  // namespace ibmsg
