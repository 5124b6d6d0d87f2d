// Rendezvous: messages larger than the eager size (protocol 1.2, kFeatureRndv).
//
// The sender's message lies in a large buffer registered for remote reads (memory.cpp). Posting
// it sends an RTS (wire.hpp) in a data message of its own: where the data is and how long. The
// receiver reads the data into a large buffer of its own, in chunks of at most the device's
// largest message, kRndvReads reads in flight per connection, the RTSs in the order they came.
// Once a message's data is in, it counts it in the done field of its next immediate (a
// credit-only message if nothing else goes); the sender's message is then done, and its
// message_sent comes in posting order with the eager ones. The receiver delivers every message
// in the order it came: an eager message behind a rendezvous still being read waits for it.
//
// Who owns what: the sender's buffer is the application's from ibmsg_alloc_msg to ibmsg_free_msg
// as any message's (the peer reads it between posting and message_sent); the receiver's buffer
// is the library's until message_received lends it, and goes back to the device's cache with
// ibmsg_free_msg. Closing drops what was not delivered (rndv_release).
#include "internal.hpp"

namespace ibmsg {
namespace {

constexpr uint64_t kChunkMax = uint64_t(1) << 30;

}  // namespace

// Posts what reads it can: the first waiting rendezvous gets its destination when its turn comes
// (so a connection holds at most the destinations of the messages it is reading or delivering).
void rndv_pump(Socket *s) {
  if (s->state != State::Connected) return;
  uint64_t chunk = tp::device_info(s->dev->tp).max_msg_size;
  if (chunk > kChunkMax) chunk = kChunkMax;
  bool any = false;
  while (s->rndv_reads < kRndvReads) {
    RndvIn *in = s->reading.front();
    if (!in) break;
    Slot *slot = static_cast<Slot *>(in->wr.owner);
    if (!slot->large) {
      int err = IBMSG_OK;
      slot->large = large_get(s->dev, false, size_t(in->length), &err);
      if (!slot->large) {
        socket_close(s, err);
        return;
      }
    }
    const uint64_t n = in->length - in->next < chunk ? in->length - in->next : chunk;
    tp::RdmaWr w{};
    w.local = slot->large->mem + in->next;
    w.len = uint32_t(n);
    w.mr = slot->large->mr;
    w.remote = in->remote + in->next;
    w.rkey = in->rkey;
    if (tp::post_rdma(s->id, &in->wr, w, 0)) {
      socket_close(s, IBMSG_EIO);
      return;
    }
    any = true;
    in->next += n;
    ++in->reads;
    ++s->rndv_reads;
    if (in->next == in->length) s->reading.pop_front();
  }
  if (any && posted(s, true)) socket_close(s, IBMSG_EIO);
}

namespace {

// Hands the messages at the front of the delivery queue to the application while they are
// complete. A callback may close the connection: what is complete is still delivered (as
// messages that arrive while it closes), the rest goes at the teardown.
void deliver_ready(Socket *s) {
  for (Slot *slot = s->deliver.front(); slot && slot->in.ready; slot = s->deliver.front()) {
    s->deliver.pop_front();
    slot->in.ready = false;
    ibmsg_buffer *msg = &slot->own;
    if (auto cb = s->loop->pub->message_received) cb(s->pub, msg);
    else msg_free(msg);
  }
}

}  // namespace

uint32_t eager_recv_size(const Socket *s) {
  return uint32_t(s->opts.eager_size) < s->opts.max_msg_size ? uint32_t(s->opts.eager_size)
                                                               : s->opts.max_msg_size;
}

bool rndv_offered(const Socket *s) { return s->opts.max_msg_size > eager_recv_size(s); }

uint32_t rndv_fill_rts(Socket *s, Slot *slot) {
  wire::Rts r;
  r.id = uint32_t(slot - slot->pool->slots);
  r.rkey = tp::mr_rkey(slot->large->mr);
  r.has_imm = slot->has_imm;
  r.imm = slot->imm;
  r.addr = reinterpret_cast<uintptr_t>(slot->large->mem);
  r.length = slot->msg->size;
  wire::encode_rts(r, slot->buf);
  s->rndv_wait.push_back(slot);  // popped when read, or when its posting fails (send_now)
  return uint32_t(wire::kRtsSize);
}

bool rndv_on_done(Socket *s, uint32_t n) {
  if (n > s->rndv_wait.size()) return false;
  while (n--) {
    Work *w = &s->rndv_wait.pop_front()->work;
    w->read = true;
    if (w->sent && !w->done) {
      w->done = true;
      w->status = IBMSG_OK;
    }
  }
  notify_front(s);
  return true;
}

void rndv_on_rts(Socket *s, Slot *slot, const tp::Completion &wc, const wire::Imm &imm) {
  wire::Rts r;
  if (!(s->features & wire::kFeatureRndv) || !s->credits.on_data_arrived() ||
      !s->credits.on_returned(imm) || !wire::decode_rts(slot->buf, wc.len, &r) ||
      r.length > s->opts.max_msg_size) {
    // not agreed on, no credit for it, credits it never had, no RTS, or larger than we take
    slot->state = SlotState::Free;
    socket_close(s, IBMSG_EPROTO);
    return;
  }
  if (s->state == State::Accepting) establish(s, true);
  slot->state = SlotState::Lent;
  ++slot->pool->out;
  ibmsg_buffer *msg = &slot->own;
  msg->data = nullptr;  // the destination, once the reads start
  msg->size = size_t(r.length);
  msg->status = IBMSG_RECEIVED;
  msg->user_data = nullptr;
  msg->flags = r.has_imm ? IBMSG_MSG_IMM : 0;
  msg->imm = r.has_imm ? r.imm : 0;
  slot->large = nullptr;
  RndvIn &in = slot->in;
  in.remote = r.addr;
  in.length = r.length;
  in.next = 0;
  in.rkey = r.rkey;
  in.reads = 0;
  in.ready = false;
  s->deliver.push_back(slot);
  s->reading.push_back(&in);
  rndv_pump(s);
  flush_sends(s);
  maybe_send_ctrl(s);
}

void rndv_on_read(Socket *s, Slot *slot, const tp::Completion &wc) {
  RndvIn &in = slot->in;
  if (in.reads) --in.reads;
  if (s->rndv_reads) --s->rndv_reads;
  if (wc.status != tp::WcStatus::Ok) {
    // The peer's key or range was wrong (it broke the protocol), or the connection failed.
    socket_close(s, wc.status == tp::WcStatus::RemoteAccess ? IBMSG_EPROTO
                    : wc.status == tp::WcStatus::Flushed    ? IBMSG_ECONNRESET
                                                            : IBMSG_EIO);
    return;
  }
  if (in.reads == 0 && in.next == in.length && !in.read_link.linked()) {
    slot->own.data = slot->large->mem;
    in.ready = true;
    ++s->done_owed;
    maybe_send_ctrl(s);  // the count goes at once, in a credit-only message if need be
    deliver_ready(s);
  }
  rndv_pump(s);
}

void deliver_msg(Socket *s, Slot *slot) {
  slot->in.ready = true;
  s->deliver.push_back(slot);
  deliver_ready(s);
}

uint32_t rndv_take_done(Socket *s) {
  uint32_t n = s->done_owed < wire::kMaxDonePerMsg ? s->done_owed : wire::kMaxDonePerMsg;
  s->done_owed -= n;
  return n;
}

void rndv_release(Socket *s) {
  while (s->reading.pop_front()) {
  }
  while (s->rndv_wait.pop_front()) {
  }
  while (Slot *slot = s->deliver.pop_front()) {
    slot->in.ready = false;
    if (slot->large) large_put(slot->large);
    slot->large = nullptr;
    slot->state = SlotState::Free;
    --slot->pool->out;
    s->credits.on_data_dropped();
  }
  s->rndv_reads = 0;
  s->done_owed = 0;
}

}  // namespace ibmsg
