/* test_shared_recv.c - receive buffers shared by a device's connections (IBMSG_OPT_SHARED_RECV,
 * protocol 1.3): what a connection costs, credits moving to the connections that have something
 * to send and coming back when they are done, a receiver that holds one peer's messages without
 * stopping the others, and lent messages outliving their connection. The harness disables RNR
 * retries: a message sent without a posted buffer closes its connection, which every test
 * checks does not happen. */
#define _POSIX_C_SOURCE 200809L

#include "harness.h"

#include <string.h>

#define SLOT 16448    /* a shared buffer: the default eager size 16384, its immediate, rounded to 64 */
#define BASE 2        /* data credits a connection always has */
#define CTRL 4        /* control buffers a connection reserves */
#define CAP 32        /* the default IBMSG_OPT_RECV_DEPTH: the most a connection gets */

static void assert_none_closed(h_ctx *ctx) {
  h_conn *c = h_first_closed(ctx);
  H_CHECK(c == NULL, "%s closed with %s", c ? c->name : "", c ? ibmsg_err_name(c->close_reason) : "");
}

static void connect_n(h_ctx *ctx, int n) {
  int i;
  h_setopt_int(ctx, IBMSG_OPT_CONNECT_TIMEOUT, 30000);
  h_listen(ctx, ctx->addr, H_MAX_CONNS);
  for (i = 0; i < n; i++) h_connect(ctx, ctx->addr, ctx->port);
  H_RUN_UNTIL_PROGRESS(ctx, h_established_count(ctx) == 2 * n || h_first_closed(ctx) != NULL, 60000);
  assert_none_closed(ctx);
}

static ibmsg_memory socket_memory(h_conn *c) {
  ibmsg_memory m;
  H_ASSERT_OK(ibmsg_socket_memory(&c->sock, &m));
  return m;
}

/* A connection holds its base and control buffers of the shared ones, no receive buffers of its
 * own; with IBMSG_OPT_SHARED_RECV 0 it has IBMSG_OPT_RECV_DEPTH + 4 of its own. */
static void idle_connections_hold_only_their_base(void **state) {
  h_ctx *ctx = *state;
  ibmsg_memory m, own, loop;
  h_conn *client, *server, *c2, *s2;
  int i;

  connect_n(ctx, 16);
  for (i = 0; i < 16; i++) {
    m = socket_memory(&ctx->servers[i]);
    H_ASSERT_EQ(m.shared, (BASE + CTRL) * SLOT, "a connection's part of the shared buffers");
    H_ASSERT_EQ(m.buffers, 0, "its own buffers (none: send buffers only while it has messages)");
    m = socket_memory(&ctx->clients[i]);
    H_ASSERT_EQ(m.shared, (BASE + CTRL) * SLOT, "a client's part of the shared buffers");
  }
  H_ASSERT_OK(ibmsg_loop_memory(&ctx->loop, &loop));
  /* both sides are on this loop's device: 32 connections, at most one slab of spare */
  H_CHECK(loop.shared >= (size_t)32 * (BASE + CTRL) * SLOT &&
              loop.shared <= (size_t)(32 * (BASE + CTRL) + 8 * CAP + 64) * SLOT,
          "the loop's shared buffers: %zu bytes for 32 connections", loop.shared);
  H_ASSERT_EQ(loop.buffers, 0, "the loop's own buffers (no message allocated yet)");

  /* One side without: buffers of its own, and the pair works. */
  h_setopt_int(ctx, IBMSG_OPT_SHARED_RECV, 0);
  client = h_connect(ctx, ctx->addr, ctx->port);
  H_RUN_UNTIL(ctx, client->established && ctx->n_servers == 17 && ctx->servers[16].established,
              H_TIMEOUT_MS);
  server = &ctx->servers[16];
  own = socket_memory(client);
  H_ASSERT_EQ(own.shared, 0, "shared buffers of a connection without");
  H_ASSERT_EQ(own.buffers, (32 + CTRL) * SLOT, "its own receive buffers");
  c2 = client;
  s2 = server;
  s2->verify = c2->verify = 1;
  s2->expect_size = c2->expect_size = 100;
  h_stream_start(c2, 200, 100, 16);
  h_stream_start(s2, 200, 100, 16);
  H_RUN_UNTIL(ctx, h_stream_done(c2) && h_stream_done(s2) && c2->received == 200 &&
                       s2->received == 200, H_TIMEOUT_MS);
  assert_none_closed(ctx);
  h_finish(ctx);
}

/* The receiver holds every message of one peer: that peer stops once its credits are used,
 * while another peer's stream goes through in full; freed, the held ones were all intact. */
static void held_messages_stop_only_their_sender(void **state) {
  h_ctx *ctx = *state;
  h_conn *a, *b, *sa, *sb;
  int held;

  connect_n(ctx, 2);
  a = &ctx->clients[0];
  b = &ctx->clients[1];
  sa = h_server_of(ctx, a);
  sb = h_server_of(ctx, b);
  sa->hold = sa->verify = sb->verify = 1;
  sa->expect_size = sb->expect_size = 500;
  h_stream_start(a, 100, 500, 32);
  H_RUN_UNTIL(ctx, sa->received >= BASE, H_TIMEOUT_MS);
  h_run_for(ctx, 500);
  held = sa->received;
  /* credits moved to it up to its cap, which counts the buffers its held messages take */
  H_ASSERT_EQ(held, CAP, "messages that arrived while the receiver holds them");
  h_stream_start(b, 300, 500, 32);
  H_RUN_UNTIL(ctx, sb->received == 300 && h_stream_done(b), H_TIMEOUT_MS);
  H_ASSERT_EQ(sa->received, held, "messages of the held peer meanwhile");
  assert_none_closed(ctx);
  sa->hold = 0;
  h_release_held(sa);
  H_RUN_UNTIL(ctx, sa->received == 100 && h_stream_done(a), H_TIMEOUT_MS);
  assert_none_closed(ctx);
  h_finish(ctx);
}

/* A stream gets more than its base while it has more to send, and gives it back when done: the
 * receiver's part of the shared buffers is the base again. */
static void credits_come_back_after_a_burst(void **state) {
  h_ctx *ctx = *state;
  h_conn *client, *server;
  ibmsg_memory m;

  h_pair(ctx, &client, &server);
  server->verify = 1;
  server->expect_size = 1000;
  h_stream_start(client, 2000, 1000, 32);
  H_RUN_UNTIL_PROGRESS(ctx, server->received == 2000 && h_stream_done(client), 30000);
  H_RUN_UNTIL(ctx, socket_memory(server).shared == (BASE + CTRL) * SLOT, H_TIMEOUT_MS);
  m = socket_memory(client);
  H_ASSERT_EQ(m.shared, (BASE + CTRL) * SLOT, "the client's part (it received nothing)");
  assert_none_closed(ctx);
  h_finish(ctx);
}

/* Many connections stream both ways at once, eager and rendezvous sizes: everything arrives,
 * in order, and nothing closes. */
static void many_streams_share_the_buffers(void **state) {
  h_ctx *ctx = *state;
  const int n = 24, total = 150;
  int i, done;

  connect_n(ctx, n);
  for (i = 0; i < n; i++) {
    h_conn *c = &ctx->clients[i], *s = h_server_of(ctx, &ctx->clients[i]);
    size_t size = i % 3 == 0 ? 40000 : i % 3 == 1 ? 16384 : 64;
    c->verify = s->verify = 1;
    c->expect_size = s->expect_size = (long)size;
    h_stream_start(c, total, size, 16);
    h_stream_start(s, total, size, 16);
  }
  for (done = 0; !done;) {
    h_run_for(ctx, 50);
    assert_none_closed(ctx);
    done = 1;
    for (i = 0; i < n; i++) {
      h_conn *c = &ctx->clients[i], *s = &ctx->servers[i];
      if (c->received < total || s->received < total || !h_stream_done(c) || !h_stream_done(s))
        done = 0;
    }
  }
  h_finish(ctx);
}

/* Messages the application holds when the connection closes are freed afterwards; the loop can
 * then go (nothing of the shared buffers is left lent). */
static void lent_messages_outlive_their_connection(void **state) {
  h_ctx *ctx = *state;
  h_conn *client, *server;

  h_pair(ctx, &client, &server);
  h_send_to_holder(client, server, 3, 200);
  h_free_lent_after_close(client, server, 3);
  h_finish(ctx); /* destroying the loop succeeds */
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      H_TEST(idle_connections_hold_only_their_base),
      H_TEST(held_messages_stop_only_their_sender),
      H_TEST(credits_come_back_after_a_burst),
      H_TEST(many_streams_share_the_buffers),
      H_TEST(lent_messages_outlive_their_connection),
  };
  h_init(argc, argv);
  return cmocka_run_group_tests(tests, NULL, NULL);
}
