/*
 * test_liveness.c - dead, frozen and cut-off peers between two hosts (keepalive, protocol 1.4).
 *
 * Runs on both hosts of test/softroce/run --hosts 2 (test/twohost/run): host 2 listens, host 1
 * connects; each test starts with a barrier. The link between the hosts is cut silently (frames
 * dropped, carriers up) by test/twohost's twohost_link_cut(). Keepalive runs at KA_MS x KA_COUNT
 * here (the defaults, 10 s x 3, are checked by the tools test at the end); every close time is
 * measured from the cut and printed.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../integration/harness.h"
#include "twohost.h"

#define KA_MS 1000
#define KA_COUNT 3
#define BOUND_MS (KA_MS * KA_COUNT)
#define SLACK_MS 1500 /* a tick (an eighth of the interval), the slow link, the emulated CPUs */
#define STEP_MS 30000

static int server(void) { return twohost_index() == 2; }

static void sync_or_fail(const char *name) {
  H_CHECK(twohost_sync(name, 60000) == 0, "the other host never reached '%s'", name);
}

static void keepalive_options(h_ctx *ctx) {
  h_setopt_int(ctx, IBMSG_OPT_KEEPALIVE, KA_MS);
  h_setopt_int(ctx, IBMSG_OPT_KEEPALIVE_COUNT, KA_COUNT);
}

/* Host 2 listens on port, host 1 connects: this host's end of the connection. */
static h_conn *connect_hosts(h_ctx *ctx, unsigned short port, const char *tag) {
  char name[64];
  snprintf(name, sizeof name, "%s-listening", tag);
  if (server()) {
    h_conn *l = &ctx->listener;
    h_conn_reset(l, ctx, "listener");
    H_ASSERT_OK(ibmsg_listen(&ctx->loop, &l->sock, twohost_addr(), port, 4));
    l->sock.user_data = l;
    l->active = 1;
    ctx->port = port;
    sync_or_fail(name);
    H_RUN_UNTIL(ctx, ctx->n_servers == 1 && ctx->servers[0].established, STEP_MS);
    return &ctx->servers[0];
  }
  sync_or_fail(name);
  h_conn *c = h_connect(ctx, twohost_peer_addr(), port);
  H_RUN_UNTIL(ctx, c->established, STEP_MS);
  return c;
}

/* Waits for conn to close with IBMSG_ETIMEDOUT within the bound after t0; prints the time. */
static void expect_timeout(h_ctx *ctx, h_conn *c, uint64_t t0, uint64_t bound_ms, const char *what) {
  H_RUN_UNTIL(ctx, c->closed, bound_ms + SLACK_MS + 5000);
  uint64_t took = c->closed_at_ms - t0;
  printf("host %d: %s: closed %llu ms after the cut (bound %llu ms): %s\n", twohost_index(), what,
         (unsigned long long)took, (unsigned long long)bound_ms, ibmsg_err_name(c->close_reason));
  fflush(stdout);
  H_ASSERT_EQ(c->closed, 1, "closed callbacks");
  H_ASSERT_REASON(c->close_reason, IBMSG_ETIMEDOUT, "close reason");
  H_CHECK(took <= bound_ms + SLACK_MS, "%s: closed %llu ms after the cut, bound %llu ms", what,
          (unsigned long long)took, (unsigned long long)bound_ms);
  H_ASSERT_EQ(c->sent, c->posted, "message_sent callbacks (one per posted message)");
}

static void end_partition(h_ctx *ctx, const char *tag) {
  char name[64];
  snprintf(name, sizeof name, "%s-closed", tag);
  sync_or_fail(name);
  if (!server()) H_CHECK(twohost_link_restore() == 0, "cannot restore the link");
  snprintf(name, sizeof name, "%s-restored", tag);
  sync_or_fail(name);
  if (server()) {
    ibmsg_disconnect(&ctx->listener.sock);
    H_RUN_UNTIL(ctx, ctx->listener.closed, STEP_MS);
  }
}

static void partition_while_idle(void **state) {
  h_ctx *ctx = *state;
  keepalive_options(ctx);
  h_conn *c = connect_hosts(ctx, 17101, "idle");
  sync_or_fail("idle-up");
  if (!server()) H_CHECK(twohost_link_cut() == 0, "cannot cut the link");
  sync_or_fail("idle-cut");  /* the cut is on the shared file system: both see it now */
  uint64_t t0 = h_now_ms();
  expect_timeout(ctx, c, t0, BOUND_MS, "partition while idle");
  end_partition(ctx, "idle");
}

static void partition_while_streaming(void **state) {
  h_ctx *ctx = *state;
  keepalive_options(ctx);
  h_conn *c = connect_hosts(ctx, 17102, "stream");
  c->expect_send_errors = 1;
  if (!server()) {
    h_stream_start(c, 1000000, 1024, 16);
    H_RUN_UNTIL(ctx, c->sent_ok >= 100, STEP_MS);
  } else {
    H_RUN_UNTIL(ctx, c->received >= 100, STEP_MS);
  }
  if (!server()) H_CHECK(twohost_link_cut() == 0, "cannot cut the link");
  uint64_t t0 = h_now_ms();
  /* (no barrier: the receiver sees the cut by the stream stopping) */
  expect_timeout(ctx, c, t0, BOUND_MS, "partition while streaming");
  if (!server()) H_CHECK(c->sent_ok + c->sent_canceled + c->sent_other == c->posted,
                         "every posted message got one callback");
  end_partition(ctx, "stream");
}

static void partition_while_stalled_on_credits(void **state) {
  h_ctx *ctx = *state;
  keepalive_options(ctx);
  h_setopt_int(ctx, IBMSG_OPT_RECV_DEPTH, 4);
  h_setopt_int(ctx, IBMSG_OPT_SHARED_RECV, 0);
  h_conn *c = connect_hosts(ctx, 17103, "stall");
  c->expect_send_errors = 1;
  if (server()) {
    c->hold = 1;  /* the receiver keeps every message: the sender runs out of credits */
    H_RUN_UNTIL(ctx, c->received == 4, STEP_MS);
  } else {
    h_stream_start(c, 12, 256, 12);
    H_RUN_UNTIL(ctx, c->sent_ok == 4, STEP_MS);
  }
  h_run_for(ctx, 2 * BOUND_MS);  /* stalled longer than the bound: the live peer answers */
  H_ASSERT_EQ(c->closed, 0, "closed while stalled with a live peer");
  ibmsg_stats st;
  H_ASSERT_OK(ibmsg_socket_stats(&c->sock, &st, sizeof st));
  if (!server()) H_CHECK(st.credit_stalls >= 1 && st.keepalives_sent >= 1,
                         "stalled sender: %llu stalls, %llu probes", (unsigned long long)st.credit_stalls,
                         (unsigned long long)st.keepalives_sent);
  sync_or_fail("stall-stalled");
  if (!server()) H_CHECK(twohost_link_cut() == 0, "cannot cut the link");
  sync_or_fail("stall-cut");
  uint64_t t0 = h_now_ms();
  expect_timeout(ctx, c, t0, BOUND_MS, "partition while stalled on credits");
  if (server()) h_release_held(c);
  end_partition(ctx, "stall");
}

static void link_flap_shorter_than_the_bound_loses_nothing(void **state) {
  h_ctx *ctx = *state;
  keepalive_options(ctx);
  h_conn *c = connect_hosts(ctx, 17104, "flap");
  const int total = 400;
  if (!server()) {
    h_stream_start(c, total, 2048, 16);
    H_RUN_UNTIL(ctx, c->sent_ok >= 100, STEP_MS);
    H_CHECK(twohost_link_cut() == 0, "cannot cut the link");
    h_run_for(ctx, 1000);
    H_CHECK(twohost_link_restore() == 0, "cannot restore the link");
    H_RUN_UNTIL(ctx, h_stream_done(c), STEP_MS);
    H_ASSERT_EQ(c->sent_ok, total, "messages confirmed");
  } else {
    c->verify = 1;
    c->expect_size = 2048;
    H_RUN_UNTIL(ctx, c->received == total, STEP_MS);
  }
  H_ASSERT_EQ(c->closed, 0, "closed by a flap shorter than the bound");
  sync_or_fail("flap-done");
  if (!server()) {
    ibmsg_disconnect(&c->sock);
    H_RUN_UNTIL(ctx, c->closed, STEP_MS);
    H_ASSERT_REASON(c->close_reason, IBMSG_OK, "close reason");
  } else {
    H_RUN_UNTIL(ctx, c->closed, STEP_MS);
    ibmsg_disconnect(&ctx->listener.sock);
    H_RUN_UNTIL(ctx, ctx->listener.closed, STEP_MS);
  }
  sync_or_fail("flap-closed");
}

/* The frozen side: a child process on host 2 that serves one connection, stopped by its parent
 * (SIGSTOP) once established. Resumed after host 1 gave up, it must see its connection close
 * exactly once and leave cleanly. Exit status 0 when it did. */
static int frozen_closed, frozen_reason = -1;
static void frozen_on_closed(ibmsg_socket *s, int reason) {
  (void)s;
  ++frozen_closed;
  frozen_reason = reason;
}
static ibmsg_socket frozen_conn;
static void frozen_on_request(ibmsg_connection_request *req) { ibmsg_accept(req, &frozen_conn); }
static int frozen_child(int ready_fd) {
  ibmsg_event_loop loop;
  ibmsg_socket listener;
  int ka = KA_MS, count = KA_COUNT;
  memset(&loop, 0, sizeof loop);
  if (ibmsg_init_event_loop(&loop) != IBMSG_OK) return 2;
  ibmsg_setopt(&loop, IBMSG_OPT_KEEPALIVE, &ka, sizeof ka);
  ibmsg_setopt(&loop, IBMSG_OPT_KEEPALIVE_COUNT, &count, sizeof count);
  loop.connection_request = frozen_on_request;
  loop.connection_closed = frozen_on_closed;
  if (ibmsg_listen(&loop, &listener, twohost_addr(), 17105, 1) != IBMSG_OK) return 3;
  if (twohost_sync("frozen-listening", 60000) != 0) return 4;
  uint64_t end = h_now_ms() + STEP_MS;
  int told = 0;
  /* Established: tell the parent (which stops us), then keep running the loop. */
  while (h_now_ms() < end && frozen_closed == 0) {
    ibmsg_dispatch_event_loop_timeout(&loop, 50);
    if (!told && frozen_conn.status == IBMSG_CONNECTED) {
      told = 1;
      if (write(ready_fd, "u", 1) != 1) return 5;
      end = h_now_ms() + 4 * STEP_MS;
    }
  }
  if (frozen_closed != 1) return 6;
  printf("host 2: the frozen side, resumed, closed with %s\n", ibmsg_err_name(frozen_reason));
  fflush(stdout);
  ibmsg_disconnect(&listener);
  for (int i = 0; i < 100; ++i) ibmsg_dispatch_event_loop_timeout(&loop, 10);
  return ibmsg_destroy_event_loop(&loop) == IBMSG_OK && frozen_closed == 2 ? 0 : 7;
}

static void frozen_peer_is_detected(void **state) {
  h_ctx *ctx = *state;
  keepalive_options(ctx);
  if (server()) {
    int fds[2];
    H_CHECK(pipe(fds) == 0, "pipe: %s", strerror(errno));
    fflush(stdout);
    pid_t pid = fork();
    H_CHECK(pid >= 0, "fork: %s", strerror(errno));
    if (pid == 0) {
      close(fds[0]);
      _exit(frozen_child(fds[1]));
    }
    close(fds[1]);
    char b;
    H_CHECK(read(fds[0], &b, 1) == 1, "the child never got its connection up");
    close(fds[0]);
    H_CHECK(kill(pid, SIGSTOP) == 0, "SIGSTOP: %s", strerror(errno));
    sync_or_fail("frozen-stopped");
    sync_or_fail("frozen-detected");
    H_CHECK(kill(pid, SIGCONT) == 0, "SIGCONT: %s", strerror(errno));
    int status = -1;
    uint64_t end = h_now_ms() + STEP_MS;
    while (waitpid(pid, &status, WNOHANG) == 0 && h_now_ms() < end) usleep(20000);
    if (h_now_ms() >= end) kill(pid, SIGKILL), waitpid(pid, &status, 0);
    H_CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0,
            "the frozen side, resumed, did not close cleanly (status 0x%x)", status);
  } else {
    sync_or_fail("frozen-listening");
    h_conn *c = h_connect(ctx, twohost_peer_addr(), 17105);
    H_RUN_UNTIL(ctx, c->established, STEP_MS);
    sync_or_fail("frozen-stopped");
    uint64_t t0 = h_now_ms();
    expect_timeout(ctx, c, t0, BOUND_MS, "peer frozen (SIGSTOP)");
    sync_or_fail("frozen-detected");
  }
  sync_or_fail("frozen-end");
}

/* The tools with default options: ibmsg-send streaming to ibmsg-recv on the other host exits
 * with an error naming the timeout when the link is cut. */
static void tools_report_a_cut_link_as_a_timeout(void **state) {
  (void)state;
  const char *builddir = getenv("IBMSG_BUILDDIR") ? getenv("IBMSG_BUILDDIR") : ".";
  char cmd[1024];
  if (server()) {
    pid_t pid = fork();
    H_CHECK(pid >= 0, "fork: %s", strerror(errno));
    if (pid == 0) {
      snprintf(cmd, sizeof cmd, "%s/examples/ibmsg-recv", builddir);
      execl(cmd, "ibmsg-recv", "-q", "-n", "100000000", twohost_addr(), "17106", (char *)NULL);
      _exit(127);
    }
    usleep(500000);
    sync_or_fail("tools-listening");
    sync_or_fail("tools-sender-done");
    kill(pid, SIGTERM);
    waitpid(pid, NULL, 0);
  } else {
    sync_or_fail("tools-listening");
    pid_t pid = fork();
    H_CHECK(pid >= 0, "fork: %s", strerror(errno));
    if (pid == 0) {
      FILE *e = freopen("/tmp/send.err", "w", stderr);
      (void)e;
      snprintf(cmd, sizeof cmd, "%s/examples/ibmsg-send", builddir);
      execl(cmd, "ibmsg-send", "-q", "-n", "100000000", "-s", "1024", twohost_peer_addr(), "17106",
            (char *)NULL);
      _exit(127);
    }
    uint64_t t0 = h_now_ms();
    sleep(3);
    H_CHECK(twohost_link_cut() == 0, "cannot cut the link: %s", twohost_error());
    int status = -1, raw = 0;
    uint64_t end = h_now_ms() + 30000 + 10000;
    while (waitpid(pid, &raw, WNOHANG) == 0 && h_now_ms() < end) usleep(50000);
    uint64_t took = h_now_ms() - t0;
    if (h_now_ms() >= end) kill(pid, SIGKILL), waitpid(pid, &raw, 0);
    twohost_link_restore();
    if (WIFEXITED(raw)) status = WEXITSTATUS(raw);
    char err[1024] = "";
    FILE *f = fopen("/tmp/send.err", "r");
    size_t n = f ? fread(err, 1, sizeof err - 1, f) : 0;
    err[n] = '\0';
    if (f) fclose(f);
    printf("host 1: ibmsg-send exited %d, %llu ms after its start (cut at 3 s): %s", status,
           (unsigned long long)took, err);
    fflush(stdout);
    H_CHECK(status == 1, "ibmsg-send exited %d, expected 1", status);
    H_CHECK(strstr(err, "timed out") != NULL, "ibmsg-send's error does not name the timeout: %s", err);
    H_CHECK(took <= 3000 + 30000 + 5000, "ibmsg-send took %llu ms", (unsigned long long)took);
    sync_or_fail("tools-sender-done");
  }
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      H_TEST(partition_while_idle),
      H_TEST(partition_while_streaming),
      H_TEST(partition_while_stalled_on_credits),
      H_TEST(link_flap_shorter_than_the_bound_loses_nothing),
      H_TEST(frozen_peer_is_detected),
      H_TEST(tools_report_a_cut_link_as_a_timeout),
  };
  h_init(argc, argv);
  return cmocka_run_group_tests(tests, NULL, NULL);
}
