// Sockets: the connection state machine driven by RDMA CM events, the send path with credits,
// completions, and teardown.
#include <arpa/inet.h>
#include <netdb.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <new>

#include "internal.hpp"
#include "verbs.hpp"
#include "wire.hpp"

namespace ibmsg {
namespace {

constexpr size_t kPrivateDataMax = 256;

void set_state(Socket *s, Event ev) {
  State next;
  if (transition(s->state, ev, &next)) s->state = next;
  s->pub->status = public_status(s->state, s->close_reason);
}

void init_pub(ibmsg_socket *pub, Loop *loop, Socket *s) {
  // user_data is the application's: left as it is.
  pub->status = IBMSG_UNCONNECTED;
  pub->loop = loop->pub;
  pub->close_reason = IBMSG_OK;
  pub->reject_reason[0] = '\0';
  pub->impl = nullptr;
  s->pub = pub;
  s->loop = loop;
  s->opts = loop->opts;
}

int resolve(const char *host, unsigned short port, bool passive, sockaddr_storage *out) {
  memset(out, 0, sizeof *out);
  if (!host || !*host) {
    if (!passive) return IBMSG_EINVAL;
    // All addresses: the IPv6 wildcard also takes IPv4 connections.
    auto *a = reinterpret_cast<sockaddr_in6 *>(out);
    a->sin6_family = AF_INET6;
    a->sin6_addr = in6addr_any;
    a->sin6_port = htons(port);
    return IBMSG_OK;
  }
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
  char service[8];
  snprintf(service, sizeof service, "%u", unsigned(port));
  if (getaddrinfo(host, service, &hints, &res) != 0 || !res) return IBMSG_ENOADDR;
  memcpy(out, res->ai_addr, res->ai_addrlen);
  freeaddrinfo(res);
  return IBMSG_OK;
}

bool device_matches(const Socket *s, ibv_context *ctx) {
  if (!s->opts.device[0]) return true;
  return ctx && strcmp(ibv_get_device_name(ctx->device), s->opts.device) == 0;
}

void start_timer(Socket *s) {
  ev_timer_init(&s->connect_timer, on_connect_timeout, s->opts.connect_timeout_ms / 1000.0, 0.);
  s->connect_timer.data = s;
  ev_timer_start(s->loop->ev, &s->connect_timer);
  s->timer_active = true;
}

void stop_timer(Socket *s) {
  if (!s->timer_active) return;
  ev_timer_stop(s->loop->ev, &s->connect_timer);
  s->timer_active = false;
}

void close_now(Socket *s, int reason) {
  if (s->close_reason == IBMSG_OK) s->close_reason = reason;
  teardown(s);
}

void reject_id(rdma_cm_id *id, const char *text) {
  uint8_t data[wire::kRejectMaxSize];
  size_t len = wire::encode_reject(text, data);
  rdma_reject(id, data, uint8_t(len));
  rdma_destroy_id(id);
}

wire::Hello my_hello(const Socket *s) {
  wire::Hello h;
  h.recv_depth = uint32_t(s->opts.recv_depth);
  h.ctrl_depth = kCtrlDepth;
  h.max_msg_size = uint32_t(s->opts.max_msg_size);
  return h;
}

void fill_conn_param(const Socket *s, rdma_conn_param *p, uint8_t *hello) {
  memset(p, 0, sizeof *p);
  wire::encode_hello(my_hello(s), hello);
  p->private_data = hello;
  p->private_data_len = wire::kHelloSize;
  p->responder_resources = 0;  // two-sided messages only: no RDMA reads or atomics
  p->initiator_depth = 0;
  p->retry_count = 7;
  p->rnr_retry_count = uint8_t(s->opts.rnr_retry);
}

void set_peer(Socket *s, const wire::Hello &h) {
  s->credits.init(h.recv_depth, h.ctrl_depth, uint32_t(s->opts.recv_depth));
  s->max_msg = h.max_msg_size < uint32_t(s->opts.max_msg_size) ? h.max_msg_size
                                                                 : uint32_t(s->opts.max_msg_size);
  s->have_peer = true;
}

// --- sending ---

void flight_push(Socket *s, Slot *slot) {
  slot->next = nullptr;
  if (s->flight_tail) s->flight_tail->next = slot;
  else s->flight_head = slot;
  s->flight_tail = slot;
}

void flight_remove(Socket *s, Slot *slot) {
  // Sends complete in order, so this is the head unless a completion went missing.
  Slot *prev = nullptr;
  for (Slot *it = s->flight_head; it; prev = it, it = it->next) {
    if (it != slot) continue;
    if (prev) prev->next = it->next;
    else s->flight_head = it->next;
    if (s->flight_tail == it) s->flight_tail = prev;
    it->next = nullptr;
    return;
  }
}

// Posts one message with a data credit; on failure the credit and owed counts are restored.
int send_now(Socket *s, Slot *slot) {
  Credits saved = s->credits;
  wire::Imm imm = s->credits.take_data();
  int rc = post_data(s, slot, wire::encode_imm(imm));
  if (rc) {
    s->credits = saved;
    return rc;
  }
  slot->state = SlotState::InFlight;
  flight_push(s, slot);
  return IBMSG_OK;
}

void flush_queue(Socket *s) {
  while (s->queue_head && s->state == State::Connected && s->credits.can_send_data()) {
    Slot *slot = s->queue_head;
    s->queue_head = slot->next;
    if (!s->queue_head) s->queue_tail = nullptr;
    --s->queue_len;
    if (send_now(s, slot)) {
      // Put it back in front: teardown cancels it in order with the rest.
      slot->next = s->queue_head;
      s->queue_head = slot;
      if (!s->queue_tail) s->queue_tail = slot;
      ++s->queue_len;
      schedule_close(s, IBMSG_EIO);
      return;
    }
  }
}

// A credit-only message, when credits are owed and no data message can carry them.
void maybe_send_ctrl(Socket *s) {
  if (s->state != State::Connected || !s->credits.ctrl_needed() || !s->credits.can_send_ctrl())
    return;
  Credits saved = s->credits;
  wire::Imm imm = s->credits.take_ctrl();
  if (post_ctrl(s, wire::encode_imm(imm))) {
    s->credits = saved;
    schedule_close(s, IBMSG_EIO);
  }
}

void notify_sent(Socket *s, Slot *slot, int status) {
  ibmsg_buffer *msg = slot->msg;
  slot->state = SlotState::Allocated;
  msg->status = status == IBMSG_OK ? IBMSG_SENT : IBMSG_SEND_FAILED;
  if (auto cb = s->loop->pub->message_sent) cb(s->pub, msg, status);
}

void cancel_list(Socket *s, Slot *list) {
  while (list) {
    Slot *slot = list;
    list = slot->next;
    slot->next = nullptr;
    notify_sent(s, slot, IBMSG_ECANCELED);
  }
}

// --- completions ---

void establish(Socket *s) {
  stop_timer(s);
  set_state(s, Event::Established);
  if (auto cb = s->loop->pub->connection_established) cb(s->pub);
}

void on_send_wc(Socket *s, Slot *slot, const ibv_wc &wc) {
  flight_remove(s, slot);
  if (wc.status == IBV_WC_SUCCESS) {
    notify_sent(s, slot, IBMSG_OK);
    return;
  }
  bool flushed = wc.status == IBV_WC_WR_FLUSH_ERR;
  if (!flushed || s->state != State::Closing) schedule_close(s, flushed ? IBMSG_ECONNRESET : IBMSG_EIO);
  notify_sent(s, slot, flushed ? IBMSG_ECANCELED : IBMSG_EIO);
}

void on_recv_wc(Socket *s, Slot *slot, const ibv_wc &wc) {
  if (wc.status != IBV_WC_SUCCESS) {
    slot->state = SlotState::Free;
    bool flushed = wc.status == IBV_WC_WR_FLUSH_ERR;
    if (!flushed || s->state != State::Closing) schedule_close(s, flushed ? IBMSG_ECONNRESET : IBMSG_EIO);
    return;
  }
  wire::Imm imm;
  if (!(wc.wc_flags & IBV_WC_WITH_IMM) || !wire::decode_imm(ntohl(wc.imm_data), &imm)) {
    slot->state = SlotState::Free;
    schedule_close(s, IBMSG_EPROTO);
    return;
  }
  s->credits.on_returned(imm);
  if (imm.ctrl) {
    slot->state = SlotState::Free;
    if (s->state != State::Closing) {
      if (post_recv(s, slot)) schedule_close(s, IBMSG_EIO);
      else s->credits.on_ctrl_received();
    }
    flush_queue(s);
    maybe_send_ctrl(s);
    return;
  }
  // Data can overtake the ESTABLISHED event on the accepting side: it proves the connection is up.
  if (s->state == State::Accepting) establish(s);
  slot->state = SlotState::Lent;
  ++slot->pool->out;
  s->credits.on_data_received();
  ibmsg_buffer *msg = &slot->own;
  msg->data = slot->buf;
  msg->size = wc.byte_len;
  msg->status = IBMSG_RECEIVED;
  msg->user_data = nullptr;
  flush_queue(s);
  maybe_send_ctrl(s);
  if (auto cb = s->loop->pub->message_received) cb(s->pub, msg);
  else msg_free(msg);
}

// --- CM events ---

void on_addr_resolved(Socket *s) {
  if (s->state != State::ResolvingAddr) return;
  if (!device_matches(s, s->id->verbs)) {
    close_now(s, IBMSG_ENODEV);
    return;
  }
  if (rdma_resolve_route(s->id, s->opts.connect_timeout_ms)) {
    close_now(s, from_errno(errno));
    return;
  }
  set_state(s, Event::AddrResolved);
}

void on_route_resolved(Socket *s) {
  if (s->state != State::ResolvingRoute) return;
  int err = IBMSG_OK;
  s->dev = device_get(s->loop, s->id->verbs, &err);
  if (!s->dev) {
    close_now(s, err);
    return;
  }
  err = conn_create(s);
  if (err) {
    close_now(s, err);
    return;
  }
  rdma_conn_param param;
  uint8_t hello[wire::kHelloSize];
  fill_conn_param(s, &param, hello);
  if (rdma_connect(s->id, &param)) {
    close_now(s, from_errno(errno));
    return;
  }
  set_state(s, Event::RouteResolved);
}

void on_established(Socket *s, const uint8_t *pdata, size_t plen) {
  if (s->state == State::Connecting) {
    wire::Hello h;
    if (!wire::decode_hello(pdata, plen, &h)) {
      close_now(s, IBMSG_EPROTO);
      return;
    }
    set_peer(s, h);
  } else if (s->state != State::Accepting) {
    return;  // already established by an early completion, or closing
  }
  establish(s);
}

void on_rejected(Socket *s, int status, const uint8_t *pdata, size_t plen) {
  if (s->state == State::Closing || s->state == State::Closed) return;
  int reason = IBMSG_ECONNREFUSED;
  if (wire::decode_reject(pdata, plen, s->pub->reject_reason, sizeof s->pub->reject_reason)) {
    reason = IBMSG_EREJECTED;
  } else if (status == 28) {  // IB_CM_REJ_CONSUMER_DEFINED: a peer application said no
    reason = IBMSG_EREJECTED;
  }
  close_now(s, reason);
}

void on_connect_request(Loop *loop, rdma_cm_id *listen_id, rdma_cm_id *id, const uint8_t *pdata,
                        size_t plen) {
  Socket *l = listen_id ? static_cast<Socket *>(listen_id->context) : nullptr;
  if (!l || l->magic != kSocketMagic || l->state != State::Listening) {
    reject_id(id, "not listening");
    return;
  }
  ibmsg__request r;
  r.id = id;
  r.listener = l;
  if (!wire::decode_hello(pdata, plen, &r.hello)) {
    reject_id(id, "not an ibmsg peer of a compatible version");
    return;
  }
  if (l->open_connections >= l->max_connections) {
    reject_id(id, "too many connections");
    return;
  }
  char peer[INET6_ADDRSTRLEN] = "";
  sockaddr *sa = rdma_get_peer_addr(id);
  if (sa && sa->sa_family == AF_INET)
    inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in *>(sa)->sin_addr, peer, sizeof peer);
  else if (sa && sa->sa_family == AF_INET6)
    inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6 *>(sa)->sin6_addr, peer, sizeof peer);

  ibmsg_connection_request req;
  req.status = IBMSG_UNDECIDED;
  req.listener = l->pub;
  req.loop = loop->pub;
  req.peer_address = peer;
  req.peer_port = ntohs(rdma_get_dst_port(id));
  req.impl = &r;
  if (auto cb = loop->pub->connection_request) cb(&req);
  if (req.status == IBMSG_UNDECIDED) reject_id(id, "not accepted");
}

void on_disconnected(Socket *s) {
  if (s->state == State::Closing || s->state == State::Closed) return;
  close_now(s, IBMSG_ECONNRESET);
}

}  // namespace

void on_connect_timeout(struct ev_loop *, ev_timer *w, int) {
  Socket *s = static_cast<Socket *>(w->data);
  Loop *loop = s->loop;
  s->timer_active = false;
  ++loop->depth;
  if (s->state != State::Connected && s->state != State::Closing) close_now(s, IBMSG_ETIMEDOUT);
  --loop->depth;
}

void on_cm_event(Loop *loop, rdma_cm_event *ev) {
  const rdma_cm_event_type type = ev->event;
  const int status = ev->status;
  rdma_cm_id *id = ev->id, *listen_id = ev->listen_id;
  uint8_t pdata[kPrivateDataMax];
  size_t plen = 0;
  if (ev->param.conn.private_data && ev->param.conn.private_data_len) {
    plen = ev->param.conn.private_data_len < kPrivateDataMax ? ev->param.conn.private_data_len
                                                             : kPrivateDataMax;
    memcpy(pdata, ev->param.conn.private_data, plen);
  }
  rdma_ack_cm_event(ev);

  if (type == RDMA_CM_EVENT_CONNECT_REQUEST) {
    on_connect_request(loop, listen_id, id, pdata, plen);
    return;
  }
  Socket *s = id ? static_cast<Socket *>(id->context) : nullptr;
  if (!s || s->magic != kSocketMagic) return;
  switch (type) {
    case RDMA_CM_EVENT_ADDR_RESOLVED: on_addr_resolved(s); break;
    case RDMA_CM_EVENT_ROUTE_RESOLVED: on_route_resolved(s); break;
    case RDMA_CM_EVENT_ADDR_ERROR:
    case RDMA_CM_EVENT_ROUTE_ERROR:
      close_now(s, status == -ETIMEDOUT ? IBMSG_ETIMEDOUT : IBMSG_EHOSTUNREACH);
      break;
    case RDMA_CM_EVENT_ESTABLISHED: on_established(s, pdata, plen); break;
    case RDMA_CM_EVENT_REJECTED: on_rejected(s, status, pdata, plen); break;
    case RDMA_CM_EVENT_UNREACHABLE:
      close_now(s, status == -ETIMEDOUT ? IBMSG_ETIMEDOUT : IBMSG_EHOSTUNREACH);
      break;
    case RDMA_CM_EVENT_CONNECT_ERROR: close_now(s, IBMSG_EIO); break;
    case RDMA_CM_EVENT_DISCONNECTED: on_disconnected(s); break;
    case RDMA_CM_EVENT_DEVICE_REMOVAL: close_now(s, IBMSG_ENODEV); break;
    default: break;  // TIMEWAIT_EXIT, ADDR_CHANGE, CONNECT_RESPONSE: nothing to do
  }
}

void drain_cq(Socket *s) {
  ibv_wc wc[32];
  for (;;) {
    if (!s->cq) return;
    int n = ibv_poll_cq(s->cq, 32, wc);
    if (n < 0) {
      schedule_close(s, IBMSG_EIO);
      return;
    }
    for (int i = 0; i < n; ++i) {
      if (wc[i].wr_id == kCtrlWrId) {
        if (wc[i].status != IBV_WC_SUCCESS && s->state != State::Closing)
          schedule_close(s, wc[i].status == IBV_WC_WR_FLUSH_ERR ? IBMSG_ECONNRESET : IBMSG_EIO);
        continue;
      }
      Slot *slot = reinterpret_cast<Slot *>(wc[i].wr_id);
      if (slot->pool->recv) on_recv_wc(s, slot, wc[i]);
      else on_send_wc(s, slot, wc[i]);
    }
    if (n < 32) return;
  }
}

void pool_release(Pool *p) {
  Loop *loop = static_cast<Loop *>(p->loop);
  pool_deregister(p);
  pool_destroy(p);
  if (loop) --loop->live_pools;
}

static void pending_remove(Loop *loop, Socket *s) {
  Socket *prev = nullptr;
  for (Socket *it = loop->pending_head; it; prev = it, it = it->pending_next) {
    if (it != s) continue;
    if (prev) prev->pending_next = it->pending_next;
    else loop->pending_head = it->pending_next;
    if (loop->pending_tail == it) loop->pending_tail = prev;
    break;
  }
  s->pending_next = nullptr;
  s->close_pending = false;
}

static void detach_pool(Pool *p) {
  if (!p) return;
  p->owner = nullptr;
  for (uint32_t i = 0; i < p->count; ++i)
    if (p->slots[i].state == SlotState::Posted) p->slots[i].state = SlotState::Free;
  if (p->out == 0) pool_release(p);
}

void teardown(Socket *s) {
  Loop *loop = s->loop;
  if (s->close_pending) pending_remove(loop, s);
  stop_timer(s);
  bool was_connected = s->state == State::Connected;
  if (s->state != State::Closing)
    set_state(s, was_connected && s->close_reason == IBMSG_ECONNRESET ? Event::PeerDisconnected
                                                                        : Event::Failed);
  // What already completed is delivered (data received, sends confirmed) before anything is
  // canceled; callbacks may run here, and may call the API (posting now fails: closing).
  drain_cq(s);
  if (was_connected && s->id) rdma_disconnect(s->id);
  conn_destroy_queues(s);
  Slot *flight = s->flight_head, *queued = s->queue_head;
  s->flight_head = s->flight_tail = s->queue_head = s->queue_tail = nullptr;
  s->queue_len = 0;
  cancel_list(s, flight);
  cancel_list(s, queued);
  detach_pool(s->send_pool);
  detach_pool(s->recv_pool);
  s->send_pool = s->recv_pool = nullptr;
  if (s->id) rdma_destroy_id(s->id);
  s->id = nullptr;
  if (s->listener) {
    for (Socket *it = loop->sockets; it; it = it->next)
      if (it->from_listener == s) it->from_listener = nullptr;
  }
  if (s->from_listener) --s->from_listener->open_connections;
  loop_unlink(loop, s);

  ibmsg_socket *pub = s->pub;
  int reason = s->close_reason;
  set_state(s, Event::TornDown);
  pub->close_reason = reason;
  pub->impl = nullptr;
  s->magic = 0;
  delete s;
  // Last: after the callback the application may free pub; nothing here touches it again.
  if (auto cb = loop->pub->connection_closed) cb(pub, reason);
}

// --- API behind the C shims ---

// A socket with its rdma_cm id on the loop's event channel (not yet linked into the loop).
static Socket *new_socket(Loop *loop, ibmsg_socket *pub, int *err) {
  Socket *s = new (std::nothrow) Socket();
  if (!s) {
    *err = IBMSG_ENOMEM;
    return nullptr;
  }
  init_pub(pub, loop, s);
  if (rdma_create_id(loop->cm, &s->id, s, RDMA_PS_TCP)) {
    *err = errno == ENODEV || errno == ENOENT ? IBMSG_ENODEV : IBMSG_ESYS;
    delete s;
    return nullptr;
  }
  return s;
}

int socket_listen(Loop *loop, ibmsg_socket *pub, const char *ip, unsigned short port,
                  int max_conn) {
  sockaddr_storage addr;
  int err = resolve(ip, port, true, &addr);
  if (err) return err;
  Socket *s = new_socket(loop, pub, &err);
  if (!s) return err;
  if (rdma_bind_addr(s->id, reinterpret_cast<sockaddr *>(&addr))) {
    err = errno == EADDRINUSE ? IBMSG_EADDRINUSE : IBMSG_EADDRNOTAVAIL;
  } else if (s->id->verbs && !device_matches(s, s->id->verbs)) {
    err = IBMSG_ENODEV;
  } else if (rdma_listen(s->id, max_conn)) {
    err = errno == EADDRINUSE ? IBMSG_EADDRINUSE : from_errno(errno);
  }
  if (err) {
    rdma_destroy_id(s->id);
    delete s;
    return err;
  }
  s->listener = true;
  s->max_connections = max_conn;
  loop_link(loop, s);
  set_state(s, Event::Listen);
  pub->impl = s;
  return IBMSG_OK;
}

int socket_connect(Loop *loop, ibmsg_socket *pub, const char *ip, unsigned short port) {
  sockaddr_storage dst, src;
  int err = resolve(ip, port, false, &dst);
  if (err) return err;
  bool have_src = loop->opts.source_addr[0] != '\0';
  if (have_src && (err = resolve(loop->opts.source_addr, 0, false, &src))) return err;
  Socket *s = new_socket(loop, pub, &err);
  if (!s) return err;
  if (rdma_resolve_addr(s->id, have_src ? reinterpret_cast<sockaddr *>(&src) : nullptr,
                        reinterpret_cast<sockaddr *>(&dst), s->opts.connect_timeout_ms)) {
    err = errno == EADDRNOTAVAIL || errno == EINVAL ? IBMSG_EADDRNOTAVAIL : from_errno(errno);
    rdma_destroy_id(s->id);
    delete s;
    return err;
  }
  loop_link(loop, s);
  set_state(s, Event::Connect);
  start_timer(s);
  pub->impl = s;
  return IBMSG_OK;
}

int socket_accept(ibmsg_connection_request *req, ibmsg_socket *pub) {
  ibmsg__request *r = req->impl;
  if (req->status != IBMSG_UNDECIDED) return IBMSG_ESTATE;
  Socket *l = r->listener;
  Loop *loop = l->loop;
  Socket *s = new (std::nothrow) Socket();
  if (!s) return IBMSG_ENOMEM;
  init_pub(pub, loop, s);
  s->id = r->id;
  int err = IBMSG_OK;
  if (!device_matches(s, s->id->verbs)) err = IBMSG_ENODEV;
  if (!err) s->dev = device_get(loop, s->id->verbs, &err);
  if (!err) err = conn_create(s);
  if (!err) {
    set_peer(s, r->hello);
    s->id->context = s;
    rdma_conn_param param;
    uint8_t hello[wire::kHelloSize];
    fill_conn_param(s, &param, hello);
    if (rdma_accept(s->id, &param)) {
      err = from_errno(errno);
      s->id->context = l;
      detach_pool(s->send_pool);
      detach_pool(s->recv_pool);
      conn_destroy_queues(s);
    }
  }
  if (err) {
    req->status = IBMSG_REJECTED;
    reject_id(r->id, "the server could not set up the connection");
    delete s;
    return err;
  }
  s->from_listener = l;
  ++l->open_connections;
  loop_link(loop, s);
  set_state(s, Event::Accept);
  // A client that vanishes before the handshake ends must not hold the socket (and one of the
  // listener's max_connections) forever.
  start_timer(s);
  req->status = IBMSG_ACCEPTED;
  pub->impl = s;
  return IBMSG_OK;
}

int socket_reject(ibmsg_connection_request *req, const char *reason) {
  if (req->status != IBMSG_UNDECIDED) return IBMSG_ESTATE;
  req->status = IBMSG_REJECTED;
  reject_id(req->impl->id, reason ? reason : "");
  return IBMSG_OK;
}

int socket_disconnect(Socket *s) {
  if (s->state == State::Closing || s->state == State::Closed || s->close_pending)
    return IBMSG_ESTATE;
  bool connected = s->state == State::Connected;
  set_state(s, Event::Disconnect);
  // Moves the QP to the error state and tells the peer; the teardown runs from the loop.
  if (connected) rdma_disconnect(s->id);
  schedule_close(s, IBMSG_OK);
  return IBMSG_OK;
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
  if (slot->pool->recv || slot->pool->owner != s) return IBMSG_EINVAL;
  if (slot->state != SlotState::Allocated) return IBMSG_EBUSY;
  if (msg->size > s->max_msg) return IBMSG_EMSGSIZE;
  if (!s->queue_head && s->credits.can_send_data()) {
    int rc = send_now(s, slot);
    if (rc) return rc;
  } else {
    if (s->queue_len >= uint32_t(s->opts.send_queue)) return IBMSG_EAGAIN;
    slot->state = SlotState::Queued;
    slot->next = nullptr;
    if (s->queue_tail) s->queue_tail->next = slot;
    else s->queue_head = slot;
    s->queue_tail = slot;
    ++s->queue_len;
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
    if (!p->owner && p->out == 0) pool_release(p);
    return IBMSG_OK;
  }
  if (slot->state != SlotState::Lent) return IBMSG_ENOTALLOC;
  msg->status = IBMSG_FREED;
  --p->out;
  Socket *s = p->owner;
  if (s && s->qp && s->state != State::Closing) {
    if (post_recv(s, slot) == IBMSG_OK) {
      s->credits.on_data_freed();
      maybe_send_ctrl(s);
      return IBMSG_OK;
    }
    schedule_close(s, IBMSG_EIO);
  }
  slot->state = SlotState::Free;
  if (s) s->credits.on_data_dropped();
  else if (p->out == 0) pool_release(p);
  return IBMSG_OK;
}

}  // namespace ibmsg
