/* test_busy_poll.c - IBMSG_OPT_BUSY_POLL on rxe0: messages and one-sided operations arrive intact
 * and in order when the loop polls (always, adaptive), from ibmsg's own dispatch and from a
 * poll(2) loop; an adaptive loop goes back to sleep and wakes again for the next message. */
#define _GNU_SOURCE /* dladdr */

#include "harness.h"

#include <dlfcn.h>
#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>

/* Counting allocations: this program's malloc, calloc and realloc count while `counting` is set
 * and hand over to glibc's. (Not under AddressSanitizer, which replaces them itself.) */
#if defined(__SANITIZE_ADDRESS__)
#define COUNT_ALLOCATIONS 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define COUNT_ALLOCATIONS 0
#endif
#endif
#ifndef COUNT_ALLOCATIONS
#define COUNT_ALLOCATIONS 1
#endif

#if COUNT_ALLOCATIONS
extern void *__libc_malloc(size_t size);
extern void *__libc_calloc(size_t n, size_t size);
extern void *__libc_realloc(void *p, size_t size);
static volatile int counting;
static volatile long allocations;
/* Who made the first counted allocations (the return address into the caller), and their size. */
#define TRACED 4
static void *volatile alloc_caller[TRACED];
static volatile size_t alloc_size[TRACED];
static void counted(void *caller, size_t size) {
  if (!counting) return;
  if (allocations < TRACED) {
    alloc_caller[allocations] = caller;
    alloc_size[allocations] = size;
  }
  allocations++;
}
void *malloc(size_t size) {
  counted(__builtin_return_address(0), size);
  return __libc_malloc(size);
}
void *calloc(size_t n, size_t size) {
  counted(__builtin_return_address(0), n * size);
  return __libc_calloc(n, size);
}
void *realloc(void *p, size_t size) {
  counted(__builtin_return_address(0), size);
  return __libc_realloc(p, size);
}
/* Prints where the first counted allocations came from (library and nearest symbol). */
static void print_callers(long n) {
  long i;
  for (i = 0; i < n && i < TRACED; i++) {
    Dl_info info;
    memset(&info, 0, sizeof info);
    if (dladdr(alloc_caller[i], &info) && info.dli_fname)
      print_message("  allocation %ld: %zu bytes from %s (%s+%#lx)\n", i, alloc_size[i],
                    info.dli_fname, info.dli_sname ? info.dli_sname : "?",
                    (unsigned long)((char *)alloc_caller[i] -
                                    (char *)(info.dli_saddr ? info.dli_saddr : info.dli_fbase)));
    else
      print_message("  allocation %ld: %zu bytes from %p\n", i, alloc_size[i], alloc_caller[i]);
  }
}
#endif

static void set_busy_poll(h_ctx *ctx, int us) {
  H_ASSERT_OK(ibmsg_setopt(&ctx->loop, IBMSG_OPT_BUSY_POLL, &us, sizeof us));
}

/* Streams n messages each way and checks order, sizes and exactly-once callbacks. */
static void stream_both_ways(h_ctx *ctx, h_conn *client, h_conn *server, int n, size_t size) {
  client->verify = server->verify = 1;
  client->expect_size = server->expect_size = (long)size;
  h_stream_start(client, n, size, 32);
  h_stream_start(server, n, size, 32);
  H_RUN_UNTIL_PROGRESS(ctx, server->received == n && client->received == n &&
                                h_stream_done(client) && h_stream_done(server),
                       120000);
  h_run_for(ctx, 100);
  H_ASSERT_EQ(server->received, n, "messages the server received");
  H_ASSERT_EQ(client->received, n, "messages the client received");
  H_ASSERT_EQ(client->sent_ok, n, "message_sent(IBMSG_OK) of the client");
  H_ASSERT_EQ(server->sent_ok, n, "message_sent(IBMSG_OK) of the server");
}

static void always_polling_streams_arrive_in_order(void **state) {
  h_ctx *ctx = *state;
  h_conn *client, *server;
  int v = 0;
  size_t len = sizeof v;

  set_busy_poll(ctx, IBMSG_BUSY_POLL_ALWAYS);
  H_ASSERT_OK(ibmsg_getopt(&ctx->loop, IBMSG_OPT_BUSY_POLL, &v, &len));
  H_ASSERT_EQ(v, IBMSG_BUSY_POLL_ALWAYS, "IBMSG_OPT_BUSY_POLL read back");
  h_pair(ctx, &client, &server);
  stream_both_ways(ctx, client, server, 10000, 64);
  /* Connected and polling: a foreign loop must call process at once. */
  H_ASSERT_EQ(ibmsg_event_loop_timeout(&ctx->loop), 0, "ibmsg_event_loop_timeout while polling");
  h_finish(ctx);
}

static void adaptive_polling_sleeps_and_wakes_again(void **state) {
  h_ctx *ctx = *state;
  h_conn *client, *server;
  int t;

  set_busy_poll(ctx, 20000); /* 20 ms */
  h_pair(ctx, &client, &server);
  stream_both_ways(ctx, client, server, 2000, 512);
  /* Quiet for ten times the poll time: both sides sleep again. */
  h_run_for(ctx, 200);
  t = ibmsg_event_loop_timeout(&ctx->loop);
  H_CHECK(t != 0, "ibmsg_event_loop_timeout is still 0 after 200 ms without activity");
  /* A message now must wake the sleeping side through the device's completion channel. */
  {
    ibmsg_buffer *m = &ctx->msgs[0];
    int received = server->received;
    server->expect_size = 100;
    h_alloc_fill(client, m, 100);
    h_post(client, m);
    H_RUN_UNTIL(ctx, server->received == received + 1 && client->sent == client->posted,
                H_TIMEOUT_MS);
    H_ASSERT_OK(ibmsg_free_msg(m));
  }
  h_finish(ctx);
}

/* An application loop built on poll(2), with ibmsg's timeout: while ibmsg polls the timeout is 0
 * and process() runs every time. */
static int poll_step(h_ctx *ctx, int max_wait_ms) {
  return h_poll_step(ctx, max_wait_ms, NULL, NULL);
}

static void polling_works_from_a_foreign_loop(void **state) {
  h_ctx *ctx = *state;
  h_conn *client, *server;

  ctx->step = poll_step;
  set_busy_poll(ctx, IBMSG_BUSY_POLL_ALWAYS);
  h_pair(ctx, &client, &server);
  stream_both_ways(ctx, client, server, 3000, 64);
  h_finish(ctx);
}

/* One connection polls (its own option set), one sleeps: both work on the same loop. */
static void polling_and_event_connections_share_a_loop(void **state) {
  h_ctx *ctx = *state;
  h_conn *c1, *s1, *c2, *s2;
  int always = IBMSG_BUSY_POLL_ALWAYS;
  ibmsg_options *o = ibmsg_options_new(&ctx->loop);

  H_CHECK(o != NULL, "ibmsg_options_new failed");
  H_ASSERT_OK(ibmsg_options_set(o, IBMSG_OPT_BUSY_POLL, &always, sizeof always));
  ctx->connect_opts = o;
  h_pair(ctx, &c1, &s1); /* the client polls, its server socket sleeps */
  ctx->connect_opts = NULL;
  h_pair(ctx, &c2, &s2); /* both sleep */
  ibmsg_options_free(o);
  stream_both_ways(ctx, c1, s1, 2000, 256);
  stream_both_ways(ctx, c2, s2, 2000, 256);
  h_finish(ctx);
}

struct op_rec {
  int calls;
  int status;
};

static void op_done(ibmsg_socket *s, ibmsg_op *op, int status) {
  struct op_rec *r = op->user_data;
  (void)s;
  r->calls++;
  r->status = status;
}

static void one_sided_operations_complete_while_polling(void **state) {
  h_ctx *ctx = *state;
  h_conn *client, *server;
  ibmsg_region *tgt = calloc(1, sizeof *tgt), *src = calloc(1, sizeof *src);
  ibmsg_op *op = calloc(1, sizeof *op);
  struct op_rec *rec = calloc(1, sizeof *rec);
  ibmsg_descriptor d;
  int i;

  H_CHECK(tgt && src && op && rec, "out of memory");
  set_busy_poll(ctx, IBMSG_BUSY_POLL_ALWAYS);
  h_pair(ctx, &client, &server);
  H_ASSERT_OK(ibmsg_alloc_region(&ctx->loop, tgt, 4096,
                                 IBMSG_ACCESS_REMOTE_READ | IBMSG_ACCESS_REMOTE_WRITE));
  H_ASSERT_OK(ibmsg_alloc_region(&ctx->loop, src, 4096, IBMSG_ACCESS_LOCAL_WRITE));
  H_ASSERT_OK(ibmsg_region_descriptor(tgt, &server->sock, 0, 4096,
                                      IBMSG_ACCESS_REMOTE_READ | IBMSG_ACCESS_REMOTE_WRITE, &d));
  op->done = op_done;
  op->user_data = rec;
  for (i = 0; i < 200; i++) {
    int calls = rec->calls;
    size_t n = (size_t)(i * 13 % 4096) + 1;
    memset(src->addr, i & 0xff, n);
    H_ASSERT_OK(ibmsg_rdma_write(&client->sock, op, src, 0, n, &d, 0));
    H_RUN_UNTIL(ctx, rec->calls == calls + 1, H_TIMEOUT_MS);
    H_ASSERT_REASON(rec->status, IBMSG_OK, "status of a write");
    H_CHECK(memcmp(tgt->addr, src->addr, n) == 0, "write %d: bytes differ", i);
    memset(src->addr, 0, n);
    H_ASSERT_OK(ibmsg_rdma_read(&client->sock, op, src, 0, n, &d, 0));
    H_RUN_UNTIL(ctx, rec->calls == calls + 2, H_TIMEOUT_MS);
    H_ASSERT_REASON(rec->status, IBMSG_OK, "status of a read");
    H_CHECK(memcmp(tgt->addr, src->addr, n) == 0, "read %d: bytes differ", i);
  }
  H_ASSERT_OK(ibmsg_deregister_region(src));
  H_ASSERT_OK(ibmsg_deregister_region(tgt));
  free(src);
  free(tgt);
  free(op);
  free(rec);
  h_finish(ctx);
}

/* The data path allocates nothing: 10,000 messages each way and 1,000 RDMA writes on polling
 * connections, after a warm-up, with every allocation of the process counted. */
static void polling_data_path_allocates_nothing(void **state) {
#if COUNT_ALLOCATIONS
  h_ctx *ctx = *state;
  h_conn *client, *server;
  long n;
  int round;

  /* The counting reaches into the library: an option set is allocated there. */
  {
    ibmsg_options *o;
    allocations = 0;
    counting = 1;
    o = ibmsg_options_new(&ctx->loop);
    counting = 0;
    ibmsg_options_free(o);
    H_CHECK(allocations >= 1, "the library's allocations are not counted (%ld)", allocations);
  }
  set_busy_poll(ctx, IBMSG_BUSY_POLL_ALWAYS);
  h_pair(ctx, &client, &server);
  stream_both_ways(ctx, client, server, 200, 64); /* warm-up: buffers, first completions */
  /* libev grows its arrays (pending watchers, timers) the first time more of them are active at
   * once than ever before, which a short warm-up may not reach: an allocating round is followed
   * by another, and a steady state allocates nothing. A per-message allocation would make every
   * round allocate thousands of times. */
  for (round = 1;; round++) {
    client->received = server->received = 0;
    client->sent_ok = server->sent_ok = 0;
    client->sent = client->posted = server->sent = server->posted = 0;
    client->recv_seq = server->recv_seq = client->send_seq = server->send_seq = 0;
    allocations = 0;
    counting = 1;
    stream_both_ways(ctx, client, server, 10000, 64);
    counting = 0;
    n = allocations;
    print_message("  allocations during 10,000 messages each way (round %d): %ld\n", round, n);
    print_callers(n);
    if (n == 0) break;
    H_CHECK(n <= TRACED && round < 3,
            "allocations during 10,000 messages each way while polling: %ld in round %d", n,
            round);
  }
  h_finish(ctx);
#else
  (void)state;
  skip();
#endif
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      H_TEST(always_polling_streams_arrive_in_order),
      H_TEST(adaptive_polling_sleeps_and_wakes_again),
      H_TEST(polling_works_from_a_foreign_loop),
      H_TEST(polling_and_event_connections_share_a_loop),
      H_TEST(one_sided_operations_complete_while_polling),
      H_TEST(polling_data_path_allocates_nothing),
  };
  h_init(argc, argv);
  return cmocka_run_group_tests(tests, NULL, NULL);
}
