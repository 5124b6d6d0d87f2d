/* test_rdma.c - one-sided RDMA on rxe0: regions, descriptors, write / read / write-with-immediate,
 * atomics, immediates on messages. */
#define _POSIX_C_SOURCE 200809L

#include "harness.h"

#include <stdlib.h>
#include <string.h>

#define MiB (1024 * 1024)

typedef struct {
  int done;
  int status;
  int calls;
} op_rec;

static void op_done(ibmsg_socket *s, ibmsg_op *op, int status) {
  op_rec *r = op->user_data;
  (void)s;
  r->calls++;
  r->status = status;
  r->done = 1;
}

/* Posts op with the record rec and runs until its callback; returns the status. */
#define RUN_OP(ctx, rec) H_RUN_UNTIL((ctx), (rec).done, H_TIMEOUT_MS)

static void write_then_read_back_is_byte_exact(void **state) {
  h_ctx *ctx = *state;
  h_conn *client, *server;
  static const size_t sizes[] = {1, 4096, MiB, 64 * MiB};
  size_t i;

  h_pair(ctx, &client, &server);
  for (i = 0; i < sizeof sizes / sizeof sizes[0]; ++i) {
    size_t n = sizes[i], off = 3, j;
    ibmsg_region target, src, dst;
    ibmsg_descriptor d;
    ibmsg_op op;
    op_rec rec;
    unsigned char *p;
    H_ASSERT_OK(ibmsg_alloc_region(&ctx->loop, &target, n + 64,
                                   IBMSG_ACCESS_REMOTE_READ | IBMSG_ACCESS_REMOTE_WRITE));
    H_ASSERT_OK(ibmsg_region_descriptor(&target, &server->sock, off, n,
                                        IBMSG_ACCESS_REMOTE_READ | IBMSG_ACCESS_REMOTE_WRITE, &d));
    H_ASSERT_OK(ibmsg_alloc_region(&ctx->loop, &src, n + 8, 0));
    H_ASSERT_OK(ibmsg_alloc_region(&ctx->loop, &dst, n + 8, IBMSG_ACCESS_LOCAL_WRITE));
    p = src.addr;
    for (j = 0; j < n + 8; ++j) p[j] = (unsigned char)(j * 7 + i + 1);

    memset(&op, 0, sizeof op);
    memset(&rec, 0, sizeof rec);
    op.done = op_done;
    op.user_data = &rec;
    H_ASSERT_OK(ibmsg_rdma_write(&client->sock, &op, &src, 5, n, &d, 0));
    RUN_OP(ctx, rec);
    H_ASSERT_REASON(rec.status, IBMSG_OK, "write status");
    H_CHECK(memcmp((char *)target.addr + off, p + 5, n) == 0, "written bytes differ (size %zu)", n);
    H_CHECK(((unsigned char *)target.addr)[off - 1] == 0 && ((unsigned char *)target.addr)[off + n] == 0,
            "bytes beside the range changed");

    memset(&rec, 0, sizeof rec);
    H_ASSERT_OK(ibmsg_rdma_read(&client->sock, &op, &dst, 1, n, &d, 0));
    RUN_OP(ctx, rec);
    H_ASSERT_REASON(rec.status, IBMSG_OK, "read status");
    H_CHECK(memcmp((char *)dst.addr + 1, p + 5, n) == 0, "read bytes differ (size %zu)", n);
    H_ASSERT_EQ(rec.calls, 1, "done callbacks");

    H_ASSERT_OK(ibmsg_deregister_region(&src));
    H_ASSERT_OK(ibmsg_deregister_region(&dst));
    H_ASSERT_OK(ibmsg_deregister_region(&target));
  }
  h_finish(ctx);
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      H_TEST(write_then_read_back_is_byte_exact),
  };
  h_init(argc, argv);
  return cmocka_run_group_tests(tests, NULL, NULL);
}
