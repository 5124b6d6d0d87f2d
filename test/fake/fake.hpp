// fake.hpp - controls the in-process fake transport (test/fake/transport.cpp) from host-side
// tests: reset it between tests, count what is open, inject failures, pause the wire, make the
// device iWARP, and act as a raw peer that speaks the transport directly (a misbehaving remote
// ibmsg, or none at all).
//
// What the fake models (the rdma-core semantics the core relies on):
//   - one "fabric" in the process: listeners by port (any address), a connect reaches the
//     listener of its port; no listener: Rejected with status 8 and no private data; a listener
//     destroyed with requests not yet taken rejects them (status 28, zeroed private data).
//   - private data is copied at the call and padded with zeros to what IB carries: 56 bytes in a
//     connect request, 196 in an accept, 148 in a reject (longer is EINVAL).
//   - event channels and device channels are non-blocking eventfds, readable while something is
//     pending; a CQ is armed when created and signals its device once per arm (cq_arm), at its
//     next completion; completions already in it when it is armed signal nothing (as on real
//     devices: the core polls once more after arming). device_take_events does not re-arm.
//   - a SEND is delivered at once into the peer's first posted receive (in order), both
//     completions are queued; no posted receive: RNR (counted, the send fails, both QPs go to the
//     error state); too long for the buffer: a length error (counted, both fail). A send to a
//     peer whose QP is gone or in error stays in flight (a real one would retry for seconds)
//     until its own QP goes to the error state.
//   - a QP in the error state flushes what is posted and completes later posts as Flushed;
//     cm_disconnect moves the local QP to the error state and both sides get Disconnected once;
//     destroying a connected id disconnects it; destroying a QP drops its completions from the
//     CQ.
//   - send and receive queues hold caps.send_wrs / caps.recv_wrs work requests until their
//     completions are polled (as mlx5 does); a CQ holds depth completions. Overflowing either,
//     posting before the connection is up, a buffer outside its memory registration, destroying
//     a CQ a QP still uses, closing a device with CQs or registrations, destroying a channel with
//     ids: each is counted as a misuse (a bug of the caller) with a description.
//   - 192.0.2.0/24 (TEST-NET-1) is unreachable: address resolution ends in AddrError.
//   - device removal (remove_device): DeviceRemoval on every id bound to the device.
//   - one-sided operations (post_rdma) execute in send-queue order with the sends, when they
//     reach the peer: the rkey must name a live registration on the peer's device (its protection
//     domain) with the right (remote read / write / atomic) on exactly [remote, remote + len);
//     otherwise the operation completes with RemoteAccess (counted), everything before it
//     completes first, and both QPs go to the error state, as on an RC connection. A zero-length
//     write or read checks no key (as IB). A write copies the local bytes when it is posted and
//     writes them into the peer's memory; a write with immediate also consumes the peer's first
//     posted receive (completed with write_imm, has_imm, imm and len = bytes written; no posted
//     receive: RNR as for a send); a read copies the peer's bytes into the local memory; atomics
//     (8 bytes, remote 8-aligned) compare-and-swap or fetch-and-add a host-order word and store
//     its previous value locally. The local memory must lie in its registration (unless a write
//     goes inline), and a read or atomic result needs local write access.
//   - type-2 memory windows (mw_alloc, post_bind): a bind executes in send-queue order when it
//     reaches the head (a local operation: it needs no peer), completes signaled, and from then
//     the window's key works on that QP only, within the window and with its rights; on any
//     other QP it is a remote access error. A registration's own key grants only the remote
//     rights it was registered with (none for a window's). Deregistering a registration with
//     windows over it, or deallocating a window whose bind is in flight, is a misuse. A QP that
//     refused a peer's one-sided operation (remote access error) says so in qp_failed, as the
//     rdma-core transport does by its error state.
//   - the device offers 16 reads/atomics per QP each way and atomics (set_atomics turns them off
//     for devices opened afterwards); an atomic posted on a device without them is a misuse, as
//     is asking for more reads/atomics in cm_connect / cm_accept than the device has
//     (tp::kMaxRdAtomic in cm_accept takes what the request asked for, at most the device's).
//   - one protection domain for the device, shared by the loops' device objects open on it, as
//     rdma-core's transport shares one per device in the process (a raw peer, another process,
//     has one of its own): a registration on it serves the QPs of all of them; it goes when its
//     last holder (device objects, holders of domain_hold) lets go, with no registration left on
//     it (else a misuse); one retired by a removal counts a rescan when it goes.
// What it does not model: timing (delivery is instant; nothing retries), more than one device,
// asynchronous device events, reads or atomics overtaken by later work requests, the
// responder-resources limit (no operation waits for it).
#pragma once
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <vector>

#include "transport/transport.hpp"
#include "wire.hpp"

namespace ibmsg::fake {

// Forgets every injection and counter and the fabric's listeners (objects a failed test left
// open are leaked, not freed). Call before each test.
void reset();

struct Counts {
  int channels, ids, devices, cqs, qps, mrs, srqs, mws;
  int domains;  // protection domains: one while a device object or a registration holds it
};
Counts open_objects();
// "" if everything is closed, else e.g. "2 CM ids, 1 device".
std::string open_objects_text();

struct Stats {
  unsigned long rnr_errors;     // sends into a receive queue without a posted buffer
  unsigned long length_errors;  // sends larger than the receive buffer
  unsigned long misuses;        // calls real rdma-core would refuse or crash on
  std::string first_misuse;
  unsigned long delivered;  // messages delivered
  unsigned long connect_requests;
  unsigned long rescans;  // devices_rescan() calls
  unsigned long cm_notifies;  // cm_notify_established() calls
  unsigned long registrations;         // successful mr_register calls (raw peers' included)
  unsigned long remote_access_errors;  // one-sided operations the responder refused
  unsigned long rdma_ops;              // one-sided operations executed
  unsigned long binds;                 // memory window binds executed
  unsigned long cq_arms;     // successful cq_arm calls
  unsigned long cq_signals;  // completions that signalled their device's fd (the CQ was armed)
  unsigned long post_lists;  // send-queue lists posted by post_flush (doorbells)
  unsigned long recv_lists;  // receive lists posted by post_flush
  unsigned long cq_resizes;   // successful cq_resize calls
  unsigned long orphan_cqes;  // completions polled after their QP was destroyed
  unsigned long send_cqes;   // send-queue completions (unsignaled successes make none)
  unsigned long ctrl_cqes;   // of them, credit-only messages' successful completions
  unsigned long take_events;  // device_take_events calls (a removed device's fail)
  // The RDMA read/atomic resources of the core's last cm_connect and cm_accept (-1: none yet);
  // for the accept, what they resolve to (tp::kMaxRdAtomic: what the request asked for, at most
  // the device's limit, as librdmacm does).
  int connect_responder_resources = -1, connect_initiator_depth = -1;
  int accept_responder_resources = -1, accept_initiator_depth = -1;
};
const Stats &stats();

// The fake device's kind (default InfiniBand/RoCE).
void set_iwarp(bool iwarp);

// Whether devices opened from now on offer atomics (default yes; reset() restores it).
void set_atomics(bool atomics);
// The largest CQ of devices opened from now on (default 4194303; reset() restores it).
void set_max_cqe(uint32_t max_cqe);
// The largest message or read of devices opened from now on (default 1 MiB; reset() restores it);
// a longer one fails with a local length error (WcStatus::Failed).
void set_max_msg_size(uint64_t bytes);
// The largest shared receive queue of devices opened from now on (default 0: devices
// without shared receive queues; reset() restores it). A shared receive queue (tp::srq_create)
// gives its posted receives, in order, to whichever of its QPs gets a message; a QP in the error
// state flushes only the receive it was taking, not the shared queue's.
void set_max_srq_wr(uint32_t n);
// Whether devices opened from now on have type-2 memory windows (default yes; reset() restores
// it).
void set_mw_type2(bool on);

// One work request the core posted to a send queue (raw peers' posts are not recorded), in
// posting order: the local port of its CM id (an accepted connection's is its listener's), what
// it is and its length in bytes.
struct Post {
  unsigned short port;
  tp::Op op;
  uint32_t len;
  bool inlined;  // the payload goes inline (len <= the max_inline the core passed)
};
const std::vector<Post> &posts();
// The kinds of the posts from CM ids with that local port, in order (credit-only messages only
// with with_ctrl).
std::vector<tp::Op> posts_of(unsigned short port, bool with_ctrl = false);

// Removes the device (until reset): every CM id on it gets DeviceRemoval, its QPs go to the
// error state, it can no longer be opened or resolved to, and the completion channel of every
// open device object stays readable with device_take_events failing (as rdma-core's after a
// disassociation).
void remove_device();

// The completion channels of the device objects open now fail (readable, reading fails), with
// no CM event, and the device can still be opened: a device object that broke, not a removal.
void fail_channels();

// Transport calls a test can make fail. Injections hit only calls made by the core, not by raw
// peers.
enum class Call {
  CmChannelCreate,
  CmIdCreate,
  CmBind,
  CmListen,
  CmResolveAddr,
  CmResolveRoute,
  CmConnect,
  CmAccept,
  DeviceOpen,
  CqCreate,
  CqPoll,  // returns -1
  QpCreate,
  MrRegister,
  PostRecv,
  PostSend,
  PostRdma,
  PostFlush,  // the whole list is refused (none of it posted)
  CqArm,
  SrqCreate,
  MwAlloc,
  PostBind,
};
// The call after the next `skip` successful ones returns code (once).
void fail_call(Call call, int code, unsigned skip = 0);

// The completion notification of a CQ the core created (s->cq): whether it is armed now (its next
// completion signals the device's fd), how often the core armed it (successful cq_arm calls)
// and how often it signalled its device.
struct CqInfo {
  bool armed;
  unsigned long arms, signals;
  unsigned long taken;  // signals whose event device_take_events has read
};
CqInfo cq_info(const tp::Cq *cq);

// Runs fn once, inside the core's next successful cq_arm of cq (nullptr: of any CQ), before the
// CQ is armed: a completion fn causes (e.g. pause_wire(false) delivering a send) lands in the
// CQ while it is still unarmed, the race between the last poll and the arming. reset() drops it.
void before_cq_arm(const tp::Cq *cq, std::function<void()> fn);

// While paused, posted sends stay in flight (not delivered, not completed); unpausing delivers
// them in order.
void pause_wire(bool paused);

// While delayed, a delivered send completes at the sender only when the delay ends (its work
// request keeps its send-queue slot), as when acknowledgements lag behind the peer's answers.
// With a port, only sends from CM ids with that local port are delayed (an accepted connection's
// local port is its listener's).
void delay_send_completions(bool delay, unsigned short port = 0);

// While held, the accepting side's Established event waits (the connecting side gets its own at
// once), so data can overtake it; release_established() queues the held ones.
void hold_established(bool hold);
void release_established();

// The data path, watched (test/perf/cost --critical): recv_polled runs when cq_poll hands out a
// receive completion, flush when post_flush is called; with one_per_poll cq_poll hands out at
// most one completion per call, so that the handling of one receive is not mixed with that of
// the completions polled with it. reset() drops it.
struct PathWatch {
  void (*recv_polled)() = nullptr;
  void (*flush)() = nullptr;
  bool one_per_poll = false;
};
void watch_path(const PathWatch &w);

// --- a raw peer -----------------------------------------------------------------------------

struct RawMsg {
  bool has_imm;
  uint32_t imm;
  std::vector<uint8_t> data;
};

// A remote endpoint driven by the test through the transport API itself: it builds its own
// hello (or any private data), sends any immediate and payload, and records what it receives.
// It has its own channel and device; nothing runs it but pump() (no loop watches it).
class RawPeer {
 public:
  enum class State { Idle, Listening, Connecting, Requested, Established, Rejected, Disconnected };

  // recv_bufs receive buffers of buf_size bytes are posted before connect/accept, and each is
  // re-posted as soon as its message was recorded.
  explicit RawPeer(uint32_t recv_bufs = 32, uint32_t buf_size = 4096);
  ~RawPeer();
  RawPeer(const RawPeer &) = delete;
  RawPeer &operator=(const RawPeer &) = delete;

  // Client: resolves 127.0.0.1:port and sends a connect request with pdata.
  int connect(unsigned short port, const void *pdata, size_t plen);
  int connect(unsigned short port, const wire::Hello &h);
  // Server: listens; requests wait in state Requested until accept/reject (one at a time).
  int listen(unsigned short port = 0);
  unsigned short port() const;
  int accept(const void *pdata, size_t plen);
  int accept(const wire::Hello &h);
  int reject(const void *pdata, size_t plen);

  // A SEND with immediate (host order) and len bytes of payload.
  int send(uint32_t imm, const void *data = nullptr, size_t len = 0);
  // A SEND without immediate (what an iWARP or foreign peer might send).
  int send_without_imm(const void *data, size_t len);
  // An RDMA write of len bytes of data to remote (a raw address) with rkey; with an immediate
  // (host order), write_imm. Their completions count in rdma_ok / rdma_failed.
  int write(uint64_t remote, uint32_t rkey, const void *data, size_t len);
  int write_imm(uint32_t imm, uint64_t remote, uint32_t rkey, const void *data, size_t len);
  int disconnect();
  // Destroys everything now (the destructor does too).
  void close();

  // Takes the CM events and completions that arrived.
  void pump();

  State state() const { return state_; }
  int event_status() const { return status_; }                        // of Rejected
  const std::vector<uint8_t> &event_pdata() const { return pdata_; }  // last request/accept/reject
  std::deque<RawMsg> received;  // what the ibmsg side sent, in order
  unsigned sends_ok = 0, sends_failed = 0, recvs_failed = 0, requests = 0;
  unsigned rdma_ok = 0, rdma_failed = 0;
  tp::WcStatus last_rdma_status = tp::WcStatus::Ok;

 private:
  void open_queues(tp::CmId *id);
  void on_event(const tp::CmEvent &ev);
  void poll();
  int post_write(tp::WorkCtx *ctx, uint32_t imm, uint64_t remote, uint32_t rkey, const void *data,
                 size_t len);

  uint32_t nbufs_, bufsize_;
  State state_ = State::Idle;
  int status_ = 0;
  std::vector<uint8_t> pdata_;
  std::vector<uint8_t> connect_pdata_;
  tp::CmChannel *ch_ = nullptr;
  tp::CmId *listen_id_ = nullptr;
  tp::CmId *req_id_ = nullptr;  // an undecided request
  tp::CmId *id_ = nullptr;      // the connection
  tp::Device *dev_ = nullptr;
  tp::Cq *cq_ = nullptr;
  tp::Mr *mr_ = nullptr;
  uint8_t *mem_ = nullptr;  // nbufs_ receive buffers, then one send buffer
  std::vector<tp::WorkCtx> recv_ctx_;
  tp::WorkCtx send_ctx_{tp::Op::Send, 0, nullptr};
  tp::WorkCtx write_ctx_{tp::Op::RdmaWrite, 0, nullptr};
  tp::WorkCtx write_imm_ctx_{tp::Op::WriteImm, 0, nullptr};
};

// For raw peers: a SEND without immediate data (post_send_imm always carries one).
int post_send_no_imm(tp::CmId *id, tp::WorkCtx *ctx, const void *buf, uint32_t len,
                     const tp::Mr *mr);

// A hello as ibmsg 1.0 would send it, to be changed field by field.
inline wire::Hello hello(uint32_t recv_depth, uint32_t ctrl_depth = 4,
                         uint32_t max_msg_size = 4096) {
  wire::Hello h;
  h.recv_depth = recv_depth;
  h.ctrl_depth = ctrl_depth;
  h.max_msg_size = max_msg_size;
  // Shared receive buffers (the wants bit, Return messages) only where a test turns them on.
  h.features = wire::kFeatures & ~wire::kFeatureShared;
  return h;
}

// An immediate: opcode in bits 28..31, control credits in 16..23, data credits in 0..15.
inline uint32_t imm(uint32_t opcode, uint32_t credits = 0, uint32_t ctrl_credits = 0) {
  return opcode << 28 | (ctrl_credits & 0xff) << 16 | (credits & 0xffff);
}

}  // namespace ibmsg::fake
