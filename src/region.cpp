// Application memory regions: registered once per device's protection domain, which the loops
// of the process on that device share (eagerly on the devices the loop has open at
// registration, lazily on others, by whichever loop's connection needs it first), so that a
// region serves the connections of every loop; and grants: what stands behind remote
// descriptors. A grant is a registration of its own because a memory window does not confine
// remote access to its range on every device (rxe checks the underlying region's range), while a
// registration of exactly the granted bytes does. A grant for one connection is a type-2 memory
// window over that registration, bound to the connection's queue pair: a peer on another
// connection of the device that learns or guesses its key gets a remote access error, as does
// one that uses the registration's own key (it grants no remote right). A device-wide grant is
// the registration with the rights itself: any connection of the device may use its key.
#include "region.hpp"

#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <new>

#include "internal.hpp"

namespace ibmsg {
namespace {

size_t page_size() {
  long p = sysconf(_SC_PAGESIZE);
  return p > 0 ? size_t(p) : 4096;
}

uintptr_t region_check(const ibmsg_region *pub, const Region *r) {
  return reinterpret_cast<uintptr_t>(r) ^ reinterpret_cast<uintptr_t>(pub) ^ 0x1b5e610a5eedull;
}

constexpr unsigned kRemoteRights =
    IBMSG_ACCESS_REMOTE_READ | IBMSG_ACCESS_REMOTE_WRITE | IBMSG_ACCESS_REMOTE_ATOMIC;
static_assert(kRemoteRights == wire::kDescRights, "a descriptor's rights byte holds the remote rights");
constexpr unsigned kAllRights = IBMSG_ACCESS_LOCAL_WRITE | kRemoteRights;

// The transport's access flags for local use of the region, or for a grant of rights.
unsigned tp_access(unsigned rights, bool local_write) {
  unsigned a = 0;
  if (rights & IBMSG_ACCESS_REMOTE_READ) a |= tp::kRemoteRead;
  if (rights & IBMSG_ACCESS_REMOTE_WRITE) a |= tp::kRemoteWrite;
  if (rights & IBMSG_ACCESS_REMOTE_ATOMIC) a |= tp::kRemoteAtomic;
  // Verbs need local write beside remote write and atomics.
  if (!local_write && !(rights & (IBMSG_ACCESS_REMOTE_WRITE | IBMSG_ACCESS_REMOTE_ATOMIC)))
    a |= tp::kLocalReadOnly;
  return a;
}

tp::Mr *find_reg(const Region *r, const tp::Domain *dom) {
  for (Region::Reg *g = r->regs.load(std::memory_order_acquire); g; g = g->next)
    if (g->dom == dom) return g->mr;
  return nullptr;
}

// Registers r for local use on dom (local write if any right needs it), unless another loop's
// thread just did. The registration holds the domain: it outlives the device objects of the
// loops, until deregistration.
tp::Mr *add_reg(Region *r, tp::Domain *dom, int *err) {
  std::lock_guard<std::mutex> hold(r->lock);
  if (tp::Mr *mr = find_reg(r, dom)) return mr;
  auto *g = new (std::nothrow) Region::Reg();
  if (!g) {
    *err = IBMSG_ENOMEM;
    return nullptr;
  }
  *err = tp::mr_register(dom, r->addr, r->length,
                         tp_access(0, r->access & IBMSG_ACCESS_LOCAL_WRITE), &g->mr);
  if (*err) {
    delete g;
    return nullptr;
  }
  g->dom = dom;
  tp::domain_hold(dom);
  g->next = r->regs.load(std::memory_order_relaxed);
  r->regs.store(g, std::memory_order_release);
  return g->mr;
}

// Deregistration only: no other thread may look them up any more.
void drop_regs(Region *r) {
  Region::Reg *g = r->regs.exchange(nullptr, std::memory_order_acquire);
  while (g) {
    Region::Reg *next = g->next;
    tp::mr_deregister(g->mr);
    tp::domain_release(g->dom);
    delete g;
    g = next;
  }
}

// Posts the bind of g's window on its connection (up). A queue pair that refuses a work request
// is broken: the connection closes (its teardown drops what was queued: the window is not bound).
int post_window(Socket *s, Grant *g) {
  const unsigned rights = g->access & kRemoteRights;
  int err = tp::post_bind(s->id, &g->bind, g->mw, g->mr, g->region->addr + g->offset, g->length,
                          tp_access(rights, false) & ~tp::kLocalReadOnly, g->key);
  if (!err) err = posted(s, true);
  if (err) {
    socket_close(s, err);
    return err;
  }
  g->waiting = false;
  g->binding = true;
  ++s->grants.binding;
  ++g->region->busy;  // deregistration waits for the bind (a window must not go while it binds)
  return IBMSG_OK;
}

// Its window (invalidated) and registration go; no bind of it may be in flight, unless its
// queue pair is gone.
void drop_grant(Grant *g) {
  {
    std::lock_guard<std::mutex> hold(g->region->lock);
    g->region->grants.remove(g);
  }
  if (g->conn) g->conn->grants.list.remove(g);
  tp::mw_dealloc(g->mw);
  tp::mr_deregister(g->mr);
  if (g->dev) device_put(g->dev);
  if (g->dom) tp::domain_release(g->dom);
  delete g;
}

}  // namespace

Region *region_of(const ibmsg_region *pub) {
  if (!pub || !pub->impl || pub->check != region_check(pub, pub->impl)) return nullptr;
  Region *r = pub->impl;
  return r->magic == kRegionMagic && r->pub == pub ? r : nullptr;
}

int region_register(Loop *loop, ibmsg_region *pub, void *addr, size_t len, unsigned access,
                    bool allocate) {
  if (!pub || len == 0 || (access & ~kAllRights) || (!allocate && !addr)) return IBMSG_EINVAL;
  if (region_of(pub)) return IBMSG_ESTATE;
  if (access & (IBMSG_ACCESS_REMOTE_WRITE | IBMSG_ACCESS_REMOTE_ATOMIC))
    access |= IBMSG_ACCESS_LOCAL_WRITE;
  Region *r = new (std::nothrow) Region();
  if (!r) return IBMSG_ENOMEM;
  if (allocate) {
    const size_t page = page_size();
    size_t bytes = (len + page - 1) & ~(page - 1);
    if (bytes < len || posix_memalign(&addr, 4096, bytes) != 0) {
      delete r;
      return IBMSG_ENOMEM;
    }
    memset(addr, 0, bytes);
    r->owned = true;
  }
  r->loop = loop;
  r->pub = pub;
  r->addr = static_cast<uint8_t *>(addr);
  r->length = len;
  r->access = access;
  int err = IBMSG_OK;
  for (Device *d = loop->devices.front(); d && !err; d = loop->devices.next(d))
    if (d->refs > 0 && !d->removed) add_reg(r, tp::device_domain(d->tp), &err);
  if (err) {
    drop_regs(r);
    if (r->owned) free(r->addr);
    delete r;
    return err;
  }
  loop->regions.push_back(r);
  pub->addr = r->addr;
  pub->length = len;
  pub->access = access;
  pub->impl = r;
  pub->check = region_check(pub, r);
  memset(pub->reserved, 0, sizeof pub->reserved);
  return IBMSG_OK;
}

int region_deregister(Region *r) {
  if (r->busy.load()) return IBMSG_EBUSY;
  {
    // Another loop's connection's grants are its thread's to drop (their windows, its device
    // object); device-wide ones hold only the shared domain and go from here.
    std::lock_guard<std::mutex> hold(r->lock);
    for (Grant *g = r->grants.front(); g; g = r->grants.next(g))
      if (g->dev && g->dev->loop != r->loop) return IBMSG_EBUSY;
  }
  while (Grant *g = r->grants.front()) drop_grant(g);
  drop_regs(r);
  r->loop->regions.remove(r);
  ibmsg_region *pub = r->pub;
  if (r->owned) free(r->addr);
  pub->impl = nullptr;
  pub->check = 0;
  r->magic = 0;
  delete r;
  return IBMSG_OK;
}

tp::Mr *region_mr(Region *r, Device *dev, int *err) {
  tp::Domain *dom = tp::device_domain(dev->tp);
  if (tp::Mr *mr = find_reg(r, dom)) return mr;
  return add_reg(r, dom, err);
}

int region_descriptor(Region *r, Socket *s, size_t off, size_t len, unsigned access,
                      ibmsg_descriptor *out) {
  const unsigned rights = access & kRemoteRights;
  const bool wide = (access & IBMSG_ACCESS_DEVICE_WIDE) != 0;
  if (!out || len == 0 || rights == 0 || (access & ~(kRemoteRights | IBMSG_ACCESS_DEVICE_WIDE)))
    return IBMSG_EINVAL;
  if (s->listener) return IBMSG_ESTATE;
  if (off > r->length || len > r->length - off) return IBMSG_ERANGE;
  if ((rights & r->access) != rights) return IBMSG_EACCES;
  if (!s->dev) return IBMSG_ENOTCONN;
  if (!(s->opts.rdma)) return IBMSG_EOPNOTSUPP;
  // A window is bound on the connection's queue pair: now if it is up, else once it is.
  const bool up = s->state == State::Connected && s->res.has_qp;
  if (!wide && (s->state == State::Lingering || s->state == State::Closing ||
                s->state == State::Closed))
    return IBMSG_ENOTCONN;
  if (!wide && !tp::device_info(s->dev->tp).mw_type2) return IBMSG_EOPNOTSUPP;
  {
    std::lock_guard<std::mutex> hold(r->lock);
    for (Grant *g = r->grants.front(); g; g = r->grants.next(g)) {
      const bool same = wide ? !g->conn && g->dom == tp::device_domain(s->dev->tp) : g->conn == s;
      if (same && g->offset == off && g->length == len && g->access == access) {
        memcpy(out->bytes, g->desc, sizeof g->desc);
        return IBMSG_OK;
      }
    }
  }
  if (!wide && up && s->grants.binding >= kBindDepth) return IBMSG_EAGAIN;
  auto *g = new (std::nothrow) Grant();
  if (!g) return IBMSG_ENOMEM;
  g->dev = wide ? nullptr : s->dev;
  g->dom = wide ? tp::device_domain(s->dev->tp) : nullptr;
  g->region = r;
  g->offset = off;
  g->length = len;
  g->access = access;
  g->bind.owner = g;
  // The window's registration grants no remote right of its own (its key is the device's, as
  // guessable as any): local write only where the window's rights need it.
  const unsigned reg_access =
      wide ? tp_access(rights, false)
           : tp::kMwBind | (rights & (IBMSG_ACCESS_REMOTE_WRITE | IBMSG_ACCESS_REMOTE_ATOMIC)
                                ? tp::kLocal
                                : tp::kLocalReadOnly);
  int err = wide ? tp::mr_register(g->dom, r->addr + off, len, reg_access, &g->mr)
                 : tp::mr_register(s->dev->tp, r->addr + off, len, reg_access, &g->mr);
  if (!err && !wide) err = tp::mw_alloc(s->dev->tp, &g->mw);
  if (!err && !wide) {
    g->key = tp::mw_next_key(g->mw);
    if (up) err = post_window(s, g);
    else g->waiting = true;
  } else if (!err) {
    g->key = tp::mr_rkey(g->mr);
  }
  if (err) {
    tp::mw_dealloc(g->mw);
    tp::mr_deregister(g->mr);
    if (g->binding) --r->busy;  // (cannot happen: a failed post does not bind)
    delete g;
    return err;
  }
  if (!wide) {
    g->conn = s;
    s->grants.list.push_back(g);
  }
  wire::Descriptor d;
  d.access = uint8_t(rights);
  d.rkey = g->key;
  d.addr = reinterpret_cast<uintptr_t>(r->addr + off);
  d.length = len;
  wire::encode_descriptor(d, g->desc);
  if (wide) tp::domain_hold(g->dom);
  else ++s->dev->refs;
  {
    std::lock_guard<std::mutex> hold(r->lock);
    r->grants.push_back(g);
  }
  memcpy(out->bytes, g->desc, sizeof g->desc);
  return IBMSG_OK;
}

// On the thread of the loop of the grant's connection (device).
int region_revoke(Region *r, const ibmsg_descriptor *d) {
  if (!d) return IBMSG_EINVAL;
  Grant *found = nullptr;
  {
    std::lock_guard<std::mutex> hold(r->lock);
    for (Grant *g = r->grants.front(); g && !found; g = r->grants.next(g))
      if (memcmp(g->desc, d->bytes, wire::kDescriptorSize) == 0) found = g;
    // Deallocating a window whose bind is in flight would fail the bind and with it the
    // connection: it goes at the bind's completion, a moment from now.
    if (found && found->binding) {
      r->grants.remove(found);
      found->revoked = true;
      return IBMSG_OK;
    }
  }
  if (!found) return IBMSG_EBADDESC;
  drop_grant(found);
  return IBMSG_OK;
}

void grant_on_bind(Socket *s, Grant *g, const tp::Completion &wc) {
  if (!g->binding) return;  // (cannot happen: one completion per bind)
  g->binding = false;
  --s->grants.binding;
  Region *r = g->region;
  if (g->revoked) drop_grant(g);
  // Last: once it is 0, the region's own thread may deregister and free it.
  --r->busy;
  if (wc.status != tp::WcStatus::Ok && wc.status != tp::WcStatus::Flushed)
    socket_close(s, tp::wc_error(wc.status));
}

void grants_established(Socket *s) {
  for (Grant *g = s->grants.list.front(); g && s->state == State::Connected;
       g = s->grants.list.next(g))
    if (g->waiting) post_window(s, g);
}

void grants_unbind(Socket *s) {
  // A bind still in flight cannot execute any more (the QP is in the error state): it completes
  // flushed, naming the grant, which stays until grants_closed.
  for (Grant *g = s->grants.list.front(); g; g = s->grants.list.next(g)) {
    tp::mw_dealloc(g->mw);
    g->mw = nullptr;
  }
}

void grants_closed(Socket *s) {
  // The queue pair is gone (and its completions polled): no bind is in flight any more; the
  // windows went before it, their registrations go now.
  while (Grant *g = s->grants.list.front()) {
    Region *r = g->region;
    const bool binding = g->binding;
    drop_grant(g);
    if (binding) --r->busy;  // last: the region may go once it is 0 (another loop's thread)
  }
  s->grants.binding = 0;
}

}  // namespace ibmsg
