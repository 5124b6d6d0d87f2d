// Keepalive (kFeatureKeepalive, protocol 1.4): noticing a peer that is dead, frozen or cut off.
//
// A connection counts the messages it receives (Socket::heard). One timer per loop looks at its
// connections each tick, an eighth of their shortest interval: a connection that heard nothing
// from its peer for IBMSG_OPT_KEEPALIVE_MS sends a Keepalive probe, a credit-only message that
// the peer answers at once with any message, and another each interval while the peer stays
// silent; one that heard nothing for IBMSG_OPT_KEEPALIVE_COUNT intervals closes with
// IBMSG_ETIMEDOUT, and the one close path gives everything it had queued or in flight its
// callback. Only an answer from the peer's loop proves it alive: the peer's kernel acknowledges
// our messages even while its process is stopped, and the transport's own resends give up only
// while something is in flight. A peer without the feature gets no probes and is never timed out.
#include "keepalive.hpp"

#include <cmath>

#include "internal.hpp"
#include "completion.hpp"
#include "datapath.hpp"

namespace ibmsg {
namespace {

double interval(const Socket *s) { return s->opts.keepalive_ms / 1000.0; }

// A probe, with the control credit rules of maybe_send_ctrl: the last control credit only when
// it returns some of the peer's (so that both sides never end up owing each other the control
// credits that neither can send).
// The interval counts as probed either way: a probe that finds no credit (its earlier ones are
// still unacknowledged: the link is down) is missed once per interval, not at every tick.
void probe(Socket *s, double now) {
  s->live.probed_at = now;
  if (s->tx.ctrl_in_flight >= kCtrlDepth || !s->tx.credits.can_send_ctrl()) return;
  if (s->tx.credits.ctrl() < 2 && s->tx.credits.owed_ctrl() == 0) return;
  ++s->stats.keepalives_sent;
  IBMSG_LOG(s, IBMSG_LOG_DEBUG, "keepalive probe: nothing heard for %.3f s", now - s->live.heard_at);
  post_ctrl(s, 0, false, wire::Opcode::Keepalive);
}

void arm(Loop *loop, double tick) {
  if (!loop->ka_timer.node.linked()) loop->ka_last = ev_now(loop->ev);
  loop->ka_tick = tick;
  timer_start(&loop->ka_timer, tick);
}

void on_tick(Timer *t) {
  Loop *loop = static_cast<Loop *>(t->data);
  const double now = ev_now(loop->ev);
  // A loop the application did not run for half an interval or more asked nothing meanwhile:
  // its connections probe now and give the peers an interval to answer, rather than close at
  // once. (A shorter delay, the scheduler's, leaves every probe on its interval.)
  const double gap = now - loop->ka_last;
  loop->ka_last = now;
  // The completions of a loop that did not run for a while may still wait in the CQs: before
  // a connection is found silent, they are read.
  bool late = false;
  for (Socket *s = loop->keepalive.front(); s; s = loop->keepalive.next(s))
    if (s->live.heard == s->live.seen && now - s->live.heard_at >= interval(s) * s->opts.keepalive_count)
      late = true;
  if (late)
    for (Device *d = loop->devices.front(); d; d = loop->devices.next(d)) drain_device(d);
  double tick = -1;
  for (Socket *s = loop->keepalive.front(); s; s = loop->keepalive.next(s)) {
    if (s->state != State::Connected) continue;  // closing (or lingering): leaves at teardown
    const double iv = interval(s);
    if (tick < 0 || iv / 8 < tick) tick = iv / 8;
    if (s->live.heard != s->live.seen) {
      s->live.seen = s->live.heard;
      s->live.heard_at = now;
      continue;
    }
    if (gap > iv / 2 && now - s->live.heard_at > iv) {
      IBMSG_LOG(s, IBMSG_LOG_INFO, "loop not run for %.3f s: the peer gets an interval to answer", gap);
      s->live.heard_at = s->live.probed_at = now - iv;
    }
    const double silent = now - s->live.heard_at;
    // Probes go on the grid of intervals since the peer was last heard, not an interval after
    // the last probe: ticks that come late do not add up to a lost interval.
    const double probed = std::floor((s->live.probed_at - s->live.heard_at) / iv);
    if (silent >= iv * s->opts.keepalive_count) {
      ++s->stats.keepalive_misses;
      IBMSG_LOG(s, IBMSG_LOG_ERROR, "peer silent for %.3f s (keepalive %d ms x %d): closing", silent,
          s->opts.keepalive_ms, s->opts.keepalive_count);
      socket_close(s, IBMSG_ETIMEDOUT);
    } else if (silent >= iv && std::floor(silent / iv) > probed) {
      if (s->live.probed_at > s->live.heard_at) {
        ++s->stats.keepalive_misses;
        IBMSG_LOG(s, IBMSG_LOG_WARN, "keepalive probe unanswered for %.3f s", now - s->live.probed_at);
      }
      probe(s, now);
    }
  }
  if (tick > 0) arm(loop, tick);
}

}  // namespace

void keepalive_start(Socket *s) {
  if (!s->opts.keepalive_ms || !(s->peer.features & wire::kFeatureKeepalive)) return;
  Loop *loop = s->loop;
  if (!loop->ka_timer.fn) timer_init(&loop->ka_timer, loop, on_tick, loop);
  s->live.seen = s->live.heard;
  s->live.heard_at = s->live.probed_at = ev_now(loop->ev);
  loop->keepalive.push_back(s);
  const double tick = interval(s) / 8;
  if (!loop->ka_timer.node.linked() || tick < loop->ka_tick) arm(loop, tick);
}

void keepalive_stop(Socket *s) {
  if (!s->ka_node.linked()) return;
  s->loop->keepalive.remove(s);
  if (s->loop->keepalive.empty()) timer_stop(&s->loop->ka_timer);
}

}  // namespace ibmsg
