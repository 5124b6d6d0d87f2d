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
 * lives on the heap in one struct rq; a failed test leaks it on purpose. The records, the handler
 * and the hooks are test/integration/requests.h, shared with test/integration/test_requests.c.
 */
#define _POSIX_C_SOURCE 200809L

/* The harness is compiled into this program. */
#include "../integration/harness.c"
#include "xtest.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define RQ_REQS 32   /* requests of the requester, each with its own message */
#define RQ_HELD 32   /* requests the responder can hold */
#define RQ_OUT 64    /* replies in flight or held for a request */
#define RQ_ROOM 256  /* bytes allocated for each request message */
#define STEP_MS 15000

/* The timeouts test: TO_COUNT requests of TO_MS, TO_AT_ONCE of them posted back to back, the
 * rest one every TO_GAP_MS while the loop runs (their deadlines fall between the timeouts of
 * the first ones). A timeout may fire at most TO_LATE_MS late, plus the longest stall of the
 * host while they ran (xtest.h's stall watch: a VM not run by a loaded host is late at
 * everything), and TO_EARLY_MS early: the library's clock (libev's) is read around the post, the
 * test's just before it. */
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
static size_t rq_room(uint32_t seq) {
  (void)seq;
  return RQ_ROOM;
}

#include "../integration/requests.h" /* the records, the handler and the hooks */

/* A record for the test: the requester receives nothing but replies, the responder nothing but
 * requests; done notes the connection's replies_dropped. */
static rq *xr_new(h_ctx *ctx) {
  rq *q = rq_new(ctx);
  q->requests_only = 1;
  q->track_dropped = 1;
  return q;
}

/* Frees every message the test holds (none may be posted still), then x_finish(), and the
 * record. */
#define xr_finish(ctx, q) rq_finish_with((ctx), (q), x_finish)

/* The index of the held request with sequence number seq (fails the test if none). */
static int rq_held_index(rq *q, uint32_t seq) {
  int i;
  for (i = 0; i < q->n_held; i++)
    if (q->held[i].seq == seq) return i;
  h_fail_at(__FILE__, __LINE__, "the responder holds no request %u (%d held)", seq, q->n_held);
  return -1;
}

/* Swaps two counts with the peer at barrier step. */
static void x_swap_counts(h_ctx *ctx, const char *step, int a, int b, int *peer_a, int *peer_b) {
  char mine[64], theirs[64];
  snprintf(mine, sizeof mine, "%d %d", a, b);
  X_EXCHANGE(ctx, step, mine, theirs, sizeof theirs);
  H_CHECK(sscanf(theirs, "%d %d", peer_a, peer_b) == 2, "the peer sent '%s' at '%s'", theirs, step);
}

/* Each connection has receive buffers of its own: the responder may hold all the requests. */
static void xr_options(h_ctx *ctx) {
  h_setopt_int(ctx, IBMSG_OPT_SHARED_RECV, 0);
  h_setopt_int(ctx, IBMSG_OPT_RECV_DEPTH, 32);
}

/* --- the link (as in test_liveness.c) ------------------------------------------------------ */

/* The link cut and healed (xtest.h), timed in rq_now_us(). */
#define l_cut(ctx) x_link_cut((ctx), rq_now_us)
#define l_restore(ctx) x_link_restore((ctx), rq_now_us)

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
  rq *q;
  long late_us[TO_COUNT];
  int i, replies = 0, peer_a = -1, peer_b = -1;

  X_BEGIN(ctx);
  xr_options(ctx);
  q = xr_new(ctx);
  c = x_pair(ctx, 0);
  if (twohost_is_client()) {
    long stall_us;
    for (i = 0; i < TO_COUNT; i++) rq_init(q, &q->reqs[i], c, (uint32_t)i + 1);
    x_stall_start();
    for (i = 0; i < TO_COUNT; i++) {
      if (i >= TO_AT_ONCE) h_run_for(ctx, TO_GAP_MS);
      H_ASSERT_OK(rq_post(&q->reqs[i], c, TO_MS));
      H_ASSERT_REASON(q->reqs[i].req.status, IBMSG_EINPROGRESS, "req->status after posting");
    }
    H_RUN_UNTIL(ctx, q->dones == TO_COUNT || c->closed, STEP_MS);
    stall_us = x_stall_stop();
    x_assert_open(c);
    h_run_for(ctx, 200); /* a second done would show up here */
    for (i = 0; i < TO_COUNT; i++) {
      rq_req *r = &q->reqs[i];
      long took = (long)(r->done_us - r->posted_us);
      H_ASSERT_EQ(r->calls, 1, "done callbacks of a request without reply");
      H_ASSERT_REASON(r->status, IBMSG_ETIMEDOUT, "done status of a request without reply");
      H_ASSERT_REASON(r->req.status, IBMSG_ETIMEDOUT, "req->status after its timeout");
      H_ASSERT_EQ(r->replies, 0, "replies of a request without reply");
      H_CHECK(took >= (TO_MS - TO_EARLY_MS) * 1000L, "request %d with a timeout of %d ms timed "
              "out after %.1f ms: early", i, TO_MS, took / 1000.0);
      H_CHECK(took <= (TO_MS + TO_LATE_MS) * 1000L + stall_us, "request %d with a timeout of %d "
              "ms timed out after %.1f ms: more than %d ms late, and the host stalled %.1f ms at "
              "most", i, TO_MS, took / 1000.0, TO_LATE_MS, stall_us / 1000.0);
      late_us[i] = took - TO_MS * 1000L;
    }
    qsort(late_us, TO_COUNT, sizeof late_us[0], cmp_long);
    print_message("  client: %d timeouts of %d ms fired late by %.1f ms (min) %.1f (median) "
                  "%.1f (max); the host's longest stall meanwhile %.1f ms\n", TO_COUNT, TO_MS,
                  late_us[0] / 1000.0, late_us[TO_COUNT / 2] / 1000.0,
                  late_us[TO_COUNT - 1] / 1000.0, stall_us / 1000.0);
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
    while (q->n_held > 0) H_ASSERT_OK(rq_reply_held(q, 0));
    H_RUN_UNTIL(ctx, q->replies_sent == TO_COUNT || c->closed, STEP_MS);
    x_assert_open(c);
    H_ASSERT_EQ(q->replies_sent_ok, TO_COUNT, "late replies with message_sent(IBMSG_OK)");
    q->mode = RQ_REPLY; /* from here on */
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
      rq_init(q, &q->reqs[i], c, (uint32_t)i + 100);
      H_ASSERT_OK(rq_post(&q->reqs[i], c, 5000));
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
  rq *q;
  rq_req *r = NULL;
  uint64_t id = 0, cut_us, restored_us;
  int peer_a = -1, peer_b = -1;

  X_BEGIN(ctx);
  xr_options(ctx);
  h_setopt_int(ctx, IBMSG_OPT_KEEPALIVE, 0); /* the partition must not close the connection */
  q = xr_new(ctx);
  c = x_pair(ctx, 0);
  if (twohost_is_client()) {
    r = &q->reqs[0];
    rq_init(q, r, c, 21);
    x_stall_start();
    H_ASSERT_OK(rq_post(r, c, PT_TIMEOUT_MS));
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
    H_ASSERT_OK(rq_reply_held(q, 0));
  } else {
    print_message("  client: the link was cut %.1f ms after the post (request timeout %d ms, "
                  "status then %s)\n", (double)(cut_us - r->posted_us) / 1000.0, PT_TIMEOUT_MS,
                  ibmsg_err_name(r->req.status));
  }
  X_SYNC(ctx, "replied into the partition");
  if (twohost_is_client()) {
    long took, stall_us;
    H_RUN_UNTIL(ctx, r->calls == 1 || c->closed, STEP_MS);
    stall_us = x_stall_stop();
    x_assert_open(c);
    took = (long)(r->done_us - r->posted_us);
    print_message("  client: the request timed out %.1f ms after its post (the host's longest "
                  "stall meanwhile %.1f ms)\n", took / 1000.0, stall_us / 1000.0);
    H_ASSERT_REASON(r->status, IBMSG_ETIMEDOUT, "done status of a request whose reply is cut off");
    H_CHECK(took >= (PT_TIMEOUT_MS - TO_EARLY_MS) * 1000L &&
                took <= (PT_TIMEOUT_MS + TO_LATE_MS) * 1000L + stall_us,
            "the request with a timeout of %d ms timed out after %.1f ms (the host stalled %.1f "
            "ms at most)", PT_TIMEOUT_MS, took / 1000.0, stall_us / 1000.0);
    h_run_for(ctx, 100);
    H_ASSERT_EQ(r->calls, 1, "done callbacks during the partition");
  }
  restored_us = l_restore(ctx);

  if (twohost_is_client()) {
    H_ASSERT_OK(rq_retry(r, c, PT_RETRY_MS));
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
  rq *q;
  rq_req *a = NULL, *b = NULL;
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
    rq_init(q, a, c1, seq_a);
    rq_init(q, b, c1, seq_b);
    H_ASSERT_OK(rq_post(a, c1, 10000));
    H_ASSERT_OK(rq_post(b, c1, 10000));
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
      rq_req *r = i ? b : a;
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
    i = rq_held_index(q, seq_a);
    k = q->held[i].out;
    H_ASSERT_CODE(ibmsg_post_reply(&c1->sock, q->held[i].request, &q->out[k].msg), IBMSG_ENOTCONN);
    H_ASSERT_EQ(q->out[k].msg.status, IBMSG_WAITING, "the refused reply's status (it stays the "
                "application's)");
    H_ASSERT_OK(rq_out_release(q, k));
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
    rq_realloc(a, c2);
    rq_realloc(b, c2);
    H_ASSERT_OK(rq_retry(a, c2, 10000));
    H_ASSERT_OK(rq_retry(b, c2, 10000));
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
    i = rq_held_index(q, seq_b);
    k = q->held[i].out;
    H_ASSERT_CODE(ibmsg_post_reply(&c1->sock, q->held[i].request, &q->out[k].msg), IBMSG_ENOTCONN);
    H_ASSERT_OK(rq_out_release(q, k));
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
