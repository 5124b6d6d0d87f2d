// What arrives: each receive completion by its immediate's opcode (wire.hpp). Data messages,
// requests and replies go to the receive buffers' owner and on to delivery (rndv.cpp), credit-only
// messages return credits, an RDMA write with immediate is reported; anything the agreed
// features do not allow closes the connection (IBMSG_EPROTO).
#include "internal.hpp"

namespace ibmsg {
namespace {

void on_credit_msg(Socket *s, Slot *slot, const tp::Completion &wc, wire::Imm imm) {
  const bool ret = imm.op == wire::Opcode::Return;
  const bool probe = imm.op == wire::Opcode::Keepalive;
  const uint32_t back = ret ? imm.credits : 0;
  if (ret) imm.credits = 0;  // it returns none of ours
  if (wc.len != 0 || (ret && imm.wants) || !s->credits.on_ctrl_arrived() ||
      (probe && !(s->features & wire::kFeatureKeepalive)) ||
      !s->credits.on_returned(imm) ||
      (imm.op == wire::Opcode::Return &&
       (!(s->features & wire::kFeatureShared) || !back || !recv_given_back(s, back)))) {
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

void on_data_msg(Socket *s, Slot *slot, const tp::Completion &wc, const wire::Imm &imm) {
  uint32_t len = wc.len;
  bool has_imm = imm.op == wire::Opcode::DataImm;
  if (has_imm) {
    if (!(s->features & wire::kFeatureImm) || len < wire::kImmTrailer) {
      recv_drop(s, slot, IBMSG_EPROTO);  // not agreed on, or no room for the immediate
      return;
    }
    len -= wire::kImmTrailer;
  }
  const bool request = imm.op == wire::Opcode::Request;
  wire::ReqTrailer tr;
  if (request || imm.op == wire::Opcode::Reply) {
    if (!req_trailer_ok(s, slot->buf, len, request, &tr)) {
      recv_drop(s, slot, IBMSG_EPROTO);
      return;
    }
    len -= uint32_t(wire::kReqTrailer);
  }
  if (len > eager_recv_size(s) || !recv_arrived(s, slot, imm.wants) ||
      !s->credits.on_returned(imm)) {
    // larger than we take, more data messages than the credits we granted, or credits returned
    // that it never had
    recv_drop(s, slot, IBMSG_EPROTO);
    return;
  }
  const uint8_t *t = slot->buf + len;
  recv_lend(s, slot, slot->buf, len, has_imm,
            has_imm ? uint32_t(t[0]) | uint32_t(t[1]) << 8 | uint32_t(t[2]) << 16 | uint32_t(t[3]) << 24 : 0);
  if (request || imm.op == wire::Opcode::Reply) req_mark(s, slot, request, tr);
  flush_sends(s);
  maybe_send_ctrl(s);
  deliver_msg(s, slot);
}

// The peer's RDMA write with immediate landed: its immediate is the application's, its data
// credit returns at once (the buffer was not used).
void on_write_imm(Socket *s, Slot *slot, const tp::Completion &wc) {
  // Its immediate is the application's: no wants bit, the connection's last word on it stands.
  if (!(s->features & wire::kFeatureRdma) || !recv_arrived(s, slot, s->share.wants)) {
    recv_drop(s, slot, IBMSG_EPROTO);
    return;
  }
  if (s->state == State::Accepting) establish(s, true);
  recv_back(s, slot);
  if (auto cb = s->loop->pub->write_received) cb(s->pub, wc.imm, wc.len);
}

}  // namespace

bool req_trailer_ok(const Socket *s, const uint8_t *payload, uint32_t len, bool request,
                    wire::ReqTrailer *tr) {
  // Not agreed on, no room for the trailer, reserved bits, id 0, an immediate (1.5 sends none),
  // or a floor above the request's id or on a reply: the peer broke the protocol.
  return (s->features & wire::kFeatureRequest) && wire::decode_req_trailer(payload, len, tr) &&
         tr->id && !tr->has_imm && (request ? tr->floor <= tr->id : !tr->floor && !tr->retry);
}

void req_mark(Socket *s, Slot *slot, bool request, const wire::ReqTrailer &tr) {
  slot->req_kind = uint8_t(request ? MsgKind::Request : MsgKind::Reply);
  slot->req_id = tr.id;
  slot->req_retry = tr.retry;
  slot->req_floor = tr.floor;
  slot->req_session = s->reqs.peer_session;
  if (request) slot->own.flags |= IBMSG_MSG_REQUEST;
}

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
  wire::Imm imm;
  if (!wc.has_imm || !wire::decode_imm(wc.imm, &imm)) {
    recv_drop(s, slot, IBMSG_EPROTO);
    return;
  }
  if (s->features & wire::kFeatureShared) wire::split_wants(&imm);
  // The peer read rendezvous messages of ours: they are done (message_sent, in order).
  if (imm.done && (!(s->features & wire::kFeatureRndv) || !rndv_on_done(s, imm.done))) {
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
    case wire::Opcode::Rendezvous: rndv_on_msg(s, slot, wc, imm); break;
    default: recv_drop(s, slot, IBMSG_EPROTO); break;  // no feature agreed that uses it
  }
}

}  // namespace ibmsg
