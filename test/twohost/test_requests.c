/*
 * test_requests.c - requests and replies between two hosts (ibmsg.h, "Requests and replies"):
 * how exactly timeouts fire, a retry across a partition of the link, and a retry over a new
 * connection after the requester closed its first one.
 *
 * Runs on both hosts of test/softroce/run --hosts 2 (test/twohost/run): host 1 (the client) is
 * the requester, host 2 (the server) the responder. The responder's message_received (the
 * on_received hook) checks each request's bytes, counts it (the handler ran), allocates its reply
 * at once and either replies at once or holds the request until the test replies. A request
 * carries a sequence number in its first 4 bytes (h_fill's pattern, size rq_size(seq)); its reply
 * carries the same number (size reply_size(seq)), so the requester's done callback checks that it
 * got exactly its own reply. The two hosts swap what they counted at a barrier, and each checks
 * the other's count too.
 *
 * Timeouts are measured on the requester from just before its post to its done callback, with
 * CLOCK_MONOTONIC in microseconds. The link is cut silently by twohost_link_cut() (frames dropped
 * both ways, carriers and RDMA ports up), as in test_liveness.c.
 *
 * Everything the library may still point at when a test fails (requests, messages, the records)
 * lives on the heap in one struct xr; a failed test leaks it on purpose.
 */
#define _POSIX_C_SOURCE 200809L

/* The harness is compiled into this program. */
#include "../integration/harness.c"
#include "xtest.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define XR_REQS 32   /* requests of the requester, each with its own message */
#define XR_OUT 64    /* replies in flight or held for a request */
#define XR_ROOM 256  /* bytes allocated for each request message */
#define STEP_MS 15000

/* The timeouts test: TO_COUNT requests of TO_MS, TO_AT_ONCE of them posted back to back, the
 * rest one every TO_GAP_MS while the loop runs (their deadlines fall between the timeouts of
 * the first ones). A timeout may fire at most TO_LATE_MS late, and TO_EARLY_MS early: the
 * library's clock (libev's) is read around the post, the test's just before it. */
#define TO_COUNT 20
#define TO_AT_ONCE 10
#define TO_GAP_MS 30
#define TO_MS 300
#define TO_LATE_MS 150
#define TO_EARLY_MS 2
#define TO_AFTER 4 /* requests posted once the timeouts are over: they are answered */

/* The partition test: the request's timeout, and the retry's (the reply queued behind the
 * partition comes when the responder's transport resends it, about its ack timeout after the
 * link is back). */
#define PT_TIMEOUT_MS 600
#define PT_RETRY_MS 10000

/* Sizes that vary with the sequence number, so that a reply of another request shows. */
static size_t rq_size(uint32_t seq) { return 16 + (seq * 37u) % 240u; }
static size_t reply_size(uint32_t seq) { return 8 + (seq * 13u) % 120u; }

static uint64_t x_now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

typedef struct xr xr;

/* One request of the requester and what its done callbacks saw. */
typedef struct {
  ibmsg_request req; /* first member */
  ibmsg_buffer msg;  /* its message, allocated on `conn` */
  xr *q;
  h_conn *conn;      /* the connection it was last posted on */
  uint32_t seq;      /* the number its payload carries, and its reply must carry */
  int posted;        /* successful posts and retries */
  int calls;         /* done callbacks */
  int status;        /* the status done got last */
  int replies;       /* done callbacks with a reply (checked: its own) */
  int closed_before; /* conn->closed when done ran last */
  int msg_busy;      /* msg posted and its message_sent not seen yet */
  int msg_status;    /* the status of its last message_sent */
  long dropped_at_done; /* the connection's replies_dropped when done ran last */
  uint64_t posted_us, done_us; /* x_now_us() just before the last post, and at done */
} xr_req;

/* A request the responder holds, with the reply allocated for it (out[out]). */
typedef struct {
  ibmsg_buffer *request;
  h_conn *conn;
  uint32_t seq;
  int out;
} xr_held;

/* A reply of the responder. */
typedef struct {
  ibmsg_buffer msg;
  int busy;   /* allocated */
  int posted; /* posted, message_sent not seen yet */
} xr_out;

struct xr {
  h_ctx *ctx;
  int reply_at_once; /* else the responder holds every request */

  /* responder */
  int handled; /* message_received with IBMSG_MSG_REQUEST: the handler ran */
  xr_held held[XR_REQS];
  int n_held;
  int replies_posted, replies_sent, replies_sent_ok;
  xr_out out[XR_OUT];

  /* requester */
  xr_req reqs[XR_REQS];
  int dones;              /* done callbacks */
  int requester_received; /* messages the requester received (a reply never may be one) */
};

#define t_new h_new

/* The sequence number in a message's first 4 bytes (h_fill). */
static uint32_t get32(const void *data) {
  const uint8_t *p = data;
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* The connection's counters (ibmsg_socket_stats). */
static ibmsg_stats stats_of(h_conn *c) {
  ibmsg_stats st;
  memset(&st, 0, sizeof st);
  H_ASSERT_OK(ibmsg_socket_stats(&c->sock, &st, sizeof st));
  return st;
}

/* Swaps two counts with the peer at barrier step. */
static void x_swap_counts(h_ctx *ctx, const char *step, int a, int b, int *peer_a, int *peer_b) {
  char mine[64], theirs[64];
  snprintf(mine, sizeof mine, "%d %d", a, b);
  X_EXCHANGE(ctx, step, mine, theirs, sizeof theirs);
  H_CHECK(sscanf(theirs, "%d %d", peer_a, peer_b) == 2, "the peer sent '%s' at '%s'", theirs, step);
}

/* --- the requester -------------------------------------------------------------------------- */

static void xr_done(ibmsg_socket *s, ibmsg_request *req, ibmsg_buffer *reply, int status) {
  xr_req *r = req->user_data;
  xr *q = r->q;
  h_ctx *ctx = q->ctx;
  h_conn *c = s ? (h_conn *)s->user_data : NULL;
  char why[200];
  int rc;

  r->done_us = x_now_us();
  r->calls++;
  r->status = status;
  q->dones++;
  if (!c || &c->sock != s) {
    h_note_error(ctx, "done called with a socket that is not one of the test's");
  } else {
    ibmsg_stats st;
    r->closed_before = c->closed;
    memset(&st, 0, sizeof st);
    r->dropped_at_done =
        ibmsg_socket_stats(s, &st, sizeof st) == IBMSG_OK ? (long)st.replies_dropped : -1;
    if (c != r->conn)
      h_note_error(ctx, "request %u: done called for %s, but it was posted on %s", r->seq, c->name,
                   r->conn->name);
  }
  if (r->calls > r->posted)
    h_note_error(ctx, "request %u: %d done callbacks for %d posts and retries (now %s)", r->seq,
                 r->calls, r->posted, ibmsg_err_name(status));
  if (req->status != status)
    h_note_error(ctx, "request %u: req->status is %s inside done, which got %s", r->seq,
                 ibmsg_err_name(req->status), ibmsg_err_name(status));
  if (status == IBMSG_OK) {
    if (!reply) {
      h_note_error(ctx, "request %u: done with IBMSG_OK but no reply", r->seq);
      return;
    }
    r->replies++;
    if (reply->status != IBMSG_RECEIVED)
      h_note_error(ctx, "request %u: the reply has status %d, expected IBMSG_RECEIVED", r->seq,
                   (int)reply->status);
    if (reply->flags & IBMSG_MSG_REQUEST)
      h_note_error(ctx, "request %u: the reply is marked as a request", r->seq);
    if (reply->size != reply_size(r->seq))
      h_note_error(ctx, "request %u: the reply has %zu bytes, expected %zu (another request's "
                   "reply?)", r->seq, reply->size, reply_size(r->seq));
    else if (h_check(reply->data, reply->size, r->seq, why, sizeof why) != 0)
      h_note_error(ctx, "request %u: its reply %s", r->seq, why);
    rc = ibmsg_free_msg(reply);
    if (rc != IBMSG_OK)
      h_note_error(ctx, "request %u: ibmsg_free_msg(reply) failed: %s", r->seq, ibmsg_err_name(rc));
  } else if (reply) {
    h_note_error(ctx, "request %u: done with %s and a reply (must be NULL)", r->seq,
                 ibmsg_err_name(status));
    ibmsg_free_msg(reply);
  }
}

/* Makes r a new request record with a message allocated on c. */
static void xr_init(xr *q, xr_req *r, h_conn *c, uint32_t seq) {
  int rc;
  memset(r, 0, sizeof *r);
  r->q = q;
  r->conn = c;
  r->seq = seq;
  r->req.done = xr_done;
  r->req.user_data = r;
  rc = ibmsg_alloc_msg(&r->msg, &c->sock, XR_ROOM);
  if (rc != IBMSG_OK)
    h_fail_at(__FILE__, __LINE__, "%s: ibmsg_alloc_msg for a request failed: %s (%d)", c->name,
              ibmsg_err_name(rc), rc);
  r->msg.user_data = r;
}

/* A new message for r on c (after its old one's connection closed). */
static void xr_realloc(xr_req *r, h_conn *c) {
  H_CHECK(!r->msg_busy, "request %u: its message is still posted", r->seq);
  H_ASSERT_OK(ibmsg_free_msg(&r->msg));
  H_ASSERT_OK(ibmsg_alloc_msg(&r->msg, &c->sock, XR_ROOM));
  r->msg.user_data = r;
}

static void xr_fill(xr_req *r) {
  r->msg.size = rq_size(r->seq);
  h_fill(r->msg.data, r->msg.size, r->seq);
}

/* ibmsg_post_request() (or, with retry, ibmsg_retry_request()) of r on c, with the bookkeeping. */
static int xr_send(xr_req *r, h_conn *c, int timeout_ms, int retry) {
  uint64_t now;
  int rc;
  xr_fill(r);
  now = x_now_us();
  rc = retry ? ibmsg_retry_request(&c->sock, &r->msg, &r->req, timeout_ms)
             : ibmsg_post_request(&c->sock, &r->msg, &r->req, timeout_ms);
  if (rc != IBMSG_OK) return rc;
  r->conn = c;
  r->posted++;
  r->msg_busy = 1;
  r->posted_us = now;
  c->posted++;
  return rc;
}
#define xr_post(r, c, timeout_ms) xr_send((r), (c), (timeout_ms), 0)
#define xr_retry(r, c, timeout_ms) xr_send((r), (c), (timeout_ms), 1)

static xr_req *xr_req_of_msg(xr *q, ibmsg_buffer *msg) {
  const char *p = (const char *)msg;
  if (p < (const char *)q->reqs || p >= (const char *)(q->reqs + XR_REQS)) return NULL;
  return (xr_req *)msg->user_data;
}

/* --- the responder -------------------------------------------------------------------------- */

static int xr_out_index(xr *q, const ibmsg_buffer *msg) {
  const char *p = (const char *)msg;
  if (p < (const char *)q->out || p >= (const char *)(q->out + XR_OUT)) return -1;
  return (int)((const xr_out *)p - q->out);
}

/* Allocates a reply on c of seq's size and pattern; -1 (noted) if none. */
static int xr_out_alloc(xr *q, h_conn *c, uint32_t seq) {
  size_t size = reply_size(seq);
  int k, rc;
  for (k = 0; k < XR_OUT && q->out[k].busy; k++) continue;
  if (k == XR_OUT) {
    h_note_error(q->ctx, "%s: more than %d replies at once", c->name, XR_OUT);
    return -1;
  }
  rc = ibmsg_alloc_msg(&q->out[k].msg, &c->sock, size);
  if (rc != IBMSG_OK) {
    h_note_error(q->ctx, "%s: ibmsg_alloc_msg(%zu) for a reply failed: %s (%d)", c->name, size,
                 ibmsg_err_name(rc), rc);
    return -1;
  }
  h_fill(q->out[k].msg.data, size, seq);
  q->out[k].busy = 1;
  q->out[k].posted = 0;
  return k;
}

static int xr_out_release(xr *q, int k) {
  int rc = ibmsg_free_msg(&q->out[k].msg);
  if (rc == IBMSG_OK) q->out[k].busy = 0;
  return rc;
}

/* ibmsg_post_reply() of reply k to request on c, with the bookkeeping. */
static int xr_post_reply(xr *q, h_conn *c, ibmsg_buffer *request, int k) {
  int rc = ibmsg_post_reply(&c->sock, request, &q->out[k].msg);
  if (rc != IBMSG_OK) return rc;
  q->out[k].posted = 1;
  q->replies_posted++;
  c->posted++;
  return rc;
}

/* Posts the reply of held request i and frees the request; on failure leaves both held. */
static int xr_reply_held(xr *q, int i) {
  xr_held *h = &q->held[i];
  int rc = xr_post_reply(q, h->conn, h->request, h->out);
  if (rc != IBMSG_OK) return rc;
  rc = ibmsg_free_msg(h->request);
  if (rc != IBMSG_OK)
    h_note_error(q->ctx, "%s: ibmsg_free_msg of an answered request failed: %s", h->conn->name,
                 ibmsg_err_name(rc));
  q->held[i] = q->held[--q->n_held];
  return IBMSG_OK;
}

/* The index of the held request with sequence number seq (fails the test if none). */
static int xr_held_index(xr *q, uint32_t seq) {
  int i;
  for (i = 0; i < q->n_held; i++)
    if (q->held[i].seq == seq) return i;
  h_fail_at(__FILE__, __LINE__, "the responder holds no request %u (%d held)", seq, q->n_held);
  return -1;
}

/* The handler: message_received of a request on the responder. */
static void xr_respond(xr *q, h_conn *c, ibmsg_buffer *msg) {
  h_ctx *ctx = q->ctx;
  char why[200];
  uint32_t seq;
  int k, rc;

  q->handled++;
  if (msg->size < 4) {
    h_note_error(ctx, "%s: a request of %zu bytes (none of the test's is below 16)", c->name,
                 msg->size);
    ibmsg_free_msg(msg);
    return;
  }
  seq = get32(msg->data);
  if (msg->size != rq_size(seq))
    h_note_error(ctx, "%s: request %u has %zu bytes, expected %zu", c->name, seq, msg->size,
                 rq_size(seq));
  else if (h_check(msg->data, msg->size, seq, why, sizeof why) != 0)
    h_note_error(ctx, "%s: request %u %s", c->name, seq, why);
  k = xr_out_alloc(q, c, seq);
  if (k < 0) {
    ibmsg_free_msg(msg);
    return;
  }
  if (q->reply_at_once) {
    rc = xr_post_reply(q, c, msg, k);
    if (rc != IBMSG_OK) {
      h_note_error(ctx, "%s: ibmsg_post_reply to request %u failed: %s (%d)", c->name, seq,
                   ibmsg_err_name(rc), rc);
      xr_out_release(q, k);
    }
    rc = ibmsg_free_msg(msg);
    if (rc != IBMSG_OK)
      h_note_error(ctx, "%s: ibmsg_free_msg of an answered request failed: %s", c->name,
                   ibmsg_err_name(rc));
    return;
  }
  if (q->n_held == XR_REQS) {
    h_note_error(ctx, "%s: more than %d requests held", c->name, XR_REQS);
    xr_out_release(q, k);
    ibmsg_free_msg(msg);
    return;
  }
  q->held[q->n_held].request = msg;
  q->held[q->n_held].conn = c;
  q->held[q->n_held].seq = seq;
  q->held[q->n_held].out = k;
  q->n_held++;
}

/* --- the hooks ---------------------------------------------------------------------------- */

static void xr_on_received(h_conn *c, ibmsg_buffer *msg) {
  h_ctx *ctx = c->ctx;
  xr *q = ctx->data;
  int rc;

  if (twohost_is_client()) {
    /* The responder sends nothing but replies: a message here is a reply delivered wrongly. */
    q->requester_received++;
    h_note_error(ctx, "%s: the requester received a message of %zu bytes (flags 0x%x): replies "
                 "must go to their request's done, late ones dropped", c->name, msg->size,
                 msg->flags);
  } else if (msg->flags & IBMSG_MSG_REQUEST) {
    xr_respond(q, c, msg);
    return;
  } else {
    h_note_error(ctx, "%s: the responder received a plain message of %zu bytes (the requester "
                 "sends only requests)", c->name, msg->size);
  }
  rc = ibmsg_free_msg(msg);
  if (rc != IBMSG_OK)
    h_note_error(ctx, "%s: ibmsg_free_msg of a received message failed: %s", c->name,
                 ibmsg_err_name(rc));
}

static void xr_on_sent(h_conn *c, ibmsg_buffer *msg, int status) {
  h_ctx *ctx = c->ctx;
  xr *q = ctx->data;
  xr_req *r;
  int k = xr_out_index(q, msg), rc;

  if (k >= 0) {
    if (!q->out[k].posted) {
      h_note_error(ctx, "%s: message_sent for a reply that is not posted", c->name);
      return;
    }
    q->out[k].posted = 0;
    q->replies_sent++;
    if (status == IBMSG_OK) q->replies_sent_ok++;
    else h_note_error(ctx, "%s: message_sent of a reply with %s", c->name, ibmsg_err_name(status));
    rc = xr_out_release(q, k);
    if (rc != IBMSG_OK)
      h_note_error(ctx, "%s: ibmsg_free_msg of a sent reply failed: %s", c->name,
                   ibmsg_err_name(rc));
  } else if ((r = xr_req_of_msg(q, msg)) != NULL) {
    if (!r->msg_busy) h_note_error(ctx, "request %u: message_sent for its message twice", r->seq);
    r->msg_busy = 0;
    r->msg_status = status;
    if (status != IBMSG_OK)
      h_note_error(ctx, "request %u: message_sent of its message with %s", r->seq,
                   ibmsg_err_name(status));
  } else {
    h_note_error(ctx, "%s: message_sent for a message the test does not know", c->name);
  }
}

/* A record for the test, installed as ctx->data with the hooks. */
static xr *xr_new(h_ctx *ctx) {
  xr *q = t_new(sizeof *q);
  q->ctx = ctx;
  ctx->data = q;
  ctx->on_received = xr_on_received;
  ctx->on_sent = xr_on_sent;
  return q;
}

/* Frees every message the test holds (none may be posted still), then x_finish(), and the
 * record. */
static void xr_finish(h_ctx *ctx, xr *q) {
  int i;
  for (i = 0; i < XR_REQS; i++) {
    xr_req *r = &q->reqs[i];
    if (!r->q) continue;
    H_CHECK(!r->msg_busy, "request %u: its message is still posted at the end", r->seq);
    H_CHECK(r->calls == r->posted, "request %u: %d done callbacks for %d posts and retries",
            r->seq, r->calls, r->posted);
    H_ASSERT_OK(ibmsg_free_msg(&r->msg));
    r->q = NULL;
  }
  for (i = 0; i < q->n_held; i++) {
    H_ASSERT_OK(ibmsg_free_msg(q->held[i].request));
    H_ASSERT_OK(xr_out_release(q, q->held[i].out));
  }
  q->n_held = 0;
  for (i = 0; i < XR_OUT; i++) {
    H_CHECK(!q->out[i].posted, "a reply is still posted at the end");
    if (q->out[i].busy) H_ASSERT_OK(xr_out_release(q, i));
  }
  x_finish(ctx);
  ctx->on_received = NULL;
  ctx->on_sent = NULL;
  ctx->data = NULL;
  free(q);
}

/* Each connection has receive buffers of its own: the responder may hold all the requests. */
static void xr_options(h_ctx *ctx) {
  h_setopt_int(ctx, IBMSG_OPT_SHARED_RECV, 0);
  h_setopt_int(ctx, IBMSG_OPT_RECV_DEPTH, 32);
}

/* --- the link (as in test_liveness.c) ------------------------------------------------------ */

/* The link cut and healed (xtest.h), timed in x_now_us(). */
#define l_cut(ctx) x_link_cut((ctx), x_now_us)
#define l_restore(ctx) x_link_restore((ctx), x_now_us)

/* A test that failed midway may leave the link cut: heal it before the next one. */
static int l_teardown(void **state) {
  if (twohost_link_is_cut() == 1) twohost_link_restore();
  return x_teardown(state);
}
#define R_TEST(f) cmocka_unit_test_setup_teardown(f, h_setup, l_teardown)

/* --- timeouts ------------------------------------------------------------------------------- */

static int cmp_long(const void *a, const void *b) {
  long x = *(const long *)a, y = *(const long *)b;
  return x < y ? -1 : x > y;
}

/* The responder holds every request: each times out once, on time; the connection stays up;
 * the replies posted after the timeouts are dropped; then new requests get their replies. */
static void requests_without_reply_time_out_on_time_and_late_replies_are_dropped(void **state) {
  h_ctx *ctx = *state;
  h_conn *c;
  xr *q;
  long late_us[TO_COUNT];
  int i, replies = 0, peer_a = -1, peer_b = -1;

  X_BEGIN(ctx);
  xr_options(ctx);
  q = xr_new(ctx);
  c = x_pair(ctx, 0);
  if (twohost_is_client()) {
    for (i = 0; i < TO_COUNT; i++) xr_init(q, &q->reqs[i], c, (uint32_t)i + 1);
    for (i = 0; i < TO_COUNT; i++) {
      if (i >= TO_AT_ONCE) h_run_for(ctx, TO_GAP_MS);
      H_ASSERT_OK(xr_post(&q->reqs[i], c, TO_MS));
      H_ASSERT_REASON(q->reqs[i].req.status, IBMSG_EINPROGRESS, "req->status after posting");
    }
    H_RUN_UNTIL(ctx, q->dones == TO_COUNT || c->closed, STEP_MS);
    x_assert_open(c);
    h_run_for(ctx, 200); /* a second done would show up here */
    for (i = 0; i < TO_COUNT; i++) {
      xr_req *r = &q->reqs[i];
      long took = (long)(r->done_us - r->posted_us);
      H_ASSERT_EQ(r->calls, 1, "done callbacks of a request without reply");
      H_ASSERT_REASON(r->status, IBMSG_ETIMEDOUT, "done status of a request without reply");
      H_ASSERT_REASON(r->req.status, IBMSG_ETIMEDOUT, "req->status after its timeout");
      H_ASSERT_EQ(r->replies, 0, "replies of a request without reply");
      H_CHECK(took >= (TO_MS - TO_EARLY_MS) * 1000L, "request %d with a timeout of %d ms timed "
              "out after %.1f ms: early", i, TO_MS, took / 1000.0);
      H_CHECK(took <= (TO_MS + TO_LATE_MS) * 1000L, "request %d with a timeout of %d ms timed "
              "out after %.1f ms: more than %d ms late", i, TO_MS, took / 1000.0, TO_LATE_MS);
      late_us[i] = took - TO_MS * 1000L;
    }
    qsort(late_us, TO_COUNT, sizeof late_us[0], cmp_long);
    print_message("  client: %d timeouts of %d ms fired late by %.1f ms (min) %.1f (median) "
                  "%.1f (max)\n", TO_COUNT, TO_MS, late_us[0] / 1000.0,
                  late_us[TO_COUNT / 2] / 1000.0, late_us[TO_COUNT - 1] / 1000.0);
    H_ASSERT_EQ(q->dones, TO_COUNT, "done callbacks");
    H_ASSERT_EQ(stats_of(c).requests_timed_out, TO_COUNT, "the requester's requests_timed_out");
    H_ASSERT_EQ(stats_of(c).replies_dropped, 0, "the requester's replies_dropped before any reply");
  } else {
    H_RUN_UNTIL(ctx, q->handled == TO_COUNT || c->closed, STEP_MS);
    x_assert_open(c);
  }
  X_SYNC(ctx, "timed out");
  H_ASSERT_STATUS(c->sock.status, IBMSG_CONNECTED, "status after the timeouts");

  /* The responder answers them all now: every reply goes out, none reaches a done. */
  if (twohost_is_server()) {
    H_ASSERT_EQ(q->handled, TO_COUNT, "requests the handler saw");
    H_ASSERT_EQ(q->n_held, TO_COUNT, "requests the responder holds");
    while (q->n_held > 0) H_ASSERT_OK(xr_reply_held(q, 0));
    H_RUN_UNTIL(ctx, q->replies_sent == TO_COUNT || c->closed, STEP_MS);
    x_assert_open(c);
    H_ASSERT_EQ(q->replies_sent_ok, TO_COUNT, "late replies with message_sent(IBMSG_OK)");
    q->reply_at_once = 1; /* from here on */
  }
  X_SYNC(ctx, "late replies sent");
  if (twohost_is_client()) {
    H_RUN_UNTIL(ctx, c->closed || stats_of(c).replies_dropped >= TO_COUNT, STEP_MS);
    x_assert_open(c);
    h_run_for(ctx, 300);
    H_ASSERT_EQ(stats_of(c).replies_dropped, TO_COUNT, "the requester's replies_dropped");
    H_ASSERT_EQ(q->dones, TO_COUNT, "done callbacks after the late replies (they must be dropped)");
    H_ASSERT_EQ(q->requester_received, 0, "late replies delivered as messages");
    H_ASSERT_EQ(c->received, 0, "message_received callbacks of the requester");

    /* The connection still works: new requests get their own replies. */
    for (i = TO_COUNT; i < TO_COUNT + TO_AFTER; i++) {
      xr_init(q, &q->reqs[i], c, (uint32_t)i + 100);
      H_ASSERT_OK(xr_post(&q->reqs[i], c, 5000));
    }
    H_RUN_UNTIL(ctx, q->dones == TO_COUNT + TO_AFTER || c->closed, STEP_MS);
    x_assert_open(c);
    h_run_for(ctx, 200);
    for (i = TO_COUNT; i < TO_COUNT + TO_AFTER; i++) {
      H_ASSERT_EQ(q->reqs[i].calls, 1, "done callbacks of a request answered");
      H_ASSERT_REASON(q->reqs[i].status, IBMSG_OK, "done status of a request answered");
      H_ASSERT_EQ(q->reqs[i].replies, 1, "replies of a request answered");
    }
    H_ASSERT_EQ(q->dones, TO_COUNT + TO_AFTER, "done callbacks in all");
    H_ASSERT_EQ(stats_of(c).replies_dropped, TO_COUNT, "replies_dropped after the answered ones");
    for (i = TO_COUNT; i < TO_COUNT + TO_AFTER; i++) replies += q->reqs[i].replies;
    x_swap_counts(ctx, "counts", q->dones, replies, &peer_a, &peer_b);
    H_ASSERT_EQ(peer_a, TO_COUNT + TO_AFTER, "the responder's handler runs");
    H_ASSERT_EQ(peer_b, TO_COUNT + TO_AFTER, "the responder's replies with message_sent(IBMSG_OK)");
  } else {
    H_RUN_UNTIL(ctx, (q->handled == TO_COUNT + TO_AFTER &&
                      q->replies_sent == TO_COUNT + TO_AFTER) || c->closed, STEP_MS);
    x_assert_open(c);
    h_run_for(ctx, 200);
    H_ASSERT_EQ(c->received, TO_COUNT + TO_AFTER, "requests the responder received");
    H_ASSERT_EQ(q->replies_sent_ok, TO_COUNT + TO_AFTER, "replies with message_sent(IBMSG_OK)");
    x_swap_counts(ctx, "counts", q->handled, q->replies_sent_ok, &peer_a, &peer_b);
    H_ASSERT_EQ(peer_a, TO_COUNT + TO_AFTER, "the requester's done callbacks");
    H_ASSERT_EQ(peer_b, TO_AFTER, "the replies the requester got");
  }
  x_assert_open(c);
  H_ASSERT_EQ(c->sent, c->posted, "message_sent callbacks vs. posts");
  xr_finish(ctx, q);
}

/* --- a retry across a partition ------------------------------------------------------------- */

/* The responder replies while the link is cut: the request times out, the link comes back, the
 * retry gets a reply (the one queued behind the partition or the kept one; the other is
 * dropped) and the handler ran once. */
static void a_retry_across_a_partition_gets_the_reply_and_runs_the_handler_once(void **state) {
  h_ctx *ctx = *state;
  h_conn *c;
  xr *q;
  xr_req *r = NULL;
  uint64_t id = 0, cut_us, restored_us;
  int peer_a = -1, peer_b = -1;

  X_BEGIN(ctx);
  xr_options(ctx);
  h_setopt_int(ctx, IBMSG_OPT_KEEPALIVE, 0); /* the partition must not close the connection */
  q = xr_new(ctx);
  c = x_pair(ctx, 0);
  if (twohost_is_client()) {
    r = &q->reqs[0];
    xr_init(q, r, c, 21);
    H_ASSERT_OK(xr_post(r, c, PT_TIMEOUT_MS));
    id = r->req.id;
    H_RUN_UNTIL(ctx, !r->msg_busy || c->closed, STEP_MS);
    x_assert_open(c);
    H_ASSERT_REASON(r->msg_status, IBMSG_OK, "message_sent status of the request");
  } else {
    H_RUN_UNTIL(ctx, q->handled == 1 || c->closed, STEP_MS);
    x_assert_open(c);
  }
  X_SYNC(ctx, "held");
  cut_us = l_cut(ctx);
  if (twohost_is_server()) {
    /* The reply goes into the partition: the transport resends it once the link is back. */
    H_ASSERT_EQ(q->n_held, 1, "requests the responder holds");
    H_ASSERT_OK(xr_reply_held(q, 0));
  } else {
    print_message("  client: the link was cut %.1f ms after the post (request timeout %d ms, "
                  "status then %s)\n", (double)(cut_us - r->posted_us) / 1000.0, PT_TIMEOUT_MS,
                  ibmsg_err_name(r->req.status));
  }
  X_SYNC(ctx, "replied into the partition");
  if (twohost_is_client()) {
    long took;
    H_RUN_UNTIL(ctx, r->calls == 1 || c->closed, STEP_MS);
    x_assert_open(c);
    took = (long)(r->done_us - r->posted_us);
    print_message("  client: the request timed out %.1f ms after its post\n", took / 1000.0);
    H_ASSERT_REASON(r->status, IBMSG_ETIMEDOUT, "done status of a request whose reply is cut off");
    H_CHECK(took >= (PT_TIMEOUT_MS - TO_EARLY_MS) * 1000L &&
                took <= (PT_TIMEOUT_MS + TO_LATE_MS) * 1000L,
            "the request with a timeout of %d ms timed out after %.1f ms", PT_TIMEOUT_MS,
            took / 1000.0);
    h_run_for(ctx, 100);
    H_ASSERT_EQ(r->calls, 1, "done callbacks during the partition");
  }
  restored_us = l_restore(ctx);

  if (twohost_is_client()) {
    H_ASSERT_OK(xr_retry(r, c, PT_RETRY_MS));
    H_ASSERT_EQ(r->req.retries, 1, "req->retries after the retry");
    H_CHECK(r->req.id == id, "the retry changed the id from %llu to %llu", (unsigned long long)id,
            (unsigned long long)r->req.id);
    H_ASSERT_REASON(r->req.status, IBMSG_EINPROGRESS, "req->status after the retry");
    /* Two replies reach the requester (the first one, resent by the transport, and the kept one
     * the retry asked for): one goes to done, the other is dropped. */
    H_RUN_UNTIL(ctx, c->closed || (r->calls == 2 && stats_of(c).replies_dropped >= 1), STEP_MS);
    x_assert_open(c);
    print_message("  client: the retry got %s %.1f ms after the link came back\n",
                  r->dropped_at_done == 0 ? "the reply queued behind the partition"
                                          : "the kept reply (the queued one came first: dropped)",
                  (double)(r->done_us - restored_us) / 1000.0);
    h_run_for(ctx, 300);
    H_ASSERT_EQ(r->calls, 2, "done callbacks: one for the post, one for the retry");
    H_ASSERT_REASON(r->status, IBMSG_OK, "done status of the retry");
    H_ASSERT_EQ(r->replies, 1, "replies the request got");
    H_ASSERT_REASON(r->msg_status, IBMSG_OK, "message_sent status of the retry");
    H_ASSERT_EQ(q->requester_received, 0, "replies delivered as messages");
    H_ASSERT_EQ(stats_of(c).replies_dropped, 1, "the requester's replies_dropped");
    H_ASSERT_EQ(stats_of(c).requests_timed_out, 1, "the requester's requests_timed_out");
    H_ASSERT_CODE(ibmsg_retry_request(&c->sock, &r->msg, &r->req, 1000), IBMSG_ESTATE);
    x_swap_counts(ctx, "counts", r->calls, r->replies, &peer_a, &peer_b);
    H_ASSERT_EQ(peer_a, 1, "the responder's handler runs");
    H_ASSERT_EQ(peer_b, 1, "the replies the responder resent for the retry");
  } else {
    /* The reply's message_sent comes once the transport got it through; the retry gets the kept
     * reply resent. */
    H_RUN_UNTIL(ctx, c->closed || (q->replies_sent == 1 && stats_of(c).replies_resent >= 1),
                STEP_MS);
    x_assert_open(c);
    h_run_for(ctx, 300);
    H_ASSERT_EQ(q->replies_sent_ok, 1, "the reply's message_sent(IBMSG_OK)");
    H_ASSERT_EQ(q->handled, 1, "handler runs (the retry must not run it again)");
    H_ASSERT_EQ(c->received, 1, "message_received callbacks of the responder");
    H_ASSERT_EQ(stats_of(c).replies_resent, 1, "the responder's replies_resent");
    x_swap_counts(ctx, "counts", q->handled, (int)stats_of(c).replies_resent, &peer_a, &peer_b);
    H_ASSERT_EQ(peer_a, 2, "the requester's done callbacks");
    H_ASSERT_EQ(peer_b, 1, "the replies the requester got");
  }
  x_assert_open(c);
  H_ASSERT_EQ(c->sent, c->posted, "message_sent callbacks vs. posts");
  xr_finish(ctx, q);
}

/* --- a retry over a new connection ---------------------------------------------------------- */

/* The requester closes its connection with two requests outstanding (each done gets
 * IBMSG_ECANCELED once); the responder answers A on the closed connection (refused, the reply is
 * kept); the requester connects again from its loop and retries both: A gets the kept reply, B
 * the reply the responder posts afterwards on the closed connection. Each handler ran once. */
static void a_retry_over_a_new_connection_gets_the_replies_posted_after_the_close(void **state) {
  h_ctx *ctx = *state;
  h_conn *c1, *c2 = NULL, *s2 = NULL;
  xr *q;
  xr_req *a = NULL, *b = NULL;
  uint64_t id_a = 0, id_b = 0;
  char port[16];
  int i, k, peer_a = -1, peer_b = -1;
  const uint32_t seq_a = 31, seq_b = 32;

  X_BEGIN(ctx);
  xr_options(ctx);
  q = xr_new(ctx);
  c1 = x_pair(ctx, 0);
  if (twohost_is_client()) {
    a = &q->reqs[0];
    b = &q->reqs[1];
    xr_init(q, a, c1, seq_a);
    xr_init(q, b, c1, seq_b);
    H_ASSERT_OK(xr_post(a, c1, 10000));
    H_ASSERT_OK(xr_post(b, c1, 10000));
    id_a = a->req.id;
    id_b = b->req.id;
    H_RUN_UNTIL(ctx, (!a->msg_busy && !b->msg_busy) || c1->closed, STEP_MS);
    x_assert_open(c1);
  } else {
    H_RUN_UNTIL(ctx, q->handled == 2 || c1->closed, STEP_MS);
    x_assert_open(c1);
  }
  X_SYNC(ctx, "held");

  if (twohost_is_client()) {
    H_ASSERT_OK(ibmsg_disconnect(&c1->sock));
    H_RUN_UNTIL(ctx, a->calls == 1 && b->calls == 1 && c1->closed, STEP_MS);
    h_run_for(ctx, 200);
    for (i = 0; i < 2; i++) {
      xr_req *r = i ? b : a;
      H_ASSERT_EQ(r->calls, 1, "done callbacks of a request whose connection closed");
      H_ASSERT_REASON(r->status, IBMSG_ECANCELED, "done status after the requester's disconnect");
      H_ASSERT_EQ(r->replies, 0, "replies");
      H_ASSERT_EQ(r->closed_before, 0, "connection_closed callbacks before the request's done");
    }
    H_ASSERT_EQ(c1->closed, 1, "connection_closed callbacks");
    H_ASSERT_REASON(c1->close_reason, IBMSG_OK, "close reason of the requester");
  } else {
    H_RUN_UNTIL(ctx, c1->closed, STEP_MS);
    H_ASSERT_REASON(c1->close_reason, IBMSG_ECONNRESET, "close reason of the responder");
    /* It answers A on the closed connection: refused, but the reply is kept. */
    H_ASSERT_EQ(q->n_held, 2, "requests the responder holds");
    i = xr_held_index(q, seq_a);
    k = q->held[i].out;
    H_ASSERT_CODE(ibmsg_post_reply(&c1->sock, q->held[i].request, &q->out[k].msg), IBMSG_ENOTCONN);
    H_ASSERT_EQ(q->out[k].msg.status, IBMSG_WAITING, "the refused reply's status (it stays the "
                "application's)");
    H_ASSERT_OK(xr_out_release(q, k));
    H_ASSERT_OK(ibmsg_free_msg(q->held[i].request));
    q->held[i] = q->held[--q->n_held];
  }
  X_SYNC(ctx, "closed");

  /* The requester connects again to the same listener, from the same loop. */
  if (twohost_is_server()) {
    snprintf(port, sizeof port, "%u", (unsigned)ctx->port);
    X_EXCHANGE(ctx, "port", port, NULL, 0);
    s2 = x_await_accepted(ctx, 1, STEP_MS, "the second connection");
  } else {
    X_EXCHANGE(ctx, "port", NULL, port, sizeof port);
    c2 = h_connect(ctx, twohost_peer_addr(), (unsigned short)atoi(port));
    H_RUN_UNTIL(ctx, c2->established || c2->closed, STEP_MS);
    H_CHECK(!c2->closed, "connecting again failed: %s", ibmsg_err_name(c2->close_reason));
  }
  X_SYNC(ctx, "reconnected");

  if (twohost_is_client()) {
    xr_realloc(a, c2);
    xr_realloc(b, c2);
    H_ASSERT_OK(xr_retry(a, c2, 10000));
    H_ASSERT_OK(xr_retry(b, c2, 10000));
    H_ASSERT_EQ(a->req.retries, 1, "req->retries of A");
    H_ASSERT_EQ(b->req.retries, 1, "req->retries of B");
    H_CHECK(a->req.id == id_a && b->req.id == id_b, "a retry changed an id (A %llu -> %llu, "
            "B %llu -> %llu)", (unsigned long long)id_a, (unsigned long long)a->req.id,
            (unsigned long long)id_b, (unsigned long long)b->req.id);
    /* A was answered: its retry gets the kept reply. B's retry reaches the responder. */
    H_RUN_UNTIL(ctx, (a->calls == 2 && !b->msg_busy) || c2->closed, STEP_MS);
    x_assert_open(c2);
    H_ASSERT_REASON(a->status, IBMSG_OK, "done status of A's retry (the kept reply)");
    H_ASSERT_EQ(a->replies, 1, "replies of A");
    H_ASSERT_EQ(b->calls, 1, "done callbacks of B while the responder works on it");
  }
  X_SYNC(ctx, "retried");

  if (twohost_is_server()) {
    h_run_for(ctx, 300); /* the retries are in: neither may run the handler */
    H_ASSERT_EQ(q->handled, 2, "handler runs after the retries");
    H_ASSERT_EQ(s2->received, 0, "message_received callbacks on the new connection");
    H_ASSERT_EQ(stats_of(s2).replies_resent, 1, "replies resent on the new connection (A's)");
    /* B's reply, posted on the closed connection, goes to the retry waiting on the new one. */
    H_ASSERT_EQ(q->n_held, 1, "requests the responder holds");
    i = xr_held_index(q, seq_b);
    k = q->held[i].out;
    H_ASSERT_CODE(ibmsg_post_reply(&c1->sock, q->held[i].request, &q->out[k].msg), IBMSG_ENOTCONN);
    H_ASSERT_OK(xr_out_release(q, k));
    H_ASSERT_OK(ibmsg_free_msg(q->held[i].request));
    q->n_held = 0;
    H_RUN_UNTIL(ctx, s2->closed || stats_of(s2).replies_resent >= 2, STEP_MS);
    x_assert_open(s2);
  }
  X_SYNC(ctx, "answered B");

  if (twohost_is_client()) {
    H_RUN_UNTIL(ctx, b->calls == 2 || c2->closed, STEP_MS);
    x_assert_open(c2);
    h_run_for(ctx, 300);
    H_ASSERT_REASON(b->status, IBMSG_OK, "done status of B's retry");
    H_ASSERT_EQ(b->replies, 1, "replies of B");
    H_ASSERT_EQ(a->calls, 2, "done callbacks of A");
    H_ASSERT_EQ(b->calls, 2, "done callbacks of B");
    H_ASSERT_EQ(q->requester_received, 0, "replies delivered as messages");
    H_ASSERT_EQ(stats_of(c2).replies_dropped, 0, "the new connection's replies_dropped");
    H_ASSERT_EQ(stats_of(c2).requests_timed_out, 0, "the new connection's requests_timed_out");
    H_ASSERT_EQ(c2->sent, c2->posted, "message_sent callbacks vs. posts on the new connection");
    x_swap_counts(ctx, "counts", q->dones, a->replies + b->replies, &peer_a, &peer_b);
    H_ASSERT_EQ(peer_a, 2, "the responder's handler runs");
    H_ASSERT_EQ(peer_b, 2, "the replies the responder resent on the new connection");
  } else {
    h_run_for(ctx, 300);
    H_ASSERT_EQ(q->handled, 2, "handler runs in all");
    H_ASSERT_EQ(stats_of(s2).replies_resent, 2, "replies resent on the new connection");
    H_ASSERT_EQ(s2->received, 0, "message_received callbacks on the new connection");
    H_ASSERT_EQ(q->replies_sent, 0, "message_sent callbacks of replies (none was posted)");
    x_swap_counts(ctx, "counts", q->handled, (int)stats_of(s2).replies_resent, &peer_a, &peer_b);
    H_ASSERT_EQ(peer_a, 4, "the requester's done callbacks");
    H_ASSERT_EQ(peer_b, 2, "the replies the requester got");
  }
  xr_finish(ctx, q);
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      R_TEST(requests_without_reply_time_out_on_time_and_late_replies_are_dropped),
      R_TEST(a_retry_across_a_partition_gets_the_reply_and_runs_the_handler_once),
      R_TEST(a_retry_over_a_new_connection_gets_the_replies_posted_after_the_close),
  };
  return X_MAIN("test_requests", tests);
}
