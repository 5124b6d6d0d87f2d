/* test_bad_calls.c - wrong calls return their documented codes and never crash. */
#define _POSIX_C_SOURCE 200809L

#include "harness.h"

#include <string.h>

/* --- NULL arguments ------------------------------------------------------------------------ */

static void loop_functions_reject_null(void **state) {
  h_ctx *ctx = *state;
  ibmsg_event_loop other;
  int rc;

  ibmsg_version(NULL, NULL, NULL); /* allowed: nothing to store */
  H_CHECK(ibmsg_version_string() != NULL, "ibmsg_version_string() returned NULL");
  H_ASSERT_CODE(ibmsg_init_event_loop(NULL), IBMSG_EINVAL);
  H_ASSERT_CODE(ibmsg_init_event_loop_ev(NULL, NULL), IBMSG_EINVAL);
  memset(&other, 0, sizeof other);
  rc = ibmsg_init_event_loop_ev(&other, NULL);
  if (rc == IBMSG_OK) ibmsg_destroy_event_loop(&other);
  H_ASSERT_CODE(rc, IBMSG_EINVAL);
  H_ASSERT_CODE(ibmsg_destroy_event_loop(NULL), IBMSG_EINVAL);
  H_ASSERT_CODE(ibmsg_dispatch_event_loop(NULL), IBMSG_EINVAL);
  H_ASSERT_CODE(ibmsg_dispatch_event_loop_timeout(NULL, 0), IBMSG_EINVAL);
  H_ASSERT_CODE(ibmsg_event_loop_process(NULL), IBMSG_EINVAL);
  H_ASSERT_EQ(ibmsg_event_loop_fd(NULL), -1, "ibmsg_event_loop_fd(NULL)");
  (void)ibmsg_event_loop_timeout(NULL); /* no code to check: it must just not crash */
  h_finish(ctx);
}

static void option_functions_reject_null(void **state) {
  h_ctx *ctx = *state;
  int value = 1;
  size_t len = sizeof value;

  H_ASSERT_CODE(ibmsg_setopt(NULL, IBMSG_OPT_RECV_DEPTH, &value, sizeof value), IBMSG_EINVAL);
  H_ASSERT_CODE(ibmsg_setopt(&ctx->loop, IBMSG_OPT_RECV_DEPTH, NULL, sizeof value), IBMSG_EINVAL);
  H_ASSERT_CODE(ibmsg_getopt(NULL, IBMSG_OPT_RECV_DEPTH, &value, &len), IBMSG_EINVAL);
  H_ASSERT_CODE(ibmsg_getopt(&ctx->loop, IBMSG_OPT_RECV_DEPTH, NULL, &len), IBMSG_EINVAL);
  H_ASSERT_CODE(ibmsg_getopt(&ctx->loop, IBMSG_OPT_RECV_DEPTH, &value, NULL), IBMSG_EINVAL);
  h_finish(ctx);
}

static void socket_functions_reject_null(void **state) {
  h_ctx *ctx = *state;
  ibmsg_socket s;
  char buf[64];
  unsigned short port;

  memset(&s, 0, sizeof s);
  H_ASSERT_CODE(ibmsg_listen(NULL, &s, ctx->addr, 0, 1), IBMSG_EINVAL);
  H_ASSERT_CODE(ibmsg_listen(&ctx->loop, NULL, ctx->addr, 0, 1), IBMSG_EINVAL);
  H_ASSERT_CODE(ibmsg_connect(NULL, &s, ctx->addr, 1), IBMSG_EINVAL);
  H_ASSERT_CODE(ibmsg_connect(&ctx->loop, NULL, ctx->addr, 1), IBMSG_EINVAL);
  H_ASSERT_CODE(ibmsg_connect(&ctx->loop, &s, NULL, 1), IBMSG_EINVAL);
  H_ASSERT_CODE(ibmsg_disconnect(NULL), IBMSG_EINVAL);
  H_ASSERT_CODE(ibmsg_socket_local_address(NULL, buf, sizeof buf, &port), IBMSG_EINVAL);
  H_ASSERT_CODE(ibmsg_socket_peer_address(NULL, buf, sizeof buf, &port), IBMSG_EINVAL);
  H_CHECK(ibmsg_socket_device(NULL) == NULL, "ibmsg_socket_device(NULL) is not NULL");
  H_ASSERT_EQ(ibmsg_socket_max_msg_size(NULL), 0, "ibmsg_socket_max_msg_size(NULL)");
  H_ASSERT_CODE(ibmsg_accept(NULL, &s), IBMSG_EINVAL);
  H_ASSERT_CODE(ibmsg_reject(NULL, "no"), IBMSG_EINVAL);
  h_run_for(ctx, 100);
  H_CHECK(h_all_closed(ctx), "a failed call left a socket behind");
  h_finish(ctx);
}

static void message_functions_reject_null(void **state) {
  h_ctx *ctx = *state;
  h_conn *client, *server;
  ibmsg_buffer *m = &ctx->msgs[0];

  h_pair(ctx, &client, &server);
  H_ASSERT_CODE(ibmsg_alloc_msg(NULL, &client->sock, 10), IBMSG_EINVAL);
  H_ASSERT_CODE(ibmsg_alloc_msg(m, NULL, 10), IBMSG_EINVAL);
  H_ASSERT_CODE(ibmsg_post_send(&client->sock, NULL), IBMSG_EINVAL);
  h_alloc_fill(client, m, 10);
  H_ASSERT_CODE(ibmsg_post_send(NULL, m), IBMSG_EINVAL);
  H_ASSERT_CODE(ibmsg_free_msg(NULL), IBMSG_EINVAL);
  H_ASSERT_OK(ibmsg_free_msg(m));
  h_run_for(ctx, 200);
  H_ASSERT_EQ(server->received, 0, "messages received after failed calls");
  h_finish(ctx);
}

struct request_calls {
  int accept_null_socket;
  int accept_null_request;
  int reject_null_request;
};

static void bad_request_calls(h_ctx *ctx, ibmsg_connection_request *request) {
  struct request_calls *r = ctx->data;
  r->accept_null_socket = ibmsg_accept(request, NULL);
  r->accept_null_request = ibmsg_accept(NULL, &ctx->servers[0].sock);
  r->reject_null_request = ibmsg_reject(NULL, "no");
  ibmsg_reject(request, "bad calls");
}

static void request_functions_reject_null(void **state) {
  h_ctx *ctx = *state;
  struct request_calls r;
  h_conn *c;

  memset(&r, 0, sizeof r);
  ctx->data = &r;
  ctx->on_request = bad_request_calls;
  h_listen(ctx, ctx->addr, 4);
  c = h_connect(ctx, ctx->addr, ctx->port);
  H_RUN_UNTIL(ctx, c->closed || c->established, H_TIMEOUT_MS);
  ctx->on_request = NULL;
  H_ASSERT_CODE(r.accept_null_socket, IBMSG_EINVAL);
  H_ASSERT_CODE(r.accept_null_request, IBMSG_EINVAL);
  H_ASSERT_CODE(r.reject_null_request, IBMSG_EINVAL);
  H_ASSERT_REASON(c->close_reason, IBMSG_EREJECTED, "close reason of the client");
  h_finish(ctx);
}

/* --- objects in the wrong state ------------------------------------------------------------ */

static void calls_on_uninitialized_or_destroyed_loop_return_einval(void **state) {
  h_ctx *ctx = *state;
  ibmsg_event_loop zero, destroyed;
  ibmsg_socket s;
  int value = 4;

  memset(&zero, 0, sizeof zero);
  memset(&s, 0, sizeof s);
  H_ASSERT_CODE(ibmsg_dispatch_event_loop_timeout(&zero, 0), IBMSG_EINVAL);
  H_ASSERT_CODE(ibmsg_event_loop_process(&zero), IBMSG_EINVAL);
  H_ASSERT_EQ(ibmsg_event_loop_fd(&zero), -1, "ibmsg_event_loop_fd of a zeroed loop");
  H_ASSERT_CODE(ibmsg_setopt(&zero, IBMSG_OPT_RECV_DEPTH, &value, sizeof value), IBMSG_EINVAL);
  H_ASSERT_CODE(ibmsg_listen(&zero, &s, ctx->addr, 0, 1), IBMSG_EINVAL);
  H_ASSERT_CODE(ibmsg_connect(&zero, &s, ctx->addr, 1), IBMSG_EINVAL);
  H_ASSERT_CODE(ibmsg_destroy_event_loop(&zero), IBMSG_EINVAL);

  H_ASSERT_OK(ibmsg_init_event_loop(&destroyed));
  H_ASSERT_OK(ibmsg_destroy_event_loop(&destroyed));
  H_ASSERT_CODE(ibmsg_destroy_event_loop(&destroyed), IBMSG_EINVAL);
  H_ASSERT_CODE(ibmsg_dispatch_event_loop_timeout(&destroyed, 0), IBMSG_EINVAL);
  H_ASSERT_CODE(ibmsg_listen(&destroyed, &s, ctx->addr, 0, 1), IBMSG_EINVAL);
  h_finish(ctx);
}

static void post_on_unconnected_socket_fails(void **state) {
  h_ctx *ctx = *state;
  ibmsg_socket s;
  ibmsg_buffer m;
  char buf[64];
  int rc;

  memset(&s, 0, sizeof s);
  memset(&m, 0, sizeof m);
  H_ASSERT_CODE(ibmsg_alloc_msg(&m, &s, 10), IBMSG_ENOTCONN);
  rc = ibmsg_post_send(&s, &m);
  H_CHECK(rc == IBMSG_ENOTCONN || rc == IBMSG_ESTATE,
          "ibmsg_post_send on a zeroed socket returned %s, expected IBMSG_ENOTCONN or IBMSG_ESTATE",
          ibmsg_err_name(rc));
  H_CHECK(ibmsg_disconnect(&s) != IBMSG_OK, "ibmsg_disconnect of a zeroed socket succeeded");
  H_CHECK(ibmsg_socket_peer_address(&s, buf, sizeof buf, NULL) != IBMSG_OK,
          "ibmsg_socket_peer_address of a zeroed socket succeeded");
  H_CHECK(ibmsg_socket_device(&s) == NULL, "ibmsg_socket_device of a zeroed socket is not NULL");
  H_ASSERT_EQ(ibmsg_socket_max_msg_size(&s), 0, "ibmsg_socket_max_msg_size of a zeroed socket");
  h_finish(ctx);
}

static void post_on_listening_socket_fails(void **state) {
  h_ctx *ctx = *state;
  ibmsg_buffer m;
  int rc;

  memset(&m, 0, sizeof m);
  h_listen(ctx, ctx->addr, 4);
  /* A listener given to a function for connections: IBMSG_ESTATE, from every one of them. */
  rc = ibmsg_alloc_msg(&m, &ctx->listener.sock, 10);
  H_ASSERT_CODE(rc, IBMSG_ESTATE);
  memset(&m, 0, sizeof m);
  rc = ibmsg_post_send(&ctx->listener.sock, &m);
  H_ASSERT_CODE(rc, IBMSG_ESTATE);
  {
    ibmsg_memory mem;
    ibmsg_stats st;
    char addr[64];
    H_ASSERT_CODE(ibmsg_socket_memory_info(&ctx->listener.sock, &mem, sizeof mem), IBMSG_ESTATE);
    H_ASSERT_CODE(ibmsg_socket_stats(&ctx->listener.sock, &st, sizeof st), IBMSG_ESTATE);
    H_ASSERT_CODE(ibmsg_socket_peer_address(&ctx->listener.sock, addr, sizeof addr, NULL),
                  IBMSG_ESTATE);
  }
  H_ASSERT_EQ(ctx->listener.sent, 0, "message_sent callbacks of the listener");
  h_finish(ctx);
}

static void double_free_returns_enotalloc(void **state) {
  h_ctx *ctx = *state;
  h_conn *client, *server;
  ibmsg_buffer *m = &ctx->msgs[0], never;

  h_pair(ctx, &client, &server);
  h_alloc_fill(client, m, 10);
  H_ASSERT_OK(ibmsg_free_msg(m));
  H_ASSERT_EQ(m->status, IBMSG_FREED, "status of a freed message");
  H_ASSERT_CODE(ibmsg_free_msg(m), IBMSG_ENOTALLOC);
  memset(&never, 0, sizeof never);
  H_ASSERT_CODE(ibmsg_free_msg(&never), IBMSG_ENOTALLOC);
  h_finish(ctx);
}

static void post_of_freed_message_returns_enotalloc(void **state) {
  h_ctx *ctx = *state;
  h_conn *client, *server;
  ibmsg_buffer *m = &ctx->msgs[0];

  h_pair(ctx, &client, &server);
  h_alloc_fill(client, m, 10);
  H_ASSERT_OK(ibmsg_free_msg(m));
  H_ASSERT_CODE(h_try_post(client, m), IBMSG_ENOTALLOC);
  h_run_for(ctx, 200);
  H_ASSERT_EQ(server->received, 0, "messages received after posting a freed message");
  h_finish(ctx);
}

static void free_of_message_in_flight_returns_ebusy(void **state) {
  h_ctx *ctx = *state;
  h_conn *client, *server;
  ibmsg_buffer *m = &ctx->msgs[0];

  h_pair(ctx, &client, &server);
  h_alloc_fill(client, m, 10);
  h_post(client, m);
  H_ASSERT_CODE(ibmsg_free_msg(m), IBMSG_EBUSY);
  H_RUN_UNTIL(ctx, client->sent == 1, H_TIMEOUT_MS);
  H_ASSERT_OK(ibmsg_free_msg(m));
  H_ASSERT_EQ(server->received, 1, "messages received");
  h_finish(ctx);
}

static void free_of_queued_message_returns_ebusy(void **state) {
  h_ctx *ctx = *state;
  h_conn *client, *server;

  h_setopt_int(ctx, IBMSG_OPT_RECV_DEPTH, 1);
  h_pair(ctx, &client, &server);
  server->hold = 1;
  h_alloc_fill(client, &ctx->msgs[0], 10);
  h_alloc_fill(client, &ctx->msgs[1], 10);
  h_post(client, &ctx->msgs[0]);
  h_post(client, &ctx->msgs[1]); /* no credit left: queued */
  H_RUN_UNTIL(ctx, client->sent == 1, H_TIMEOUT_MS);
  h_run_for(ctx, 200);
  H_ASSERT_EQ(client->sent, 1, "message_sent callbacks with one credit");
  H_ASSERT_CODE(ibmsg_free_msg(&ctx->msgs[1]), IBMSG_EBUSY);
  server->hold = 0;
  h_release_held(server);
  H_RUN_UNTIL(ctx, client->sent == 2 && server->received == 2, H_TIMEOUT_MS);
  H_ASSERT_OK(ibmsg_free_msg(&ctx->msgs[0]));
  H_ASSERT_OK(ibmsg_free_msg(&ctx->msgs[1]));
  h_finish(ctx);
}

static void posting_a_message_in_flight_again_fails(void **state) {
  h_ctx *ctx = *state;
  h_conn *client, *server;
  ibmsg_buffer *m = &ctx->msgs[0];
  int rc;

  h_pair(ctx, &client, &server);
  h_alloc_fill(client, m, 10);
  h_post(client, m);
  rc = ibmsg_post_send(&client->sock, m);
  H_CHECK(rc != IBMSG_OK, "posting a message that is in flight succeeded");
  H_RUN_UNTIL(ctx, client->sent == 1, H_TIMEOUT_MS);
  h_run_for(ctx, 200);
  H_ASSERT_EQ(client->sent, 1, "message_sent callbacks");
  H_ASSERT_EQ(server->received, 1, "messages received");
  H_ASSERT_OK(ibmsg_free_msg(m));
  h_finish(ctx);
}

static ibmsg_buffer *last_received;

static void keep_last(h_conn *conn, ibmsg_buffer *msg) {
  (void)conn;
  last_received = msg;
}

static void posting_a_received_message_fails(void **state) {
  h_ctx *ctx = *state;
  h_conn *client, *server;
  int rc;

  h_pair(ctx, &client, &server);
  last_received = NULL;
  ctx->on_received = keep_last;
  h_alloc_fill(client, &ctx->msgs[0], 10);
  h_post(client, &ctx->msgs[0]);
  H_RUN_UNTIL(ctx, last_received != NULL, H_TIMEOUT_MS);
  ctx->on_received = NULL;
  rc = ibmsg_post_send(&server->sock, last_received);
  H_CHECK(rc != IBMSG_OK, "posting a received (lent) message succeeded");
  h_run_for(ctx, 200);
  H_ASSERT_EQ(client->received, 0, "messages the client received");
  H_ASSERT_OK(ibmsg_free_msg(last_received));
  H_ASSERT_OK(ibmsg_free_msg(&ctx->msgs[0]));
  h_finish(ctx);
}

static void post_of_message_from_another_socket_returns_einval(void **state) {
  h_ctx *ctx = *state;
  h_conn *client, *server;
  ibmsg_buffer *m = &ctx->msgs[0];

  h_pair(ctx, &client, &server);
  h_alloc_fill(client, m, 10);
  H_ASSERT_CODE(h_try_post(server, m), IBMSG_EINVAL);
  h_run_for(ctx, 200);
  H_ASSERT_EQ(client->received, 0, "messages the client received");
  H_ASSERT_EQ(server->sent, 0, "message_sent callbacks of the server");
  H_ASSERT_OK(ibmsg_free_msg(m));
  h_finish(ctx);
}

struct twice {
  int first, second, reject_after;
};

static void accept_twice(h_ctx *ctx, ibmsg_connection_request *request) {
  struct twice *t = ctx->data;
  h_conn *extra = &ctx->servers[1];
  t->first = h_accept(ctx, request);
  t->second = ibmsg_accept(request, &extra->sock);
  if (t->second == IBMSG_OK) { /* wrong, but keep the harness able to close it */
    extra->sock.user_data = extra;
    extra->active = 1;
    ctx->n_servers = 2;
  }
  t->reject_after = ibmsg_reject(request, "too late");
}

static void accept_twice_on_one_request_fails(void **state) {
  h_ctx *ctx = *state;
  struct twice t;
  h_conn *c;

  ctx->data = &t;
  ctx->on_request = accept_twice;
  h_listen(ctx, ctx->addr, 4);
  c = h_connect(ctx, ctx->addr, ctx->port);
  H_RUN_UNTIL(ctx, (c->established && ctx->servers[0].established) || c->closed, H_TIMEOUT_MS);
  ctx->on_request = NULL;
  H_ASSERT_OK(t.first);
  H_CHECK(t.second != IBMSG_OK, "a second ibmsg_accept on the same request succeeded");
  H_CHECK(t.reject_after != IBMSG_OK, "ibmsg_reject after ibmsg_accept succeeded");
  H_CHECK(c->established && !c->closed, "the accepted client did not connect (closed with %s)",
          ibmsg_err_name(c->close_reason));
  h_run_for(ctx, 200);
  H_ASSERT_EQ(ctx->servers[1].closed, 0, "connection_closed callbacks for the failed second accept");
  h_finish(ctx);
}

struct reentry {
  int dispatch, dispatch_timeout, process, destroy;
};

static void reenter_loop(h_ctx *ctx, ibmsg_connection_request *request) {
  struct reentry *r = ctx->data;
  r->dispatch = ibmsg_dispatch_event_loop(&ctx->loop);
  r->dispatch_timeout = ibmsg_dispatch_event_loop_timeout(&ctx->loop, 0);
  r->process = ibmsg_event_loop_process(&ctx->loop);
  r->destroy = ibmsg_destroy_event_loop(&ctx->loop);
  h_accept(ctx, request);
}

static void running_or_destroying_the_loop_inside_a_callback_returns_ebusy(void **state) {
  h_ctx *ctx = *state;
  struct reentry r = {-1, -1, -1, -1};
  h_conn *c;

  ctx->data = &r;
  ctx->on_request = reenter_loop;
  h_listen(ctx, ctx->addr, 4);
  c = h_connect(ctx, ctx->addr, ctx->port);
  H_RUN_UNTIL(ctx, (c->established && ctx->servers[0].established) || c->closed, H_TIMEOUT_MS);
  ctx->on_request = NULL;
  H_ASSERT_CODE(r.dispatch, IBMSG_EBUSY);
  H_ASSERT_CODE(r.dispatch_timeout, IBMSG_EBUSY);
  H_ASSERT_CODE(r.process, IBMSG_EBUSY);
  H_ASSERT_CODE(r.destroy, IBMSG_EBUSY);
  H_CHECK(c->established && !c->closed, "the connection did not survive the re-entry attempts");
  h_finish(ctx);
}

/* --- options ------------------------------------------------------------------------------- */

static void setopt_rejects_unknown_options_wrong_lengths_and_bad_values(void **state) {
  h_ctx *ctx = *state;
  ibmsg_event_loop *loop = &ctx->loop;
  int v = 4, bad, got;
  long wide = 4;
  size_t len;
  /* IBMSG_OPT_MAX_MSG_SIZE also takes a uint64_t (below). */
  const int int_options[] = {IBMSG_OPT_RECV_DEPTH, IBMSG_OPT_SEND_DEPTH, IBMSG_OPT_SEND_QUEUE,
                             IBMSG_OPT_EAGER_SIZE, IBMSG_OPT_CONNECT_TIMEOUT, IBMSG_OPT_RNR_RETRY,
                             IBMSG_OPT_SHARED_RECV};
  uint64_t wide64;
  size_t i;

  H_ASSERT_CODE(ibmsg_setopt(loop, 0, &v, sizeof v), IBMSG_EINVAL);
  H_ASSERT_CODE(ibmsg_setopt(loop, 9, &v, sizeof v), IBMSG_EINVAL);
  H_ASSERT_CODE(ibmsg_setopt(loop, -1, &v, sizeof v), IBMSG_EINVAL);
  H_ASSERT_CODE(ibmsg_setopt(loop, 1000, &v, sizeof v), IBMSG_EINVAL);
  len = sizeof v;
  H_ASSERT_CODE(ibmsg_getopt(loop, 99, &v, &len), IBMSG_EINVAL);

  for (i = 0; i < sizeof int_options / sizeof int_options[0]; i++) {
    H_ASSERT_CODE(ibmsg_setopt(loop, int_options[i], &v, 0), IBMSG_EINVAL);
    H_ASSERT_CODE(ibmsg_setopt(loop, int_options[i], &v, 2), IBMSG_EINVAL);
    H_ASSERT_CODE(ibmsg_setopt(loop, int_options[i], &wide, sizeof wide), IBMSG_EINVAL);
    bad = -1;
    H_ASSERT_CODE(ibmsg_setopt(loop, int_options[i], &bad, sizeof bad), IBMSG_EINVAL);
  }
  H_ASSERT_CODE(ibmsg_setopt(loop, IBMSG_OPT_MAX_MSG_SIZE, &v, 2), IBMSG_EINVAL);
  bad = 0;
  H_ASSERT_CODE(ibmsg_setopt(loop, IBMSG_OPT_MAX_MSG_SIZE, &bad, sizeof bad), IBMSG_EINVAL);
  bad = -1;
  H_ASSERT_CODE(ibmsg_setopt(loop, IBMSG_OPT_MAX_MSG_SIZE, &bad, sizeof bad), IBMSG_EINVAL);
  wide64 = 0;
  H_ASSERT_CODE(ibmsg_setopt(loop, IBMSG_OPT_MAX_MSG_SIZE, &wide64, sizeof wide64), IBMSG_EINVAL);
  wide64 = (uint64_t)1 << 32; /* beyond what a hello can say */
  H_ASSERT_CODE(ibmsg_setopt(loop, IBMSG_OPT_MAX_MSG_SIZE, &wide64, sizeof wide64), IBMSG_EINVAL);
  bad = (1 << 30) + 1; /* the eager size goes up to 1 GiB */
  H_ASSERT_CODE(ibmsg_setopt(loop, IBMSG_OPT_EAGER_SIZE, &bad, sizeof bad), IBMSG_EINVAL);
  bad = 8;
  H_ASSERT_CODE(ibmsg_setopt(loop, IBMSG_OPT_RNR_RETRY, &bad, sizeof bad), IBMSG_EINVAL);
  bad = 2;
  H_ASSERT_CODE(ibmsg_setopt(loop, IBMSG_OPT_SHARED_RECV, &bad, sizeof bad), IBMSG_EINVAL);
  bad = 0;
  H_ASSERT_CODE(ibmsg_setopt(loop, IBMSG_OPT_RECV_DEPTH, &bad, sizeof bad), IBMSG_EINVAL);
  H_ASSERT_CODE(ibmsg_setopt(loop, IBMSG_OPT_MAX_MSG_SIZE, &bad, sizeof bad), IBMSG_EINVAL);
  H_ASSERT_CODE(ibmsg_setopt(loop, IBMSG_OPT_SEND_DEPTH, &bad, sizeof bad), IBMSG_EINVAL);

  /* A rejected value leaves the option as it was (the harness set RNR retry 0). */
  got = -5;
  len = sizeof got;
  H_ASSERT_OK(ibmsg_getopt(loop, IBMSG_OPT_RNR_RETRY, &got, &len));
  H_ASSERT_EQ(got, 0, "IBMSG_OPT_RNR_RETRY after rejected values");
  len = 2;
  H_ASSERT_CODE(ibmsg_getopt(loop, IBMSG_OPT_RNR_RETRY, &got, &len), IBMSG_EINVAL);
  h_finish(ctx);
}

static void option_sets_check_their_handles_and_values(void **state) {
  h_ctx *ctx = *state;
  ibmsg_event_loop never_initialized;
  ibmsg_options *o;
  long not_a_set[16];
  int v = 0;
  size_t len = sizeof v;
  ibmsg_socket sock;

  memset(&never_initialized, 0, sizeof never_initialized);
  memset(not_a_set, 0, sizeof not_a_set);
  H_CHECK(ibmsg_options_new(&never_initialized) == NULL, "ibmsg_options_new accepted a bad loop");
  o = ibmsg_options_new(NULL);
  H_CHECK(o != NULL, "ibmsg_options_new(NULL) returned NULL");
  H_ASSERT_OK(ibmsg_options_get(o, IBMSG_OPT_RECV_DEPTH, &v, &len));
  H_ASSERT_EQ(v, 32, "IBMSG_OPT_RECV_DEPTH of a set made without a loop (the built-in default)");
  v = 0;
  H_ASSERT_CODE(ibmsg_options_set(o, IBMSG_OPT_MAX_MSG_SIZE, &v, sizeof v), IBMSG_EINVAL);
  H_ASSERT_CODE(ibmsg_options_set(o, 99, &v, sizeof v), IBMSG_EINVAL);
  H_ASSERT_CODE(ibmsg_options_set(NULL, IBMSG_OPT_RECV_DEPTH, &v, sizeof v), IBMSG_EINVAL);
  H_ASSERT_CODE(ibmsg_options_get(NULL, IBMSG_OPT_RECV_DEPTH, &v, &len), IBMSG_EINVAL);
  H_ASSERT_CODE(ibmsg_listen_opts(&ctx->loop, &sock, ctx->addr, 0, 1,
                                  (const ibmsg_options *)(void *)not_a_set), IBMSG_EINVAL);
  H_ASSERT_CODE(ibmsg_connect_opts(&ctx->loop, &sock, ctx->addr, 1,
                                   (const ibmsg_options *)(void *)not_a_set), IBMSG_EINVAL);
  ibmsg_options_free(o);
  ibmsg_options_free(NULL);
  h_finish(ctx);
}

static void listen_or_connect_on_an_open_socket_returns_estate(void **state) {
  h_ctx *ctx = *state;
  h_conn *client, *server;

  h_pair(ctx, &client, &server);
  H_ASSERT_CODE(ibmsg_listen(&ctx->loop, &client->sock, ctx->addr, 0, 1), IBMSG_ESTATE);
  H_ASSERT_CODE(ibmsg_connect(&ctx->loop, &client->sock, ctx->addr, ctx->port), IBMSG_ESTATE);
  H_ASSERT_CODE(ibmsg_listen(&ctx->loop, &ctx->listener.sock, ctx->addr, 0, 1), IBMSG_ESTATE);
  H_ASSERT_CODE(ibmsg_connect(&ctx->loop, &server->sock, ctx->addr, ctx->port), IBMSG_ESTATE);
  /* Both sockets are untouched: the connection still carries a message. */
  H_ASSERT_STATUS(client->sock.status, IBMSG_CONNECTED, "client status after the refused calls");
  H_ASSERT_STATUS(ctx->listener.sock.status, IBMSG_LISTENING, "listener status after the refused calls");
  h_alloc_fill(client, &ctx->msgs[0], 64);
  h_post(client, &ctx->msgs[0]);
  H_RUN_UNTIL(ctx, server->received == 1 && client->sent == 1, H_TIMEOUT_MS);
  H_ASSERT_OK(ibmsg_free_msg(&ctx->msgs[0]));
  h_finish(ctx);
}

static int get_int(ibmsg_event_loop *loop, int option) {
  int value = -12345;
  size_t len = sizeof value;
  H_ASSERT_OK(ibmsg_getopt(loop, option, &value, &len));
  H_ASSERT_EQ(len, sizeof value, "length ibmsg_getopt reports for an int option");
  return value;
}

static void get_str(ibmsg_event_loop *loop, int option, char *buf, size_t size) {
  size_t len = size;
  memset(buf, 'x', size);
  H_ASSERT_OK(ibmsg_getopt(loop, option, buf, &len));
  H_CHECK(len < size && memchr(buf, '\0', size) != NULL,
          "ibmsg_getopt of a string option did not NUL-terminate a big enough buffer");
}

static void options_have_documented_defaults(void **state) {
  h_ctx *ctx = *state;
  ibmsg_event_loop loop;
  char buf[64];

  H_ASSERT_OK(ibmsg_init_event_loop(&loop));
  H_ASSERT_EQ(get_int(&loop, IBMSG_OPT_RECV_DEPTH), 32, "default IBMSG_OPT_RECV_DEPTH");
  H_ASSERT_EQ(get_int(&loop, IBMSG_OPT_SEND_DEPTH), 32, "default IBMSG_OPT_SEND_DEPTH");
  H_ASSERT_EQ(get_int(&loop, IBMSG_OPT_SEND_QUEUE), 32, "default IBMSG_OPT_SEND_QUEUE");
  /* 2^32 - 1, which an int reads as INT_MAX */
  H_ASSERT_EQ(get_int(&loop, IBMSG_OPT_MAX_MSG_SIZE), 0x7fffffff, "default IBMSG_OPT_MAX_MSG_SIZE");
  H_ASSERT_EQ(get_int(&loop, IBMSG_OPT_EAGER_SIZE), 16384, "default IBMSG_OPT_EAGER_SIZE");
  H_ASSERT_EQ(get_int(&loop, IBMSG_OPT_SHARED_RECV), 1, "default IBMSG_OPT_SHARED_RECV");
  H_ASSERT_EQ(get_int(&loop, IBMSG_OPT_CONNECT_TIMEOUT), 5000, "default IBMSG_OPT_CONNECT_TIMEOUT");
  H_ASSERT_EQ(get_int(&loop, IBMSG_OPT_RNR_RETRY), 7, "default IBMSG_OPT_RNR_RETRY");
  get_str(&loop, IBMSG_OPT_SOURCE_ADDR, buf, sizeof buf);
  H_CHECK(buf[0] == '\0', "default IBMSG_OPT_SOURCE_ADDR is \"%s\", expected \"\"", buf);
  get_str(&loop, IBMSG_OPT_DEVICE, buf, sizeof buf);
  H_CHECK(buf[0] == '\0', "default IBMSG_OPT_DEVICE is \"%s\", expected \"\"", buf);
  H_ASSERT_OK(ibmsg_destroy_event_loop(&loop));
  h_finish(ctx);
}

static void setopt_values_read_back_with_getopt(void **state) {
  h_ctx *ctx = *state;
  char buf[64];

  h_setopt_int(ctx, IBMSG_OPT_RECV_DEPTH, 7);
  h_setopt_int(ctx, IBMSG_OPT_MAX_MSG_SIZE, 12345);
  H_ASSERT_EQ(get_int(&ctx->loop, IBMSG_OPT_RECV_DEPTH), 7, "IBMSG_OPT_RECV_DEPTH read back");
  H_ASSERT_EQ(get_int(&ctx->loop, IBMSG_OPT_MAX_MSG_SIZE), 12345, "IBMSG_OPT_MAX_MSG_SIZE read back");
  /* String options take a length and need no terminator. */
  H_ASSERT_OK(ibmsg_setopt(&ctx->loop, IBMSG_OPT_DEVICE, "rxe0-and-more", 4));
  get_str(&ctx->loop, IBMSG_OPT_DEVICE, buf, sizeof buf);
  H_CHECK(strcmp(buf, "rxe0") == 0, "IBMSG_OPT_DEVICE read back as \"%s\", expected \"rxe0\"", buf);
  H_ASSERT_OK(ibmsg_setopt(&ctx->loop, IBMSG_OPT_DEVICE, "", 0));
  get_str(&ctx->loop, IBMSG_OPT_DEVICE, buf, sizeof buf);
  H_CHECK(buf[0] == '\0', "IBMSG_OPT_DEVICE read back as \"%s\" after setting \"\"", buf);
  h_finish(ctx);
}

/* --- error texts --------------------------------------------------------------------------- */

struct code {
  int value;
  const char *name;
};

static void strerror_and_err_name_cover_every_code(void **state) {
  h_ctx *ctx = *state;
  static const struct code codes[] = {
      {IBMSG_OK, "IBMSG_OK"},
#define CODE(name, value, text) {IBMSG_##name, "IBMSG_" #name},
      IBMSG_ERRNO_MAP(CODE) IBMSG_ERROR_MAP(CODE)
#undef CODE
  };
  const size_t n = sizeof codes / sizeof codes[0];
  size_t i, j;
  const char *text, *name;

  for (i = 0; i < n; i++) {
    text = ibmsg_strerror(codes[i].value);
    name = ibmsg_err_name(codes[i].value);
    H_CHECK(text != NULL && text[0] != '\0', "ibmsg_strerror(%s) is empty", codes[i].name);
    H_CHECK(name != NULL && strcmp(name, codes[i].name) == 0, "ibmsg_err_name(%d) is \"%s\", expected \"%s\"",
            codes[i].value, name ? name : "(null)", codes[i].name);
    for (j = 0; j < i; j++)
      H_CHECK(strcmp(text, ibmsg_strerror(codes[j].value)) != 0,
              "ibmsg_strerror gives the same text \"%s\" for %s and %s", text, codes[i].name,
              codes[j].name);
  }
  text = ibmsg_strerror(123456);
  H_CHECK(text != NULL && text[0] != '\0', "ibmsg_strerror of an unknown code is empty");
  text = ibmsg_strerror(-1);
  H_CHECK(text != NULL && text[0] != '\0', "ibmsg_strerror(-1) is empty");
  text = ibmsg_strerror(1); /* EPERM: an errno value ibmsg does not return itself */
  H_CHECK(text != NULL && text[0] != '\0', "ibmsg_strerror(EPERM) is empty");
  name = ibmsg_err_name(123456);
  H_CHECK(name != NULL && strcmp(name, "IBMSG_UNKNOWN") == 0,
          "ibmsg_err_name of an unknown code is \"%s\", expected \"IBMSG_UNKNOWN\"", name ? name : "(null)");
  h_finish(ctx);
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      H_TEST(loop_functions_reject_null),
      H_TEST(option_functions_reject_null),
      H_TEST(socket_functions_reject_null),
      H_TEST(message_functions_reject_null),
      H_TEST(request_functions_reject_null),
      H_TEST(calls_on_uninitialized_or_destroyed_loop_return_einval),
      H_TEST(post_on_unconnected_socket_fails),
      H_TEST(post_on_listening_socket_fails),
      H_TEST(double_free_returns_enotalloc),
      H_TEST(post_of_freed_message_returns_enotalloc),
      H_TEST(free_of_message_in_flight_returns_ebusy),
      H_TEST(free_of_queued_message_returns_ebusy),
      H_TEST(posting_a_message_in_flight_again_fails),
      H_TEST(posting_a_received_message_fails),
      H_TEST(post_of_message_from_another_socket_returns_einval),
      H_TEST(accept_twice_on_one_request_fails),
      H_TEST(running_or_destroying_the_loop_inside_a_callback_returns_ebusy),
      H_TEST(setopt_rejects_unknown_options_wrong_lengths_and_bad_values),
      H_TEST(options_have_documented_defaults),
      H_TEST(option_sets_check_their_handles_and_values),
      H_TEST(listen_or_connect_on_an_open_socket_returns_estate),
      H_TEST(setopt_values_read_back_with_getopt),
      H_TEST(strerror_and_err_name_cover_every_code),
  };
  h_init(argc, argv);
  return cmocka_run_group_tests(tests, NULL, NULL);
}
