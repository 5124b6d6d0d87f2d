// Option values and their limits (options.cpp).
#pragma once
#include <cstddef>
#include <cstdint>

#include "ibmsg.h"

namespace ibmsg {

constexpr size_t kNameMax = 64;
constexpr uint32_t kMaxMsgSize = 0xffffffff;  // what a hello can say

struct Options {
  int recv_depth = 32;
  int send_depth = 32;
  int send_queue = 32;
  uint32_t max_msg_size = kMaxMsgSize;  // any path
  int eager_size = 16384;  // through the pools; more by rendezvous
  int shared_recv = 1;     // receive buffers shared by the device's connections
  int connect_timeout_ms = 5000;
  int rnr_retry = 7;
  int rdma = 1;          // offer one-sided RDMA
  int rdma_depth = 16;   // one-sided operations in flight
  int busy_poll_us = 0;  // 0 events, > 0 adaptive polling, -1 always
  int keepalive_ms = 10000;  // 0: off
  int keepalive_count = 3;
  int ack_timeout = 18;  // 4.096 us * 2^n; 0: the CM's default
  int retry_count = 7;
  int request_window_ms = 10000;  // loop-wide (the loop's value counts): requests.cpp, dedup.cpp
  int reply_cache = 1 << 20;      // loop-wide: reply bytes kept for retries
  uint64_t rndv_memory = uint64_t(512) << 20;  // loop-wide: rendezvous destinations (rndv.cpp)
  int violation_ban_ms = 10000;   // listener: refuse a violator's address this long
  char source_addr[kNameMax] = "";
  char device[kNameMax] = "";
};
int options_set(Options *o, int option, const void *value, size_t len);
// The options of a set from ibmsg_options_new (nullptr for NULL); *bad if o is not one.
const Options *options_of(const ibmsg_options *o, bool *bad);
int options_get(const Options *o, int option, void *value, size_t *len);

}  // namespace ibmsg
