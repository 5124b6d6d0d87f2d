// Options: the table of every option, the values a loop or a socket has, and their limits
// (options.cpp).
#pragma once
#include <climits>
#include <cstddef>
#include <cstdint>

#include "ibmsg.h"

namespace ibmsg {

constexpr size_t kNameMax = 64;
constexpr uint32_t kMaxMsgSize = 0xffffffff;  // what a hello can say
using Name = char[kNameMax];                  // a string option, NUL-terminated

// Every option of ibmsg_setopt() and the option sets, one row each: the only place that says its
// field, type, range, default and scope, like IBMSG_ERRNO_MAP for the errors. Made from it:
// the Options fields and their defaults (below), the lookup and the range checks of
// options_set/options_get (options.cpp), and the head of each entry in ibmsg_setopt(3), which
// test/doc/check-options prints (--print) and checks, with the defaults that ibmsg.h documents.
//
// X(ID, field, type, min, max, default, scope, unit):
//   ID        the option is IBMSG_OPT_<ID>
//   type      int: an int; uint32_t or uint64_t: an int, or a uint64_t with len 8 for values
//             beyond INT_MAX; Name: a string, whose length min and max bound
//   min, max  what ibmsg_setopt() accepts; anything else is IBMSG_EINVAL
//   scope     socket: each socket's copy counts; listener: the copy a listener was set up with
//             counts; loop: the loop's value counts, for all its sockets at once
//   unit      for the manual: none, ms, us or bytes
// Rows in the order of ibmsg_setopt(3). Numbers are integer literals (ull allowed), + - * << and
// parentheses, INT_MAX, IBMSG_BUSY_POLL_ALWAYS, kNameMax and kMaxMsgSize: what
// test/doc/check-options can evaluate.
#define IBMSG_OPTION_MAP(X)                                                                   \
  X(RECV_DEPTH, recv_depth, int, 1, 16384, 32, socket, none)                                  \
  X(SEND_DEPTH, send_depth, int, 1, 16384, 32, socket, none)                                  \
  X(SEND_QUEUE, send_queue, int, 0, 1 << 20, 32, socket, none)                                \
  /* any path: eager or rendezvous */                                                         \
  X(MAX_MSG_SIZE, max_msg_size, uint32_t, 1, kMaxMsgSize, kMaxMsgSize, socket, bytes)         \
  /* through the pools; more by rendezvous */                                                 \
  X(EAGER_SIZE, eager_size, int, 1, 1 << 30, 16384, socket, bytes)                            \
  X(CONNECT_TIMEOUT, connect_timeout_ms, int, 1, 3600 * 1000, 5000, socket, ms)               \
  X(RNR_RETRY, rnr_retry, int, 0, 7, 7, socket, none)                                         \
  X(SOURCE_ADDR, source_addr, Name, 0, kNameMax - 1, "", socket, none)                        \
  X(DEVICE, device, Name, 0, kNameMax - 1, "", socket, none)                                  \
  /* offer one-sided RDMA */                                                                  \
  X(RDMA, rdma, int, 0, 1, 1, socket, none)                                                   \
  /* one-sided operations in flight */                                                        \
  X(RDMA_DEPTH, rdma_depth, int, 1, 4096, 16, socket, none)                                   \
  /* 0 events, > 0 adaptive polling, -1 always */                                             \
  X(BUSY_POLL, busy_poll_us, int, IBMSG_BUSY_POLL_ALWAYS, 10 * 1000 * 1000, 0, socket, us)    \
  /* receive buffers shared by the device's connections */                                    \
  X(SHARED_RECV, shared_recv, int, 0, 1, 1, socket, none)                                     \
  /* 0: off */                                                                                \
  X(KEEPALIVE, keepalive_ms, int, 0, 24 * 3600 * 1000, 10000, socket, ms)                     \
  X(KEEPALIVE_COUNT, keepalive_count, int, 2, 255, 3, socket, none)                           \
  /* 4.096 us * 2^n; 0: the CM's default */                                                   \
  X(ACK_TIMEOUT, ack_timeout, int, 0, 31, 18, socket, none)                                   \
  X(RETRY_COUNT, retry_count, int, 0, 7, 7, socket, none)                                     \
  /* requests and de-duplication */                                                           \
  X(REQUEST_WINDOW, request_window_ms, int, 1, 24 * 3600 * 1000, 10000, loop, ms)             \
  /* reply bytes kept for retries */                                                          \
  X(REPLY_CACHE, reply_cache, int, 0, INT_MAX, 1 << 20, loop, bytes)                          \
  /* the library's rendezvous destinations */                                                 \
  X(RNDV_MEMORY, rndv_memory, uint64_t, 1, 1ull << 48, 512 << 20, loop, bytes)                \
  /* refuse a violator's address this long */                                                 \
  X(VIOLATION_BAN, violation_ban_ms, int, 0, 24 * 3600 * 1000, 10000, listener, ms)          \
  /* outgoing connection attempts under way at once */                                        \
  X(CONNECT_LIMIT, connect_limit, int, 1, 1 << 20, 16, loop, none)                           \
  /* what a device's idle connections reserve of shared buffers; 0: no limit */               \
  X(SHARED_RECV_BUDGET, shared_recv_budget, uint64_t, 0, 1ull << 48, 32ull << 20, loop, bytes)

// One field per option, with its default.
struct Options {
#define IBMSG__OPTION_FIELD(id, field, type, min, max, def, scope, unit) type field = def;
  IBMSG_OPTION_MAP(IBMSG__OPTION_FIELD)
#undef IBMSG__OPTION_FIELD
};
int options_set(Options *o, int option, const void *value, size_t len);
// The options of a set from ibmsg_options_new (nullptr for NULL); *bad if o is not one.
const Options *options_of(const ibmsg_options *o, bool *bad);
int options_get(const Options *o, int option, void *value, size_t *len);

}  // namespace ibmsg
