/* test_shared_region.c - one region for two loops on two threads (issue 25), on Soft-RoCE: loop A
 * and loop B run on threads of their own, each with a connection to the harness's server (the
 * test's thread). A region registered once on loop A serves loop B's connection: messages from it
 * (eager and rendezvous), an RDMA write from it, and a descriptor of it granted on B's connection
 * that the server's peer of that connection reads through. Deregistration on A is refused with
 * IBMSG_EBUSY while B's grant lives and succeeds once B revoked it. The test's thread hands the
 * loops their work with ibmsg_event_loop_call and reads what their callbacks saw under a mutex. */
#include "harness.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define REGION_SIZE (1024 * 1024)
#define EAGER_SIZE 4096
#define RNDV_SIZE (256 * 1024)
#define RNDV_OFF 65536
#define WRITE_OFF 8192
#define WRITE_LEN 3000
#define GRANT_OFF 512
#define GRANT_LEN 4096

/* A loop on a thread of its own, with one connection, and what its callbacks saw. */
struct peer {
  const char *name;
  pthread_t thread;
  ibmsg_event_loop loop;
  ibmsg_socket sock;
  ibmsg_op op;
  ibmsg_buffer msgs[4];
  int stop; /* __atomic: the loop's thread destroys its loop and ends */
  /* Under g_mu: written on the loop's thread, read by the test's. */
  int ready, established, closed, close_reason;
  int sent, sent_ok, op_done, op_status;
  int calls;   /* handed calls that ran */
  int rc;      /* what the last handed call's ibmsg function said */
  int destroy_rc;
};

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cv = PTHREAD_COND_INITIALIZER;

/* Loop A's region (registered and deregistered on A's thread, used on B's), a descriptor of it
 * granted on B's connection, and what the server granted B's connection. */
static ibmsg_region g_shared;
static ibmsg_descriptor g_granted, g_server_desc;
static const char *g_addr;
static unsigned short g_port;

static int peer_get(struct peer *p, const int *field) {
  (void)p;
  pthread_mutex_lock(&g_mu);
  int v = *field;
  pthread_mutex_unlock(&g_mu);
  return v;
}
#define GET(p, f) peer_get((p), &(p)->f)

static void set_locked(int *field, int v) {
  pthread_mutex_lock(&g_mu);
  *field = v;
  pthread_mutex_unlock(&g_mu);
}

static struct peer *peer_of(ibmsg_socket *s) { return (struct peer *)s->loop->user_data; }

static void on_established(ibmsg_socket *s) { set_locked(&peer_of(s)->established, 1); }

static void on_sent(ibmsg_socket *s, ibmsg_buffer *msg, int status) {
  struct peer *p = peer_of(s);
  ibmsg_free_msg(msg);  /* a region's message: the region is busy until then */
  pthread_mutex_lock(&g_mu);
  p->sent++;
  if (status == IBMSG_OK) p->sent_ok++;
  pthread_mutex_unlock(&g_mu);
}

static void on_closed(ibmsg_socket *s, int reason) {
  struct peer *p = peer_of(s);
  pthread_mutex_lock(&g_mu);
  p->closed = 1;
  p->close_reason = reason;
  pthread_mutex_unlock(&g_mu);
}

static void on_op_done(ibmsg_socket *s, ibmsg_op *op, int status) {
  struct peer *p = peer_of(s);
  (void)op;
  pthread_mutex_lock(&g_mu);
  p->op_done++;
  p->op_status = status;
  pthread_mutex_unlock(&g_mu);
}

static void *run_loop(void *arg) {
  struct peer *p = arg;
  int rc = ibmsg_init_event_loop(&p->loop);
  if (rc == IBMSG_OK) {
    p->loop.user_data = p;
    p->loop.connection_established = on_established;
    p->loop.message_sent = on_sent;
    p->loop.connection_closed = on_closed;
    p->op.done = on_op_done;
  }
  pthread_mutex_lock(&g_mu);
  p->ready = rc == IBMSG_OK ? 1 : -1;
  pthread_cond_broadcast(&g_cv);
  pthread_mutex_unlock(&g_mu);
  if (rc) return NULL;
  while (!__atomic_load_n(&p->stop, __ATOMIC_ACQUIRE))
    ibmsg_dispatch_event_loop_timeout(&p->loop, 20);
  /* The socket is closed by now; the loop goes once its teardown ran (bounded). */
  uint64_t until = h_now_ms() + 10000;
  while ((rc = ibmsg_destroy_event_loop(&p->loop)) == IBMSG_EBUSY && h_now_ms() < until)
    ibmsg_dispatch_event_loop_timeout(&p->loop, 20);
  set_locked(&p->destroy_rc, rc);
  return NULL;
}

static void start_peer(struct peer *p, const char *name) {
  memset(p, 0, sizeof *p);
  p->name = name;
  H_CHECK(pthread_create(&p->thread, NULL, run_loop, p) == 0, "pthread_create failed");
  pthread_mutex_lock(&g_mu);
  while (!p->ready) pthread_cond_wait(&g_cv, &g_mu);
  int ready = p->ready;
  pthread_mutex_unlock(&g_mu);
  H_CHECK(ready == 1, "%s: ibmsg_init_event_loop failed", name);
}

static void stop_peer(struct peer *p) {
  __atomic_store_n(&p->stop, 1, __ATOMIC_RELEASE);
  pthread_join(p->thread, NULL);
  H_ASSERT_OK(p->destroy_rc);
}

/* --- work handed to the loops' threads ---------------------------------------------------- */

struct call {
  struct peer *p;
  int (*fn)(struct peer *p);
};

static void run_call(void *arg) {
  struct call *c = arg;
  int rc = c->fn(c->p);
  pthread_mutex_lock(&g_mu);
  c->p->rc = rc;
  c->p->calls++;
  pthread_mutex_unlock(&g_mu);
  free(c);
}

/* Runs fn on p's loop thread, the server's loop running meanwhile; returns what fn returned. */
static int on_loop(h_ctx *ctx, struct peer *p, int (*fn)(struct peer *p)) {
  struct call *c = h_new(sizeof *c);
  c->p = p;
  c->fn = fn;
  int before = GET(p, calls);
  H_ASSERT_OK(ibmsg_event_loop_call(&p->loop, run_call, c));
  H_RUN_UNTIL(ctx, GET(p, calls) > before, H_TIMEOUT_MS);
  return GET(p, rc);
}

static int do_connect(struct peer *p) { return ibmsg_connect(&p->loop, &p->sock, g_addr, g_port); }
static int do_disconnect(struct peer *p) { return ibmsg_disconnect(&p->sock); }

static unsigned char shared_byte(size_t i) { return (unsigned char)(i * 7 + (i >> 9) + 3); }

/* A: registers the region once and fills it. */
static int do_register(struct peer *p) {
  int rc = ibmsg_alloc_region(&p->loop, &g_shared, REGION_SIZE,
                              IBMSG_ACCESS_LOCAL_WRITE | IBMSG_ACCESS_REMOTE_READ);
  if (rc) return rc;
  for (size_t i = 0; i < REGION_SIZE; i++) ((unsigned char *)g_shared.addr)[i] = shared_byte(i);
  return IBMSG_OK;
}
static int do_deregister(struct peer *p) {
  (void)p;
  return ibmsg_deregister_region(&g_shared);
}

/* B: messages straight from A's region, an eager one and a rendezvous one. */
static int do_send_from_region(struct peer *p) {
  int rc = ibmsg_msg_from_region(&p->msgs[0], &p->sock, &g_shared, 0, EAGER_SIZE);
  if (!rc) rc = ibmsg_post_send(&p->sock, &p->msgs[0]);
  if (!rc) rc = ibmsg_msg_from_region(&p->msgs[1], &p->sock, &g_shared, RNDV_OFF, RNDV_SIZE);
  if (!rc) rc = ibmsg_post_send(&p->sock, &p->msgs[1]);
  return rc;
}
/* B: an RDMA write from A's region into the server's memory. */
static int do_write(struct peer *p) {
  return ibmsg_rdma_write(&p->sock, &p->op, &g_shared, WRITE_OFF, WRITE_LEN, &g_server_desc, 0);
}
/* B: a descriptor of A's region for its connection's peer, sent to it in a message (which
 * reaches the peer after the grant is in force). */
static int do_grant(struct peer *p) {
  int rc = ibmsg_region_descriptor(&g_shared, &p->sock, GRANT_OFF, GRANT_LEN,
                                   IBMSG_ACCESS_REMOTE_READ, &g_granted);
  if (!rc) rc = ibmsg_alloc_msg(&p->msgs[2], &p->sock, sizeof g_granted);
  if (rc) return rc;
  memcpy(p->msgs[2].data, g_granted.bytes, sizeof g_granted);
  return ibmsg_post_send(&p->sock, &p->msgs[2]);
}
static int do_revoke(struct peer *p) {
  (void)p;
  return ibmsg_revoke_descriptor(&g_shared, &g_granted);
}

/* --- the server (the test's thread) ------------------------------------------------------- */

struct server_rx {
  int n;
  size_t sizes[4];
  int bad; /* messages whose bytes were not the region's */
  ibmsg_descriptor desc;
};
static struct server_rx g_rx;

static void server_received(h_conn *c, ibmsg_buffer *msg) {
  (void)c;
  /* B's first two messages are the region's bytes; the third carries a descriptor. */
  const size_t off[] = {0, RNDV_OFF};
  if (g_rx.n < 2) {
    const unsigned char *d = msg->data;
    for (size_t i = 0; i < msg->size; i++)
      if (d[i] != shared_byte(off[g_rx.n] + i)) {
        g_rx.bad++;
        break;
      }
  } else if (g_rx.n == 2 && msg->size == sizeof g_rx.desc) {
    memcpy(g_rx.desc.bytes, msg->data, sizeof g_rx.desc);
  }
  if (g_rx.n < 4) g_rx.sizes[g_rx.n] = msg->size;
  g_rx.n++;
  ibmsg_free_msg(msg);
}

static void one_region_serves_two_loops_on_two_threads(void **state) {
  h_ctx *ctx = *state;
  struct peer *a = h_new(sizeof *a), *b = h_new(sizeof *b);
  ibmsg_region target, dst;
  h_op_slot rd;
  memset(&g_rx, 0, sizeof g_rx);
  g_addr = ctx->addr;
  ctx->on_received = server_received;
  h_listen(ctx, ctx->addr, 8);
  g_port = ctx->port;

  start_peer(a, "loop A");
  start_peer(b, "loop B");
  /* A's connection first, then B's: the server's sockets 0 and 1. */
  H_ASSERT_OK(on_loop(ctx, a, do_connect));
  H_RUN_UNTIL(ctx, GET(a, established) && ctx->n_servers == 1 && ctx->servers[0].established,
              H_TIMEOUT_MS);
  H_ASSERT_OK(on_loop(ctx, b, do_connect));
  H_RUN_UNTIL(ctx, GET(b, established) && ctx->n_servers == 2 && ctx->servers[1].established,
              H_TIMEOUT_MS);
  h_conn *sb = &ctx->servers[1];

  /* One registration, on A. */
  H_ASSERT_OK(on_loop(ctx, a, do_register));

  /* B sends from it: an eager message and a rendezvous one the server reads from it. */
  H_ASSERT_OK(on_loop(ctx, b, do_send_from_region));
  H_RUN_UNTIL(ctx, g_rx.n == 2 && GET(b, sent) == 2, H_TIMEOUT_MS);
  H_ASSERT_EQ(GET(b, sent_ok), 2, "B's messages from A's region sent");
  H_ASSERT_EQ(g_rx.sizes[0], EAGER_SIZE, "size of the eager message");
  H_ASSERT_EQ(g_rx.sizes[1], RNDV_SIZE, "size of the rendezvous message");
  H_ASSERT_EQ(g_rx.bad, 0, "messages whose bytes are not the region's");
  H_ASSERT_EQ(sb->received, 2, "messages on B's server socket");

  /* B writes from it into the server's memory, through the server's grant to B's connection. */
  H_ASSERT_OK(ibmsg_alloc_region(&ctx->loop, &target, 65536, IBMSG_ACCESS_REMOTE_WRITE));
  H_ASSERT_OK(ibmsg_region_descriptor(&target, &sb->sock, 0, 65536, IBMSG_ACCESS_REMOTE_WRITE,
                                      &g_server_desc));
  h_run_for(ctx, 200); /* the server's window is bound on its queue pair by then */
  H_ASSERT_OK(on_loop(ctx, b, do_write));
  H_RUN_UNTIL(ctx, GET(b, op_done) == 1, H_TIMEOUT_MS);
  H_ASSERT_REASON(GET(b, op_status), IBMSG_OK, "B's write from A's region");
  for (size_t i = 0; i < WRITE_LEN; i++)
    H_CHECK(((unsigned char *)target.addr)[i] == shared_byte(WRITE_OFF + i),
            "written byte %zu differs", i);

  /* B grants its peer a part of it; the server reads it through that connection. */
  H_ASSERT_OK(on_loop(ctx, b, do_grant));
  H_RUN_UNTIL(ctx, g_rx.n == 3, H_TIMEOUT_MS);
  H_CHECK(memcmp(g_rx.desc.bytes, g_granted.bytes, sizeof g_granted) == 0,
          "the descriptor did not arrive intact");
  H_ASSERT_OK(ibmsg_alloc_region(&ctx->loop, &dst, GRANT_LEN, IBMSG_ACCESS_LOCAL_WRITE));
  H_ASSERT_OK(ibmsg_rdma_read(&sb->sock, h_op_start(&rd), &dst, 0, GRANT_LEN, &g_rx.desc, 0));
  H_RUN_UNTIL(ctx, rd.calls > 0, H_TIMEOUT_MS);
  H_ASSERT_REASON(rd.status, IBMSG_OK, "the server's read through B's grant");
  for (size_t i = 0; i < GRANT_LEN; i++)
    H_CHECK(((unsigned char *)dst.addr)[i] == shared_byte(GRANT_OFF + i), "read byte %zu differs",
            i);

  /* A cannot deregister it while B's grant lives; once B revoked it, it can. */
  H_ASSERT_CODE(on_loop(ctx, a, do_deregister), IBMSG_EBUSY);
  H_ASSERT_OK(on_loop(ctx, b, do_revoke));
  H_ASSERT_OK(on_loop(ctx, a, do_deregister));

  /* Both connections close cleanly; both loops go. */
  H_ASSERT_OK(on_loop(ctx, a, do_disconnect));
  H_ASSERT_OK(on_loop(ctx, b, do_disconnect));
  H_RUN_UNTIL(ctx, GET(a, closed) && GET(b, closed), H_TIMEOUT_MS);
  H_ASSERT_REASON(GET(a, close_reason), IBMSG_OK, "A's close");
  H_ASSERT_REASON(GET(b, close_reason), IBMSG_OK, "B's close");
  stop_peer(a);
  stop_peer(b);
  H_ASSERT_OK(ibmsg_deregister_region(&target));
  H_ASSERT_OK(ibmsg_deregister_region(&dst));
  free(a);
  free(b);
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      H_TEST(one_region_serves_two_loops_on_two_threads),
  };
  h_init(argc, argv);
  return cmocka_run_group_tests(tests, NULL, NULL);
}
