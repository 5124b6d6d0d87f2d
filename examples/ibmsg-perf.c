/*
 * ibmsg-perf - measure ibmsg's latency, message rate and bandwidth.
 *
 *   ibmsg-perf --server [OPTIONS] [IP]       serve tests until interrupted
 *   ibmsg-perf [OPTIONS] IP                  run tests against that server
 *   ibmsg-perf --loopback [OPTIONS] IP       both in this process, on one ibmsg loop
 *
 * Each test (latency or bandwidth, at one message size) runs on a connection of its own. The
 * client's first message on it is a HELLO that tells the server what to do:
 *   latency    the client sends a message and waits for the server's echo of the same size,
 *              again and again (ping-pong); one-way latency = round trip / 2, timed with
 *              CLOCK_MONOTONIC from ibmsg_post_send() to the message_received callback, so it
 *              includes the completion event going through the loop, as in any ibmsg program.
 *   bandwidth  the client keeps as many messages in flight as ibmsg lets it (its send buffers
 *              are posted again from their message_sent callbacks); the clock runs from the
 *              first timed post to the last message_sent. The server answers the last message
 *              with a DONE message carrying its count, so no message goes unaccounted.
 * A few untimed warm-up iterations come first. Because the ibmsg callbacks belong to the loop,
 * not to a socket, each socket's user_data says which role it plays, and one set of callbacks
 * serves the server side and the client side alike: that is what makes --loopback possible.
 */
#define _POSIX_C_SOURCE 200809L

#include <getopt.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include <ibmsg.h>

#include "tool.h"

static const char usage_text[] =
    "Usage: ibmsg-perf [OPTIONS] IP\n"
    "       ibmsg-perf --server [OPTIONS] [IP]\n"
    "       ibmsg-perf --loopback [OPTIONS] IP\n"
    "Measure ibmsg's latency, message rate and bandwidth against an ibmsg-perf\n"
    "server at IP, or serve such tests, or run both sides in one process.\n"
    "\n"
    "Modes:\n"
    "      --server          serve tests until interrupted, on IP or on all\n"
    "                        addresses\n"
    "      --loopback        listen on IP and run the tests against ourselves\n"
    "\n"
    "Options:\n"
    "  -p, --port PORT       the server's port (default 12345; with --loopback\n"
    "                        any free port)\n"
    "  -t, --test TEST       lat, bw or all (default all)\n"
    "  -s, --sizes SIZES     comma-separated message sizes in bytes (default\n"
    "                        64,4096,65536)\n"
    "  -n, --iters N         timed iterations per test (default 1000)\n"
    "  -w, --warmup N        untimed iterations before each test (default 32)\n"
    "      --max-size BYTES  largest message size (default 65536, and at least\n"
    "                        the largest of SIZES)\n"
    "      --json            print the results as one JSON document\n"
    "  -q, --quiet           print only the results and errors\n"
    "  -h, --help            print this help and exit\n"
    "      --version         print the version and exit\n"
    "\n"
    "Sizes may end in K, M or G (times 1024, 1024^2, 1024^3). Latency is one way\n"
    "(round trip / 2) in microseconds; MB/s is 10^6 bytes per second; Mpps is\n"
    "10^6 messages per second.\n"
    "Exit status: 0 on success, 1 on an error, 2 on bad usage.\n";

#define MAX_SIZES 64
/* A test whose peer says nothing for this long has failed (for example, the peer is not an
 * ibmsg-perf server). */
#define IDLE_TIMEOUT_S 10.0
/* How long the tool waits for sockets to close at the end. */
#define CLOSE_TIMEOUT_S 5.0

enum test { TEST_LAT = 1, TEST_BW = 2 };

/* ---- the messages that control a test --------------------------------------------------------
 * Fixed little-endian layouts, so that client and server need not be the same build. */
#define HELLO_SIZE 32 /* "ibmsgprf", u32 version, u32 test, u64 size, u64 count */
#define DONE_SIZE 16  /* "ibmsgend", u64 messages received */
#define PROTO_VERSION 1

static void put64(unsigned char *p, uint64_t v) {
  for (int i = 0; i < 8; i++)
    p[i] = (unsigned char)(v >> (8 * i));
}

static uint64_t get64(const unsigned char *p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++)
    v |= (uint64_t)p[i] << (8 * i);
  return v;
}

static void encode_hello(unsigned char *p, int test, uint64_t size, uint64_t count) {
  memcpy(p, "ibmsgprf", 8);
  put64(p + 8, PROTO_VERSION | ((uint64_t)test << 32));
  put64(p + 16, size);
  put64(p + 24, count);
}

/* ---- sockets and their roles ----------------------------------------------------------------- */

enum role { ROLE_LISTENER, ROLE_SESSION, ROLE_CLIENT };

/* One socket. The socket comes first so that the callbacks' socket pointer is the endpoint's. */
struct endpoint {
  ibmsg_socket socket;
  enum role role;
  struct tool_sendpool pool;
  int open; /* set up, and its connection_closed has not come */

  /* ROLE_SESSION: the server's side of one test. */
  struct endpoint *next;
  char peer[64];
  unsigned short peer_port;
  int have_hello;
  int test;
  uint64_t size, count, received;
  uint64_t echoes_owed; /* latency: echoes to post once a send buffer is free */
  int done_owed;        /* bandwidth: the DONE message is due */
  int failed;           /* reported; the session is closing */
};

/* The client's side of the test running now. */
static struct {
  struct endpoint ep;
  int established;
  int closed;
  int close_reason;
  int test;
  uint64_t size, warmup, iters, total;
  ibmsg_buffer *hello; /* the HELLO message, until its message_sent */
  int hello_sent;
  uint64_t posted, sent, received;
  double t_post;        /* latency: when the ping in flight was posted */
  double *rtt;          /* latency: the timed round trips, in seconds */
  double t_start, t_end;
  uint64_t server_count; /* bandwidth: from DONE */
  int finished;          /* all iterations done (and DONE came) */
  int failed;            /* reported */
  double last_activity;
} cl;

struct lat_result {
  uint64_t size, iters;
  double min, median, avg, p99, max; /* one way, microseconds */
};

struct bw_result {
  uint64_t size, iters;
  double seconds, mbps, mpps;
};

static struct {
  /* options */
  int server, loopback;
  const char *ip;
  unsigned short port;
  int port_given;
  int tests; /* TEST_LAT | TEST_BW */
  uint64_t sizes[MAX_SIZES];
  int nsizes;
  uint64_t iters, warmup, max_size;
  int max_size_given;
  int json, quiet;

  ibmsg_event_loop loop;
  struct endpoint listener;
  struct endpoint *sessions; /* open server-side connections */
  int server_quiet;          /* no line per session (--loopback: the client reports) */
  char device[64];

  struct lat_result lat[MAX_SIZES];
  struct bw_result bw[MAX_SIZES];
  int nlat, nbw;
  int lat_header, bw_header;
} g;

/* ---- the server side ------------------------------------------------------------------------- */

static void session_fail(struct endpoint *s, const char *what, int code) {
  /* A session whose client already hung up cannot send: that is no error worth a line. */
  int quiet = s->failed || s->socket.status == IBMSG_DISCONNECTING ||
              s->socket.status == IBMSG_UNCONNECTED || s->socket.status == IBMSG_ERROR;
  if (!quiet && code != IBMSG_OK)
    tool_error("client %s port %u: %s: %s", s->peer, s->peer_port, what, ibmsg_strerror(code));
  else if (!quiet)
    tool_error("client %s port %u: %s", s->peer, s->peer_port, what);
  s->failed = 1;
  tool_sendpool_release(&s->pool);
  ibmsg_disconnect(&s->socket); /* IBMSG_ESTATE when it is closing already: fine */
}

/* Posts the echoes and the DONE message that are due, as far as send buffers allow; runs again
 * from message_sent when they do not. */
static void session_pump(struct endpoint *s) {
  ibmsg_buffer *msg;
  int rc;

  while (!s->failed && (s->echoes_owed > 0 || s->done_owed)) {
    size_t size = s->echoes_owed > 0 ? (size_t)s->size : DONE_SIZE;
    rc = tool_sendpool_get(&s->pool, size, &msg);
    if (rc == IBMSG_EAGAIN)
      return;
    if (rc != IBMSG_OK) {
      session_fail(s, "cannot allocate a message", rc);
      return;
    }
    if (s->echoes_owed == 0) {
      memcpy(msg->data, "ibmsgend", 8);
      put64((unsigned char *)msg->data + 8, s->received);
    }
    /* An echo's content does not matter: copying it would only add to the latency. */
    rc = ibmsg_post_send(&s->socket, msg);
    if (rc == IBMSG_EAGAIN) {
      tool_sendpool_put(&s->pool, msg);
      return;
    }
    if (rc != IBMSG_OK) {
      tool_sendpool_put(&s->pool, msg);
      session_fail(s, "cannot send", rc);
      return;
    }
    if (s->echoes_owed > 0)
      s->echoes_owed--;
    else
      s->done_owed = 0;
  }
}

static void session_hello(struct endpoint *s, const ibmsg_buffer *msg) {
  const unsigned char *p = msg->data;
  uint64_t word;

  if (msg->size != HELLO_SIZE || memcmp(p, "ibmsgprf", 8) != 0) {
    session_fail(s, "not an ibmsg-perf client (its first message is not a test request)",
                 IBMSG_OK);
    return;
  }
  word = get64(p + 8);
  s->test = (int)(word >> 32);
  s->size = get64(p + 16);
  s->count = get64(p + 24);
  if ((word & 0xffffffffu) != PROTO_VERSION || (s->test != TEST_LAT && s->test != TEST_BW)) {
    session_fail(s, "unsupported test request (another version of ibmsg-perf?)", IBMSG_OK);
    return;
  }
  if (s->size > ibmsg_socket_max_msg_size(&s->socket)) {
    session_fail(s, "messages larger than the maximum message size (see --max-size)",
                 IBMSG_EMSGSIZE);
    return;
  }
  s->have_hello = 1;
  if (!g.server_quiet)
    tool_info(g.quiet, "client %s port %u: %s test, %" PRIu64 " bytes, %" PRIu64 " messages",
              s->peer, s->peer_port, s->test == TEST_LAT ? "latency" : "bandwidth", s->size,
              s->count);
  if (s->test == TEST_BW && s->count == 0) {
    s->done_owed = 1;
    session_pump(s);
  }
}

static void session_received(struct endpoint *s, ibmsg_buffer *msg) {
  if (s->failed) {
    /* closing: only give the buffer back */
  } else if (!s->have_hello) {
    session_hello(s, msg);
  } else if (msg->size != s->size || s->received >= s->count) {
    session_fail(s, "a message that does not belong to the test", IBMSG_OK);
  } else {
    s->received++;
    if (s->test == TEST_LAT)
      s->echoes_owed++;
    else if (s->received == s->count)
      s->done_owed = 1;
    session_pump(s);
  }
  ibmsg_free_msg(msg);
}

static void on_request(ibmsg_connection_request *request) {
  struct endpoint *s = calloc(1, sizeof *s);
  int rc;

  if (s == NULL) {
    ibmsg_reject(request, "ibmsg-perf: out of memory");
    return;
  }
  snprintf(s->peer, sizeof s->peer, "%s", request->peer_address);
  s->peer_port = request->peer_port;
  rc = ibmsg_accept(request, &s->socket);
  if (rc != IBMSG_OK) {
    tool_error("cannot accept the connection from %s port %u: %s", s->peer, s->peer_port,
               ibmsg_strerror(rc));
    free(s);
    return;
  }
  s->socket.user_data = s;
  s->role = ROLE_SESSION;
  s->open = 1;
  s->next = g.sessions;
  g.sessions = s;
  rc = tool_sendpool_init(&s->pool, &s->socket, &g.loop);
  if (rc != IBMSG_OK) {
    s->pool.released = 1;
    session_fail(s, "cannot make the send buffer list", rc);
  }
}

static void session_closed(struct endpoint *s, int reason) {
  /* ECONNRESET is how every test ends: the client disconnects. */
  if (reason != IBMSG_OK && reason != IBMSG_ECONNRESET && !s->failed)
    tool_error("client %s port %u: connection failed: %s", s->peer, s->peer_port,
               ibmsg_strerror(reason));
  tool_sendpool_release(&s->pool);
  tool_sendpool_destroy(&s->pool);
  for (struct endpoint **p = &g.sessions; *p != NULL; p = &(*p)->next) {
    if (*p == s) {
      *p = s->next;
      break;
    }
  }
  free(s); /* ibmsg never touches the socket after connection_closed */
}

/* ---- the client side ------------------------------------------------------------------------- */

static void client_fail(const char *what, int code) {
  if (!cl.failed) {
    if (code != IBMSG_OK)
      tool_error("%s: %s", what, ibmsg_strerror(code));
    else
      tool_error("%s", what);
  }
  cl.failed = 1;
}

/* Posts the messages that are due: the next ping (latency), or as many as there are buffers
 * for (bandwidth), holding back the timed ones until the warm-up has drained. */
static void client_pump(void) {
  ibmsg_buffer *msg;
  uint64_t limit;
  int rc;

  if (cl.failed || cl.closed)
    return;
  if (cl.test == TEST_LAT) {
    limit = cl.posted == cl.received ? cl.posted + 1 : cl.posted; /* one ping at a time */
    if (limit > cl.total)
      limit = cl.total;
  } else {
    if (cl.t_start == 0 && cl.hello_sent && cl.sent == cl.warmup)
      cl.t_start = tool_now();
    limit = cl.t_start != 0 ? cl.total : cl.warmup;
  }
  while (cl.posted < limit) {
    rc = tool_sendpool_get(&cl.ep.pool, (size_t)cl.size, &msg);
    if (rc == IBMSG_EAGAIN)
      return; /* a message_sent will call us again */
    if (rc != IBMSG_OK) {
      client_fail("cannot allocate a message", rc);
      return;
    }
    if (cl.test == TEST_LAT)
      cl.t_post = tool_now();
    rc = ibmsg_post_send(&cl.ep.socket, msg);
    if (rc == IBMSG_EAGAIN) {
      tool_sendpool_put(&cl.ep.pool, msg);
      return;
    }
    if (rc != IBMSG_OK) {
      tool_sendpool_put(&cl.ep.pool, msg);
      client_fail("cannot send", rc);
      return;
    }
    cl.posted++;
  }
}

static void client_check_finished(void) {
  int all_in = cl.test == TEST_LAT ? cl.received == cl.total : cl.server_count == cl.total;
  /* Also wait for every message_sent, so that the buffers can be freed. */
  if (all_in && cl.hello_sent && cl.sent == cl.total && tool_sendpool_busy(&cl.ep.pool) == 0)
    cl.finished = 1;
}

static void client_established(void) {
  ibmsg_buffer *msg;
  size_t max = ibmsg_socket_max_msg_size(&cl.ep.socket);
  const char *dev = ibmsg_socket_device(&cl.ep.socket);
  int rc;

  cl.established = 1;
  if (dev != NULL && g.device[0] == '\0')
    snprintf(g.device, sizeof g.device, "%s", dev);
  if (cl.size > max) {
    char what[256];
    snprintf(what, sizeof what, "%" PRIu64 "-byte messages do not fit: the connection's maximum "
             "message size is %zu (use --max-size %" PRIu64 " on both sides)", cl.size, max,
             cl.size);
    client_fail(what, IBMSG_OK);
    return;
  }
  rc = tool_sendpool_get(&cl.ep.pool, HELLO_SIZE, &msg);
  if (rc != IBMSG_OK) {
    client_fail("cannot allocate a message", rc);
    return;
  }
  encode_hello(msg->data, cl.test, cl.size, cl.total);
  cl.hello = msg;
  rc = ibmsg_post_send(&cl.ep.socket, msg);
  if (rc != IBMSG_OK) {
    tool_sendpool_put(&cl.ep.pool, msg);
    client_fail("cannot send the test request", rc);
    return;
  }
  /* Messages arrive in order: the data may follow the request at once. */
  client_pump();
}

static void client_sent(ibmsg_buffer *msg, int status) {
  tool_sendpool_put(&cl.ep.pool, msg);
  if (status != IBMSG_OK) {
    if (status != IBMSG_ECANCELED) /* ECANCELED: connection_closed says why */
      client_fail("a message was not delivered", status);
    return;
  }
  if (!cl.hello_sent && msg == cl.hello) {
    cl.hello_sent = 1;
  } else {
    cl.sent++;
    if (cl.sent == cl.total)
      cl.t_end = tool_now();
  }
  client_pump();
  client_check_finished();
}

static void client_received(ibmsg_buffer *msg) {
  double now = tool_now();

  if (cl.test == TEST_LAT && msg->size == cl.size && cl.received < cl.posted) {
    if (cl.received >= cl.warmup)
      cl.rtt[cl.received - cl.warmup] = now - cl.t_post;
    cl.received++;
  } else if (cl.test == TEST_BW && msg->size == DONE_SIZE &&
             memcmp(msg->data, "ibmsgend", 8) == 0) {
    cl.server_count = get64((const unsigned char *)msg->data + 8);
    if (cl.server_count != cl.total) {
      char what[256];
      snprintf(what, sizeof what, "the server received %" PRIu64 " of %" PRIu64 " messages",
               cl.server_count, cl.total);
      client_fail(what, IBMSG_OK);
    }
  } else {
    client_fail("unexpected message from the server (is it ibmsg-perf --server?)", IBMSG_OK);
  }
  ibmsg_free_msg(msg);
  client_pump();
  client_check_finished();
}

/* ---- the loop's callbacks: dispatch on the socket's role ------------------------------------- */

static void on_established(ibmsg_socket *socket) {
  struct endpoint *e = socket->user_data;
  if (e->role == ROLE_CLIENT) {
    cl.last_activity = tool_now();
    client_established();
  }
}

static void on_received(ibmsg_socket *socket, ibmsg_buffer *msg) {
  struct endpoint *e = socket->user_data;
  if (e->role == ROLE_CLIENT) {
    cl.last_activity = tool_now();
    client_received(msg);
  } else {
    session_received(e, msg);
  }
}

static void on_sent(ibmsg_socket *socket, ibmsg_buffer *msg, int status) {
  struct endpoint *e = socket->user_data;
  if (e->role == ROLE_CLIENT) {
    cl.last_activity = tool_now();
    client_sent(msg, status);
  } else {
    tool_sendpool_put(&e->pool, msg);
    if (status == IBMSG_OK)
      session_pump(e);
    else if (status != IBMSG_ECANCELED) /* ECANCELED: the connection is closing anyway */
      session_fail(e, "a message was not delivered", status);
  }
}

static void on_closed(ibmsg_socket *socket, int reason) {
  struct endpoint *e = socket->user_data;
  e->open = 0;
  if (e->role == ROLE_CLIENT) {
    cl.closed = 1;
    cl.close_reason = reason;
    tool_sendpool_release(&cl.ep.pool);
  } else if (e->role == ROLE_SESSION) {
    session_closed(e, reason);
  } else if (reason != IBMSG_OK) {
    tool_error("the listening socket closed: %s", ibmsg_strerror(reason));
  }
}

/* ---- running the loop ------------------------------------------------------------------------ */

/* Dispatches until *flag is set. Returns 0, or -1 after reporting why it stopped waiting: the
 * test failed, its connection closed, the peer went quiet, or a signal came. */
static int client_wait(const int *flag) {
  int rc;
  while (!*flag) {
    if (cl.failed)
      return -1;
    if (cl.closed) {
      if (!cl.established) {
        char what[256];
        snprintf(what, sizeof what, "cannot connect to %s port %u", g.ip, g.port);
        client_fail(what, cl.close_reason == IBMSG_OK ? IBMSG_ECONNRESET : cl.close_reason);
      } else {
        client_fail("the server closed the connection during the test",
                    cl.close_reason == IBMSG_OK ? IBMSG_ECONNRESET : cl.close_reason);
      }
      return -1;
    }
    if (tool_stop) {
      client_fail("interrupted", IBMSG_OK);
      return -1;
    }
    if (tool_now() - cl.last_activity > IDLE_TIMEOUT_S) {
      client_fail("no answer from the server for 10 s (is it ibmsg-perf --server?)", IBMSG_OK);
      return -1;
    }
    rc = ibmsg_dispatch_event_loop_timeout(&g.loop, TOOL_TICK_MS);
    if (rc != IBMSG_OK) {
      client_fail("event loop failed", rc);
      return -1;
    }
  }
  return 0;
}

/* Dispatches until no socket is open or the time is up. */
static int wait_all_closed(void) {
  double deadline = tool_now() + CLOSE_TIMEOUT_S;
  while (cl.ep.open || g.listener.open || g.sessions != NULL) {
    if (tool_now() > deadline) {
      tool_error("sockets did not close within %.0f s", CLOSE_TIMEOUT_S);
      return -1;
    }
    int rc = ibmsg_dispatch_event_loop_timeout(&g.loop, TOOL_TICK_MS);
    if (rc != IBMSG_OK) {
      tool_error("event loop failed: %s", ibmsg_strerror(rc));
      return -1;
    }
  }
  return 0;
}

/* Closes the client's connection (after a test, or when it failed) and waits for it. */
static void client_close(void) {
  double deadline = tool_now() + CLOSE_TIMEOUT_S;
  tool_sendpool_release(&cl.ep.pool);
  if (cl.ep.open)
    ibmsg_disconnect(&cl.ep.socket); /* IBMSG_ESTATE if the peer closed it first */
  while (cl.ep.open && tool_now() < deadline)
    if (ibmsg_dispatch_event_loop_timeout(&g.loop, TOOL_TICK_MS) != IBMSG_OK)
      break;
  if (!cl.ep.open)
    tool_sendpool_destroy(&cl.ep.pool);
}

/* ---- results --------------------------------------------------------------------------------- */

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static void print_rule(void) {
  puts("-------------------------------------------------------------------------------------"
       "--------");
}

static void print_banner(const char *title) {
  if (g.quiet) {
    return;
  }
  print_rule();
  printf("%*s%s\n", (int)(46 - strlen(title) / 2), "", title);
  printf(" Peer: %s port %u   Device: %s\n", g.ip, g.port, g.device[0] ? g.device : "?");
  printf(" Iterations: %" PRIu64 " per size, after %" PRIu64 " warm-up\n", g.iters, g.warmup);
  print_rule();
}

static void report_lat(const struct lat_result *r) {
  if (g.json)
    return;
  if (!g.lat_header) {
    g.lat_header = 1;
    print_banner("ibmsg Send Latency Test (one way = RTT/2)");
    printf(" %-10s %-11s %-14s %-14s %-14s %-14s %s\n", "#bytes", "#iterations",
           "t_min[usec]", "t_median[usec]", "t_avg[usec]", "t_p99[usec]", "t_max[usec]");
  }
  printf(" %-10" PRIu64 " %-11" PRIu64 " %-14.2f %-14.2f %-14.2f %-14.2f %.2f\n", r->size,
         r->iters, r->min, r->median, r->avg, r->p99, r->max);
  fflush(stdout);
}

static void report_bw(const struct bw_result *r) {
  if (g.json)
    return;
  if (!g.bw_header) {
    g.bw_header = 1;
    if (g.lat_header && !g.quiet)
      putchar('\n');
    print_banner("ibmsg Send Bandwidth Test");
    printf(" %-10s %-11s %-14s %-14s %s\n", "#bytes", "#iterations", "BW[MB/s]",
           "MsgRate[Mpps]", "seconds");
  }
  printf(" %-10" PRIu64 " %-11" PRIu64 " %-14.2f %-14.6f %.6f\n", r->size, r->iters, r->mbps,
         r->mpps, r->seconds);
  fflush(stdout);
}

static void json_string(const char *s) {
  putchar('"');
  for (; *s; s++) {
    unsigned char ch = (unsigned char)*s;
    if (ch == '"' || ch == '\\')
      printf("\\%c", ch);
    else if (ch < 0x20)
      printf("\\u%04x", ch);
    else
      putchar(ch);
  }
  putchar('"');
}

static void print_json(void) {
  printf("{\n  \"tool\": \"ibmsg-perf\",\n  \"version\": ");
  json_string(ibmsg_version_string());
  printf(",\n  \"peer\": {\"address\": ");
  json_string(g.ip);
  printf(", \"port\": %u},\n  \"device\": ", g.port);
  json_string(g.device);
  printf(",\n  \"warmup\": %" PRIu64 ",\n  \"latency\": [", g.warmup);
  for (int i = 0; i < g.nlat; i++) {
    const struct lat_result *r = &g.lat[i];
    printf("%s\n    {\"bytes\": %" PRIu64 ", \"iterations\": %" PRIu64 ", \"t_min_us\": %.3f, "
           "\"t_median_us\": %.3f, \"t_avg_us\": %.3f, \"t_p99_us\": %.3f, \"t_max_us\": %.3f}",
           i ? "," : "", r->size, r->iters, r->min, r->median, r->avg, r->p99, r->max);
  }
  printf("%s],\n  \"bandwidth\": [", g.nlat ? "\n  " : "");
  for (int i = 0; i < g.nbw; i++) {
    const struct bw_result *r = &g.bw[i];
    printf("%s\n    {\"bytes\": %" PRIu64 ", \"iterations\": %" PRIu64 ", \"seconds\": %.6f, "
           "\"bw_mb_per_s\": %.3f, \"msg_rate_mpps\": %.6f}",
           i ? "," : "", r->size, r->iters, r->seconds, r->mbps, r->mpps);
  }
  printf("%s]\n}\n", g.nbw ? "\n  " : "");
  fflush(stdout);
}

/* ---- one test -------------------------------------------------------------------------------- */

static int run_test(int test, uint64_t size) {
  int rc;

  memset(&cl, 0, sizeof cl);
  cl.test = test;
  cl.size = size;
  cl.warmup = g.warmup;
  cl.iters = g.iters;
  cl.total = g.warmup + g.iters;
  cl.last_activity = tool_now();
  cl.ep.role = ROLE_CLIENT;
  if (test == TEST_LAT) {
    cl.rtt = malloc((size_t)g.iters * sizeof *cl.rtt);
    if (cl.rtt == NULL) {
      tool_error("out of memory for %" PRIu64 " samples", g.iters);
      return -1;
    }
  }
  rc = tool_sendpool_init(&cl.ep.pool, &cl.ep.socket, &g.loop);
  if (rc == IBMSG_OK)
    rc = ibmsg_connect(&g.loop, &cl.ep.socket, g.ip, g.port);
  if (rc != IBMSG_OK) {
    tool_error("cannot connect to %s port %u: %s", g.ip, g.port, ibmsg_strerror(rc));
    tool_sendpool_destroy(&cl.ep.pool);
    free(cl.rtt);
    return -1;
  }
  cl.ep.socket.user_data = &cl.ep;
  cl.ep.open = 1;

  rc = client_wait(&cl.finished);
  client_close();
  if (rc != 0) {
    free(cl.rtt);
    return -1;
  }

  if (test == TEST_LAT) {
    struct lat_result *r = &g.lat[g.nlat++];
    double sum = 0;
    uint64_t n = g.iters;
    qsort(cl.rtt, (size_t)n, sizeof *cl.rtt, cmp_double);
    for (uint64_t i = 0; i < n; i++)
      sum += cl.rtt[i];
    /* One way = RTT / 2, in microseconds: hence the factor 0.5e6. */
    r->size = size;
    r->iters = n;
    r->min = cl.rtt[0] * 0.5e6;
    r->max = cl.rtt[n - 1] * 0.5e6;
    r->median = (n % 2 ? cl.rtt[n / 2] : (cl.rtt[n / 2 - 1] + cl.rtt[n / 2]) / 2) * 0.5e6;
    r->avg = sum / (double)n * 0.5e6;
    /* p99 by nearest rank: the smallest sample that 99% of the samples do not exceed. */
    r->p99 = cl.rtt[(n * 99 + 99) / 100 - 1] * 0.5e6;
    report_lat(r);
  } else {
    struct bw_result *r = &g.bw[g.nbw++];
    r->size = size;
    r->iters = g.iters;
    r->seconds = cl.t_end - cl.t_start;
    r->mbps = r->seconds > 0 ? (double)(size * g.iters) / r->seconds / 1e6 : 0;
    r->mpps = r->seconds > 0 ? (double)g.iters / r->seconds / 1e6 : 0;
    report_bw(r);
  }
  free(cl.rtt);
  cl.rtt = NULL;
  return 0;
}

/* ---- command line ---------------------------------------------------------------------------- */

static int parse_sizes(const char *arg) {
  char buf[1024], *save = NULL, *tok;
  uint64_t v;

  if (strlen(arg) >= sizeof buf) {
    tool_usage_error("-s: the list is too long");
    return -1;
  }
  strcpy(buf, arg);
  g.nsizes = 0;
  for (tok = strtok_r(buf, ",", &save); tok != NULL; tok = strtok_r(NULL, ",", &save)) {
    if (g.nsizes == MAX_SIZES) {
      tool_usage_error("-s: at most %d sizes", MAX_SIZES);
      return -1;
    }
    if (tool_parse_size("-s", tok, 0, INT32_MAX, &v) != 0)
      return -1;
    g.sizes[g.nsizes++] = v;
  }
  if (g.nsizes == 0) {
    tool_usage_error("-s: no size given");
    return -1;
  }
  return 0;
}

static int parse_args(int argc, char **argv) {
  enum { OPT_SERVER = 256, OPT_LOOPBACK, OPT_MAX_SIZE, OPT_JSON, OPT_VERSION };
  static const struct option options[] = {
      {"server", no_argument, NULL, OPT_SERVER},
      {"loopback", no_argument, NULL, OPT_LOOPBACK},
      {"port", required_argument, NULL, 'p'},
      {"test", required_argument, NULL, 't'},
      {"sizes", required_argument, NULL, 's'},
      {"iters", required_argument, NULL, 'n'},
      {"warmup", required_argument, NULL, 'w'},
      {"max-size", required_argument, NULL, OPT_MAX_SIZE},
      {"json", no_argument, NULL, OPT_JSON},
      {"quiet", no_argument, NULL, 'q'},
      {"help", no_argument, NULL, 'h'},
      {"version", no_argument, NULL, OPT_VERSION},
      {NULL, 0, NULL, 0}};
  int opt;

  g.port = TOOL_DEFAULT_PORT;
  g.tests = TEST_LAT | TEST_BW;
  g.sizes[0] = 64;
  g.sizes[1] = 4096;
  g.sizes[2] = 65536;
  g.nsizes = 3;
  g.iters = 1000;
  g.warmup = 32;
  g.max_size = TOOL_DEFAULT_MAX_SIZE;
  opterr = 0; /* we print our own one-line errors */
  while ((opt = getopt_long(argc, argv, ":p:t:s:n:w:qh", options, NULL)) != -1) {
    switch (opt) {
    case OPT_SERVER: g.server = 1; break;
    case OPT_LOOPBACK: g.loopback = 1; break;
    case 'p':
      if (tool_parse_port(optarg, 0, &g.port) != 0)
        return -1;
      g.port_given = 1;
      break;
    case 't':
      if (strcmp(optarg, "lat") == 0)
        g.tests = TEST_LAT;
      else if (strcmp(optarg, "bw") == 0)
        g.tests = TEST_BW;
      else if (strcmp(optarg, "all") == 0)
        g.tests = TEST_LAT | TEST_BW;
      else {
        tool_usage_error("-t: '%s' is not lat, bw or all", optarg);
        return -1;
      }
      break;
    case 's':
      if (parse_sizes(optarg) != 0)
        return -1;
      break;
    case 'n':
      if (tool_parse_uint("-n", optarg, 1, 100000000, &g.iters) != 0)
        return -1;
      break;
    case 'w':
      if (tool_parse_uint("-w", optarg, 0, 100000000, &g.warmup) != 0)
        return -1;
      break;
    case OPT_MAX_SIZE:
      if (tool_parse_size("--max-size", optarg, HELLO_SIZE, INT32_MAX, &g.max_size) != 0)
        return -1;
      g.max_size_given = 1;
      break;
    case OPT_JSON: g.json = 1; break;
    case 'q': g.quiet = 1; break;
    case 'h': fputs(usage_text, stdout); exit(TOOL_EXIT_OK);
    case OPT_VERSION: tool_print_version(); exit(TOOL_EXIT_OK);
    case ':': tool_usage_error("option %s needs a value", tool_bad_option(argv)); return -1;
    default: tool_usage_error("unknown option %s", tool_bad_option(argv)); return -1;
    }
  }
  if (g.server && g.loopback) {
    tool_usage_error("--server and --loopback exclude each other");
    return -1;
  }
  if (optind < argc)
    g.ip = argv[optind++];
  if (optind < argc) {
    tool_usage_error("unexpected argument '%s'", argv[optind]);
    return -1;
  }
  if (g.ip == NULL && !g.server) {
    tool_usage_error("no IP address given");
    return -1;
  }
  if (!g.server) {
    /* The client side needs room for its largest size; the server has only --max-size. */
    for (int i = 0; i < g.nsizes; i++)
      if (g.max_size < g.sizes[i])
        g.max_size = g.sizes[i];
  }
  if (g.loopback && !g.port_given)
    g.port = 0; /* any free port: nothing else needs to know it */
  return 0;
}

/* ---- main ------------------------------------------------------------------------------------ */

static int start_listener(void) {
  char addr[64];
  unsigned short port;
  int rc = ibmsg_listen(&g.loop, &g.listener.socket, g.ip, g.port, 16);
  if (rc != IBMSG_OK) {
    tool_error("cannot listen on %s port %u: %s", g.ip ? g.ip : "all addresses", g.port,
               ibmsg_strerror(rc));
    return -1;
  }
  g.listener.socket.user_data = &g.listener;
  g.listener.role = ROLE_LISTENER;
  g.listener.open = 1;
  if (ibmsg_socket_local_address(&g.listener.socket, addr, sizeof addr, &port) == IBMSG_OK)
    g.port = port; /* the port picked, when it was 0 */
  else
    snprintf(addr, sizeof addr, "%s", g.ip ? g.ip : "*");
  if (g.server)
    tool_info(g.quiet, "listening on %s port %u", addr, g.port);
  return 0;
}

static void stop_server_side(void) {
  if (g.listener.open)
    ibmsg_disconnect(&g.listener.socket);
  for (struct endpoint *s = g.sessions; s != NULL; s = s->next) {
    tool_sendpool_release(&s->pool);
    ibmsg_disconnect(&s->socket);
  }
}

int main(int argc, char **argv) {
  int failed = 0, rc;

  tool_name = "ibmsg-perf";
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (parse_args(argc, argv) != 0)
    return TOOL_EXIT_USAGE;
  tool_catch_signals();

  rc = ibmsg_init_event_loop(&g.loop);
  if (rc != IBMSG_OK) {
    tool_error("cannot create the event loop: %s", ibmsg_strerror(rc));
    return TOOL_EXIT_FAILURE;
  }
  g.loop.connection_request = on_request;
  g.loop.connection_established = on_established;
  g.loop.message_received = on_received;
  g.loop.message_sent = on_sent;
  g.loop.connection_closed = on_closed;
  if (tool_setopt_int(&g.loop, IBMSG_OPT_MAX_MSG_SIZE, "the maximum message size",
                      (int)g.max_size) != 0) {
    ibmsg_destroy_event_loop(&g.loop);
    return TOOL_EXIT_FAILURE;
  }
  g.server_quiet = g.loopback;
  if ((g.server || g.loopback) && start_listener() != 0) {
    ibmsg_destroy_event_loop(&g.loop);
    return TOOL_EXIT_FAILURE;
  }

  if (g.server) {
    /* Everything happens in the callbacks; a signal ends the service. */
    while (!tool_stop && g.listener.open) {
      rc = ibmsg_dispatch_event_loop_timeout(&g.loop, TOOL_TICK_MS);
      if (rc != IBMSG_OK) {
        tool_error("event loop failed: %s", ibmsg_strerror(rc));
        failed = 1;
        break;
      }
    }
    if (!tool_stop && !failed)
      failed = 1; /* the listener closed by itself: reported by on_closed */
  } else {
    if (g.tests & TEST_LAT)
      for (int i = 0; i < g.nsizes && !failed; i++)
        failed = run_test(TEST_LAT, g.sizes[i]) != 0;
    if (g.tests & TEST_BW)
      for (int i = 0; i < g.nsizes && !failed; i++)
        failed = run_test(TEST_BW, g.sizes[i]) != 0;
    if (!failed && g.json)
      print_json();
    else if (!failed && !g.quiet)
      print_rule();
  }

  stop_server_side();
  if (wait_all_closed() == 0) {
    rc = ibmsg_destroy_event_loop(&g.loop);
    if (rc != IBMSG_OK) {
      tool_error("cannot destroy the event loop: %s", ibmsg_strerror(rc));
      failed = 1;
    }
  } else {
    failed = 1;
  }
  return failed ? TOOL_EXIT_FAILURE : TOOL_EXIT_OK;
}
