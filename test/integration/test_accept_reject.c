/* test_accept_reject.c - accepting and rejecting connection requests, and max_connections. */
#define _POSIX_C_SOURCE 200809L

#include "harness.h"

#include <string.h>

/* Connects one more client to the listener and waits until it is established or closed. */
static h_conn *connect_and_settle(h_ctx *ctx) {
  h_conn *c = h_connect(ctx, ctx->addr, ctx->port);
  H_RUN_UNTIL(ctx, c->established || c->closed, H_TIMEOUT_MS);
  return c;
}

static void assert_rejected(h_conn *c, const char *why) {
  H_CHECK(c->established == 0, "%s: the client got connection_established, expected a rejection",
          why);
  H_ASSERT_EQ(c->closed, 1, "connection_closed callbacks of the rejected client");
  H_ASSERT_REASON(c->close_reason, IBMSG_EREJECTED, "the rejected client's close reason");
  H_ASSERT_REASON(c->sock.close_reason, IBMSG_EREJECTED, "the rejected client's close_reason field");
  H_ASSERT_STATUS(c->close_status, IBMSG_ERROR, "the rejected client's status in connection_closed");
  H_ASSERT_STATUS(c->sock.status, IBMSG_ERROR, "the rejected client's status");
}

static void accept_establishes_both_sides_exactly_once(void **state) {
  h_ctx *ctx = *state;
  h_conn *client, *server;

  h_pair(ctx, &client, &server);
  h_run_for(ctx, 300); /* a second connection_established would show up here */
  H_ASSERT_EQ(client->established, 1, "connection_established callbacks of the client");
  H_ASSERT_EQ(server->established, 1, "connection_established callbacks of the accepted socket");
  H_ASSERT_EQ(ctx->listener.established, 0, "connection_established callbacks of the listener");
  H_ASSERT_EQ(ctx->requests, 1, "connection_request callbacks");
  H_ASSERT_STATUS(ctx->listener.sock.status, IBMSG_LISTENING, "listener status");
  H_ASSERT_REASON(client->sock.close_reason, IBMSG_OK, "close_reason of a connected client");
  H_CHECK(client->sock.loop == &ctx->loop, "client->loop does not point at the loop");
  H_CHECK(server->sock.loop == &ctx->loop, "the accepted socket's loop does not point at the loop");
  h_finish(ctx);
}

static void request_describes_peer_and_listener(void **state) {
  h_ctx *ctx = *state;
  h_conn *client, *server;
  char addr[64];
  unsigned short port = 0;

  h_pair(ctx, &client, &server);
  H_CHECK(strcmp(ctx->request_peer, ctx->addr) == 0, "request->peer_address is \"%s\", expected \"%s\"",
          ctx->request_peer, ctx->addr);
  H_ASSERT_OK(ibmsg_socket_local_address(&client->sock, addr, sizeof addr, &port));
  H_ASSERT_EQ(ctx->request_peer_port, port, "request->peer_port (the client's local port)");
  h_finish(ctx);
}

static void explicit_reject_closes_client_with_reason(void **state) {
  h_ctx *ctx = *state;
  h_conn *c;

  ctx->decision = H_REJECT;
  ctx->reject_reason = "go away";
  h_listen(ctx, ctx->addr, 8);
  c = connect_and_settle(ctx);
  assert_rejected(c, "ibmsg_reject");
  H_CHECK(strcmp(c->sock.reject_reason, "go away") == 0,
          "reject_reason is \"%.132s\", expected \"go away\"", c->sock.reject_reason);
  H_ASSERT_EQ(ctx->requests, 1, "connection_request callbacks");
  H_ASSERT_EQ(ctx->n_servers, 0, "sockets accepted");
  h_run_for(ctx, 300);
  H_ASSERT_EQ(c->closed, 1, "connection_closed callbacks of the rejected client");
  h_finish(ctx);
}

static void reject_without_reason_gives_empty_text(void **state) {
  h_ctx *ctx = *state;
  h_conn *c;

  ctx->decision = H_REJECT;
  ctx->reject_reason = NULL;
  h_listen(ctx, ctx->addr, 8);
  c = connect_and_settle(ctx);
  assert_rejected(c, "ibmsg_reject(NULL reason)");
  H_CHECK(c->sock.reject_reason[0] == '\0', "reject_reason is \"%.132s\", expected \"\"",
          c->sock.reject_reason);
  h_finish(ctx);
}

static void reject_reason_of_128_bytes_arrives_whole(void **state) {
  h_ctx *ctx = *state;
  h_conn *c;
  char reason[129];

  memset(reason, 'r', 128);
  reason[0] = '<';
  reason[127] = '>';
  reason[128] = '\0';
  ctx->decision = H_REJECT;
  ctx->reject_reason = reason;
  h_listen(ctx, ctx->addr, 8);
  c = connect_and_settle(ctx);
  assert_rejected(c, "ibmsg_reject(128-byte reason)");
  H_CHECK(strcmp(c->sock.reject_reason, reason) == 0,
          "reject_reason is \"%.132s\" (%zu bytes), expected the 128 bytes given", c->sock.reject_reason,
          strnlen(c->sock.reject_reason, sizeof c->sock.reject_reason));
  h_finish(ctx);
}

static void undecided_request_is_rejected(void **state) {
  h_ctx *ctx = *state;
  h_conn *c;

  ctx->decision = H_UNDECIDED;
  h_listen(ctx, ctx->addr, 8);
  c = connect_and_settle(ctx);
  assert_rejected(c, "a request left undecided");
  H_ASSERT_EQ(ctx->requests, 1, "connection_request callbacks");
  H_ASSERT_EQ(ctx->n_servers, 0, "sockets accepted");
  h_finish(ctx);
}

static void no_request_callback_rejects(void **state) {
  h_ctx *ctx = *state;
  h_conn *c;

  ctx->loop.connection_request = NULL;
  h_listen(ctx, ctx->addr, 8);
  c = connect_and_settle(ctx);
  assert_rejected(c, "no connection_request callback");
  H_ASSERT_EQ(ctx->requests, 0, "connection_request callbacks");
  h_finish(ctx);
}

static void listener_enforces_max_connections(void **state) {
  h_ctx *ctx = *state;
  h_conn *a, *b, *third;

  h_listen(ctx, ctx->addr, 2);
  h_pair(ctx, &a, NULL);
  h_pair(ctx, &b, NULL);
  third = connect_and_settle(ctx);
  assert_rejected(third, "a third connection on a listener with max_connections 2");
  H_ASSERT_EQ(ctx->n_servers, 2, "sockets accepted");
  H_ASSERT_STATUS(a->sock.status, IBMSG_CONNECTED, "first client status");
  H_ASSERT_STATUS(b->sock.status, IBMSG_CONNECTED, "second client status");
  h_finish(ctx);
}

static void max_connections_slot_is_free_again_after_close(void **state) {
  h_ctx *ctx = *state;
  h_conn *first, *server, *second, *third;

  h_listen(ctx, ctx->addr, 1);
  h_pair(ctx, &first, &server);
  second = connect_and_settle(ctx);
  assert_rejected(second, "a second connection on a listener with max_connections 1");

  H_ASSERT_OK(ibmsg_disconnect(&first->sock));
  H_RUN_UNTIL(ctx, first->closed && server->closed, H_TIMEOUT_MS);
  third = connect_and_settle(ctx);
  H_CHECK(third->established == 1 && !third->closed,
          "a connection after the only open one closed was not accepted (closed with %s)",
          ibmsg_err_name(third->close_reason));
  h_finish(ctx);
}

/* An option set with IBMSG_OPT_MAX_MSG_SIZE = size (freed by the test). */
static ibmsg_options *max_size_opts(h_ctx *ctx, int size) {
  ibmsg_options *o = ibmsg_options_new(&ctx->loop);
  H_CHECK(o != NULL, "ibmsg_options_new returned NULL");
  H_ASSERT_OK(ibmsg_options_set(o, IBMSG_OPT_MAX_MSG_SIZE, &size, sizeof size));
  return o;
}

static void listener_options_apply_to_its_accepted_connections(void **state) {
  h_ctx *ctx = *state;
  h_conn *client, *server;
  ibmsg_buffer msg;

  ctx->listen_opts = max_size_opts(ctx, 1000);
  h_listen(ctx, ctx->addr, 4);
  ibmsg_options_free(ctx->listen_opts); /* the listener keeps its own copy */
  ctx->listen_opts = NULL;
  h_pair(ctx, &client, &server);
  H_ASSERT_EQ(ibmsg_socket_max_msg_size(&server->sock), 1000, "max size of the accepted socket");
  H_ASSERT_EQ(ibmsg_socket_max_msg_size(&client->sock), 1000,
              "max size of the client (the smaller of both sides)");
  H_ASSERT_CODE(ibmsg_alloc_msg(&msg, &client->sock, 1001), IBMSG_EMSGSIZE);
  h_finish(ctx);
}

static void accept_options_override_the_listener_options(void **state) {
  h_ctx *ctx = *state;
  h_conn *client, *server;

  ctx->listen_opts = max_size_opts(ctx, 1000);
  ctx->accept_opts = max_size_opts(ctx, 500);
  h_pair(ctx, &client, &server);
  H_ASSERT_EQ(ibmsg_socket_max_msg_size(&server->sock), 500, "max size of the accepted socket");
  H_ASSERT_EQ(ibmsg_socket_max_msg_size(&client->sock), 500, "max size of the client");
  ibmsg_options_free(ctx->listen_opts);
  ibmsg_options_free(ctx->accept_opts);
  ctx->listen_opts = ctx->accept_opts = NULL;
  h_finish(ctx);
}

static void connect_options_apply_to_that_connection_only(void **state) {
  h_ctx *ctx = *state;
  h_conn *small, *plain, *server;

  ctx->connect_opts = max_size_opts(ctx, 300);
  h_pair(ctx, &small, &server);
  ibmsg_options_free(ctx->connect_opts);
  ctx->connect_opts = NULL;
  H_ASSERT_EQ(ibmsg_socket_max_msg_size(&small->sock), 300, "max size of the client with options");
  H_ASSERT_EQ(ibmsg_socket_max_msg_size(&server->sock), 300, "max size of its accepted socket");
  h_pair(ctx, &plain, &server);
  H_ASSERT_EQ(ibmsg_socket_max_msg_size(&plain->sock), 0xffffffffu,
              "max size of a client without options (the default, 2^32 - 1)");
  h_finish(ctx);
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      H_TEST(accept_establishes_both_sides_exactly_once),
      H_TEST(request_describes_peer_and_listener),
      H_TEST(explicit_reject_closes_client_with_reason),
      H_TEST(reject_without_reason_gives_empty_text),
      H_TEST(reject_reason_of_128_bytes_arrives_whole),
      H_TEST(undecided_request_is_rejected),
      H_TEST(no_request_callback_rejects),
      H_TEST(listener_enforces_max_connections),
      H_TEST(max_connections_slot_is_free_again_after_close),
      H_TEST(listener_options_apply_to_its_accepted_connections),
      H_TEST(accept_options_override_the_listener_options),
      H_TEST(connect_options_apply_to_that_connection_only),
  };
  h_init(argc, argv);
  return cmocka_run_group_tests(tests, NULL, NULL);
}
