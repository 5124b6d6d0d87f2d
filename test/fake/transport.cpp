// transport.cpp - an in-process fake of the transport layer (src/transport/transport.hpp) for
// host-side tests of the core: one fabric of CM ids, queue pairs and completion queues in this
// process, with the rdma-core semantics the core relies on (fake.hpp lists them) and checks for
// what real rdma-core would refuse. Single-threaded, like the loops that use it.
#include "transport/transport.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <utility>
#include <vector>

#include "fake.hpp"
#include "ibmsg.h"

namespace ibmsg::tp {

struct Qp;

// The protection domain of the fake device, shared by the loops' device objects open on it, as
// rdma-core's transport shares one per device in the process (a raw peer has its own).
struct Domain {
  int refs = 0;
  int mrs = 0;  // registrations on it (through any device object, or itself)
  bool gone = false;  // its device was removed: a later device object gets another
};

struct Device {
  int fd;
  Domain *dom;
  DeviceInfo info;
  std::vector<Cq *> signalled;          // CQs with an event not yet taken
  std::vector<Cq *> *taking = nullptr;  // the list device_take_events is calling back for
  int cqs = 0;
  int mrs = 0;
  int srqs = 0;
  int mws = 0;
  bool gone = false;  // removed: its fd stays readable and reading it fails, as rdma-core's
};

struct Srq;
struct Cqe {
  Completion wc;
  Qp *qp;
  Srq *srq;  // a receive taken from a shared receive queue: its slot there is freed when polled
  bool send;
  uint32_t retire;  // send-queue slots it frees: itself and the unsignaled ones before it
};

struct Cq {
  Device *dev;
  void *user;
  uint32_t depth;
  std::deque<Cqe> q;
  bool armed = true;
  bool signalled = false;
  int qps = 0;
  unsigned long arms = 0;     // successful cq_arm calls
  unsigned long signals = 0;  // completions that signalled the device
  unsigned long taken = 0;    // its events read by device_take_events
};

constexpr uint32_t kMrMagic = 0x4d52f4e3;

struct Mr {
  uint32_t magic;
  Domain *dom;
  Device *dev;  // the device object it was registered through; nullptr: the domain itself
  uint8_t *addr;
  size_t len;
  unsigned access;  // tp::Access flags
  uint32_t lkey, rkey;
  int mws = 0;  // windows bound over it
};

constexpr uint32_t kMwMagic = 0x4d57f4e3;

// A type-2 memory window: valid once a bind on a QP executed; then its key works on that QP
// only, on [addr, addr + len) with its rights, while its registration lives.
struct Mw {
  uint32_t magic;
  Device *dev;
  uint32_t rkey;
  bool valid = false;
  Qp *qp = nullptr;
  Mr *mr = nullptr;
  uint64_t addr = 0;
  size_t len = 0;
  unsigned access = 0;
  int binding = 0;  // binds posted, not yet executed
};

struct CmChannel {
  int fd;
  std::deque<CmEvent> events;
  int ids = 0;
};

enum class IdState {
  Idle,
  Bound,
  Listening,
  AddrResolved,
  RouteResolved,
  Connecting,  // request sent
  ReqRcvd,     // passive side, undecided
  Connected,
  Disconnected,
  Rejected,
};

struct CmId {
  CmChannel *ch;
  void *user;
  IdState state = IdState::Idle;
  sockaddr_storage local{}, peer{};
  bool has_local = false, has_peer = false, has_dev = false;
  unsigned short port = 0;  // bound (in the fabric's port table)
  CmId *remote = nullptr;   // the other end of a connection or request
  Qp *qp = nullptr;
  bool got_disconnected = false;
  uint8_t req_responder_resources = 0;  // a request's: what its connector asked for
  uint8_t req_initiator_depth = 0;
};

struct RecvWr {
  WorkCtx *ctx;
  uint8_t *buf;
  uint32_t len;
};

// A work request of the send queue: a SEND, or a one-sided operation (rdma: ctx->op says which).
struct SendWr {
  WorkCtx *ctx;
  std::vector<uint8_t> data;  // a SEND's payload, or the bytes of an RDMA write (taken at posting)
  bool has_imm = false;
  uint32_t imm = 0;
  bool rdma = false;
  RdmaWr rw{};
  Mw *bind = nullptr;  // a window's bind: its key, registration and range follow
  bool bind_dead = false;  // a bind whose window went (its QP was in the error state)
  uint32_t bind_key = 0;
  Mr *bind_mr = nullptr;
  uint64_t bind_addr = 0;
  size_t bind_len = 0;
  unsigned bind_access = 0;
  bool signaled = true;  // set at post_flush
};

// A delivered send whose completion is delayed.
struct SendAck {
  WorkCtx *ctx;
  bool signaled;
};

// A shared receive queue: its posted receives, taken in order by whichever QP gets a message.
struct Srq {
  Device *dev;
  uint32_t max_wr;
  std::deque<RecvWr> rq;
  uint32_t unpolled = 0;  // taken receives whose completion is not polled yet
  int qps = 0;
};

struct Qp {
  CmId *id;
  Device *dev;
  Cq *cq;
  QpCaps caps;
  Srq *srq = nullptr;  // receives from it (caps.srq) instead of rq
  uint32_t num = 0;
  bool rts = false;
  bool error = false;
  bool refused = false;  // it went to the error state refusing a request of the peer
  std::deque<RecvWr> rq;       // posted receives
  std::deque<SendWr> pending;  // queued for the next post_flush
  std::deque<RecvWr> pending_rq;  // likewise
  std::deque<SendWr> sq;       // posted sends and operations not yet executed (in flight)
  std::deque<SendAck> acks;    // delivered sends whose completion is delayed
  uint32_t unsignaled_done = 0;  // unsignaled sends completed since the last send CQE
  uint32_t recv_unpolled = 0;  // receive slots whose completion is not polled yet
  uint32_t send_unpolled = 0;  // send slots likewise (in flight ones included)
};

namespace {

const char g_device_key = 0;
constexpr uint32_t kMaxInline = 64;
constexpr size_t kReqPdata = 56;
constexpr size_t kRepPdata = 196;
constexpr size_t kRejPdata = 148;
constexpr int kRejInvalidServiceId = 8;
constexpr int kCalls = int(fake::Call::PostBind) + 1;
constexpr uint32_t kMaxRdAtom = 16;  // reads / atomics a QP serves and issues at once

struct Injection {
  bool armed = false;
  int code = 0;
  unsigned skip = 0;
};

struct Fabric {
  fake::Stats stats{};
  fake::Counts counts{};
  bool iwarp = false;
  bool paused = false;
  bool hold_est = false;
  bool delay_acks = false;
  unsigned short delay_port = 0;  // 0: every QP
  bool removed = false;
  bool atomics = true;                // devices opened from now on offer atomics
  uint32_t max_cqe = 4194303;         // ... and CQs that large
  uint64_t max_msg = uint64_t(1) << 20;  // ... and messages / reads that large (1 MiB)
  std::vector<CmId *> ids;  // every id (for device removal)
  std::vector<Device *> devices;  // open devices (for device removal)
  Domain *domain = nullptr;       // the device's protection domain while one is open
  std::map<unsigned short, CmId *> ports;
  std::vector<Qp *> qps;
  std::map<uint32_t, Mr *> rkeys;  // every live registration by its remote key
  std::map<uint32_t, Mw *> windows;  // every live window by its index (key >> 8)
  uint32_t next_mw = 0x800000;       // window indexes: apart from registration keys
  bool mw_type2 = true;              // devices opened from now on have type-2 windows
  fake::PathWatch watch;             // fake::watch_path
  std::vector<fake::Post> posts;   // the core's posts to send queues, in order
  std::vector<std::pair<CmId *, CmEvent>> held;  // Established events held back
  Injection inj[kCalls];
  std::function<void()> arm_hook;  // fake::before_cq_arm
  const Cq *arm_hook_cq = nullptr;
  int raw = 0;  // > 0 while a raw peer calls
  unsigned short next_port = 20000;
  unsigned short next_ephemeral = 50000;
  uint32_t next_key = 0x100;
  uint32_t next_qpn = 0x11;
  uint32_t max_srq_wr = 0;  // devices opened from now on (0: no shared receive queues)
};

Fabric g;

void misuse(const char *fmt, ...) {
  char buf[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  if (g.stats.misuses++ == 0) g.stats.first_misuse = buf;
  fprintf(stderr, "fake transport: misuse: %s\n", buf);
}

int injected(fake::Call c) {
  if (g.raw) return 0;
  Injection &i = g.inj[int(c)];
  if (!i.armed) return 0;
  if (i.skip) {
    --i.skip;
    return 0;
  }
  i.armed = false;
  return i.code;
}

void fd_signal(int fd) {
  uint64_t one = 1;
  ssize_t n = write(fd, &one, sizeof one);
  (void)n;
}

void fd_drain(int fd) {
  uint64_t v;
  ssize_t n = read(fd, &v, sizeof v);
  (void)n;
}

int new_eventfd() { return eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC); }

// --- addresses ---

unsigned short port_of(const sockaddr_storage &a) {
  if (a.ss_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in &>(a).sin_port);
  if (a.ss_family == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6 &>(a).sin6_port);
  return 0;
}

void set_port(sockaddr_storage *a, unsigned short port) {
  if (a->ss_family == AF_INET) reinterpret_cast<sockaddr_in *>(a)->sin_port = htons(port);
  if (a->ss_family == AF_INET6) reinterpret_cast<sockaddr_in6 *>(a)->sin6_port = htons(port);
}

bool copy_addr(const sockaddr *sa, sockaddr_storage *out) {
  memset(out, 0, sizeof *out);
  if (!sa) return false;
  if (sa->sa_family == AF_INET) memcpy(out, sa, sizeof(sockaddr_in));
  else if (sa->sa_family == AF_INET6) memcpy(out, sa, sizeof(sockaddr_in6));
  else return false;
  return true;
}

bool is_wildcard(const sockaddr_storage &a) {
  if (a.ss_family == AF_INET)
    return reinterpret_cast<const sockaddr_in &>(a).sin_addr.s_addr == htonl(INADDR_ANY);
  return IN6_IS_ADDR_UNSPECIFIED(&reinterpret_cast<const sockaddr_in6 &>(a).sin6_addr);
}

bool unreachable(const sockaddr_storage &a) {  // TEST-NET-1
  if (a.ss_family != AF_INET) return false;
  return (ntohl(reinterpret_cast<const sockaddr_in &>(a).sin_addr.s_addr) & 0xffffff00u) ==
         0xc0000200u;
}

void loopback(int family, sockaddr_storage *out) {
  memset(out, 0, sizeof *out);
  out->ss_family = sa_family_t(family);
  if (family == AF_INET)
    reinterpret_cast<sockaddr_in *>(out)->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  else reinterpret_cast<sockaddr_in6 *>(out)->sin6_addr = in6addr_loopback;
}

// --- CM events ---

CmEvent make_event(CmEventType type, CmId *id, int status, const void *pdata, size_t plen,
                   size_t pad) {
  CmEvent ev;
  memset(&ev, 0, sizeof ev);
  ev.type = type;
  ev.id = id;
  ev.status = status;
  if (plen > kPrivateDataMax) plen = kPrivateDataMax;
  if (plen) memcpy(ev.pdata, pdata, plen);
  ev.plen = plen > pad ? plen : pad;  // IB carries the whole private data field, zero-padded
  return ev;
}

void push_event(CmChannel *ch, const CmEvent &ev) {
  ch->events.push_back(ev);
  fd_signal(ch->fd);
}

void push_disconnected(CmId *id) {
  if (id->got_disconnected) return;
  id->got_disconnected = true;
  push_event(id->ch, make_event(CmEventType::Disconnected, id, 0, nullptr, 0, 0));
}

void reject_connector(CmId *c, int status, const void *pdata, size_t plen, size_t pad) {
  if (!c || c->state != IdState::Connecting) return;
  c->state = IdState::Rejected;
  c->remote = nullptr;
  push_event(c->ch, make_event(CmEventType::Rejected, c, status, pdata, plen, pad));
}

// --- completions and the wire ---

void cq_push(Cq *c, Qp *qp, bool send, Completion wc, uint32_t retire = 1) {
  if (c->q.size() >= c->depth) misuse("CQ overrun: more than %u completions unpolled", c->depth);
  wc.qp_num = qp->num;
  Srq *srq = send ? nullptr : qp->srq;
  if (srq) ++srq->unpolled;
  c->q.push_back(Cqe{wc, qp, srq, send, retire});
  if (!c->armed) return;
  c->armed = false;
  ++c->signals;
  ++g.stats.cq_signals;
  if (!c->signalled) {
    c->signalled = true;
    c->dev->signalled.push_back(c);
  }
  fd_signal(c->dev->fd);
}

void complete_recv(Qp *q, WorkCtx *ctx, WcStatus st, bool has_imm = false, uint32_t imm = 0,
                   uint32_t len = 0, bool write_imm = false) {
  if (!q->srq) ++q->recv_unpolled;
  cq_push(q->cq, q, false,
          Completion{ctx, st, has_imm, has_imm ? imm : 0, len, write_imm, 0, nullptr});
}

// An unsignaled send that succeeded makes no completion: its slot in the send queue is freed
// with the next completion polled (as on a real device).
void complete_send(Qp *q, WorkCtx *ctx, WcStatus st, bool signaled = true) {
  if (st == WcStatus::Ok && !signaled) {
    ++q->unsignaled_done;
    return;
  }
  ++g.stats.send_cqes;
  if (st == WcStatus::Ok && ctx->op == Op::Ctrl) ++g.stats.ctrl_cqes;
  uint32_t retire = 1 + q->unsignaled_done;
  q->unsignaled_done = 0;
  cq_push(q->cq, q, true, Completion{ctx, st, false, 0, 0, false, 0, nullptr}, retire);
}

// Moves a QP to the error state: everything posted completes as flushed, in order.
void qp_error(Qp *q) {
  if (q->error) return;
  q->error = true;
  while (!q->rq.empty()) {
    RecvWr r = q->rq.front();
    q->rq.pop_front();
    complete_recv(q, r.ctx, WcStatus::Flushed);
  }
  while (!q->acks.empty()) {  // delivered, but the sender never learned it
    WorkCtx *ctx = q->acks.front().ctx;
    q->acks.pop_front();
    complete_send(q, ctx, WcStatus::Flushed);
  }
  while (!q->sq.empty()) {
    WorkCtx *ctx = q->sq.front().ctx;
    q->sq.pop_front();
    complete_send(q, ctx, WcStatus::Flushed);
  }
}

// Where q's incoming messages and writes with immediate take their receives from.
std::deque<RecvWr> &recvq(Qp *q) { return q->srq ? q->srq->rq : q->rq; }

Qp *peer_qp(const Qp *q) { return q->id && q->id->remote ? q->id->remote->qp : nullptr; }

// The responder acknowledged or answered a later work request: the delivered ones whose
// completion lagged are acknowledged with it (a send queue completes in order).
void settle_acks(Qp *s) {
  while (!s->acks.empty()) {
    SendAck a = s->acks.front();
    s->acks.pop_front();
    complete_send(s, a.ctx, WcStatus::Ok, a.signaled);
  }
}

// The head of s's send queue failed with st (the responder refused it): it completes with st
// after everything before it, and both QPs go to the error state, as on an RC connection.
void fail_head(Qp *s, Qp *d, WcStatus st) {
  WorkCtx *ctx = s->sq.front().ctx;
  s->sq.pop_front();
  settle_acks(s);
  complete_send(s, ctx, st);
  qp_error(s);
  if (st == WcStatus::RemoteAccess && !d->error) d->refused = true;
  qp_error(d);
}

// The registration on d's device (protection domain) that rkey names, if it allows right on
// [addr, addr + len); nullptr otherwise (a remote access error).
// A window's key works on the QP it is bound to only, within the window and its registration.
Mr *remote_mr(const Qp *d, uint64_t addr, uint32_t len, uint32_t rkey, unsigned right) {
  auto w = g.windows.find(rkey >> 8);
  if (w != g.windows.end()) {
    const Mw *mw = w->second;
    if (!mw->valid || mw->rkey != rkey || mw->qp != d || !(mw->access & right)) return nullptr;
    if (addr < mw->addr || addr - mw->addr > mw->len || len > mw->len - (addr - mw->addr))
      return nullptr;
    return mw->mr;
  }
  auto it = g.rkeys.find(rkey);
  if (it == g.rkeys.end()) return nullptr;
  Mr *m = it->second;
  if (m->dom != d->dev->dom || !(m->access & right)) return nullptr;
  uint64_t start = reinterpret_cast<uintptr_t>(m->addr);
  if (addr < start || addr - start > m->len || len > m->len - (addr - start)) return nullptr;
  return m;
}

// A bind at the head of s's send queue: a local operation, done when it is reached.
void execute_bind(Qp *s, SendWr &w) {
  Mw *mw = w.bind;
  --mw->binding;
  mw->valid = true;
  mw->qp = s;
  mw->rkey = w.bind_key;
  if (mw->mr != w.bind_mr) {
    if (mw->mr) --mw->mr->mws;
    ++w.bind_mr->mws;
  }
  mw->mr = w.bind_mr;
  mw->addr = w.bind_addr;
  mw->len = w.bind_len;
  mw->access = w.bind_access;
  ++g.stats.binds;
}

const char *op_name(Op op) {
  switch (op) {
    case Op::RdmaWrite: return "RDMA write";
    case Op::RdmaRead: return "RDMA read";
    case Op::RndvRead: return "rendezvous read";
    case Op::WriteImm: return "RDMA write with immediate";
    case Op::Atomic: return "atomic";
    default: return "work request";
  }
}

// Executes the one-sided operation at the head of s's send queue on its peer d (the receive it
// needs, for a write with immediate, is there). false if it failed (both QPs are in error then).
bool execute_rdma(Qp *s, Qp *d, SendWr &w) {
  const RdmaWr &rw = w.rw;
  const Op op = w.ctx->op;
  const unsigned right = op == Op::RdmaRead || op == Op::RndvRead ? kRemoteRead
                         : op == Op::Atomic ? kRemoteAtomic
                                            : kRemoteWrite;
  // A zero-length write or read checks no key (as IB does); atomics always do.
  if (rw.len || op == Op::Atomic) {
    if (!remote_mr(d, rw.remote, rw.len, rw.rkey, right)) {
      ++g.stats.remote_access_errors;
      fprintf(stderr, "fake transport: remote access error: %s of %u bytes at 0x%llx, rkey 0x%x\n",
              op_name(op), rw.len, (unsigned long long)rw.remote, rw.rkey);
      fail_head(s, d, WcStatus::RemoteAccess);
      return false;
    }
  }
  auto *target = reinterpret_cast<uint8_t *>(uintptr_t(rw.remote));
  switch (op) {
    case Op::RdmaWrite:
    case Op::WriteImm:
      if (!w.data.empty()) memcpy(target, w.data.data(), w.data.size());
      if (op == Op::WriteImm) {
        RecvWr r = recvq(d).front();
        recvq(d).pop_front();
        complete_recv(d, r.ctx, WcStatus::Ok, true, rw.imm, rw.len, true);
      }
      break;
    case Op::RdmaRead:
    case Op::RndvRead:
      if (rw.len) memcpy(rw.local, target, rw.len);
      break;
    case Op::Atomic: {
      if (rw.remote % 8 != 0) {  // a remote invalid request: the caller checks alignment
        misuse("an atomic on the unaligned remote address 0x%llx", (unsigned long long)rw.remote);
        fail_head(s, d, WcStatus::Failed);
        return false;
      }
      uint64_t old, now;
      memcpy(&old, target, 8);
      now = rw.cas ? (old == rw.compare_add ? rw.swap : old) : old + rw.compare_add;
      memcpy(target, &now, 8);
      memcpy(rw.local, &old, 8);
      break;
    }
    default: break;
  }
  ++g.stats.rdma_ops;
  return true;
}

// Delivers what q has in flight, in order, as far as the peer can take it.
void deliver(Qp *s) {
  while (!g.paused && !s->error && s->rts && !s->sq.empty()) {
    Qp *d = peer_qp(s);
    if (!d || d->error || !d->rts) return;  // nobody answers: stays in flight
    SendWr &w = s->sq.front();
    if (w.bind || w.bind_dead) {
      if (w.bind) execute_bind(s, w);
      SendAck a{w.ctx, w.signaled};
      s->sq.pop_front();
      if (!s->acks.empty()) s->acks.push_back(a);
      else complete_send(s, a.ctx, WcStatus::Ok, a.signaled);
      continue;
    }
    const bool needs_recv = !w.rdma || w.ctx->op == Op::WriteImm;
    if (needs_recv && recvq(d).empty()) {
      ++g.stats.rnr_errors;
      fprintf(stderr, "fake transport: RNR: a %s found no posted receive\n",
              w.rdma ? "write with immediate" : "send");
      fail_head(s, d, WcStatus::Failed);
      return;
    }
    if (w.rdma) {
      if (!execute_rdma(s, d, w)) return;
    } else {
      RecvWr r = recvq(d).front();
      recvq(d).pop_front();
      if (w.data.size() > r.len) {
        ++g.stats.length_errors;
        fprintf(stderr, "fake transport: a %zu-byte send into a %u-byte receive buffer\n",
                w.data.size(), r.len);
        complete_recv(d, r.ctx, WcStatus::Failed);
        fail_head(s, d, WcStatus::Failed);
        return;
      }
      if (!w.data.empty()) memcpy(r.buf, w.data.data(), w.data.size());
      complete_recv(d, r.ctx, WcStatus::Ok, w.has_imm, w.imm, uint32_t(w.data.size()));
      ++g.stats.delivered;
    }
    SendAck a{w.ctx, w.signaled};
    s->sq.pop_front();
    bool delay = g.delay_acks && (!g.delay_port || port_of(s->id->local) == g.delay_port);
    if (delay || !s->acks.empty()) s->acks.push_back(a);  // completions stay in order
    else complete_send(s, a.ctx, WcStatus::Ok, a.signaled);
  }
}

bool check_mr(const Qp *q, const Mr *mr, const void *buf, uint32_t len) {
  if (!mr || mr->magic != kMrMagic) {
    misuse("a work request without a valid memory registration");
    return false;
  }
  if (mr->dom != q->dev->dom) {
    misuse("a buffer registered on another device's protection domain");
    return false;
  }
  auto p = static_cast<const uint8_t *>(buf);
  if (!p || p < mr->addr || p + len > mr->addr + mr->len) {
    misuse("a buffer outside its memory registration");
    return false;
  }
  return true;
}

void record_post(const Qp *q, Op op, uint32_t len, bool inlined) {
  if (!g.raw) g.posts.push_back(fake::Post{port_of(q->id->local), op, len, inlined});
}

int post_send(CmId *id, WorkCtx *ctx, const void *buf, uint32_t len, const Mr *mr, bool has_imm,
              uint32_t imm, uint32_t max_inline, const Segment *tail = nullptr) {
  if (int err = injected(fake::Call::PostSend)) return err;
  Qp *q = id->qp;
  if (!q) {
    misuse("post_send on an id without a QP");
    return IBMSG_EIO;
  }
  if (!ctx) {
    misuse("post_send without a work request context");
    return IBMSG_EINVAL;
  }
  if (max_inline > q->caps.max_inline) {
    misuse("post_send with max_inline %u beyond the %u granted", max_inline, q->caps.max_inline);
    return IBMSG_EIO;
  }
  const uint32_t tail_len = tail ? tail->len : 0;
  const uint32_t total = len + tail_len;
  if (len && total > max_inline && !check_mr(q, mr, buf, len)) return IBMSG_EIO;
  if (tail_len && total > max_inline && !check_mr(q, tail->mr, tail->buf, tail_len))
    return IBMSG_EIO;
  if ((len && !buf) || (tail_len && !tail->buf)) {
    misuse("post_send of %u + %u bytes without a buffer", len, tail_len);
    return IBMSG_EIO;
  }
  if (q->send_unpolled >= q->caps.send_wrs) {
    misuse("send queue overflow: %u work requests outstanding", q->send_unpolled);
    return IBMSG_EIO;
  }
  if (!q->rts && !q->error) {
    misuse("post_send before the connection is established");
    return IBMSG_EIO;
  }
  record_post(q, ctx->op, total, total && total <= max_inline);
  ++q->send_unpolled;
  SendWr w;
  w.ctx = ctx;
  if (len)
    w.data.assign(static_cast<const uint8_t *>(buf), static_cast<const uint8_t *>(buf) + len);
  if (tail_len) {
    auto t = static_cast<const uint8_t *>(tail->buf);
    w.data.insert(w.data.end(), t, t + tail_len);
  }
  w.has_imm = has_imm;
  w.imm = imm;
  q->pending.push_back(std::move(w));
  return IBMSG_OK;
}

void destroy_qp(Qp *q) {
  Cq *c = q->cq;
  // As on Soft-RoCE, the QP's completions stay in the CQ (a device like mlx5 removes them): the
  // core must poll them before it frees what their contexts name.
  for (Cqe &e : c->q)
    if (e.qp == q) e.qp = nullptr;
  --c->qps;
  if (q->srq) --q->srq->qps;
  g.qps.erase(std::remove(g.qps.begin(), g.qps.end(), q), g.qps.end());
  --g.counts.qps;
  delete q;
}

}  // namespace

// --- devices ---

int device_open(DeviceKey key, Device **out) {
  if (int err = injected(fake::Call::DeviceOpen)) return err;
  if (key != &g_device_key || g.removed) return IBMSG_ENODEV;
  int fd = new_eventfd();
  if (fd < 0) return IBMSG_ESYS;
  Device *d = new Device();
  d->fd = fd;
  // A raw peer stands for another process: a domain of its own.
  if (g.raw || !g.domain) {
    d->dom = new Domain();
    ++g.counts.domains;
    if (!g.raw) g.domain = d->dom;
  } else {
    d->dom = g.domain;
  }
  ++d->dom->refs;
  snprintf(d->info.name, sizeof d->info.name, "fake0");
  d->info.iwarp = g.iwarp;
  d->info.max_qp_wr = 16384;
  d->info.max_cqe = g.max_cqe;
  d->info.max_rd_atom = kMaxRdAtom;
  d->info.max_init_rd_atom = kMaxRdAtom;
  d->info.atomics = g.atomics;
  d->info.max_msg_size = g.max_msg;
  d->info.max_srq_wr = g.max_srq_wr;
  d->info.mw_type2 = g.mw_type2;
  ++g.counts.devices;
  g.devices.push_back(d);
  *out = d;
  return IBMSG_OK;
}

// Drops a reference (with removed, retires the domain); whether it lives on.
bool domain_put(Domain *x, bool removed) {
  if (removed) {
    x->gone = true;
    if (g.domain == x) g.domain = nullptr;
  }
  if (x->refs <= 0) misuse("a domain released more often than held");
  if (--x->refs > 0) return true;
  if (x->mrs) misuse("the last reference of a domain released with %d registrations", x->mrs);
  if (g.domain == x) g.domain = nullptr;
  if (x->gone) ++g.stats.rescans;  // as rdma-core's transport: the removal completes now
  --g.counts.domains;
  delete x;
  return false;
}

bool device_close(Device *d, bool removed) {
  if (d->cqs || d->mrs || d->srqs || d->mws)
    misuse("device_close with %d CQs, %d memory registrations, %d shared receive queues and %d "
           "memory windows still there", d->cqs, d->mrs, d->srqs, d->mws);
  close(d->fd);
  --g.counts.devices;
  g.devices.erase(std::find(g.devices.begin(), g.devices.end(), d));
  const bool kept = domain_put(d->dom, removed);
  delete d;
  return kept;
}

Domain *device_domain(const Device *d) { return d->dom; }
void domain_hold(Domain *x) { ++x->refs; }
void domain_release(Domain *x) { domain_put(x, false); }

int device_fd(const Device *d) { return d->fd; }
const DeviceInfo &device_info(const Device *d) { return d->info; }

int device_take_events(Device *d, void (*ready)(void *cq_user, void *arg), void *arg) {
  ++g.stats.take_events;
  if (d->gone) return IBMSG_ENODEV;  // the fd stays readable
  fd_drain(d->fd);
  std::vector<Cq *> list;
  list.swap(d->signalled);
  for (Cq *c : list) {
    c->signalled = false;  // the core re-arms with cq_arm
    ++c->taken;
  }
  d->taking = &list;
  for (size_t i = 0; i < list.size(); ++i)
    if (list[i]) ready(list[i]->user, arg);
  d->taking = nullptr;
  return IBMSG_OK;
}

void devices_rescan() { ++g.stats.rescans; }
bool device_gone(const Device *) { return g.removed; }

// --- completion queues ---

int cq_arm(Cq *c) {
  if (int err = injected(fake::Call::CqArm)) return err;
  if (g.arm_hook && (!g.arm_hook_cq || g.arm_hook_cq == c)) {
    std::function<void()> fn = std::move(g.arm_hook);
    g.arm_hook = nullptr;
    g.arm_hook_cq = nullptr;
    fn();
  }
  c->armed = true;
  ++c->arms;
  ++g.stats.cq_arms;
  return IBMSG_OK;
}

int cq_create(Device *d, uint32_t depth, void *user, Cq **out) {
  if (int err = injected(fake::Call::CqCreate)) return err;
  if (depth == 0 || depth > d->info.max_cqe) return IBMSG_EINVAL;
  Cq *c = new Cq();
  c->dev = d;
  c->user = user;
  c->depth = depth;
  ++d->cqs;
  ++g.counts.cqs;
  *out = c;
  return IBMSG_OK;
}

int cq_resize(Cq *c, uint32_t depth) {
  if (depth == 0 || depth > c->dev->info.max_cqe) return IBMSG_EINVAL;
  if (depth < c->q.size()) misuse("cq_resize below the %zu completions it holds", c->q.size());
  ++g.stats.cq_resizes;
  c->depth = depth;
  return IBMSG_OK;
}

void cq_destroy(Cq *c) {
  if (c->qps) misuse("cq_destroy while %d QPs use the CQ", c->qps);
  Device *d = c->dev;
  d->signalled.erase(std::remove(d->signalled.begin(), d->signalled.end(), c), d->signalled.end());
  if (d->taking) {
    for (Cq *&t : *d->taking) {
      if (t == c) {
        misuse("cq_destroy from a device_take_events callback");
        t = nullptr;
      }
    }
  }
  --d->cqs;
  --g.counts.cqs;
  delete c;
}

int cq_poll(Cq *c, Completion *out, int max) {
  if (injected(fake::Call::CqPoll)) return -1;
  if (g.watch.one_per_poll && max > 1) max = 1;
  int n = 0;
  while (n < max && !c->q.empty()) {
    Cqe e = c->q.front();
    c->q.pop_front();
    if (e.srq) --e.srq->unpolled;
    if (!e.qp) {
      ++g.stats.orphan_cqes;
    } else if (e.send) {
      e.qp->send_unpolled -= e.retire;
    } else if (!e.srq) {
      --e.qp->recv_unpolled;
    }
    out[n++] = e.wc;
  }
  if (g.watch.recv_polled)
    for (int i = 0; i < n; ++i)
      if (out[i].ctx->op == Op::Recv) g.watch.recv_polled();
  return n;
}

// --- memory ---

int mr_register(Device *d, void *addr, size_t len, unsigned access, Mr **out) {
  int err = mr_register(d->dom, addr, len, access, out);
  if (!err) {
    (*out)->dev = d;
    ++d->mrs;
  }
  return err;
}

int mr_register(Domain *x, void *addr, size_t len, unsigned access, Mr **out) {
  if (int err = injected(fake::Call::MrRegister)) return err;
  if (x->refs <= 0) misuse("mr_register on a domain nobody holds");
  if (!addr || !len) return IBMSG_EINVAL;
  constexpr unsigned kKnown =
      kRemoteRead | kRemoteWrite | kRemoteAtomic | kLocalReadOnly | kMwBind;
  if (access & ~kKnown) {
    misuse("mr_register with unknown access flags 0x%x", access);
    return IBMSG_EINVAL;
  }
  if ((access & kLocalReadOnly) && (access & (kRemoteWrite | kRemoteAtomic))) {
    misuse("mr_register of remote write or atomic access without local write");  // verbs: EINVAL
    return IBMSG_EINVAL;
  }
  Mr *m = new Mr();
  m->magic = kMrMagic;
  m->dom = x;
  m->dev = nullptr;
  m->addr = static_cast<uint8_t *>(addr);
  m->len = len;
  m->access = access;
  m->lkey = g.next_key++;
  m->rkey = g.next_key++;
  g.rkeys[m->rkey] = m;
  ++x->mrs;
  ++g.counts.mrs;
  ++g.stats.registrations;
  *out = m;
  return IBMSG_OK;
}

void mr_deregister(Mr *m) {
  if (!m) return;
  if (m->mws) misuse("mr_deregister of a registration with %d memory windows bound", m->mws);
  g.rkeys.erase(m->rkey);
  if (m->dev) --m->dev->mrs;
  --m->dom->mrs;
  --g.counts.mrs;
  m->magic = 0;
  delete m;
}

uint32_t mr_lkey(const Mr *m) { return m->lkey; }
uint32_t mr_rkey(const Mr *m) { return m->rkey; }

int mw_alloc(Device *d, Mw **out) {
  if (int err = injected(fake::Call::MwAlloc)) return err;
  if (!d->info.mw_type2) return IBMSG_EOPNOTSUPP;
  Mw *w = new Mw();
  w->magic = kMwMagic;
  w->dev = d;
  w->rkey = g.next_mw++ << 8;
  g.windows[w->rkey >> 8] = w;
  ++d->mws;
  ++g.counts.mws;
  *out = w;
  return IBMSG_OK;
}

void mw_dealloc(Mw *w) {
  if (!w) return;
  // A bind in flight on a QP in the error state only completes flushed: it may go (its work
  // requests forget it); on a working QP the bind would fail and break the connection.
  for (Qp *q : g.qps) {
    for (auto *list : {&q->sq, &q->pending}) {
      for (SendWr &x : *list) {
        if (x.bind != w) continue;
        if (!q->error) misuse("mw_dealloc of a window whose bind is in flight");
        x.bind = nullptr;
        x.bind_dead = true;
      }
    }
  }
  if (w->mr) --w->mr->mws;
  g.windows.erase(w->rkey >> 8);
  --w->dev->mws;
  --g.counts.mws;
  w->magic = 0;
  delete w;
}

// --- connection manager ---

int cm_channel_create(CmChannel **out) {
  if (int err = injected(fake::Call::CmChannelCreate)) return err;
  int fd = new_eventfd();
  if (fd < 0) return IBMSG_ESYS;
  CmChannel *ch = new CmChannel();
  ch->fd = fd;
  ++g.counts.channels;
  *out = ch;
  return IBMSG_OK;
}

void cm_channel_destroy(CmChannel *ch) {
  if (ch->ids) misuse("cm_channel_destroy with %d ids still on it", ch->ids);
  close(ch->fd);
  --g.counts.channels;
  delete ch;
}

int cm_channel_fd(const CmChannel *ch) { return ch->fd; }

int cm_get_event(CmChannel *ch, CmEvent *out) {
  if (ch->events.empty()) {
    fd_drain(ch->fd);
    return IBMSG_EAGAIN;
  }
  *out = ch->events.front();
  ch->events.pop_front();
  if (ch->events.empty()) fd_drain(ch->fd);
  return IBMSG_OK;
}

int cm_id_create(CmChannel *ch, void *user, CmId **out) {
  if (int err = injected(fake::Call::CmIdCreate)) return err;
  CmId *id = new CmId();
  id->ch = ch;
  id->user = user;
  g.ids.push_back(id);
  ++ch->ids;
  ++g.counts.ids;
  *out = id;
  return IBMSG_OK;
}

void cm_id_destroy(CmId *id) {
  if (id->qp) {
    destroy_qp(id->qp);
    id->qp = nullptr;
  }
  // Events not yet taken go with the id; requests to a listener go with their new ids (as the
  // kernel does it), which rejects their connectors.
  std::vector<CmId *> children;
  auto &evs = id->ch->events;
  for (auto it = evs.begin(); it != evs.end();) {
    if (it->type == CmEventType::ConnectRequest && it->listen_id == id) {
      children.push_back(it->id);
      it = evs.erase(it);
    } else if (it->id == id) {
      it = evs.erase(it);
    } else {
      ++it;
    }
  }
  g.held.erase(std::remove_if(g.held.begin(), g.held.end(),
                              [id](const std::pair<CmId *, CmEvent> &h) { return h.first == id; }),
               g.held.end());
  for (CmId *c : children) cm_id_destroy(c);

  CmId *r = id->remote;
  switch (id->state) {
    case IdState::Connected:  // destroying a connection disconnects it
      if (r && r->state == IdState::Connected) {
        r->state = IdState::Disconnected;
        push_disconnected(r);
      }
      break;
    case IdState::ReqRcvd: {  // an undecided request is rejected
      uint8_t zeros[kRejPdata] = {};
      reject_connector(r, kRejectConsumer, zeros, 0, kRejPdata);
      break;
    }
    default: break;
  }
  if (r && r->remote == id) r->remote = nullptr;
  if (id->port) {
    auto it = g.ports.find(id->port);
    if (it != g.ports.end() && it->second == id) g.ports.erase(it);
  }
  g.ids.erase(std::remove(g.ids.begin(), g.ids.end(), id), g.ids.end());
  --id->ch->ids;
  --g.counts.ids;
  delete id;
}

void *cm_id_user(const CmId *id) { return id->user; }
void cm_id_set_user(CmId *id, void *user) { id->user = user; }

int cm_migrate(CmId *id, CmChannel *to) {
  --id->ch->ids;
  id->ch = to;
  ++to->ids;
  return IBMSG_OK;
}

int cm_bind(CmId *id, const sockaddr *addr) {
  if (int err = injected(fake::Call::CmBind)) return err;
  if (id->state != IdState::Idle) return IBMSG_EINVAL;
  sockaddr_storage a;
  if (!copy_addr(addr, &a)) return IBMSG_EADDRNOTAVAIL;
  unsigned short port = port_of(a);
  if (port == 0) {
    while (g.ports.count(g.next_port)) ++g.next_port;
    port = g.next_port++;
  } else if (g.ports.count(port)) {
    return IBMSG_EADDRINUSE;
  }
  set_port(&a, port);
  g.ports[port] = id;
  id->port = port;
  id->local = a;
  id->has_local = true;
  id->has_dev = !is_wildcard(a);
  id->state = IdState::Bound;
  return IBMSG_OK;
}

int cm_listen(CmId *id, int backlog) {
  (void)backlog;
  if (int err = injected(fake::Call::CmListen)) return err;
  if (id->state != IdState::Bound) return IBMSG_EINVAL;
  id->state = IdState::Listening;
  return IBMSG_OK;
}

int cm_resolve_addr(CmId *id, const sockaddr *src, const sockaddr *dst, int timeout_ms) {
  (void)timeout_ms;
  if (int err = injected(fake::Call::CmResolveAddr)) return err;
  if (id->state != IdState::Idle) return IBMSG_EINVAL;
  if (!copy_addr(dst, &id->peer)) return IBMSG_EADDRNOTAVAIL;
  id->has_peer = true;
  if (!src || !copy_addr(src, &id->local)) loopback(id->peer.ss_family, &id->local);
  set_port(&id->local, g.next_ephemeral++);
  id->has_local = true;
  if (g.removed) {
    push_event(id->ch, make_event(CmEventType::AddrError, id, -ENODEV, nullptr, 0, 0));
    return IBMSG_OK;
  }
  if (unreachable(id->peer)) {
    push_event(id->ch, make_event(CmEventType::AddrError, id, -EHOSTUNREACH, nullptr, 0, 0));
    return IBMSG_OK;
  }
  id->has_dev = true;
  id->state = IdState::AddrResolved;
  push_event(id->ch, make_event(CmEventType::AddrResolved, id, 0, nullptr, 0, 0));
  return IBMSG_OK;
}

int cm_resolve_route(CmId *id, int timeout_ms) {
  (void)timeout_ms;
  if (int err = injected(fake::Call::CmResolveRoute)) return err;
  if (id->state != IdState::AddrResolved) return IBMSG_EINVAL;
  id->state = IdState::RouteResolved;
  push_event(id->ch, make_event(CmEventType::RouteResolved, id, 0, nullptr, 0, 0));
  return IBMSG_OK;
}

int cm_connect(CmId *id, const ConnParam &p) {
  if (int err = injected(fake::Call::CmConnect)) return err;
  if (id->state != IdState::RouteResolved) {
    misuse("cm_connect before the route is resolved");
    return IBMSG_EINVAL;
  }
  if (p.plen > kReqPdata) return IBMSG_EINVAL;
  if (p.responder_resources > kMaxRdAtom || p.initiator_depth > kMaxRdAtom) {
    misuse("cm_connect with %u responder resources / initiator depth %u beyond the device's %u",
           p.responder_resources, p.initiator_depth, kMaxRdAtom);
    return IBMSG_EINVAL;
  }
  if (!g.raw) {
    g.stats.connect_responder_resources = p.responder_resources;
    g.stats.connect_initiator_depth = p.initiator_depth;
  }
  auto it = g.ports.find(port_of(id->peer));
  if (it == g.ports.end() || it->second->state != IdState::Listening) {
    id->state = IdState::Connecting;
    reject_connector(id, kRejInvalidServiceId, nullptr, 0, 0);
    return IBMSG_OK;
  }
  CmId *l = it->second;
  CmId *n = new CmId();
  g.ids.push_back(n);
  n->ch = l->ch;
  n->user = l->user;  // as rdma_cm: the listener's context until the application sets its own
  n->state = IdState::ReqRcvd;
  n->local = is_wildcard(l->local) ? id->peer : l->local;
  set_port(&n->local, l->port);
  n->peer = id->local;
  n->has_local = n->has_peer = n->has_dev = true;
  n->remote = id;
  n->req_responder_resources = p.responder_resources;
  n->req_initiator_depth = p.initiator_depth;
  ++l->ch->ids;
  ++g.counts.ids;
  id->remote = n;
  id->state = IdState::Connecting;
  ++g.stats.connect_requests;
  CmEvent ev = make_event(CmEventType::ConnectRequest, n, 0, p.pdata, p.plen, kReqPdata);
  ev.listen_id = l;
  push_event(l->ch, ev);
  return IBMSG_OK;
}

int cm_accept(CmId *id, const ConnParam &p) {
  if (int err = injected(fake::Call::CmAccept)) {
    if (id->qp) qp_error(id->qp);  // as librdmacm: its receives complete as flushed
    return err;
  }
  if (id->state != IdState::ReqRcvd) {
    misuse("cm_accept on an id that is no undecided request");
    return IBMSG_EINVAL;
  }
  if (p.plen > kRepPdata) return IBMSG_EINVAL;
  // kMaxRdAtomic: as librdmacm, as many as the request asked for (its initiator depth is our
  // responder resources) and the device allows; an explicit value must fit the device.
  auto resolve = [](uint8_t v, uint8_t asked) {
    return v == kMaxRdAtomic ? std::min<unsigned>(asked, kMaxRdAtom) : unsigned(v);
  };
  unsigned rr = resolve(p.responder_resources, id->req_initiator_depth);
  unsigned idepth = resolve(p.initiator_depth, id->req_responder_resources);
  if (rr > kMaxRdAtom || idepth > kMaxRdAtom) {
    misuse("cm_accept with %u responder resources / initiator depth %u beyond the device's %u",
           rr, idepth, kMaxRdAtom);
    return IBMSG_EINVAL;
  }
  if (!g.raw) {
    g.stats.accept_responder_resources = int(rr);
    g.stats.accept_initiator_depth = int(idepth);
  }
  CmId *c = id->remote;
  if (!c || c->state != IdState::Connecting) {  // the peer gave up
    if (id->qp) qp_error(id->qp);
    return IBMSG_ECONNRESET;
  }
  id->state = c->state = IdState::Connected;
  if (id->qp) id->qp->rts = true;
  if (c->qp) c->qp->rts = true;
  push_event(c->ch, make_event(CmEventType::Established, c, 0, p.pdata, p.plen, kRepPdata));
  CmEvent mine = make_event(CmEventType::Established, id, 0, nullptr, 0, 0);
  if (g.hold_est) g.held.emplace_back(id, mine);
  else push_event(id->ch, mine);
  return IBMSG_OK;
}

int cm_reject(CmId *id, const void *pdata, uint8_t plen) {
  if (id->state != IdState::ReqRcvd) {
    misuse("cm_reject on an id that is no undecided request");
    return IBMSG_EINVAL;
  }
  if (plen > kRejPdata) return IBMSG_EINVAL;
  reject_connector(id->remote, kRejectConsumer, pdata, plen, kRejPdata);
  id->remote = nullptr;
  id->state = IdState::Rejected;
  return IBMSG_OK;
}

void cm_notify_established(CmId *) { ++g.stats.cm_notifies; }

int cm_disconnect(CmId *id) {
  if (id->state == IdState::Disconnected) {  // the peer disconnected first
    if (id->qp) qp_error(id->qp);
    return IBMSG_OK;
  }
  if (id->state != IdState::Connected) return IBMSG_EINVAL;
  id->state = IdState::Disconnected;
  if (id->qp) qp_error(id->qp);
  push_disconnected(id);  // the DREP (or its timeout) ends the local side too
  CmId *r = id->remote;
  if (r && r->state == IdState::Connected) {
    r->state = IdState::Disconnected;
    push_disconnected(r);
  }
  return IBMSG_OK;
}

DeviceKey cm_device(const CmId *id) { return id->has_dev ? &g_device_key : nullptr; }
const char *cm_device_name(const CmId *id) { return id->has_dev ? "fake0" : nullptr; }

const sockaddr *cm_local_addr(const CmId *id) {
  return id->has_local ? reinterpret_cast<const sockaddr *>(&id->local) : nullptr;
}

const sockaddr *cm_peer_addr(const CmId *id) {
  return id->has_peer ? reinterpret_cast<const sockaddr *>(&id->peer) : nullptr;
}

// --- queue pairs ---

int qp_create(CmId *id, Device *dev, Cq *cq, QpCaps *caps) {
  if (int err = injected(fake::Call::QpCreate)) return err;
  if (id->qp) {
    misuse("qp_create on an id that has a QP");
    return IBMSG_EINVAL;
  }
  if (cq->dev != dev) {
    misuse("qp_create with a CQ of another device");
    return IBMSG_EINVAL;
  }
  if (caps->srq && caps->srq->dev != dev) {
    misuse("qp_create with a shared receive queue of another device");
    return IBMSG_EINVAL;
  }
  if (caps->send_wrs == 0 || caps->send_wrs > dev->info.max_qp_wr ||
      (!caps->srq && (caps->recv_wrs == 0 || caps->recv_wrs > dev->info.max_qp_wr)))
    return IBMSG_EINVAL;
  if (caps->max_inline > kMaxInline) caps->max_inline = kMaxInline;
  Qp *q = new Qp();
  q->id = id;
  q->dev = dev;
  q->cq = cq;
  q->caps = *caps;
  q->srq = caps->srq;
  if (q->srq) ++q->srq->qps;
  q->num = g.next_qpn++;
  q->rts = id->state == IdState::Connected;
  ++cq->qps;
  g.qps.push_back(q);
  ++g.counts.qps;
  id->qp = q;
  return IBMSG_OK;
}

void qp_destroy(CmId *id) {
  if (!id->qp) return;
  destroy_qp(id->qp);
  id->qp = nullptr;
}

uint32_t qp_num(const CmId *id) { return id->qp ? id->qp->num : 0; }

// --- shared receive queues ---

int srq_create(Device *dev, uint32_t max_wr, Srq **out) {
  if (int err = injected(fake::Call::SrqCreate)) return err;
  if (max_wr == 0 || max_wr > dev->info.max_srq_wr) return IBMSG_EINVAL;
  Srq *q = new Srq();
  q->dev = dev;
  q->max_wr = max_wr;
  ++dev->srqs;
  ++g.counts.srqs;
  *out = q;
  return IBMSG_OK;
}

void srq_destroy(Srq *q) {
  if (!q) return;
  if (q->qps) misuse("srq_destroy while %d QPs use it", q->qps);
  --q->dev->srqs;
  --g.counts.srqs;
  // Completions of its receives still in a CQ no longer count against it.
  for (Qp *qp : g.qps)
    if (qp->srq == q) qp->srq = nullptr;
  delete q;
}

int srq_post_recv(Srq *q, WorkCtx *ctx, void *buf, uint32_t len, const Mr *mr) {
  if (int err = injected(fake::Call::PostRecv)) return err;
  if (!ctx) {
    misuse("srq_post_recv without a work request context");
    return IBMSG_EINVAL;
  }
  if (!mr || mr->magic != kMrMagic || static_cast<uint8_t *>(buf) < mr->addr ||
      static_cast<uint8_t *>(buf) + len > mr->addr + mr->len) {
    misuse("srq_post_recv of a buffer outside its memory registration");
    return IBMSG_EIO;
  }
  if (q->rq.size() + q->unpolled >= q->max_wr) {
    misuse("shared receive queue overflow: %zu work requests outstanding",
           q->rq.size() + q->unpolled);
    return IBMSG_EIO;
  }
  q->rq.push_back(RecvWr{ctx, static_cast<uint8_t *>(buf), len});
  // Senders waiting for a receive (none wait: the fake fails them with RNR) need nothing here.
  return IBMSG_OK;
}

int post_recv(CmId *id, WorkCtx *ctx, void *buf, uint32_t len, const Mr *mr) {
  if (int err = injected(fake::Call::PostRecv)) return err;
  Qp *q = id->qp;
  if (!q) {
    misuse("post_recv on an id without a QP");
    return IBMSG_EIO;
  }
  if (!ctx) {
    misuse("post_recv without a work request context");
    return IBMSG_EINVAL;
  }
  if (!check_mr(q, mr, buf, len)) return IBMSG_EIO;
  const size_t outstanding = q->rq.size() + q->pending_rq.size() + q->recv_unpolled;
  if (outstanding >= q->caps.recv_wrs) {
    misuse("receive queue overflow: %zu work requests outstanding", outstanding);
    return IBMSG_EIO;
  }
  q->pending_rq.push_back(RecvWr{ctx, static_cast<uint8_t *>(buf), len});
  return IBMSG_OK;
}

int post_send_imm(CmId *id, WorkCtx *ctx, const void *buf, uint32_t len, const Mr *mr, uint32_t imm,
                  uint32_t max_inline, const Segment *tail) {
  return post_send(id, ctx, buf, len, mr, true, imm, max_inline, tail);
}

bool pending_imm(CmId *id, uint32_t *imm) {
  const Qp *q = id->qp;
  if (!q || q->pending.empty()) return false;
  const SendWr &w = q->pending.back();
  if (w.rdma || w.bind || !w.has_imm || w.ctx->op != Op::Send) return false;
  *imm = w.imm;
  return true;
}

void set_pending_imm(CmId *id, uint32_t imm) {
  Qp *q = id->qp;
  if (!q || q->pending.empty()) {
    misuse("set_pending_imm without a queued work request");
    return;
  }
  q->pending.back().imm = imm;
}

int post_rdma(CmId *id, WorkCtx *ctx, const RdmaWr &w, uint32_t max_inline) {
  if (int err = injected(fake::Call::PostRdma)) return err;
  Qp *q = id->qp;
  if (!q) {
    misuse("post_rdma on an id without a QP");
    return IBMSG_EIO;
  }
  if (!ctx) {
    misuse("post_rdma without a work request context");
    return IBMSG_EINVAL;
  }
  const Op op = ctx->op;
  if (op != Op::RdmaWrite && op != Op::RdmaRead && op != Op::RndvRead && op != Op::WriteImm &&
      op != Op::Atomic) {
    misuse("post_rdma of a work request that is no one-sided operation");
    return IBMSG_EINVAL;
  }
  const bool write = op == Op::RdmaWrite || op == Op::WriteImm;
  if (max_inline > q->caps.max_inline) {
    misuse("post_rdma with max_inline %u beyond the %u granted", max_inline, q->caps.max_inline);
    return IBMSG_EIO;
  }
  if (op == Op::Atomic) {
    if (!q->dev->info.atomics) {
      misuse("an atomic on a device without atomics");
      return IBMSG_EINVAL;
    }
    if (w.len != 8) {
      misuse("an atomic of %u bytes", w.len);
      return IBMSG_EINVAL;
    }
  }
  if (w.len && !w.local) {
    misuse("post_rdma of %u bytes without local memory", w.len);
    return IBMSG_EIO;
  }
  if (w.len && !(write && w.len <= max_inline) && !check_mr(q, w.mr, w.local, w.len))
    return IBMSG_EIO;
  if (w.len > q->dev->info.max_msg_size) {  // a device fails it (local length error)
    misuse("an %s of %u bytes beyond the device's largest message", op_name(op), w.len);
    return IBMSG_EIO;
  }
  if (!write && w.mr && (w.mr->access & kLocalReadOnly)) {
    misuse("the result of an %s into memory registered without local write", op_name(op));
    return IBMSG_EIO;  // a real device completes it with a local protection error
  }
  if (q->send_unpolled >= q->caps.send_wrs) {
    misuse("send queue overflow: %u work requests outstanding", q->send_unpolled);
    return IBMSG_EIO;
  }
  if (!q->rts && !q->error) {
    misuse("post_rdma before the connection is established");
    return IBMSG_EIO;
  }
  record_post(q, op, w.len, write && w.len && w.len <= max_inline);
  ++q->send_unpolled;
  SendWr s;
  s.ctx = ctx;
  s.has_imm = op == Op::WriteImm;
  s.imm = w.imm;
  s.rdma = true;
  s.rw = w;
  if (write && w.len) {
    auto p = static_cast<const uint8_t *>(w.local);
    s.data.assign(p, p + w.len);
  }
  q->pending.push_back(std::move(s));
  return IBMSG_OK;
}

// The 8 low bits change with every bind (as the rdma-core transport's random ones do).
uint32_t mw_next_key(const Mw *mw) { return (mw->rkey & ~0xffu) | ((mw->rkey + 0x5b) & 0xff); }

int post_bind(CmId *id, WorkCtx *ctx, Mw *mw, const Mr *mr, void *addr, size_t len,
              unsigned access, uint32_t rkey) {
  if (int err = injected(fake::Call::PostBind)) return err;
  Qp *q = id->qp;
  if (!q || !ctx || ctx->op != Op::Bind || !mw || mw->magic != kMwMagic) {
    misuse("post_bind without a QP, a Bind context or a window");
    return IBMSG_EINVAL;
  }
  if (!mr || mr->magic != kMrMagic || !(mr->access & kMwBind) || mr->dom != q->dev->dom ||
      mw->dev->dom != q->dev->dom) {
    misuse("post_bind over a registration without kMwBind, or of another device");
    return IBMSG_EINVAL;
  }
  auto p = static_cast<uint8_t *>(addr);
  if (p < mr->addr || len > mr->len || size_t(p - mr->addr) > mr->len - len) {
    misuse("post_bind of a range outside its registration");
    return IBMSG_EINVAL;
  }
  if ((access & (kRemoteWrite | kRemoteAtomic)) && (mr->access & kLocalReadOnly)) {
    misuse("post_bind of remote write or atomic over a registration without local write");
    return IBMSG_EINVAL;
  }
  if (q->send_unpolled >= q->caps.send_wrs) {
    misuse("send queue overflow: %u work requests outstanding", q->send_unpolled);
    return IBMSG_EIO;
  }
  if (!q->rts && !q->error) {
    misuse("post_bind before the connection is established");
    return IBMSG_EIO;
  }
  record_post(q, Op::Bind, 0, false);
  ++q->send_unpolled;
  if ((rkey & ~0xffu) != (mw->rkey & ~0xffu)) {
    misuse("post_bind with a key of another window");
    return IBMSG_EINVAL;
  }
  ++mw->binding;
  SendWr s;
  s.ctx = ctx;
  s.bind = mw;
  s.bind_key = rkey;
  s.bind_mr = const_cast<Mr *>(mr);
  s.bind_addr = reinterpret_cast<uintptr_t>(addr);
  s.bind_len = len;
  s.bind_access = access;
  q->pending.push_back(std::move(s));
  return IBMSG_OK;
}

bool qp_failed(CmId *id) { return id->qp && id->qp->error && id->qp->refused; }

int post_flush(CmId *id) {
  if (g.watch.flush) g.watch.flush();
  Qp *q = id->qp;
  if (!q) {
    misuse("post_flush on an id without a QP");
    return IBMSG_EIO;
  }
  if (q->pending.empty() && q->pending_rq.empty()) return IBMSG_OK;
  if (int err = injected(fake::Call::PostFlush)) {
    q->send_unpolled -= uint32_t(q->pending.size());
    q->pending.clear();
    q->pending_rq.clear();
    return err;
  }
  // Receives first, as the rdma-core transport.
  if (!q->pending_rq.empty()) ++g.stats.recv_lists;
  while (!q->pending_rq.empty()) {
    if (q->error) complete_recv(q, q->pending_rq.front().ctx, WcStatus::Flushed);
    else q->rq.push_back(q->pending_rq.front());
    q->pending_rq.pop_front();
  }
  if (q->pending.empty()) return IBMSG_OK;
  ++g.stats.post_lists;
  // As the rdma-core transport: of the data messages before a one-sided operation or the end of
  // the list the last is signaled; one-sided operations always are; a credit-only message is
  // unless a signaled data message follows it before any operation, which then counts it
  // (carried).
  bool signal = true;
  WorkCtx *carrier = nullptr;
  for (size_t i = q->pending.size(); i-- > 0;) {
    SendWr &w = q->pending[i];
    if (!w.rdma && w.ctx->op == Op::Send) {
      w.signaled = signal;
      if (signal) {
        w.ctx->carried = 0;
        carrier = w.ctx;
      }
      signal = false;
    } else if (!w.rdma && w.ctx->op == Op::Ctrl) {
      w.signaled = carrier == nullptr;
      if (carrier) ++carrier->carried;
    } else {
      w.signaled = true;
      w.ctx->carried = 0;
      carrier = nullptr;
      signal = true;
    }
  }
  while (!q->pending.empty()) {
    if (q->error) {
      complete_send(q, q->pending.front().ctx, WcStatus::Flushed);
    } else {
      q->sq.push_back(std::move(q->pending.front()));
    }
    q->pending.pop_front();
  }
  deliver(q);
  return IBMSG_OK;
}

}  // namespace ibmsg::tp

// --- the control API ---------------------------------------------------------------------------

namespace ibmsg::fake {

using namespace ibmsg::tp;

void watch_path(const PathWatch &w) { tp::g.watch = w; }

void reset() {
  tp::g.watch = PathWatch{};
  tp::g.stats = Stats{};
  tp::g.counts = Counts{};
  tp::g.iwarp = false;
  tp::g.paused = false;
  tp::g.hold_est = false;
  tp::g.delay_acks = false;
  tp::g.delay_port = 0;
  tp::g.removed = false;
  tp::g.atomics = true;
  tp::g.max_cqe = 4194303;
  tp::g.max_msg = uint64_t(1) << 20;
  tp::g.max_srq_wr = 0;
  tp::g.mw_type2 = true;
  tp::g.ids.clear();
  tp::g.rkeys.clear();
  tp::g.domain = nullptr;  // (leaked if a failed test left it held)
  tp::g.windows.clear();
  tp::g.posts.clear();
  tp::g.ports.clear();
  tp::g.qps.clear();
  tp::g.held.clear();
  for (auto &i : tp::g.inj) i = tp::Injection{};
  tp::g.arm_hook = nullptr;
  tp::g.arm_hook_cq = nullptr;
  tp::g.raw = 0;
}

Counts open_objects() { return tp::g.counts; }

std::string open_objects_text() {
  const Counts &c = tp::g.counts;
  std::string s;
  auto add = [&s](int n, const char *what) {
    if (!n) return;
    if (!s.empty()) s += ", ";
    s += std::to_string(n) + " " + what;
  };
  add(c.channels, "CM channel(s)");
  add(c.ids, "CM id(s)");
  add(c.devices, "device(s)");
  add(c.cqs, "CQ(s)");
  add(c.qps, "QP(s)");
  add(c.mrs, "memory registration(s)");
  add(c.srqs, "shared receive queue(s)");
  add(c.mws, "memory window(s)");
  add(c.domains, "protection domain(s)");
  return s;
}

const Stats &stats() { return tp::g.stats; }

void set_iwarp(bool iwarp) { tp::g.iwarp = iwarp; }

void set_atomics(bool atomics) { tp::g.atomics = atomics; }
void set_max_cqe(uint32_t max_cqe) { tp::g.max_cqe = max_cqe; }
void set_max_msg_size(uint64_t bytes) { tp::g.max_msg = bytes; }
void set_max_srq_wr(uint32_t n) { tp::g.max_srq_wr = n; }
void set_mw_type2(bool on) { tp::g.mw_type2 = on; }

const std::vector<Post> &posts() { return tp::g.posts; }

std::vector<Op> posts_of(unsigned short port, bool with_ctrl) {
  std::vector<Op> out;
  for (const Post &p : tp::g.posts)
    if (p.port == port && (with_ctrl || p.op != Op::Ctrl)) out.push_back(p.op);
  return out;
}

void remove_device() {
  tp::g.removed = true;
  for (tp::Device *d : tp::g.devices) {
    d->gone = true;
    tp::fd_signal(d->fd);
  }
  for (CmId *id : tp::g.ids) {
    if (!id->has_dev) continue;
    if (id->qp) tp::qp_error(id->qp);
    tp::push_event(id->ch, tp::make_event(CmEventType::DeviceRemoval, id, 0, nullptr, 0, 0));
  }
}

void fail_channels() {
  for (tp::Device *d : tp::g.devices) {
    d->gone = true;
    tp::fd_signal(d->fd);
  }
}

void fail_call(Call call, int code, unsigned skip) {
  tp::Injection &i = tp::g.inj[int(call)];
  i.armed = true;
  i.code = code;
  i.skip = skip;
}

CqInfo cq_info(const tp::Cq *cq) {
  if (!cq) return CqInfo{false, 0, 0, 0};
  return CqInfo{cq->armed, cq->arms, cq->signals, cq->taken};
}

void before_cq_arm(const tp::Cq *cq, std::function<void()> fn) {
  tp::g.arm_hook = std::move(fn);
  tp::g.arm_hook_cq = cq;
}

void pause_wire(bool paused) {
  tp::g.paused = paused;
  if (paused) return;
  std::vector<Qp *> qps = tp::g.qps;
  for (Qp *q : qps) tp::deliver(q);
}

void delay_send_completions(bool delay, unsigned short port) {
  tp::g.delay_acks = delay;
  tp::g.delay_port = port;
  if (delay) return;
  std::vector<Qp *> qps = tp::g.qps;
  for (Qp *q : qps) {
    while (!q->acks.empty()) {
      tp::SendAck a = q->acks.front();
      q->acks.pop_front();
      tp::complete_send(q, a.ctx, WcStatus::Ok, a.signaled);
    }
  }
}

void hold_established(bool hold) { tp::g.hold_est = hold; }

void release_established() {
  auto held = std::move(tp::g.held);
  tp::g.held.clear();
  for (auto &h : held) tp::push_event(h.first->ch, h.second);
}

int post_send_no_imm(CmId *id, WorkCtx *ctx, const void *buf, uint32_t len, const Mr *mr) {
  int err = tp::post_send(id, ctx, buf, len, mr, false, 0, 0);
  return err ? err : tp::post_flush(id);
}

// --- RawPeer ---

namespace {

struct RawCall {
  RawCall() { ++tp::g.raw; }
  ~RawCall() { --tp::g.raw; }
  RawCall(const RawCall &) = delete;
  RawCall &operator=(const RawCall &) = delete;
};

constexpr uint32_t kRawSendWrs = 256;

}  // namespace

RawPeer::RawPeer(uint32_t recv_bufs, uint32_t buf_size) : nbufs_(recv_bufs), bufsize_(buf_size) {}

RawPeer::~RawPeer() { close(); }

int RawPeer::connect(unsigned short port, const void *pdata, size_t plen) {
  RawCall rc;
  if (state_ != State::Idle || ch_) return IBMSG_ESTATE;
  int err = cm_channel_create(&ch_);
  if (!err) err = cm_id_create(ch_, this, &id_);
  if (err) return err;
  sockaddr_in dst{};
  dst.sin_family = AF_INET;
  dst.sin_port = htons(port);
  dst.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  auto p = static_cast<const uint8_t *>(pdata);
  connect_pdata_.assign(p, p + plen);
  err = cm_resolve_addr(id_, nullptr, reinterpret_cast<sockaddr *>(&dst), 1000);
  if (err) return err;
  state_ = State::Connecting;
  pump();  // address, route, request
  return IBMSG_OK;
}

int RawPeer::connect(unsigned short port, const wire::Hello &h) {
  uint8_t buf[wire::kHelloSize];
  wire::encode_hello(h, buf);
  return connect(port, buf, sizeof buf);
}

int RawPeer::listen(unsigned short port) {
  RawCall rc;
  if (state_ != State::Idle || ch_) return IBMSG_ESTATE;
  int err = cm_channel_create(&ch_);
  if (!err) err = cm_id_create(ch_, this, &listen_id_);
  if (err) return err;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  err = cm_bind(listen_id_, reinterpret_cast<sockaddr *>(&a));
  if (!err) err = cm_listen(listen_id_, 16);
  if (!err) state_ = State::Listening;
  return err;
}

unsigned short RawPeer::port() const { return listen_id_ ? tp::port_of(listen_id_->local) : 0; }

void RawPeer::open_queues(CmId *id) {
  int err = device_open(cm_device(id), &dev_);
  if (!err) err = cq_create(dev_, nbufs_ + kRawSendWrs, this, &cq_);
  size_t bytes = size_t(nbufs_ + 1) * bufsize_;
  mem_ = static_cast<uint8_t *>(calloc(1, bytes));
  if (!err) err = mr_register(dev_, mem_, bytes, kLocal, &mr_);
  QpCaps caps{kRawSendWrs, nbufs_, 0};
  if (!err) err = qp_create(id, dev_, cq_, &caps);
  recv_ctx_.resize(nbufs_);
  for (uint32_t i = 0; !err && i < nbufs_; ++i) {
    recv_ctx_[i] = WorkCtx{Op::Recv, 0, reinterpret_cast<void *>(uintptr_t(i))};
    err = post_recv(id, &recv_ctx_[i], mem_ + size_t(i) * bufsize_, bufsize_, mr_);
  }
  if (!err) err = post_flush(id);
  send_ctx_.owner = this;
  if (err) fprintf(stderr, "fake raw peer: cannot set up its queues: %d\n", err);
}

int RawPeer::accept(const void *pdata, size_t plen) {
  RawCall rc;
  if (state_ != State::Requested || !req_id_) return IBMSG_ESTATE;
  id_ = req_id_;
  req_id_ = nullptr;
  open_queues(id_);
  ConnParam p{pdata, uint8_t(plen), 7, 7, 0, 0};
  int err = cm_accept(id_, p);
  state_ = err ? State::Listening : State::Established;
  pump();
  return err;
}

int RawPeer::accept(const wire::Hello &h) {
  uint8_t buf[wire::kHelloSize];
  wire::encode_hello(h, buf);
  return accept(buf, sizeof buf);
}

int RawPeer::reject(const void *pdata, size_t plen) {
  RawCall rc;
  if (state_ != State::Requested || !req_id_) return IBMSG_ESTATE;
  int err = cm_reject(req_id_, pdata, uint8_t(plen));
  cm_id_destroy(req_id_);
  req_id_ = nullptr;
  state_ = State::Listening;
  return err;
}

int RawPeer::send(uint32_t imm, const void *data, size_t len) {
  RawCall rc;
  if (!id_ || !mr_) return IBMSG_ENOTCONN;
  if (len > bufsize_) return IBMSG_EMSGSIZE;
  poll();
  uint8_t *area = mem_ + size_t(nbufs_) * bufsize_;
  if (len) memcpy(area, data, len);
  int err = post_send_imm(id_, &send_ctx_, area, uint32_t(len), mr_, imm, 0);
  return err ? err : post_flush(id_);
}

int RawPeer::send_without_imm(const void *data, size_t len) {
  RawCall rc;
  if (!id_ || !mr_) return IBMSG_ENOTCONN;
  if (len > bufsize_) return IBMSG_EMSGSIZE;
  poll();
  uint8_t *area = mem_ + size_t(nbufs_) * bufsize_;
  if (len) memcpy(area, data, len);
  return post_send_no_imm(id_, &send_ctx_, area, uint32_t(len), mr_);
}

int RawPeer::post_write(WorkCtx *ctx, uint32_t imm, uint64_t remote, uint32_t rkey,
                        const void *data, size_t len) {
  RawCall rc;
  if (!id_ || !mr_) return IBMSG_ENOTCONN;
  if (len > bufsize_) return IBMSG_EMSGSIZE;
  poll();
  uint8_t *area = mem_ + size_t(nbufs_) * bufsize_;
  if (len) memcpy(area, data, len);
  RdmaWr w{};
  w.local = area;
  w.len = uint32_t(len);
  w.mr = mr_;
  w.remote = remote;
  w.rkey = rkey;
  w.imm = imm;
  int err = post_rdma(id_, ctx, w, 0);
  return err ? err : post_flush(id_);
}

int RawPeer::write(uint64_t remote, uint32_t rkey, const void *data, size_t len) {
  return post_write(&write_ctx_, 0, remote, rkey, data, len);
}

int RawPeer::write_imm(uint32_t imm, uint64_t remote, uint32_t rkey, const void *data,
                       size_t len) {
  return post_write(&write_imm_ctx_, imm, remote, rkey, data, len);
}

int RawPeer::disconnect() {
  RawCall rc;
  if (!id_) return IBMSG_ENOTCONN;
  return cm_disconnect(id_);
}

void RawPeer::close() {
  RawCall rc;
  if (req_id_) cm_id_destroy(req_id_);
  if (id_) cm_id_destroy(id_);  // and its QP
  if (listen_id_) cm_id_destroy(listen_id_);
  req_id_ = id_ = listen_id_ = nullptr;
  if (cq_) cq_destroy(cq_);
  cq_ = nullptr;
  mr_deregister(mr_);
  mr_ = nullptr;
  free(mem_);
  mem_ = nullptr;
  if (dev_) device_close(dev_);
  dev_ = nullptr;
  if (ch_) cm_channel_destroy(ch_);
  ch_ = nullptr;
  state_ = State::Idle;
}

void RawPeer::on_event(const CmEvent &ev) {
  switch (ev.type) {
    case CmEventType::AddrResolved:
      if (cm_resolve_route(id_, 1000)) state_ = State::Rejected;
      break;
    case CmEventType::RouteResolved: {
      open_queues(id_);
      ConnParam p{connect_pdata_.data(), uint8_t(connect_pdata_.size()), 7, 7, 0, 0};
      status_ = cm_connect(id_, p);
      if (status_) state_ = State::Rejected;
      break;
    }
    case CmEventType::ConnectRequest:
      ++requests;
      if (req_id_ || id_) {  // one at a time
        cm_reject(ev.id, nullptr, 0);
        cm_id_destroy(ev.id);
        break;
      }
      req_id_ = ev.id;
      cm_id_set_user(req_id_, this);
      pdata_.assign(ev.pdata, ev.pdata + ev.plen);
      state_ = State::Requested;
      break;
    case CmEventType::Established:
      state_ = State::Established;
      if (ev.plen) pdata_.assign(ev.pdata, ev.pdata + ev.plen);
      break;
    case CmEventType::Rejected:
      state_ = State::Rejected;
      status_ = ev.status;
      pdata_.assign(ev.pdata, ev.pdata + ev.plen);
      break;
    case CmEventType::Disconnected: state_ = State::Disconnected; break;
    default:
      status_ = ev.status;
      state_ = State::Rejected;
      break;
  }
}

void RawPeer::poll() {
  if (!cq_) return;
  Completion wc[32];
  for (;;) {
    int n = cq_poll(cq_, wc, 32);
    for (int i = 0; i < n; ++i) {
      if (wc[i].ctx->op == Op::Recv) {
        uint32_t slot = uint32_t(reinterpret_cast<uintptr_t>(wc[i].ctx->owner));
        uint8_t *buf = mem_ + size_t(slot) * bufsize_;
        if (wc[i].status != WcStatus::Ok) {
          ++recvs_failed;
          continue;
        }
        RawMsg m;
        m.has_imm = wc[i].has_imm;
        m.imm = wc[i].imm;
        m.data.assign(buf, buf + wc[i].len);
        received.push_back(std::move(m));
        if (id_ && post_recv(id_, wc[i].ctx, buf, bufsize_, mr_) == IBMSG_OK) post_flush(id_);
      } else if (wc[i].ctx->op == Op::RdmaWrite || wc[i].ctx->op == Op::WriteImm) {
        last_rdma_status = wc[i].status;
        if (wc[i].status == WcStatus::Ok) ++rdma_ok;
        else ++rdma_failed;
      } else if (wc[i].status == WcStatus::Ok) {
        ++sends_ok;
      } else {
        ++sends_failed;
      }
    }
    if (n < 32) return;
  }
}

void RawPeer::pump() {
  RawCall rc;
  CmEvent ev;
  while (ch_ && cm_get_event(ch_, &ev) == IBMSG_OK) on_event(ev);
  poll();
}

}  // namespace ibmsg::fake
