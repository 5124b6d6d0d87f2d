/* test_rdma.c - one-sided RDMA on rxe0: regions, descriptors, write / read / write-with-immediate,
 * atomics, immediates on messages. */
#define _POSIX_C_SOURCE 200809L

#include "harness.h"

#include <stdio.h>
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

/* --- helpers for the tests below ------------------------------------------------------------
 *
 * Everything the library may still point at when a test fails (operations, regions, the tests'
 * records) lives on the heap: a failed test longjmps out of its frame, and the teardown then
 * closes the connections, which runs done callbacks on those operations. On success a test frees
 * its records after h_finish(); after a failure they are leaked on purpose. */

#define RW (IBMSG_ACCESS_REMOTE_READ | IBMSG_ACCESS_REMOTE_WRITE)
#define RWA (IBMSG_ACCESS_REMOTE_READ | IBMSG_ACCESS_REMOTE_WRITE | IBMSG_ACCESS_REMOTE_ATOMIC)

#define t_new h_new

/* One operation and what its done callback saw. */
typedef struct {
  ibmsg_op op;       /* first member */
  int calls;         /* done callbacks */
  int status;        /* the last status done got */
  int closed_before; /* the socket's connection_closed callbacks before done (must be 0) */
  int order;         /* when done ran, counted over the test program */
} op_slot;

static int t_done_order;

static void slot_done(ibmsg_socket *s, ibmsg_op *op, int status) {
  op_slot *o = op->user_data;
  h_conn *c = s ? (h_conn *)s->user_data : NULL;
  o->calls++;
  o->status = status;
  o->closed_before = c ? c->closed : -1;
  o->order = ++t_done_order;
  if (!c) return;
  if (&c->sock != s) {
    h_note_error(c->ctx, "done called with a socket whose user_data is not its record");
    return;
  }
  if (o->calls > 1)
    h_note_error(c->ctx, "%s: done called %d times for one operation (now with %s)", c->name,
                 o->calls, ibmsg_err_name(status));
  if (op->status != status)
    h_note_error(c->ctx, "%s: op->status is %s inside done, which got %s", c->name,
                 ibmsg_err_name(op->status), ibmsg_err_name(status));
}

/* A fresh operation of o (its previous one, if any, must have had its done). */
static ibmsg_op *slot_op(op_slot *o) {
  memset(o, 0, sizeof *o);
  o->op.done = slot_done;
  o->op.user_data = o;
  return &o->op;
}

#define RUN_SLOT(ctx, o) H_RUN_UNTIL((ctx), (o)->calls > 0, H_TIMEOUT_MS)

/* An option set from the loop's defaults with one int option changed. */
static ibmsg_options *opts_with(h_ctx *ctx, int option, int value) {
  ibmsg_options *o = ibmsg_options_new(&ctx->loop);
  H_CHECK(o != NULL, "ibmsg_options_new failed");
  H_ASSERT_OK(ibmsg_options_set(o, option, &value, sizeof value));
  return o;
}

/* A message slot of ctx->msgs that holds no message. */
static ibmsg_buffer *free_msg(h_ctx *ctx) {
  int i;
  for (i = 0; i < H_MAX_MSGS; i++)
    if (!ctx->msgs[i].impl && ctx->outstanding[i] == 0) return &ctx->msgs[i];
  h_fail_at(__FILE__, __LINE__, "no free message slot in ctx->msgs");
  return NULL;
}

/* ibmsg_post_send_imm() with the harness's bookkeeping (what h_try_post does for post_send). */
static int post_imm(h_conn *c, ibmsg_buffer *msg, uint32_t imm) {
  h_ctx *ctx = c->ctx;
  int rc = ibmsg_post_send_imm(&c->sock, msg, imm);
  if (rc != IBMSG_OK) return rc;
  c->posted++;
  if (msg >= ctx->msgs && msg < ctx->msgs + H_MAX_MSGS) ctx->outstanding[msg - ctx->msgs]++;
  return rc;
}

/* Sends one message of size bytes from `from` to `to` and waits until it arrived and was sent. */
static void ping(h_ctx *ctx, h_conn *from, h_conn *to, size_t size) {
  ibmsg_buffer *m = free_msg(ctx);
  int sent = from->sent, sent_ok = from->sent_ok, received = to->received;
  h_alloc_fill(from, m, size);
  h_post(from, m);
  H_RUN_UNTIL(ctx, from->sent > sent && to->received > received, H_TIMEOUT_MS);
  H_ASSERT_EQ(from->sent_ok, sent_ok + 1, "message_sent callbacks with IBMSG_OK");
  H_ASSERT_EQ(to->received, received + 1, "messages received");
  H_ASSERT_EQ(to->last_received_size, size, "size of the received message");
  H_ASSERT_OK(ibmsg_free_msg(m));
}

/* A write of 4096 fresh bytes from client to a new region of server, checked on arrival. */
static void write_works(h_ctx *ctx, h_conn *client, h_conn *server) {
  ibmsg_region *tgt = t_new(sizeof *tgt), *src = t_new(sizeof *src);
  op_slot *o = t_new(sizeof *o);
  ibmsg_descriptor d;
  size_t j;

  H_ASSERT_OK(ibmsg_alloc_region(&ctx->loop, tgt, 4096, RW));
  H_ASSERT_OK(ibmsg_region_descriptor(tgt, &server->sock, 0, 4096, IBMSG_ACCESS_REMOTE_WRITE, &d));
  H_ASSERT_OK(ibmsg_alloc_region(&ctx->loop, src, 4096, 0));
  for (j = 0; j < 4096; j++) ((unsigned char *)src->addr)[j] = (unsigned char)(j * 13 + 5);
  H_ASSERT_OK(ibmsg_rdma_write(&client->sock, slot_op(o), src, 0, 4096, &d, 0));
  RUN_SLOT(ctx, o);
  H_ASSERT_REASON(o->status, IBMSG_OK, "status of a write on a healthy connection");
  H_CHECK(memcmp(tgt->addr, src->addr, 4096) == 0, "the write's bytes did not arrive");
  H_ASSERT_OK(ibmsg_deregister_region(src));
  H_ASSERT_OK(ibmsg_deregister_region(tgt));
  free(o);
  free(src);
  free(tgt);
}

/* Runs until a connection closed, then checks the reason. */
#define WAIT_CLOSED(ctx, conn, reason)                                                          \
  do {                                                                                          \
    H_RUN_UNTIL((ctx), (conn)->closed, H_TIMEOUT_MS);                                           \
    H_ASSERT_REASON((conn)->close_reason, (reason), "close reason");                            \
  } while (0)

/* --- a pump: keeps up to PUMP_OPS operations posted, re-posting each from its done ----------- */

#define PUMP_OPS 16

typedef struct pump pump;
struct pump {
  h_conn *conn;
  int total;             /* operations to do */
  int posted;            /* successfully posted */
  int completed;         /* done callbacks */
  int nops;              /* operations kept posted at once (at most PUMP_OPS) */
  ibmsg_op ops[PUMP_OPS];
  int index[PUMP_OPS];   /* the number of the operation ops[k] carries */
  int (*post)(pump *p, ibmsg_op *op, int k, int i); /* posts operation number i on op */
  void (*done)(pump *p, int k, int i);              /* after operation i succeeded on ops[k] */
  void *arg;
};

static void pump_done(ibmsg_socket *s, ibmsg_op *op, int status) {
  pump *p = op->user_data;
  h_ctx *ctx = p->conn->ctx;
  int k = (int)(op - p->ops), i, rc;
  (void)s;
  if (k < 0 || k >= p->nops) {
    h_note_error(ctx, "done called with an operation that is not the pump's");
    return;
  }
  i = p->index[k];
  p->completed++;
  if (p->completed > p->posted) {
    h_note_error(ctx, "%s: %d done callbacks for %d posted operations", p->conn->name, p->completed,
                 p->posted);
    return;
  }
  if (status != IBMSG_OK) {
    h_note_error(ctx, "%s: operation %d failed: %s (%d)", p->conn->name, i, ibmsg_err_name(status),
                 status);
    return;
  }
  if (p->done) p->done(p, k, i);
  if (p->posted < p->total) {
    rc = p->post(p, op, k, p->posted);
    if (rc != IBMSG_OK) {
      h_note_error(ctx, "%s: posting operation %d from done failed: %s (%d)", p->conn->name,
                   p->posted, ibmsg_err_name(rc), rc);
      return;
    }
    p->index[k] = p->posted++;
  }
}

static void pump_start(pump *p) {
  int k, rc;
  for (k = 0; k < p->nops && p->posted < p->total; k++) {
    memset(&p->ops[k], 0, sizeof p->ops[k]);
    p->ops[k].done = pump_done;
    p->ops[k].user_data = p;
    rc = p->post(p, &p->ops[k], k, p->posted);
    if (rc != IBMSG_OK)
      h_fail_at(__FILE__, __LINE__, "%s: posting operation %d failed: %s (%d)", p->conn->name,
                p->posted, ibmsg_err_name(rc), rc);
    p->index[k] = p->posted++;
  }
}

static int pump_finished(const pump *p) { return p->completed == p->total; }

/* Runs the loop until cond holds, while `progress` keeps changing: gives up (cond still false)
 * after stall_ms without progress or limit_ms in all, so that a stall fails fast and the caller
 * can say how far it got. The limit in all is a backstop far above what a slow, loaded machine
 * takes (the stall is the test's real limit: it follows the progress). */
#define RUN_WHILE_PROGRESS(ctx, cond, progress, stall_ms, limit_ms)                             \
  do {                                                                                          \
    uint64_t t__start = h_now_ms(), t__last = t__start;                                         \
    long t__seen = (long)(progress);                                                            \
    while (!(cond) && h_now_ms() - t__last < (uint64_t)(stall_ms) &&                            \
           h_now_ms() - t__start < (uint64_t)(limit_ms)) {                                      \
      h_run_for((ctx), 10);                                                                     \
      if ((long)(progress) != t__seen) {                                                        \
        t__seen = (long)(progress);                                                             \
        t__last = h_now_ms();                                                                   \
      }                                                                                         \
    }                                                                                           \
  } while (0)

/* --- 1. write with immediate ---------------------------------------------------------------- */

#define WI_TOTAL 200
#define WI_SLOT 4096
#define WI_IMM_BASE 0xc0de0000u

typedef struct {
  pump pump;
  ibmsg_region src, tgt;
  ibmsg_descriptor d;
  h_conn *server;
  int calls[WI_TOTAL]; /* write_received callbacks per write */
  int total_calls;
  int next;            /* the write expected next */
  int bad;             /* callbacks that saw something wrong */
  char why[256];       /* the first of them */
} wi_state;

static size_t wi_len(int i) { return 1 + ((size_t)i * 997u) % WI_SLOT; }
static unsigned char wi_byte(int i, size_t j) { return (unsigned char)(i * 31 + j * 7 + 3); }

static void wi_bad(wi_state *w, const char *fmt, int i, long a, long b) {
  if (w->bad++ == 0) snprintf(w->why, sizeof w->why, fmt, i, a, b);
}

static void wi_received(ibmsg_socket *s, uint32_t imm, size_t length) {
  h_ctx *ctx = s->loop->user_data;
  wi_state *w = ctx->data;
  const unsigned char *p;
  int i = (int)(imm - WI_IMM_BASE);
  size_t j;

  w->total_calls++;
  if (s != &w->server->sock) {
    wi_bad(w, "write_received for write %d came on another socket (%ld, %ld)", i, 0, 0);
    return;
  }
  if (imm < WI_IMM_BASE || i >= WI_TOTAL) {
    wi_bad(w, "write_received with immediate 0x%x (%ld, %ld): not one that was sent", (int)imm, 0, 0);
    return;
  }
  w->calls[i]++;
  if (i != w->next) wi_bad(w, "write %d reported when write %ld was expected (%ld)", i, w->next, 0);
  w->next = i + 1;
  if (length != wi_len(i)) wi_bad(w, "write %d reported length %ld, expected %ld", i, (long)length, (long)wi_len(i));
  p = (const unsigned char *)w->tgt.addr + (size_t)i * WI_SLOT;
  for (j = 0; j < wi_len(i); j++)
    if (p[j] != wi_byte(i, j)) {
      wi_bad(w, "write %d: byte %ld not yet in the region when write_received ran (0x%02lx)", i,
             (long)j, (long)p[j]);
      break;
    }
}

static int wi_post(pump *p, ibmsg_op *op, int k, int i) {
  wi_state *w = p->arg;
  (void)k;
  return ibmsg_rdma_write_imm(&p->conn->sock, op, &w->src, (size_t)i * WI_SLOT, wi_len(i), &w->d,
                              (size_t)i * WI_SLOT, WI_IMM_BASE + (uint32_t)i);
}

/* total write-imms, at most PUMP_OPS posted at once, to a server with recv_depth receive
 * buffers (0: the default). */
static void write_imm_run(h_ctx *ctx, int total, int recv_depth) {
  h_conn *client, *server;
  wi_state *w = t_new(sizeof *w);
  size_t size = (size_t)total * WI_SLOT, j;
  int i;

  H_CHECK(total <= WI_TOTAL, "at most %d write-imms", WI_TOTAL);
  ctx->data = w;
  ctx->loop.write_received = wi_received;
  if (recv_depth) ctx->listen_opts = opts_with(ctx, IBMSG_OPT_RECV_DEPTH, recv_depth);
  h_pair(ctx, &client, &server);
  ibmsg_options_free(ctx->listen_opts);
  ctx->listen_opts = NULL;
  w->server = server;

  H_ASSERT_OK(ibmsg_alloc_region(&ctx->loop, &w->tgt, size, IBMSG_ACCESS_REMOTE_WRITE));
  H_ASSERT_OK(ibmsg_region_descriptor(&w->tgt, &server->sock, 0, size, IBMSG_ACCESS_REMOTE_WRITE,
                                      &w->d));
  H_ASSERT_OK(ibmsg_alloc_region(&ctx->loop, &w->src, size, 0));
  for (i = 0; i < total; i++)
    for (j = 0; j < WI_SLOT; j++) ((unsigned char *)w->src.addr)[(size_t)i * WI_SLOT + j] = wi_byte(i, j);

  w->pump.conn = client;
  w->pump.total = total;
  w->pump.nops = PUMP_OPS;
  w->pump.post = wi_post;
  w->pump.arg = w;
  pump_start(&w->pump);
  RUN_WHILE_PROGRESS(ctx, pump_finished(&w->pump) && w->total_calls >= total,
                     w->pump.completed + w->total_calls, 15000, 900000);
  H_CHECK(pump_finished(&w->pump) && w->total_calls >= total,
          "stalled (nothing for 15 s, the test's own limit): %d write-imms posted, %d done, "
          "%d write_received (of %d); the client is %s",
          w->pump.posted, w->pump.completed, w->total_calls, total,
          h_status_name(client->sock.status));
  h_run_for(ctx, 100); /* room for a callback too many */
  H_CHECK(w->bad == 0, "%d write_received callbacks saw a problem; the first: %s", w->bad, w->why);
  H_ASSERT_EQ(w->total_calls, total, "write_received callbacks");
  for (i = 0; i < total; i++) H_ASSERT_EQ(w->calls[i], 1, "write_received callbacks for one write");
  H_ASSERT_EQ(server->received, 0, "message_received callbacks (write-imms are not messages)");
  H_ASSERT_STATUS(client->sock.status, IBMSG_CONNECTED, "client status after the write-imms");

  /* Credits came back: messages still go through afterwards, both ways. */
  ping(ctx, client, server, 100);
  ping(ctx, server, client, 100);
  H_ASSERT_OK(ibmsg_deregister_region(&w->src));
  H_ASSERT_OK(ibmsg_deregister_region(&w->tgt));
  h_finish(ctx);
  free(w);
}

/* Fewer write-imms than the peer has receive buffers: each is reported once, with its immediate
 * and length, and its bytes are in the region when write_received runs. */
static void write_imm_reports_once_with_bytes_visible(void **state) { write_imm_run(*state, 24, 0); }

/* 200 write-imms in a row to a peer with 8 receive buffers: they spend its credits like messages,
 * so all arrive only if the credits come back. */
static void write_imm_credits_come_back(void **state) { write_imm_run(*state, WI_TOTAL, 8); }

/* --- 2. immediates on messages -------------------------------------------------------------- */

#define MI_N 12

typedef struct {
  int n;
  size_t size[MI_N];
  uint32_t imm[MI_N];
  unsigned flags[MI_N];
  int payload_ok[MI_N];
  char why[256];
} mi_state;

static void mi_received(h_conn *c, ibmsg_buffer *msg) {
  mi_state *m = c->ctx->data;
  char why[160];
  if (m->n < MI_N) {
    m->size[m->n] = msg->size;
    m->imm[m->n] = msg->imm;
    m->flags[m->n] = msg->flags;
    m->payload_ok[m->n] = h_check(msg->data, msg->size, (uint32_t)m->n, why, sizeof why) == 0;
    if (!m->payload_ok[m->n] && !m->why[0]) snprintf(m->why, sizeof m->why, "message %d: %s", m->n, why);
  }
  m->n++;
  if (ibmsg_free_msg(msg) != IBMSG_OK) h_note_error(c->ctx, "freeing a received message failed");
}

static void message_immediates_arrive_with_flag(void **state) {
  h_ctx *ctx = *state;
  h_conn *client, *server;
  mi_state *m = t_new(sizeof *m);
  size_t max;
  int i, rc;
  /* Alternating with and without an immediate; with a receive depth of 2 the server's buffers
   * are reused, so a message without an immediate lands where one with an immediate was. */
  struct { int size_kind; int with_imm; uint32_t imm; } plan[MI_N] = {
      {0, 1, 0x00000000u}, {0, 0, 0}, {1, 1, 0xffffffffu}, {1, 0, 0}, {2, 1, 0x12345678u},
      {2, 0, 0},           {2, 1, 0x80000001u}, {2, 0, 0}, {1, 1, 0xdeadbeefu}, {0, 0, 0},
      {0, 1, 0x00000001u}, {1, 0, 0}};

  ctx->data = m;
  ctx->on_received = mi_received;
  ctx->listen_opts = opts_with(ctx, IBMSG_OPT_RECV_DEPTH, 2);
  h_pair(ctx, &client, &server);
  ibmsg_options_free(ctx->listen_opts);
  ctx->listen_opts = NULL;
  max = ibmsg_socket_max_msg_size(&client->sock);
  H_CHECK(max > 4, "max message size %zu", max);
  /* The largest kind: a rendezvous message (the default maximum, 4 GiB - 1, is too much here). */
  if (max > 300000) max = 300000;

  for (i = 0; i < MI_N; i++) {
    ibmsg_buffer *msg = &ctx->msgs[i];
    /* the largest kind: a rendezvous message (the maximum is 4 GiB - 1 by default) */
    size_t size = plan[i].size_kind == 0 ? 0 : plan[i].size_kind == 1 ? 1 : max;
    H_ASSERT_OK(ibmsg_alloc_msg(msg, &client->sock, size));
    h_fill(msg->data, size, (uint32_t)i);
    rc = plan[i].with_imm ? post_imm(client, msg, plan[i].imm) : h_try_post(client, msg);
    H_ASSERT_OK(rc);
  }
  H_RUN_UNTIL(ctx, m->n >= MI_N && client->sent >= MI_N, H_TIMEOUT_MS);
  H_ASSERT_EQ(client->sent_ok, MI_N, "message_sent callbacks with IBMSG_OK");
  H_ASSERT_EQ(m->n, MI_N, "messages received");
  for (i = 0; i < MI_N; i++) {
    size_t size = plan[i].size_kind == 0 ? 0 : plan[i].size_kind == 1 ? 1 : max;
    H_CHECK(m->size[i] == size, "message %d has %zu bytes, expected %zu", i, m->size[i], size);
    H_CHECK(m->payload_ok[i], "payload damaged: %s", m->why);
    if (plan[i].with_imm) {
      H_CHECK(m->flags[i] == IBMSG_MSG_IMM, "message %d (with an immediate): flags 0x%x, expected "
              "IBMSG_MSG_IMM", i, m->flags[i]);
      H_CHECK(m->imm[i] == plan[i].imm, "message %d: immediate 0x%08x, expected 0x%08x", i,
              (unsigned)m->imm[i], (unsigned)plan[i].imm);
    } else {
      H_CHECK(m->flags[i] == 0, "message %d (plain): flags 0x%x, expected 0", i, m->flags[i]);
    }
  }
  for (i = 0; i < MI_N; i++) H_ASSERT_OK(ibmsg_free_msg(&ctx->msgs[i]));
  h_finish(ctx);
  free(m);
}

/* --- 3. atomics ----------------------------------------------------------------------------- */

#define AT_PER_CLIENT 10000
#define AT_TOTAL (2 * AT_PER_CLIENT)

typedef struct {
  pump pumps[2];
  ibmsg_region word;      /* the server's 8-byte word (in a page) */
  ibmsg_region results;   /* the clients' previous values: pump c uses 8-byte slots at c * 128 */
  ibmsg_descriptor d[2];
  unsigned char seen[AT_TOTAL];
  int out_of_range, duplicates;
  uint64_t first_bad;
} at_state;

static uint64_t get_u64(const void *p) {
  uint64_t v;
  memcpy(&v, p, sizeof v);
  return v;
}

static int at_post(pump *p, ibmsg_op *op, int k, int i) {
  at_state *a = p->arg;
  int c = (int)(p - a->pumps);
  (void)i;
  return ibmsg_atomic_fadd(&p->conn->sock, op, &a->results, (size_t)c * 128 + (size_t)k * 8, &a->d[c],
                           0, 1);
}

static void at_done(pump *p, int k, int i) {
  at_state *a = p->arg;
  int c = (int)(p - a->pumps);
  uint64_t v = get_u64((const char *)a->results.addr + (size_t)c * 128 + (size_t)k * 8);
  (void)i;
  if (v >= AT_TOTAL) {
    if (a->out_of_range++ == 0 && a->duplicates == 0) a->first_bad = v;
    return;
  }
  if (a->seen[v]++) {
    if (a->duplicates++ == 0 && a->out_of_range == 0) a->first_bad = v;
  }
}

static void atomics_count_exactly(void **state) {
  h_ctx *ctx = *state;
  h_conn *client[2], *server[2];
  at_state *a = t_new(sizeof *a);
  op_slot *o = t_new(sizeof *o);
  uint64_t *word;
  int c, i;

  for (c = 0; c < 2; c++) h_pair(ctx, &client[c], &server[c]);
  H_ASSERT_OK(ibmsg_alloc_region(&ctx->loop, &a->word, 4096, IBMSG_ACCESS_REMOTE_ATOMIC));
  H_ASSERT_OK(ibmsg_alloc_region(&ctx->loop, &a->results, 4096, IBMSG_ACCESS_LOCAL_WRITE));
  for (c = 0; c < 2; c++)
    H_ASSERT_OK(ibmsg_region_descriptor(&a->word, &server[c]->sock, 0, 8, IBMSG_ACCESS_REMOTE_ATOMIC,
                                        &a->d[c]));
  word = a->word.addr;

  for (c = 0; c < 2; c++) {
    a->pumps[c].conn = client[c];
    a->pumps[c].total = AT_PER_CLIENT;
    a->pumps[c].nops = PUMP_OPS;
    a->pumps[c].post = at_post;
    a->pumps[c].done = at_done;
    a->pumps[c].arg = a;
  }
  for (c = 0; c < 2; c++) pump_start(&a->pumps[c]);
  RUN_WHILE_PROGRESS(ctx, pump_finished(&a->pumps[0]) && pump_finished(&a->pumps[1]),
                     a->pumps[0].completed + a->pumps[1].completed, 15000, 900000);
  H_CHECK(pump_finished(&a->pumps[0]) && pump_finished(&a->pumps[1]),
          "stalled (nothing for 15 s, the test's own limit): fetch-and-adds done %d and %d of "
          "%d each", a->pumps[0].completed,
          a->pumps[1].completed, AT_PER_CLIENT);
  H_ASSERT_EQ(*word, AT_TOTAL, "the word after 2 x 10000 fetch-and-adds of 1");
  H_CHECK(a->out_of_range == 0 && a->duplicates == 0,
          "%d previous values >= %d, %d duplicates (first bad value %llu)", a->out_of_range, AT_TOTAL,
          a->duplicates, (unsigned long long)a->first_bad);
  for (i = 0; i < AT_TOTAL; i++) H_CHECK(a->seen[i] == 1, "previous value %d seen %d times", i, a->seen[i]);

  /* compare-and-swap with the right compare value swaps */
  H_ASSERT_OK(ibmsg_atomic_cas(&client[0]->sock, slot_op(o), &a->results, 256, &a->d[0], 0,
                               AT_TOTAL, 777));
  RUN_SLOT(ctx, o);
  H_ASSERT_REASON(o->status, IBMSG_OK, "compare-and-swap status");
  H_ASSERT_EQ(get_u64((char *)a->results.addr + 256), AT_TOTAL, "previous value returned by the CAS");
  H_ASSERT_EQ(*word, 777, "the word after a CAS with the right compare value");
  /* ... and with a wrong one leaves the word, returning its value */
  H_ASSERT_OK(ibmsg_atomic_cas(&client[1]->sock, slot_op(o), &a->results, 264, &a->d[1], 0,
                               AT_TOTAL, 5));
  RUN_SLOT(ctx, o);
  H_ASSERT_REASON(o->status, IBMSG_OK, "compare-and-swap status");
  H_ASSERT_EQ(get_u64((char *)a->results.addr + 264), 777, "value returned by a failing CAS");
  H_ASSERT_EQ(*word, 777, "the word after a CAS with a wrong compare value");

  H_ASSERT_OK(ibmsg_deregister_region(&a->results));
  H_ASSERT_OK(ibmsg_deregister_region(&a->word));
  h_finish(ctx);
  free(o);
  free(a);
}

/* --- 4. ordering: write, then message ------------------------------------------------------- */

#define OR_ROUNDS 100
#define OR_MAX (64 * 1024)

typedef struct {
  ibmsg_region src, tgt;
  op_slot op;
  int received, bad;
  char why[256];
} or_state;

static size_t or_len(uint32_t r) { return 8 + ((size_t)r * 7919u) % (OR_MAX - 8); }

static void or_received(h_conn *c, ibmsg_buffer *msg) {
  or_state *s = c->ctx->data;
  char why[200];
  uint32_t r;
  s->received++;
  if (msg->size != 4) {
    if (s->bad++ == 0) snprintf(s->why, sizeof s->why, "a message of %zu bytes, expected 4", msg->size);
  } else {
    memcpy(&r, msg->data, 4);
    if (h_check(s->tgt.addr, or_len(r), r, why, sizeof why) != 0 && s->bad++ == 0)
      snprintf(s->why, sizeof s->why, "round %u: the write's bytes are not visible: %s", r, why);
  }
  if (ibmsg_free_msg(msg) != IBMSG_OK) h_note_error(c->ctx, "freeing a received message failed");
}

static void write_is_visible_before_next_message(void **state) {
  h_ctx *ctx = *state;
  h_conn *client, *server;
  or_state *s = t_new(sizeof *s);
  ibmsg_descriptor d;
  uint32_t r;

  ctx->data = s;
  ctx->on_received = or_received;
  h_pair(ctx, &client, &server);
  H_ASSERT_OK(ibmsg_alloc_region(&ctx->loop, &s->tgt, OR_MAX, IBMSG_ACCESS_REMOTE_WRITE));
  H_ASSERT_OK(ibmsg_region_descriptor(&s->tgt, &server->sock, 0, OR_MAX, IBMSG_ACCESS_REMOTE_WRITE, &d));
  H_ASSERT_OK(ibmsg_alloc_region(&ctx->loop, &s->src, OR_MAX, 0));
  for (r = 0; r < OR_ROUNDS; r++) {
    ibmsg_buffer *m = &ctx->msgs[0];
    int sent = client->sent;
    h_fill(s->src.addr, or_len(r), r);
    H_ASSERT_OK(ibmsg_alloc_msg(m, &client->sock, 4));
    memcpy(m->data, &r, 4);
    H_ASSERT_OK(ibmsg_rdma_write(&client->sock, slot_op(&s->op), &s->src, 0, or_len(r), &d, 0));
    h_post(client, m);
    H_RUN_UNTIL(ctx, s->op.calls > 0 && client->sent > sent && s->received > (int)r, H_TIMEOUT_MS);
    H_ASSERT_REASON(s->op.status, IBMSG_OK, "write status");
    H_ASSERT_REASON(client->last_sent_status, IBMSG_OK, "message_sent status");
    H_CHECK(s->bad == 0, "%s", s->why);
    H_ASSERT_OK(ibmsg_free_msg(m));
  }
  H_ASSERT_EQ(s->received, OR_ROUNDS, "messages received");
  H_ASSERT_OK(ibmsg_deregister_region(&s->src));
  H_ASSERT_OK(ibmsg_deregister_region(&s->tgt));
  h_finish(ctx);
  free(s);
}

/* --- 5. a descriptor of a sub-range; a forged one ------------------------------------------- */

/* desc with its length (bytes 16..23) replaced and the check (28..31) recomputed. */
#define forge_length(desc, length) h_forge_descriptor((desc), 16, (length), 8)

typedef struct {
  ibmsg_region tgt, src;
  op_slot op;
} sr_state;

static void subrange_descriptor_confines_the_peer(void **state) {
  h_ctx *ctx = *state;
  h_conn *client, *server, *client2, *server2;
  sr_state *s = t_new(sizeof *s);
  ibmsg_descriptor d, forged;
  unsigned char *tgt, before[4096];
  size_t len = 0;
  unsigned access = 0;
  int j;

  h_setopt_int(ctx, IBMSG_OPT_VIOLATION_BAN, 0);  /* it connects again after the violation */
  h_pair(ctx, &client, &server);
  H_ASSERT_OK(ibmsg_alloc_region(&ctx->loop, &s->tgt, 4096, RW));
  tgt = s->tgt.addr;
  memset(tgt, 0x5a, 4096);
  H_ASSERT_OK(ibmsg_region_descriptor(&s->tgt, &server->sock, 64, 64, IBMSG_ACCESS_REMOTE_WRITE, &d));
  H_ASSERT_OK(ibmsg_descriptor_info(&d, &len, &access));
  H_ASSERT_EQ(len, 64, "descriptor length");
  H_ASSERT_EQ(access, IBMSG_ACCESS_REMOTE_WRITE, "descriptor rights");
  H_ASSERT_OK(ibmsg_alloc_region(&ctx->loop, &s->src, 4096, 0));
  for (j = 0; j < 4096; j++) ((unsigned char *)s->src.addr)[j] = (unsigned char)(j + 1);

  /* 64 bytes at offset 0 of the descriptor: bytes 64..127 of the region */
  H_ASSERT_OK(ibmsg_rdma_write(&client->sock, slot_op(&s->op), &s->src, 0, 64, &d, 0));
  RUN_SLOT(ctx, &s->op);
  H_ASSERT_REASON(s->op.status, IBMSG_OK, "status of a 64-byte write");
  H_CHECK(memcmp(tgt + 64, s->src.addr, 64) == 0, "bytes 64..127 do not hold the write");
  H_CHECK(tgt[63] == 0x5a && tgt[128] == 0x5a, "a byte beside the range changed");

  /* 65 bytes: refused locally, nothing posted */
  H_ASSERT_CODE(ibmsg_rdma_write(&client->sock, slot_op(&s->op), &s->src, 0, 65, &d, 0), IBMSG_ERANGE);
  H_ASSERT_CODE(ibmsg_rdma_write(&client->sock, &s->op.op, &s->src, 0, 1, &d, 64), IBMSG_ERANGE);
  h_run_for(ctx, 50);
  H_ASSERT_EQ(s->op.calls, 0, "done callbacks of refused writes");

  /* A forged descriptor claiming 65 bytes passes the local checks; the peer refuses it. */
  forged = forge_length(&d, 65);
  H_ASSERT_OK(ibmsg_descriptor_info(&forged, &len, NULL));
  H_ASSERT_EQ(len, 65, "length of the forged descriptor");
  for (j = 0; j < 4096; j++) ((unsigned char *)s->src.addr)[j] = (unsigned char)(0xc3 ^ j);
  memcpy(before, tgt, 4096);
  H_ASSERT_OK(ibmsg_rdma_write(&client->sock, slot_op(&s->op), &s->src, 0, 65, &forged, 0));
  WAIT_CLOSED(ctx, client, IBMSG_EREMOTEACCESS);
  H_ASSERT_EQ(s->op.calls, 1, "done callbacks of the forged write");
  H_ASSERT_REASON(s->op.status, IBMSG_EREMOTEACCESS, "status of the forged write");
  H_ASSERT_EQ(s->op.closed_before, 0, "connection_closed callbacks before its done");
  H_CHECK(tgt[63] == before[63], "byte 63 changed");
  H_CHECK(memcmp(tgt + 128, before + 128, 4096 - 128) == 0, "bytes from 128 on changed");
  /* The server's side of that connection closes too (the error moves both queue pairs to the
   * error state), with the same reason: its peer's violation (test_grants.c tests the rest). */
  WAIT_CLOSED(ctx, server, IBMSG_EREMOTEACCESS);

  /* Other connections of the loop keep working. */
  h_pair(ctx, &client2, &server2);
  ping(ctx, client2, server2, 64);
  ping(ctx, server2, client2, 64);
  write_works(ctx, client2, server2);

  H_ASSERT_OK(ibmsg_deregister_region(&s->src));
  H_ASSERT_OK(ibmsg_deregister_region(&s->tgt));
  h_finish(ctx);
  free(s);
}

/* --- 6. revocation -------------------------------------------------------------------------- */

typedef struct {
  ibmsg_region tgt, other, src, dst;
  op_slot op;
} rv_state;

static void revoked_descriptor_is_refused(void **state) {
  h_ctx *ctx = *state;
  h_conn *ca, *sa, *cb, *sb;
  rv_state *s = t_new(sizeof *s);
  ibmsg_descriptor da, db;
  unsigned char before[4096];

  h_pair(ctx, &ca, &sa);
  h_pair(ctx, &cb, &sb);
  H_ASSERT_OK(ibmsg_alloc_region(&ctx->loop, &s->tgt, 4096, RW));
  H_ASSERT_OK(ibmsg_alloc_region(&ctx->loop, &s->other, 4096, RW));
  H_ASSERT_OK(ibmsg_alloc_region(&ctx->loop, &s->src, 4096, 0));
  H_ASSERT_OK(ibmsg_alloc_region(&ctx->loop, &s->dst, 4096, IBMSG_ACCESS_LOCAL_WRITE));
  memset(s->src.addr, 0x11, 4096);
  H_ASSERT_OK(ibmsg_region_descriptor(&s->tgt, &sa->sock, 0, 4096, RW, &da));
  H_ASSERT_OK(ibmsg_region_descriptor(&s->tgt, &sb->sock, 0, 2048, RW, &db));

  /* Both work before the revocation. */
  H_ASSERT_OK(ibmsg_rdma_write(&ca->sock, slot_op(&s->op), &s->src, 0, 16, &da, 0));
  RUN_SLOT(ctx, &s->op);
  H_ASSERT_REASON(s->op.status, IBMSG_OK, "write before the revocation");
  H_ASSERT_OK(ibmsg_rdma_read(&cb->sock, slot_op(&s->op), &s->dst, 0, 16, &db, 0));
  RUN_SLOT(ctx, &s->op);
  H_ASSERT_REASON(s->op.status, IBMSG_OK, "read before the revocation");

  /* Revoking: once; again, or on another region, is EBADDESC. */
  H_ASSERT_OK(ibmsg_revoke_descriptor(&s->tgt, &da));
  H_ASSERT_CODE(ibmsg_revoke_descriptor(&s->tgt, &da), IBMSG_EBADDESC);
  H_ASSERT_CODE(ibmsg_revoke_descriptor(&s->other, &db), IBMSG_EBADDESC);

  /* A write on the revoked descriptor fails at the peer and closes that connection only. */
  memset(s->src.addr, 0x22, 4096);
  memcpy(before, s->tgt.addr, 4096);
  H_ASSERT_OK(ibmsg_rdma_write(&ca->sock, slot_op(&s->op), &s->src, 0, 16, &da, 0));
  WAIT_CLOSED(ctx, ca, IBMSG_EREMOTEACCESS);
  H_ASSERT_EQ(s->op.calls, 1, "done callbacks");
  H_ASSERT_REASON(s->op.status, IBMSG_EREMOTEACCESS, "status of a write on a revoked descriptor");
  H_ASSERT_EQ(s->op.closed_before, 0, "connection_closed callbacks before its done");
  H_CHECK(memcmp(before, s->tgt.addr, 4096) == 0, "the revoked write changed the region");
  H_RUN_UNTIL(ctx, sa->closed, H_TIMEOUT_MS);

  /* The other connection still works on its own descriptor, until that is revoked too. */
  H_ASSERT_OK(ibmsg_rdma_read(&cb->sock, slot_op(&s->op), &s->dst, 0, 16, &db, 0));
  RUN_SLOT(ctx, &s->op);
  H_ASSERT_REASON(s->op.status, IBMSG_OK, "read on the other connection");
  H_ASSERT_OK(ibmsg_revoke_descriptor(&s->tgt, &db));
  H_ASSERT_CODE(ibmsg_revoke_descriptor(&s->tgt, &db), IBMSG_EBADDESC);
  H_ASSERT_OK(ibmsg_rdma_read(&cb->sock, slot_op(&s->op), &s->dst, 0, 16, &db, 0));
  WAIT_CLOSED(ctx, cb, IBMSG_EREMOTEACCESS);
  H_ASSERT_EQ(s->op.calls, 1, "done callbacks");
  H_ASSERT_REASON(s->op.status, IBMSG_EREMOTEACCESS, "status of a read on a revoked descriptor");
  H_ASSERT_EQ(s->op.closed_before, 0, "connection_closed callbacks before its done");

  H_ASSERT_OK(ibmsg_deregister_region(&s->src));
  H_ASSERT_OK(ibmsg_deregister_region(&s->dst));
  H_ASSERT_OK(ibmsg_deregister_region(&s->other));
  H_ASSERT_OK(ibmsg_deregister_region(&s->tgt));
  h_finish(ctx);
  free(s);
}

/* --- 7. bad inputs -------------------------------------------------------------------------- */

#define BIG (16 * MiB)

typedef struct {
  ibmsg_region tgt, src, dst, big, never, foreign;
  ibmsg_event_loop loop2;
  op_slot op;
} bi_state;

static void bad_inputs_are_refused_with_their_codes(void **state) {
  h_ctx *ctx = *state;
  h_conn *ca, *sa, *cb, *sb;
  bi_state *s = t_new(sizeof *s);
  ibmsg_descriptor d_all, d_ro, d_w, d_big, junk;
  ibmsg_socket *a;
  ibmsg_op *op;
  size_t len = 0;
  unsigned access = 0;
  uint32_t x = 0x9e3779b9u;
  int j;

  h_pair(ctx, &ca, &sa);
  h_pair(ctx, &cb, &sb);
  a = &ca->sock;
  H_ASSERT_OK(ibmsg_alloc_region(&ctx->loop, &s->tgt, 4096, RWA));
  H_ASSERT_OK(ibmsg_alloc_region(&ctx->loop, &s->src, 4096, 0));
  H_ASSERT_OK(ibmsg_alloc_region(&ctx->loop, &s->dst, BIG, IBMSG_ACCESS_LOCAL_WRITE));
  H_ASSERT_OK(ibmsg_alloc_region(&ctx->loop, &s->big, BIG, IBMSG_ACCESS_REMOTE_READ));
  H_ASSERT_OK(ibmsg_region_descriptor(&s->tgt, &sa->sock, 0, 4096, RWA, &d_all));
  H_ASSERT_OK(ibmsg_region_descriptor(&s->tgt, &sa->sock, 0, 4096, IBMSG_ACCESS_REMOTE_READ, &d_ro));
  H_ASSERT_OK(ibmsg_region_descriptor(&s->tgt, &sa->sock, 0, 4096, IBMSG_ACCESS_REMOTE_WRITE, &d_w));
  H_ASSERT_OK(ibmsg_region_descriptor(&s->big, &sa->sock, 0, BIG, IBMSG_ACCESS_REMOTE_READ, &d_big));
  for (j = 0; j < IBMSG_DESCRIPTOR_SIZE; j++) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    junk.bytes[j] = (unsigned char)x;
  }
  memset(&s->never, 0, sizeof s->never);
  H_ASSERT_OK(ibmsg_init_event_loop(&s->loop2));
  H_ASSERT_OK(ibmsg_alloc_region(&s->loop2, &s->foreign, 4096, IBMSG_ACCESS_LOCAL_WRITE));
  op = slot_op(&s->op);

  /* NULL arguments */
  H_ASSERT_CODE(ibmsg_rdma_write(NULL, op, &s->src, 0, 8, &d_all, 0), IBMSG_EINVAL);
  H_ASSERT_CODE(ibmsg_rdma_write(a, NULL, &s->src, 0, 8, &d_all, 0), IBMSG_EINVAL);
  H_ASSERT_CODE(ibmsg_rdma_write(a, op, NULL, 0, 8, &d_all, 0), IBMSG_EINVAL);
  H_ASSERT_CODE(ibmsg_rdma_write(a, op, &s->src, 0, 8, NULL, 0), IBMSG_EINVAL);
  H_ASSERT_CODE(ibmsg_rdma_read(NULL, op, &s->dst, 0, 8, &d_all, 0), IBMSG_EINVAL);
  H_ASSERT_CODE(ibmsg_rdma_read(a, op, &s->dst, 0, 8, NULL, 0), IBMSG_EINVAL);
  H_ASSERT_CODE(ibmsg_rdma_write_imm(a, NULL, &s->src, 0, 8, &d_all, 0, 1), IBMSG_EINVAL);
  H_ASSERT_CODE(ibmsg_atomic_fadd(a, op, NULL, 0, &d_all, 0, 1), IBMSG_EINVAL);
  H_ASSERT_CODE(ibmsg_atomic_cas(a, op, &s->dst, 0, NULL, 0, 0, 1), IBMSG_EINVAL);
  /* length 0 */
  H_ASSERT_CODE(ibmsg_rdma_write(a, op, &s->src, 0, 0, &d_all, 0), IBMSG_EINVAL);
  H_ASSERT_CODE(ibmsg_rdma_read(a, op, &s->dst, 0, 0, &d_all, 0), IBMSG_EINVAL);
  H_ASSERT_CODE(ibmsg_rdma_write_imm(a, op, &s->src, 0, 0, &d_all, 0, 1), IBMSG_EINVAL);
  /* local range outside the region */
  H_ASSERT_CODE(ibmsg_rdma_write(a, op, &s->src, 4000, 200, &d_all, 0), IBMSG_ERANGE);
  H_ASSERT_CODE(ibmsg_rdma_write(a, op, &s->src, 4097, 1, &d_all, 0), IBMSG_ERANGE);
  H_ASSERT_CODE(ibmsg_rdma_read(a, op, &s->dst, BIG - 1, 2, &d_all, 0), IBMSG_ERANGE);
  H_ASSERT_CODE(ibmsg_atomic_fadd(a, op, &s->dst, BIG - 4, &d_all, 0, 1), IBMSG_ERANGE);
  /* remote offset outside the descriptor */
  H_ASSERT_CODE(ibmsg_rdma_write(a, op, &s->src, 0, 200, &d_all, 4000), IBMSG_ERANGE);
  H_ASSERT_CODE(ibmsg_rdma_read(a, op, &s->dst, 0, 1, &d_all, 4096), IBMSG_ERANGE);
  H_ASSERT_CODE(ibmsg_rdma_write(a, op, &s->src, 0, 1, &d_all, (size_t)-1), IBMSG_ERANGE);
  H_ASSERT_CODE(ibmsg_atomic_fadd(a, op, &s->dst, 0, &d_all, 4096, 1), IBMSG_ERANGE);
  /* a descriptor of random bytes */
  H_ASSERT_CODE(ibmsg_rdma_write(a, op, &s->src, 0, 8, &junk, 0), IBMSG_EBADDESC);
  H_ASSERT_CODE(ibmsg_rdma_read(a, op, &s->dst, 0, 8, &junk, 0), IBMSG_EBADDESC);
  H_ASSERT_CODE(ibmsg_descriptor_info(&junk, &len, &access), IBMSG_EBADDESC);
  /* a descriptor without the right */
  H_ASSERT_CODE(ibmsg_rdma_write(a, op, &s->src, 0, 8, &d_ro, 0), IBMSG_EACCES);
  H_ASSERT_CODE(ibmsg_rdma_write_imm(a, op, &s->src, 0, 8, &d_ro, 0, 7), IBMSG_EACCES);
  H_ASSERT_CODE(ibmsg_atomic_fadd(a, op, &s->dst, 0, &d_ro, 0, 1), IBMSG_EACCES);
  H_ASSERT_CODE(ibmsg_rdma_read(a, op, &s->dst, 0, 8, &d_w, 0), IBMSG_EACCES);
  H_ASSERT_CODE(ibmsg_atomic_cas(a, op, &s->dst, 0, &d_w, 0, 0, 1), IBMSG_EACCES);
  /* a read or atomic into a region without IBMSG_ACCESS_LOCAL_WRITE */
  H_ASSERT_CODE(ibmsg_rdma_read(a, op, &s->src, 0, 8, &d_all, 0), IBMSG_EACCES);
  H_ASSERT_CODE(ibmsg_atomic_fadd(a, op, &s->src, 0, &d_all, 0, 1), IBMSG_EACCES);
  /* unaligned atomics */
  H_ASSERT_CODE(ibmsg_atomic_fadd(a, op, &s->dst, 0, &d_all, 4, 1), IBMSG_EINVAL);
  H_ASSERT_CODE(ibmsg_atomic_cas(a, op, &s->dst, 0, &d_all, 12, 0, 1), IBMSG_EINVAL);
  /* a region struct never registered (a region of another loop works: test_shared_region) */
  H_ASSERT_CODE(ibmsg_rdma_write(a, op, &s->never, 0, 8, &d_all, 0), IBMSG_EINVAL);
  /* a listener */
  H_ASSERT_CODE(ibmsg_rdma_write(&ctx->listener.sock, op, &s->src, 0, 8, &d_all, 0), IBMSG_ESTATE);
  /* descriptors: range, rights, length 0, rights that are not remote ones */
  H_ASSERT_CODE(ibmsg_region_descriptor(&s->tgt, &sa->sock, 4000, 200, IBMSG_ACCESS_REMOTE_READ, &junk),
                IBMSG_ERANGE);
  H_ASSERT_CODE(ibmsg_region_descriptor(&s->src, &sa->sock, 0, 16, IBMSG_ACCESS_REMOTE_READ, &junk),
                IBMSG_EACCES);
  H_ASSERT_CODE(ibmsg_region_descriptor(&s->tgt, &sa->sock, 0, 0, IBMSG_ACCESS_REMOTE_READ, &junk),
                IBMSG_EINVAL);
  H_ASSERT_CODE(ibmsg_region_descriptor(&s->tgt, &sa->sock, 0, 16, IBMSG_ACCESS_LOCAL_WRITE, &junk),
                IBMSG_EINVAL);
  H_ASSERT_OK(ibmsg_descriptor_info(&d_ro, &len, &access));
  H_ASSERT_EQ(len, 4096, "descriptor length");
  H_ASSERT_EQ(access, IBMSG_ACCESS_REMOTE_READ, "descriptor rights");
  h_run_for(ctx, 50);
  H_ASSERT_EQ(s->op.calls, 0, "done callbacks after refused calls");
  H_ASSERT_STATUS(ca->sock.status, IBMSG_CONNECTED, "status after refused calls");

  /* The same operation works; posted twice it is refused; its local region is busy. */
  H_ASSERT_OK(ibmsg_rdma_write(a, op, &s->src, 0, 8, &d_all, 0));
  RUN_SLOT(ctx, &s->op);
  H_ASSERT_REASON(s->op.status, IBMSG_OK, "a good write after the refused calls");
  H_ASSERT_OK(ibmsg_rdma_read(a, slot_op(&s->op), &s->dst, 0, BIG, &d_big, 0));
  H_ASSERT_REASON(op->status, IBMSG_EINPROGRESS, "op->status while posted");
  H_ASSERT_EQ(op->type, IBMSG_OP_READ, "op->type");
  H_ASSERT_CODE(ibmsg_rdma_read(a, op, &s->dst, 0, 8, &d_all, 0), IBMSG_EINVAL);
  H_ASSERT_CODE(ibmsg_rdma_write(&cb->sock, op, &s->src, 0, 8, &d_all, 0), IBMSG_EINVAL);
  H_ASSERT_CODE(ibmsg_deregister_region(&s->dst), IBMSG_EBUSY);
  RUN_SLOT(ctx, &s->op);
  H_ASSERT_EQ(s->op.calls, 1, "done callbacks of the big read");
  H_ASSERT_REASON(s->op.status, IBMSG_OK, "status of the big read");
  H_ASSERT_OK(ibmsg_deregister_region(&s->dst));
  H_ASSERT_CODE(ibmsg_deregister_region(&s->dst), IBMSG_EINVAL);

  /* A loop with a region registered cannot be destroyed. */
  H_ASSERT_CODE(ibmsg_destroy_event_loop(&s->loop2), IBMSG_EBUSY);
  H_ASSERT_OK(ibmsg_deregister_region(&s->foreign));
  H_ASSERT_OK(ibmsg_destroy_event_loop(&s->loop2));

  /* A descriptor of a region the server deregistered: the peer refuses it. */
  H_ASSERT_OK(ibmsg_deregister_region(&s->tgt));
  H_ASSERT_OK(ibmsg_rdma_write(a, slot_op(&s->op), &s->src, 0, 8, &d_all, 0));
  WAIT_CLOSED(ctx, ca, IBMSG_EREMOTEACCESS);
  H_ASSERT_EQ(s->op.calls, 1, "done callbacks");
  H_ASSERT_REASON(s->op.status, IBMSG_EREMOTEACCESS, "status of a write to a deregistered region");
  H_ASSERT_EQ(s->op.closed_before, 0, "connection_closed callbacks before its done");
  H_RUN_UNTIL(ctx, sa->closed, H_TIMEOUT_MS);
  /* a closed socket */
  H_ASSERT_CODE(ibmsg_rdma_write(a, slot_op(&s->op), &s->src, 0, 8, &d_all, 0), IBMSG_ENOTCONN);
  H_ASSERT_CODE(ibmsg_rdma_read(a, &s->op.op, &s->big, 0, 8, &d_big, 0), IBMSG_ENOTCONN);

  /* The other connection keeps working. */
  ping(ctx, cb, sb, 32);
  ping(ctx, sb, cb, 32);
  write_works(ctx, cb, sb);
  h_run_for(ctx, 50);
  H_ASSERT_EQ(s->op.calls, 0, "done callbacks after refused calls");

  H_ASSERT_OK(ibmsg_deregister_region(&s->src));
  H_ASSERT_OK(ibmsg_deregister_region(&s->big));
  h_finish(ctx);
  free(s);
}

/* --- 8. one-sided RDMA off ------------------------------------------------------------------ */

typedef struct {
  ibmsg_region tgt, src, dst;
  op_slot op;
} off_state;

static void rdma_off_refuses_ops_but_messages_work(void **state) {
  h_ctx *ctx = *state;
  h_conn *c_off, *s_off, *c_on, *s_on;
  off_state *s = t_new(sizeof *s);
  ibmsg_descriptor d, unused;
  ibmsg_buffer *m;
  ibmsg_op *op;
  int sent, received;

  /* The listener has one-sided RDMA off; a second connection accepted with it on is the
   * control. */
  ctx->listen_opts = opts_with(ctx, IBMSG_OPT_RDMA, 0);
  h_pair(ctx, &c_off, &s_off);
  ctx->accept_opts = opts_with(ctx, IBMSG_OPT_RDMA, 1);
  h_pair(ctx, &c_on, &s_on);
  ibmsg_options_free(ctx->listen_opts);
  ibmsg_options_free(ctx->accept_opts);
  ctx->listen_opts = ctx->accept_opts = NULL;

  H_ASSERT_OK(ibmsg_alloc_region(&ctx->loop, &s->tgt, 4096, RWA));
  H_ASSERT_OK(ibmsg_alloc_region(&ctx->loop, &s->src, 4096, 0));
  H_ASSERT_OK(ibmsg_alloc_region(&ctx->loop, &s->dst, 4096, IBMSG_ACCESS_LOCAL_WRITE));
  H_ASSERT_CODE(ibmsg_region_descriptor(&s->tgt, &s_off->sock, 0, 4096, RWA, &unused), IBMSG_EOPNOTSUPP);
  H_ASSERT_OK(ibmsg_region_descriptor(&s->tgt, &s_on->sock, 0, 4096, RWA, &d));

  op = slot_op(&s->op);
  H_ASSERT_CODE(ibmsg_rdma_write(&c_off->sock, op, &s->src, 0, 8, &d, 0), IBMSG_EOPNOTSUPP);
  H_ASSERT_CODE(ibmsg_rdma_read(&c_off->sock, op, &s->dst, 0, 8, &d, 0), IBMSG_EOPNOTSUPP);
  H_ASSERT_CODE(ibmsg_rdma_write_imm(&c_off->sock, op, &s->src, 0, 8, &d, 0, 3), IBMSG_EOPNOTSUPP);
  H_ASSERT_CODE(ibmsg_atomic_fadd(&c_off->sock, op, &s->dst, 0, &d, 0, 1), IBMSG_EOPNOTSUPP);
  H_ASSERT_CODE(ibmsg_atomic_cas(&c_off->sock, op, &s->dst, 0, &d, 0, 0, 1), IBMSG_EOPNOTSUPP);
  /* the side that turned it off has no operations either */
  H_ASSERT_CODE(ibmsg_rdma_write(&s_off->sock, op, &s->src, 0, 8, &d, 0), IBMSG_EOPNOTSUPP);
  H_ASSERT_CODE(ibmsg_rdma_read(&s_off->sock, op, &s->dst, 0, 8, &d, 0), IBMSG_EOPNOTSUPP);
  h_run_for(ctx, 50);
  H_ASSERT_EQ(s->op.calls, 0, "done callbacks of refused operations");

  /* Messages work both ways, with and without an immediate. */
  ping(ctx, c_off, s_off, 100);
  ping(ctx, s_off, c_off, 100);
  m = free_msg(ctx);
  sent = c_off->sent;
  received = s_off->received;
  h_alloc_fill(c_off, m, 10);
  H_ASSERT_OK(post_imm(c_off, m, 42));
  H_RUN_UNTIL(ctx, c_off->sent > sent && s_off->received > received, H_TIMEOUT_MS);
  H_ASSERT_REASON(c_off->last_sent_status, IBMSG_OK, "message_sent status of a message with an immediate");
  H_ASSERT_OK(ibmsg_free_msg(m));

  /* The control connection does one-sided RDMA with the same descriptor. */
  memset(s->src.addr, 0x77, 8);
  H_ASSERT_OK(ibmsg_rdma_write(&c_on->sock, op, &s->src, 0, 8, &d, 0));
  RUN_SLOT(ctx, &s->op);
  H_ASSERT_REASON(s->op.status, IBMSG_OK, "write on the connection with RDMA on");
  H_CHECK(memcmp(s->tgt.addr, s->src.addr, 8) == 0, "the control write did not arrive");
  H_ASSERT_STATUS(c_off->sock.status, IBMSG_CONNECTED, "status of the connection with RDMA off");

  H_ASSERT_OK(ibmsg_deregister_region(&s->src));
  H_ASSERT_OK(ibmsg_deregister_region(&s->dst));
  H_ASSERT_OK(ibmsg_deregister_region(&s->tgt));
  h_finish(ctx);
  free(s);
}

/* --- 9. done exactly once when the connection closes with operations in flight -------------- */

#define CL_OPS 40
#define CL_DEPTH 4
#define CL_SIZE (256 * 1024)

typedef struct {
  ibmsg_region tgt, dst;
  op_slot ops[CL_OPS];
  int rc[CL_OPS];
} cl_state;

static void closing_gives_every_op_one_done(void **state) {
  h_ctx *ctx = *state;
  h_conn *client, *server;
  cl_state *s = t_new(sizeof *s);
  ibmsg_descriptor d;
  int send_queue = 0, i, accepted = 0, last_order = 0, ok = 0, canceled = 0, calls_at_close;
  size_t len = sizeof send_queue;

  ctx->connect_opts = opts_with(ctx, IBMSG_OPT_RDMA_DEPTH, CL_DEPTH);
  H_ASSERT_OK(ibmsg_options_get(ctx->connect_opts, IBMSG_OPT_SEND_QUEUE, &send_queue, &len));
  h_pair(ctx, &client, &server);
  ibmsg_options_free(ctx->connect_opts);
  ctx->connect_opts = NULL;
  H_CHECK(CL_DEPTH + send_queue < CL_OPS, "the send queue (%d) is too long for this test", send_queue);

  H_ASSERT_OK(ibmsg_alloc_region(&ctx->loop, &s->tgt, CL_SIZE, IBMSG_ACCESS_REMOTE_READ));
  H_ASSERT_OK(ibmsg_region_descriptor(&s->tgt, &server->sock, 0, CL_SIZE, IBMSG_ACCESS_REMOTE_READ, &d));
  H_ASSERT_OK(ibmsg_alloc_region(&ctx->loop, &s->dst, (size_t)CL_OPS * CL_SIZE, IBMSG_ACCESS_LOCAL_WRITE));
  for (i = 0; i < CL_OPS; i++) {
    s->rc[i] = ibmsg_rdma_read(&client->sock, slot_op(&s->ops[i]), &s->dst, (size_t)i * CL_SIZE,
                               CL_SIZE, &d, 0);
    if (s->rc[i] == IBMSG_OK) accepted++;
  }
  H_ASSERT_OK(ibmsg_disconnect(&client->sock));
  for (i = 0; i < CL_OPS; i++)
    H_ASSERT_CODE(s->rc[i], i < CL_DEPTH + send_queue ? IBMSG_OK : IBMSG_EAGAIN);
  H_ASSERT_EQ(accepted, CL_DEPTH + send_queue, "reads accepted");

  WAIT_CLOSED(ctx, client, IBMSG_OK);
  calls_at_close = 0;
  for (i = 0; i < CL_OPS; i++) calls_at_close += s->ops[i].calls;
  h_run_for(ctx, 100);
  for (i = 0; i < CL_OPS; i++) {
    op_slot *o = &s->ops[i];
    if (i >= accepted) {
      H_CHECK(o->calls == 0, "read %d was refused with EAGAIN but got %d done callbacks", i, o->calls);
      continue;
    }
    H_CHECK(o->calls == 1, "read %d got %d done callbacks, expected 1", i, o->calls);
    H_CHECK(o->status == IBMSG_OK || o->status == IBMSG_ECANCELED, "read %d: status %s", i,
            ibmsg_err_name(o->status));
    H_CHECK(o->closed_before == 0, "read %d: done came after connection_closed", i);
    H_CHECK(o->order > last_order, "read %d: done came out of posting order", i);
    last_order = o->order;
    if (o->status == IBMSG_OK) ok++;
    else canceled++;
  }
  H_ASSERT_EQ(calls_at_close, accepted, "done callbacks by the time of connection_closed");
  print_message("closing with %d reads posted: %d completed, %d canceled\n", accepted, ok, canceled);

  H_ASSERT_OK(ibmsg_deregister_region(&s->dst));
  H_ASSERT_OK(ibmsg_deregister_region(&s->tgt));
  h_finish(ctx);
  free(s);
}

/* --- 10. regions registered before any connection ------------------------------------------- */

typedef struct {
  ibmsg_region tgt, local;
  op_slot op;
  void *mem;
} lz_state;

static void region_registered_early_works_later(void **state) {
  h_ctx *ctx = *state;
  h_conn *client, *server;
  lz_state *s = t_new(sizeof *s);
  ibmsg_descriptor d;
  size_t n = 256 * 1024;

  /* Before anything is listening or connected: the loop has no device open yet. */
  H_ASSERT_OK(ibmsg_alloc_region(&ctx->loop, &s->tgt, n, RW));
  H_CHECK(posix_memalign(&s->mem, 4096, 2 * n) == 0, "posix_memalign failed");
  memset(s->mem, 0, 2 * n);
  H_ASSERT_OK(ibmsg_register_region(&ctx->loop, &s->local, s->mem, 2 * n, IBMSG_ACCESS_LOCAL_WRITE));
  h_fill(s->mem, n, 4711);

  h_pair(ctx, &client, &server);
  H_ASSERT_OK(ibmsg_region_descriptor(&s->tgt, &server->sock, 0, n, RW, &d));
  H_ASSERT_OK(ibmsg_rdma_write(&client->sock, slot_op(&s->op), &s->local, 0, n, &d, 0));
  RUN_SLOT(ctx, &s->op);
  H_ASSERT_REASON(s->op.status, IBMSG_OK, "write from a region registered before the connection");
  H_CHECK(memcmp(s->tgt.addr, s->mem, n) == 0, "the write's bytes differ");
  H_ASSERT_OK(ibmsg_rdma_read(&client->sock, slot_op(&s->op), &s->local, n, n, &d, 0));
  RUN_SLOT(ctx, &s->op);
  H_ASSERT_REASON(s->op.status, IBMSG_OK, "read into a region registered before the connection");
  H_CHECK(memcmp((char *)s->mem + n, s->mem, n) == 0, "the read's bytes differ");

  H_ASSERT_OK(ibmsg_deregister_region(&s->local));
  H_ASSERT_OK(ibmsg_deregister_region(&s->tgt));
  h_finish(ctx);
  free(s->mem);
  free(s);
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      H_TEST(write_then_read_back_is_byte_exact),
      H_TEST(write_imm_reports_once_with_bytes_visible),
      H_TEST(write_imm_credits_come_back),
      H_TEST(message_immediates_arrive_with_flag),
      H_TEST(atomics_count_exactly),
      H_TEST(write_is_visible_before_next_message),
      H_TEST(subrange_descriptor_confines_the_peer),
      H_TEST(revoked_descriptor_is_refused),
      H_TEST(bad_inputs_are_refused_with_their_codes),
      H_TEST(rdma_off_refuses_ops_but_messages_work),
      H_TEST(closing_gives_every_op_one_done),
      H_TEST(region_registered_early_works_later),
  };
  h_init(argc, argv);
  return cmocka_run_group_tests(tests, NULL, NULL);
}
