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
 *   bandwidth  the client keeps a window of messages posted and not yet sent (its send buffers,
 *              IBMSG_OPT_SEND_DEPTH of them, are posted again from their message_sent
 *              callbacks), on each of -c connections of its one loop; the clock runs from the
 *              first timed post (once every connection's warm-up has drained) to the last
 *              message_sent of all. The server answers each connection's last message with a
 *              DONE message carrying its count, so no message goes unaccounted.
 *   rpc        requests and replies: the client keeps --outstanding requests posted with
 *              ibmsg_post_request() and not yet answered, posting the next one from each done
 *              callback; the server answers each request from message_received with
 *              ibmsg_post_reply() (a reply of the same size; when no send buffer is free it keeps
 *              the request until one is). Each request's round trip is timed from its posting
 *              call to its done callback; the rate is the timed requests over the time from the
 *              first timed post (once the warm-up has drained) to the last done callback. A
 *              request without its reply within RPC_TIMEOUT_MS fails the test.
 * Messages above the eager size (IBMSG_OPT_EAGER_SIZE), requests and replies among them, go by
 * rendezvous: the receiver reads each one from the sender's buffer, and its message_sent comes
 * once it has been read. Each such message in flight has a registered buffer of its own size on
 * both sides, so without -W the bandwidth test's window holds at most MSG_WINDOW_BYTES (and at
 * least 2 messages), and the client allocates the window's send buffers before the clock
 * starts; rpc's requests and replies take their buffers from the send pools as they go.
 * The one-sided RDMA tests (write_lat, read_lat, atomic_lat, write_bw, read_bw) use messages only
 * to set up: the server answers the HELLO with a DESC message carrying a descriptor of a region it
 * allocated for the test and, apart from answering write_lat's writes, only runs its loop; the
 * client does the operations:
 *   write_lat  a ping-pong of RDMA writes with immediate: each side writes into the other's
 *              region (the client's descriptor rides in its HELLO) and answers the peer's write
 *              from its write_received callback; one-way latency = round trip / 2, as perftest's
 *              ib_write_lat reports it (there both sides poll the last byte in memory instead).
 *   read_lat,  one RDMA read (or 8-byte fetch-and-add) at a time, timed from the posting call to
 *   atomic_lat its done callback, as ib_read_lat and ib_atomic_lat report them (not halved).
 *   write_bw,  a window of operations in flight (--window, as perftest's --tx-depth), each one
 *   read_bw    posted again from its done callback; the clock runs from the first timed post to
 *              the last done callback.
 * A few untimed warm-up iterations come first. --busy-poll and --poll-us set IBMSG_OPT_BUSY_POLL
 * on the loop, for the connections of whichever side is given them: a connection's options are
 * fixed when it is accepted, before the HELLO could say anything, so the server polls only when
 * it was started with the option itself. The report ends with what a client connection costs
 * (ibmsg_socket_memory, the most seen once it is established and when its test finished). Because the ibmsg callbacks belong to the loop,
 * not to a socket, each socket's user_data says which role it plays, and one set of callbacks
 * serves the server side and the client side alike: that is what makes --loopback possible.
 */
#define _POSIX_C_SOURCE 200809L

#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <ibmsg.h>

#include "tool.h"

static const char usage_text[] =
    "Usage: ibmsg-perf [OPTIONS] IP\n"
    "       ibmsg-perf --server [OPTIONS] [IP]\n"
    "       ibmsg-perf --loopback [OPTIONS] IP\n"
    "Measure ibmsg's latency, message rate and bandwidth, with messages or with\n"
    "one-sided RDMA, against an ibmsg-perf server at IP, or serve such tests, or\n"
    "run both sides in one process.\n"
    "\n"
    "Modes:\n"
    "      --server          serve tests until interrupted, on IP or on all\n"
    "                        addresses\n"
    "      --loopback        listen on IP and run the tests against ourselves\n"
    "\n"
    "Options:\n"
    "  -p, --port PORT       the server's port (default 12345; with --loopback\n"
    "                        any free port; with --server, 0 picks a free port,\n"
    "                        shown in the 'listening' line)\n"
    "  -t, --test TESTS      comma-separated tests (default lat,bw):\n"
    "                          lat         message latency (ping-pong)\n"
    "                          bw          message bandwidth\n"
    "                          rpc         request/reply round trip and rate\n"
    "                                      (ibmsg_post_request, post to done)\n"
    "                          write_lat   RDMA write latency (write-with-immediate\n"
    "                                      ping-pong)\n"
    "                          read_lat    RDMA read latency (post to done)\n"
    "                          atomic_lat  fetch-and-add latency (8 bytes, post to\n"
    "                                      done)\n"
    "                          write_bw    RDMA write bandwidth\n"
    "                          read_bw     RDMA read bandwidth\n"
    "                          send        lat and bw\n"
    "                          rdma        the five RDMA tests\n"
    "                          all         every test (send, rpc and rdma)\n"
    "  -s, --sizes SIZES     comma-separated message sizes in bytes, up to\n"
    "                        4294967295 (default 64,4096,65536)\n"
    "  -n, --iters N         timed iterations per test (default 1000)\n"
    "  -D, --duration SECONDS\n"
    "                        run each test for SECONDS after its warm-up instead\n"
    "                        of -n iterations (as perftest's -D, iperf3's -t)\n"
    "  -i, --interval SECONDS\n"
    "                        report every SECONDS on stderr: one line per\n"
    "                        interval with the rate in it\n"
    "  -w, --warmup N        untimed iterations before each test (default 32)\n"
    "  -W, --window N        RDMA operations in flight in write_bw and read_bw\n"
    "                        (1..4096, default 128, like perftest's tx depth);\n"
    "                        messages posted and not yet sent per connection in\n"
    "                        bw (default 32, ibmsg's send depth, or as many as\n"
    "                        256 MiB hold for larger messages, at least 2; with\n"
    "                        -c, as many as 64 MiB hold for all connections,\n"
    "                        each message counted at least the eager size, at\n"
    "                        least 1)\n"
    "  -o, --outstanding N   requests posted and not yet answered in rpc\n"
    "                        (1..4096, default 1)\n"
    "  -c, --connections N   connections of the bw test, all on the client's one\n"
    "                        loop; it reports their aggregate rate (1..65536,\n"
    "                        default 1); server: the most connections it serves\n"
    "                        at once (default 1024)\n"
    "  -T, --threads N       server: N event loops on N threads, the connections\n"
    "                        spread over them in turn (ibmsg_accept_on); prints\n"
    "                        each thread's connections at exit (1..16, default 1)\n"
    "      --busy-poll       poll the completion queues and never sleep\n"
    "                        (IBMSG_OPT_BUSY_POLL always); the server polls only\n"
    "                        if it is given this option too\n"
    "      --poll-us N       adaptive polling: poll for N microseconds after a\n"
    "                        connection's last activity, then sleep until the\n"
    "                        next completion event (0: events only, the default);\n"
    "                        give it to the server too\n"
    "      --max-size BYTES  largest message size, up to 4294967295 (default: the\n"
    "                        library's, 4294967295; the client takes at least\n"
    "                        the largest of SIZES); give it to the server too\n"
    "      --eager-size BYTES\n"
    "                        largest message sent eagerly, through the\n"
    "                        connection's buffers (1..1G, default: the library's,\n"
    "                        16384); larger ones go by rendezvous: the receiver\n"
    "                        reads them from the sender's buffer; give it to the\n"
    "                        server too\n"
    "      --recv-budget BYTES\n"
    "                        for many connections: about the most receive buffers\n"
    "                        their idle connections reserve on this side; new\n"
    "                        ones get smaller eager sizes past it (ibmsg's\n"
    "                        IBMSG_OPT_SHARED_RECV_BUDGET; default: ibmsg's,\n"
    "                        32M; 0: none)\n"
    "      --memory          print the peak RSS and the registered memory\n"
    "                        (ibmsg_loop_memory) at the end (the server: when it\n"
    "                        stops); not with --threads\n"
    "      --json            print the results as one JSON document, also when a\n"
    "                        test failed (what was measured, and the error)\n"
    "  -q, --quiet           print only the results and errors\n"
    "  -h, --help            print this help and exit\n"
    "      --version         print the version and exit\n"
    "\n"
    "Sizes may end in K, M or G (times 1024, 1024^2, 1024^3). Latency is in\n"
    "microseconds: one way (round trip / 2) for lat and write_lat, post to done for\n"
    "read_lat, atomic_lat and rpc (a request's whole round trip). MB/s is 10^6\n"
    "bytes per second in every table, the JSON and the --interval lines (before\n"
    "1.7 the RDMA tables showed MiB/s, 2^20 bytes per second, what perftest calls\n"
    "MB/sec); Mpps is 10^6 messages or operations per second; req/s is requests\n"
    "answered per second (rpc). Completions: events unless --busy-poll or\n"
    "--poll-us (perftest busy-polls by default); the output says which.\n"
    "Exit status: 0 on success, 1 on an error, 2 on bad usage.\n";

#define MAX_SIZES 64
/* A test whose peer says nothing for this long has failed (for example, the peer is not an
 * ibmsg-perf server). */
#define IDLE_TIMEOUT_S 10.0
/* How long the tool waits for sockets to close at the end. */
#define CLOSE_TIMEOUT_S 5.0
/* The most connections of the bw test (-c), as ibmsg-send's; a server serves at most
 * DEFAULT_SERVER_CONNS at once unless its own -c says more (up to MAX_CONNS). */
#define MAX_CONNS 65536
#define DEFAULT_SERVER_CONNS 1024
/* The server's loops (--threads), each on a thread of its own. */
#define MAX_THREADS 16
/* The bandwidth test's window without -W: ibmsg's default send depth, which is left as it is,
 * but for messages so large that fewer of them hold MSG_WINDOW_BYTES (each one in flight has a
 * registered buffer of its size on either side), and at least MIN_MSG_WINDOW: 4 of 64 MiB. */
#define DEFAULT_MSG_WINDOW 32
#define MSG_WINDOW_BYTES (UINT64_C(256) << 20)
#define MIN_MSG_WINDOW 2
/* With many connections (-c) and no -W, the window of each is cut so that all of them together
 * hold at most ALL_WINDOW_BYTES of send buffers (each at least the eager size), down to
 * MIN_CONN_WINDOW: 10000 connections of 32 eager buffers of 16 KiB would hold 5 GiB. From 128
 * connections of 16 KiB on (1000: 4 each). */
#define ALL_WINDOW_BYTES (UINT64_C(64) << 20)
#define MIN_CONN_WINDOW 1
/* The largest IBMSG_OPT_MAX_MSG_SIZE (2^32 - 1) and IBMSG_OPT_EAGER_SIZE (2^30). */
#define PERF_MAX_MSG_SIZE UINT64_C(4294967295)
#define PERF_MAX_EAGER_SIZE (UINT64_C(1) << 30)
/* rpc: a request's timeout (ibmsg_post_request); one that runs out fails the test. */
#define RPC_TIMEOUT_MS 10000
/* rpc: the most requests outstanding (--outstanding); beyond ibmsg's default send depth the
 * client raises IBMSG_OPT_SEND_DEPTH and IBMSG_OPT_SEND_QUEUE to it. */
#define MAX_OUTSTANDING 4096

/* The tests; the values are also their numbers in the HELLO message. */
enum test {
  TEST_LAT = 1,         /* message ping-pong */
  TEST_BW = 2,          /* messages, as many in flight as ibmsg takes */
  TEST_WRITE_LAT = 4,   /* RDMA write-with-immediate ping-pong */
  TEST_READ_LAT = 8,    /* one RDMA read at a time */
  TEST_ATOMIC_LAT = 16, /* one fetch-and-add at a time */
  TEST_WRITE_BW = 32,   /* RDMA writes, a window in flight */
  TEST_READ_BW = 64,    /* RDMA reads, a window in flight */
  TEST_RPC = 128        /* requests and replies, --outstanding of them in flight */
};
#define TESTS_SEND (TEST_LAT | TEST_BW)
/* The tests that send messages of their size. */
#define TESTS_MESSAGES (TESTS_SEND | TEST_RPC)
#define TESTS_RDMA (TEST_WRITE_LAT | TEST_READ_LAT | TEST_ATOMIC_LAT | TEST_WRITE_BW | TEST_READ_BW)
#define TESTS_LATENCY (TEST_LAT | TEST_WRITE_LAT | TEST_READ_LAT | TEST_ATOMIC_LAT)

/* The tests in the order they run, with their names (-t, JSON) and table titles. */
static const struct test_info {
  int test;
  const char *name;
  const char *title;
  double us_per_s; /* latency: from a timed interval in seconds to the reported microseconds */
} test_infos[] = {
    {TEST_LAT, "lat", "ibmsg Send Latency Test (one way = RTT/2)", 0.5e6},
    {TEST_BW, "bw", "ibmsg Send Bandwidth Test", 0},
    {TEST_RPC, "rpc", "ibmsg Request/Reply Test (round trip = post to done)", 1e6},
    {TEST_WRITE_LAT, "write_lat",
     "ibmsg RDMA Write Latency Test (write-imm ping-pong, one way = RTT/2)", 0.5e6},
    {TEST_READ_LAT, "read_lat", "ibmsg RDMA Read Latency Test (post to done)", 1e6},
    {TEST_ATOMIC_LAT, "atomic_lat", "ibmsg Atomic Fetch-and-Add Latency Test (post to done)", 1e6},
    {TEST_WRITE_BW, "write_bw", "ibmsg RDMA Write Bandwidth Test", 0},
    {TEST_READ_BW, "read_bw", "ibmsg RDMA Read Bandwidth Test", 0},
};
#define NTESTS (int)(sizeof test_infos / sizeof test_infos[0])

static const struct test_info *info_of(int test) {
  for (int i = 0; i < NTESTS; i++)
    if (test_infos[i].test == test)
      return &test_infos[i];
  return NULL;
}

/* The remote right an RDMA test needs on the server's region. */
static unsigned right_of(int test) {
  switch (test) {
  case TEST_READ_LAT:
  case TEST_READ_BW: return IBMSG_ACCESS_REMOTE_READ;
  case TEST_ATOMIC_LAT: return IBMSG_ACCESS_REMOTE_ATOMIC;
  default: return IBMSG_ACCESS_REMOTE_WRITE;
  }
}

/* Bytes an RDMA test touches: an atomic works on one 8-byte word whatever the size. */
static uint64_t rdma_bytes(int test, uint64_t size) {
  return test == TEST_ATOMIC_LAT || size < 8 ? 8 : size;
}

/* ---- the messages that control a test --------------------------------------------------------
 * Fixed little-endian layouts, so that client and server need not be the same build. */
#define HELLO_SIZE 32 /* "ibmsgprf", u32 version, u32 test, u64 size, u64 count */
/* write_lat: the HELLO goes on with the client's descriptor (the server's writes go there) */
#define HELLO_DESC_SIZE (HELLO_SIZE + IBMSG_DESCRIPTOR_SIZE)
#define DESC_SIZE (8 + IBMSG_DESCRIPTOR_SIZE) /* RDMA tests: "ibmsgdsc", the server's descriptor */
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
  struct perf_loop *home; /* the loop it was accepted onto, whose thread serves it */
  int started;            /* session_start() ran on that thread */
  int call_pending;       /* session_start_call() is posted and has not run: it frees a
                             session that ended before it (free_at_call) */
  int free_at_call;
  int closed_early;       /* its connection_closed came before session_start() */
  int early_reason;
  struct endpoint *next, *prev; /* its loop's sessions */
  char peer[64];
  unsigned short peer_port;
  int have_hello;
  int test;
  uint64_t size, count, received;
  uint64_t echoes_owed; /* latency: echoes to post once a send buffer is free */
  int done_owed;        /* bandwidth: the DONE message is due */
  int failed;           /* reported; the session is closing */
  /* rpc: the requests not yet answered (held: each keeps its receive credit), first come first
   * answered: held[held_first..nheld). */
  ibmsg_buffer **held;
  size_t nheld, held_first, held_cap;

  /* RDMA tests: the region the client works on, and what it needs to know of it. */
  ibmsg_region region;
  int have_region;
  ibmsg_descriptor desc; /* ours, sent in the DESC message */
  int desc_owed;         /* the DESC message is due */
  ibmsg_descriptor peer_desc; /* write_lat: the client's region, where our answers go */
  uint64_t echoed;            /* write_lat: answers posted */
  ibmsg_op ops[2];            /* write_lat: an answer may be posted before the last one's done */
};

/* One of the client's connections for the test running now: one, or -c of them for bw. */
struct conn {
  struct endpoint ep; /* first: the callbacks' socket pointer is the connection's */
  int established;
  int closed;
  int close_reason;
  ibmsg_buffer hello; /* the HELLO message: a buffer of its own, freed at its message_sent */
  int hello_sent;
  uint64_t posted, sent, received;
  uint64_t server_count; /* bandwidth: from DONE */
  double t_done;         /* bandwidth: its last message_sent */
  uint64_t total;        /* its iterations, warm-up included: the test's, or with --duration
                            UINT64_MAX until the time is up, then the ones it posted */
  int all_in;            /* everything of it is done (client_check_conn) */
};

/* The client's connection of an endpoint whose role is ROLE_CLIENT. */
static struct conn *conn_of(struct endpoint *e) { return (struct conn *)e; }

/* rpc: one of the client's requests. The request comes first: the done callback's request
 * pointer is the slot's. */
struct rpc_slot {
  ibmsg_request req;
  uint64_t index; /* the request's number in the test: below the warm-up it is untimed */
  double t_post;  /* when it was posted */
  int posted;     /* its done callback is due */
};

/* The client's side of the test running now. */
static struct {
  struct conn *conns;   /* nconns of them, allocated for the test */
  int nconns;
  int nopen;            /* connections whose ep.open is set */
  int nclosed;          /* connections whose connection_closed came */
  int nestablished;     /* connections established */
  int nall_in;          /* connections whose all_in is set: the test is finished at nconns */
  int test;
  uint64_t size, warmup, iters, total;
  uint64_t window;      /* bandwidth: messages posted and not yet sent, per connection */
  double t_post;        /* latency: when the ping in flight was posted */
  double *rtt;          /* latency: the timed round trips, in seconds */
  double t_start, t_end;
  int hellos_sent;       /* bandwidth: connections whose HELLO went */
  uint64_t sent_all;     /* bandwidth: message_sent callbacks of all connections */
  int conns_done;        /* bandwidth: connections whose last message_sent came */
  size_t rtt_cap;        /* latency: room in rtt (--duration: it grows) */
  int stopped;           /* --duration: the time is up, no more posts */
  double t_last_report;  /* --interval: the last report (or the timed part's start) */
  uint64_t done_last_report; /* --interval: timed iterations done then */
  double next_report;    /* --interval: when the next report is due */
  int finished;          /* all iterations done (and DONE came) */
  int failed;            /* reported */
  uint64_t activity; /* client callbacks so far: progress, without reading the clock */

  /* RDMA tests (always one connection, conns[0]): "received" counts the finished iterations of
   * a latency test and "sent" the done callbacks of a bandwidth test. */
  ibmsg_region region; /* ours: the source or destination of the operations */
  int have_region;
  ibmsg_descriptor remote; /* the server's region, from its DESC message */
  int have_remote;
  ibmsg_op *ops;       /* window (bandwidth) or 2 (latency) */
  ibmsg_op **free_ops; /* the ops that are not posted */
  size_t nops, nfree;

  /* rpc (one connection, conns[0]): "posted" counts the requests posted, "received" those
   * answered and "sent" their message_sent callbacks. */
  struct rpc_slot *reqs;       /* --outstanding of them */
  struct rpc_slot **free_reqs; /* the ones not posted (their done callback came) */
  size_t nreqs, nfree_reqs;
} cl;

struct lat_result {
  int test;
  uint64_t size, iters;
  double min, median, avg, p99, p999, max; /* microseconds */
};

struct bw_result {
  int test;
  uint64_t size, iters, window, conns; /* iterations per connection */
  double seconds, mbps, mpps;          /* all connections together; MB/s: 10^6 bytes/s */
  double *conn_mps;                    /* bw: each connection's messages per second (conns) */
};

struct rpc_result {
  struct lat_result lat; /* the round trips */
  uint64_t outstanding;
  double seconds, rate; /* rate: requests answered per second */
};

static struct {
  /* options */
  int server, loopback;
  const char *ip;
  unsigned short port;
  int port_given;
  int tests; /* enum test flags */
  uint64_t sizes[MAX_SIZES];
  int nsizes;
  uint64_t iters, warmup, max_size, eager_size, window, msg_window, conns, outstanding, threads_arg;
  int max_size_given, eager_size_given, window_given, conns_given;
  uint64_t recv_budget; /* --recv-budget (0: none) */
  int recv_budget_given;
  int memory;           /* --memory */
  struct tool_memwatch mem; /* --memory: the main loop's, sampled as connections come */
  int busy_poll; /* IBMSG_OPT_BUSY_POLL: 0, microseconds, or IBMSG_BUSY_POLL_ALWAYS */
  int busy_poll_given;
  int json, quiet;
  uint64_t duration;  /* --duration: seconds per test (0: -n iterations) */
  uint64_t interval;  /* --interval: seconds between reports on stderr (0: none) */
  int iters_given;

  /* The test that failed, for the JSON: its name, size and timed iterations done. */
  const char *failed_test;
  uint64_t failed_size, failed_done;

  ibmsg_event_loop loop;
  struct endpoint listener;
  int threads;              /* --threads: the server's loops */
  unsigned next_loop;       /* the loop the next connection goes to (round robin) */
  int loop_failed;          /* a loop's thread stopped on an error */
  int server_quiet;          /* no line per session (--loopback: the client reports) */
  char device[64];

  ibmsg_memory conn_memory; /* the client's connections: the most of each field seen */
  int have_conn_memory;

  struct lat_result lat[4 * MAX_SIZES];
  struct bw_result bw[3 * MAX_SIZES];
  struct rpc_result rpc[MAX_SIZES];
  int nlat, nbw, nrpc;
  int header_test; /* the test whose table is being printed */
} g;

/* ---- the server's loops ---------------------------------------------------------------------- */

/* One of the server's loops: the first is g.loop, run by the main thread with the listener;
 * with --threads N the others run on threads of their own, each serving the sessions accepted
 * onto it (ibmsg_accept_on()). The only calls between the threads go through
 * ibmsg_event_loop_call(): a session handed to its loop (session_start), the stop, and a
 * failure reported to the main thread. Everything else in it belongs to its own thread. */
struct perf_loop {
  ibmsg_event_loop *loop;
  ibmsg_event_loop own; /* the loop of the others */
  int index;            /* 1..N, for the messages */
  struct endpoint *sessions; /* open server-side connections */
  uint64_t nsessions;        /* how many */
  uint64_t established;      /* connections established on it */
  int stop;                  /* told to close its sessions and end */
  pthread_t thread;
  int running;          /* the thread was started and not yet joined */
  int failed;           /* its thread ended on an error */
};

static struct perf_loop loops[MAX_THREADS];

/* ---- the server side ------------------------------------------------------------------------- */

/* rpc: gives back the requests not answered (their retries, if any, would time out). */
static void session_drop_held(struct endpoint *s) {
  while (s->held_first < s->nheld)
    ibmsg_free_msg(s->held[s->held_first++]);
  free(s->held);
  s->held = NULL;
  s->nheld = s->held_first = s->held_cap = 0;
}

static void session_fail(struct endpoint *s, const char *what, int code) {
  /* A session whose client already hung up cannot send: that is no error worth a line. */
  int quiet = s->failed || s->socket.status == IBMSG_DISCONNECTING ||
              s->socket.status == IBMSG_UNCONNECTED || s->socket.status == IBMSG_ERROR;
  if (!quiet && code != IBMSG_OK)
    tool_error("client %s port %u: %s: %s", s->peer, s->peer_port, what, ibmsg_strerror(code));
  else if (!quiet)
    tool_error("client %s port %u: %s", s->peer, s->peer_port, what);
  s->failed = 1;
  session_drop_held(s);
  tool_sendpool_release(&s->pool);
  ibmsg_disconnect(&s->socket); /* IBMSG_ESTATE when it is closing already: fine */
}

/* rpc: keeps a request until its reply is posted. 0, or -1 after failing the session. */
static int session_hold(struct endpoint *s, ibmsg_buffer *msg) {
  if (s->nheld == s->held_cap && s->held_first > 0) {
    memmove(s->held, s->held + s->held_first, (s->nheld - s->held_first) * sizeof *s->held);
    s->nheld -= s->held_first;
    s->held_first = 0;
  }
  if (s->nheld == s->held_cap) {
    size_t cap = s->held_cap > 0 ? 2 * s->held_cap : 32;
    ibmsg_buffer **held = realloc(s->held, cap * sizeof *held);
    if (held == NULL) {
      session_fail(s, "out of memory for the requests", IBMSG_ENOMEM);
      return -1;
    }
    s->held = held;
    s->held_cap = cap;
  }
  s->held[s->nheld++] = msg;
  return 0;
}

/* rpc: answers the requests held, first come first answered, as far as send buffers allow;
 * runs again from message_sent when they do not. A reply has the request's size (the test's);
 * its content does not matter, as an echo's. */
static void session_pump_replies(struct endpoint *s) {
  while (!s->failed && s->held_first < s->nheld) {
    ibmsg_buffer *request = s->held[s->held_first], *msg;
    int rc = tool_sendpool_get(&s->pool, (size_t)s->size, &msg);
    if (rc == IBMSG_EAGAIN)
      return;
    if (rc != IBMSG_OK) {
      session_fail(s, "cannot allocate a message", rc);
      return;
    }
    rc = ibmsg_post_reply(&s->socket, request, msg);
    if (rc == IBMSG_EAGAIN) {
      tool_sendpool_put(&s->pool, msg);
      return;
    }
    if (rc != IBMSG_OK) {
      tool_sendpool_put(&s->pool, msg);
      session_fail(s, "cannot post a reply", rc);
      return;
    }
    s->held_first++;
    ibmsg_free_msg(request);
  }
}

static void session_op_done(ibmsg_socket *socket, ibmsg_op *op, int status);

/* write_lat: posts the answers that are due, as far as the ops allow; runs again from their done
 * callbacks when they do not. */
static void session_pump_writes(struct endpoint *s) {
  while (!s->failed && s->echoes_owed > 0) {
    ibmsg_op *op = NULL;
    for (int i = 0; i < 2 && op == NULL; i++)
      if (s->ops[i].status != IBMSG_EINPROGRESS)
        op = &s->ops[i];
    if (op == NULL)
      return;
    op->done = session_op_done;
    op->user_data = s;
    int rc = ibmsg_rdma_write_imm(&s->socket, op, &s->region, 0, (size_t)s->size, &s->peer_desc,
                                  0, (uint32_t)s->echoed);
    if (rc == IBMSG_EAGAIN)
      return;
    if (rc != IBMSG_OK) {
      session_fail(s, "cannot post an RDMA write", rc);
      return;
    }
    s->echoed++;
    s->echoes_owed--;
  }
}

/* Posts the DESC message, the echoes and the DONE message that are due, as far as send buffers
 * allow; runs again from message_sent when they do not. write_lat's answers are RDMA writes. */
static void session_pump(struct endpoint *s) {
  int rdma = (s->test & TESTS_RDMA) != 0;
  ibmsg_buffer *msg;
  int rc;

  if (s->test == TEST_RPC) {
    session_pump_replies(s);
    return;
  }
  while (!s->failed && (s->desc_owed || (!rdma && (s->echoes_owed > 0 || s->done_owed)))) {
    size_t size = s->desc_owed ? DESC_SIZE : s->echoes_owed > 0 ? (size_t)s->size : DONE_SIZE;
    rc = tool_sendpool_get(&s->pool, size, &msg);
    if (rc == IBMSG_EAGAIN)
      return;
    if (rc != IBMSG_OK) {
      session_fail(s, "cannot allocate a message", rc);
      return;
    }
    if (s->desc_owed) {
      memcpy(msg->data, "ibmsgdsc", 8);
      memcpy((unsigned char *)msg->data + 8, s->desc.bytes, IBMSG_DESCRIPTOR_SIZE);
    } else if (s->echoes_owed == 0) {
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
    if (s->desc_owed)
      s->desc_owed = 0;
    else if (s->echoes_owed > 0)
      s->echoes_owed--;
    else
      s->done_owed = 0;
  }
  if (s->test == TEST_WRITE_LAT && !s->desc_owed)
    session_pump_writes(s);
}

/* An RDMA test: the region the client's operations go to, and its descriptor for the DESC
 * message. The region has every remote right; the descriptor grants the one the test needs, on
 * exactly the bytes it touches. */
static int session_setup_rdma(struct endpoint *s) {
  uint64_t bytes = rdma_bytes(s->test, s->size);
  unsigned access =
      IBMSG_ACCESS_REMOTE_READ | IBMSG_ACCESS_REMOTE_WRITE | IBMSG_ACCESS_REMOTE_ATOMIC;
  int rc = ibmsg_alloc_region(s->home->loop, &s->region, (size_t)bytes, access);
  if (rc != IBMSG_OK) {
    session_fail(s, "cannot allocate the region for the test", rc);
    return -1;
  }
  s->have_region = 1;
  rc = ibmsg_region_descriptor(&s->region, &s->socket, 0, (size_t)bytes, right_of(s->test),
                               &s->desc);
  if (rc != IBMSG_OK) {
    session_fail(s, "cannot make a descriptor of the region", rc);
    return -1;
  }
  s->desc_owed = 1;
  return 0;
}

static void session_hello(struct endpoint *s, const ibmsg_buffer *msg) {
  const unsigned char *p = msg->data;
  uint64_t word;

  if ((msg->size != HELLO_SIZE && msg->size != HELLO_DESC_SIZE) ||
      memcmp(p, "ibmsgprf", 8) != 0) {
    session_fail(s, "not an ibmsg-perf client (its first message is not a test request)",
                 IBMSG_OK);
    return;
  }
  word = get64(p + 8);
  s->test = (int)(word >> 32);
  s->size = get64(p + 16);
  s->count = get64(p + 24);
  if ((word & 0xffffffffu) != PROTO_VERSION || info_of(s->test) == NULL) {
    session_fail(s, "unsupported test request (another version of ibmsg-perf?)", IBMSG_OK);
    return;
  }
  if (msg->size != (s->test == TEST_WRITE_LAT ? HELLO_DESC_SIZE : HELLO_SIZE) ||
      ((s->test & TESTS_RDMA) && s->size == 0)) {
    session_fail(s, "a malformed test request", IBMSG_OK);
    return;
  }
  if ((s->test & TESTS_MESSAGES) && s->size > ibmsg_socket_max_msg_size(&s->socket)) {
    session_fail(s, "messages larger than the maximum message size (see --max-size)",
                 IBMSG_EMSGSIZE);
    return;
  }
  if (s->test == TEST_WRITE_LAT)
    memcpy(s->peer_desc.bytes, p + HELLO_SIZE, IBMSG_DESCRIPTOR_SIZE);
  s->have_hello = 1;
  if (!g.server_quiet) {
    const char *what = s->test == TEST_RPC ? "requests" : "operations";
    if (s->test & TESTS_SEND)
      what = "messages";
    char thread[32] = "";
    if (g.threads > 1)
      snprintf(thread, sizeof thread, " (thread %d)", s->home->index);
    char count[32];
    if (s->count == UINT64_MAX) /* the client's --duration */
      snprintf(count, sizeof count, "until the client stops:");
    else
      snprintf(count, sizeof count, "%" PRIu64, s->count);
    tool_info(g.quiet, "client %s port %u: %s test, %" PRIu64 " bytes, %s %s%s", s->peer,
              s->peer_port, info_of(s->test)->name, s->size, count, what, thread);
  }
  if ((s->test & TESTS_RDMA) && session_setup_rdma(s) != 0)
    return;
  if (s->test == TEST_BW && s->count == 0)
    s->done_owed = 1;
  session_pump(s);
}

static void session_received(struct endpoint *s, ibmsg_buffer *msg) {
  if (s->failed) {
    /* closing: only give the buffer back */
  } else if (!s->have_hello) {
    session_hello(s, msg);
  } else if ((s->test & TESTS_RDMA) || msg->size != s->size || s->received >= s->count ||
             (s->test == TEST_RPC) != ((msg->flags & IBMSG_MSG_REQUEST) != 0)) {
    session_fail(s, "a message that does not belong to the test", IBMSG_OK);
  } else if (s->test == TEST_RPC) {
    s->received++;
    if (session_hold(s, msg) == 0) {
      session_pump(s); /* answers it, or keeps it until a send buffer is free */
      return;
    }
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

/* write_lat: the client's write landed in our region; answer it with a write into its region. */
static void session_write_received(struct endpoint *s, uint32_t imm, size_t length) {
  if (s->failed)
    return;
  if (s->test != TEST_WRITE_LAT || !s->have_hello || length != s->size ||
      s->received >= s->count || imm != (uint32_t)s->received) {
    session_fail(s, "an RDMA write that does not belong to the test", IBMSG_OK);
    return;
  }
  s->received++;
  s->echoes_owed++;
  session_pump_writes(s);
}

static void session_op_done(ibmsg_socket *socket, ibmsg_op *op, int status) {
  struct endpoint *s = op->user_data;
  (void)socket;
  if (status == IBMSG_OK)
    session_pump_writes(s);
  else if (status != IBMSG_ECANCELED) /* ECANCELED: the connection is closing anyway */
    session_fail(s, "an RDMA write failed", status);
}

static void session_closed(struct endpoint *s, int reason);

/* On the session's own loop's thread, at the first of its connection_established and the call
 * on_request posts (the other loop may set the connection up and run its callbacks before that
 * call; its connection_closed before either defers to the call): the session joins its loop's
 * list and gets its send buffer list. */
static void session_start(struct endpoint *s) {
  int rc;

  s->started = 1;
  s->prev = NULL;
  s->next = s->home->sessions;
  if (s->next != NULL)
    s->next->prev = s;
  s->home->sessions = s;
  s->home->nsessions++;
  rc = tool_sendpool_init(&s->pool, &s->socket, s->home->loop);
  if (rc != IBMSG_OK)
    s->pool.released = 1;
  if (s->closed_early) {
    session_closed(s, s->early_reason);
    return;
  }
  s->open = 1;
  if (rc != IBMSG_OK)
    session_fail(s, "cannot make the send buffer list", rc);
}

static void session_start_call(void *arg) {
  struct endpoint *s = arg;
  s->call_pending = 0;
  if (s->free_at_call)
    free(s); /* it ran and ended before this call */
  else if (!s->started)
    session_start(s);
}

/* A connection request on the listener's loop: accepted onto the next loop in turn. The session
 * is set up before the accept; once a connection is accepted onto another loop, it belongs to
 * that loop's thread, and session_start() runs there: at its connection_established or at the
 * call posted here, whichever comes first (the other loop may set the connection up and call
 * back before this call is posted). */
static void on_request(ibmsg_connection_request *request) {
  struct endpoint *s = calloc(1, sizeof *s);
  int rc;

  if (s == NULL) {
    ibmsg_reject(request, "ibmsg-perf: out of memory");
    return;
  }
  snprintf(s->peer, sizeof s->peer, "%s", request->peer_address);
  s->peer_port = request->peer_port;
  s->socket.user_data = s;
  s->role = ROLE_SESSION;
  s->home = &loops[g.threads > 1 ? g.next_loop++ % (unsigned)g.threads : 0];
  if (s->home->loop == &g.loop) {
    rc = ibmsg_accept(request, &s->socket);
  } else {
    /* Before the accept: from it on, the other loop's thread may run (and end) the session. */
    s->call_pending = 1;
    rc = ibmsg_accept_on(request, s->home->loop, &s->socket, NULL);
  }
  if (rc != IBMSG_OK) {
    tool_error("cannot accept the connection from %s port %u: %s", s->peer, s->peer_port,
               ibmsg_strerror(rc));
    free(s);
    return;
  }
  if (s->home->loop == &g.loop) {
    session_start(s);
    return;
  }
  if ((rc = ibmsg_event_loop_call(s->home->loop, session_start_call, s)) != IBMSG_OK)
    tool_error("cannot hand the connection from %s port %u to thread %d: %s", s->peer,
               s->peer_port, s->home->index, ibmsg_strerror(rc)); /* it stays there, unserved */
}

static void session_closed(struct endpoint *s, int reason) {
  int rc = IBMSG_OK;

  /* ECONNRESET is how every test ends: the client disconnects. */
  if (reason != IBMSG_OK && reason != IBMSG_ECONNRESET && !s->failed)
    tool_error("client %s port %u: connection failed: %s", s->peer, s->peer_port,
               ibmsg_strerror(reason));
  session_drop_held(s);
  tool_sendpool_release(&s->pool);
  tool_sendpool_destroy(&s->pool);
  /* Every done callback of the socket came before this one: nothing of ours uses the region. */
  if (s->have_region && (rc = ibmsg_deregister_region(&s->region)) != IBMSG_OK)
    tool_error("client %s port %u: cannot deregister the region: %s", s->peer, s->peer_port,
               ibmsg_strerror(rc));
  /* --memory: the first close after the most sessions were up samples them all (the tick as
   * they came may have missed the last ones). */
  if (g.memory && g.server && s->home->nsessions > g.mem.conns_up)
    tool_memwatch_sample(&g.mem, s->home->loop, s->home->nsessions);
  /* Out of its loop's list (thousands of sessions: no walk). */
  if (s->prev != NULL)
    s->prev->next = s->next;
  else
    s->home->sessions = s->next;
  if (s->next != NULL)
    s->next->prev = s->prev;
  s->home->nsessions--;
  /* ibmsg never touches the socket after connection_closed, but a region it still holds must
   * stay where it is (the loop then refuses to go away, which reports it once more). */
  if (rc != IBMSG_OK)
    return;
  if (s->call_pending)
    s->free_at_call = 1; /* session_start_call() still has it */
  else
    free(s);
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

static void client_op_done(ibmsg_socket *socket, ibmsg_op *op, int status);

/* Keeps timed round trip i (seconds). With --duration the array grows as the samples come. 0, or
 * -1 after failing the test. */
static int record_rtt(uint64_t i, double seconds) {
  if (i >= cl.rtt_cap) {
    size_t cap = cl.rtt_cap > 0 ? 2 * cl.rtt_cap : 65536;
    double *more;
    while (cap <= i)
      cap *= 2;
    more = realloc(cl.rtt, cap * sizeof *more);
    if (more == NULL) {
      client_fail("out of memory for the round trips", IBMSG_ENOMEM);
      return -1;
    }
    cl.rtt = more;
    cl.rtt_cap = cap;
  }
  cl.rtt[i] = seconds;
  return 0;
}

/* Posts one RDMA operation of the test on op. */
static int client_post_op(struct conn *c, ibmsg_op *op) {
  ibmsg_socket *sock = &c->ep.socket;
  size_t size = (size_t)cl.size;

  op->done = client_op_done;
  switch (cl.test) {
  case TEST_WRITE_LAT:
    return ibmsg_rdma_write_imm(sock, op, &cl.region, 0, size, &cl.remote, 0,
                                (uint32_t)c->posted);
  case TEST_WRITE_BW: return ibmsg_rdma_write(sock, op, &cl.region, 0, size, &cl.remote, 0);
  case TEST_ATOMIC_LAT: return ibmsg_atomic_fadd(sock, op, &cl.region, 0, &cl.remote, 0, 1);
  default: return ibmsg_rdma_read(sock, op, &cl.region, 0, size, &cl.remote, 0);
  }
}

/* The RDMA counterpart of client_pump(): the next operation of a latency test, or as many as
 * the window holds for a bandwidth test (the timed ones once the warm-up has drained). All of
 * them go to the same bytes on both sides, as perftest's do: what is measured is the transfer,
 * not the memory. */
static void client_pump_rdma(struct conn *c) {
  uint64_t limit;
  int rc;

  if (!cl.have_remote)
    return; /* the server's DESC message has not come yet */
  if (cl.test & TESTS_LATENCY) {
    if (cl.t_start == 0 && c->received == cl.warmup)
      cl.t_start = tool_now(); /* the timed part starts: for --duration and --interval */
    limit = c->posted == c->received ? c->posted + 1 : c->posted; /* one at a time */
    if (limit > c->total)
      limit = c->total;
  } else {
    if (cl.t_start == 0 && c->sent == cl.warmup)
      cl.t_start = tool_now();
    limit = cl.t_start != 0 ? c->total : cl.warmup;
  }
  while (c->posted < limit && cl.nfree > 0) {
    ibmsg_op *op = cl.free_ops[--cl.nfree];
    if (cl.test & TESTS_LATENCY)
      cl.t_post = tool_now();
    rc = client_post_op(c, op);
    if (rc != IBMSG_OK) {
      cl.free_ops[cl.nfree++] = op;
      if (rc == IBMSG_EOPNOTSUPP)
        client_fail(cl.test == TEST_ATOMIC_LAT
                        ? "cannot post: no atomics on this device, or the server offers no "
                          "one-sided RDMA"
                        : "cannot post: the server offers no one-sided RDMA",
                    IBMSG_OK);
      else if (rc != IBMSG_EAGAIN) /* EAGAIN: a done callback will call us again */
        client_fail("cannot post an RDMA operation", rc);
      return;
    }
    c->posted++;
  }
}

static void client_reply(ibmsg_socket *socket, ibmsg_request *req, ibmsg_buffer *reply,
                         int status);

/* rpc: posts requests while fewer than --outstanding are unanswered, the timed ones once the
 * warm-up has drained (its last done callback starts the clock). Requests, like the HELLO
 * before them, go in the connection's order: the first may follow the HELLO at once. */
static void client_pump_rpc(struct conn *c) {
  ibmsg_buffer *msg;
  uint64_t limit;
  int rc;

  if (cl.t_start == 0 && c->received == cl.warmup)
    cl.t_start = tool_now();
  limit = cl.t_start != 0 ? c->total : cl.warmup;
  while (c->posted < limit && cl.nfree_reqs > 0) {
    struct rpc_slot *slot = cl.free_reqs[cl.nfree_reqs - 1];
    rc = tool_sendpool_get(&c->ep.pool, (size_t)cl.size, &msg);
    if (rc == IBMSG_EAGAIN)
      return; /* a message_sent will call us again */
    if (rc != IBMSG_OK) {
      client_fail("cannot allocate a message", rc);
      return;
    }
    slot->req.done = client_reply;
    slot->index = c->posted;
    slot->t_post = tool_now();
    rc = ibmsg_post_request(&c->ep.socket, msg, &slot->req, RPC_TIMEOUT_MS);
    if (rc != IBMSG_OK) {
      tool_sendpool_put(&c->ep.pool, msg);
      if (rc == IBMSG_EOPNOTSUPP)
        client_fail("cannot post a request: the server's ibmsg has no requests (before 1.5)",
                    IBMSG_OK);
      else if (rc != IBMSG_EAGAIN) /* EAGAIN: a message_sent or done callback calls us again */
        client_fail("cannot post a request", rc);
      return;
    }
    slot->posted = 1;
    cl.nfree_reqs--;
    c->posted++;
  }
}

/* Posts the messages of one connection that are due: the next ping (latency), or as many as
 * the window holds (bandwidth), holding back the timed ones until the warm-up of every
 * connection has drained. */
static void client_pump_one(struct conn *c) {
  ibmsg_buffer *msg;
  uint64_t limit;
  int rc;

  if (cl.failed || c->closed)
    return;
  if (cl.test & TESTS_RDMA) {
    client_pump_rdma(c);
    return;
  }
  if (cl.test == TEST_RPC) {
    client_pump_rpc(c);
    return;
  }
  if (cl.test == TEST_LAT) {
    if (cl.t_start == 0 && c->received == cl.warmup)
      cl.t_start = tool_now(); /* the timed part starts: for --duration and --interval */
    limit = c->posted == c->received ? c->posted + 1 : c->posted; /* one ping at a time */
    if (limit > c->total)
      limit = c->total;
  } else {
    limit = cl.t_start != 0 ? c->total : cl.warmup;
    /* The window: at most the send buffers (IBMSG_OPT_SEND_DEPTH is set to -W), fewer for
     * large messages. A message_sent gives one back and calls us again. */
    if (limit > c->sent + cl.window)
      limit = c->sent + cl.window;
  }
  while (c->posted < limit) {
    rc = tool_sendpool_get(&c->ep.pool, (size_t)cl.size, &msg);
    if (rc == IBMSG_EAGAIN)
      return; /* a message_sent will call us again */
    if (rc != IBMSG_OK) {
      client_fail("cannot allocate a message", rc);
      return;
    }
    if (cl.test == TEST_LAT)
      cl.t_post = tool_now();
    rc = ibmsg_post_send(&c->ep.socket, msg);
    if (rc == IBMSG_EAGAIN) {
      tool_sendpool_put(&c->ep.pool, msg);
      return;
    }
    if (rc != IBMSG_OK) {
      tool_sendpool_put(&c->ep.pool, msg);
      client_fail("cannot send", rc);
      return;
    }
    c->posted++;
  }
}

static void client_tick(double now);

/* client_pump_one() for c, and for every connection at the moment the bandwidth test's clock
 * starts: when every connection has its HELLO sent and its warm-up drained. With --duration or
 * --interval every 64th callback reads the clock first: a dispatch need not return while
 * completions keep coming (a window of RDMA writes keeps it busy), so client_wait() alone would
 * not see the time. */
static void client_pump(struct conn *c) {
  if ((g.duration > 0 || g.interval > 0) && cl.t_start != 0 && !cl.stopped &&
      (cl.activity & 63) == 0)
    client_tick(tool_now());
  if (cl.test == TEST_BW && cl.t_start == 0 && cl.hellos_sent == cl.nconns &&
      cl.sent_all == (uint64_t)cl.nconns * cl.warmup) {
    cl.t_start = tool_now();
    for (int i = 0; i < cl.nconns; i++)
      client_pump_one(&cl.conns[i]);
    return;
  }
  client_pump_one(c);
}

/* Whether everything of c is done; the test is finished once every connection is. Each call
 * looks at c alone (thousands of connections: no walk over all of them per callback): a
 * connection that is done stays done, since nothing more is posted on it. */
static void client_check_conn(struct conn *c) {
  int all_in;
  if (c->all_in)
    return;
  if (cl.test & TESTS_RDMA) {
    /* Also wait for every done callback, so that no op is posted any more. */
    all_in = (cl.test & TESTS_LATENCY ? c->received : c->sent) == c->total &&
             cl.nfree == cl.nops;
  } else {
    /* Also wait for every message_sent, so that the buffers can be freed, and (rpc) for
     * every done callback. */
    /* (--duration: no DONE comes; each message_sent says the server has the message) */
    all_in = (cl.test != TEST_BW ? c->received : g.duration ? c->sent : c->server_count) ==
                 c->total &&
             c->sent == c->total && cl.nfree_reqs == cl.nreqs;
  }
  if (!all_in || !c->hello_sent || tool_sendpool_busy(&c->ep.pool) != 0)
    return;
  c->all_in = 1;
  if (++cl.nall_in == cl.nconns)
    cl.finished = 1;
}

/* client_check_conn() for every connection: when something common to all changed (--duration's
 * end). */
static void client_check_finished(void) {
  for (int i = 0; i < cl.nconns; i++)
    client_check_conn(&cl.conns[i]);
}

/* An RDMA test: our region (registered now that the connection's device is open, so that no
 * operation pays for it) and, for write_lat, the descriptor the server writes its answers to. */
static int client_setup_rdma(struct conn *c, ibmsg_descriptor *desc) {
  unsigned access = IBMSG_ACCESS_LOCAL_WRITE;
  int rc;

  if (cl.test == TEST_WRITE_LAT)
    access |= IBMSG_ACCESS_REMOTE_WRITE;
  rc = ibmsg_alloc_region(&g.loop, &cl.region, (size_t)rdma_bytes(cl.test, cl.size), access);
  if (rc != IBMSG_OK) {
    client_fail("cannot allocate the region for the test", rc);
    return -1;
  }
  cl.have_region = 1;
  if (cl.test == TEST_WRITE_LAT) {
    rc = ibmsg_region_descriptor(&cl.region, &c->ep.socket, 0, (size_t)cl.size,
                                 IBMSG_ACCESS_REMOTE_WRITE, desc);
    if (rc != IBMSG_OK) {
      client_fail("cannot make a descriptor of the region", rc);
      return -1;
    }
  }
  return 0;
}

/* Notes what a client connection costs now (ibmsg_socket_memory): the most of each field over
 * the run is reported. Only the first NOTED_CONNS connections of a test: ibmsg_socket_memory
 * looks through the device's buffers, so noting thousands would be quadratic, and the first
 * connections of a device are the largest (IBMSG_OPT_SHARED_RECV_BUDGET scales later ones). */
#define NOTED_CONNS 16
static void client_note_memory(struct conn *c) {
  ibmsg_memory m;
  if (ibmsg_socket_memory(&c->ep.socket, &m) != IBMSG_OK)
    return;
  if (m.buffers > g.conn_memory.buffers)
    g.conn_memory.buffers = m.buffers;
  if (m.shared > g.conn_memory.shared)
    g.conn_memory.shared = m.shared;
  if (m.large > g.conn_memory.large)
    g.conn_memory.large = m.large;
  g.have_conn_memory = 1;
}

/* bw: allocates the window's send buffers before the clock starts, however short the warm-up: a
 * rendezvous message's buffer is registered when it is allocated, and perftest registers its
 * memory before it times anything too. As many as the send buffers allow (the HELLO holds one
 * until it is sent) and the test sends; the pool keeps them for the test. */
static void client_alloc_window(struct conn *c) {
  uint64_t want = cl.window < c->total ? cl.window : c->total;
  ibmsg_buffer **held = calloc((size_t)want, sizeof *held);
  size_t n = 0;

  if (held == NULL)
    return; /* they are allocated as they are needed */
  while (n < want && tool_sendpool_get(&c->ep.pool, (size_t)cl.size, &held[n]) == IBMSG_OK)
    n++;
  while (n > 0)
    tool_sendpool_put(&c->ep.pool, held[--n]);
  free(held);
}

static void client_established(struct conn *c) {
  ibmsg_descriptor desc;
  ibmsg_buffer *msg;
  size_t max = ibmsg_socket_max_msg_size(&c->ep.socket);
  const char *dev = ibmsg_socket_device(&c->ep.socket);
  int rc;

  c->established = 1;
  cl.nestablished++;
  if (g.memory)
    tool_memwatch_tick(&g.mem, &g.loop, (uint64_t)cl.nestablished, 0.5);
  if (dev != NULL && g.device[0] == '\0')
    snprintf(g.device, sizeof g.device, "%s", dev);
  if ((cl.test & TESTS_MESSAGES) && cl.size > max) {
    char what[256];
    snprintf(what, sizeof what, "%" PRIu64 "-byte messages do not fit: the connection's maximum "
             "message size is %zu (use --max-size %" PRIu64 " on both sides)", cl.size, max,
             cl.size);
    client_fail(what, IBMSG_OK);
    return;
  }
  if ((cl.test & TESTS_RDMA) && client_setup_rdma(c, &desc) != 0)
    return;
  /* The HELLO's buffer is its own, freed once it is sent: the pool's buffers are for the
   * test's messages, which may need buffers of their own size (rendezvous). */
  msg = &c->hello;
  rc = ibmsg_alloc_msg(msg, &c->ep.socket,
                       cl.test == TEST_WRITE_LAT ? HELLO_DESC_SIZE : HELLO_SIZE);
  if (rc != IBMSG_OK) {
    client_fail("cannot allocate a message", rc);
    return;
  }
  encode_hello(msg->data, cl.test, cl.size, c->total);
  if (cl.test == TEST_WRITE_LAT)
    memcpy((unsigned char *)msg->data + HELLO_SIZE, desc.bytes, IBMSG_DESCRIPTOR_SIZE);
  rc = ibmsg_post_send(&c->ep.socket, msg);
  if (rc != IBMSG_OK) {
    ibmsg_free_msg(msg);
    client_fail("cannot send the test request", rc);
    return;
  }
  if (cl.test == TEST_BW)
    client_alloc_window(c);
  if (cl.nestablished <= NOTED_CONNS)
    client_note_memory(c);
  /* Messages arrive in order: the data may follow the request at once (the RDMA tests wait
   * for the server's descriptor). */
  client_pump(c);
}

static void client_sent(struct conn *c, ibmsg_buffer *msg, int status) {
  int hello = msg == &c->hello;
  if (hello)
    ibmsg_free_msg(msg);
  else
    tool_sendpool_put(&c->ep.pool, msg);
  if (status != IBMSG_OK) {
    if (status != IBMSG_ECANCELED) /* ECANCELED: connection_closed says why */
      client_fail("a message was not delivered", status);
    return;
  }
  if (hello) {
    c->hello_sent = 1;
    cl.hellos_sent++;
  } else {
    c->sent++;
    cl.sent_all++;
    if (c->sent == c->total && cl.test == TEST_BW) {
      c->t_done = tool_now();
      if (++cl.conns_done == cl.nconns)
        cl.t_end = c->t_done;
    }
  }
  client_pump(c);
  client_check_conn(c);
}

/* The server's DESC message: the region the test's operations go to. */
static void client_got_desc(const ibmsg_buffer *msg) {
  size_t length;
  unsigned access;
  int rc;

  memcpy(cl.remote.bytes, (const unsigned char *)msg->data + 8, IBMSG_DESCRIPTOR_SIZE);
  rc = ibmsg_descriptor_info(&cl.remote, &length, &access);
  if (rc != IBMSG_OK) {
    client_fail("the server's descriptor is not valid", rc);
  } else if (length < rdma_bytes(cl.test, cl.size) || !(access & right_of(cl.test))) {
    client_fail("the server's descriptor does not grant what the test needs", IBMSG_OK);
  } else {
    cl.have_remote = 1;
  }
}

static void client_received(struct conn *c, ibmsg_buffer *msg) {
  double now = tool_now();

  if ((cl.test & TESTS_RDMA) && !cl.have_remote && msg->size == DESC_SIZE &&
      memcmp(msg->data, "ibmsgdsc", 8) == 0) {
    client_got_desc(msg);
  } else if (cl.test == TEST_LAT && msg->size == cl.size && c->received < c->posted) {
    if (c->received >= cl.warmup && record_rtt(c->received - cl.warmup, now - cl.t_post) != 0)
      return;
    c->received++;
  } else if (cl.test == TEST_BW && msg->size == DONE_SIZE &&
             memcmp(msg->data, "ibmsgend", 8) == 0) {
    c->server_count = get64((const unsigned char *)msg->data + 8);
    if (c->server_count != c->total) {
      char what[256];
      snprintf(what, sizeof what, "the server received %" PRIu64 " of %" PRIu64 " messages",
               c->server_count, c->total);
      client_fail(what, IBMSG_OK);
    }
  } else {
    client_fail("unexpected message from the server (is it ibmsg-perf --server?)", IBMSG_OK);
  }
  ibmsg_free_msg(msg);
  client_pump(c);
  client_check_conn(c);
}

/* write_lat: the server's answer to our write landed in our region. */
static void client_write_received(struct conn *c, uint32_t imm, size_t length) {
  double now = tool_now();

  if (cl.test != TEST_WRITE_LAT || length != cl.size || c->received >= c->posted ||
      imm != (uint32_t)c->received) {
    client_fail("an RDMA write from the server that does not belong to the test", IBMSG_OK);
    return;
  }
  if (c->received >= cl.warmup && record_rtt(c->received - cl.warmup, now - cl.t_post) != 0)
    return;
  c->received++;
  client_pump(c);
  client_check_conn(c);
}

/* rpc: a request's done callback, with its reply or why it has none. */
static void client_reply(ibmsg_socket *socket, ibmsg_request *req, ibmsg_buffer *reply,
                         int status) {
  struct conn *c = conn_of(socket->user_data);
  struct rpc_slot *slot = (struct rpc_slot *)req;
  double now = tool_now();
  uintptr_t at = (uintptr_t)slot, first = (uintptr_t)cl.reqs;

  if (cl.reqs == NULL || at < first || at >= first + cl.nreqs * sizeof *cl.reqs ||
      !slot->posted) {
    /* Not one of the test's posted requests: a second done callback, or one after its
     * connection closed. */
    tool_error("a done callback for a request that is not posted (status %s)",
               ibmsg_strerror(status));
    cl.failed = 1;
    if (reply != NULL)
      ibmsg_free_msg(reply);
    return;
  }
  cl.activity++;
  slot->posted = 0;
  cl.free_reqs[cl.nfree_reqs++] = slot;
  if (status != IBMSG_OK) {
    if (status == IBMSG_ETIMEDOUT)
      client_fail("a request got no reply within 10 s", IBMSG_OK);
    else if (status != IBMSG_ECANCELED) /* ECANCELED: we closed the connection */
      client_fail("a request failed", status);
    return;
  }
  if (reply == NULL || reply->size != cl.size) {
    client_fail("a reply of the wrong size (is the server ibmsg-perf --server?)", IBMSG_OK);
  } else if (c->received < c->posted) {
    if (slot->index >= cl.warmup && record_rtt(slot->index - cl.warmup, now - slot->t_post) != 0) {
      ibmsg_free_msg(reply);
      return;
    }
    if (++c->received == c->total)
      cl.t_end = now;
  } else {
    client_fail("more replies than requests", IBMSG_OK);
  }
  if (reply != NULL)
    ibmsg_free_msg(reply);
  client_pump(c);
  client_check_conn(c);
}

static void client_op_done(ibmsg_socket *socket, ibmsg_op *op, int status) {
  struct conn *c = conn_of(socket->user_data);
  /* The clock only where a time is taken: a bandwidth test reads it at its start and end. */
  double now = cl.test == TEST_READ_LAT || cl.test == TEST_ATOMIC_LAT ? tool_now() : 0;

  cl.activity++;
  cl.free_ops[cl.nfree++] = op;
  if (status != IBMSG_OK) {
    if (status == IBMSG_EREMOTEACCESS)
      client_fail("the server refused an RDMA operation", status);
    else if (status != IBMSG_ECANCELED) /* ECANCELED: connection_closed says why */
      client_fail("an RDMA operation failed", status);
    return;
  }
  if (cl.test == TEST_READ_LAT || cl.test == TEST_ATOMIC_LAT) {
    /* The server's word starts at 0 and only we add to it: the value before our add counts
     * our adds. */
    if (cl.test == TEST_ATOMIC_LAT && *(const uint64_t *)cl.region.addr != c->received) {
      client_fail("fetch-and-add returned a wrong previous value", IBMSG_OK);
      return;
    }
    if (c->received >= cl.warmup && record_rtt(c->received - cl.warmup, now - cl.t_post) != 0)
      return;
    c->received++;
  } else if (cl.test & (TEST_WRITE_BW | TEST_READ_BW)) {
    c->sent++;
    if (c->sent == c->total)
      cl.t_end = tool_now();
  }
  client_pump(c);
  client_check_conn(c);
}

/* ---- the loop's callbacks: dispatch on the socket's role ------------------------------------- */

static void on_established(ibmsg_socket *socket) {
  struct endpoint *e = socket->user_data;
  if (e->role == ROLE_CLIENT) {
    cl.activity++;
    client_established(conn_of(e));
  } else if (e->role == ROLE_SESSION) {
    if (!e->started)
      session_start(e); /* before on_request's call came: the first callback of the connection */
    e->home->established++;
    if (g.memory && g.server) /* one loop (--memory excludes --threads) */
      tool_memwatch_tick(&g.mem, &g.loop, e->home->nsessions, 0.5);
  }
}

static void on_received(ibmsg_socket *socket, ibmsg_buffer *msg) {
  struct endpoint *e = socket->user_data;
  if (e->role == ROLE_CLIENT) {
    cl.activity++;
    client_received(conn_of(e), msg);
  } else {
    session_received(e, msg);
  }
}

static void on_write_received(ibmsg_socket *socket, uint32_t imm, size_t length) {
  struct endpoint *e = socket->user_data;
  if (e->role == ROLE_CLIENT) {
    cl.activity++;
    client_write_received(conn_of(e), imm, length);
  } else {
    session_write_received(e, imm, length);
  }
}

static void on_sent(ibmsg_socket *socket, ibmsg_buffer *msg, int status) {
  struct endpoint *e = socket->user_data;
  if (e->role == ROLE_CLIENT) {
    cl.activity++;
    client_sent(conn_of(e), msg, status);
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
    struct conn *c = conn_of(e);
    c->closed = 1;
    c->close_reason = reason;
    cl.nopen--;
    cl.nclosed++;
    tool_sendpool_release(&c->ep.pool);
  } else if (e->role == ROLE_SESSION && !e->started) {
    /* Accepted onto another loop, and closed before session_start() came there: it ends it. */
    e->closed_early = 1;
    e->early_reason = reason;
  } else if (e->role == ROLE_SESSION) {
    session_closed(e, reason);
  } else if (reason != IBMSG_OK) {
    tool_error("the listening socket closed: %s", ibmsg_strerror(reason));
  }
}

/* ---- --duration and --interval ---------------------------------------------------------------- */

/* The timed iterations done so far, over all connections: round trips (latency tests, rpc),
 * messages the server has (bw: message_sent), operations done (write_bw, read_bw). */
static uint64_t timed_done(void) {
  uint64_t n = 0;
  for (int i = 0; i < cl.nconns; i++) {
    const struct conn *c = &cl.conns[i];
    uint64_t d = cl.test & (TESTS_LATENCY | TEST_RPC) ? c->received : c->sent;
    n += d > cl.warmup ? d - cl.warmup : 0;
  }
  return n;
}

/* --interval: one line on stderr about the time since the last one (or since the timed part
 * started), with the rate in it:
 *   ibmsg-perf: interval 1.00-2.00 s: bw 4096 B: 123456 messages, 505.67 MB/s, 0.123456 Mpps
 *   ibmsg-perf: interval 1.00-2.00 s: lat 64 B: 45678 iterations, 45678 iterations/s,
 *               t_avg 10.95 usec   (one line)
 * The rates in MB/s (10^6 bytes per second) and Mpps, as in the tables. */
static void report_interval(double now) {
  uint64_t done = timed_done(), n = done - cl.done_last_report;
  uint64_t bytes = cl.test == TEST_ATOMIC_LAT ? 8 : cl.size;
  double dt = now - cl.t_last_report;
  const struct test_info *ti = info_of(cl.test);

  if (dt <= 0)
    return;
  flockfile(stderr);
  fprintf(stderr, "%s: interval %.2f-%.2f s: %s %" PRIu64 " B: ", tool_name,
          cl.t_last_report - cl.t_start, now - cl.t_start, ti->name, bytes);
  if (cl.test & TESTS_LATENCY) {
    double sum = 0;
    for (uint64_t i = cl.done_last_report; i < done; i++)
      sum += cl.rtt[i];
    fprintf(stderr, "%" PRIu64 " iterations, %.0f iterations/s", n, (double)n / dt);
    if (n > 0)
      fprintf(stderr, ", t_avg %.2f usec", sum / (double)n * ti->us_per_s);
  } else if (cl.test == TEST_RPC) {
    fprintf(stderr, "%" PRIu64 " requests, %.0f req/s", n, (double)n / dt);
  } else {
    fprintf(stderr, "%" PRIu64 " %s, %.2f MB/s, %.6f Mpps", n,
            cl.test == TEST_BW ? "messages" : "operations", (double)(n * bytes) / dt / 1e6,
            (double)n / dt / 1e6);
  }
  fputc('\n', stderr);
  funlockfile(stderr);
  cl.t_last_report = now;
  cl.done_last_report = done;
}

/* --duration: the time is up. Each connection stops posting (its last iteration is the last it
 * posted); the test ends when those are done. */
static void client_stop_posting(double now) {
  if (g.interval > 0 && timed_done() > cl.done_last_report)
    report_interval(now);
  cl.stopped = 1;
  for (int i = 0; i < cl.nconns; i++) {
    struct conn *c = &cl.conns[i];
    c->total = c->posted;
    /* Nothing in flight: no callback will say it is the last. */
    if (cl.test == TEST_BW && c->sent == c->total) {
      c->t_done = now;
      if (++cl.conns_done == cl.nconns)
        cl.t_end = now;
    } else if ((cl.test & (TEST_WRITE_BW | TEST_READ_BW)) && c->sent == c->total) {
      cl.t_end = now;
    } else if (cl.test == TEST_RPC && c->received == c->total) {
      cl.t_end = now;
    }
  }
  client_check_finished();
}

/* After a dispatch, in the timed part of a test with --duration or --interval. */
static void client_tick(double now) {
  if (g.interval > 0) {
    if (cl.next_report == 0) {
      cl.t_last_report = cl.t_start;
      cl.next_report = cl.t_start + (double)g.interval;
    }
    if (now >= cl.next_report) {
      report_interval(now);
      while (cl.next_report <= now)
        cl.next_report += (double)g.interval;
    }
  }
  if (g.duration > 0 && now >= cl.t_start + (double)g.duration)
    client_stop_posting(now);
}

/* ---- running the loop ------------------------------------------------------------------------ */

/* Dispatches until *flag is set. Returns 0, or -1 after reporting why it stopped waiting: the
 * test failed, one of its connections closed, the peer went quiet, or a signal came. */
static int client_wait(const int *flag) {
  /* The clock is read only after a dispatch that brought the client nothing: a test's hot path
   * reads it for its timings alone (where clock_gettime is a system call, as in emulated
   * machines, each read costs as much as one). The quiet time starts at the first such
   * dispatch, which is at most one dispatch late. --duration and --interval read it after
   * every dispatch once the timed part has started. */
  uint64_t seen = cl.activity;
  double quiet_since = tool_now();
  int rc;
  while (!*flag) {
    if (cl.failed)
      return -1;
    if ((g.duration > 0 || g.interval > 0) && cl.t_start != 0 && !cl.stopped)
      client_tick(tool_now());
    for (int i = 0; i < cl.nconns && cl.nclosed > 0; i++) {
      struct conn *c = &cl.conns[i];
      if (!c->closed)
        continue;
      if (!c->established) {
        char what[256];
        snprintf(what, sizeof what, "cannot connect to %s port %u", g.ip, g.port);
        client_fail(what, c->close_reason == IBMSG_OK ? IBMSG_ECONNRESET : c->close_reason);
      } else {
        client_fail("the server closed the connection during the test",
                    c->close_reason == IBMSG_OK ? IBMSG_ECONNRESET : c->close_reason);
      }
      return -1;
    }
    if (tool_stop) {
      client_fail("interrupted", IBMSG_OK);
      return -1;
    }
    if (cl.activity != seen) {
      seen = cl.activity;
      quiet_since = 0;
    } else if (quiet_since == 0) {
      quiet_since = tool_now();
    } else if (tool_now() - quiet_since > IDLE_TIMEOUT_S) {
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

/* How many of the client's connections are open. */
static int client_open(void) { return cl.nopen; }

/* Dispatches until no socket is open or the time is up. */
static int wait_all_closed(void) {
  double deadline = tool_now() + CLOSE_TIMEOUT_S;
  while (client_open() > 0 || g.listener.open || loops[0].sessions != NULL) {
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

/* Closes the client's connections (after a test, or when it failed) and waits for them; a
 * connection's pool is destroyed once it closed. Returns how many are still open. */
static int client_close(void) {
  double deadline = tool_now() + CLOSE_TIMEOUT_S;
  for (int i = 0; i < cl.nconns; i++) {
    struct conn *c = &cl.conns[i];
    tool_sendpool_release(&c->ep.pool);
    if (c->ep.open)
      ibmsg_disconnect(&c->ep.socket); /* IBMSG_ESTATE if the peer closed it first */
  }
  while (client_open() > 0 && tool_now() < deadline)
    if (ibmsg_dispatch_event_loop_timeout(&g.loop, TOOL_TICK_MS) != IBMSG_OK)
      break;
  for (int i = 0; i < cl.nconns; i++)
    if (!cl.conns[i].ep.open)
      tool_sendpool_destroy(&cl.conns[i].ep.pool);
  return client_open();
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

/* How this side's connections wait for completions (IBMSG_OPT_BUSY_POLL), in words. */
static const char *poll_mode(char *buf, size_t len) {
  if (g.busy_poll == IBMSG_BUSY_POLL_ALWAYS)
    snprintf(buf, len, "busy polling");
  else if (g.busy_poll > 0)
    snprintf(buf, len, "adaptive polling (%d usec, then events)", g.busy_poll);
  else
    snprintf(buf, len, "events");
  return buf;
}

static void print_banner(const char *title) {
  char mode[64];
  if (g.quiet) {
    return;
  }
  print_rule();
  printf("%*s%s\n", (int)(46 - strlen(title) / 2), "", title);
  printf(" Peer: %s port %u   Device: %s\n", g.ip, g.port, g.device[0] ? g.device : "?");
  if (g.duration > 0)
    printf(" Duration: %" PRIu64 " s per size, after %" PRIu64 " warm-up iterations\n",
           g.duration, g.warmup);
  else
    printf(" Iterations: %" PRIu64 " per size, after %" PRIu64 " warm-up\n", g.iters, g.warmup);
  printf(" Completions: %s%s\n", poll_mode(mode, sizeof mode),
         g.busy_poll_given ? "" : " (the default; perftest busy-polls: see --busy-poll)");
  printf(" Units: usec = microseconds, MB/s = 10^6 bytes/s, Mpps = 10^6 per second\n");
  print_rule();
}

/* The banner and column heads of a test's table, before its first row. */
static int table_header(int test) {
  if (g.json || g.header_test == test)
    return 0;
  if (g.header_test != 0 && !g.quiet)
    putchar('\n');
  g.header_test = test;
  print_banner(info_of(test)->title);
  return 1;
}

static void report_lat(const struct lat_result *r) {
  if (g.json)
    return;
  if (table_header(r->test))
    printf(" %-10s %-11s %-14s %-14s %-14s %-14s %-14s %s\n", "#bytes", "#iterations",
           "t_min[usec]", "t_median[usec]", "t_avg[usec]", "t_p99[usec]", "t_p99.9[usec]",
           "t_max[usec]");
  printf(" %-10" PRIu64 " %-11" PRIu64 " %-14.2f %-14.2f %-14.2f %-14.2f %-14.2f %.2f\n",
         r->size, r->iters, r->min, r->median, r->avg, r->p99, r->p999, r->max);
  fflush(stdout);
}

static void report_bw(const struct bw_result *r) {
  if (g.json)
    return;
  if (r->test == TEST_BW) {
    /* #iterations per connection; the rates are those of all connections together. */
    if (table_header(r->test))
      printf(" %-10s %-11s %-8s %-7s %-14s %-14s %-14s %s\n", "#bytes", "#iterations",
             "#window", "#conns", "BW[MB/s]", "MsgRate[Mpps]", "msg/s", "seconds");
    printf(" %-10" PRIu64 " %-11" PRIu64 " %-8" PRIu64 " %-7" PRIu64
           " %-14.2f %-14.6f %-14.0f %.6f\n",
           r->size, r->iters, r->window, r->conns, r->mbps, r->mpps, r->mpps * 1e6, r->seconds);
  } else {
    /* MB/s as in the message tables (perftest's ib_write_bw and ib_read_bw print MiB/s and
     * call it MB/sec: theirs is 1.048576 times smaller for the same rate). */
    if (table_header(r->test))
      printf(" %-10s %-11s %-8s %-14s %-14s %-14s %s\n", "#bytes", "#iterations", "#window",
             "BW[MB/s]", "MsgRate[Mpps]", "ops/s", "seconds");
    printf(" %-10" PRIu64 " %-11" PRIu64 " %-8" PRIu64 " %-14.2f %-14.6f %-14.0f %.6f\n",
           r->size, r->iters, r->window, r->mbps, r->mpps, r->mpps * 1e6, r->seconds);
  }
  fflush(stdout);
}

static void report_rpc(const struct rpc_result *r) {
  const struct lat_result *l = &r->lat;
  if (g.json)
    return;
  if (table_header(l->test))
    printf(" %-10s %-11s %-12s %-14s %-14s %-14s %-14s %-14s %-14s %-14s %s\n", "#bytes",
           "#iterations", "#outstanding", "t_min[usec]", "t_median[usec]", "t_avg[usec]",
           "t_p99[usec]", "t_p99.9[usec]", "t_max[usec]", "req/s", "seconds");
  printf(" %-10" PRIu64 " %-11" PRIu64 " %-12" PRIu64
         " %-14.2f %-14.2f %-14.2f %-14.2f %-14.2f %-14.2f %-14.0f %.6f\n",
         l->size, l->iters, r->outstanding, l->min, l->median, l->avg, l->p99, l->p999, l->max,
         r->rate, r->seconds);
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

static void json_lat(const struct lat_result *r, int first) {
  printf("%s\n    {\"bytes\": %" PRIu64 ", \"iterations\": %" PRIu64 ", \"t_min_us\": %.3f, "
         "\"t_median_us\": %.3f, \"t_avg_us\": %.3f, \"t_p99_us\": %.3f, \"t_p999_us\": %.3f, "
         "\"t_max_us\": %.3f}",
         first ? "" : ",", r->size, r->iters, r->min, r->median, r->avg, r->p99, r->p999,
         r->max);
}

static void json_bw(const struct bw_result *r, int first) {
  printf("%s\n    {\"bytes\": %" PRIu64 ", \"iterations\": %" PRIu64 ", \"seconds\": %.6f, "
         "\"bw_mb_per_s\": %.3f, \"msg_rate_mpps\": %.6f",
         first ? "" : ",", r->size, r->iters, r->seconds, r->mbps, r->mpps);
  if (r->test == TEST_BW) {
    printf(", \"window\": %" PRIu64 ", \"connections\": %" PRIu64 ", \"msg_per_s\": %.1f",
           r->window, r->conns, r->mpps * 1e6);
    /* Each connection's timed messages over the time from the common start to its last
     * message_sent; msg_per_s is all of them over the time to the last of all. */
    if (r->conn_mps != NULL) {
      printf(", \"connection_msg_per_s\": [");
      for (uint64_t i = 0; i < r->conns; i++)
        printf("%s%.1f", i ? ", " : "", r->conn_mps[i]);
      putchar(']');
    }
  } else
    printf(", \"window\": %" PRIu64 ", \"ops_per_s\": %.1f", r->window, r->mpps * 1e6);
  putchar('}');
}

static void json_rpc(const struct rpc_result *r, int first) {
  const struct lat_result *l = &r->lat;
  printf("%s\n    {\"bytes\": %" PRIu64 ", \"iterations\": %" PRIu64 ", \"outstanding\": %" PRIu64
         ", \"t_min_us\": %.3f, \"t_median_us\": %.3f, \"t_avg_us\": %.3f, \"t_p99_us\": %.3f, "
         "\"t_p999_us\": %.3f, \"t_max_us\": %.3f, \"seconds\": %.6f, \"requests_per_s\": %.1f}",
         first ? "" : ",", l->size, l->iters, r->outstanding, l->min, l->median, l->avg, l->p99,
         l->p999, l->max, r->seconds, r->rate);
}

/* The results of one test as the member named after it: "latency" and "bandwidth" for the
 * message tests lat and bw (always there), the test's name for rpc and the RDMA tests (when
 * they ran). */
static void json_test(int test, const char *member) {
  int n = 0;
  printf(",\n  \"%s\": [", member);
  if (test == TEST_RPC) {
    for (int i = 0; i < g.nrpc; i++)
      json_rpc(&g.rpc[i], n++ == 0);
  } else if (test & TESTS_LATENCY) {
    for (int i = 0; i < g.nlat; i++)
      if (g.lat[i].test == test)
        json_lat(&g.lat[i], n++ == 0);
  } else {
    for (int i = 0; i < g.nbw; i++)
      if (g.bw[i].test == test)
        json_bw(&g.bw[i], n++ == 0);
  }
  printf("%s]", n ? "\n  " : "");
}

/* One line after the tables; its first word is no number, so that scripts reading the rows by
 * their first column (test/perf/compare) pass it by. */
static void print_memory(void) {
  if (!g.have_conn_memory)
    return;
  printf(" Memory per connection (ibmsg_socket_memory, most seen): buffers %zu, shared %zu, "
         "large %zu bytes\n", g.conn_memory.buffers, g.conn_memory.shared,
         g.conn_memory.large);
  fflush(stdout);
}

static void print_json(int failed) {
  printf("{\n  \"tool\": \"ibmsg-perf\",\n  \"version\": ");
  json_string(ibmsg_version_string());
  printf(",\n  \"peer\": {\"address\": ");
  json_string(g.ip != NULL ? g.ip : "");
  printf(", \"port\": %u},\n  \"device\": ", g.port);
  json_string(g.device);
  printf(",\n  \"warmup\": %" PRIu64 ",\n  \"busy_poll_us\": %d", g.warmup, g.busy_poll);
  printf(",\n  \"completions\": ");
  json_string(g.busy_poll == IBMSG_BUSY_POLL_ALWAYS ? "busy_poll"
              : g.busy_poll > 0                    ? "adaptive"
                                                   : "events");
  if (g.duration > 0)
    printf(",\n  \"duration_s\": %" PRIu64, g.duration);
  else
    printf(",\n  \"iterations\": %" PRIu64, g.iters);
  if (g.have_conn_memory)
    printf(",\n  \"connection_memory\": {\"buffers\": %zu, \"shared\": %zu, \"large\": %zu}",
           g.conn_memory.buffers, g.conn_memory.shared, g.conn_memory.large);
  if (g.memory) {
    printf(",\n  \"memory\": ");
    tool_memwatch_json(stdout, &g.mem);
  }
  json_test(TEST_LAT, "latency");
  json_test(TEST_BW, "bandwidth");
  for (int i = 0; i < NTESTS; i++)
    if ((test_infos[i].test & (TESTS_RDMA | TEST_RPC)) && (g.tests & test_infos[i].test))
      json_test(test_infos[i].test, test_infos[i].name);
  /* A run that failed: what was measured above, and the error. */
  printf(",\n  \"ok\": %s", failed ? "false" : "true");
  if (failed) {
    printf(",\n  \"error\": ");
    json_string(tool_first_error() != NULL ? tool_first_error() : "failed");
    if (g.failed_test != NULL) {
      printf(",\n  \"failed_test\": {\"test\": ");
      json_string(g.failed_test);
      printf(", \"bytes\": %" PRIu64 ", \"timed_iterations_done\": %" PRIu64 "}",
             g.failed_size, g.failed_done);
    }
  }
  printf("\n}\n");
  fflush(stdout);
}

/* ---- one test -------------------------------------------------------------------------------- */

/* Frees what run_test() allocated for the client; -1 if the region could not go (it then stays
 * allocated, and the loop refuses to be destroyed). */
static int client_free(void) {
  int rc = IBMSG_OK, failed = 0;
  if (cl.have_region && (rc = ibmsg_deregister_region(&cl.region)) != IBMSG_OK)
    tool_error("cannot deregister the region: %s", ibmsg_strerror(rc));
  cl.have_region = rc != IBMSG_OK;
  if (cl.nfree_reqs != cl.nreqs) {
    /* The connection closed, so every request's done callback must have come: the library
     * may still hold these, and so they stay where they are. */
    tool_error("%zu of %zu requests got no done callback before their connection closed",
               cl.nreqs - cl.nfree_reqs, cl.nreqs);
    failed = 1;
  } else {
    free(cl.reqs);
  }
  free(cl.rtt);
  free(cl.ops);
  free(cl.free_ops);
  free(cl.free_reqs);
  /* Every connection closed (the caller made sure): ibmsg is done with their sockets. */
  free(cl.conns);
  cl.conns = NULL;
  cl.nconns = 0;
  cl.rtt = NULL;
  cl.ops = NULL;
  cl.free_ops = NULL;
  cl.reqs = NULL;
  cl.free_reqs = NULL;
  cl.nreqs = cl.nfree_reqs = 0;
  return rc == IBMSG_OK && !failed ? 0 : -1;
}

/* The statistics of the round trips in cl.rtt (which it sorts). */
static void lat_stats(int test, uint64_t size, uint64_t n, struct lat_result *r) {
  double sum = 0, f = info_of(test)->us_per_s;
  qsort(cl.rtt, (size_t)n, sizeof *cl.rtt, cmp_double);
  for (uint64_t i = 0; i < n; i++)
    sum += cl.rtt[i];
  /* f turns seconds into microseconds, halving a round trip into one way. */
  r->test = test;
  r->size = test == TEST_ATOMIC_LAT ? 8 : size;
  r->iters = n;
  r->min = cl.rtt[0] * f;
  r->max = cl.rtt[n - 1] * f;
  r->median = (n % 2 ? cl.rtt[n / 2] : (cl.rtt[n / 2 - 1] + cl.rtt[n / 2]) / 2) * f;
  r->avg = sum / (double)n * f;
  /* p99 and p99.9 by nearest rank: the smallest sample that 99% (99.9%) of the samples do
   * not exceed. */
  r->p99 = cl.rtt[(n * 99 + 99) / 100 - 1] * f;
  r->p999 = cl.rtt[(n * 999 + 999) / 1000 - 1] * f;
}

static int run_test(int test, uint64_t size) {
  int rc, still_open;
  uint64_t n;

  memset(&cl, 0, sizeof cl);
  cl.test = test;
  cl.size = size;
  cl.warmup = g.warmup;
  cl.iters = g.iters;
  cl.total = g.warmup + g.iters; /* --duration: UINT64_MAX per connection until the time is up */
  cl.window = g.msg_window;
  if (test == TEST_BW && !g.window_given && size * cl.window > MSG_WINDOW_BYTES) {
    cl.window = MSG_WINDOW_BYTES / size;
    if (cl.window < MIN_MSG_WINDOW)
      cl.window = MIN_MSG_WINDOW;
  }
  /* Only the message bandwidth test uses more than one connection. */
  cl.nconns = test == TEST_BW ? (int)g.conns : 1;
  if (test == TEST_BW && !g.window_given && cl.nconns > 1) {
    int eager = 0;
    size_t len = sizeof eager;
    if (ibmsg_getopt(&g.loop, IBMSG_OPT_EAGER_SIZE, &eager, &len) == IBMSG_OK)
      cl.window = tool_window_share(ALL_WINDOW_BYTES, (uint64_t)cl.nconns, size,
                                    (uint64_t)(eager > 0 ? eager : 0), MIN_CONN_WINDOW, cl.window);
  }
  cl.conns = calloc((size_t)cl.nconns, sizeof *cl.conns);
  if (cl.conns == NULL) {
    tool_error("out of memory for %d connections", cl.nconns);
    cl.nconns = 0;
    return -1;
  }
  for (int i = 0; i < cl.nconns; i++)
    cl.conns[i].total = g.duration > 0 ? UINT64_MAX : cl.total;
  if ((test & (TESTS_LATENCY | TEST_RPC)) && g.duration == 0) {
    cl.rtt = malloc((size_t)g.iters * sizeof *cl.rtt);
    if (cl.rtt == NULL) {
      tool_error("out of memory for %" PRIu64 " samples", g.iters);
      client_free();
      return -1;
    }
    cl.rtt_cap = (size_t)g.iters;
  }
  if (test == TEST_RPC) {
    cl.reqs = calloc((size_t)g.outstanding, sizeof *cl.reqs);
    cl.free_reqs = calloc((size_t)g.outstanding, sizeof *cl.free_reqs);
    if (cl.reqs == NULL || cl.free_reqs == NULL) {
      tool_error("out of memory for %" PRIu64 " requests", g.outstanding);
      client_free();
      return -1;
    }
    cl.nreqs = (size_t)g.outstanding;
    for (size_t i = 0; i < cl.nreqs; i++)
      cl.free_reqs[cl.nfree_reqs++] = &cl.reqs[cl.nreqs - 1 - i];
  }
  if (test & TESTS_RDMA) {
    /* A latency test needs a second op: the next write may be due before the last one's done
     * callback came. */
    cl.nops = test & TESTS_LATENCY ? 2 : (size_t)g.window;
    cl.ops = calloc(cl.nops, sizeof *cl.ops);
    cl.free_ops = calloc(cl.nops, sizeof *cl.free_ops);
    if (cl.ops == NULL || cl.free_ops == NULL) {
      tool_error("out of memory for %zu operations", cl.nops);
      client_free();
      return -1;
    }
    for (size_t i = 0; i < cl.nops; i++)
      cl.free_ops[cl.nfree++] = &cl.ops[cl.nops - 1 - i];
  }
  rc = IBMSG_OK;
  for (int i = 0; i < cl.nconns && rc == IBMSG_OK; i++) {
    struct conn *c = &cl.conns[i];
    c->ep.role = ROLE_CLIENT;
    rc = tool_sendpool_init(&c->ep.pool, &c->ep.socket, &g.loop);
    if (rc == IBMSG_OK)
      rc = ibmsg_connect(&g.loop, &c->ep.socket, g.ip, g.port);
    if (rc != IBMSG_OK) {
      tool_error("cannot connect to %s port %u: %s", g.ip, g.port, ibmsg_strerror(rc));
      tool_sendpool_destroy(&c->ep.pool);
      break;
    }
    c->ep.socket.user_data = &c->ep;
    c->ep.open = 1;
    cl.nopen++;
  }

  if (rc == IBMSG_OK)
    rc = client_wait(&cl.finished);
  for (int i = 0; i < cl.nconns && i < NOTED_CONNS; i++)
    if (cl.conns[i].ep.open && cl.conns[i].established)
      client_note_memory(&cl.conns[i]);
  if (g.memory)
    tool_memwatch_sample(&g.mem, &g.loop, (uint64_t)cl.nestablished - (uint64_t)cl.nclosed);
  /* --interval without --duration: the last part of the last interval. */
  if (rc == 0 && g.interval > 0 && !cl.stopped && cl.t_start != 0 &&
      timed_done() > cl.done_last_report) {
    if (cl.t_last_report == 0)
      cl.t_last_report = cl.t_start;
    report_interval(tool_now());
  }
  if (rc != 0) {
    g.failed_test = info_of(test)->name;
    g.failed_size = test == TEST_ATOMIC_LAT ? 8 : size;
    g.failed_done = timed_done();
  }
  still_open = client_close();
  if (rc != 0 || still_open) {
    if (!still_open)
      client_free();
    return -1;
  }
  n = timed_done(); /* all connections' timed iterations: -n each, or what --duration allowed */
  if (n == 0) {
    tool_error("%s test, %" PRIu64 " bytes: no timed iteration was done", info_of(test)->name,
               size);
    g.failed_test = info_of(test)->name;
    g.failed_size = test == TEST_ATOMIC_LAT ? 8 : size;
    g.failed_done = 0;
    client_free();
    return -1;
  }

  if (test == TEST_RPC) {
    struct rpc_result *r = &g.rpc[g.nrpc++];
    lat_stats(test, size, n, &r->lat);
    r->outstanding = g.outstanding;
    r->seconds = cl.t_end - cl.t_start;
    r->rate = r->seconds > 0 ? (double)n / r->seconds : 0;
    report_rpc(r);
  } else if (test & TESTS_LATENCY) {
    struct lat_result *r = &g.lat[g.nlat++];
    lat_stats(test, size, n, r);
    report_lat(r);
  } else {
    struct bw_result *r = &g.bw[g.nbw++];
    r->test = test;
    r->size = size;
    r->iters = n / (uint64_t)cl.nconns; /* per connection (-n, or their mean with --duration) */
    r->window = test & TESTS_RDMA ? g.window : cl.window;
    r->conns = (uint64_t)cl.nconns;
    r->seconds = cl.t_end - cl.t_start;
    r->mbps = r->seconds > 0 ? (double)(size * n) / r->seconds / 1e6 : 0;
    r->mpps = r->seconds > 0 ? (double)n / r->seconds / 1e6 : 0;
    r->conn_mps = test == TEST_BW ? calloc((size_t)cl.nconns, sizeof *r->conn_mps) : NULL;
    if (test == TEST_BW && r->conn_mps == NULL)
      tool_error("out of memory for the rates of %d connections", cl.nconns); /* not in JSON */
    for (int i = 0; i < cl.nconns && r->conn_mps != NULL; i++) {
      double t = cl.conns[i].t_done - cl.t_start;
      r->conn_mps[i] = t > 0 ? (double)(cl.conns[i].total - cl.warmup) / t : 0;
    }
    report_bw(r);
  }
  return client_free();
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
    if (tool_parse_size("-s", tok, 0, PERF_MAX_MSG_SIZE, &v) != 0)
      return -1;
    g.sizes[g.nsizes++] = v;
  }
  if (g.nsizes == 0) {
    tool_usage_error("-s: no size given");
    return -1;
  }
  return 0;
}

/* -t: a comma-separated list of test names, "send", "rdma" or "all". */
static int parse_tests(const char *arg) {
  char buf[256], *save = NULL, *tok;

  if (strlen(arg) >= sizeof buf) {
    tool_usage_error("-t: the list is too long");
    return -1;
  }
  strcpy(buf, arg);
  g.tests = 0;
  for (tok = strtok_r(buf, ",", &save); tok != NULL; tok = strtok_r(NULL, ",", &save)) {
    int test = 0;
    for (int i = 0; i < NTESTS && test == 0; i++)
      if (strcmp(tok, test_infos[i].name) == 0)
        test = test_infos[i].test;
    if (strcmp(tok, "send") == 0)
      test = TESTS_SEND;
    else if (strcmp(tok, "rdma") == 0)
      test = TESTS_RDMA;
    else if (strcmp(tok, "all") == 0)
      test = TESTS_SEND | TEST_RPC | TESTS_RDMA;
    if (test == 0) {
      tool_usage_error("-t: '%s' is not a test (see --help)", tok);
      return -1;
    }
    g.tests |= test;
  }
  if (g.tests == 0) {
    tool_usage_error("-t: no test given");
    return -1;
  }
  return 0;
}

static int parse_args(int argc, char **argv) {
  enum {
    OPT_SERVER = 256,
    OPT_LOOPBACK,
    OPT_MAX_SIZE,
    OPT_EAGER_SIZE,
    OPT_BUSY_POLL,
    OPT_POLL_US,
    OPT_JSON,
    OPT_MEMORY,
    OPT_RECV_BUDGET,
    OPT_VERSION
  };
  const char *client_option = NULL; /* the first client-only option given */
  static const struct option options[] = {
      {"server", no_argument, NULL, OPT_SERVER},
      {"loopback", no_argument, NULL, OPT_LOOPBACK},
      {"port", required_argument, NULL, 'p'},
      {"test", required_argument, NULL, 't'},
      {"sizes", required_argument, NULL, 's'},
      {"iters", required_argument, NULL, 'n'},
      {"warmup", required_argument, NULL, 'w'},
      {"window", required_argument, NULL, 'W'},
      {"connections", required_argument, NULL, 'c'},
      {"threads", required_argument, NULL, 'T'},
      {"outstanding", required_argument, NULL, 'o'},
      {"busy-poll", no_argument, NULL, OPT_BUSY_POLL},
      {"poll-us", required_argument, NULL, OPT_POLL_US},
      {"max-size", required_argument, NULL, OPT_MAX_SIZE},
      {"eager-size", required_argument, NULL, OPT_EAGER_SIZE},
      {"json", no_argument, NULL, OPT_JSON},
      {"memory", no_argument, NULL, OPT_MEMORY},
      {"recv-budget", required_argument, NULL, OPT_RECV_BUDGET},
      {"duration", required_argument, NULL, 'D'},
      {"interval", required_argument, NULL, 'i'},
      {"quiet", no_argument, NULL, 'q'},
      {"help", no_argument, NULL, 'h'},
      {"version", no_argument, NULL, OPT_VERSION},
      {NULL, 0, NULL, 0}};
  uint64_t v;
  int opt;

  g.port = TOOL_DEFAULT_PORT;
  g.tests = TEST_LAT | TEST_BW;
  g.sizes[0] = 64;
  g.sizes[1] = 4096;
  g.sizes[2] = 65536;
  g.nsizes = 3;
  g.iters = 1000;
  g.warmup = 32;
  g.window = 128;
  g.conns = 1;
  g.threads_arg = 1;
  g.outstanding = 1;
  opterr = 0; /* we print our own one-line errors */
  while ((opt = getopt_long(argc, argv, ":p:t:s:n:w:W:c:T:o:D:i:qh", options, NULL)) != -1) {
    switch (opt) {
    case OPT_SERVER: g.server = 1; break;
    case OPT_LOOPBACK: g.loopback = 1; break;
    case 'p':
      if (tool_parse_port("-p", optarg, 1, &g.port) != 0) /* 0: checked below */
        return -1;
      g.port_given = 1;
      break;
    case 't':
      if (parse_tests(optarg) != 0)
        return -1;
      break;
    case 's':
      if (parse_sizes(optarg) != 0)
        return -1;
      break;
    case 'n':
      if (tool_parse_uint("-n", optarg, 1, 100000000, &g.iters) != 0)
        return -1;
      g.iters_given = 1;
      break;
    case 'D':
      if (tool_parse_uint("--duration", optarg, 1, 86400, &g.duration) != 0)
        return -1;
      client_option = client_option ? client_option : "--duration";
      break;
    case 'i':
      if (tool_parse_uint("--interval", optarg, 1, 86400, &g.interval) != 0)
        return -1;
      client_option = client_option ? client_option : "--interval";
      break;
    case 'w':
      if (tool_parse_uint("-w", optarg, 0, 100000000, &g.warmup) != 0)
        return -1;
      break;
    case 'W':
      /* the range of IBMSG_OPT_RDMA_DEPTH, which is set to it */
      if (tool_parse_uint("-W", optarg, 1, 4096, &g.window) != 0)
        return -1;
      g.window_given = 1;
      break;
    case 'c':
      if (tool_parse_uint("-c", optarg, 1, MAX_CONNS, &g.conns) != 0)
        return -1;
      g.conns_given = 1;
      break;
    case 'T':
      if (tool_parse_uint("-T", optarg, 1, MAX_THREADS, &g.threads_arg) != 0)
        return -1;
      break;
    case 'o':
      if (tool_parse_uint("-o", optarg, 1, MAX_OUTSTANDING, &g.outstanding) != 0)
        return -1;
      break;
    case OPT_BUSY_POLL:
    case OPT_POLL_US:
      if (g.busy_poll_given) {
        tool_usage_error("give one of --busy-poll and --poll-us, once");
        return -1;
      }
      g.busy_poll_given = 1;
      if (opt == OPT_BUSY_POLL) {
        g.busy_poll = IBMSG_BUSY_POLL_ALWAYS;
      } else {
        /* the range of IBMSG_OPT_BUSY_POLL, which is set to it */
        if (tool_parse_uint("--poll-us", optarg, 0, 10000000, &v) != 0)
          return -1;
        g.busy_poll = (int)v;
      }
      break;
    case OPT_MAX_SIZE:
      if (tool_parse_size("--max-size", optarg, HELLO_DESC_SIZE, PERF_MAX_MSG_SIZE,
                          &g.max_size) != 0)
        return -1;
      g.max_size_given = 1;
      break;
    case OPT_EAGER_SIZE:
      if (tool_parse_size("--eager-size", optarg, 1, PERF_MAX_EAGER_SIZE, &g.eager_size) != 0)
        return -1;
      g.eager_size_given = 1;
      break;
    case OPT_JSON: g.json = 1; break;
    case OPT_MEMORY: g.memory = 1; break;
    case OPT_RECV_BUDGET:
      if (tool_parse_size("--recv-budget", optarg, 0, (uint64_t)1 << 48, &g.recv_budget) != 0)
        return -1;
      g.recv_budget_given = 1;
      break;
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
  if (g.threads_arg > 1 && !g.server) {
    tool_usage_error("--threads is for --server");
    return -1;
  }
  if (g.memory && g.threads_arg > 1) {
    tool_usage_error("--memory goes with one loop: not with --threads");
    return -1;
  }
  if (g.server && client_option != NULL) {
    tool_usage_error("%s is a client option: it does not go with --server (the client tells "
                     "the server how long a test runs)", client_option);
    return -1;
  }
  if (g.duration > 0 && g.iters_given) {
    tool_usage_error("-n and --duration exclude each other: a test runs for a count or a time");
    return -1;
  }
  g.threads = (int)g.threads_arg;
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
  if (g.port_given && g.port == 0 && !g.server && !g.loopback) {
    tool_usage_error("-p 0 (any free port) is for --server and --loopback only: a client needs "
                     "the server's port");
    return -1;
  }
  for (int i = 0; i < g.nsizes; i++) {
    if (g.sizes[i] == 0 && (g.tests & TESTS_RDMA & ~TEST_ATOMIC_LAT)) {
      tool_usage_error("-s: an RDMA operation moves at least 1 byte");
      return -1;
    }
  }
  if (g.max_size_given && !g.server && (g.tests & TESTS_MESSAGES)) {
    /* The client side needs room for its largest message; the server has only --max-size. The
     * RDMA tests send no messages of their size. Without --max-size the library's maximum
     * takes every size. */
    for (int i = 0; i < g.nsizes; i++)
      if (g.max_size < g.sizes[i])
        g.max_size = g.sizes[i];
  }
  g.msg_window = g.window_given ? g.window : DEFAULT_MSG_WINDOW;
  if (g.loopback && !g.port_given)
    g.port = 0; /* any free port: nothing else needs to know it */
  return 0;
}

/* ---- main ------------------------------------------------------------------------------------ */

/* IBMSG_OPT_MAX_MSG_SIZE: an int up to INT_MAX, a uint64_t (told apart by its length) above. */
static int set_max_size(ibmsg_event_loop *loop, uint64_t size) {
  int rc;
  if (size <= INT_MAX) {
    int v = (int)size;
    rc = ibmsg_setopt(loop, IBMSG_OPT_MAX_MSG_SIZE, &v, sizeof v);
  } else {
    rc = ibmsg_setopt(loop, IBMSG_OPT_MAX_MSG_SIZE, &size, sizeof size);
  }
  if (rc != IBMSG_OK) {
    tool_error("cannot set the maximum message size to %" PRIu64 ": %s", size,
               ibmsg_strerror(rc));
    return -1;
  }
  return 0;
}

static int start_listener(void) {
  char addr[64], mode[64];
  unsigned short port;
  /* The server: its -c, or DEFAULT_SERVER_CONNS; --loopback: the client's connections, and room
   * for those of the test before that are still closing. */
  int most = g.server ? (g.conns_given ? (int)g.conns : DEFAULT_SERVER_CONNS)
                      : (int)g.conns + DEFAULT_SERVER_CONNS;
  int rc = ibmsg_listen(&g.loop, &g.listener.socket, g.ip, g.port, most);
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
  if (g.server && g.threads > 1)
    tool_info(g.quiet, "listening on %s port %u (completions: %s), %d threads", addr, g.port,
              poll_mode(mode, sizeof mode), g.threads);
  else if (g.server)
    tool_info(g.quiet, "listening on %s port %u (completions: %s)", addr, g.port,
              poll_mode(mode, sizeof mode));
  return 0;
}

/* Closes the sessions of one loop, on its own thread. */
static void stop_sessions(struct perf_loop *pl) {
  for (struct endpoint *s = pl->sessions; s != NULL; s = s->next) {
    tool_sendpool_release(&s->pool);
    ibmsg_disconnect(&s->socket); /* its connection_closed comes from the loop, later */
  }
}

/* The listener first: a session it handed to another loop is started there before the stop
 * posted after it. */
static void stop_server_side(void) {
  if (g.listener.open)
    ibmsg_disconnect(&g.listener.socket);
  stop_sessions(&loops[0]);
}

/* ---- the other loops' threads ---------------------------------------------------------------- */

/* On the main thread: a loop's thread ended on an error. */
static void loop_failed_call(void *arg) {
  (void)arg;
  g.loop_failed = 1;
}

/* On a loop's own thread: close its sessions and end. */
static void loop_stop_call(void *arg) {
  struct perf_loop *pl = arg;
  pl->stop = 1;
  stop_sessions(pl);
}

/* The thread of one of the other loops: serves its sessions until told to stop, waits for them
 * to close, and destroys the loop. */
static void *loop_thread(void *arg) {
  struct perf_loop *pl = arg;
  double deadline = 0;
  int rc;

  for (;;) {
    if (pl->stop) {
      if (deadline == 0)
        deadline = tool_now() + CLOSE_TIMEOUT_S;
      if (pl->sessions == NULL || tool_now() > deadline)
        break;
    }
    rc = ibmsg_dispatch_event_loop_timeout(pl->loop, TOOL_TICK_MS);
    if (rc != IBMSG_OK) {
      tool_error("thread %d: event loop failed: %s", pl->index, ibmsg_strerror(rc));
      pl->failed = 1;
      ibmsg_event_loop_call(&g.loop, loop_failed_call, pl);
      return NULL; /* the main thread destroys the loop once it has joined this thread */
    }
  }
  if (pl->sessions != NULL) {
    tool_error("thread %d: sockets did not close within %.0f s", pl->index, CLOSE_TIMEOUT_S);
    pl->failed = 1;
  }
  return NULL;
}

static int configure_loop(ibmsg_event_loop *loop, uint64_t send_depth);

/* --threads N: the other N - 1 loops, with the main loop's callbacks and options, each on a
 * thread of its own. */
static int start_loops(uint64_t send_depth) {
  loops[0].loop = &g.loop;
  loops[0].index = 1;
  for (int i = 1; i < g.threads; i++) {
    struct perf_loop *pl = &loops[i];
    int rc = ibmsg_init_event_loop(&pl->own);
    pl->index = i + 1;
    if (rc != IBMSG_OK) {
      tool_error("cannot create the event loop of thread %d: %s", pl->index, ibmsg_strerror(rc));
      return -1;
    }
    pl->loop = &pl->own;
    pl->own.connection_established = g.loop.connection_established;
    pl->own.message_received = g.loop.message_received;
    pl->own.message_sent = g.loop.message_sent;
    pl->own.connection_closed = g.loop.connection_closed;
    pl->own.write_received = g.loop.write_received;
    if (configure_loop(pl->loop, send_depth) != 0)
      return -1;
    rc = pthread_create(&pl->thread, NULL, loop_thread, pl);
    if (rc != 0) {
      tool_error("cannot start thread %d: %s", pl->index, strerror(rc));
      return -1;
    }
    pl->running = 1;
  }
  return 0;
}

/* Stops the other loops' threads, joins them and destroys their loops; their counts. -1 if one
 * failed. */
static int stop_loops(void) {
  int failed = 0, rc;
  for (int i = 1; i < g.threads; i++) {
    struct perf_loop *pl = &loops[i];
    if (pl->running && ibmsg_event_loop_call(pl->loop, loop_stop_call, pl) != IBMSG_OK)
      pl->stop = 1; /* cannot happen but for lack of memory: the thread then ends at a tick */
  }
  for (int i = 1; i < g.threads; i++) {
    struct perf_loop *pl = &loops[i];
    if (pl->running) {
      pthread_join(pl->thread, NULL);
      pl->running = 0;
    }
    failed |= pl->failed;
    /* The thread is done with the loop: this one may destroy it (calls posted to it meanwhile,
     * such as its stop when the thread ended early, run first). */
    if (pl->loop != NULL) {
      ibmsg_event_loop_process(pl->loop);
      rc = ibmsg_destroy_event_loop(pl->loop);
      if (rc != IBMSG_OK) {
        tool_error("cannot destroy the event loop of thread %d: %s", pl->index,
                   ibmsg_strerror(rc));
        failed = 1;
      }
      pl->loop = NULL;
    }
  }
  return failed ? -1 : 0;
}

/* At the server's exit with --threads above 1: how the connections were spread. */
static void print_loop_counts(void) {
  for (int i = 0; i < g.threads; i++)
    tool_info(0, "thread %d: %" PRIu64 " connection%s", loops[i].index, loops[i].established,
              TOOL_S(loops[i].established));
}

/* The options of a loop (each of the server's loops gets the same). */
static int configure_loop(ibmsg_event_loop *loop, uint64_t send_depth) {
  if ((g.max_size_given && set_max_size(loop, g.max_size) != 0) ||
      (g.eager_size_given && tool_setopt_int(loop, IBMSG_OPT_EAGER_SIZE, "the eager size",
                                             (int)g.eager_size) != 0) ||
      tool_setopt_int(loop, IBMSG_OPT_BUSY_POLL, "busy polling", g.busy_poll) != 0 ||
      (g.recv_budget_given && tool_setopt_u64(loop, IBMSG_OPT_SHARED_RECV_BUDGET,
                                             "the receive budget", g.recv_budget) != 0) ||
      (!g.server && (g.tests & TESTS_RDMA) &&
       tool_setopt_int(loop, IBMSG_OPT_RDMA_DEPTH, "the RDMA operations in flight",
                       (int)g.window) != 0) ||
      (send_depth > 0 &&
       (tool_setopt_int(loop, IBMSG_OPT_SEND_DEPTH, "the send buffers per connection",
                        (int)send_depth) != 0 ||
        (send_depth > DEFAULT_MSG_WINDOW &&
         tool_setopt_int(loop, IBMSG_OPT_SEND_QUEUE, "the send queue",
                         (int)send_depth) != 0))))
    return -1;
  return 0;
}

int main(int argc, char **argv) {
  int failed = 0, rc;
  uint64_t send_depth = 0; /* the client's IBMSG_OPT_SEND_DEPTH, when it sets it */

  tool_name = "ibmsg-perf";
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (parse_args(argc, argv) != 0)
    return TOOL_EXIT_USAGE;
  tool_catch_signals();

  rc = ibmsg_init_event_loop(&g.loop);
  if (rc != IBMSG_OK) {
    tool_error("cannot create the event loop: %s", ibmsg_strerror(rc));
    if (g.json && !g.server)
      print_json(1);
    return TOOL_EXIT_FAILURE;
  }
  g.loop.connection_request = on_request;
  g.loop.connection_established = on_established;
  g.loop.message_received = on_received;
  g.loop.message_sent = on_sent;
  g.loop.connection_closed = on_closed;
  g.loop.write_received = on_write_received;
  /* The bandwidth window must fit in flight, or operations would wait in ibmsg's send queue.
   * The message window is the send buffers: with more than the send queue holds, posts would
   * fail with IBMSG_EAGAIN until some are sent. rpc needs a send buffer per request until its
   * message_sent, which waits for a credit: --outstanding of them, beyond the default. */
  if (!g.server && (g.tests & TEST_BW) && g.window_given)
    send_depth = g.msg_window;
  if (!g.server && (g.tests & TEST_RPC) &&
      g.outstanding > (send_depth > 0 ? send_depth : DEFAULT_MSG_WINDOW))
    send_depth = g.outstanding;
  if (configure_loop(&g.loop, send_depth) != 0) {
    ibmsg_destroy_event_loop(&g.loop);
    if (g.json && !g.server)
      print_json(1);
    return TOOL_EXIT_FAILURE;
  }
  g.server_quiet = g.loopback;
  loops[0].loop = &g.loop;
  loops[0].index = 1;
  if (g.threads > 1 && start_loops(send_depth) != 0) {
    stop_loops();
    ibmsg_destroy_event_loop(&g.loop);
    return TOOL_EXIT_FAILURE;
  }
  if ((g.server || g.loopback) && start_listener() != 0) {
    stop_loops();
    ibmsg_destroy_event_loop(&g.loop);
    if (g.json && !g.server)
      print_json(1);
    return TOOL_EXIT_FAILURE;
  }

  if (g.server) {
    /* Everything happens in the callbacks; a signal ends the service. */
    while (!tool_stop && !g.loop_failed && g.listener.open) {
      rc = ibmsg_dispatch_event_loop_timeout(&g.loop, TOOL_TICK_MS);
      if (rc != IBMSG_OK) {
        tool_error("event loop failed: %s", ibmsg_strerror(rc));
        failed = 1;
        break;
      }
    }
    if (!tool_stop && !failed)
      failed = 1; /* the listener closed by itself (reported by on_closed), or a thread failed */
    if (g.memory)
      tool_memwatch_print(&g.mem);
  } else {
    for (int t = 0; t < NTESTS && !failed; t++) {
      int test = test_infos[t].test;
      if (!(g.tests & test))
        continue;
      /* An atomic is 8 bytes whatever the sizes: it runs once. */
      for (int i = 0; i < (test == TEST_ATOMIC_LAT ? 1 : g.nsizes) && !failed; i++) {
        failed = run_test(test, g.sizes[i]) != 0;
      }
    }
    if (g.json) {
      print_json(failed); /* also when a test failed: what was measured, and the error */
    } else {
      if (!failed)
        print_memory();
      if (g.memory)
        tool_memwatch_print(&g.mem);
      if (!failed && !g.quiet)
        print_rule();
    }
  }

  stop_server_side();
  if (stop_loops() != 0)
    failed = 1;
  if (g.server && g.threads > 1)
    print_loop_counts();
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
