// The responder's side of requests and replies (requests.hpp): each request is delivered once per
// identity (the requester's session and id), ibmsg_post_reply answers it, and a copy that comes
// again (a retry, maybe over a new connection) gets the kept reply instead of a second delivery.
#include "dedup.hpp"

#include <algorithm>
#include <cstring>

#include "internal.hpp"
#include "message.hpp"
#include "recv.hpp"

namespace ibmsg {
namespace {

double window_s(const Loop *loop) { return loop->opts.request_window_ms / 1000.0; }

// The most answers a session keeps: a requester whose floor stays (a request of its it may still
// retry) while it posts on would otherwise grow the table for the whole window. Beyond it the
// oldest answered ones are forgotten early (their retries get no answer; none runs twice).
constexpr size_t kMaxAnswers = 1 << 16;

void drop_kept(ReqLoop &rl, Answer &a) {
  rl.kept_bytes -= a.reply.size();
  std::vector<uint8_t>().swap(a.reply);
  a.kept = false;
}

// Forgets the answers the requester will never ask for again (below its floor), and those
// answered longer ago than the window (from the lowest id on).
void prune(Loop *loop, Session &ss, double now) {
  ReqLoop &rl = loop->req;
  auto below = ss.answers.lower_bound(ss.floor);
  for (auto it = ss.answers.begin(); it != below; it = ss.answers.erase(it)) drop_kept(rl, it->second);
  while (!ss.answers.empty()) {
    auto it = ss.answers.begin();
    if (!it->second.answered || it->second.answered_at + window_s(loop) > now) break;
    if (it->first > ss.forgotten) ss.forgotten = it->first;
    drop_kept(rl, it->second);
    ss.answers.erase(it);
  }
}

// Once a window: every session's old answers go, and the sessions idle for two windows with
// nothing kept.
void sweep(Loop *loop, double now) {
  ReqLoop &rl = loop->req;
  if (now - rl.last_sweep < window_s(loop)) return;
  rl.last_sweep = now;
  for (auto it = rl.sessions.begin(); it != rl.sessions.end();) {
    prune(loop, it->second, now);
    if (it->second.answers.empty() && now - it->second.last > 2 * window_s(loop))
      it = rl.sessions.erase(it);
    else ++it;
  }
}

// A kept reply goes to s again, from a send buffer of the library's own (no message_sent). Without
// a buffer or room in the send queue it does not go: the requester's next retry asks again. Its
// buffer comes as an application's message gets one (msg_alloc): above s's eager size (a retry
// on a new connection with a smaller one, say scaled down by IBMSG_OPT_SHARED_RECV_BUDGET) a
// large buffer, and the reply goes by rendezvous; send_free gives it back.
void resend(Socket *s, uint64_t id, const Answer &a) {
  if (!state_can_post(s->state)) return;
  ibmsg_buffer m{};
  if (msg_alloc(s, &m, a.reply.size()) != IBMSG_OK) return;
  Slot *slot = m.impl;
  slot->own = m;
  slot->msg = &slot->own;
  slot->req.internal = true;
  if (!a.reply.empty()) memcpy(slot->own.data, a.reply.data(), a.reply.size());
  PostAs as;
  as.kind = MsgKind::Reply;
  as.id = id;
  if (msg_post(s, &slot->own, false, 0, &as) != IBMSG_OK) {
    slot->req.internal = false;
    msg_release(&slot->own);
    return;
  }
  ++s->stats.replies_resent;
}

Answer *find_answer(Loop *loop, const Slot *q) {
  auto sit = loop->req.sessions.find(q->req.session);
  if (sit == loop->req.sessions.end()) return nullptr;
  auto it = sit->second.answers.find(q->req.id);
  return it == sit->second.answers.end() ? nullptr : &it->second;
}

Loop *loop_of_slot(const Slot *q) { return q->pool->dev->loop; }

}  // namespace

namespace {

// The session of slot's request, its floor raised and its old answers forgotten.
Session &session_of(Socket *s, const Slot *slot) {
  Loop *loop = s->loop;
  const double now = ev_now(loop->ev);
  sweep(loop, now);
  Session &ss = loop->req.sessions[slot->req.session];
  ss.last = now;
  if (slot->req.floor > ss.floor) ss.floor = slot->req.floor;
  prune(loop, ss, now);
  return ss;
}

// False for a copy of a request delivered before (it runs once: it is answered on s when the
// application replies, or now with the kept reply), and for a retry that may have been
// answered and forgotten (then it may have run: it gets no answer rather than a second run).
bool is_new(Socket *s, const Slot *slot, Session &ss) {
  const uint64_t id = slot->req.id;
  auto it = ss.answers.find(id);
  if (it == ss.answers.end()) return !(slot->req.retry && (id < ss.floor || id <= ss.forgotten));
  Answer &a = it->second;
  if (!a.answered) a.waiting = s;  // answered on it too, once the reply is posted
  else if (a.kept) resend(s, id, a);
  return false;
}

}  // namespace

bool answer_on_request(Socket *s, Slot *slot) {
  Session &ss = session_of(s, slot);
  if (!is_new(s, slot, ss)) {
    slot->req.answered = true;  // (not the application's: its freeing answers nothing)
    msg_release(&slot->own);
    return false;
  }
  ss.answers.emplace(slot->req.id, Answer());
  for (auto f = ss.answers.begin(); ss.answers.size() > kMaxAnswers && f != ss.answers.end();) {
    if (!f->second.answered) {
      ++f;
      continue;
    }
    if (f->first > ss.forgotten) ss.forgotten = f->first;
    drop_kept(s->loop->req, f->second);
    f = ss.answers.erase(f);
  }
  return true;
}

bool answer_is_copy(Socket *s, Slot *slot) {
  if (is_new(s, slot, session_of(s, slot))) return false;
  slot->req.answered = true;
  return true;
}

int reply_post(Socket *s, ibmsg_buffer *request, ibmsg_buffer *reply) {
  Slot *q = request->impl;
  if (!slot_valid(q) || q->msg != request || !q->pool->recv) return IBMSG_EINVAL;
  if (q->state != SlotState::Lent || request->status != IBMSG_RECEIVED) return IBMSG_ENOTALLOC;
  if (!(request->flags & IBMSG_MSG_REQUEST) || q->req.kind != uint8_t(MsgKind::Request))
    return IBMSG_EINVAL;
  if (q->req.answered) return IBMSG_EALREADY;
  Slot *rs = reply->impl;
  if (!slot_valid(rs) || rs->msg != reply || rs->pool->recv) return IBMSG_EINVAL;
  Loop *loop = loop_of_slot(q);
  // Kept only up to the loop's eager size (IBMSG_OPT_EAGER_SIZE), or a send buffer's size if
  // larger: a larger reply is not, and its retries get no answer, as when the cache is full.
  // Not the connection's own eager size: one scaled down by IBMSG_OPT_SHARED_RECV_BUDGET keeps
  // what the others keep (resend sends any size, by rendezvous above the eager size).
  const bool keepable = reply->size <= std::max(rs->pool->slot_size - wire::kMaxTrailer,
                                                 size_t(loop->opts.eager_size));
  Socket *owner = recv_owner(q);
  if (owner != s) {
    if (owner) return IBMSG_EINVAL;  // it came on another connection (open), or s is none
    s = nullptr;                     // its connection closed
  }
  if (s && s->loop != loop) return IBMSG_EINVAL;
  PostAs as;
  as.kind = MsgKind::Reply;
  as.id = q->req.id;
  const int rc = s ? msg_post(s, reply, false, 0, &as) : IBMSG_ENOTCONN;
  if (rc != IBMSG_OK && rc != IBMSG_ENOTCONN) return rc;
  q->req.answered = true;
  Answer *a = find_answer(loop, q);
  if (!a || a->answered) return rc;
  a->answered = true;
  a->answered_at = ev_now(loop->ev);
  ReqLoop &rl = loop->req;
  if (keepable && reply->size <= size_t(loop->opts.reply_cache) &&
      rl.kept_bytes <= size_t(loop->opts.reply_cache) - reply->size) {
    const uint8_t *d = static_cast<const uint8_t *>(reply->data);
    a->reply.assign(d, d + reply->size);
    a->kept = true;
    rl.kept_bytes += reply->size;
  }
  Socket *w = a->waiting;
  a->waiting = nullptr;
  if (w && w != s && a->kept) resend(w, q->req.id, *a);
  return rc;
}

void answer_on_free(Slot *slot) {
  if (slot->req.kind != uint8_t(MsgKind::Request) || slot->req.answered) return;
  slot->req.answered = true;
  Loop *loop = loop_of_slot(slot);
  Answer *a = find_answer(loop, slot);
  if (!a || a->answered) return;
  a->answered = true;  // with nothing: its retries get no answer (it ran once)
  a->answered_at = ev_now(loop->ev);
  a->waiting = nullptr;
}

void answers_closed(Socket *s) {
  for (auto &ss : s->loop->req.sessions)
    for (auto &a : ss.second.answers)
      if (a.second.waiting == s) a.second.waiting = nullptr;
}

}  // namespace ibmsg
