// The data path: send queue, in-flight list, credit-only messages, completions (no allocation);
// what arrives is inbound.cpp's.
#include <initializer_list>

#include "internal.hpp"

namespace ibmsg {
namespace {

int post_data(Socket *s, Slot *slot, wire::Imm imm) {
  uint32_t len = uint32_t(slot->msg->size);
  const uint8_t *buf = slot->buf;
  const tp::Mr *mr = slot->pool->mr;
  tp::Segment tail{nullptr, 0, nullptr};
  if (slot->work.rndv) {
    len = rndv_fill_rts(s, slot);
    imm.op = wire::Opcode::Rendezvous;
  } else if (slot->has_imm) {
    // The immediate follows the payload, little-endian: in the pool's room behind it, or, for a
    // payload in a region, in the slot as a second element.
    uint8_t *t = slot->region ? slot->buf : slot->buf + len;
    t[0] = uint8_t(slot->imm);
    t[1] = uint8_t(slot->imm >> 8);
    t[2] = uint8_t(slot->imm >> 16);
    t[3] = uint8_t(slot->imm >> 24);
    if (slot->region) tail = {t, wire::kImmTrailer, slot->pool->mr};
    else len += wire::kImmTrailer;
    imm.op = wire::Opcode::DataImm;
  } else if (slot->req_kind != uint8_t(MsgKind::Plain)) {
    // A request or reply: its trailer follows the payload, as an immediate does.
    uint8_t *t = slot->region ? slot->buf : slot->buf + len;
    wire::ReqTrailer tr;
    tr.id = slot->req_id;
    tr.retry = slot->req_retry;
    tr.floor = slot->req_floor;
    wire::encode_req_trailer(tr, t);
    if (slot->region) tail = {t, uint32_t(wire::kReqTrailer), slot->pool->mr};
    else len += wire::kReqTrailer;
    imm.op = slot->req_kind == uint8_t(MsgKind::Request) ? wire::Opcode::Request : wire::Opcode::Reply;
  }
  if (slot->region && !slot->work.rndv) {  // zero copy: straight from the region
    buf = static_cast<const uint8_t *>(slot->msg->data);
    mr = slot->rmr;
  }
  int rc = tp::post_send_imm(s->id, &slot->work.wr, buf, len, mr, wire::encode_imm(imm),
                             s->max_inline, tail.len ? &tail : nullptr);
  return rc ? rc : posted(s, true);
}

}  // namespace

int send_now(Socket *s, Slot *slot) {
  Credits saved = s->credits;
  const uint32_t done = s->done_owed;
  wire::Imm imm = s->credits.take_data();
  imm.done = rndv_take_done(s);
  // More waits behind it: a peer that shares its buffers grants more.
  imm.wants = s->credits.shared_wire() && !s->queue.empty();
  s->wants_told = false;  // if it runs out again, it says so again
  s->live.stalled = false;
  int rc = post_data(s, slot, imm);
  if (rc) {
    s->credits = saved;
    s->done_owed = done;
    if (slot->link.linked()) s->rndv_wait.remove(slot);
    return rc;
  }
  s->live.answer_due = false;
  slot->state = SlotState::InFlight;
  slot->work.done = slot->work.sent = slot->work.read = false;
  slot->work.read_status = IBMSG_OK;
  s->flight.push_back(&slot->work);
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
  Credits saved = s->credits;
  const uint32_t done = s->done_owed;
  wire::Imm imm = give_back ? s->credits.take_return(give_back) : s->credits.take_ctrl();
  if (op == wire::Opcode::Keepalive) imm.op = op;
  imm.wants = wants;
  imm.done = rndv_take_done(s);
  if (tp::post_send_imm(s->id, &s->ctrl_wr, nullptr, 0, nullptr, wire::encode_imm(imm), 0)) {
    s->credits = saved;
    s->done_owed = done;
    socket_close(s, IBMSG_EIO);
    return false;
  }
  ++s->ctrl_in_flight;
  s->live.answer_due = false;
  if (posted(s, true)) {
    socket_close(s, IBMSG_EIO);
    return false;
  }
  return true;
}

void maybe_send_ctrl(Socket *s) {
  if (s->lingering) {  // closing once the done counts are out
    send_last_done(s);
    if (!s->done_owed) socket_close(s, IBMSG_OK);
    return;
  }
  // Control credits ride on messages sent for other reasons. A side that sends only RDMA writes
  // with immediate sends none, while its peer spends control credits returning the data credits
  // those writes took: once this side waits for a data credit, it returns the control credits it
  // owes on their own. A side whose rendezvous messages wait for the peer's done count likewise:
  // the peer may need control credits to send it.
  while (s->state == State::Connected && s->ctrl_in_flight < kCtrlDepth) {
    const Work *head = s->queue.front();
    bool waits = (head && (head->wr.op == tp::Op::Send || head->wr.op == tp::Op::WriteImm) &&
                  !s->credits.can_send_data()) ||
                 !s->rndv_wait.empty();
    const bool fin = rndv_fin_due(s);
    // Data credits above the peer's base that nothing waits for go back to its shared pool;
    // data that waits for credits is told once (the peer's pool may have more for it).
    uint32_t surplus = head ? 0 : s->credits.surplus();
    if (surplus > wire::kMaxSharedCreditsPerMsg) surplus = wire::kMaxSharedCreditsPerMsg;
    const bool tell = s->credits.shared_wire() && !s->wants_told && head &&
                      (head->wr.op == tp::Op::Send || head->wr.op == tp::Op::WriteImm) &&
                      !s->credits.can_send_data();
    // The peer probed (keepalive): the answer returns its control credit, so it may be the last.
    if (s->live.answer_due && !fin && s->credits.can_send_ctrl()) {
      if (!post_ctrl(s)) return;
      continue;
    }
    if (!s->credits.ctrl_due(waits, s->done_owed > 0 || fin || surplus || tell)) return;
    if (fin) {  // a FIN (with the done counts before it) in the place of a credit-only message
      if (!rndv_send_fin(s)) return;
      continue;
    }
    if (tell) s->wants_told = true;
    if (!post_ctrl(s, surplus, tell)) return;
  }
}

void send_last_done(Socket *s) {
  // Closing: no control credit needs keeping for later, the last one may carry them.
  while (s->state == State::Connected && s->done_owed && s->credits.can_send_ctrl() &&
         s->ctrl_in_flight < kCtrlDepth && post_ctrl(s)) continue;
}

bool work_can_go(const Socket *s, const Work *w) {
  switch (w->wr.op) {
    case tp::Op::Send: return s->credits.can_send_data();
    case tp::Op::WriteImm:
      return s->credits.can_send_data() && s->ops_in_flight < uint32_t(s->opts.rdma_depth);
    default: return s->ops_in_flight < uint32_t(s->opts.rdma_depth);
  }
}

void flush_sends(Socket *s) {
  // A disconnect that lingers sends only its done counts: the queue is canceled at the close.
  while (s->state == State::Connected && !s->lingering) {
    Work *w = s->queue.front();
    if (!w || !work_can_go(s, w)) {
      if (w && !s->live.stalled && !s->credits.can_send_data()) {
        s->live.stalled = true;
        ++s->stats.credit_stalls;
        IBMSG_LOG(s, IBMSG_LOG_DEBUG, "credit stall: the peer has granted no data credit");
      }
      return;
    }
    s->queue.remove(w);
    if (post_work(s, w)) {
      // Back in front: the teardown cancels it in order with the rest.
      s->queue.push_front(w);
      socket_close(s, IBMSG_EIO);
      return;
    }
  }
}

namespace {

void notify_sent(Socket *s, Slot *slot, int status) {
  ibmsg_buffer *msg = slot->msg;
  if (slot->link.linked()) s->rndv_wait.remove(slot);  // failed or canceled before it was read
  if (slot->xmr) tp::mr_deregister(slot->xmr);  // the peer reads no more (or never will)
  slot->xmr = nullptr;
  slot->state = SlotState::Allocated;
  msg->status = status == IBMSG_OK ? IBMSG_SENT : IBMSG_SEND_FAILED;
  if (slot->req_internal) {  // a kept reply sent again (dedup.cpp): the library's own
    slot->req_internal = false;
    msg_free(msg);
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
  for (Work *x = s->flight.front(); x && x->done; x = s->flight.front()) {
    s->flight.remove(x);
    notify_work(s, x, x->status);
  }
}

void work_done(Socket *s, Work *w, int status, int close_reason) {
  // Only the last message of a post list is signaled: whatever this completion says, the work
  // before it completed, and what of it is not marked yet succeeded (a failed or flushed work
  // request completes on its own, signaled or not, before this one).
  // A rendezvous message's RTS went; the message is done once the peer read it too.
  for (Work *x = s->flight.front(); x && x != w; x = s->flight.next(x)) {
    if (!x->sent) {
      if (x->wr.op != tp::Op::Send && s->ops_in_flight) --s->ops_in_flight;  // (never today)
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
