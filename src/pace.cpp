// Connect pacing: a loop has at most IBMSG_OPT_CONNECT_LIMIT outgoing connection attempts under
// way at once (from the address resolution to ESTABLISHED or the close); an ibmsg_connect()
// beyond that waits its turn, in the order of the calls, and is CONNECTING meanwhile.
//
// Why: every attempt takes several connection-manager events on the loop's one channel, and the
// accepting side gives its half IBMSG_OPT_CONNECT_TIMEOUT to complete. Ten thousand connects
// started at once queued tens of thousands of events: the last replies were handled after the
// accepting side had given up on them (measured: 1580 of 10000 timed out there on Soft-RoCE).
// A bounded number in flight keeps each attempt's events near the front, so each completes in
// about the time one takes; the connect timeout counts from the start of the attempt, not from
// the call, so waiting for a turn does not use it up.
#include "pace.hpp"

#include <cstring>
#include <new>

#include "internal.hpp"

namespace ibmsg {
namespace {

int start(Socket *s, const sockaddr_storage *src, const sockaddr_storage &dst) {
  int err = tp::cm_resolve_addr(s->id, src ? reinterpret_cast<const sockaddr *>(src) : nullptr,
                                reinterpret_cast<const sockaddr *>(&dst),
                                s->opts.connect_timeout_ms);
  if (err) return err;
  s->pace = PaceState::UnderWay;
  ++s->loop->pace_under_way;
  timer_start(&s->connect_timer, s->opts.connect_timeout_ms / 1000.0);
  return IBMSG_OK;
}

bool has_room(const Loop *loop) { return loop->pace_under_way < uint32_t(loop->opts.connect_limit); }

// Starts waiting attempts while there is room. A start that fails closes its socket, whose
// close comes back here (pace_done): the flag keeps that from recursing.
void fill(Loop *loop) {
  if (loop->pace_filling) return;
  loop->pace_filling = true;
  while (has_room(loop)) {
    Socket *s = loop->pace_waiting.pop_front();
    if (!s) break;
    PaceWait *w = s->pace_wait;
    s->pace_wait = nullptr;
    s->pace = PaceState::None;
    const int err = start(s, w->have_src ? &w->src : nullptr, w->dst);
    delete w;
    if (err) socket_close(s, err);
  }
  loop->pace_filling = false;
}

}  // namespace

int pace_connect(Socket *s, const sockaddr_storage *src, const sockaddr_storage &dst) {
  Loop *loop = s->loop;
  fill(loop);  // those before it first (there is room when the limit was raised meanwhile)
  if (has_room(loop) && loop->pace_waiting.empty()) return start(s, src, dst);
  PaceWait *w = new (std::nothrow) PaceWait;
  if (!w) return IBMSG_ENOMEM;
  w->have_src = src != nullptr;
  if (src) w->src = *src;
  w->dst = dst;
  s->pace_wait = w;
  s->pace = PaceState::Waiting;
  loop->pace_waiting.push_back(s);
  return IBMSG_OK;
}

void pace_done(Socket *s) {
  Loop *loop = s->loop;
  switch (s->pace) {
    case PaceState::None: return;
    case PaceState::Waiting:
      loop->pace_waiting.remove(s);
      delete s->pace_wait;
      s->pace_wait = nullptr;
      break;
    case PaceState::UnderWay: --loop->pace_under_way; break;
  }
  s->pace = PaceState::None;
  fill(loop);
}

}  // namespace ibmsg
