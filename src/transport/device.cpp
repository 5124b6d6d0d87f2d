// rdma-core: a device's protection domain (one per device in the process, shared by the loops),
// a loop's completion channel, completion queues, memory registration.
#include <arpa/inet.h>
#include <fcntl.h>

#include <cstdio>
#include <mutex>
#include <new>

#include "transport/hoptrace.hpp"
#include "transport/verbs.hpp"

namespace ibmsg::tp {

// The registry's entry of a device (its ibv_context, librdmacm's, already one per process).
struct Domain {
  ibv_context *ctx;
  ibv_pd *pd;
  int refs;    // device objects and registrations; under g_domains.lock
  bool gone;   // its device went away: a device object opened later gets a domain of its own
  Domain *next;
};

struct Device {
  ibv_context *ctx;
  Domain *dom;
  ibv_comp_channel *channel;
  DeviceInfo info;
};

struct Cq {
  ibv_cq *cq;
  void *user;
};

struct Mr {
  ibv_mr *mr;
};

struct Mw {
  ibv_mw *mw;
};

namespace {

int set_nonblocking(int fd) {
  int flags = fcntl(fd, F_GETFL);
  return flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0 ? -1 : 0;
}

// Loops on different threads open and close their device objects, and regions hold domains,
// at any time: the registry is locked (a device object's open and close only, never the data
// path).
struct Domains {
  std::mutex lock;
  Domain *list = nullptr;
} g_domains;

int domain_get(ibv_context *ctx, Domain **out) {
  std::lock_guard<std::mutex> hold(g_domains.lock);
  for (Domain *x = g_domains.list; x; x = x->next) {
    if (x->ctx == ctx && !x->gone) {
      ++x->refs;
      *out = x;
      return IBMSG_OK;
    }
  }
  Domain *x = new (std::nothrow) Domain();
  if (!x) return IBMSG_ENOMEM;
  x->pd = ibv_alloc_pd(ctx);
  if (!x->pd) {
    int err = alloc_error();
    delete x;
    return err;
  }
  x->ctx = ctx;
  x->refs = 1;
  x->next = g_domains.list;
  g_domains.list = x;
  *out = x;
  return IBMSG_OK;
}

// Drops a reference (and with removed, retires the domain); whether it lives on.
bool domain_put(Domain *x, bool removed) {
  bool rescan;
  {
    std::lock_guard<std::mutex> hold(g_domains.lock);
    if (removed) x->gone = true;
    if (--x->refs > 0) return true;
    Domain **p = &g_domains.list;
    while (*p != x) p = &(*p)->next;
    *p = x->next;
    ibv_dealloc_pd(x->pd);
    rescan = x->gone;
  }
  delete x;
  // The removal of a device whose domain outlived the device objects (a region's registration
  // held it) completes once rdma-core rescans (device_close's caller did not).
  if (rescan) devices_rescan();
  return false;
}

}  // namespace

Domain *device_domain(const Device *d) { return d->dom; }

void domain_hold(Domain *x) {
  std::lock_guard<std::mutex> hold(g_domains.lock);
  ++x->refs;
}

void domain_release(Domain *x) { domain_put(x, false); }

int device_open(DeviceKey key, Device **out) {
  auto *ctx = static_cast<ibv_context *>(const_cast<void *>(key));
  if (!ctx) return IBMSG_ENODEV;
  Device *d = new (std::nothrow) Device();
  if (!d) return IBMSG_ENOMEM;
  d->ctx = ctx;
  ibv_device_attr attr;
  if (ibv_query_device(ctx, &attr)) {
    delete d;
    return IBMSG_ENODEV;
  }
  snprintf(d->info.name, sizeof d->info.name, "%s", ibv_get_device_name(ctx->device));
  d->info.iwarp = ctx->device->transport_type == IBV_TRANSPORT_IWARP;
  d->info.max_qp_wr = uint32_t(attr.max_qp_wr);
  d->info.max_cqe = uint32_t(attr.max_cqe);
  d->info.max_rd_atom = uint32_t(attr.max_qp_rd_atom);
  d->info.max_init_rd_atom = uint32_t(attr.max_qp_init_rd_atom);
  d->info.atomics = attr.atomic_cap != IBV_ATOMIC_NONE;
  d->info.max_srq_wr = attr.max_srq > 0 ? uint32_t(attr.max_srq_wr) : 0;
  d->info.mw_type2 = attr.max_mw > 0 && (attr.device_cap_flags & (IBV_DEVICE_MEM_WINDOW_TYPE_2A |
                                                                  IBV_DEVICE_MEM_WINDOW_TYPE_2B));
  // Every port of a device has the same limit on the devices ibmsg knows; port 1 is always there.
  ibv_port_attr port;
  d->info.max_msg_size = ibv_query_port(ctx, 1, &port) == 0 && port.max_msg_sz ? port.max_msg_sz
                                                                                : uint64_t(1) << 31;
  if (int err = domain_get(ctx, &d->dom)) {
    delete d;
    return err;
  }
  d->channel = ibv_create_comp_channel(ctx);
  if (!d->channel || set_nonblocking(d->channel->fd)) {
    if (d->channel) ibv_destroy_comp_channel(d->channel);
    domain_put(d->dom, false);
    delete d;
    return IBMSG_ESYS;
  }
  *out = d;
  return IBMSG_OK;
}

bool device_close(Device *d, bool removed) {
  ibv_destroy_comp_channel(d->channel);
  const bool kept = domain_put(d->dom, removed);
  delete d;
  return kept;
}

int device_fd(const Device *d) { return d->channel->fd; }

bool device_gone(const Device *d) {
  int n = 0;
  ibv_device **list = ibv_get_device_list(&n);
  if (!list) return false;  // cannot tell: assume present
  bool found = false;
  for (int i = 0; i < n && !found; ++i) found = list[i] == d->ctx->device;
  ibv_free_device_list(list);
  return !found;
}
const DeviceInfo &device_info(const Device *d) { return d->info; }

int device_take_events(Device *d, void (*ready)(void *cq_user, void *arg), void *arg) {
  // One event per call: reading on until EAGAIN would cost a read() that finds nothing on every
  // wake-up. The channel's fd stays readable while events are left, so the loop calls again.
  ibv_cq *cq;
  void *ctx;
  if (ibv_get_cq_event(d->channel, &cq, &ctx) != 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return IBMSG_OK;
    return errno == ENODEV || errno == EIO ? IBMSG_ENODEV : from_errno(errno);
  }
  Cq *c = static_cast<Cq *>(ctx);
  ibv_ack_cq_events(c->cq, 1);
  ready(c->user, arg);
  return IBMSG_OK;
}

int cq_create(Device *d, uint32_t depth, void *user, Cq **out) {
  return make_handle(out, [&](Cq *c) {
    c->user = user;
    c->cq = ibv_create_cq(d->ctx, int(depth), c, d->channel, 0);
    if (!c->cq) return alloc_error();
    if (ibv_req_notify_cq(c->cq, 0)) {
      ibv_destroy_cq(c->cq);
      return int(IBMSG_ESYS);
    }
    return int(IBMSG_OK);
  });
}

int cq_resize(Cq *c, uint32_t depth) {
  return ibv_resize_cq(c->cq, int(depth)) ? from_errno(errno) : IBMSG_OK;
}

int cq_arm(Cq *c) { return ibv_req_notify_cq(c->cq, 0) ? IBMSG_EIO : IBMSG_OK; }

void cq_destroy(Cq *c) {
  ibv_destroy_cq(c->cq);
  delete c;
}

int cq_poll(Cq *c, Completion *out, int max) {
  ibv_wc wc[32];
  if (max > 32) max = 32;
  int n = ibv_poll_cq(c->cq, max, wc);
  if (n == 0) hoptrace::poll_empty();
  for (int i = 0; i < n; ++i) {
    Completion &o = out[i];
    o.ctx = reinterpret_cast<WorkCtx *>(uintptr_t(wc[i].wr_id));
    switch (wc[i].status) {
      case IBV_WC_SUCCESS: o.status = WcStatus::Ok; break;
      case IBV_WC_WR_FLUSH_ERR: o.status = WcStatus::Flushed; break;
      case IBV_WC_REM_ACCESS_ERR: o.status = WcStatus::RemoteAccess; break;
      case IBV_WC_RETRY_EXC_ERR: o.status = WcStatus::Timeout; break;
      default: o.status = WcStatus::Failed; break;
    }
    o.write_imm = wc[i].status == IBV_WC_SUCCESS && wc[i].opcode == IBV_WC_RECV_RDMA_WITH_IMM;
    o.has_imm = (wc[i].wc_flags & IBV_WC_WITH_IMM) != 0;
    o.imm = o.has_imm ? ntohl(wc[i].imm_data) : 0;
    o.len = wc[i].byte_len;
    o.qp_num = wc[i].qp_num;
    if (wc[i].status == IBV_WC_SUCCESS && (wc[i].opcode & IBV_WC_RECV))
      hoptrace::recv_found();  // a receive or a write's immediate
    o.status_text = wc[i].status == IBV_WC_SUCCESS ? nullptr : ibv_wc_status_str(wc[i].status);
  }
  return n;
}

int mr_register(Device *d, void *addr, size_t len, unsigned access, Mr **out) {
  return mr_register(d->dom, addr, len, access, out);
}

int mr_register(Domain *x, void *addr, size_t len, unsigned access, Mr **out) {
  int flags = access & kLocalReadOnly ? 0 : IBV_ACCESS_LOCAL_WRITE;
  if (access & kRemoteRead) flags |= IBV_ACCESS_REMOTE_READ;
  if (access & kRemoteWrite) flags |= IBV_ACCESS_REMOTE_WRITE;
  if (access & kRemoteAtomic) flags |= IBV_ACCESS_REMOTE_ATOMIC;
  if (access & kMwBind) flags |= IBV_ACCESS_MW_BIND;
  return make_handle(out, [&](Mr *m) {
    m->mr = ibv_reg_mr(x->pd, addr, len, flags);
    return m->mr ? int(IBMSG_OK) : alloc_error();
  });
}

void mr_deregister(Mr *m) {
  if (!m) return;
  ibv_dereg_mr(m->mr);
  delete m;
}

uint32_t mr_lkey(const Mr *m) { return m->mr->lkey; }
uint32_t mr_rkey(const Mr *m) { return m->mr->rkey; }

int mw_alloc(Device *d, Mw **out) {
  return make_handle(out, [&](Mw *w) {
    w->mw = ibv_alloc_mw(d->dom->pd, IBV_MW_TYPE_2);
    if (w->mw) return int(IBMSG_OK);
    return errno == EOPNOTSUPP || errno == ENOSYS ? int(IBMSG_EOPNOTSUPP) : alloc_error();
  });
}

void mw_dealloc(Mw *w) {
  if (!w) return;
  ibv_dealloc_mw(w->mw);
  delete w;
}

ibv_mw *mw_verbs(Mw *w) { return w->mw; }
ibv_mr *mr_verbs(const Mr *m) { return m->mr; }

// For qp.cpp: the verbs objects behind the handles.
ibv_pd *device_pd(Device *d) { return d->dom->pd; }
ibv_cq *cq_verbs(Cq *c) { return c->cq; }

}  // namespace ibmsg::tp
