/* test_device_removal.c - an RDMA device removed under a running ibmsg program: its sockets close
 * with IBMSG_ENODEV, and once they closed (and every message was freed) the device is released,
 * so `rdma link delete` returns at once while the program goes on running.
 *
 * librdmacm closes a removed device only when its rescan of the device list finds another device
 * (with none left, rdma-core 44's sync_devices_list() stops early and keeps the dead device open
 * until the process exits), so the test first adds a second rxe device, as a machine with more
 * than one device has.
 *
 * Destructive: it deletes the device and adds it back. It runs only in the Soft-RoCE VM
 * (IBMSG_TEST_IN_VM=1, set by test/integration/run), or on hardware with
 * IBMSG_TEST_ALLOW_DEVICE_REMOVAL=1 and an rxe device; otherwise it skips. Run it last. */
#define _POSIX_C_SOURCE 200809L

#include "harness.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>

#define DELETE_BOUND_MS 5000 /* "within a few seconds" of the sockets closing */

static int allowed(void) {
  const char *vm = getenv("IBMSG_TEST_IN_VM");
  const char *hw = getenv("IBMSG_TEST_ALLOW_DEVICE_REMOVAL");
  return (vm && strcmp(vm, "1") == 0) || (hw && strcmp(hw, "1") == 0);
}

/* The netdev under an rxe device, from `rdma link show DEV/1` ("... netdev rdma0 ..."). */
static void netdev_of(const char *dev, char *out, size_t len) {
  char cmd[128], line[512], fmt[16];
  snprintf(fmt, sizeof fmt, "%%%zus", len - 1);
  snprintf(cmd, sizeof cmd, "rdma link show %s/1 2>/dev/null", dev);
  FILE *p = popen(cmd, "r");
  H_CHECK(p != NULL, "cannot run %s", cmd);
  out[0] = '\0';
  while (fgets(line, sizeof line, p)) {
    char *n = strstr(line, " netdev ");
    if (n && sscanf(n + 8, fmt, out) == 1) break;
  }
  pclose(p);
  H_CHECK(out[0] != '\0', "%s printed no netdev (is %s an rxe device?)", cmd, dev);
}

static pid_t spawn(const char *const argv[]) {
  pid_t pid = fork();
  H_CHECK(pid >= 0, "fork failed");
  if (pid == 0) {
    execvp(argv[0], (char *const *)argv);
    _exit(127);
  }
  return pid;
}

static int port_active(const char *dev) {
  char path[256], buf[64] = "";
  snprintf(path, sizeof path, "/sys/class/infiniband/%s/ports/1/state", dev);
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  if (!fgets(buf, sizeof buf, f)) buf[0] = '\0';
  fclose(f);
  return strstr(buf, "ACTIVE") != NULL;
}

#define SPARE_NETDEV "ibmsgspare0"
#define SPARE_DEVICE "ibmsgspare"

static void run(const char *cmd) { H_CHECK(system(cmd) == 0, "`%s` failed", cmd); }

/* A second rxe device on a dummy netdev: the machine keeps a device when rxe0 goes. */
static void add_spare(void) {
  run("ip link add " SPARE_NETDEV " type dummy && ip link set " SPARE_NETDEV " up");
  run("rdma link add " SPARE_DEVICE " type rxe netdev " SPARE_NETDEV);
}

/* Runs argv while the loop keeps running (a removal waits for the program to let go of the
 * device); returns its exit status, or -1 if it did not end within bound_ms. */
static int run_looping(h_ctx *ctx, const char *const argv[], int bound_ms) {
  int st = 0;
  pid_t pid = spawn(argv);
  uint64_t deadline = h_now_ms() + (uint64_t)bound_ms;
  while (h_now_ms() < deadline) {
    if (waitpid(pid, &st, WNOHANG) == pid) return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
    h_run_for(ctx, 20);
  }
  kill(pid, SIGKILL);
  return -1;
}

/* Clean-up, not what is under test: librdmacm opened the spare when ibmsg had it rescan, and
 * lets it go at a later rescan (while the loop still rescans) or when the process exits. */
static void remove_spare(h_ctx *ctx) {
  const char *del[] = {"rdma", "link", "delete", SPARE_DEVICE, NULL};
  if (system("rdma link show " SPARE_DEVICE "/1 >/dev/null 2>&1") != 0) return;
  if (run_looping(ctx, del, 10000) != 0)
    print_message("note: %s not deleted yet; it goes when this process exits\n", SPARE_DEVICE);
  else if (system("ip link delete " SPARE_NETDEV " 2>/dev/null") != 0) { /* already gone */ }
}

/* Adds the device back for whatever runs after this test. */
static void restore(const char *dev, const char *netdev) {
  char cmd[256];
  int i;
  snprintf(cmd, sizeof cmd, "rdma link add %s type rxe netdev %s", dev, netdev);
  H_CHECK(system(cmd) == 0, "%s failed: the device could not be added back", cmd);
  struct timespec tenth = {0, 100 * 1000 * 1000};
  for (i = 0; i < 100 && !port_active(dev); i++) nanosleep(&tenth, NULL);
  H_CHECK(port_active(dev), "%s is back but its port did not become active", dev);
}

static void removed_device_closes_its_sockets_and_is_released_at_once(void **state) {
  h_ctx *ctx = *state;
  h_conn *client, *server;
  char netdev[64];
  const char *dev;
  const char *argv[5];
  pid_t pid;
  int st = 0, done = 0;
  uint64_t closed_at, deadline;

  if (!allowed()) {
    print_message("skipped: deletes the RDMA device (set IBMSG_TEST_ALLOW_DEVICE_REMOVAL=1)\n");
    skip();
  }
  dev = h_env("IBMSG_TEST_DEVICE");
  netdev_of(dev, netdev, sizeof netdev);
  remove_spare(ctx);
  add_spare();
  h_pair(ctx, &client, &server);
  client->expect_send_errors = 1;
  server->expect_send_errors = 1;

  argv[0] = "rdma";
  argv[1] = "link";
  argv[2] = "delete";
  argv[3] = dev;
  argv[4] = NULL;
  pid = spawn(argv);
  /* The loop keeps running while the kernel removes the device: it must see DEVICE_REMOVAL. */
  H_RUN_UNTIL(ctx, client->closed && server->closed && ctx->listener.closed, 20000);
  /* Both ends are on the one device: the end that hears of the removal first closes with
   * IBMSG_ENODEV, and its peer may hear the disconnect before its own removal event. */
  H_CHECK(client->close_reason == IBMSG_ENODEV || client->close_reason == IBMSG_ECONNRESET,
          "close reason of the client is %s", ibmsg_err_name(client->close_reason));
  H_CHECK(server->close_reason == IBMSG_ENODEV || server->close_reason == IBMSG_ECONNRESET,
          "close reason of the accepted socket is %s", ibmsg_err_name(server->close_reason));
  H_CHECK(client->close_reason == IBMSG_ENODEV || server->close_reason == IBMSG_ENODEV,
          "neither end of the connection closed with IBMSG_ENODEV");
  H_ASSERT_REASON(ctx->listener.close_reason, IBMSG_ENODEV, "close reason of the listener");

  closed_at = h_now_ms();
  deadline = closed_at + DELETE_BOUND_MS;
  while (!done && h_now_ms() < deadline) {
    h_run_for(ctx, 50);
    done = waitpid(pid, &st, WNOHANG) == pid;
  }
  if (!done) {
    kill(pid, SIGKILL);
    H_CHECK(0, "`rdma link delete %s` still blocked %d ms after every socket closed: the program "
            "holds the device", dev, DELETE_BOUND_MS);
  }
  H_CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "`rdma link delete %s` failed (status %d)", dev, st);
  print_message("rdma link delete returned %llu ms after the sockets closed\n",
                (unsigned long long)(h_now_ms() - closed_at));

  /* The program goes on: its loop still runs, and is destroyed as usual. */
  H_ASSERT_OK(ibmsg_dispatch_event_loop_timeout(&ctx->loop, 10));
  restore(dev, netdev);
  remove_spare(ctx);
  H_ASSERT_OK(ibmsg_destroy_event_loop(&ctx->loop));
  ctx->loop_initialized = 0;
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      H_TEST(removed_device_closes_its_sockets_and_is_released_at_once),
  };
  h_init(argc, argv);
  return cmocka_run_group_tests(tests, NULL, NULL);
}
