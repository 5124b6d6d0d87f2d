/* test_grants.c - grants bound to their connection on rxe0: a descriptor works on the connection
 * it was made for only (a type-2 memory window bound to its queue pair), unless it is
 * device-wide; the granting side sees a peer's violation (it closes with IBMSG_EREMOTEACCESS,
 * counts it and logs it with the peer's address); listeners refuse a violator's address for
 * IBMSG_OPT_VIOLATION_BAN; and what a grant and a revoke cost. */
#define _POSIX_C_SOURCE 200809L

#include "harness.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define RW (IBMSG_ACCESS_REMOTE_READ | IBMSG_ACCESS_REMOTE_WRITE)

#define t_new h_new

/* One operation and what its done callback saw (harness.h). */
typedef h_op_slot op_slot;
#define slot_op h_op_start
#define RUN_SLOT(ctx, o) H_RUN_UNTIL((ctx), (o)->calls > 0, H_TIMEOUT_MS)

#define WAIT_CLOSED(ctx, conn, reason)                                                          \
  do {                                                                                          \
    H_RUN_UNTIL((ctx), (conn)->closed, H_TIMEOUT_MS);                                           \
    H_ASSERT_REASON((conn)->close_reason, (reason), "close reason of " #conn);                  \
  } while (0)

/* The loop's log lines at warning that report a violation, and the last one. */
static int t_warnings;
static char t_last_warning[512];

static void log_line(ibmsg_event_loop *loop, ibmsg_socket *s, int level, const char *text) {
  (void)loop;
  (void)s;
  if (level == IBMSG_LOG_WARN && strstr(text, "remote access violation")) {
    t_warnings++;
    snprintf(t_last_warning, sizeof t_last_warning, "%s", text);
  }
}

static void set_ban(h_ctx *ctx, int ms) { h_setopt_int(ctx, IBMSG_OPT_VIOLATION_BAN, ms); }

static uint64_t violations(h_ctx *ctx) {
  ibmsg_loop_counters c;
  H_ASSERT_OK(ibmsg_loop_stats(&ctx->loop, &c, sizeof c));
  return c.remote_access_violations;
}

static uint64_t banned(h_ctx *ctx) {
  ibmsg_loop_counters c;
  H_ASSERT_OK(ibmsg_loop_stats(&ctx->loop, &c, sizeof c));
  return c.requests_banned;
}

/* desc with its key (bytes 4..7) replaced and the check (28..31) recomputed: what a peer that
 * guesses keys sends. */
static uint32_t key_of(const ibmsg_descriptor *d) {
  return (uint32_t)d->bytes[4] | (uint32_t)d->bytes[5] << 8 | (uint32_t)d->bytes[6] << 16 |
         (uint32_t)d->bytes[7] << 24;
}

#define with_key(d, key) h_forge_descriptor((d), 4, (key), 4)

typedef struct {
  ibmsg_region tgt, src;
  op_slot op;
} g_state;

static g_state *regions(h_ctx *ctx) {
  g_state *s = t_new(sizeof *s);
  H_ASSERT_OK(ibmsg_alloc_region(&ctx->loop, &s->tgt, 4096, RW));
  H_ASSERT_OK(ibmsg_alloc_region(&ctx->loop, &s->src, 4096, IBMSG_ACCESS_LOCAL_WRITE));
  memset(s->tgt.addr, 0x5a, 4096);
  memset(s->src.addr, 0xa5, 4096);
  return s;
}

static void free_regions(g_state *s) {
  H_ASSERT_OK(ibmsg_deregister_region(&s->src));
  H_ASSERT_OK(ibmsg_deregister_region(&s->tgt));
  free(s);
}

/* A write of 16 bytes at offset off of d from conn; returns its status. */
static int write16(h_ctx *ctx, h_conn *conn, op_slot *o, const ibmsg_descriptor *d, size_t off) {
  H_ASSERT_OK(ibmsg_rdma_write(&conn->sock, slot_op(o), &((g_state *)ctx->data)->src, 0, 16, d, off));
  RUN_SLOT(ctx, o);
  return o->status;
}

/* B uses d, a descriptor B's server side was not granted: B's operation fails with
 * IBMSG_EREMOTEACCESS, both sides of B's connection close with it, the granting loop counts one
 * more violation and logs it with B's address; the target is unchanged. */
static void use_fails(h_ctx *ctx, h_conn *b, h_conn *sb, const ibmsg_descriptor *d) {
  g_state *s = ctx->data;
  unsigned char before[4096];
  uint64_t v = violations(ctx);
  int w = t_warnings;
  memcpy(before, s->tgt.addr, sizeof before);
  H_ASSERT_REASON(write16(ctx, b, &s->op, d, 0), IBMSG_EREMOTEACCESS, "status of B's write");
  WAIT_CLOSED(ctx, b, IBMSG_EREMOTEACCESS);
  WAIT_CLOSED(ctx, sb, IBMSG_EREMOTEACCESS);
  H_ASSERT_EQ(violations(ctx), v + 1, "violations counted by the granting loop");
  H_ASSERT_EQ(t_warnings, w + 1, "warnings logged for the violation");
  H_CHECK(strstr(t_last_warning, ctx->addr) != NULL,
          "the warning does not name the peer's address %s: \"%s\"", ctx->addr, t_last_warning);
  H_CHECK(memcmp(before, s->tgt.addr, sizeof before) == 0, "a refused write changed the target");
}

/* --- 1. a descriptor of connection A used on connection B ----------------------------------- */

static void grant_works_on_its_connection_only(void **state) {
  h_ctx *ctx = *state;
  h_conn *a, *sa, *b, *sb;
  ibmsg_descriptor da;
  g_state *s = regions(ctx);
  int i;

  ctx->data = s;
  ctx->loop.log = log_line;
  set_ban(ctx, 0);  /* B reconnects at once */
  h_pair(ctx, &a, &sa);
  H_ASSERT_OK(ibmsg_region_descriptor(&s->tgt, &sa->sock, 0, 4096, RW, &da));
  H_ASSERT_REASON(write16(ctx, a, &s->op, &da, 0), IBMSG_OK, "status of A's write");
  H_CHECK(memcmp(s->tgt.addr, s->src.addr, 16) == 0, "A's write did not land");
  /* Every time, on a new connection B. */
  for (i = 0; i < 3; i++) {
    h_pair(ctx, &b, &sb);
    use_fails(ctx, b, sb, &da);
  }
  print_message("  the warning: %s\n", t_last_warning);
  /* A's connection is untouched and its descriptor still works. */
  H_ASSERT_STATUS(a->sock.status, IBMSG_CONNECTED, "A's status");
  memset(s->src.addr, 0x3c, 16);
  H_ASSERT_REASON(write16(ctx, a, &s->op, &da, 64), IBMSG_OK, "status of A's write after");
  H_CHECK(memcmp((char *)s->tgt.addr + 64, s->src.addr, 16) == 0, "A's second write did not land");
  free_regions(s);
  h_finish(ctx);
}

/* --- 2. a device-wide grant ----------------------------------------------------------------- */

static void device_wide_grant_works_on_every_connection(void **state) {
  h_ctx *ctx = *state;
  h_conn *a, *sa, *b, *sb;
  ibmsg_descriptor dw, again;
  g_state *s = regions(ctx);

  ctx->data = s;
  h_pair(ctx, &a, &sa);
  h_pair(ctx, &b, &sb);
  H_ASSERT_OK(ibmsg_region_descriptor(&s->tgt, &sa->sock, 0, 4096,
                                      RW | IBMSG_ACCESS_DEVICE_WIDE, &dw));
  H_ASSERT_OK(ibmsg_region_descriptor(&s->tgt, &sb->sock, 0, 4096,
                                      RW | IBMSG_ACCESS_DEVICE_WIDE, &again));
  H_CHECK(memcmp(dw.bytes, again.bytes, sizeof dw.bytes) == 0,
          "a device-wide grant of the same range differs by connection");
  H_ASSERT_REASON(write16(ctx, a, &s->op, &dw, 0), IBMSG_OK, "status of A's write");
  memset(s->src.addr, 0x77, 16);
  H_ASSERT_REASON(write16(ctx, b, &s->op, &dw, 128), IBMSG_OK, "status of B's write");
  H_CHECK(memcmp((char *)s->tgt.addr + 128, s->src.addr, 16) == 0, "B's write did not land");
  H_ASSERT_EQ(violations(ctx), 0, "violations");
  H_ASSERT_OK(ibmsg_revoke_descriptor(&s->tgt, &dw));
  free_regions(s);
  h_finish(ctx);
}

/* --- 3. revoke, and a connection's close ---------------------------------------------------- */

static void revoked_grant_fails_and_is_a_violation(void **state) {
  h_ctx *ctx = *state;
  h_conn *a, *sa;
  ibmsg_descriptor da;
  g_state *s = regions(ctx);

  ctx->data = s;
  ctx->loop.log = log_line;
  h_pair(ctx, &a, &sa);
  H_ASSERT_OK(ibmsg_region_descriptor(&s->tgt, &sa->sock, 0, 4096, RW, &da));
  H_ASSERT_REASON(write16(ctx, a, &s->op, &da, 0), IBMSG_OK, "status before the revoke");
  H_ASSERT_OK(ibmsg_revoke_descriptor(&s->tgt, &da));
  H_ASSERT_CODE(ibmsg_revoke_descriptor(&s->tgt, &da), IBMSG_EBADDESC);
  use_fails(ctx, a, sa, &da);
  free_regions(s);
  h_finish(ctx);
}

static void close_releases_the_connections_grants(void **state) {
  h_ctx *ctx = *state;
  h_conn *a, *sa, *b, *sb;
  ibmsg_descriptor da, db;
  g_state *s = regions(ctx);

  ctx->data = s;
  h_pair(ctx, &a, &sa);
  h_pair(ctx, &b, &sb);
  H_ASSERT_OK(ibmsg_region_descriptor(&s->tgt, &sa->sock, 0, 4096, RW, &da));
  H_ASSERT_OK(ibmsg_region_descriptor(&s->tgt, &sb->sock, 0, 4096, RW, &db));
  H_ASSERT_REASON(write16(ctx, a, &s->op, &da, 0), IBMSG_OK, "status of A's write");
  H_ASSERT_OK(ibmsg_disconnect(&sa->sock));
  H_RUN_UNTIL(ctx, sa->closed && a->closed, H_TIMEOUT_MS);
  /* A's grant went with its connection; B's is there still. */
  H_ASSERT_CODE(ibmsg_revoke_descriptor(&s->tgt, &da), IBMSG_EBADDESC);
  H_ASSERT_REASON(write16(ctx, b, &s->op, &db, 0), IBMSG_OK, "status of B's write");
  H_ASSERT_OK(ibmsg_revoke_descriptor(&s->tgt, &db));
  free_regions(s);
  h_finish(ctx);
}

/* --- 4. a peer guessing the keys of another connection -------------------------------------- */

static void guessed_keys_fail_every_time_and_are_counted(void **state) {
  h_ctx *ctx = *state;
  h_conn *a, *sa, *b, *sb;
  ibmsg_descriptor da, guess;
  g_state *s = regions(ctx);
  uint32_t key;
  int i;

  ctx->data = s;
  ctx->loop.log = log_line;
  set_ban(ctx, 0);
  h_pair(ctx, &a, &sa);
  H_ASSERT_OK(ibmsg_region_descriptor(&s->tgt, &sa->sock, 0, 4096, RW, &da));
  key = key_of(&da);
  /* The right key is among the guesses (i == 0): bound to A's queue pair, it fails on B's too. */
  for (i = 0; i < 20; i++) {
    guess = with_key(&da, (key & ~0xffu) | ((key + (uint32_t)i * 37u) & 0xffu));
    h_pair(ctx, &b, &sb);
    use_fails(ctx, b, sb, &guess);
  }
  H_ASSERT_EQ(violations(ctx), 20, "violations counted");
  H_ASSERT_REASON(write16(ctx, a, &s->op, &da, 0), IBMSG_OK, "status of A's write after");
  free_regions(s);
  h_finish(ctx);
}

/* --- 5. the ban ------------------------------------------------------------------------------ */

static void violators_address_is_refused_while_banned(void **state) {
  h_ctx *ctx = *state;
  h_conn *a, *sa, *b, *sb, *c;
  ibmsg_descriptor da;
  g_state *s = regions(ctx);
  uint64_t t0;

  ctx->data = s;
  ctx->loop.log = log_line;
  set_ban(ctx, 2000);
  h_pair(ctx, &a, &sa);
  H_ASSERT_OK(ibmsg_region_descriptor(&s->tgt, &sa->sock, 0, 4096, RW, &da));
  h_pair(ctx, &b, &sb);
  use_fails(ctx, b, sb, &da);
  t0 = h_now_ms();
  /* The next request from that address (any port) is refused, with a reason, while it lasts. */
  c = h_connect(ctx, ctx->addr, ctx->port);
  WAIT_CLOSED(ctx, c, IBMSG_EREJECTED);
  H_CHECK(h_now_ms() - t0 < 2000, "the refusal came after the ban ended (%llu ms)",
          (unsigned long long)(h_now_ms() - t0));
  H_CHECK(strstr(c->sock.reject_reason, "violation") != NULL, "reject_reason is \"%.132s\"",
          c->sock.reject_reason);
  print_message("  refused: %s\n", c->sock.reject_reason);
  H_ASSERT_EQ(banned(ctx), 1, "requests refused for the ban");
  /* A's connection, made before, is untouched. */
  H_ASSERT_REASON(write16(ctx, a, &s->op, &da, 0), IBMSG_OK, "status of A's write");
  /* After the ban, the address may connect again. */
  while (h_now_ms() - t0 < 2100) h_run_for(ctx, 50);
  h_pair(ctx, &b, &sb);
  H_ASSERT_EQ(banned(ctx), 1, "requests refused for the ban");
  free_regions(s);
  h_finish(ctx);
}

/* --- 6. what a grant and a revoke cost -------------------------------------------------------- */

#define COST_N 1000

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

/* COST_N grants of distinct 64-byte ranges, then COST_N revokes. A grant's bind completes in
 * the loop: it runs whenever the connection has its most binds in flight (IBMSG_EAGAIN), so the
 * grants' time includes all but the last few binds; before the revokes it runs until those are
 * done too (not timed). */
static void measure(h_ctx *ctx, ibmsg_region *r, h_conn *sa, unsigned access, const char *what) {
  ibmsg_descriptor *d = t_new(COST_N * sizeof *d);
  double t0, t1, t2;
  int i, rc, waits = 0;

  t0 = now_us();
  for (i = 0; i < COST_N; i++) {
    while ((rc = ibmsg_region_descriptor(r, &sa->sock, (size_t)i * 64, 64, access, &d[i])) ==
           IBMSG_EAGAIN) {
      waits++;
      H_ASSERT_OK(ibmsg_dispatch_event_loop_timeout(&ctx->loop, 1));
    }
    H_ASSERT_OK(rc);
  }
  t1 = now_us();
  h_run_for(ctx, 200);
  t2 = now_us();
  for (i = 0; i < COST_N; i++) H_ASSERT_OK(ibmsg_revoke_descriptor(r, &d[i]));
  t2 = now_us() - t2;
  print_message("  %s: %d grants %.1f us each (%d waits for binds in flight), %d revokes %.1f us "
                "each\n", what, COST_N, (t1 - t0) / COST_N, waits, COST_N, t2 / COST_N);
  free(d);
}

static void grant_and_revoke_cost(void **state) {
  h_ctx *ctx = *state;
  h_conn *a, *sa;
  ibmsg_region *r = t_new(sizeof *r);

  h_watchdog(600);
  h_pair(ctx, &a, &sa);
  H_ASSERT_OK(ibmsg_alloc_region(&ctx->loop, r, COST_N * 64, RW));
  measure(ctx, r, sa, RW, "bound to the connection");
  H_ASSERT_OK(ibmsg_deregister_region(r));
  H_ASSERT_OK(ibmsg_alloc_region(&ctx->loop, r, COST_N * 64, RW));
  measure(ctx, r, sa, RW | IBMSG_ACCESS_DEVICE_WIDE, "device-wide");
  H_ASSERT_OK(ibmsg_deregister_region(r));
  free(r);
  h_finish(ctx);
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      H_TEST(grant_works_on_its_connection_only),
      H_TEST(device_wide_grant_works_on_every_connection),
      H_TEST(revoked_grant_fails_and_is_a_violation),
      H_TEST(close_releases_the_connections_grants),
      H_TEST(guessed_keys_fail_every_time_and_are_counted),
      H_TEST(violators_address_is_refused_while_banned),
      H_TEST(grant_and_revoke_cost),
  };
  h_init(argc, argv);
  return cmocka_run_group_tests(tests, NULL, NULL);
}
