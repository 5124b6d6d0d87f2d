// The core's shared handles: the socket, the loop, the options set and a connection request, and
// who owns what in them. The tiers of src/ and what each file is for: tiers.hpp (the one map,
// checked by test/layers/check); the README's "Source layout" names the same files.
// Each file's functions are declared in its own header, which a .cpp includes for what it calls:
// its include lines say what it may call.
#pragma once
#include <ev.h>

#include <cstddef>
#include <cstdint>
#include <memory>

#include "batch.hpp"
#include "credits.hpp"
#include "hooks.hpp"
#include "ibmsg.h"
#include "list.hpp"
#include "options.hpp"
#include "pool.hpp"
#include "state.hpp"
#include "transport/transport.hpp"
#include "wire.hpp"

struct ibmsg__loop;

namespace ibmsg {

constexpr uint32_t kLoopMagic = 0x1b5910b0;
constexpr uint32_t kSocketMagic = 0x1b550c4e;
constexpr uint32_t kOptionsMagic = 0x1b5007a5;

using Loop = ::ibmsg__loop;

// --- options.cpp: Options (options.hpp) ---

}  // namespace ibmsg

#include "device.hpp"    // Device, DevCq, pools and large buffers
#include "region.hpp"  // ibmsg__region, Grant
#include "rdma.hpp"    // ibmsg__op
#include "timer.hpp"
#include "keepalive.hpp"  // Liveness
#include "requests.hpp"   // requests and replies
#include "violations.hpp"  // remote access violations

struct ibmsg__socket {
  using Loop = ibmsg::Loop;
  using Socket = ::ibmsg__socket;
  uint32_t magic = ibmsg::kSocketMagic;
  ibmsg::State state = ibmsg::State::Idle;
  bool listener = false;
  bool was_connected = false;  // reached Connected (the peer must be told when it closes)
  ibmsg_socket *pub = nullptr;
  Loop *loop = nullptr;
  ibmsg::tp::CmId *id = nullptr;
  ibmsg::Options opts;
  ibmsg::ListNode loop_node;     // the loop's open sockets
  ibmsg::ListNode open_node;     // every open socket of the process (see socket_is_open)

  // accepted connection: its listener (nullptr once the listener closed)
  Socket *from_listener = nullptr;
  ibmsg::ListNode listener_node;
  // listener: its accepted connections that are still open
  int max_connections = 0;
  ibmsg::List<Socket, &Socket::listener_node> accepted;

  // connection
  ibmsg::Device *dev = nullptr;
  uint64_t serial = 0;  // unique among the process's connections (conn_open)
  ibmsg::DevCq *devcq = nullptr;  // its device's CQ, from conn_open to conn_release,
  ibmsg::tp::Cq *cq = nullptr;    // and its share of it
  uint32_t cq_need = 0;
  bool has_qp = false;
  ibmsg::SharedSend *ssend = nullptr;  // the device's send buffers it takes its messages from
  uint32_t send_out = 0;               // and how many it holds (at most IBMSG_OPT_SEND_DEPTH)
  ibmsg::Pool *recv_pool = nullptr;   // receive buffers of its own, or
  ibmsg::SharedRecv *srecv = nullptr;  // the device's shared ones (recv.cpp), and its book there
  ibmsg::ShareConn share;
  uint32_t qp_num = 0;  // its queue pair's (shared receives name it)
  bool wants_told = false;  // a credit-only message told the peer that data waits for credits
  uint32_t ctrl_lost = 0;   // its control buffers the shared queue refused back
  uint32_t max_msg = 0;      // min of both sides' maximum, once have_peer
  uint32_t eager = 0;        // largest message sent through the pools (min of both sides')
  bool have_peer = false;    // the peer's hello is known
  uint32_t features = 0;     // feature bits both sides have
  uint32_t max_inline = 0;
  ibmsg::Credits credits;
  // Messages and operations in posting order: waiting (for credits or room in flight), then
  // posted to the QP until their completion.
  ibmsg::List<ibmsg::Work, &ibmsg::Work::link> queue;
  ibmsg::List<ibmsg::Work, &ibmsg::Work::link> flight;
  // One-sided operations: the table (rdma_depth + send_queue entries) and its free entries.
  std::unique_ptr<ibmsg__op[]> ops;
  ibmsg::List<ibmsg__op, &ibmsg__op::free_link> free_ops;
  uint32_t ops_in_flight = 0;
  ibmsg::ConnGrants grants;  // descriptors bound to it: their windows (region.cpp)
  uint8_t responder_resources = 0;  // what fill_conn_param offers
  uint8_t initiator_depth = 0;
  ibmsg::tp::WorkCtx ctrl_wr{ibmsg::tp::Op::Ctrl, 0, nullptr};
  // Credit-only messages posted and not yet completed here: the send queue has room for
  // kCtrlDepth of them. Control credits alone do not bound them: the peer returns a control
  // credit once it consumed the message, which can be before our completion arrives.
  uint32_t ctrl_in_flight = 0;
  // Rendezvous (rndv.cpp). Sending: the RTSs posted, in order, until the peer has read them.
  // Receiving: the messages not yet delivered (behind one still being read), and the ones
  // whose reads are not all posted; reads in flight; messages read, not yet counted to the peer.
  ibmsg::List<ibmsg::Slot, &ibmsg::Slot::link> rndv_wait;
  ibmsg::List<ibmsg::Slot, &ibmsg::Slot::link> deliver;
  ibmsg::List<ibmsg::RndvIn, &ibmsg::RndvIn::read_link> reading;
  uint32_t rndv_reads = 0;
  uint64_t rndv_read_bytes = 0;  // of the reads in flight
  uint32_t done_owed = 0;
  // Waiting for the loop's rendezvous memory (IBMSG_OPT_RNDV_MEMORY): in its queue of waiters.
  ibmsg::ListNode rndv_mem_node;
  ibmsg::List<ibmsg::RndvIn, &ibmsg::RndvIn::read_link> fins;  // declined: FINs posted
  ibmsg::Timer connect_timer;
  // busy polling (poll.cpp): the CQ is polled from the loop instead of armed while poll_active
  bool poll_active = false;
  uint64_t poll_last_ns = 0;  // the connection's last activity

  ibmsg::ListNode post_node;  // in the loop's list of sockets with posts not yet flushed
  ibmsg::Liveness live;        // keepalive (keepalive.hpp)
  ibmsg::ListNode ka_node;     // in the loop's list of connections with keepalive
  ibmsg_stats stats{};         // ibmsg_socket_stats
  ibmsg::ReqConn reqs;         // requests posted on it (requests.cpp)
  ibmsg::Timer req_timer;      // for the first of their deadlines
  // closing
  int close_reason = IBMSG_OK;
  ibmsg::ListNode close_node;  // in the loop's list of sockets due for teardown
};

struct ibmsg__loop {
  using Socket = ::ibmsg__socket;
  uint32_t magic = ibmsg::kLoopMagic;
  ibmsg_event_loop *pub = nullptr;
  const ibmsg::Hooks *hooks = nullptr;  // what lower tiers tell higher ones (loop.cpp)
  struct ev_loop *ev = nullptr;
  bool own_ev = false;
  ibmsg::tp::CmChannel *cm = nullptr;
  ev_io cm_watcher;
  ev_idle idle;      // runs teardowns and releases devices
  ev_timer wakeup;   // bounds ibmsg_dispatch_event_loop_timeout
  ev_idle poller;    // busy polling: runs while polling > 0 (poll.cpp)
  int polling = 0;   // sockets with poll_active
  ibmsg::List<ibmsg::Device, &ibmsg::Device::node> devices;
  bool devices_dirty = false;  // a device reached zero references
  ibmsg::Timer rescan;         // after a removed device was released (device.cpp)
  int rescans_left = 0;
  ibmsg::List<Socket, &Socket::loop_node> sockets;       // open sockets
  ibmsg::List<Socket, &Socket::close_node> closing;      // due for teardown
  ibmsg::List<Socket, &Socket::post_node> unflushed;     // posts to flush (datapath.cpp)
  ibmsg::List<ibmsg::Timer, &ibmsg::Timer::node> timers;  // running timers
  ibmsg::List<ibmsg__region, &ibmsg__region::loop_node> regions;  // registered regions
  int epfd = -1;     // for ibmsg_event_loop_fd
  int depth = 0;     // > 0 while a watcher callback runs (no re-entry)
  ibmsg::List<Socket, &Socket::ka_node> keepalive;  // connections with keepalive (keepalive.cpp)
  ibmsg::Timer ka_timer;
  double ka_tick = 0;
  double ka_last = 0;  // loop time of the last tick
  int debug = 0;  // IBMSG_DEBUG: the level up to which log lines go to stderr (log.cpp)
  // While a closed callback runs: the socket and its last counters (ibmsg_socket_stats).
  const ibmsg_socket *closed_pub = nullptr;
  ibmsg_stats closed_stats{};
  ibmsg::Options opts;
  ibmsg::ReqLoop req;  // requests and the answers kept for retries (requests.cpp, dedup.cpp)
  ibmsg::Violations violations;  // peers' remote access violations (violations.cpp)
  // Rendezvous destinations the library allocated, from their first read until freed (bytes of
  // their size classes), and the connections waiting for room under IBMSG_OPT_RNDV_MEMORY, in
  // the order they asked (rndv.cpp).
  size_t rndv_mem = 0;
  ibmsg::List<Socket, &Socket::rndv_mem_node> rndv_mem_waiters;
};

// An options set (ibmsg_options_new).
struct ibmsg_options {
  uint32_t magic;
  ibmsg::Options opts;
};

// The private part of ibmsg_connection_request: on the stack while connection_request runs.
struct ibmsg__request {
  ibmsg::tp::CmId *id;
  ibmsg::wire::Hello hello;
  ibmsg__socket *listener;
};

namespace ibmsg {

// Held while a watcher callback runs: the loop's API refuses to re-enter (IBMSG_EBUSY). What the
// callbacks posted goes to the QPs when it ends, if not before (posts_flush).
// Lower tiers ask for the close through the hook the loop registered (hooks.hpp).
inline void socket_close(Socket *s, int reason) { s->loop->hooks->close(s, reason); }

struct LoopEntered {
  explicit LoopEntered(Loop *l) : loop(l) { ++loop->depth; }
  ~LoopEntered() {
    if (--loop->depth == 0 && !loop->unflushed.empty()) posts_flush(loop);
  }
  LoopEntered(const LoopEntered &) = delete;
  LoopEntered &operator=(const LoopEntered &) = delete;
  Loop *loop;
};

}  // namespace ibmsg
#include "rdma.hpp"

#include "log.hpp"  // IBMSG_LOG, after the structs it reads
