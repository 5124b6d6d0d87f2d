// Receive buffers and the data credits they back: a connection's own (its receive pool, posted
// to its queue pair) or its device's shared ones (SharedRecv: slabs posted to one shared receive
// queue, credits moved by SharedCredits). Every path that takes or gives back a receive buffer
// comes through here, so the two kinds differ in this file only.
//
// Shared buffers: a connection joins with its control buffers and a base of data credits
// reserved; more come from the pool while its peer says it wants them (the wants bit), up to
// IBMSG_OPT_RECV_DEPTH. The pool grows by a slab when connections wait for credits, up to what
// its connections reserve plus a spare of eight connections' worth; it never shrinks while it
// lives (a posted receive cannot be taken back), and goes with its last connection and lent
// buffer. A shared queue holds at most kSrqMax receives (about 5400 connections' reservations
// with the defaults); when every pool of a buffer size is full, the next connection opens
// another pool with a queue of its own, so that a device's connections all stay on shared
// buffers however many there are (before, they fell back to buffers of their own: 36 instead of
// 6 per connection, and the memory per connection grew past the first queue's worth).
#include "recv.hpp"

#include <new>

#include "internal.hpp"
#include "memory.hpp"
#include "shared_credits.hpp"

namespace ibmsg {
namespace {

// The eager size the options give (IBMSG_OPT_EAGER_SIZE, at most IBMSG_OPT_MAX_MSG_SIZE), before
// recv_join decides the connection's own (RecvBuffers::eager).
uint32_t option_eager(const Socket *s) {
  return uint32_t(s->opts.eager_size) < s->opts.max_msg_size ? uint32_t(s->opts.eager_size)
                                                               : s->opts.max_msg_size;
}

constexpr uint32_t kSrqMax = 32768;  // receives one shared queue holds at most

uint32_t share_base(uint32_t cap) { return cap < kShareBase ? cap : kShareBase; }

SharedRecv *shared_create(Device *dev, size_t slot_size, uint32_t cap) {
  const uint32_t max = tp::device_info(dev->tp).max_srq_wr;
  SharedRecv *r = new (std::nothrow) SharedRecv(share_base(cap), cap);
  if (!r) return nullptr;
  r->max_wr = max < kSrqMax ? max : kSrqMax;
  if (tp::srq_create(dev->tp, r->max_wr, &r->srq)) {
    delete r;
    return nullptr;
  }
  r->dev = dev;
  r->slot_size = slot_size;
  r->cap = cap;
  ++dev->refs;
  dev->shared.push_back(r);
  return r;
}

void shared_maybe_destroy(SharedRecv *r) {
  if (r->conns || r->lent) return;
  Device *dev = r->dev;
  dev->shared.remove(r);
  tp::srq_destroy(r->srq);  // no queue pair uses it any more
  while (Pool *p = r->slabs.pop_front()) slab_destroy(p);
  delete r;
  device_put(dev);
}

// Another slab of buffers, registered and posted; false if the queue is full or it failed.
bool shared_grow(SharedRecv *r) {
  const uint32_t count = slab_count(r->slot_size);
  if (r->buffers + count > r->max_wr) return false;
  int err = IBMSG_OK;
  Pool *p = slab_create(r->dev, true, count, r->slot_size, &err);
  if (!p) return false;
  p->shared = r;
  r->slabs.push_back(p);
  uint32_t n = 0;
  for (; n < p->count; ++n) {
    Slot *slot = &p->slots[n];
    if (tp::srq_post_recv(r->srq, &slot->work.wr, slot->buf, uint32_t(p->slot_size), p->mr)) break;
    slot->state = SlotState::Posted;
  }
  r->buffers += n;
  r->credits.add_buffers(n);
  return n == p->count;
}

// The connections waiting for credits get what the pool has free, in turn.
void shared_serve(SharedRecv *r) {
  if (!r->credits.waiting()) return;  // (the common case, on every arrival: no call further)
  while (ShareConn *w = r->credits.serve_waiting()) {
    Socket *c = static_cast<Socket *>(w->user);
    c->loop->hooks->ctrl_due(c);  // it tells its peer (datapath.cpp)
  }
}

// What the pool may grow to: what its connections reserve, and a spare of eight connections'
// most, to move where the traffic is.
uint64_t shared_limit(const SharedRecv *r) {
  // (Buffers the application holds do not eat the spare: each connection's cap counts them.)
  return uint64_t(r->conns) * (r->credits.base() + kCtrlDepth) + r->lent + 8 * uint64_t(r->cap);
}

// Names the connection a shared buffer's message is of (nullptr: none), keeping each
// connection's count of the buffers that name it, so that its leave looks for them only when
// there are some.
inline void route_to(Slot *slot, Socket *s) {
  if (slot->sock) --slot->sock->rx.routed;
  slot->sock = s;
  if (s) ++s->rx.routed;
}

// A buffer back into the shared queue; false if the device refused it (it is lost to the pool).
inline bool shared_post(SharedRecv *r, Slot *slot) {
  route_to(slot, nullptr);
  slot->credited = false;
  if (tp::srq_post_recv(r->srq, &slot->work.wr, slot->buf, uint32_t(r->slot_size),
                        slot->pool->mr)) {
    slot->state = SlotState::Free;
    return false;
  }
  slot->state = SlotState::Posted;
  return true;
}

}  // namespace

size_t msg_slot_size(const Socket *s) {
  // Room for an eager message and what may follow it (an immediate, a request's trailer), or an
  // RTS.
  const size_t size = eager_recv_size(s) > wire::kRtsSize ? eager_recv_size(s) : wire::kRtsSize;
  return size + wire::kMaxTrailer;
}

namespace {

// Whether r has a new connection's reservation unassigned, growing it by slabs as far as it
// may.
bool shared_has_room(SharedRecv *r) {
  const uint32_t need = r->credits.base() + kCtrlDepth;
  while (r->credits.unassigned() < need && shared_grow(r)) continue;
  return r->credits.unassigned() >= need;
}

// The pool of this buffer size and cap that takes a new connection: the first with room, else a
// new one (with a shared queue of its own); nullptr if none can be made.
SharedRecv *shared_for(Device *dev, size_t size, uint32_t cap) {
  for (SharedRecv *r = dev->shared.front(); r; r = dev->shared.next(r))
    if (r->slot_size == size && r->cap == cap && shared_has_room(r)) return r;
  SharedRecv *r = shared_create(dev, size, cap);
  if (r && !shared_has_room(r)) {
    shared_maybe_destroy(r);
    return nullptr;
  }
  return r;
}

// The eager size of a new connection on dev's shared buffers: the option's, halved while the
// device's connections on shared buffers, this one included, would reserve more than the loop's
// IBMSG_OPT_SHARED_RECV_BUDGET with it (connections x their base and control buffers x eager
// size), but not below kMinScaledEager. Only for a connection that offers rendezvous: a larger
// message goes by rendezvous instead (requests and replies too), and not for an accepted
// connection whose peer takes no rendezvous (RecvBuffers::keep_eager). So the memory of each new
// connection shrinks as they grow many (with the default 32 MiB: 16 KiB up to 341 connections,
// then 8, 4, 2 and from 2731 on 1 KiB; 96 to 6 KiB reserved per idle connection), and the first
// connections keep the full size. 0 turns it off.
uint32_t scaled_eager(const Socket *s, const Device *dev, uint32_t per_conn) {
  const uint32_t eager = option_eager(s);
  const uint64_t budget = s->loop->opts.shared_recv_budget;
  if (!budget || !rndv_offered(s) || s->rx.keep_eager) return eager;
  uint64_t n = 1;
  for (const SharedRecv *r = dev->shared.front(); r; r = dev->shared.next(r)) n += r->conns;
  uint32_t e = eager;
  while (e / 2 >= kMinScaledEager && n * per_conn * e > budget) e /= 2;
  return e;
}

}  // namespace

void recv_join(Socket *s, tp::QpCaps *caps) {
  Device *dev = s->dev;
  s->rx.eager = option_eager(s);  // (every arrival checks against it)
  if (!s->opts.shared_recv || !tp::device_info(dev->tp).max_srq_wr) return;
  s->rx.eager = scaled_eager(s, dev, share_base(uint32_t(s->opts.recv_depth)) + kCtrlDepth);
  const size_t size = (msg_slot_size(s) + 63) & ~size_t(63);
  SharedRecv *r = shared_for(dev, size, uint32_t(s->opts.recv_depth));
  if (!r) {  // buffers of its own, then (of the option's size)
    s->rx.eager = option_eager(s);
    return;
  }
  r->credits.take_buffers(kCtrlDepth);  // its control buffers: re-posted as soon as used
  r->credits.join(&s->rx.share);
  r->credits.take_owed(&s->rx.share);  // the hello grants the base
  s->rx.share.user = s;
  ++r->conns;
  s->rx.shared = r;
  caps->srq = r->srq;
}

int recv_open(Socket *s) {
  if (SharedRecv *r = s->rx.shared) {
    s->rx.qp_num = tp::qp_num(s->id);
    if (r->last_qp == s->rx.qp_num) r->last_sock = nullptr;  // (a number used again)
    return r->by_qp.put(s->rx.qp_num, s) ? IBMSG_OK : IBMSG_ENOMEM;
  }
  int err = IBMSG_OK;
  const uint32_t n = uint32_t(s->opts.recv_depth) + kCtrlDepth;
  s->rx.pool = pool_acquire(s->dev, s, true, n, msg_slot_size(s), &err);
  for (uint32_t i = 0; !err && i < n; ++i) {
    Slot *slot = &s->rx.pool->slots[i];
    err = tp::post_recv(s->id, &slot->work.wr, slot->buf, uint32_t(s->rx.pool->slot_size),
                        s->rx.pool->mr);
    if (!err) slot->state = SlotState::Posted;
  }
  return err;
}

void recv_leave(Socket *s) {
  s->loop->fresh.remove(s);  // (a drain of the teardown leaves none: recv_grants_release)
  SharedRecv *r = s->rx.shared;
  if (!r) {
    pool_disown(s->rx.pool);
    s->rx.pool = nullptr;
    return;
  }
  // Its queue pair is gone and the CQ polled: nothing of it takes a buffer any more. A queue
  // pair that never connected (a failed accept) took none: destroying it flushes nothing of the
  // shared queue.
  if (s->rx.qp_num && r->by_qp.get(s->rx.qp_num) == s) r->by_qp.erase(s->rx.qp_num);
  if (r->last_sock == s) r->last_sock = nullptr;
  r->credits.leave(&s->rx.share);
  r->credits.add_buffers(kCtrlDepth - (s->rx.ctrl_lost < kCtrlDepth ? s->rx.ctrl_lost : kCtrlDepth));
  // Messages of it the application still holds: their buffers go to the pool when freed. (Only
  // when some buffer names it: the walk over every slab made closing n connections cost n^2.)
  for (Pool *p = r->slabs.front(); s->rx.routed && p; p = r->slabs.next(p))
    for (uint32_t i = 0; i < p->count; ++i)
      if (p->slots[i].sock == s) route_to(&p->slots[i], nullptr);
  --r->conns;
  s->rx.shared = nullptr;
  shared_serve(r);
  shared_maybe_destroy(r);
}

Socket *recv_owner(const Slot *slot) { return slot->pool->shared ? slot->sock : slot->pool->user; }

Socket *recv_route(Slot *slot, uint32_t qp_num) {
  SharedRecv *r = slot->pool->shared;
  if (!r) return slot->pool->user;
  const bool last = qp_num == r->last_qp && r->last_sock;
  route_to(slot, last ? r->last_sock : r->by_qp.get(qp_num));
  if (last) return slot->sock;
  if (!slot->sock) {
    shared_post(r, slot);  // its connection is gone: back into the queue
    return nullptr;
  }
  r->last_qp = qp_num;
  r->last_sock = slot->sock;
  return slot->sock;
}

bool recv_arrived(Socket *s, Slot *slot, bool wants) {
  SharedRecv *r = s->rx.shared;
  if (!r) return s->tx.credits.on_data_arrived();
  if (!s->tx.credits.data_usable() || !r->credits.on_arrival(&s->rx.share, wants)) return false;
  if (!wants) shared_serve(r);  // what it was owed above its base goes to those waiting
  slot->credited = true;
  s->tx.credits.data_lent();
  // It waits for more: a slab more, if the pool may grow (its turn comes in shared_serve).
  if (s->rx.share.wait_node.linked() && r->buffers < shared_limit(r) && shared_grow(r))
    shared_serve(r);
  return true;
}

bool recv_grants_held(Socket *s) {
  if (!s->loop->poll_rest) return false;
  if (!s->fresh_node.linked()) s->loop->fresh.push_back(s);
  return true;
}

void recv_grants_release(Loop *loop) {
  while (Socket *s = loop->fresh.pop_front()) s->tx.credits.release_fresh();
}

namespace {

// The lend itself: the slot's state and counts, the message the application gets.
inline void lend(Slot *slot, uint8_t *data, size_t size, bool has_imm, uint32_t imm) {
  slot->state = SlotState::Lent;
  if (SharedRecv *r = slot->pool->shared) ++r->lent;
  else ++slot->pool->out;
  ibmsg_buffer *msg = &slot->own;
  msg->data = data;
  msg->size = size;
  msg->status = IBMSG_RECEIVED;
  msg->user_data = nullptr;
  msg->flags = has_imm ? IBMSG_MSG_IMM : 0;
  msg->imm = imm;
  slot->req.kind = uint8_t(MsgKind::Plain);
  slot->req.answered = false;
}

// A message can overtake the ESTABLISHED event on the accepting side: it proves the connection
// is up. (Apart, so that the common path calls nothing and saves no registers.)
[[gnu::noinline]] void lend_accepting(Socket *s, Slot *slot, uint8_t *data, size_t size,
                                      bool has_imm, uint32_t imm) {
  s->loop->hooks->data_established(s);
  lend(slot, data, size, has_imm, imm);
}

}  // namespace

void recv_lend(Socket *s, Slot *slot, uint8_t *data, size_t size, bool has_imm, uint32_t imm) {
  if (s->state == State::Accepting) lend_accepting(s, slot, data, size, has_imm, imm);
  else lend(slot, data, size, has_imm, imm);
}

void recv_back(Socket *s, Slot *slot) {
  Pool *p = slot->pool;
  if (SharedRecv *r = p->shared) {
    const bool credited = slot->credited;
    if (credited && s) s->tx.credits.on_data_dropped();
    // Its credit (unless it came without one) goes where the pool says.
    ShareConn *c = s && s->rx.shared == r ? &s->rx.share : nullptr;
    if (!shared_post(r, slot)) {
      if (credited) r->credits.on_lost(c);  // (its unit left the pool at its arrival)
      else r->credits.lose();
      --r->buffers;
      if (s) socket_close(s, IBMSG_EIO);  // as with a buffer of its own the QP refuses
    } else if (credited) {
      if (ShareConn *to = r->credits.on_freed(c)) {
        Socket *u = static_cast<Socket *>(to->user);
        u->loop->hooks->ctrl_due(u);
      }
    }
    return;
  }
  if (s && s->res.has_qp && s->state != State::Closing) {
    if (tp::post_recv(s->id, &slot->work.wr, slot->buf, uint32_t(p->slot_size), p->mr) ==
            IBMSG_OK &&
        posted(s, false) == IBMSG_OK) {
      slot->state = SlotState::Posted;
      s->tx.credits.on_data_freed();
      s->loop->hooks->ctrl_due(s);
      return;
    }
    socket_close(s, IBMSG_EIO);
  }
  slot->state = SlotState::Free;
  if (s) s->tx.credits.on_data_dropped();
  else pool_maybe_release(p);
}

void recv_unlent(Socket *s, Slot *slot) {
  Pool *p = slot->pool;
  if (SharedRecv *r = p->shared) {
    recv_back(s, slot);
    --r->lent;
    shared_maybe_destroy(r);
    return;
  }
  --p->out;
  recv_back(s, slot);
}

void recv_ctrl_back(Socket *s, Slot *slot) {
  if (SharedRecv *r = slot->pool->shared) {
    if (!shared_post(r, slot)) {
      ++s->rx.ctrl_lost;  // not in the queue: it does not go back to the pool at the leave
      --r->buffers;
      socket_close(s, IBMSG_EIO);
    } else if (s->state != State::Closing) {
      s->tx.credits.on_ctrl_received();
    }
    return;
  }
  slot->state = SlotState::Free;
  if (s->state == State::Closing) return;
  if (tp::post_recv(s->id, &slot->work.wr, slot->buf, uint32_t(slot->pool->slot_size),
                    slot->pool->mr) ||
      posted(s, false)) {
    socket_close(s, IBMSG_EIO);
  } else {
    slot->state = SlotState::Posted;
    s->tx.credits.on_ctrl_received();
  }
}

void recv_drop(Socket *s, Slot *slot, int reason) {
  if (slot->pool->shared) recv_back(s, slot);  // the shared queue needs it back
  else slot->state = SlotState::Free;
  // A peer that breaks the protocol on shared buffers takes them from the other connections
  // with every message it sends until its QP stops: the QP goes to the error state now, not at
  // the teardown.
  const bool stop = slot->pool->shared && reason == IBMSG_EPROTO && s->was_connected &&
                    s->state != State::Closing && s->state != State::Closed;
  if (reason == IBMSG_EPROTO && s->state != State::Closing && s->state != State::Closed)
    IBMSG_LOG(s, IBMSG_LOG_ERROR, "the peer broke the protocol");
  socket_close(s, reason);
  if (stop) tp::cm_disconnect(s->id);
}

void recv_closing(Socket *s) {
  if (SharedRecv *r = s->rx.shared) r->credits.stop_waiting(&s->rx.share);
}

void recv_wants(Socket *s) {
  SharedRecv *r = s->rx.shared;
  if (!r) return;  // buffers of its own: it has all its credits already
  r->credits.on_wants(&s->rx.share);
  if (s->rx.share.wait_node.linked() && r->buffers < shared_limit(r) && shared_grow(r))
    shared_serve(r);
}

bool recv_given_back(Socket *s, uint32_t n) {
  SharedRecv *r = s->rx.shared;
  if (!r) return s->tx.credits.on_given_back(n);
  if (!r->credits.on_given_back(&s->rx.share, n)) return false;
  shared_serve(r);
  return true;
}

void recv_memory(const Device *dev, ibmsg_memory *out) {
  for (const SharedRecv *r = dev->shared.front(); r; r = dev->shared.next(r))
    for (const Pool *p = r->slabs.front(); p; p = r->slabs.next(p)) out->shared += p->bytes;
}

uint32_t eager_recv_size(const Socket *s) { return s->rx.eager ? s->rx.eager : option_eager(s); }

// (The option's eager size, not the scaled one: a connection that offers rendezvous keeps
// offering it when its eager size is scaled down, and only such a connection's is.)
bool rndv_offered(const Socket *s) { return s->opts.max_msg_size > uint32_t(s->opts.eager_size); }

void recv_mark_request(Socket *s, Slot *slot, bool request, const wire::ReqTrailer &tr) {
  slot->req.kind = uint8_t(request ? MsgKind::Request : MsgKind::Reply);
  slot->req.id = tr.id;
  slot->req.retry = tr.retry;
  slot->req.floor = tr.floor;
  slot->req.session = s->reqs.peer_session;
  if (request) slot->own.flags |= IBMSG_MSG_REQUEST;
}

}  // namespace ibmsg
