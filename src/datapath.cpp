// The data path: the send queue and the in-flight list, credit-only messages, completions, and
// the bodies of alloc / post / free. Nothing here allocates or registers memory.
#include "internal.hpp"

namespace ibmsg {
namespace {

int post_data(Socket *s, Slot *slot, const wire::Imm &imm) {
  return tp::post_send_imm(s->id, &slot->wr, slot->buf, uint32_t(slot->msg->size), slot->pool->mr,
                           wire::encode_imm(imm), s->max_inline);
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
  s->flight.push_back(slot);
  return IBMSG_OK;
}

void flush_queue(Socket *s) {
  while (!s->queue.empty() && s->state == State::Connected && s->credits.can_send_data()) {
    Slot *slot = s->queue.pop_front();
    if (send_now(s, slot)) {
      // Back in front: the teardown cancels it in order with the rest.
      s->queue.push_front(slot);
      socket_close(s, IBMSG_EIO);
      return;
    }
  }
}

// A credit-only message, when credits are owed and no data message can carry them.
void maybe_send_ctrl(Socket *s) {
  if (s->state != State::Connected || !s->credits.ctrl_needed() || !s->credits.can_send_ctrl() ||
      s->ctrl_in_flight >= kCtrlDepth)
    return;
  Credits saved = s->credits;
  wire::Imm imm = s->credits.take_ctrl();
  if (tp::post_send_imm(s->id, &s->ctrl_wr, nullptr, 0, nullptr, wire::encode_imm(imm), 0)) {
    s->credits = saved;
    socket_close(s, IBMSG_EIO);
    return;
  }
  ++s->ctrl_in_flight;
}

void notify_sent(Socket *s, Slot *slot, int status) {
  ibmsg_buffer *msg = slot->msg;
  slot->state = SlotState::Allocated;
  msg->status = status == IBMSG_OK ? IBMSG_SENT : IBMSG_SEND_FAILED;
  if (auto cb = s->loop->pub->message_sent) cb(s->pub, msg, status);
}

int wc_error(tp::WcStatus st) { return st == tp::WcStatus::Flushed ? IBMSG_ECONNRESET : IBMSG_EIO; }

void on_send_wc(Socket *s, Slot *slot, const tp::Completion &wc) {
  s->flight.remove(slot);
  if (wc.status == tp::WcStatus::Ok) {
    notify_sent(s, slot, IBMSG_OK);
    return;
  }
  socket_close(s, wc_error(wc.status));
  notify_sent(s, slot, wc.status == tp::WcStatus::Flushed ? IBMSG_ECANCELED : IBMSG_EIO);
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
    if (tp::post_recv(s->id, &slot->wr, slot->buf, uint32_t(slot->pool->slot_size),
                      slot->pool->mr)) {
      socket_close(s, IBMSG_EIO);
    } else {
      slot->state = SlotState::Posted;
      s->credits.on_ctrl_received();
    }
  }
  flush_queue(s);
  maybe_send_ctrl(s);
}

void on_data_msg(Socket *s, Slot *slot, const tp::Completion &wc, const wire::Imm &imm) {
  if (!s->credits.on_data_arrived() || !s->credits.on_returned(imm)) {
    // more data messages than the credits we granted, or credits returned that it never had
    drop_recv(s, slot, IBMSG_EPROTO);
    return;
  }
  // Data can overtake the ESTABLISHED event on the accepting side: it proves the connection is up.
  if (s->state == State::Accepting) establish(s);
  slot->state = SlotState::Lent;
  ++slot->pool->out;
  ibmsg_buffer *msg = &slot->own;
  msg->data = slot->buf;
  msg->size = wc.len;
  msg->status = IBMSG_RECEIVED;
  msg->user_data = nullptr;
  flush_queue(s);
  maybe_send_ctrl(s);
  if (auto cb = s->loop->pub->message_received) cb(s->pub, msg);
  else msg_free(msg);
}

void on_recv_wc(Socket *s, Slot *slot, const tp::Completion &wc) {
  if (wc.status != tp::WcStatus::Ok) {
    drop_recv(s, slot, wc_error(wc.status));
    return;
  }
  wire::Imm imm;
  if (!wc.has_imm || !wire::decode_imm(wc.imm, &imm)) {
    drop_recv(s, slot, IBMSG_EPROTO);
    return;
  }
  switch (imm.op) {
    case wire::Opcode::Data: on_data_msg(s, slot, wc, imm); break;
    case wire::Opcode::Credit: on_credit_msg(s, slot, wc, imm); break;
    default: drop_recv(s, slot, IBMSG_EPROTO); break;  // no feature agreed that uses it
  }
}

void on_completion(Socket *s, const tp::Completion &wc) {
  switch (wc.ctx->op) {
    case tp::Op::Recv: on_recv_wc(s, static_cast<Slot *>(wc.ctx->owner), wc); break;
    case tp::Op::Send: on_send_wc(s, static_cast<Slot *>(wc.ctx->owner), wc); break;
    case tp::Op::Ctrl:
      --s->ctrl_in_flight;
      if (wc.status != tp::WcStatus::Ok) socket_close(s, wc_error(wc.status));
      else maybe_send_ctrl(s);  // it may have waited for room in the send queue
      break;
    default: socket_close(s, IBMSG_EIO); break;  // nothing else is posted yet
  }
}

}  // namespace

void drain_cq(Socket *s) {
  tp::Completion wc[32];
  for (;;) {
    if (!s->cq) return;
    int n = tp::cq_poll(s->cq, wc, 32);
    if (n < 0) {
      socket_close(s, IBMSG_EIO);
      return;
    }
    for (int i = 0; i < n; ++i) on_completion(s, wc[i]);
    if (n < 32) return;
  }
}

void on_cq_ready(void *cq_user, void *) { drain_cq(static_cast<Socket *>(cq_user)); }

void cancel_sends(Socket *s) {
  while (Slot *slot = s->flight.pop_front()) notify_sent(s, slot, IBMSG_ECANCELED);
  while (Slot *slot = s->queue.pop_front()) notify_sent(s, slot, IBMSG_ECANCELED);
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

int msg_post(Socket *s, ibmsg_buffer *msg) {
  if (s->listener) return IBMSG_ESTATE;
  if (!state_can_post(s->state)) return IBMSG_ENOTCONN;
  Slot *slot = msg->impl;
  if (!slot_valid(slot) || slot->msg != msg) return IBMSG_ENOTALLOC;
  if (slot->pool->recv || slot->pool->user != s) return IBMSG_EINVAL;
  if (slot->state != SlotState::Allocated) return IBMSG_EBUSY;
  if (msg->size > s->max_msg) return IBMSG_EMSGSIZE;
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
    s->queue.push_back(slot);
  }
  msg->status = IBMSG_WAITING;
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
    if (tp::post_recv(s->id, &slot->wr, slot->buf, uint32_t(p->slot_size), p->mr) == IBMSG_OK) {
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
