// One-sided operations as a connection holds them (rdma.cpp; posted and finished in the send
// queue by datapath.cpp).
#pragma once
#include <cstddef>
#include <cstdint>

#include "handles.hpp"
#include "ibmsg.h"
#include "list.hpp"
#include "pool.hpp"
#include "transport/transport.hpp"

namespace ibmsg {
constexpr uint32_t kOpMagic = 0x1b50b0b0;
}  // namespace ibmsg

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

namespace ibmsg {

using Op = ::ibmsg__op;
// What an operation does beyond its ranges.
struct OpArgs {
  ibmsg_op_type type;
  uint32_t imm;
  uint64_t compare_add, swap;
};
int op_post(Socket *s, ibmsg_op *pub, Region *local, size_t loff, size_t len,
            const ibmsg_descriptor *remote, size_t roff, const OpArgs &a);
int ops_open(Socket *s);      // the operation table (its first operation); freed with the socket
void op_on_wc(Socket *s, Op *op, const tp::Completion &wc);

}  // namespace ibmsg
