#include "verbs.hpp"

#include <arpa/inet.h>

#include <cerrno>
#include <cstring>

namespace ibmsg {

int pool_register(Device *dev, Pool *p) {
  ibv_mr *mr = ibv_reg_mr(dev->pd, p->mem, p->bytes, IBV_ACCESS_LOCAL_WRITE);
  if (!mr) return errno == ENOMEM ? IBMSG_ENOMEM : IBMSG_ESYS;
  p->mr = mr;
  return IBMSG_OK;
}

void pool_deregister(Pool *p) {
  if (p->mr) ibv_dereg_mr(static_cast<ibv_mr *>(p->mr));
  p->mr = nullptr;
}

static uint32_t lkey(const Pool *p) { return static_cast<const ibv_mr *>(p->mr)->lkey; }

int post_recv(Socket *s, Slot *slot) {
  ibv_sge sge;
  sge.addr = reinterpret_cast<uintptr_t>(slot->buf);
  sge.length = uint32_t(slot->pool->slot_size);
  sge.lkey = lkey(slot->pool);
  ibv_recv_wr wr{}, *bad = nullptr;
  wr.wr_id = reinterpret_cast<uintptr_t>(slot);
  wr.sg_list = &sge;
  wr.num_sge = 1;
  int rc = ibv_post_recv(s->qp, &wr, &bad);
  if (rc) return IBMSG_EIO;
  slot->state = SlotState::Posted;
  return IBMSG_OK;
}

int post_data(Socket *s, Slot *slot, uint32_t imm) {
  size_t size = slot->msg->size;
  ibv_sge sge;
  sge.addr = reinterpret_cast<uintptr_t>(slot->buf);
  sge.length = uint32_t(size);
  sge.lkey = lkey(slot->pool);
  ibv_send_wr wr{}, *bad = nullptr;
  wr.wr_id = reinterpret_cast<uintptr_t>(slot);
  wr.sg_list = size ? &sge : nullptr;
  wr.num_sge = size ? 1 : 0;
  wr.opcode = IBV_WR_SEND_WITH_IMM;
  wr.send_flags = IBV_SEND_SIGNALED | (size && size <= s->max_inline ? IBV_SEND_INLINE : 0);
  wr.imm_data = htonl(imm);
  return ibv_post_send(s->qp, &wr, &bad) ? IBMSG_EIO : IBMSG_OK;
}

int post_ctrl(Socket *s, uint32_t imm) {
  ibv_send_wr wr{}, *bad = nullptr;
  wr.wr_id = kCtrlWrId;
  wr.num_sge = 0;
  wr.opcode = IBV_WR_SEND_WITH_IMM;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.imm_data = htonl(imm);
  return ibv_post_send(s->qp, &wr, &bad) ? IBMSG_EIO : IBMSG_OK;
}

static Pool *make_pool(Socket *s, bool recv, uint32_t count, int *err) {
  Pool *p = pool_create(recv, count, size_t(s->opts.max_msg_size));
  if (!p) {
    *err = IBMSG_ENOMEM;
    return nullptr;
  }
  *err = pool_register(s->dev, p);
  if (*err) {
    pool_destroy(p);
    return nullptr;
  }
  p->owner = s;
  p->loop = s->loop;
  ++s->loop->live_pools;
  return p;
}

int conn_create(Socket *s) {
  const uint32_t recv_slots = uint32_t(s->opts.recv_depth) + kCtrlDepth;
  const uint32_t send_wrs = uint32_t(s->opts.send_depth) + kCtrlDepth;
  int err = IBMSG_OK;

  s->cq = ibv_create_cq(s->dev->ctx, int(recv_slots + send_wrs), s, s->dev->channel, 0);
  if (!s->cq) return errno == ENOMEM ? IBMSG_ENOMEM : IBMSG_ESYS;
  if (ibv_req_notify_cq(s->cq, 0)) {
    err = IBMSG_ESYS;
    goto fail;
  }

  {
    ibv_qp_init_attr attr{};
    attr.send_cq = s->cq;
    attr.recv_cq = s->cq;
    attr.qp_type = IBV_QPT_RC;
    attr.sq_sig_all = 1;
    attr.cap.max_send_wr = send_wrs;
    attr.cap.max_recv_wr = recv_slots;
    attr.cap.max_send_sge = 1;
    attr.cap.max_recv_sge = 1;
    // Small messages go inline (no DMA read of the payload); not every device offers it.
    attr.cap.max_inline_data = 256;
    if (rdma_create_qp(s->id, s->dev->pd, &attr)) {
      attr.cap.max_inline_data = 0;
      if (rdma_create_qp(s->id, s->dev->pd, &attr)) {
        err = errno == ENOMEM ? IBMSG_ENOMEM : IBMSG_ESYS;
        goto fail;
      }
    }
    s->qp = s->id->qp;
    s->max_inline = attr.cap.max_inline_data;
  }

  s->send_pool = make_pool(s, false, uint32_t(s->opts.send_depth), &err);
  if (!s->send_pool) goto fail;
  s->recv_pool = make_pool(s, true, recv_slots, &err);
  if (!s->recv_pool) goto fail;
  for (uint32_t i = 0; i < recv_slots; ++i) {
    err = post_recv(s, &s->recv_pool->slots[i]);
    if (err) goto fail;
  }
  return IBMSG_OK;

fail:
  if (s->send_pool) pool_release(s->send_pool);
  if (s->recv_pool) pool_release(s->recv_pool);
  s->send_pool = s->recv_pool = nullptr;
  conn_destroy_queues(s);
  return err;
}

void conn_destroy_queues(Socket *s) {
  if (s->qp) rdma_destroy_qp(s->id);
  s->qp = nullptr;
  if (s->cq) {
    if (s->cq_events) ibv_ack_cq_events(s->cq, s->cq_events);
    s->cq_events = 0;
    ibv_destroy_cq(s->cq);
  }
  s->cq = nullptr;
}

}  // namespace ibmsg
