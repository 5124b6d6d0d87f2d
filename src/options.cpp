// Options: their values and limits. The loop keeps the defaults (ibmsg_setopt); an ibmsg_options
// set starts as a copy of them and is handed to ibmsg_listen_opts/connect_opts/accept_opts.
#include <climits>
#include <cstring>

#include "internal.hpp"

namespace ibmsg {
namespace {

int *int_option(Options *o, int option) {
  switch (option) {
    case IBMSG_OPT_RECV_DEPTH: return &o->recv_depth;
    case IBMSG_OPT_SEND_DEPTH: return &o->send_depth;
    case IBMSG_OPT_SEND_QUEUE: return &o->send_queue;
    case IBMSG_OPT_EAGER_SIZE: return &o->eager_size;
    case IBMSG_OPT_CONNECT_TIMEOUT: return &o->connect_timeout_ms;
    case IBMSG_OPT_RNR_RETRY: return &o->rnr_retry;
    case IBMSG_OPT_RDMA: return &o->rdma;
    case IBMSG_OPT_RDMA_DEPTH: return &o->rdma_depth;
    case IBMSG_OPT_BUSY_POLL: return &o->busy_poll_us;
    case IBMSG_OPT_SHARED_RECV: return &o->shared_recv;
    case IBMSG_OPT_KEEPALIVE: return &o->keepalive_ms;
    case IBMSG_OPT_KEEPALIVE_COUNT: return &o->keepalive_count;
    case IBMSG_OPT_ACK_TIMEOUT: return &o->ack_timeout;
    case IBMSG_OPT_RETRY_COUNT: return &o->retry_count;
    case IBMSG_OPT_REQUEST_WINDOW: return &o->request_window_ms;
    case IBMSG_OPT_REPLY_CACHE: return &o->reply_cache;
    case IBMSG_OPT_VIOLATION_BAN: return &o->violation_ban_ms;
    default: return nullptr;
  }
}

char *string_option(Options *o, int option) {
  switch (option) {
    case IBMSG_OPT_SOURCE_ADDR: return o->source_addr;
    case IBMSG_OPT_DEVICE: return o->device;
    default: return nullptr;
  }
}

bool int_option_valid(int option, int v) {
  switch (option) {
    case IBMSG_OPT_RECV_DEPTH: return v >= 1 && v <= 16384;
    case IBMSG_OPT_SEND_DEPTH: return v >= 1 && v <= 16384;
    case IBMSG_OPT_SEND_QUEUE: return v >= 0 && v <= 1 << 20;
    case IBMSG_OPT_EAGER_SIZE: return v >= 1 && v <= 1 << 30;
    case IBMSG_OPT_CONNECT_TIMEOUT: return v >= 1 && v <= 3600 * 1000;
    case IBMSG_OPT_RNR_RETRY: return v >= 0 && v <= 7;
    case IBMSG_OPT_RDMA: return v == 0 || v == 1;
    case IBMSG_OPT_RDMA_DEPTH: return v >= 1 && v <= 4096;
    case IBMSG_OPT_BUSY_POLL: return v >= IBMSG_BUSY_POLL_ALWAYS && v <= 10 * 1000 * 1000;
    case IBMSG_OPT_SHARED_RECV: return v == 0 || v == 1;
    case IBMSG_OPT_KEEPALIVE: return v >= 0 && v <= 24 * 3600 * 1000;
    case IBMSG_OPT_KEEPALIVE_COUNT: return v >= 2 && v <= 255;
    case IBMSG_OPT_ACK_TIMEOUT: return v >= 0 && v <= 31;
    case IBMSG_OPT_RETRY_COUNT: return v >= 0 && v <= 7;
    case IBMSG_OPT_REQUEST_WINDOW: return v >= 1 && v <= 24 * 3600 * 1000;
    case IBMSG_OPT_REPLY_CACHE: return v >= 0;
    case IBMSG_OPT_VIOLATION_BAN: return v >= 0 && v <= 24 * 3600 * 1000;
    default: return false;
  }
}

}  // namespace

const Options *options_of(const ibmsg_options *o, bool *bad) {
  *bad = o && o->magic != kOptionsMagic;
  return o && !*bad ? &o->opts : nullptr;
}

int options_set(Options *o, int option, const void *value, size_t len) {
  if (!value) return IBMSG_EINVAL;
  if (option == IBMSG_OPT_MAX_MSG_SIZE || option == IBMSG_OPT_RNDV_MEMORY) {
    uint64_t v;  // an int, or a uint64_t for sizes beyond INT_MAX
    if (len == sizeof(int)) {
      int i;
      memcpy(&i, value, sizeof i);
      v = i < 1 ? 0 : uint64_t(i);
    } else if (len == sizeof v) {
      memcpy(&v, value, sizeof v);
    } else {
      return IBMSG_EINVAL;
    }
    if (option == IBMSG_OPT_RNDV_MEMORY) {
      if (v < 1 || v > (uint64_t(1) << 48)) return IBMSG_EINVAL;
      o->rndv_memory = v;
      return IBMSG_OK;
    }
    if (v < 1 || v > kMaxMsgSize) return IBMSG_EINVAL;
    o->max_msg_size = uint32_t(v);
    return IBMSG_OK;
  }
  if (int *p = int_option(o, option)) {
    int v;
    if (len != sizeof v) return IBMSG_EINVAL;
    memcpy(&v, value, sizeof v);
    if (!int_option_valid(option, v)) return IBMSG_EINVAL;
    *p = v;
    return IBMSG_OK;
  }
  if (char *p = string_option(o, option)) {
    const char *s = static_cast<const char *>(value);
    size_t n = strnlen(s, len);
    if (n >= kNameMax) return IBMSG_EINVAL;
    memcpy(p, s, n);
    p[n] = '\0';
    return IBMSG_OK;
  }
  return IBMSG_EINVAL;
}

int options_get(const Options *o, int option, void *value, size_t *len) {
  if (!value || !len) return IBMSG_EINVAL;
  Options *m = const_cast<Options *>(o);  // the lookups only read here
  if (option == IBMSG_OPT_MAX_MSG_SIZE || option == IBMSG_OPT_RNDV_MEMORY) {
    // Into a uint64_t if len says so; an int gets at most INT_MAX (as large as it can say).
    const uint64_t v64 = option == IBMSG_OPT_MAX_MSG_SIZE ? o->max_msg_size : o->rndv_memory;
    if (*len == sizeof(uint64_t)) {
      memcpy(value, &v64, sizeof v64);
      return IBMSG_OK;
    }
    if (*len < sizeof(int)) return IBMSG_EINVAL;
    int v = v64 > uint64_t(INT_MAX) ? INT_MAX : int(v64);
    memcpy(value, &v, sizeof v);
    *len = sizeof v;
    return IBMSG_OK;
  }
  if (int *p = int_option(m, option)) {
    if (*len < sizeof(int)) return IBMSG_EINVAL;
    memcpy(value, p, sizeof(int));
    *len = sizeof(int);
    return IBMSG_OK;
  }
  if (char *p = string_option(m, option)) {
    size_t n = strlen(p);
    if (*len < n) return IBMSG_EINVAL;
    memcpy(value, p, n);
    if (*len > n) static_cast<char *>(value)[n] = '\0';
    *len = n;
    return IBMSG_OK;
  }
  return IBMSG_EINVAL;
}

}  // namespace ibmsg
