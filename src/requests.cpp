// The requester's side of requests and replies (requests.hpp): ibmsg_post_request,
// ibmsg_retry_request, the timeouts, the replies, and the close. Each posted request gets its
// done callback exactly once: the reply, IBMSG_ETIMEDOUT, or the reason its connection closed.
#include "requests.hpp"

#include <sys/random.h>
#include <unistd.h>

#include <ctime>
#include <new>

#include "deadlines.hpp"
#include "internal.hpp"
#include "message.hpp"

namespace ibmsg {
namespace {

// ibmsg_request.check: ties the public struct to its record while it is posted.
uintptr_t req_check(const ibmsg_request *pub, const Req *r) {
  return reinterpret_cast<uintptr_t>(r) ^ reinterpret_cast<uintptr_t>(pub) ^ 0x1b5e9e57ull;
}

double window_s(const Loop *loop) { return loop->opts.request_window_ms / 1000.0; }

constexpr size_t kSpareReqs = 1024;  // records kept for reuse: no allocation per request

void forget(Loop *loop, Req *r) {
  ReqLoop &rl = loop->req;
  rl.live.erase(r->id);
  rl.order.remove(r);
  if (rl.spares >= kSpareReqs) {
    delete r;
    return;
  }
  rl.spare.push_back(r);
  ++rl.spares;
}

Req *new_req(ReqLoop &rl) {
  Req *r = rl.spare.pop_front();
  if (!r) return new (std::nothrow) Req();
  --rl.spares;
  *r = Req();
  return r;
}

// Records that can no longer be retried go: the front of the list (the lowest ids) only, which
// is what the floor needs.
void prune(Loop *loop) {
  const double now = ev_now(loop->ev);
  while (Req *r = loop->req.order.front()) {
    if (r->posted || r->first_posted + window_s(loop) > now) break;
    forget(loop, r);
  }
}

// The lowest id this loop may still send: the responder forgets the answers below it.
uint64_t floor_of(Loop *loop) {
  prune(loop);
  const Req *r = loop->req.order.front();
  return r ? r->id : loop->req.next_id;
}

void arm(Socket *s) {
  const Req *r = s->reqs.deadlines.front();
  if (!r) {
    timer_stop(&s->req_timer);
    return;
  }
  const double in = r->deadline - ev_now(s->loop->ev);
  timer_start(&s->req_timer, in > 0 ? in : 0);
}

// The request's done callback: with the reply (IBMSG_OK) it is over, otherwise it may be retried
// within the window.
void finish(Socket *s, Req *r, Slot *reply, int status) {
  Loop *loop = s->loop;
  const bool first = s->reqs.deadlines.front() == r;
  s->reqs.deadlines.remove(r);
  ibmsg_request *pub = r->pub;
  r->pub = nullptr;
  r->sock = nullptr;
  r->posted = false;
  pub->status = status;
  pub->impl = nullptr;
  pub->check = 0;
  if (status == IBMSG_OK) forget(loop, r);
  if (first) arm(s);
  ibmsg_buffer *msg = reply ? &reply->own : nullptr;
  if (pub->done) pub->done(s->pub, pub, msg, status);
  else if (msg) msg_release(msg);
}

void on_req_timer(Timer *t) {
  Socket *s = static_cast<Socket *>(t->data);
  const double now = ev_now(s->loop->ev);
  // Those due now, in deadline order; a callback may post more (they go behind) or close the
  // connection (the teardown ends the rest).
  while (Req *r = s->reqs.deadlines.front()) {
    if (r->deadline > now + 1e-6 || s->state == State::Closing || s->state == State::Closed) break;
    ++s->stats.requests_timed_out;
    finish(s, r, nullptr, IBMSG_ETIMEDOUT);
  }
  if (s->state != State::Closing && s->state != State::Closed) arm(s);
}

// The posted request of s that a reply with this id answers, if any.
Req *waiting_for_reply(Socket *s, uint64_t id) {
  auto it = s->loop->req.live.find(id);
  Req *r = it == s->loop->req.live.end() ? nullptr : it->second;
  return r && r->posted && r->sock == s ? r : nullptr;
}

}  // namespace

void req_timer_init(Socket *s) { timer_init(&s->req_timer, s->loop, on_req_timer, s); }

void requests_init(Loop *loop) {
  uint64_t v = 0;
  while (!v) {
    if (getrandom(&v, sizeof v, GRND_NONBLOCK) != ssize_t(sizeof v)) {
      timespec ts{};
      clock_gettime(CLOCK_REALTIME, &ts);  // no entropy yet (early boot): time and process
      v = uint64_t(ts.tv_nsec) ^ uint64_t(ts.tv_sec) << 30 ^ uint64_t(getpid()) << 48 ^
          reinterpret_cast<uintptr_t>(loop);
    }
  }
  loop->req.session = v;
}

void requests_destroy(Loop *loop) {
  while (Req *r = loop->req.order.pop_front()) delete r;
  while (Req *r = loop->req.spare.pop_front()) delete r;
  loop->req.live.clear();
}

int req_post(Socket *s, ibmsg_buffer *msg, ibmsg_request *req, int timeout_ms, bool retry) {
  if (timeout_ms <= 0) return IBMSG_EINVAL;
  if (s->listener) return IBMSG_ESTATE;
  Loop *loop = s->loop;
  ReqLoop &rl = loop->req;
  // The timeout counts from now, not from the loop's last wake-up (the application may have
  // worked for a while since).
  ev_now_update(loop->ev);
  auto it = rl.live.find(req->id);
  Req *r = it == rl.live.end() ? nullptr : it->second;
  if (r && r->posted && r->pub == req) return IBMSG_EBUSY;
  if (req->impl && req->check == req_check(req, req->impl)) return IBMSG_EBUSY;
  if (retry) {
    if (!r || r->posted) {
      // Answered, never posted, or forgotten (older than the window): nothing to send again.
      if (r) return IBMSG_EBUSY;
      const bool failed = req->status != IBMSG_OK && req->status != IBMSG_EINPROGRESS &&
                          req->id && req->id < rl.next_id;
      return failed ? IBMSG_ETIMEDOUT : IBMSG_ESTATE;
    }
    if (r->owner != req) return IBMSG_ESTATE;  // another request's id (another loop's?)
    if (r->first_posted + window_s(loop) <= ev_now(loop->ev)) {
      forget(loop, r);
      return IBMSG_ETIMEDOUT;
    }
  }
  if (!state_can_post(s->state)) return IBMSG_ENOTCONN;
  if (s->peer.known && !(s->peer.features & wire::kFeatureRequest)) return IBMSG_EOPNOTSUPP;
  const bool fresh = !retry;
  if (fresh) {
    r = new_req(rl);
    if (!r) return IBMSG_ENOMEM;
    r->id = rl.next_id;
    r->first_posted = ev_now(loop->ev);
  }
  PostAs as;
  as.kind = MsgKind::Request;
  as.retry = retry;
  as.id = r->id;
  // The floor with this request counted: a fresh one is the highest id, a retried one is listed.
  as.floor = floor_of(loop);
  int rc = msg_post(s, msg, false, 0, &as);
  if (rc) {
    if (fresh) {
      rl.spare.push_back(r);
      ++rl.spares;
    }
    return rc;
  }
  if (fresh) {
    ++rl.next_id;
    rl.live.emplace(r->id, r);
    rl.order.push_back(r);
  } else {
    ++req->retries;
  }
  if (fresh) req->retries = 0;
  r->pub = req;
  r->owner = req;
  r->sock = s;
  r->posted = true;
  r->deadline = ev_now(loop->ev) + timeout_ms / 1000.0;
  req->id = r->id;
  req->status = IBMSG_EINPROGRESS;
  req->impl = r;
  req->check = req_check(req, r);
  deadline_insert<Req, &Req::dl, &Req::deadline>(s->reqs.deadlines, r);
  if (s->reqs.deadlines.front() == r) arm(s);
  return IBMSG_OK;
}

void req_on_reply(Socket *s, Slot *slot) {
  Req *r = waiting_for_reply(s, slot->req.id);
  if (!r) {
    // Late (the request timed out), or a reply to a request of another connection: dropped.
    ++s->stats.replies_dropped;  // (not counted as received)
    msg_release(&slot->own);
    return;
  }
  ++s->stats.msgs_received;
  s->stats.bytes_received += slot->own.size;
  finish(s, r, slot, IBMSG_OK);
}

ibmsg_request *req_awaiting(Socket *s, uint64_t id) {
  if (Req *r = waiting_for_reply(s, id)) return r->pub;
  ++s->stats.replies_dropped;
  return nullptr;
}

void req_on_declined(Socket *s, uint64_t id) {
  if (Req *r = waiting_for_reply(s, id)) finish(s, r, nullptr, IBMSG_EDECLINED);
}

void requests_closed(Socket *s, int reason) {
  timer_stop(&s->req_timer);
  const int status = reason == IBMSG_OK ? IBMSG_ECANCELED : reason;
  while (Req *r = s->reqs.deadlines.front()) finish(s, r, nullptr, status);
}

}  // namespace ibmsg
