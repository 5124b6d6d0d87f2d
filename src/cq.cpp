// The completion queues of a device on a loop, shared by the device's connections: one, grown
// (doubling) as connections come, and another when it cannot grow; polling them, each completion
// going to the connection whose work request it names. Arming and busy polling are poll.cpp's.
#include <new>

#include "internal.hpp"

namespace ibmsg {
namespace {

// The connection a completed work request belongs to.
Socket *socket_of(const tp::Completion &wc) {
  const tp::WorkCtx *ctx = wc.ctx;
  switch (ctx->op) {
    case tp::Op::Recv: return recv_route(static_cast<Slot *>(ctx->owner), wc.qp_num);
    case tp::Op::Send: return static_cast<Slot *>(ctx->owner)->sock;
    case tp::Op::RndvRead:
    case tp::Op::RndvFin: return recv_owner(static_cast<Slot *>(ctx->owner));
    case tp::Op::Ctrl: return static_cast<Socket *>(ctx->owner);
    case tp::Op::RdmaWrite:
    case tp::Op::RdmaRead:
    case tp::Op::WriteImm:
    case tp::Op::Atomic: return static_cast<Op *>(ctx->owner)->sock;
    case tp::Op::Bind: return static_cast<Grant *>(ctx->owner)->conn;
    default: return nullptr;  // nothing else is posted
  }
}

}  // namespace

DevCq *device_cq_reserve(Device *dev, uint32_t need, int *err) {
  constexpr uint32_t kMinCq = 256;
  const uint32_t max = tp::device_info(dev->tp).max_cqe;
  *err = IBMSG_OK;
  for (DevCq *q = dev->cqs.front(); q; q = dev->cqs.next(q)) {
    if (q->dead) continue;
    const uint64_t want = uint64_t(q->need) + need;
    if (want <= q->size) return q;
    if (want > max) continue;
    // Doubling: growing costs a resize now and then, not one per connection.
    uint64_t size = 2 * uint64_t(q->size);
    if (size < want) size = want;
    if (size > max) size = max;
    if (tp::cq_resize(q->cq, uint32_t(size)) == IBMSG_OK) {
      q->size = uint32_t(size);
      return q;
    }
  }
  // All full (or none yet): another CQ on the device.
  uint64_t size = 2 * uint64_t(need);
  if (size < kMinCq) size = kMinCq;
  if (size > max) size = max;
  if (need > size) {
    *err = IBMSG_EINVAL;  // more than the device's largest CQ for one connection
    return nullptr;
  }
  DevCq *q = new (std::nothrow) DevCq();
  if (!q) {
    *err = IBMSG_ENOMEM;
    return nullptr;
  }
  *err = tp::cq_create(dev->tp, uint32_t(size), dev, &q->cq);
  if (*err) {
    delete q;
    return nullptr;
  }
  q->size = uint32_t(size);
  dev->cqs.push_back(q);
  return q;
}

void device_cqs_destroy(Device *dev) {
  while (DevCq *q = dev->cqs.pop_front()) {
    tp::cq_destroy(q->cq);  // its connections are gone, and drained it
    delete q;
  }
}

int drain_device(Device *dev) {
  tp::Completion wc[32];
  int total = 0;
  for (DevCq *q = dev->cqs.front(); q; q = dev->cqs.next(q)) {
    while (!q->dead) {
      int n = tp::cq_poll(q->cq, wc, 32);
      if (n < 0) {
        q->dead = true;
        device_cq_failed(dev, IBMSG_EIO);
        break;
      }
      for (int i = 0; i < n; ++i) {
        Socket *s = socket_of(wc[i]);
        // A slot whose pool has no connection any more: cannot happen, since a teardown polls
        // the CQ after destroying the QP and before giving the pools back (a shared receive
        // buffer whose connection is gone went back into its queue).
        if (!s) continue;
        poll_touch(s);  // activity: a busy-polling connection polls (again)
        on_completion(s, wc[i]);
      }
      total += n;
      if (n < 32) break;
    }
  }
  // What the callbacks posted goes out now, one list per connection.
  posts_flush(dev->loop);
  return total;
}

void devices_unpark(Loop *loop) {
  for (Device *d = loop->devices.front(); d; d = loop->devices.next(d)) {
    if (d->parked == 0) continue;
    drain_device(d);
    Pool *p = d->pools.front();
    while (p) {
      Pool *next = d->pools.next(p);  // releasing p may release the device: not before the end
      if (p->parked_cq) {
        p->parked_cq->need -= p->parked_need;
        p->parked_cq = nullptr;
        --d->parked;
        --p->out;
        pool_maybe_release(p);
      }
      p = next;
    }
  }
}

// Marks nothing itself: the caller marks the CQ that failed dead first.
void device_cq_failed(Device *dev, int reason) {
  for (Socket *s = dev->loop->sockets.front(); s; s = dev->loop->sockets.next(s))
    if (s->dev == dev && s->cq) socket_close(s, reason);
}

void on_cq_ready(void *cq_user, void *) { poll_cq_ready(static_cast<Device *>(cq_user)); }

}  // namespace ibmsg
