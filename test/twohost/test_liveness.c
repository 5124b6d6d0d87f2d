/*
 * test_liveness.c - dead, frozen and cut-off peers between two hosts (keepalive, protocol 1.4).
 *
 * Runs on both hosts of test/softroce/run --hosts 2 (test/twohost/run): host 2 listens, host 1
 * connects. The link between the hosts is cut silently (frames dropped both ways, carriers and
 * RDMA ports up: a failed switch) by twohost_link_cut(). Keepalive runs at KA_MS x KA_COUNT here;
 * the last test runs the tools with the defaults (10 s x 3). Each host measures how long after
 * the cut its end closed and prints it; host 1 measures from the cut itself, host 2 from the
 * barrier right after it (a few ms later).
 */
#define _POSIX_C_SOURCE 200809L

/* The harness is compiled into this program. */
#include "../integration/harness.c"
#include "xtest.h"

#include <errno.h>
#include <signal.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#define KA_MS 1000
#define KA_COUNT 3
#define BOUND_MS (KA_MS * KA_COUNT)
#define SLACK_MS 1500 /* a tick (an eighth of the interval), the slow link, the emulated CPUs */
#define STEP_MS 30000

static void keepalive_options(h_ctx *ctx) {
  h_setopt_int(ctx, IBMSG_OPT_KEEPALIVE, KA_MS);
  h_setopt_int(ctx, IBMSG_OPT_KEEPALIVE_COUNT, KA_COUNT);
}

/* The start of a test here: X_BEGIN, and keepalive at KA_MS x KA_COUNT. */
#define L_BEGIN(ctx)                                                                            \
  do {                                                                                          \
    X_BEGIN(ctx);                                                                               \
    keepalive_options(ctx);                                                                     \
  } while (0)

/* The link: cut (returns when the cut began, in h_now_ms()) and healed (see xtest.h). */
#define l_cut(ctx) x_link_cut((ctx), h_now_ms)
#define l_restore(ctx) ((void)x_link_restore((ctx), h_now_ms))

/* Waits for c to close with IBMSG_ETIMEDOUT within the bound after t0; prints the time. */
static void expect_timeout(h_ctx *ctx, h_conn *c, uint64_t t0, const char *what) {
  H_RUN_UNTIL(ctx, c->closed, BOUND_MS + SLACK_MS + 10000);
  uint64_t took = c->closed_at_ms - t0;
  print_message("  %s: %s: closed %llu ms after the cut (bound %d ms): %s\n", twohost_role(), what,
                (unsigned long long)took, BOUND_MS, ibmsg_err_name(c->close_reason));
  h_run_for(ctx, 200); /* nothing more may come */
  H_ASSERT_EQ(c->closed, 1, "connection_closed callbacks");
  H_ASSERT_REASON(c->close_reason, IBMSG_ETIMEDOUT, "close reason");
  H_CHECK(took <= BOUND_MS + SLACK_MS, "%s: closed %llu ms after the cut, bound %d ms + %d ms",
          what, (unsigned long long)took, BOUND_MS, SLACK_MS);
  /* The silence began at most an interval before the cut (the last probe's answer). */
  H_CHECK(took + KA_MS + 500 >= BOUND_MS, "%s: closed %llu ms after the cut: too early for a "
          "bound of %d ms", what, (unsigned long long)took, BOUND_MS);
  H_ASSERT_EQ(c->sent, c->posted, "message_sent callbacks (one per posted message)");
}

/* Cuts the link and waits for c to close with IBMSG_ETIMEDOUT within the bound after the cut. */
static void cut_and_expect_timeout(h_ctx *ctx, h_conn *c, const char *what) {
  expect_timeout(ctx, c, l_cut(ctx), what);
}

/* A test that failed midway may leave the link cut: heal it before the next one. */
static int l_teardown(void **state) {
  if (twohost_link_is_cut() == 1) twohost_link_restore();
  return x_teardown(state);
}
#define L_TEST(f) cmocka_unit_test_setup_teardown(f, h_setup, l_teardown)

static void partition_while_idle_closes_both_ends_in_bounded_time(void **state) {
  h_ctx *ctx = *state;
  L_BEGIN(ctx);
  h_conn *c = x_pair(ctx, 0);
  h_run_for(ctx, 2 * KA_MS); /* idle but alive: probes are answered */
  H_ASSERT_EQ(c->closed, 0, "closed while idle with a live peer");
  cut_and_expect_timeout(ctx, c, "partition while idle");
  l_restore(ctx);
  x_finish(ctx);
}

static void partition_while_streaming_closes_both_ends_in_bounded_time(void **state) {
  h_ctx *ctx = *state;
  L_BEGIN(ctx);
  x_local(ctx)->expect_send_errors = 1;
  x_local(ctx)->verify = 1;
  x_local(ctx)->expect_size = 1024;
  h_conn *c = x_pair(ctx, 0);
  if (twohost_is_client()) {
    h_stream_start(c, 1000000, 1024, 16);
    H_RUN_UNTIL(ctx, c->sent_ok >= 100, STEP_MS);
  } else {
    H_RUN_UNTIL(ctx, c->received >= 100, STEP_MS);
  }
  cut_and_expect_timeout(ctx, c, "partition while streaming");
  if (twohost_is_client()) {
    H_ASSERT_EQ(c->sent_ok + c->sent_canceled + c->sent_other, c->posted, "message_sent callbacks");
    H_ASSERT_EQ(c->stream_inflight, 0, "stream messages never given back");
    print_message("  client: %d sent, %d canceled, %d failed otherwise\n", c->sent_ok,
                  c->sent_canceled, c->sent_other);
  }
  l_restore(ctx);
  x_finish(ctx);
}

static void partition_while_stalled_on_credits_closes_both_ends(void **state) {
  h_ctx *ctx = *state;
  L_BEGIN(ctx);
  h_setopt_int(ctx, IBMSG_OPT_RECV_DEPTH, 4);
  h_setopt_int(ctx, IBMSG_OPT_SHARED_RECV, 0);
  x_local(ctx)->expect_send_errors = 1;
  x_local(ctx)->hold = twohost_is_server(); /* the receiver keeps every message */
  h_conn *c = x_pair(ctx, 0);
  if (twohost_is_server()) {
    H_RUN_UNTIL(ctx, c->received == 4, STEP_MS);
  } else {
    h_stream_start(c, 12, 256, 12);
    H_RUN_UNTIL(ctx, c->sent_ok == 4, STEP_MS);
  }
  h_run_for(ctx, 2 * BOUND_MS); /* stalled for longer than the bound: the live peer answers */
  H_ASSERT_EQ(c->closed, 0, "closed while stalled with a live peer");
  H_ASSERT_EQ(c->received, twohost_is_server() ? 4 : 0, "messages received while stalled");
  ibmsg_stats st;
  memset(&st, 0, sizeof st);
  H_ASSERT_OK(ibmsg_socket_stats(&c->sock, &st, sizeof st));
  print_message("  %s: stalled: %llu credit stalls, %llu probes sent, %llu received\n",
                twohost_role(), (unsigned long long)st.credit_stalls,
                (unsigned long long)st.keepalives_sent, (unsigned long long)st.keepalives_received);
  if (twohost_is_client())
    H_CHECK(st.credit_stalls >= 1 && st.keepalives_sent >= 1,
            "the stalled sender: %llu credit stalls, %llu probes sent",
            (unsigned long long)st.credit_stalls, (unsigned long long)st.keepalives_sent);
  cut_and_expect_timeout(ctx, c, "partition while stalled on credits");
  l_restore(ctx);
  x_finish(ctx);
}

static void link_flap_shorter_than_the_bound_loses_nothing(void **state) {
  h_ctx *ctx = *state;
  const int total = 400;
  L_BEGIN(ctx);
  x_local(ctx)->verify = 1;
  x_local(ctx)->expect_size = 2048;
  h_conn *c = x_pair(ctx, 0);
  if (twohost_is_client()) {
    h_stream_start(c, total, 2048, 16);
    H_RUN_UNTIL(ctx, c->sent_ok >= 100 || c->closed, STEP_MS);
    x_assert_open(c);
    H_CHECK(twohost_link_cut() == 0, "cannot cut the link: %s", twohost_error());
    h_run_for(ctx, KA_MS);
    H_CHECK(twohost_link_restore() == 0, "cannot restore the link: %s", twohost_error());
    H_RUN_UNTIL(ctx, h_stream_done(c) || c->closed, STEP_MS);
    x_assert_open(c);
    H_ASSERT_EQ(c->sent_ok, total, "messages confirmed");
  } else {
    H_RUN_UNTIL(ctx, c->received == total || c->closed, STEP_MS);
    x_assert_open(c);
  }
  X_SYNC(ctx, "all through");
  H_ASSERT_EQ(c->closed, 0, "closed by a flap shorter than the bound");
  print_message("  %s: %d messages through a %d ms cut\n", twohost_role(),
                twohost_is_client() ? c->sent_ok : c->received, KA_MS);
  x_finish(ctx);
}

/* The frozen side: a child process on host 2 that serves one connection and is stopped
 * (SIGSTOP) by its parent once the connection is up. Resumed after host 1 gave up, it must see
 * its connection close exactly once, with IBMSG_ECONNRESET, and leave cleanly: exit status 0
 * when it did. */
static int frozen_closed, frozen_reason = -1;
static ibmsg_socket frozen_listener, frozen_conn;
static void frozen_on_closed(ibmsg_socket *s, int reason) {
  if (s == &frozen_conn) frozen_reason = reason;
  ++frozen_closed;
}
static void frozen_on_request(ibmsg_connection_request *req) { ibmsg_accept(req, &frozen_conn); }
static int frozen_child(int ready_fd, int port_fd) {
  ibmsg_event_loop loop;
  int ka = KA_MS, count = KA_COUNT;
  char port[16];
  memset(&loop, 0, sizeof loop);
  if (ibmsg_init_event_loop(&loop) != IBMSG_OK) return 2;
  ibmsg_setopt(&loop, IBMSG_OPT_KEEPALIVE, &ka, sizeof ka);
  ibmsg_setopt(&loop, IBMSG_OPT_KEEPALIVE_COUNT, &count, sizeof count);
  loop.connection_request = frozen_on_request;
  loop.connection_closed = frozen_on_closed;
  if (ibmsg_listen(&loop, &frozen_listener, twohost_addr(), 0, 1) != IBMSG_OK) return 3;
  unsigned short p = 0;
  if (ibmsg_socket_local_address(&frozen_listener, NULL, 0, &p) != IBMSG_OK || p == 0) return 4;
  snprintf(port, sizeof port, "%u", (unsigned)p);
  if (write(port_fd, port, strlen(port) + 1) != (ssize_t)strlen(port) + 1) return 4;
  uint64_t end = h_now_ms() + STEP_MS;
  int told = 0;
  while (h_now_ms() < end && frozen_reason == -1) {
    ibmsg_dispatch_event_loop_timeout(&loop, 20);
    if (!told && frozen_conn.status == IBMSG_CONNECTED) {
      told = 1; /* the parent stops this process now; the time it was stopped does not count */
      if (write(ready_fd, "u", 1) != 1) return 5;
      end = h_now_ms() + STEP_MS;
    }
  }
  if (!told || frozen_reason == -1) return 6;
  printf("  server: the frozen side, resumed, closed with %s\n", ibmsg_err_name(frozen_reason));
  fflush(stdout);
  ibmsg_disconnect(&frozen_listener);
  for (int i = 0; i < 200 && frozen_closed < 2; ++i) ibmsg_dispatch_event_loop_timeout(&loop, 10);
  if (frozen_closed != 2) return 7;
  /* The peer gave up and disconnected while this side was stopped: the disconnect, not the
   * posts that fail after it, says why (a post failure would close with IBMSG_EIO). */
  if (frozen_reason != IBMSG_ECONNRESET) return 9;
  return ibmsg_destroy_event_loop(&loop) == IBMSG_OK ? 0 : 8;
}

static void frozen_peer_is_detected_and_closes_cleanly_when_resumed(void **state) {
  h_ctx *ctx = *state;
  L_BEGIN(ctx);
  if (twohost_is_server()) {
    int ready[2], ports[2], status = -1;
    char port[16] = "";
    H_CHECK(pipe(ready) == 0 && pipe(ports) == 0, "pipe: %s", strerror(errno));
    fflush(stdout);
    pid_t pid = fork();
    H_CHECK(pid >= 0, "fork: %s", strerror(errno));
    if (pid == 0) {
      close(ready[0]);
      close(ports[0]);
      _exit(frozen_child(ready[1], ports[1]));
    }
    close(ready[1]);
    close(ports[1]);
    ssize_t n = read(ports[0], port, sizeof port - 1);
    close(ports[0]);
    if (n <= 0) kill(pid, SIGKILL), waitpid(pid, &status, 0);
    H_CHECK(n > 0, "the frozen side did not listen (exit status 0x%x)", status);
    X_EXCHANGE(ctx, "listening", port, NULL, 0);
    char b;
    n = read(ready[0], &b, 1);
    close(ready[0]);
    if (n != 1) kill(pid, SIGKILL), waitpid(pid, &status, 0);
    H_CHECK(n == 1, "the frozen side never got its connection up (exit status 0x%x)", status);
    H_CHECK(kill(pid, SIGSTOP) == 0, "SIGSTOP: %s", strerror(errno));
    X_SYNC(ctx, "stopped");
    X_SYNC(ctx, "detected");
    H_CHECK(kill(pid, SIGCONT) == 0, "SIGCONT: %s", strerror(errno));
    uint64_t end = h_now_ms() + STEP_MS;
    while (waitpid(pid, &status, WNOHANG) == 0 && h_now_ms() < end) h_run_for(ctx, 20);
    if (h_now_ms() >= end) kill(pid, SIGKILL), waitpid(pid, &status, 0);
    H_CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0,
            "the frozen side, resumed, did not close cleanly (status 0x%x)", status);
  } else {
    char port[16];
    X_EXCHANGE(ctx, "listening", NULL, port, sizeof port);
    h_conn *c = h_connect(ctx, twohost_peer_addr(), (unsigned short)atoi(port));
    H_RUN_UNTIL(ctx, c->established || c->closed, STEP_MS);
    x_assert_open(c);
    X_SYNC(ctx, "stopped");
    uint64_t t0 = h_now_ms();
    expect_timeout(ctx, c, t0, "peer frozen (SIGSTOP)");
    X_SYNC(ctx, "detected");
  }
  x_finish(ctx);
}

/* Runs a tool of the build with its stderr in errfile; returns its pid. */
static pid_t spawn_tool(const char *const argv[], const char *errfile) {
  char path[512];
  fflush(stdout);
  pid_t pid = fork();
  if (pid != 0) return pid;
  if (!freopen(errfile, "w", stderr)) _exit(126);
  snprintf(path, sizeof path, "examples/%s", argv[0]);
  execv(path, (char *const *)argv);
  _exit(127);
}

/* Waits up to ms for pid; returns its exit status, or -1 after killing it. */
static int wait_tool(h_ctx *ctx, pid_t pid, int ms) {
  int raw = 0;
  uint64_t end = h_now_ms() + (uint64_t)ms;
  while (waitpid(pid, &raw, WNOHANG) == 0) {
    if (h_now_ms() >= end) {
      kill(pid, SIGKILL);
      waitpid(pid, &raw, 0);
      return -1;
    }
    h_run_for(ctx, 50);
  }
  return WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
}

static void read_file(const char *path, char *buf, size_t len) {
  FILE *f = fopen(path, "r");
  size_t n = f ? fread(buf, 1, len - 1, f) : 0;
  buf[n] = '\0';
  if (f) fclose(f);
}

/* ibmsg-send streaming to ibmsg-recv on the other host, both with ibmsg's default keepalive:
 * when the link is cut, each exits with status 1 and an error that names the timeout, within
 * the default bound (30 s) after the cut. */
static void tools_with_defaults_report_a_cut_link_as_a_timeout(void **state) {
  h_ctx *ctx = *state;
  const int bound_ms = 30000;
  const char *const recv_argv[] = {"ibmsg-recv", "-q", "-c", "1", twohost_addr(), "17106", NULL};
  const char *const send_argv[] = {"ibmsg-send", "-q", "-n", "100000000", "-s", "1024",
                                   twohost_peer_addr(), "17106", NULL};
  const char *const *argv = twohost_is_server() ? recv_argv : send_argv;
  char errfile[64], err[2048];
  pid_t pid = -1;

  snprintf(errfile, sizeof errfile, "/tmp/%s.err", argv[0]);
  X_BEGIN(ctx);
  if (twohost_is_server()) { /* the receiver listens first */
    pid = spawn_tool(argv, errfile);
    H_CHECK(pid > 0, "fork: %s", strerror(errno));
    h_run_for(ctx, 1000);
  }
  X_SYNC(ctx, "listening");
  if (twohost_is_client()) {
    pid = spawn_tool(argv, errfile);
    H_CHECK(pid > 0, "fork: %s", strerror(errno));
  }
  h_run_for(ctx, 3000); /* streaming */
  uint64_t t0 = l_cut(ctx);
  int st = wait_tool(ctx, pid, bound_ms + SLACK_MS + 10000);
  uint64_t took = h_now_ms() - t0;
  read_file(errfile, err, sizeof err);
  print_message("  %s: %s exited %d %llu ms after the cut: %s", twohost_role(), argv[0], st,
                (unsigned long long)took, err);
  H_ASSERT_EQ(st, 1, "the tool's exit status");
  H_CHECK(strstr(err, "timed out") != NULL, "%s's error does not name the timeout", argv[0]);
  H_CHECK(took + 1000 + 500 >= (uint64_t)bound_ms && took <= (uint64_t)bound_ms + SLACK_MS,
          "%s exited %llu ms after the cut, the bound is %d ms", argv[0], (unsigned long long)took,
          bound_ms);
  l_restore(ctx);
  x_finish(ctx);
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      L_TEST(partition_while_idle_closes_both_ends_in_bounded_time),
      L_TEST(partition_while_streaming_closes_both_ends_in_bounded_time),
      L_TEST(partition_while_stalled_on_credits_closes_both_ends),
      L_TEST(link_flap_shorter_than_the_bound_loses_nothing),
      L_TEST(frozen_peer_is_detected_and_closes_cleanly_when_resumed),
      L_TEST(tools_with_defaults_report_a_cut_link_as_a_timeout),
  };
  return X_MAIN("test_liveness", tests);
}
