/*
 * tool.c - helpers shared by the command-line tools (see tool.h).
 */
#define _POSIX_C_SOURCE 200809L

#include "tool.h"

#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

const char *tool_name = "ibmsg";
volatile sig_atomic_t tool_stop = 0;
FILE *tool_out;

/* The first error line, for --json. */
static char first_error[512];

static FILE *out(void) { return tool_out != NULL ? tool_out : stdout; }

/* The progress line on the screen, if any: erased before any other line is printed. */
static struct tool_progress *active_progress;

static void clear_progress(void) {
  if (active_progress != NULL)
    tool_progress_clear(active_progress);
}

/* ---- messages to the user ------------------------------------------------------------------ */

/* The lines below are written whole: flockfile() keeps the threads of a tool that has several
 * (ibmsg-perf --server --threads) from mixing their pieces. */
void tool_error(const char *fmt, ...) {
  va_list ap;
  flockfile(stdout);
  flockfile(stderr);
  clear_progress();
  fflush(stdout); /* keep the order of stdout and stderr when both go to one place */
  fprintf(stderr, "%s: error: ", tool_name);
  va_start(ap, fmt);
  if (first_error[0] == '\0') {
    va_list copy;
    va_copy(copy, ap);
    vsnprintf(first_error, sizeof first_error, fmt, copy);
    va_end(copy);
  }
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
  funlockfile(stderr);
  funlockfile(stdout);
}

const char *tool_first_error(void) { return first_error[0] != '\0' ? first_error : NULL; }

void tool_json_mode(void) { tool_out = stderr; }

void tool_usage_error(const char *fmt, ...) {
  va_list ap;
  fprintf(stderr, "%s: error: ", tool_name);
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fprintf(stderr, " (try '%s --help')\n", tool_name);
}

void tool_info(int quiet, const char *fmt, ...) {
  va_list ap;
  FILE *f = out();
  if (quiet)
    return;
  flockfile(f);
  clear_progress();
  fprintf(f, "%s: ", tool_name);
  va_start(ap, fmt);
  vfprintf(f, fmt, ap);
  va_end(ap);
  fputc('\n', f);
  funlockfile(f);
}

void tool_print_version(void) {
  printf("%s %d.%d.%d (libibmsg %s)\n", tool_name, IBMSG_VERSION_MAJOR, IBMSG_VERSION_MINOR,
         IBMSG_VERSION_PATCH, ibmsg_version_string());
}

/* ---- option values ------------------------------------------------------------------------- */

/* Parses digits and an optional suffix; strtoull alone would accept "-1", " 5" and "5x". */
static int parse_number(const char *option, const char *arg, int allow_suffix, uint64_t min,
                        uint64_t max, uint64_t *value) {
  const char *p = arg;
  uint64_t v = 0, mult = 1;

  if (*p < '0' || *p > '9') {
    tool_usage_error("%s: '%s' is not a number", option, arg);
    return -1;
  }
  for (; *p >= '0' && *p <= '9'; p++) {
    unsigned d = (unsigned)(*p - '0');
    if (v > (UINT64_MAX - d) / 10) {
      tool_usage_error("%s: '%s' is too large", option, arg);
      return -1;
    }
    v = v * 10 + d;
  }
  if (allow_suffix && *p != '\0' && p[1] == '\0') {
    switch (*p) {
    case 'k': case 'K': mult = UINT64_C(1) << 10; p++; break;
    case 'm': case 'M': mult = UINT64_C(1) << 20; p++; break;
    case 'g': case 'G': mult = UINT64_C(1) << 30; p++; break;
    default: break;
    }
  }
  if (*p != '\0') {
    tool_usage_error("%s: '%s' is not a number%s", option, arg,
                     allow_suffix ? " (a suffix may be K, M or G)" : "");
    return -1;
  }
  if (v > UINT64_MAX / mult) {
    tool_usage_error("%s: '%s' is too large", option, arg);
    return -1;
  }
  v *= mult;
  if (v < min || v > max) {
    tool_usage_error("%s: %s is out of range (%" PRIu64 "..%" PRIu64 ")", option, arg, min, max);
    return -1;
  }
  *value = v;
  return 0;
}

int tool_parse_uint(const char *option, const char *arg, uint64_t min, uint64_t max,
                    uint64_t *value) {
  return parse_number(option, arg, 0, min, max, value);
}

int tool_parse_size(const char *option, const char *arg, uint64_t min, uint64_t max,
                    uint64_t *value) {
  return parse_number(option, arg, 1, min, max, value);
}

int tool_parse_port(const char *option, const char *arg, int allow_zero, unsigned short *port) {
  uint64_t v;
  if (parse_number(option, arg, 0, allow_zero ? 0 : 1, 65535, &v) != 0)
    return -1;
  *port = (unsigned short)v;
  return 0;
}

const char *tool_bad_option(char **argv) {
  static char buf[3];
  const char *word = argv[optind - 1];
  /* A long option is reported as written; for a short one getopt saves the letter in optopt,
   * since the word may hold several ("-qx"). */
  if (strncmp(word, "--", 2) != 0 && optopt > ' ' && optopt < 127) {
    buf[0] = '-';
    buf[1] = (char)optopt;
    buf[2] = '\0';
    return buf;
  }
  return word;
}

int tool_setopt_int(ibmsg_event_loop *loop, int option, const char *what, int value) {
  int rc = ibmsg_setopt(loop, option, &value, sizeof value);
  if (rc != IBMSG_OK) {
    tool_error("cannot set %s to %d: %s", what, value, ibmsg_strerror(rc));
    return -1;
  }
  return 0;
}

int tool_setopt_u64(ibmsg_event_loop *loop, int option, const char *what, uint64_t value) {
  int rc = ibmsg_setopt(loop, option, &value, sizeof value);
  if (rc != IBMSG_OK) {
    tool_error("cannot set %s to %" PRIu64 ": %s", what, value, ibmsg_strerror(rc));
    return -1;
  }
  return 0;
}

uint64_t tool_window_share(uint64_t all_bytes, uint64_t conns, uint64_t size, uint64_t eager,
                           uint64_t lo, uint64_t hi) {
  uint64_t per_msg = size > eager ? size : eager, w;
  w = all_bytes / ((conns > 0 ? conns : 1) * (per_msg > 0 ? per_msg : 1));
  if (w < lo)
    w = lo;
  return w > hi ? hi : w;
}

int tool_setopt_max_size(ibmsg_event_loop *loop, uint64_t value) {
  /* Beyond an int: the option takes a uint64_t, told apart by its length. */
  if (value <= INT_MAX)
    return tool_setopt_int(loop, IBMSG_OPT_MAX_MSG_SIZE, "the maximum message size", (int)value);
  return tool_setopt_u64(loop, IBMSG_OPT_MAX_MSG_SIZE, "the maximum message size", value);
}

/* ---- signals and time ---------------------------------------------------------------------- */

static time_t first_signal; /* CLOCK_MONOTONIC seconds of the signal that set tool_stop */

static void on_signal(int sig) {
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now); /* async-signal-safe */
  if (!tool_stop) {
    first_signal = now.tv_sec;
    tool_stop = 1;
  } else if (now.tv_sec - first_signal >= 2) {
    /* A second ^C, well after the first: the orderly shutdown seems stuck, so die. One that
     * comes at once is the same signal delivered twice (timeout(1) signals the process and
     * its group), not a second request. */
    signal(sig, SIG_DFL);
    raise(sig);
  }
}

void tool_catch_signals(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0; /* no SA_RESTART: a blocked epoll_wait should return at once */
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
}

double tool_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- summary and progress ------------------------------------------------------------------ */

void tool_print_summary(const char *verb, uint64_t messages, uint64_t bytes, double seconds,
                        const char *extra) {
  double mbps = seconds > 0 ? (double)bytes / seconds / 1e6 : 0.0;
  double rate = seconds > 0 ? (double)messages / seconds : 0.0;
  FILE *f = out();
  clear_progress();
  fprintf(f, "%s: %s %" PRIu64 " message%s, %" PRIu64 " bytes in %.3f s: %.2f MB/s, %.0f msg/s",
          tool_name, verb, messages, TOOL_S(messages), bytes, seconds, mbps, rate);
  if (extra != NULL && *extra != '\0')
    fprintf(f, " (%s)", extra);
  fputc('\n', f);
  fflush(f);
}

void tool_progress_init(struct tool_progress *p, int quiet) {
  memset(p, 0, sizeof *p);
  p->enabled = !quiet && isatty(STDERR_FILENO);
  p->last = tool_now();
  active_progress = p;
}

void tool_progress_update(struct tool_progress *p, uint64_t messages, uint64_t bytes) {
  double now, dt;
  if (!p->enabled || messages == 0) /* nothing to show while waiting for a peer */
    return;
  now = tool_now();
  dt = now - p->last;
  if (dt < 1.0)
    return;
  /* The rate over the last interval: what is happening now, not the average so far. The
   * trailing blanks erase the end of a longer earlier line. */
  fprintf(stderr, "\r%s: %" PRIu64 " messages, %.1f MB, %.2f MB/s, %.0f msg/s    ", tool_name,
          messages, (double)bytes / 1e6, (double)(bytes - p->last_bytes) / dt / 1e6,
          (double)(messages - p->last_msgs) / dt);
  fflush(stderr);
  p->shown = 1;
  p->last = now;
  p->last_msgs = messages;
  p->last_bytes = bytes;
}

void tool_progress_clear(struct tool_progress *p) {
  if (!p->shown)
    return;
  fprintf(stderr, "\r%79s\r", "");
  fflush(stderr);
  p->shown = 0;
}

/* ---- --verify payload ---------------------------------------------------------------------- */

/* splitmix64's output function: consecutive inputs give unrelated outputs, cheaply. */
static uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
  z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
  return z ^ (z >> 31);
}

#define GOLDEN UINT64_C(0x9e3779b97f4a7c15)

static void put_le(unsigned char *p, uint64_t v, int n) {
  for (int i = 0; i < n; i++)
    p[i] = (unsigned char)(v >> (8 * i));
}

static uint64_t get_le(const unsigned char *p, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; i++)
    v |= (uint64_t)p[i] << (8 * i);
  return v;
}

/* Eight bytes at once: filling and checking a large payload run on these. */
static void put_le64(unsigned char *p, uint64_t v) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
  memcpy(p, &v, 8);
#else
  put_le(p, v, 8);
#endif
}

static uint64_t get_le64(const unsigned char *p) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
  uint64_t v;
  memcpy(&v, p, 8);
  return v;
#else
  return get_le(p, 8);
#endif
}

static void make_header(unsigned char h[TOOL_PAYLOAD_HEADER], size_t size, uint32_t conn,
                        uint64_t seq) {
  put_le(h, seq, 8);
  put_le(h + 8, conn, 4);
  put_le(h + 12, (uint32_t)size, 4);
}

static uint64_t seed_of(uint32_t conn, uint64_t seq) {
  return mix64(((uint64_t)conn << 40) ^ seq ^ UINT64_C(0x1b5d2a6c3f4e8091));
}

void tool_payload_fill(void *data, size_t size, uint32_t conn, uint64_t seq, int full) {
  unsigned char *p = data, h[TOOL_PAYLOAD_HEADER];
  size_t n = size < TOOL_PAYLOAD_HEADER ? size : TOOL_PAYLOAD_HEADER, off;
  uint64_t x;

  make_header(h, size, conn, seq);
  memcpy(p, h, n);
  if (!full || size <= TOOL_PAYLOAD_HEADER)
    return;
  x = seed_of(conn, seq);
  for (off = TOOL_PAYLOAD_HEADER; size - off >= 8; off += 8) {
    x += GOLDEN;
    put_le64(p + off, mix64(x));
  }
  if (off < size) { /* the last 1..7 bytes: the start of one more word */
    x += GOLDEN;
    put_le(p + off, mix64(x), (int)(size - off));
  }
}

int tool_payload_check(const void *data, size_t size, uint64_t seq, int64_t *conn, char *why,
                       size_t why_len) {
  const unsigned char *p = data;
  unsigned char h[TOOL_PAYLOAD_HEADER];
  size_t n = size < TOOL_PAYLOAD_HEADER ? size : TOOL_PAYLOAD_HEADER;
  uint64_t x;

  if (size >= 8 && get_le(p, 8) != seq) {
    snprintf(why, why_len, "got message number %" PRIu64 " where %" PRIu64
             " was due (lost, repeated or reordered)", get_le(p, 8), seq);
    return -1;
  }
  if (size >= 12) {
    int64_t c = (int64_t)get_le(p + 8, 4);
    if (*conn < 0)
      *conn = c;
    else if (c != *conn) {
      snprintf(why, why_len, "message %" PRIu64 " says it is from connection %" PRId64
               ", earlier ones said %" PRId64, seq, c, *conn);
      return -1;
    }
  }
  if (size >= 16 && get_le(p + 12, 4) != (uint32_t)size) {
    snprintf(why, why_len, "message %" PRIu64 " has %zu bytes but was sent with %" PRIu64, seq,
             size, get_le(p + 12, 4));
    return -1;
  }
  /* What is left: the bytes of a header cut short, which the checks above could not take as a
   * whole, and the pseudo-random part. */
  make_header(h, size, *conn < 0 ? 0 : (uint32_t)*conn, seq);
  for (size_t i = 0; i < n; i++) {
    if (i >= 8 && i < 12 && *conn < 0)
      continue; /* a 9..11-byte message carries part of a connection number we do not know */
    if (p[i] != h[i]) {
      snprintf(why, why_len, "message %" PRIu64 ": byte %zu is 0x%02x, expected 0x%02x", seq, i,
               p[i], h[i]);
      return -1;
    }
  }
  if (size <= TOOL_PAYLOAD_HEADER)
    return 0;
  x = seed_of((uint32_t)*conn, seq);
  for (size_t off = TOOL_PAYLOAD_HEADER; off < size; off += 8) {
    size_t left = size - off;
    int len = left < 8 ? (int)left : 8;
    uint64_t want, got;
    x += GOLDEN;
    want = mix64(x);
    if (len == 8) {
      got = get_le64(p + off);
    } else {
      got = get_le(p + off, len);
      want &= (UINT64_C(1) << (8 * len)) - 1;
    }
    if (got != want) {
      int i = 0;
      while (((got >> (8 * i)) & 0xff) == ((want >> (8 * i)) & 0xff))
        i++;
      snprintf(why, why_len, "message %" PRIu64 ": byte %zu is 0x%02x, expected 0x%02x", seq,
               off + (size_t)i, (unsigned)((got >> (8 * i)) & 0xff),
               (unsigned)((want >> (8 * i)) & 0xff));
      return -1;
    }
  }
  return 0;
}

/* ---- random bytes -------------------------------------------------------------------------- */

uint64_t tool_random_seed(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return mix64(((uint64_t)ts.tv_sec << 32) ^ (uint64_t)ts.tv_nsec ^
               ((uint64_t)getpid() << 16));
}

void tool_random_fill(void *data, size_t size, uint64_t *state) {
  unsigned char *p = data;
  for (size_t off = 0; off < size; off += 8) {
    size_t left = size - off;
    *state += GOLDEN;
    put_le(p + off, mix64(*state), left < 8 ? (int)left : 8);
  }
}

/* ---- memory -------------------------------------------------------------------------------- */

uint64_t tool_peak_rss_kib(void) {
  struct rusage ru;
  if (getrusage(RUSAGE_SELF, &ru) != 0 || ru.ru_maxrss < 0)
    return 0;
  return (uint64_t)ru.ru_maxrss; /* KiB on Linux */
}

uint64_t tool_rss_kib(void) {
  unsigned long long size, resident;
  long page = sysconf(_SC_PAGESIZE);
  FILE *f = fopen("/proc/self/statm", "r");
  int n;

  if (f == NULL)
    return 0;
  n = fscanf(f, "%llu %llu", &size, &resident);
  fclose(f);
  if (n != 2 || page <= 0)
    return 0;
  return (uint64_t)resident * (uint64_t)page / 1024;
}

void tool_memwatch_sample(struct tool_memwatch *w, ibmsg_event_loop *loop, uint64_t conns) {
  ibmsg_memory m;

  w->last = tool_now();
  if (ibmsg_loop_memory(loop, &m) != IBMSG_OK) {
    w->failed = 1;
    return;
  }
  if (m.buffers > w->most.buffers)
    w->most.buffers = m.buffers;
  if (m.shared > w->most.shared)
    w->most.shared = m.shared;
  if (m.large > w->most.large)
    w->most.large = m.large;
  if (conns > w->conns_up) {
    w->at_up = m;
    w->rss_at_up_kib = tool_rss_kib();
    w->conns_up = conns;
  }
}

void tool_memwatch_tick(struct tool_memwatch *w, ibmsg_event_loop *loop, uint64_t conns,
                        double interval) {
  if (tool_now() - w->last >= interval)
    tool_memwatch_sample(w, loop, conns);
}

#define MIB(bytes) ((double)(bytes) / 1048576.0)

void tool_memwatch_print(const struct tool_memwatch *w) {
  uint64_t peak = tool_peak_rss_kib();
  FILE *f = out();

  clear_progress();
  fprintf(f, "%s: memory: peak RSS %" PRIu64 " KiB (%.1f MiB)", tool_name, peak, peak / 1024.0);
  if (w->failed)
    fprintf(f, "; ibmsg_loop_memory failed\n");
  else
    fprintf(f, "; most registered (ibmsg_loop_memory): buffers %zu, shared %zu, large %zu bytes "
            "(%.1f, %.1f, %.1f MiB)\n", w->most.buffers, w->most.shared, w->most.large,
            MIB(w->most.buffers), MIB(w->most.shared), MIB(w->most.large));
  if (!w->failed && w->conns_up > 0)
    fprintf(f, "%s: memory with %" PRIu64 " connection%s up: RSS %" PRIu64 " KiB (%.1f MiB); "
            "registered: buffers %zu, shared %zu, large %zu bytes (%.1f, %.1f, %.1f MiB)\n",
            tool_name, w->conns_up, TOOL_S(w->conns_up), w->rss_at_up_kib,
            w->rss_at_up_kib / 1024.0, w->at_up.buffers, w->at_up.shared, w->at_up.large,
            MIB(w->at_up.buffers), MIB(w->at_up.shared), MIB(w->at_up.large));
  fflush(f);
}

void tool_memwatch_json(FILE *f, const struct tool_memwatch *w) {
  fprintf(f, "{\"peak_rss_kib\": %" PRIu64, tool_peak_rss_kib());
  if (!w->failed)
    fprintf(f, ", \"most_registered\": {\"buffers\": %zu, \"shared\": %zu, \"large\": %zu}",
            w->most.buffers, w->most.shared, w->most.large);
  if (!w->failed && w->conns_up > 0)
    fprintf(f, ", \"at_most_connections\": {\"connections\": %" PRIu64 ", \"rss_kib\": %" PRIu64
            ", \"buffers\": %zu, \"shared\": %zu, \"large\": %zu}",
            w->conns_up, w->rss_at_up_kib, w->at_up.buffers, w->at_up.shared, w->at_up.large);
  fputc('}', f);
}

/* ---- send buffers ---------------------------------------------------------------------------- */

int tool_sendpool_init(struct tool_sendpool *pool, ibmsg_socket *socket, ibmsg_event_loop *loop) {
  int depth = 0;
  size_t len = sizeof depth;
  int rc;

  memset(pool, 0, sizeof *pool);
  pool->socket = socket;
  rc = ibmsg_getopt(loop, IBMSG_OPT_SEND_DEPTH, &depth, &len);
  if (rc != IBMSG_OK)
    return rc;
  if (depth < 1)
    depth = 1;
  pool->capacity = (size_t)depth;
  pool->slots = calloc(pool->capacity, sizeof *pool->slots);
  pool->room = calloc(pool->capacity, sizeof *pool->room);
  pool->idle = calloc(pool->capacity, sizeof *pool->idle);
  if (pool->slots == NULL || pool->room == NULL || pool->idle == NULL) {
    tool_sendpool_destroy(pool);
    return IBMSG_ENOMEM;
  }
  return IBMSG_OK;
}

/* Takes idle[i] out of the idle list. */
static ibmsg_buffer *take_idle(struct tool_sendpool *pool, size_t i) {
  ibmsg_buffer *m = pool->idle[i];
  pool->idle[i] = pool->idle[--pool->nidle];
  return m;
}

int tool_sendpool_get(struct tool_sendpool *pool, size_t size, ibmsg_buffer **msg) {
  ibmsg_buffer *m;
  size_t i;
  int rc;

  /* The most recently used first: with one message size it fits at once. */
  for (i = pool->nidle; i-- > 0;) {
    m = pool->idle[i];
    if (size <= pool->room[m - pool->slots]) {
      if (size > ibmsg_socket_max_msg_size(pool->socket))
        return IBMSG_EMSGSIZE; /* what ibmsg_alloc_msg() would say */
      take_idle(pool, i);
      m->size = size; /* the buffer stays, only the length changes */
      *msg = m;
      return IBMSG_OK;
    }
  }
  if (pool->released)
    return IBMSG_EAGAIN;
  if (pool->allocated < pool->capacity) {
    m = &pool->slots[pool->allocated];
    rc = ibmsg_alloc_msg(m, pool->socket, size);
    if (rc != IBMSG_OK)
      return rc;
    pool->room[pool->allocated] = size;
    pool->allocated++;
    pool->live++;
    *msg = m;
    return IBMSG_OK;
  }
  if (pool->nidle == 0)
    return IBMSG_EAGAIN;
  if (size > ibmsg_socket_max_msg_size(pool->socket))
    return IBMSG_EMSGSIZE; /* keep the buffer: a new one would not be allowed */
  /* Every buffer exists and none idle is large enough: make the last one used larger. */
  m = take_idle(pool, pool->nidle - 1);
  rc = ibmsg_free_msg(m);
  if (rc != IBMSG_OK) {
    pool->idle[pool->nidle++] = m;
    return rc;
  }
  rc = ibmsg_alloc_msg(m, pool->socket, size);
  if (rc != IBMSG_OK) {
    pool->room[m - pool->slots] = 0;
    pool->live--; /* the slot stays empty */
    return rc;
  }
  pool->room[m - pool->slots] = size;
  *msg = m;
  return IBMSG_OK;
}

void tool_sendpool_put(struct tool_sendpool *pool, ibmsg_buffer *msg) {
  if (pool->released) {
    if (ibmsg_free_msg(msg) == IBMSG_OK)
      pool->live--;
    return;
  }
  pool->idle[pool->nidle++] = msg;
}

size_t tool_sendpool_busy(const struct tool_sendpool *pool) {
  return pool->live - pool->nidle;
}

void tool_sendpool_release(struct tool_sendpool *pool) {
  pool->released = 1;
  while (pool->nidle > 0) {
    if (ibmsg_free_msg(pool->idle[--pool->nidle]) == IBMSG_OK)
      pool->live--;
  }
}

void tool_sendpool_destroy(struct tool_sendpool *pool) {
  free(pool->slots);
  free(pool->room);
  free(pool->idle);
  pool->slots = NULL;
  pool->room = NULL;
  pool->idle = NULL;
  pool->capacity = pool->allocated = pool->live = pool->nidle = 0;
}

void tool_print_stats(const char *what, const ibmsg_socket *socket) {
  ibmsg_stats st;
  if (ibmsg_socket_stats(socket, &st, sizeof st) != IBMSG_OK)
    return;
  fprintf(stderr,
          "%s: %s: sent %" PRIu64 " messages (%" PRIu64 " bytes), received %" PRIu64
          " (%" PRIu64 " bytes), credit stalls %" PRIu64 ", keepalives sent %" PRIu64
          ", received %" PRIu64 ", missed %" PRIu64 "\n",
          tool_name, what, st.msgs_sent, st.bytes_sent, st.msgs_received, st.bytes_received,
          st.credit_stalls, st.keepalives_sent, st.keepalives_received, st.keepalive_misses);
}

void tool_log(ibmsg_event_loop *loop, ibmsg_socket *socket, int level, const char *text) {
  static const char *const names[] = {"", "error", "warn", "info", "debug"};
  (void)loop;
  (void)socket;
  if (level <= IBMSG_LOG_INFO && level >= IBMSG_LOG_ERROR)
    fprintf(stderr, "%s: log: %s: %s\n", tool_name, names[level], text);
}

unsigned long tool_log_number(const char *text) {
  static const char prefix[] = "connection ";
  unsigned long n = 0;
  const char *p;

  if (strncmp(text, prefix, sizeof prefix - 1) != 0)
    return 0;
  for (p = text + sizeof prefix - 1; *p >= '0' && *p <= '9'; p++) {
    if (n > (ULONG_MAX - 9) / 10)
      return 0;
    n = n * 10 + (unsigned long)(*p - '0');
  }
  return *p == ':' ? n : 0;
}

/* ---- JSON ---------------------------------------------------------------------------------- */

void tool_json_string(FILE *f, const char *s) {
  if (s == NULL) {
    fputs("null", f);
    return;
  }
  fputc('"', f);
  for (; *s; s++) {
    unsigned char ch = (unsigned char)*s;
    if (ch == '"' || ch == '\\')
      fprintf(f, "\\%c", ch);
    else if (ch < 0x20 || ch == 0x7f)
      fprintf(f, "\\u%04x", ch);
    else
      fputc(ch, f);
  }
  fputc('"', f);
}

void tool_json_stats(FILE *f, const ibmsg_stats *st) {
  fprintf(f, "{\"msgs_sent\": %" PRIu64 ", \"bytes_sent\": %" PRIu64 ", \"msgs_received\": %" PRIu64
          ", \"bytes_received\": %" PRIu64 ", \"credit_stalls\": %" PRIu64
          ", \"keepalives_sent\": %" PRIu64 ", \"keepalives_received\": %" PRIu64
          ", \"keepalive_misses\": %" PRIu64 ", \"requests_timed_out\": %" PRIu64
          ", \"replies_dropped\": %" PRIu64 ", \"replies_resent\": %" PRIu64 "}",
          st->msgs_sent, st->bytes_sent, st->msgs_received, st->bytes_received, st->credit_stalls,
          st->keepalives_sent, st->keepalives_received, st->keepalive_misses,
          st->requests_timed_out, st->replies_dropped, st->replies_resent);
}
