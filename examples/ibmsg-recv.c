/*
 * ibmsg-recv - receive messages from ibmsg-send and report the throughput.
 *
 *   ibmsg-recv [OPTIONS] [-p PORT] IP
 *   ibmsg-recv [OPTIONS] IP PORT          (the old form, still taken)
 *
 * How it uses ibmsg: one event loop and one listening socket. Each connection request is
 * accepted into a socket the tool allocates (freed again in connection_closed, after which ibmsg
 * never touches it). Every received message is checked if asked to and returned at once with
 * ibmsg_free_msg(), which gives its buffer back to the sender as a credit. The loop is
 * dispatched with a timeout so that a SIGINT ends the run promptly with a summary. Messages
 * above the eager size come by rendezvous (ibmsg reads them into a buffer of its own, which
 * ibmsg_free_msg() gives back): any size up to the library's maximum takes no option. With
 * --memory it samples ibmsg_loop_memory() while connections are up and prints it with its peak
 * RSS. Its connections are numbered as ibmsg's log lines number them: a log callback learns each
 * one's number from the first line about it; with --json it prints one JSON object at the end.
 */
#define _POSIX_C_SOURCE 200809L

#include <getopt.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include <ibmsg.h>

#include "tool.h"

static const char usage_text[] =
    "Usage: ibmsg-recv [OPTIONS] [-p PORT] IP\n"
    "       ibmsg-recv [OPTIONS] IP PORT   (the old form: the port after IP)\n"
    "Listen at IP and PORT (default 12345) for ibmsg-send, receive its messages\n"
    "over RDMA and report the throughput. IP may be 0.0.0.0 or :: for all\n"
    "addresses.\n"
    "\n"
    "Options:\n"
    "  -p, --port PORT       the port to listen on (default 12345; 0: any free\n"
    "                        port, shown in the 'listening' line)\n"
    "  -n, --count COUNT     exit after COUNT messages in total (default 0: run\n"
    "                        until interrupted)\n"
    "  -s, --size SIZE       expect messages of SIZE bytes: any other size is an\n"
    "                        error (default: any size up to --max-size)\n"
    "  -c, --connections N   accept N connections in all, then exit when they\n"
    "                        have closed (default 0: no limit)\n"
    "      --verify          check the pattern ibmsg-send --verify puts in each\n"
    "                        message\n"
    "      --max-size BYTES  largest message size to accept, at least SIZE\n"
    "                        (default: ibmsg's, 4294967295)\n"
    "      --eager-size BYTES\n"
    "                        messages above BYTES come by rendezvous: this side\n"
    "                        reads them (default: ibmsg's, 16384)\n"
    "      --recv-budget BYTES\n"
    "                        for many connections: about the most receive buffers\n"
    "                        their idle connections reserve on this side; new\n"
    "                        ones get smaller eager sizes past it (ibmsg's\n"
    "                        IBMSG_OPT_SHARED_RECV_BUDGET; default: ibmsg's,\n"
    "                        32M; 0: none)\n"
    "      --memory          print the peak RSS and the registered memory\n"
    "                        (ibmsg_loop_memory) while the connections were up\n"
    "      --json            print one JSON object on stdout at the end (counts,\n"
    "                        bytes, rates, each connection's counters, the error\n"
    "                        if the run failed); the other lines go to stderr\n"
    "  -q, --quiet           print only the summary and errors\n"
    "  -v, --verbose         print ibmsg's log lines (connections, errors, keepalive\n"
    "                        misses) and each connection's counters at its close\n"
    "                        (connection N: the number ibmsg's log lines give it)\n"
    "  -h, --help            print this help and exit\n"
    "      --version         print the version and exit\n"
    "\n"
    "SIZE and BYTES may end in K, M or G (times 1024, 1024^2, 1024^3).\n"
    "A message may be as large as both sides' --max-size allow.\n"
    "Exit status: 0 on success (also when interrupted without -n), 1 on an error\n"
    "or a failed check, 2 on bad usage.\n";

/* Connections without -c: accepted at once, at most. */
#define MAX_OPEN_CONNECTIONS 1024
/* After COUNT messages, how long the senders get to disconnect before we do. A sender learns
 * that a message arrived from its message_sent, which for a rendezvous message needs a word from
 * this side after the message was read: closing at once could leave the sender without it. */
#define LINGER_S 1.0
/* --memory: how often ibmsg_loop_memory() is sampled, in seconds. */
#define MEMORY_INTERVAL_S 0.1

/* One accepted connection. The socket comes first so that the callbacks' socket pointer is
 * also the connection's. */
struct conn {
  ibmsg_socket socket;
  struct conn *next; /* the list of open connections */
  unsigned long number; /* ibmsg's number of the connection (its log lines'), 0 until known */
  int established;
  char peer[64];
  unsigned short peer_port;
  uint64_t received;
  int64_t sender_conn; /* --verify: the sender's connection number, -1 until known */
  int bad;             /* --verify found a bad message on it (reported once) */
};

static struct {
  const char *ip;
  unsigned short port;
  uint64_t count;     /* 0: no limit */
  uint64_t size;      /* expected size */
  int check_size;
  uint64_t max_size;   /* 0: the library's default */
  uint64_t eager_size; /* 0: the library's default */
  uint64_t recv_budget; /* --recv-budget (0: none) */
  int recv_budget_given;
  unsigned limit;     /* -c: connections in all, 0: no limit */
  int verify;
  int quiet;
  int verbose;
  int memory;         /* --memory */
  int json;           /* --json */
  int port_given;     /* -p */

  ibmsg_event_loop loop;
  ibmsg_socket listener;
  int listening;      /* its connection_closed has not come */
  struct conn *conns; /* open connections */
  unsigned accepted;
  unsigned not_accepted; /* ibmsg_accept() failed: they count toward -c too */
  unsigned established; /* connections that were established */
  unsigned up;        /* established and not closed */
  double t_request;   /* the first connection request */
  double lingering;   /* COUNT messages came at this time: the senders may close first */
  int stopping;
  int failed;
  uint64_t received;
  uint64_t bytes;
  uint64_t bad_messages;
  double t_start;     /* first connection established */
  double t_end;       /* last message received */
  struct tool_progress progress;
  struct tool_memwatch mem;
  struct record *records; /* --json: the connections that closed */
  size_t nrecords, records_cap;
} g;

/* --json: what is left of a connection once it closed. */
struct record {
  unsigned long number;
  char peer[64];
  unsigned short peer_port;
  int established;
  uint64_t received;
  int reason;
  int have_stats;
  ibmsg_stats stats;
};

static void keep_record(const struct conn *c, int reason) {
  struct record *r;
  if (g.nrecords == g.records_cap) {
    size_t cap = g.records_cap > 0 ? 2 * g.records_cap : 16;
    struct record *more = realloc(g.records, cap * sizeof *more);
    if (more == NULL)
      return; /* the JSON lacks it; the counts stay right */
    g.records = more;
    g.records_cap = cap;
  }
  r = &g.records[g.nrecords++];
  memset(r, 0, sizeof *r);
  r->number = c->number;
  snprintf(r->peer, sizeof r->peer, "%s", c->peer);
  r->peer_port = c->peer_port;
  r->established = c->established;
  r->received = c->received;
  r->reason = reason;
  r->have_stats = ibmsg_socket_stats(&c->socket, &r->stats, sizeof r->stats) == IBMSG_OK;
}

static void stop_listening(void) {
  int rc;
  if (g.listening) {
    rc = ibmsg_disconnect(&g.listener);
    if (rc != IBMSG_OK && rc != IBMSG_ESTATE) /* ESTATE: it is closing already */
      tool_error("cannot close the listening socket: %s", ibmsg_strerror(rc));
  }
}

/* Closes the listener and every connection; the loop then runs until their callbacks came. */
static void stop_all(void) {
  int rc;
  if (g.stopping)
    return;
  g.stopping = 1;
  stop_listening();
  for (struct conn *c = g.conns; c != NULL; c = c->next) {
    rc = ibmsg_disconnect(&c->socket);
    if (rc != IBMSG_OK && rc != IBMSG_ESTATE)
      tool_error("connection %lu: cannot disconnect: %s", c->number, ibmsg_strerror(rc));
  }
}

/* With -c, once every connection came (or failed to) and closed: the end. */
static void check_done(void) {
  if (g.limit > 0 && g.accepted + g.not_accepted >= g.limit && g.conns == NULL && !g.stopping) {
    if (g.count > 0 && g.received < g.count) {
      tool_error("all %u connections closed after %" PRIu64 " of %" PRIu64 " messages",
                 g.limit, g.received, g.count);
      g.failed = 1;
    }
    stop_all();
  }
}

static void on_request(ibmsg_connection_request *request) {
  struct conn *c;
  int rc;

  if (g.t_request == 0)
    g.t_request = tool_now();
  if (g.stopping || g.lingering != 0 ||
      (g.limit > 0 && g.accepted + g.not_accepted >= g.limit)) {
    ibmsg_reject(request, "ibmsg-recv takes no more connections");
    return;
  }
  c = calloc(1, sizeof *c);
  if (c == NULL) {
    tool_error("out of memory for the connection from %s", request->peer_address);
    ibmsg_reject(request, "ibmsg-recv is out of memory");
    return;
  }
  snprintf(c->peer, sizeof c->peer, "%s", request->peer_address);
  c->peer_port = request->peer_port;
  c->socket.user_data = c; /* before the accept: ibmsg's log lines about it find it */
  rc = ibmsg_accept(request, &c->socket);
  if (rc != IBMSG_OK) {
    /* No callback will come for this socket: it was never set up. */
    tool_error("cannot accept the connection from %s port %u: %s", c->peer, c->peer_port,
               ibmsg_strerror(rc));
    free(c);
    g.not_accepted++;
    g.failed = 1;
    check_done();
    return;
  }
  g.accepted++;
  c->sender_conn = -1;
  c->next = g.conns;
  g.conns = c;
}

static void on_established(ibmsg_socket *socket) {
  struct conn *c = socket->user_data;
  const char *dev = ibmsg_socket_device(socket);

  c->established = 1;
  g.established++;
  g.up++;
  if (g.t_start == 0)
    g.t_start = tool_now();
  tool_info(g.quiet, "connection %lu from %s port %u (%s)", c->number, c->peer, c->peer_port,
            dev ? dev : "?");
  if (g.limit > 1 && g.established == g.limit) {
    tool_info(g.quiet, "all %u connections established, %.3f s after the first request",
              g.limit, tool_now() - g.t_request);
    if (g.memory)
      tool_memwatch_sample(&g.mem, &g.loop, g.up);
  }
}

static void on_received(ibmsg_socket *socket, ibmsg_buffer *msg) {
  struct conn *c = socket->user_data;
  char why[200];
  int rc;

  /* Messages that arrive after COUNT, while the connections close, are not counted. */
  if (g.count == 0 || g.received < g.count) {
    if (g.check_size && msg->size != g.size) {
      if (!c->bad)
        tool_error("connection %lu: message %" PRIu64 " has %zu bytes, expected %" PRIu64,
                   c->number, c->received, msg->size, g.size);
      c->bad = 1;
      g.bad_messages++;
    } else if (g.verify &&
               tool_payload_check(msg->data, msg->size, c->received, &c->sender_conn, why,
                                  sizeof why) != 0) {
      if (!c->bad) /* one line per connection: the rest would repeat it */
        tool_error("--verify: connection %lu from %s port %u: %s", c->number, c->peer,
                   c->peer_port, why);
      c->bad = 1;
      g.bad_messages++;
    }
    c->received++;
    g.received++;
    g.bytes += msg->size;
    g.t_end = tool_now();
    tool_progress_update(&g.progress, g.received, g.bytes);
  }
  /* Lent, not given: freeing it returns the buffer to the sender as a credit. */
  rc = ibmsg_free_msg(msg);
  if (rc != IBMSG_OK) {
    tool_error("connection %lu: cannot free a message: %s", c->number, ibmsg_strerror(rc));
    g.failed = 1;
    stop_all();
    return;
  }
  if (g.count > 0 && g.received == g.count && g.lingering == 0) {
    /* Done: no new connections; the main loop closes the rest after LINGER_S. */
    g.lingering = tool_now();
    stop_listening();
  }
}

static void on_closed(ibmsg_socket *socket, int reason) {
  struct conn *c = socket->user_data;

  if (socket == &g.listener) {
    g.listening = 0;
    if (!g.stopping && g.lingering == 0) {
      tool_error("the listening socket closed: %s", ibmsg_strerror(reason));
      g.failed = 1;
      stop_all();
    }
    return;
  }
  if (c->established)
    g.up--;
  if (g.verbose) {
    char what[48];
    snprintf(what, sizeof what, "connection %lu", c->number);
    tool_print_stats(what, socket);
  }
  if (g.json)
    keep_record(c, reason);
  /* ECONNRESET: the sender disconnected, the normal end of a connection. */
  if (reason != IBMSG_OK && reason != IBMSG_ECONNRESET) {
    tool_error("connection %lu from %s port %u failed after %" PRIu64 " message%s: %s",
               c->number, c->peer, c->peer_port, c->received, TOOL_S(c->received),
               ibmsg_strerror(reason));
    g.failed = 1;
  } else {
    tool_info(g.quiet, "connection %lu closed after %" PRIu64 " message%s", c->number,
              c->received, TOOL_S(c->received));
  }
  for (struct conn **p = &g.conns; *p != NULL; p = &(*p)->next) {
    if (*p == c) {
      *p = c->next;
      break;
    }
  }
  free(c); /* ibmsg never touches the socket after this callback */
  check_done();
}

/* The log callback: learns each connection's number from ibmsg's first line about it (the
 * socket's user_data is set before ibmsg_accept(), so every line finds its connection), and with
 * -v prints the lines. */
static void on_log(ibmsg_event_loop *loop, ibmsg_socket *socket, int level, const char *text) {
  if (socket != NULL && socket != &g.listener && socket->user_data != NULL) {
    struct conn *c = socket->user_data;
    if (c->number == 0)
      c->number = tool_log_number(text);
  }
  if (g.verbose)
    tool_log(loop, socket, level, text);
}

static int parse_args(int argc, char **argv) {
  enum { OPT_VERIFY = 256, OPT_MAX_SIZE, OPT_EAGER_SIZE, OPT_RECV_BUDGET, OPT_MEMORY, OPT_JSON, OPT_VERSION };
  static const struct option options[] = {
      {"port", required_argument, NULL, 'p'},
      {"count", required_argument, NULL, 'n'},
      {"size", required_argument, NULL, 's'},
      {"connections", required_argument, NULL, 'c'},
      {"verify", no_argument, NULL, OPT_VERIFY},
      {"max-size", required_argument, NULL, OPT_MAX_SIZE},
      {"eager-size", required_argument, NULL, OPT_EAGER_SIZE},
      {"recv-budget", required_argument, NULL, OPT_RECV_BUDGET},
      {"memory", no_argument, NULL, OPT_MEMORY},
      {"json", no_argument, NULL, OPT_JSON},
      {"quiet", no_argument, NULL, 'q'},
      {"verbose", no_argument, NULL, 'v'},
      {"help", no_argument, NULL, 'h'},
      {"version", no_argument, NULL, OPT_VERSION},
      {NULL, 0, NULL, 0}};
  uint64_t v;
  int opt;

  g.port = TOOL_DEFAULT_PORT;
  opterr = 0; /* we print our own one-line errors */
  while ((opt = getopt_long(argc, argv, ":p:n:s:c:qvh", options, NULL)) != -1) {
    switch (opt) {
    case 'p':
      if (tool_parse_port("-p", optarg, 1, &g.port) != 0)
        return -1;
      g.port_given = 1;
      break;
    case OPT_JSON: g.json = 1; break;
    case 'n':
      if (tool_parse_uint("-n", optarg, 0, UINT64_MAX / 2, &g.count) != 0)
        return -1;
      break;
    case 's':
      if (tool_parse_size("-s", optarg, 0, TOOL_MAX_MSG_SIZE, &g.size) != 0)
        return -1;
      g.check_size = 1;
      break;
    case 'c':
      if (tool_parse_uint("-c", optarg, 0, 65536, &v) != 0)
        return -1;
      g.limit = (unsigned)v;
      break;
    case OPT_VERIFY: g.verify = 1; break;
    case OPT_MEMORY: g.memory = 1; break;
    case OPT_MAX_SIZE:
      if (tool_parse_size("--max-size", optarg, 1, TOOL_MAX_MSG_SIZE, &g.max_size) != 0)
        return -1;
      break;
    case OPT_EAGER_SIZE:
      if (tool_parse_size("--eager-size", optarg, 1, TOOL_MAX_EAGER_SIZE, &g.eager_size) != 0)
        return -1;
      break;
    case OPT_RECV_BUDGET:
      if (tool_parse_size("--recv-budget", optarg, 0, (uint64_t)1 << 48, &g.recv_budget) != 0)
        return -1;
      g.recv_budget_given = 1;
      break;
    case 'q': g.quiet = 1; break;
    case 'v': g.verbose = 1; break;
    case 'h': fputs(usage_text, stdout); exit(TOOL_EXIT_OK);
    case OPT_VERSION: tool_print_version(); exit(TOOL_EXIT_OK);
    case ':': tool_usage_error("option %s needs a value", tool_bad_option(argv)); return -1;
    default: tool_usage_error("unknown option %s", tool_bad_option(argv)); return -1;
    }
  }
  if (optind >= argc) {
    tool_usage_error("no IP address given");
    return -1;
  }
  g.ip = argv[optind++];
  if (optind < argc) {
    /* The old form: the port after IP. */
    if (g.port_given) {
      tool_usage_error("the port is given twice: -p and '%s' after IP", argv[optind]);
      return -1;
    }
    if (tool_parse_port("PORT", argv[optind++], 1, &g.port) != 0)
      return -1;
  }
  if (optind < argc) {
    tool_usage_error("unexpected argument '%s'", argv[optind]);
    return -1;
  }
  if (g.check_size && g.max_size != 0 && g.max_size < g.size) {
    tool_usage_error("-s %" PRIu64 " is larger than --max-size %" PRIu64, g.size, g.max_size);
    return -1;
  }
  return 0;
}

/* --json: one object on stdout, whatever the outcome. */
static void print_json(const char *addr, unsigned short port) {
  double seconds = g.received > 0 ? g.t_end - g.t_start : 0.0;

  printf("{\n  \"tool\": \"ibmsg-recv\",\n  \"version\": ");
  tool_json_string(stdout, ibmsg_version_string());
  printf(",\n  \"listen\": {\"address\": ");
  tool_json_string(stdout, addr);
  printf(", \"port\": %u},\n", port);
  printf("  \"count\": %" PRIu64 ",\n  \"size\": ", g.count);
  if (g.check_size)
    printf("%" PRIu64, g.size);
  else
    printf("null");
  printf(",\n  \"verify\": %s,\n  \"connections\": %u,\n  \"not_accepted\": %u,\n"
         "  \"established\": %u,\n", g.verify ? "true" : "false", g.accepted, g.not_accepted,
         g.established);
  printf("  \"messages\": %" PRIu64 ",\n  \"bytes\": %" PRIu64 ",\n  \"bad_messages\": %" PRIu64
         ",\n  \"seconds\": %.6f,\n  \"mb_per_s\": %.3f,\n  \"msg_per_s\": %.1f,\n",
         g.received, g.bytes, g.bad_messages, seconds,
         seconds > 0 ? (double)g.bytes / seconds / 1e6 : 0.0,
         seconds > 0 ? (double)g.received / seconds : 0.0);
  printf("  \"per_connection\": [");
  for (size_t i = 0; i < g.nrecords; i++) {
    const struct record *r = &g.records[i];
    printf("%s\n    {\"connection\": ", i ? "," : "");
    if (r->number > 0)
      printf("%lu", r->number);
    else
      printf("null");
    printf(", \"peer\": {\"address\": ");
    tool_json_string(stdout, r->peer);
    printf(", \"port\": %u}, \"established\": %s, \"messages\": %" PRIu64 ", \"close\": ",
           r->peer_port, r->established ? "true" : "false", r->received);
    tool_json_string(stdout, ibmsg_err_name(r->reason));
    printf(", \"stats\": ");
    if (r->have_stats)
      tool_json_stats(stdout, &r->stats);
    else
      printf("null");
    putchar('}');
  }
  printf("%s],\n", g.nrecords > 0 ? "\n  " : "");
  if (g.memory) {
    printf("  \"memory\": ");
    tool_memwatch_json(stdout, &g.mem);
    printf(",\n");
  }
  printf("  \"ok\": %s,\n  \"error\": ", g.failed ? "false" : "true");
  tool_json_string(stdout, g.failed ? (tool_first_error() ? tool_first_error() : "failed")
                                    : NULL);
  printf("\n}\n");
  fflush(stdout);
}

int main(int argc, char **argv) {
  char extra[160], addr[64];
  unsigned short port;
  int rc;

  tool_name = "ibmsg-recv";
  setvbuf(stdout, NULL, _IOLBF, 0); /* a script waiting for "listening" sees it at once */
  if (parse_args(argc, argv) != 0)
    return TOOL_EXIT_USAGE;
  if (g.json) {
    tool_json_mode();
    setvbuf(stderr, NULL, _IOLBF, 0);
  }
  snprintf(addr, sizeof addr, "%s", g.ip);
  port = g.port;
  tool_catch_signals();
  tool_progress_init(&g.progress, g.quiet);

  rc = ibmsg_init_event_loop(&g.loop);
  if (rc != IBMSG_OK) {
    tool_error("cannot create the event loop: %s", ibmsg_strerror(rc));
    g.failed = 1;
    if (g.json)
      print_json(addr, port);
    return TOOL_EXIT_FAILURE;
  }
  g.loop.connection_request = on_request;
  g.loop.connection_established = on_established;
  g.loop.message_received = on_received;
  g.loop.connection_closed = on_closed;
  g.loop.log = on_log;
  if ((g.max_size != 0 && tool_setopt_max_size(&g.loop, g.max_size) != 0) ||
      (g.eager_size != 0 && tool_setopt_int(&g.loop, IBMSG_OPT_EAGER_SIZE, "the eager size",
                                            (int)g.eager_size) != 0) ||
      (g.recv_budget_given && tool_setopt_u64(&g.loop, IBMSG_OPT_SHARED_RECV_BUDGET,
                                             "the receive budget", g.recv_budget) != 0)) {
    ibmsg_destroy_event_loop(&g.loop);
    g.failed = 1;
    if (g.json)
      print_json(addr, port);
    return TOOL_EXIT_FAILURE;
  }
  rc = ibmsg_listen(&g.loop, &g.listener, g.ip, g.port,
                    g.limit > 0 ? (int)g.limit : MAX_OPEN_CONNECTIONS);
  if (rc != IBMSG_OK) {
    tool_error("cannot listen on %s port %u: %s", g.ip, g.port, ibmsg_strerror(rc));
    ibmsg_destroy_event_loop(&g.loop);
    g.failed = 1;
    if (g.json)
      print_json(addr, port);
    return TOOL_EXIT_FAILURE;
  }
  g.listening = 1;
  if (ibmsg_socket_local_address(&g.listener, addr, sizeof addr, &port) != IBMSG_OK) {
    snprintf(addr, sizeof addr, "%s", g.ip);
    port = g.port;
  }
  tool_info(g.quiet, "listening on %s port %u", addr, port);

  /* Run until the listener and every connection have closed; the callbacks do the work. */
  while (g.listening || g.conns != NULL) {
    rc = ibmsg_dispatch_event_loop_timeout(&g.loop, TOOL_TICK_MS);
    if (rc != IBMSG_OK) {
      tool_error("event loop failed: %s", ibmsg_strerror(rc));
      g.failed = 1;
      break; /* cannot wait for the sockets without a loop */
    }
    if (tool_stop && !g.stopping) {
      /* The usual way to end a run without -n; with -n it ended too early. */
      if (g.count > 0 && g.received < g.count) {
        tool_error("interrupted after %" PRIu64 " of %" PRIu64 " messages", g.received, g.count);
        g.failed = 1;
      }
      stop_all();
    }
    if (g.lingering != 0 && !g.stopping &&
        (g.conns == NULL || tool_now() - g.lingering >= LINGER_S))
      stop_all();
    tool_progress_update(&g.progress, g.received, g.bytes);
    if (g.memory && g.up > 0)
      tool_memwatch_tick(&g.mem, &g.loop, g.up, MEMORY_INTERVAL_S);
  }

  snprintf(extra, sizeof extra, "%u connection%s%s", g.accepted, g.accepted == 1 ? "" : "s",
           !g.verify ? "" : g.bad_messages == 0 ? ", payload verified" : ", VERIFY FAILED");
  if (g.not_accepted > 0)
    tool_error("%u connection request%s could not be accepted", g.not_accepted,
               TOOL_S(g.not_accepted));
  tool_print_summary("received", g.received, g.bytes,
                     g.received > 0 ? g.t_end - g.t_start : 0.0, extra);
  if (g.memory)
    tool_memwatch_print(&g.mem);
  if (g.bad_messages > 0) {
    tool_error("%" PRIu64 " of %" PRIu64 " messages failed the check", g.bad_messages,
               g.received);
    g.failed = 1;
  }

  if (!g.listening && g.conns == NULL) {
    rc = ibmsg_destroy_event_loop(&g.loop);
    if (rc != IBMSG_OK) {
      tool_error("cannot destroy the event loop: %s", ibmsg_strerror(rc));
      g.failed = 1;
    }
  }
  if (g.json)
    print_json(addr, port);
  free(g.records);
  return g.failed ? TOOL_EXIT_FAILURE : TOOL_EXIT_OK;
}
