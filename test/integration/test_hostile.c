/* test_hostile.c - a hostile peer cannot take the server down, nor hurt its other connections.
 *
 * A raw peer, written here with librdmacm and libibverbs and encoding the wire protocol of
 * ibmsg(7) (WIRE PROTOCOL) by hand, connects to an ibmsg listener of the test's loop and breaks
 * the protocol in one way per test: private data that is not a hello or a hello that makes no
 * sense (the listener must refuse it, with the reject text of ibmsg(7)), or, once connected,
 * messages that the receiver must not take (it must close that connection alone, with the code
 * ibmsg(7) documents, IBMSG_EPROTO for protocol violations). All along, a well-behaved ibmsg
 * client of the same loop streams messages to the server and the server to it; every one of
 * them must arrive, whole and in order, and both ends must stay up. Two cases are positive
 * controls: valid messages of the raw peer (eager, with an immediate, by rendezvous) arrive,
 * and a FIN that declines a large message of the server is taken; they show that the raw peer
 * speaks the protocol, so that what the other cases change is what the server refuses.
 *
 * The raw peer runs in the test's thread: its connection manager events and completions are
 * polled between rounds of the ibmsg loop (HS_RUN_UNTIL). It offers immediates, rendezvous and
 * shared buffers (feature bits 1 to 3), not one-sided RDMA (bit 0); some cases leave out
 * another bit to send what it would allow. It never retries on RNR: where it sends beyond the
 * server's buffers, its own queue pair fails, which is its problem, not the server's.
 *
 * Each case is a test of its own (the table `cases` at the end): a new loop, the well-behaved
 * pair, the raw peer; then the pair streams STREAM_AFTER more messages each way, which must all
 * arrive, and a new client must still connect. The harness runs with RNR retry 0, so a shared
 * receive queue that the hostile peer leaves short of buffers fails the pair (IBMSG_EIO).
 * Opcode 2 is left alone: it is taken by a feature (keepalive) that is on its way.
 */
#define _POSIX_C_SOURCE 200809L

#include "harness.h"
#include "rawcm.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <netdb.h>
#include <rdma/rdma_cma.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* --- the wire format (ibmsg(7), WIRE PROTOCOL; src/wire.hpp) -------------------------------- */

#define W_MAGIC 0x49424d53u /* "IBMS", little-endian on the wire */
#define W_MAJOR 1
#define W_MINOR 3
#define W_KIND_HELLO 1
#define W_KIND_REJECT 2
#define W_HELLO_SIZE 32

#define W_OP_DATA 0
#define W_OP_CREDIT 1
#define W_OP_RNDV 3
#define W_OP_DATA_IMM 5
#define W_OP_RETURN 6

#define W_F_RDMA (1u << 0)
#define W_F_IMM (1u << 1)
#define W_F_RNDV (1u << 2)
#define W_F_SHARED (1u << 3)

#define W_WANTS 0x8000u
#define W_RTS_SIZE 32
#define W_FIN_SIZE 8
#define W_RTS 1
#define W_FIN 2

/* The immediate of a message: bits 0-15 data credits (bit 15 the wants bit with shared
 * buffers), 16-23 control credits, 24-27 done count, 28-31 opcode. */
static uint32_t w_imm(unsigned op, uint32_t credits, uint32_t ctrl, uint32_t done) {
  return (credits & 0xffffu) | (ctrl & 0xffu) << 16 | (done & 0x0fu) << 24 | (uint32_t)op << 28;
}

static void w_put32(uint8_t *p, uint32_t v) {
  p[0] = (uint8_t)v;
  p[1] = (uint8_t)(v >> 8);
  p[2] = (uint8_t)(v >> 16);
  p[3] = (uint8_t)(v >> 24);
}
static void w_put64(uint8_t *p, uint64_t v) {
  w_put32(p, (uint32_t)v);
  w_put32(p + 4, (uint32_t)(v >> 32));
}
static uint32_t w_get32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t w_get64(const uint8_t *p) { return (uint64_t)w_get32(p) | (uint64_t)w_get32(p + 4) << 32; }

/* A hello's fields, encoded by hs_hello_encode. */
struct w_hello {
  uint8_t major, minor, kind;
  uint32_t features, recv_depth, ctrl_depth, max_msg_size, rndv_max_size, cap;
};

/* The raw peer's own hello: immediates, rendezvous (up to 1 MiB) and shared buffers. */
#define RAW_RECV_DEPTH 16
#define RAW_CTRL_DEPTH 4
#define RAW_EAGER 16384
#define RAW_RNDV_MAX (1u << 20)

static struct w_hello w_hello_default(void) {
  struct w_hello h = {W_MAJOR, W_MINOR, W_KIND_HELLO, W_F_IMM | W_F_RNDV | W_F_SHARED,
                      RAW_RECV_DEPTH, RAW_CTRL_DEPTH, RAW_EAGER, RAW_RNDV_MAX, RAW_RECV_DEPTH};
  return h;
}

static void w_hello_encode(const struct w_hello *h, uint8_t out[W_HELLO_SIZE]) {
  w_put32(out, W_MAGIC);
  out[4] = h->major;
  out[5] = h->minor;
  out[6] = h->kind;
  out[7] = 0;
  w_put32(out + 8, h->features);
  w_put32(out + 12, h->recv_depth);
  w_put32(out + 16, h->ctrl_depth);
  w_put32(out + 20, h->max_msg_size);
  w_put32(out + 24, h->rndv_max_size);
  w_put32(out + 28, h->cap);
}

/* RTS: kind 1, flags, zero, id, rkey, immediate, address, length. */
static void w_rts(uint8_t out[W_RTS_SIZE], uint8_t flags, uint32_t id, uint32_t rkey, uint32_t imm,
                  uint64_t addr, uint64_t length) {
  out[0] = W_RTS;
  out[1] = flags;
  out[2] = out[3] = 0;
  w_put32(out + 4, id);
  w_put32(out + 8, rkey);
  w_put32(out + 12, imm);
  w_put64(out + 16, addr);
  w_put64(out + 24, length);
}

/* FIN: kind 2, status, zero, id. */
static void w_fin(uint8_t out[W_FIN_SIZE], uint8_t status, uint32_t id) {
  out[0] = W_FIN;
  out[1] = status;
  out[2] = out[3] = 0;
  w_put32(out + 4, id);
}

/* --- the raw peer --------------------------------------------------------------------------- */

#define RAW_RECVS 32                  /* receive buffers it posts (its hello grants 16 + 4) */
#define RAW_RECV_SLOT (RAW_EAGER + 64)
#define RAW_SENDS 32                  /* send slots, used in turn */
#define RAW_SEND_SLOT 20480           /* room for a message above the server's buffers */
#define RAW_DATA_SIZE 65536           /* the payload of its rendezvous messages */
#define RAW_CQ_SIZE 256
#define RAW_SEND_TAG (UINT64_C(1) << 32) /* in the id of every send work request */

struct raw {
  rawcm cm; /* the connection manager's part (rawcm.h) */
  struct ibv_pd *pd;
  struct ibv_cq *cq;
  struct ibv_mr *mr;
  uint8_t *mem; /* receive slots, send slots, the rendezvous payload */
  size_t mem_len;
  unsigned next_send;

  /* connection manager, besides cm */
  int reject_status;
  size_t reject_len;
  uint8_t reject_data[256];
  struct w_hello peer; /* the server's hello (established) */
  int peer_hello_ok;

  /* sending */
  int32_t data_credits; /* what the server granted, less what was spent (may go negative) */
  int sends_posted, sends_completed, send_errors;
  int first_send_error; /* ibv_wc_status of the first failed send */

  /* receiving */
  int received;      /* messages from the server */
  int recv_errors;
  uint32_t done_seen; /* done counts the server sent */
  int rts_seen;       /* RTSs of the server */
  int fins_seen;      /* FINs: the server declined one of our RTSs */
  uint32_t rts_id;    /* the id of the last one */
  uint64_t rts_length;
};

static uint8_t *raw_recv_buf(struct raw *r, unsigned i) { return r->mem + (size_t)i * RAW_RECV_SLOT; }
static uint8_t *raw_send_buf(struct raw *r, unsigned i) {
  return r->mem + (size_t)RAW_RECVS * RAW_RECV_SLOT + (size_t)i * RAW_SEND_SLOT;
}
static uint8_t *raw_data(struct raw *r) { return raw_send_buf(r, RAW_SENDS); }

static void raw_post_recv(struct raw *r, unsigned i) {
  struct ibv_sge sge;
  struct ibv_recv_wr wr, *bad = NULL;
  int rc;
  memset(&wr, 0, sizeof wr);
  sge.addr = (uintptr_t)raw_recv_buf(r, i);
  sge.length = RAW_RECV_SLOT;
  sge.lkey = r->mr->lkey;
  wr.wr_id = i;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  rc = ibv_post_recv(r->cm.id->qp, &wr, &bad);
  if (rc) r->recv_errors++;
}

/* One message of the server: its credits, done counts and, for an RTS, its id and length. */
static void raw_on_recv(struct raw *r, const struct ibv_wc *wc) {
  const uint8_t *buf = raw_recv_buf(r, (unsigned)wc->wr_id);
  uint32_t imm;
  unsigned op;

  r->received++;
  if (!(wc->wc_flags & IBV_WC_WITH_IMM)) return;
  imm = ntohl(wc->imm_data);
  op = imm >> 28;
  r->done_seen += (imm >> 24) & 0x0f;
  if (op == W_OP_RETURN) r->data_credits -= (int32_t)(imm & 0x7fff);
  else r->data_credits += (int32_t)(imm & 0x7fff);
  if (op == W_OP_RNDV && wc->byte_len == W_RTS_SIZE && buf[0] == W_RTS) {
    r->rts_seen++;
    r->rts_id = w_get32(buf + 4);
    r->rts_length = w_get64(buf + 24);
  }
  if (op == W_OP_RNDV && wc->byte_len == W_FIN_SIZE && buf[0] == W_FIN) r->fins_seen++;
}

static void raw_on_cm_event(struct raw *r, const struct rdma_cm_event *ev) {
  const uint8_t *p;
  size_t len;
  switch (ev->event) {
  case RDMA_CM_EVENT_ESTABLISHED:
    p = ev->param.conn.private_data;
    len = ev->param.conn.private_data_len;
    if (p && len >= W_HELLO_SIZE && w_get32(p) == W_MAGIC && p[6] == W_KIND_HELLO) {
      r->peer.major = p[4];
      r->peer.minor = p[5];
      r->peer.kind = p[6];
      r->peer.features = w_get32(p + 8);
      r->peer.recv_depth = w_get32(p + 12);
      r->peer.ctrl_depth = w_get32(p + 16);
      r->peer.max_msg_size = w_get32(p + 20);
      r->peer.rndv_max_size = w_get32(p + 24);
      r->peer.cap = w_get32(p + 28);
      r->peer_hello_ok = 1;
      r->data_credits = (int32_t)r->peer.recv_depth;
    }
    break;
  case RDMA_CM_EVENT_REJECTED:
    r->reject_status = ev->status;
    len = ev->param.conn.private_data_len;
    if (len > sizeof r->reject_data) len = sizeof r->reject_data;
    r->reject_len = ev->param.conn.private_data ? len : 0;
    if (r->reject_len) memcpy(r->reject_data, ev->param.conn.private_data, r->reject_len);
    break;
  default: break;
  }
  rawcm_note(&r->cm, ev->event); /* the flags, once the peer's own handling is done */
}

/* Handles whatever the raw peer's connection manager and completion queue have (never blocks). */
static void raw_poll(struct raw *r) {
  struct rdma_cm_event *ev;
  struct ibv_wc wc[16];
  int n, i;

  if (!r) return;
  while (r->cm.ch && rdma_get_cm_event(r->cm.ch, &ev) == 0) {
    raw_on_cm_event(r, ev);
    rdma_ack_cm_event(ev);
  }
  while (r->cq && (n = ibv_poll_cq(r->cq, 16, wc)) > 0) {
    for (i = 0; i < n; i++) {
      /* (the opcode of a failed completion is undefined: the work request's id tells) */
      if (!(wc[i].wr_id & RAW_SEND_TAG)) {
        if (wc[i].status != IBV_WC_SUCCESS) {
          r->recv_errors++;
          continue;
        }
        raw_on_recv(r, &wc[i]);
        raw_post_recv(r, (unsigned)wc[i].wr_id);
      } else {
        r->sends_completed++;
        if (wc[i].status != IBV_WC_SUCCESS && r->send_errors++ == 0)
          r->first_send_error = wc[i].status;
      }
    }
  }
}

/* The well-behaved pair of the running test, for failure messages. */
static h_conn *hs_pair_client, *hs_pair_server;

/* h_check_errors_at, saying first how the well-behaved pair is. */
static void hs_check_errors_at(h_ctx *ctx, const char *file, int line) {
  if (ctx->error[0] && hs_pair_client && hs_pair_server)
    print_error("well-behaved pair: client %s, server %s\n",
                hs_pair_client->closed ? ibmsg_err_name(hs_pair_client->close_reason) : "open",
                hs_pair_server->closed ? ibmsg_err_name(hs_pair_server->close_reason) : "open");
  h_check_errors_at(ctx, file, line);
}

/* What the large-announcement tests watch at every step of the loop: the longest time the
 * well-behaved server socket went without a message, and the most memory the process had pinned
 * (VmPin of /proc/self/status: what RDMA registrations hold in RAM) above where it started. */
static struct {
  h_conn *conn; /* NULL: not watching */
  int last_received;
  uint64_t last_ms, longest_ms;
  long pin_kb0, max_pin_kb;
} hs_watch;

static long hs_status_kb(const char *field) {
  char line[256];
  long kb = -1;
  size_t n = strlen(field);
  FILE *f = fopen("/proc/self/status", "r");
  if (!f) return -1;
  while (fgets(line, sizeof line, f))
    if (strncmp(line, field, n) == 0 && line[n] == ':') {
      kb = strtol(line + n + 1, NULL, 10);
      break;
    }
  fclose(f);
  return kb;
}

static void hs_watch_step(void) {
  uint64_t now;
  long pin;
  if (!hs_watch.conn) return;
  now = h_now_ms();
  if (hs_watch.conn->received != hs_watch.last_received) {
    hs_watch.last_received = hs_watch.conn->received;
    hs_watch.last_ms = now;
  } else if (now - hs_watch.last_ms > hs_watch.longest_ms) {
    hs_watch.longest_ms = now - hs_watch.last_ms;
  }
  pin = hs_status_kb("VmPin") - hs_watch.pin_kb0;
  if (pin > hs_watch.max_pin_kb) hs_watch.max_pin_kb = pin;
}

static void hs_watch_start(h_conn *c) {
  memset(&hs_watch, 0, sizeof hs_watch);
  hs_watch.pin_kb0 = hs_status_kb("VmPin");
  hs_watch.last_received = c->received;
  hs_watch.last_ms = h_now_ms();
  hs_watch.conn = c;
}

/* Stops watching and says what it saw. */
static void hs_watch_end(const char *what) {
  hs_watch_step();
  hs_watch.conn = NULL;
  print_message("  %s: the well-behaved stream's longest stall %llu ms; pinned memory at most "
                "%ld KiB above the start\n", what, (unsigned long long)hs_watch.longest_ms,
                hs_watch.max_pin_kb);
}

/* Runs the ibmsg loop and the raw peer until cond holds; fails the test after timeout_ms. */
static void hs_step_at(h_ctx *ctx, struct raw *r, uint64_t deadline, int timeout_ms, const char *what,
                       const char *file, int line) {
  int rc;
  hs_check_errors_at(ctx, file, line);
  if (h_now_ms() >= deadline) h_fail_at(file, line, "timed out after %d ms waiting for: %s", timeout_ms, what);
  rc = ctx->step(ctx, 2);
  if (rc != IBMSG_OK)
    h_fail_at(file, line, "running the loop failed with %s (%d) while waiting for: %s",
              ibmsg_err_name(rc), rc, what);
  raw_poll(r);
  hs_watch_step();
}

#define HS_RUN_UNTIL(ctx, r, cond, timeout_ms)                                                  \
  do {                                                                                          \
    uint64_t hs__deadline = h_now_ms() + (uint64_t)(timeout_ms);                                \
    raw_poll(r);                                                                                \
    while (!(cond)) hs_step_at((ctx), (r), hs__deadline, (timeout_ms), #cond, __FILE__, __LINE__); \
    hs_check_errors_at((ctx), __FILE__, __LINE__);                                              \
  } while (0)

/* Runs both for ms milliseconds. */
#define HS_RUN_FOR(ctx, r, ms)                                                                  \
  do {                                                                                          \
    uint64_t hs__end = h_now_ms() + (uint64_t)(ms);                                             \
    while (h_now_ms() < hs__end) hs_step_at((ctx), (r), hs__end + 1000, (ms), "(run for)", __FILE__, __LINE__); \
  } while (0)

/* The raw peers set up and not yet destroyed: a failed test leaves them to the teardown. */
#define RAW_LIVE_MAX 8
static struct raw *raw_live[RAW_LIVE_MAX];

static void raw_poll_peer(void *r) { raw_poll(r); }

static void raw_destroy(struct raw *r) {
  int i;
  if (!r) return;
  for (i = 0; i < RAW_LIVE_MAX; i++)
    if (raw_live[i] == r) raw_live[i] = NULL;
  rawcm_destroy_id(&r->cm, raw_poll_peer, r);
  if (r->cq) ibv_destroy_cq(r->cq);
  if (r->mr) ibv_dereg_mr(r->mr);
  if (r->pd) ibv_dealloc_pd(r->pd);
  if (r->cm.ch) rdma_destroy_event_channel(r->cm.ch);
  free(r->mem);
  free(r);
}

/* Resolves the server's address and route and sets up the queue pair with its receives posted;
 * then connects with private data pdata (len bytes). */
static struct raw *raw_connect(h_ctx *ctx, const void *pdata, uint8_t len) {
  struct raw *r = calloc(1, sizeof *r);
  struct ibv_qp_init_attr qa;
  struct ibv_device_attr da;
  struct rdma_conn_param cp;
  unsigned i;

  H_CHECK(r != NULL, "out of memory for the raw peer");
  for (i = 0; i < RAW_LIVE_MAX && raw_live[i]; i++) continue;
  if (i == RAW_LIVE_MAX) free(r);
  H_CHECK(i < RAW_LIVE_MAX, "more than %d raw peers at once", RAW_LIVE_MAX);
  raw_live[i] = r;
  rawcm_resolve_addr(ctx, &r->cm, r);
  HS_RUN_UNTIL(ctx, r, r->cm.addr_resolved || r->cm.cm_error, H_TIMEOUT_MS);
  H_CHECK(!r->cm.cm_error, "raw peer: address resolution failed (CM event %d)", r->cm.cm_error);
  H_CHECK(rdma_resolve_route(r->cm.id, 2000) == 0, "rdma_resolve_route: %s", strerror(errno));
  HS_RUN_UNTIL(ctx, r, r->cm.route_resolved || r->cm.cm_error, H_TIMEOUT_MS);
  H_CHECK(!r->cm.cm_error, "raw peer: route resolution failed (CM event %d)", r->cm.cm_error);

  r->pd = ibv_alloc_pd(r->cm.id->verbs);
  H_CHECK(r->pd != NULL, "ibv_alloc_pd failed");
  r->cq = ibv_create_cq(r->cm.id->verbs, RAW_CQ_SIZE, NULL, NULL, 0);
  H_CHECK(r->cq != NULL, "ibv_create_cq failed");
  r->mem_len = (size_t)RAW_RECVS * RAW_RECV_SLOT + (size_t)RAW_SENDS * RAW_SEND_SLOT + RAW_DATA_SIZE;
  r->mem = calloc(1, r->mem_len);
  H_CHECK(r->mem != NULL, "out of memory for the raw peer's buffers");
  r->mr = ibv_reg_mr(r->pd, r->mem, r->mem_len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
  H_CHECK(r->mr != NULL, "ibv_reg_mr: %s", strerror(errno));
  memset(&qa, 0, sizeof qa);
  qa.send_cq = r->cq;
  qa.recv_cq = r->cq;
  qa.qp_type = IBV_QPT_RC;
  qa.sq_sig_all = 1;
  qa.cap.max_send_wr = 64;
  qa.cap.max_recv_wr = RAW_RECVS;
  qa.cap.max_send_sge = 1;
  qa.cap.max_recv_sge = 1;
  H_CHECK(rdma_create_qp(r->cm.id, r->pd, &qa) == 0, "rdma_create_qp: %s", strerror(errno));
  r->cm.has_qp = 1;
  for (i = 0; i < RAW_RECVS; i++) raw_post_recv(r, i);
  H_CHECK(r->recv_errors == 0, "raw peer: posting its receives failed");

  H_CHECK(ibv_query_device(r->cm.id->verbs, &da) == 0, "ibv_query_device failed");
  memset(&cp, 0, sizeof cp);
  cp.private_data = pdata;
  cp.private_data_len = len;
  /* The server reads its rendezvous messages: it must be able to serve RDMA reads. */
  cp.responder_resources = (uint8_t)(da.max_qp_rd_atom < 16 ? da.max_qp_rd_atom : 16);
  cp.initiator_depth = (uint8_t)(da.max_qp_init_rd_atom < 16 ? da.max_qp_init_rd_atom : 16);
  cp.retry_count = 7;
  cp.rnr_retry_count = 0; /* a hostile sender: no RNR retries, its QP fails instead */
  H_CHECK(rdma_connect(r->cm.id, &cp) == 0, "rdma_connect: %s", strerror(errno));
  HS_RUN_UNTIL(ctx, r, r->cm.established || r->cm.rejected || r->cm.cm_error, H_TIMEOUT_MS);
  return r;
}

/* Posts one work request: a SEND with immediate imm (with_imm) or without, of len bytes of
 * payload (copied into the next send slot), or a zero-length RDMA write with immediate. */
enum raw_kind { RAW_SEND_IMM, RAW_SEND_PLAIN, RAW_WRITE_IMM };

static void raw_post(struct raw *r, enum raw_kind kind, uint32_t imm, const void *payload, size_t len) {
  struct ibv_sge sge;
  struct ibv_send_wr wr, *bad = NULL;
  uint8_t *buf = raw_send_buf(r, r->next_send++ % RAW_SENDS);
  int rc;

  H_CHECK(len <= RAW_SEND_SLOT, "raw message of %zu bytes does not fit a send slot", len);
  if (payload && len) memcpy(buf, payload, len);
  memset(&wr, 0, sizeof wr);
  sge.addr = (uintptr_t)buf;
  sge.length = (uint32_t)len;
  sge.lkey = r->mr->lkey;
  wr.wr_id = RAW_SEND_TAG | (uint64_t)r->sends_posted;
  wr.sg_list = len ? &sge : NULL;
  wr.num_sge = len ? 1 : 0;
  wr.send_flags = IBV_SEND_SIGNALED;
  switch (kind) {
  case RAW_SEND_IMM:
    wr.opcode = IBV_WR_SEND_WITH_IMM;
    wr.imm_data = htonl(imm);
    break;
  case RAW_SEND_PLAIN: wr.opcode = IBV_WR_SEND; break;
  case RAW_WRITE_IMM:
    wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
    wr.imm_data = htonl(imm);
    wr.wr.rdma.remote_addr = 0;
    wr.wr.rdma.rkey = 0;
    break;
  }
  rc = ibv_post_send(r->cm.id->qp, &wr, &bad);
  H_CHECK(rc == 0, "raw peer: ibv_post_send failed: %s", strerror(rc));
  r->sends_posted++;
}

/* A message of opcode op (immediate w_imm(op, credits, ctrl, done)). Spends a data credit of
 * the raw peer's book for data opcodes. */
static void raw_msg(struct raw *r, unsigned op, uint32_t credits, uint32_t ctrl, uint32_t done,
                    const void *payload, size_t len) {
  if (op == W_OP_DATA || op == W_OP_DATA_IMM) r->data_credits--;
  raw_post(r, RAW_SEND_IMM, w_imm(op, credits, ctrl, done), payload, len);
}

/* --- the test: a streaming pair, the raw peer, the case ---------------------------------------- */

#define STREAM_SIZE 300      /* bytes of each message of the well-behaved pair */
#define STREAM_BUFS 8
#define STREAM_AFTER 200     /* messages each way once the hostile connection is gone */
#define STREAM_OPEN 1000000  /* "until told": the stream runs during the whole case */
#define CLOSE_TIMEOUT_MS 10000

enum hs_expect { HS_REFUSED, HS_CLOSED };

struct hs_case {
  const char *name;
  enum hs_expect expect;
  /* HS_REFUSED: the private data of the connect, and the start of the reject text. */
  void (*pdata)(uint8_t *out, uint8_t *len);
  const char *reject_prefix;
  /* HS_CLOSED: options before anything is set up (NULL: defaults), what the raw peer does once
   * connected, the code the server's socket must close with, and checks after it closed. */
  void (*options)(h_ctx *ctx);
  void (*act)(h_ctx *ctx, struct raw *r, h_conn *srv);
  int reason;
  void (*after)(h_ctx *ctx, struct raw *r, h_conn *srv);
  int hold; /* the server's application holds what the raw peer sends (returns no credits) */
  void (*hello)(struct w_hello *h); /* changes the raw peer's hello (NULL: w_hello_default) */
};

/* The test's context: the well-behaved pair. */
struct hs_state {
  h_conn *client, *server;
};

static void hs_start_pair(h_ctx *ctx, struct hs_state *st) {
  h_pair(ctx, &st->client, &st->server);
  st->client->verify = st->server->verify = 1;
  st->client->expect_size = st->server->expect_size = STREAM_SIZE;
  hs_pair_client = st->client;
  hs_pair_server = st->server;
  h_stream_start(st->client, STREAM_OPEN, STREAM_SIZE, STREAM_BUFS);
  h_stream_start(st->server, STREAM_OPEN, STREAM_SIZE, STREAM_BUFS);
}

/* Ends both streams STREAM_AFTER messages from now and checks that everything arrived. */
static void hs_finish_pair(h_ctx *ctx, struct hs_state *st, struct raw *r) {
  h_conn *c = st->client, *s = st->server;
  H_CHECK(!c->closed && !s->closed, "the well-behaved pair closed (client %s, server %s): the "
          "hostile connection hurt another one", c->closed ? ibmsg_err_name(c->close_reason) : "open",
          s->closed ? ibmsg_err_name(s->close_reason) : "open");
  c->stream_total = c->stream_posted + STREAM_AFTER;
  s->stream_total = s->stream_posted + STREAM_AFTER;
  HS_RUN_UNTIL(ctx, r, (h_stream_done(c) && h_stream_done(s)) || c->closed || s->closed, 20000);
  H_CHECK(!c->closed && !s->closed, "the well-behaved pair closed while streaming (client %s, "
          "server %s)", ibmsg_err_name(c->close_reason), ibmsg_err_name(s->close_reason));
  HS_RUN_UNTIL(ctx, r, s->received == c->stream_total && c->received == s->stream_total, 10000);
  H_ASSERT_EQ(c->sent_ok, c->stream_total, "messages the client sent with IBMSG_OK");
  H_ASSERT_EQ(s->sent_ok, s->stream_total, "messages the server sent with IBMSG_OK");
  H_ASSERT_EQ(c->sent_other + c->sent_canceled, 0, "failed sends of the client");
  H_ASSERT_EQ(s->sent_other + s->sent_canceled, 0, "failed sends of the server");
  H_ASSERT_STATUS(c->sock.status, IBMSG_CONNECTED, "the well-behaved client's status");
  H_ASSERT_STATUS(s->sock.status, IBMSG_CONNECTED, "the well-behaved server socket's status");
  print_message("  well-behaved pair: %d messages each way, all delivered in order\n",
                c->stream_total);
}

/* Connects a raw peer with the valid hello pdata and waits until the server socket the harness
 * accepts for it (srv, the next of ctx->servers) is established. */
static struct raw *hs_raw_pair(h_ctx *ctx, const uint8_t *pdata, h_conn *srv) {
  const int servers = ctx->n_servers;
  struct raw *r = raw_connect(ctx, pdata, W_HELLO_SIZE);
  H_CHECK(r->cm.established, "the raw peer with a valid hello was not accepted (rejected %d, CM "
          "event %d)", r->cm.rejected, r->cm.cm_error);
  H_CHECK(r->peer_hello_ok, "the server's answer carries no ibmsg hello");
  H_CHECK(srv == &ctx->servers[servers], "the raw peer's server socket is not the next one");
  HS_RUN_UNTIL(ctx, r, ctx->n_servers == servers + 1 && (srv->established || srv->closed),
               H_TIMEOUT_MS);
  H_CHECK(srv->established, "the server socket of the raw peer closed with %s before it was "
          "established", ibmsg_err_name(srv->close_reason));
  return r;
}

static void hs_run(void **state) {
  h_ctx *ctx = *state;
  const struct hs_case *cs = ctx->data;
  struct hs_state st;
  struct raw *r;
  h_conn *srv;
  uint8_t pdata[64];
  uint8_t len = 0;
  int requests, servers, server_before, client_before;
  char text[160];
  size_t n;

  ctx->data = NULL;
  if (cs->options) cs->options(ctx);
  hs_start_pair(ctx, &st);
  requests = ctx->requests;
  servers = ctx->n_servers;
  srv = &ctx->servers[servers]; /* where the harness accepts the raw peer's connection */
  srv->hold = cs->hold;
  server_before = st.server->received;
  client_before = st.client->received;

  if (cs->expect == HS_REFUSED) {
    cs->pdata(pdata, &len);
    r = raw_connect(ctx, pdata, len);
    H_CHECK(!r->cm.established, "the listener accepted private data it must refuse");
    H_CHECK(r->cm.rejected, "the raw peer's connect neither was rejected nor established (CM event %d)",
            r->cm.cm_error);
    H_ASSERT_EQ(ctx->requests, requests, "connection_request callbacks for a refused hello");
    H_ASSERT_EQ(ctx->n_servers, servers, "connections accepted");
    H_ASSERT_EQ(r->reject_status, 28, "the CM status of the rejection (28: by the consumer)");
    H_CHECK(r->reject_len >= 8 && w_get32(r->reject_data) == W_MAGIC &&
                r->reject_data[6] == W_KIND_REJECT,
            "the rejection carries no ibmsg reject (%zu bytes of private data, status %d)",
            r->reject_len, r->reject_status);
    n = r->reject_len - 8 < 128 ? r->reject_len - 8 : 128;
    memcpy(text, r->reject_data + 8, n);
    text[n] = '\0';
    print_message("  rejected (CM status %d): \"%s\"\n", r->reject_status, text);
    H_CHECK(strncmp(text, cs->reject_prefix, strlen(cs->reject_prefix)) == 0,
            "the reject text is \"%s\", expected one starting \"%s\"", text, cs->reject_prefix);
    H_ASSERT_STATUS(ctx->listener.sock.status, IBMSG_LISTENING, "the listener's status");
  } else {
    struct w_hello h = w_hello_default();
    if (cs->hello) cs->hello(&h);
    w_hello_encode(&h, pdata);
    r = hs_raw_pair(ctx, pdata, srv);
    cs->act(ctx, r, srv);
    HS_RUN_UNTIL(ctx, r, srv->closed, CLOSE_TIMEOUT_MS);
    print_message("  the raw peer's server socket closed with %s (status %s)%s\n",
                  ibmsg_err_name(srv->close_reason), h_status_name(srv->close_status),
                  r->send_errors ? "; the raw peer's sends failed" : "");
    H_ASSERT_REASON(srv->close_reason, cs->reason, "the close reason of the raw peer's server socket");
    H_ASSERT_STATUS(srv->close_status, cs->reason == IBMSG_ECONNRESET ? IBMSG_UNCONNECTED : IBMSG_ERROR,
                    "the status of the raw peer's server socket when it closed");
    if (cs->after) cs->after(ctx, r, srv);
  }
  H_CHECK(st.server->received > server_before && st.client->received > client_before,
          "the well-behaved pair did not stream while the raw peer was at work (%d and %d "
          "messages before, %d and %d after)", server_before, client_before,
          st.server->received, st.client->received);
  hs_finish_pair(ctx, &st, r);
  /* and the listener still takes new connections */
  h_pair(ctx, NULL, NULL);
  raw_destroy(r);
  h_finish(ctx);
}

/* cmocka state: the case before the setup, the context after it. */
static int hs_setup(void **state) {
  const struct hs_case *cs = *state;
  int rc = h_setup(state);
  if (rc == 0) ((h_ctx *)*state)->data = (void *)cs;
  print_message("case %s\n", cs->name);
  return rc;
}

static int hs_teardown(void **state) {
  int i;
  hs_pair_client = hs_pair_server = NULL;
  /* A failed test may leave raw peers behind. */
  for (i = 0; i < RAW_LIVE_MAX; i++) raw_destroy(raw_live[i]);
  return h_teardown(state);
}

/* --- refused connects ------------------------------------------------------------------------ */

static void pd_garbage(uint8_t *out, uint8_t *len) {
  static const char text[] = "GET / HTTP/1.1\r\nHost: ibmsg\r\n\r\n";
  memcpy(out, text, 32);
  *len = 32;
}
static void pd_none(uint8_t *out, uint8_t *len) {
  (void)out;
  *len = 0; /* the transport pads the REQ with zeros */
}
static void pd_wrong_kind(uint8_t *out, uint8_t *len) {
  struct w_hello h = w_hello_default();
  h.kind = W_KIND_REJECT;
  w_hello_encode(&h, out);
  *len = W_HELLO_SIZE;
}
#define PD_HELLO(fn, field, value)                                                              \
  static void fn(uint8_t *out, uint8_t *len) {                                                  \
    struct w_hello h = w_hello_default();                                                       \
    h.field = (value);                                                                          \
    w_hello_encode(&h, out);                                                                    \
    *len = W_HELLO_SIZE;                                                                        \
  }
PD_HELLO(pd_recv_depth_0, recv_depth, 0)
PD_HELLO(pd_ctrl_depth_0, ctrl_depth, 0)
PD_HELLO(pd_recv_depth_65536, recv_depth, 65536)
PD_HELLO(pd_ctrl_depth_256, ctrl_depth, 256)
PD_HELLO(pd_cap_65536, cap, 65536)
PD_HELLO(pd_max_size_0, max_msg_size, 0)
PD_HELLO(pd_rndv_below_max, rndv_max_size, RAW_EAGER - 1)
PD_HELLO(pd_major_2, major, 2)

/* --- connected: each act breaks the protocol once ---------------------------------------------- */

static void act_send_without_imm(h_ctx *ctx, struct raw *r, h_conn *srv) {
  uint8_t payload[16];
  (void)ctx;
  (void)srv;
  h_fill(payload, sizeof payload, 0);
  raw_post(r, RAW_SEND_PLAIN, 0, payload, sizeof payload);
}

static void act_empty_send_without_imm(h_ctx *ctx, struct raw *r, h_conn *srv) {
  (void)ctx;
  (void)srv;
  raw_post(r, RAW_SEND_PLAIN, 0, NULL, 0);
}

static void act_credit_with_payload(h_ctx *ctx, struct raw *r, h_conn *srv) {
  uint8_t payload[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  (void)ctx;
  (void)srv;
  raw_msg(r, W_OP_CREDIT, 0, 0, 0, payload, sizeof payload);
}

static void act_opcode_15(h_ctx *ctx, struct raw *r, h_conn *srv) {
  uint8_t payload[8] = {0};
  (void)ctx;
  (void)srv;
  raw_msg(r, 15, 0, 0, 0, payload, sizeof payload);
}

static void act_opcode_4_empty(h_ctx *ctx, struct raw *r, h_conn *srv) {
  (void)ctx;
  (void)srv;
  raw_msg(r, 4, 0, 0, 0, NULL, 0); /* reserved (RDMA notice), no feature agreed uses it */
}

static void act_opcode_7(h_ctx *ctx, struct raw *r, h_conn *srv) {
  uint8_t payload[4] = {0};
  (void)ctx;
  (void)srv;
  raw_msg(r, 7, 0, 0, 0, payload, sizeof payload);
}

/* Data messages beyond the data credits the server granted (its hello's recv_depth; the
 * server's application holds them, so no credit comes back). */
static void act_data_beyond_credits(h_ctx *ctx, struct raw *r, h_conn *srv) {
  uint8_t payload[64];
  uint32_t i, n = r->peer.recv_depth + 6;
  (void)ctx;
  (void)srv;
  for (i = 0; i < n; i++) {
    h_fill(payload, sizeof payload, i);
    raw_msg(r, W_OP_DATA, 0, 0, 0, payload, sizeof payload);
  }
}

/* Beyond everything the server posted for it with buffers of its own: its data credits, its
 * control buffers, and more (RNR for the raw peer, which does not retry). */
static void act_flood_own_buffers(h_ctx *ctx, struct raw *r, h_conn *srv) {
  uint8_t payload[64];
  uint32_t i, n = r->peer.recv_depth + r->peer.ctrl_depth + 8;
  (void)ctx;
  (void)srv;
  for (i = 0; i < n; i++) {
    h_fill(payload, sizeof payload, i);
    raw_msg(r, W_OP_DATA, 0, 0, 0, payload, sizeof payload);
  }
}

static void opt_own_buffers(h_ctx *ctx) {
  h_setopt_int(ctx, IBMSG_OPT_SHARED_RECV, 0);
  h_setopt_int(ctx, IBMSG_OPT_RECV_DEPTH, 4);
}

/* Credit-only messages beyond the control credits (4). The server owes the control credits
 * back but returns them only in a message of its own, and it has no reason to send one. */
static void act_ctrl_beyond_credits(h_ctx *ctx, struct raw *r, h_conn *srv) {
  uint32_t i;
  (void)ctx;
  (void)srv;
  for (i = 0; i < r->peer.ctrl_depth + 1; i++) raw_msg(r, W_OP_CREDIT, 0, 0, 0, NULL, 0);
}

static void act_data_above_eager(h_ctx *ctx, struct raw *r, h_conn *srv) {
  static uint8_t payload[RAW_SEND_SLOT];
  (void)ctx;
  (void)srv;
  H_CHECK(r->peer.max_msg_size + 1 <= sizeof payload, "the server's eager size %u is too large "
          "for this test", r->peer.max_msg_size);
  h_fill(payload, r->peer.max_msg_size + 1, 0);
  raw_msg(r, W_OP_DATA, 0, 0, 0, payload, r->peer.max_msg_size + 1);
}

static void act_data_imm_above_eager(h_ctx *ctx, struct raw *r, h_conn *srv) {
  static uint8_t payload[RAW_SEND_SLOT];
  (void)ctx;
  (void)srv;
  /* max_msg_size + 1 bytes of payload, then the 4-byte immediate */
  h_fill(payload, r->peer.max_msg_size + 5, 0);
  raw_msg(r, W_OP_DATA_IMM, 0, 0, 0, payload, r->peer.max_msg_size + 5);
}

/* Larger than the server's receive buffer (eager size + 4, rounded up to 64): the server's
 * device cannot place it, the receive fails. */
static void act_data_above_buffer(h_ctx *ctx, struct raw *r, h_conn *srv) {
  static uint8_t payload[RAW_SEND_SLOT];
  size_t len = ((r->peer.max_msg_size + 4 + 63) & ~(size_t)63) + 64;
  (void)ctx;
  (void)srv;
  H_CHECK(len <= sizeof payload, "the server's eager size %u is too large for this test",
          r->peer.max_msg_size);
  h_fill(payload, len, 0);
  raw_msg(r, W_OP_DATA, 0, 0, 0, payload, len);
}

static void act_data_imm_short(h_ctx *ctx, struct raw *r, h_conn *srv) {
  uint8_t payload[3] = {9, 9, 9};
  (void)ctx;
  (void)srv;
  raw_msg(r, W_OP_DATA_IMM, 0, 0, 0, payload, sizeof payload);
}

static void act_data_imm_empty(h_ctx *ctx, struct raw *r, h_conn *srv) {
  (void)ctx;
  (void)srv;
  raw_msg(r, W_OP_DATA_IMM, 0, 0, 0, NULL, 0);
}

static void act_rts(struct raw *r, uint8_t flags, uint32_t rkey, uint32_t imm, uint64_t addr,
                    uint64_t length) {
  uint8_t rts[W_RTS_SIZE];
  w_rts(rts, flags, 1, rkey, imm, addr, length);
  raw_msg(r, W_OP_RNDV, 0, 0, 0, rts, sizeof rts);
  r->data_credits--;
}

static void act_rts_zero_length(h_ctx *ctx, struct raw *r, h_conn *srv) {
  (void)ctx;
  (void)srv;
  act_rts(r, 0, r->mr->rkey, 0, (uintptr_t)raw_data(r), 0);
}

static void act_rts_wrapping(h_ctx *ctx, struct raw *r, h_conn *srv) {
  (void)ctx;
  (void)srv;
  act_rts(r, 0, r->mr->rkey, 0, UINT64_MAX - 0xff, 0x200);
}

static void act_rts_above_max(h_ctx *ctx, struct raw *r, h_conn *srv) {
  (void)ctx;
  (void)srv;
  H_CHECK(r->peer.rndv_max_size != 0, "the server offers no rendezvous");
  act_rts(r, 0, r->mr->rkey, 0, (uintptr_t)raw_data(r), (uint64_t)r->peer.rndv_max_size + 1);
}

/* A valid RTS whose key the raw peer's device refuses: the server's RDMA read fails. */
static void act_rts_bad_rkey(h_ctx *ctx, struct raw *r, h_conn *srv) {
  (void)ctx;
  (void)srv;
  act_rts(r, 0, r->mr->rkey ^ 0x5a5a5a00u, 0, (uintptr_t)raw_data(r), RAW_DATA_SIZE);
}

/* A valid key, a range beyond its registration. */
static void act_rts_outside_mr(h_ctx *ctx, struct raw *r, h_conn *srv) {
  (void)ctx;
  (void)srv;
  act_rts(r, 0, r->mr->rkey, 0, (uintptr_t)r->mem + r->mem_len - 100, RAW_DATA_SIZE);
}

static void act_rts_reserved_bits(h_ctx *ctx, struct raw *r, h_conn *srv) {
  (void)ctx;
  (void)srv;
  act_rts(r, 0x02, r->mr->rkey, 0, (uintptr_t)raw_data(r), RAW_DATA_SIZE);
}

static void act_rts_short(h_ctx *ctx, struct raw *r, h_conn *srv) {
  uint8_t rts[W_RTS_SIZE];
  (void)ctx;
  (void)srv;
  w_rts(rts, 0, 1, r->mr->rkey, 0, (uintptr_t)raw_data(r), RAW_DATA_SIZE);
  raw_msg(r, W_OP_RNDV, 0, 0, 0, rts, W_RTS_SIZE - 1);
}

static void act_rts_long(h_ctx *ctx, struct raw *r, h_conn *srv) {
  uint8_t rts[W_RTS_SIZE + 1];
  (void)ctx;
  (void)srv;
  w_rts(rts, 0, 1, r->mr->rkey, 0, (uintptr_t)raw_data(r), RAW_DATA_SIZE);
  rts[W_RTS_SIZE] = 0;
  raw_msg(r, W_OP_RNDV, 0, 0, 0, rts, sizeof rts);
}

static void act_rndv_empty(h_ctx *ctx, struct raw *r, h_conn *srv) {
  (void)ctx;
  (void)srv;
  raw_msg(r, W_OP_RNDV, 0, 0, 0, NULL, 0);
}

/* Many malformed rendezvous messages at once (they land in shared receive buffers until the
 * server stops the queue pair): the server closes the connection once, and the well-behaved
 * pair goes on. FLOOD and the pair's messages in flight fit one slab of 64 buffers: with the
 * harness's RNR retry 0 a shared queue that runs dry even for a moment fails the pair with
 * IBMSG_EIO. */
#define FLOOD 32

static void act_rndv_flood(h_ctx *ctx, struct raw *r, h_conn *srv) {
  int i;
  (void)ctx;
  (void)srv;
  for (i = 0; i < FLOOD; i++) raw_msg(r, W_OP_RNDV, 0, 0, 0, NULL, 0);
}

/* The same flood of messages of an unknown opcode (closed through the common drop path). */
static void act_opcode_flood(h_ctx *ctx, struct raw *r, h_conn *srv) {
  int i;
  (void)ctx;
  (void)srv;
  for (i = 0; i < FLOOD; i++) raw_msg(r, 15, 0, 0, 0, NULL, 0);
}

/* One malformed rendezvous message each from many connections, one connection after the
 * other: each is refused, and each receive buffer must go back to the shared queue. The
 * well-behaved pair streams afterwards (a buffer missing from the queue: RNR, IBMSG_EIO). */
#define ONE_BY_ONE 80

/* IBMSG_OPT_RECV_DEPTH 2: the pool never needs more than one slab (64 buffers of 16 KiB), and
 * buffers missing from the queue but counted by the pool never make it grow. */
static void opt_depth_2(h_ctx *ctx) { h_setopt_int(ctx, IBMSG_OPT_RECV_DEPTH, 2); }

static void act_rndv_one_by_one(h_ctx *ctx, struct raw *r, h_conn *srv) {
  struct w_hello h = w_hello_default();
  uint8_t pdata[W_HELLO_SIZE];
  ibmsg_memory mem;
  h_conn *x;
  struct raw *y;
  int i, slot;
  char name[32];

  raw_msg(r, W_OP_RNDV, 0, 0, 0, NULL, 0);
  HS_RUN_UNTIL(ctx, r, srv->closed, CLOSE_TIMEOUT_MS);
  H_ASSERT_REASON(srv->close_reason, IBMSG_EPROTO, "the close reason of the first connection");
  w_hello_encode(&h, pdata);
  slot = ctx->n_servers;
  x = &ctx->servers[slot];
  for (i = 1; i < ONE_BY_ONE; i++) {
    y = hs_raw_pair(ctx, pdata, x);
    raw_msg(y, W_OP_RNDV, 0, 0, 0, NULL, 0);
    HS_RUN_UNTIL(ctx, y, x->closed, CLOSE_TIMEOUT_MS);
    if (x->close_reason != IBMSG_EPROTO)
      h_fail_at(__FILE__, __LINE__, "connection %d of %d closed with %s, expected IBMSG_EPROTO", i + 1,
                ONE_BY_ONE, ibmsg_err_name(x->close_reason));
    raw_destroy(y);
    if ((i + 1) % 10 == 0) print_message("  %d connections refused so far\n", i + 1);
    /* the record of a closed socket may be used again (the library never touches it after
     * its connection_closed) */
    snprintf(name, sizeof name, "server %d", slot);
    h_conn_reset(x, ctx, name);
    ctx->n_servers = slot;
  }
  H_ASSERT_OK(ibmsg_loop_memory(&ctx->loop, &mem));
  print_message("  %d connections refused one after the other; the loop's shared receive "
                "buffers: %zu bytes\n", ONE_BY_ONE, mem.shared);
}

/* The server sends the raw peer a message above the eager size: an RTS arrives. */
static void hs_server_sends_large(h_ctx *ctx, struct raw *r, h_conn *srv) {
  h_alloc_fill(srv, &ctx->msgs[0], RAW_EAGER + 4000);
  h_post(srv, &ctx->msgs[0]);
  HS_RUN_UNTIL(ctx, r, r->rts_seen == 1 || srv->closed, H_TIMEOUT_MS);
  H_CHECK(r->rts_seen == 1, "no RTS reached the raw peer (server socket %s)",
          srv->closed ? ibmsg_err_name(srv->close_reason) : "open");
  H_ASSERT_EQ(r->rts_length, RAW_EAGER + 4000, "the length in the server's RTS");
}

static void act_fin(struct raw *r, uint8_t status, uint32_t id) {
  uint8_t fin[W_FIN_SIZE];
  w_fin(fin, status, id);
  raw_msg(r, W_OP_RNDV, 0, 0, 0, fin, sizeof fin);
}

static void act_fin_status_0(h_ctx *ctx, struct raw *r, h_conn *srv) {
  hs_server_sends_large(ctx, r, srv);
  act_fin(r, 0, r->rts_id);
}

static void act_fin_status_2(h_ctx *ctx, struct raw *r, h_conn *srv) {
  hs_server_sends_large(ctx, r, srv);
  act_fin(r, 2, r->rts_id);
}

static void act_fin_wrong_id(h_ctx *ctx, struct raw *r, h_conn *srv) {
  hs_server_sends_large(ctx, r, srv);
  act_fin(r, 1, r->rts_id + 1);
}

static void act_fin_without_rts(h_ctx *ctx, struct raw *r, h_conn *srv) {
  (void)ctx;
  (void)srv;
  act_fin(r, 1, 0);
}

/* The server's large message was canceled by the close. */
static void after_large_canceled(h_ctx *ctx, struct raw *r, h_conn *srv) {
  (void)r;
  H_ASSERT_EQ(srv->sent, 1, "message_sent callbacks of the server's large message");
  H_ASSERT_REASON(srv->last_sent_status, IBMSG_ECANCELED, "its status");
  ibmsg_free_msg(&ctx->msgs[0]);
}

/* Positive control: the FIN that declines the server's message (status 1, its id) is taken:
 * message_sent with IBMSG_EDECLINED, the connection stays up; then the raw peer disconnects. */
static void act_fin_declined_then_disconnect(h_ctx *ctx, struct raw *r, h_conn *srv) {
  hs_server_sends_large(ctx, r, srv);
  act_fin(r, 1, r->rts_id);
  HS_RUN_UNTIL(ctx, r, srv->sent == 1 || srv->closed, H_TIMEOUT_MS);
  H_CHECK(!srv->closed, "a FIN with status 1 closed the connection with %s",
          ibmsg_err_name(srv->close_reason));
  H_ASSERT_REASON(srv->last_sent_status, IBMSG_EDECLINED, "message_sent of the declined message");
  ibmsg_free_msg(&ctx->msgs[0]);
  HS_RUN_FOR(ctx, r, 100);
  H_CHECK(!srv->closed, "the connection closed after the FIN (%s)", ibmsg_err_name(srv->close_reason));
  rdma_disconnect(r->cm.id);
}

static void act_credits_beyond_cap(h_ctx *ctx, struct raw *r, h_conn *srv) {
  uint8_t payload[16];
  (void)ctx;
  (void)srv;
  h_fill(payload, sizeof payload, 0);
  raw_msg(r, W_OP_DATA, 1000, 0, 0, payload, sizeof payload);
}

static void act_ctrl_credits_beyond_depth(h_ctx *ctx, struct raw *r, h_conn *srv) {
  (void)ctx;
  (void)srv;
  raw_msg(r, W_OP_CREDIT, 0, 200, 0, NULL, 0);
}

/* One credit more than the server spent (it sent nothing yet): below the cap, still more than
 * the raw peer could have. */
static void act_data_credit_never_spent(h_ctx *ctx, struct raw *r, h_conn *srv) {
  uint8_t payload[16];
  (void)ctx;
  (void)srv;
  h_fill(payload, sizeof payload, 0);
  raw_msg(r, W_OP_DATA, 1, 0, 0, payload, sizeof payload);
}

static void act_ctrl_credit_never_spent(h_ctx *ctx, struct raw *r, h_conn *srv) {
  (void)ctx;
  (void)srv;
  raw_msg(r, W_OP_CREDIT, 0, 1, 0, NULL, 0);
}

static void act_done_without_rts(h_ctx *ctx, struct raw *r, h_conn *srv) {
  (void)ctx;
  (void)srv;
  raw_msg(r, W_OP_CREDIT, 0, 0, 1, NULL, 0);
}

static void act_return_zero(h_ctx *ctx, struct raw *r, h_conn *srv) {
  (void)ctx;
  (void)srv;
  raw_msg(r, W_OP_RETURN, 0, 0, 0, NULL, 0);
}

/* Gives back a credit below the base (the raw peer holds only the base). */
static void act_return_below_base(h_ctx *ctx, struct raw *r, h_conn *srv) {
  (void)ctx;
  (void)srv;
  raw_msg(r, W_OP_RETURN, 1, 0, 0, NULL, 0);
}

static void act_return_with_wants(h_ctx *ctx, struct raw *r, h_conn *srv) {
  (void)ctx;
  (void)srv;
  raw_msg(r, W_OP_RETURN, 1 | W_WANTS, 0, 0, NULL, 0);
}

/* An RDMA write with immediate, zero bytes, without feature bit 0 (the raw peer's hello lacks
 * it); a zero-length write needs no key. */
static void act_write_imm_without_rdma(h_ctx *ctx, struct raw *r, h_conn *srv) {
  (void)ctx;
  (void)srv;
  r->data_credits--;
  raw_post(r, RAW_WRITE_IMM, 0x1234, NULL, 0);
}

/* Positive control: an eager message, one with an immediate and one by rendezvous from the
 * raw peer all arrive whole; the rendezvous one is counted done; then the raw peer disconnects. */
static uint32_t hs_imm_seen[4];
static unsigned hs_flags_seen[4];
static int hs_n_seen;

static void hs_record(h_conn *c, ibmsg_buffer *msg) {
  if (c == &c->ctx->servers[1] && hs_n_seen < 4) {
    hs_imm_seen[hs_n_seen] = msg->imm;
    hs_flags_seen[hs_n_seen] = msg->flags;
    hs_n_seen++;
  }
  ibmsg_free_msg(msg);
}

static void act_valid_then_disconnect(h_ctx *ctx, struct raw *r, h_conn *srv) {
  uint8_t payload[104];
  uint8_t rts[W_RTS_SIZE];

  hs_n_seen = 0;
  ctx->on_received = hs_record;
  srv->verify = 1;
  srv->recv_seq = 0;
  h_fill(payload, 100, 0);
  raw_msg(r, W_OP_DATA, 0, 0, 0, payload, 100);
  h_fill(payload, 50, 1);
  w_put32(payload + 50, 0x12345678u);
  raw_msg(r, W_OP_DATA_IMM, 0, 0, 0, payload, 54);
  /* the server's base is 2 credits: the third message waits for one to come back */
  HS_RUN_UNTIL(ctx, r, (srv->received == 2 && r->data_credits > 0) || srv->closed, H_TIMEOUT_MS);
  H_CHECK(!srv->closed, "valid messages closed the connection with %s", ibmsg_err_name(srv->close_reason));
  h_fill(raw_data(r), RAW_DATA_SIZE, 2);
  w_rts(rts, 1, 77, r->mr->rkey, 0xcafef00du, (uintptr_t)raw_data(r), RAW_DATA_SIZE);
  raw_msg(r, W_OP_RNDV, 0, 0, 0, rts, sizeof rts);
  HS_RUN_UNTIL(ctx, r, (srv->received == 3 && r->done_seen == 1) || srv->closed, H_TIMEOUT_MS);
  H_CHECK(!srv->closed, "a valid RTS closed the connection with %s", ibmsg_err_name(srv->close_reason));
  H_ASSERT_EQ(srv->received_bytes, 100 + 50 + RAW_DATA_SIZE, "bytes the server received");
  H_ASSERT_EQ(hs_n_seen, 3, "messages recorded");
  H_ASSERT_EQ(hs_flags_seen[0], 0, "flags of the eager message");
  H_ASSERT_EQ(hs_flags_seen[1], IBMSG_MSG_IMM, "flags of the message with an immediate");
  H_ASSERT_EQ(hs_imm_seen[1], 0x12345678u, "its immediate");
  H_ASSERT_EQ(hs_flags_seen[2], IBMSG_MSG_IMM, "flags of the rendezvous message");
  H_ASSERT_EQ(hs_imm_seen[2], 0xcafef00du, "its immediate");
  ctx->on_received = NULL;
  rdma_disconnect(r->cm.id);
}

static void opt_max_1m(h_ctx *ctx) {
  uint64_t max = 1u << 20;
  H_ASSERT_OK(ibmsg_setopt(&ctx->loop, IBMSG_OPT_MAX_MSG_SIZE, &max, sizeof max));
}

/* Hellos without a feature the message then uses. */
static void hello_no_imm(struct w_hello *h) { h->features &= ~W_F_IMM; }
static void hello_no_rndv(struct w_hello *h) {
  h->features &= ~W_F_RNDV;
  h->rndv_max_size = 0;
}
static void hello_no_shared(struct w_hello *h) {
  h->features &= ~W_F_SHARED;
  h->cap = 0;
}

static void act_data_imm_valid(h_ctx *ctx, struct raw *r, h_conn *srv) {
  uint8_t payload[20];
  (void)ctx;
  (void)srv;
  h_fill(payload, sizeof payload, 0);
  raw_msg(r, W_OP_DATA_IMM, 0, 0, 0, payload, sizeof payload);
}

static void act_rts_with_imm(h_ctx *ctx, struct raw *r, h_conn *srv) {
  (void)ctx;
  (void)srv;
  act_rts(r, 1, r->mr->rkey, 0x77, (uintptr_t)raw_data(r), RAW_DATA_SIZE);
}

static void act_rts_valid(h_ctx *ctx, struct raw *r, h_conn *srv) {
  (void)ctx;
  (void)srv;
  act_rts(r, 0, r->mr->rkey, 0, (uintptr_t)raw_data(r), RAW_DATA_SIZE);
}

/* --- large announcements: rendezvous memory, pieces, stalls (issue 21) ------------------------ */

#define MIB_ ((uint64_t)1 << 20)
#define N_ANNOUNCERS 5

/* Polls every raw peer of the array, then steps the loop (watching the stream). */
static void hs_step_all(h_ctx *ctx, struct raw **r, int n, uint64_t deadline, const char *what) {
  int i;
  for (i = 1; i < n; i++) raw_poll(r[i]);
  hs_step_at(ctx, r[0], deadline, 0, what, __FILE__, __LINE__);
}

/* Five peers each announce 512 MiB with a key that does not work, at the same instant. The
 * receiver stays up, reads one piece of one destination at a time (the destinations wait their
 * turn under IBMSG_OPT_RNDV_MEMORY, 512 MiB by default), closes each of those connections with
 * IBMSG_EPROTO, and pins far less than the cap; the well-behaved stream goes on. Before 1.6 the
 * receiver registered all five destinations at once (2.5 GiB) and was killed for memory. */
static void five_peers_announce_512_mib_with_bad_keys_at_once(void **state) {
  h_ctx *ctx = *state;
  struct hs_state st;
  struct raw *r[N_ANNOUNCERS];
  h_conn *srv[N_ANNOUNCERS];
  struct w_hello h = w_hello_default();
  uint8_t pdata[W_HELLO_SIZE];
  uint64_t deadline;
  int i, closed = 0;

  hs_start_pair(ctx, &st);
  w_hello_encode(&h, pdata);
  for (i = 0; i < N_ANNOUNCERS; i++) {
    srv[i] = &ctx->servers[ctx->n_servers];
    r[i] = hs_raw_pair(ctx, pdata, srv[i]);
  }
  hs_watch_start(st.server);
  for (i = 0; i < N_ANNOUNCERS; i++)
    act_rts(r[i], 0, 0x00dead00u + (uint32_t)i, 0, (uint64_t)1 << 40, 512 * MIB_);
  /* each case is one failed read: a bound for a hang, not for speed */
  deadline = h_now_ms() + 120000;
  while (closed < N_ANNOUNCERS) {
    hs_step_all(ctx, r, N_ANNOUNCERS, deadline, "the five announcers' connections close");
    for (closed = 0, i = 0; i < N_ANNOUNCERS; i++) closed += srv[i]->closed;
  }
  hs_watch_end("5 x 512 MiB with bad keys");
  for (i = 0; i < N_ANNOUNCERS; i++)
    H_ASSERT_REASON(srv[i]->close_reason, IBMSG_EPROTO, "the close reason of an announcer's socket");
  H_CHECK(hs_watch.max_pin_kb < 64 * 1024, "the receiver pinned %ld KiB for announcements whose "
          "keys do not work (one piece each is 4 MiB)", hs_watch.max_pin_kb);
  hs_finish_pair(ctx, &st, r[0]);
  for (i = 0; i < N_ANNOUNCERS; i++) raw_destroy(r[i]);
  h_pair(ctx, NULL, NULL);
  h_finish(ctx);
}

/* One peer announces 1.5 GiB with a key that does not work. With the default rendezvous memory
 * (512 MiB) the message is declined unread (a FIN) and the connection goes on; with room for it
 * (2 GiB) the receiver reads one piece, pins no more than that, and closes that connection with
 * IBMSG_EPROTO. The well-behaved stream's longest stall is printed (before 1.6 the loop froze
 * for 11 s while it registered 1.5 GiB). */
static void a_peer_announces_1_5_gib_with_a_bad_key(void **state) {
  h_ctx *ctx = *state;
  struct hs_state st;
  struct raw *r;
  h_conn *srv;
  struct w_hello h = w_hello_default();
  uint8_t pdata[W_HELLO_SIZE];
  uint64_t cap = 2048 * MIB_;

  hs_start_pair(ctx, &st);
  w_hello_encode(&h, pdata);
  srv = &ctx->servers[ctx->n_servers];
  r = hs_raw_pair(ctx, pdata, srv);
  hs_watch_start(st.server);
  act_rts(r, 0, 0x00dead00u, 0, (uint64_t)1 << 40, 1536 * MIB_);
  HS_RUN_UNTIL(ctx, r, r->fins_seen == 1 || srv->closed, H_TIMEOUT_MS);
  H_CHECK(!srv->closed, "an announcement above IBMSG_OPT_RNDV_MEMORY closed the connection (%s) "
          "instead of being declined", ibmsg_err_name(srv->close_reason));
  hs_watch_end("1.5 GiB with a bad key, declined");
  H_ASSERT_OK(ibmsg_setopt(&ctx->loop, IBMSG_OPT_RNDV_MEMORY, &cap, sizeof cap));
  hs_watch_start(st.server);
  act_rts(r, 0, 0x00dead00u, 0, (uint64_t)1 << 40, 1536 * MIB_);
  HS_RUN_UNTIL(ctx, r, srv->closed, 60000);
  hs_watch_end("1.5 GiB with a bad key, read");
  H_ASSERT_REASON(srv->close_reason, IBMSG_EPROTO, "the close reason of the announcer's socket");
  H_CHECK(hs_watch.max_pin_kb < 16 * 1024, "the receiver pinned %ld KiB for an announcement whose "
          "key does not work (one piece is 4 MiB)", hs_watch.max_pin_kb);
  hs_finish_pair(ctx, &st, r);
  raw_destroy(r);
  h_finish(ctx);
}

/* Another process sends 8 messages of 64 MiB (valid) to the loop while the well-behaved pair
 * streams: all arrive, and the stream's longest stall is printed (before 1.6: 2.2-2.8 s). */
static void valid_large_messages_from_one_peer_while_another_streams(void **state) {
  h_ctx *ctx = *state;
  struct hs_state st;
  h_conn *srv;
  char port[16];
  char *argv[] = {"examples/ibmsg-send", "-q", "-n", "8", "-s", "64M", "-w", "8", NULL, port, NULL};
  pid_t pid;
  int status = 0, done = 0;
  uint64_t deadline;

  H_CHECK(access(argv[0], X_OK) == 0, "%s not found (run from the build directory)", argv[0]);
  hs_start_pair(ctx, &st);
  srv = &ctx->servers[ctx->n_servers];
  argv[8] = (char *)ctx->addr;
  snprintf(port, sizeof port, "%u", (unsigned)ctx->port);
  pid = fork();
  H_CHECK(pid >= 0, "fork: %s", strerror(errno));
  if (pid == 0) {
    execv(argv[0], argv);
    _exit(127);
  }
  hs_watch_start(st.server);
  /* the sender's own time (64 MiB buffers, emulated): a bound for a hang, not for speed */
  deadline = h_now_ms() + 600000;
  while (!done) {
    hs_step_at(ctx, NULL, deadline, 600000, "ibmsg-send ends", __FILE__, __LINE__);
    done = waitpid(pid, &status, WNOHANG) == pid;
  }
  HS_RUN_UNTIL(ctx, NULL, srv->closed, CLOSE_TIMEOUT_MS);
  hs_watch_end("8 x 64 MiB from another process");
  H_CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "ibmsg-send failed (status 0x%x)", status);
  H_ASSERT_EQ(srv->received, 8, "64 MiB messages received");
  H_ASSERT_EQ(srv->received_bytes, 8 * 64 * MIB_, "bytes received");
  hs_finish_pair(ctx, &st, NULL);
  h_finish(ctx);
}

/* --- the cases ----------------------------------------------------------------------------- */

#define REFUSED(n, pd, prefix) {.name = n, .expect = HS_REFUSED, .pdata = pd, .reject_prefix = prefix}
#define CLOSED(n, fn, code) {.name = n, .expect = HS_CLOSED, .act = fn, .reason = code}
#define CLOSED_HOLD(n, fn, code) {.name = n, .expect = HS_CLOSED, .act = fn, .reason = code, .hold = 1}

#define NOT_IBMSG "not an ibmsg peer"
#define INVALID "invalid ibmsg hello"

static const struct hs_case cases[] = {
    REFUSED("refuse_garbage_private_data", pd_garbage, NOT_IBMSG),
    REFUSED("refuse_no_private_data", pd_none, NOT_IBMSG),
    REFUSED("refuse_hello_of_kind_reject", pd_wrong_kind, NOT_IBMSG),
    REFUSED("refuse_recv_depth_0", pd_recv_depth_0, INVALID),
    REFUSED("refuse_ctrl_depth_0", pd_ctrl_depth_0, INVALID),
    REFUSED("refuse_recv_depth_65536", pd_recv_depth_65536, INVALID),
    REFUSED("refuse_ctrl_depth_256", pd_ctrl_depth_256, INVALID),
    REFUSED("refuse_cap_65536", pd_cap_65536, INVALID),
    REFUSED("refuse_max_size_0", pd_max_size_0, INVALID),
    REFUSED("refuse_rndv_size_below_max_size", pd_rndv_below_max, INVALID),
    /* (the server's minor version is its own: 1.3 when this was written) */
    REFUSED("refuse_major_version_2", pd_major_2, "incompatible ibmsg protocol: peer speaks 2.3, this side 1."),

    CLOSED("control_valid_messages_then_disconnect", act_valid_then_disconnect, IBMSG_ECONNRESET),
    CLOSED("control_fin_declined_then_disconnect", act_fin_declined_then_disconnect, IBMSG_ECONNRESET),

    CLOSED("send_without_immediate", act_send_without_imm, IBMSG_EPROTO),
    CLOSED("empty_send_without_immediate", act_empty_send_without_imm, IBMSG_EPROTO),
    CLOSED("credit_only_with_payload", act_credit_with_payload, IBMSG_EPROTO),
    CLOSED("opcode_15", act_opcode_15, IBMSG_EPROTO),
    CLOSED("opcode_4_empty", act_opcode_4_empty, IBMSG_EPROTO),
    CLOSED("opcode_7", act_opcode_7, IBMSG_EPROTO),
    CLOSED_HOLD("data_beyond_credits_shared", act_data_beyond_credits, IBMSG_EPROTO),
    {.name = "data_beyond_receive_depth_own_buffers", .expect = HS_CLOSED,
     .options = opt_own_buffers, .act = act_flood_own_buffers, .reason = IBMSG_EPROTO, .hold = 1},
    CLOSED("credit_only_beyond_control_credits", act_ctrl_beyond_credits, IBMSG_EPROTO),
    CLOSED("data_above_eager_size", act_data_above_eager, IBMSG_EPROTO),
    CLOSED("data_imm_above_eager_size", act_data_imm_above_eager, IBMSG_EPROTO),
    /* ibmsg(7) WIRE PROTOCOL: one too large for the receive buffer fails in the device:
     * IBMSG_EIO. */
    CLOSED("data_above_receive_buffer", act_data_above_buffer, IBMSG_EIO),
    CLOSED("data_imm_shorter_than_trailer", act_data_imm_short, IBMSG_EPROTO),
    CLOSED("data_imm_empty", act_data_imm_empty, IBMSG_EPROTO),
    CLOSED("rts_zero_length", act_rts_zero_length, IBMSG_EPROTO),
    CLOSED("rts_wrapping_range", act_rts_wrapping, IBMSG_EPROTO),
    CLOSED("rts_above_max_size", act_rts_above_max, IBMSG_EPROTO),
    {.name = "rts_above_configured_max_size", .expect = HS_CLOSED, .options = opt_max_1m,
     .act = act_rts_above_max, .reason = IBMSG_EPROTO},
    CLOSED("rts_garbage_rkey", act_rts_bad_rkey, IBMSG_EPROTO),
    CLOSED("rts_range_outside_registration", act_rts_outside_mr, IBMSG_EPROTO),
    CLOSED("rts_reserved_flag", act_rts_reserved_bits, IBMSG_EPROTO),
    CLOSED("rts_31_bytes", act_rts_short, IBMSG_EPROTO),
    CLOSED("rts_33_bytes", act_rts_long, IBMSG_EPROTO),
    CLOSED("rendezvous_empty", act_rndv_empty, IBMSG_EPROTO),
    CLOSED("rendezvous_malformed_flood", act_rndv_flood, IBMSG_EPROTO),
    {.name = "rendezvous_malformed_one_by_one", .expect = HS_CLOSED, .options = opt_depth_2,
     .act = act_rndv_one_by_one, .reason = IBMSG_EPROTO},
    CLOSED("opcode_15_flood", act_opcode_flood, IBMSG_EPROTO),
    {.name = "fin_status_0", .expect = HS_CLOSED, .act = act_fin_status_0,
     .reason = IBMSG_EPROTO, .after = after_large_canceled},
    {.name = "fin_status_2", .expect = HS_CLOSED, .act = act_fin_status_2,
     .reason = IBMSG_EPROTO, .after = after_large_canceled},
    {.name = "fin_wrong_id", .expect = HS_CLOSED, .act = act_fin_wrong_id,
     .reason = IBMSG_EPROTO, .after = after_large_canceled},
    CLOSED("fin_without_rts", act_fin_without_rts, IBMSG_EPROTO),
    CLOSED("data_credits_returned_beyond_cap", act_credits_beyond_cap, IBMSG_EPROTO),
    CLOSED("control_credits_returned_beyond_depth", act_ctrl_credits_beyond_depth, IBMSG_EPROTO),
    CLOSED("data_credit_returned_never_spent", act_data_credit_never_spent, IBMSG_EPROTO),
    CLOSED("control_credit_returned_never_spent", act_ctrl_credit_never_spent, IBMSG_EPROTO),
    CLOSED("done_count_without_rts", act_done_without_rts, IBMSG_EPROTO),
    CLOSED("return_of_zero_credits", act_return_zero, IBMSG_EPROTO),
    CLOSED("return_below_base", act_return_below_base, IBMSG_EPROTO),
    CLOSED("return_with_wants_bit", act_return_with_wants, IBMSG_EPROTO),
    CLOSED("write_imm_without_rdma_feature", act_write_imm_without_rdma, IBMSG_EPROTO),
    {.name = "data_imm_without_imm_feature", .expect = HS_CLOSED, .hello = hello_no_imm,
     .act = act_data_imm_valid, .reason = IBMSG_EPROTO},
    {.name = "rts_imm_without_imm_feature", .expect = HS_CLOSED, .hello = hello_no_imm,
     .act = act_rts_with_imm, .reason = IBMSG_EPROTO},
    {.name = "rts_without_rndv_feature", .expect = HS_CLOSED, .hello = hello_no_rndv,
     .act = act_rts_valid, .reason = IBMSG_EPROTO},
    {.name = "done_count_without_rndv_feature", .expect = HS_CLOSED, .hello = hello_no_rndv,
     .act = act_done_without_rts, .reason = IBMSG_EPROTO},
    {.name = "return_without_shared_feature", .expect = HS_CLOSED, .hello = hello_no_shared,
     .act = act_return_below_base, .reason = IBMSG_EPROTO},
};

#define N_CASES (sizeof cases / sizeof cases[0])

/* Tests of their own (more than one raw peer, or another process). */
static const struct CMUnitTest more[] = {
    cmocka_unit_test_setup_teardown(five_peers_announce_512_mib_with_bad_keys_at_once, h_setup, hs_teardown),
    cmocka_unit_test_setup_teardown(a_peer_announces_1_5_gib_with_a_bad_key, h_setup, hs_teardown),
    cmocka_unit_test_setup_teardown(valid_large_messages_from_one_peer_while_another_streams, h_setup,
                                    hs_teardown),
};
#define N_MORE (sizeof more / sizeof more[0])

int main(int argc, char **argv) {
  struct CMUnitTest tests[N_CASES + N_MORE];
  size_t i;
  for (i = 0; i < N_CASES; i++) {
    tests[i].name = cases[i].name;
    tests[i].test_func = hs_run;
    tests[i].setup_func = hs_setup;
    tests[i].teardown_func = hs_teardown;
    tests[i].initial_state = (void *)&cases[i];
  }
  for (i = 0; i < N_MORE; i++) tests[N_CASES + i] = more[i];
  h_init(argc, argv);
  return _cmocka_run_group_tests("test_hostile", tests, N_CASES + N_MORE, NULL, NULL);
}
