/* test_connect_errors.c - connections that cannot be made fail with a clear code, within the
 * connect timeout, and with exactly one connection_closed (or none, if ibmsg_connect failed). */
#define _POSIX_C_SOURCE 200809L

#include "harness.h"

#include <stdlib.h>

#define CONNECT_TIMEOUT_MS 2000
#define BOUND_MS 5000        /* a failing connect must be over by then */
#define UNUSED_PORT 1        /* nothing listens there inside the test VM */
#define NO_ROUTE_ADDR "169.254.99.99" /* link-local, never leaves the VM, nobody answers */

/* Connects and waits for the client to close; returns how long that took. The client must
 * not become established. */
static uint64_t connect_expecting_close(h_ctx *ctx, h_conn **client, const char *ip, unsigned short port) {
  uint64_t start = h_now_ms();
  h_conn *c = h_connect(ctx, ip, port);
  H_RUN_UNTIL(ctx, c->closed || c->established, BOUND_MS + 5000);
  H_CHECK(!c->established, "connecting to %s port %u succeeded; it must fail", ip, (unsigned)port);
  h_run_for(ctx, 200);
  H_ASSERT_EQ(c->closed, 1, "connection_closed callbacks of the failed connection");
  H_ASSERT_STATUS(c->sock.status, IBMSG_ERROR, "status of the failed connection");
  *client = c;
  return c->closed_at_ms - start;
}

static void connect_to_port_without_listener_is_refused(void **state) {
  h_ctx *ctx = *state;
  h_conn *c;
  uint64_t ms;

  h_setopt_int(ctx, IBMSG_OPT_CONNECT_TIMEOUT, CONNECT_TIMEOUT_MS);
  ms = connect_expecting_close(ctx, &c, ctx->addr, UNUSED_PORT);
  print_message("refused after %llu ms with %s\n", (unsigned long long)ms, ibmsg_err_name(c->close_reason));
  H_ASSERT_REASON(c->close_reason, IBMSG_ECONNREFUSED, "close reason without a listener");
  H_CHECK(ms < BOUND_MS, "the refusal took %llu ms, expected less than %d", (unsigned long long)ms, BOUND_MS);
  h_finish(ctx);
}

static void connect_to_unresolvable_host_fails_with_enoaddr(void **state) {
  h_ctx *ctx = *state;
  h_conn *c;

  h_setopt_int(ctx, IBMSG_OPT_CONNECT_TIMEOUT, CONNECT_TIMEOUT_MS);
  c = h_connect_must_fail(ctx, "no-such-host.invalid", 7471, IBMSG_ENOADDR, BOUND_MS, 1,
                          "to no-such-host.invalid");
  H_ASSERT_EQ(c->established, 0, "connection_established callbacks");
  h_finish(ctx);
}

static void connect_to_address_without_route_fails_within_timeout(void **state) {
  h_ctx *ctx = *state;
  h_conn *c = NULL;
  uint64_t start;
  int rc;

  h_setopt_int(ctx, IBMSG_OPT_CONNECT_TIMEOUT, CONNECT_TIMEOUT_MS);
  start = h_now_ms();
  rc = h_try_connect(ctx, &c, NO_ROUTE_ADDR, 7471);
  if (rc != IBMSG_OK) {
    print_message("ibmsg_connect(%s) failed at once with %s\n", NO_ROUTE_ADDR, ibmsg_err_name(rc));
    h_run_for(ctx, 300);
    H_ASSERT_EQ(c->closed, 0, "connection_closed callbacks after ibmsg_connect failed");
  } else {
    H_RUN_UNTIL(ctx, c->closed || c->established, BOUND_MS);
    H_CHECK(!c->established, "a connection to %s was established", NO_ROUTE_ADDR);
    H_CHECK(c->close_reason != IBMSG_OK, "the failed connection closed with IBMSG_OK");
    H_ASSERT_STATUS(c->sock.status, IBMSG_ERROR, "status of the failed connection");
    print_message("closed after %llu ms with %s\n", (unsigned long long)(c->closed_at_ms - start),
                  ibmsg_err_name(c->close_reason));
  }
  h_finish(ctx);
}

/* A listener on a second loop that the test never runs: connection requests reach the kernel
 * but nobody answers them. */
struct silent {
  ibmsg_event_loop loop;
  ibmsg_socket listener;
  int closed;
  unsigned short port;
};

static void silent_closed(ibmsg_socket *socket, int reason) {
  struct silent *s = socket->loop->user_data;
  (void)reason;
  s->closed++;
}

static struct silent *silent_listener(h_ctx *ctx) {
  struct silent *s = calloc(1, sizeof *s);
  H_CHECK(s != NULL, "out of memory");
  ctx->data = s;
  H_ASSERT_OK(ibmsg_init_event_loop(&s->loop));
  s->loop.user_data = s;
  s->loop.connection_closed = silent_closed;
  H_ASSERT_OK(ibmsg_listen(&s->loop, &s->listener, ctx->addr, 0, 4));
  H_ASSERT_OK(ibmsg_socket_local_address(&s->listener, NULL, 0, &s->port));
  return s;
}

/* Disconnects `sock` of a second loop (the test's ctx->data, `owner`), runs that loop until
 * *closed, destroys it and frees owner; asserts each step. */
static void close_second_loop(h_ctx *ctx, ibmsg_event_loop *loop, ibmsg_socket *sock,
                              const int *closed, void *owner, const char *what) {
  uint64_t deadline;
  H_ASSERT_OK(ibmsg_disconnect(sock));
  deadline = h_now_ms() + H_TIMEOUT_MS;
  while (!*closed) {
    H_CHECK(h_now_ms() < deadline, "the second loop's %s did not close", what);
    H_ASSERT_OK(ibmsg_dispatch_event_loop_timeout(loop, 50));
  }
  H_ASSERT_OK(ibmsg_destroy_event_loop(loop));
  free(owner);
  ctx->data = NULL;
}

static void silent_close(h_ctx *ctx, struct silent *s) {
  close_second_loop(ctx, &s->loop, &s->listener, &s->closed, s, "listener");
}

static void connect_times_out_when_peer_never_answers(void **state) {
  h_ctx *ctx = *state;
  struct silent *s = silent_listener(ctx);
  h_conn *c;
  uint64_t ms;

  h_setopt_int(ctx, IBMSG_OPT_CONNECT_TIMEOUT, CONNECT_TIMEOUT_MS);
  ms = connect_expecting_close(ctx, &c, ctx->addr, s->port);
  print_message("timed out after %llu ms with %s\n", (unsigned long long)ms, ibmsg_err_name(c->close_reason));
  H_ASSERT_REASON(c->close_reason, IBMSG_ETIMEDOUT, "close reason when the peer never answers");
  H_CHECK(ms >= CONNECT_TIMEOUT_MS - 500 && ms < BOUND_MS,
          "the connect timed out after %llu ms; IBMSG_OPT_CONNECT_TIMEOUT is %d",
          (unsigned long long)ms, CONNECT_TIMEOUT_MS);
  silent_close(ctx, s);
  h_finish(ctx);
}

static void disconnect_right_after_connect_closes_once(void **state) {
  h_ctx *ctx = *state;
  h_conn *c;

  h_listen(ctx, ctx->addr, 4);
  c = h_connect(ctx, ctx->addr, ctx->port);
  H_ASSERT_OK(ibmsg_disconnect(&c->sock));
  H_RUN_UNTIL(ctx, c->closed, H_TIMEOUT_MS);
  h_run_for(ctx, 500);
  H_ASSERT_EQ(c->closed, 1, "connection_closed callbacks");
  H_ASSERT_EQ(c->established, 0, "connection_established callbacks after ibmsg_disconnect");
  H_CHECK(c->close_reason == IBMSG_ECANCELED || c->close_reason == IBMSG_OK,
          "close reason is %s, expected IBMSG_ECANCELED or IBMSG_OK", ibmsg_err_name(c->close_reason));
  h_finish(ctx); /* any socket the server accepted meanwhile must close too */
}

static void disconnect_while_waiting_for_the_peer_closes_once(void **state) {
  h_ctx *ctx = *state;
  struct silent *s = silent_listener(ctx);
  h_conn *c;
  uint64_t start;

  h_setopt_int(ctx, IBMSG_OPT_CONNECT_TIMEOUT, 10000);
  c = h_connect(ctx, ctx->addr, s->port);
  H_RUN_UNTIL(ctx, c->sock.status == IBMSG_ROUTE_RESOLVED || c->closed, H_TIMEOUT_MS);
  H_CHECK(!c->closed, "the connect closed with %s before it was canceled", ibmsg_err_name(c->close_reason));
  h_run_for(ctx, 300); /* the request is now with the silent peer */
  start = h_now_ms();
  H_ASSERT_OK(ibmsg_disconnect(&c->sock));
  H_RUN_UNTIL(ctx, c->closed, 5000);
  h_run_for(ctx, 300);
  print_message("closed %llu ms after ibmsg_disconnect with %s\n",
                (unsigned long long)(c->closed_at_ms - start), ibmsg_err_name(c->close_reason));
  H_ASSERT_EQ(c->closed, 1, "connection_closed callbacks");
  H_ASSERT_EQ(c->established, 0, "connection_established callbacks");
  H_CHECK(c->close_reason == IBMSG_ECANCELED || c->close_reason == IBMSG_OK,
          "close reason is %s, expected IBMSG_ECANCELED or IBMSG_OK", ibmsg_err_name(c->close_reason));
  silent_close(ctx, s);
  h_finish(ctx);
}

static int teardown_silent(void **state) {
  h_ctx *ctx = *state;
  struct silent *s = ctx ? ctx->data : NULL;
  int rc = h_teardown(state);
  if (s) { /* a failed test left the second loop open */
    ibmsg_disconnect(&s->listener);
    ibmsg_dispatch_event_loop_timeout(&s->loop, 500);
    if (ibmsg_destroy_event_loop(&s->loop) == IBMSG_OK) free(s);
  }
  return rc;
}

static void connect_timeout_does_not_close_established_connection(void **state) {
  h_ctx *ctx = *state;
  h_conn *client, *server;

  h_setopt_int(ctx, IBMSG_OPT_CONNECT_TIMEOUT, 500);
  h_pair(ctx, &client, &server);
  h_run_for(ctx, 1500);
  H_CHECK(!client->closed, "the client closed with %s after the connect timeout had passed",
          ibmsg_err_name(client->close_reason));
  H_CHECK(!server->closed, "the accepted socket closed with %s after the connect timeout had passed",
          ibmsg_err_name(server->close_reason));
  h_finish(ctx);
}

/* A client on a second loop that stops running once its connection request is out: the server
 * accepts, and then never hears from the client again. */
struct vanishing {
  ibmsg_event_loop loop;
  ibmsg_socket client;
  int closed;
};

static void vanishing_closed(ibmsg_socket *socket, int reason) {
  struct vanishing *v = socket->loop->user_data;
  (void)reason;
  v->closed++;
}

static void accepted_connection_whose_client_vanishes_closes(void **state) {
  h_ctx *ctx = *state;
  struct vanishing *v = calloc(1, sizeof *v);
  h_conn *server = &ctx->servers[0];
  uint64_t start, deadline;

  H_CHECK(v != NULL, "out of memory");
  ctx->data = v;
  h_setopt_int(ctx, IBMSG_OPT_CONNECT_TIMEOUT, CONNECT_TIMEOUT_MS);
  h_listen(ctx, ctx->addr, 4);
  H_ASSERT_OK(ibmsg_init_event_loop(&v->loop));
  v->loop.user_data = v;
  v->loop.connection_closed = vanishing_closed;
  H_ASSERT_OK(ibmsg_connect(&v->loop, &v->client, ctx->addr, ctx->port));
  deadline = h_now_ms() + H_TIMEOUT_MS;
  while (v->client.status != IBMSG_ROUTE_RESOLVED) {
    H_CHECK(h_now_ms() < deadline && !v->closed, "the second loop's client did not send its request");
    H_ASSERT_OK(ibmsg_dispatch_event_loop_timeout(&v->loop, 10));
  }
  start = h_now_ms();
  H_RUN_UNTIL(ctx, ctx->n_servers == 1, H_TIMEOUT_MS);
  /* Bounded like a connect: otherwise a vanished client holds the socket (and a slot of the
   * listener's max_connections) for good. */
  deadline = h_now_ms() + BOUND_MS + 5000;
  while (!server->closed && !server->established && h_now_ms() < deadline) h_run_for(ctx, 50);
  H_CHECK(server->closed || server->established,
          "the accepted socket is still %s %llu ms after the request: a connection whose client "
          "vanished after sending its request is never closed (IBMSG_OPT_CONNECT_TIMEOUT is %d ms)",
          h_status_name(server->sock.status), (unsigned long long)(h_now_ms() - start),
          CONNECT_TIMEOUT_MS);
  print_message("the accepted socket %s after %llu ms (%s)\n",
                server->closed ? "closed" : "was established", (unsigned long long)(h_now_ms() - start),
                server->closed ? ibmsg_err_name(server->close_reason) : "");
  H_CHECK(!server->established, "the accepted socket was established although the client never answered");
  H_CHECK(server->close_reason != IBMSG_OK, "the half-open connection closed with IBMSG_OK");

  close_second_loop(ctx, &v->loop, &v->client, &v->closed, v, "client");
  h_finish(ctx);
}

static int teardown_vanishing(void **state) {
  h_ctx *ctx = *state;
  struct vanishing *v = ctx ? ctx->data : NULL;
  int rc = h_teardown(state);
  uint64_t deadline = h_now_ms() + 3000;
  if (v) { /* a failed test left the second loop open */
    ibmsg_disconnect(&v->client);
    while (!v->closed && h_now_ms() < deadline) ibmsg_dispatch_event_loop_timeout(&v->loop, 50);
    if (ibmsg_destroy_event_loop(&v->loop) == IBMSG_OK) free(v);
  }
  return rc;
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      H_TEST(connect_to_port_without_listener_is_refused),
      H_TEST(connect_to_unresolvable_host_fails_with_enoaddr),
      H_TEST(connect_to_address_without_route_fails_within_timeout),
      cmocka_unit_test_setup_teardown(connect_times_out_when_peer_never_answers, h_setup, teardown_silent),
      H_TEST(disconnect_right_after_connect_closes_once),
      cmocka_unit_test_setup_teardown(disconnect_while_waiting_for_the_peer_closes_once, h_setup,
                                      teardown_silent),
      H_TEST(connect_timeout_does_not_close_established_connection),
      cmocka_unit_test_setup_teardown(accepted_connection_whose_client_vanishes_closes, h_setup,
                                      teardown_vanishing),
  };
  h_init(argc, argv);
  return cmocka_run_group_tests(tests, NULL, NULL);
}
