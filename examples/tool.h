/*
 * tool.h - helpers shared by the command-line tools ibmsg-send, ibmsg-recv, ibmsg-perf,
 * ibmsg-rdma and ibmsg-rpc.
 *
 * Nothing here is part of the ibmsg API: it is the plumbing every tool needs (messages to the
 * user, option values, time, the summary and progress lines, the --verify payload, random
 * bytes, a free list of send buffers) kept in one place so that each tool's own file shows only
 * how it uses ibmsg.
 */
#ifndef IBMSG_TOOL_H
#define IBMSG_TOOL_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <ibmsg.h>

#define TOOL_DEFAULT_PORT 12345
/* ibmsg-perf's default --max-size (ibmsg-send and ibmsg-recv keep the library's default). */
#define TOOL_DEFAULT_MAX_SIZE 65536
/* The largest IBMSG_OPT_MAX_MSG_SIZE, 2^32 - 1: the largest --max-size and message size. */
#define TOOL_MAX_MSG_SIZE UINT64_C(4294967295)
/* The largest IBMSG_OPT_EAGER_SIZE: the largest --eager-size. */
#define TOOL_MAX_EAGER_SIZE (UINT64_C(1) << 30)
/* How long one dispatch may wait: short enough that a SIGINT or the progress line is handled
 * promptly, long enough that an idle tool does not spin. */
#define TOOL_TICK_MS 200

/* Exit statuses, the same for every tool. */
#define TOOL_EXIT_OK 0
#define TOOL_EXIT_FAILURE 1
#define TOOL_EXIT_USAGE 2

#if defined(__GNUC__)
#define TOOL_PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define TOOL_PRINTF(f, a)
#endif

/* ---- messages to the user ------------------------------------------------------------------ */

/** "s" unless n is 1: "1 message", "2 messages". */
#define TOOL_S(n) ((n) == 1 ? "" : "s")

/** The tool's name, used as the prefix of every line it prints ("ibmsg-send"). */
extern const char *tool_name;

/** Where tool_info(), tool_print_summary() and tool_memwatch_print() write: stdout (NULL), or
 *  stderr after tool_json_mode(). */
extern FILE *tool_out;
/** --json: stdout is for the JSON object alone; the lines that went there go to stderr. */
void tool_json_mode(void);

/** Prints "NAME: error: ...". The first one is kept for tool_first_error(). */
void tool_error(const char *fmt, ...) TOOL_PRINTF(1, 2);
/** The text of the first tool_error() line (without "NAME: error: "), or NULL if none came. */
const char *tool_first_error(void);
/** Prints "NAME: error: ... (try 'NAME --help')" for a bad command line. */
void tool_usage_error(const char *fmt, ...) TOOL_PRINTF(1, 2);
/** Prints "NAME: ..." on stdout (tool_out) unless quiet (information, not results). */
void tool_info(int quiet, const char *fmt, ...) TOOL_PRINTF(2, 3);
/** Prints "NAME X.Y.Z (libibmsg X.Y.Z)": the version built against and the one linked. */
void tool_print_version(void);
/** -v: the connection's counters (ibmsg_socket_stats) on stderr, prefixed with what. Call it
 *  from connection_closed, or while the connection is open. */
void tool_print_stats(const char *what, const ibmsg_socket *socket);
/** The library's number of a connection, from one of its log lines (the callback's text): each
 *  line of a connection starts with "connection N: ", N unique in the process, counted from 1 as
 *  connections get their RDMA device (ibmsg(7), IBMSG_DEBUG). 0 for a line without one (the
 *  loop's, a listener's, a connection still resolving its address). The tools number their
 *  connections with it, so that their lines and ibmsg's name a connection alike. */
unsigned long tool_log_number(const char *text);
/** -v: a log callback (ibmsg_event_loop.log) printing the library's lines up to
 *  IBMSG_LOG_INFO (IBMSG_DEBUG=4 in the environment prints all of them) on stderr. */
void tool_log(ibmsg_event_loop *loop, ibmsg_socket *socket, int level, const char *text);

/* ---- option values: each returns 0, or prints one line and returns -1 ---------------------- */

/** A decimal integer in [min, max]. */
int tool_parse_uint(const char *option, const char *arg, uint64_t min, uint64_t max,
                    uint64_t *value);
/** A size in bytes in [min, max]: a decimal integer, optionally followed by K, M or G
 *  (times 1024, 1024^2, 1024^3). */
int tool_parse_size(const char *option, const char *arg, uint64_t min, uint64_t max,
                    uint64_t *value);
/** A port number: 1..65535, or also 0 when allow_zero (a listener picks any free port). option
 *  names it in the error ("-p", "PORT"). */
int tool_parse_port(const char *option, const char *arg, int allow_zero, unsigned short *port);
/** The option getopt_long() just stumbled on ('?' or ':'), as the user wrote it. */
const char *tool_bad_option(char **argv);
/** Sets an int option of the loop; prints what failed. */
int tool_setopt_int(ibmsg_event_loop *loop, int option, const char *what, int value);
/** Sets IBMSG_OPT_MAX_MSG_SIZE (1..TOOL_MAX_MSG_SIZE): as an int up to INT_MAX, as a uint64_t
 *  above; prints what failed. */
int tool_setopt_max_size(ibmsg_event_loop *loop, uint64_t value);
/* Sets a size option that takes a uint64_t (len 8); an error line and -1 if refused. */
int tool_setopt_u64(ibmsg_event_loop *loop, int option, const char *what, uint64_t value);
/* A window per connection (messages in flight on each) such that conns connections together
 * hold about all_bytes of send buffers, each message counted at its size but at least the eager
 * size (a send buffer of that): all_bytes / (conns x that), at least lo, and then at most hi. */
uint64_t tool_window_share(uint64_t all_bytes, uint64_t conns, uint64_t size, uint64_t eager,
                           uint64_t lo, uint64_t hi);

/* ---- signals and time ---------------------------------------------------------------------- */

/** Set by SIGINT and SIGTERM once tool_catch_signals() ran. Another signal two or more seconds
 *  later kills the tool, in case its orderly shutdown is what hangs. */
extern volatile sig_atomic_t tool_stop;
void tool_catch_signals(void);

/** Seconds on CLOCK_MONOTONIC: for intervals only. */
double tool_now(void);

/* ---- summary and progress ------------------------------------------------------------------ */

/** The line every tool ends with, on stdout (tool_out):
 *  "NAME: VERB N messages, B bytes in S s: X MB/s, Y msg/s (EXTRA)". MB is 10^6 bytes. */
void tool_print_summary(const char *verb, uint64_t messages, uint64_t bytes, double seconds,
                        const char *extra);

/** A progress line on stderr, rewritten in place (\r) about once a second, only when stderr is a
 *  terminal and the tool is not quiet. tool_error(), tool_info() and tool_print_summary() erase
 *  it first. */
struct tool_progress {
  int enabled;
  int shown;          /* a line is on the screen and must be erased before other output */
  double last;        /* when the line was last written */
  uint64_t last_msgs; /* the counts then, for the current rate */
  uint64_t last_bytes;
};
void tool_progress_init(struct tool_progress *p, int quiet);
/** Rewrites the line if a second has passed since the last time. Cheap enough to call per
 *  message. */
void tool_progress_update(struct tool_progress *p, uint64_t messages, uint64_t bytes);
/** Erases the line. */
void tool_progress_clear(struct tool_progress *p);

/* ---- --verify payload ---------------------------------------------------------------------- */

/*
 * Message number SEQ of connection CONN carries the first SIZE bytes of this stream:
 *   bytes 0..7    SEQ, little-endian
 *   bytes 8..11   CONN, little-endian
 *   bytes 12..15  SIZE (low 32 bits), little-endian
 *   bytes 16..    pseudo-random bytes seeded from (CONN, SEQ)
 * so any lost, repeated, reordered, truncated or damaged message shows, for every size (a
 * message shorter than 16 bytes carries only part of the header). The receiver learns CONN from
 * the first message of a connection and checks that it never changes.
 */
#define TOOL_PAYLOAD_HEADER 16

/** Writes the payload of message seq of connection conn; with full == 0 only the header, which
 *  costs nothing but still numbers the messages. The pseudo-random part goes 8 bytes at a time,
 *  as tool_payload_check() reads it: 256 MiB take tens of milliseconds on a current CPU. */
void tool_payload_fill(void *data, size_t size, uint32_t conn, uint64_t seq, int full);
/** Checks a received message that should be message seq of its connection. *conn is the
 *  sender's connection number, or -1 until a message long enough to carry it came (then it is
 *  learned). Returns 0, or -1 with what is wrong in why. */
int tool_payload_check(const void *data, size_t size, uint64_t seq, int64_t *conn, char *why,
                       size_t why_len);

/* ---- random bytes -------------------------------------------------------------------------- */

/** A seed that differs from run to run (the time and the process id). */
uint64_t tool_random_seed(void);
/** Fills size bytes with pseudo-random bytes drawn from *state, which advances, so that the
 *  next call gives other bytes. Fast, not for cryptography. */
void tool_random_fill(void *data, size_t size, uint64_t *state);

/* ---- memory -------------------------------------------------------------------------------- */

/** The process's largest resident set size so far (getrusage(RUSAGE_SELF) ru_maxrss), in KiB;
 *  0 if unknown. */
uint64_t tool_peak_rss_kib(void);
/** The process's resident set size now (/proc/self/statm), in KiB; 0 if unknown. */
uint64_t tool_rss_kib(void);

/*
 * What a tool's connections cost while they are up (--memory of ibmsg-send and ibmsg-recv):
 * ibmsg_loop_memory() sampled now and then, the largest of each field, and one sample taken
 * when the most connections were up at once, with the RSS then.
 */
struct tool_memwatch {
  ibmsg_memory most;      /* the largest buffers, shared and large seen (each on its own) */
  ibmsg_memory at_up;     /* when conns_up connections were up */
  uint64_t rss_at_up_kib; /* the RSS then */
  uint64_t conns_up;      /* the most connections up at a sample; 0: no sample yet */
  double last;            /* tool_now() of the last sample */
  int failed;             /* ibmsg_loop_memory() failed: no samples */
};
/** Samples the loop's memory now, with conns connections up. */
void tool_memwatch_sample(struct tool_memwatch *w, ibmsg_event_loop *loop, uint64_t conns);
/** tool_memwatch_sample() if at least interval seconds passed since the last sample. */
void tool_memwatch_tick(struct tool_memwatch *w, ibmsg_event_loop *loop, uint64_t conns,
                        double interval);
/** Prints two lines on stdout (tool_out; also when quiet, as the summary):
 *    NAME: memory: peak RSS R KiB (M MiB); most registered (ibmsg_loop_memory): buffers B,
 *          shared S, large L bytes
 *    NAME: memory with N connections up: RSS R KiB; registered: buffers B, shared S, large L
 *          bytes
 *  each on one line. */
void tool_memwatch_print(const struct tool_memwatch *w);

/** --json: the memory as one JSON object (peak_rss_kib, most_registered, at_most_connections). */
void tool_memwatch_json(FILE *f, const struct tool_memwatch *w);

/* ---- JSON ---------------------------------------------------------------------------------- */

/** s as a JSON string, escaped; null for NULL. */
void tool_json_string(FILE *f, const char *s);
/** A connection's counters (ibmsg_socket_stats) as one JSON object, the fields' names as keys. */
void tool_json_stats(FILE *f, const ibmsg_stats *st);

/* ---- send buffers ---------------------------------------------------------------------------- */

/*
 * A free list of send buffers for one connection. ibmsg_alloc_msg() hands out at most
 * IBMSG_OPT_SEND_DEPTH registered buffers per connection; the fast way to send is to allocate
 * them once and post each again from its message_sent callback, instead of freeing and
 * reallocating. The ibmsg_buffer structs live here because each must keep its address from
 * ibmsg_alloc_msg() until ibmsg_free_msg().
 *
 * A buffer holds what it was allocated for: a message above the eager size has a buffer of its
 * own size (rendezvous), not the connection's maximum. So each slot remembers the size it was
 * allocated with, and a larger message takes a buffer that is big enough, or a new one.
 */
struct tool_sendpool {
  ibmsg_socket *socket;
  ibmsg_buffer *slots; /* slots[0..allocated) went through ibmsg_alloc_msg() */
  size_t *room;        /* room[i]: the size slots[i] was allocated with; its messages fit */
  size_t allocated;
  size_t capacity; /* IBMSG_OPT_SEND_DEPTH when the pool was made */
  size_t live;     /* allocated and not yet freed */
  ibmsg_buffer **idle;
  size_t nidle;  /* live, and neither posted nor in the application's hands */
  int released;  /* tool_sendpool_release() ran: buffers that come back are freed */
};

/** Prepares an empty pool for socket (no buffer is allocated yet). */
int tool_sendpool_init(struct tool_sendpool *pool, ibmsg_socket *socket, ibmsg_event_loop *loop);
/** A buffer for a size-byte message: an idle one with room for it, else a new one from
 *  ibmsg_alloc_msg(), else an idle one allocated anew for size (ibmsg_free_msg() and
 *  ibmsg_alloc_msg(); if that fails, the pool has one buffer less). Returns IBMSG_OK,
 *  IBMSG_EAGAIN when every buffer is posted (retry after a message_sent), or the error of
 *  ibmsg_alloc_msg(). */
int tool_sendpool_get(struct tool_sendpool *pool, size_t size, ibmsg_buffer **msg);
/** Gives back a buffer the library returned (message_sent) or that could not be posted; after
 *  tool_sendpool_release() it is freed instead. */
void tool_sendpool_put(struct tool_sendpool *pool, ibmsg_buffer *msg);
/** How many buffers are out (posted, or taken and not put back). */
size_t tool_sendpool_busy(const struct tool_sendpool *pool);
/** Frees every idle buffer with ibmsg_free_msg(), and from now on each one that is put back.
 *  Call it when no more messages will be posted (at the latest from connection_closed). */
void tool_sendpool_release(struct tool_sendpool *pool);
/** Frees the pool's own memory; every buffer must have been released. */
void tool_sendpool_destroy(struct tool_sendpool *pool);

#endif /* IBMSG_TOOL_H */
