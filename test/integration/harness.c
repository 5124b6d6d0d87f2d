/* harness.c - shared helpers for the ibmsg integration tests (see harness.h). */
#define _POSIX_C_SOURCE 200809L

#include "harness.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define H_STEP_MS 50 /* longest single wait inside the loop, so deadlines are checked often */

static const char *h_program = "test";
static const char *volatile h_last_wait = "(nothing yet)";
/* Bumped each time the test is back in the harness (a step of a wait, a callback): the watchdog
 * fires only when it stood still for the watchdog's whole period, not when a test that keeps
 * moving takes long on a slow machine. */
static volatile sig_atomic_t h_progress;
static unsigned long h_event_count; /* callbacks of the harness (h_events()) */
static sig_atomic_t h_progress_seen;
static volatile unsigned h_watchdog_s;

/* --- set up and tear down ------------------------------------------------------------------ */

void h_init(int argc, char **argv) {
  const char *slash;
  if (argc > 0 && argv[0]) {
    /* The libtool wrapper runs .libs/lt-NAME or .libs/NAME: name the program the user ran. */
    slash = strrchr(argv[0], '/');
    h_program = slash ? slash + 1 : argv[0];
    if (strncmp(h_program, "lt-", 3) == 0) h_program += 3;
  }
  if (argc > 1) cmocka_set_test_filter(argv[1]);
  if (!getenv("IBMSG_TEST_ADDR") || !*getenv("IBMSG_TEST_ADDR")) {
    fprintf(stderr, "%s: IBMSG_TEST_ADDR is not set: run it inside the Soft-RoCE VM "
            "(test/softroce/run -- build/test/integration/%s), or set IBMSG_TEST_ADDR (and "
            "IBMSG_TEST_ADDR6, IBMSG_TEST_HOST, IBMSG_TEST_DEVICE) for real RDMA hardware\n",
            h_program, h_program);
    exit(1);
  }
}

const char *h_env(const char *name) {
  const char *value = getenv(name);
  if (!value || !*value)
    h_fail_at(__FILE__, __LINE__,
              "%s is not set: run this program inside the Soft-RoCE VM "
              "(test/softroce/run -- build/test/integration/%s) or set %s for real RDMA hardware",
              name, h_program, name);
  return value;
}

static void h_watchdog_fired(int sig) {
  static const char head[] = "\nwatchdog: the test made no progress for ";
  static const char tail[] = " s (its own limit: stuck in a library call or a wait that never "
                             "returns to the harness); last wait: ";
  const char *what = h_last_wait;
  char num[24], *p = num + sizeof num;
  unsigned n = h_watchdog_s;
  ssize_t ignored;
  (void)sig;
  if (h_progress != h_progress_seen) { /* it moved since the last alarm: a slow test, not a hang */
    h_progress_seen = h_progress;
    alarm(h_watchdog_s);
    return;
  }
  do *--p = (char)('0' + n % 10); while ((n /= 10) != 0);
  ignored = write(2, head, sizeof head - 1);
  ignored = write(2, p, (size_t)(num + sizeof num - p));
  ignored = write(2, tail, sizeof tail - 1);
  ignored = write(2, what, strlen(what));
  ignored = write(2, "\n", 1);
  (void)ignored;
  _exit(3);
}

void h_watchdog(unsigned seconds) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = h_watchdog_fired;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGALRM, &sa, NULL);
  h_watchdog_s = seconds;
  h_progress_seen = h_progress;
  alarm(seconds);
}

static void h_callbacks_install(ibmsg_event_loop *loop);

void h_conn_reset(h_conn *conn, h_ctx *ctx, const char *name) {
  memset(conn, 0, sizeof *conn);
  conn->ctx = ctx;
  snprintf(conn->name, sizeof conn->name, "%s", name);
  conn->close_reason = -1;
  conn->expect_size = -1;
}

static int h_dispatch_step(h_ctx *ctx, int max_wait_ms) {
  return ibmsg_dispatch_event_loop_timeout(&ctx->loop, max_wait_ms);
}

h_ctx *h_ctx_create(struct ev_loop *ev) {
  h_ctx *ctx;
  int rc, i;
  char name[32];

  ctx = calloc(1, sizeof *ctx);
  H_CHECK(ctx != NULL, "out of memory for the test context");
  ctx->addr = h_env("IBMSG_TEST_ADDR");
  h_conn_reset(&ctx->listener, ctx, "listener");
  for (i = 0; i < H_MAX_CONNS; i++) {
    snprintf(name, sizeof name, "client %d", i);
    h_conn_reset(&ctx->clients[i], ctx, name);
    snprintf(name, sizeof name, "server %d", i);
    h_conn_reset(&ctx->servers[i], ctx, name);
  }
  ctx->decision = H_ACCEPT;
  ctx->step = h_dispatch_step;

  rc = ev ? ibmsg_init_event_loop_ev(&ctx->loop, ev) : ibmsg_init_event_loop(&ctx->loop);
  if (rc != IBMSG_OK) {
    free(ctx);
    h_fail_at(__FILE__, __LINE__, "%s failed: %s (%d)",
              ev ? "ibmsg_init_event_loop_ev" : "ibmsg_init_event_loop", ibmsg_err_name(rc), rc);
    return NULL;
  }
  ctx->loop_initialized = 1;
  H_CHECK(ctx->loop.connection_request == NULL && ctx->loop.connection_established == NULL &&
              ctx->loop.message_received == NULL && ctx->loop.message_sent == NULL &&
              ctx->loop.connection_closed == NULL,
          "ibmsg_init_event_loop left a callback set (all must be NULL)");
  ctx->loop.user_data = ctx;
  h_callbacks_install(&ctx->loop);
  /* The tests run with RNR retry disabled so that a message sent without a credit closes the
   * connection with a transport error instead of being retried until a buffer shows up. */
  h_setopt_int(ctx, IBMSG_OPT_RNR_RETRY, 0);
  return ctx;
}

static int h_conn_open(const h_conn *c) { return c->active && c->closed == 0; }

int h_all_closed(h_ctx *ctx) {
  int i;
  if (h_conn_open(&ctx->listener)) return 0;
  for (i = 0; i < ctx->n_clients; i++)
    if (h_conn_open(&ctx->clients[i])) return 0;
  for (i = 0; i < ctx->n_servers; i++)
    if (h_conn_open(&ctx->servers[i])) return 0;
  return 1;
}

static void h_release_quietly(h_conn *c) {
  int i;
  for (i = 0; i < c->n_held; i++) ibmsg_free_msg(c->held[i]);
  c->n_held = 0;
  c->hold = 0;
  /* Stream buffers that are not posted (a post failed); freeing one twice is harmless. */
  for (i = 0; i < c->stream_nbufs; i++)
    if (!c->stream_busy[i] && c->stream_msgs[i].impl) ibmsg_free_msg(&c->stream_msgs[i]);
}

static void h_disconnect_quietly(h_conn *c) {
  if (h_conn_open(c)) ibmsg_disconnect(&c->sock);
}

int h_ctx_cleanup(h_ctx *ctx) {
  int i, rc;
  uint64_t deadline;

  if (!ctx) return 0;
  ctx->decision = H_REJECT;
  if (!ctx->loop_initialized) {
    free(ctx);
    return 0;
  }
  /* Whatever a failed test left behind: close it all, without asserting anything. */
  ctx->on_request = NULL;
  ctx->on_established = NULL;
  ctx->on_received = NULL;
  ctx->on_sent = NULL;
  ctx->on_closed = NULL;
  for (i = 0; i < ctx->n_clients; i++) h_disconnect_quietly(&ctx->clients[i]);
  for (i = 0; i < ctx->n_servers; i++) h_disconnect_quietly(&ctx->servers[i]);
  h_disconnect_quietly(&ctx->listener);
  for (i = 0; i < ctx->n_clients; i++) h_release_quietly(&ctx->clients[i]);
  for (i = 0; i < ctx->n_servers; i++) h_release_quietly(&ctx->servers[i]);
  deadline = h_now_ms() + 5000;
  while (!h_all_closed(ctx) && h_now_ms() < deadline) {
    if (ctx->step(ctx, H_STEP_MS) != IBMSG_OK) break;
    for (i = 0; i < ctx->n_clients; i++) h_release_quietly(&ctx->clients[i]);
    for (i = 0; i < ctx->n_servers; i++) h_release_quietly(&ctx->servers[i]);
  }
  for (i = 0; i < H_MAX_MSGS; i++)
    if (ctx->msgs[i].impl && ctx->outstanding[i] == 0) ibmsg_free_msg(&ctx->msgs[i]);
  rc = ibmsg_destroy_event_loop(&ctx->loop);
  if (rc != IBMSG_OK) {
    print_message("note: cleanup could not destroy the loop (%s): leaking it\n", ibmsg_err_name(rc));
    return -1;
  }
  free(ctx);
  return 0;
}

int h_setup(void **state) {
  h_watchdog(H_WATCHDOG_S);
  h_last_wait = "(setup)";
  *state = h_ctx_create(NULL);
  return *state ? 0 : -1;
}

int h_teardown(void **state) {
  h_last_wait = "(teardown)";
  h_ctx_cleanup(*state);
  *state = NULL;
  alarm(0);
  return 0;
}

/* --- assertions ---------------------------------------------------------------------------- */

void h_fail_at(const char *file, int line, const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  print_error("%s\n", msg);
  _fail(file, line);
}

void h_note_error(h_ctx *ctx, const char *fmt, ...) {
  va_list ap;
  if (ctx->error[0]) return;
  va_start(ap, fmt);
  vsnprintf(ctx->error, sizeof ctx->error, fmt, ap);
  va_end(ap);
}

void h_assert_code_at(int got, int expected, const char *expr, const char *file, int line) {
  if (got != expected)
    h_fail_at(file, line, "%s returned %s (%d: %s), expected %s (%d)", expr, ibmsg_err_name(got),
              got, ibmsg_strerror(got), ibmsg_err_name(expected), expected);
}

const char *h_status_name(int status) {
  switch (status) {
  case IBMSG_UNCONNECTED: return "IBMSG_UNCONNECTED";
  case IBMSG_ADDRESS_RESOLVED: return "IBMSG_ADDRESS_RESOLVED";
  case IBMSG_ROUTE_RESOLVED: return "IBMSG_ROUTE_RESOLVED";
  case IBMSG_CONNECTED: return "IBMSG_CONNECTED";
  case IBMSG_DISCONNECTING: return "IBMSG_DISCONNECTING";
  case IBMSG_ERROR: return "IBMSG_ERROR";
  case IBMSG_LISTENING: return "IBMSG_LISTENING";
  default: return "(not a socket status)";
  }
}

/* --- driving the loop ---------------------------------------------------------------------- */

uint64_t h_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

void h_check_errors_at(h_ctx *ctx, const char *file, int line) {
  if (ctx->error[0]) h_fail_at(file, line, "a callback saw a problem: %s", ctx->error);
}

static void h_step_mode_at(h_ctx *ctx, uint64_t deadline, int timeout_ms, int idle,
                           const char *what, const char *file, int line);

void h_step_at(h_ctx *ctx, uint64_t deadline, int timeout_ms, const char *what, const char *file,
               int line) {
  h_step_mode_at(ctx, deadline, timeout_ms, 0, what, file, line);
}

void h_step_idle_at(h_ctx *ctx, uint64_t deadline, int idle_ms, const char *what,
                    const char *file, int line) {
  h_step_mode_at(ctx, deadline, idle_ms, 1, what, file, line);
}

static void h_step_mode_at(h_ctx *ctx, uint64_t deadline, int timeout_ms, int idle,
                           const char *what, const char *file, int line) {
  uint64_t now;
  int wait, rc;

  h_last_wait = what;
  h_progress++;
  h_check_errors_at(ctx, file, line);
  now = h_now_ms();
  if (now >= deadline) {
    if (idle)
      h_fail_at(file, line, "timed out: nothing happened (no callback) for %d ms (the wait's own "
                "limit) while waiting for: %s", timeout_ms, what);
    else
      h_fail_at(file, line, "timed out after %d ms (the wait's own limit) waiting for: %s",
                timeout_ms, what);
    return;
  }
  wait = deadline - now > H_STEP_MS ? H_STEP_MS : (int)(deadline - now);
  rc = ctx->step(ctx, wait);
  if (rc != IBMSG_OK)
    h_fail_at(file, line, "running the loop failed with %s (%d) while waiting for: %s",
              ibmsg_err_name(rc), rc, what);
}

void h_run_for_at(h_ctx *ctx, int ms, const char *file, int line) {
  uint64_t deadline = h_now_ms() + (uint64_t)ms;
  uint64_t now;
  int rc;

  h_last_wait = "(h_run_for)";
  while ((now = h_now_ms()) < deadline) {
    h_progress++;
    h_check_errors_at(ctx, file, line);
    rc = ctx->step(ctx, deadline - now > H_STEP_MS ? H_STEP_MS : (int)(deadline - now));
    if (rc != IBMSG_OK)
      h_fail_at(file, line, "running the loop failed with %s (%d)", ibmsg_err_name(rc), rc);
  }
  h_check_errors_at(ctx, file, line);
}

/* --- callbacks ----------------------------------------------------------------------------- */

unsigned long h_events(void) { return h_event_count; }

h_conn *h_first_closed(h_ctx *ctx) {
  int i;
  for (i = 0; i < ctx->n_clients; i++)
    if (ctx->clients[i].closed) return &ctx->clients[i];
  for (i = 0; i < ctx->n_servers; i++)
    if (ctx->servers[i].closed) return &ctx->servers[i];
  return NULL;
}

int h_established_count(h_ctx *ctx) {
  int i, n = 0;
  for (i = 0; i < ctx->n_clients; i++) n += ctx->clients[i].established;
  for (i = 0; i < ctx->n_servers; i++) n += ctx->servers[i].established;
  return n;
}

int h_poll_step(h_ctx *ctx, int max_wait_ms, int *readable, int *processed) {
  struct pollfd p;
  int fd = ibmsg_event_loop_fd(&ctx->loop);
  int t = ibmsg_event_loop_timeout(&ctx->loop);
  int wait = (t < 0 || t > max_wait_ms) ? max_wait_ms : t;
  int n;

  if (fd < 0) return IBMSG_EINVAL;
  if (t < -1) h_note_error(ctx, "ibmsg_event_loop_timeout returned %d", t);
  p.fd = fd;
  p.events = POLLIN;
  p.revents = 0;
  n = poll(&p, 1, wait);
  if (n < 0) return errno == EINTR ? IBMSG_OK : IBMSG_ESYS;
  if (n > 0 && readable) (*readable)++;
  if (n > 0 || (t >= 0 && t <= max_wait_ms)) {
    if (processed) (*processed)++;
    return ibmsg_event_loop_process(&ctx->loop);
  }
  return IBMSG_OK;
}

static h_ctx *h_ctx_of_loop(ibmsg_event_loop *loop) {
  h_progress++;
  h_event_count++;
  /* A NULL here would be a library bug (user_data is the application's): crash loudly. */
  return (h_ctx *)loop->user_data;
}

/* The record of a socket, or NULL (after noting why) if the socket is not one of ours. */
static h_conn *h_conn_of(h_ctx *ctx, ibmsg_socket *socket, const char *callback) {
  h_conn *c;
  if (!socket) {
    h_note_error(ctx, "%s called with a NULL socket", callback);
    return NULL;
  }
  c = (h_conn *)socket->user_data;
  if (!c || &c->sock != socket) {
    h_note_error(ctx, "%s called for a socket whose user_data was changed or never set "
                 "(socket %p, user_data %p)", callback, (void *)socket, socket->user_data);
    return NULL;
  }
  if (c->closed)
    h_note_error(ctx, "%s called for %s after its connection_closed", callback, c->name);
  return c;
}

static int h_msg_index(h_ctx *ctx, const ibmsg_buffer *msg) {
  if (msg >= ctx->msgs && msg < ctx->msgs + H_MAX_MSGS) return (int)(msg - ctx->msgs);
  return -1;
}

int h_accept(h_ctx *ctx, ibmsg_connection_request *request) {
  h_conn *s;
  int rc;

  if (ctx->n_servers >= H_MAX_CONNS) {
    h_note_error(ctx, "more than %d connections accepted", H_MAX_CONNS);
    return ibmsg_reject(request, "test harness full");
  }
  s = &ctx->servers[ctx->n_servers];
  rc = ctx->accept_opts ? ibmsg_accept_opts(request, &s->sock, ctx->accept_opts)
                        : ibmsg_accept(request, &s->sock);
  if (rc != IBMSG_OK) {
    ctx->accept_failures++;
    ctx->last_accept_rc = rc;
    return rc;
  }
  s->sock.user_data = s;
  s->active = 1;
  ctx->n_servers++;
  if (request->status != IBMSG_ACCEPTED)
    h_note_error(ctx, "request status is %d after a successful ibmsg_accept, expected IBMSG_ACCEPTED",
                 (int)request->status);
  if (s->sock.status != IBMSG_ROUTE_RESOLVED && s->sock.status != IBMSG_CONNECTED)
    h_note_error(ctx, "%s: status after ibmsg_accept is %s, expected IBMSG_ROUTE_RESOLVED", s->name,
                 h_status_name(s->sock.status));
  return IBMSG_OK;
}

static void h_on_request(ibmsg_connection_request *request) {
  h_ctx *ctx = h_ctx_of_loop(request->loop);
  int rc;

  ctx->requests++;
  snprintf(ctx->request_peer, sizeof ctx->request_peer, "%s",
           request->peer_address ? request->peer_address : "(null)");
  ctx->request_peer_port = request->peer_port;
  if (request->status != IBMSG_UNDECIDED)
    h_note_error(ctx, "connection_request: request status is %d on entry, expected IBMSG_UNDECIDED",
                 (int)request->status);
  if (request->listener != &ctx->listener.sock)
    h_note_error(ctx, "connection_request: request->listener is not the listening socket");
  if (ctx->on_request) {
    ctx->on_request(ctx, request);
    return;
  }
  switch (ctx->decision) {
  case H_ACCEPT:
    h_accept(ctx, request);
    break;
  case H_REJECT:
    rc = ibmsg_reject(request, ctx->reject_reason);
    if (rc != IBMSG_OK) h_note_error(ctx, "ibmsg_reject failed: %s", ibmsg_err_name(rc));
    else if (request->status != IBMSG_REJECTED)
      h_note_error(ctx, "request status is %d after ibmsg_reject, expected IBMSG_REJECTED",
                   (int)request->status);
    break;
  case H_UNDECIDED:
    break;
  }
}

static void h_on_established(ibmsg_socket *socket) {
  h_ctx *ctx = h_ctx_of_loop(socket->loop);
  h_conn *c = h_conn_of(ctx, socket, "connection_established");
  if (!c) return;
  c->established++;
  if (c->established > 1) h_note_error(ctx, "%s: connection_established fired twice", c->name);
  if (socket->status != IBMSG_CONNECTED)
    h_note_error(ctx, "%s: status in connection_established is %s, expected IBMSG_CONNECTED",
                 c->name, h_status_name(socket->status));
  if (ctx->on_established) ctx->on_established(c);
}

static void h_free_or_note(h_ctx *ctx, h_conn *c, ibmsg_buffer *msg, const char *what) {
  int rc = ibmsg_free_msg(msg);
  if (rc != IBMSG_OK)
    h_note_error(ctx, "%s: ibmsg_free_msg of %s failed: %s (%d)", c->name, what,
                 ibmsg_err_name(rc), rc);
}

static void h_on_received(ibmsg_socket *socket, ibmsg_buffer *msg) {
  h_ctx *ctx = h_ctx_of_loop(socket->loop);
  h_conn *c = h_conn_of(ctx, socket, "message_received");
  char why[200];

  if (!c) {
    ibmsg_free_msg(msg);
    return;
  }
  if (!c->established)
    h_note_error(ctx, "%s: message_received before connection_established", c->name);
  c->received++;
  c->received_bytes += msg->size;
  c->last_received_size = msg->size;
  if (msg->status != IBMSG_RECEIVED)
    h_note_error(ctx, "%s: received message has status %d, expected IBMSG_RECEIVED", c->name,
                 (int)msg->status);
  if (c->verify) {
    if (c->expect_size >= 0 && msg->size != (size_t)c->expect_size)
      h_note_error(ctx, "%s: message %u has %zu bytes, expected %ld", c->name, c->recv_seq,
                   msg->size, c->expect_size);
    else if (h_check(msg->data, msg->size, c->recv_seq, why, sizeof why) != 0)
      h_note_error(ctx, "%s: message %u (%zu bytes): %s", c->name, c->recv_seq, msg->size, why);
    c->recv_seq++;
  }
  if (ctx->on_received) {
    ctx->on_received(c, msg);
  } else if (c->hold && c->n_held < H_MAX_HELD) {
    c->held[c->n_held++] = msg;
  } else {
    if (c->hold) h_note_error(ctx, "%s: more than %d messages held", c->name, H_MAX_HELD);
    h_free_or_note(ctx, c, msg, "a received message");
  }
}

static int h_stream_index(h_conn *c, const ibmsg_buffer *msg) {
  if (msg >= c->stream_msgs && msg < c->stream_msgs + H_STREAM_BUFS) return (int)(msg - c->stream_msgs);
  return -1;
}

static int h_stream_post(h_conn *c, int i) {
  ibmsg_buffer *m = &c->stream_msgs[i];
  int rc;
  m->size = c->stream_size;
  h_fill(m->data, m->size, c->send_seq);
  rc = ibmsg_post_send(&c->sock, m);
  if (rc == IBMSG_OK) {
    c->send_seq++;
    c->stream_posted++;
    c->stream_inflight++;
    c->stream_busy[i] = 1;
    c->posted++;
  }
  return rc;
}

static void h_stream_sent(h_ctx *ctx, h_conn *c, int i, ibmsg_buffer *msg, int status) {
  int rc;
  if (!c->stream_busy[i]) {
    h_note_error(ctx, "%s: message_sent for stream buffer %d that was not posted (twice?)", c->name, i);
    return;
  }
  c->stream_busy[i] = 0;
  c->stream_inflight--;
  if (status != IBMSG_OK) {
    if (!c->expect_send_errors)
      h_note_error(ctx, "%s: stream message got message_sent with %s (%d)", c->name,
                   ibmsg_err_name(status), status);
    h_free_or_note(ctx, c, msg, "a stream buffer");
    return;
  }
  if (c->stream_posted < c->stream_total && !c->closed) {
    rc = h_stream_post(c, i);
    if (rc == IBMSG_OK) return;
    /* A connection that is closing refuses new posts; that is expected in disconnect tests. */
    if (!(c->expect_send_errors && (rc == IBMSG_ENOTCONN || rc == IBMSG_ESTATE)))
      h_note_error(ctx, "%s: re-posting stream message %u from message_sent failed: %s (%d)",
                   c->name, c->send_seq, ibmsg_err_name(rc), rc);
  }
  h_free_or_note(ctx, c, msg, "a stream buffer");
}

static void h_on_sent(ibmsg_socket *socket, ibmsg_buffer *msg, int status) {
  h_ctx *ctx = h_ctx_of_loop(socket->loop);
  h_conn *c = h_conn_of(ctx, socket, "message_sent");
  int i;

  if (!c) return;
  c->sent++;
  c->last_sent_status = status;
  if (status == IBMSG_OK) {
    c->sent_ok++;
    if (msg->status != IBMSG_SENT)
      h_note_error(ctx, "%s: message_sent with IBMSG_OK but msg->status is %d, expected IBMSG_SENT",
                   c->name, (int)msg->status);
  } else if (status == IBMSG_ECANCELED) {
    c->sent_canceled++;
  } else {
    c->sent_other++;
  }
  if (status != IBMSG_OK && msg->status != IBMSG_SEND_FAILED)
    h_note_error(ctx, "%s: message_sent with %s but msg->status is %d, expected IBMSG_SEND_FAILED",
                 c->name, ibmsg_err_name(status), (int)msg->status);
  if (c->sent > c->posted)
    h_note_error(ctx, "%s: %d message_sent callbacks for %d posts", c->name, c->sent, c->posted);

  i = h_msg_index(ctx, msg);
  if (i >= 0) {
    if (ctx->outstanding[i] <= 0)
      h_note_error(ctx, "%s: message_sent for ctx->msgs[%d], which has no post waiting (twice?)",
                   c->name, i);
    else
      ctx->outstanding[i]--;
  }
  i = h_stream_index(c, msg);
  if (i >= 0) h_stream_sent(ctx, c, i, msg, status);
  if (ctx->on_sent) ctx->on_sent(c, msg, status);
}

static void h_on_closed(ibmsg_socket *socket, int reason) {
  h_ctx *ctx = h_ctx_of_loop(socket->loop);
  h_conn *c = h_conn_of(ctx, socket, "connection_closed");

  if (!c) return;
  c->closed++;
  if (c->closed > 1) {
    h_note_error(ctx, "%s: connection_closed fired twice (%s, then %s)", c->name,
                 ibmsg_err_name(c->close_reason), ibmsg_err_name(reason));
    return;
  }
  c->close_reason = reason;
  c->close_status = socket->status;
  c->sent_at_close = c->sent;
  c->closed_at_ms = h_now_ms();
  if (socket->close_reason != reason)
    h_note_error(ctx, "%s: socket->close_reason is %s but connection_closed got %s", c->name,
                 ibmsg_err_name(socket->close_reason), ibmsg_err_name(reason));
  if (c->sent != c->posted)
    h_note_error(ctx, "%s: connection_closed came before all message_sent callbacks "
                 "(%d posted, %d message_sent)", c->name, c->posted, c->sent);
  if (ctx->on_closed) ctx->on_closed(c, reason);
}

static void h_callbacks_install(ibmsg_event_loop *loop) {
  loop->connection_request = h_on_request;
  loop->connection_established = h_on_established;
  loop->message_received = h_on_received;
  loop->message_sent = h_on_sent;
  loop->connection_closed = h_on_closed;
}

/* --- sockets ------------------------------------------------------------------------------- */

void h_setopt_int(h_ctx *ctx, int option, int value) {
  int rc = ibmsg_setopt(&ctx->loop, option, &value, sizeof value);
  if (rc != IBMSG_OK)
    h_fail_at(__FILE__, __LINE__, "ibmsg_setopt(option %d, %d) failed: %s (%d)", option, value,
              ibmsg_err_name(rc), rc);
}

void h_setopt_str(h_ctx *ctx, int option, const char *value) {
  int rc = ibmsg_setopt(&ctx->loop, option, value, strlen(value));
  if (rc != IBMSG_OK)
    h_fail_at(__FILE__, __LINE__, "ibmsg_setopt(option %d, \"%s\") failed: %s (%d)", option, value,
              ibmsg_err_name(rc), rc);
}

void h_setopt_own_credits(h_ctx *ctx, int recv_depth, int send_queue, int send_depth) {
  h_setopt_int(ctx, IBMSG_OPT_SHARED_RECV, 0);
  h_setopt_int(ctx, IBMSG_OPT_RECV_DEPTH, recv_depth);
  h_setopt_int(ctx, IBMSG_OPT_SEND_QUEUE, send_queue);
  h_setopt_int(ctx, IBMSG_OPT_SEND_DEPTH, send_depth);
}

void h_listen(h_ctx *ctx, const char *ip, int max_connections) {
  h_conn *l = &ctx->listener;
  unsigned short port = 0;
  int rc;

  h_conn_reset(l, ctx, "listener");
  rc = ctx->listen_opts ? ibmsg_listen_opts(&ctx->loop, &l->sock, ip, 0, max_connections, ctx->listen_opts)
                        : ibmsg_listen(&ctx->loop, &l->sock, ip, 0, max_connections);
  if (rc != IBMSG_OK)
    h_fail_at(__FILE__, __LINE__, "ibmsg_listen(%s, port 0, %d) failed: %s (%d)",
              ip ? ip : "NULL", max_connections, ibmsg_err_name(rc), rc);
  l->sock.user_data = l;
  l->active = 1;
  H_ASSERT_STATUS(l->sock.status, IBMSG_LISTENING, "listener status after ibmsg_listen");
  H_ASSERT_OK(ibmsg_socket_local_address(&l->sock, NULL, 0, &port));
  H_CHECK(port != 0, "the listener on port 0 reports port 0: no port was picked");
  ctx->port = port;
}

int h_try_connect(h_ctx *ctx, h_conn **client, const char *ip, unsigned short port) {
  h_conn *c;
  int rc;

  H_CHECK(ctx->n_clients < H_MAX_CONNS, "too many clients for the harness");
  c = &ctx->clients[ctx->n_clients++];
  rc = ctx->connect_opts ? ibmsg_connect_opts(&ctx->loop, &c->sock, ip, port, ctx->connect_opts)
                         : ibmsg_connect(&ctx->loop, &c->sock, ip, port);
  if (rc == IBMSG_OK) {
    c->sock.user_data = c;
    c->active = 1;
  }
  if (client) *client = c;
  return rc;
}

h_conn *h_connect(h_ctx *ctx, const char *ip, unsigned short port) {
  h_conn *c = NULL;
  int rc = h_try_connect(ctx, &c, ip, port);
  if (rc != IBMSG_OK)
    h_fail_at(__FILE__, __LINE__, "ibmsg_connect(%s, %u) failed: %s (%d)", ip ? ip : "NULL",
              (unsigned)port, ibmsg_err_name(rc), rc);
  return c;
}

void h_pair(h_ctx *ctx, h_conn **client, h_conn **server) {
  h_pair_to(ctx, ctx->addr, client, server);
}

void h_pair_to(h_ctx *ctx, const char *ip, h_conn **client, h_conn **server) {
  h_conn *c;
  int servers_before;

  if (!ctx->listener.active) h_listen(ctx, ctx->addr, H_MAX_CONNS);
  servers_before = ctx->n_servers;
  c = h_connect(ctx, ip, ctx->port);
  H_RUN_UNTIL(ctx, c->established || c->closed, H_TIMEOUT_MS);
  H_CHECK(!c->closed, "%s closed with %s (status %s) instead of connecting", c->name,
          ibmsg_err_name(c->close_reason), h_status_name(c->close_status));
  H_CHECK(ctx->n_servers == servers_before + 1,
          "the client is established but the server accepted %d sockets, expected %d",
          ctx->n_servers - servers_before, 1);
  H_RUN_UNTIL(ctx, ctx->servers[servers_before].established || ctx->servers[servers_before].closed,
              H_TIMEOUT_MS);
  H_CHECK(!ctx->servers[servers_before].closed, "the accepted socket closed with %s instead of connecting",
          ibmsg_err_name(ctx->servers[servers_before].close_reason));
  H_ASSERT_STATUS(c->sock.status, IBMSG_CONNECTED, "client status");
  H_ASSERT_STATUS(ctx->servers[servers_before].sock.status, IBMSG_CONNECTED, "server status");
  if (client) *client = c;
  if (server) *server = &ctx->servers[servers_before];
}

h_conn *h_server_of(h_ctx *ctx, h_conn *client) {
  char caddr[64], saddr[64];
  unsigned short cport = 0, sport = 0;
  int i;

  H_ASSERT_OK(ibmsg_socket_local_address(&client->sock, caddr, sizeof caddr, &cport));
  for (i = 0; i < ctx->n_servers; i++) {
    if (ibmsg_socket_peer_address(&ctx->servers[i].sock, saddr, sizeof saddr, &sport) != IBMSG_OK)
      continue;
    if (sport == cport && strcmp(saddr, caddr) == 0) return &ctx->servers[i];
  }
  h_fail_at(__FILE__, __LINE__, "no accepted socket has %s's address %s port %u as its peer",
            client->name, caddr, (unsigned)cport);
  return NULL;
}

void h_finish(h_ctx *ctx) {
  int i, rc;

  for (i = 0; i < ctx->n_clients; i++) {
    h_conn *c = &ctx->clients[i];
    if (!h_conn_open(c)) continue;
    rc = ibmsg_disconnect(&c->sock);
    if (rc != IBMSG_OK && rc != IBMSG_ESTATE)
      h_fail_at(__FILE__, __LINE__, "ibmsg_disconnect(%s) failed: %s", c->name, ibmsg_err_name(rc));
  }
  for (i = 0; i < ctx->n_clients; i++) {
    h_conn *c = &ctx->clients[i];
    H_RUN_UNTIL(ctx, !h_conn_open(c), H_TIMEOUT_MS);
  }
  for (i = 0; i < ctx->n_servers; i++) {
    h_conn *s = &ctx->servers[i];
    H_RUN_UNTIL(ctx, !h_conn_open(s), H_TIMEOUT_MS);
  }
  if (h_conn_open(&ctx->listener)) {
    H_ASSERT_OK(ibmsg_disconnect(&ctx->listener.sock));
    H_RUN_UNTIL(ctx, ctx->listener.closed, H_TIMEOUT_MS);
    H_ASSERT_REASON(ctx->listener.close_reason, IBMSG_OK, "the listener's close reason");
  }
  for (i = 0; i < ctx->n_clients; i++) h_release_held(&ctx->clients[i]);
  for (i = 0; i < ctx->n_servers; i++) h_release_held(&ctx->servers[i]);
  h_check_errors_at(ctx, __FILE__, __LINE__);
  H_ASSERT_OK(ibmsg_destroy_event_loop(&ctx->loop));
  ctx->loop_initialized = 0;
}

/* --- messages ------------------------------------------------------------------------------ */

static uint8_t h_pattern_byte(uint32_t seq, size_t i) {
  return (uint8_t)(seq * 131u + (uint32_t)i * 7u + (uint32_t)(i >> 8) * 13u + 1u);
}

void h_fill(void *data, size_t size, uint32_t seq) {
  uint8_t *p = data;
  size_t i;
  for (i = 0; i < size; i++) p[i] = i < 4 ? (uint8_t)(seq >> (8 * i)) : h_pattern_byte(seq, i);
}

int h_check(const void *data, size_t size, uint32_t seq, char *why, size_t why_len) {
  const uint8_t *p = data;
  size_t i;
  uint8_t want;

  if (size >= 4) {
    uint32_t got = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
    if (got != seq) {
      snprintf(why, why_len, "carries sequence number %u, expected %u (lost, duplicated or out of "
               "order)", got, seq);
      return -1;
    }
  }
  for (i = 0; i < size; i++) {
    want = i < 4 ? (uint8_t)(seq >> (8 * i)) : h_pattern_byte(seq, i);
    if (p[i] != want) {
      snprintf(why, why_len, "byte %zu of %zu is 0x%02x, expected 0x%02x", i, size, p[i], want);
      return -1;
    }
  }
  return 0;
}

void h_alloc_fill(h_conn *conn, ibmsg_buffer *msg, size_t size) {
  int rc = ibmsg_alloc_msg(msg, &conn->sock, size);
  if (rc != IBMSG_OK)
    h_fail_at(__FILE__, __LINE__, "%s: ibmsg_alloc_msg(%zu) failed: %s (%d)", conn->name, size,
              ibmsg_err_name(rc), rc);
  H_CHECK(msg->size == size, "ibmsg_alloc_msg set size %zu, expected %zu", msg->size, size);
  H_CHECK(msg->data != NULL || size == 0, "ibmsg_alloc_msg left data NULL");
  H_CHECK(msg->status == IBMSG_WAITING, "a new message has status %d, expected IBMSG_WAITING",
          (int)msg->status);
  if (msg->data) h_fill(msg->data, size, conn->send_seq);
  conn->send_seq++;
}

int h_try_post(h_conn *conn, ibmsg_buffer *msg) {
  h_ctx *ctx = conn->ctx;
  int i, rc;

  rc = ibmsg_post_send(&conn->sock, msg);
  if (rc != IBMSG_OK) return rc;
  conn->posted++;
  i = h_msg_index(ctx, msg);
  if (i >= 0) ctx->outstanding[i]++;
  return rc;
}

void h_release_held(h_conn *conn) {
  int i, rc, n = conn->n_held;
  conn->n_held = 0;
  for (i = 0; i < n; i++) {
    rc = ibmsg_free_msg(conn->held[i]);
    if (rc != IBMSG_OK)
      h_fail_at(__FILE__, __LINE__, "%s: ibmsg_free_msg of held message %d failed: %s (%d)",
                conn->name, i, ibmsg_err_name(rc), rc);
  }
}

void h_stream_start(h_conn *conn, int total, size_t size, int nbufs) {
  int i, rc;

  H_CHECK(nbufs > 0 && nbufs <= H_STREAM_BUFS, "a stream needs 1..%d buffers", H_STREAM_BUFS);
  conn->stream_total = total;
  conn->stream_posted = 0;
  conn->stream_inflight = 0;
  conn->stream_size = size;
  conn->stream_nbufs = nbufs;
  for (i = 0; i < nbufs && conn->stream_posted < total; i++) {
    rc = ibmsg_alloc_msg(&conn->stream_msgs[i], &conn->sock, size);
    if (rc != IBMSG_OK)
      h_fail_at(__FILE__, __LINE__, "%s: ibmsg_alloc_msg for stream buffer %d failed: %s (%d)",
                conn->name, i, ibmsg_err_name(rc), rc);
    rc = h_stream_post(conn, i);
    if (rc != IBMSG_OK)
      h_fail_at(__FILE__, __LINE__, "%s: posting stream message %d failed: %s (%d)", conn->name, i,
                ibmsg_err_name(rc), rc);
  }
}

int h_stream_done(const h_conn *conn) {
  return conn->stream_posted == conn->stream_total && conn->stream_inflight == 0;
}

void h_stream_both_at(h_ctx *ctx, h_conn *a, h_conn *b, int n, size_t size, int nbufs,
                      int idle_ms, const char *file, int line) {
  unsigned long ev;
  uint64_t deadline;

  h_stream_start(a, n, size, nbufs);
  h_stream_start(b, n, size, nbufs);
  ev = h_events();
  deadline = h_now_ms() + (uint64_t)idle_ms;
  while (!(a->received == n && b->received == n && h_stream_done(a) && h_stream_done(b))) {
    if (h_events() != ev) {
      ev = h_events();
      deadline = h_now_ms() + (uint64_t)idle_ms;
    }
    h_step_idle_at(ctx, deadline, idle_ms, "both streams delivered and done", file, line);
  }
  h_check_errors_at(ctx, file, line);
}

void h_free_in_batches(h_conn *conn, ibmsg_buffer *msg, int batch) {
  int i, rc;
  conn->held[conn->n_held++] = msg;
  if (conn->n_held < batch) return;
  for (i = 0; i < conn->n_held; i++) {
    rc = ibmsg_free_msg(conn->held[i]);
    if (rc != IBMSG_OK) h_note_error(conn->ctx, "ibmsg_free_msg in message_received: %s", ibmsg_err_name(rc));
  }
  conn->n_held = 0;
}

void h_post_msgs(h_conn *conn, int first, int n, size_t size) {
  int i;
  for (i = first; i < first + n; i++) {
    h_alloc_fill(conn, &conn->ctx->msgs[i], size);
    h_post(conn, &conn->ctx->msgs[i]);
  }
}

ibmsg_descriptor h_forge_descriptor(const ibmsg_descriptor *desc, int offset, uint64_t value, int n) {
  ibmsg_descriptor f = *desc;
  uint32_t check = 2166136261u; /* FNV-1a */
  int i;
  for (i = 0; i < n; i++) f.bytes[offset + i] = (unsigned char)(value >> (8 * i));
  for (i = 0; i < 28; i++) check = (check ^ f.bytes[i]) * 16777619u;
  for (i = 0; i < 4; i++) f.bytes[28 + i] = (unsigned char)(check >> (8 * i));
  return f;
}

void *h_new(size_t size) {
  void *p = calloc(1, size);
  H_CHECK(p != NULL, "out of memory for the test's records (%zu bytes)", size);
  return p;
}

static void h_op_done(ibmsg_socket *s, ibmsg_op *op, int status) {
  h_op_slot *o = op->user_data;
  (void)s;
  o->status = status;
  o->calls++;
}

ibmsg_op *h_op_start(h_op_slot *o) {
  static const h_op_slot fresh;
  *o = fresh;
  o->op.user_data = o;
  o->op.done = h_op_done;
  return &o->op;
}

h_conn *h_connect_must_fail_at(h_ctx *ctx, const char *ip, unsigned short port, int expected,
                               int timeout_ms, int quiet, const char *what, const char *file,
                               int line) {
  h_conn *c = NULL;
  uint64_t deadline;
  int rc = h_try_connect(ctx, &c, ip, port);

  if (rc != IBMSG_OK) {
    h_assert_code_at(rc, expected, "ibmsg_connect", file, line);
    if (!quiet) return c;
    h_run_for_at(ctx, 300, file, line);
    if (c->closed != 0)
      h_fail_at(file, line, "connection_closed callbacks after ibmsg_connect failed is %d, "
                "expected 0", c->closed);
    return c;
  }
  deadline = h_now_ms() + (uint64_t)timeout_ms;
  while (!(c->closed || c->established))
    h_step_at(ctx, deadline, timeout_ms, "c->closed || c->established", file, line);
  h_check_errors_at(ctx, file, line);
  if (c->established) h_fail_at(file, line, "a connection %s was established", what);
  if (c->close_reason != expected)
    h_fail_at(file, line, "close reason %s is %s (%d), expected %s (%d)", what,
              ibmsg_err_name(c->close_reason), c->close_reason, ibmsg_err_name(expected), expected);
  return c;
}

void h_send_to_holder(h_conn *sender, h_conn *holder, int n, size_t size) {
  holder->hold = 1;
  h_post_msgs(sender, 0, n, size);
  H_RUN_UNTIL(sender->ctx, holder->received == n && sender->sent == n, H_TIMEOUT_MS);
}

void h_free_lent_after_close(h_conn *sender, h_conn *holder, int n) {
  h_ctx *ctx = sender->ctx;
  int i;
  H_ASSERT_OK(ibmsg_disconnect(&sender->sock));
  H_RUN_UNTIL(ctx, sender->closed && holder->closed, H_TIMEOUT_MS);
  H_ASSERT_EQ(holder->n_held, n, "messages the receiver holds");
  for (i = 0; i < n; i++) {
    H_ASSERT_EQ(holder->held[i]->status, IBMSG_RECEIVED, "status of a lent message after close");
    H_ASSERT_OK(ibmsg_free_msg(holder->held[i]));
  }
  holder->n_held = 0;
  for (i = 0; i < n; i++) H_ASSERT_OK(ibmsg_free_msg(&ctx->msgs[i]));
}
