/* test_many_connections.c - 64 connections on one loop, all exchanging verified messages. */
#define _POSIX_C_SOURCE 200809L

#include "harness.h"

#define CONNS 64
#define MESSAGES 100
#define MSG_SIZE 1000
#define DEPTH 8

static int connections_closed(h_ctx *ctx) {
  int i, n = 0;
  for (i = 0; i < ctx->n_clients; i++) n += ctx->clients[i].closed;
  for (i = 0; i < ctx->n_servers; i++) n += ctx->servers[i].closed;
  return n;
}

/* Connects CONNS clients at once to one listener, all on ctx's loop, with small buffers. */
static void connect_all(h_ctx *ctx) {
  h_conn *closed;
  int i;

  h_setopt_int(ctx, IBMSG_OPT_MAX_MSG_SIZE, 4096);
  h_setopt_int(ctx, IBMSG_OPT_RECV_DEPTH, DEPTH);
  h_setopt_int(ctx, IBMSG_OPT_SEND_DEPTH, DEPTH);
  h_setopt_int(ctx, IBMSG_OPT_CONNECT_TIMEOUT, 30000);
  h_listen(ctx, ctx->addr, CONNS);
  for (i = 0; i < CONNS; i++) h_connect(ctx, ctx->addr, ctx->port);
  H_RUN_UNTIL_PROGRESS(ctx, h_established_count(ctx) == 2 * CONNS || h_first_closed(ctx) != NULL, 90000);
  closed = h_first_closed(ctx);
  H_CHECK(closed == NULL, "%s closed with %s while %d connections were being set up", closed->name,
          ibmsg_err_name(closed->close_reason), CONNS);
  H_ASSERT_EQ(ctx->n_servers, CONNS, "sockets accepted");
}

static int all_streams_done(h_ctx *ctx) {
  int i;
  for (i = 0; i < CONNS; i++) {
    const h_conn *c = &ctx->clients[i], *s = &ctx->servers[i];
    if (c->received < MESSAGES || s->received < MESSAGES || !h_stream_done(c) || !h_stream_done(s))
      return 0;
  }
  return 1;
}

static void sixty_four_connections_exchange_verified_messages(void **state) {
  h_ctx *ctx = *state;
  h_conn *closed;
  int i;

  connect_all(ctx);
  for (i = 0; i < CONNS; i++) {
    h_conn *c = &ctx->clients[i], *s = &ctx->servers[i];
    c->verify = s->verify = 1;
    c->expect_size = s->expect_size = MSG_SIZE;
    h_stream_start(c, MESSAGES, MSG_SIZE, DEPTH);
    h_stream_start(s, MESSAGES, MSG_SIZE, DEPTH);
  }
  H_RUN_UNTIL_PROGRESS(ctx, all_streams_done(ctx) || h_first_closed(ctx) != NULL, 180000);
  closed = h_first_closed(ctx);
  H_CHECK(closed == NULL, "%s closed with %s during the exchange", closed->name,
          ibmsg_err_name(closed->close_reason));
  for (i = 0; i < CONNS; i++) {
    H_ASSERT_EQ(ctx->clients[i].received, MESSAGES, "messages a client received");
    H_ASSERT_EQ(ctx->servers[i].received, MESSAGES, "messages a server socket received");
    H_ASSERT_EQ(ctx->clients[i].sent_ok, MESSAGES, "message_sent(IBMSG_OK) of a client");
    H_ASSERT_EQ(ctx->servers[i].sent_ok, MESSAGES, "message_sent(IBMSG_OK) of a server socket");
  }
  h_finish(ctx);
  for (i = 0; i < CONNS; i++) {
    H_ASSERT_REASON(ctx->clients[i].close_reason, IBMSG_OK, "close reason of a client");
    H_ASSERT_REASON(ctx->servers[i].close_reason, IBMSG_ECONNRESET, "close reason of a server socket");
  }
}

static void sixty_four_connections_close_from_both_sides(void **state) {
  h_ctx *ctx = *state;
  h_conn *closers[CONNS], *peers[CONNS];
  int i;

  connect_all(ctx);
  for (i = 0; i < CONNS; i++) {
    h_conn *server = h_server_of(ctx, &ctx->clients[i]);
    closers[i] = i % 2 ? server : &ctx->clients[i];
    peers[i] = i % 2 ? &ctx->clients[i] : server;
  }
  for (i = 0; i < CONNS; i++) H_ASSERT_OK(ibmsg_disconnect(&closers[i]->sock));
  H_RUN_UNTIL_PROGRESS(ctx, connections_closed(ctx) == 2 * CONNS, 60000);
  h_run_for(ctx, 300);
  for (i = 0; i < CONNS; i++) {
    H_ASSERT_EQ(closers[i]->closed, 1, "connection_closed callbacks of a disconnecting socket");
    H_ASSERT_EQ(peers[i]->closed, 1, "connection_closed callbacks of its peer");
    H_ASSERT_REASON(closers[i]->close_reason, IBMSG_OK, "close reason of a disconnecting socket");
    H_ASSERT_REASON(peers[i]->close_reason, IBMSG_ECONNRESET, "close reason of its peer");
  }
  h_finish(ctx);
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      H_TEST(sixty_four_connections_exchange_verified_messages),
      H_TEST(sixty_four_connections_close_from_both_sides),
  };
  h_init(argc, argv);
  return cmocka_run_group_tests(tests, NULL, NULL);
}
