// libibverbs: a shared receive queue (one per device and loop, in the core's shared receive pool).
#include <new>

#include "transport/verbs.hpp"

namespace ibmsg::tp {

struct Srq {
  ibv_srq *srq;
};

ibv_srq *srq_verbs(Srq *s) { return s->srq; }

int srq_create(Device *dev, uint32_t max_wr, Srq **out) {
  return make_handle(out, [&](Srq *s) {
    ibv_srq_init_attr attr{};
    attr.attr.max_wr = max_wr;
    attr.attr.max_sge = 1;
    s->srq = ibv_create_srq(device_pd(dev), &attr);
    return s->srq ? int(IBMSG_OK) : alloc_error();
  });
}

void srq_destroy(Srq *s) {
  if (!s) return;
  ibv_destroy_srq(s->srq);
  delete s;
}

int srq_post_recv(Srq *s, WorkCtx *ctx, void *buf, uint32_t len, const Mr *mr) {
  ibv_sge sge{};
  sge.addr = reinterpret_cast<uintptr_t>(buf);
  sge.length = len;
  sge.lkey = mr_lkey(mr);
  ibv_recv_wr wr{};
  wr.wr_id = reinterpret_cast<uintptr_t>(ctx);
  wr.sg_list = &sge;
  wr.num_sge = 1;
  ibv_recv_wr *bad = nullptr;
  return ibv_post_srq_recv(s->srq, &wr, &bad) ? IBMSG_EIO : IBMSG_OK;
}

}  // namespace ibmsg::tp
