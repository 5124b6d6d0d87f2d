// test_credits.cpp - ibmsg::Credits (src/credits.hpp): credit accounting and when to send a
// credit-only control message, then a simulation of two peers that checks the guarantees the
// accounting exists for: no send without a posted receive buffer (no RNR), control messages never
// short of control credits, and no deadlock.
#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <csetjmp>
extern "C" {  // cmocka.h 1.1 has no extern "C" of its own
#include <cmocka.h>
}

#include <cstdio>
#include <deque>
#include <initializer_list>
#include <random>
#include <utility>

#include "credits.hpp"

using ibmsg::Credits;
using ibmsg::kCtrlDepth;
namespace wire = ibmsg::wire;

namespace {

// n data messages arrive from an honest peer and are lent to the application.
void receive(Credits *c, uint32_t n) {
  for (uint32_t i = 0; i < n; ++i)
    if (!c->on_data_arrived())
      fail_msg("data message %u of %u refused: the peer had %u credits granted, %u held, %u owed",
               i + 1, n, unsigned(c->granted()), unsigned(c->held()), unsigned(c->owed()));
}

void free_held(Credits *c, uint32_t n) {
  for (uint32_t i = 0; i < n; ++i) c->on_data_freed();
}

// Lends n received messages to the application and lets it free them again, so that n data
// credits are owed to the peer (and none are held).
void receive_and_free(Credits *c, uint32_t n) {
  receive(c, n);
  free_held(c, n);
}

// n credit-only messages arrive and their buffers are re-posted, so n control credits are owed.
void receive_ctrl(Credits *c, uint32_t n) {
  for (uint32_t i = 0; i < n; ++i) {
    if (!c->on_ctrl_arrived())
      fail_msg("control message %u of %u refused: the peer had %u control credits granted", i + 1,
               n, unsigned(c->granted_ctrl()));
    c->on_ctrl_received();
  }
}

// The receiving side's invariant: every data receive buffer is granted to the peer, held by the
// application or owed back.
void assert_granted_held_owed_add_up(const Credits &c, uint32_t depth, const char *after) {
  if (c.granted() + c.held() + c.owed() != depth)
    fail_msg("after %s: granted %u + held %u + owed %u != recv depth %u", after,
             unsigned(c.granted()), unsigned(c.held()), unsigned(c.owed()), unsigned(depth));
  if (c.granted_ctrl() + c.owed_ctrl() != kCtrlDepth)
    fail_msg("after %s: control credits granted %u + owed %u != %u", after,
             unsigned(c.granted_ctrl()), unsigned(c.owed_ctrl()), unsigned(kCtrlDepth));
}

// --- initial credits ------------------------------------------------------------------------

void init_takes_data_and_ctrl_credits_from_the_peers_hello(void **) {
  Credits c;
  c.init(8, 4, 16);
  assert_int_equal(c.data(), 8);  // data credits = the peer's recv_depth
  assert_int_equal(c.ctrl(), 4);  // ctrl credits = the peer's ctrl_depth
  assert_true(c.can_send_data());
  assert_true(c.can_send_ctrl());
}

void init_owes_nothing_and_holds_nothing(void **) {
  Credits c;
  c.init(8, 4, 16);
  receive_and_free(&c, 3);  // left over from an earlier use of the object
  receive_ctrl(&c, 1);
  receive(&c, 2);
  c.init(8, 4, 16);
  assert_int_equal(c.owed(), 0);
  assert_int_equal(c.owed_ctrl(), 0);
  assert_int_equal(c.held(), 0);
  assert_false(c.ctrl_needed());
}

void init_grants_the_peer_our_recv_depth_and_ctrl_depth(void **) {
  Credits c;
  c.init(8, 2, 16);
  assert_int_equal(c.granted(), 16);              // what we posted, not the peer's recv_depth
  assert_int_equal(c.granted_ctrl(), kCtrlDepth);  // what we posted, not the peer's ctrl_depth
}

void init_resets_the_granted_credits(void **) {
  Credits c;
  c.init(8, 4, 16);
  receive(&c, 5);
  receive_ctrl(&c, 2);
  c.init(8, 4, 16);
  assert_int_equal(c.granted(), 16);
  assert_int_equal(c.granted_ctrl(), kCtrlDepth);
}

void init_depth_does_not_change_what_we_may_send(void **) {
  Credits c;
  c.init(3, 2, 1000);  // our own recv depth is not the peer's
  assert_int_equal(c.data(), 3);
  assert_int_equal(c.ctrl(), 2);
}

void zero_credits_allow_no_send(void **) {
  Credits c;
  c.init(0, 0, 16);
  assert_false(c.can_send_data());
  assert_false(c.can_send_ctrl());
}

// --- spending ---------------------------------------------------------------------------------

void take_data_spends_one_data_credit(void **) {
  Credits c;
  c.init(8, 4, 16);
  wire::Imm imm = c.take_data();
  assert_int_equal(c.data(), 7);
  assert_int_equal(c.ctrl(), 4);  // a data message must not spend a control credit
  assert_true(imm.op == wire::Opcode::Data);  // a data message must not be marked credit-only
}

void take_data_until_none_left_stops_sending(void **) {
  Credits c;
  c.init(3, 4, 16);
  for (int i = 0; i < 3; ++i) {
    assert_true(c.can_send_data());
    c.take_data();
  }
  assert_int_equal(c.data(), 0);
  assert_false(c.can_send_data());
  assert_true(c.can_send_ctrl());  // control credits are separate
}

void take_ctrl_spends_one_ctrl_credit_and_marks_the_message(void **) {
  Credits c;
  c.init(8, 4, 16);
  wire::Imm imm = c.take_ctrl();
  assert_int_equal(c.ctrl(), 3);
  assert_int_equal(c.data(), 8);  // a control message must not spend a data credit
  assert_true(imm.op == wire::Opcode::Credit);  // the receiver must see it is credit-only
}

void take_with_nothing_owed_carries_no_credits(void **) {
  Credits c;
  c.init(8, 4, 16);
  wire::Imm imm = c.take_data();
  assert_int_equal(imm.credits, 0);
  assert_int_equal(imm.ctrl_credits, 0);
}

void take_data_carries_owed_credits_and_resets_them(void **) {
  Credits c;
  c.init(8, 4, 16);
  receive_and_free(&c, 3);
  receive_ctrl(&c, 2);
  wire::Imm imm = c.take_data();
  assert_int_equal(imm.credits, 3);       // every freed buffer goes back
  assert_int_equal(imm.ctrl_credits, 2);  // every consumed control buffer goes back
  assert_int_equal(c.owed(), 0);          // what was carried is no longer owed
  assert_int_equal(c.owed_ctrl(), 0);
  imm = c.take_data();
  assert_int_equal(imm.credits, 0);  // a second message must not return the same credits again
  assert_int_equal(imm.ctrl_credits, 0);
}

void take_ctrl_carries_owed_credits_and_resets_them(void **) {
  Credits c;
  c.init(8, 4, 16);
  receive_and_free(&c, 5);
  receive_ctrl(&c, 1);
  wire::Imm imm = c.take_ctrl();
  assert_int_equal(imm.credits, 5);
  assert_int_equal(imm.ctrl_credits, 1);
  assert_int_equal(c.owed(), 0);
  assert_int_equal(c.owed_ctrl(), 0);
}

void held_messages_are_not_returned_until_freed(void **) {
  Credits c;
  c.init(8, 4, 16);
  receive(&c, 4);
  free_held(&c, 1);
  wire::Imm imm = c.take_data();
  assert_int_equal(imm.credits, 1);  // three buffers are still lent to the application
  assert_int_equal(c.held(), 3);
}

// --- returned credits -------------------------------------------------------------------------

void on_returned_adds_data_and_ctrl_credits(void **) {
  Credits c;
  c.init(8, 4, 16);
  for (int i = 0; i < 6; ++i) c.take_data();
  for (int i = 0; i < 3; ++i) c.take_ctrl();
  wire::Imm imm;
  imm.credits = 5;
  imm.ctrl_credits = 3;
  assert_true(c.on_returned(imm));
  assert_int_equal(c.data(), 2 + 5);
  assert_int_equal(c.ctrl(), 1 + 3);
}

void on_returned_refuses_more_credits_than_were_spent(void **) {
  Credits c;
  c.init(8, 4, 16);
  c.take_data();
  c.take_ctrl();
  wire::Imm imm;
  imm.credits = 2;  // one was spent
  if (c.on_returned(imm)) fail_msg("two data credits accepted back after spending one");
  assert_int_equal(c.data(), 7);  // unchanged
  imm.credits = 0;
  imm.ctrl_credits = 2;
  if (c.on_returned(imm)) fail_msg("two control credits accepted back after spending one");
  assert_int_equal(c.ctrl(), 3);
  imm.credits = 1;
  imm.ctrl_credits = 1;
  assert_true(c.on_returned(imm));  // exactly what was spent
  assert_int_equal(c.data(), 8);
  assert_int_equal(c.ctrl(), 4);
}

void on_returned_with_nothing_changes_nothing(void **) {
  Credits c;
  c.init(2, 1, 16);
  c.on_returned(wire::Imm{});
  assert_int_equal(c.data(), 2);
  assert_int_equal(c.ctrl(), 1);
}

// --- receiving ----------------------------------------------------------------------------------

void received_data_is_held_until_freed_then_owed(void **) {
  Credits c;
  c.init(8, 4, 16);
  receive(&c, 2);
  assert_int_equal(c.held(), 2);
  assert_int_equal(c.owed(), 0);  // not owed while the application holds it
  free_held(&c, 1);
  assert_int_equal(c.held(), 1);
  assert_int_equal(c.owed(), 1);
}

void dropped_data_is_not_owed(void **) {
  Credits c;
  c.init(8, 4, 16);
  receive(&c, 2);
  c.on_data_dropped();  // freed after the connection closed: no buffer was re-posted
  assert_int_equal(c.held(), 1);
  assert_int_equal(c.owed(), 0);
}

void received_ctrl_is_owed_at_once(void **) {
  Credits c;
  c.init(8, 4, 16);
  c.on_ctrl_received();
  assert_int_equal(c.owed_ctrl(), 1);
  assert_int_equal(c.held(), 0);  // a control message is never lent to the application
  assert_int_equal(c.owed(), 0);  // nor does it owe a data credit
}

// --- arrivals against granted credits ---------------------------------------------------------

void data_arrival_is_refused_once_the_granted_credits_are_used_up(void **) {
  Credits c;
  c.init(8, 4, 3);
  receive(&c, 3);
  assert_int_equal(c.granted(), 0);
  assert_false(c.on_data_arrived());  // a fourth message without a credit breaks the protocol
}

void refused_data_arrival_changes_nothing(void **) {
  Credits c;
  c.init(8, 4, 2);
  receive(&c, 2);
  assert_false(c.on_data_arrived());
  assert_int_equal(c.granted(), 0);
  assert_int_equal(c.held(), 2);  // the message is not lent to the application
  assert_int_equal(c.owed(), 0);
}

void data_arrival_is_allowed_again_after_take_data_returned_credits(void **) {
  Credits c;
  c.init(8, 4, 2);
  receive(&c, 2);
  free_held(&c, 1);
  assert_false(c.on_data_arrived());  // freed but not yet returned: the peer does not know
  wire::Imm imm = c.take_data();
  assert_int_equal(imm.credits, 1);
  assert_int_equal(c.granted(), 1);
  assert_true(c.on_data_arrived());
  assert_false(c.on_data_arrived());  // exactly the one returned credit, no more
}

void data_arrival_is_allowed_again_after_take_ctrl_returned_credits(void **) {
  Credits c;
  c.init(8, 4, 2);
  receive_and_free(&c, 2);
  assert_false(c.on_data_arrived());
  wire::Imm imm = c.take_ctrl();
  assert_int_equal(imm.credits, 2);
  assert_int_equal(c.granted(), 2);
  assert_true(c.on_data_arrived());
  assert_true(c.on_data_arrived());
  assert_false(c.on_data_arrived());
}

// Credits granted while completions of the poll being handled are still to come (hold) are not
// usable by those completions; once the poll's end released them they are.
void credits_held_back_are_not_usable_until_released(void **) {
  Credits c;
  c.init(8, 4, 2);
  receive_and_free(&c, 2);  // the peer used both; both owed
  receive_ctrl(&c, kCtrlDepth);
  assert_false(c.data_usable());
  wire::Imm imm = c.take_data(true);  // two data and four control credits, held back
  assert_int_equal(imm.credits, 2);
  assert_int_equal(imm.ctrl_credits, kCtrlDepth);
  assert_int_equal(c.granted(), 2);
  assert_false(c.data_usable());
  assert_false(c.on_data_arrived());  // a completion of the same poll: it did not have them
  assert_false(c.on_ctrl_arrived());
  assert_int_equal(c.granted(), 2);  // refused: nothing changes
  assert_int_equal(c.granted_ctrl(), kCtrlDepth);
  assert_granted_held_owed_add_up(c, 2, "a refused arrival");
  c.release_fresh();  // the next poll's completions may have them
  assert_true(c.data_usable());
  assert_true(c.on_data_arrived());
  assert_true(c.on_data_arrived());
  assert_false(c.on_data_arrived());
  for (uint32_t i = 0; i < kCtrlDepth; ++i) assert_true(c.on_ctrl_arrived());
  assert_false(c.on_ctrl_arrived());
}

// Only the credits held back are: those granted before stay usable, and grants that are not
// held back (no completion of the poll still to come) count at once.
void only_the_credits_held_back_wait(void **) {
  Credits c;
  c.init(8, 4, 4);
  receive_and_free(&c, 3);  // one credit left with the peer, three owed
  c.take_data();            // three granted, usable at once
  assert_true(c.on_data_arrived());  // the peer used one; owed again
  c.on_data_freed();
  assert_int_equal(c.granted(), 3);
  c.take_data(true);  // one more granted, held back
  assert_int_equal(c.granted(), 4);
  for (int i = 0; i < 3; ++i) assert_true(c.on_data_arrived());
  assert_false(c.on_data_arrived());  // the fourth is held back
  c.release_fresh();
  assert_true(c.on_data_arrived());
  assert_false(c.on_data_arrived());
}

// The control credits a Return or top_up carries are held back too.
void control_credits_of_a_return_or_top_up_are_held_back(void **) {
  Credits c;
  c.init(2, 4, 2, 8, nullptr, true);
  wire::Imm more;
  more.credits = 2;  // the peer grants two above its base
  assert_true(c.on_returned(more));
  receive_ctrl(&c, 2);
  wire::Imm imm = c.take_return(2, true);
  assert_int_equal(imm.ctrl_credits, 2);
  assert_int_equal(c.granted_ctrl(), kCtrlDepth);
  assert_true(c.on_ctrl_arrived());  // the two granted before
  assert_true(c.on_ctrl_arrived());
  assert_false(c.on_ctrl_arrived());
  c.release_fresh();
  assert_true(c.on_ctrl_arrived());
  receive_ctrl(&c, 1);  // the peer's last control credit: one owed
  assert_int_equal(c.granted_ctrl(), 0);
  wire::Imm up;
  c.top_up(&up, true);
  assert_int_equal(up.ctrl_credits, 1);
  assert_false(c.on_ctrl_arrived());
  c.release_fresh();
  assert_true(c.on_ctrl_arrived());
  assert_false(c.on_ctrl_arrived());
}

void ctrl_arrival_is_refused_once_the_granted_ctrl_credits_are_used_up(void **) {
  Credits c;
  c.init(8, 4, 16);
  receive_ctrl(&c, kCtrlDepth);
  assert_int_equal(c.granted_ctrl(), 0);
  assert_false(c.on_ctrl_arrived());
  assert_int_equal(c.granted_ctrl(), 0);  // refused: nothing changes
  assert_int_equal(c.owed_ctrl(), kCtrlDepth);
}

void ctrl_arrival_is_allowed_again_after_take_data_returned_ctrl_credits(void **) {
  Credits c;
  c.init(8, 4, 16);
  receive_ctrl(&c, kCtrlDepth);
  wire::Imm imm = c.take_data();
  assert_int_equal(imm.ctrl_credits, kCtrlDepth);
  assert_int_equal(c.granted_ctrl(), kCtrlDepth);
  for (uint32_t i = 0; i < kCtrlDepth; ++i)
    if (!c.on_ctrl_arrived()) fail_msg("control message %u refused after %u were returned", i + 1,
                                       unsigned(kCtrlDepth));
  assert_false(c.on_ctrl_arrived());
}

void ctrl_arrival_is_allowed_again_after_take_ctrl_returned_ctrl_credits(void **) {
  Credits c;
  c.init(8, 4, 16);
  receive_ctrl(&c, kCtrlDepth);
  assert_false(c.on_ctrl_arrived());
  wire::Imm imm = c.take_ctrl();
  assert_int_equal(imm.ctrl_credits, kCtrlDepth);
  assert_true(c.on_ctrl_arrived());
}

void data_and_ctrl_arrivals_spend_separate_credits(void **) {
  Credits c;
  c.init(8, 4, 2);
  receive(&c, 2);
  assert_int_equal(c.granted_ctrl(), kCtrlDepth);  // data arrivals leave control credits alone
  assert_true(c.on_ctrl_arrived());  // a credit-only message may still come
  assert_int_equal(c.granted(), 0);  // and it spends no data credit
}

void granted_grows_by_exactly_the_credits_a_message_returned(void **) {
  // The per-message cap: credits still owed are not granted yet.
  const uint32_t depth = wire::kMaxCreditsPerMsg + 100;
  Credits c;
  c.init(8, 4, depth);
  receive_and_free(&c, depth);
  c.take_data();
  assert_int_equal(c.granted(), wire::kMaxCreditsPerMsg);
  c.take_data();
  assert_int_equal(c.granted(), depth);
}

void granted_held_and_owed_always_add_up_to_the_recv_depth(void **) {
  const uint32_t depth = 5;
  Credits c;
  c.init(8, 4, depth);
  assert_granted_held_owed_add_up(c, depth, "init");
  receive(&c, 3);
  assert_granted_held_owed_add_up(c, depth, "3 arrivals");
  free_held(&c, 2);
  assert_granted_held_owed_add_up(c, depth, "2 frees");
  receive_ctrl(&c, 3);
  assert_granted_held_owed_add_up(c, depth, "3 control arrivals");
  c.take_data();
  assert_granted_held_owed_add_up(c, depth, "take_data");
  receive(&c, 4);
  assert_granted_held_owed_add_up(c, depth, "4 more arrivals");
  assert_false(c.on_data_arrived());
  assert_granted_held_owed_add_up(c, depth, "a refused arrival");
  free_held(&c, 5);
  assert_granted_held_owed_add_up(c, depth, "5 frees");
  c.take_ctrl();
  assert_granted_held_owed_add_up(c, depth, "take_ctrl");
  assert_int_equal(c.granted(), depth);  // everything freed and returned
}

// --- when to send a control message -----------------------------------------------------------

void ctrl_not_needed_when_nothing_is_owed(void **) {
  Credits c;
  c.init(8, 4, 16);
  assert_false(c.ctrl_needed());
  receive(&c, 16);  // everything held: the peer is starved, but there is nothing to give it
  assert_false(c.ctrl_needed());
}

void ctrl_not_needed_for_owed_ctrl_credits_alone(void **) {
  Credits c;
  c.init(8, 4, 16);
  receive_ctrl(&c, kCtrlDepth);
  // Control credits only travel on messages sent for other reasons; answering a control message
  // with a control message would ping-pong forever.
  assert_false(c.ctrl_needed());
}

void ctrl_not_needed_below_half_the_depth(void **) {
  Credits c;
  c.init(8, 4, 16);
  receive_and_free(&c, 7);
  assert_false(c.ctrl_needed());  // 7 owed, threshold 8, nothing held: the peer still has 9
}

void ctrl_needed_at_half_the_depth(void **) {
  Credits c;
  c.init(8, 4, 16);
  receive_and_free(&c, 8);
  assert_true(c.ctrl_needed());  // 8 owed reaches the threshold 16 / 2
}

// Shared receive buffers: with completion events a credit-only message goes once the peer holds no
// more than we owe it; on a busy-polling connection once it holds fewer (a ping-pong's request
// goes back after its reply, and its credit rides on the next one). And the test for a message
// about to carry what is owed: whether n buffers given back after it would need one.
void shared_ctrl_needed_events_and_polling(void **) {
  ibmsg::ShareConn share;
  Credits c;
  c.init(2, 4, 2, 32, &share, true);
  share.granted = 1;
  share.owed = 0;
  for (bool polling : {false, true}) assert_false(c.ctrl_needed(polling));
  share.owed = 1;  // the peer holds as many as we owe
  assert_true(c.ctrl_needed(false));
  assert_false(c.ctrl_needed(true));
  share.owed = 2;  // fewer
  for (bool polling : {false, true}) assert_true(c.ctrl_needed(polling));
  share.granted = 0;
  share.owed = 1;  // none
  for (bool polling : {false, true}) assert_true(c.ctrl_needed(polling));
  // Owing 1 to a peer holding none: a message carries it, then 1 more given back is as many
  // as it holds, 2 more are more.
  assert_false(c.ctrl_needed_after_carry(0));
  assert_false(c.ctrl_needed_after_carry(1));
  assert_true(c.ctrl_needed_after_carry(2));
  // Buffers of its own: half the depth, with the owed ones carried first.
  Credits own;
  own.init(8, 4, 16);
  assert_false(own.ctrl_needed_after_carry(7));
  assert_true(own.ctrl_needed_after_carry(8));
}

void ctrl_threshold_rounds_half_an_odd_depth_down(void **) {
  Credits c;
  c.init(8, 4, 7);
  receive_and_free(&c, 2);
  assert_false(c.ctrl_needed());  // 2 owed < 7 / 2 = 3
  receive_and_free(&c, 1);
  assert_true(c.ctrl_needed());  // 3 owed
}

void ctrl_threshold_is_at_least_one_for_depth_one(void **) {
  Credits c;
  c.init(8, 4, 1);
  assert_false(c.ctrl_needed());
  receive_and_free(&c, 1);
  assert_true(c.ctrl_needed());  // 1 / 2 == 0: the threshold must still be 1
}

void ctrl_needed_when_the_peer_is_starved_below_the_threshold(void **) {
  Credits c;
  c.init(8, 4, 16);
  receive(&c, 16);   // the peer has spent all 16 credits
  free_held(&c, 1);  // 1 owed, far below the threshold of 8
  assert_true(c.ctrl_needed());  // held + owed == depth: the peer waits for this one credit
}

void ctrl_not_needed_when_the_peer_still_has_a_credit(void **) {
  Credits c;
  c.init(8, 4, 16);
  receive(&c, 15);  // the peer still has one credit
  free_held(&c, 1);
  assert_false(c.ctrl_needed());  // held + owed == 15 < 16 and 1 owed < 8
}

void ctrl_not_needed_after_a_message_carried_the_owed_credits(void **) {
  Credits c;
  c.init(8, 4, 16);
  receive_and_free(&c, 8);
  c.take_data();
  assert_false(c.ctrl_needed());  // the data message returned them
}

// --- per-message caps -------------------------------------------------------------------------

void owed_data_credits_are_capped_per_message_and_the_rest_kept(void **) {
  const uint32_t owed = wire::kMaxCreditsPerMsg + 100;
  Credits c;
  c.init(8, 4, owed);
  receive_and_free(&c, owed);
  wire::Imm imm = c.take_data();
  assert_int_equal(imm.credits, wire::kMaxCreditsPerMsg);  // must fit the 16-bit field
  assert_int_equal(c.owed(), 100);                         // the rest must not be lost
  imm = c.take_data();
  assert_int_equal(imm.credits, 100);
  assert_int_equal(c.owed(), 0);
}

void owed_ctrl_credits_are_capped_per_message_and_the_rest_kept(void **) {
  const uint32_t owed = wire::kMaxCtrlCreditsPerMsg + 7;
  Credits c;
  c.init(8, 4, 16);
  for (uint32_t i = 0; i < owed; ++i) c.on_ctrl_received();
  wire::Imm imm = c.take_ctrl();
  assert_int_equal(imm.ctrl_credits, wire::kMaxCtrlCreditsPerMsg);  // must fit the 8-bit field
  assert_int_equal(c.owed_ctrl(), 7);
  imm = c.take_data();
  assert_int_equal(imm.ctrl_credits, 7);
  assert_int_equal(c.owed_ctrl(), 0);
}

// --- simulation -------------------------------------------------------------------------------
//
// Two peers A and B, each with a Credits object and a receive queue modelled as a counter of
// posted buffers (recv_depth + kCtrlDepth, as the library posts). Messages travel in order (an RC
// QP) through a simulated wire with random latency. The receiver re-posts a control buffer at once
// and a data buffer when its application frees the message; applications post and free at random
// with hold patterns that change every round. The send policy is the library's (datapath.cpp): send
// at once when nothing is queued and a data credit is left, otherwise queue; after every received
// message flush the queue, then send a control message if one is needed; after every free send a
// control message if one is needed. As the library does, the receiver checks every arrival against
// the credits it granted (on_data_arrived / on_ctrl_arrived), which an honest peer never trips.

struct Msg {
  wire::Imm imm;
  bool rndv = false;  // a rendezvous message (RTS): the receiver reads it, then counts it done
};

struct Peer {
  Credits credits;
  uint32_t recv_depth = 0;
  uint32_t posted = 0;  // receive buffers posted to the (simulated) receive queue
  uint32_t held = 0;    // received data messages the application holds
  uint32_t queued = 0;  // messages the application posted that wait for a data credit
  std::deque<bool> queued_rndv;  // ... which of them are rendezvous messages
  // Rendezvous (rndv.cpp): ours the peer has not counted done yet; the peer's being read; the
  // peer's read and not yet counted to it in an immediate.
  uint32_t rndv_waiting = 0, reading = 0, done_owed = 0;
  uint64_t data_sent = 0, data_received = 0;
  // this round's application behaviour, in percent per step
  unsigned post_pct = 0, free_pct = 0, free_all_pct = 0, deliver_pct = 0;
  unsigned rndv_pct = 0, read_pct = 0;  // rendezvous share of the posts; reads finishing
};

// One kind of broken guarantee: how often, and the first occurrence for the failure message.
struct Violations {
  unsigned long count = 0;
  char first[240] = "";
};

// What a simulation saw; plain data so that cmocka's longjmp on a failed assertion skips no
// destructor.
struct SimResult {
  unsigned long steps = 0;
  Violations rnr;             // a message arrived at a receive queue with no posted buffer
  Violations sent_unbacked;   // a message was sent while the receiver had no spare buffer
  Violations ctrl_starved;    // the last control credit went to something else than returns
  Violations ctrl_overdrawn;  // more than kCtrlDepth control credits in a peer's hands
  Violations accounting;      // the conservation of buffers and credits broke
  Violations unearned;        // on_*_arrived refused a message (no credit) or on_returned its credits
  Violations granted;         // granted + held + owed != recv depth, or != what the peer may send
  Violations deadlocks;       // a drain ended with messages queued or a peer without credits
  Violations undelivered;     // a drain ended with data sent but never received
  Violations done_stuck;      // a drain ended with rendezvous not counted done
  Violations done_unearned;   // a done count named more rendezvous than were sent
  unsigned long data_msgs = 0, ctrl_msgs = 0;  // messages sent
  unsigned long starved = 0;  // steps in which a peer had messages queued and no data credit
  unsigned long drains = 0;   // drains completed
  unsigned long rndv_msgs = 0, done_in_ctrl = 0;  // rendezvous sent; done counts in control msgs
};

class Sim {
 public:
  Sim(uint32_t depth_a, uint32_t depth_b, uint32_t seed, SimResult *r) : rng_(seed), r_(r) {
    a_.recv_depth = depth_a;
    b_.recv_depth = depth_b;
    a_.posted = depth_a + kCtrlDepth;
    b_.posted = depth_b + kCtrlDepth;
    // The hello exchange: each peer starts with the credits the other posted.
    a_.credits.init(depth_b, kCtrlDepth, depth_a);
    b_.credits.init(depth_a, kCtrlDepth, depth_b);
  }

  void run(int rounds, int steps_per_round) {
    for (int round = 0; round < rounds; ++round) {
      new_pattern(&a_);
      new_pattern(&b_);
      for (int i = 0; i < steps_per_round; ++i) step();
      drain();
    }
  }

 private:
  unsigned pct() { return unsigned(rng_() % 100); }

  // Hold patterns: hold everything (starves the peer), hold long, hold briefly, free at once.
  void new_pattern(Peer *p) {
    static const unsigned kFree[] = {0, 0, 2, 10, 50, 100};
    static const unsigned kPost[] = {0, 5, 30, 60, 100};
    static const unsigned kDeliver[] = {5, 30, 70, 100};
    p->free_pct = kFree[rng_() % 6];
    p->free_all_pct = rng_() % 4 == 0 ? 2 : 0;  // sometimes the application frees a whole batch
    p->post_pct = kPost[rng_() % 5];
    p->deliver_pct = kDeliver[rng_() % 4];
    static const unsigned kRndv[] = {0, 0, 20, 100};
    static const unsigned kRead[] = {2, 30, 100};
    p->rndv_pct = kRndv[rng_() % 4];
    p->read_pct = kRead[rng_() % 3];
  }

  void step() {
    ++r_->steps;
    Peer *order[2] = {&a_, &b_};
    if (rng_() % 2) std::swap(order[0], order[1]);
    for (Peer *p : order) {
      if (pct() < p->post_pct && p->queued < kMaxQueued) app_post(p);
      if (p->held && pct() < p->free_pct) app_free(p);
      if (p->held && pct() < p->free_all_pct)
        while (p->held) app_free(p);
      if (p->reading && pct() < p->read_pct) read_done(p);
    }
    // deliver_pct of the receiving peer models the latency of the wire towards it
    if (!ab_.empty() && pct() < b_.deliver_pct) deliver(&b_);
    if (!ba_.empty() && pct() < a_.deliver_pct) deliver(&a_);
    for (const Peer *p : {&a_, &b_})
      if (p->queued && !p->credits.can_send_data()) ++r_->starved;
    check_accounting();
  }

  // No new messages; the applications free everything as it arrives and the wire delivers all.
  // When nothing moves any more, every posted message must have been sent and received, and each
  // peer must have data credits: otherwise the peers wait for each other.
  void drain() {
    for (Peer *p : {&a_, &b_}) {
      while (p->held) app_free(p);
    }
    for (int i = 0; i < kDrainLimit && (!ab_.empty() || !ba_.empty() || a_.reading || b_.reading);
         ++i) {
      ++r_->steps;
      for (Peer *p : {&a_, &b_})
        while (p->reading) read_done(p);
      if (!ab_.empty()) deliver(&b_);
      while (b_.held) app_free(&b_);
      if (!ba_.empty()) deliver(&a_);
      while (a_.held) app_free(&a_);
      check_accounting();
    }
    for (const Peer *p : {&a_, &b_}) {
      const char *name = p == &a_ ? "A" : "B";
      if (!ab_.empty() || !ba_.empty() || p->queued != 0 || p->credits.data() == 0) {
        violation(&r_->deadlocks,
                  "deadlock after %lu steps: peer %s has %u messages queued and %u data credits, "
                  "%zu + %zu messages on the wire, although both applications freed everything",
                  r_->steps, name, unsigned(p->queued), unsigned(p->credits.data()), ab_.size(),
                  ba_.size());
        return;
      }
    }
    for (const Peer *p : {&a_, &b_}) {
      if (p->rndv_waiting || p->done_owed) {
        violation(&r_->done_stuck,
                  "after %lu steps peer %s waits for %u done counts and owes %u, with %u + %u "
                  "control credits and %u + %u owed",
                  r_->steps, p == &a_ ? "A" : "B", unsigned(p->rndv_waiting),
                  unsigned(p->done_owed), unsigned(a_.credits.ctrl()), unsigned(b_.credits.ctrl()),
                  unsigned(a_.credits.owed_ctrl()), unsigned(b_.credits.owed_ctrl()));
        return;
      }
    }
    ++r_->drains;
    if (a_.data_sent != b_.data_received || b_.data_sent != a_.data_received)
      violation(&r_->undelivered,
                "after a drain A sent %llu and B received %llu, B sent %llu and A received %llu",
                (unsigned long long)a_.data_sent,
                (unsigned long long)b_.data_received, (unsigned long long)b_.data_sent,
                (unsigned long long)a_.data_received);
  }

  Peer *peer_of(Peer *p) { return p == &a_ ? &b_ : &a_; }
  std::deque<Msg> &wire_to(Peer *p) { return p == &a_ ? ba_ : ab_; }

  void app_post(Peer *p) {
    const bool rndv = pct() < p->rndv_pct;
    if (p->queued == 0 && p->credits.can_send_data()) {
      send(p, false, rndv);
    } else {
      ++p->queued;
      p->queued_rndv.push_back(rndv);
    }
  }

  // The reads of the oldest rendezvous message being read finished: its done count is owed.
  void read_done(Peer *p) {
    --p->reading;
    ++p->done_owed;
    maybe_send_ctrl(p);
  }

  void app_free(Peer *p) {
    --p->held;
    ++p->posted;  // the buffer is re-posted
    p->credits.on_data_freed();
    maybe_send_ctrl(p);
  }

  void flush_queue(Peer *p) {
    while (p->queued && p->credits.can_send_data()) {
      --p->queued;
      const bool rndv = p->queued_rndv.front();
      p->queued_rndv.pop_front();
      send(p, false, rndv);
    }
  }

  void maybe_send_ctrl(Peer *p) {
    // As the library (datapath.cpp): the peer waits for us when our queue waits for a data
    // credit or our rendezvous messages wait for its done count.
    for (;;) {
      const bool waits = (p->queued && !p->credits.can_send_data()) || p->rndv_waiting;
      const bool returns = waits && p->credits.owed_ctrl() >= kCtrlDepth / 2;
      if (!p->credits.ctrl_due(waits, p->done_owed > 0)) break;
      if (!returns && p->credits.ctrl() < 2)
        violation(&r_->ctrl_starved, "step %lu: peer %s spends its last control credit on "
                  "something else than returning control credits", r_->steps, p == &a_ ? "A" : "B");
      send(p, true, false);
    }
  }

  void send(Peer *from, bool ctrl, bool rndv) {
    Peer *to = peer_of(from);
    std::deque<Msg> &w = wire_to(to);
    // The buffers this message may use: posted ones not already claimed by messages on the wire.
    if (to->posted <= w.size())
      violation(&r_->sent_unbacked,
                "step %lu: peer %s sends a %s message while peer %s has %u buffers posted and %zu "
                "messages already on the way",
                r_->steps, from == &a_ ? "A" : "B", ctrl ? "control" : "data",
                to == &a_ ? "A" : "B", unsigned(to->posted), w.size());
    Msg m;
    m.imm = ctrl ? from->credits.take_ctrl() : from->credits.take_data();
    m.imm.done = from->done_owed < wire::kMaxDonePerMsg ? from->done_owed : wire::kMaxDonePerMsg;
    from->done_owed -= m.imm.done;
    m.rndv = rndv;
    if (rndv) {
      ++from->rndv_waiting;
      ++r_->rndv_msgs;
    }
    if (ctrl && m.imm.done) ++r_->done_in_ctrl;
    if (ctrl) {
      ++r_->ctrl_msgs;
    } else {
      ++from->data_sent;
      ++r_->data_msgs;
    }
    w.push_back(m);
  }

  void deliver(Peer *to) {
    std::deque<Msg> &w = wire_to(to);
    Msg m = w.front();
    w.pop_front();
    if (to->posted == 0) {
      violation(&r_->rnr, "step %lu: a message arrived at peer %s with no receive buffer posted "
                "(RNR)", r_->steps, to == &a_ ? "A" : "B");
      return;
    }
    --to->posted;
    const char *t = to == &a_ ? "A" : "B";
    if (m.imm.op == wire::Opcode::Credit) {
      if (!to->credits.on_ctrl_arrived())
        violation(&r_->unearned, "step %lu: peer %s refused a control message: %u control "
                  "credits granted", r_->steps, t, unsigned(to->credits.granted_ctrl()));
      if (!to->credits.on_returned(m.imm))
        violation(&r_->unearned, "step %lu: peer %s refused the credits a control message "
                  "returned", r_->steps, t);
      ++to->posted;  // control buffers are re-posted at once
      to->credits.on_ctrl_received();
    } else {
      if (m.rndv) ++to->reading;  // read, then counted done; held until freed like any
      if (!to->credits.on_data_arrived())
        violation(&r_->unearned, "step %lu: peer %s refused a data message: %u credits granted, "
                  "%u held, %u owed", r_->steps, t, unsigned(to->credits.granted()),
                  unsigned(to->credits.held()), unsigned(to->credits.owed()));
      if (!to->credits.on_returned(m.imm))
        violation(&r_->unearned, "step %lu: peer %s refused the credits a data message returned",
                  r_->steps, t);
      ++to->held;
      ++to->data_received;
    }
    if (m.imm.done > to->rndv_waiting)
      violation(&r_->done_unearned, "step %lu: peer %s got a done count of %u with %u rendezvous "
                "waiting", r_->steps, t, unsigned(m.imm.done), unsigned(to->rndv_waiting));
    else
      to->rndv_waiting -= m.imm.done;
    flush_queue(to);
    maybe_send_ctrl(to);
  }

  // Every receive buffer of `to` is exactly one of: held by its application, a data or control
  // credit in the sender's hands, a message on the wire, a credit on its way back in an immediate,
  // or owed by `to`. Nothing may be created or lost.
  void check_direction(Peer *from, Peer *to) {
    const std::deque<Msg> &forward = wire_to(to), &back = wire_to(from);
    uint64_t data_msgs = 0, ctrl_msgs = 0, data_back = 0, ctrl_back = 0;
    for (const Msg &m : forward) (m.imm.op == wire::Opcode::Credit ? ctrl_msgs : data_msgs) += 1;
    for (const Msg &m : back) {
      data_back += m.imm.credits;
      ctrl_back += m.imm.ctrl_credits;
    }
    uint64_t data = from->credits.data() + data_msgs + data_back + to->credits.owed() + to->held;
    uint64_t ctrl = from->credits.ctrl() + ctrl_msgs + ctrl_back + to->credits.owed_ctrl();
    const char *f = from == &a_ ? "A" : "B", *t = to == &a_ ? "A" : "B";
    if (data != to->recv_depth || ctrl != kCtrlDepth || to->credits.held() != to->held ||
        to->posted + to->held != to->recv_depth + kCtrlDepth)
      violation(&r_->accounting,
                "step %lu, %s -> %s: data credits add up to %llu (expected %u), control credits "
                "to %llu (expected %u), held %u vs %u, posted %u",
                r_->steps, f, t, (unsigned long long)data, unsigned(to->recv_depth),
                (unsigned long long)ctrl, unsigned(kCtrlDepth), unsigned(to->credits.held()),
                unsigned(to->held), unsigned(to->posted));
    // What `to` believes it granted must be what `from` may still send: its credits, plus the
    // messages already on their way (they were sent on a credit), plus the credits on their way
    // back to it.
    const Credits &c = to->credits;
    if (c.granted() + c.held() + c.owed() != to->recv_depth ||
        c.granted_ctrl() + c.owed_ctrl() != kCtrlDepth ||
        c.granted() != from->credits.data() + data_msgs + data_back ||
        c.granted_ctrl() != from->credits.ctrl() + ctrl_msgs + ctrl_back)
      violation(&r_->granted,
                "step %lu, %s -> %s: %s granted %u + held %u + owed %u (depth %u), control "
                "granted %u + owed %u (depth %u); %s has %u + %u credits, %llu + %llu on the wire, "
                "%llu + %llu on the way back",
                r_->steps, f, t, t, unsigned(c.granted()), unsigned(c.held()), unsigned(c.owed()),
                unsigned(to->recv_depth), unsigned(c.granted_ctrl()), unsigned(c.owed_ctrl()),
                unsigned(kCtrlDepth), f, unsigned(from->credits.data()),
                unsigned(from->credits.ctrl()), (unsigned long long)data_msgs,
                (unsigned long long)ctrl_msgs, (unsigned long long)data_back,
                (unsigned long long)ctrl_back);
    if (from->credits.ctrl() > kCtrlDepth)
      violation(&r_->ctrl_overdrawn, "step %lu: peer %s holds %u control credits, more than the %u "
                "the peer posted", r_->steps, f, unsigned(from->credits.ctrl()),
                unsigned(kCtrlDepth));
  }

  void check_accounting() {
    check_direction(&a_, &b_);
    check_direction(&b_, &a_);
  }

  __attribute__((format(printf, 3, 4))) void violation(Violations *v, const char *fmt, ...) {
    if (++v->count == 1) {
      va_list ap;
      va_start(ap, fmt);
      vsnprintf(v->first, sizeof v->first, fmt, ap);
      va_end(ap);
    }
  }

  static constexpr uint32_t kMaxQueued = 64;
  static constexpr int kDrainLimit = 1000000;

  std::mt19937 rng_;
  SimResult *r_;
  Peer a_, b_;
  std::deque<Msg> ab_, ba_;  // messages on the wire from A to B and from B to A
};

// Depths worth trying: one buffer, odd and even, small against large.
struct SimConfig {
  uint32_t depth_a, depth_b, seed;
};
const SimConfig kConfigs[] = {
    {1, 1, 1},  {1, 2, 2},   {2, 2, 3},    {3, 3, 4},   {3, 32, 5},  {5, 5, 6},
    {7, 4, 7},  {8, 1, 8},   {16, 16, 9},  {32, 32, 10}, {33, 2, 11}, {64, 64, 12},
};

void merge(Violations *total, const Violations &v, const SimConfig &cfg) {
  total->count += v.count;
  if (!total->first[0] && v.first[0])
    snprintf(total->first, sizeof total->first, "depths A=%u B=%u seed %u: %.200s",
             unsigned(cfg.depth_a), unsigned(cfg.depth_b), unsigned(cfg.seed), v.first);
}

// Runs every configuration and adds up what went wrong.
SimResult simulate_all_configs() {
  SimResult total;
  for (const SimConfig &cfg : kConfigs) {
    SimResult r;
    {
      Sim sim(cfg.depth_a, cfg.depth_b, cfg.seed, &r);
      sim.run(200, 500);
    }
    total.steps += r.steps;
    merge(&total.rnr, r.rnr, cfg);
    merge(&total.sent_unbacked, r.sent_unbacked, cfg);
    merge(&total.ctrl_starved, r.ctrl_starved, cfg);
    merge(&total.ctrl_overdrawn, r.ctrl_overdrawn, cfg);
    merge(&total.accounting, r.accounting, cfg);
    merge(&total.unearned, r.unearned, cfg);
    merge(&total.granted, r.granted, cfg);
    merge(&total.deadlocks, r.deadlocks, cfg);
    merge(&total.undelivered, r.undelivered, cfg);
    merge(&total.done_stuck, r.done_stuck, cfg);
    merge(&total.done_unearned, r.done_unearned, cfg);
    total.rndv_msgs += r.rndv_msgs;
    total.done_in_ctrl += r.done_in_ctrl;
    total.data_msgs += r.data_msgs;
    total.ctrl_msgs += r.ctrl_msgs;
    total.starved += r.starved;
    total.drains += r.drains;
  }
  return total;
}

// The simulation is deterministic (fixed seeds): run it once and let every test read the result.
const SimResult &simulate_all() {
  static const SimResult result = simulate_all_configs();
  return result;
}

// Prints what went wrong before the assertion fails, which only shows the count.
void report(const SimResult &r, const Violations &v, const char *what) {
  if (v.count)
    print_error("%lu times in %lu steps %s; the first: %s\n", v.count, r.steps, what, v.first);
}

void simulation_never_sends_without_a_posted_receive_buffer(void **) {
  const SimResult &r = simulate_all();
  report(r, r.sent_unbacked, "a peer sent without a spare receive buffer at the other end");
  report(r, r.rnr, "a message arrived with no receive buffer posted (RNR)");
  assert_int_equal(r.sent_unbacked.count, 0);
  assert_int_equal(r.rnr.count, 0);
}

void simulation_never_creates_or_loses_credits(void **) {
  const SimResult &r = simulate_all();
  report(r, r.accounting, "buffers and credits did not add up");
  assert_int_equal(r.accounting.count, 0);
}

void simulation_keeps_the_last_control_credit_for_returning_control_credits(void **) {
  const SimResult &r = simulate_all();
  report(r, r.ctrl_starved, "the last control credit was spent on something else");
  report(r, r.ctrl_overdrawn, "a peer held more control credits than the other side posted");
  assert_int_equal(r.ctrl_starved.count, 0);
  assert_int_equal(r.ctrl_overdrawn.count, 0);
}

void simulation_never_deadlocks_once_the_applications_free_everything(void **) {
  const SimResult &r = simulate_all();
  report(r, r.deadlocks, "the peers waited for each other after everything was freed");
  report(r, r.undelivered, "data was sent but never received");
  assert_int_equal(r.deadlocks.count, 0);
  assert_int_equal(r.undelivered.count, 0);
}

// Rendezvous messages: every one is counted done once read, also when both sides read at once and
// the done counts need control messages (rndv.cpp; the control credit kept in reserve).
void simulation_counts_every_rendezvous_done(void **) {
  const SimResult &r = simulate_all();
  report(r, r.done_stuck, "rendezvous waited for their done counts after everything was read");
  report(r, r.done_unearned, "a done count named rendezvous that were never sent");
  print_message("%lu rendezvous, %lu control messages with done counts\n", r.rndv_msgs,
                r.done_in_ctrl);
  assert_int_equal(r.done_stuck.count, 0);
  assert_int_equal(r.done_unearned.count, 0);
  assert_true(r.rndv_msgs > 10000);
  assert_true(r.done_in_ctrl > 1000);
}

void simulation_never_receives_a_message_it_granted_no_credit_for(void **) {
  const SimResult &r = simulate_all();
  report(r, r.unearned, "a receiver refused a message of an honest peer for lack of a credit");
  report(r, r.granted, "the granted credits did not match the peer's or the recv depth");
  assert_int_equal(r.unearned.count, 0);
  assert_int_equal(r.granted.count, 0);
}

void simulation_reaches_starvation_and_sends_control_messages(void **) {
  // Guards the tests above against passing because the simulation never got anywhere near the
  // cases they are about.
  const SimResult &r = simulate_all();
  print_message("%lu steps: %lu data and %lu control messages, %lu starved steps, %lu drains\n",
                r.steps, r.data_msgs, r.ctrl_msgs, r.starved, r.drains);
  assert_true(r.data_msgs > 100000);  // data messages exchanged
  assert_true(r.ctrl_msgs > 1000);    // credit-only messages were needed
  assert_true(r.starved > 1000);      // steps with messages queued for lack of data credits
  assert_true(r.drains > 100);        // rounds that ended in a deadlock check
}

}  // namespace

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(init_takes_data_and_ctrl_credits_from_the_peers_hello),
      cmocka_unit_test(init_owes_nothing_and_holds_nothing),
      cmocka_unit_test(init_grants_the_peer_our_recv_depth_and_ctrl_depth),
      cmocka_unit_test(init_resets_the_granted_credits),
      cmocka_unit_test(init_depth_does_not_change_what_we_may_send),
      cmocka_unit_test(zero_credits_allow_no_send),
      cmocka_unit_test(take_data_spends_one_data_credit),
      cmocka_unit_test(take_data_until_none_left_stops_sending),
      cmocka_unit_test(take_ctrl_spends_one_ctrl_credit_and_marks_the_message),
      cmocka_unit_test(take_with_nothing_owed_carries_no_credits),
      cmocka_unit_test(take_data_carries_owed_credits_and_resets_them),
      cmocka_unit_test(take_ctrl_carries_owed_credits_and_resets_them),
      cmocka_unit_test(held_messages_are_not_returned_until_freed),
      cmocka_unit_test(on_returned_adds_data_and_ctrl_credits),
      cmocka_unit_test(on_returned_refuses_more_credits_than_were_spent),
      cmocka_unit_test(on_returned_with_nothing_changes_nothing),
      cmocka_unit_test(received_data_is_held_until_freed_then_owed),
      cmocka_unit_test(dropped_data_is_not_owed),
      cmocka_unit_test(received_ctrl_is_owed_at_once),
      cmocka_unit_test(data_arrival_is_refused_once_the_granted_credits_are_used_up),
      cmocka_unit_test(refused_data_arrival_changes_nothing),
      cmocka_unit_test(data_arrival_is_allowed_again_after_take_data_returned_credits),
      cmocka_unit_test(data_arrival_is_allowed_again_after_take_ctrl_returned_credits),
      cmocka_unit_test(ctrl_arrival_is_refused_once_the_granted_ctrl_credits_are_used_up),
      cmocka_unit_test(ctrl_arrival_is_allowed_again_after_take_data_returned_ctrl_credits),
      cmocka_unit_test(credits_held_back_are_not_usable_until_released),
      cmocka_unit_test(only_the_credits_held_back_wait),
      cmocka_unit_test(control_credits_of_a_return_or_top_up_are_held_back),
      cmocka_unit_test(ctrl_arrival_is_allowed_again_after_take_ctrl_returned_ctrl_credits),
      cmocka_unit_test(data_and_ctrl_arrivals_spend_separate_credits),
      cmocka_unit_test(granted_grows_by_exactly_the_credits_a_message_returned),
      cmocka_unit_test(granted_held_and_owed_always_add_up_to_the_recv_depth),
      cmocka_unit_test(ctrl_not_needed_when_nothing_is_owed),
      cmocka_unit_test(ctrl_not_needed_for_owed_ctrl_credits_alone),
      cmocka_unit_test(ctrl_not_needed_below_half_the_depth),
      cmocka_unit_test(ctrl_needed_at_half_the_depth),
      cmocka_unit_test(shared_ctrl_needed_events_and_polling),
      cmocka_unit_test(ctrl_threshold_rounds_half_an_odd_depth_down),
      cmocka_unit_test(ctrl_threshold_is_at_least_one_for_depth_one),
      cmocka_unit_test(ctrl_needed_when_the_peer_is_starved_below_the_threshold),
      cmocka_unit_test(ctrl_not_needed_when_the_peer_still_has_a_credit),
      cmocka_unit_test(ctrl_not_needed_after_a_message_carried_the_owed_credits),
      cmocka_unit_test(owed_data_credits_are_capped_per_message_and_the_rest_kept),
      cmocka_unit_test(owed_ctrl_credits_are_capped_per_message_and_the_rest_kept),
      cmocka_unit_test(simulation_never_sends_without_a_posted_receive_buffer),
      cmocka_unit_test(simulation_never_creates_or_loses_credits),
      cmocka_unit_test(simulation_keeps_the_last_control_credit_for_returning_control_credits),
      cmocka_unit_test(simulation_never_deadlocks_once_the_applications_free_everything),
      cmocka_unit_test(simulation_never_receives_a_message_it_granted_no_credit_for),
      cmocka_unit_test(simulation_counts_every_rendezvous_done),
      cmocka_unit_test(simulation_reaches_starvation_and_sends_control_messages),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
