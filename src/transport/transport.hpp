// The transport layer: the only code that calls rdma-core (libibverbs, librdmacm).
//
// It knows nothing of sockets, credits or messages. The core sees opaque handles and typed
// results: CM events copied out and already acknowledged, completions tagged with the WorkCtx the
// core posted. Two implementations link against the same declarations: src/transport/*.cpp
// (rdma-core) and test/fake/transport.cpp (in-process, for host-side tests of the core).
//
// Every function that can fail returns 0 or an ibmsg error code (IBMSG_*).
#pragma once
#include <sys/socket.h>

#include <cstddef>
#include <cstdint>

#include "ibmsg.h"
#include "work.hpp"

namespace ibmsg::tp {

// --- work requests and completions ------------------------------------------------------------

// Op and WorkCtx, what a work request was for: work.hpp (pure: the core embeds them).

enum class WcStatus : uint8_t {
  Ok,
  Flushed,  // the queue pair went to the error state first (closing)
  RemoteAccess,  // the peer refused a one-sided operation: key, range or rights
  Timeout,  // the transport's resends ran out: the peer did not acknowledge (dead, cut off)
  Failed,   // another transport error
};

// The one mapping of a completion's status to the library's codes: what a failed completion
// closes its connection with (IBMSG_ECONNRESET for a flushed one: the queue pair was reset;
// IBMSG_ETIMEDOUT when the resends ran out) ...
inline int wc_error(WcStatus st) {
  switch (st) {
    case WcStatus::Ok: return IBMSG_OK;
    case WcStatus::Flushed: return IBMSG_ECONNRESET;
    case WcStatus::RemoteAccess: return IBMSG_EREMOTEACCESS;
    case WcStatus::Timeout: return IBMSG_ETIMEDOUT;
    default: return IBMSG_EIO;
  }
}
// ... and what the work request's own callback reports (a flushed one was canceled).
inline int wc_work_status(WcStatus st) {
  return st == WcStatus::Flushed ? IBMSG_ECANCELED : wc_error(st);
}

struct Completion {
  WorkCtx *ctx;
  WcStatus status;
  bool has_imm;
  uint32_t imm;   // host byte order
  uint32_t len;   // bytes received (receives only)
  bool write_imm; // a receive consumed by the peer's RDMA write with immediate (len: bytes written)
  uint32_t qp_num;  // the queue pair it is of (a receive from a shared receive queue names no
                    // connection of its own: qp_num says whose message it took)
  const char *status_text;  // a failed one: the driver's words for its status (for logs)
};

// --- devices --------------------------------------------------------------------------------

// An opaque key naming an RDMA device as a CM id found it (equal keys: the same device).
using DeviceKey = const void *;

struct DeviceInfo {
  char name[64];
  bool iwarp;            // iWARP delivers no immediate data: ibmsg cannot run on it
  uint32_t max_qp_wr;    // largest queue a QP may have
  uint32_t max_cqe;
  uint32_t max_rd_atom;       // RDMA reads / atomics a QP may serve at once (as responder)
  uint32_t max_init_rd_atom;  // ... and issue at once
  bool atomics;               // compare-and-swap and fetch-and-add work
  uint64_t max_msg_size;      // largest single message or RDMA read (the port's max_msg_sz)
  uint32_t max_srq_wr;        // largest shared receive queue (0: the device has none)
  bool mw_type2;              // type-2 memory windows: a remote key bound to one queue pair
};

// A device as used by one loop: a completion channel (one fd) shared by the completion queues
// created on it, and the device's protection domain (Domain), which it shares with the other
// loops' device objects on the same device.
struct Device;
int device_open(DeviceKey key, Device **out);
// Everything created on the device object (CQs, queues, windows, registrations made with
// mr_register(Device *)) must be gone. Its domain stays while others hold it. removed: the
// device went away: the domain is not given to a device object opened later, and when its last
// holder lets go rdma-core rescans its devices (devices_rescan). Returns whether the domain lives
// on (then the rescan is not due yet).
bool device_close(Device *dev, bool removed = false);
int device_fd(const Device *dev);  // non-blocking; readable when a CQ on the device signalled
const DeviceInfo &device_info(const Device *dev);
// Reads a pending completion-channel event (one per call in rdma-core's transport: the fd stays
// readable while more wait), acknowledges it and calls ready(cq_user, arg) for its CQ. The CQ is
// not re-armed: the core arms it (cq_arm) when it wants the next event, and then polls it once
// more, so that a completion that arrived before the arming is still found. IBMSG_OK also when
// there was none; an error when the channel failed (a removed device's stays readable): no event
// comes through it again.
int device_take_events(Device *dev, void (*ready)(void *cq_user, void *arg), void *arg);

// Whether the device has gone from the system's device list (it is being removed).
bool device_gone(const Device *dev);
// rdma-core keeps a removed device open until it rescans its device list: this rescans, so that
// a removed device nothing uses any more is closed and its removal can complete.
void devices_rescan();

// --- completion queues ----------------------------------------------------------------------

struct Cq;
// An armed CQ with room for depth completions; user comes back from device_take_events().
int cq_create(Device *dev, uint32_t depth, void *user, Cq **out);
void cq_destroy(Cq *cq);
// Room for depth completions (more than it has); on failure it is as before.
int cq_resize(Cq *cq, uint32_t depth);
// Asks for one completion-channel event at the next completion.
int cq_arm(Cq *cq);
// Up to max completions; returns their number, or a negative value on a device error.
int cq_poll(Cq *cq, Completion *out, int max);

// The protection domain of an RDMA device: one per device in the process, shared by the device
// objects of every loop on it, so that a registration made on it (mr_register(Domain *)) works
// on the queue pairs of all of them. Reference-counted; these calls are for any thread.
struct Domain;
Domain *device_domain(const Device *dev);  // the device object holds a reference
void domain_hold(Domain *dom);
void domain_release(Domain *dom);  // the last reference deallocates it

struct Mr;

// --- shared receive queues -----------------------------------------------------------------

// One queue of receive buffers that every queue pair created with it (QpCaps::srq) takes its
// receives from, in posting order. Destroying a queue pair leaves the buffers it did not take in
// the shared queue; the ones it took complete (flushed if it went to the error state first).
struct Srq;
int srq_create(Device *dev, uint32_t max_wr, Srq **out);
void srq_destroy(Srq *srq);  // no queue pair may still use it
// Posted at once (not batched with a queue pair's post_flush).
int srq_post_recv(Srq *srq, WorkCtx *ctx, void *buf, uint32_t len, const Mr *mr);

// --- memory ---------------------------------------------------------------------------------

enum Access : unsigned {
  kLocal = 0,                 // local read and write
  kRemoteRead = 1u << 0,
  kRemoteWrite = 1u << 1,
  kRemoteAtomic = 1u << 2,
  kLocalReadOnly = 1u << 3,   // no local write (read-only memory); not with remote write/atomic
  kMwBind = 1u << 4,          // memory windows may be bound over it (post_bind)
};

struct Mr;
int mr_register(Device *dev, void *addr, size_t len, unsigned access, Mr **out);
// On the domain itself (any thread): usable on the queue pairs of every device object of it;
// the caller holds a reference on the domain while the registration lives.
int mr_register(Domain *dom, void *addr, size_t len, unsigned access, Mr **out);
void mr_deregister(Mr *mr);
uint32_t mr_lkey(const Mr *mr);
uint32_t mr_rkey(const Mr *mr);

// A type-2 memory window (DeviceInfo::mw_type2): a remote key that a bind ties to one queue pair
// and to a registration's bytes; a peer on any other queue pair of the protection domain that
// uses it gets a remote access error.
struct Mw;
int mw_alloc(Device *dev, Mw **out);
// Invalidates it, bound or not, and frees it. A bind of it still in flight would fail and take
// its queue pair to the error state: wait for the bind's completion first.
void mw_dealloc(Mw *mw);

// --- connection manager ---------------------------------------------------------------------

struct CmChannel;  // the event channel of one loop
struct CmId;       // one listening or connecting endpoint

int cm_channel_create(CmChannel **out);
void cm_channel_destroy(CmChannel *ch);
int cm_channel_fd(const CmChannel *ch);  // non-blocking

enum class CmEventType : uint8_t {
  AddrResolved,
  AddrError,
  RouteResolved,
  RouteError,
  ConnectRequest,
  Established,
  Rejected,
  Unreachable,
  ConnectError,
  Disconnected,
  DeviceRemoval,
  Other,  // events ibmsg has no use for (TIMEWAIT_EXIT, ADDR_CHANGE, ...)
};

inline const char *cm_event_name(CmEventType t) {
  static const char *const names[] = {"ADDR_RESOLVED", "ADDR_ERROR", "ROUTE_RESOLVED",
                                      "ROUTE_ERROR", "CONNECT_REQUEST", "ESTABLISHED",
                                      "REJECTED", "UNREACHABLE", "CONNECT_ERROR",
                                      "DISCONNECTED", "DEVICE_REMOVAL", "OTHER"};
  return unsigned(t) < sizeof names / sizeof *names ? names[unsigned(t)] : "?";
}

constexpr size_t kPrivateDataMax = 256;
constexpr int kRejectConsumer = 28;  // status of a rejection the peer's application made

struct CmEvent {
  CmEventType type;
  int status;          // the raw CM status (negative errno, or the IB reject reason)
  CmId *id;            // for ConnectRequest: the new id (its user is the listener's until set)
  CmId *listen_id;     // for ConnectRequest
  uint8_t pdata[kPrivateDataMax];
  size_t plen;
};

// One event, copied out and acknowledged (so destroying its id never waits). Returns 0, or
// IBMSG_EAGAIN when there is none.
int cm_get_event(CmChannel *ch, CmEvent *out);

int cm_id_create(CmChannel *ch, void *user, CmId **out);
void cm_id_destroy(CmId *id);  // destroys its QP too, if any
void *cm_id_user(const CmId *id);
void cm_id_set_user(CmId *id, void *user);
// Moves the id's events to another channel (another loop's): its later events come there. Any
// thread; the id must have no event waiting for an acknowledgement (cm_get_event acknowledges each
// one before it returns). IBMSG_ESYS if the CM refuses.
int cm_migrate(CmId *id, CmChannel *to);

int cm_bind(CmId *id, const sockaddr *addr);
int cm_listen(CmId *id, int backlog);
int cm_resolve_addr(CmId *id, const sockaddr *src, const sockaddr *dst, int timeout_ms);
int cm_resolve_route(CmId *id, int timeout_ms);

// What connect and accept carry: ibmsg's hello and the transport's retry settings.
struct ConnParam {
  const void *pdata;
  uint8_t plen;
  uint8_t retry_count;
  uint8_t rnr_retry_count;
  uint8_t responder_resources;  // RDMA reads/atomics the peer may have outstanding to us
  uint8_t initiator_depth;      // ... and we to the peer
  uint8_t ack_timeout = 0;      // of the QP: 4.096 us * 2^ack_timeout; 0: the CM's default
};
// For cm_accept: as many as the connecting side asked for and the device allows.
constexpr uint8_t kMaxRdAtomic = 0xff;
int cm_connect(CmId *id, const ConnParam &p);
int cm_accept(CmId *id, const ConnParam &p);
int cm_reject(CmId *id, const void *pdata, uint8_t plen);
int cm_disconnect(CmId *id);
// The accepting side's data arrived before the CM's Established event (the connecting side's
// RTU is late or lost): tells the CM the connection is up (rdma_notify, IB COMM_EST), else it
// times the connection out underneath although data flows.
void cm_notify_established(CmId *id);

// The device the id is bound to, or nullptr before address resolution (or for a wildcard
// listener).
DeviceKey cm_device(const CmId *id);
const char *cm_device_name(const CmId *id);  // nullptr without a device
const sockaddr *cm_local_addr(const CmId *id);
const sockaddr *cm_peer_addr(const CmId *id);

// --- queue pairs ----------------------------------------------------------------------------

struct QpCaps {
  uint32_t send_wrs;
  uint32_t recv_wrs;  // unused with srq
  uint32_t max_inline;  // requested; the transport stores what the device granted
  Srq *srq = nullptr;   // receives from this shared queue (nullptr: a receive queue of its own)
};
// A reliable-connected QP on the id, both queues completing on cq. IBMSG_ECONNRESET when the CM
// no longer takes a QP on the id (a request whose connecting side gave up).
int qp_create(CmId *id, Device *dev, Cq *cq, QpCaps *caps);
void qp_destroy(CmId *id);
uint32_t qp_num(const CmId *id);  // its number (what Completion::qp_num says); 0 without a QP

// Work requests are queued on the QP and go to the device together, one list for the receives
// (post_recv), then one for the send queue (post_send_imm, post_rdma), at post_flush (or when a
// chain is full, which an error from the queuing call reports). Nothing reaches the device before
// post_flush. An error from post_flush means some
// of them may not have been posted: the core closes the connection. qp_destroy drops what was not
// flushed. Completions: they come in posting order. Of the data messages (Op::Send) of one flush
// between one-sided operations only the last is signaled: a successful completion of a Send
// stands for every Send posted before it that has not completed yet (no operation is among them).
// Credit-only messages (Op::Ctrl) are signaled unless a later data message's completion stands
// for them (WorkCtx::carried); one-sided operations and rendezvous FINs are always signaled. A failed or
// flushed work request always completes, signaled or not.
int post_flush(CmId *id);

int post_recv(CmId *id, WorkCtx *ctx, void *buf, uint32_t len, const Mr *mr);

// A SEND with immediate data (host byte order); len may be 0 (buf and mr are then unused). A
// tail (its len > 0) follows the payload from memory of its own (a second scatter/gather
// element). Payloads up to the granted max_inline, tail included, are sent inline.
struct Segment {
  const void *buf;
  uint32_t len;
  const Mr *mr;
};
int post_send_imm(CmId *id, WorkCtx *ctx, const void *buf, uint32_t len, const Mr *mr,
                  uint32_t imm, uint32_t max_inline, const Segment *tail = nullptr);
// The immediate (host order) of the last work request queued on id and not flushed yet, if it is
// a data message's SEND (Op::Send): what became due after its posting may still ride on it.
// false otherwise (nothing queued, or the last is another kind). set_pending_imm replaces it.
bool pending_imm(CmId *id, uint32_t *imm);
void set_pending_imm(CmId *id, uint32_t imm);

// A one-sided operation; ctx->op says which (RdmaWrite, RdmaRead or RndvRead, WriteImm, Atomic).
struct RdmaWr {
  void *local;        // local bytes (source of a write, destination of a read / atomic result)
  uint32_t len;       // bytes (8 for atomics)
  const Mr *mr;       // registration of the local bytes
  uint64_t remote;    // the peer's address
  uint32_t rkey;
  uint32_t imm;       // WriteImm: the immediate (host byte order)
  bool cas;           // Atomic: compare-and-swap (else fetch-and-add)
  uint64_t compare_add;  // Atomic: compare value, or the addend
  uint64_t swap;
};
// Writes of up to max_inline bytes go inline.
int post_rdma(CmId *id, WorkCtx *ctx, const RdmaWr &w, uint32_t max_inline);

// The key mw gets at its next bind: its 8 low bits (the part a consumer may choose) new and
// random.
uint32_t mw_next_key(const Mw *mw);
// Binds mw (ctx->op Bind) to the id's queue pair over the bytes [addr, addr + len) of mr (a
// registration with kMwBind) with the remote rights in access (kRemote*) and the key rkey (from
// mw_next_key), in send-queue order: work requests posted after it reach the peer after the
// window is valid.
int post_bind(CmId *id, WorkCtx *ctx, Mw *mw, const Mr *mr, void *addr, size_t len,
              unsigned access, uint32_t rkey);

// Whether the id's queue pair is in the error state. The core asks while the connection is up
// and it has not disconnected: then nothing of its own failed, so the queue pair refused a
// request of the peer (a remote access with a bad key, range or right, or a malformed request),
// which is all a responder learns of it on Soft-RoCE (no completion, no asynchronous event).
bool qp_failed(CmId *id);

}  // namespace ibmsg::tp
