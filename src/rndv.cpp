// Rendezvous: messages larger than the eager size (protocol 1.2, kFeatureRndv).
//
// The sender's message lies in a large buffer registered for remote reads (memory.cpp). Posting
// it sends an RTS (wire.hpp) in a data message of its own: where the data is and how long. The
// receiver reads the data into a large buffer of its own, in chunks of at most the device's
// largest message, kRndvReads reads in flight per connection, the RTSs in the order they came.
// Once a message's data is in, it counts it in the done field of its next immediate (a
// credit-only message if nothing else goes); the sender's message is then done, and its
// message_sent comes in posting order with the eager ones. The receiver delivers every message
// in the order it came: an eager message behind a rendezvous still being read waits for it.
//
// The receiving application may choose (message_incoming, before any data moves) where the data
// goes, a region of its own, or decline the message: then a FIN (wire.hpp) goes back in the
// place of the done count, in the same order, in a message of its own that spends a control
// credit, and the sender's message_sent reports IBMSG_EDECLINED.
//
// Who owns what: the sender's buffer is the application's from ibmsg_alloc_msg (or
// ibmsg_msg_from_region) to ibmsg_free_msg as any message's (the peer reads it between posting
// and message_sent); the receiver's buffer is the library's until message_received lends it, and
// goes back to the device's cache with ibmsg_free_msg, or it is the application's region (busy
// until then). Closing drops what was not delivered (rndv_release).
//
// Here: the receiver's reads, destinations and FINs. The sender's RTS and the done counts are
// datapath.cpp's (sending), an RTS's or FIN's arrival inbound.cpp's, delivery deliver.cpp's.
#include "rndv.hpp"

#include "internal.hpp"
#include "datapath.hpp"
#include "memory.hpp"
#include "recv.hpp"
#include "rndv_memory.hpp"

namespace ibmsg {
namespace {

// The largest read: the peer's device may take less than ours (rxe takes 8 MiB).
constexpr uint64_t kChunkMax = uint64_t(8) << 20;
// The most bytes of reads a connection has in flight (at least one read): enough to keep the
// link busy; the other connections of the loop keep flowing between them.
constexpr uint64_t kReadAhead = kLargePiece;

uint64_t read_chunk(const Socket *s) {
  const uint64_t chunk = tp::device_info(s->dev->tp).max_msg_size;
  return chunk > kChunkMax ? kChunkMax : chunk;
}

// The read of in at off: at most a chunk, and within one piece of a library destination (each
// piece is registered on its own). The reads of a message complete in the order they were
// posted, so the same function tells the length of the one that completed.
uint64_t read_len(const RndvIn &in, uint64_t off, uint64_t chunk) {
  uint64_t n = in.length - off < chunk ? in.length - off : chunk;
  const uint64_t room = kLargePiece - off % kLargePiece;
  return !in.region && n > room ? room : n;
}

// The first waiting connections whose destinations fit now post their reads.
void mem_wake(Loop *loop) {
  while (Socket *w = rndv_mem_first(loop)) {
    rndv_pump(w);
    if (rndv_mem_first(loop) == w) break;  // still waits (or reads before it first)
  }
}

}  // namespace

void rndv_dest_put(Slot *slot) {
  LargeMem *m = slot->large;
  if (!m) return;
  slot->large = nullptr;
  Loop *loop = m->dev->loop;
  rndv_mem_give(loop, m->bytes);
  large_put(m);
  mem_wake(loop);
}

// Posts what reads it can: the first waiting rendezvous gets its destination when its turn comes
// (so a connection holds at most the destinations of the messages it is reading or delivering,
// and the loop at most IBMSG_OPT_RNDV_MEMORY of them). No read crosses a piece of a library
// destination, and a piece is registered when its first read is posted: a key that does not
// work costs one piece, and this step registers at most kReadAhead / kLargePiece + 1 pieces.
void rndv_pump(Socket *s) {
  if (s->state != State::Connected) {  // a closing (or lingering) one starts no reads
    rndv_mem_leave(s);
    return;
  }
  const uint64_t chunk = read_chunk(s);
  bool any = false;
  while (s->rndv.reads < kRndvReads) {
    RndvIn *in = s->rndv.reading.front();
    if (!in) break;
    if (in->declined) break;  // its FIN goes first (maybe_send_ctrl), then the reads behind it
    Slot *slot = static_cast<Slot *>(in->wr.owner);
    const uint64_t n = read_len(*in, in->next, chunk);
    if (s->rndv.read_bytes && s->rndv.read_bytes + n > kReadAhead)
      break;  // enough in flight: the next completion posts more
    if (!in->dest) {
      const size_t bytes = rndv_dest_bytes(in->length);
      if (!rndv_mem_take(s, bytes)) break;  // waits for rendezvous memory
      int err = IBMSG_OK;
      slot->large = large_get(s->dev, false, 0, size_t(in->length), &err);
      if (!slot->large) {
        rndv_mem_give(s->loop, bytes);
        socket_close(s, err);
        return;
      }
      in->dest = slot->large->mem;
    }
    tp::RdmaWr w{};
    w.local = in->dest + in->next;
    w.len = uint32_t(n);
    w.mr = in->dest_mr;
    if (!in->region) {
      size_t room;
      int err = IBMSG_OK;
      w.mr = large_piece(slot->large, size_t(in->next), &room, &err);
      if (!w.mr) {
        socket_close(s, err);
        return;
      }
    }
    w.remote = in->remote + in->next;
    w.rkey = in->rkey;
    if (tp::post_rdma(s->id, &in->wr, w, 0)) {
      socket_close(s, IBMSG_EIO);
      return;
    }
    any = true;
    in->next += n;
    ++in->reads;
    ++s->rndv.reads;
    s->rndv.read_bytes += n;
    if (in->next == in->length) s->rndv.reading.pop_front();
  }
  if (any && posted(s, true)) socket_close(s, IBMSG_EIO);
}

// A slot the rendezvous held (declined, or undelivered at a close) goes back to the pool.
void rndv_drop(Socket *s, Slot *slot) {
  rndv_dest_put(slot);
  if (slot->in.region) --slot->in.region->busy;
  slot->in.region = nullptr;
  slot->in.ready = slot->in.declined = false;
  recv_unlent(s, slot);
}

bool rndv_fin_due(const Socket *s) {
  const RndvIn *in = s->rndv.reading.front();
  // In order: after every read before it completed, with the done counts before it in its
  // immediate (at most kMaxDonePerMsg: more go first, in credit-only messages).
  return in && in->declined && s->rndv.reads == 0 && s->rndv.done_owed <= wire::kMaxDonePerMsg;
}

bool rndv_send_fin(Socket *s) {
  RndvIn *in = s->rndv.reading.front();
  Slot *slot = static_cast<Slot *>(in->wr.owner);
  wire::Fin f;
  f.id = in->id;
  f.status = wire::FinStatus::Declined;
  wire::encode_fin(f, slot->buf);  // the RTS's buffer, held until the FIN completes
  wire::Imm imm = s->tx.credits.carry(Credits::Spend::Ctrl);
  imm.op = wire::Opcode::Rendezvous;
  imm.done = rndv_done_due(s);
  if (tp::post_send_imm(s->id, &in->fin_wr, slot->buf, uint32_t(wire::kFinSize), slot->pool->mr,
                        wire::encode_imm(imm), s->res.max_inline)) {
    socket_close(s, IBMSG_EIO);  // (nothing was taken)
    return false;
  }
  s->tx.credits.taken(imm, Credits::Spend::Ctrl, recv_grants_held(s));
  s->rndv.done_owed -= imm.done;
  ++s->tx.ctrl_in_flight;
  s->rndv.reading.pop_front();
  s->rndv.fins.push_back(in);  // until its completion, or the teardown
  if (posted(s, true)) {
    socket_close(s, IBMSG_EIO);
    return false;
  }
  rndv_pump(s);  // the reads behind it
  return true;
}

void rndv_on_fin_sent(Socket *s, Slot *slot, const tp::Completion &wc) {
  if (!slot->in.read_link.linked()) return;  // released by the teardown already
  s->rndv.fins.remove(&slot->in);
  if (s->tx.ctrl_in_flight) --s->tx.ctrl_in_flight;
  const bool ok = wc.status == tp::WcStatus::Ok;
  if (!ok) socket_close(s, tp::wc_error(wc.status));
  // The declined message's buffer and data credit come back now.
  rndv_drop(s, slot);
  maybe_send_ctrl(s);
}

int rndv_on_read(Socket *s, Slot *slot, const tp::Completion &wc) {
  RndvIn &in = slot->in;
  if (in.reads) --in.reads;
  if (s->rndv.reads) --s->rndv.reads;
  const uint64_t n = read_len(in, in.done, read_chunk(s));
  in.done += n;
  s->rndv.read_bytes -= n < s->rndv.read_bytes ? n : s->rndv.read_bytes;
  if (wc.status != tp::WcStatus::Ok) {
    // The peer's key or range was wrong (it broke the protocol), or the connection failed.
    socket_close(s, wc.status == tp::WcStatus::RemoteAccess ? IBMSG_EPROTO : tp::wc_error(wc.status));
    return -1;
  }
  if (in.reads == 0 && in.next == in.length && !in.read_link.linked()) {
    slot->own.data = in.dest;
    in.ready = true;
    ++s->rndv.done_owed;
    // The count goes at once, in a credit-only message if need be (or a FIN), before the
    // application sees the message (and perhaps closes).
    maybe_send_ctrl(s);
    return 1;  // the caller delivers it (deliver_ready), then rndv_read_more
  }
  return 0;
}

void rndv_read_more(Socket *s) {
  rndv_pump(s);
  maybe_send_ctrl(s);
}

void rndv_release(Socket *s) {
  while (RndvIn *in = s->rndv.reading.pop_front())
    if (in->declined) rndv_drop(s, static_cast<Slot *>(in->wr.owner));
  // FINs posted whose completion did not come (a failed flush; a device that drops a destroyed
  // QP's completions): their slots come back here.
  while (RndvIn *in = s->rndv.fins.pop_front()) rndv_drop(s, static_cast<Slot *>(in->wr.owner));
  while (s->rndv.wait.pop_front()) {
  }
  rndv_mem_leave(s);
  while (Slot *slot = s->deliver.pop_front()) rndv_drop(s, slot);
  s->rndv.reads = 0;
  s->rndv.read_bytes = 0;
  s->rndv.done_owed = 0;
}

}  // namespace ibmsg
