// Application memory regions, their registrations and grants (region.cpp).
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>

#include "handles.hpp"
#include "ibmsg.h"
#include "list.hpp"
#include "pool.hpp"
#include "transport/transport.hpp"
#include "wire.hpp"

struct ibmsg__socket;
struct ibmsg__region;

namespace ibmsg {
struct Device;
constexpr uint32_t kRegionMagic = 0x1b5e610a;
// Binds of memory windows a connection has in flight at once: its queue pair has room for them
// beside its messages and operations. (4, not 8: with the defaults the send queue then takes 60
// work requests, under 64 -- conn.cpp, conn_open, says why that matters.)
constexpr uint32_t kBindDepth = 4;

// A grant (made on a connection's loop thread; a connection's is used and dropped there too, a
// device-wide one holds only the shared protection domain and goes from any loop): the exact-range
// registration behind a descriptor (a registration of exactly the granted bytes confines the
// peer to them on every device: a window alone does not on rxe) and, unless it is device-wide, a
// type-2 memory window bound over it on one connection's queue pair, whose key is the
// descriptor's (the registration itself then grants no remote right).
struct Grant {
  Device *dev;            // a connection's grant: its device (a reference); device-wide: nullptr
  tp::Domain *dom;        // device-wide: the device's protection domain (a reference, any thread)
  ::ibmsg__region *region;
  ::ibmsg__socket *conn;  // the connection its window is bound to; nullptr: device-wide
  size_t offset, length;
  unsigned access;        // IBMSG_ACCESS_REMOTE_* and IBMSG_ACCESS_DEVICE_WIDE
  tp::Mr *mr;
  tp::Mw *mw = nullptr;
  tp::WorkCtx bind{tp::Op::Bind, 0, nullptr};
  uint32_t key = 0;       // the window's key: the descriptor's
  bool waiting = false;   // made before its connection was up: bound when it is
  bool binding = false;   // its bind is in flight: the window must not go before it completes
  bool revoked = false;   // revoked while binding: goes once the bind completed
  uint8_t desc[wire::kDescriptorSize];
  ListNode node;          // in its region's grants (until revoked)
  ListNode conn_node;     // in its connection's grants
};

// A connection's grants: its windows go when it closes.
struct ConnGrants {
  List<Grant, &Grant::conn_node> list;
  uint32_t binding = 0;  // binds in flight (at most kBindDepth)
};
}  // namespace ibmsg

// An application memory region (ibmsg_region), registered on one loop and used by the
// connections of every loop on the same devices, from their threads. Its registrations are on
// the devices' protection domains (each holds a reference on its domain, not on a loop's device
// object, which belongs to its loop's thread); its grants (the descriptors made of it) belong to
// their connections' device objects and threads. What is fixed at registration is read freely.
struct ibmsg__region {
  struct Reg {
    ibmsg::tp::Domain *dom;
    ibmsg::tp::Mr *mr;
    Reg *next;  // set before the registration is published
  };
  using Grant = ibmsg::Grant;
  uint32_t magic = ibmsg::kRegionMagic;
  ibmsg::Loop *loop = nullptr;  // the one it was registered on (deregistered on its thread)
  ibmsg_region *pub = nullptr;
  uint8_t *addr = nullptr;
  size_t length = 0;
  unsigned access = 0;
  bool owned = false;   // ibmsg_alloc_region's memory: freed on deregistration
  // This side's operations queued or in flight on it, messages from or into it, binds in
  // flight: of any loop's connections.
  std::atomic<uint32_t> busy{0};
  // Added under lock, at the front, and looked up without it (an acquire load per lookup, on
  // every operation); removed only by deregistration, when no other thread may use the region.
  std::atomic<Reg *> regs{nullptr};
  std::mutex lock;  // adding registrations; the grants list
  ibmsg::List<Grant, &Grant::node> grants;
  ibmsg::ListNode loop_node;
};

namespace ibmsg {

using Region = ::ibmsg__region;
int region_register(Loop *loop, ibmsg_region *pub, void *addr, size_t len, unsigned access,
                    bool allocate);
// On r's loop's thread. IBMSG_EBUSY while busy or while a grant of another loop's connection or
// device is left (that loop's thread drops it).
int region_deregister(Region *r);
Region *region_of(const ibmsg_region *pub);  // validated impl or nullptr
// The registration of r on dev's protection domain (made now if none yet), for a connection of
// any loop on dev, from that loop's thread.
tp::Mr *region_mr(Region *r, Device *dev, int *err);
int region_descriptor(Region *r, Socket *s, size_t off, size_t len, unsigned access,
                      ibmsg_descriptor *out);
int region_revoke(Region *r, const ibmsg_descriptor *d);
void grant_on_bind(Socket *s, Grant *g, const tp::Completion &wc);  // a window's bind completed
// It is up: the windows of grants made before are bound now, ahead of anything posted on it.
void grants_established(Socket *s);
// Closing, its QP in the error state: its windows go (invalidated), before the QP.
void grants_unbind(Socket *s);
void grants_closed(Socket *s);  // its QP gone: the grants and their registrations go

}  // namespace ibmsg
