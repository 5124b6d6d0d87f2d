/*
 * requests.h - the bookkeeping of the requests-and-replies tests, test/integration/test_requests.c
 * and test/twohost/test_requests.c: a record per request of the requester (rq_req) and what its
 * done callbacks saw, the responder's handler (message_received of a request: checks its bytes,
 * counts it, allocates its reply at once and replies at once, holds it, or holds up to a number
 * and replies to a random one), the replies and plain messages in flight (rq_out), and the hooks
 * of the harness that drive them. A request carries a sequence number in its first 4 bytes
 * (h_fill's pattern, size rq_size(seq)); its reply carries the same number (size
 * reply_size(seq)), so the requester's done callback checks that it got exactly its own reply.
 *
 * Everything the library may still point at when a test fails (requests, messages, the records)
 * lives on the heap in one struct rq; a failed test leaks it on purpose. struct rq holds what
 * either test counts: each uses its part.
 *
 * Included after the harness (harness.h, or harness.c compiled into the program) by a test that
 * defines first RQ_REQS (requests of the requester), RQ_HELD (requests the responder can hold),
 * RQ_OUT (replies and plain messages in flight), and rq_size(seq), reply_size(seq) and
 * rq_room(seq) (the bytes allocated for request seq). Everything here is static to the program.
 */
#ifndef IBMSG_TEST_REQUESTS_H
#define IBMSG_TEST_REQUESTS_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static uint64_t rq_now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

typedef struct rq rq;

/* One request of the requester and what its done callbacks saw. */
typedef struct {
  ibmsg_request req; /* first member */
  ibmsg_buffer msg;  /* its message, allocated on `conn` */
  rq *q;
  h_conn *conn;      /* the connection it was last posted on */
  uint32_t seq;      /* the number its payload carries, and its reply must carry */
  int posted;        /* successful posts and retries */
  int calls;         /* done callbacks */
  int status;        /* the status done got last */
  int replies;       /* done callbacks with a reply (checked: its own) */
  int closed_before; /* conn->closed when done ran last */
  int msg_busy;      /* msg posted and its message_sent not seen yet */
  int msg_status;    /* the status of its last message_sent */
  uint64_t first_posted_at, posted_at, done_at; /* h_now_ms() */
  uint64_t posted_us, done_us; /* rq_now_us() just before the last post, and at done */
  long dropped_at_done; /* with track_dropped: the connection's replies_dropped at the last done */
} rq_req;

/* A request the responder holds, with the reply allocated for it. */
typedef struct {
  ibmsg_buffer *request;
  h_conn *conn;
  uint32_t seq;
  int out; /* index of its reply in rq.out */
} rq_held;

/* A send message of the test other than a request: a reply or a plain message. */
typedef struct {
  ibmsg_buffer msg;
  int busy;   /* allocated */
  int posted; /* posted, message_sent not seen yet */
  int reply;  /* a reply (else a plain message) */
} rq_out;

enum rq_mode {
  RQ_HOLD,  /* the responder holds every request */
  RQ_REPLY, /* it replies at once and frees the request */
  RQ_RANDOM /* it holds up to hold_high, replying to a random one of them beyond */
};

struct rq {
  h_ctx *ctx;
  enum rq_mode mode;
  int hold_high;      /* RQ_RANDOM */
  int expect_handled; /* RQ_RANDOM: once this many arrived, it replies to all it holds */
  int hold_plain;     /* the responder keeps plain messages in plain_held */
  int reply_every;    /* RQ_RANDOM: a plain message to the requester after every this many replies */
  int expect_send_errors;
  int requests_only; /* the requester receives no messages, the responder nothing but requests */
  int track_dropped; /* done records dropped_at_done */
  unsigned rng;

  /* responder */
  int handled;             /* message_received with IBMSG_MSG_REQUEST */
  int plain;               /* plain messages received */
  rq_held held[RQ_HELD];
  int n_held;
  ibmsg_buffer *plain_held[8];
  int n_plain_held;
  int replies_posted, replies_sent, replies_sent_ok;

  /* requester */
  rq_req reqs[RQ_REQS];
  int dones;               /* done callbacks */
  int requester_received;  /* messages the requesters received (replies never count) */
  int plain_sent_ok;
  void (*on_done)(rq *q, rq_req *r, int status);
  void (*pump)(rq *q);

  rq_out out[RQ_OUT];

  /* test/integration's ten_thousand_requests_... */
  h_conn *t_client;
  int t_total, t_posted, t_done, t_out_of_order, t_plain_posted, t_since_plain;
  int *t_seq_done; /* done callbacks per sequence number */
  uint64_t *t_ids; /* the id of each request posted */
  int t_seq_max;
};

static int rq_is_client(h_ctx *ctx, h_conn *c) {
  return c >= ctx->clients && c < ctx->clients + H_MAX_CONNS;
}

/* The sequence number in a message's first 4 bytes (h_fill). */
static uint32_t get32(const void *data) {
  const uint8_t *p = data;
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static unsigned rq_rand(rq *q) {
  q->rng = q->rng * 1103515245u + 12345u;
  return (q->rng >> 8) & 0xffffffu;
}

/* The connection's counters (ibmsg_socket_stats). */
static ibmsg_stats stats_of(h_conn *c) {
  ibmsg_stats st;
  memset(&st, 0, sizeof st);
  H_ASSERT_OK(ibmsg_socket_stats(&c->sock, &st, sizeof st));
  return st;
}

/* --- the requester -------------------------------------------------------------------------- */

static void rq_done(ibmsg_socket *s, ibmsg_request *req, ibmsg_buffer *reply, int status) {
  rq_req *r = req->user_data;
  rq *q = r->q;
  h_ctx *ctx = q->ctx;
  h_conn *c = s ? (h_conn *)s->user_data : NULL;
  char why[200];
  int rc;

  r->done_us = rq_now_us();
  r->calls++;
  r->status = status;
  r->done_at = h_now_ms();
  q->dones++;
  if (!c || &c->sock != s) {
    h_note_error(ctx, "done called with a socket that is not one of the test's");
  } else {
    r->closed_before = c->closed;
    if (q->track_dropped) {
      ibmsg_stats st;
      memset(&st, 0, sizeof st);
      r->dropped_at_done =
          ibmsg_socket_stats(s, &st, sizeof st) == IBMSG_OK ? (long)st.replies_dropped : -1;
    }
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
    } else {
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
    }
  } else if (reply) {
    h_note_error(ctx, "request %u: done with %s and a reply (must be NULL)", r->seq,
                 ibmsg_err_name(status));
    ibmsg_free_msg(reply);
  }
  if (q->on_done) q->on_done(q, r, status);
}

/* Makes r a new request record with a message allocated on c. */
static void rq_init(rq *q, rq_req *r, h_conn *c, uint32_t seq) {
  int rc;
  memset(r, 0, sizeof *r);
  r->q = q;
  r->conn = c;
  r->seq = seq;
  r->req.done = rq_done;
  r->req.user_data = r;
  rc = ibmsg_alloc_msg(&r->msg, &c->sock, rq_room(seq));
  if (rc != IBMSG_OK)
    h_fail_at(__FILE__, __LINE__, "%s: ibmsg_alloc_msg for a request failed: %s (%d)", c->name,
              ibmsg_err_name(rc), rc);
  r->msg.user_data = r;
}

/* A new message for r on c (after its old one's connection closed). */
static void rq_realloc(rq_req *r, h_conn *c) {
  H_CHECK(!r->msg_busy, "request %u: its message is still posted", r->seq);
  H_ASSERT_OK(ibmsg_free_msg(&r->msg));
  H_ASSERT_OK(ibmsg_alloc_msg(&r->msg, &c->sock, rq_room(r->seq)));
  r->msg.user_data = r;
}

static void rq_fill(rq_req *r) {
  r->msg.size = rq_size(r->seq);
  h_fill(r->msg.data, r->msg.size, r->seq);
}

/* ibmsg_post_request() (or, with retry, ibmsg_retry_request()) of r on c with the harness's
 * bookkeeping; a post (not a retry) also sets first_posted_at. */
static int rq_send(rq_req *r, h_conn *c, int timeout_ms, int retry) {
  uint64_t now = h_now_ms(), now_us;
  int rc;
  rq_fill(r);
  now_us = rq_now_us();
  rc = retry ? ibmsg_retry_request(&c->sock, &r->msg, &r->req, timeout_ms)
             : ibmsg_post_request(&c->sock, &r->msg, &r->req, timeout_ms);
  if (rc != IBMSG_OK) return rc;
  r->conn = c;
  r->posted++;
  r->msg_busy = 1;
  r->posted_at = now;
  r->posted_us = now_us;
  if (!retry) r->first_posted_at = now;
  c->posted++;
  return rc;
}
#define rq_post(r, c, timeout_ms) rq_send((r), (c), (timeout_ms), 0)
#define rq_retry(r, c, timeout_ms) rq_send((r), (c), (timeout_ms), 1)

static rq_req *rq_req_of_msg(rq *q, ibmsg_buffer *msg) {
  const char *p = (const char *)msg;
  if (p < (const char *)q->reqs || p >= (const char *)(q->reqs + RQ_REQS)) return NULL;
  return (rq_req *)msg->user_data;
}

/* --- replies and plain messages ----------------------------------------------------------- */

static int rq_out_index(rq *q, const ibmsg_buffer *msg) {
  const char *p = (const char *)msg;
  if (p < (const char *)q->out || p >= (const char *)(q->out + RQ_OUT)) return -1;
  return (int)((const rq_out *)p - q->out);
}

/* Allocates an out slot on c of size bytes filled with seq's pattern; -1 (noted) if none. */
static int rq_out_alloc(rq *q, h_conn *c, size_t size, uint32_t seq, int reply) {
  int k, rc;
  for (k = 0; k < RQ_OUT && q->out[k].busy; k++) continue;
  if (k == RQ_OUT) {
    h_note_error(q->ctx, "%s: more than %d replies and plain messages at once", c->name, RQ_OUT);
    return -1;
  }
  rc = ibmsg_alloc_msg(&q->out[k].msg, &c->sock, size);
  if (rc != IBMSG_OK) {
    h_note_error(q->ctx, "%s: ibmsg_alloc_msg(%zu) failed: %s (%d)", c->name, size,
                 ibmsg_err_name(rc), rc);
    return -1;
  }
  h_fill(q->out[k].msg.data, size, seq);
  q->out[k].busy = 1;
  q->out[k].posted = 0;
  q->out[k].reply = reply;
  return k;
}

static int rq_out_release(rq *q, int k) {
  int rc = ibmsg_free_msg(&q->out[k].msg);
  if (rc == IBMSG_OK) q->out[k].busy = 0;
  return rc;
}

/* ibmsg_post_reply() of out slot k to request on c, with the bookkeeping. */
static int rq_post_reply(rq *q, h_conn *c, ibmsg_buffer *request, int k) {
  int rc = ibmsg_post_reply(&c->sock, request, &q->out[k].msg);
  if (rc != IBMSG_OK) return rc;
  q->out[k].posted = 1;
  q->replies_posted++;
  c->posted++;
  return rc;
}

/* Posts the reply of held request i and frees the request; on failure leaves both held. */
static int rq_reply_held(rq *q, int i) {
  rq_held *h = &q->held[i];
  int rc = rq_post_reply(q, h->conn, h->request, h->out);
  if (rc != IBMSG_OK) return rc;
  rc = ibmsg_free_msg(h->request);
  if (rc != IBMSG_OK)
    h_note_error(q->ctx, "%s: ibmsg_free_msg of an answered request failed: %s", h->conn->name,
                 ibmsg_err_name(rc));
  q->held[i] = q->held[--q->n_held];
  return IBMSG_OK;
}

/* A plain message of seq's pattern from c (numbered by c->send_seq). */
static int rq_post_plain(rq *q, h_conn *c, size_t size) {
  int k = rq_out_alloc(q, c, size, c->send_seq, 0), rc;
  if (k < 0) return IBMSG_ENOMEM;
  rc = h_try_post(c, &q->out[k].msg);
  if (rc != IBMSG_OK) {
    rq_out_release(q, k);
    return rc;
  }
  q->out[k].posted = 1;
  c->send_seq++;
  return rc;
}

/* --- the hooks ---------------------------------------------------------------------------- */

static void rq_respond(rq *q, h_conn *c, ibmsg_buffer *msg) {
  h_ctx *ctx = q->ctx;
  char why[200];
  uint32_t seq;
  int k, rc;

  q->handled++;
  if (msg->size < 4) {
    h_note_error(ctx, "%s: a request of %zu bytes (none of the test's is below 16)", c->name, msg->size);
    ibmsg_free_msg(msg);
    return;
  }
  seq = get32(msg->data);
  if (msg->size != rq_size(seq))
    h_note_error(ctx, "%s: request %u has %zu bytes, expected %zu", c->name, seq, msg->size,
                 rq_size(seq));
  else if (h_check(msg->data, msg->size, seq, why, sizeof why) != 0)
    h_note_error(ctx, "%s: request %u %s", c->name, seq, why);
  k = rq_out_alloc(q, c, reply_size(seq), seq, 1);
  if (k < 0) {
    ibmsg_free_msg(msg);
    return;
  }
  if (q->mode == RQ_REPLY) {
    rc = rq_post_reply(q, c, msg, k);
    if (rc != IBMSG_OK) {
      h_note_error(ctx, "%s: ibmsg_post_reply to request %u failed: %s (%d)", c->name, seq,
                   ibmsg_err_name(rc), rc);
      rq_out_release(q, k);
    }
    rc = ibmsg_free_msg(msg);
    if (rc != IBMSG_OK)
      h_note_error(ctx, "%s: ibmsg_free_msg of an answered request failed: %s", c->name,
                   ibmsg_err_name(rc));
    return;
  }
  if (q->n_held == RQ_HELD) {
    h_note_error(ctx, "%s: more than %d requests held", c->name, RQ_HELD);
    rq_out_release(q, k);
    ibmsg_free_msg(msg);
    return;
  }
  q->held[q->n_held].request = msg;
  q->held[q->n_held].conn = c;
  q->held[q->n_held].seq = seq;
  q->held[q->n_held].out = k;
  q->n_held++;
  if (q->mode != RQ_RANDOM) return;
  while (q->n_held > 0 && (q->n_held >= q->hold_high || q->handled >= q->expect_handled)) {
    int i = (int)(rq_rand(q) % (unsigned)q->n_held);
    rq_held h = q->held[i];
    rc = rq_reply_held(q, i);
    if (rc != IBMSG_OK) {
      h_note_error(ctx, "%s: ibmsg_post_reply to request %u failed: %s (%d)", h.conn->name, h.seq,
                   ibmsg_err_name(rc), rc);
      return;
    }
    if (q->reply_every && q->replies_posted % q->reply_every == 0) {
      rc = rq_post_plain(q, h.conn, 40);
      if (rc != IBMSG_OK)
        h_note_error(ctx, "%s: a plain message between replies failed: %s (%d)", h.conn->name,
                     ibmsg_err_name(rc), rc);
    }
  }
}

static void rq_on_received(h_conn *c, ibmsg_buffer *msg) {
  h_ctx *ctx = c->ctx;
  rq *q = ctx->data;
  int rc;

  if (rq_is_client(ctx, c)) {
    q->requester_received++;
    if (q->requests_only) /* the responder sends nothing but replies: one delivered wrongly */
      h_note_error(ctx, "%s: the requester received a message of %zu bytes (flags 0x%x): replies "
                   "must go to their request's done, late ones dropped", c->name, msg->size,
                   msg->flags);
    else if (msg->flags & IBMSG_MSG_REQUEST)
      h_note_error(ctx, "%s: the requester received a message marked as a request", c->name);
  } else if (msg->flags & IBMSG_MSG_REQUEST) {
    rq_respond(q, c, msg);
    return;
  } else if (q->requests_only) {
    h_note_error(ctx, "%s: the responder received a plain message of %zu bytes (the requester "
                 "sends only requests)", c->name, msg->size);
  } else {
    q->plain++;
    if (q->hold_plain && q->n_plain_held < 8) {
      q->plain_held[q->n_plain_held++] = msg;
      return;
    }
  }
  rc = ibmsg_free_msg(msg);
  if (rc != IBMSG_OK)
    h_note_error(ctx, "%s: ibmsg_free_msg of a received message failed: %s", c->name, ibmsg_err_name(rc));
}

static void rq_on_sent(h_conn *c, ibmsg_buffer *msg, int status) {
  h_ctx *ctx = c->ctx;
  rq *q = ctx->data;
  rq_req *r;
  int k = rq_out_index(q, msg), rc;

  if (k >= 0) {
    if (!q->out[k].posted) {
      h_note_error(ctx, "%s: message_sent for a reply or message that is not posted", c->name);
      return;
    }
    q->out[k].posted = 0;
    if (q->out[k].reply) {
      q->replies_sent++;
      if (status == IBMSG_OK) q->replies_sent_ok++;
    } else if (status == IBMSG_OK) {
      q->plain_sent_ok++;
    }
    if (status != IBMSG_OK && !q->expect_send_errors)
      h_note_error(ctx, "%s: message_sent of a %s with %s", c->name,
                   q->out[k].reply ? "reply" : "plain message", ibmsg_err_name(status));
    rc = rq_out_release(q, k);
    if (rc != IBMSG_OK)
      h_note_error(ctx, "%s: ibmsg_free_msg after message_sent failed: %s", c->name, ibmsg_err_name(rc));
  } else if ((r = rq_req_of_msg(q, msg)) != NULL) {
    if (!r->msg_busy) h_note_error(ctx, "request %u: message_sent for its message twice", r->seq);
    r->msg_busy = 0;
    r->msg_status = status;
    if (status != IBMSG_OK && !q->expect_send_errors)
      h_note_error(ctx, "request %u: message_sent of its message with %s", r->seq,
                   ibmsg_err_name(status));
  } else if (q->requests_only || msg < ctx->msgs || msg >= ctx->msgs + H_MAX_MSGS) {
    h_note_error(ctx, "%s: message_sent for a message the test does not know", c->name);
  }
  if (q->pump && rq_is_client(ctx, c)) q->pump(q);
}

/* A record for the test, installed as ctx->data with the hooks. */
static rq *rq_new(h_ctx *ctx) {
  rq *q = h_new(sizeof *q);
  q->ctx = ctx;
  q->mode = RQ_HOLD;
  q->rng = 20261124u;
  ctx->data = q;
  ctx->on_received = rq_on_received;
  ctx->on_sent = rq_on_sent;
  return q;
}

/* Frees every message the test holds (none may be posted still) and unhooks q. */
static void rq_release(rq *q) {
  int i;
  for (i = 0; i < RQ_REQS; i++) {
    rq_req *r = &q->reqs[i];
    if (!r->q) continue;
    H_CHECK(!r->msg_busy, "request %u: its message is still posted at the end", r->seq);
    H_CHECK(r->calls == r->posted, "request %u: %d done callbacks for %d posts and retries",
            r->seq, r->calls, r->posted);
    H_ASSERT_OK(ibmsg_free_msg(&r->msg));
    r->q = NULL;
  }
  for (i = 0; i < q->n_held; i++) {
    H_ASSERT_OK(ibmsg_free_msg(q->held[i].request));
    H_ASSERT_OK(rq_out_release(q, q->held[i].out));
  }
  q->n_held = 0;
  for (i = 0; i < q->n_plain_held; i++) H_ASSERT_OK(ibmsg_free_msg(q->plain_held[i]));
  q->n_plain_held = 0;
  for (i = 0; i < RQ_OUT; i++) {
    H_CHECK(!q->out[i].posted, "a reply or plain message is still posted at the end");
    if (q->out[i].busy) H_ASSERT_OK(rq_out_release(q, i));
  }
  q->pump = NULL;
  q->on_done = NULL;
}

/* rq_release, the test's end (h_finish, or x_finish on two hosts), and the record unhooked and
 * freed. */
static void rq_finish_with(h_ctx *ctx, rq *q, void (*finish)(h_ctx *)) {
  rq_release(q);
  finish(ctx);
  ctx->on_received = NULL;
  ctx->on_sent = NULL;
  ctx->data = NULL;
  free(q->t_seq_done);
  free(q->t_ids);
  free(q);
}

#endif
