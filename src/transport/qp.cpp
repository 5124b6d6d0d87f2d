// libibverbs: the reliable-connected queue pair of a connection and the work requests posted on
// it. Every work request carries the core's WorkCtx in its wr_id.
#include <arpa/inet.h>
#include <sys/random.h>

#include <ctime>
#include <new>

#include "transport/hoptrace.hpp"
#include "transport/verbs.hpp"

namespace ibmsg::tp {
namespace {

// The work requests queued since the last post_flush, posted as one list each (one doorbell).
constexpr int kChain = 32;
struct Chain {
  ibv_send_wr wr[kChain];
  ibv_sge sge[kChain][2];  // a message's payload and its tail (post_send_imm)
  int n = 0;
  ibv_recv_wr rwr[kChain];
  ibv_sge rsge[kChain];
  int rn = 0;
};

Chain *chain_of(CmId *id) { return static_cast<Chain *>(id->qp->qp_context); }

// Providers check fields an opcode does not use (Soft-RoCE refuses a bind whose imm_data is not
// zero), so every field of a work request must be set or zero. A free request of the chain holds
// nothing but the fields a send sets (a new Chain is zeroed; the requests of one-sided operations
// and binds are zeroed again once they went, chain_empty): a send sets those fields every time
// and takes its request as it is (post_send_imm: 128 bytes, 16 stores a message saved); a
// one-sided operation or a bind takes it zeroed (chain_next).

// The next free work request of the chain, zeroed; flushes a full chain first.
ibv_send_wr *chain_next(CmId *id, int *err) {
  Chain *c = chain_of(id);
  if (c->n == kChain && (*err = post_flush(id))) return nullptr;
  ibv_send_wr *wr = &c->wr[c->n];
  *wr = ibv_send_wr{};
  wr->sg_list = c->sge[c->n];
  ++c->n;
  return wr;
}

// The first n requests went (or were dropped): those that were not sends are zeroed again.
void chain_empty(Chain *c, int n) {
  for (int i = 0; i < n; ++i)
    if (c->wr[i].opcode != IBV_WR_SEND_WITH_IMM) c->wr[i] = ibv_send_wr{};
}

void fill_sge(ibv_sge *sge, const void *buf, uint32_t len, const Mr *mr) {
  sge->addr = reinterpret_cast<uintptr_t>(buf);
  sge->length = len;
  sge->lkey = mr_lkey(mr);
}

int flush_recvs(CmId *id, Chain *c) {
  if (c->rn == 0) return IBMSG_OK;
  for (int i = 0; i < c->rn; ++i) c->rwr[i].next = i + 1 < c->rn ? &c->rwr[i + 1] : nullptr;
  c->rn = 0;
  ibv_recv_wr *bad = nullptr;
  return ibv_post_recv(id->qp, &c->rwr[0], &bad) ? IBMSG_EIO : IBMSG_OK;
}

}  // namespace

int post_flush(CmId *id) {
  Chain *c = id->qp ? chain_of(id) : nullptr;
  if (!c) return IBMSG_OK;
  // Receives first: a credit a send of this list returns is for a buffer posted by then. (Most
  // lists have none: a connection on a shared receive queue posts its receives there.)
  if (c->rn) {
    if (int err = flush_recvs(id, c)) {
      chain_empty(c, c->n);
      c->n = 0;
      return err;
    }
  }
  if (c->n == 0) return IBMSG_OK;
  // Completions come in order: of the data messages before a one-sided operation (or the end
  // of the list), the last is signaled and its completion stands for the others. Operations are
  // always signaled (post_rdma). A credit-only message is signaled unless a signaled data
  // message follows it in the list before any operation: that one's completion stands for it
  // too and counts it in its WorkCtx (not the connection's one control context: several of its
  // messages may be in flight; not an operation: a long read or write would hold the control
  // slot back for its whole transfer).
  bool signal = true, others = false;
  WorkCtx *carrier = nullptr;
  for (int i = c->n - 1; i >= 0; --i) {
    c->wr[i].next = i + 1 < c->n ? &c->wr[i + 1] : nullptr;
    WorkCtx *ctx = reinterpret_cast<WorkCtx *>(c->wr[i].wr_id);
    switch (ctx->op) {
      case Op::Send:
        if (signal) {
          c->wr[i].send_flags |= IBV_SEND_SIGNALED;
          ctx->carried = 0;
          carrier = ctx;
        }
        signal = false;
        break;
      case Op::Ctrl:
        if (carrier) ++carrier->carried;
        else c->wr[i].send_flags |= IBV_SEND_SIGNALED;
        break;
      default:  // one-sided operations, binds and rendezvous FINs: always signaled
        c->wr[i].send_flags |= IBV_SEND_SIGNALED;
        ctx->carried = 0;
        carrier = nullptr;
        signal = true;
        others = true;
        break;
    }
  }
  const int n = c->n;
  c->n = 0;
  ibv_send_wr *bad = nullptr;
  hoptrace::post_begin();
  const int err = ibv_post_send(id->qp, &c->wr[0], &bad) ? IBMSG_EIO : IBMSG_OK;
  hoptrace::post_end();
  if (others) chain_empty(c, n);
  return err;
}

int qp_create(CmId *id, Device *dev, Cq *cq, QpCaps *caps) {
  ibv_qp_init_attr attr{};
  attr.send_cq = cq_verbs(cq);
  attr.recv_cq = cq_verbs(cq);
  attr.qp_type = IBV_QPT_RC;
  attr.sq_sig_all = 0;  // post_flush says which sends are signaled
  attr.cap.max_send_wr = caps->send_wrs;
  attr.cap.max_recv_wr = caps->srq ? 0 : caps->recv_wrs;
  attr.cap.max_send_sge = 2;
  attr.cap.max_recv_sge = caps->srq ? 0 : 1;
  attr.srq = caps->srq ? srq_verbs(caps->srq) : nullptr;
  attr.cap.max_inline_data = caps->max_inline;
  Chain *chain = new (std::nothrow) Chain();  // zeroed (chain_next)
  if (!chain) return IBMSG_ENOMEM;
  attr.qp_context = chain;
  if (rdma_create_qp(raw(id), device_pd(dev), &attr)) {
    // Not every device offers inline data.
    attr.cap.max_inline_data = 0;
    if (rdma_create_qp(raw(id), device_pd(dev), &attr)) {
      int err = alloc_error();
      // The verbs part takes these caps, so the CM refused: the id's connection is gone (a
      // request whose connecting side gave up: Soft-RoCE says EINVAL for its QP attributes).
      if (errno == EINVAL) {
        if (ibv_qp *probe = ibv_create_qp(device_pd(dev), &attr)) {
          ibv_destroy_qp(probe);
          err = IBMSG_ECONNRESET;
        }
      }
      delete chain;
      return err;
    }
  }
  caps->max_inline = attr.cap.max_inline_data;
  return IBMSG_OK;
}

void qp_destroy(CmId *id) {
  if (!id->qp) return;
  Chain *chain = chain_of(id);  // what was never flushed is dropped: the core cancels it
  rdma_destroy_qp(raw(id));
  delete chain;
}

uint32_t qp_num(const CmId *id) { return id->qp ? id->qp->qp_num : 0; }

int post_recv(CmId *id, WorkCtx *ctx, void *buf, uint32_t len, const Mr *mr) {
  Chain *c = chain_of(id);
  if (c->rn == kChain) {
    if (int err = flush_recvs(id, c)) return err;
  }
  ibv_recv_wr *wr = &c->rwr[c->rn];
  ibv_sge *sge = &c->rsge[c->rn];
  ++c->rn;
  sge->addr = reinterpret_cast<uintptr_t>(buf);
  sge->length = len;
  sge->lkey = mr_lkey(mr);
  *wr = ibv_recv_wr{};
  wr->wr_id = reinterpret_cast<uintptr_t>(ctx);
  wr->sg_list = sge;
  wr->num_sge = 1;
  return IBMSG_OK;
}

namespace {

// A full chain goes first, then the message (on its own: post_send_imm's path then calls
// nothing and saves no registers).
[[gnu::noinline]] int post_send_imm_full(CmId *id, WorkCtx *ctx, const void *buf, uint32_t len,
                                         const Mr *mr, uint32_t imm, uint32_t max_inline,
                                         const Segment *tail) {
  if (int err = post_flush(id)) return err;
  return post_send_imm(id, ctx, buf, len, mr, imm, max_inline, tail);
}

}  // namespace

int post_send_imm(CmId *id, WorkCtx *ctx, const void *buf, uint32_t len, const Mr *mr,
                  uint32_t imm, uint32_t max_inline, const Segment *tail) {
  Chain *c = chain_of(id);
  if (c->n == kChain) return post_send_imm_full(id, ctx, buf, len, mr, imm, max_inline, tail);
  // Not zeroed (chain_next says why it need not be): the fields below, next (post_flush).
  ibv_send_wr *wr = &c->wr[c->n];
  wr->sg_list = c->sge[c->n];
  ++c->n;
  // The payload, if any, then the tail, if any: zero, one or two elements.
  int n = 0;
  if (len) fill_sge(&wr->sg_list[n++], buf, len, mr);
  if (tail && tail->len) fill_sge(&wr->sg_list[n++], tail->buf, tail->len, tail->mr);
  const uint32_t total = len + (tail ? tail->len : 0);
  wr->num_sge = n;
  wr->wr_id = reinterpret_cast<uintptr_t>(ctx);
  wr->opcode = IBV_WR_SEND_WITH_IMM;
  // Signaled or not: post_flush decides for the whole list.
  wr->send_flags = total && total <= max_inline ? IBV_SEND_INLINE : 0;
  wr->imm_data = htonl(imm);
  return IBMSG_OK;
}

bool pending_imm(CmId *id, uint32_t *imm) {
  const Chain *c = id->qp ? chain_of(id) : nullptr;
  if (!c || c->n == 0) return false;
  const ibv_send_wr &wr = c->wr[c->n - 1];
  if (wr.opcode != IBV_WR_SEND_WITH_IMM ||
      reinterpret_cast<const WorkCtx *>(wr.wr_id)->op != Op::Send)
    return false;
  *imm = ntohl(wr.imm_data);
  return true;
}

void set_pending_imm(CmId *id, uint32_t imm) {
  Chain *c = chain_of(id);
  c->wr[c->n - 1].imm_data = htonl(imm);
}

int post_rdma(CmId *id, WorkCtx *ctx, const RdmaWr &w, uint32_t max_inline) {
  int err = IBMSG_OK;
  if (ctx->op != Op::RdmaWrite && ctx->op != Op::WriteImm && ctx->op != Op::RdmaRead &&
      ctx->op != Op::RndvRead && ctx->op != Op::Atomic)
    return IBMSG_EINVAL;
  ibv_send_wr *wrp = chain_next(id, &err);
  if (!wrp) return err;
  ibv_send_wr &wr = *wrp;
  wr.sg_list->addr = reinterpret_cast<uintptr_t>(w.local);
  wr.sg_list->length = w.len;
  wr.sg_list->lkey = mr_lkey(w.mr);
  wr.wr_id = reinterpret_cast<uintptr_t>(ctx);
  wr.num_sge = 1;
  wr.send_flags = IBV_SEND_SIGNALED;
  switch (ctx->op) {
    case Op::RdmaWrite:
    case Op::WriteImm:
      wr.opcode = ctx->op == Op::WriteImm ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE;
      wr.imm_data = htonl(w.imm);
      if (w.len <= max_inline) wr.send_flags |= IBV_SEND_INLINE;
      wr.wr.rdma.remote_addr = w.remote;
      wr.wr.rdma.rkey = w.rkey;
      break;
    case Op::RdmaRead:
    case Op::RndvRead:
      wr.opcode = IBV_WR_RDMA_READ;
      wr.wr.rdma.remote_addr = w.remote;
      wr.wr.rdma.rkey = w.rkey;
      break;
    case Op::Atomic:
      wr.opcode = w.cas ? IBV_WR_ATOMIC_CMP_AND_SWP : IBV_WR_ATOMIC_FETCH_AND_ADD;
      wr.wr.atomic.remote_addr = w.remote;
      wr.wr.atomic.rkey = w.rkey;
      wr.wr.atomic.compare_add = w.compare_add;
      wr.wr.atomic.swap = w.swap;
      break;
    default: break;  // checked above
  }
  return IBMSG_OK;
}

namespace {

// 8 random bits for a window's key: a peer that learned one key of the device (its index in the
// upper 24 bits is predictable) still has to guess them. A per-thread generator seeded once
// from the kernel: a grant costs no system call for them.
uint8_t key_byte() {
  thread_local uint64_t state = 0;
  if (state == 0) {
    if (getrandom(&state, sizeof state, GRND_NONBLOCK) != sizeof state)
      state = uint64_t(reinterpret_cast<uintptr_t>(&state)) ^ uint64_t(time(nullptr));
    state |= 1;
  }
  state ^= state << 13;  // xorshift64
  state ^= state >> 7;
  state ^= state << 17;
  return uint8_t(state >> 32);
}

}  // namespace

uint32_t mw_next_key(const Mw *mw) {
  const ibv_mw *w = mw_verbs(const_cast<Mw *>(mw));
  // A new key byte, never the one the window had (a key the peer may hold from before).
  uint8_t b = key_byte();
  if (b == uint8_t(w->rkey)) b = uint8_t(b + 1 + key_byte() % 255);
  return (w->rkey & ~0xffu) | b;
}

int post_bind(CmId *id, WorkCtx *ctx, Mw *mw, const Mr *mr, void *addr, size_t len,
              unsigned access, uint32_t rkey) {
  if (ctx->op != Op::Bind) return IBMSG_EINVAL;
  int err = IBMSG_OK;
  ibv_send_wr *wr = chain_next(id, &err);
  if (!wr) return err;
  ibv_mw *w = mw_verbs(mw);
  unsigned flags = 0;
  if (access & kRemoteRead) flags |= IBV_ACCESS_REMOTE_READ;
  if (access & kRemoteWrite) flags |= IBV_ACCESS_REMOTE_WRITE;
  if (access & kRemoteAtomic) flags |= IBV_ACCESS_REMOTE_ATOMIC;
  wr->wr_id = reinterpret_cast<uintptr_t>(ctx);
  wr->opcode = IBV_WR_BIND_MW;
  wr->num_sge = 0;
  wr->send_flags = IBV_SEND_SIGNALED;
  wr->bind_mw.mw = w;
  wr->bind_mw.rkey = rkey;
  wr->bind_mw.bind_info.mr = mr_verbs(mr);
  wr->bind_mw.bind_info.addr = reinterpret_cast<uintptr_t>(addr);
  wr->bind_mw.bind_info.length = len;
  wr->bind_mw.bind_info.mw_access_flags = flags;
  return IBMSG_OK;
}

bool qp_failed(CmId *id) {
  if (!id->qp) return false;
  ibv_qp_attr attr;
  ibv_qp_init_attr init;
  if (ibv_query_qp(id->qp, &attr, IBV_QP_STATE, &init)) return false;
  return attr.qp_state == IBV_QPS_ERR;
}

}  // namespace ibmsg::tp
