// One-sided RDMA as the core holds it: application regions and the connection's operations
// (region.cpp, rdma.cpp).
#pragma once
#include <cstddef>
#include <cstdint>

#include "ibmsg.h"
#include "list.hpp"
#include "pool.hpp"
#include "transport/transport.hpp"
#include "wire.hpp"

namespace ibmsg {
struct Device;
constexpr uint32_t kRegionMagic = 0x1b5e610a;
constexpr uint32_t kOpMagic = 0x1b50b0b0;
}  // namespace ibmsg

// An application memory region (ibmsg_region). Its registrations belong to the devices they are
// on (each holds a reference), its grants are the exact-range registrations behind descriptors.
struct ibmsg__region {
  struct Reg {
    ibmsg::Device *dev;
    ibmsg::tp::Mr *mr;
    ibmsg::ListNode node;
  };
  struct Grant {
    ibmsg::Device *dev;
    size_t offset, length;
    unsigned access;
    ibmsg::tp::Mr *mr;
    uint8_t desc[ibmsg::wire::kDescriptorSize];
    ibmsg::ListNode node;
  };
  uint32_t magic = ibmsg::kRegionMagic;
  ibmsg::Loop *loop = nullptr;
  ibmsg_region *pub = nullptr;
  uint8_t *addr = nullptr;
  size_t length = 0;
  unsigned access = 0;
  bool owned = false;   // ibmsg_alloc_region's memory: freed on deregistration
  uint32_t busy = 0;    // this side's operations queued or in flight on it
  ibmsg::List<Reg, &Reg::node> regs;
  ibmsg::List<Grant, &Grant::node> grants;
  ibmsg::ListNode loop_node;
};

// A one-sided operation as a connection holds it: an entry of its operation table, lent to the
// application's ibmsg_op from posting until the done callback.
struct ibmsg__op {
  uint32_t magic = ibmsg::kOpMagic;
  ibmsg_op *pub = nullptr;
  ibmsg__socket *sock = nullptr;
  ibmsg__region *local = nullptr;
  ibmsg::Work work;
  ibmsg::tp::RdmaWr rw{};
  ibmsg::ListNode free_link;
};
