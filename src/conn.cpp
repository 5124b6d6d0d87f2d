// A connection's resources and parameters: its queue pair, CQ share, send and receive buffers
// (conn_open, conn_release), the hello and the parameters both sides agree on, its state changes,
// and the process's registry of open sockets.
#include "conn.hpp"

#include <arpa/inet.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <new>

#include "internal.hpp"
#include "completion.hpp"
#include "cq.hpp"
#include "errors.hpp"
#include "poll.hpp"
#include "recv.hpp"
#include "rndv.hpp"
#include "send_slots.hpp"
#include "wake.hpp"

namespace ibmsg {
namespace {

// Every open socket of the process, so that listen/connect/accept refuse a struct that is still
// an open socket (on any loop) instead of orphaning it. Not on the data path.
std::mutex open_lock;
List<Socket, &Socket::open_node> open_sockets;
// The same by their struct's address, so that the check is not a walk over thousands of them;
// those it had no memory to index (unindexed) are found by the walk.
PtrMap<Socket> open_index;
size_t unindexed = 0;
uint64_t key_of(const ibmsg_socket *pub) { return uint64_t(reinterpret_cast<uintptr_t>(pub)); }
// Structs accepted onto another loop whose loop has not set them up yet (spread.cpp): open too.
struct HandedOver {
  const ibmsg_socket *pub;
  HandedOver *next;
};
HandedOver *handed_over = nullptr;

}  // namespace

void register_open(Socket *s) {
  std::lock_guard<std::mutex> g(open_lock);
  open_sockets.push_back(s);
  s->open_indexed = open_index.put(key_of(s->pub), s);
  if (!s->open_indexed) ++unindexed;
}

int format_address(const sockaddr *sa, char *buf, size_t len, unsigned short *port) {
  if (!sa) return IBMSG_ENOTCONN;
  const void *addr;
  unsigned short p;
  if (sa->sa_family == AF_INET) {
    auto in = reinterpret_cast<const sockaddr_in *>(sa);
    addr = &in->sin_addr;
    p = ntohs(in->sin_port);
  } else if (sa->sa_family == AF_INET6) {
    auto in6 = reinterpret_cast<const sockaddr_in6 *>(sa);
    addr = &in6->sin6_addr;
    p = ntohs(in6->sin6_port);
  } else {
    return IBMSG_ENOTCONN;
  }
  if (buf && len) {
    if (!inet_ntop(sa->sa_family, addr, buf, socklen_t(len))) return IBMSG_EINVAL;
  }
  if (port) *port = p;
  return IBMSG_OK;
}

bool device_matches(const Socket *s) {
  if (!s->opts.device[0]) return true;
  const char *name = tp::cm_device_name(s->id);
  return name && strcmp(name, s->opts.device) == 0;
}

void fill_conn_param(const Socket *s, tp::ConnParam *p, uint8_t *hello) {
  wire::encode_hello(my_hello(s), hello);
  p->pdata = hello;
  p->plen = wire::kHelloSize;
  p->retry_count = uint8_t(s->opts.retry_count);
  p->ack_timeout = uint8_t(s->opts.ack_timeout);
  p->rnr_retry_count = uint8_t(s->opts.rnr_retry);
  // RDMA reads and atomics each side may have outstanding: the device's limits (librdmacm takes
  // the smaller of both sides'), none without one-sided RDMA.
  p->responder_resources = s->res.responder_resources;
  p->initiator_depth = s->res.initiator_depth;
}

bool set_state(Socket *s, Event ev) {
  State next;
  if (!transition(s->state, ev, &next)) {
    note_invalid_transition(s->state, ev);
    return false;
  }
  const State before = s->state;
  s->state = next;
  s->pub->status = public_status(next, s->close_reason);
  IBMSG_LOG(s, IBMSG_LOG_DEBUG, "state %s -> %s", state_name(before), state_name(next));
  return true;
}

namespace {

bool is_open_locked(const ibmsg_socket *pub) {
  if (open_index.get(key_of(pub))) return true;
  for (Socket *s = open_sockets.front(); unindexed && s; s = open_sockets.next(s))
    if (s->pub == pub) return true;
  for (HandedOver *h = handed_over; h; h = h->next)
    if (h->pub == pub) return true;
  return false;
}

}  // namespace

bool socket_is_open(const ibmsg_socket *pub) {
  std::lock_guard<std::mutex> g(open_lock);
  return is_open_locked(pub);
}

int socket_hand_over(const ibmsg_socket *pub) {
  std::lock_guard<std::mutex> g(open_lock);
  if (is_open_locked(pub)) return IBMSG_ESTATE;
  auto *h = new (std::nothrow) HandedOver{pub, handed_over};
  if (!h) return IBMSG_ENOMEM;
  handed_over = h;
  return IBMSG_OK;
}

void socket_handed(const ibmsg_socket *pub) {
  std::lock_guard<std::mutex> g(open_lock);
  for (HandedOver **p = &handed_over; *p; p = &(*p)->next) {
    if ((*p)->pub == pub) {
      HandedOver *h = *p;
      *p = h->next;
      delete h;
      return;
    }
  }
}

void socket_unregister(Socket *s) {
  std::lock_guard<std::mutex> g(open_lock);
  if (!s->open_node.linked()) return;  // never registered
  open_sockets.remove(s);
  if (s->open_indexed) open_index.erase(key_of(s->pub));
  else --unindexed;
  s->open_indexed = false;
}

wire::Hello my_hello(const Socket *s) {
  wire::Hello h;
  // Shared receive buffers: a base the peer always gets, more while it wants them.
  h.cap = uint32_t(s->opts.recv_depth);
  h.recv_depth = s->rx.shared ? s->rx.shared->credits.base() : h.cap;
  h.ctrl_depth = kCtrlDepth;
  h.max_msg_size = eager_recv_size(s);
  h.features = wire::kFeatures & ~(s->opts.rdma ? 0 : wire::kFeatureRdma);
  if (rndv_offered(s)) h.rndv_max_size = s->opts.max_msg_size;
  else h.features &= ~wire::kFeatureRndv;
  h.session = s->loop->req.session;
  return h;
}

void set_peer(Socket *s, const wire::Hello &h) {
  const wire::Hello me = my_hello(s);
  s->peer.features = h.features & me.features;
  // Requests need the peer's session: a hello without one has none (its requests: EPROTO).
  if (!h.session) s->peer.features &= ~wire::kFeatureRequest;
  s->reqs.peer_session = h.session;
  s->tx.credits.init(h.recv_depth, h.ctrl_depth, me.recv_depth, h.cap,
                  s->rx.shared ? &s->rx.share : nullptr, (s->peer.features & wire::kFeatureShared) != 0);
  // Without rendezvous on both sides only eager messages go, either way.
  const bool rndv = (s->peer.features & wire::kFeatureRndv) && h.rndv_max_size;
  const uint32_t mine = rndv ? s->opts.max_msg_size : eager_recv_size(s);
  const uint32_t theirs = rndv ? h.rndv_max_size : h.max_msg_size;
  if (!rndv) s->peer.features &= ~wire::kFeatureRndv;
  s->peer.max_msg = theirs < mine ? theirs : mine;
  s->peer.eager = h.max_msg_size < eager_recv_size(s) ? h.max_msg_size : eager_recv_size(s);
  s->peer.known = true;
}

int conn_open(Socket *s) {
  static std::atomic<uint64_t> serials{0};
  s->res.serial = ++serials;
  const uint32_t recv_slots = uint32_t(s->opts.recv_depth) + kCtrlDepth;
  // The send queue's work requests: 32 + 4 + 16 + 4 + 4 = 60 with the defaults. Providers round
  // a queue up to a power of two of slots (rxe: of the depth + 1, 512 bytes a slot), so staying
  // under 64 halves what each connection maps: 36 KiB on Soft-RoCE instead of 68 (measured,
  // 1.7), 320 MiB at 10000 connections.
  const uint32_t send_wrs = uint32_t(s->opts.send_depth) + kCtrlDepth +
                            uint32_t(s->opts.rdma ? s->opts.rdma_depth : 0) +
                            (rndv_offered(s) ? kRndvReads : 0) +
                            (s->opts.rdma ? kBindDepth : 0);  // windows of its grants
  const tp::DeviceInfo &info = tp::device_info(s->dev->tp);
  if (s->opts.rdma || rndv_offered(s)) {  // rendezvous: the receiver reads the sender's buffer
    s->res.responder_resources = uint8_t(info.max_rd_atom > 255 ? 255 : info.max_rd_atom);
    s->res.initiator_depth = uint8_t(info.max_init_rd_atom > 255 ? 255 : info.max_init_rd_atom);
  }
  if (recv_slots > info.max_qp_wr || send_wrs > info.max_qp_wr ||
      recv_slots + send_wrs > info.max_cqe)
    return IBMSG_EINVAL;
  int err = IBMSG_OK;
  s->res.devcq = device_cq_reserve(s->dev, recv_slots + send_wrs, &err);
  if (err) return err;
  s->res.cq = s->res.devcq->cq;
  s->res.cq_need = recv_slots + send_wrs;
  s->res.devcq->need += s->res.cq_need;
  s->tx.ctrl_wr.owner = s;
  // Small messages go inline (no DMA read of the payload) where the device offers it.
  tp::QpCaps caps{send_wrs, recv_slots, 256};
  recv_join(s, &caps);  // the device's shared receive buffers, if it can
  err = tp::qp_create(s->id, s->dev->tp, s->res.cq, &caps);
  if (!err) {
    s->res.has_qp = true;
    s->res.max_inline = caps.max_inline;
    err = send_join(s);
  }
  if (!err) err = recv_open(s);
  // All of them before the connection can be established, also from inside a callback.
  if (!err) err = tp::post_flush(s->id);
  if (!err) return IBMSG_OK;
  conn_release(s);
  return err;
}

void conn_release(Socket *s, bool drain, bool park) {
  poll_stop(s);
  s->loop->unflushed.remove(s);  // the QP drops what it holds: the teardown cancels it
  if (s->res.has_qp) tp::qp_destroy(s->id);
  s->res.has_qp = false;
  if (s->res.cq) {
    // Completions of the QP that are still in the shared CQ name this socket's slots and
    // operations: they are handed out now, while the socket and its pools are still there.
    if (drain) drain_device(s->dev);
    if (park && s->rx.pool) {
      Pool *p = s->rx.pool;
      p->parked_cq = s->res.devcq;
      p->parked_need = s->res.cq_need;
      ++p->out;  // pool_disown keeps it
      ++s->dev->parked;
      loop_kick(s->loop);
    } else {
      s->res.devcq->need -= s->res.cq_need;
    }
    s->res.cq_need = 0;
  }
  s->res.cq = nullptr;
  s->res.devcq = nullptr;
  rndv_release(s);
  send_leave(s);
  recv_leave(s);
}

}  // namespace ibmsg
