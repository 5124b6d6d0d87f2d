// Requests and replies (protocol 1.5, kFeatureRequest; ibmsg(7), REQUESTS AND REPLIES).
//
// Requester (requests.cpp): each posted request has a record, owned by the loop, named by its id
// (the loop's counter: unique within the loop's session, never 0). A record lives while the
// request is posted, and after a timeout or a close for IBMSG_OPT_REQUEST_WINDOW from its first
// post, so that it may be retried with the same id; a reply ends it. The records of a
// connection's posted requests are in deadline order, one timer for the front.
//
// Responder (dedup.cpp): the loop remembers each request it delivered by (session, id): in
// progress until the application replies, then answered, with the reply's bytes while the cache
// has room, for the window. A copy that comes again (a retry) is not delivered: it gets the kept
// reply, or the reply once it is posted. The requester's floor (in each request) lets the
// responder forget what the requester will never send again.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <unordered_map>
#include <vector>

#include "ibmsg.h"
#include "list.hpp"

struct ibmsg__socket;
struct ibmsg__loop;
struct ibmsg__slot;

// The record of one request identity (ibmsg_request.impl).
struct ibmsg__req {
  ibmsg_request *pub = nullptr;     // while posted
  const ibmsg_request *owner = nullptr;  // the struct it was posted with (a retry takes the same)
  ::ibmsg__socket *sock = nullptr;  // while posted
  uint64_t id = 0;
  double first_posted = 0;  // loop time of its first post (the retry window starts there)
  double deadline = 0;      // while posted
  bool posted = false;
  ibmsg::ListNode order;  // the loop's records, by id
  ibmsg::ListNode dl;     // its connection's posted requests, by deadline
};

namespace ibmsg {

using Req = ::ibmsg__req;

// What a message is posted as (msg_post): a plain message, a request or a reply.
enum class MsgKind : uint8_t { Plain = 0, Request = 1, Reply = 2 };
struct PostAs {
  MsgKind kind = MsgKind::Plain;
  bool retry = false;
  uint64_t id = 0;
  uint64_t floor = 0;
};

// A request the responder delivered.
struct Answer {
  bool answered = false;       // replied (or freed unanswered: retries get nothing)
  bool kept = false;           // the reply's bytes are in `reply`
  double answered_at = 0;
  std::vector<uint8_t> reply;
  ::ibmsg__socket *waiting = nullptr;  // a copy came on this connection while in progress
};
struct Session {
  uint64_t floor = 0;      // the requester sends no id below it again
  uint64_t forgotten = 0;  // ids up to it were answered and forgotten (window or cache)
  double last = 0;         // loop time of its last request
  std::map<uint64_t, Answer> answers;
};

// A loop's requests (requester) and answers (responder).
struct ReqLoop {
  uint64_t session = 0;  // random, never 0
  uint64_t next_id = 1;
  std::unordered_map<uint64_t, Req *> live;  // records by id
  List<Req, &Req::order> order;              // the same, by id
  List<Req, &Req::order> spare;              // records to reuse (at most kSpareReqs)
  size_t spares = 0;
  std::unordered_map<uint64_t, Session> sessions;
  size_t kept_bytes = 0;  // reply bytes kept (IBMSG_OPT_REPLY_CACHE)
  double last_sweep = 0;
};

// A connection's posted requests.
struct ReqConn {
  uint64_t peer_session = 0;  // the session of the peer's requests (its hello)
  List<Req, &Req::dl> deadlines;
};

using Socket = ::ibmsg__socket;
using Slot = ::ibmsg__slot;
using Loop = ::ibmsg__loop;

// --- requests.cpp (the requester's side) ---
void requests_init(Loop *loop);  // the loop's session
void req_timer_init(Socket *s);  // a new socket
void requests_destroy(Loop *loop);  // the records of requests that may still be retried
// ibmsg_post_request (retry false) and ibmsg_retry_request
int req_post(Socket *s, ibmsg_buffer *msg, ibmsg_request *req, int timeout_ms, bool retry);
void req_on_reply(Socket *s, Slot *slot);  // a Reply is due for delivery: its request's done
void req_on_declined(Socket *s, uint64_t id);  // its rendezvous Reply declined: IBMSG_EDECLINED
// A rendezvous Reply announced: the request it answers; nullptr if late (counted dropped).
ibmsg_request *req_awaiting(Socket *s, uint64_t id);
void requests_closed(Socket *s, int reason);  // teardown: each posted request's done, once
}  // namespace ibmsg
