// Remote access violations: counted, logged at warning with the peer's address, and remembered
// by address for IBMSG_OPT_VIOLATION_BAN (violations.hpp).
#include "violations.hpp"

#include <netinet/in.h>

#include <cstring>

#include "internal.hpp"
#include "conn.hpp"

namespace ibmsg {
namespace {

// The address without its port (a reconnection comes from a new port).
bool ip_of(const sockaddr *sa, sockaddr_storage *out) {
  memset(out, 0, sizeof *out);
  if (!sa) return false;
  if (sa->sa_family == AF_INET) {
    auto *in = reinterpret_cast<sockaddr_in *>(out);
    in->sin_family = AF_INET;
    in->sin_addr = reinterpret_cast<const sockaddr_in *>(sa)->sin_addr;
    return true;
  }
  if (sa->sa_family == AF_INET6) {
    auto *in6 = reinterpret_cast<sockaddr_in6 *>(out);
    in6->sin6_family = AF_INET6;
    in6->sin6_addr = reinterpret_cast<const sockaddr_in6 *>(sa)->sin6_addr;
    in6->sin6_scope_id = reinterpret_cast<const sockaddr_in6 *>(sa)->sin6_scope_id;
    return true;
  }
  return false;
}

Violations::Entry *find(Violations &v, const sockaddr_storage &ip) {
  for (Violations::Entry &e : v.table)
    if (e.used && memcmp(&e.addr, &ip, sizeof ip) == 0) return &e;
  return nullptr;
}

}  // namespace

bool violation_seen(Socket *s) {
  return (s->state == State::Connected || s->state == State::Lingering) && s->res.has_qp &&
         tp::qp_failed(s->id);
}

void violation_note(Socket *s) {
  Loop *loop = s->loop;
  Violations &v = loop->violations;
  ++v.count;
  char peer[INET6_ADDRSTRLEN] = "?";
  unsigned short port = 0;
  const sockaddr *sa = tp::cm_peer_addr(s->id);
  format_address(sa, peer, sizeof peer, &port);
  IBMSG_LOG(s, IBMSG_LOG_WARN,
            "remote access violation: the peer %s port %u used a key, range or right it was not "
            "granted on this connection (%llu in this loop)",
            peer, unsigned(port), static_cast<unsigned long long>(v.count));
  sockaddr_storage ip;
  if (!ip_of(sa, &ip)) return;
  Violations::Entry *e = find(v, ip);
  if (!e) {
    e = &v.table[0];
    for (Violations::Entry &x : v.table) {
      if (!x.used) {
        e = &x;
        break;
      }
      if (x.at < e->at) e = &x;
    }
    e->addr = ip;
    e->used = true;
  }
  e->at = ev_now(loop->ev);
}

int violations_counters(Loop *loop, ibmsg_loop_counters *out, size_t size) {
  ibmsg_loop_counters c{};
  c.remote_access_violations = loop->violations.count;
  c.requests_banned = loop->violations.banned;
  memcpy(out, &c, size < sizeof c ? size : sizeof c);
  return IBMSG_OK;
}

double violation_ban_left(Loop *loop, const sockaddr *peer, int ban_ms) {
  sockaddr_storage ip;
  if (ban_ms <= 0 || !ip_of(peer, &ip)) return 0;
  const Violations::Entry *e = find(loop->violations, ip);
  if (!e) return 0;
  const double left = e->at + ban_ms / 1000.0 - ev_now(loop->ev);
  if (left <= 0) return 0;
  ++loop->violations.banned;
  return left;
}

}  // namespace ibmsg
