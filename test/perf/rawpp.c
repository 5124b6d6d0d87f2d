// rawpp: a minimal busy-polled RDMA ping-pong over librdmacm and libibverbs, the raw-verbs
// reference of test/perf/hops. It makes the same choices as ibmsg's data path: one RC QP and ONE
// CQ for send and receive, 32 receive buffers of 16 KiB re-posted as they are polled (with -Q a
// shared receive queue of 1024 of them, as ibmsg's default), send with immediate, every send
// signaled, inline up to 256 bytes, busy polling.
// The client prints the median one-way latency (half a round trip, time stamp counter).
//
// Hop trace: with IBMSG_HOP_TRACE=DIR each process writes DIR/hops-PID.bin at exit, as ibmsg's
// hop-trace build does (src/transport/hoptrace.cpp; test/perf/hops-analyze reads it): little-endian
// uint64 words "IBMSGHOP" (0x504f4847534d4249), the counter rate in kHz, then four arrays, each a
// count and its values: rdtsc before each ibv_post_send, after it, at each receive completion
// polled, and at the last empty poll before that one (0 if none).
//
// Usage: rawpp -s | -c ADDR  [-p PORT] [-n ITERS] [-S SIZE] [-w WARMUP] [-Q] [-D] [-T K] [-X K] [-M K]
// (-D: each receive buffer is re-posted after the next send's doorbell, as ibmsg does, not before;
// -T K: one word of each of K pages written before every send, a data footprint for experiments;
// -X K: K blocks of straight-line code run before every send, each on a page of its own, about
// 120 distinct instructions each, a code footprint: ibmsg's path runs about 1400 distinct
// instructions per message on 13 pages, make cost; -M K: K steps through a ring of nodes on 8
// pages before every send, each an increment of the node it is on and a load of the next (5
// instructions), memory accesses as ibmsg's critical part makes about 360 per message)
// The server answers each message with one of the same length; give it the client's -n and -w.
// Build: gcc -std=gnu11 -O2 -o rawpp rawpp.c -lrdmacm -libverbs
#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <x86intrin.h>

enum { NRECV = 32, NSRQ = 1024, BUF = 16384, CQ_DEPTH = 256, SQ_DEPTH = 64, INLINE = 256, TIMEOUT_MS = 10000 };
#define TRACE_MAX (1u << 20)
#define SEND_WRID (1ull << 32)  // send wr_ids are SEND_WRID | iteration; receives are a buffer index

struct ctx {
  struct rdma_event_channel *ec;
  struct rdma_cm_id *listen_id, *id;
  struct ibv_pd *pd;
  struct ibv_cq *cq;
  struct ibv_srq *srq;  // -Q: a shared receive queue of NSRQ buffers, as ibmsg's
  uint64_t nbufs;       // receive buffers: NRECV, or NSRQ with -Q
  int defer;            // -D: a receive buffer goes back after the next send's doorbell, not before
  uint64_t held[32];    // (its index, until then)
  int nheld;
  uint64_t *pages;      // -T K: K pages, one word of each written before every send (a footprint)
  long npages;
  long nblocks;         // -X K: K blocks of code run before every send (a code footprint)
  struct mnode *ring;   // -M K: a ring of nodes on 8 pages, K steps through it before every send
  struct mnode *ring_base;
  long nsteps;
  struct ibv_mr *rmr, *smr;
  char *rbuf, *sbuf;
  uint32_t max_inline;
  uint64_t sends_posted, sends_done, nrecv;
  uint64_t last_found;  // rdtsc at the last receive completion polled
  uint32_t last_len;    // its byte count
};

enum { T_POSTS, T_ENDS, T_FOUND, T_EMPTY };
static struct {
  int on;
  uint64_t *v[4], n[4];
  uint64_t last_empty;
} tr;
static struct timespec t_start;
static uint64_t tsc_start;

__attribute__((noreturn, format(printf, 1, 2))) static void die(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs("rawpp: ", stderr);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  exit(1);
}
// rdma_* and allocation calls: failure sets errno. ibv_* calls returning int: the error number.
#define CHECK(ok, what) do { if (!(ok)) die("%s: %s", what, strerror(errno)); } while (0)
#define CHECK_RET(call, what)                                                 \
  do {                                                                        \
    int r_ = (call);                                                          \
    if (r_) die("%s: %s", what, strerror(r_ > 0 ? r_ : errno));               \
  } while (0)

static double elapsed_ns(const struct timespec *a, const struct timespec *b) {
  return (double)(b->tv_sec - a->tv_sec) * 1e9 + (double)(b->tv_nsec - a->tv_nsec);
}

// Counter ticks per nanosecond, from process start to now.
static double tsc_per_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  uint64_t ticks = __rdtsc() - tsc_start;
  double ns = elapsed_ns(&t_start, &t);
  return ns > 0 ? (double)ticks / ns : 0;
}

static void rec(int k, uint64_t t) {
  if (tr.on && tr.n[k] < TRACE_MAX) tr.v[k][tr.n[k]++] = t;
}

static struct rdma_cm_event *get_event(struct rdma_event_channel *ec, enum rdma_cm_event_type want) {
  struct pollfd p = {.fd = ec->fd, .events = POLLIN};
  int r;
  do r = poll(&p, 1, TIMEOUT_MS); while (r < 0 && errno == EINTR);
  CHECK(r >= 0, "poll on the CM event channel");
  if (r == 0) die("no CM event within %d s (waiting for %s)", TIMEOUT_MS / 1000, rdma_event_str(want));
  struct rdma_cm_event *ev;
  CHECK(rdma_get_cm_event(ec, &ev) == 0, "rdma_get_cm_event");
  if (ev->event != want)
    die("expected CM event %s, got %s (status %d)", rdma_event_str(want), rdma_event_str(ev->event),
        ev->status);
  return ev;
}

static void wait_event(struct rdma_event_channel *ec, enum rdma_cm_event_type want) {
  CHECK(rdma_ack_cm_event(get_event(ec, want)) == 0, "rdma_ack_cm_event");
}

static void post_recv(struct ctx *c, uint64_t i) {
  struct ibv_sge sge = {.addr = (uintptr_t)(c->rbuf + i * BUF), .length = BUF, .lkey = c->rmr->lkey};
  struct ibv_recv_wr wr = {.wr_id = i, .sg_list = &sge, .num_sge = 1}, *bad = NULL;
  if (c->srq) CHECK_RET(ibv_post_srq_recv(c->srq, &wr, &bad), "ibv_post_srq_recv");
  else CHECK_RET(ibv_post_recv(c->id->qp, &wr, &bad), "ibv_post_recv");
}

// Polls once; consumes send completions, re-posts receives. Returns the number of completions.
static int poll_once(struct ctx *c) {
  struct ibv_wc wc[32];
  int n = ibv_poll_cq(c->cq, 32, wc);
  if (n == 0) {
    if (tr.on) tr.last_empty = __rdtsc();
    return 0;
  }
  if (n < 0) die("ibv_poll_cq failed (%d)", n);
  for (int i = 0; i < n; i++) {
    if (wc[i].status != IBV_WC_SUCCESS)
      die("%s completion failed: %s (vendor error 0x%x)", wc[i].wr_id & SEND_WRID ? "send" : "receive",
          ibv_wc_status_str(wc[i].status), wc[i].vendor_err);
    if (!(wc[i].opcode & IBV_WC_RECV)) {
      c->sends_done++;
      continue;
    }
    uint64_t t = __rdtsc();
    if (tr.on && tr.n[T_FOUND] < TRACE_MAX) {
      tr.v[T_EMPTY][tr.n[T_EMPTY]++] = tr.last_empty;
      tr.v[T_FOUND][tr.n[T_FOUND]++] = t;
    }
    if (!(wc[i].wc_flags & IBV_WC_WITH_IMM) || ntohl(wc[i].imm_data) != (uint32_t)c->nrecv)
      die("receive %llu: no or unexpected immediate", (unsigned long long)c->nrecv);
    c->last_found = t;
    c->last_len = wc[i].byte_len;
    if (c->defer && c->nheld < 32) c->held[c->nheld++] = wc[i].wr_id;
    else post_recv(c, wc[i].wr_id);
    c->nrecv++;
  }
  return n;
}

// Busy-polls until *count reaches target; gives up after 10 s.
static void wait_for(struct ctx *c, const uint64_t *count, uint64_t target, const char *what) {
  unsigned empty = 0;
  struct timespec start = {0}, now;
  while (*count < target) {
    if (poll_once(c) || ++empty % 4096) continue;
    clock_gettime(CLOCK_MONOTONIC, &now);
    if (empty == 4096) start = now;  // the clock is read only once a wait is long
    else if (elapsed_ns(&start, &now) > TIMEOUT_MS * 1e6) die("no %s within %d s", what, TIMEOUT_MS / 1000);
  }
}

// -X: blocks of straight-line code, each aligned to a page of its own; every step has a constant
// of its own (__COUNTER__), so that no two are the same instructions and none folds away.
#define XOP x = (x ^ (__COUNTER__ * 0x9E3779B97F4A7C15ull)) * 3 + (x >> 7);
#define X4 XOP XOP XOP XOP
#define X24 X4 X4 X4 X4 X4 X4
#define XBLK(n) \
  __attribute__((noinline, aligned(4096))) static uint64_t xblk##n(uint64_t x) { X24 return x; }
XBLK(0) XBLK(1) XBLK(2) XBLK(3) XBLK(4) XBLK(5) XBLK(6) XBLK(7)
XBLK(8) XBLK(9) XBLK(10) XBLK(11) XBLK(12) XBLK(13) XBLK(14) XBLK(15)
enum { XBLOCKS = 16 };
static volatile uint64_t xsink;

// Direct calls, one after the other: a table of pointers would make each an indirect call, which
// under qemu's TCG costs tens of nanoseconds more (PERFORMANCE.md) and is not what -X measures.
static void run_blocks(long k) {
  uint64_t x = xsink;
  if (k > 0) x = xblk0(x);
  if (k > 1) x = xblk1(x);
  if (k > 2) x = xblk2(x);
  if (k > 3) x = xblk3(x);
  if (k > 4) x = xblk4(x);
  if (k > 5) x = xblk5(x);
  if (k > 6) x = xblk6(x);
  if (k > 7) x = xblk7(x);
  if (k > 8) x = xblk8(x);
  if (k > 9) x = xblk9(x);
  if (k > 10) x = xblk10(x);
  if (k > 11) x = xblk11(x);
  if (k > 12) x = xblk12(x);
  if (k > 13) x = xblk13(x);
  if (k > 14) x = xblk14(x);
  if (k > 15) x = xblk15(x);
  xsink = x;
}

// -M: nodes of a ring, one per 64 bytes of 8 pages, linked in a stride that visits every page in
// turn; each step increments the node it is on and loads the next.
struct mnode {
  struct mnode *next;
  uint64_t count;
  char pad[48];
};
enum { MNODES = 8 * 4096 / 64 };

static struct mnode *ring_make(void) {
  struct mnode *r = aligned_alloc(4096, MNODES * sizeof *r);
  if (!r) return NULL;
  memset(r, 0, MNODES * sizeof *r);
  // (i * 65) mod 512: 65 is odd, so the steps visit all 512 nodes, a page further each time.
  for (long i = 0; i < MNODES; i++) r[(i * 65) % MNODES].next = &r[((i + 1) * 65) % MNODES];
  return r;
}

static void run_steps(struct ctx *c) {
  struct mnode *n = c->ring;
  for (long k = 0; k < c->nsteps; k++) {
    n->count++;
    n = n->next;
  }
  c->ring = n;  // the next send goes on from here
}

// Posts one send of len bytes with immediate imm; returns rdtsc just before ibv_post_send.
static uint64_t post_send(struct ctx *c, uint32_t imm, uint32_t len) {
  for (long k = 0; k < c->npages; k++) c->pages[k * 512]++;
  if (c->nblocks) run_blocks(c->nblocks);
  if (c->nsteps) run_steps(c);
  if (c->sends_posted - c->sends_done >= SQ_DEPTH)
    wait_for(c, &c->sends_done, c->sends_posted - SQ_DEPTH + 1, "send completion");
  struct ibv_sge sge = {.addr = (uintptr_t)c->sbuf, .length = len, .lkey = c->smr->lkey};
  struct ibv_send_wr wr = {.wr_id = SEND_WRID | imm, .sg_list = &sge, .num_sge = len ? 1 : 0,
                           .opcode = IBV_WR_SEND_WITH_IMM, .imm_data = htonl(imm),
                           .send_flags = IBV_SEND_SIGNALED | (len <= c->max_inline ? IBV_SEND_INLINE : 0)};
  struct ibv_send_wr *bad = NULL;
  uint64_t t = __rdtsc();
  rec(T_POSTS, t);
  int r = ibv_post_send(c->id->qp, &wr, &bad);
  rec(T_ENDS, __rdtsc());
  if (r) die("ibv_post_send: %s", strerror(r > 0 ? r : errno));
  c->sends_posted++;
  while (c->nheld > 0) post_recv(c, c->held[--c->nheld]);
  return t;
}

static struct ibv_qp_init_attr qp_attr(struct ctx *c, uint32_t max_inline) {
  struct ibv_qp_init_attr a = {.send_cq = c->cq, .recv_cq = c->cq, .qp_type = IBV_QPT_RC,
                               .srq = c->srq,
                               .cap = {.max_send_wr = SQ_DEPTH, .max_recv_wr = c->srq ? 0 : NRECV,
                                       .max_send_sge = 1, .max_recv_sge = c->srq ? 0 : 1,
                                       .max_inline_data = max_inline}};
  return a;
}

// PD, CQ, buffers, QP on c->id's device; all receives posted.
static void setup(struct ctx *c, int use_srq) {
  CHECK(c->pd = ibv_alloc_pd(c->id->verbs), "ibv_alloc_pd");
  c->nbufs = NRECV;
  if (use_srq) {
    struct ibv_srq_init_attr sa = {.attr = {.max_wr = NSRQ, .max_sge = 1}};
    CHECK(c->srq = ibv_create_srq(c->pd, &sa), "ibv_create_srq");
    c->nbufs = NSRQ;
  }
  CHECK(c->cq = ibv_create_cq(c->id->verbs, CQ_DEPTH, NULL, NULL, 0), "ibv_create_cq");
  CHECK_RET(posix_memalign((void **)&c->rbuf, 4096, c->nbufs * BUF), "posix_memalign");
  CHECK_RET(posix_memalign((void **)&c->sbuf, 4096, BUF), "posix_memalign");
  memset(c->rbuf, 0, c->nbufs * BUF);
  memset(c->sbuf, 0x5a, BUF);
  CHECK(c->rmr = ibv_reg_mr(c->pd, c->rbuf, c->nbufs * BUF, IBV_ACCESS_LOCAL_WRITE), "ibv_reg_mr (receive)");
  CHECK(c->smr = ibv_reg_mr(c->pd, c->sbuf, BUF, IBV_ACCESS_LOCAL_WRITE), "ibv_reg_mr (send)");
  struct ibv_qp_init_attr a = qp_attr(c, INLINE);
  if (rdma_create_qp(c->id, c->pd, &a)) {
    fprintf(stderr, "rawpp: rdma_create_qp with %d inline bytes: %s; retrying without inline\n", INLINE,
            strerror(errno));
    a = qp_attr(c, 0);
    CHECK(rdma_create_qp(c->id, c->pd, &a) == 0, "rdma_create_qp");
  }
  c->max_inline = a.cap.max_inline_data;
  for (uint64_t i = 0; i < c->nbufs; i++) post_recv(c, i);
}

static void teardown(struct ctx *c) {
  rdma_destroy_qp(c->id);
  CHECK_RET(ibv_dereg_mr(c->smr), "ibv_dereg_mr (send)");
  CHECK_RET(ibv_dereg_mr(c->rmr), "ibv_dereg_mr (receive)");
  if (c->srq) CHECK_RET(ibv_destroy_srq(c->srq), "ibv_destroy_srq");
  CHECK_RET(ibv_destroy_cq(c->cq), "ibv_destroy_cq");
  CHECK_RET(ibv_dealloc_pd(c->pd), "ibv_dealloc_pd");
  free(c->sbuf);
  free(c->rbuf);
  free(c->pages);
  free(c->ring_base);
  CHECK(rdma_destroy_id(c->id) == 0, "rdma_destroy_id");
  if (c->listen_id) CHECK(rdma_destroy_id(c->listen_id) == 0, "rdma_destroy_id (listener)");
  rdma_destroy_event_channel(c->ec);
}

static void write_trace(void) {
  double rate = tsc_per_ns();
  uint64_t head[2] = {0x504f4847534d4249ull, (uint64_t)(rate * 1e6 + 0.5)};  // "IBMSGHOP", kHz
  char path[4096];
  snprintf(path, sizeof path, "%s/hops-%ld.bin", getenv("IBMSG_HOP_TRACE"), (long)getpid());
  FILE *f = fopen(path, "wb");
  CHECK(f, path);
  int ok = fwrite(head, sizeof head, 1, f) == 1;
  for (int k = 0; k < 4; k++) {
    ok = ok && fwrite(&tr.n[k], sizeof tr.n[k], 1, f) == 1;
    ok = ok && fwrite(tr.v[k], sizeof(uint64_t), tr.n[k], f) == tr.n[k];
    free(tr.v[k]);
  }
  if (fclose(f) != 0 || !ok) die("writing %s failed", path);
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

static long num(const char *s, long lo, long hi, const char *what) {
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno || *end || end == s || v < lo || v > hi) die("bad %s '%s' (%ld..%ld)", what, s, lo, hi);
  return v;
}

__attribute__((noreturn)) static void usage(void) {
  fprintf(stderr, "usage: rawpp -s | -c ADDR  [-p PORT] [-n ITERS] [-S SIZE] [-w WARMUP] [-Q] [-D] [-T PAGES] [-X BLOCKS] [-M STEPS]\n");
  exit(2);
}

int main(int argc, char **argv) {
  clock_gettime(CLOCK_MONOTONIC, &t_start);
  tsc_start = __rdtsc();
  int server = 0, use_srq = 0, defer = 0, opt;
  long touch = 0, blocks = 0, steps = 0;
  const char *addr = NULL;
  long port = 12399, iters = 20000, size = 64, warmup = 100;
  while ((opt = getopt(argc, argv, "sc:p:n:S:w:QDT:X:M:")) != -1) {
    switch (opt) {
      case 's': server = 1; break;
      case 'c': addr = optarg; break;
      case 'p': port = num(optarg, 1, 65535, "port"); break;
      case 'n': iters = num(optarg, 1, 1L << 30, "iteration count"); break;
      case 'S': size = num(optarg, 0, BUF, "size"); break;
      case 'Q': use_srq = 1; break;
      case 'D': defer = 1; break;
      case 'T': touch = num(optarg, 0, 65536, "page count"); break;
      case 'X': blocks = num(optarg, 0, XBLOCKS, "block count"); break;
      case 'M': steps = num(optarg, 0, 1L << 20, "step count"); break;
      case 'w': warmup = num(optarg, 0, 1L << 30, "warmup count"); break;
      default: usage();
    }
  }
  if (optind != argc || server == (addr != NULL)) usage();
  const char *dir = getenv("IBMSG_HOP_TRACE");
  if (dir && *dir) {
    for (int k = 0; k < 4; k++) CHECK(tr.v[k] = calloc(TRACE_MAX, sizeof(uint64_t)), "calloc (hop trace)");
    tr.on = 1;
  }

  struct ctx c = {0};
  c.defer = defer;
  c.nblocks = blocks;
  if (steps) {
    CHECK(c.ring = c.ring_base = ring_make(), "aligned_alloc (ring)");
    c.nsteps = steps;
  }
  if (touch) {
    CHECK(c.pages = calloc((size_t)touch * 512, sizeof(uint64_t)), "calloc (pages)");
    c.npages = touch;
  }
  struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  struct rdma_conn_param param = {.responder_resources = 1, .initiator_depth = 1, .retry_count = 7,
                                  .rnr_retry_count = 7};
  CHECK(c.ec = rdma_create_event_channel(), "rdma_create_event_channel");
  if (server) {
    sin.sin_addr.s_addr = htonl(INADDR_ANY);
    CHECK(rdma_create_id(c.ec, &c.listen_id, NULL, RDMA_PS_TCP) == 0, "rdma_create_id");
    CHECK(rdma_bind_addr(c.listen_id, (struct sockaddr *)&sin) == 0, "rdma_bind_addr");
    CHECK(rdma_listen(c.listen_id, 1) == 0, "rdma_listen");
    struct rdma_cm_event *ev = get_event(c.ec, RDMA_CM_EVENT_CONNECT_REQUEST);
    c.id = ev->id;
    CHECK(rdma_ack_cm_event(ev) == 0, "rdma_ack_cm_event");
    setup(&c, use_srq);
    CHECK(rdma_accept(c.id, &param) == 0, "rdma_accept");
  } else {
    if (inet_pton(AF_INET, addr, &sin.sin_addr) != 1) die("'%s' is not an IPv4 address", addr);
    CHECK(rdma_create_id(c.ec, &c.id, NULL, RDMA_PS_TCP) == 0, "rdma_create_id");
    CHECK(rdma_resolve_addr(c.id, NULL, (struct sockaddr *)&sin, 2000) == 0, "rdma_resolve_addr");
    wait_event(c.ec, RDMA_CM_EVENT_ADDR_RESOLVED);
    CHECK(rdma_resolve_route(c.id, 2000) == 0, "rdma_resolve_route");
    wait_event(c.ec, RDMA_CM_EVENT_ROUTE_RESOLVED);
    setup(&c, use_srq);
    CHECK(rdma_connect(c.id, &param) == 0, "rdma_connect");
  }
  wait_event(c.ec, RDMA_CM_EVENT_ESTABLISHED);

  uint64_t total = (uint64_t)warmup + (uint64_t)iters;
  if (server) {
    for (uint64_t i = 0; i < total; i++) {
      wait_for(&c, &c.nrecv, i + 1, "request");
      post_send(&c, (uint32_t)i, c.last_len);
    }
    wait_for(&c, &c.sends_done, c.sends_posted, "send completion");
    wait_event(c.ec, RDMA_CM_EVENT_DISCONNECTED);  // the client disconnects first
    CHECK(rdma_disconnect(c.id) == 0, "rdma_disconnect");
  } else {
    uint64_t *lat = malloc((size_t)iters * sizeof *lat);
    CHECK(lat, "malloc");
    for (uint64_t i = 0; i < total; i++) {
      uint64_t t0 = post_send(&c, (uint32_t)i, (uint32_t)size);
      wait_for(&c, &c.nrecv, i + 1, "reply");
      if (c.last_len != (uint32_t)size)
        die("reply %llu has %u bytes, not %ld", (unsigned long long)i, c.last_len, size);
      if (i >= (uint64_t)warmup) lat[i - (uint64_t)warmup] = c.last_found - t0;
    }
    wait_for(&c, &c.sends_done, c.sends_posted, "send completion");
    CHECK(rdma_disconnect(c.id) == 0, "rdma_disconnect");
    wait_event(c.ec, RDMA_CM_EVENT_DISCONNECTED);
    qsort(lat, (size_t)iters, sizeof *lat, cmp_u64);
    double rate = tsc_per_ns();
    if (rate <= 0) die("could not measure the time stamp counter's rate");
    printf("rawpp: %ld bytes, %ld round trips: one way median %.2f us\n", size, iters,
           (double)lat[iters / 2] / 2.0 / (rate * 1e3));
    free(lat);
  }
  teardown(&c);
  if (tr.on) write_trace();
  return 0;
}
