// The C API: every extern "C" entry point of libibmsg. Each validates its handles and arguments,
// then calls the core; nothing here throws or aborts.
#include <arpa/inet.h>

#include <cstring>
#include <new>

#include "internal.hpp"
#include "conn.hpp"
#include "dedup.hpp"
#include "deliver.hpp"
#include "errors.hpp"
#include "handover.hpp"
#include "incoming.hpp"
#include "loop.hpp"
#include "message.hpp"
#include "setup.hpp"
#include "spread.hpp"
#include "usage.hpp"

using namespace ibmsg;

namespace {

// A query's answer copied into the caller's struct, at most size bytes of it: a caller built
// against an older, smaller struct gets its part (ibmsg_socket_stats, the memory queries).
template <typename T>
int copy_sized(T *out, const T &value, size_t size) {
  memcpy(out, &value, size < sizeof value ? size : sizeof value);
  return IBMSG_OK;
}

bool valid_request(const ibmsg_connection_request *req) {
  return req && req->impl && req->impl->id && req->impl->listener &&
         req->impl->listener->magic == kSocketMagic;
}

}  // namespace

extern "C" {

// --- version and errors ---

void ibmsg_version(int *major, int *minor, int *patch) {
  if (major) *major = IBMSG_VERSION_MAJOR;
  if (minor) *minor = IBMSG_VERSION_MINOR;
  if (patch) *patch = IBMSG_VERSION_PATCH;
}

#define IBMSG__STR2(x) #x
#define IBMSG__STR(x) IBMSG__STR2(x)
const char *ibmsg_version_string(void) {
  return IBMSG__STR(IBMSG_VERSION_MAJOR) "." IBMSG__STR(IBMSG_VERSION_MINOR) "." IBMSG__STR(
      IBMSG_VERSION_PATCH);
}

const char *ibmsg_strerror(int code) { return error_text(code); }
const char *ibmsg_err_name(int code) { return error_name(code); }

// --- event loop ---

int ibmsg_init_event_loop(ibmsg_event_loop *loop) {
  if (!loop) return IBMSG_EINVAL;
  return loop_init(loop, nullptr);
}

int ibmsg_init_event_loop_ev(ibmsg_event_loop *loop, struct ev_loop *ev) {
  if (!loop || !ev) return IBMSG_EINVAL;
  return loop_init(loop, ev);
}

int ibmsg_destroy_event_loop(ibmsg_event_loop *pub) {
  Loop *loop = loop_of(pub);
  return loop ? loop_destroy(loop) : IBMSG_EINVAL;
}

int ibmsg_dispatch_event_loop(ibmsg_event_loop *pub) {
  Loop *loop = loop_of(pub);
  return loop ? loop_run(loop, EVRUN_ONCE, 0) : IBMSG_EINVAL;
}

int ibmsg_dispatch_event_loop_timeout(ibmsg_event_loop *pub, int timeout_ms) {
  Loop *loop = loop_of(pub);
  if (!loop || timeout_ms < 0) return IBMSG_EINVAL;
  if (timeout_ms == 0) return loop_run(loop, EVRUN_NOWAIT, 0);
  return loop_run(loop, EVRUN_ONCE, timeout_ms / 1000.0);
}

int ibmsg_event_loop_fd(ibmsg_event_loop *pub) { return loop_of(pub) ? loop_fd(loop_of(pub)) : -1; }

int ibmsg_event_loop_call(ibmsg_event_loop *pub, ibmsg_call_fn fn, void *arg) {
  // The one entry point for any thread: it reads only what ibmsg_init_event_loop set.
  Loop *loop = loop_of_any_thread(pub);
  if (!loop || !fn) return IBMSG_EINVAL;
  return handover_post(loop, fn, arg);
}

int ibmsg_event_loop_process(ibmsg_event_loop *pub) {
  Loop *loop = loop_of(pub);
  return loop ? loop_run(loop, EVRUN_NOWAIT, 0) : IBMSG_EINVAL;
}

int ibmsg_event_loop_timeout(ibmsg_event_loop *pub) {
  return loop_of(pub) ? loop_timeout_ms(loop_of(pub)) : -1;
}

int ibmsg_event_loop_next_timeout(ibmsg_event_loop *pub, int *timeout_ms) {
  Loop *loop = loop_of(pub);
  if (!loop || !timeout_ms) return IBMSG_EINVAL;
  *timeout_ms = loop_timeout_ms(loop);
  return IBMSG_OK;
}

// --- options ---

int ibmsg_setopt(ibmsg_event_loop *pub, int option, const void *value, size_t len) {
  Loop *loop = loop_of(pub);
  return loop ? options_set(&loop->opts, option, value, len) : IBMSG_EINVAL;
}

int ibmsg_getopt(ibmsg_event_loop *pub, int option, void *value, size_t *len) {
  Loop *loop = loop_of(pub);
  return loop ? options_get(&loop->opts, option, value, len) : IBMSG_EINVAL;
}

ibmsg_options *ibmsg_options_new(ibmsg_event_loop *pub) {
  Loop *loop = loop_of(pub);
  if (pub && !loop) return nullptr;
  ibmsg_options *o = new (std::nothrow) ibmsg_options();
  if (!o) return nullptr;
  o->magic = kOptionsMagic;
  if (loop) o->opts = loop->opts;
  return o;
}

void ibmsg_options_free(ibmsg_options *o) {
  if (!o || o->magic != kOptionsMagic) return;
  o->magic = 0;
  delete o;
}

int ibmsg_options_set(ibmsg_options *o, int option, const void *value, size_t len) {
  if (!o || o->magic != kOptionsMagic) return IBMSG_EINVAL;
  return options_set(&o->opts, option, value, len);
}

int ibmsg_options_get(const ibmsg_options *o, int option, void *value, size_t *len) {
  if (!o || o->magic != kOptionsMagic) return IBMSG_EINVAL;
  return options_get(&o->opts, option, value, len);
}

// --- sockets ---

int ibmsg_listen_opts(ibmsg_event_loop *loop, ibmsg_socket *socket, const char *ip,
                      unsigned short port, int max_connections, const ibmsg_options *opts) {
  Loop *l = loop_of(loop);
  bool bad;
  const Options *o = options_of(opts, &bad);
  if (!l || !socket || max_connections <= 0 || bad) return IBMSG_EINVAL;
  return socket_listen(l, socket, ip, port, max_connections, o);
}

int ibmsg_listen(ibmsg_event_loop *loop, ibmsg_socket *socket, const char *ip,
                 unsigned short port, int max_connections) {
  return ibmsg_listen_opts(loop, socket, ip, port, max_connections, nullptr);
}

int ibmsg_connect_opts(ibmsg_event_loop *loop, ibmsg_socket *socket, const char *ip,
                       unsigned short port, const ibmsg_options *opts) {
  Loop *l = loop_of(loop);
  bool bad;
  const Options *o = options_of(opts, &bad);
  if (!l || !socket || !ip || !*ip || port == 0 || bad) return IBMSG_EINVAL;
  return socket_connect(l, socket, ip, port, o);
}

int ibmsg_connect(ibmsg_event_loop *loop, ibmsg_socket *socket, const char *ip,
                  unsigned short port) {
  return ibmsg_connect_opts(loop, socket, ip, port, nullptr);
}

int ibmsg_accept_opts(ibmsg_connection_request *request, ibmsg_socket *socket,
                      const ibmsg_options *opts) {
  bool bad;
  const Options *o = options_of(opts, &bad);
  if (!valid_request(request) || !socket || bad) return IBMSG_EINVAL;
  return request->impl->listener->spread ? accept_spread(request, socket, o)
                                         : accept_here(request, socket, o);
}

int ibmsg_accept(ibmsg_connection_request *request, ibmsg_socket *socket) {
  return ibmsg_accept_opts(request, socket, nullptr);
}

int ibmsg_accept_on(ibmsg_connection_request *request, ibmsg_event_loop *loop,
                    ibmsg_socket *socket, const ibmsg_options *opts) {
  bool bad;
  const Options *o = options_of(opts, &bad);
  // The other loop runs on another thread: only what ibmsg_init_event_loop set is read of it.
  Loop *to = loop ? loop_of_any_thread(loop) : nullptr;
  if (!valid_request(request) || !socket || bad || (loop && !to)) return IBMSG_EINVAL;
  if (!to || to == request->impl->listener->loop) return accept_here(request, socket, o);
  return accept_on(request, to, socket, o);
}

int ibmsg_listen_spread(ibmsg_socket *listener, ibmsg_event_loop *const *loops, int count) {
  Socket *l = socket_of(listener);
  if (!l || count < 0 || count > kSpreadMax || (count > 0 && !loops)) return IBMSG_EINVAL;
  if (!l->listener) return IBMSG_ESTATE;
  Loop *impls[kSpreadMax];
  for (int i = 0; i < count; ++i)
    if (!(impls[i] = loop_of_any_thread(loops[i]))) return IBMSG_EINVAL;
  return listen_spread(l, impls, count);
}

int ibmsg_reject(ibmsg_connection_request *request, const char *reason) {
  if (!valid_request(request)) return IBMSG_EINVAL;
  return socket_reject(request, reason);
}

int ibmsg_disconnect(ibmsg_socket *socket) {
  if (!socket) return IBMSG_EINVAL;
  Socket *s = socket_of(socket);
  if (!s) return IBMSG_ENOTCONN;
  if (s->state == State::Lingering || s->state == State::Closing || s->state == State::Closed)
    return IBMSG_ESTATE;
  socket_close(s, IBMSG_OK);
  return IBMSG_OK;
}

int ibmsg_socket_local_address(const ibmsg_socket *socket, char *buf, size_t len,
                               unsigned short *port) {
  if (!socket) return IBMSG_EINVAL;
  Socket *s = socket_of(socket);
  if (!s || !s->id) return IBMSG_ENOTCONN;
  return format_address(tp::cm_local_addr(s->id), buf, len, port);
}

int ibmsg_socket_peer_address(const ibmsg_socket *socket, char *buf, size_t len,
                              unsigned short *port) {
  if (!socket) return IBMSG_EINVAL;
  Socket *s = socket_of(socket);
  if (s && s->listener) return IBMSG_ESTATE;
  if (!s || !s->id) return IBMSG_ENOTCONN;
  return format_address(tp::cm_peer_addr(s->id), buf, len, port);
}

const char *ibmsg_socket_device(const ibmsg_socket *socket) {
  Socket *s = socket_of(socket);
  if (!s || !s->id) return nullptr;
  return tp::cm_device_name(s->id);
}

size_t ibmsg_socket_max_msg_size(const ibmsg_socket *socket) {
  Socket *s = socket_of(socket);
  if (!s || s->listener) return 0;
  return s->peer.known ? s->peer.max_msg : size_t(s->opts.max_msg_size);
}

int ibmsg_socket_memory_info(const ibmsg_socket *socket, ibmsg_memory *out, size_t size) {
  Socket *s = socket_of(socket);
  if (!s || !out) return IBMSG_EINVAL;
  if (s->listener) return IBMSG_ESTATE;
  ibmsg_memory m;
  memory_of_socket(s, &m);
  return copy_sized(out, m, size);
}

int ibmsg_socket_memory(const ibmsg_socket *socket, ibmsg_memory *out) {
  return ibmsg_socket_memory_info(socket, out, sizeof *out);
}

int ibmsg_socket_stats(const ibmsg_socket *socket, ibmsg_stats *out, size_t size) {
  if (!socket || !out) return IBMSG_EINVAL;
  const ibmsg_stats *st = nullptr;
  if (Socket *s = socket_of(socket)) {
    if (s->listener) return IBMSG_ESTATE;
    st = &s->stats;
  } else if (Loop *l = loop_of(socket->loop); l && l->closed_pub == socket) {
    st = &l->closed_stats;  // in its connection_closed callback
  }
  if (!st) return IBMSG_EINVAL;
  return copy_sized(out, *st, size);
}

int ibmsg_loop_stats(ibmsg_event_loop *loop, ibmsg_loop_counters *out, size_t size) {
  Loop *l = loop_of(loop);
  return l && out ? violations_counters(l, out, size) : IBMSG_EINVAL;
}

int ibmsg_loop_memory_info(ibmsg_event_loop *loop, ibmsg_memory *out, size_t size) {
  Loop *l = loop_of(loop);
  if (!l || !out) return IBMSG_EINVAL;
  ibmsg_memory m;
  memory_of_loop(l, &m);
  return copy_sized(out, m, size);
}

int ibmsg_loop_memory(ibmsg_event_loop *loop, ibmsg_memory *out) {
  return ibmsg_loop_memory_info(loop, out, sizeof *out);
}

// --- messages ---

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
  return msg_post(s, msg, false, 0);
}

int ibmsg_post_request(ibmsg_socket *socket, ibmsg_buffer *msg, ibmsg_request *req, int ms) {
  Socket *s = socket_of(socket);
  if (!socket || !msg || !req) return IBMSG_EINVAL;
  return s ? req_post(s, msg, req, ms, false) : IBMSG_ENOTCONN;
}

int ibmsg_retry_request(ibmsg_socket *socket, ibmsg_buffer *msg, ibmsg_request *req, int ms) {
  Socket *s = socket_of(socket);
  if (!socket || !msg || !req) return IBMSG_EINVAL;
  return s ? req_post(s, msg, req, ms, true) : IBMSG_ENOTCONN;
}

int ibmsg_post_reply(ibmsg_socket *socket, ibmsg_buffer *request, ibmsg_buffer *reply) {
  if (!socket || !request || !reply) return IBMSG_EINVAL;
  return reply_post(socket_of(socket), request, reply);  // a closed socket: the reply is kept
}

int ibmsg_post_send_imm(ibmsg_socket *socket, ibmsg_buffer *msg, uint32_t imm) {
  if (!msg || !socket) return IBMSG_EINVAL;
  Socket *s = socket_of(socket);
  if (!s) return IBMSG_ENOTCONN;
  return msg_post(s, msg, true, imm);
}

int ibmsg_free_msg(ibmsg_buffer *msg) {
  if (!msg) return IBMSG_EINVAL;
  return msg_free(msg);
}

int ibmsg_msg_from_region(ibmsg_buffer *msg, ibmsg_socket *socket, ibmsg_region *region,
                          size_t offset, size_t size) {
  if (!msg || !socket) return IBMSG_EINVAL;
  Socket *s = socket_of(socket);
  if (!s) return IBMSG_ENOTCONN;
  Region *r = region_of(region);
  if (!r) return IBMSG_EINVAL;
  return msg_from_region(s, msg, r, offset, size);
}

int ibmsg_incoming_to_region(ibmsg_incoming *in, ibmsg_region *region, size_t offset) {
  Region *r = region_of(region);
  if (!r) return IBMSG_EINVAL;
  return incoming_to_region(in, r, offset);
}

int ibmsg_incoming_decline(ibmsg_incoming *in) { return incoming_decline(in); }

// --- one-sided RDMA ---

int ibmsg_register_region(ibmsg_event_loop *loop, ibmsg_region *region, void *addr, size_t length,
                          unsigned access) {
  Loop *l = loop_of(loop);
  if (!l) return IBMSG_EINVAL;
  return region_register(l, region, addr, length, access, false);
}

int ibmsg_alloc_region(ibmsg_event_loop *loop, ibmsg_region *region, size_t length,
                       unsigned access) {
  Loop *l = loop_of(loop);
  if (!l) return IBMSG_EINVAL;
  return region_register(l, region, nullptr, length, access, true);
}

int ibmsg_deregister_region(ibmsg_region *region) {
  Region *r = region_of(region);
  if (!r) return IBMSG_EINVAL;
  return region_deregister(r);
}

int ibmsg_region_descriptor(ibmsg_region *region, ibmsg_socket *socket, size_t offset,
                            size_t length, unsigned access, ibmsg_descriptor *out) {
  Region *r = region_of(region);
  if (!r || !socket) return IBMSG_EINVAL;
  Socket *s = socket_of(socket);
  if (!s) return IBMSG_ENOTCONN;
  return region_descriptor(r, s, offset, length, access, out);
}

int ibmsg_revoke_descriptor(ibmsg_region *region, const ibmsg_descriptor *desc) {
  Region *r = region_of(region);
  if (!r || !desc) return IBMSG_EINVAL;
  return region_revoke(r, desc);
}

int ibmsg_descriptor_info(const ibmsg_descriptor *desc, size_t *length, unsigned *access) {
  if (!desc) return IBMSG_EINVAL;
  wire::Descriptor d;
  if (!wire::decode_descriptor(desc->bytes, &d) || d.length > SIZE_MAX) return IBMSG_EBADDESC;
  if (length) *length = size_t(d.length);
  if (access) *access = d.access;
  return IBMSG_OK;
}

namespace {

int post_op(ibmsg_socket *socket, ibmsg_op *op, ibmsg_region *local, size_t loff, size_t len,
            const ibmsg_descriptor *remote, size_t roff, const OpArgs &a) {
  if (!socket || !op || !remote) return IBMSG_EINVAL;
  Region *r = region_of(local);
  if (!r) return IBMSG_EINVAL;
  Socket *s = socket_of(socket);
  if (!s) return IBMSG_ENOTCONN;
  return op_post(s, op, r, loff, len, remote, roff, a);
}

}  // namespace

int ibmsg_rdma_write(ibmsg_socket *socket, ibmsg_op *op, ibmsg_region *local, size_t local_offset,
                     size_t length, const ibmsg_descriptor *remote, size_t remote_offset) {
  return post_op(socket, op, local, local_offset, length, remote, remote_offset,
                 OpArgs{IBMSG_OP_WRITE, 0, 0, 0});
}

int ibmsg_rdma_read(ibmsg_socket *socket, ibmsg_op *op, ibmsg_region *local, size_t local_offset,
                    size_t length, const ibmsg_descriptor *remote, size_t remote_offset) {
  return post_op(socket, op, local, local_offset, length, remote, remote_offset,
                 OpArgs{IBMSG_OP_READ, 0, 0, 0});
}

int ibmsg_rdma_write_imm(ibmsg_socket *socket, ibmsg_op *op, ibmsg_region *local,
                         size_t local_offset, size_t length, const ibmsg_descriptor *remote,
                         size_t remote_offset, uint32_t imm) {
  return post_op(socket, op, local, local_offset, length, remote, remote_offset,
                 OpArgs{IBMSG_OP_WRITE_IMM, imm, 0, 0});
}

int ibmsg_atomic_cas(ibmsg_socket *socket, ibmsg_op *op, ibmsg_region *local, size_t local_offset,
                     const ibmsg_descriptor *remote, size_t remote_offset, uint64_t compare,
                     uint64_t swap) {
  return post_op(socket, op, local, local_offset, 8, remote, remote_offset,
                 OpArgs{IBMSG_OP_CAS, 0, compare, swap});
}

int ibmsg_atomic_fadd(ibmsg_socket *socket, ibmsg_op *op, ibmsg_region *local,
                      size_t local_offset, const ibmsg_descriptor *remote, size_t remote_offset,
                      uint64_t add) {
  return post_op(socket, op, local, local_offset, 8, remote, remote_offset,
                 OpArgs{IBMSG_OP_FADD, 0, add, 0});
}

}  // extern "C"
