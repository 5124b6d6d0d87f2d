// The C API: argument checks, then the core. Nothing here throws or aborts.
#include <arpa/inet.h>

#include <cstring>

#include "internal.hpp"

using namespace ibmsg;

namespace {

Socket *socket_of(const ibmsg_socket *pub) {
  if (!pub || !pub->impl) return nullptr;
  Socket *s = pub->impl;
  return s->magic == kSocketMagic && s->pub == pub ? s : nullptr;
}

bool valid_request(const ibmsg_connection_request *req) {
  return req && req->impl && req->impl->id && req->impl->listener &&
         req->impl->listener->magic == kSocketMagic;
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

}  // namespace

extern "C" {

int ibmsg_listen(ibmsg_event_loop *loop, ibmsg_socket *socket, const char *ip,
                 unsigned short port, int max_connections) {
  Loop *l = loop_of(loop);
  if (!l || !socket || max_connections <= 0) return IBMSG_EINVAL;
  return socket_listen(l, socket, ip, port, max_connections);
}

int ibmsg_connect(ibmsg_event_loop *loop, ibmsg_socket *socket, const char *ip,
                  unsigned short port) {
  Loop *l = loop_of(loop);
  if (!l || !socket || !ip || !*ip || port == 0) return IBMSG_EINVAL;
  return socket_connect(l, socket, ip, port);
}

int ibmsg_accept(ibmsg_connection_request *request, ibmsg_socket *socket) {
  if (!valid_request(request) || !socket) return IBMSG_EINVAL;
  return socket_accept(request, socket);
}

int ibmsg_reject(ibmsg_connection_request *request, const char *reason) {
  if (!valid_request(request)) return IBMSG_EINVAL;
  return socket_reject(request, reason);
}

int ibmsg_disconnect(ibmsg_socket *socket) {
  if (!socket) return IBMSG_EINVAL;
  Socket *s = socket_of(socket);
  if (!s) return IBMSG_ENOTCONN;
  return socket_disconnect(s);
}

int ibmsg_socket_local_address(const ibmsg_socket *socket, char *buf, size_t len,
                               unsigned short *port) {
  if (!socket) return IBMSG_EINVAL;
  Socket *s = socket_of(socket);
  if (!s || !s->id) return IBMSG_ENOTCONN;
  return format_address(rdma_get_local_addr(s->id), buf, len, port);
}

int ibmsg_socket_peer_address(const ibmsg_socket *socket, char *buf, size_t len,
                              unsigned short *port) {
  if (!socket) return IBMSG_EINVAL;
  Socket *s = socket_of(socket);
  if (!s || !s->id || s->listener) return IBMSG_ENOTCONN;
  return format_address(rdma_get_peer_addr(s->id), buf, len, port);
}

const char *ibmsg_socket_device(const ibmsg_socket *socket) {
  Socket *s = socket_of(socket);
  if (!s || !s->id || !s->id->verbs) return nullptr;
  return ibv_get_device_name(s->id->verbs->device);
}

size_t ibmsg_socket_max_msg_size(const ibmsg_socket *socket) {
  Socket *s = socket_of(socket);
  if (!s || s->listener) return 0;
  return s->have_peer ? s->max_msg : size_t(s->opts.max_msg_size);
}

int ibmsg_alloc_msg(ibmsg_buffer *msg, ibmsg_socket *socket, size_t size) {
  if (!msg || !socket) return IBMSG_EINVAL;
  Socket *s = socket_of(socket);
  if (!s) return IBMSG_ENOTCONN;
  return msg_alloc(s, msg, size);
}

int ibmsg_post_send(ibmsg_socket *socket, ibmsg_buffer *msg) {
  if (!msg || !socket) return IBMSG_EINVAL;
  Socket *s = socket_of(socket);
  if (!s) return IBMSG_ENOTCONN;
  return msg_post(s, msg);
}

int ibmsg_free_msg(ibmsg_buffer *msg) {
  if (!msg) return IBMSG_EINVAL;
  return msg_free(msg);
}

}  // extern "C"
