/* test_cross.c - messages, flow control and disconnects between two hosts: the server on host 2,
 * the client on host 1 (test/twohost/run starts this program on both; test/softroce/run
 * --hosts 2 links them by a slow emulated network: a few ms one way for a small message, a few
 * thousand messages a second).
 *
 * The checks mirror test/integration/test_messages.c, test_flow_control.c and
 * test_disconnect.c, with the integration tests' harness: every test runs on both hosts, each
 * host checks what its own side saw, and the two meet at named barriers (twohost_sync) that keep
 * the ibmsg loop running while they wait. RNR retry is 0 (the harness's default), so a message
 * sent without a credit would close the connection with a transport error. */
#define _POSIX_C_SOURCE 200809L

/* The harness is compiled into this program (the build lists only test_cross.c and twohost.c
 * for it). */
#include "../integration/harness.c"
#include "twohost.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KiB ((size_t)1024)
#define MiB ((size_t)1024 * 1024)
#define EAGER ((size_t)16384) /* the default IBMSG_OPT_EAGER_SIZE */

#include "xtest.h"

/* --- messages ------------------------------------------------------------------------------ */

/* One message of each size, every other one with an immediate, back to back from one host to
 * the other: the receiver checks order, size, content and immediate of each. */
static const size_t plan_sizes[] = {0,     1,         63,         64,     4096,     4097,   EAGER - 1,
                                    EAGER, EAGER + 1, 64 * KiB,  MiB,    MiB + 7, 2 * MiB + 1};
#define PLAN_COUNT ((int)(sizeof plan_sizes / sizeof plan_sizes[0]))
static int plan_next;

static uint32_t plan_imm(int i) { return 0xabc00000u + (uint32_t)i; }

static void plan_received(h_conn *conn, ibmsg_buffer *msg) {
  h_ctx *ctx = conn->ctx;
  int i = plan_next++, rc;
  if (i >= PLAN_COUNT) {
    h_note_error(ctx, "%s: message %d arrived, only %d were sent", conn->name, i + 1, PLAN_COUNT);
  } else if (msg->size != plan_sizes[i]) {
    h_note_error(ctx, "%s: message %d has %zu bytes, expected %zu", conn->name, i, msg->size,
                 plan_sizes[i]);
  } else if (i % 2 == 1 && (!(msg->flags & IBMSG_MSG_IMM) || msg->imm != plan_imm(i))) {
    h_note_error(ctx, "%s: message %d: flags 0x%x imm 0x%x, expected IBMSG_MSG_IMM and 0x%x",
                 conn->name, i, msg->flags, msg->imm, plan_imm(i));
  } else if (i % 2 == 0 && (msg->flags & IBMSG_MSG_IMM)) {
    h_note_error(ctx, "%s: message %d carries an immediate (0x%x) but was sent without", conn->name,
                 i, msg->imm);
  }
  rc = ibmsg_free_msg(msg);
  if (rc != IBMSG_OK) h_note_error(ctx, "%s: ibmsg_free_msg: %s", conn->name, ibmsg_err_name(rc));
}

/* from_server: the server sends, else the client. `me` is this host's end. */
static void send_plan(h_ctx *ctx, h_conn *me, int from_server) {
  int i, rc;
  uint64_t start;
  size_t total = 0;
  const int sender = twohost_is_server() == from_server;

  if (!sender) {
    plan_next = 0;
    me->verify = 1;
    me->recv_seq = 0;
    me->expect_size = -1;
    ctx->on_received = plan_received;
  }
  X_SYNC(ctx, from_server ? "ready for the server's plan" : "ready for the client's plan");
  start = h_now_ms();
  if (sender) {
    for (i = 0; i < PLAN_COUNT; i++) {
      ibmsg_buffer *m = &ctx->msgs[i];
      h_alloc_fill(me, m, plan_sizes[i]);
      if (i % 2 == 1) {
        rc = ibmsg_post_send_imm(&me->sock, m, plan_imm(i));
        H_ASSERT_CODE(rc, IBMSG_OK);
        me->posted++;
        ctx->outstanding[i]++;
      } else {
        h_post(me, m);
      }
    }
    H_RUN_UNTIL_PROGRESS(ctx, me->sent == PLAN_COUNT || me->closed, 60000);
    x_assert_open(me);
    H_ASSERT_EQ(me->sent_ok, PLAN_COUNT, "message_sent(IBMSG_OK) callbacks");
    for (i = 0; i < PLAN_COUNT; i++) {
      H_ASSERT_EQ(ctx->msgs[i].status, IBMSG_SENT, "msg.status after message_sent(IBMSG_OK)");
      H_ASSERT_OK(ibmsg_free_msg(&ctx->msgs[i]));
    }
  } else {
    H_RUN_UNTIL_PROGRESS(ctx, plan_next == PLAN_COUNT || me->closed, 60000);
    x_assert_open(me);
    ctx->on_received = NULL;
    H_ASSERT_EQ(me->received, PLAN_COUNT, "messages received");
    for (i = 0; i < PLAN_COUNT; i++) total += plan_sizes[i];
    print_message("  %s: %d messages of 0 B .. 2 MiB (%.1f MiB) received in %llu ms\n",
                  twohost_role(), PLAN_COUNT, (double)total / (double)MiB,
                  (unsigned long long)(h_now_ms() - start));
  }
  X_SYNC(ctx, from_server ? "server's plan done" : "client's plan done");
}

static void messages_of_every_size_arrive_in_order_with_immediates(void **state) {
  h_ctx *ctx = *state;
  h_conn *me;

  X_BEGIN(ctx);
  me = x_pair(ctx, 0);
  H_CHECK(ibmsg_socket_max_msg_size(&me->sock) >= plan_sizes[PLAN_COUNT - 1],
          "the maximum message size is %zu", ibmsg_socket_max_msg_size(&me->sock));
  send_plan(ctx, me, 0);
  send_plan(ctx, me, 1);
  h_run_for(ctx, 200); /* a duplicate or a stray callback would show up here */
  H_ASSERT_EQ(me->received, PLAN_COUNT, "messages received in total");
  H_ASSERT_EQ(me->sent, me->posted, "message_sent callbacks vs. posts");
  x_finish(ctx);
}

/* Both hosts connect (over IPv6 with ipv6) and stream n messages of size bytes to each other at
 * the same time. */
static void both_stream(h_ctx *ctx, int ipv6, int n, size_t size) {
  uint64_t start, ms;
  h_conn *me;

  x_local(ctx)->verify = 1; /* from the first message on */
  x_local(ctx)->expect_size = (long)size;
  me = x_pair(ctx, ipv6);
  start = h_now_ms();
  h_stream_start(me, n, size, 16);
  H_RUN_UNTIL_PROGRESS(ctx, (me->received == n && h_stream_done(me)) || me->closed, 120000);
  x_assert_open(me);
  ms = h_now_ms() - start;
  print_message("  %s: %d messages of %zu B each way in %llu ms (%.0f/s each way)\n",
                twohost_role(), n, size, (unsigned long long)ms, ms ? n * 1000.0 / (double)ms : 0.0);
  X_SYNC(ctx, "streamed");
  h_run_for(ctx, 200);
  H_ASSERT_EQ(me->received, n, "messages received");
  H_ASSERT_EQ(me->sent_ok, n, "message_sent(IBMSG_OK) callbacks");
  H_ASSERT_EQ(me->sent, me->posted, "message_sent callbacks vs. posts");
}

static void streams_each_way_arrive_in_order(void **state) {
  h_ctx *ctx = *state;
  X_BEGIN(ctx);
  both_stream(ctx, 0, 2000, 512);
  x_finish(ctx);
}

static void streams_over_ipv6_arrive_in_order(void **state) {
  h_ctx *ctx = *state;
  X_BEGIN(ctx);
  both_stream(ctx, 1, 300, 3000);
  x_finish(ctx);
}

/* --- flow control -------------------------------------------------------------------------- */

#define FC_RECV_DEPTH 4
#define FC_SEND_QUEUE 40
#define FC_SEND_DEPTH 48
#define FC_SIZE 256
#define FC_POSTED (FC_RECV_DEPTH + FC_SEND_QUEUE)

static void flow_options(h_ctx *ctx) {
  /* Receive buffers of each connection's own: RECV_DEPTH credits exactly. */
  h_setopt_int(ctx, IBMSG_OPT_SHARED_RECV, 0);
  h_setopt_int(ctx, IBMSG_OPT_RECV_DEPTH, FC_RECV_DEPTH);
  h_setopt_int(ctx, IBMSG_OPT_SEND_QUEUE, FC_SEND_QUEUE);
  h_setopt_int(ctx, IBMSG_OPT_SEND_DEPTH, FC_SEND_DEPTH);
}

/* The server holds every message; the client posts eleven times its receive depth. */
static void receiver_holding_every_message_stops_the_sender_until_it_frees(void **state) {
  h_ctx *ctx = *state;
  h_conn *me;
  ibmsg_buffer *extra = &ctx->msgs[FC_POSTED];
  int i;

  X_BEGIN(ctx);
  flow_options(ctx);
  if (twohost_is_server()) {
    x_local(ctx)->hold = 1;
    x_local(ctx)->verify = 1;
    x_local(ctx)->expect_size = FC_SIZE;
  }
  me = x_pair(ctx, 0);
  if (twohost_is_client()) {
    h_post_msgs(me, 0, FC_POSTED, FC_SIZE);
    h_alloc_fill(me, extra, FC_SIZE);
    H_ASSERT_CODE(h_try_post(me, extra), IBMSG_EAGAIN); /* the queue is full */
    H_ASSERT_EQ(extra->status, IBMSG_WAITING, "status of the message whose post failed");
    H_RUN_UNTIL(ctx, me->sent >= FC_RECV_DEPTH || me->closed, H_TIMEOUT_MS);
    h_run_for(ctx, 1500); /* a message sent beyond the credits would arrive (or fail) meanwhile */
    x_assert_open(me);
    H_ASSERT_EQ(me->sent, FC_RECV_DEPTH, "message_sent callbacks while the receiver holds its buffers");
    H_ASSERT_EQ(me->sent_ok, FC_RECV_DEPTH, "message_sent(IBMSG_OK) callbacks");
    for (i = FC_RECV_DEPTH; i < FC_POSTED; i++)
      H_ASSERT_EQ(ctx->msgs[i].status, IBMSG_WAITING, "status of a message queued for credits");
  } else {
    H_RUN_UNTIL(ctx, me->received >= FC_RECV_DEPTH || me->closed, H_TIMEOUT_MS);
    h_run_for(ctx, 1500);
    x_assert_open(me);
    H_ASSERT_EQ(me->received, FC_RECV_DEPTH, "messages delivered to a receiver holding all buffers");
    H_ASSERT_EQ(me->n_held, FC_RECV_DEPTH, "messages held");
  }
  X_SYNC(ctx, "holding");

  if (twohost_is_server()) {
    me->hold = 0;
    h_release_held(me); /* verify checks that the rest come in order and intact */
    H_RUN_UNTIL_PROGRESS(ctx, me->received == FC_POSTED + 1 || me->closed, 60000);
    x_assert_open(me);
  } else {
    H_RUN_UNTIL_PROGRESS(ctx, me->sent == FC_POSTED || me->closed, 60000);
    x_assert_open(me);
    for (i = 0; i < FC_POSTED; i++) {
      H_ASSERT_EQ(ctx->outstanding[i], 0, "message_sent callbacks missing for a queued message");
      H_ASSERT_EQ(ctx->msgs[i].status, IBMSG_SENT, "status of a delivered message");
    }
    /* Once the queue drained, the refused message can be posted, and arrives last. */
    h_post(me, extra);
    H_RUN_UNTIL(ctx, me->sent == FC_POSTED + 1 || me->closed, H_TIMEOUT_MS);
    x_assert_open(me);
    H_ASSERT_EQ(me->sent_ok, FC_POSTED + 1, "message_sent(IBMSG_OK) callbacks");
  }
  X_SYNC(ctx, "released");
  h_run_for(ctx, 200);
  if (twohost_is_server()) H_ASSERT_EQ(me->received, FC_POSTED + 1, "messages received in total");
  else for (i = 0; i <= FC_POSTED; i++) H_ASSERT_OK(ibmsg_free_msg(&ctx->msgs[i]));
  x_finish(ctx);
}

/* Holds received messages and frees all of them, from the callback, once RECV_DEPTH are held:
 * the sender runs dry of credits again and again. */
static void free_in_batches(h_conn *conn, ibmsg_buffer *msg) {
  h_free_in_batches(conn, msg, FC_RECV_DEPTH);
}

static void receiver_freeing_in_batches_keeps_a_stream_flowing(void **state) {
  h_ctx *ctx = *state;
  h_conn *me;
  const int n = 300;

  X_BEGIN(ctx);
  flow_options(ctx);
  if (twohost_is_server()) {
    x_local(ctx)->verify = 1;
    x_local(ctx)->expect_size = FC_SIZE;
    ctx->on_received = free_in_batches;
  }
  me = x_pair(ctx, 0);
  if (twohost_is_client()) {
    h_stream_start(me, n, FC_SIZE, FC_SEND_QUEUE);
    H_RUN_UNTIL_PROGRESS(ctx, h_stream_done(me) || me->closed, 60000);
    x_assert_open(me);
    H_ASSERT_EQ(me->sent_ok, n, "message_sent(IBMSG_OK) callbacks");
  } else {
    H_RUN_UNTIL_PROGRESS(ctx, me->received == n || me->closed, 60000);
    x_assert_open(me);
  }
  X_SYNC(ctx, "streamed");
  ctx->on_received = NULL;
  x_finish(ctx);
}

/* --- disconnect ---------------------------------------------------------------------------- */

#define DC_RECV_DEPTH 4
#define DC_SEND_QUEUE 8
#define DC_SIZE 200
#define DC_POSTED (DC_RECV_DEPTH + DC_SEND_QUEUE) /* some in flight or delivered, the rest queued */

static void disconnect_options(h_ctx *ctx) {
  h_setopt_int(ctx, IBMSG_OPT_SHARED_RECV, 0);
  h_setopt_int(ctx, IBMSG_OPT_RECV_DEPTH, DC_RECV_DEPTH);
  h_setopt_int(ctx, IBMSG_OPT_SEND_QUEUE, DC_SEND_QUEUE);
  h_setopt_int(ctx, IBMSG_OPT_SEND_DEPTH, 16);
}

/* The closer (the server when server_closes, else the client) posts DC_POSTED messages and
 * disconnects at once; its peer holds what arrives. Each host checks its side of the close. */
static void disconnect_with_messages_pending(h_ctx *ctx, int server_closes) {
  const int closer = twohost_is_server() == server_closes;
  h_conn *me;
  int i;

  disconnect_options(ctx);
  if (!closer) {
    x_local(ctx)->hold = 1;
    x_local(ctx)->verify = 1;
  }
  me = x_pair(ctx, 0);
  if (closer) {
    me->expect_send_errors = 1;
    h_post_msgs(me, 0, DC_POSTED, DC_SIZE);
    H_ASSERT_OK(ibmsg_disconnect(&me->sock));
    H_ASSERT_STATUS(me->sock.status, IBMSG_DISCONNECTING, "status right after ibmsg_disconnect");
  }
  H_RUN_UNTIL(ctx, me->closed, H_TIMEOUT_MS);
  h_run_for(ctx, 500); /* a second connection_closed or a late message_sent would show up here */
  H_ASSERT_EQ(me->closed, 1, "connection_closed callbacks");
  H_ASSERT_STATUS(me->close_status, IBMSG_UNCONNECTED, "status when closed");
  H_ASSERT_STATUS(me->sock.status, IBMSG_UNCONNECTED, "status after close");
  if (closer) {
    H_ASSERT_REASON(me->close_reason, IBMSG_OK, "close reason of the side that disconnected");
    H_ASSERT_EQ(me->sent, DC_POSTED, "message_sent callbacks of the disconnecting side");
    H_ASSERT_EQ(me->sent_ok + me->sent_canceled, DC_POSTED,
                "message_sent callbacks with IBMSG_OK or IBMSG_ECANCELED");
    H_ASSERT_EQ(me->sent_at_close, DC_POSTED, "message_sent callbacks before connection_closed");
    for (i = 0; i < DC_POSTED; i++) {
      H_ASSERT_EQ(ctx->outstanding[i], 0, "a posted message without exactly one message_sent");
      H_ASSERT_OK(ibmsg_free_msg(&ctx->msgs[i]));
    }
    print_message("  %s (closer): %d sent, %d canceled\n", twohost_role(), me->sent_ok,
                  me->sent_canceled);
  } else {
    H_ASSERT_REASON(me->close_reason, IBMSG_ECONNRESET, "close reason of the peer");
    H_CHECK(me->received <= DC_RECV_DEPTH, "received %d messages without freeing any; there are "
            "only %d buffers", me->received, DC_RECV_DEPTH);
    print_message("  %s (peer): %d received\n", twohost_role(), me->received);
    h_release_held(me);
  }
  x_finish(ctx);
}

static void client_disconnect_accounts_for_every_posted_message(void **state) {
  X_BEGIN((h_ctx *)*state);
  disconnect_with_messages_pending(*state, 0);
}

static void server_disconnect_accounts_for_every_posted_message(void **state) {
  X_BEGIN((h_ctx *)*state);
  disconnect_with_messages_pending(*state, 1);
}

/* Both stream; the server disconnects once it has received 200 messages. */
static void disconnect_during_streams_accounts_for_every_message(void **state) {
  h_ctx *ctx = *state;
  h_conn *me;

  X_BEGIN(ctx);
  disconnect_options(ctx);
  x_local(ctx)->verify = 1;
  x_local(ctx)->expect_send_errors = 1;
  me = x_pair(ctx, 0);
  h_stream_start(me, 100000, DC_SIZE, DC_SEND_QUEUE);
  if (twohost_is_server()) {
    H_RUN_UNTIL_PROGRESS(ctx, me->received >= 200 || me->closed, 60000);
    x_assert_open(me);
    H_ASSERT_OK(ibmsg_disconnect(&me->sock));
  }
  H_RUN_UNTIL(ctx, me->closed, 60000);
  h_run_for(ctx, 500);
  H_ASSERT_EQ(me->closed, 1, "connection_closed callbacks");
  H_ASSERT_EQ(me->sent, me->posted, "message_sent callbacks vs. posts");
  H_ASSERT_EQ(me->sent_other, 0, "message_sent callbacks with a status other than IBMSG_OK or IBMSG_ECANCELED");
  H_ASSERT_EQ(me->stream_inflight, 0, "stream messages never sent back");
  H_ASSERT_REASON(me->close_reason, twohost_is_server() ? IBMSG_OK : IBMSG_ECONNRESET, "close reason");
  print_message("  %s: %d received, %d sent, %d canceled\n", twohost_role(), me->received,
                me->sent_ok, me->sent_canceled);
  x_finish(ctx);
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      X_TEST(messages_of_every_size_arrive_in_order_with_immediates),
      X_TEST(streams_each_way_arrive_in_order),
      X_TEST(streams_over_ipv6_arrive_in_order),
      X_TEST(receiver_holding_every_message_stops_the_sender_until_it_frees),
      X_TEST(receiver_freeing_in_batches_keeps_a_stream_flowing),
      X_TEST(client_disconnect_accounts_for_every_posted_message),
      X_TEST(server_disconnect_accounts_for_every_posted_message),
      X_TEST(disconnect_during_streams_accounts_for_every_message),
  };
  return X_MAIN("test_cross", tests);
}
