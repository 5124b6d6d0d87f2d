/* test_flow_control.c - credits: a receiver that holds its buffers stops the sender, posts queue
 * and then fail with IBMSG_EAGAIN, and everything flows again once the buffers are freed.
 * The harness disables RNR retries, so a message sent without a credit would close the
 * connection with a transport error: every test asserts that no connection closed. */
#define _POSIX_C_SOURCE 200809L

#include "harness.h"

#define RECV_DEPTH 4
#define SEND_QUEUE 6
#define SEND_DEPTH 16
#define MSG_SIZE 256

static void flow_pair(h_ctx *ctx, h_conn **client, h_conn **server) {
  /* Receive buffers of each connection's own: these tests count its credits exactly
   * (test_shared_recv covers the shared ones). */
  h_setopt_own_credits(ctx, RECV_DEPTH, SEND_QUEUE, SEND_DEPTH);
  h_pair(ctx, client, server);
  (*client)->verify = (*server)->verify = 1;
  (*client)->expect_size = (*server)->expect_size = MSG_SIZE;
}

static void assert_still_connected(h_conn *a, h_conn *b) {
  H_CHECK(!a->closed, "%s closed with %s: a message was probably sent without a credit", a->name,
          ibmsg_err_name(a->close_reason));
  H_CHECK(!b->closed, "%s closed with %s: a message was probably sent without a credit", b->name,
          ibmsg_err_name(b->close_reason));
}

/* Allocates and posts msgs[first .. first+n-1] from conn; every post must succeed. */
static void post_range(h_ctx *ctx, h_conn *conn, int first, int n) {
  int i;
  for (i = first; i < first + n; i++) {
    h_alloc_fill(conn, &ctx->msgs[i], MSG_SIZE);
    h_post(conn, &ctx->msgs[i]);
  }
}

static void free_range(h_ctx *ctx, int first, int n) {
  int i;
  for (i = first; i < first + n; i++) H_ASSERT_OK(ibmsg_free_msg(&ctx->msgs[i]));
}

/* The end of a test that used msgs[0 .. n-1]: no connection closed, the messages freed, and
 * h_finish. */
static void flow_finish(h_ctx *ctx, h_conn *client, h_conn *server, int n) {
  assert_still_connected(client, server);
  free_range(ctx, 0, n);
  h_finish(ctx);
}

/* flow_pair, then posts RECV_DEPTH + SEND_QUEUE messages to a holding receiver and waits until
 * the credits are used up: RECV_DEPTH delivered, the rest queued. */
static void pair_fill_credits_and_queue(h_ctx *ctx, h_conn **clientp, h_conn **serverp) {
  h_conn *client, *server;
  flow_pair(ctx, clientp, serverp);
  client = *clientp;
  server = *serverp;
  server->hold = 1;
  post_range(ctx, client, 0, RECV_DEPTH + SEND_QUEUE);
  H_RUN_UNTIL(ctx, server->received >= RECV_DEPTH && client->sent >= RECV_DEPTH, H_TIMEOUT_MS);
  h_run_for(ctx, 500); /* a message sent beyond the credits would arrive (or fail) meanwhile */
  assert_still_connected(client, server);
  H_ASSERT_EQ(server->received, RECV_DEPTH, "messages delivered to a receiver holding all buffers");
  H_ASSERT_EQ(client->sent, RECV_DEPTH, "message_sent callbacks while the receiver holds its buffers");
}

/* The receiver stops holding and frees what it held: the queued messages go out, and the test
 * waits until all RECV_DEPTH + SEND_QUEUE arrived and every post got its message_sent. */
static void release_and_drain(h_ctx *ctx, h_conn *client, h_conn *server) {
  server->hold = 0;
  h_release_held(server);
  H_RUN_UNTIL(ctx, server->received == RECV_DEPTH + SEND_QUEUE && client->sent == client->posted,
              H_TIMEOUT_MS);
}

static void sender_stops_after_recv_depth_messages_while_receiver_holds_them(void **state) {
  h_ctx *ctx = *state;
  h_conn *client, *server;
  int i;

  pair_fill_credits_and_queue(ctx, &client, &server);
  H_ASSERT_EQ(client->sent_ok, RECV_DEPTH, "message_sent(IBMSG_OK) callbacks");
  for (i = RECV_DEPTH; i < RECV_DEPTH + SEND_QUEUE; i++)
    H_ASSERT_EQ(ctx->msgs[i].status, IBMSG_WAITING, "status of a message queued for credits");

  release_and_drain(ctx, client, server);
  flow_finish(ctx, client, server, RECV_DEPTH + SEND_QUEUE);
}

static void post_returns_eagain_when_send_queue_is_full(void **state) {
  h_ctx *ctx = *state;
  h_conn *client, *server;
  ibmsg_buffer *extra = &ctx->msgs[RECV_DEPTH + SEND_QUEUE];

  pair_fill_credits_and_queue(ctx, &client, &server);
  h_alloc_fill(client, extra, MSG_SIZE);
  H_ASSERT_CODE(h_try_post(client, extra), IBMSG_EAGAIN);
  H_ASSERT_EQ(extra->status, IBMSG_WAITING, "status of the message whose post failed");
  H_ASSERT_CODE(h_try_post(client, extra), IBMSG_EAGAIN);
  h_run_for(ctx, 300);
  H_ASSERT_EQ(client->sent, RECV_DEPTH, "message_sent callbacks (none for a failed post)");

  /* Once the queue drains, the same message can be posted and arrives last, in order. */
  release_and_drain(ctx, client, server);
  h_post(client, extra);
  H_RUN_UNTIL(ctx, server->received == RECV_DEPTH + SEND_QUEUE + 1 && client->sent == client->posted,
              H_TIMEOUT_MS);
  flow_finish(ctx, client, server, RECV_DEPTH + SEND_QUEUE + 1);
}

static void queued_messages_arrive_in_order_when_receiver_frees(void **state) {
  h_ctx *ctx = *state;
  h_conn *client, *server;
  int i;

  pair_fill_credits_and_queue(ctx, &client, &server);
  release_and_drain(ctx, client, server); /* server->verify checks order and content */
  h_run_for(ctx, 300);
  H_ASSERT_EQ(server->received, RECV_DEPTH + SEND_QUEUE, "messages received in total");
  H_ASSERT_EQ(client->sent_ok, RECV_DEPTH + SEND_QUEUE, "message_sent(IBMSG_OK) callbacks");
  for (i = 0; i < RECV_DEPTH + SEND_QUEUE; i++) {
    H_ASSERT_EQ(ctx->outstanding[i], 0, "message_sent callbacks missing for a queued message");
    H_ASSERT_EQ(ctx->msgs[i].status, IBMSG_SENT, "status of a delivered message");
  }
  flow_finish(ctx, client, server, RECV_DEPTH + SEND_QUEUE);
}

static void alloc_returns_eagain_when_all_send_buffers_are_allocated(void **state) {
  h_ctx *ctx = *state;
  h_conn *client, *server;
  ibmsg_buffer *extra = &ctx->msgs[SEND_DEPTH];
  int i;

  flow_pair(ctx, &client, &server);
  for (i = 0; i < SEND_DEPTH; i++) h_alloc_fill(client, &ctx->msgs[i], MSG_SIZE);
  H_ASSERT_CODE(ibmsg_alloc_msg(extra, &client->sock, MSG_SIZE), IBMSG_EAGAIN);

  /* A sent message stays the sender's (allocated) until it is freed. */
  for (i = 0; i < 4; i++) h_post(client, &ctx->msgs[i]);
  H_RUN_UNTIL(ctx, client->sent == 4, H_TIMEOUT_MS);
  H_ASSERT_CODE(ibmsg_alloc_msg(extra, &client->sock, MSG_SIZE), IBMSG_EAGAIN);

  H_ASSERT_OK(ibmsg_free_msg(&ctx->msgs[0]));
  H_ASSERT_OK(ibmsg_alloc_msg(extra, &client->sock, MSG_SIZE));
  H_ASSERT_CODE(ibmsg_alloc_msg(&ctx->msgs[0], &client->sock, MSG_SIZE), IBMSG_EAGAIN);
  H_ASSERT_OK(ibmsg_free_msg(extra));
  free_range(ctx, 1, SEND_DEPTH - 1);
  assert_still_connected(client, server);
  h_finish(ctx);
}

/* Holds received messages and frees all of them, from the callback, once RECV_DEPTH are held:
 * the sender runs dry of credits again and again. */
static void free_in_batches(h_conn *conn, ibmsg_buffer *msg) {
  h_free_in_batches(conn, msg, RECV_DEPTH);
}

static void receiver_freeing_in_batches_keeps_a_stream_flowing(void **state) {
  h_ctx *ctx = *state;
  h_conn *client, *server;
  const int n = 2000;

  flow_pair(ctx, &client, &server);
  ctx->on_received = free_in_batches;
  h_stream_start(client, n, MSG_SIZE, SEND_QUEUE);
  H_RUN_UNTIL_PROGRESS(ctx, server->received == n && h_stream_done(client), 120000);
  assert_still_connected(client, server);
  H_ASSERT_EQ(client->sent_ok, n, "message_sent(IBMSG_OK) callbacks");
  ctx->on_received = NULL;
  h_finish(ctx);
}

static void receiver_freeing_from_main_loop_keeps_a_stream_flowing(void **state) {
  h_ctx *ctx = *state;
  h_conn *client, *server;
  const int n = 2000;
  uint64_t deadline = h_now_ms() + 60000;
  unsigned long events = h_events();

  flow_pair(ctx, &client, &server);
  server->hold = 1;
  h_stream_start(client, n, MSG_SIZE, SEND_QUEUE);
  while (!(server->received == n && h_stream_done(client))) {
    /* The limit follows the progress: 60 s without any callback (not 120 s for the stream). */
    if (h_events() != events) {
      events = h_events();
      deadline = h_now_ms() + 60000;
    }
    H_CHECK(h_now_ms() < deadline, "timed out: nothing happened for 60 s (the test's own limit): "
            "%d of %d messages received, %d message_sent", server->received, n, client->sent);
    h_run_for(ctx, 2);
    h_release_held(server);
  }
  assert_still_connected(client, server);
  H_ASSERT_EQ(client->sent_ok, n, "message_sent(IBMSG_OK) callbacks");
  h_finish(ctx);
}

static void credits_return_when_both_sides_are_out_of_credits(void **state) {
  h_ctx *ctx = *state;
  h_conn *client, *server;
  const int n = RECV_DEPTH + SEND_QUEUE;

  flow_pair(ctx, &client, &server);
  client->hold = server->hold = 1;
  /* Both sides use up the peer's credits and fill their queues: a credit update that itself
   * needed a credit would deadlock here. */
  post_range(ctx, client, 0, n);
  post_range(ctx, server, n, n);
  H_RUN_UNTIL(ctx, server->received == RECV_DEPTH && client->received == RECV_DEPTH, H_TIMEOUT_MS);
  h_run_for(ctx, 300);
  assert_still_connected(client, server);
  client->hold = server->hold = 0;
  h_release_held(client);
  h_release_held(server);
  H_RUN_UNTIL(ctx, server->received == n && client->received == n && client->sent == n &&
                       server->sent == n,
              H_TIMEOUT_MS);
  flow_finish(ctx, client, server, 2 * n);
}

/* Bursts that use up all credits, each followed by the receiver freeing one message per loop
 * turn, newest first, while the sender is idle: every credit must come back by credit-only
 * messages alone. */
static void bursts_freed_one_at_a_time_in_reverse_order_keep_flowing(void **state) {
  h_ctx *ctx = *state;
  h_conn *client, *server;
  /* SEND_QUEUE, not RECV_DEPTH + SEND_QUEUE: credits come back lazily (a credit-only message
   * goes out when half the depth is owed or the sender has none left), so an idle sender may
   * start a burst with fewer than RECV_DEPTH credits. */
  const int burst = SEND_QUEUE, bursts = 30;
  int b, i;

  flow_pair(ctx, &client, &server);
  server->hold = 1;
  for (i = 0; i < burst; i++) h_alloc_fill(client, &ctx->msgs[i], MSG_SIZE);
  for (b = 0; b < bursts; b++) {
    for (i = 0; i < burst; i++) {
      if (b > 0) {
        ctx->msgs[i].size = MSG_SIZE;
        h_fill(ctx->msgs[i].data, MSG_SIZE, client->send_seq++);
      }
      h_post(client, &ctx->msgs[i]);
    }
    while (client->sent < (b + 1) * burst) {
      H_RUN_UNTIL(ctx, server->n_held > 0 || client->sent == (b + 1) * burst, H_TIMEOUT_MS);
      if (server->n_held > 0) {
        H_ASSERT_OK(ibmsg_free_msg(server->held[--server->n_held]));
        h_run_for(ctx, 1);
      }
    }
    assert_still_connected(client, server);
  }
  H_RUN_UNTIL(ctx, server->received == burst * bursts, H_TIMEOUT_MS);
  h_release_held(server);
  free_range(ctx, 0, burst);
  h_finish(ctx);
}

/* The receiver answers every other message from message_received, right after freeing it: the
 * credits of the freed buffers then often go back on a credit-only message posted just before the
 * answer in the same round, which goes out unsignaled (the answer's completion confirms it and
 * gives its control slot back). Then a stream without answers, whose credits can only go back on
 * credit-only messages: had control slots not come back, it would stop at once. Answers use ctx->msgs[0 .. ANSWER_BUFS - 1]
 * and are freed in message_sent. */
#define ANSWER_BUFS SEND_QUEUE
static int answers;

static void free_then_answer(h_conn *conn, ibmsg_buffer *msg) {
  h_ctx *ctx = conn->ctx;
  int i, rc;
  rc = ibmsg_free_msg(msg);
  if (rc != IBMSG_OK) h_note_error(ctx, "ibmsg_free_msg in message_received: %s", ibmsg_err_name(rc));
  if (conn == ctx->clients || conn->received % 2 != 0) return; /* the server answers */
  for (i = 0; i < ANSWER_BUFS && ctx->outstanding[i] > 0; i++) continue;
  if (i == ANSWER_BUFS) return; /* every answer buffer in flight: no answer this time */
  rc = ibmsg_alloc_msg(&ctx->msgs[i], &conn->sock, MSG_SIZE);
  if (rc != IBMSG_OK) {
    h_note_error(ctx, "ibmsg_alloc_msg for an answer: %s", ibmsg_err_name(rc));
    return;
  }
  h_fill(ctx->msgs[i].data, MSG_SIZE, conn->send_seq++);
  rc = h_try_post(conn, &ctx->msgs[i]);
  if (rc != IBMSG_OK) h_note_error(ctx, "posting an answer: %s", ibmsg_err_name(rc));
  else answers++;
}

static void free_answer(h_conn *conn, ibmsg_buffer *msg, int status) {
  int rc;
  (void)status;
  if (conn == conn->ctx->clients) return; /* the client's stream frees its own */
  rc = ibmsg_free_msg(msg);
  if (rc != IBMSG_OK) h_note_error(conn->ctx, "ibmsg_free_msg in message_sent: %s", ibmsg_err_name(rc));
}

static void answers_after_freeing_keep_a_stream_flowing(void **state) {
  h_ctx *ctx = *state;
  h_conn *client, *server;
  const int n = 4000;

  flow_pair(ctx, &client, &server);
  answers = 0;
  ctx->on_received = free_then_answer;
  ctx->on_sent = free_answer;
  h_stream_start(client, n, MSG_SIZE, SEND_QUEUE);
  H_RUN_UNTIL_PROGRESS(ctx, server->received == n && h_stream_done(client) &&
                                client->received == answers && server->sent == server->posted,
                       120000);
  assert_still_connected(client, server);
  H_ASSERT_EQ(client->sent_ok, n, "message_sent(IBMSG_OK) callbacks of the stream");
  H_ASSERT_EQ(server->sent_ok, answers, "message_sent(IBMSG_OK) callbacks of the answers");
  H_CHECK(answers >= n / 4, "only %d answers for %d messages", answers, n);
  print_message("  %d messages, %d answers\n", n, answers);
  ctx->on_received = NULL;
  ctx->on_sent = NULL;
  h_stream_start(client, n, MSG_SIZE, SEND_QUEUE);
  H_RUN_UNTIL_PROGRESS(ctx, server->received == 2 * n && h_stream_done(client), 60000);
  assert_still_connected(client, server);
  H_ASSERT_EQ(client->sent_ok, 2 * n, "message_sent(IBMSG_OK) callbacks of both streams");
  h_finish(ctx);
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      H_TEST(sender_stops_after_recv_depth_messages_while_receiver_holds_them),
      H_TEST(post_returns_eagain_when_send_queue_is_full),
      H_TEST(queued_messages_arrive_in_order_when_receiver_frees),
      H_TEST(alloc_returns_eagain_when_all_send_buffers_are_allocated),
      H_TEST(receiver_freeing_in_batches_keeps_a_stream_flowing),
      H_TEST(receiver_freeing_from_main_loop_keeps_a_stream_flowing),
      H_TEST(credits_return_when_both_sides_are_out_of_credits),
      H_TEST(bursts_freed_one_at_a_time_in_reverse_order_keep_flowing),
      H_TEST(answers_after_freeing_keep_a_stream_flowing),
  };
  h_init(argc, argv);
  return cmocka_run_group_tests(tests, NULL, NULL);
}
