// Connection-manager events: address and route resolution, the connection request and its hello,
// establishment, rejection, disconnection and device removal. Every failure goes to the one close
// path (close.cpp).
#include "cm.hpp"

#include <arpa/inet.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "internal.hpp"
#include "conn.hpp"
#include "datapath.hpp"
#include "pace.hpp"
#include "poll.hpp"
#include "rndv.hpp"

namespace ibmsg {
namespace {

void on_addr_resolved(Socket *s) {
  if (s->state != State::ResolvingAddr) return;
  if (!device_matches(s)) {
    socket_close(s, IBMSG_ENODEV);
    return;
  }
  int err = tp::cm_resolve_route(s->id, s->opts.connect_timeout_ms);
  if (err) {
    socket_close(s, err);
    return;
  }
  set_state(s, Event::AddrResolved);
}

void on_route_resolved(Socket *s) {
  if (s->state != State::ResolvingRoute) return;
  int err = IBMSG_OK;
  s->dev = device_get(s->loop, tp::cm_device(s->id), &err);
  if (!err) err = conn_open(s);
  if (!err) {
    tp::ConnParam param;
    uint8_t hello[wire::kHelloSize];
    fill_conn_param(s, &param, hello);
    err = tp::cm_connect(s->id, param);
  }
  if (err) {
    socket_close(s, err);
    return;
  }
  set_state(s, Event::RouteResolved);
}

// The server's hello, in the ESTABLISHED event of the connecting side.
void on_established(Socket *s, const tp::CmEvent &ev) {
  if (s->state == State::Connecting) {
    wire::Hello h;
    if (wire::decode_hello(ev.pdata, ev.plen, &h) != wire::HelloResult::Ok) {
      socket_close(s, IBMSG_EPROTO);
      return;
    }
    set_peer(s, h);
  } else if (s->state != State::Accepting) {
    return;  // already established by an early completion
  }
  establish(s);
}

void on_rejected(Socket *s, const tp::CmEvent &ev) {
  int reason = IBMSG_ECONNREFUSED;
  if (wire::decode_reject(ev.pdata, ev.plen, s->pub->reject_reason, sizeof s->pub->reject_reason))
    reason = IBMSG_EREJECTED;
  else if (ev.status == tp::kRejectConsumer)  // a peer application said no
    reason = IBMSG_EREJECTED;
  socket_close(s, reason);
}

// The reject text for a hello this side cannot take, or nullptr if it can.
const char *hello_refusal(const ibmsg__request &r, wire::HelloResult res, char *buf, size_t len) {
  switch (res) {
    case wire::HelloResult::Ok: break;
    case wire::HelloResult::NotIbmsg: return "not an ibmsg peer";
    case wire::HelloResult::OtherMajor:
      snprintf(buf, len, "incompatible ibmsg protocol: peer speaks %u.%u, this side %u.%u",
               unsigned(r.hello.major), unsigned(r.hello.minor), unsigned(wire::kMajor),
               unsigned(wire::kMinor));
      return buf;
    case wire::HelloResult::Invalid: return "invalid ibmsg hello (zero or oversized depths or size)";
  }
  return nullptr;
}

void on_connect_request(Loop *loop, const tp::CmEvent &ev) {
  Socket *l = ev.listen_id ? static_cast<Socket *>(tp::cm_id_user(ev.listen_id)) : nullptr;
  if (!l || l->magic != kSocketMagic || l->state != State::Listening) {
    reject_id(ev.id, "not listening");
    return;
  }
  ibmsg__request r;
  r.id = ev.id;
  r.listener = l;
  char why[wire::kRejectTextMax];
  if (const char *no = hello_refusal(r, wire::decode_hello(ev.pdata, ev.plen, &r.hello), why,
                                     sizeof why)) {
    reject_id(ev.id, no);
    return;
  }
  const char *dev = tp::cm_device_name(ev.id);
  if (l->opts.device[0] && (!dev || strcmp(dev, l->opts.device) != 0)) {
    reject_id(ev.id, "not listening on this device");
    return;
  }
  if (l->accepted.size() + size_t(away_open(l->away)) >= size_t(l->max_connections)) {
    reject_id(ev.id, "too many connections");
    return;
  }
  if (double left = violation_ban_left(loop, tp::cm_peer_addr(ev.id), l->opts.violation_ban_ms)) {
    char text[96];
    snprintf(text, sizeof text,
             "refused for %.1f s more: a remote access violation came from this address", left);
    reject_id(ev.id, text);
    return;
  }
  char peer[INET6_ADDRSTRLEN] = "";
  unsigned short port = 0;
  format_address(tp::cm_peer_addr(ev.id), peer, sizeof peer, &port);
  ibmsg_connection_request req;
  memset(&req, 0, sizeof req);
  req.status = IBMSG_UNDECIDED;
  req.listener = l->pub;
  req.loop = loop->pub;
  req.peer_address = peer;
  req.peer_port = port;
  req.impl = &r;
  if (auto cb = loop->pub->connection_request) cb(&req);
  if (req.status == IBMSG_UNDECIDED) reject_id(ev.id, "not accepted");
}

int resolve_error(int status) { return status == -ETIMEDOUT ? IBMSG_ETIMEDOUT : IBMSG_EHOSTUNREACH; }

}  // namespace

void establish(Socket *s, bool by_data) {
  if (by_data) tp::cm_notify_established(s->id);  // the CM must hear it too, or it times out
  timer_stop(&s->connect_timer);
  set_state(s, Event::Established);
  pace_done(s);  // the next connect waiting for its turn starts
  s->was_connected = true;
  grants_established(s);  // ahead of what waited: the peer may use the descriptors it gets
  poll_touch(s);
  keepalive_start(s);
  IBMSG_LOG(s, IBMSG_LOG_INFO, "established (features 0x%x)", s->peer.features);
  if (auto cb = s->loop->pub->connection_established) cb(s->pub);
  rndv_pump(s);  // an RTS that came first waits for it
  // Whatever waited for the connection to be up: queued messages, credits or a FIN it owes.
  flush_sends(s);
  maybe_send_ctrl(s);
}

void reject_id(tp::CmId *id, const char *text) {
  uint8_t data[wire::kRejectMaxSize];
  size_t len = wire::encode_reject(text, data);
  tp::cm_reject(id, data, uint8_t(len));
  tp::cm_id_destroy(id);
}

void on_connect_timeout(Timer *t) {
  Socket *s = static_cast<Socket *>(t->data);
  if (s->state == State::Connected) return;
  // Which step it was in says where the time went (the address, the route, the peer's answer).
  IBMSG_LOG(s, IBMSG_LOG_ERROR, "no connection after %d ms: still %s", s->opts.connect_timeout_ms,
            state_name(s->state));
  socket_close(s, IBMSG_ETIMEDOUT);
}

void on_cm_event(Loop *loop, const tp::CmEvent &ev) {
  if (ev.type == tp::CmEventType::ConnectRequest) {
    on_connect_request(loop, ev);
    return;
  }
  Socket *s = ev.id ? static_cast<Socket *>(tp::cm_id_user(ev.id)) : nullptr;
  if (!s || s->magic != kSocketMagic) return;
  IBMSG_LOG(s, IBMSG_LOG_DEBUG, "CM event %s (status %d)", tp::cm_event_name(ev.type), ev.status);
  // Also when it is closing already: the device must be rescanned once released.
  if (ev.type == tp::CmEventType::DeviceRemoval && s->dev) s->dev->removed = true;
  // A socket on its way down hears nothing more: its teardown destroys the id.
  if (s->state == State::Closing) return;
  switch (ev.type) {
    case tp::CmEventType::AddrResolved: on_addr_resolved(s); break;
    case tp::CmEventType::RouteResolved: on_route_resolved(s); break;
    case tp::CmEventType::AddrError:
    case tp::CmEventType::RouteError:
    case tp::CmEventType::Unreachable: socket_close(s, resolve_error(ev.status)); break;
    case tp::CmEventType::Established: on_established(s, ev); break;
    case tp::CmEventType::Rejected: on_rejected(s, ev); break;
    case tp::CmEventType::ConnectError: socket_close(s, IBMSG_EIO); break;
    case tp::CmEventType::Disconnected:  // (during a disconnect that lingers: ours came first)
      socket_close(s, s->state == State::Lingering ? IBMSG_OK : IBMSG_ECONNRESET);
      break;
    case tp::CmEventType::DeviceRemoval: socket_close(s, IBMSG_ENODEV); break;
    case tp::CmEventType::ConnectRequest:
    case tp::CmEventType::Other: break;
  }
}

}  // namespace ibmsg
