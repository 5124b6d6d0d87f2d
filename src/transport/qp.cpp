// libibverbs: the reliable-connected queue pair of a connection and the work requests posted on
// it. Every work request carries the core's WorkCtx in its wr_id.
#include <arpa/inet.h>

#include "transport/verbs.hpp"

namespace ibmsg::tp {

int qp_create(CmId *id, Device *dev, Cq *cq, QpCaps *caps) {
  ibv_qp_init_attr attr{};
  attr.send_cq = cq_verbs(cq);
  attr.recv_cq = cq_verbs(cq);
  attr.qp_type = IBV_QPT_RC;
  attr.sq_sig_all = 1;
  attr.cap.max_send_wr = caps->send_wrs;
  attr.cap.max_recv_wr = caps->recv_wrs;
  attr.cap.max_send_sge = 1;
  attr.cap.max_recv_sge = 1;
  attr.cap.max_inline_data = caps->max_inline;
  if (rdma_create_qp(raw(id), device_pd(dev), &attr)) {
    // Not every device offers inline data.
    attr.cap.max_inline_data = 0;
    if (rdma_create_qp(raw(id), device_pd(dev), &attr)) return alloc_error();
  }
  caps->max_inline = attr.cap.max_inline_data;
  return IBMSG_OK;
}

void qp_destroy(CmId *id) {
  if (id->qp) rdma_destroy_qp(raw(id));
}

int post_recv(CmId *id, WorkCtx *ctx, void *buf, uint32_t len, const Mr *mr) {
  ibv_sge sge;
  sge.addr = reinterpret_cast<uintptr_t>(buf);
  sge.length = len;
  sge.lkey = mr_lkey(mr);
  ibv_recv_wr wr{}, *bad = nullptr;
  wr.wr_id = reinterpret_cast<uintptr_t>(ctx);
  wr.sg_list = &sge;
  wr.num_sge = 1;
  return ibv_post_recv(id->qp, &wr, &bad) ? IBMSG_EIO : IBMSG_OK;
}

int post_send_imm(CmId *id, WorkCtx *ctx, const void *buf, uint32_t len, const Mr *mr,
                  uint32_t imm, uint32_t max_inline) {
  ibv_sge sge;
  ibv_send_wr wr{}, *bad = nullptr;
  if (len) {
    sge.addr = reinterpret_cast<uintptr_t>(buf);
    sge.length = len;
    sge.lkey = mr_lkey(mr);
    wr.sg_list = &sge;
    wr.num_sge = 1;
  }
  wr.wr_id = reinterpret_cast<uintptr_t>(ctx);
  wr.opcode = IBV_WR_SEND_WITH_IMM;
  wr.send_flags = IBV_SEND_SIGNALED | (len && len <= max_inline ? IBV_SEND_INLINE : 0);
  wr.imm_data = htonl(imm);
  return ibv_post_send(id->qp, &wr, &bad) ? IBMSG_EIO : IBMSG_OK;
}

int post_rdma(CmId *id, WorkCtx *ctx, const RdmaWr &w, uint32_t max_inline) {
  ibv_sge sge;
  sge.addr = reinterpret_cast<uintptr_t>(w.local);
  sge.length = w.len;
  sge.lkey = mr_lkey(w.mr);
  ibv_send_wr wr{}, *bad = nullptr;
  wr.wr_id = reinterpret_cast<uintptr_t>(ctx);
  wr.sg_list = &sge;
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
    default: return IBMSG_EINVAL;
  }
  return ibv_post_send(id->qp, &wr, &bad) ? IBMSG_EIO : IBMSG_OK;
}

}  // namespace ibmsg::tp
