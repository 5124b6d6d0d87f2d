// One-sided operations on a connection: the checks before anything is posted, the operation
// table (no allocation per operation), posting in the connection's send order, completions and
// cancellation. Each posted operation gets exactly one done callback.
#include "rdma.hpp"

#include <new>

#include "internal.hpp"
#include "datapath.hpp"
#include "poll.hpp"

namespace ibmsg {
namespace {

// ibmsg_op.check: ties the public struct to its table entry, so that a struct that was never
// posted (any bytes) is not taken for one that is.
uintptr_t op_check(const ibmsg_op *pub, const Op *op) {
  return reinterpret_cast<uintptr_t>(op) ^ reinterpret_cast<uintptr_t>(pub) ^ 0x1b50b0b05eedull;
}

bool op_posted(const ibmsg_op *pub) {
  return pub->impl && pub->check == op_check(pub, pub->impl) && pub->impl->pub == pub;
}

unsigned right_for(ibmsg_op_type t) {
  switch (t) {
    case IBMSG_OP_READ: return IBMSG_ACCESS_REMOTE_READ;
    case IBMSG_OP_CAS:
    case IBMSG_OP_FADD: return IBMSG_ACCESS_REMOTE_ATOMIC;
    default: return IBMSG_ACCESS_REMOTE_WRITE;
  }
}

tp::Op wr_op(ibmsg_op_type t) {
  switch (t) {
    case IBMSG_OP_WRITE: return tp::Op::RdmaWrite;
    case IBMSG_OP_READ: return tp::Op::RdmaRead;
    case IBMSG_OP_WRITE_IMM: return tp::Op::WriteImm;
    default: return tp::Op::Atomic;
  }
}

// Everything that can be checked without the transport; IBMSG_OK or the code to return.
int check(Socket *s, Region *local, size_t loff, size_t len, const ibmsg_descriptor *remote,
          size_t roff, const OpArgs &a, wire::Descriptor *d) {
  if (s->listener) return IBMSG_ESTATE;
  if (s->state != State::Connected) return IBMSG_ENOTCONN;
  if (!(s->peer.features & wire::kFeatureRdma)) return IBMSG_EOPNOTSUPP;
  const bool atomic = a.type == IBMSG_OP_CAS || a.type == IBMSG_OP_FADD;
  if (atomic && !tp::device_info(s->dev->tp).atomics) return IBMSG_EOPNOTSUPP;
  if (len == 0 || len > UINT32_MAX) return IBMSG_EINVAL;
  if (loff > local->length || len > local->length - loff) return IBMSG_ERANGE;
  if ((a.type == IBMSG_OP_READ || atomic) && !(local->access & IBMSG_ACCESS_LOCAL_WRITE))
    return IBMSG_EACCES;
  if (!wire::decode_descriptor(remote->bytes, d)) return IBMSG_EBADDESC;
  if (roff > d->length || len > d->length - roff) return IBMSG_ERANGE;
  if (!(d->access & right_for(a.type))) return IBMSG_EACCES;
  if (atomic && (d->addr + roff) % 8 != 0) return IBMSG_EINVAL;
  return IBMSG_OK;
}

bool work_can_go_as(const Socket *s, tp::Op kind) {
  Work w;
  w.wr.op = kind;
  return work_can_go(s, &w);
}

}  // namespace

int ops_open(Socket *s) {
  const uint32_t n = uint32_t(s->opts.rdma_depth) + uint32_t(s->opts.send_queue);
  s->rdma.table.reset(new (std::nothrow) Op[n]);
  if (!s->rdma.table) return IBMSG_ENOMEM;
  for (uint32_t i = 0; i < n; ++i) {
    Op *op = &s->rdma.table[i];
    op->sock = s;
    op->work.wr.owner = op;
    s->rdma.free.push_back(op);
  }
  return IBMSG_OK;
}

int op_post(Socket *s, ibmsg_op *pub, Region *local, size_t loff, size_t len,
            const ibmsg_descriptor *remote, size_t roff, const OpArgs &a) {
  if (op_posted(pub)) return IBMSG_EINVAL;  // still posted: its callback has not run
  wire::Descriptor d;
  int err = check(s, local, loff, len, remote, roff, a, &d);
  if (err) return err;
  const bool go = s->tx.queue.empty() && work_can_go_as(s, wr_op(a.type));
  if (!go && s->tx.queue.size() >= size_t(s->opts.send_queue)) return IBMSG_EAGAIN;
  tp::Mr *mr = region_mr(local, s->dev, &err);  // registers on first use on this device
  if (!mr) return err;
  // The table comes with the connection's first operation: most connections never post one.
  if (!s->rdma.table && (err = ops_open(s))) return err;
  Op *op = s->rdma.free.pop_front();
  if (!op) return IBMSG_EAGAIN;  // cannot happen: the table has room for the queue and flight
  op->pub = pub;
  op->local = local;
  op->work.wr.op = wr_op(a.type);
  tp::RdmaWr &w = op->rw;
  w.local = local->addr + loff;
  w.len = uint32_t(len);
  w.mr = mr;
  w.remote = d.addr + roff;
  w.rkey = d.rkey;
  w.imm = a.imm;
  w.cas = a.type == IBMSG_OP_CAS;
  w.compare_add = a.compare_add;
  w.swap = a.swap;
  ++local->busy;
  pub->type = a.type;
  pub->status = IBMSG_EINPROGRESS;
  pub->impl = op;
  pub->check = op_check(pub, op);
  if (go) {
    err = op_send_now(s, op);
    if (err) {
      // A queue pair that refuses a work request is broken: the connection closes; the call
      // fails, so no callback fires for it.
      op_release(s, op, err);
      socket_close(s, err);
      return err;
    }
  } else {
    s->tx.queue.push_back(&op->work);
    maybe_send_ctrl(s);  // it may wait for a credit the peer cannot return without control credits
  }
  poll_touch(s);
  return IBMSG_OK;
}

void op_on_wc(Socket *s, Op *op, const tp::Completion &wc) {
  if (op->work.done || !op->pub) return;  // not in flight (cannot happen)
  if (s->tx.ops_in_flight) --s->tx.ops_in_flight;
  const int status = tp::wc_work_status(wc.status);
  work_done(s, &op->work, status,
            status == IBMSG_ECANCELED ? IBMSG_ECONNRESET : status);  // IBMSG_OK: no close
  if (status == IBMSG_OK) flush_sends(s);
}

}  // namespace ibmsg
