// Where a large message goes (ibmsg(7), LARGE MESSAGES): the message_incoming callback may put
// it in a region of the application's or decline it, before any data moves; one that would need
// a library buffer larger than the loop's IBMSG_OPT_RNDV_MEMORY is declined (rndv_memory.hpp).
#include "incoming.hpp"

#include "internal.hpp"
#include "recv.hpp"
#include "rndv_memory.hpp"

namespace ibmsg {
namespace {

// The message_incoming callback's handle while it runs on this thread (its functions compare
// before they read anything through it: a kept copy is refused, not followed).
thread_local const ibmsg_incoming *g_incoming = nullptr;

}  // namespace

void incoming_choose(Socket *s, Slot *slot, ibmsg_request *answers) {
  RndvIn &in = slot->in;
  if (auto cb = s->loop->pub->message_incoming) {
    ibmsg_incoming inc{};
    inc.size = slot->own.size;
    inc.imm = slot->own.imm;
    inc.flags = slot->own.flags;
    inc.impl = slot;
    inc.request = answers;
    g_incoming = &inc;
    cb(s->pub, &inc);
    g_incoming = nullptr;
  }
  if (!in.declined && !in.region && rndv_dest_bytes(in.length) > s->loop->opts.rndv_memory) {
    in.declined = true;  // not for a region, and larger than the loop's rendezvous memory
    IBMSG_LOG(s, IBMSG_LOG_WARN,
              "declined a message of %llu bytes: more than IBMSG_OPT_RNDV_MEMORY (%llu)",
              static_cast<unsigned long long>(in.length),
              static_cast<unsigned long long>(s->loop->opts.rndv_memory));
  }
}

int incoming_to_region(ibmsg_incoming *inc, Region *r, size_t off) {
  if (!inc || inc != g_incoming || !r) return IBMSG_EINVAL;  // outside its callback
  Slot *slot = inc->impl;
  Socket *s = recv_owner(slot);
  RndvIn &in = slot->in;
  if (in.declined || in.region) return IBMSG_ESTATE;
  if (off > r->length || in.length > r->length - off) return IBMSG_ERANGE;
  if (!(r->access & IBMSG_ACCESS_LOCAL_WRITE)) return IBMSG_EACCES;
  int err = IBMSG_OK;
  const tp::Mr *mr = region_mr(r, s->dev, &err);
  if (!mr) return err;
  in.dest = r->addr + off;
  in.dest_mr = mr;
  in.region = r;
  ++r->busy;  // the reads write into it, and the message points into it until it is freed
  return IBMSG_OK;
}

int incoming_decline(ibmsg_incoming *inc) {
  if (!inc || inc != g_incoming) return IBMSG_EINVAL;  // outside its callback
  Slot *slot = inc->impl;
  if (slot->in.declined || slot->in.region) return IBMSG_ESTATE;
  slot->in.declined = true;
  return IBMSG_OK;
}

}  // namespace ibmsg
