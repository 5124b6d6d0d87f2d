/* test_spread.c - one port served by two loops on two threads (issue 25), on Soft-RoCE: the
 * listener on the first loop spreads its connections over both (ibmsg_listen_spread); a client
 * loop on the main thread opens CONNS connections (1000 unless IBMSG_TEST_SPREAD_CONNS says
 * otherwise), each sends MSGS numbered messages that its server side checks and echoes. What
 * must hold: each server loop gets exactly half of the connections (round robin), every message
 * arrives once, in order and intact, and is echoed; every socket closes exactly once, on its
 * own loop's thread; nothing is lost or refused. The last echo of every connection is sent from
 * one region registered once, on the first loop, before the threads start (ibmsg_msg_from_region):
 * it serves the connections of both loops. A second test accepts onto the other loop
 * explicitly (ibmsg_accept_on), 200 connections, all onto the second loop.
 * Built with -fsanitize=thread too (the TSan build), where it must run without a report. */
#define _POSIX_C_SOURCE 200809L
#include "harness.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LOOPS 2
#define MSGS 4
#define MSG_SIZE 64
#define CONNECTING 64 /* connects in progress at once */

struct srv_loop {
  ibmsg_event_loop loop;
  pthread_t thread;
  int index;
  int stop;        /* set on its own thread (stop_call) */
  pthread_t owner; /* the thread that runs it: every callback must come there */
  /* Its own thread writes them; the main thread reads them (atomics). */
  int established, closed, received, echoed, bad, off_thread, close_errors, from_region;
};

struct srv_conn {
  ibmsg_socket sock;
  uint32_t next; /* the next sequence number expected */
};

struct cli_conn {
  ibmsg_socket sock;
  uint32_t index;
  int established, closed, close_reason;
  uint32_t echoes, next_echo;
};

struct test {
  struct srv_loop srv[LOOPS];
  ibmsg_region region; /* connection c's last echo at offset c * MSG_SIZE, written before */
  ibmsg_socket listener;
  int listener_closed;
  ibmsg_event_loop client;
  struct cli_conn *conns;
  int n, started, established, done, closed, failed, bad;
  int accept_explicit; /* test 2: ibmsg_accept_on onto loop 1 instead of the spread */
  int accept_failures;
  char error[256];
};

static struct test *T;

static int load(const int *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
static void bump(int *p) { __atomic_add_fetch(p, 1, __ATOMIC_ACQ_REL); }

struct header {
  uint32_t conn, seq;
};

static void fill(void *data, uint32_t conn, uint32_t seq) {
  struct header h = {conn, seq};
  memset(data, (int)((conn * 7 + seq) & 0xff), MSG_SIZE);
  memcpy(data, &h, sizeof h);
}

static int intact(const void *data, size_t size, struct header *h) {
  if (size != MSG_SIZE) return 0;
  memcpy(h, data, sizeof *h);
  const unsigned char *b = data;
  for (size_t i = sizeof *h; i < MSG_SIZE; i++)
    if (b[i] != ((h->conn * 7 + h->seq) & 0xff)) return 0;
  return 1;
}

/* --- the server loops (their own threads) ------------------------------------------------- */

static struct srv_loop *srv_of(ibmsg_socket *s) { return s->loop->user_data; }

static void check_thread(struct srv_loop *l) {
  if (!pthread_equal(pthread_self(), l->owner)) bump(&l->off_thread);
}

static void srv_request(ibmsg_connection_request *req) {
  struct srv_loop *l = req->loop->user_data;
  check_thread(l);
  struct srv_conn *c = calloc(1, sizeof *c);
  if (!c) return; /* rejected */
  c->sock.user_data = c;
  int rc = T->accept_explicit ? ibmsg_accept_on(req, &T->srv[1].loop, &c->sock, NULL)
                              : ibmsg_accept(req, &c->sock);
  if (rc != IBMSG_OK) {
    bump(&T->accept_failures);
    free(c);
  }
}

static void srv_established(ibmsg_socket *s) {
  struct srv_loop *l = srv_of(s);
  check_thread(l);
  bump(&l->established);
}

static void srv_received(ibmsg_socket *s, ibmsg_buffer *msg) {
  struct srv_loop *l = srv_of(s);
  struct srv_conn *c = s->user_data;
  check_thread(l);
  struct header h = {0, 0};
  if (!intact(msg->data, msg->size, &h) || h.seq != c->next) bump(&l->bad);
  c->next = h.seq + 1;
  bump(&l->received);
  ibmsg_buffer *echo = malloc(sizeof *echo);
  /* The last one from the shared region, which holds the same bytes; the others copied. */
  const int last = h.seq == MSGS - 1;
  int rc = !echo ? IBMSG_ENOMEM
           : last ? ibmsg_msg_from_region(echo, s, &T->region, (size_t)h.conn * MSG_SIZE, MSG_SIZE)
                  : ibmsg_alloc_msg(echo, s, msg->size);
  if (rc != IBMSG_OK) {
    bump(&l->bad);
    free(echo);
  } else {
    if (last) bump(&l->from_region);
    else memcpy(echo->data, msg->data, msg->size);
    echo->user_data = echo;
    if (ibmsg_post_send(s, echo) != IBMSG_OK) {
      bump(&l->bad);
      ibmsg_free_msg(echo);
      free(echo);
    }
  }
  ibmsg_free_msg(msg);
}

static void srv_sent(ibmsg_socket *s, ibmsg_buffer *msg, int status) {
  struct srv_loop *l = srv_of(s);
  check_thread(l);
  if (status == IBMSG_OK) bump(&l->echoed);
  else bump(&l->bad);
  void *own = msg->user_data;
  ibmsg_free_msg(msg);
  free(own);
}

static void srv_closed(ibmsg_socket *s, int reason) {
  struct srv_loop *l = srv_of(s);
  check_thread(l);
  if (s == &T->listener) {
    bump(&T->listener_closed);
    return;
  }
  if (reason != IBMSG_OK && reason != IBMSG_ECONNRESET) bump(&l->close_errors);
  bump(&l->closed);
  free(s->user_data);
}

static void stop_call(void *arg) {
  struct srv_loop *l = arg;
  check_thread(l);
  l->stop = 1;
}

static void close_listener_call(void *arg) {
  (void)arg;
  ibmsg_disconnect(&T->listener);
}

static void *run_server(void *arg) {
  struct srv_loop *l = arg;
  l->owner = pthread_self();
  while (!l->stop) ibmsg_dispatch_event_loop_timeout(&l->loop, 1000);
  return NULL;
}

/* --- the client loop (the main thread) ---------------------------------------------------- */

static void cli_established(ibmsg_socket *s) {
  struct cli_conn *c = s->user_data;
  c->established = 1;
  T->established++;
  for (uint32_t i = 0; i < MSGS; i++) {
    ibmsg_buffer *m = malloc(sizeof *m);
    if (!m || ibmsg_alloc_msg(m, s, MSG_SIZE) != IBMSG_OK) {
      free(m);
      T->bad++;
      continue;
    }
    fill(m->data, c->index, i);
    m->user_data = m;
    if (ibmsg_post_send(s, m) != IBMSG_OK) {
      T->bad++;
      ibmsg_free_msg(m);
      free(m);
    }
  }
}

static void cli_received(ibmsg_socket *s, ibmsg_buffer *msg) {
  struct cli_conn *c = s->user_data;
  struct header h = {0, 0};
  if (!intact(msg->data, msg->size, &h) || h.conn != c->index || h.seq != c->next_echo) T->bad++;
  c->next_echo = h.seq + 1;
  if (++c->echoes == MSGS) T->done++;
  ibmsg_free_msg(msg);
}

static void cli_sent(ibmsg_socket *s, ibmsg_buffer *msg, int status) {
  (void)s;
  if (status != IBMSG_OK) T->bad++;
  void *own = msg->user_data;
  ibmsg_free_msg(msg);
  free(own);
}

static void cli_closed(ibmsg_socket *s, int reason) {
  struct cli_conn *c = s->user_data;
  c->closed++;
  c->close_reason = reason;
  T->closed++;
  if (!c->established) {
    T->failed++;
    if (!T->error[0])
      snprintf(T->error, sizeof T->error, "client %u closed before it was up: %s", c->index,
               ibmsg_err_name(reason));
  }
}

/* Runs the client loop until cond, re-arming the watchdog while anything moves. */
#define CLIENT_UNTIL(cond, what)                                                       \
  do {                                                                                 \
    long last_ = -1;                                                                   \
    while (!(cond)) {                                                                  \
      long now_ = T->established + T->done + T->closed + load(&T->srv[0].closed) +     \
                  load(&T->srv[1].closed) + T->started;                                \
      if (now_ != last_) h_watchdog(H_WATCHDOG_S);                                     \
      last_ = now_;                                                                    \
      ibmsg_dispatch_event_loop_timeout(&T->client, 100);                              \
      H_CHECK(!T->error[0], "%s: %s", what, T->error);                                 \
    }                                                                                  \
  } while (0)

static int conns_wanted(void) {
  const char *v = getenv("IBMSG_TEST_SPREAD_CONNS");
  int n = v && *v ? atoi(v) : 1000;
  return n > 1 ? n & ~1 : 2; /* even: half on each loop */
}

static void run(int accept_explicit) {
  const char *addr = h_env("IBMSG_TEST_ADDR");
  struct test t;
  memset(&t, 0, sizeof t);
  T = &t;
  t.n = conns_wanted();
  if (accept_explicit && t.n > 200) t.n = 200; /* (the spread test has the numbers) */
  t.accept_explicit = accept_explicit;
  t.conns = h_new(sizeof *t.conns * (size_t)t.n);
  memset(t.conns, 0, sizeof *t.conns * (size_t)t.n);
  for (int i = 0; i < LOOPS; i++) {
    struct srv_loop *l = &t.srv[i];
    l->index = i;
    l->owner = pthread_self();
    H_ASSERT_OK(ibmsg_init_event_loop(&l->loop));
    l->loop.user_data = l;
    l->loop.connection_request = srv_request;
    l->loop.connection_established = srv_established;
    l->loop.message_received = srv_received;
    l->loop.message_sent = srv_sent;
    l->loop.connection_closed = srv_closed;
  }
  H_ASSERT_OK(ibmsg_init_event_loop(&t.client));
  t.client.connection_established = cli_established;
  t.client.message_received = cli_received;
  t.client.message_sent = cli_sent;
  t.client.connection_closed = cli_closed;

  /* The region, and the listener on loop 0, before its thread takes the loop over. */
  H_ASSERT_OK(ibmsg_alloc_region(&t.srv[0].loop, &t.region, (size_t)t.n * MSG_SIZE, 0));
  for (int i = 0; i < t.n; i++)
    fill((char *)t.region.addr + (size_t)i * MSG_SIZE, (uint32_t)i, MSGS - 1);
  H_ASSERT_OK(ibmsg_listen(&t.srv[0].loop, &t.listener, addr, 0, t.n));
  unsigned short port = 0;
  H_ASSERT_OK(ibmsg_socket_local_address(&t.listener, NULL, 0, &port));
  if (!accept_explicit) {
    ibmsg_event_loop *loops[LOOPS] = {&t.srv[0].loop, &t.srv[1].loop};
    H_ASSERT_OK(ibmsg_listen_spread(&t.listener, loops, LOOPS));
  }
  for (int i = 0; i < LOOPS; i++)
    H_CHECK(pthread_create(&t.srv[i].thread, NULL, run_server, &t.srv[i]) == 0,
            "pthread_create failed");

  /* CONNECTING at a time, the next ones as those come up. */
  while (t.started < t.n || t.established + t.failed < t.n) {
    while (t.started < t.n && t.started - t.established - t.failed < CONNECTING) {
      struct cli_conn *c = &t.conns[t.started];
      c->index = (uint32_t)t.started;
      c->sock.user_data = c;
      H_ASSERT_OK(ibmsg_connect(&t.client, &c->sock, addr, port));
      t.started++;
    }
    CLIENT_UNTIL(t.established + t.failed == t.started ||
                     (t.started < t.n && t.started - t.established - t.failed < CONNECTING),
                 "connecting");
  }
  CLIENT_UNTIL(t.done == t.n, "echoes");
  H_ASSERT_EQ(t.bad, 0, "bad messages at the client");
  for (int i = 0; i < t.n; i++) H_ASSERT_OK(ibmsg_disconnect(&t.conns[i].sock));
  CLIENT_UNTIL(t.closed == t.n && load(&t.srv[0].closed) + load(&t.srv[1].closed) == t.n,
               "closing");
  H_ASSERT_OK(ibmsg_event_loop_call(&t.srv[0].loop, close_listener_call, NULL));
  CLIENT_UNTIL(load(&t.listener_closed) == 1, "closing the listener");
  for (int i = 0; i < LOOPS; i++) H_ASSERT_OK(ibmsg_event_loop_call(&t.srv[i].loop, stop_call, &t.srv[i]));
  for (int i = 0; i < LOOPS; i++) pthread_join(t.srv[i].thread, NULL);

  printf("# %d connections: loop 0 took %d, loop 1 took %d; %d + %d messages echoed, %d + %d of "
         "them from the one region\n", t.n, t.srv[0].established, t.srv[1].established,
         t.srv[0].echoed, t.srv[1].echoed, t.srv[0].from_region, t.srv[1].from_region);
  H_ASSERT_EQ(t.accept_failures, 0, "failed accepts");
  const int half = accept_explicit ? 0 : t.n / 2;
  H_ASSERT_EQ(t.srv[0].established, half, "connections of loop 0");
  H_ASSERT_EQ(t.srv[1].established, t.n - half, "connections of loop 1");
  for (int i = 0; i < LOOPS; i++) {
    struct srv_loop *l = &t.srv[i];
    const int conns = i == 0 ? half : t.n - half;
    H_ASSERT_EQ(l->received, conns * MSGS, "messages a server loop received");
    H_ASSERT_EQ(l->echoed, conns * MSGS, "messages a server loop echoed");
    H_ASSERT_EQ(l->from_region, conns, "echoes a server loop sent from the shared region");
    H_ASSERT_EQ(l->closed, conns, "closed connections of a server loop");
    H_ASSERT_EQ(l->bad, 0, "bad messages at a server loop");
    H_ASSERT_EQ(l->off_thread, 0, "callbacks off the loop's thread");
    H_ASSERT_EQ(l->close_errors, 0, "server connections closed with an error");
  }
  for (int i = 0; i < t.n; i++) H_ASSERT_EQ(t.conns[i].closed, 1, "closed callbacks of a client");
  H_ASSERT_EQ(t.failed, 0, "clients that never came up");
  H_ASSERT_OK(ibmsg_deregister_region(&t.region)); /* (loop 0 is this thread's again) */
  for (int i = 0; i < LOOPS; i++) H_ASSERT_OK(ibmsg_destroy_event_loop(&t.srv[i].loop));
  H_ASSERT_OK(ibmsg_destroy_event_loop(&t.client));
  free(t.conns);
  T = NULL;
}

static void a_spreading_listener_splits_its_connections_evenly(void **state) {
  (void)state;
  run(0);
}

static void connections_accepted_onto_another_loop_live_there(void **state) {
  (void)state;
  run(1);
}

int main(int argc, char **argv) {
  h_init(argc, argv);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(a_spreading_listener_splits_its_connections_evenly),
      cmocka_unit_test(connections_accepted_onto_another_loop_live_there),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
