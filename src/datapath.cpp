// The data path: the send queue and the in-flight list, credit-only messages, completions, and
// the bodies of alloc / post / free. Nothing here allocates or registers memory.
#include <initializer_list>

#include "internal.hpp"

namespace ibmsg {
namespace {

int post_data(Socket *s, Slot *slot, wire::Imm imm) {
  uint32_t len = uint32_t(slot->msg->size);
  if (slot->has_imm) {
    // The immediate follows the payload, little-endian (the pools have room for it).
    uint8_t *t = slot->buf + len;
    t[0] = uint8_t(slot->imm);
    t[1] = uint8_t(slot->imm >> 8);
    t[2] = uint8_t(slot->imm >> 16);
    t[3] = uint8_t(slot->imm >> 24);
    len += wire::kImmTrailer;
    imm.op = wire::Opcode::DataImm;
  }
  int rc = tp::post_send_imm(s->id, &slot->work.wr, slot->buf, len, slot->pool->mr,
                             wire::encode_imm(imm), s->max_inline);
  return rc ? rc : posted(s, true);
}

// Posts one message with a data credit; on failure the credits are as before.
int send_now(Socket *s, Slot *slot) {
  Credits saved = s->credits;
  int rc = post_data(s, slot, s->credits.take_data());
  if (rc) {
    s->credits = saved;
    return rc;
  }
  slot->state = SlotState::InFlight;
  slot->work.done = false;
  s->flight.push_back(&slot->work);
  return IBMSG_OK;
}

int post_work(Socket *s, Work *w) {
  if (w->wr.op == tp::Op::Send) return send_now(s, static_cast<Slot *>(w->wr.owner));
  return op_send_now(s, static_cast<Op *>(w->wr.owner));
}

}  // namespace

// A credit-only message, when credits are owed and no data message can carry them.
void maybe_send_ctrl(Socket *s) {
  if (s->state != State::Connected || !s->credits.can_send_ctrl() ||
      s->ctrl_in_flight >= kCtrlDepth)
    return;
  // Control credits ride on messages sent for other reasons. A side that sends only RDMA writes
  // with immediate sends none, while its peer spends control credits returning the data credits
  // those writes took: once this side waits for a data credit, it returns the control credits it
  // owes on their own (from half of them: the peer owes one for this message, so two waiting
  // sides do not ping-pong).
  const Work *head = s->queue.front();
  bool waits = head && (head->wr.op == tp::Op::Send || head->wr.op == tp::Op::WriteImm) &&
               !s->credits.can_send_data();
  if (!s->credits.ctrl_needed() && !(waits && s->credits.owed_ctrl() >= kCtrlDepth / 2)) return;
  Credits saved = s->credits;
  wire::Imm imm = s->credits.take_ctrl();
  if (tp::post_send_imm(s->id, &s->ctrl_wr, nullptr, 0, nullptr, wire::encode_imm(imm), 0)) {
    s->credits = saved;
    socket_close(s, IBMSG_EIO);
    return;
  }
  ++s->ctrl_in_flight;
  if (posted(s, true)) socket_close(s, IBMSG_EIO);
}

int posted(Socket *s, bool send_queue) {
  // Outside callbacks nothing would flush it soon; and a send to a connection with nothing in
  // flight goes at once, since batching only adds latency while the wire is idle (as TCP
  // autocorking holds back only while earlier packets wait to go out).
  if (s->loop->depth == 0 ||
      (send_queue && s->flight.empty() && s->ctrl_in_flight == 0))
    return tp::post_flush(s->id);
  if (!s->post_node.linked()) s->loop->unflushed.push_back(s);
  return IBMSG_OK;
}

void posts_flush(Loop *loop) {
  // A refused list closes its connection: what it carried is canceled with the rest.
  while (Socket *s = loop->unflushed.pop_front())
    if (s->has_qp && tp::post_flush(s->id)) socket_close(s, IBMSG_EIO);
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
  while (s->state == State::Connected) {
    Work *w = s->queue.front();
    if (!w || !work_can_go(s, w)) return;
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
  slot->state = SlotState::Allocated;
  msg->status = status == IBMSG_OK ? IBMSG_SENT : IBMSG_SEND_FAILED;
  if (auto cb = s->loop->pub->message_sent) cb(s->pub, msg, status);
}

int wc_error(tp::WcStatus st) {
  return st == tp::WcStatus::Flushed        ? IBMSG_ECONNRESET
         : st == tp::WcStatus::RemoteAccess ? IBMSG_EREMOTEACCESS
                                            : IBMSG_EIO;
}

void on_send_wc(Socket *s, Slot *slot, const tp::Completion &wc) {
  if (slot->state != SlotState::InFlight || slot->work.done) return;  // cannot happen
  const bool ok = wc.status == tp::WcStatus::Ok;
  const int st = ok ? IBMSG_OK : wc.status == tp::WcStatus::Flushed ? IBMSG_ECANCELED : IBMSG_EIO;
  work_done(s, &slot->work, st, ok ? IBMSG_OK : wc_error(wc.status));
}

// A protocol violation or a failed receive: the buffer stays unposted, the connection closes.
void drop_recv(Socket *s, Slot *slot, int reason) {
  slot->state = SlotState::Free;
  socket_close(s, reason);
}

void on_credit_msg(Socket *s, Slot *slot, const tp::Completion &wc, const wire::Imm &imm) {
  if (wc.len != 0 || !s->credits.on_ctrl_arrived() || !s->credits.on_returned(imm)) {
    // a payload on a credit-only message, no credit for it, or credits it never had
    drop_recv(s, slot, IBMSG_EPROTO);
    return;
  }
  slot->state = SlotState::Free;
  if (s->state != State::Closing) {
    if (tp::post_recv(s->id, &slot->work.wr, slot->buf, uint32_t(slot->pool->slot_size),
                      slot->pool->mr) ||
        posted(s, false)) {
      socket_close(s, IBMSG_EIO);
    } else {
      slot->state = SlotState::Posted;
      s->credits.on_ctrl_received();
    }
  }
  flush_sends(s);
  maybe_send_ctrl(s);
}

void on_data_msg(Socket *s, Slot *slot, const tp::Completion &wc, const wire::Imm &imm) {
  uint32_t len = wc.len;
  bool has_imm = imm.op == wire::Opcode::DataImm;
  if (has_imm) {
    if (!(s->features & wire::kFeatureImm) || len < wire::kImmTrailer) {
      drop_recv(s, slot, IBMSG_EPROTO);  // not agreed on, or no room for the immediate
      return;
    }
    len -= wire::kImmTrailer;
  }
  if (len > uint32_t(s->opts.max_msg_size) || !s->credits.on_data_arrived() ||
      !s->credits.on_returned(imm)) {
    // larger than we take, more data messages than the credits we granted, or credits returned
    // that it never had
    drop_recv(s, slot, IBMSG_EPROTO);
    return;
  }
  // Data can overtake the ESTABLISHED event on the accepting side: it proves the connection is up.
  if (s->state == State::Accepting) establish(s, true);
  slot->state = SlotState::Lent;
  ++slot->pool->out;
  ibmsg_buffer *msg = &slot->own;
  msg->data = slot->buf;
  msg->size = len;
  msg->status = IBMSG_RECEIVED;
  msg->user_data = nullptr;
  msg->flags = has_imm ? IBMSG_MSG_IMM : 0;
  const uint8_t *t = slot->buf + len;
  msg->imm = has_imm ? uint32_t(t[0]) | uint32_t(t[1]) << 8 | uint32_t(t[2]) << 16 | uint32_t(t[3]) << 24 : 0;
  flush_sends(s);
  maybe_send_ctrl(s);
  if (auto cb = s->loop->pub->message_received) cb(s->pub, msg);
  else msg_free(msg);
}

// The peer's RDMA write with immediate landed: its immediate is the application's, its data
// credit returns at once (the buffer was not used).
void on_write_imm(Socket *s, Slot *slot, const tp::Completion &wc) {
  if (!(s->features & wire::kFeatureRdma) || !s->credits.on_data_arrived()) {
    drop_recv(s, slot, IBMSG_EPROTO);
    return;
  }
  if (s->state == State::Accepting) establish(s, true);
  slot->state = SlotState::Free;
  if (s->state == State::Closing) {
    s->credits.on_data_dropped();
  } else if (tp::post_recv(s->id, &slot->work.wr, slot->buf, uint32_t(slot->pool->slot_size),
                           slot->pool->mr) ||
             posted(s, false)) {
    s->credits.on_data_dropped();
    socket_close(s, IBMSG_EIO);
  } else {
    slot->state = SlotState::Posted;
    s->credits.on_data_freed();
    maybe_send_ctrl(s);
  }
  if (auto cb = s->loop->pub->write_received) cb(s->pub, wc.imm, wc.len);
}

void on_recv_wc(Socket *s, Slot *slot, const tp::Completion &wc) {
  if (wc.status != tp::WcStatus::Ok) {
    drop_recv(s, slot, wc_error(wc.status));
    return;
  }
  if (wc.write_imm) {
    on_write_imm(s, slot, wc);
    return;
  }
  wire::Imm imm;
  if (!wc.has_imm || !wire::decode_imm(wc.imm, &imm)) {
    drop_recv(s, slot, IBMSG_EPROTO);
    return;
  }
  switch (imm.op) {
    case wire::Opcode::Data:
    case wire::Opcode::DataImm: on_data_msg(s, slot, wc, imm); break;
    case wire::Opcode::Credit: on_credit_msg(s, slot, wc, imm); break;
    default: drop_recv(s, slot, IBMSG_EPROTO); break;  // no feature agreed that uses it
  }
}

// A work request's callback: message_sent, or the operation's done.
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

}  // namespace

void work_done(Socket *s, Work *w, int status, int close_reason) {
  // Only the last message of a post list is signaled: whatever this completion says, the work
  // before it completed, and what of it is not marked yet succeeded (a failed or flushed work
  // request completes on its own, signaled or not, before this one).
  for (Work *x = s->flight.front(); x && x != w; x = s->flight.next(x)) {
    if (!x->done) {
      if (x->wr.op != tp::Op::Send && s->ops_in_flight) --s->ops_in_flight;  // (never today)
      x->done = true;
      x->status = IBMSG_OK;
    }
  }
  if (close_reason != IBMSG_OK) {
    notify_front(s);  // what succeeded before it is reported first
    socket_close(s, close_reason);
  }
  w->done = true;
  w->status = status;
  notify_front(s);
}

void on_completion(Socket *s, const tp::Completion &wc) {
  // The unsignaled credit-only messages posted before this work request (tp::post_flush): done
  // if it succeeded; a failure closes the connection, and a flushed one completes on its own.
  uint32_t carried = wc.ctx->carried;
  if (carried) {
    wc.ctx->carried = 0;
    if (wc.status != tp::WcStatus::Ok || carried > s->ctrl_in_flight) carried = 0;
    s->ctrl_in_flight -= carried;
  }
  switch (wc.ctx->op) {
    case tp::Op::Recv: on_recv_wc(s, static_cast<Slot *>(wc.ctx->owner), wc); break;
    case tp::Op::Send: on_send_wc(s, static_cast<Slot *>(wc.ctx->owner), wc); break;
    case tp::Op::Ctrl:
      --s->ctrl_in_flight;
      if (wc.status != tp::WcStatus::Ok) socket_close(s, wc_error(wc.status));
      else maybe_send_ctrl(s);  // it may have waited for room in the send queue
      break;
    case tp::Op::RdmaWrite:
    case tp::Op::RdmaRead:
    case tp::Op::WriteImm:
    case tp::Op::Atomic: op_on_wc(s, static_cast<Op *>(wc.ctx->owner), wc); break;
    default: socket_close(s, IBMSG_EIO); break;  // nothing else is posted
  }
  if (carried) maybe_send_ctrl(s);  // one may have waited for a control slot
}

void cancel_sends(Socket *s) {
  for (auto *list : {&s->flight, &s->queue}) {
    while (Work *w = list->pop_front()) {
      // In flight and completed (waiting for an earlier one): its own status.
      const bool done = list == &s->flight && w->done;
      if (w->wr.op != tp::Op::Send && list == &s->flight && !done && s->ops_in_flight)
        --s->ops_in_flight;
      notify_work(s, w, done ? w->status : IBMSG_ECANCELED);
    }
  }
}

int msg_alloc(Socket *s, ibmsg_buffer *msg, size_t size) {
  if (s->listener) return IBMSG_ESTATE;
  if (!state_has_buffers(s->state)) return IBMSG_ENOTCONN;
  if (size > size_t(s->opts.max_msg_size) || (s->have_peer && size > s->max_msg))
    return IBMSG_EMSGSIZE;
  Slot *slot = pool_get(s->send_pool);
  if (!slot) return IBMSG_EAGAIN;
  slot->msg = msg;
  msg->data = slot->buf;
  msg->size = size;
  msg->status = IBMSG_WAITING;
  msg->impl = slot;
  return IBMSG_OK;
}

int msg_post(Socket *s, ibmsg_buffer *msg, bool has_imm, uint32_t imm) {
  if (s->listener) return IBMSG_ESTATE;
  if (!state_can_post(s->state)) return IBMSG_ENOTCONN;
  Slot *slot = msg->impl;
  if (!slot_valid(slot) || slot->msg != msg) return IBMSG_ENOTALLOC;
  if (slot->pool->recv || slot->pool->user != s) return IBMSG_EINVAL;
  if (slot->state != SlotState::Allocated) return IBMSG_EBUSY;
  if (msg->size > s->max_msg) return IBMSG_EMSGSIZE;
  if (has_imm && !(s->features & wire::kFeatureImm)) return IBMSG_EOPNOTSUPP;
  slot->has_imm = has_imm;
  slot->imm = imm;
  if (s->queue.empty() && s->credits.can_send_data()) {
    // A queue pair that refuses a work request is broken: the connection closes, as it does when
    // a queued message fails to go out. The message stays the application's (no callback).
    int rc = send_now(s, slot);
    if (rc) {
      socket_close(s, rc);
      return rc;
    }
  } else {
    if (s->queue.size() >= size_t(s->opts.send_queue)) return IBMSG_EAGAIN;
    slot->state = SlotState::Queued;
    s->queue.push_back(&slot->work);
    maybe_send_ctrl(s);  // it may wait for a credit the peer cannot return without control credits
  }
  msg->status = IBMSG_WAITING;
  poll_touch(s);  // its completion (and the answer) will come soon
  return IBMSG_OK;
}

int msg_free(ibmsg_buffer *msg) {
  Slot *slot = msg->impl;
  if (!slot_valid(slot) || slot->msg != msg) return IBMSG_ENOTALLOC;
  Pool *p = slot->pool;
  if (!p->recv) {
    if (slot->state == SlotState::Queued || slot->state == SlotState::InFlight) return IBMSG_EBUSY;
    if (slot->state != SlotState::Allocated) return IBMSG_ENOTALLOC;
    pool_put(p, slot);
    msg->impl = nullptr;
    msg->data = nullptr;
    msg->status = IBMSG_FREED;
    pool_maybe_release(p);
    return IBMSG_OK;
  }
  if (slot->state != SlotState::Lent) return IBMSG_ENOTALLOC;
  msg->status = IBMSG_FREED;
  --p->out;
  Socket *s = p->user;
  if (s && s->has_qp && s->state != State::Closing) {
    if (tp::post_recv(s->id, &slot->work.wr, slot->buf, uint32_t(p->slot_size), p->mr) ==
            IBMSG_OK &&
        posted(s, false) == IBMSG_OK) {
      slot->state = SlotState::Posted;
      s->credits.on_data_freed();
      maybe_send_ctrl(s);
      return IBMSG_OK;
    }
    socket_close(s, IBMSG_EIO);
  }
  slot->state = SlotState::Free;
  if (s) s->credits.on_data_dropped();
  else pool_maybe_release(p);
  return IBMSG_OK;
}

}  // namespace ibmsg
