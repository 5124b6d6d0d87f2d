/*
 * ibmsg-send - send messages to ibmsg-recv and report the throughput.
 *
 *   ibmsg-send [OPTIONS] [-p PORT] IP
 *   ibmsg-send [OPTIONS] IP PORT          (the old form, still taken)
 *
 * How it uses ibmsg: one event loop; -c connections opened with ibmsg_connect() at once; when
 * all of them are established, each starts sending. On each, the send buffers are taken from
 * the socket's pool once (ibmsg_alloc_msg) and posted again from their message_sent callback,
 * so that up to a window of messages are in flight per connection: IBMSG_OPT_SEND_DEPTH, fewer
 * when many connections or large messages would hold too much memory (see set_window). When
 * every message of a connection is confirmed, the connection is closed with ibmsg_disconnect();
 * the tool ends when every socket's connection_closed has come. With --memory it samples
 * ibmsg_loop_memory() while the connections are up and prints it with its peak RSS. Its
 * connections are numbered as ibmsg's log lines number them: a log callback learns each one's
 * number from the first line about it; with --json it prints one JSON object at the end.
 *
 * Any size up to the library's maximum goes without options: messages above the eager size
 * (IBMSG_OPT_EAGER_SIZE) go by rendezvous, the receiver reading them from the send buffer.
 */
#define _POSIX_C_SOURCE 200809L

#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include <ibmsg.h>

#include "tool.h"

static const char usage_text[] =
    "Usage: ibmsg-send [OPTIONS] [-p PORT] IP\n"
    "       ibmsg-send [OPTIONS] IP PORT   (the old form: the port after IP)\n"
    "Send messages to ibmsg-recv listening at IP and PORT (default 12345) over\n"
    "RDMA and report the throughput.\n"
    "\n"
    "Options:\n"
    "  -p, --port PORT       the receiver's port (default 12345)\n"
    "  -n, --count COUNT     send COUNT messages in total (default 1000, fewer\n"
    "                        above 1 MiB: as many as make 1 GiB, at least 1)\n"
    "  -s, --size SIZE       bytes per message, 0 to 4294967295 (default 4096)\n"
    "  -c, --connections N   open N connections and spread the messages over\n"
    "                        them (default 1); they start sending once all of\n"
    "                        them are established\n"
    "  -W, --window N        messages in flight per connection, at most (default:\n"
    "                        32, ibmsg's send depth, or fewer so that all\n"
    "                        connections together hold about 32 MiB of buffers,\n"
    "                        at least 2, and at most 512 MiB per connection);\n"
    "                        -w N, the old letter, is taken too\n"
    "      --verify          fill each message with a pattern ibmsg-recv --verify\n"
    "                        checks\n"
    "      --max-size BYTES  largest message size to offer, at least SIZE\n"
    "                        (default: ibmsg's, 4294967295)\n"
    "      --eager-size BYTES\n"
    "                        messages above BYTES go by rendezvous: the\n"
    "                        receiver reads them (default: ibmsg's, 16384)\n"
    "      --recv-budget BYTES\n"
    "                        for many connections: about the most receive buffers\n"
    "                        their idle connections reserve on this side; new\n"
    "                        ones get smaller eager sizes past it (ibmsg's\n"
    "                        IBMSG_OPT_SHARED_RECV_BUDGET; default: ibmsg's,\n"
    "                        32M; 0: none)\n"
    "      --memory          print the peak RSS and the registered memory\n"
    "                        (ibmsg_loop_memory) while the connections were up\n"
    "      --connect-timeout MS\n"
    "                        give each connection MS milliseconds to be\n"
    "                        established (default: ibmsg's, 5000)\n"
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
    "SIZE and BYTES may end in K, M or G (times 1024, 1024^2, 1024^3). A message\n"
    "may be as large as both sides' --max-size allow.\n"
    "Exit status: 0 if every message was delivered, 1 on an error, 2 on bad usage.\n";

/* Default COUNT: DEFAULT_COUNT messages, or for large ones as many as make DEFAULT_BYTES (at
 * least 1), so that a run with only -s ends in seconds on fast hardware, not hours. */
#define DEFAULT_COUNT 1000
#define DEFAULT_BYTES (UINT64_C(1) << 30)

/* The bytes of messages one connection keeps in flight, at least one message: a rendezvous
 * message lies in a registered buffer of its own until the receiver has read it, so 32 of
 * 256 MiB would pin 8 GiB. Two in flight keep the receiver reading while the next is filled. */
#define SEND_WINDOW_BYTES (UINT64_C(512) << 20)
/* The bytes of send buffers all connections together keep in flight, about: with many
 * connections each gets a smaller window (at least MIN_WINDOW), so that 1000 connections do not
 * hold 1000 x 32 buffers. A message takes a buffer of at least the eager size. */
#define ALL_WINDOW_BYTES (UINT64_C(32) << 20)
#define MIN_WINDOW 2
/* -w: the largest window; above the send depth it raises IBMSG_OPT_SEND_DEPTH and
 * IBMSG_OPT_SEND_QUEUE to it. */
#define MAX_WINDOW 4096
/* --memory: how often ibmsg_loop_memory() is sampled, in seconds. */
#define MEMORY_INTERVAL_S 0.1

/* One connection: its socket, the messages it is to send and its send buffers. The socket is
 * embedded so that the callbacks find the connection from the socket pointer they get. */
struct conn {
  ibmsg_socket socket;
  uint32_t index;         /* 0, 1, ...: its place in g.conns */
  unsigned long number;   /* ibmsg's number of the connection (its log lines'), 0 until known */
  ibmsg_stats stats;      /* at its close, for --json */
  int have_stats;
  int close_reason;
  uint64_t to_send;   /* this connection's share of COUNT */
  uint64_t posted;    /* also the sequence number of the next message */
  uint64_t confirmed; /* message_sent with IBMSG_OK */
  int established;
  int closing;        /* we called ibmsg_disconnect() */
  int open;           /* set up and its connection_closed has not come yet */
  struct tool_sendpool pool;
};

static struct {
  const char *ip;
  unsigned short port;
  uint64_t count;
  uint64_t size;
  uint64_t max_size;   /* 0: the library's default */
  uint64_t eager_size; /* 0: the library's default */
  uint64_t recv_budget; /* --recv-budget (0: none) */
  int recv_budget_given;
  uint64_t connect_timeout; /* ms, 0: the library's default */
  uint64_t window;     /* messages in flight per connection, at most; 0: set_window() picks */
  uint32_t nconns;
  int verify;
  int quiet;
  int verbose;
  int memory;          /* --memory */
  int json;            /* --json */
  int port_given;      /* -p */

  ibmsg_event_loop loop;
  struct conn *conns;
  uint32_t open;       /* sockets whose connection_closed has not come */
  int stopping;        /* no more posts: an error, a signal, or done */
  int failed;          /* exit with 1 */
  uint64_t confirmed;  /* over all connections */
  uint32_t established; /* connections that were established */
  uint32_t up;         /* established and not closed */
  double t_connect;    /* the first ibmsg_connect() */
  double t_start;      /* every connection established: sending starts (0: not yet) */
  double t_end;        /* last message confirmed */
  struct tool_progress progress;
  struct tool_memwatch mem;
} g;

static void stop_all(void);

/* Posts as many of the connection's messages as it has buffers for. Runs when the connection is
 * established and after each message_sent, so the pipeline stays full without any polling. */
static void pump(struct conn *c) {
  while (!g.stopping && c->posted < c->to_send && tool_sendpool_busy(&c->pool) < g.window) {
    ibmsg_buffer *msg;
    int rc = tool_sendpool_get(&c->pool, (size_t)g.size, &msg);
    if (rc == IBMSG_EAGAIN)
      return; /* every buffer is in flight: a message_sent will call us again */
    if (rc != IBMSG_OK) {
      tool_error("connection %lu: cannot allocate a %" PRIu64 "-byte message: %s",
                 c->number, g.size, ibmsg_strerror(rc));
      g.failed = 1;
      stop_all();
      return;
    }
    tool_payload_fill(msg->data, msg->size, (uint32_t)c->number, c->posted, g.verify);
    rc = ibmsg_post_send(&c->socket, msg);
    if (rc == IBMSG_EAGAIN) {
      /* The send queue is full; nothing was sent. Keep the buffer for the next try. */
      tool_sendpool_put(&c->pool, msg);
      return;
    }
    if (rc == IBMSG_ENOTCONN && c->socket.status != IBMSG_CONNECTED) {
      /* Closing (a message confirmed during the close got us here): connection_closed comes
       * next and tells why. */
      tool_sendpool_put(&c->pool, msg);
      return;
    }
    if (rc != IBMSG_OK) {
      tool_sendpool_put(&c->pool, msg);
      tool_error("connection %lu: cannot send message %" PRIu64 ": %s", c->number,
                 c->posted, ibmsg_strerror(rc));
      g.failed = 1;
      stop_all();
      return;
    }
    c->posted++;
  }
}

/* Closes a connection once nothing more is to be sent on it. */
static void finish(struct conn *c) {
  int rc;
  c->closing = 1;
  tool_sendpool_release(&c->pool);
  rc = ibmsg_disconnect(&c->socket);
  if (rc != IBMSG_OK && rc != IBMSG_ESTATE) /* ESTATE: it is closing already */
    tool_error("connection %lu: cannot disconnect: %s", c->number, ibmsg_strerror(rc));
}

static void stop_all(void) {
  if (g.stopping)
    return;
  g.stopping = 1;
  for (uint32_t i = 0; i < g.nconns; i++)
    if (g.conns[i].open)
      finish(&g.conns[i]);
}

/* Every connection is established: each starts sending, so that all of them exchange messages
 * at once (the first ones would otherwise be done before the last ones are up). */
static void start_all(void) {
  g.t_start = tool_now();
  /* Every connection knows its number now: without -v the log lines are not needed any more
   * (with a callback, ibmsg would format each of them). */
  if (!g.verbose)
    g.loop.log = NULL;
  if (g.nconns > 1)
    tool_info(g.quiet, "all %" PRIu32 " connections established in %.3f s", g.nconns,
              g.t_start - g.t_connect);
  if (g.memory)
    tool_memwatch_sample(&g.mem, &g.loop, g.up);
  for (uint32_t i = 0; i < g.nconns && !g.stopping; i++) {
    struct conn *c = &g.conns[i];
    if (c->to_send == 0)
      finish(c);
    else
      pump(c);
  }
}

static void on_established(ibmsg_socket *socket) {
  struct conn *c = socket->user_data;
  size_t max = ibmsg_socket_max_msg_size(socket);

  c->established = 1;
  g.established++;
  g.up++;
  tool_info(g.quiet, "connection %lu to %s port %u (%s)", c->number, g.ip, g.port,
            ibmsg_socket_device(socket) ? ibmsg_socket_device(socket) : "?");
  if (g.size > max) {
    /* Ours is at least SIZE (parse_args): the receiver's is smaller. */
    tool_error("%" PRIu64 "-byte messages do not fit: the connection's maximum message size is "
               "%zu, the receiver's (its --max-size)", g.size, max);
    g.failed = 1;
    stop_all();
    return;
  }
  if (g.established == g.nconns && !g.stopping)
    start_all();
}

static void on_sent(ibmsg_socket *socket, ibmsg_buffer *msg, int status) {
  struct conn *c = socket->user_data;

  tool_sendpool_put(&c->pool, msg);
  if (status == IBMSG_ECANCELED)
    return; /* the connection is closing: connection_closed tells why */
  if (status != IBMSG_OK) {
    if (!g.failed)
      tool_error("connection %lu: a message was not delivered: %s", c->number,
                 ibmsg_strerror(status));
    g.failed = 1;
    stop_all();
    return;
  }
  c->confirmed++;
  g.confirmed++;
  g.t_end = tool_now();
  tool_progress_update(&g.progress, g.confirmed, g.confirmed * g.size);
  if (c->confirmed == c->to_send)
    finish(c);
  else
    pump(c);
}

static void on_closed(ibmsg_socket *socket, int reason) {
  struct conn *c = socket->user_data;
  char what[48];

  c->have_stats = ibmsg_socket_stats(socket, &c->stats, sizeof c->stats) == IBMSG_OK;
  c->close_reason = reason;
  if (g.verbose) {
    snprintf(what, sizeof what, "connection %lu", c->number);
    tool_print_stats(what, socket);
  }
  c->open = 0;
  g.open--;
  if (c->established)
    g.up--;
  tool_sendpool_release(&c->pool);
  if (c->confirmed == c->to_send && (reason == IBMSG_OK || reason == IBMSG_ECONNRESET))
    return; /* all delivered; who hung up first does not matter */
  if (c->closing)
    return; /* we closed it early because of an error or a signal, which was reported */

  if (!c->established) {
    /* One connection that cannot be made ends the run before anything is sent: the messages
     * are shared out over all -c connections, and fewer would measure something else. With
     * several, the line says how far the set-up got; only the first failure is reported. */
    char far[96] = "";
    if (g.nconns > 1)
      snprintf(far, sizeof far, " (%" PRIu32 " of %" PRIu32 " connections were up; nothing sent)",
               g.established, g.nconns);
    const int why = reason == IBMSG_EREJECTED && socket->reject_reason[0] != '\0';
    if (!g.failed) /* only the first failure is reported */
      tool_error("cannot connect to %s port %u: %s%s%s%s", g.ip, g.port, ibmsg_strerror(reason),
                 why ? ": " : "", why ? socket->reject_reason : "", far);
  } else {
    tool_error("connection %lu closed after %" PRIu64 " of %" PRIu64 " messages: %s",
               c->number, c->confirmed, c->to_send, ibmsg_strerror(reason));
  }
  g.failed = 1;
  stop_all();
}

/* The log callback: learns each connection's number from ibmsg's first line about it (the
 * socket's user_data is set before ibmsg_connect(), so every line finds its connection), and with
 * -v prints the lines. */
static void on_log(ibmsg_event_loop *loop, ibmsg_socket *socket, int level, const char *text) {
  if (socket != NULL && socket->user_data != NULL) {
    struct conn *c = socket->user_data;
    if (c->number == 0)
      c->number = tool_log_number(text);
  }
  if (g.verbose)
    tool_log(loop, socket, level, text);
}

static int parse_args(int argc, char **argv) {
  enum { OPT_VERIFY = 256, OPT_MAX_SIZE, OPT_EAGER_SIZE, OPT_RECV_BUDGET, OPT_MEMORY, OPT_CONNECT_TIMEOUT,
         OPT_JSON, OPT_VERSION };
  static const struct option options[] = {
      {"port", required_argument, NULL, 'p'},
      {"count", required_argument, NULL, 'n'},
      {"size", required_argument, NULL, 's'},
      {"connections", required_argument, NULL, 'c'},
      {"window", required_argument, NULL, 'W'},
      {"verify", no_argument, NULL, OPT_VERIFY},
      {"max-size", required_argument, NULL, OPT_MAX_SIZE},
      {"eager-size", required_argument, NULL, OPT_EAGER_SIZE},
      {"recv-budget", required_argument, NULL, OPT_RECV_BUDGET},
      {"memory", no_argument, NULL, OPT_MEMORY},
      {"connect-timeout", required_argument, NULL, OPT_CONNECT_TIMEOUT},
      {"json", no_argument, NULL, OPT_JSON},
      {"quiet", no_argument, NULL, 'q'},
      {"verbose", no_argument, NULL, 'v'},
      {"help", no_argument, NULL, 'h'},
      {"version", no_argument, NULL, OPT_VERSION},
      {NULL, 0, NULL, 0}};
  uint64_t v;
  int opt, count_given = 0;

  g.port = TOOL_DEFAULT_PORT;
  g.size = 4096;
  g.nconns = 1;
  opterr = 0; /* we print our own one-line errors */
  while ((opt = getopt_long(argc, argv, ":p:n:s:c:W:w:qvh", options, NULL)) != -1) {
    switch (opt) {
    case 'p':
      if (tool_parse_port("-p", optarg, 0, &g.port) != 0)
        return -1;
      g.port_given = 1;
      break;
    case 'n':
      if (tool_parse_uint("-n", optarg, 0, UINT64_MAX / 2, &g.count) != 0)
        return -1;
      count_given = 1;
      break;
    case 's':
      if (tool_parse_size("-s", optarg, 0, TOOL_MAX_MSG_SIZE, &g.size) != 0)
        return -1;
      break;
    case 'c':
      if (tool_parse_uint("-c", optarg, 1, 65536, &v) != 0)
        return -1;
      g.nconns = (uint32_t)v;
      break;
    case 'W':
    case 'w': /* the old letter of --window: ibmsg-perf's -w is --warmup, its -W --window */
      if (tool_parse_uint(opt == 'W' ? "-W" : "-w", optarg, 1, MAX_WINDOW, &g.window) != 0)
        return -1;
      break;
    case OPT_JSON: g.json = 1; break;
    case OPT_VERIFY: g.verify = 1; break;
    case OPT_MEMORY: g.memory = 1; break;
    case OPT_CONNECT_TIMEOUT:
      if (tool_parse_uint("--connect-timeout", optarg, 1, INT_MAX, &g.connect_timeout) != 0)
        return -1;
      break;
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
    if (tool_parse_port("PORT", argv[optind++], 0, &g.port) != 0)
      return -1;
  }
  if (optind < argc) {
    tool_usage_error("unexpected argument '%s'", argv[optind]);
    return -1;
  }
  if (g.max_size != 0 && g.max_size < g.size) {
    tool_usage_error("-s %" PRIu64 " is larger than --max-size %" PRIu64, g.size, g.max_size);
    return -1;
  }
  if (!count_given) {
    g.count = g.size > 0 ? DEFAULT_BYTES / g.size : DEFAULT_COUNT;
    if (g.count > DEFAULT_COUNT)
      g.count = DEFAULT_COUNT;
    if (g.count < 1)
      g.count = 1;
  }
  return 0;
}

/* The window. Without -w: the send depth, or fewer so that all connections together keep about
 * ALL_WINDOW_BYTES of buffers in flight (at least MIN_WINDOW each), and a connection at most
 * SEND_WINDOW_BYTES (at least one message). A -w above the send depth raises the send depth and
 * the send queue to it, or the pool would not have the buffers. */
static int set_window(void) {
  int depth = 0, queue = 0, eager = 0;
  size_t len = sizeof depth;
  uint64_t w;
  int rc = ibmsg_getopt(&g.loop, IBMSG_OPT_SEND_DEPTH, &depth, &len);
  if (rc == IBMSG_OK) {
    len = sizeof queue;
    rc = ibmsg_getopt(&g.loop, IBMSG_OPT_SEND_QUEUE, &queue, &len);
  }
  if (rc == IBMSG_OK) {
    len = sizeof eager;
    rc = ibmsg_getopt(&g.loop, IBMSG_OPT_EAGER_SIZE, &eager, &len);
  }
  if (rc != IBMSG_OK) {
    tool_error("cannot read the loop's options: %s", ibmsg_strerror(rc));
    return -1;
  }
  if (g.window != 0) {
    if (g.window > (uint64_t)depth &&
        tool_setopt_int(&g.loop, IBMSG_OPT_SEND_DEPTH, "the send buffers per connection",
                        (int)g.window) != 0)
      return -1;
    if (g.window > (uint64_t)queue &&
        tool_setopt_int(&g.loop, IBMSG_OPT_SEND_QUEUE, "the send queue", (int)g.window) != 0)
      return -1;
    return 0;
  }
  w = tool_window_share(ALL_WINDOW_BYTES, g.nconns, g.size, (uint64_t)(eager > 0 ? eager : 0),
                        MIN_WINDOW, (uint64_t)(depth > 0 ? depth : 1));
  if (g.size > 0 && w > SEND_WINDOW_BYTES / g.size)
    w = SEND_WINDOW_BYTES / g.size > 0 ? SEND_WINDOW_BYTES / g.size : 1;
  g.window = w;
  return 0;
}

/* --json: one object on stdout, whatever the outcome. */
static void print_json(void) {
  double seconds = g.confirmed > 0 ? g.t_end - g.t_start : 0.0;
  uint64_t bytes = g.confirmed * g.size;

  printf("{\n  \"tool\": \"ibmsg-send\",\n  \"version\": ");
  tool_json_string(stdout, ibmsg_version_string());
  printf(",\n  \"peer\": {\"address\": ");
  tool_json_string(stdout, g.ip);
  printf(", \"port\": %u},\n", g.port);
  printf("  \"size\": %" PRIu64 ",\n  \"count\": %" PRIu64 ",\n  \"connections\": %" PRIu32
         ",\n  \"window\": %" PRIu64 ",\n  \"verify\": %s,\n  \"established\": %" PRIu32 ",\n",
         g.size, g.count, g.nconns, g.window, g.verify ? "true" : "false", g.established);
  printf("  \"messages\": %" PRIu64 ",\n  \"bytes\": %" PRIu64 ",\n  \"seconds\": %.6f,\n"
         "  \"mb_per_s\": %.3f,\n  \"msg_per_s\": %.1f,\n",
         g.confirmed, bytes, seconds, seconds > 0 ? (double)bytes / seconds / 1e6 : 0.0,
         seconds > 0 ? (double)g.confirmed / seconds : 0.0);
  printf("  \"per_connection\": [");
  for (uint32_t i = 0; g.conns != NULL && i < g.nconns; i++) {
    const struct conn *c = &g.conns[i];
    printf("%s\n    {\"connection\": ", i ? "," : "");
    if (c->number > 0)
      printf("%lu", c->number);
    else
      printf("null");
    printf(", \"established\": %s, \"to_send\": %" PRIu64 ", \"messages\": %" PRIu64
           ", \"close\": ", c->established ? "true" : "false", c->to_send, c->confirmed);
    tool_json_string(stdout, c->open ? NULL : ibmsg_err_name(c->close_reason));
    printf(", \"stats\": ");
    if (c->have_stats)
      tool_json_stats(stdout, &c->stats);
    else
      printf("null");
    putchar('}');
  }
  printf("%s],\n", g.conns != NULL && g.nconns > 0 ? "\n  " : "");
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

/* A failure before any connection: the error was printed; with --json the object says it too. */
static int fail_early(void) {
  g.failed = 1;
  if (g.json)
    print_json();
  return TOOL_EXIT_FAILURE;
}

int main(int argc, char **argv) {
  int rc;
  char extra[128];

  tool_name = "ibmsg-send";
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (parse_args(argc, argv) != 0)
    return TOOL_EXIT_USAGE;
  if (g.json)
    tool_json_mode();
  tool_catch_signals();
  tool_progress_init(&g.progress, g.quiet);

  rc = ibmsg_init_event_loop(&g.loop);
  if (rc != IBMSG_OK) {
    tool_error("cannot create the event loop: %s", ibmsg_strerror(rc));
    return fail_early();
  }
  g.loop.connection_established = on_established;
  g.loop.message_sent = on_sent;
  g.loop.connection_closed = on_closed;
  g.loop.log = on_log;
  if ((g.max_size != 0 && tool_setopt_max_size(&g.loop, g.max_size) != 0) ||
      (g.eager_size != 0 && tool_setopt_int(&g.loop, IBMSG_OPT_EAGER_SIZE, "the eager size",
                                            (int)g.eager_size) != 0) ||
      (g.recv_budget_given && tool_setopt_u64(&g.loop, IBMSG_OPT_SHARED_RECV_BUDGET,
                                             "the receive budget", g.recv_budget) != 0) ||
      (g.connect_timeout != 0 &&
       tool_setopt_int(&g.loop, IBMSG_OPT_CONNECT_TIMEOUT, "the connect timeout",
                       (int)g.connect_timeout) != 0) ||
      set_window() != 0) {
    ibmsg_destroy_event_loop(&g.loop);
    return fail_early();
  }

  g.conns = calloc(g.nconns, sizeof *g.conns);
  if (g.conns == NULL) {
    tool_error("out of memory for %" PRIu32 " connections", g.nconns);
    ibmsg_destroy_event_loop(&g.loop);
    return fail_early();
  }
  g.t_connect = tool_now();
  for (uint32_t i = 0; i < g.nconns && !g.stopping; i++) {
    struct conn *c = &g.conns[i];
    c->index = i;
    /* An equal share of COUNT each; each connection numbers its own messages from 0. */
    c->to_send = g.count / g.nconns + (i < g.count % g.nconns ? 1 : 0);
    c->socket.user_data = c; /* before the connect: ibmsg's log lines about it find it */
    rc = tool_sendpool_init(&c->pool, &c->socket, &g.loop);
    if (rc != IBMSG_OK) {
      tool_error("cannot make the send buffer list: %s", ibmsg_strerror(rc));
      g.failed = 1;
      stop_all();
      break;
    }
    rc = ibmsg_connect(&g.loop, &c->socket, g.ip, g.port);
    if (rc != IBMSG_OK) {
      tool_error("cannot connect to %s port %u: %s", g.ip, g.port, ibmsg_strerror(rc));
      g.failed = 1;
      stop_all();
      break;
    }
    c->open = 1;
    g.open++;
  }

  /* Run until every socket has closed; the callbacks do the work. */
  while (g.open > 0) {
    rc = ibmsg_dispatch_event_loop_timeout(&g.loop, TOOL_TICK_MS);
    if (rc != IBMSG_OK) {
      tool_error("event loop failed: %s", ibmsg_strerror(rc));
      g.failed = 1;
      break; /* cannot wait for the sockets without a loop */
    }
    if (tool_stop && !g.stopping) {
      tool_error("interrupted after %" PRIu64 " of %" PRIu64 " messages", g.confirmed, g.count);
      g.failed = 1;
      stop_all();
    }
    tool_progress_update(&g.progress, g.confirmed, g.confirmed * g.size);
    if (g.memory && g.up > 0)
      tool_memwatch_tick(&g.mem, &g.loop, g.up, MEMORY_INTERVAL_S);
  }
  snprintf(extra, sizeof extra,
           "%" PRIu32 " connection%s, window %" PRIu64 ", %" PRIu64 "-byte messages%s", g.nconns,
           g.nconns == 1 ? "" : "s", g.window, g.size, g.verify ? ", with --verify pattern" : "");
  /* Without a connection the error line said it all. */
  if (g.established > 0)
    tool_print_summary("sent", g.confirmed, g.confirmed * g.size,
                       g.confirmed > 0 ? g.t_end - g.t_start : 0.0, extra);
  if (g.memory)
    tool_memwatch_print(&g.mem);

  if (g.open == 0) {
    rc = ibmsg_destroy_event_loop(&g.loop);
    if (rc != IBMSG_OK) {
      tool_error("cannot destroy the event loop: %s", ibmsg_strerror(rc));
      g.failed = 1;
    }
  }
  if (g.json)
    print_json();
  for (uint32_t i = 0; i < g.nconns; i++)
    tool_sendpool_destroy(&g.conns[i].pool);
  free(g.conns);
  return g.failed ? TOOL_EXIT_FAILURE : TOOL_EXIT_OK;
}
