/*
 * xtest.h - the frame of a cmocka test that runs on both hosts of test/twohost/run: named
 * barriers that keep the ibmsg loop running (X_SYNC), a test start both hosts meet at (X_BEGIN),
 * connecting the two hosts (x_pair), an end that closes everything (x_finish), and a teardown
 * that makes the peer give up on the barriers of a test that failed here (X_TEST).
 *
 * Included by a test program after ../integration/harness.c (compiled into the program), so
 * everything here is static to it.
 */
#ifndef IBMSG_TEST_XTEST_H
#define IBMSG_TEST_XTEST_H

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "twohost.h"

#define BEGIN_MS 120000 /* the peer may still be failing its previous test */
#define SYNC_MS 60000

#if defined(__GNUC__)
#define X_UNUSED __attribute__((unused))
#else
#define X_UNUSED
#endif

/* --- two hosts ----------------------------------------------------------------------------- */

static const char *x_test = "(none)"; /* the running test: barrier names start with it */
static int x_done;                    /* it got through x_finish() */

static X_UNUSED void x_idle(void *arg) {
  h_ctx *ctx = arg;
  h_progress++; /* waiting at a barrier (bounded by its own limit) is not a hang: see h_watchdog */
  if (ctx && ctx->loop_initialized) ctx->step(ctx, 5);
}

/* Barrier "TEST:step" with the peer, running the loop meanwhile; data is swapped when mine or
 * theirs is given. Fails the test if the peer does not come. */
static X_UNUSED void x_exchange_at(h_ctx *ctx, const char *step, const char *mine, char *theirs,
                                   size_t len, int timeout_ms, const char *file, int line) {
  char name[160];
  snprintf(name, sizeof name, "%s:%s", x_test, step);
  if (twohost_exchange_idle(name, mine, theirs, len, timeout_ms, x_idle, ctx) != 0)
    h_fail_at(file, line, "%s", twohost_error());
  if (ctx) h_check_errors_at(ctx, file, line);
}
#define X_EXCHANGE(ctx, step, mine, theirs, len)                                                \
  x_exchange_at((ctx), (step), (mine), (theirs), (len), SYNC_MS, __FILE__, __LINE__)
#define X_SYNC(ctx, step) x_exchange_at((ctx), (step), NULL, NULL, 0, SYNC_MS, __FILE__, __LINE__)

/* Starts a test on both hosts: both are past their previous test and have a fresh context. */
#define X_BEGIN(ctx)                                                                            \
  do {                                                                                          \
    x_test = __func__;                                                                          \
    x_done = 0;                                                                                 \
    x_exchange_at((ctx), "begin", NULL, NULL, 0, BEGIN_MS, __FILE__, __LINE__);                 \
  } while (0)

/* The record this host's end of the connection of x_pair() will use: set flags on it (hold,
 * verify ...) before x_pair(), so that they are in force from the first message on. */
static X_UNUSED h_conn *x_local(h_ctx *ctx) {
  return twohost_is_server() ? &ctx->servers[ctx->n_servers] : &ctx->clients[ctx->n_clients];
}

/* On the server: waits until the accepted connection ctx->servers[i] is established (or
 * closed) and checks that it did not close; `what` names it in the failure. */
static X_UNUSED h_conn *x_await_accepted(h_ctx *ctx, int i, int timeout_ms, const char *what) {
  h_conn *c = &ctx->servers[i];
  H_RUN_UNTIL(ctx, ctx->n_servers == i + 1 && (c->established || c->closed), timeout_ms);
  H_CHECK(!c->closed, "%s closed with %s instead of connecting", what,
          ibmsg_err_name(c->close_reason));
  return c;
}

/* Connects the two hosts: the server listens on its address (IPv4, or IPv6 with ipv6) and
 * tells the client its port; both wait until their end is established. Returns this host's
 * end. */
static X_UNUSED h_conn *x_pair_at(h_ctx *ctx, int ipv6, const char *file, int line) {
  char port[16];
  h_conn *c;
  unsigned long p;
  char *end;
  uint64_t start = h_now_ms();

  if (twohost_is_server()) {
    h_listen(ctx, ipv6 ? twohost_addr6() : twohost_addr(), 4);
    snprintf(port, sizeof port, "%u", (unsigned)ctx->port);
    x_exchange_at(ctx, "listening", port, NULL, 0, SYNC_MS, file, line);
    c = x_await_accepted(ctx, 0, H_TIMEOUT_MS, "the accepted connection");
  } else {
    x_exchange_at(ctx, "listening", NULL, port, sizeof port, SYNC_MS, file, line);
    p = strtoul(port, &end, 10);
    H_CHECK(*end == 0 && p > 0 && p < 65536, "the server sent '%s' as its port", port);
    c = h_connect(ctx, ipv6 ? twohost_peer_addr6() : twohost_peer_addr(), (unsigned short)p);
    H_RUN_UNTIL(ctx, c->established || c->closed, H_TIMEOUT_MS);
    H_CHECK(!c->closed, "connecting to %s port %lu failed: %s",
            ipv6 ? twohost_peer_addr6() : twohost_peer_addr(), p, ibmsg_err_name(c->close_reason));
  }
  H_ASSERT_STATUS(c->sock.status, IBMSG_CONNECTED, "status of this host's end");
  x_exchange_at(ctx, "connected", NULL, NULL, 0, SYNC_MS, file, line);
  print_message("  %s: connected over %s in %llu ms\n", twohost_role(), ipv6 ? "IPv6" : "IPv4",
                (unsigned long long)(h_now_ms() - start));
  return c;
}
#define x_pair(ctx, ipv6) x_pair_at((ctx), (ipv6), __FILE__, __LINE__)

/* Ends a test: once both hosts are done checking, closes everything (the client disconnects,
 * the server waits for that) and destroys the loop, asserting each step. */
static X_UNUSED void x_finish(h_ctx *ctx) {
  X_SYNC(ctx, "checked");
  h_finish(ctx);
  x_done = 1;
}

/* --- stalls of the whole host ---------------------------------------------------------------
 * A check of how late something fires measures the library only while this host is running: a
 * VM whose vCPUs the host did not run for a while (a loaded CI machine) is late at everything.
 * The stall watch is a thread that sleeps a millisecond at a time and keeps the longest gap
 * between two of its wake-ups (CLOCK_MONOTONIC): a bound on lateness adds it, so that a stall
 * of the host does not fail the check, and a late timer on a host that ran does. */
static struct {
  pthread_t thread;
  int running;
  int stop;     /* __atomic */
  long max_us;  /* __atomic: the longest gap so far */
} x_stall;

static uint64_t x_mono_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

static void *x_stall_main(void *arg) {
  const struct timespec ms = {0, 1000000};
  uint64_t last = x_mono_us();
  (void)arg;
  while (!__atomic_load_n(&x_stall.stop, __ATOMIC_ACQUIRE)) {
    uint64_t now;
    long gap;
    nanosleep(&ms, NULL);
    now = x_mono_us();
    gap = (long)(now - last);
    if (gap > __atomic_load_n(&x_stall.max_us, __ATOMIC_RELAXED))
      __atomic_store_n(&x_stall.max_us, gap, __ATOMIC_RELAXED);
    last = now;
  }
  return NULL;
}

/* Starts the watch (the longest gap starts at 0). */
static X_UNUSED void x_stall_start(void) {
  H_CHECK(!x_stall.running, "the stall watch runs already");
  x_stall.stop = 0;
  x_stall.max_us = 0;
  H_CHECK(pthread_create(&x_stall.thread, NULL, x_stall_main, NULL) == 0,
          "cannot start the stall watch");
  x_stall.running = 1;
}

/* The longest gap in microseconds since x_stall_start(), the watch still running. */
static X_UNUSED long x_stall_max_us(void) {
  return __atomic_load_n(&x_stall.max_us, __ATOMIC_RELAXED);
}

/* Stops the watch; returns its longest gap in microseconds (0 if it was not running). */
static X_UNUSED long x_stall_stop(void) {
  if (!x_stall.running) return 0;
  __atomic_store_n(&x_stall.stop, 1, __ATOMIC_RELEASE);
  pthread_join(x_stall.thread, NULL);
  x_stall.running = 0;
  return x_stall.max_us;
}

/* cmocka teardown: a test that did not get through x_finish() failed on this host; the peer's
 * waits at its remaining barriers then fail at once. */
static X_UNUSED int x_teardown(void **state) {
  char prefix[160];
  if (!x_done) {
    snprintf(prefix, sizeof prefix, "%s:", x_test);
    if (twohost_abandon(prefix) != 0) print_error("%s\n", twohost_error());
  }
  x_done = 1;
  x_stall_stop();
  return h_teardown(state);
}
#define X_TEST(f) cmocka_unit_test_setup_teardown(f, h_setup, x_teardown)

/* Cuts the link (host 1 does) and meets the peer behind the cut; returns when the cut began as
 * this host knows it, on the clock now(). */
static X_UNUSED uint64_t x_link_cut(h_ctx *ctx, uint64_t (*now)(void)) {
  uint64_t t0 = now();
  if (twohost_is_client()) {
    H_CHECK(twohost_link_cut() == 0, "cannot cut the link: %s", twohost_error());
    t0 = now();
  }
  X_SYNC(ctx, "cut");
  return twohost_is_client() ? t0 : now();
}

/* Heals the link once both hosts are done with the partition; returns when it was healed, on
 * the clock now(). */
static X_UNUSED uint64_t x_link_restore(h_ctx *ctx, uint64_t (*now)(void)) {
  uint64_t t0;
  X_SYNC(ctx, "partition over");
  if (twohost_is_client())
    H_CHECK(twohost_link_restore() == 0, "cannot restore the link: %s", twohost_error());
  t0 = now();
  X_SYNC(ctx, "restored");
  return t0;
}

/* The main() of a two-host test program: checks the rig, applies argv's test filter, says where
 * it runs and runs the tests. */
static X_UNUSED int x_main_at(int argc, char **argv, const char *program,
                              const struct CMUnitTest *tests, size_t n) {
  if (twohost_init() != 0) {
    fprintf(stderr, "%s: %s\n", program, twohost_error());
    return 1;
  }
  h_init(argc, argv);
  print_message("%s on host %d (%s): %s, peer %s\n", program, twohost_index(), twohost_role(),
                twohost_addr(), twohost_peer_addr());
  return _cmocka_run_group_tests("tests", tests, n, NULL, NULL);
}
#define X_MAIN(program, tests) x_main_at(argc, argv, (program), (tests), sizeof(tests) / sizeof((tests)[0]))

static X_UNUSED void x_assert_open(h_conn *c) {
  H_CHECK(!c->closed, "%s closed with %s: a message was probably sent without a credit", c->name,
          ibmsg_err_name(c->close_reason));
}

#endif /* IBMSG_TEST_XTEST_H */
