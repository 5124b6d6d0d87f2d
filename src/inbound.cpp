// What arrives: each receive completion by its immediate's opcode (wire.hpp). Data messages,
// requests and replies go to the receive buffers' owner and on to delivery (deliver.cpp), an
// RTS or FIN of a rendezvous to its reads (rndv.cpp), credit-only
// messages return credits, an RDMA write with immediate is reported; anything the agreed
// features do not allow closes the connection (IBMSG_EPROTO).
#include "inbound.hpp"

#include "internal.hpp"
#include "datapath.hpp"
#include "dedup.hpp"
#include "deliver.hpp"
#include "incoming.hpp"
#include "recv.hpp"
#include "rndv.hpp"

namespace ibmsg {
namespace {

void on_credit_msg(Socket *s, Slot *slot, const tp::Completion &wc, wire::Imm imm) {
  const bool ret = imm.op == wire::Opcode::Return;
  const bool probe = imm.op == wire::Opcode::Keepalive;
  const uint32_t back = ret ? imm.credits : 0;
  if (ret) imm.credits = 0;  // it returns none of ours
  if (wc.len != 0 || (ret && imm.wants) || !s->tx.credits.on_ctrl_arrived() ||
      (probe && !(s->peer.features & wire::kFeatureKeepalive)) ||
      !s->tx.credits.on_returned(imm) ||
      (imm.op == wire::Opcode::Return &&
       (!(s->peer.features & wire::kFeatureShared) || !back || !recv_given_back(s, back)))) {
    // a payload on a credit-only message, no credit for it, credits it never had, or a Return
    // not agreed on or of more than it had
    recv_drop(s, slot, IBMSG_EPROTO);
    return;
  }
  recv_ctrl_back(s, slot);
  if (probe) {
    s->live.answer_due = true;
    ++s->stats.keepalives_received;
  }
  if (imm.wants) recv_wants(s);  // data waits at the peer: more credits if the pool has them
  flush_sends(s);
  maybe_send_ctrl(s);
}

// A data message's payload of len bytes landed in slot (its trailer, if any, decoded into *tr):
// checked against what was granted, lent to the application and delivered.
// (Inlined into on_data_msg's two calls: as a call of its own it saved and restored six
// registers per message.)
[[gnu::always_inline]] inline void data_landed(Socket *s, Slot *slot, uint32_t len,
                                               const wire::Imm &imm, const wire::ReqTrailer *tr) {
  const bool has_imm = imm.op == wire::Opcode::DataImm;
  if (len > s->rx.eager || !recv_arrived(s, slot, imm.wants) ||
      !s->tx.credits.on_returned(imm)) {
    // larger than we take, more data messages than the credits we granted, or credits returned
    // that it never had
    recv_drop(s, slot, IBMSG_EPROTO);
    return;
  }
  recv_lend(s, slot, slot->buf, len, has_imm,
            has_imm ? wire::decode_imm_trailer(slot->buf + len) : 0);
  if (tr) recv_mark_request(s, slot, imm.op == wire::Opcode::Request, *tr);
  // Credits it returned may let waiting messages go.
  if (!s->tx.queue.empty()) flush_sends(s);
  // Whether credits go on their own is decided at the end of the round (in the loop's
  // callbacks): the reply message_received may post carries them.
  ctrl_due(s);
  deliver_msg(s, slot);
}

void on_data_msg(Socket *s, Slot *slot, const tp::Completion &wc, const wire::Imm &imm) {
  uint32_t len = wc.len;
  if (imm.op == wire::Opcode::DataImm) {  // the immediate follows the payload
    if (!(s->peer.features & wire::kFeatureImm) || len < wire::kImmTrailer) {
      recv_drop(s, slot, IBMSG_EPROTO);  // not agreed on, or no room for the immediate
      return;
    }
    len -= wire::kImmTrailer;
  } else if (imm.op == wire::Opcode::Request || imm.op == wire::Opcode::Reply) {
    // A request's or reply's trailer follows the payload (decoded here only: a plain message
    // pays no stores for it).
    wire::ReqTrailer tr;
    if (!wire::req_trailer_ok(s->peer.features, slot->buf, len, imm.op == wire::Opcode::Request,
                              &tr)) {
      recv_drop(s, slot, IBMSG_EPROTO);
      return;
    }
    data_landed(s, slot, len - uint32_t(wire::kReqTrailer), imm, &tr);
    return;
  }
  data_landed(s, slot, len, imm, nullptr);
}

// The peer's RDMA write with immediate landed: its immediate is the application's, its data
// credit returns at once (the buffer was not used).
void on_write_imm(Socket *s, Slot *slot, const tp::Completion &wc) {
  // Its immediate is the application's: no wants bit, the connection's last word on it stands.
  if (!(s->peer.features & wire::kFeatureRdma) || !recv_arrived(s, slot, s->rx.share.wants)) {
    recv_drop(s, slot, IBMSG_EPROTO);
    return;
  }
  if (s->state == State::Accepting) s->loop->hooks->data_established(s);
  recv_back(s, slot);
  if (auto cb = s->loop->pub->write_received) cb(s->pub, wc.imm, wc.len);
}

// The message in slot arrived as an RTS: the application may choose its destination or decline
// it, then it waits for its reads (or its FIN) in order.
void on_rts(Socket *s, Slot *slot, const tp::Completion &wc, const wire::Imm &imm) {
  wire::Rts r;
  wire::ReqTrailer tr;
  if (!recv_arrived(s, slot, imm.wants) || !s->tx.credits.on_returned(imm) ||
      !wire::decode_rts(slot->buf, wc.len, &r) || r.length > s->opts.max_msg_size ||
      (r.has_imm && !(s->peer.features & wire::kFeatureImm)) ||
      (r.req && !wire::req_trailer_ok(s->peer.features, slot->buf, wc.len, r.req == 1, &tr)) || (r.req && r.has_imm)) {
    // no credit for it, credits it never had, no RTS, larger than we take, an immediate not
    // agreed on, or a request or reply not agreed on, with a broken trailer or an immediate
    recv_drop(s, slot, IBMSG_EPROTO);
    return;
  }
  // Its data: the destination, once the reads are done.
  recv_lend(s, slot, nullptr, size_t(r.length), r.has_imm, r.has_imm ? r.imm : 0);
  if (r.req) recv_mark_request(s, slot, r.req == 1, tr);
  ibmsg_buffer *msg = &slot->own;
  slot->large = nullptr;
  RndvIn &in = slot->in;
  in.remote = r.addr;
  in.length = r.length;
  in.next = 0;
  in.done = 0;
  in.rkey = r.rkey;
  in.id = r.id;
  in.reads = 0;
  in.ready = in.declined = false;
  in.dest = nullptr;
  in.dest_mr = nullptr;
  in.region = nullptr;
  // A copy of a request delivered before is not read, nor offered (the peer's message_sent
  // reports IBMSG_EDECLINED); the answer goes as for an eager copy.
  // A late reply is not read either (dropped, as an eager one).
  ibmsg_request *answers = r.req == 2 ? req_awaiting(s, tr.id) : nullptr;
  if ((r.req == 1 && answer_is_copy(s, slot)) || (r.req == 2 && !answers))
    in.declined = true;
  else
    incoming_choose(s, slot, answers);
  if (in.region) msg->flags |= IBMSG_MSG_REGION;
  const bool declined = in.declined;
  if (!declined) s->deliver.push_back(slot);
  s->rndv.reading.push_back(&in);
  rndv_pump(s);
  flush_sends(s);
  maybe_send_ctrl(s);
  // A declined reply ends its request (IBMSG_EDECLINED): its done callback comes last, with
  // the connection's state whole (the callback may disconnect, or post).
  if (declined && r.req == 2) req_on_declined(s, tr.id);
}

// A FIN: the peer declined the oldest of our RTSs it has not counted done.
void on_fin(Socket *s, Slot *slot, const tp::Completion &wc, const wire::Imm &imm) {
  wire::Fin f;
  Slot *front = s->rndv.wait.front();
  if (!s->tx.credits.on_ctrl_arrived() || !s->tx.credits.on_returned(imm) ||
      !wire::decode_fin(slot->buf, wc.len, &f) || f.status != wire::FinStatus::Declined ||
      !front || f.id != uint32_t(front - front->pool->slots)) {
    recv_drop(s, slot, IBMSG_EPROTO);
    return;
  }
  recv_ctrl_back(s, slot);
  rndv_read_done(&s->rndv.wait.pop_front()->work, IBMSG_EDECLINED);
  notify_front(s);
  flush_sends(s);
  maybe_send_ctrl(s);
}

void on_rndv_msg(Socket *s, Slot *slot, const tp::Completion &wc, const wire::Imm &imm) {
  wire::RndvKind kind;
  if (!(s->peer.features & wire::kFeatureRndv) || !wire::rndv_kind(slot->buf, wc.len, &kind)) {
    recv_drop(s, slot, IBMSG_EPROTO);  // not agreed on, or neither RTS nor FIN
    return;
  }
  if (kind == wire::RndvKind::Rts) on_rts(s, slot, wc, imm);
  else on_fin(s, slot, wc, imm);
}

}  // namespace

void on_recv_wc(Socket *s, Slot *slot, const tp::Completion &wc) {
  if (wc.status != tp::WcStatus::Ok) {
    recv_drop(s, slot, tp::wc_error(wc.status));
    return;
  }
  ++s->live.heard;  // the peer lives (keepalive.cpp)
  if (wc.write_imm) {
    on_write_imm(s, slot, wc);
    return;
  }
  if (!wc.has_imm) {
    recv_drop(s, slot, IBMSG_EPROTO);
    return;
  }
  const wire::Imm imm = wire::imm_of(wc.imm, s->peer.features & wire::kFeatureShared);
  // The peer read rendezvous messages of ours: they are done (message_sent, in order).
  if (imm.done && (!(s->peer.features & wire::kFeatureRndv) || !rndv_on_done(s, imm.done))) {
    recv_drop(s, slot, IBMSG_EPROTO);
    return;
  }
  switch (imm.op) {
    case wire::Opcode::Data:
    case wire::Opcode::DataImm:
    case wire::Opcode::Request:
    case wire::Opcode::Reply: on_data_msg(s, slot, wc, imm); break;
    case wire::Opcode::Credit:
    case wire::Opcode::Keepalive:
    case wire::Opcode::Return: on_credit_msg(s, slot, wc, imm); break;
    case wire::Opcode::Rendezvous: on_rndv_msg(s, slot, wc, imm); break;
    default: recv_drop(s, slot, IBMSG_EPROTO); break;  // no feature agreed that uses it
  }
}

}  // namespace ibmsg
