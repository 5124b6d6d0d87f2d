/* test_disconnect.c - closing connections and listeners: every posted message is accounted for,
 * connection_closed fires exactly once per socket with the documented reason and status, and
 * the loop can be destroyed only once everything is closed. */
#define _POSIX_C_SOURCE 200809L

#include "harness.h"

#include <string.h>

#define RECV_DEPTH 4
#define SEND_QUEUE 8
#define SEND_DEPTH 16
#define MSG_SIZE 200
#define POSTED (RECV_DEPTH + SEND_QUEUE) /* some in flight or delivered, the rest queued */

static void small_pair(h_ctx *ctx, h_conn **client, h_conn **server) {
  /* Buffers of its own: RECV_DEPTH credits from the start, so that POSTED fit */
  h_setopt_own_credits(ctx, RECV_DEPTH, SEND_QUEUE, SEND_DEPTH);
  h_pair(ctx, client, server);
}

/* `closer` disconnects while POSTED of its messages are in flight or queued (its peer holds
 * what arrives, so the queue cannot drain); checks the whole close. */
static void disconnect_with_messages_pending(h_ctx *ctx, h_conn *closer, h_conn *peer) {
  int i;

  peer->hold = 1;
  peer->verify = 1;
  closer->expect_send_errors = 1;
  h_post_msgs(closer, 0, POSTED, MSG_SIZE);
  H_ASSERT_OK(ibmsg_disconnect(&closer->sock));
  H_ASSERT_STATUS(closer->sock.status, IBMSG_DISCONNECTING, "status right after ibmsg_disconnect");
  H_RUN_UNTIL(ctx, closer->closed && peer->closed, H_TIMEOUT_MS);
  h_run_for(ctx, 300); /* a second connection_closed or a late message_sent would show up here */

  H_ASSERT_EQ(closer->sent, POSTED, "message_sent callbacks of the disconnecting side");
  H_ASSERT_EQ(closer->sent_ok + closer->sent_canceled, POSTED,
              "message_sent callbacks with IBMSG_OK or IBMSG_ECANCELED");
  H_ASSERT_EQ(closer->sent_at_close, POSTED, "message_sent callbacks before connection_closed");
  for (i = 0; i < POSTED; i++)
    H_ASSERT_EQ(ctx->outstanding[i], 0, "a posted message without exactly one message_sent");
  H_CHECK(peer->received <= RECV_DEPTH, "the peer received %d messages without freeing any; it has "
          "only %d buffers", peer->received, RECV_DEPTH);

  H_ASSERT_EQ(closer->closed, 1, "connection_closed callbacks of the disconnecting side");
  H_ASSERT_EQ(peer->closed, 1, "connection_closed callbacks of the peer");
  H_ASSERT_REASON(closer->close_reason, IBMSG_OK, "close reason of the side that disconnected");
  H_ASSERT_REASON(peer->close_reason, IBMSG_ECONNRESET, "close reason of the peer");
  H_ASSERT_STATUS(closer->close_status, IBMSG_UNCONNECTED, "status of the disconnecting side when closed");
  H_ASSERT_STATUS(peer->close_status, IBMSG_UNCONNECTED, "status of the peer when closed");
  H_ASSERT_STATUS(closer->sock.status, IBMSG_UNCONNECTED, "status of the disconnecting side after close");
  H_ASSERT_STATUS(peer->sock.status, IBMSG_UNCONNECTED, "status of the peer after close");

  /* Sent or canceled, each message is the sender's again; what the peer holds is still lent. */
  for (i = 0; i < POSTED; i++) H_ASSERT_OK(ibmsg_free_msg(&ctx->msgs[i]));
  h_release_held(peer);
}

/* disconnect_with_messages_pending() on a fresh pair, the server or else the client closing. */
static void pair_and_disconnect_with_messages_pending(h_ctx *ctx, int server_closes) {
  h_conn *client, *server;
  small_pair(ctx, &client, &server);
  if (server_closes) disconnect_with_messages_pending(ctx, server, client);
  else disconnect_with_messages_pending(ctx, client, server);
  h_finish(ctx);
}

static void client_disconnect_accounts_for_every_posted_message(void **state) { pair_and_disconnect_with_messages_pending(*state, 0); }

static void server_disconnect_accounts_for_every_posted_message(void **state) { pair_and_disconnect_with_messages_pending(*state, 1); }

static void disconnect_during_streams_accounts_for_every_message(void **state) {
  h_ctx *ctx = *state;
  h_conn *client, *server;

  small_pair(ctx, &client, &server);
  client->expect_send_errors = server->expect_send_errors = 1;
  client->verify = server->verify = 1;
  h_stream_start(client, 100000, MSG_SIZE, SEND_QUEUE);
  h_stream_start(server, 100000, MSG_SIZE, SEND_QUEUE);
  H_RUN_UNTIL_PROGRESS(ctx, client->received >= 300 && server->received >= 300, 60000);
  H_ASSERT_OK(ibmsg_disconnect(&server->sock));
  H_RUN_UNTIL(ctx, client->closed && server->closed, H_TIMEOUT_MS);
  h_run_for(ctx, 300);
  H_ASSERT_EQ(client->sent, client->posted, "the client's message_sent callbacks vs. its posts");
  H_ASSERT_EQ(server->sent, server->posted, "the server's message_sent callbacks vs. its posts");
  H_ASSERT_EQ(client->sent_other + server->sent_other, 0,
              "message_sent callbacks with a status other than IBMSG_OK or IBMSG_ECANCELED");
  H_ASSERT_EQ(client->stream_inflight + server->stream_inflight, 0, "stream messages never sent back");
  H_ASSERT_REASON(server->close_reason, IBMSG_OK, "close reason of the side that disconnected");
  H_ASSERT_REASON(client->close_reason, IBMSG_ECONNRESET, "close reason of the peer");
  h_finish(ctx);
}

static void post_and_alloc_after_close_return_enotconn(void **state) {
  h_ctx *ctx = *state;
  h_conn *client, *server;
  ibmsg_buffer *kept = &ctx->msgs[0], *late = &ctx->msgs[1];

  small_pair(ctx, &client, &server);
  h_alloc_fill(client, kept, MSG_SIZE);
  H_ASSERT_OK(ibmsg_disconnect(&client->sock));
  H_RUN_UNTIL(ctx, client->closed && server->closed, H_TIMEOUT_MS);

  H_ASSERT_CODE(ibmsg_post_send(&client->sock, kept), IBMSG_ENOTCONN);
  H_ASSERT_CODE(ibmsg_alloc_msg(late, &client->sock, MSG_SIZE), IBMSG_ENOTCONN);
  H_ASSERT_CODE(ibmsg_alloc_msg(late, &server->sock, MSG_SIZE), IBMSG_ENOTCONN);
  h_run_for(ctx, 200);
  H_ASSERT_EQ(client->sent, 0, "message_sent callbacks for a post that failed");
  H_ASSERT_OK(ibmsg_free_msg(kept));
  h_finish(ctx);
}

static void received_messages_can_be_freed_after_close(void **state) {
  h_ctx *ctx = *state;
  h_conn *client, *server;

  small_pair(ctx, &client, &server);
  h_send_to_holder(client, server, 3, MSG_SIZE);
  h_free_lent_after_close(client, server, 3);
  h_finish(ctx); /* destroying the loop succeeds: nothing is still lent */
}

static void disconnect_twice_returns_estate(void **state) {
  h_ctx *ctx = *state;
  h_conn *client, *server;

  small_pair(ctx, &client, &server);
  H_ASSERT_OK(ibmsg_disconnect(&client->sock));
  H_ASSERT_CODE(ibmsg_disconnect(&client->sock), IBMSG_ESTATE);
  H_RUN_UNTIL(ctx, client->closed && server->closed, H_TIMEOUT_MS);
  h_run_for(ctx, 300);
  H_ASSERT_EQ(client->closed, 1, "connection_closed callbacks after two ibmsg_disconnect calls");
  H_ASSERT_REASON(client->close_reason, IBMSG_OK, "close reason");
  h_finish(ctx);
}

static void disconnect_after_peer_disconnected_closes_once(void **state) {
  h_ctx *ctx = *state;
  h_conn *client, *server;
  int rc;

  small_pair(ctx, &client, &server);
  H_ASSERT_OK(ibmsg_disconnect(&client->sock));
  /* Both sides closing at the same time: the server may or may not have seen the peer yet. */
  rc = ibmsg_disconnect(&server->sock);
  H_CHECK(rc == IBMSG_OK || rc == IBMSG_ESTATE, "ibmsg_disconnect of the server returned %s",
          ibmsg_err_name(rc));
  H_RUN_UNTIL(ctx, client->closed && server->closed, H_TIMEOUT_MS);
  h_run_for(ctx, 300);
  H_ASSERT_EQ(client->closed, 1, "connection_closed callbacks of the client");
  H_ASSERT_EQ(server->closed, 1, "connection_closed callbacks of the server");
  H_CHECK(server->close_reason == IBMSG_OK || server->close_reason == IBMSG_ECONNRESET,
          "server close reason is %s, expected IBMSG_OK or IBMSG_ECONNRESET",
          ibmsg_err_name(server->close_reason));
  h_finish(ctx);
}

static void listener_close_gives_connection_closed(void **state) {
  h_ctx *ctx = *state;
  h_conn *l = &ctx->listener;

  h_listen(ctx, ctx->addr, 4);
  H_ASSERT_OK(ibmsg_disconnect(&l->sock));
  H_RUN_UNTIL(ctx, l->closed, H_TIMEOUT_MS);
  h_run_for(ctx, 200);
  H_ASSERT_EQ(l->closed, 1, "connection_closed callbacks of the listener");
  H_ASSERT_REASON(l->close_reason, IBMSG_OK, "the listener's close reason");
  H_ASSERT_STATUS(l->sock.status, IBMSG_UNCONNECTED, "the listener's status after close");
  h_finish(ctx);
}

static void closed_listener_refuses_new_connections(void **state) {
  h_ctx *ctx = *state;
  h_conn *c;

  h_listen(ctx, ctx->addr, 4);
  H_ASSERT_OK(ibmsg_disconnect(&ctx->listener.sock));
  H_RUN_UNTIL(ctx, ctx->listener.closed, H_TIMEOUT_MS);
  c = h_connect(ctx, ctx->addr, ctx->port);
  H_RUN_UNTIL(ctx, c->closed || c->established, H_TIMEOUT_MS);
  H_CHECK(!c->established, "a client connected to a listener that was closed");
  H_ASSERT_EQ(ctx->requests, 0, "connection_request callbacks after the listener closed");
  h_finish(ctx);
}

static void destroy_loop_returns_ebusy_until_everything_is_closed(void **state) {
  h_ctx *ctx = *state;
  h_conn *client, *server;
  ibmsg_buffer *m = &ctx->msgs[0];

  small_pair(ctx, &client, &server);
  H_ASSERT_CODE(ibmsg_destroy_event_loop(&ctx->loop), IBMSG_EBUSY);
  h_alloc_fill(client, m, MSG_SIZE);
  H_ASSERT_OK(ibmsg_disconnect(&client->sock));
  H_RUN_UNTIL(ctx, client->closed && server->closed, H_TIMEOUT_MS);
  H_ASSERT_CODE(ibmsg_destroy_event_loop(&ctx->loop), IBMSG_EBUSY); /* the listener is open */
  H_ASSERT_OK(ibmsg_disconnect(&ctx->listener.sock));
  H_RUN_UNTIL(ctx, ctx->listener.closed, H_TIMEOUT_MS);
  H_ASSERT_CODE(ibmsg_destroy_event_loop(&ctx->loop), IBMSG_EBUSY); /* m is still allocated */
  H_ASSERT_OK(ibmsg_free_msg(m));
  h_finish(ctx); /* destroys the loop, asserting IBMSG_OK */
}

static void closed_socket_struct_can_be_reused_for_a_new_connection(void **state) {
  h_ctx *ctx = *state;
  h_conn *client, *server, *server2;
  int n;

  small_pair(ctx, &client, &server);
  H_ASSERT_OK(ibmsg_disconnect(&client->sock));
  H_RUN_UNTIL(ctx, client->closed && server->closed, H_TIMEOUT_MS);

  n = ctx->n_servers;
  h_conn_reset(client, ctx, "client 0 (reused)");
  H_ASSERT_OK(ibmsg_connect(&ctx->loop, &client->sock, ctx->addr, ctx->port));
  client->sock.user_data = client;
  client->active = 1;
  H_RUN_UNTIL(ctx, client->established || client->closed, H_TIMEOUT_MS);
  H_CHECK(client->established, "a reused socket struct did not connect (closed with %s)",
          ibmsg_err_name(client->close_reason));
  H_ASSERT_EQ(ctx->n_servers, n + 1, "sockets accepted for the reused client");
  server2 = &ctx->servers[n];
  H_RUN_UNTIL(ctx, server2->established, H_TIMEOUT_MS);
  server2->verify = 1;
  h_stream_start(client, 50, MSG_SIZE, 4);
  H_RUN_UNTIL(ctx, server2->received == 50 && h_stream_done(client), H_TIMEOUT_MS);
  h_finish(ctx);
}

/* After connection_closed returns the library must never touch the socket: poison the struct in
 * the callback and check later that every byte is still the poison. */
static void poison(h_conn *conn, int reason) {
  (void)reason;
  memset(&conn->sock, 0xa5, sizeof conn->sock);
}

static int poisoned(const ibmsg_socket *s) {
  const unsigned char *p = (const unsigned char *)s;
  size_t i;
  for (i = 0; i < sizeof *s; i++)
    if (p[i] != 0xa5) return 0;
  return 1;
}

static void closed_socket_is_never_touched_after_its_callback(void **state) {
  h_ctx *ctx = *state;
  h_conn *client, *server;

  small_pair(ctx, &client, &server);
  server->hold = 1;
  h_stream_start(client, 8, MSG_SIZE, 4);
  H_RUN_UNTIL(ctx, server->received == RECV_DEPTH, H_TIMEOUT_MS);
  client->expect_send_errors = 1;
  ctx->on_closed = poison;
  H_ASSERT_OK(ibmsg_disconnect(&client->sock));
  H_RUN_UNTIL(ctx, client->closed && server->closed, H_TIMEOUT_MS);
  h_release_held(server); /* lent messages of a closed connection go back to their pool */
  h_run_for(ctx, 500);
  H_CHECK(poisoned(&client->sock), "the library wrote to the client's socket after connection_closed");
  H_CHECK(poisoned(&server->sock), "the library wrote to the server's socket after connection_closed");
  ctx->on_closed = NULL;
  h_finish(ctx);
}

/* --- closing from inside callbacks --------------------------------------------------------- */

static void disconnect_on_tenth_message(h_conn *conn, ibmsg_buffer *msg) {
  int rc;
  if (conn->received == 10) {
    rc = ibmsg_disconnect(&conn->sock);
    if (rc != IBMSG_OK) h_note_error(conn->ctx, "ibmsg_disconnect in message_received: %s", ibmsg_err_name(rc));
  }
  rc = ibmsg_free_msg(msg);
  if (rc != IBMSG_OK) h_note_error(conn->ctx, "ibmsg_free_msg: %s", ibmsg_err_name(rc));
}

static void disconnect_on_tenth_sent(h_conn *conn, ibmsg_buffer *msg, int status) {
  int rc;
  (void)msg;
  (void)status;
  if (conn == &conn->ctx->clients[0] && conn->sent == 10) {
    rc = ibmsg_disconnect(&conn->sock);
    if (rc != IBMSG_OK) h_note_error(conn->ctx, "ibmsg_disconnect in message_sent: %s", ibmsg_err_name(rc));
  }
}

/* The server (from message_received) or the client (from message_sent) disconnects on the tenth
 * message of a stream from the client; checks both close reasons and the client's accounting. */
static void disconnect_from_callback(h_ctx *ctx, int from_sent) {
  h_conn *client, *server, *closer, *peer;

  small_pair(ctx, &client, &server);
  closer = from_sent ? client : server;
  peer = from_sent ? server : client;
  client->expect_send_errors = 1;
  server->verify = 1;
  if (from_sent) ctx->on_sent = disconnect_on_tenth_sent;
  else ctx->on_received = disconnect_on_tenth_message;
  h_stream_start(client, 1000, MSG_SIZE, SEND_QUEUE);
  H_RUN_UNTIL(ctx, client->closed && server->closed, H_TIMEOUT_MS);
  h_run_for(ctx, 300);
  ctx->on_received = NULL;
  ctx->on_sent = NULL;
  H_ASSERT_REASON(closer->close_reason, IBMSG_OK, "close reason of the side that disconnected");
  H_ASSERT_REASON(peer->close_reason, IBMSG_ECONNRESET, "close reason of the peer");
  H_ASSERT_EQ(client->sent, client->posted, "the client's message_sent callbacks vs. its posts");
  h_finish(ctx);
}

static void disconnect_from_message_received_callback(void **state) { disconnect_from_callback(*state, 0); }

static void disconnect_from_message_sent_callback(void **state) { disconnect_from_callback(*state, 1); }

static void disconnect_when_established(h_conn *conn) {
  int rc;
  if (conn != &conn->ctx->servers[0]) return;
  rc = ibmsg_disconnect(&conn->sock);
  if (rc != IBMSG_OK) h_note_error(conn->ctx, "ibmsg_disconnect in connection_established: %s", ibmsg_err_name(rc));
}

static void disconnect_from_connection_established_callback(void **state) {
  h_ctx *ctx = *state;
  h_conn *client, *server = &ctx->servers[0];

  ctx->on_established = disconnect_when_established;
  h_listen(ctx, ctx->addr, 4);
  client = h_connect(ctx, ctx->addr, ctx->port);
  H_RUN_UNTIL(ctx, client->closed && server->closed, H_TIMEOUT_MS);
  h_run_for(ctx, 300);
  ctx->on_established = NULL;
  H_ASSERT_EQ(server->established, 1, "connection_established callbacks of the server");
  H_ASSERT_EQ(server->closed, 1, "connection_closed callbacks of the server");
  H_ASSERT_EQ(client->closed, 1, "connection_closed callbacks of the client");
  H_ASSERT_REASON(server->close_reason, IBMSG_OK, "close reason of the side that disconnected");
  if (client->established)
    H_ASSERT_REASON(client->close_reason, IBMSG_ECONNRESET, "close reason of the established client");
  else
    H_CHECK(client->close_reason != IBMSG_OK, "a client that never connected closed with IBMSG_OK");
  h_finish(ctx);
}

static void accept_then_disconnect(h_ctx *ctx, ibmsg_connection_request *request) {
  int rc;
  if (h_accept(ctx, request) != IBMSG_OK) return;
  rc = ibmsg_disconnect(&ctx->servers[ctx->n_servers - 1].sock);
  if (rc != IBMSG_OK) h_note_error(ctx, "ibmsg_disconnect right after ibmsg_accept: %s", ibmsg_err_name(rc));
}

static void server_disconnect_before_established_closes_both_sides(void **state) {
  h_ctx *ctx = *state;
  h_conn *client, *server = &ctx->servers[0];
  uint64_t start;

  h_setopt_int(ctx, IBMSG_OPT_CONNECT_TIMEOUT, 10000);
  ctx->on_request = accept_then_disconnect;
  h_listen(ctx, ctx->addr, 4);
  start = h_now_ms();
  client = h_connect(ctx, ctx->addr, ctx->port);
  H_RUN_UNTIL(ctx, client->closed && server->closed, H_TIMEOUT_MS);
  h_run_for(ctx, 300);
  ctx->on_request = NULL;
  print_message("client closed after %llu ms with %s (established: %d); server with %s\n",
                (unsigned long long)(client->closed_at_ms - start), ibmsg_err_name(client->close_reason),
                client->established, ibmsg_err_name(server->close_reason));
  H_ASSERT_EQ(server->closed, 1, "connection_closed callbacks of the server");
  H_ASSERT_EQ(client->closed, 1, "connection_closed callbacks of the client");
  H_ASSERT_EQ(server->established, 0, "connection_established callbacks of the server");
  H_CHECK(server->close_reason == IBMSG_OK || server->close_reason == IBMSG_ECANCELED,
          "server close reason is %s, expected IBMSG_OK or IBMSG_ECANCELED", ibmsg_err_name(server->close_reason));
  H_CHECK(client->closed_at_ms - start < 5000, "the client needed %llu ms to learn the server gave up",
          (unsigned long long)(client->closed_at_ms - start));
  h_finish(ctx);
}

static void reconnect(h_conn *conn, int reason) {
  h_ctx *ctx = conn->ctx;
  int rc;
  (void)reason;
  if (conn != &ctx->clients[0] || ctx->data) return;
  ctx->data = conn; /* only once */
  h_conn_reset(conn, ctx, "client 0 (reconnected)");
  rc = ibmsg_connect(&ctx->loop, &conn->sock, ctx->addr, ctx->port);
  if (rc != IBMSG_OK) {
    h_note_error(ctx, "ibmsg_connect from connection_closed failed: %s", ibmsg_err_name(rc));
    return;
  }
  conn->sock.user_data = conn;
  conn->active = 1;
}

static void reconnect_from_connection_closed_callback(void **state) {
  h_ctx *ctx = *state;
  h_conn *client, *server;

  small_pair(ctx, &client, &server);
  ctx->on_closed = reconnect;
  H_ASSERT_OK(ibmsg_disconnect(&client->sock));
  H_RUN_UNTIL(ctx, ctx->data && client->established && ctx->n_servers == 2 &&
                       ctx->servers[1].established,
              H_TIMEOUT_MS);
  ctx->on_closed = NULL;
  H_RUN_UNTIL(ctx, server->closed, H_TIMEOUT_MS);
  ctx->servers[1].verify = 1;
  h_stream_start(client, 50, MSG_SIZE, 4);
  H_RUN_UNTIL(ctx, ctx->servers[1].received == 50 && h_stream_done(client), H_TIMEOUT_MS);
  h_finish(ctx);
}

/* --- lent messages and the end of a connection --------------------------------------------- */

static void freeing_lent_messages_after_disconnect_keeps_reason_ok(void **state) {
  h_ctx *ctx = *state;
  h_conn *client, *server;
  int i;

  small_pair(ctx, &client, &server);
  h_send_to_holder(client, server, 3, MSG_SIZE);
  H_ASSERT_OK(ibmsg_disconnect(&server->sock));
  h_release_held(server); /* before the loop ran: the connection is closing, not closed */
  H_RUN_UNTIL(ctx, client->closed && server->closed, H_TIMEOUT_MS);
  H_ASSERT_REASON(server->close_reason, IBMSG_OK, "close reason of the side that disconnected");
  H_ASSERT_REASON(client->close_reason, IBMSG_ECONNRESET, "close reason of the peer");
  for (i = 0; i < 3; i++) H_ASSERT_OK(ibmsg_free_msg(&ctx->msgs[i]));
  h_finish(ctx);
}

static void destroy_loop_returns_ebusy_while_a_received_message_is_lent(void **state) {
  h_ctx *ctx = *state;
  h_conn *client, *server;

  small_pair(ctx, &client, &server);
  server->hold = 1;
  h_alloc_fill(client, &ctx->msgs[0], MSG_SIZE);
  h_post(client, &ctx->msgs[0]);
  H_RUN_UNTIL(ctx, server->received == 1 && client->sent == 1, H_TIMEOUT_MS);
  H_ASSERT_OK(ibmsg_free_msg(&ctx->msgs[0]));
  H_ASSERT_OK(ibmsg_disconnect(&client->sock));
  H_RUN_UNTIL(ctx, client->closed && server->closed, H_TIMEOUT_MS);
  H_ASSERT_OK(ibmsg_disconnect(&ctx->listener.sock));
  H_RUN_UNTIL(ctx, ctx->listener.closed, H_TIMEOUT_MS);
  H_ASSERT_CODE(ibmsg_destroy_event_loop(&ctx->loop), IBMSG_EBUSY);
  h_release_held(server);
  h_finish(ctx); /* now destroys the loop, asserting IBMSG_OK */
}

static void listener_close_leaves_accepted_connections_working(void **state) {
  h_ctx *ctx = *state;
  h_conn *client, *server;

  small_pair(ctx, &client, &server);
  H_ASSERT_OK(ibmsg_disconnect(&ctx->listener.sock));
  H_RUN_UNTIL(ctx, ctx->listener.closed, H_TIMEOUT_MS);
  H_CHECK(!client->closed && !server->closed, "closing the listener closed an accepted connection (%s)",
          ibmsg_err_name(server->closed ? server->close_reason : client->close_reason));
  client->verify = server->verify = 1;
  h_stream_start(client, 100, MSG_SIZE, 4);
  h_stream_start(server, 100, MSG_SIZE, 4);
  H_RUN_UNTIL(ctx, client->received == 100 && server->received == 100 && h_stream_done(client) &&
                       h_stream_done(server),
              H_TIMEOUT_MS);
  h_finish(ctx);
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      H_TEST(client_disconnect_accounts_for_every_posted_message),
      H_TEST(server_disconnect_accounts_for_every_posted_message),
      H_TEST(disconnect_during_streams_accounts_for_every_message),
      H_TEST(post_and_alloc_after_close_return_enotconn),
      H_TEST(received_messages_can_be_freed_after_close),
      H_TEST(disconnect_twice_returns_estate),
      H_TEST(disconnect_after_peer_disconnected_closes_once),
      H_TEST(listener_close_gives_connection_closed),
      H_TEST(closed_listener_refuses_new_connections),
      H_TEST(destroy_loop_returns_ebusy_until_everything_is_closed),
      H_TEST(closed_socket_struct_can_be_reused_for_a_new_connection),
      H_TEST(closed_socket_is_never_touched_after_its_callback),
      H_TEST(disconnect_from_message_received_callback),
      H_TEST(disconnect_from_message_sent_callback),
      H_TEST(disconnect_from_connection_established_callback),
      H_TEST(server_disconnect_before_established_closes_both_sides),
      H_TEST(reconnect_from_connection_closed_callback),
      H_TEST(freeing_lent_messages_after_disconnect_keeps_reason_ok),
      H_TEST(destroy_loop_returns_ebusy_while_a_received_message_is_lent),
      H_TEST(listener_close_leaves_accepted_connections_working),
  };
  h_init(argc, argv);
  return cmocka_run_group_tests(tests, NULL, NULL);
}
