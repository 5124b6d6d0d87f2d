// Private structures of the core: the loop, its devices and its sockets.
// Layering: api.cpp (argument checks) -> loop.cpp / socket.cpp (core) -> verbs.cpp (rdma-core).
#pragma once
#include <ev.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include <cstddef>
#include <cstdint>

#include "credits.hpp"
#include "ibmsg.h"
#include "pool.hpp"
#include "state.hpp"
#include "wire.hpp"

struct ibmsg__loop;

namespace ibmsg {

constexpr uint32_t kLoopMagic = 0x1b5910b0;
constexpr uint32_t kSocketMagic = 0x1b550c4e;
constexpr int kMaxDevices = 16;
constexpr size_t kNameMax = 64;

struct Options {
  int recv_depth = 32;
  int send_depth = 32;
  int send_queue = 32;
  int max_msg_size = 65536;
  int connect_timeout_ms = 5000;
  int rnr_retry = 7;
  char source_addr[kNameMax] = "";
  char device[kNameMax] = "";
};

using Loop = ::ibmsg__loop;

// One RDMA device as used by one loop: its protection domain and a completion channel shared by
// the CQs of all connections on the device.
struct Device {
  Loop *loop;
  ibv_context *ctx;
  ibv_pd *pd;
  ibv_comp_channel *channel;
  ev_io watcher;
};

}  // namespace ibmsg

struct ibmsg__socket {
  using State = ibmsg::State;
  using Options = ibmsg::Options;
  using Credits = ibmsg::Credits;
  using Device = ibmsg::Device;
  using Pool = ibmsg::Pool;
  using Slot = ibmsg::Slot;
  using Loop = ibmsg::Loop;
  using Socket = ::ibmsg__socket;
  uint32_t magic = ibmsg::kSocketMagic;
  State state = State::Idle;
  bool listener = false;
  ibmsg_socket *pub = nullptr;
  Loop *loop = nullptr;
  rdma_cm_id *id = nullptr;
  Options opts;
  Socket *prev = nullptr, *next = nullptr;  // the loop's list of open sockets

  // listener
  int max_connections = 0;
  int open_connections = 0;
  // accepted connection: its listener (nullptr once the listener closed)
  Socket *from_listener = nullptr;

  // connection
  Device *dev = nullptr;
  ibv_cq *cq = nullptr;
  ibv_qp *qp = nullptr;
  Pool *send_pool = nullptr;
  Pool *recv_pool = nullptr;
  uint32_t max_msg = 0;      // min of both sides' maximum, once have_peer
  bool have_peer = false;    // the peer's hello is known
  uint32_t max_inline = 0;
  Credits credits;
  Slot *queue_head = nullptr, *queue_tail = nullptr;  // posted, waiting for credits
  uint32_t queue_len = 0;
  Slot *flight_head = nullptr, *flight_tail = nullptr;  // posted to the QP, in order
  ev_timer connect_timer;
  bool timer_active = false;

  // closing
  int close_reason = IBMSG_OK;
  bool close_pending = false;  // queued for teardown in the loop's pending list
  Socket *pending_next = nullptr;
  bool cq_ready = false;       // in the device handler's ready list
  Socket *ready_next = nullptr;
  uint32_t cq_events = 0;      // CQ events read but not yet acked
};

struct ibmsg__loop {
  using Options = ibmsg::Options;
  using Device = ibmsg::Device;
  using Socket = ::ibmsg__socket;
  uint32_t magic = ibmsg::kLoopMagic;
  ibmsg_event_loop *pub = nullptr;
  struct ev_loop *ev = nullptr;
  bool own_ev = false;
  rdma_event_channel *cm = nullptr;
  ev_io cm_watcher;
  ev_idle idle;      // runs deferred teardowns
  ev_timer wakeup;   // bounds ibmsg_dispatch_event_loop_timeout
  Device devices[ibmsg::kMaxDevices];
  int ndevices = 0;
  Socket *sockets = nullptr;          // open sockets
  Socket *pending_head = nullptr, *pending_tail = nullptr;
  uint32_t live_pools = 0;            // pools not yet destroyed (some may be orphaned)
  int epfd = -1;                      // for ibmsg_event_loop_fd
  int depth = 0;                      // > 0 while a watcher callback runs (no re-entry)
  Options opts;
};

// The private part of ibmsg_connection_request: lives on the stack while the
// connection_request callback runs.
struct ibmsg__request {
  rdma_cm_id *id;
  ibmsg::wire::Hello hello;
  ibmsg__socket *listener;
};

namespace ibmsg {

// --- loop.cpp ---
Loop *loop_of(ibmsg_event_loop *l);  // validated impl or nullptr
Device *device_get(Loop *loop, ibv_context *ctx, int *err);
void loop_link(Loop *loop, Socket *s);
void loop_unlink(Loop *loop, Socket *s);
// Queues s for teardown from the loop (never inside an API call) with the given reason.
void schedule_close(Socket *s, int reason);
int loop_run(Loop *loop, int flags, double timeout_s);

// --- socket.cpp ---
void on_cm_event(Loop *loop, rdma_cm_event *ev);
void drain_cq(Socket *s);
// Releases everything and runs the closed callback; s is freed on return.
void teardown(Socket *s);
int socket_listen(Loop *loop, ibmsg_socket *pub, const char *ip, unsigned short port, int max_conn);
int socket_connect(Loop *loop, ibmsg_socket *pub, const char *ip, unsigned short port);
int socket_accept(ibmsg_connection_request *req, ibmsg_socket *pub);
int socket_reject(ibmsg_connection_request *req, const char *reason);
int socket_disconnect(Socket *s);
int msg_alloc(Socket *s, ibmsg_buffer *msg, size_t size);
int msg_post(Socket *s, ibmsg_buffer *msg);
int msg_free(ibmsg_buffer *msg);
// Deregisters and frees a pool no one holds any more.
void pool_release(Pool *p);
void on_connect_timeout(struct ev_loop *ev, ev_timer *w, int revents);

// --- errors.cpp ---
// Maps an errno value from rdma-core to an ibmsg code.
int from_errno(int e);

}  // namespace ibmsg
