/* test_foreign_loop.c - driving ibmsg from another event loop: poll(2) on ibmsg_event_loop_fd()
 * with ibmsg_event_loop_timeout() and ibmsg_event_loop_process(), and the application's own libev
 * loop (ev_loop_new and ev_default_loop) run with ev_run(EVRUN_ONCE). */
#define _POSIX_C_SOURCE 200809L

#include "harness.h"

#include <errno.h>
#include <poll.h>
#include <stdlib.h>

#include <ev.h>

#define MESSAGES 1000

struct driver {
  struct ev_loop *ev; /* the application's libev loop, or NULL for poll(2) */
  ev_timer tick;      /* keeps ev_run(EVRUN_ONCE) from blocking longer than a tick */
  int own_ev;         /* created with ev_loop_new: destroy it afterwards */
  int readable;       /* poll(2) found the fd readable */
  int processed;      /* ibmsg_event_loop_process() calls */
};

/* One step of an application loop built on poll(2): wait for the fd, at most as long as ibmsg's
 * own timeout says, and process only when the fd is readable or that timeout has expired. */
static int poll_step(h_ctx *ctx, int max_wait_ms) {
  struct driver *d = ctx->data;
  return h_poll_step(ctx, max_wait_ms, &d->readable, &d->processed);
}

static int ev_step(h_ctx *ctx, int max_wait_ms) {
  struct driver *d = ctx->data;
  (void)max_wait_ms; /* the tick timer bounds the wait */
  ev_run(d->ev, EVRUN_ONCE);
  return IBMSG_OK;
}

static void tick(struct ev_loop *ev, ev_timer *w, int revents) {
  (void)ev;
  (void)w;
  (void)revents;
}

static int setup_poll(void **state) {
  struct driver *d;
  h_ctx *ctx;

  if (h_setup(state) != 0) return -1;
  ctx = *state;
  d = calloc(1, sizeof *d);
  if (!d) return -1;
  ctx->data = d;
  ctx->step = poll_step;
  return 0;
}

static int setup_ev(void **state, struct ev_loop *ev, int own_ev) {
  struct driver *d = calloc(1, sizeof *d);
  h_ctx *ctx;

  h_watchdog(H_WATCHDOG_S);
  if (!d || !ev) {
    free(d);
    return -1;
  }
  d->ev = ev;
  d->own_ev = own_ev;
  ev_timer_init(&d->tick, tick, 0.02, 0.02);
  ev_timer_start(ev, &d->tick);
  *state = ctx = h_ctx_create(ev);
  ctx->data = d;
  ctx->step = ev_step;
  return 0;
}

static int setup_ev_new(void **state) { return setup_ev(state, ev_loop_new(EVFLAG_AUTO), 1); }
static int setup_ev_default(void **state) { return setup_ev(state, ev_default_loop(0), 0); }

static int teardown_driver(void **state) {
  h_ctx *ctx = *state;
  struct driver *d = ctx ? ctx->data : NULL;
  int rc = h_teardown(state); /* still drives the loop through d */
  if (d && d->ev) {
    ev_timer_stop(d->ev, &d->tick);
    if (d->own_ev) ev_loop_destroy(d->ev);
  }
  free(d);
  return rc;
}

static void connect_and_exchange(h_ctx *ctx) {
  h_conn *client, *server;

  h_pair(ctx, &client, &server);
  client->verify = server->verify = 1;
  h_stream_both(ctx, client, server, MESSAGES, 256, 32, 120000);
  H_ASSERT_EQ(client->sent_ok, MESSAGES, "message_sent(IBMSG_OK) callbacks of the client");
  H_ASSERT_EQ(server->sent_ok, MESSAGES, "message_sent(IBMSG_OK) callbacks of the server");
}

static void poll_on_loop_fd_drives_connection_and_messages(void **state) {
  h_ctx *ctx = *state;
  struct driver *d = ctx->data;

  H_CHECK(ibmsg_event_loop_fd(&ctx->loop) >= 0, "ibmsg_event_loop_fd returned %d",
          ibmsg_event_loop_fd(&ctx->loop));
  connect_and_exchange(ctx);
  print_message("poll: fd readable %d times, %d process calls\n", d->readable, d->processed);
  H_CHECK(d->readable > 0, "the loop fd never became readable: ibmsg ran only on its timeouts");
  h_finish(ctx);
}

static void application_ev_loop_new_drives_connection_and_messages(void **state) {
  connect_and_exchange(*state);
  h_finish(*state);
}

static void application_default_ev_loop_drives_connection_and_messages(void **state) {
  connect_and_exchange(*state);
  h_finish(*state);
}

static void destroy_leaves_no_watcher_on_application_loop(void **state) {
  h_ctx *ctx = *state;
  struct driver *d = ctx->data;
  int active;

  connect_and_exchange(ctx);
  h_finish(ctx); /* ibmsg_destroy_event_loop */
  ev_timer_stop(d->ev, &d->tick);
  active = ev_run(d->ev, EVRUN_NOWAIT);
  H_ASSERT_EQ(active, 0, "active watchers left on the application's libev loop after "
                         "ibmsg_destroy_event_loop");
  ev_timer_start(d->ev, &d->tick); /* the application's loop still works */
  ev_run(d->ev, EVRUN_ONCE);
}

/* A test with the driver its setup starts (every one ends with teardown_driver). */
#define F_TEST(f, setup) cmocka_unit_test_setup_teardown(f, setup, teardown_driver)

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      F_TEST(poll_on_loop_fd_drives_connection_and_messages, setup_poll),
      F_TEST(application_ev_loop_new_drives_connection_and_messages, setup_ev_new),
      F_TEST(application_default_ev_loop_drives_connection_and_messages, setup_ev_default),
      F_TEST(destroy_leaves_no_watcher_on_application_loop, setup_ev_new),
  };
  h_init(argc, argv);
  return cmocka_run_group_tests(tests, NULL, NULL);
}
