// The send path: the send queue and in-flight list, posting messages (eager, or the RTS of a
// rendezvous) and one-sided operations in order under the credits, credit-only messages and
// FINs' turn, and the callbacks of what completed, in posting order (no allocation). What
// arrives is inbound.cpp's.
#include "datapath.hpp"

#include <initializer_list>

#include "internal.hpp"
#include "batch.hpp"
#include "memory.hpp"
#include "poll.hpp"
#include "recv.hpp"
#include "rndv.hpp"
#include "send_slots.hpp"

namespace ibmsg {

namespace {

// The trailer of a request or reply slot carries (behind its payload, or behind its RTS).
wire::ReqTrailer req_trailer(const Slot *slot) {
  wire::ReqTrailer tr;
  tr.id = slot->req.id;
  tr.retry = slot->req.retry;
  tr.floor = slot->req.floor;
  return tr;
}

}  // namespace

// --- rendezvous, the sender's side (the receiver's is rndv.cpp's) ---

// The peer read our rendezvous message w (status IBMSG_OK) or declined it: w is done once its
// RTS's send completed too.
void rndv_read_done(Work *w, int status) {
  w->read = true;
  w->read_status = status;
  if (w->sent && !w->done) {
    w->done = true;
    w->status = status;
  }
}

uint32_t rndv_fill_rts(Socket *s, Slot *slot) {
  wire::Rts r;
  r.id = uint32_t(slot - slot->pool->slots);
  r.rkey = tp::mr_rkey(slot->large ? slot->large->mr : slot->src.xmr);
  r.has_imm = slot->has_imm;
  r.imm = slot->imm;
  // The large buffer itself, whatever the application did to msg->data (a region message's
  // data was checked against its region when posted).
  r.addr = slot->large ? reinterpret_cast<uintptr_t>(slot->large->mem)
                       : reinterpret_cast<uintptr_t>(slot->msg->data);
  r.length = slot->msg->size;
  r.req = slot->req.kind;  // a request or reply names itself in a trailer behind the RTS
  wire::encode_rts(r, slot->buf);
  s->rndv.wait.push_back(slot);  // popped when read, or when its posting fails (send_now)
  if (!r.req) return uint32_t(wire::kRtsSize);
  wire::encode_req_trailer(req_trailer(slot), slot->buf + wire::kRtsSize);
  return uint32_t(wire::kRtsSize + wire::kReqTrailer);
}

bool rndv_on_done(Socket *s, uint32_t n) {
  if (n > s->rndv.wait.size()) return false;
  while (n--) rndv_read_done(&s->rndv.wait.pop_front()->work, IBMSG_OK);
  notify_front(s);
  return true;
}

uint32_t rndv_done_due(const Socket *s) {
  return s->rndv.done_owed < wire::kMaxDonePerMsg ? s->rndv.done_owed : wire::kMaxDonePerMsg;
}

// --- one-sided operations in the send queue (rdma.cpp checks and queues them) ---

// Gives the table entry back and detaches the application's struct; returns it.
ibmsg_op *op_release(Socket *s, Op *op, int status) {
  ibmsg_op *pub = op->pub;
  --op->local->busy;
  op->pub = nullptr;
  op->local = nullptr;
  s->rdma.free.push_front(op);
  pub->impl = nullptr;
  pub->check = 0;
  pub->status = status;
  return pub;
}

int op_send_now(Socket *s, Op *op) {
  int err = tp::post_rdma(s->id, &op->work.wr, op->rw, s->res.max_inline);
  if (!err) err = posted(s, true);
  if (err) return err;
  if (op->work.wr.op == tp::Op::WriteImm) {
    s->tx.credits.spend_data();  // the peer's receive buffer
    s->tx.wants_told = false;    // if it runs out again, it says so again (maybe_send_ctrl)
  }
  ++s->tx.ops_in_flight;
  op->work.done = false;
  op->work.sent = false;
  s->tx.flight.push_back(&op->work);
  return IBMSG_OK;
}

void op_finish(Socket *s, Op *op, int status) {
  ibmsg_op *pub = op_release(s, op, status);
  if (pub->done) pub->done(s->pub, pub, status);
}

namespace {

[[gnu::always_inline]] inline int post_data(Socket *s, Slot *slot, wire::Imm imm) {
  uint32_t len = uint32_t(slot->msg->size);
  const uint8_t *buf = slot->buf;
  const tp::Mr *mr = slot->pool->mr;
  // A second element only for a trailer behind a payload in a region (not filled otherwise: its
  // stores would be on every message's path).
  tp::Segment tail;
  const tp::Segment *second = nullptr;
  if (slot->work.rndv) {
    len = rndv_fill_rts(s, slot);
    imm.op = wire::Opcode::Rendezvous;
  } else if (slot->has_imm) {
    // The immediate follows the payload, little-endian: in the pool's room behind it, or, for a
    // payload in a region, in the slot as a second element.
    uint8_t *t = slot->src.region ? slot->buf : slot->buf + len;
    wire::encode_imm_trailer(slot->imm, t);
    if (slot->src.region) second = &(tail = {t, wire::kImmTrailer, slot->pool->mr});
    else len += wire::kImmTrailer;
    imm.op = wire::Opcode::DataImm;
  } else if (slot->req.kind != uint8_t(MsgKind::Plain)) {
    // A request or reply: its trailer follows the payload, as an immediate does.
    uint8_t *t = slot->src.region ? slot->buf : slot->buf + len;
    wire::encode_req_trailer(req_trailer(slot), t);
    if (slot->src.region) second = &(tail = {t, uint32_t(wire::kReqTrailer), slot->pool->mr});
    else len += wire::kReqTrailer;
    imm.op = slot->req.kind == uint8_t(MsgKind::Request) ? wire::Opcode::Request : wire::Opcode::Reply;
  }
  if (slot->src.region && !slot->work.rndv) {  // zero copy: straight from the region
    buf = static_cast<const uint8_t *>(slot->msg->data);
    mr = slot->src.mr;
  }
  int rc = tp::post_send_imm(s->id, &slot->work.wr, buf, len, mr, wire::encode_imm(imm),
                             s->res.max_inline, second);
  return rc ? rc : posted(s, true);
}

}  // namespace

namespace {

// send_now's body, inlined into send_first too: there it saves its registers once.
[[gnu::always_inline]] inline int send_inline(Socket *s, Slot *slot) {
  wire::Imm imm = s->tx.credits.carry(Credits::Spend::Data);
  imm.done = rndv_done_due(s);
  // More waits behind it: a peer that shares its buffers grants more.
  imm.wants = s->tx.credits.shared_wire() && !s->tx.queue.empty();
  s->tx.wants_told = false;  // if it runs out again, it says so again
  s->live.stalled = false;
  int rc = post_data(s, slot, imm);
  if (rc) {
    if (slot->link.linked()) s->rndv.wait.remove(slot);
    return rc;
  }
  s->tx.credits.taken(imm, Credits::Spend::Data, recv_grants_held(s));
  s->rndv.done_owed -= imm.done;
  s->live.answer_due = false;
  slot->state = SlotState::InFlight;
  slot->work.done = slot->work.sent = slot->work.read = false;
  slot->work.read_status = IBMSG_OK;
  s->tx.flight.push_back(&slot->work);
  return IBMSG_OK;
}

}  // namespace

int send_now(Socket *s, Slot *slot) { return send_inline(s, slot); }

[[gnu::noinline]] int send_first(Socket *s, Slot *slot) {
  if (int rc = send_inline(s, slot)) {
    // A queue pair that refuses a work request is broken: the connection closes. The message
    // stays the application's (no callback).
    socket_close(s, rc);
    return rc;
  }
  return send_waiting(s, slot);
}

// (Not inlined into msg_post: its calls would make msg_post's common path save registers.)
[[gnu::noinline]] int send_later(Socket *s, Slot *slot) {
  slot->state = SlotState::Queued;
  s->tx.queue.push_back(&slot->work);
  maybe_send_ctrl(s);  // it may wait for a credit the peer cannot return without control credits
  return send_waiting(s, slot);
}

int send_waiting(Socket *s, Slot *slot) {
  slot->msg->status = IBMSG_WAITING;
  poll_touch(s);  // its completion (and the answer) will come soon
  return IBMSG_OK;
}

namespace {

int post_work(Socket *s, Work *w) {
  if (w->wr.op == tp::Op::Send) return send_now(s, static_cast<Slot *>(w->wr.owner));
  return op_send_now(s, static_cast<Op *>(w->wr.owner));
}

}  // namespace

// A credit-only message, when credits are owed and no data message can carry them.
bool post_ctrl(Socket *s, uint32_t give_back, bool wants, wire::Opcode op) {
  const Credits::Spend spend = give_back ? Credits::Spend::Return : Credits::Spend::Ctrl;
  wire::Imm imm = s->tx.credits.carry(spend, give_back);
  if (op == wire::Opcode::Keepalive) imm.op = op;
  imm.wants = wants;
  imm.done = rndv_done_due(s);
  if (tp::post_send_imm(s->id, &s->tx.ctrl_wr, nullptr, 0, nullptr, wire::encode_imm(imm), 0)) {
    socket_close(s, IBMSG_EIO);  // (nothing was taken)
    return false;
  }
  s->tx.credits.taken(imm, spend, recv_grants_held(s));
  s->rndv.done_owed -= imm.done;
  ++s->tx.ctrl_in_flight;
  s->live.answer_due = false;
  if (posted(s, true)) {
    socket_close(s, IBMSG_EIO);
    return false;
  }
  return true;
}

void ctrl_due(Socket *s) {
  // Outside callbacks nothing is posted before the end of the round: at once. (A teardown may
  // queue its own socket here while it gives buffers back; it takes it off the list before
  // freeing it, close.cpp.)
  if (s->loop->depth == 0) {
    maybe_send_ctrl(s);
    return;
  }
  s->tx.ctrl_check = true;
  flush_later(s);
}

void ctrl_round_end(Socket *s) {
  uint32_t v;
  if (s->state == State::Connected && s->res.has_qp &&
      (s->tx.credits.owed() || s->tx.credits.owed_ctrl()) && tp::pending_imm(s->id, &v)) {
    // (a reply posted in message_received before the request was freed: its credit goes along)
    wire::Imm imm = wire::imm_of(v, s->tx.credits.shared_wire());
    s->tx.credits.top_up(&imm);  // (at the round's end: no completion of a poll is to come)
    tp::set_pending_imm(s->id, wire::encode_imm(imm));
  }
  maybe_send_ctrl(s);
}

void maybe_send_ctrl(Socket *s) {
  if (s->state == State::Lingering) {  // closing once the done counts are out
    send_last_done(s);
    if (!s->rndv.done_owed) socket_close(s, IBMSG_OK);
    return;
  }
  // Control credits ride on messages sent for other reasons. A side that sends only RDMA writes
  // with immediate sends none, while its peer spends control credits returning the data credits
  // those writes took: once this side waits for a data credit, it returns the control credits it
  // owes on their own. A side whose rendezvous messages wait for the peer's done count likewise:
  // the peer may need control credits to send it.
  while (s->state == State::Connected && s->tx.ctrl_in_flight < kCtrlDepth) {
    const Work *head = s->tx.queue.front();
    bool waits = (head && (head->wr.op == tp::Op::Send || head->wr.op == tp::Op::WriteImm) &&
                  !s->tx.credits.can_send_data()) ||
                 !s->rndv.wait.empty();
    const bool fin = rndv_fin_due(s);
    // Data credits above the peer's base that nothing waits for go back to its shared pool;
    // data that waits for credits is told once (the peer's pool may have more for it).
    uint32_t surplus = head ? 0 : s->tx.credits.surplus();
    if (surplus > wire::kMaxSharedCreditsPerMsg) surplus = wire::kMaxSharedCreditsPerMsg;
    const bool tell = s->tx.credits.shared_wire() && !s->tx.wants_told && head &&
                      (head->wr.op == tp::Op::Send || head->wr.op == tp::Op::WriteImm) &&
                      !s->tx.credits.can_send_data();
    // The peer probed (keepalive): the answer returns its control credit, so it may be the last.
    if (s->live.answer_due && !fin && s->tx.credits.can_send_ctrl()) {
      if (!post_ctrl(s)) return;
      continue;
    }
    if (!s->tx.credits.ctrl_due(waits, s->rndv.done_owed > 0 || fin || surplus || tell,
                                s->poll_node.linked()))
      return;
    if (fin) {  // a FIN (with the done counts before it) in the place of a credit-only message
      if (!rndv_send_fin(s)) return;
      continue;
    }
    if (tell) s->tx.wants_told = true;
    if (!post_ctrl(s, surplus, tell)) return;
  }
}

void send_last_done(Socket *s) {
  // Closing: no control credit needs keeping for later, the last one may carry them.
  while ((s->state == State::Connected || s->state == State::Lingering) && s->rndv.done_owed &&
         s->tx.credits.can_send_ctrl() &&
         s->tx.ctrl_in_flight < kCtrlDepth && post_ctrl(s)) continue;
}

bool work_can_go(const Socket *s, const Work *w) {
  switch (w->wr.op) {
    case tp::Op::Send: return s->tx.credits.can_send_data();
    case tp::Op::WriteImm:
      return s->tx.credits.can_send_data() && s->tx.ops_in_flight < uint32_t(s->opts.rdma_depth);
    default: return s->tx.ops_in_flight < uint32_t(s->opts.rdma_depth);
  }
}

void flush_sends(Socket *s) {
  // A disconnect that lingers sends only its done counts: the queue is canceled at the close.
  while (s->state == State::Connected) {
    Work *w = s->tx.queue.front();
    if (!w || !work_can_go(s, w)) {
      if (w && !s->live.stalled && !s->tx.credits.can_send_data()) {
        s->live.stalled = true;
        ++s->stats.credit_stalls;
        IBMSG_LOG(s, IBMSG_LOG_DEBUG, "credit stall: the peer has granted no data credit");
      }
      return;
    }
    s->tx.queue.remove(w);
    if (post_work(s, w)) {
      // Back in front: the teardown cancels it in order with the rest.
      s->tx.queue.push_front(w);
      socket_close(s, IBMSG_EIO);
      return;
    }
  }
}

namespace {

void notify_sent(Socket *s, Slot *slot, int status) {
  ibmsg_buffer *msg = slot->msg;
  if (slot->link.linked()) s->rndv.wait.remove(slot);  // failed or canceled before it was read
  if (slot->src.xmr) tp::mr_deregister(slot->src.xmr);  // the peer reads no more (or never will)
  slot->src.xmr = nullptr;
  slot->state = SlotState::Allocated;
  msg->status = status == IBMSG_OK ? IBMSG_SENT : IBMSG_SEND_FAILED;
  if (slot->req.internal) {  // a kept reply sent again (dedup.cpp): the library's own
    slot->req.internal = false;
    msg->impl = nullptr;
    msg->data = nullptr;
    msg->status = IBMSG_FREED;
    send_free(slot);
    return;
  }
  if (status == IBMSG_OK) {
    ++s->stats.msgs_sent;
    s->stats.bytes_sent += msg->size;
  }
  if (auto cb = s->loop->pub->message_sent) cb(s->pub, msg, status);
}

}  // namespace

void send_on_wc(Socket *s, Slot *slot, const tp::Completion &wc) {
  if (slot->state != SlotState::InFlight || slot->work.done) return;  // cannot happen
  const bool ok = wc.status == tp::WcStatus::Ok;
  const int st = tp::wc_work_status(wc.status);
  work_done(s, &slot->work, st, ok ? IBMSG_OK : tp::wc_error(wc.status));
}

void notify_work(Socket *s, Work *w, int status) {
  if (w->wr.op == tp::Op::Send) notify_sent(s, static_cast<Slot *>(w->wr.owner), status);
  else op_finish(s, static_cast<Op *>(w->wr.owner), status);
}

// The callbacks of the completed work at the front of the flight list, in posting order. One may
// post (at the back, not done) or close the connection (the teardown empties the list later).
void notify_front(Socket *s) {
  for (Work *x = s->tx.flight.front(); x && x->done; x = s->tx.flight.front()) {
    s->tx.flight.remove(x);
    notify_work(s, x, x->status);
  }
}

void work_done(Socket *s, Work *w, int status, int close_reason) {
  // Only the last message of a post list is signaled: whatever this completion says, the work
  // before it completed, and what of it is not marked yet succeeded (a failed or flushed work
  // request completes on its own, signaled or not, before this one).
  // A rendezvous message's RTS went; the message is done once the peer read it too.
  for (Work *x = s->tx.flight.front(); x && x != w; x = s->tx.flight.next(x)) {
    if (!x->sent) {
      if (x->wr.op != tp::Op::Send && s->tx.ops_in_flight) --s->tx.ops_in_flight;  // (never today)
      x->sent = true;
      if (!x->rndv || x->read) {
        x->done = true;
        x->status = x->rndv ? x->read_status : IBMSG_OK;
      }
    }
  }
  if (close_reason != IBMSG_OK) {
    notify_front(s);  // what succeeded before it is reported first
    socket_close(s, close_reason);
  }
  w->sent = true;
  if (status != IBMSG_OK || !w->rndv || w->read) {
    w->done = true;
    w->status = status != IBMSG_OK || !w->rndv ? status : w->read_status;
  }
  notify_front(s);
}

}  // namespace ibmsg
