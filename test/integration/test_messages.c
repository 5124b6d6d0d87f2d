/* test_messages.c - messages arrive intact, in order and exactly once, at every size. */
#define _POSIX_C_SOURCE 200809L

#include "harness.h"

#include <stdlib.h>
#include <string.h>

#define MiB (1024 * 1024)

static void ten_thousand_messages_each_way_arrive_in_order(void **state) {
  h_ctx *ctx = *state;
  h_conn *client, *server;
  const int n = 10000;

  h_pair(ctx, &client, &server);
  client->verify = server->verify = 1;
  client->expect_size = server->expect_size = 512;
  h_stream_both(ctx, client, server, n, 512, 32, 180000);
  h_run_for(ctx, 200); /* anything extra (duplicates, stray callbacks) would show up here */
  H_ASSERT_EQ(server->received, n, "messages the server received");
  H_ASSERT_EQ(client->received, n, "messages the client received");
  H_ASSERT_EQ(client->sent_ok, n, "message_sent(IBMSG_OK) callbacks of the client");
  H_ASSERT_EQ(server->sent_ok, n, "message_sent(IBMSG_OK) callbacks of the server");
  H_ASSERT_EQ(client->sent, client->posted, "the client's message_sent callbacks vs. its posts");
  H_ASSERT_EQ(server->sent, server->posted, "the server's message_sent callbacks vs. its posts");
  h_finish(ctx);
}

/* Sends one message of each size from `from` to `to` and checks each arrives with that size. */
static void send_each_size(h_ctx *ctx, h_conn *from, h_conn *to, const size_t *sizes, int count) {
  int i;
  for (i = 0; i < count; i++) {
    ibmsg_buffer *m = &ctx->msgs[i];
    int received = to->received, sent = from->sent;
    to->expect_size = (long)sizes[i];
    h_alloc_fill(from, m, sizes[i]);
    h_post(from, m);
    H_RUN_UNTIL(ctx, to->received > received && from->sent > sent, H_TIMEOUT_MS);
    H_ASSERT_EQ(to->received, received + 1, "messages received for one post");
    H_ASSERT_EQ(to->last_received_size, sizes[i], "size of the received message");
    H_ASSERT_REASON(from->last_sent_status, IBMSG_OK, "message_sent status");
    H_ASSERT_EQ(m->status, IBMSG_SENT, "msg.status after message_sent(IBMSG_OK)");
    H_ASSERT_OK(ibmsg_free_msg(m));
  }
}

static void every_size_up_to_the_maximum_arrives_intact(void **state) {
  h_ctx *ctx = *state;
  h_conn *client, *server;
  size_t max, sizes[] = {0, 1, 63, 64, 65, 4095, 4096, 4097, 0};
  const int count = (int)(sizeof sizes / sizeof sizes[0]);

  /* Eager messages only: the maximum is the eager size (test_rendezvous goes beyond). */
  h_setopt_int(ctx, IBMSG_OPT_MAX_MSG_SIZE, 65536);
  h_pair(ctx, &client, &server);
  max = ibmsg_socket_max_msg_size(&client->sock);
  H_ASSERT_EQ(max, 65536, "the client's maximum message size (IBMSG_OPT_MAX_MSG_SIZE)");
  H_ASSERT_EQ(ibmsg_socket_max_msg_size(&server->sock), max, "the server's maximum message size");
  sizes[count - 1] = max;
  client->verify = server->verify = 1;
  send_each_size(ctx, client, server, sizes, count);
  send_each_size(ctx, server, client, sizes, count);
  h_finish(ctx);
}

/* With a maximum of `limit` bytes (the eager size, or above it: rendezvous). */
static void larger_than_maximum_fails(h_ctx *ctx, int limit) {
  h_conn *client, *server;
  ibmsg_buffer *m = &ctx->msgs[0], *big = &ctx->msgs[1];
  size_t max;

  h_setopt_int(ctx, IBMSG_OPT_MAX_MSG_SIZE, limit);
  h_pair(ctx, &client, &server);
  max = ibmsg_socket_max_msg_size(&client->sock);
  H_ASSERT_EQ(max, limit, "the client's maximum message size");
  H_ASSERT_CODE(ibmsg_alloc_msg(big, &client->sock, max + 1), IBMSG_EMSGSIZE);

  h_alloc_fill(client, m, max);
  m->size = max + 1;
  H_ASSERT_CODE(h_try_post(client, m), IBMSG_EMSGSIZE);
  H_ASSERT_EQ(m->status, IBMSG_WAITING, "msg.status after a failed post (still the sender's)");
  m->size = (size_t)-1;
  H_ASSERT_CODE(h_try_post(client, m), IBMSG_EMSGSIZE);

  h_run_for(ctx, 500);
  H_ASSERT_EQ(server->received, 0, "messages the server received after failed posts");
  H_ASSERT_EQ(client->sent, 0, "message_sent callbacks for failed posts");
  H_ASSERT_OK(ibmsg_free_msg(m));
  h_finish(ctx);
}

static void message_larger_than_maximum_fails_and_sends_nothing(void **state) { larger_than_maximum_fails(*state, 65536); }

static void message_larger_than_a_rendezvous_maximum_fails_and_sends_nothing(void **state) { larger_than_maximum_fails(*state, 3 * MiB + 5); }

static void every_post_gets_exactly_one_message_sent(void **state) {
  h_ctx *ctx = *state;
  h_conn *client, *server;
  int i;

  h_pair(ctx, &client, &server);
  h_post_msgs(client, 0, 16, 100);
  H_RUN_UNTIL(ctx, client->sent == 16, H_TIMEOUT_MS);
  h_run_for(ctx, 300); /* a second message_sent for any of them would show up here */
  H_ASSERT_EQ(client->sent, 16, "message_sent callbacks for 16 posts");
  H_ASSERT_EQ(client->sent_ok, 16, "message_sent(IBMSG_OK) callbacks for 16 posts");
  for (i = 0; i < 16; i++) {
    H_ASSERT_EQ(ctx->outstanding[i], 0, "message_sent callbacks missing for a message");
    H_ASSERT_EQ(ctx->msgs[i].status, IBMSG_SENT, "msg.status after message_sent");
    /* After message_sent the message is the sender's again: it may be posted once more. */
    ctx->msgs[i].size = 100;
    h_fill(ctx->msgs[i].data, 100, client->send_seq++);
    h_post(client, &ctx->msgs[i]);
  }
  H_RUN_UNTIL(ctx, client->sent == 32 && server->received == 32, H_TIMEOUT_MS);
  for (i = 0; i < 16; i++) H_ASSERT_OK(ibmsg_free_msg(&ctx->msgs[i]));
  h_finish(ctx);
}

static void one_mib_maximum_message_size_works_end_to_end(void **state) {
  h_ctx *ctx = *state;
  h_conn *client, *server;

  h_setopt_int(ctx, IBMSG_OPT_MAX_MSG_SIZE, MiB);
  h_setopt_int(ctx, IBMSG_OPT_RECV_DEPTH, 4);
  h_setopt_int(ctx, IBMSG_OPT_SEND_DEPTH, 4);
  h_pair(ctx, &client, &server);
  H_ASSERT_EQ(ibmsg_socket_max_msg_size(&client->sock), MiB, "the client's maximum message size");
  H_ASSERT_EQ(ibmsg_socket_max_msg_size(&server->sock), MiB, "the server's maximum message size");
  client->verify = server->verify = 1;
  client->expect_size = server->expect_size = MiB;
  h_stream_start(client, 20, MiB, 4);
  h_stream_start(server, 20, MiB, 4);
  H_RUN_UNTIL_PROGRESS(ctx, server->received == 20 && client->received == 20 &&
                                h_stream_done(client) && h_stream_done(server),
                       120000);
  H_ASSERT_EQ(client->sent_ok, 20, "message_sent(IBMSG_OK) callbacks of the client");
  H_ASSERT_EQ(server->sent_ok, 20, "message_sent(IBMSG_OK) callbacks of the server");
  h_finish(ctx);
}

/* Options are loop-wide defaults taken when a socket is set up: the hook below makes the
 * accepted socket use data->server_max whichever way the library reads them. */
struct sizes {
  int server_max;
};

static void accept_with_server_max(h_ctx *ctx, ibmsg_connection_request *request) {
  struct sizes *s = ctx->data;
  int rc = ibmsg_setopt(&ctx->loop, IBMSG_OPT_MAX_MSG_SIZE, &s->server_max, sizeof s->server_max);
  if (rc != IBMSG_OK)
    h_note_error(ctx, "ibmsg_setopt(IBMSG_OPT_MAX_MSG_SIZE) in connection_request failed: %s",
                 ibmsg_err_name(rc));
  h_accept(ctx, request);
}

static void check_negotiated_maximum(h_ctx *ctx, int server_max, int client_max) {
  struct sizes s;
  h_conn *client, *server, *small, *big;
  const size_t want = (size_t)(server_max < client_max ? server_max : client_max);

  s.server_max = server_max;
  ctx->data = &s;
  ctx->on_request = accept_with_server_max;
  h_setopt_int(ctx, IBMSG_OPT_MAX_MSG_SIZE, server_max);
  h_listen(ctx, ctx->addr, 8);
  h_setopt_int(ctx, IBMSG_OPT_MAX_MSG_SIZE, client_max);
  h_pair(ctx, &client, &server);
  H_ASSERT_EQ(ibmsg_socket_max_msg_size(&client->sock), want, "the client's maximum message size");
  H_ASSERT_EQ(ibmsg_socket_max_msg_size(&server->sock), want, "the server's maximum message size");

  /* The side with the larger own maximum must still be held to the smaller one. */
  big = server_max > client_max ? server : client;
  small = big == server ? client : server;
  H_ASSERT_CODE(ibmsg_alloc_msg(&ctx->msgs[0], &big->sock, want + 1), IBMSG_EMSGSIZE);
  small->verify = 1;
  small->expect_size = (long)want;
  h_alloc_fill(big, &ctx->msgs[1], want);
  h_post(big, &ctx->msgs[1]);
  H_RUN_UNTIL(ctx, small->received == 1 && big->sent == 1, H_TIMEOUT_MS);
  H_ASSERT_REASON(big->last_sent_status, IBMSG_OK, "message_sent status of a maximum-size message");
  H_ASSERT_OK(ibmsg_free_msg(&ctx->msgs[1]));
  ctx->on_request = NULL;
  h_finish(ctx);
}

static void maximum_is_the_smaller_when_server_allows_more(void **state) { check_negotiated_maximum(*state, MiB, 4096); }

static void maximum_is_the_smaller_when_client_allows_more(void **state) { check_negotiated_maximum(*state, 4096, MiB); }

/* The client posts from its connection_established callback: the messages may reach the server
 * before its own ESTABLISHED event, and must still come after its connection_established. */
static void post_from_established(h_conn *conn) {
  h_ctx *ctx = conn->ctx;
  int i, rc;
  if (conn != &ctx->clients[0]) return;
  for (i = 0; i < 8; i++) {
    ibmsg_buffer *m = &ctx->msgs[i];
    rc = ibmsg_alloc_msg(m, &conn->sock, 64);
    if (rc == IBMSG_OK) {
      h_fill(m->data, 64, conn->send_seq++);
      rc = h_try_post(conn, m);
    }
    if (rc != IBMSG_OK) h_note_error(ctx, "posting from connection_established: %s", ibmsg_err_name(rc));
  }
}

static void messages_posted_from_connection_established_arrive(void **state) {
  h_ctx *ctx = *state;
  h_conn *client, *server;
  int i;

  ctx->on_established = post_from_established;
  ctx->servers[0].verify = 1; /* set before the server socket exists: h_accept keeps it */
  h_pair(ctx, &client, &server);
  ctx->on_established = NULL;
  H_RUN_UNTIL(ctx, server->received == 8 && client->sent == 8, H_TIMEOUT_MS);
  H_ASSERT_EQ(client->sent_ok, 8, "message_sent(IBMSG_OK) callbacks");
  for (i = 0; i < 8; i++) H_ASSERT_OK(ibmsg_free_msg(&ctx->msgs[i]));
  h_finish(ctx);
}

static void messages_without_received_callback_are_freed_unread(void **state) {
  h_ctx *ctx = *state;
  h_conn *client, *server;

  h_setopt_int(ctx, IBMSG_OPT_RECV_DEPTH, 4);
  h_pair(ctx, &client, &server);
  ctx->loop.message_received = NULL;
  /* 25 times the receive depth: only credits returned by the library itself let this finish. */
  h_stream_start(client, 100, 64, 4);
  H_RUN_UNTIL(ctx, h_stream_done(client), H_TIMEOUT_MS);
  H_ASSERT_EQ(client->sent_ok, 100, "message_sent(IBMSG_OK) callbacks");
  H_ASSERT_EQ(server->received, 0, "message_received callbacks (there is none)");
  H_CHECK(!client->closed && !server->closed, "a connection closed (with %s / %s)",
          ibmsg_err_name(client->close_reason), ibmsg_err_name(server->close_reason));
  h_finish(ctx);
}

/* The server sends every message back from its message_received callback. */
struct echo {
  ibmsg_buffer msgs[64];
  int used[64];
};

static void echo_back(h_conn *conn, ibmsg_buffer *msg) {
  h_ctx *ctx = conn->ctx;
  struct echo *e = ctx->data;
  int i, rc;

  if (conn == &ctx->clients[0]) { /* the client just checks (verify) and frees */
    rc = ibmsg_free_msg(msg);
    if (rc != IBMSG_OK) h_note_error(ctx, "client: ibmsg_free_msg: %s", ibmsg_err_name(rc));
    return;
  }
  for (i = 0; i < 64 && e->used[i]; i++) continue;
  if (i == 64) {
    h_note_error(ctx, "more than 64 echoes outstanding");
  } else if ((rc = ibmsg_alloc_msg(&e->msgs[i], &conn->sock, msg->size)) != IBMSG_OK) {
    h_note_error(ctx, "server: ibmsg_alloc_msg in message_received: %s", ibmsg_err_name(rc));
  } else {
    memcpy(e->msgs[i].data, msg->data, msg->size);
    e->used[i] = 1;
    rc = h_try_post(conn, &e->msgs[i]);
    if (rc != IBMSG_OK) h_note_error(ctx, "server: ibmsg_post_send in message_received: %s", ibmsg_err_name(rc));
  }
  rc = ibmsg_free_msg(msg);
  if (rc != IBMSG_OK) h_note_error(ctx, "server: ibmsg_free_msg: %s", ibmsg_err_name(rc));
}

static void echo_sent(h_conn *conn, ibmsg_buffer *msg, int status) {
  h_ctx *ctx = conn->ctx;
  struct echo *e = ctx->data;
  int i = (int)(msg - e->msgs);
  (void)status;
  if (conn == &ctx->clients[0] || i < 0 || i >= 64) return;
  e->used[i] = 0;
  if (ibmsg_free_msg(msg) != IBMSG_OK) h_note_error(ctx, "server: freeing an echo failed");
}

static void echo_from_message_received_round_trips(void **state) {
  h_ctx *ctx = *state;
  h_conn *client, *server;
  /* On the heap: the library writes to posted messages until their message_sent, even when a
   * failed test has left this function. */
  struct echo *e = calloc(1, sizeof *e);
  const int n = 2000;

  H_CHECK(e != NULL, "out of memory");
  ctx->data = e;
  h_pair(ctx, &client, &server);
  ctx->on_received = echo_back;
  ctx->on_sent = echo_sent;
  client->verify = 1;
  h_stream_start(client, n, 333, 4);
  H_RUN_UNTIL_PROGRESS(ctx, client->received == n && h_stream_done(client) && server->sent == n,
                       120000);
  H_ASSERT_EQ(server->sent_ok, n, "echoes sent");
  ctx->on_received = NULL;
  ctx->on_sent = NULL;
  h_finish(ctx);
  free(e);
}

static void options_set_later_do_not_change_existing_sockets(void **state) {
  h_ctx *ctx = *state;
  h_conn *client, *server;

  size_t max;

  h_pair(ctx, &client, &server);
  max = ibmsg_socket_max_msg_size(&client->sock);
  h_setopt_int(ctx, IBMSG_OPT_MAX_MSG_SIZE, 1024);
  h_setopt_int(ctx, IBMSG_OPT_EAGER_SIZE, 512);
  h_setopt_int(ctx, IBMSG_OPT_SEND_DEPTH, 1);
  H_ASSERT_EQ(ibmsg_socket_max_msg_size(&client->sock), max, "the client's maximum after setopt");
  h_alloc_fill(client, &ctx->msgs[0], 65536);
  h_alloc_fill(client, &ctx->msgs[1], 65536); /* a second buffer: SEND_DEPTH is still 32 here */
  server->verify = 1;
  h_post(client, &ctx->msgs[0]);
  h_post(client, &ctx->msgs[1]);
  H_RUN_UNTIL(ctx, server->received == 2 && client->sent == 2, H_TIMEOUT_MS);
  H_ASSERT_OK(ibmsg_free_msg(&ctx->msgs[0]));
  H_ASSERT_OK(ibmsg_free_msg(&ctx->msgs[1]));
  h_finish(ctx);
}

static void deep_queues_carry_long_streams(void **state) {
  h_ctx *ctx = *state;
  h_conn *client, *server;
  const int n = 20000, depth = 1024;

  h_setopt_int(ctx, IBMSG_OPT_MAX_MSG_SIZE, 1024);
  h_setopt_int(ctx, IBMSG_OPT_RECV_DEPTH, depth);
  h_setopt_int(ctx, IBMSG_OPT_SEND_DEPTH, depth);
  h_setopt_int(ctx, IBMSG_OPT_SEND_QUEUE, depth);
  h_pair(ctx, &client, &server);
  client->verify = server->verify = 1;
  h_stream_start(client, n, 100, depth);
  h_stream_start(server, n, 100, depth);
  H_RUN_UNTIL_PROGRESS(ctx, server->received == n && client->received == n &&
                                h_stream_done(client) && h_stream_done(server),
                       180000);
  H_ASSERT_EQ(client->sent_ok, n, "message_sent(IBMSG_OK) callbacks of the client");
  H_ASSERT_EQ(server->sent_ok, n, "message_sent(IBMSG_OK) callbacks of the server");
  h_finish(ctx);
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      H_TEST(ten_thousand_messages_each_way_arrive_in_order),
      H_TEST(every_size_up_to_the_maximum_arrives_intact),
      H_TEST(message_larger_than_maximum_fails_and_sends_nothing),
      H_TEST(message_larger_than_a_rendezvous_maximum_fails_and_sends_nothing),
      H_TEST(every_post_gets_exactly_one_message_sent),
      H_TEST(one_mib_maximum_message_size_works_end_to_end),
      H_TEST(maximum_is_the_smaller_when_server_allows_more),
      H_TEST(maximum_is_the_smaller_when_client_allows_more),
      H_TEST(messages_posted_from_connection_established_arrive),
      H_TEST(messages_without_received_callback_are_freed_unread),
      H_TEST(echo_from_message_received_round_trips),
      H_TEST(options_set_later_do_not_change_existing_sockets),
      H_TEST(deep_queues_carry_long_streams),
  };
  h_init(argc, argv);
  return cmocka_run_group_tests(tests, NULL, NULL);
}
