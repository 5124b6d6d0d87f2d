// The application's messages: ibmsg_alloc_msg, ibmsg_post_send and ibmsg_free_msg. A message is
// a slot of the device's send buffers (send_slots.cpp); one above the eager size also has a large
// buffer for its payload (rndv.cpp). A received message is a receive buffer (recv.cpp), lent
// until it is freed.
#include "message.hpp"

#include <cstring>

#include "internal.hpp"
#include "datapath.hpp"
#include "memory.hpp"
#include "recv.hpp"
#include "rndv.hpp"
#include "send_slots.hpp"

namespace ibmsg {
namespace {

// The largest message sent through the pool: both sides' eager sizes once the peer's is known.
size_t send_eager(const Socket *s) { return s->peer.known ? s->peer.eager : eager_recv_size(s); }

}  // namespace

int msg_alloc(Socket *s, ibmsg_buffer *msg, size_t size) {
  if (s->listener) return IBMSG_ESTATE;
  if (!state_has_buffers(s->state)) return IBMSG_ENOTCONN;
  if (size > size_t(s->opts.max_msg_size) || (s->peer.known && size > s->peer.max_msg))
    return IBMSG_EMSGSIZE;
  int err = IBMSG_OK;
  Slot *slot = send_get(s, &err);
  if (!slot) return err;
  slot->large = nullptr;
  slot->src.region = nullptr;
  slot->req.internal = false;
  if (size > send_eager(s)) {
    // Rendezvous: the payload in a large buffer the peer reads; the slot carries the RTS.
    slot->large = large_get(s->dev, true, s->res.serial, size, &err);
    if (!slot->large) {
      send_put(slot);
      return err;
    }
  }
  slot->msg = msg;
  msg->data = slot->large ? slot->large->mem : slot->buf;
  msg->size = size;
  msg->status = IBMSG_WAITING;
  msg->impl = slot;
  return IBMSG_OK;
}

int msg_from_region(Socket *s, ibmsg_buffer *msg, Region *r, size_t off, size_t size) {
  if (s->listener) return IBMSG_ESTATE;  // (a region of any loop: registered per device)
  if (!state_has_buffers(s->state)) return IBMSG_ENOTCONN;
  if (off > r->length || size > r->length - off) return IBMSG_ERANGE;
  if (size > size_t(s->opts.max_msg_size) || (s->peer.known && size > s->peer.max_msg))
    return IBMSG_EMSGSIZE;
  int err = IBMSG_OK;
  const tp::Mr *mr = region_mr(r, s->dev, &err);  // registered on the device once
  if (!mr) return err;
  Slot *slot = send_get(s, &err);
  if (!slot) return err;
  slot->large = nullptr;
  slot->req.internal = false;
  slot->src.region = r;
  slot->src.off = off;
  slot->src.mr = mr;
  ++r->busy;  // it stays registered while the message may point into it
  slot->msg = msg;
  msg->data = r->addr + off;
  msg->size = size;
  msg->status = IBMSG_WAITING;
  msg->impl = slot;
  return IBMSG_OK;
}

namespace {

// What a post says of the message, kept in its slot: its immediate, a request's or reply's fields.
inline void post_fields(Slot *slot, bool has_imm, uint32_t imm, const PostAs *as) {
  slot->has_imm = has_imm;
  slot->imm = imm;
  slot->req.kind = uint8_t(as ? as->kind : MsgKind::Plain);
  slot->req.retry = as && as->retry;
  slot->req.id = as ? as->id : 0;
  slot->req.floor = as ? as->floor : 0;
}

// msg_post of every message but the common ones (see there): a rendezvous, a payload in a large
// buffer or a region, or one that goes now after the round's freed buffers. msg_post has checked
// it and set post_fields.
[[gnu::noinline]] int post_general(Socket *s, ibmsg_buffer *msg, Slot *slot, bool rndv,
                                   bool now) {
  if (rndv && slot->src.region) {
    // The peer reads exactly the message's bytes: a registration of their own, until it did.
    // (No local write: the region may be read-only memory.)
    int err = tp::mr_register(s->dev->tp, msg->data, msg->size,
                              tp::kRemoteRead | tp::kLocalReadOnly, &slot->src.xmr);
    if (err) return err;
  }
  bool late = false;
  if (rndv && !slot->large && !slot->src.region) {
    // Allocated before the peer's hello said its eager size is smaller: a large buffer now
    // (msg->data moves there; back if the post fails).
    int err = IBMSG_OK;
    slot->large = large_get(s->dev, true, s->res.serial, msg->size, &err);
    if (!slot->large) return err;
    memcpy(slot->large->mem, slot->buf, msg->size);
    msg->data = slot->large->mem;
    late = true;
  }
  // A large buffer's message that fits the eager size goes eagerly, copied into the slot.
  if (!rndv && slot->large && msg->size) memcpy(slot->buf, slot->large->mem, msg->size);
  slot->work.rndv = rndv;
  if (!now) return send_later(s, slot);
  // The messages of s freed in this round go back at its end, after this one. Unless their
  // credits would then need a credit-only message: then first, and this one carries them.
  if (s->tx.credits.ctrl_needed_after_carry(s->rx.freed_later)) msgs_freed_back(s->loop);
  // A queue pair that refuses a work request is broken: the connection closes, as it does when
  // a queued message fails to go out. The message stays the application's (no callback).
  if (int rc = send_now(s, slot)) {
    if (slot->src.xmr) tp::mr_deregister(slot->src.xmr);
    slot->src.xmr = nullptr;
    if (late) {
      large_put(slot->large);
      slot->large = nullptr;
      msg->data = slot->buf;
    }
    socket_close(s, rc);
    return rc;
  }
  return send_waiting(s, slot);
}

}  // namespace

int msg_post(Socket *s, ibmsg_buffer *msg, bool has_imm, uint32_t imm, const PostAs *as) {
  if (s->listener) return IBMSG_ESTATE;
  if (!state_can_post(s->state)) return IBMSG_ENOTCONN;
  Slot *slot = msg->impl;
  if (!slot_valid(slot) || slot->msg != msg) return IBMSG_ENOTALLOC;
  if (slot->pool->recv || slot->sock != s) return IBMSG_EINVAL;
  if (slot->state != SlotState::Allocated) return IBMSG_EBUSY;
  if (msg->size > s->peer.max_msg) return IBMSG_EMSGSIZE;
  const bool rndv = msg->size > s->peer.eager;
  if (slot->src.region) {
    if (msg->data != slot->src.region->addr + slot->src.off ||
        msg->size > slot->src.region->length - slot->src.off)
      return IBMSG_ERANGE;  // moved or grown beyond its region
  } else if (slot->large ? msg->size > slot->large->bytes
                          : msg->size > slot->pool->slot_size - wire::kMaxTrailer) {
    return IBMSG_EMSGSIZE;  // more than its buffer holds
  }
  if (has_imm && !(s->peer.features & wire::kFeatureImm)) return IBMSG_EOPNOTSUPP;
  if (as && as->kind != MsgKind::Plain && !(s->peer.features & wire::kFeatureRequest))
    return IBMSG_EOPNOTSUPP;
  const bool now = s->tx.queue.empty() && s->tx.credits.can_send_data();
  if (!now && s->tx.queue.size() >= size_t(s->opts.send_queue)) return IBMSG_EAGAIN;
  // (Set before anything can fail: a failed post leaves the message the application's, and the
  // next post sets them again.)
  post_fields(slot, has_imm, imm, as);
  // The common cases, an eager message in its slot's own buffer: it goes at once, ahead of the
  // buffers freed in this round (send_first: sent, or, refused, the connection closes), or it
  // waits in the queue (send_later). Nothing here is called with a value needed after it: this
  // path saves no registers.
  if (!rndv && !slot->large && !slot->src.region) {
    slot->work.rndv = false;
    if (!now) return send_later(s, slot);
    if (!s->tx.credits.ctrl_needed_after_carry(s->rx.freed_later)) return send_first(s, slot);
  }
  return post_general(s, msg, slot, rndv, now);
}

bool msg_lent(const ibmsg_buffer *msg) {
  const Slot *slot = msg->impl;
  return slot_valid(slot) && slot->msg == msg && slot->pool->recv &&
         slot->state == SlotState::Lent && !slot->in.ready && !slot->in.declined &&
         !slot->link.linked() && !slot->in.read_link.linked();
}

int msg_release(ibmsg_buffer *msg) {
  Slot *slot = msg->impl;
  if (!slot_valid(slot) || slot->msg != msg) return IBMSG_ENOTALLOC;
  Pool *p = slot->pool;
  if (!p->recv) {
    if (slot->state == SlotState::Queued || slot->state == SlotState::InFlight) return IBMSG_EBUSY;
    if (slot->state != SlotState::Allocated) return IBMSG_ENOTALLOC;
    send_free(slot);
    msg->impl = nullptr;
    msg->data = nullptr;
    msg->status = IBMSG_FREED;
    return IBMSG_OK;
  }
  if (!msg_lent(msg)) return IBMSG_ENOTALLOC;  // not lent to the application (yet)
  return msg_give_back(msg);
}

int msg_give_back(ibmsg_buffer *msg) {
  Slot *slot = msg->impl;
  Pool *p = slot->pool;
  msg->status = IBMSG_FREED;
  // Freed in a callback of a busy-polling connection: it goes back at the end of the round
  // (msgs_freed_back), so that a reply the callback posts to an idle wire goes first (msg_post)
  // while the peer polls; its credit then rides on a later message. It stays lent until it goes
  // back (not msg_lent: linked). (With completion events, work after the reply measured slower:
  // PERFORMANCE.md.)
  Loop *loop = p->dev->loop;
  Socket *owner = recv_owner(slot);
  if (loop->depth > 0 && owner && owner->poll_node.linked()) {
    ++owner->rx.freed_later;
    loop->freed.push_back(slot);
    return IBMSG_OK;
  }
  rndv_drop(owner, slot);  // its destination, its region's hold, its buffer
  return IBMSG_OK;
}

void msgs_freed_back(Loop *loop) {
  while (Slot *slot = loop->freed.pop_front()) {
    // Its owner now: the connection may have closed since (then none, or one closing).
    Socket *owner = recv_owner(slot);
    if (owner && owner->rx.freed_later) --owner->rx.freed_later;
    rndv_drop(owner, slot);
  }
}

}  // namespace ibmsg
