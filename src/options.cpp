// Options: their values and limits. The loop keeps the defaults (ibmsg_setopt); an ibmsg_options
// set starts as a copy of them and is handed to ibmsg_listen_opts/connect_opts/accept_opts.
#include <cstring>

#include "internal.hpp"

namespace ibmsg {
namespace {

int *int_option(Options *o, int option) {
  switch (option) {
    case IBMSG_OPT_RECV_DEPTH: return &o->recv_depth;
    case IBMSG_OPT_SEND_DEPTH: return &o->send_depth;
    case IBMSG_OPT_SEND_QUEUE: return &o->send_queue;
    case IBMSG_OPT_MAX_MSG_SIZE: return &o->max_msg_size;
    case IBMSG_OPT_CONNECT_TIMEOUT: return &o->connect_timeout_ms;
    case IBMSG_OPT_RNR_RETRY: return &o->rnr_retry;
    case IBMSG_OPT_RDMA: return &o->rdma;
    case IBMSG_OPT_RDMA_DEPTH: return &o->rdma_depth;
    case IBMSG_OPT_BUSY_POLL: return &o->busy_poll_us;
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
    case IBMSG_OPT_MAX_MSG_SIZE: return v >= 1 && v <= 1 << 30;
    case IBMSG_OPT_CONNECT_TIMEOUT: return v >= 1 && v <= 3600 * 1000;
    case IBMSG_OPT_RNR_RETRY: return v >= 0 && v <= 7;
    case IBMSG_OPT_RDMA: return v == 0 || v == 1;
    case IBMSG_OPT_RDMA_DEPTH: return v >= 1 && v <= 4096;
    case IBMSG_OPT_BUSY_POLL: return v >= IBMSG_BUSY_POLL_ALWAYS && v <= 10 * 1000 * 1000;
    default: return false;
  }
}

}  // namespace

int options_set(Options *o, int option, const void *value, size_t len) {
  if (!value) return IBMSG_EINVAL;
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
