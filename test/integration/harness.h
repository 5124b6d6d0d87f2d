/*
 * harness.h - shared helpers for the ibmsg integration tests.
 *
 * The integration tests are cmocka programs that run against a real RDMA device (the Soft-RoCE VM
 * of test/softroce/run, or real hardware named by IBMSG_TEST_ADDR). Each test function gets a
 * fresh h_ctx from h_setup(): one ibmsg_event_loop with RNR retry disabled (so that a credit bug
 * fails loudly as a transport error instead of being retried away), room for a listener, clients
 * and accepted server sockets, and callbacks that record what they see per socket.
 *
 * Callbacks never fail the test themselves: cmocka's longjmp must not cross the library's stack
 * frames. They note the first problem in ctx->error, and every wait (H_RUN_UNTIL, h_run_for)
 * fails the test with it. Every wait is bounded, and a watchdog alarm ends a test program whose
 * test blocks inside a library call: it fires after H_WATCHDOG_S seconds in which the test never
 * came back to the harness (no step of a wait, no callback), so a test that keeps moving on a
 * slow, loaded machine is not ended by it, however long it takes.
 *
 * Socket and loop user_data point at the harness's records: ctx->loop.user_data is the h_ctx,
 * socket->user_data the h_conn that embeds the socket.
 */
#ifndef IBMSG_TEST_HARNESS_H
#define IBMSG_TEST_HARNESS_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "ibmsg.h"

#define H_MAX_CONNS 64    /* clients, and accepted server sockets, per test */
#define H_MAX_HELD 256    /* received messages one socket can hold without freeing them */
#define H_STREAM_BUFS 1024 /* send buffers one stream uses at most */
#define H_MAX_MSGS 64     /* test-owned messages in ctx->msgs */
#define H_TIMEOUT_MS 15000 /* default bound for one connection step (the VM is emulated: slow) */
#define H_WATCHDOG_S 240  /* a test stuck this long (no progress at all) ends the program */

typedef struct h_ctx h_ctx;
typedef struct h_conn h_conn;

/** What the harness's connection_request callback does with a request. */
enum h_decision { H_ACCEPT, H_REJECT, H_UNDECIDED };

/** One socket under test and what its callbacks saw. */
struct h_conn {
  ibmsg_socket sock; /* first member: user_data points here */
  h_ctx *ctx;
  char name[32];   /* "client 3", "server 0", "listener": used in failure messages */
  int active;      /* ibmsg_listen/connect/accept succeeded on it: it must get closed */

  int established;                    /* connection_established callbacks */
  int closed;                         /* connection_closed callbacks */
  int close_reason;                   /* reason given to connection_closed (-1 before) */
  enum ibmsg_socket_status close_status; /* socket->status inside connection_closed */
  int sent_at_close;                  /* message_sent callbacks seen before connection_closed */
  uint64_t closed_at_ms;              /* h_now_ms() at connection_closed */

  int posted;        /* successful ibmsg_post_send() through the harness */
  int sent;          /* message_sent callbacks */
  int sent_ok;       /* ... with IBMSG_OK */
  int sent_canceled; /* ... with IBMSG_ECANCELED */
  int sent_other;    /* ... with anything else */
  int last_sent_status;

  int received;              /* message_received callbacks */
  size_t received_bytes;
  size_t last_received_size;

  /* Receiving: with verify, every message must carry the next sequence number (h_fill) and, when
   * expect_size >= 0, have that size. With hold, messages are kept (lent) in held[] instead of
   * being freed at once; h_release_held() frees them. */
  int verify;
  uint32_t recv_seq;
  long expect_size;
  int hold;
  ibmsg_buffer *held[H_MAX_HELD];
  int n_held;

  /* Sending: h_fill() numbers messages with send_seq. A stream (h_stream_start) keeps up to
   * stream_nbufs messages posted and re-posts each from its message_sent until stream_total
   * messages have gone out; then it frees them. */
  uint32_t send_seq;
  int stream_total;
  int stream_posted;
  int stream_inflight;
  int stream_nbufs;
  size_t stream_size;
  ibmsg_buffer stream_msgs[H_STREAM_BUFS];
  int stream_busy[H_STREAM_BUFS];
  int expect_send_errors; /* message_sent with an error is expected (disconnect tests) */
};

struct h_ctx {
  ibmsg_event_loop loop;
  int loop_initialized;
  const char *addr; /* IBMSG_TEST_ADDR */

  h_conn listener;
  unsigned short port; /* the listener's port (it listens on port 0) */
  h_conn clients[H_MAX_CONNS];
  int n_clients;
  h_conn servers[H_MAX_CONNS]; /* accepted in the connection_request callback, in order */
  int n_servers;

  enum h_decision decision;  /* H_ACCEPT unless a test changes it */
  const char *reject_reason; /* for H_REJECT */
  int requests;              /* connection_request callbacks */
  int accept_failures;       /* ibmsg_accept() calls that failed in the callback */
  int last_accept_rc;
  char request_peer[64];     /* peer_address of the last request */
  unsigned short request_peer_port;

  /* Test-owned send messages (heap, so a failed test cannot leave the library pointing into a
   * dead stack frame). outstanding[i] counts posts of msgs[i] without a message_sent yet. */
  ibmsg_buffer msgs[H_MAX_MSGS];
  int outstanding[H_MAX_MSGS];

  /* Option sets for h_listen, h_connect and the harness's accept (NULL: the plain calls). */
  ibmsg_options *listen_opts;
  ibmsg_options *connect_opts;
  ibmsg_options *accept_opts;

  char error[512]; /* the first problem a callback saw; fails the next wait */

  /** Drives the loop for at most max_wait_ms; default: ibmsg_dispatch_event_loop_timeout(). */
  int (*step)(h_ctx *ctx, int max_wait_ms);

  /* Optional hooks, run after the harness's own bookkeeping. */
  void (*on_request)(h_ctx *ctx, ibmsg_connection_request *request); /* replaces `decision` */
  void (*on_established)(h_conn *conn);
  void (*on_received)(h_conn *conn, ibmsg_buffer *msg); /* replaces hold/free: owns msg */
  void (*on_sent)(h_conn *conn, ibmsg_buffer *msg, int status);
  void (*on_closed)(h_conn *conn, int reason);
  void *data; /* the test's own */
};

/* --- set up and tear down ------------------------------------------------------------------ */

/** Remembers the program name and applies an optional test-name filter (argv[1], '*' and '?'). */
void h_init(int argc, char **argv);
/** The value of an environment variable; fails the test if it is unset or empty. */
const char *h_env(const char *name);
/** A new context with its loop initialized (on the application's libev loop `ev` when not NULL),
 *  the harness callbacks installed and IBMSG_OPT_RNR_RETRY set to 0. Fails the test on error. */
h_ctx *h_ctx_create(struct ev_loop *ev);
/** Best-effort cleanup of whatever a test left open (bounded); never fails. Returns 0 if the loop
 *  could be destroyed, else leaks the context on purpose (the library may still point into it). */
int h_ctx_cleanup(h_ctx *ctx);
/** cmocka setup/teardown: *state = h_ctx_create(NULL) and a watchdog; cleanup. */
int h_setup(void **state);
int h_teardown(void **state);
/** (Re)arms the watchdog: the program ends (exit status 3) with a message if the test stands
 *  still (never back in the harness: no wait step, no callback) for `seconds`. */
void h_watchdog(unsigned seconds);

#define H_TEST(f) cmocka_unit_test_setup_teardown(f, h_setup, h_teardown)

/* --- assertions with messages that say what went wrong ------------------------------------- */

/** Fails the test at file:line with a formatted message. */
void h_fail_at(const char *file, int line, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
/** Notes a problem seen in a callback (only the first is kept); the next wait fails with it. */
void h_note_error(h_ctx *ctx, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
void h_assert_code_at(int got, int expected, const char *expr, const char *file, int line);

#define H_CHECK(cond, ...)                                                                      \
  do {                                                                                          \
    if (!(cond)) h_fail_at(__FILE__, __LINE__, __VA_ARGS__);                                     \
  } while (0)
/** expr must return the ibmsg code `expected`; the message names both codes. */
#define H_ASSERT_CODE(expr, expected) h_assert_code_at((expr), (expected), #expr, __FILE__, __LINE__)
#define H_ASSERT_OK(expr) H_ASSERT_CODE(expr, IBMSG_OK)
/** The integer `actual` must equal `expected`; `what` describes it. */
#define H_ASSERT_EQ(actual, expected, what)                                                     \
  do {                                                                                          \
    long h__a = (long)(actual), h__e = (long)(expected);                                        \
    if (h__a != h__e) h_fail_at(__FILE__, __LINE__, "%s is %ld, expected %ld", (what), h__a, h__e); \
  } while (0)
/** The socket status (enum ibmsg_socket_status) `actual` must be `expected`. */
#define H_ASSERT_STATUS(actual, expected, what)                                                 \
  do {                                                                                          \
    int h__a = (int)(actual), h__e = (int)(expected);                                           \
    if (h__a != h__e)                                                                           \
      h_fail_at(__FILE__, __LINE__, "%s is %s, expected %s", (what), h_status_name(h__a),       \
                h_status_name(h__e));                                                           \
  } while (0)
/** The error code `actual` (a callback's reason or status) must be `expected`. */
#define H_ASSERT_REASON(actual, expected, what)                                                 \
  do {                                                                                          \
    int h__a = (int)(actual), h__e = (int)(expected);                                           \
    if (h__a != h__e)                                                                           \
      h_fail_at(__FILE__, __LINE__, "%s is %s (%d), expected %s (%d)", (what),                 \
                ibmsg_err_name(h__a), h__a, ibmsg_err_name(h__e), h__e);                        \
  } while (0)

const char *h_status_name(int socket_status);

/* --- driving the loop ---------------------------------------------------------------------- */

uint64_t h_now_ms(void);
/** One bounded step of the loop; fails the test if a callback noted an error, if the deadline
 *  (h_now_ms() value) passed, or if the loop returned an error. Used by H_RUN_UNTIL. */
void h_step_at(h_ctx *ctx, uint64_t deadline, int timeout_ms, const char *what, const char *file,
               int line);
/** Runs the loop until cond is true; fails the test after timeout_ms. cond may be a flag, a
 *  comparison or a predicate call. */
#define H_RUN_UNTIL(ctx, cond, timeout_ms)                                                      \
  do {                                                                                          \
    uint64_t h__deadline = h_now_ms() + (uint64_t)(timeout_ms);                                 \
    while (!(cond)) h_step_at((ctx), h__deadline, (timeout_ms), #cond, __FILE__, __LINE__);      \
    h_check_errors_at((ctx), __FILE__, __LINE__);                                               \
  } while (0)
/** The harness's callbacks so far (any socket, any kind): what H_RUN_UNTIL_PROGRESS watches. */
unsigned long h_events(void);
void h_step_idle_at(h_ctx *ctx, uint64_t deadline, int idle_ms, const char *what,
                    const char *file, int line);
/** H_RUN_UNTIL for long transfers (streams, many connections): fails only after idle_ms in which
 *  no harness callback came at all. The limit follows the progress, so a slow, loaded machine
 *  that keeps delivering is not failed by a fixed bound on the whole transfer, and a transfer
 *  that stalls fails idle_ms after its last callback. Not for bounds that are the behaviour
 *  under test (use H_RUN_UNTIL and check the time). */
#define H_RUN_UNTIL_PROGRESS(ctx, cond, idle_ms)                                                \
  do {                                                                                          \
    unsigned long h__ev = h_events();                                                           \
    uint64_t h__deadline = h_now_ms() + (uint64_t)(idle_ms);                                    \
    while (!(cond)) {                                                                           \
      if (h_events() != h__ev) {                                                                \
        h__ev = h_events();                                                                     \
        h__deadline = h_now_ms() + (uint64_t)(idle_ms);                                         \
      }                                                                                         \
      h_step_idle_at((ctx), h__deadline, (idle_ms), #cond, __FILE__, __LINE__);                 \
    }                                                                                           \
    h_check_errors_at((ctx), __FILE__, __LINE__);                                               \
  } while (0)
/** Runs the loop for ms milliseconds (to let things happen that must not), failing on errors. */
#define h_run_for(ctx, ms) h_run_for_at((ctx), (ms), __FILE__, __LINE__)
void h_run_for_at(h_ctx *ctx, int ms, const char *file, int line);
void h_check_errors_at(h_ctx *ctx, const char *file, int line);

/* --- sockets ------------------------------------------------------------------------------- */

/** ibmsg_listen() on ip (port 0) into ctx->listener; stores the picked port in ctx->port. */
void h_listen(h_ctx *ctx, const char *ip, int max_connections);
/** ibmsg_connect() a new client (ctx->clients[ctx->n_clients++]); asserts it starts. */
h_conn *h_connect(h_ctx *ctx, const char *ip, unsigned short port);
/** Like h_connect() but returns ibmsg_connect()'s code (the client is active only on IBMSG_OK). */
int h_try_connect(h_ctx *ctx, h_conn **client, const char *ip, unsigned short port);
/** ibmsg_connect() to ip/port must fail with `expected`: at once (then, with quiet, no
 *  connection_closed may follow within 300 ms), or later in connection_closed within timeout_ms
 *  without connection_established. `what` names the attempt in failures. Returns the client. */
#define h_connect_must_fail(ctx, ip, port, expected, timeout_ms, quiet, what)                  \
  h_connect_must_fail_at((ctx), (ip), (port), (expected), (timeout_ms), (quiet), (what),       \
                         __FILE__, __LINE__)
h_conn *h_connect_must_fail_at(h_ctx *ctx, const char *ip, unsigned short port, int expected,
                               int timeout_ms, int quiet, const char *what, const char *file,
                               int line);
/** Listens on IBMSG_TEST_ADDR if nothing listens yet, connects a client and waits until the
 *  client and the server socket accepted for it are both established. */
void h_pair(h_ctx *ctx, h_conn **client, h_conn **server);
/** h_pair() connecting to ip (the listener must already listen where ip leads). */
void h_pair_to(h_ctx *ctx, const char *ip, h_conn **client, h_conn **server);
/** Accepts the request into the next ctx->servers[] slot (what H_ACCEPT does); for hooks. */
int h_accept(h_ctx *ctx, ibmsg_connection_request *request);
/** The accepted server socket whose peer is this client (matched by address and port). */
h_conn *h_server_of(h_ctx *ctx, h_conn *client);
/** Disconnects every client, waits until all clients and servers closed, then closes the
 *  listener, frees held messages and destroys the loop; asserts each step. */
void h_finish(h_ctx *ctx);
/** True when every socket that was set up got its connection_closed. */
int h_all_closed(h_ctx *ctx);
/** The first client, else server, that got its connection_closed; NULL if none did. */
h_conn *h_first_closed(h_ctx *ctx);
/** connection_established callbacks of all clients and servers together. */
int h_established_count(h_ctx *ctx);
/** A loop step (for ctx->step) as an application loop built on poll(2) does it: waits for the
 *  loop's fd at most as long as ibmsg_event_loop_timeout() says, and calls
 *  ibmsg_event_loop_process() only when the fd is readable or that timeout expired. Counts both
 *  in *readable and *processed when they are not NULL. */
int h_poll_step(h_ctx *ctx, int max_wait_ms, int *readable, int *processed);
/** Reinitializes a record (counters and socket) for reuse; the socket must be closed or new. */
void h_conn_reset(h_conn *conn, h_ctx *ctx, const char *name);

/* --- messages ------------------------------------------------------------------------------ */

/** Fills size bytes with the pattern of message seq (the first 4 bytes carry seq). */
void h_fill(void *data, size_t size, uint32_t seq);
/** 0 if data holds the pattern of message seq, else -1 and a description in why. */
int h_check(const void *data, size_t size, uint32_t seq, char *why, size_t why_len);
/** Allocates msg on conn and fills it with the next sequence number; asserts success. */
void h_alloc_fill(h_conn *conn, ibmsg_buffer *msg, size_t size);
/** ibmsg_post_send(); on success counts the post (and, for ctx->msgs, the outstanding send). */
int h_try_post(h_conn *conn, ibmsg_buffer *msg);
/** h_try_post() that must succeed. */
#define h_post(conn, msg) H_ASSERT_OK(h_try_post((conn), (msg)))
/** Frees every held received message, asserting IBMSG_OK. */
void h_release_held(h_conn *conn);
/** holder keeps what it receives (hold) while `sender` posts ctx->msgs[0 .. n-1] of size bytes;
 *  waits until all n arrived and got their message_sent. */
void h_send_to_holder(h_conn *sender, h_conn *holder, int n, size_t size);
/** After h_send_to_holder(): the sender disconnects; once both ends closed, the holder's n
 *  messages must still be lent (IBMSG_RECEIVED) and can be freed, as can the sent ones. */
void h_free_lent_after_close(h_conn *sender, h_conn *holder, int n);
/** Starts a stream of `total` messages of `size` bytes over nbufs send buffers. nbufs must not
 *  exceed IBMSG_OPT_SEND_QUEUE (nor IBMSG_OPT_SEND_DEPTH): a post beyond the queue would fail
 *  with IBMSG_EAGAIN when the peer is out of credits, and the stream treats that as an error. */
void h_stream_start(h_conn *conn, int total, size_t size, int nbufs);
/** True when the whole stream was posted and every message got its message_sent. */
int h_stream_done(const h_conn *conn);
/** Streams n messages of size bytes each way (nbufs send buffers a side) and waits until both
 *  sides received n and both streams are done (H_RUN_UNTIL_PROGRESS with idle_ms). */
#define h_stream_both(ctx, a, b, n, size, nbufs, idle_ms)                                       \
  h_stream_both_at((ctx), (a), (b), (n), (size), (nbufs), (idle_ms), __FILE__, __LINE__)
void h_stream_both_at(h_ctx *ctx, h_conn *a, h_conn *b, int n, size_t size, int nbufs,
                      int idle_ms, const char *file, int line);
/** For a message_received hook: holds conn's messages and frees them all, from the callback,
 *  once `batch` are held (noting a failed free). */
void h_free_in_batches(h_conn *conn, ibmsg_buffer *msg, int batch);
/** Allocates, fills and posts ctx->msgs[first .. first+n-1] of size bytes on conn. */
void h_post_msgs(h_conn *conn, int first, int n, size_t size);
/** A copy of desc with bytes [offset, offset+n) replaced by value (little-endian) and its check
 *  (bytes 28..31, FNV-1a of bytes 0..27) recomputed: what a peer that forges descriptors sends. */
ibmsg_descriptor h_forge_descriptor(const ibmsg_descriptor *desc, int offset, uint64_t value, int n);
/** One one-sided operation and what its done callback saw: done calls and the last status. */
typedef struct {
  ibmsg_op op; /* first member */
  int calls;
  int status;
} h_op_slot;
/** Clears o and returns its operation, ready to post, with a done callback that records. */
ibmsg_op *h_op_start(h_op_slot *o);
/** calloc(1, size) for a test's records; fails the test when out of memory. */
void *h_new(size_t size);
/** Sets an int option / a string option on the loop, asserting IBMSG_OK. */
void h_setopt_int(h_ctx *ctx, int option, int value);
void h_setopt_str(h_ctx *ctx, int option, const char *value);
/** Options for a test that counts each connection's credits exactly: receive buffers of each
 *  connection's own (IBMSG_OPT_SHARED_RECV 0), IBMSG_OPT_RECV_DEPTH, IBMSG_OPT_SEND_QUEUE and
 *  IBMSG_OPT_SEND_DEPTH as given. */
void h_setopt_own_credits(h_ctx *ctx, int recv_depth, int send_queue, int send_depth);

#endif /* IBMSG_TEST_HARNESS_H */
