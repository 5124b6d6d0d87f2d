/* test_requests.c - requests and replies (ibmsg.h, "Requests and replies"): every request gets
 * exactly one done callback per post or retry (its own reply, IBMSG_ETIMEDOUT or the reason its
 * connection closed), replies may come in any order, a reply after the timeout is dropped, a
 * retry runs the responder's handler at most once (also over a new connection), and bad calls
 * fail with the documented codes and send nothing.
 *
 * The clients of the harness are the requesters, the accepted server sockets the responders; both
 * run on the test's one loop. The responder's message_received (the on_received hook) checks each
 * request's bytes, counts it (the handler ran), allocates its reply at once and, depending on the
 * test, replies at once, holds it, or holds up to a number and replies to a random one. A request
 * carries a sequence number in its first 4 bytes (h_fill's pattern, size rq_size(seq)); its reply
 * carries the same number (size reply_size(seq)), so the requester's done callback checks that it
 * got exactly its own reply. These records, the handler and the hooks are in requests.h, which
 * test/twohost/test_requests.c shares.
 *
 * The last test connects a peer of protocol 1.4 written with librdmacm (like test_hostile's raw
 * peer): this program links with $(RDMA_LIBS).
 *
 * Everything the library may still point at when a test fails (requests, messages, the records)
 * lives on the heap in one struct rq; a failed test leaks it on purpose.
 */
#define _POSIX_C_SOURCE 200809L

#include "harness.h"

#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <rdma/rdma_cma.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define RQ_REQS 64     /* requests of the requester, each with its own message */
#define RQ_HELD 128    /* requests the responder can hold */
#define RQ_OUT 256     /* replies and plain messages in flight */
#define RQ_ROOM 256    /* bytes allocated for each request message (a small one) */
#define SLACK_MS 300   /* how late a timeout may fire */
#define RQ_LARGE 1000000u /* sequence numbers from here on: requests above the eager size */
#define RQ_LARGE_ROOM ((size_t)2 << 20)

/* Sizes that vary with the sequence number, so that a reply of another request shows. From
 * RQ_LARGE on requests are above the default eager size (16 KiB) up to 2 MiB, and every other
 * reply is too (up to 1 MiB): they go by rendezvous. */
static size_t rq_size(uint32_t seq) {
  return seq >= RQ_LARGE ? 16385 + ((seq - RQ_LARGE) * 524309u) % (RQ_LARGE_ROOM - 16385)
                         : 16 + (seq * 37u) % 240u;
}
static size_t reply_size(uint32_t seq) {
  return seq >= RQ_LARGE && seq % 2 ? 16385 + ((seq - RQ_LARGE) * 65537u) % (1u << 20)
                                    : 8 + (seq * 13u) % 120u;
}
static size_t rq_room(uint32_t seq) { return seq >= RQ_LARGE ? RQ_LARGE_ROOM : RQ_ROOM; }

#include "rawcm.h"    /* the old peer's connection manager (shared with test_hostile) */
#include "requests.h" /* the records, the handler and the hooks (shared with test/twohost) */

#define t_new h_new
#define rq_finish(ctx, q) rq_finish_with((ctx), (q), h_finish)

/* Sleeps without running the loop. */
static void nap_ms(long ms) {
  struct timespec ts;
  ts.tv_sec = ms / 1000;
  ts.tv_nsec = (ms % 1000) * 1000000L;
  while (nanosleep(&ts, &ts) != 0) continue;
}

static int rq_msgs_idle(rq *q) {
  int i;
  for (i = 0; i < RQ_REQS; i++)
    if (q->reqs[i].q && q->reqs[i].msg_busy) return 0;
  for (i = 0; i < RQ_OUT; i++)
    if (q->out[i].posted) return 0;
  return 1;
}

/* --- 10,000 requests, replies in random order ----------------------------------------------- */

#define T1_TOTAL 10000
#define T1_WINDOW 64      /* requests outstanding at most */
#define T1_HOLD 48        /* the responder replies to a random one once it holds this many */
#define T1_PLAIN_EVERY 5  /* a plain message after every 5 requests */
#define T1_REPLY_PLAIN 16 /* and one from the responder after every 16 replies */
#define T1_TIMEOUT 60000  /* no request may time out here */

static void t1_pump(rq *q) {
  h_conn *c = q->t_client;
  int k, rc;

  if (!c || c->closed) return;
  while (q->t_posted < q->t_total) {
    if (q->t_since_plain == T1_PLAIN_EVERY) {
      rc = rq_post_plain(q, c, 24 + (size_t)(c->send_seq % 50));
      if (rc != IBMSG_OK) {
        h_note_error(q->ctx, "%s: a plain message between requests failed: %s (%d)", c->name,
                     ibmsg_err_name(rc), rc);
        return;
      }
      q->t_plain_posted++;
      q->t_since_plain = 0;
      continue;
    }
    for (k = 0; k < T1_WINDOW; k++)
      if (q->reqs[k].calls == q->reqs[k].posted && !q->reqs[k].msg_busy) break;
    if (k == T1_WINDOW) return; /* T1_WINDOW outstanding, or messages not yet sent */
    q->reqs[k].seq = c->send_seq;
    if ((int)c->send_seq >= q->t_seq_max) {
      h_note_error(q->ctx, "more sequence numbers than the test has room for");
      return;
    }
    rc = rq_post(&q->reqs[k], c, T1_TIMEOUT);
    if (rc != IBMSG_OK) {
      h_note_error(q->ctx, "%s: ibmsg_post_request of request %u failed: %s (%d)", c->name,
                   c->send_seq, ibmsg_err_name(rc), rc);
      return;
    }
    if (q->reqs[k].req.status != IBMSG_EINPROGRESS)
      h_note_error(q->ctx, "request %u: req->status is %s after posting, expected IBMSG_EINPROGRESS",
                   c->send_seq, ibmsg_err_name(q->reqs[k].req.status));
    q->t_ids[q->t_posted++] = q->reqs[k].req.id;
    c->send_seq++;
    q->t_since_plain++;
  }
}

static void t1_done(rq *q, rq_req *r, int status) {
  uint32_t oldest = r->seq;
  int k;
  if (status != IBMSG_OK) {
    h_note_error(q->ctx, "request %u: done with %s, expected its reply", r->seq, ibmsg_err_name(status));
    return;
  }
  if ((int)r->seq < q->t_seq_max) q->t_seq_done[r->seq]++;
  q->t_done++;
  for (k = 0; k < T1_WINDOW; k++)
    if (q->reqs[k].posted > q->reqs[k].calls && q->reqs[k].seq < oldest) oldest = q->reqs[k].seq;
  if (oldest != r->seq) q->t_out_of_order++;
  t1_pump(q);
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

static void ten_thousand_requests_answered_in_random_order_each_get_their_own_reply(void **state) {
  h_ctx *ctx = *state;
  h_conn *client, *server;
  rq *q;
  uint64_t start;
  int i, k, requests = 0;

  /* The responder holds up to 64 requests (a receive credit each) between plain messages; both
   * sides have up to 64 requests or replies and some plain messages in flight. */
  h_setopt_int(ctx, IBMSG_OPT_RECV_DEPTH, 128);
  h_setopt_int(ctx, IBMSG_OPT_SEND_DEPTH, 192);
  h_setopt_int(ctx, IBMSG_OPT_SEND_QUEUE, 192);
  h_pair(ctx, &client, &server);
  q = rq_new(ctx);
  q->t_client = client;
  q->t_total = T1_TOTAL;
  q->t_seq_max = 2 * T1_TOTAL;
  q->t_seq_done = t_new(sizeof *q->t_seq_done * (size_t)q->t_seq_max);
  q->t_ids = t_new(sizeof *q->t_ids * T1_TOTAL);
  q->mode = RQ_RANDOM;
  q->hold_high = T1_HOLD;
  q->expect_handled = T1_TOTAL;
  q->reply_every = T1_REPLY_PLAIN;
  server->verify = 1; /* requests and plain messages: one sequence, in order */
  client->verify = 1; /* the responder's plain messages; replies never come as messages */
  for (k = 0; k < T1_WINDOW; k++) rq_init(q, &q->reqs[k], client, 0);
  q->on_done = t1_done;
  q->pump = t1_pump;

  start = h_now_ms();
  t1_pump(q);
  H_RUN_UNTIL_PROGRESS(ctx, q->t_done == T1_TOTAL && rq_msgs_idle(q), 120000);
  print_message("  %d requests (%d answered out of order) and %d plain messages in %lu ms\n",
                T1_TOTAL, q->t_out_of_order, q->t_plain_posted, (unsigned long)(h_now_ms() - start));
  h_run_for(ctx, 200); /* a second done or a stray message would show up here */

  H_ASSERT_EQ(q->t_posted, T1_TOTAL, "requests posted");
  H_ASSERT_EQ(q->dones, T1_TOTAL, "done callbacks");
  H_ASSERT_EQ(q->handled, T1_TOTAL, "requests the responder's handler saw");
  for (i = 0; i < (int)client->send_seq; i++) {
    if (q->t_seq_done[i] > 1)
      h_fail_at(__FILE__, __LINE__, "request %d got %d replies", i, q->t_seq_done[i]);
    requests += q->t_seq_done[i];
  }
  H_ASSERT_EQ(requests, T1_TOTAL, "requests that got their reply exactly once");
  H_ASSERT_EQ(q->replies_posted, T1_TOTAL, "replies posted");
  H_ASSERT_EQ(q->replies_sent_ok, T1_TOTAL, "replies with message_sent(IBMSG_OK)");
  H_ASSERT_EQ(q->n_held, 0, "requests the responder still holds");
  H_ASSERT_EQ(q->plain, q->t_plain_posted, "plain messages the responder received");
  H_ASSERT_EQ(server->received, T1_TOTAL + q->t_plain_posted, "messages the responder received");
  H_ASSERT_EQ(server->recv_seq, client->send_seq, "messages the responder checked in order");
  H_ASSERT_EQ(q->requester_received, T1_TOTAL / T1_REPLY_PLAIN,
              "plain messages the requester received (replies must not come as messages)");
  H_ASSERT_EQ(client->recv_seq, server->send_seq, "messages the requester checked in order");
  H_ASSERT_EQ(client->sent, client->posted, "the requester's message_sent callbacks vs. posts");
  H_ASSERT_EQ(client->sent_ok, client->posted, "the requester's message_sent(IBMSG_OK) callbacks");
  H_ASSERT_EQ(server->sent_ok, server->posted, "the responder's message_sent(IBMSG_OK) callbacks");
  /* The replies really came out of order (the test exercises matching, not a queue). */
  H_CHECK(q->t_out_of_order > T1_TOTAL / 4, "only %d of %d replies came out of order",
          q->t_out_of_order, T1_TOTAL);
  qsort(q->t_ids, T1_TOTAL, sizeof *q->t_ids, cmp_u64);
  for (i = 1; i < T1_TOTAL; i++)
    H_CHECK(q->t_ids[i] != q->t_ids[i - 1], "two requests had the same id %llu",
            (unsigned long long)q->t_ids[i]);
  for (k = 0; k < T1_WINDOW; k++)
    H_ASSERT_REASON(q->reqs[k].req.status, IBMSG_OK, "req->status after its reply");
  H_CHECK(!client->closed && !server->closed, "a connection closed");
  rq_finish(ctx, q);
}

/* --- timeouts ------------------------------------------------------------------------------- */

static void requests_without_reply_time_out_and_late_replies_are_dropped(void **state) {
  h_ctx *ctx = *state;
  h_conn *client, *server;
  rq *q;
  uint64_t old_id;
  int i, rc;
  const int n = 8;

  h_pair(ctx, &client, &server);
  q = rq_new(ctx);
  q->mode = RQ_HOLD; /* the responder never replies (until told below) */
  /* An application may post long after the loop last ran: the timeout counts from the post. */
  nap_ms(100);
  for (i = 0; i < n; i++) {
    rq_init(q, &q->reqs[i], client, (uint32_t)i + 1);
    H_ASSERT_OK(rq_post(&q->reqs[i], client, i % 2 ? 400 : 200));
    H_ASSERT_REASON(q->reqs[i].req.status, IBMSG_EINPROGRESS, "req->status after posting");
  }
  H_RUN_UNTIL(ctx, q->dones == n, 5000);
  for (i = 0; i < n; i++) {
    rq_req *r = &q->reqs[i];
    long t = i % 2 ? 400 : 200, took = (long)(r->done_at - r->posted_at);
    H_ASSERT_EQ(r->calls, 1, "done callbacks of a request");
    H_ASSERT_REASON(r->status, IBMSG_ETIMEDOUT, "done status of a request without reply");
    H_ASSERT_EQ(r->replies, 0, "replies of a request without reply");
    H_ASSERT_REASON(r->req.status, IBMSG_ETIMEDOUT, "req->status after its timeout");
    /* (whole milliseconds of a monotonic clock: the post may have started up to 1 ms later) */
    H_CHECK(took >= t - 1, "request %d with a timeout of %ld ms timed out after %ld ms", i, t, took);
    H_CHECK(took <= t + SLACK_MS, "request %d with a timeout of %ld ms timed out only after %ld ms",
            i, t, took);
  }
  H_ASSERT_EQ(q->handled, n, "requests the responder's handler saw");
  H_CHECK(!client->closed && !server->closed, "a connection closed after timeouts (%s / %s)",
          ibmsg_err_name(client->close_reason), ibmsg_err_name(server->close_reason));
  H_ASSERT_STATUS(client->sock.status, IBMSG_CONNECTED, "the requester's status after timeouts");

  /* Now the responder answers them all: every reply goes out, none comes to the requester. */
  while (q->n_held > 0) {
    rc = rq_reply_held(q, 0);
    H_ASSERT_OK(rc);
  }
  H_RUN_UNTIL(ctx, q->replies_sent == n, H_TIMEOUT_MS);
  H_ASSERT_EQ(q->replies_sent_ok, n, "late replies with message_sent(IBMSG_OK) at the responder");
  h_run_for(ctx, 300);
  H_ASSERT_EQ(q->dones, n, "done callbacks after late replies (they must be dropped)");
  H_ASSERT_EQ(q->requester_received, 0, "messages the requester received (late replies?)");
  H_ASSERT_EQ(client->received, 0, "message_received callbacks of the requester");
  H_ASSERT_EQ(stats_of(client).requests_timed_out, n, "the requester's requests_timed_out");
  H_ASSERT_EQ(stats_of(client).replies_dropped, n, "the requester's replies_dropped");

  /* The connection still works: a timed-out request posted anew is a new request (new id, the
   * handler runs) and gets its reply, not one of the late ones. */
  q->mode = RQ_REPLY;
  old_id = q->reqs[0].req.id;
  q->reqs[0].seq = 100;
  H_ASSERT_OK(rq_post(&q->reqs[0], client, 5000));
  H_CHECK(q->reqs[0].req.id != old_id, "a request posted anew kept its id %llu",
          (unsigned long long)old_id);
  H_RUN_UNTIL(ctx, q->reqs[0].calls == 2, H_TIMEOUT_MS);
  H_ASSERT_REASON(q->reqs[0].status, IBMSG_OK, "done status of a request the responder answers");
  H_ASSERT_EQ(q->reqs[0].replies, 1, "replies of that request");
  H_ASSERT_EQ(q->handled, n + 1, "requests the handler saw");
  H_ASSERT_EQ(q->reqs[0].req.retries, 0, "req->retries of a request posted anew");
  rq_finish(ctx, q);
}

/* --- retries ------------------------------------------------------------------------------- */

/* seq: a small request, or (from RQ_LARGE) one that goes by rendezvous, whose copy the responder
 * does not read: the retry's message_sent says IBMSG_EDECLINED. */
static void retry_runs_the_handler_once(h_ctx *ctx, uint32_t seq) {
  h_conn *client, *server;
  rq *q;
  rq_req *r;
  uint64_t id;
  const int copy_status = seq >= RQ_LARGE ? IBMSG_EDECLINED : IBMSG_OK;

  h_pair(ctx, &client, &server);
  q = rq_new(ctx);
  q->mode = RQ_HOLD;
  r = &q->reqs[0];
  rq_init(q, r, client, seq);
  H_ASSERT_OK(rq_post(r, client, 200));
  id = r->req.id;
  H_RUN_UNTIL(ctx, r->calls == 1 && !r->msg_busy, H_TIMEOUT_MS);
  H_ASSERT_REASON(r->status, IBMSG_ETIMEDOUT, "done status of the first post");
  H_ASSERT_EQ(q->handled, 1, "handler runs for the first post");
  H_ASSERT_EQ(r->req.retries, 0, "req->retries before a retry");

  q->expect_send_errors = copy_status != IBMSG_OK;
  H_ASSERT_OK(rq_retry(r, client, 5000));
  H_ASSERT_EQ(r->req.retries, 1, "req->retries after a retry");
  H_CHECK(r->req.id == id, "the retry changed the id from %llu to %llu", (unsigned long long)id,
          (unsigned long long)r->req.id);
  H_ASSERT_REASON(r->req.status, IBMSG_EINPROGRESS, "req->status after the retry");
  /* message_sent: the responder's side has the second copy (a large one it did not read) */
  H_RUN_UNTIL(ctx, !r->msg_busy, H_TIMEOUT_MS);
  H_ASSERT_REASON(r->msg_status, copy_status, "message_sent status of the retry");
  q->expect_send_errors = 0;
  h_run_for(ctx, 200);
  H_ASSERT_EQ(q->handled, 1, "handler runs after the retry arrived (it must not run twice)");
  H_ASSERT_EQ(server->received, 1, "message_received callbacks of the responder");
  H_ASSERT_EQ(r->calls, 1, "done callbacks before the reply");

  /* The responder answers the one request it has: the retry gets the reply, once. */
  H_ASSERT_EQ(q->n_held, 1, "requests the responder holds");
  H_ASSERT_OK(rq_reply_held(q, 0));
  H_RUN_UNTIL(ctx, r->calls == 2 && q->replies_sent == 1, H_TIMEOUT_MS);
  H_ASSERT_REASON(r->status, IBMSG_OK, "done status of the retry");
  H_ASSERT_EQ(r->replies, 1, "replies the retry got");
  h_run_for(ctx, 200);
  H_ASSERT_EQ(r->calls, 2, "done callbacks: one per post and retry");
  H_ASSERT_EQ(q->requester_received, 0, "messages the requester received");
  H_ASSERT_EQ(q->handled, 1, "handler runs in all");

  /* A request that got its reply cannot be retried. */
  H_ASSERT_CODE(ibmsg_retry_request(&client->sock, &r->msg, &r->req, 1000), IBMSG_ESTATE);
  H_ASSERT_EQ(r->req.retries, 1, "req->retries after a refused retry");
  h_run_for(ctx, 100);
  H_ASSERT_EQ(r->calls, 2, "done callbacks after a refused retry");
  H_ASSERT_EQ(client->sent, client->posted, "message_sent callbacks vs. posts");
  rq_finish(ctx, q);
}

static void a_retry_runs_the_handler_once_and_gets_the_reply(void **state) { retry_runs_the_handler_once(*state, 7); }

static void a_retry_of_a_large_request_is_not_read_again_and_gets_the_reply(void **state) { retry_runs_the_handler_once(*state, RQ_LARGE + 7); }

/* Requests above the eager size, with replies above and below it, many outstanding at once:
 * each arrives byte exact and gets its own reply. */
static void large_requests_and_replies_go_by_rendezvous(void **state) {
  h_ctx *ctx = *state;
  h_conn *client, *server;
  rq *q;
  int i, round, n = 16, large_replies = 0;

  h_pair(ctx, &client, &server);
  q = rq_new(ctx);
  q->mode = RQ_REPLY;
  for (round = 0; round < 2; round++) {
    for (i = 0; i < n; i++) {
      rq_req *r = &q->reqs[i];
      if (round == 0) rq_init(q, r, client, RQ_LARGE + (uint32_t)i);
      else r->seq = RQ_LARGE + (uint32_t)(n + i); /* the same message, a new request */
      if (reply_size(r->seq) > 16384) large_replies++;
      H_ASSERT_OK(rq_post(r, client, 30000));
    }
    H_RUN_UNTIL(ctx, q->dones == n * (round + 1) && q->replies_sent == n * (round + 1),
                H_TIMEOUT_MS);
    for (i = 0; i < n; i++) {
      H_ASSERT_REASON(q->reqs[i].status, IBMSG_OK, "done status of a large request");
      H_ASSERT_EQ(q->reqs[i].replies, round + 1, "replies (checked byte for byte) of a request");
    }
  }
  H_ASSERT_EQ(q->handled, 2 * n, "requests the responder handled");
  H_ASSERT_EQ(q->replies_sent_ok, 2 * n, "replies sent");
  H_CHECK(large_replies >= n / 2, "only %d replies above the eager size", large_replies);
  H_RUN_UNTIL(ctx, client->sent == client->posted, H_TIMEOUT_MS);
  rq_finish(ctx, q);
}

/* After a retry of r: its done comes once more, with the reply the responder kept (the handler
 * does not run again); status_what names the retry's status in a failure. */
static void expect_kept_reply(h_ctx *ctx, rq *q, rq_req *r, const char *status_what) {
  H_RUN_UNTIL(ctx, r->calls == 2, H_TIMEOUT_MS);
  H_ASSERT_REASON(r->status, IBMSG_OK, status_what);
  H_ASSERT_EQ(r->replies, 1, "replies of the retry");
  h_run_for(ctx, 200);
  H_ASSERT_EQ(r->calls, 2, "done callbacks");
  H_ASSERT_EQ(q->handled, 1, "handler runs (the retry must get the kept reply)");
}

static void a_retry_after_a_dropped_reply_gets_the_kept_reply(void **state) {
  h_ctx *ctx = *state;
  h_conn *client, *server;
  rq *q;
  rq_req *r;

  h_pair(ctx, &client, &server);
  q = rq_new(ctx);
  q->mode = RQ_HOLD;
  r = &q->reqs[0];
  rq_init(q, r, client, 11);
  H_ASSERT_OK(rq_post(r, client, 200));
  H_RUN_UNTIL(ctx, r->calls == 1 && q->handled == 1, H_TIMEOUT_MS);
  H_ASSERT_REASON(r->status, IBMSG_ETIMEDOUT, "done status without a reply");

  /* The responder answers after the timeout: the requester drops the reply. */
  H_ASSERT_OK(rq_reply_held(q, 0));
  H_RUN_UNTIL(ctx, q->replies_sent == 1, H_TIMEOUT_MS);
  H_ASSERT_EQ(q->replies_sent_ok, 1, "the late reply's message_sent(IBMSG_OK)");
  h_run_for(ctx, 200);
  H_ASSERT_EQ(r->calls, 1, "done callbacks after a late reply");
  H_ASSERT_EQ(q->requester_received, 0, "messages the requester received");

  /* The retry gets the reply the responder kept, without running the handler again. */
  H_ASSERT_OK(rq_retry(r, client, 5000));
  expect_kept_reply(ctx, q, r, "done status of the retry");
  H_ASSERT_EQ(server->received, 1, "message_received callbacks of the responder");
  H_ASSERT_EQ(q->replies_posted, 1, "replies the responder posted");
  H_ASSERT_EQ(stats_of(server).replies_resent, 1, "the responder's replies_resent");
  H_ASSERT_EQ(stats_of(client).replies_dropped, 1, "the requester's replies_dropped (the late one)");
  H_ASSERT_CODE(ibmsg_retry_request(&client->sock, &r->msg, &r->req, 1000), IBMSG_ESTATE);
  rq_finish(ctx, q);
}

static void a_retry_after_the_window_fails_with_etimedout(void **state) {
  h_ctx *ctx = *state;
  h_conn *client, *server;
  rq *q;
  rq_req *r;
  const int window = 600;
  uint64_t now;

  h_setopt_int(ctx, IBMSG_OPT_REQUEST_WINDOW, window);
  h_pair(ctx, &client, &server);
  q = rq_new(ctx);
  q->mode = RQ_HOLD;
  r = &q->reqs[0];
  rq_init(q, r, client, 3);
  H_ASSERT_OK(rq_post(r, client, 100));
  H_RUN_UNTIL(ctx, r->calls == 1 && !r->msg_busy, H_TIMEOUT_MS);
  H_ASSERT_REASON(r->status, IBMSG_ETIMEDOUT, "done status of the first post");
  /* within the window: a retry, which times out too (the responder holds the request) */
  H_ASSERT_OK(rq_retry(r, client, 100));
  H_RUN_UNTIL(ctx, r->calls == 2 && !r->msg_busy, H_TIMEOUT_MS);
  H_ASSERT_REASON(r->status, IBMSG_ETIMEDOUT, "done status of the retry");
  H_ASSERT_EQ(q->handled, 1, "handler runs for a request and its retry");
  /* beyond the window since the first post: the identity is forgotten */
  now = h_now_ms();
  if (now < r->first_posted_at + (uint64_t)window + 50)
    h_run_for(ctx, (int)(r->first_posted_at + (uint64_t)window + 50 - now));
  H_ASSERT_CODE(rq_retry(r, client, 100), IBMSG_ETIMEDOUT);
  H_ASSERT_EQ(r->req.retries, 1, "req->retries after a refused retry");
  h_run_for(ctx, 200);
  H_ASSERT_EQ(r->calls, 2, "done callbacks after a refused retry");
  H_ASSERT_EQ(server->received, 1, "message_received callbacks of the responder");
  /* posted anew, it is a new request: the handler runs, the reply comes */
  q->mode = RQ_REPLY;
  H_ASSERT_OK(rq_post(r, client, 5000));
  H_RUN_UNTIL(ctx, r->calls == 3, H_TIMEOUT_MS);
  H_ASSERT_REASON(r->status, IBMSG_OK, "done status of the request posted anew");
  H_ASSERT_EQ(q->handled, 2, "handler runs");
  rq_finish(ctx, q);
}

/* --- retries over a new connection ---------------------------------------------------------- */

/* The requester posts r on a first connection, the responder holds it, the requester disconnects;
 * r's done gets IBMSG_ECANCELED once, before connection_closed. */
static void post_then_disconnect(h_ctx *ctx, rq *q, rq_req *r, h_conn **c1, h_conn **s1) {
  h_pair(ctx, c1, s1);
  rq_init(q, r, *c1, 21);
  H_ASSERT_OK(rq_post(r, *c1, 10000));
  H_RUN_UNTIL(ctx, q->handled == 1 && !r->msg_busy, H_TIMEOUT_MS);
  H_ASSERT_OK(ibmsg_disconnect(&(*c1)->sock));
  H_RUN_UNTIL(ctx, r->calls == 1 && (*c1)->closed && (*s1)->closed, H_TIMEOUT_MS);
  h_run_for(ctx, 200);
  H_ASSERT_EQ(r->calls, 1, "done callbacks of a request whose connection closed");
  H_ASSERT_REASON(r->status, IBMSG_ECANCELED, "done status after the requester's own disconnect");
  H_ASSERT_EQ(r->replies, 0, "replies");
  H_ASSERT_EQ(r->closed_before, 0, "connection_closed callbacks before the request's done");
  H_ASSERT_REASON((*c1)->close_reason, IBMSG_OK, "close reason of the requester");
  H_ASSERT_REASON((*s1)->close_reason, IBMSG_ECONNRESET, "close reason of the responder");
  H_ASSERT_EQ(q->n_held, 1, "requests the responder holds");
}

static void a_retry_on_a_new_connection_gets_the_reply_kept_from_the_closed_one(void **state) {
  h_ctx *ctx = *state;
  h_conn *c1, *s1, *c2, *s2;
  rq *q = rq_new(ctx);
  rq_req *r = &q->reqs[0];
  int out;

  post_then_disconnect(ctx, q, r, &c1, &s1);
  /* The responder answers on the closed connection: refused, but the reply is kept. */
  out = q->held[0].out;
  H_ASSERT_CODE(ibmsg_post_reply(&s1->sock, q->held[0].request, &q->out[out].msg), IBMSG_ENOTCONN);
  H_ASSERT_EQ(q->out[out].msg.status, IBMSG_WAITING, "the reply's status (it stays the application's)");
  H_ASSERT_OK(rq_out_release(q, out));
  H_ASSERT_OK(ibmsg_free_msg(q->held[0].request));
  q->n_held = 0;

  /* The requester connects again from the same loop and retries there. */
  h_pair(ctx, &c2, &s2);
  rq_realloc(r, c2);
  H_ASSERT_OK(rq_retry(r, c2, 5000));
  H_ASSERT_EQ(r->req.retries, 1, "req->retries");
  expect_kept_reply(ctx, q, r, "done status of the retry on the new connection");
  H_ASSERT_EQ(s2->received, 0, "message_received callbacks on the new connection");
  H_ASSERT_EQ(q->requester_received, 0, "messages the requester received");
  H_ASSERT_EQ(stats_of(s2).replies_resent, 1, "replies the new connection's responder resent");
  rq_finish(ctx, q);
}

static void a_retry_on_a_new_connection_waits_for_the_reply_in_progress(void **state) {
  h_ctx *ctx = *state;
  h_conn *c1, *s1, *c2, *s2;
  rq *q = rq_new(ctx);
  rq_req *r = &q->reqs[0];
  uint64_t deadline;
  int out;

  post_then_disconnect(ctx, q, r, &c1, &s1);
  /* The requester retries on a new connection while the responder still works on it. */
  h_pair(ctx, &c2, &s2);
  rq_realloc(r, c2);
  H_ASSERT_OK(rq_retry(r, c2, 5000));
  H_RUN_UNTIL(ctx, !r->msg_busy, H_TIMEOUT_MS);
  H_ASSERT_REASON(r->msg_status, IBMSG_OK, "message_sent status of the retry");
  h_run_for(ctx, 200);
  H_ASSERT_EQ(q->handled, 1, "handler runs (the retry of a request in progress must not run it)");
  H_ASSERT_EQ(s2->received, 0, "message_received callbacks on the new connection");
  H_ASSERT_EQ(r->calls, 1, "done callbacks before the reply");
  /* The responder replies to the request of the closed connection: the retry gets that reply. */
  out = q->held[0].out;
  H_ASSERT_CODE(ibmsg_post_reply(&s1->sock, q->held[0].request, &q->out[out].msg), IBMSG_ENOTCONN);
  H_ASSERT_OK(rq_out_release(q, out));
  H_ASSERT_OK(ibmsg_free_msg(q->held[0].request));
  q->n_held = 0;
  deadline = h_now_ms() + 3000;
  while (r->calls < 2 && h_now_ms() < deadline) h_run_for(ctx, 10);
  H_CHECK(r->calls == 2, "the retry waiting on the new connection got no reply in 3 s (the new "
          "responder socket resent %llu replies, the requester dropped %llu)",
          (unsigned long long)stats_of(s2).replies_resent,
          (unsigned long long)stats_of(c2).replies_dropped);
  H_ASSERT_EQ(stats_of(s2).replies_resent, 1, "replies the new connection's responder resent");
  H_ASSERT_REASON(r->status, IBMSG_OK, "done status of the retry");
  H_ASSERT_EQ(r->replies, 1, "replies of the retry");
  h_run_for(ctx, 200);
  H_ASSERT_EQ(r->calls, 2, "done callbacks");
  H_ASSERT_EQ(q->handled, 1, "handler runs");
  rq_finish(ctx, q);
}

/* --- closing with requests outstanding -------------------------------------------------------- */

static void close_with_requests_outstanding(h_ctx *ctx, int responder_closes) {
  h_conn *client, *server, *closer;
  rq *q;
  int i, k, expect = responder_closes ? IBMSG_ECONNRESET : IBMSG_ECANCELED;
  const int n = 8;

  h_pair(ctx, &client, &server);
  q = rq_new(ctx);
  q->mode = RQ_HOLD;
  for (i = 0; i < n; i++) {
    rq_init(q, &q->reqs[i], client, 40 + (uint32_t)i);
    H_ASSERT_OK(rq_post(&q->reqs[i], client, 10000));
  }
  H_RUN_UNTIL(ctx, q->handled == n && rq_msgs_idle(q), H_TIMEOUT_MS);
  closer = responder_closes ? server : client;
  H_ASSERT_OK(ibmsg_disconnect(&closer->sock));
  H_RUN_UNTIL(ctx, q->dones == n && client->closed && server->closed, H_TIMEOUT_MS);
  h_run_for(ctx, 300);
  H_ASSERT_EQ(q->dones, n, "done callbacks for the outstanding requests");
  for (i = 0; i < n; i++) {
    rq_req *r = &q->reqs[i];
    H_ASSERT_EQ(r->calls, 1, "done callbacks of one request");
    H_ASSERT_REASON(r->status, expect, "done status of a request whose connection closed");
    H_ASSERT_REASON(r->req.status, expect, "req->status afterwards");
    H_ASSERT_EQ(r->replies, 0, "replies");
    H_ASSERT_EQ(r->closed_before, 0, "connection_closed callbacks before the request's done");
  }
  H_ASSERT_REASON(client->close_reason, responder_closes ? IBMSG_ECONNRESET : IBMSG_OK,
                  "close reason of the requester");
  /* Both sides refuse now: the requester to post, the responder to reply. */
  H_ASSERT_CODE(rq_post(&q->reqs[0], client, 1000), IBMSG_ENOTCONN);
  k = q->held[0].out;
  H_ASSERT_CODE(ibmsg_post_reply(&server->sock, q->held[0].request, &q->out[k].msg), IBMSG_ENOTCONN);
  h_run_for(ctx, 100);
  H_ASSERT_EQ(q->dones, n, "done callbacks after refused calls");
  rq_finish(ctx, q);
}

static void responder_closing_ends_each_outstanding_request_once(void **state) { close_with_requests_outstanding(*state, 1); }

static void requester_closing_ends_each_outstanding_request_once(void **state) { close_with_requests_outstanding(*state, 0); }

/* --- bad calls ------------------------------------------------------------------------------ */

static void bad_requests_fail_with_the_documented_codes_and_send_nothing(void **state) {
  h_ctx *ctx = *state;
  h_conn *client, *server;
  rq *q;
  rq_req *r, *r2;
  ibmsg_buffer *big;
  int rc;

  h_pair(ctx, &client, &server);
  q = rq_new(ctx);
  q->mode = RQ_HOLD;
  r = &q->reqs[0];
  r2 = &q->reqs[1];
  rq_init(q, r, client, 1);
  rq_init(q, r2, client, 2);
  rq_fill(r);
  rq_fill(r2);

  /* timeouts that are not positive */
  H_ASSERT_CODE(ibmsg_post_request(&client->sock, &r->msg, &r->req, 0), IBMSG_EINVAL);
  H_ASSERT_CODE(ibmsg_post_request(&client->sock, &r->msg, &r->req, -1), IBMSG_EINVAL);
  H_ASSERT_CODE(ibmsg_post_request(&client->sock, &r->msg, &r->req, INT_MIN), IBMSG_EINVAL);
  /* NULL arguments */
  H_ASSERT_CODE(ibmsg_post_request(NULL, &r->msg, &r->req, 100), IBMSG_EINVAL);
  H_ASSERT_CODE(ibmsg_post_request(&client->sock, NULL, &r->req, 100), IBMSG_EINVAL);
  H_ASSERT_CODE(ibmsg_post_request(&client->sock, &r->msg, NULL, 100), IBMSG_EINVAL);
  H_ASSERT_CODE(ibmsg_retry_request(NULL, &r->msg, &r->req, 100), IBMSG_EINVAL);
  H_ASSERT_CODE(ibmsg_retry_request(&client->sock, NULL, &r->req, 100), IBMSG_EINVAL);
  H_ASSERT_CODE(ibmsg_retry_request(&client->sock, &r->msg, NULL, 100), IBMSG_EINVAL);
  /* a retry of a request never posted */
  H_ASSERT_CODE(ibmsg_retry_request(&client->sock, &r->msg, &r->req, 100), IBMSG_ESTATE);
  /* a request above the connection's maximum message size */
  big = &ctx->msgs[0];
  H_ASSERT_OK(ibmsg_alloc_msg(big, &client->sock, 64));
  big->size = ibmsg_socket_max_msg_size(&client->sock) + 1;
  H_ASSERT_CODE(ibmsg_post_request(&client->sock, big, &r->req, 100), IBMSG_EMSGSIZE);
  H_ASSERT_EQ(big->status, IBMSG_WAITING, "status of the message of a refused request");
  big->size = 64;
  /* on the listener */
  rc = ibmsg_post_request(&ctx->listener.sock, &r->msg, &r->req, 100);
  H_ASSERT_CODE(rc, IBMSG_ESTATE);
  h_run_for(ctx, 200);
  H_ASSERT_EQ(client->sent, 0, "message_sent callbacks of refused requests");
  H_ASSERT_EQ(server->received, 0, "messages that refused requests delivered");
  H_ASSERT_EQ(q->dones, 0, "done callbacks of refused requests");
  H_ASSERT_EQ(r->req.retries, 0, "req->retries of a refused retry");

  /* a request that is posted still */
  H_ASSERT_OK(rq_post(r, client, 10000));
  H_ASSERT_CODE(ibmsg_post_request(&client->sock, &r2->msg, &r->req, 1000), IBMSG_EBUSY);
  H_ASSERT_CODE(ibmsg_retry_request(&client->sock, &r2->msg, &r->req, 1000), IBMSG_EBUSY);
  H_RUN_UNTIL(ctx, q->handled == 1 && !r->msg_busy, H_TIMEOUT_MS);
  H_ASSERT_EQ(server->received, 1, "messages delivered for one request");
  H_ASSERT_EQ(q->dones, 0, "done callbacks while the request waits for its reply");
  H_ASSERT_EQ(r->req.retries, 0, "req->retries after a refused retry");
  H_ASSERT_OK(rq_reply_held(q, 0));
  H_RUN_UNTIL(ctx, r->calls == 1 && q->replies_sent == 1, H_TIMEOUT_MS);
  H_ASSERT_REASON(r->status, IBMSG_OK, "done status of the request once answered");
  H_ASSERT_EQ(r2->calls, 0, "done callbacks of the message refused with IBMSG_EBUSY");
  H_ASSERT_OK(ibmsg_free_msg(big));
  rq_finish(ctx, q);
}

static void bad_replies_fail_with_the_documented_codes(void **state) {
  h_ctx *ctx = *state;
  h_conn *client, *server;
  rq *q;
  rq_req *r;
  ibmsg_buffer *request, *extra = &ctx->msgs[0], *big = &ctx->msgs[1], *plain, *pmsg = &ctx->msgs[2];
  int out;

  h_pair(ctx, &client, &server);
  q = rq_new(ctx);
  q->mode = RQ_HOLD;
  q->hold_plain = 1;
  r = &q->reqs[0];
  rq_init(q, r, client, 5);
  H_ASSERT_OK(rq_post(r, client, 10000));
  h_alloc_fill(client, pmsg, 64);
  h_post(client, pmsg);
  H_RUN_UNTIL(ctx, q->handled == 1 && q->plain == 1 && client->sent == 2, H_TIMEOUT_MS);
  request = q->held[0].request;
  out = q->held[0].out;
  plain = q->plain_held[0];
  H_CHECK(request->flags & IBMSG_MSG_REQUEST, "the request lacks IBMSG_MSG_REQUEST");
  H_CHECK(!(plain->flags & IBMSG_MSG_REQUEST), "a plain message has IBMSG_MSG_REQUEST");
  H_ASSERT_OK(ibmsg_alloc_msg(extra, &server->sock, 32));

  /* NULL arguments, a plain message, a reply above the connection's maximum message size */
  H_ASSERT_CODE(ibmsg_post_reply(NULL, request, extra), IBMSG_EINVAL);
  H_ASSERT_CODE(ibmsg_post_reply(&server->sock, NULL, extra), IBMSG_EINVAL);
  H_ASSERT_CODE(ibmsg_post_reply(&server->sock, request, NULL), IBMSG_EINVAL);
  H_ASSERT_CODE(ibmsg_post_reply(&server->sock, plain, extra), IBMSG_EINVAL);
  H_ASSERT_OK(ibmsg_alloc_msg(big, &server->sock, 64));
  big->size = ibmsg_socket_max_msg_size(&server->sock) + 1;
  H_ASSERT_CODE(ibmsg_post_reply(&server->sock, request, big), IBMSG_EMSGSIZE);
  H_ASSERT_EQ(big->status, IBMSG_WAITING, "status of a refused reply");
  big->size = 64;
  h_run_for(ctx, 200);
  H_ASSERT_EQ(server->sent, 0, "message_sent callbacks of refused replies");
  H_ASSERT_EQ(r->calls, 0, "done callbacks after refused replies");

  /* one reply goes; a second is refused */
  H_ASSERT_OK(rq_post_reply(q, server, request, out));
  H_ASSERT_CODE(ibmsg_post_reply(&server->sock, request, extra), IBMSG_EALREADY);
  H_ASSERT_EQ(extra->status, IBMSG_WAITING, "status of a refused second reply");
  H_RUN_UNTIL(ctx, r->calls == 1 && q->replies_sent == 1, H_TIMEOUT_MS);
  H_ASSERT_REASON(r->status, IBMSG_OK, "done status");
  H_ASSERT_EQ(r->replies, 1, "replies");
  /* ... also after the request was freed */
  H_ASSERT_OK(ibmsg_free_msg(request));
  q->n_held = 0;
  H_ASSERT_CODE(ibmsg_post_reply(&server->sock, request, extra), IBMSG_ENOTALLOC);
  h_run_for(ctx, 200);
  H_ASSERT_EQ(r->calls, 1, "done callbacks after refused second replies");
  H_ASSERT_EQ(q->requester_received, 0, "messages the requester received");
  H_ASSERT_EQ(server->sent, 1, "message_sent callbacks of the responder (one reply)");
  H_ASSERT_OK(ibmsg_free_msg(extra));
  H_ASSERT_OK(ibmsg_free_msg(big));
  H_ASSERT_OK(ibmsg_free_msg(pmsg));
  rq_finish(ctx, q);
}

/* --- a peer without requests ------------------------------------------------------------------ */

/* A peer of protocol 1.4, written with librdmacm: its hello (ibmsg(7), WIRE PROTOCOL; src/wire.hpp)
 * offers immediates, rendezvous and shared buffers but not requests (feature bit 5). It only
 * connects; nothing is sent to it. */
#define OP_MAGIC 0x49424d53u
#define OP_HELLO_SIZE 32
#define OP_FEATURES ((1u << 1) | (1u << 2) | (1u << 3))

struct old_peer {
  rawcm cm; /* it has nothing but the connection manager's part (rawcm.h) and a queue pair */
};

static void op_put32(uint8_t *p, uint32_t v) {
  p[0] = (uint8_t)v;
  p[1] = (uint8_t)(v >> 8);
  p[2] = (uint8_t)(v >> 16);
  p[3] = (uint8_t)(v >> 24);
}

static void op_poll(struct old_peer *p) {
  struct rdma_cm_event *ev;
  while (p->cm.ch && rdma_get_cm_event(p->cm.ch, &ev) == 0) {
    rawcm_note(&p->cm, ev->event);
    rdma_ack_cm_event(ev);
  }
}
static void op_poll_peer(void *p) { op_poll(p); }

#define OP_RUN_UNTIL(ctx, p, cond, timeout_ms)                                                  \
  do {                                                                                          \
    uint64_t op__deadline = h_now_ms() + (uint64_t)(timeout_ms);                                \
    op_poll(p);                                                                                 \
    while (!(cond)) {                                                                           \
      h_step_at((ctx), op__deadline, (timeout_ms), #cond, __FILE__, __LINE__);                  \
      op_poll(p);                                                                               \
    }                                                                                           \
    h_check_errors_at((ctx), __FILE__, __LINE__);                                               \
  } while (0)

/* Runs the loop and the old peer for ms milliseconds. */
#define OP_RUN_FOR(ctx, p, ms)                                                                  \
  do {                                                                                          \
    uint64_t op__end = h_now_ms() + (uint64_t)(ms);                                             \
    while (h_now_ms() < op__end) {                                                              \
      h_step_at((ctx), op__end + 1000, (ms), "(run for)", __FILE__, __LINE__);                  \
      op_poll(p);                                                                               \
    }                                                                                           \
    h_check_errors_at((ctx), __FILE__, __LINE__);                                               \
  } while (0)

static struct old_peer *op_live;

static void op_destroy(struct old_peer *p) {
  if (!p) return;
  if (op_live == p) op_live = NULL;
  rawcm_destroy_id(&p->cm, op_poll_peer, p);
  if (p->cm.ch) rdma_destroy_event_channel(p->cm.ch);
  free(p);
}

static struct old_peer *op_connect(h_ctx *ctx) {
  struct old_peer *p = t_new(sizeof *p);
  struct ibv_qp_init_attr qa;
  struct rdma_conn_param cp;
  uint8_t hello[OP_HELLO_SIZE];

  op_live = p;
  rawcm_resolve_addr(ctx, &p->cm, p);
  OP_RUN_UNTIL(ctx, p, p->cm.addr_resolved || p->cm.cm_error, H_TIMEOUT_MS);
  H_CHECK(!p->cm.cm_error, "the old peer's address resolution failed (CM event %d)",
          p->cm.cm_error);
  H_CHECK(rdma_resolve_route(p->cm.id, 2000) == 0, "rdma_resolve_route failed");
  OP_RUN_UNTIL(ctx, p, p->cm.route_resolved || p->cm.cm_error, H_TIMEOUT_MS);
  H_CHECK(!p->cm.cm_error, "the old peer's route resolution failed (CM event %d)",
          p->cm.cm_error);
  /* A queue pair with the CM's default protection domain and completion queues. */
  memset(&qa, 0, sizeof qa);
  qa.qp_type = IBV_QPT_RC;
  qa.cap.max_send_wr = 4;
  qa.cap.max_recv_wr = 4;
  qa.cap.max_send_sge = 1;
  qa.cap.max_recv_sge = 1;
  H_CHECK(rdma_create_qp(p->cm.id, NULL, &qa) == 0, "rdma_create_qp failed");
  p->cm.has_qp = 1;

  op_put32(hello, OP_MAGIC);
  hello[4] = 1; /* major */
  hello[5] = 4; /* minor */
  hello[6] = 1; /* kind: hello */
  hello[7] = 0;
  op_put32(hello + 8, OP_FEATURES);
  op_put32(hello + 12, 16);    /* recv_depth */
  op_put32(hello + 16, 4);     /* ctrl_depth */
  op_put32(hello + 20, 16384); /* max_msg_size (eager) */
  op_put32(hello + 24, 1u << 20); /* rndv_max_size */
  op_put32(hello + 28, 16);    /* cap */
  memset(&cp, 0, sizeof cp);
  cp.private_data = hello;
  cp.private_data_len = OP_HELLO_SIZE;
  cp.responder_resources = 1;
  cp.initiator_depth = 1;
  cp.retry_count = 7;
  cp.rnr_retry_count = 7;
  H_CHECK(rdma_connect(p->cm.id, &cp) == 0, "rdma_connect failed");
  OP_RUN_UNTIL(ctx, p, p->cm.established || p->cm.rejected || p->cm.cm_error, H_TIMEOUT_MS);
  H_CHECK(p->cm.established, "the old peer was not accepted (rejected %d, CM event %d)",
          p->cm.rejected, p->cm.cm_error);
  return p;
}

static void a_request_to_a_peer_without_requests_fails_with_eopnotsupp(void **state) {
  h_ctx *ctx = *state;
  h_conn *srv, *client, *server;
  struct old_peer *p;
  rq *q;
  rq_req *r;

  h_setopt_int(ctx, IBMSG_OPT_KEEPALIVE, 0); /* the old peer answers no probes */
  h_listen(ctx, ctx->addr, 8);
  q = rq_new(ctx);
  srv = &ctx->servers[0];
  p = op_connect(ctx);
  OP_RUN_UNTIL(ctx, p, ctx->n_servers == 1 && (srv->established || srv->closed), H_TIMEOUT_MS);
  H_CHECK(srv->established, "the old peer's connection closed with %s",
          ibmsg_err_name(srv->close_reason));
  r = &q->reqs[0];
  rq_init(q, r, srv, 9);
  H_ASSERT_CODE(rq_post(r, srv, 1000), IBMSG_EOPNOTSUPP);
  H_ASSERT_EQ(r->msg.status, IBMSG_WAITING, "status of the message of a refused request");
  OP_RUN_FOR(ctx, p, 200);
  H_ASSERT_EQ(srv->sent, 0, "message_sent callbacks of a refused request");
  H_ASSERT_EQ(r->calls, 0, "done callbacks of a refused request");
  H_CHECK(!srv->closed, "the old peer's connection closed with %s", ibmsg_err_name(srv->close_reason));
  H_ASSERT_OK(ibmsg_free_msg(&r->msg));
  r->q = NULL;

  /* The control: between two peers of this ibmsg, the same request works. */
  h_pair(ctx, &client, &server);
  q->mode = RQ_REPLY;
  rq_init(q, r, client, 9);
  H_ASSERT_OK(rq_post(r, client, 5000));
  H_RUN_UNTIL(ctx, r->calls == 1, H_TIMEOUT_MS);
  H_ASSERT_REASON(r->status, IBMSG_OK, "done status of the control request");

  op_destroy(p);
  H_RUN_UNTIL(ctx, srv->closed, H_TIMEOUT_MS);
  rq_finish(ctx, q);
}

static int op_teardown(void **state) {
  op_destroy(op_live);
  return h_teardown(state);
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      H_TEST(ten_thousand_requests_answered_in_random_order_each_get_their_own_reply),
      H_TEST(requests_without_reply_time_out_and_late_replies_are_dropped),
      H_TEST(a_retry_runs_the_handler_once_and_gets_the_reply),
      H_TEST(a_retry_of_a_large_request_is_not_read_again_and_gets_the_reply),
      H_TEST(large_requests_and_replies_go_by_rendezvous),
      H_TEST(a_retry_after_a_dropped_reply_gets_the_kept_reply),
      H_TEST(a_retry_after_the_window_fails_with_etimedout),
      H_TEST(a_retry_on_a_new_connection_gets_the_reply_kept_from_the_closed_one),
      H_TEST(a_retry_on_a_new_connection_waits_for_the_reply_in_progress),
      H_TEST(responder_closing_ends_each_outstanding_request_once),
      H_TEST(requester_closing_ends_each_outstanding_request_once),
      H_TEST(bad_requests_fail_with_the_documented_codes_and_send_nothing),
      H_TEST(bad_replies_fail_with_the_documented_codes),
      cmocka_unit_test_setup_teardown(a_request_to_a_peer_without_requests_fails_with_eopnotsupp,
                                      h_setup, op_teardown),
  };
  h_init(argc, argv);
  return cmocka_run_group_tests(tests, NULL, NULL);
}
