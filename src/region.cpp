// Application memory regions: registered once per device of the loop (eagerly on the devices
// open at registration, lazily on later ones), and grants: the exact-range registrations behind
// remote descriptors. A grant is a registration of its own because a memory window does not
// confine remote access on every device (rxe checks the underlying region's range), while a
// registration of exactly the granted bytes does.
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

// Registers r for local use on dev (local write if any right needs it).
tp::Mr *add_reg(Region *r, Device *dev, int *err) {
  auto *g = new (std::nothrow) Region::Reg();
  if (!g) {
    *err = IBMSG_ENOMEM;
    return nullptr;
  }
  *err = tp::mr_register(dev->tp, r->addr, r->length,
                         tp_access(0, r->access & IBMSG_ACCESS_LOCAL_WRITE), &g->mr);
  if (*err) {
    delete g;
    return nullptr;
  }
  g->dev = dev;
  ++dev->refs;
  r->regs.push_back(g);
  return g->mr;
}

void drop_reg(Region *r, Region::Reg *g) {
  r->regs.remove(g);
  tp::mr_deregister(g->mr);
  device_put(g->dev);
  delete g;
}

void drop_grant(Region *r, Region::Grant *g) {
  r->grants.remove(g);
  tp::mr_deregister(g->mr);
  device_put(g->dev);
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
    if (d->refs > 0 && !d->removed) add_reg(r, d, &err);
  if (err) {
    while (Region::Reg *g = r->regs.front()) drop_reg(r, g);
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
  if (r->busy) return IBMSG_EBUSY;
  while (Region::Grant *g = r->grants.front()) drop_grant(r, g);
  while (Region::Reg *g = r->regs.front()) drop_reg(r, g);
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
  for (Region::Reg *g = r->regs.front(); g; g = r->regs.next(g))
    if (g->dev == dev) return g->mr;
  return add_reg(r, dev, err);
}

int region_descriptor(Region *r, Socket *s, size_t off, size_t len, unsigned access,
                      ibmsg_descriptor *out) {
  if (!out || len == 0 || access == 0 || (access & ~kRemoteRights)) return IBMSG_EINVAL;
  if (s->loop != r->loop || s->listener) return IBMSG_EINVAL;
  if (off > r->length || len > r->length - off) return IBMSG_ERANGE;
  if ((access & r->access) != access) return IBMSG_EACCES;
  if (!s->dev) return IBMSG_ENOTCONN;
  if (!(s->opts.rdma)) return IBMSG_EOPNOTSUPP;
  for (Region::Grant *g = r->grants.front(); g; g = r->grants.next(g)) {
    if (g->dev == s->dev && g->offset == off && g->length == len && g->access == access) {
      memcpy(out->bytes, g->desc, sizeof g->desc);
      return IBMSG_OK;
    }
  }
  auto *g = new (std::nothrow) Region::Grant();
  if (!g) return IBMSG_ENOMEM;
  int err = tp::mr_register(s->dev->tp, r->addr + off, len, tp_access(access, false), &g->mr);
  if (err) {
    delete g;
    return err;
  }
  g->dev = s->dev;
  g->offset = off;
  g->length = len;
  g->access = access;
  wire::Descriptor d;
  d.access = uint8_t(access);
  d.rkey = tp::mr_rkey(g->mr);
  d.addr = reinterpret_cast<uintptr_t>(r->addr + off);
  d.length = len;
  wire::encode_descriptor(d, g->desc);
  ++s->dev->refs;
  r->grants.push_back(g);
  memcpy(out->bytes, g->desc, sizeof g->desc);
  return IBMSG_OK;
}

int region_revoke(Region *r, const ibmsg_descriptor *d) {
  if (!d) return IBMSG_EINVAL;
  for (Region::Grant *g = r->grants.front(); g; g = r->grants.next(g)) {
    if (memcmp(g->desc, d->bytes, wire::kDescriptorSize) == 0) {
      drop_grant(r, g);
      return IBMSG_OK;
    }
  }
  return IBMSG_EBADDESC;
}

}  // namespace ibmsg
