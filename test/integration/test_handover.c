/* test_handover.c - worker threads get messages sent on a real connection through
 * ibmsg_event_loop_call (issue 25), on Soft-RoCE: 4 threads hand 2000 sends each to the loop's
 * thread while it runs; every message arrives exactly once, each thread's in the order it posted
 * them, intact; the workers never call anything else of ibmsg. A second test checks that one
 * thread's calls run in its order against the connection: its last call, posted after its 2000
 * sends, finds all of them handed over; then the connection closes cleanly. */
#include "harness.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define WORKERS 4
#define PER_WORKER 2000
#define MSG_SIZE 64
#define BACKLOG (WORKERS * PER_WORKER)

struct job {
  uint32_t worker, seq;
};

struct state {
  h_ctx *ctx;
  h_conn *client, *server;
  /* The loop's thread only: jobs waiting for a send buffer, in the order they came. */
  struct job *backlog; /* BACKLOG entries */
  int head, tail;
  int posted, sent_ok, failed_posts;
  /* The receiver: the next sequence number of each worker, and what went wrong. */
  uint32_t next[WORKERS];
  int received, out_of_order, corrupt;
  int last_ran;         /* the worker's last call ran */
  int handed_at_last;   /* sends posted or waiting when it ran */
  /* Any thread: the workers' failed ibmsg_event_loop_call, and calls run off the loop thread. */
  int call_failures;
  pthread_t loop_thread;
  int off_thread;
};

static struct state *g;

/* Posts what waits, as far as send buffers allow; message_sent calls it again. */
static void pump(struct state *s) {
  while (s->head != s->tail) {
    struct job j = s->backlog[s->head];
    ibmsg_buffer *msg = h_new(sizeof *msg);
    int rc = ibmsg_alloc_msg(msg, &s->client->sock, MSG_SIZE);
    if (rc == IBMSG_EAGAIN) {
      free(msg);
      return; /* a message_sent gives a buffer back */
    }
    if (rc != IBMSG_OK) {
      free(msg);
      h_note_error(s->ctx, "ibmsg_alloc_msg: %s", ibmsg_err_name(rc));
      return;
    }
    memset(msg->data, (int)(j.worker * 31 + j.seq) & 0xff, MSG_SIZE);
    memcpy(msg->data, &j, sizeof j);
    msg->user_data = msg;
    rc = h_try_post(s->client, msg);
    if (rc == IBMSG_EAGAIN) { /* the send queue is full: later */
      ibmsg_free_msg(msg);
      free(msg);
      return;
    }
    if (rc != IBMSG_OK) {
      ++s->failed_posts;
      ibmsg_free_msg(msg);
      free(msg);
      h_note_error(s->ctx, "ibmsg_post_send: %s", ibmsg_err_name(rc));
      return;
    }
    ++s->posted;
    s->head = (s->head + 1) % BACKLOG;
  }
}

/* On the loop's thread: a worker's send. */
static void send_job(void *arg) {
  struct state *s = g;
  uintptr_t v = (uintptr_t)arg;
  struct job j = {(uint32_t)(v >> 32), (uint32_t)v};
  if (!pthread_equal(pthread_self(), s->loop_thread)) ++s->off_thread;
  s->backlog[s->tail] = j;
  s->tail = (s->tail + 1) % BACKLOG;
  pump(s);
}

static void on_sent(h_conn *conn, ibmsg_buffer *msg, int status) {
  struct state *s = g;
  if (conn != s->client) return;
  if (status == IBMSG_OK) ++s->sent_ok;
  ibmsg_free_msg(msg);
  free(msg);
  pump(s);
}

static void on_received(h_conn *conn, ibmsg_buffer *msg) {
  struct state *s = g;
  struct job j;
  const unsigned char *p = msg->data;
  (void)conn;
  if (msg->size != MSG_SIZE) {
    ++s->corrupt;
  } else {
    memcpy(&j, p, sizeof j);
    for (size_t i = sizeof j; i < MSG_SIZE; i++)
      if (p[i] != ((j.worker * 31 + j.seq) & 0xff)) ++s->corrupt;
    if (j.worker >= WORKERS || j.seq != s->next[j.worker]) ++s->out_of_order;
    else ++s->next[j.worker];
  }
  ++s->received;
  ibmsg_free_msg(msg);
}

struct worker {
  h_ctx *ctx;
  uint32_t id;
};

static void *run_worker(void *arg) {
  struct worker *w = arg;
  for (uint32_t i = 0; i < PER_WORKER; i++) {
    uintptr_t v = ((uintptr_t)w->id << 32) | i;
    if (ibmsg_event_loop_call(&w->ctx->loop, send_job, (void *)v) != IBMSG_OK)
      __atomic_add_fetch(&g->call_failures, 1, __ATOMIC_RELAXED);
  }
  return NULL;
}

/* On the loop's thread: a worker's last call, behind its sends. */
static void last_job(void *arg) {
  struct state *s = arg;
  s->last_ran = 1;
  s->handed_at_last = s->posted + (s->tail - s->head + BACKLOG) % BACKLOG;
}

static void start(h_ctx *ctx, struct state *s) {
  memset(s, 0, sizeof *s);
  s->ctx = ctx;
  s->backlog = h_new(sizeof *s->backlog * BACKLOG);
  s->loop_thread = pthread_self();
  g = s;
  h_pair(ctx, &s->client, &s->server);
  ctx->on_sent = on_sent;
  ctx->on_received = on_received;
}

static void check(struct state *s) {
  H_CHECK(s->call_failures == 0, "%d ibmsg_event_loop_call failed", s->call_failures);
  H_CHECK(s->off_thread == 0, "%d calls ran off the loop's thread", s->off_thread);
  H_CHECK(s->failed_posts == 0, "%d posts failed", s->failed_posts);
  H_CHECK(s->received == BACKLOG, "%d of %d messages arrived", s->received, BACKLOG);
  H_CHECK(s->out_of_order == 0, "%d messages out of a worker's order, or twice", s->out_of_order);
  H_CHECK(s->corrupt == 0, "%d bytes or sizes wrong", s->corrupt);
  for (int t = 0; t < WORKERS; t++)
    H_CHECK(s->next[t] == PER_WORKER, "worker %d: %u of %d arrived", t, s->next[t], PER_WORKER);
}

static void workers_send_through_the_loop(void **state) {
  h_ctx *ctx = *state;
  struct state s;
  pthread_t th[WORKERS];
  struct worker w[WORKERS];
  start(ctx, &s);
  for (int t = 0; t < WORKERS; t++) {
    w[t].ctx = ctx;
    w[t].id = (uint32_t)t;
    H_CHECK(pthread_create(&th[t], NULL, run_worker, &w[t]) == 0, "pthread_create failed");
  }
  H_RUN_UNTIL_PROGRESS(ctx, s.received == BACKLOG && s.sent_ok == BACKLOG, 30000);
  for (int t = 0; t < WORKERS; t++) pthread_join(th[t], NULL);
  check(&s);
  free(s.backlog);
  h_finish(ctx);
}

/* A worker's last call runs after its sends were all handed over (in the order posted); the
 * connection closes with IBMSG_OK after all of them went out. */
static void *run_worker_then_last(void *arg) {
  run_worker(arg);
  struct worker *w = arg;
  if (ibmsg_event_loop_call(&w->ctx->loop, last_job, g) != IBMSG_OK)
    __atomic_add_fetch(&g->call_failures, 1, __ATOMIC_RELAXED);
  return NULL;
}

static void one_threads_calls_run_in_its_order(void **state) {
  h_ctx *ctx = *state;
  struct state s;
  pthread_t th;
  struct worker w = {ctx, 0};
  start(ctx, &s);
  H_CHECK(pthread_create(&th, NULL, run_worker_then_last, &w) == 0, "pthread_create failed");
  H_RUN_UNTIL_PROGRESS(ctx, s.last_ran, 30000);
  pthread_join(th, NULL);
  H_CHECK(s.handed_at_last == PER_WORKER,
          "%d sends posted or waiting when the last call ran, of %d", s.handed_at_last,
          PER_WORKER);
  H_RUN_UNTIL_PROGRESS(ctx, s.received == PER_WORKER && s.sent_ok == PER_WORKER, 30000);
  H_ASSERT_OK(ibmsg_disconnect(&s.client->sock));
  H_RUN_UNTIL(ctx, s.client->closed == 1 && s.server->closed == 1, H_TIMEOUT_MS);
  H_CHECK(s.client->close_reason == IBMSG_OK, "the client closed with %s",
          ibmsg_err_name(s.client->close_reason));
  H_CHECK(s.next[0] == PER_WORKER, "%u of %d arrived", s.next[0], PER_WORKER);
  H_CHECK(s.out_of_order == 0 && s.corrupt == 0, "%d out of order, %d corrupt", s.out_of_order,
          s.corrupt);
  free(s.backlog);
  h_finish(ctx);
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(workers_send_through_the_loop, h_setup, h_teardown),
      cmocka_unit_test_setup_teardown(one_threads_calls_run_in_its_order, h_setup, h_teardown),
  };
  h_init(argc, argv);
  return cmocka_run_group_tests(tests, NULL, NULL);
}
