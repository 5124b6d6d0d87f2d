// Socket set-up, the application's side: name resolution, listen / connect / accept / reject; a
// connection's resources and parameters are conn.cpp's, its CM events cm.cpp's.
#include "setup.hpp"

#include <arpa/inet.h>
#include <netdb.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <new>

#include "internal.hpp"
#include "cm.hpp"
#include "conn.hpp"
#include "errors.hpp"
#include "pace.hpp"

namespace ibmsg {
namespace {

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

// The set-up succeeded: from here on the socket closes only through socket_close().
void open_socket(Socket *s, Event ev) {
  s->loop->sockets.push_back(s);
  register_open(s);
  set_state(s, ev);
  s->pub->impl = s;
}

}  // namespace

Socket *new_socket(Loop *loop, ibmsg_socket *pub, const Options *opts) {
  Socket *s = new (std::nothrow) Socket();
  if (!s) return nullptr;
  // user_data is the application's: left as it is.
  pub->status = IBMSG_UNCONNECTED;
  pub->loop = loop->pub;
  pub->close_reason = IBMSG_OK;
  pub->reject_reason[0] = '\0';
  pub->impl = nullptr;
  memset(pub->reserved, 0, sizeof pub->reserved);
  s->pub = pub;
  s->loop = loop;
  s->opts = opts ? *opts : loop->opts;
  s->tx.ctrl_wr.owner = s;
  timer_init(&s->connect_timer, loop, on_connect_timeout, s);
  req_timer_init(s);
  return s;
}


int socket_listen(Loop *loop, ibmsg_socket *pub, const char *ip, unsigned short port,
                  int max_conn, const Options *opts) {
  if (socket_is_open(pub)) return IBMSG_ESTATE;
  sockaddr_storage addr;
  int err = resolve(ip, port, true, &addr);
  if (err) return err;
  Socket *s = new_socket(loop, pub, opts);
  if (!s) return IBMSG_ENOMEM;
  err = tp::cm_id_create(loop->cm, s, &s->id);
  if (!err) err = tp::cm_bind(s->id, reinterpret_cast<sockaddr *>(&addr));
  if (!err && tp::cm_device(s->id) && !device_matches(s)) err = IBMSG_ENODEV;
  if (!err) err = tp::cm_listen(s->id, max_conn);
  if (err) {
    log_write(loop, nullptr, IBMSG_LOG_ERROR, "cannot listen on %s port %u: %s%s", ip ? ip : "every address", port,
              error_text(err),
              err == IBMSG_EADDRNOTAVAIL ? " (no RDMA device on this host has that address)"
                                         : "");
    if (s->id) tp::cm_id_destroy(s->id);
    delete s;
    return err;
  }
  s->listener = true;
  s->max_connections = max_conn;
  open_socket(s, Event::Listen);
  return IBMSG_OK;
}

int socket_connect(Loop *loop, ibmsg_socket *pub, const char *ip, unsigned short port,
                   const Options *opts) {
  if (socket_is_open(pub)) return IBMSG_ESTATE;
  const Options &o = opts ? *opts : loop->opts;
  sockaddr_storage dst, src;
  int err = resolve(ip, port, false, &dst);
  if (err) return err;
  bool have_src = o.source_addr[0] != '\0';
  if (have_src && (err = resolve(o.source_addr, 0, false, &src))) return err;
  Socket *s = new_socket(loop, pub, opts);
  if (!s) return IBMSG_ENOMEM;
  err = tp::cm_id_create(loop->cm, s, &s->id);
  // It starts now (its address resolved, its connect timer running) or waits for its turn
  // (IBMSG_OPT_CONNECT_LIMIT): pace.cpp.
  if (!err) err = pace_connect(s, have_src ? &src : nullptr, dst);
  if (err) {
    log_write(loop, nullptr, IBMSG_LOG_ERROR, "cannot connect to %s port %u: %s", ip ? ip : "(null)", port,
              error_text(err));
    if (s->id) tp::cm_id_destroy(s->id);
    delete s;
    return err;
  }
  open_socket(s, Event::Connect);
  return IBMSG_OK;
}

int accept_socket(Socket *s, const wire::Hello &hello) {
  int err = device_matches(s) ? IBMSG_OK : IBMSG_ENODEV;
  if (!err) s->dev = device_get(s->loop, tp::cm_device(s->id), &err);
  s->rx.keep_eager = !(hello.features & wire::kFeatureRndv) || !hello.rndv_max_size;
  if (!err) err = conn_open(s);
  if (!err) {
    set_peer(s, hello);
    tp::cm_id_set_user(s->id, s);
    tp::ConnParam param;
    uint8_t data[wire::kHelloSize];
    fill_conn_param(s, &param, data);
    if (s->res.responder_resources || s->res.initiator_depth) {  // one-sided RDMA or rendezvous
      // Accepting: no more than the connecting side offered either (the transport takes the
      // smaller of its request and the device's limits).
      param.responder_resources = tp::kMaxRdAtomic;
      param.initiator_depth = tp::kMaxRdAtomic;
    }
    err = tp::cm_accept(s->id, param);
    // The peer went away during the handshake (its request is void), or the device failed.
    // librdmacm moved the QP to the error state: its receives complete as flushed.
    if (err) conn_release(s, false, true);
  }
  if (err) {
    if (s->dev) device_put(s->dev);
    reject_id(s->id, "the server could not set up the connection");
    delete s;
    return err;
  }
  open_socket(s, Event::Accept);
  // A client that vanishes before the handshake ends must not hold the socket (and one of the
  // listener's max_connections) forever.
  timer_start(&s->connect_timer, s->opts.connect_timeout_ms / 1000.0);
  return IBMSG_OK;
}

int accept_here(ibmsg_connection_request *req, ibmsg_socket *pub, const Options *opts) {
  ibmsg__request *r = req->impl;
  if (req->status != IBMSG_UNDECIDED) return IBMSG_ESTATE;
  if (socket_is_open(pub)) return IBMSG_ESTATE;
  Socket *l = r->listener;
  Socket *s = new_socket(l->loop, pub, opts ? opts : &l->opts);
  if (!s) return IBMSG_ENOMEM;
  s->id = r->id;
  int err = accept_socket(s, r->hello);
  req->status = err ? IBMSG_REJECTED : IBMSG_ACCEPTED;
  if (err) return err;
  s->from_listener = l;
  l->accepted.push_back(s);
  return IBMSG_OK;
}

int socket_reject(ibmsg_connection_request *req, const char *reason) {
  if (req->status != IBMSG_UNDECIDED) return IBMSG_ESTATE;
  req->status = IBMSG_REJECTED;
  reject_id(req->impl->id, reason ? reason : "");
  return IBMSG_OK;
}

}  // namespace ibmsg
