// cost.cpp - the ping-pong whose instructions test/perf/cost-run counts with callgrind (issue 24):
// the polled path of one message, receive completion -> message_received -> the reply's post ->
// its completion, with the library core (libibmsg_core) over the fake transport (test/fake), both
// ends in this process on one loop, so that nothing but the code decides the count.
//
// One listener and one connection to it on one loop, busy polling (IBMSG_OPT_BUSY_POLL =
// IBMSG_BUSY_POLL_ALWAYS) and every other option at its default; the fake device has shared
// receive queues (as Soft-RoCE's and mlx5's), so the default IBMSG_OPT_SHARED_RECV path runs as
// on a real device. The client posts message 0 (64 bytes); each side's message_received checks
// the message (its number, in order, and every byte), frees it and posts the answer: the server
// the reply k, the client, on reply k, message k + 1. message_sent frees each sent buffer. After
// WARMUP round trips the callgrind client requests start the count (in the client's
// message_received for reply WARMUP - 1, on entry), and they stop it in the same callback for
// reply WARMUP + ROUND_TRIPS - 1, which posts nothing more: the count covers exactly ROUND_TRIPS
// round trips, 2 * ROUND_TRIPS messages, each received (receive completion, message_received,
// ibmsg_free_msg, the buffer back as a credit) and answered (ibmsg_alloc_msg, ibmsg_post_send,
// its send completion, message_sent, ibmsg_free_msg), with the polling loop around them. Then
// the client disconnects, everything closes and the loop is destroyed.
//
// Without valgrind the client requests do nothing and this is a test of its own: it fails
// (exit 1, saying why) if a message arrives out of order, changed or twice, a post or a free
// fails, a connection closes early, a callback is missing, the fake saw an RNR, a length error or
// a misuse, or anything is left open. Built without valgrind's headers (valgrind/callgrind.h),
// or with -DCOST_NO_CALLGRIND, it has no client requests (--markers says "none") and
// test/perf/cost-run refuses to count.
//
// With --critical (test/perf/cost-run --critical, which runs callgrind with
// --collect-atstart=no) only the critical part of each message's path is collected: from the
// fake handing out its receive completion (one completion per poll) to the post_flush of the
// answer message_received posts -- what stands between a message's arrival and the answer's
// doorbell. The send completions, message_sent, the frees of sent messages and what the end of
// the poller's round does come after the doorbell and are not counted.
//
// With --stream (test/perf/cost-run --stream) the path of a message stream instead, as a rate
// test runs it: the client keeps kWindow messages in flight, posting the next from message_sent,
// and the server frees each message it gets and answers nothing; ROUND_TRIPS then counts
// messages, measured from the client's WARMUP-th message_sent to its (WARMUP + ROUND_TRIPS)-th,
// kWindow messages in flight throughout (each posted, received, freed and its send completed).
//
// Usage: cost [--critical | --stream] [ROUND_TRIPS [WARMUP]]   (default 10000 and 1000)
//        cost --markers                 "callgrind" or "none"
//        cost --compiler                the compiler that built it, e.g. "g++ 12.2.0"
#include <time.h>

#include <cerrno>
#include <cinttypes>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "fake.hpp"
#include "ibmsg.h"

#if defined(__has_include) && !defined(COST_NO_CALLGRIND)
#if __has_include(<valgrind/callgrind.h>)
#include <valgrind/callgrind.h>
#define COST_MARKERS "callgrind"
#endif
#endif
#ifndef COST_MARKERS
#define COST_MARKERS "none"
#define CALLGRIND_START_INSTRUMENTATION do {} while (0)
#define CALLGRIND_STOP_INSTRUMENTATION do {} while (0)
#define CALLGRIND_ZERO_STATS do {} while (0)
#define CALLGRIND_DUMP_STATS_AT(what) do { (void)(what); } while (0)
#define CALLGRIND_TOGGLE_COLLECT do {} while (0)
#endif

namespace fake = ibmsg::fake;

namespace {

constexpr size_t kSize = 64;
constexpr uint64_t kWindow = 32;  // --stream: messages in flight
// Send buffers per side: at most two are posted at once in the ping-pong (the most recently
// freed is used first), kWindow in a stream.
constexpr int kBufs = int(kWindow) + 8;
// The description of the measured dump (callgrind's "desc: Trigger: Client Request: ..."), which
// test/perf/cost-run looks for.
constexpr const char *kTrigger = "ibmsg-cost measured";

struct Side {
  Side(const char *n, int pat) : name(n), pattern(pat) {}
  const char *name;
  ibmsg_socket s{};
  int pattern;  // kPatterns[pattern]: the replies' bytes differ from the messages'
  bool opened = false, established = false;
  int closed = 0, close_reason = -1;
  uint64_t received = 0, sent_ok = 0, posted = 0;
  ibmsg_buffer bufs[kBufs]{};
  int free_bufs[kBufs]{};
  int nfree = 0;
};

struct Run {
  ibmsg_event_loop loop{};
  Side listener{"listener", 0}, client{"client", 0}, server{"server", 1};
  uint64_t warmup = 1000, measured = 10000;
  bool done = false;  // the client has the last reply
  bool measuring = false;
  bool stream = false;  // --stream
  int requests = 0;
  fake::Stats at_start{}, at_stop{};
  size_t posts_start = 0, posts_stop = 0;  // fake::posts() then
  std::string failure;  // the first thing that went wrong
};

Run *g_run;

void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void fail(const char *fmt, ...) {
  if (!g_run->failure.empty()) return;
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  g_run->failure = buf;
}

bool failed() { return !g_run->failure.empty(); }

Side *side_of(ibmsg_socket *s) { return static_cast<Side *>(s->user_data); }

// Message k of a side: its number in the first 8 bytes, then the side's pattern (kept cheap: what
// this program spends per message counts in the total, not in src/'s figure).
struct Pattern {
  uint8_t bytes[kSize];
  explicit Pattern(uint8_t salt) {
    for (size_t i = 0; i < kSize; ++i) bytes[i] = uint8_t(i * 13 + 7) ^ salt;
  }
};
const Pattern kPatterns[2] = {Pattern(0x00), Pattern(0xa5)};  // the client's, the server's

void fill(void *data, uint64_t k, int side) {
  memcpy(data, kPatterns[side].bytes, kSize);
  memcpy(data, &k, 8);
}

bool intact(const ibmsg_buffer *m, uint64_t k, int side) {
  if (m->size != kSize || m->status != IBMSG_RECEIVED || m->flags != 0) return false;
  uint64_t got;
  memcpy(&got, m->data, 8);
  return got == k &&
         memcmp(static_cast<const uint8_t *>(m->data) + 8, kPatterns[side].bytes + 8, kSize - 8) == 0;
}

// Allocates, fills and posts message k of side x.
void post(Side *x, uint64_t k) {
  if (x->nfree == 0) return fail("%s: no free send buffer for message %" PRIu64, x->name, k);
  const int b = x->free_bufs[--x->nfree];
  ibmsg_buffer *m = &x->bufs[b];
  int rc = ibmsg_alloc_msg(m, &x->s, kSize);
  if (rc) return fail("%s: ibmsg_alloc_msg for message %" PRIu64 ": %s", x->name, k,
                      ibmsg_err_name(rc));
  m->user_data = reinterpret_cast<void *>(intptr_t(b));
  fill(m->data, k, x->pattern);
  rc = ibmsg_post_send(&x->s, m);
  if (rc) return fail("%s: ibmsg_post_send of message %" PRIu64 ": %s", x->name, k,
                      ibmsg_err_name(rc));
  ++x->posted;
}

void on_request(ibmsg_connection_request *req) {
  ++g_run->requests;
  Side *x = &g_run->server;
  if (x->opened) {
    ibmsg_reject(req, "one connection only");
    return fail("a second connection request");
  }
  x->s.user_data = x;
  if (int rc = ibmsg_accept(req, &x->s)) return fail("ibmsg_accept: %s", ibmsg_err_name(rc));
  x->opened = true;
}

void on_established(ibmsg_socket *s) { side_of(s)->established = true; }

void on_received(ibmsg_socket *s, ibmsg_buffer *m) {
  Run *r = g_run;
  Side *x = side_of(s);
  const uint64_t k = x->received++;
  if (r->stream) {  // the server frees what it gets; nothing comes back
    if (x != &r->server) fail("%s: a message in a stream to the server", x->name);
    else if (!intact(m, k, r->client.pattern))
      fail("%s: message %" PRIu64 " arrived changed, out of order or twice", x->name, k);
    if (int rc = ibmsg_free_msg(m))
      fail("%s: ibmsg_free_msg of message %" PRIu64 ": %s", x->name, k, ibmsg_err_name(rc));
    return;
  }
  if (x == &r->client) {
    // Reply k: round trip k + 1 is complete.
    if (k + 1 == r->warmup) {
      r->at_start = fake::stats();
      r->posts_start = fake::posts().size();
      r->measuring = true;
      CALLGRIND_START_INSTRUMENTATION;
      CALLGRIND_ZERO_STATS;
    } else if (k + 1 == r->warmup + r->measured) {
      CALLGRIND_DUMP_STATS_AT(kTrigger);
      CALLGRIND_STOP_INSTRUMENTATION;
      r->at_stop = fake::stats();
      r->posts_stop = fake::posts().size();
      r->measuring = false;
    }
  }
  if (!intact(m, k, x == &r->client ? r->server.pattern : r->client.pattern))
    fail("%s: message %" PRIu64 " arrived changed, out of order or twice", x->name, k);
  if (int rc = ibmsg_free_msg(m))
    fail("%s: ibmsg_free_msg of message %" PRIu64 ": %s", x->name, k, ibmsg_err_name(rc));
  if (failed()) return;
  if (x == &r->server) {
    post(x, k);  // the reply
  } else if (k + 1 < r->warmup + r->measured) {
    post(x, k + 1);
  } else {
    r->done = true;
  }
}

void on_sent(ibmsg_socket *s, ibmsg_buffer *m, int status) {
  Side *x = side_of(s);
  if (status != IBMSG_OK) fail("%s: message_sent with %s", x->name, ibmsg_err_name(status));
  else ++x->sent_ok;
  const int b = int(reinterpret_cast<intptr_t>(m->user_data));
  if (int rc = ibmsg_free_msg(m))
    return fail("%s: ibmsg_free_msg of a sent message: %s", x->name, ibmsg_err_name(rc));
  x->free_bufs[x->nfree++] = b;
  Run *r = g_run;
  if (!r->stream || x != &r->client || failed()) return;
  // The stream: message k's send is complete; the count runs from the WARMUP-th to the
  // (WARMUP + ROUND_TRIPS)-th, with kWindow messages in flight throughout.
  const uint64_t k = x->sent_ok;
  if (k == r->warmup) {
    r->at_start = fake::stats();
    r->posts_start = fake::posts().size();
    r->measuring = true;
    CALLGRIND_START_INSTRUMENTATION;
    CALLGRIND_ZERO_STATS;
  } else if (k == r->warmup + r->measured) {
    CALLGRIND_DUMP_STATS_AT(kTrigger);
    CALLGRIND_STOP_INSTRUMENTATION;
    r->at_stop = fake::stats();
    r->posts_stop = fake::posts().size();
    r->measuring = false;
  }
  if (x->posted < r->warmup + r->measured + kWindow) post(x, x->posted);
}

void on_closed(ibmsg_socket *s, int reason) {
  Side *x = side_of(s);
  ++x->closed;
  x->close_reason = reason;
  if (!g_run->done && !failed())
    fail("%s closed before the end: %s", x->name, ibmsg_err_name(reason));
}

// --critical: collection on from a receive completion to the next post_flush, while measuring
// (callgrind toggles only while it instruments: the window around the start is left out).
bool g_window = false;
void window_open() {
  if (g_window || !g_run->measuring) return;
  g_window = true;
  CALLGRIND_TOGGLE_COLLECT;
}
void window_close() {
  if (!g_window) return;
  g_window = false;
  CALLGRIND_TOGGLE_COLLECT;
}

double now_s() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return double(ts.tv_sec) + double(ts.tv_nsec) / 1e9;
}

// Dispatches the loop until cond() or a failure, at most limit_s seconds; whether cond() came.
template <class F>
bool run_until(Run *r, F cond, double limit_s) {
  const double start = now_s();
  while (!cond() && !failed()) {
    if (now_s() - start > limit_s) return false;
    ibmsg_dispatch_event_loop_timeout(&r->loop, 100);
  }
  return cond();
}

int usage() {
  fprintf(stderr, "usage: cost [--critical | --stream] [ROUND_TRIPS [WARMUP]]   "
                  "(ROUND_TRIPS >= 1, WARMUP >= 1)\n"
                  "       cost --markers | --compiler\n");
  return 2;
}

bool parse_count(const char *arg, uint64_t *out) {
  char *end;
  errno = 0;
  unsigned long long v = strtoull(arg, &end, 10);
  if (errno || end == arg || *end || v == 0 || v > (1ull << 40) || arg[0] == '-') return false;
  *out = v;
  return true;
}

}  // namespace

int main(int argc, char **argv) {
  if (argc == 2 && strcmp(argv[1], "--markers") == 0) {
    puts(COST_MARKERS);
    return 0;
  }
  if (argc == 2 && strcmp(argv[1], "--compiler") == 0) {
#if defined(__clang__)
    printf("clang++ %d.%d.%d\n", __clang_major__, __clang_minor__, __clang_patchlevel__);
#elif defined(__GNUC__)
    printf("g++ %d.%d.%d\n", __GNUC__, __GNUC_MINOR__, __GNUC_PATCHLEVEL__);
#else
    puts("unknown");
#endif
    return 0;
  }
  Run run;
  g_run = &run;
  const bool critical = argc > 1 && strcmp(argv[1], "--critical") == 0;
  run.stream = argc > 1 && strcmp(argv[1], "--stream") == 0;
  if (critical || run.stream) {
    --argc;
    ++argv;
  }
  if (argc > 3 || (argc > 1 && !parse_count(argv[1], &run.measured)) ||
      (argc > 2 && !parse_count(argv[2], &run.warmup)))
    return usage();

  fake::reset();
  fake::set_max_srq_wr(16384);  // a device with shared receive queues (Soft-RoCE's maximum)
  if (critical) {
    fake::PathWatch w;
    w.recv_polled = window_open;
    w.flush = window_close;
    w.one_per_poll = true;
    fake::watch_path(w);
  }
  for (Side *x : {&run.client, &run.server}) {
    for (int i = 0; i < kBufs; ++i) x->free_bufs[i] = kBufs - 1 - i;
    x->nfree = kBufs;
  }
  ibmsg_event_loop *loop = &run.loop;
  int rc = ibmsg_init_event_loop(loop);
  if (rc) {
    fprintf(stderr, "cost: ibmsg_init_event_loop: %s\n", ibmsg_err_name(rc));
    return 1;
  }
  loop->connection_request = on_request;
  loop->connection_established = on_established;
  loop->message_received = on_received;
  loop->message_sent = on_sent;
  loop->connection_closed = on_closed;
  const int always = IBMSG_BUSY_POLL_ALWAYS;
  rc = ibmsg_setopt(loop, IBMSG_OPT_BUSY_POLL, &always, sizeof always);
  if (rc) fail("ibmsg_setopt IBMSG_OPT_BUSY_POLL: %s", ibmsg_err_name(rc));

  Side *l = &run.listener, *c = &run.client, *sv = &run.server;
  l->s.user_data = l;
  c->s.user_data = c;
  unsigned short port = 0;
  if (!failed()) {
    if ((rc = ibmsg_listen(loop, &l->s, nullptr, 0, 1))) fail("ibmsg_listen: %s", ibmsg_err_name(rc));
    else l->opened = true;
  }
  if (!failed() && (rc = ibmsg_socket_local_address(&l->s, nullptr, 0, &port)))
    fail("ibmsg_socket_local_address: %s", ibmsg_err_name(rc));
  if (!failed()) {
    if ((rc = ibmsg_connect(loop, &c->s, "127.0.0.1", port)))
      fail("ibmsg_connect: %s", ibmsg_err_name(rc));
    else c->opened = true;
  }
  if (!failed() && !run_until(&run, [&] { return c->established && sv->established; }, 30))
    fail("not connected after 30 s");

  // The ping-pong: message 0 from outside the callbacks, the rest from message_received (the
  // stream: the first kWindow messages, the rest from message_sent). A polling loop does not
  // sleep: each dispatch is one slice of spinning (1 ms).
  const uint64_t total = run.warmup + run.measured + (run.stream ? kWindow : 0);
  if (!failed()) {
    if (run.stream)
      for (uint64_t k = 0; k < kWindow && !failed(); ++k) post(c, k);
    else
      post(c, 0);
  }
  // Progress: the client's replies, or the server's messages in a stream.
  const uint64_t &progress = run.stream ? sv->received : c->received;
  auto finished = [&] {
    return run.stream ? sv->received == total && c->sent_ok == total : run.done;
  };
  double last = now_s();
  uint64_t last_progress = 0;
  for (unsigned i = 0; !finished() && !failed(); ++i) {
    ibmsg_dispatch_event_loop(loop);
    if ((i & 255) != 255) continue;
    if (progress != last_progress) {
      last_progress = progress;
      last = now_s();
    } else if (now_s() - last > 60) {
      fail("nothing for 60 s: %" PRIu64 " of %" PRIu64 " %s", progress, total,
           run.stream ? "messages" : "round trips");
    }
  }
  if (run.measuring) CALLGRIND_STOP_INSTRUMENTATION;
  if (run.stream && finished()) run.done = true;  // (the closes that follow are expected)

  // Closing: the client disconnects (the server sees the peer's disconnect), then the listener.
  const bool pingpong_ok = !failed();
  for (Side *x : {c, l})
    if (x->opened && x->closed == 0 && (rc = ibmsg_disconnect(&x->s)) && rc != IBMSG_ESTATE)
      fail("ibmsg_disconnect of the %s: %s", x->name, ibmsg_err_name(rc));
  if (!run_until(&run, [&] {
        return (!l->opened || l->closed) && (!c->opened || c->closed) && (!sv->opened || sv->closed);
      }, 30))
    fail("the sockets did not all close within 30 s");
  const double t0 = now_s();
  while ((rc = ibmsg_destroy_event_loop(loop)) == IBMSG_EBUSY && now_s() - t0 < 30)
    ibmsg_dispatch_event_loop_timeout(loop, 10);
  if (rc) fail("ibmsg_destroy_event_loop: %s", ibmsg_err_name(rc));

  if (pingpong_ok) {
    for (Side *x : {c, sv}) {
      // (A stream: the client only posts and the server only receives.)
      const uint64_t received = run.stream && x == c ? 0 : total;
      const uint64_t posted = run.stream && x == sv ? 0 : total;
      if (x->received != received || x->posted != posted || x->sent_ok != posted)
        fail("%s: received %" PRIu64 ", posted %" PRIu64 ", sent %" PRIu64 ", expected %" PRIu64
             ", %" PRIu64 " and %" PRIu64, x->name, x->received, x->posted, x->sent_ok, received,
             posted, posted);
      if (x->closed != 1) fail("%s: %d closed callbacks", x->name, x->closed);
    }
    if (l->closed != 1) fail("listener: %d closed callbacks", l->closed);
    if (c->close_reason != IBMSG_OK) fail("client closed with %s", ibmsg_err_name(c->close_reason));
    if (run.requests != 1) fail("%d connection requests", run.requests);
  }
  const fake::Stats &st = fake::stats();
  if (st.rnr_errors || st.length_errors || st.misuses)
    fail("the fake transport saw %lu RNR, %lu length errors, %lu misuses%s%s", st.rnr_errors,
         st.length_errors, st.misuses, st.misuses ? ": " : "", st.first_misuse.c_str());
  const std::string open = fake::open_objects_text();
  if (!open.empty()) fail("left open in the fake transport: %s", open.c_str());

  if (failed()) {
    fprintf(stderr, "cost: FAIL: %s\n", run.failure.c_str());
    return 1;
  }
  // What the transport did in the measured round trips (the fake's counters).
  const fake::Stats &a = run.at_start, &b = run.at_stop;
  const double n = double(run.measured);
  const char *unit = run.stream ? "message" : "round trip";
  if (run.stream)
    printf("cost: a stream of %" PRIu64 " messages of %zu B, %" PRIu64 " in flight (%" PRIu64
           " warm-up, %" PRIu64 " measured), every message intact and in order, everything "
           "closed\n", total, kSize, kWindow, run.warmup, run.measured);
  else
    printf("cost: %" PRIu64 " round trips of %zu B (%" PRIu64 " warm-up, %" PRIu64
           " measured), every message intact and in order, everything closed\n",
           total, kSize, run.warmup, run.measured);
  printf("cost: per measured %s, in the fake: %.3f SENDs delivered (credit-only ones "
         "included), %.3f send completions, %.3f send lists (doorbells), %.3f receive lists\n",
         unit, double(b.delivered - a.delivered) / n, double(b.send_cqes - a.send_cqes) / n,
         double(b.post_lists - a.post_lists) / n, double(b.recv_lists - a.recv_lists) / n);
  unsigned long data = 0, ctrl = 0, other = 0;
  for (size_t i = run.posts_start; i < run.posts_stop && i < fake::posts().size(); ++i) {
    const ibmsg::tp::Op op = fake::posts()[i].op;
    (op == ibmsg::tp::Op::Send ? data : op == ibmsg::tp::Op::Ctrl ? ctrl : other)++;
  }
  printf("cost: per measured %s, posted: %.3f data messages, %.3f credit-only messages, "
         "%.3f other work requests\n", unit, double(data) / n, double(ctrl) / n,
         double(other) / n);
  printf("cost: client requests: %s (trigger \"%s\")\n", COST_MARKERS, kTrigger);
  return 0;
}
