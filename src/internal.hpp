// The core's shared handles: the socket, the loop, the options set and a connection request, and
// who owns what in them. The tiers of src/ and what each file is for: tiers.hpp (the one map,
// checked by test/layers/check); HACKING.md's "Source layout" names the same files.
// Each file's functions are declared in its own header, which a .cpp includes for what it calls:
// its include lines say what it may call.
#pragma once
#include <ev.h>
#include <unistd.h>

#include <atomic>
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
#include "away.hpp"

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
#include "handover.hpp"   // calls from other threads
#include "violations.hpp"  // remote access violations
#include "pace.hpp"        // connects waiting for their turn

namespace ibmsg {

// A connection's parts, each owned by the file of its concept (the file that changes it; others
// may read it).

// The send path (datapath.cpp): the credits it spends and returns, the messages and operations
// in posting order -- waiting (for credits or room in flight), then posted to the QP until their
// completion -- and its credit-only messages.
struct SendPath {
  Credits credits;
  List<Work, &Work::link> queue;
  List<Work, &Work::link> flight;
  bool wants_told = false;  // a credit-only message told the peer that data waits for credits
  bool ctrl_check = false;  // credits became due in a callback: decided at the round's end (batch.cpp)
  tp::WorkCtx ctrl_wr{tp::Op::Ctrl, 0, nullptr};
  // Credit-only messages posted and not yet completed here: the send queue has room for
  // kCtrlDepth of them. Control credits alone do not bound them: the peer returns a control
  // credit once it consumed the message, which can be before our completion arrives.
  uint32_t ctrl_in_flight = 0;
  uint32_t ops_in_flight = 0;  // one-sided operations posted (at most IBMSG_OPT_RDMA_DEPTH)
};

// Its receive buffers (recv.cpp): of its own, or the device's shared ones and its book there.
struct RecvBuffers {
  Pool *pool = nullptr;
  SharedRecv *shared = nullptr;
  ShareConn share;
  uint32_t qp_num = 0;     // its queue pair's (shared receives name it)
  uint32_t ctrl_lost = 0;  // its control buffers the shared queue refused back
  uint32_t freed_later = 0;  // its messages freed in the round, waiting in Loop::freed
  uint32_t routed = 0;       // shared buffers that name it (Slot::sock): recv.cpp's route_to
  // Its eager size (recv_join): the largest message its buffers take, the option's or, on shared
  // buffers, scaled down for many connections (IBMSG_OPT_SHARED_RECV_BUDGET); 0 before.
  uint32_t eager = 0;
  // The peer is known to take no rendezvous (an accepted connection from ibmsg 1.1): its eager
  // size is not scaled down, since that peer could then send nothing larger.
  bool keep_eager = false;
};

// Its send buffers (send_slots.cpp): the device's ones it takes its messages from, and how many
// it holds (at most IBMSG_OPT_SEND_DEPTH).
struct SendBuffers {
  SharedSend *shared = nullptr;
  uint32_t out = 0;
};

// Its one-sided operations (rdma.cpp): the table (rdma_depth + send_queue entries, made with the
// first operation) and its free entries.
struct OpTable {
  std::unique_ptr<::ibmsg__op[]> table;
  List<::ibmsg__op, &::ibmsg__op::free_link> free;
};

// Rendezvous (rndv.cpp). Sending: the RTSs posted, in order, until the peer has read them.
// Receiving: the messages whose reads are not all posted, reads in flight and their bytes,
// messages read and not yet counted to the peer (done_owed), declined ones whose FIN is posted.
struct RndvConn {
  List<Slot, &Slot::link> wait;
  List<RndvIn, &RndvIn::read_link> reading;
  uint32_t reads = 0;
  uint64_t read_bytes = 0;
  uint32_t done_owed = 0;
  List<RndvIn, &RndvIn::read_link> fins;
};

// Its queue pair and its share of the device's CQ, and what they allow (conn.cpp).
struct ConnResources {
  uint64_t serial = 0;      // unique among the process's connections (conn_open)
  DevCq *devcq = nullptr;   // its device's CQ, from conn_open to conn_release,
  tp::Cq *cq = nullptr;     // and its share of it
  uint32_t cq_need = 0;
  bool has_qp = false;
  uint32_t max_inline = 0;
  uint8_t responder_resources = 0;  // what fill_conn_param offers
  uint8_t initiator_depth = 0;
};

// What both sides agreed on in their hellos (conn.cpp, set_peer).
struct PeerTerms {
  bool known = false;     // the peer's hello is known
  uint32_t features = 0;  // feature bits both sides have
  uint32_t max_msg = 0;   // min of both sides' maximum
  uint32_t eager = 0;     // largest message sent through the pools (min of both sides')
};

// Busy polling (poll.cpp): the CQ is polled from the loop instead of armed while the socket is
// on the loop's pollers list (poll_node linked).
struct PollState {
  uint64_t last_ns = 0;  // the connection's last activity
};

}  // namespace ibmsg

struct ibmsg__socket {
  using Loop = ibmsg::Loop;
  using Socket = ::ibmsg__socket;
  // What it is (setup.cpp, conn.cpp; the state: the state table, close.cpp).
  uint32_t magic = ibmsg::kSocketMagic;
  ibmsg::State state = ibmsg::State::Idle;
  bool listener = false;
  bool was_connected = false;  // reached Connected (the peer must be told when it closes)
  ibmsg_socket *pub = nullptr;
  Loop *loop = nullptr;
  ibmsg::tp::CmId *id = nullptr;
  ibmsg::Device *dev = nullptr;
  ibmsg::Options opts;
  ibmsg::ListNode loop_node;     // the loop's open sockets
  ibmsg::ListNode open_node;     // every open socket of the process (see socket_is_open)
  bool open_indexed = false;     // in the process's index of open sockets too (conn.cpp)
  ibmsg::Timer connect_timer;    // connecting, or lingering (cm.cpp, close.cpp)
  ibmsg::PaceState pace = ibmsg::PaceState::None;  // its connect's turn (pace.cpp)
  ibmsg::PaceWait *pace_wait = nullptr;            // its addresses while it waits
  ibmsg_stats stats{};           // ibmsg_socket_stats (each counter by the file that counts)

  // accepted connection: its listener (nullptr once the listener closed)
  Socket *from_listener = nullptr;
  ibmsg::ListNode listener_node;
  // listener: its accepted connections that are still open
  int max_connections = 0;
  ibmsg::List<Socket, &Socket::listener_node> accepted;
  // Connections accepted onto other loops (spread.cpp): a listener's count of them, shared with
  // each (it lives while any of them or the listener does); the loops its accepts go to in turn.
  ibmsg::AwayCount *away = nullptr;
  ibmsg::Spread *spread = nullptr;

  // A connection's parts, by the file that owns each.
  ibmsg::ConnResources res;    // conn.cpp
  ibmsg::PeerTerms peer;       // conn.cpp
  ibmsg::SendPath tx;          // datapath.cpp
  ibmsg::RecvBuffers rx;       // recv.cpp
  ibmsg::SendBuffers sendbuf;  // send_slots.cpp
  ibmsg::OpTable rdma;         // rdma.cpp
  ibmsg::ConnGrants grants;    // region.cpp: descriptors bound to it, their windows
  ibmsg::RndvConn rndv;        // rndv.cpp
  // received messages in order, behind one still being read (deliver.cpp)
  ibmsg::List<ibmsg::Slot, &ibmsg::Slot::link> deliver;
  ibmsg::PollState poll;       // poll.cpp
  ibmsg::Liveness live;        // keepalive.cpp
  ibmsg::ReqConn reqs;         // requests.cpp: requests posted on it,
  ibmsg::Timer req_timer;      // and the first of their deadlines

  // Memberships of the loop's lists, each kept by the file of the list.
  ibmsg::ListNode post_node;      // posts not yet flushed (batch.cpp)
  ibmsg::ListNode fresh_node;     // granted credits held back until the poll's end (recv.cpp)
  ibmsg::ListNode ka_node;        // connections with keepalive (keepalive.cpp)
  ibmsg::ListNode rndv_mem_node;  // waiting for rendezvous memory (rndv_memory.cpp)
  ibmsg::ListNode close_node;     // due for teardown (close.cpp)
  ibmsg::ListNode poll_node;      // busy polling now (poll.cpp): the poller walks only these
  ibmsg::ListNode pace_node;      // waiting for its connect's turn (pace.cpp)
  int close_reason = IBMSG_OK;    // the first reason it closed for (close.cpp)
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
  ev_idle poller;    // busy polling: runs while pollers is not empty (poll.cpp)
  ibmsg::List<ibmsg::Device, &ibmsg::Device::node> devices;
  bool devices_dirty = false;  // a device reached zero references
  ibmsg::Timer rescan;         // after a removed device was released (device.cpp)
  ibmsg::Handover handover;    // calls other threads hand it (handover.cpp)
  int rescans_left = 0;
  ibmsg::List<Socket, &Socket::loop_node> sockets;       // open sockets
  ibmsg::List<Socket, &Socket::close_node> closing;      // due for teardown
  ibmsg::List<Socket, &Socket::poll_node> pollers;       // busy polling now (poll.cpp)
  ibmsg::List<Socket, &Socket::post_node> unflushed;     // posts to flush (batch.cpp)
  ibmsg::List<ibmsg__slot, &ibmsg__slot::link> freed;    // received, freed in the round (message.cpp)
  ibmsg::List<ibmsg::Timer, &ibmsg::Timer::node> timers;  // running timers
  ibmsg::List<ibmsg__region, &ibmsg__region::loop_node> regions;  // registered regions
  int epfd = -1;     // for ibmsg_event_loop_fd
  int depth = 0;     // > 0 while a watcher callback runs (no re-entry)
  // Completions of the poll being handled that are still to come after the one handled now
  // (completion.cpp), and the connections that granted credits meanwhile (recv.cpp).
  uint32_t poll_rest = 0;
  ibmsg::List<Socket, &Socket::fresh_node> fresh;
  ibmsg::List<Socket, &Socket::ka_node> keepalive;  // connections with keepalive (keepalive.cpp)
  ibmsg::Timer ka_timer;
  double ka_tick = 0;
  double ka_last = 0;  // loop time of the last tick
  int debug = 0;  // IBMSG_DEBUG: the level up to which log lines go to stderr (log.cpp)
  // With IBMSG_DEBUG: the thread in the loop now (dispatching it or in one of its callbacks),
  // 0 outside; a call from another thread meanwhile is refused (loop.hpp, from_other_thread).
  std::atomic<long> runner{0};
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
  // Outgoing connection attempts under way, and those waiting for their turn, in order
  // (IBMSG_OPT_CONNECT_LIMIT, pace.cpp).
  uint32_t pace_under_way = 0;
  bool pace_filling = false;
  ibmsg::List<Socket, &Socket::pace_node> pace_waiting;
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

// Held while a watcher callback runs: the loop's API refuses to re-enter (IBMSG_EBUSY). When it
// ends, the received messages the callbacks freed go back, and what they posted goes to the QPs,
// if not before (posts_flush).
// Lower tiers ask for the close through the hook the loop registered (hooks.hpp).
inline void socket_close(Socket *s, int reason) { s->loop->hooks->close(s, reason); }

// The calling thread's id (gettid(2), read once per thread).
inline long current_tid() {
  static thread_local const long tid = long(gettid());
  return tid;
}

// Marks the calling thread as the one in the loop while it lives (with IBMSG_DEBUG only).
struct LoopThread {
  explicit LoopThread(Loop *l) : loop(l) {
    if (loop->debug) prev = loop->runner.exchange(current_tid(), std::memory_order_relaxed);
  }
  ~LoopThread() {
    if (loop->debug) loop->runner.store(prev, std::memory_order_relaxed);
  }
  LoopThread(const LoopThread &) = delete;
  LoopThread &operator=(const LoopThread &) = delete;
  Loop *loop;
  long prev = 0;
};

struct LoopEntered {
  explicit LoopEntered(Loop *l) : loop(l), thread(l) { ++loop->depth; }
  ~LoopEntered() {
    // (still inside: what the end of the round posts is batched with the rest)
    if (loop->depth == 1 && (!loop->unflushed.empty() || !loop->freed.empty())) posts_flush(loop);
    --loop->depth;
  }
  LoopEntered(const LoopEntered &) = delete;
  LoopEntered &operator=(const LoopEntered &) = delete;
  Loop *loop;
  LoopThread thread;
};

}  // namespace ibmsg
#include "rdma.hpp"

#include "log.hpp"  // IBMSG_LOG, after the structs it reads
