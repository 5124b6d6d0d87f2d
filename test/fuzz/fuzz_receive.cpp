// fuzz_receive.cpp - libFuzzer harness of the core's receive path: a raw peer (the fake
// transport's RawPeer, test/fake) connects to an ibmsg listener and sends what the input says:
// data messages with and without an application immediate, credit-only and Return messages,
// RTSs (valid, pointing at memory the peer registered, or corrupted) and FINs, RDMA writes with
// immediate, messages without immediate, arbitrary immediates and payloads; the application side
// frees or holds what it gets, sends messages of its own, takes rendezvous messages into a region
// or declines them (message_incoming), disconnects. Each input runs on a fresh loop and a reset
// fake, from the core sources src/*.cpp over test/fake/transport.cpp.
//
// The harness keeps the raw peer's book of the protocol (wire.hpp, protocol 1.3): its data and
// control credits (from ibmsg's hello and the credits ibmsg's messages return), what it owes
// ibmsg (ibmsg's messages it consumed), ibmsg's RTSs it has not counted done. With the book, each
// message the raw peer sends is honest (keeps the protocol), breaks it, or is beyond the model
// (a Return, a keepalive, shared credits granted above what was owed: no claims from then on).
//
// Input (fuzz::Cursor: zeros once it ends; test/fuzz/make-seeds writes inputs of this form):
//   cfg   bits 0..2 IBMSG_OPT_RECV_DEPTH - 1, 3 IBMSG_OPT_SHARED_RECV, 4 IBMSG_OPT_RDMA off,
//         5 a message_incoming callback (and a region), 6 a witness connection, 7 hold messages
//   cfg2  bit 0 the device's largest message 8 KiB (else 1 MiB: the rendezvous read chunk),
//         1 the peer's private data straight from the input, 2..3 busy polling (0, 1, 20, 0 us),
//         4 ibmsg connects to the peer (else the peer connects to ibmsg's listener)
//   4 bytes: what message_incoming does, in turn (% 5: library buffer, decline, the region,
//         beyond the region, a copied handle)
//   sizes bits 0..1 eager size (16, 64, 512, 4000), 2..3 maximum (x 1, 3, 16, 64, at most
//         256 KiB), 4..5 IBMSG_OPT_SEND_DEPTH - 1
//   the peer's hello: features (bit 7: the 1.3 ones only), depth, control depth, eager maximum
//         (16 bits), then bits 0..1 rendezvous maximum (none, x 1, 4, 1024), 2 a cap, 3..7 its
//         excess; with cfg2 bit 1 then a length (8 + % 49) and the private data
//   commands, at most 48 (first byte % 16): 0 data, 1 data with immediate, 2 credit-only,
//         3 RTS, 4 corrupted RTS, 5 FIN, 6 Return, 7 any immediate and payload, 8 RDMA write
//         with immediate, 9 no immediate, 10 free held messages, 11 the application sends,
//         12 run the loop, 13 the peer disconnects, 14 the application disconnects, 15 hold on/off
//         (their bytes: see command()); the credit fields of the peer's messages are what its
//         book says it owes unless a flag gives them explicitly.
//
// Properties (a violation aborts, libFuzzer keeps the input):
//   - no crash, leak or undefined behaviour (ASan, UBSan; every object of the fake released at
//     the end, no misuse of the transport, no invalid state transition);
//   - every socket that was set up closes exactly once, with no callback after its closed
//     callback, established at most once; a connection closes with IBMSG_OK only after
//     ibmsg_disconnect, otherwise with IBMSG_ECONNRESET, IBMSG_EPROTO or IBMSG_EIO;
//   - message_sent exactly once per posted message (by the end), write_received once per write
//     with immediate, with its immediate, in order;
//   - every message delivered was sent by the peer, once, in order, with its size, bytes and
//     immediate (a region message inside its region);
//   - while the peer is honest, the connection stays up, every message it sent is delivered (or
//     declined by the application), and none of its sends finds no receive (RNR) or too small a
//     buffer; once it breaks the protocol, the connection closes; once it has returned every
//     control credit and the application holds nothing, it has a data credit again and each of
//     its rendezvous messages is counted done or declined (credits.hpp: "a peer never waits for
//     credits that exist");
//   - ibmsg never sends the peer more data or control messages than the peer's credits allow (no
//     RNR or length error at the peer either), counts no more of the peer's rendezvous messages
//     done than it sent, sends only known opcodes, valid RTSs and FINs;
//   - the hello: a connection comes up exactly when the peer's hello decodes Ok; otherwise it is
//     refused with an ibmsg reject text (or, ibmsg connecting, closes with IBMSG_EPROTO);
//   - shared receive buffers: at every quiet moment each buffer of the pool is posted or lent
//     (a buffer lost from the shared queue shows here), and another connection on the same pool
//     (the witness, when the input asks for one) still works at the end;
//   - no file descriptor is left open.
// FUZZ_DEBUG=1 in the environment traces what an input does (to read a crashing one).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include <dirent.h>

#include "fake.hpp"
#include "fuzz.hpp"
#include "ibmsg.h"
#include "internal.hpp"  // the shared pool's book (SharedRecv, Slot states)
#include "errors.hpp"    // ibmsg::invalid_transitions
#include "wire.hpp"

namespace fake = ibmsg::fake;
namespace wire = ibmsg::wire;
namespace tp = ibmsg::tp;
using Raw = fake::RawPeer;

namespace {

// RawPeer keeps its device to itself, but the memory an RTS points at must be registered on it
// (the fake checks that a key belongs to the responder's protection domain). An explicit
// instantiation may name a private member ([temp.spec.general]): this one hands it out.
tp::Device *raw_device(const Raw &r);
template <tp::Device *Raw::*M>
struct RawDeviceOf {
  friend tp::Device *raw_device(const Raw &r) { return r.*M; }
};
template struct RawDeviceOf<&Raw::dev_>;

constexpr uint32_t kRawBufs = 32;     // the raw peer's receive buffers
constexpr uint32_t kRawBufSize = 4096;
constexpr int kMaxCommands = 48;
constexpr size_t kRegionSize = size_t(1) << 20;  // the application's region for incoming messages
constexpr uint32_t kOpData = 0, kOpCredit = 1, kOpKeepalive = 2, kOpRndv = 3, kOpDataImm = 5,
                   kOpReturn = 6;
constexpr uint32_t kKnownFeatures =
    wire::kFeatureRdma | wire::kFeatureImm | wire::kFeatureRndv | wire::kFeatureShared;

uint32_t make_imm(uint32_t op, uint32_t credits, uint32_t ctrl, uint32_t done) {
  return op << 28 | (done & 0x0f) << 24 | (ctrl & 0xff) << 16 | (credits & 0xffff);
}

// --- what the sockets saw ------------------------------------------------------------------------

struct Sock {
  ibmsg_socket s{};
  const char *name = "";
  bool opened = false;
  int established = 0;
  int closed = 0;
  int reason = -1;
  int after_close = 0;
  int disconnect_in_closed = -1;
};

// A message the application posted: its buffer is freed in its message_sent callback.
struct Out {
  ibmsg_buffer m{};
  bool attached = false;  // allocated, not yet freed
  int posts = 0;
  int sent_cbs = 0;
};

// A message of the raw peer that may be delivered (data, data with immediate, RTS).
struct Expect {
  uint32_t size = 0;
  bool has_imm = false;
  uint32_t imm = 0;
  std::vector<uint8_t> bytes;       // an eager message's payload
  const uint8_t *source = nullptr;  // an RTS's data, in memory of the raw peer's (nullptr: unknown)
  bool rts = false;
  bool honest = false;
  bool declined = false;
  bool incoming_seen = false;  // message_incoming ran for it
  bool unreadable = false;     // an RTS whose range the peer did not register with its key
};

// Memory of the raw peer's that an RTS points at (registered for remote reads on its device): a
// part of the arena, which each input uses from its start (no two chunks of an input overlap).
struct Chunk {
  uint8_t *mem = nullptr;
  size_t len = 0;
  tp::Mr *mr = nullptr;
};
constexpr size_t kArenaSize = size_t(4) << 20;

// Memory allocated once for the process (so that an input costs no page faults for it): the
// chunks' arena and the application's region.
uint8_t *arena() {
  static uint8_t *mem = static_cast<uint8_t *>(calloc(1, kArenaSize));
  return mem;
}
void *region_memory() {
  static void *mem = calloc(1, kRegionSize);
  return mem;
}

// The raw peer's book of the protocol.
struct Book {
  bool active = false;  // the connection is up: the book runs
  bool known = true;   // the model can judge what the peer does
  bool broke = false;  // the peer broke the protocol (while known)
  const char *broke_why = "";
  bool disconnected = false;      // the raw peer disconnected
  bool app_disconnected = false;  // ibmsg_disconnect on the connection returned IBMSG_OK
  // agreed on
  uint32_t features = 0;
  bool shared = false, imm = false, rndv = false, rdma = false;
  // ibmsg's hello
  uint32_t ib_eager = 0, ib_max = 0;
  // the raw peer's hello
  uint32_t raw_max = 0;
  // the raw peer's credits at ibmsg, and what it owes ibmsg (ibmsg's messages it consumed)
  int64_t data = 0, ctrl = 0, owed_data = 0, owed_ctrl = 0;
  std::deque<uint32_t> ib_rts;     // ibmsg's RTSs the peer has not counted done (their ids)
  std::deque<uint32_t> raw_rts;    // the peer's well-formed RTSs ibmsg has not counted (ids)
  // ibmsg's credits at the raw peer: its messages must keep them at or above zero
  int64_t ib_data = 0, ib_ctrl = 0;

  bool claims() const { return active && known && !broke && !disconnected && !app_disconnected; }
  const char *state() const {
    return !known ? "beyond the model" : broke ? broke_why : disconnected || app_disconnected ? "disconnected" : "honest";
  }
  void breaks(const char *why) {
    if (known && !broke) {
      broke = true;
      broke_why = why;
    }
  }
};

struct Run {
  ibmsg_event_loop loop{};
  bool loop_alive = false;
  unsigned long transitions_before = 0;
  std::deque<Sock> socks;  // stable addresses
  Sock *listener = nullptr, *acc = nullptr, *wit_client = nullptr, *wit_acc = nullptr;
  Sock *accept_into = nullptr;
  int requests = 0;
  int accept_rc = -1;
  std::unique_ptr<Raw> raw;
  std::vector<Chunk> chunks;
  size_t arena_next = 0;
  ibmsg_region region{};
  bool have_region = false;
  size_t region_next = 0;
  // application policy
  bool hold = false;
  std::vector<uint8_t> incoming_plan;
  size_t incoming_step = 0;
  std::deque<ibmsg_buffer *> held;
  std::deque<Out> outs;
  // the raw peer's messages and what arrived of them
  std::deque<Expect> expect;
  size_t next_deliver = 0, next_incoming = 0;
  std::deque<uint32_t> writes;  // immediates of its RDMA writes with immediate
  size_t seen = 0;              // raw->received processed
  unsigned long delivered = 0;
  Book book;
  uint64_t tag = 0;  // numbers the raw peer's messages (the first 4 bytes of their payload)
  bool raw_lies = false;  // its hello is any private data: it may claim more than it has
};

Run *g_run = nullptr;

// FUZZ_DEBUG=1 in the environment: what happens, on stderr (to read a crashing input).
bool debug() {
  static const bool on = getenv("FUZZ_DEBUG") != nullptr;
  return on;
}
#define TRACE(...)                        \
  do {                                    \
    if (debug()) {                        \
      fprintf(stderr, "fuzz: " __VA_ARGS__); \
      fputc('\n', stderr);                \
    }                                     \
  } while (0)

Sock &new_sock(Run &r, const char *name) {
  r.socks.emplace_back();
  Sock &s = r.socks.back();
  s.name = name;
  s.s.user_data = &s;
  return s;
}

// File descriptors open in the process (an input must leave as many as it found).
int open_fds() {
  DIR *d = opendir("/proc/self/fd");
  if (!d) return -1;
  int n = 0;
  while (readdir(d)) ++n;
  closedir(d);
  return n;
}

unsigned long transport_faults() {
  const fake::Stats &st = fake::stats();
  return st.rnr_errors + st.length_errors;
}

// --- the shared receive pool's book ------------------------------------------------------------

// At a quiet moment every buffer of a shared pool is in its shared receive queue (Posted) or
// holds a message (Lent: delivered and held, being read, declined until its FIN completed); one
// in neither state left the queue for good while the pool still counts it.
void check_shared_pool(const Sock *sock) {
  if (!sock || sock->closed || !sock->s.impl) return;
  const ibmsg::SharedRecv *r = sock->s.impl->rx.shared;
  if (!r) return;
  uint32_t posted = 0, lent = 0, other = 0;
  for (const ibmsg::Pool *p = r->slabs.front(); p; p = r->slabs.next(p))
    for (uint32_t i = 0; i < p->count; ++i) {
      switch (p->slots[i].state) {
        case ibmsg::SlotState::Posted: ++posted; break;
        case ibmsg::SlotState::Lent: ++lent; break;
        default: ++other; break;
      }
    }
  if (posted + lent != r->buffers || lent != r->lent)
    FUZZ_FAIL("shared receive pool (seen from the %s socket): %u buffers counted, %u lent counted; "
              "%u posted, %u lent, %u in neither state (lost from the shared receive queue)",
              sock->name, r->buffers, r->lent, posted, lent, other);
}

// --- the raw peer's book: ibmsg's messages -----------------------------------------------------

void process_ibmsg_messages(Run &r) {
  Book &b = r.book;
  while (r.seen < r.raw->received.size()) {
    const fake::RawMsg &m = r.raw->received[r.seen++];
    TRACE("ibmsg -> peer: imm 0x%08x, %zu bytes", m.imm, m.data.size());
    if (!m.has_imm) FUZZ_FAIL("ibmsg sent a message without immediate");
    wire::Imm imm;
    wire::decode_imm(m.imm, &imm);
    if (b.shared) wire::split_wants(&imm);
    const uint32_t op = uint32_t(imm.op);
    // The peer's rendezvous messages ibmsg read: in order, no more than it sent.
    if (imm.done > b.raw_rts.size())
      FUZZ_FAIL("ibmsg counts %u rendezvous messages done, the peer has %zu outstanding", imm.done,
                b.raw_rts.size());
    for (uint32_t i = 0; i < imm.done; ++i) b.raw_rts.pop_front();
    if (op != kOpReturn) b.data += imm.credits;
    b.ctrl += imm.ctrl_credits;
    switch (op) {
      case kOpData:
      case kOpDataImm:
        --b.ib_data;
        ++b.owed_data;
        if (op == kOpDataImm && (!b.imm || m.data.size() < wire::kImmTrailer))
          FUZZ_FAIL("ibmsg sent a data message with immediate (%zu bytes, immediates agreed: %d)",
                    m.data.size(), b.imm);
        break;
      case kOpRndv:
        if (!b.rndv) FUZZ_FAIL("ibmsg sent a rendezvous message without rendezvous agreed");
        if (m.data.size() == wire::kRtsSize) {
          wire::Rts rts;
          if (!wire::decode_rts(m.data.data(), m.data.size(), &rts))
            FUZZ_FAIL("ibmsg sent an RTS that does not decode");
          if (rts.length > b.raw_max)
            FUZZ_FAIL("ibmsg sent an RTS of %llu bytes, the peer takes %u",
                      (unsigned long long)rts.length, b.raw_max);
          if (rts.has_imm && !b.imm) FUZZ_FAIL("ibmsg sent an RTS with an immediate not agreed on");
          --b.ib_data;
          ++b.owed_data;
          b.ib_rts.push_back(rts.id);
        } else if (m.data.size() == wire::kFinSize) {
          wire::Fin fin;
          if (!wire::decode_fin(m.data.data(), m.data.size(), &fin) ||
              fin.status != wire::FinStatus::Declined)
            FUZZ_FAIL("ibmsg sent a FIN that does not decode or is not a decline");
          if (b.raw_rts.empty() || b.raw_rts.front() != fin.id)
            FUZZ_FAIL("ibmsg declined rendezvous message %u, the peer's next is %s%u", fin.id,
                      b.raw_rts.empty() ? "none " : "", b.raw_rts.empty() ? 0 : b.raw_rts.front());
          b.raw_rts.pop_front();
          --b.ib_ctrl;
          ++b.owed_ctrl;
        } else {
          FUZZ_FAIL("ibmsg sent a rendezvous message of %zu bytes", m.data.size());
        }
        break;
      case kOpCredit:
        if (!m.data.empty()) FUZZ_FAIL("ibmsg sent a credit-only message with a payload");
        --b.ib_ctrl;
        ++b.owed_ctrl;
        break;
      case kOpReturn:
        if (!b.shared) FUZZ_FAIL("ibmsg sent a Return without shared receive buffers agreed");
        if (!m.data.empty()) FUZZ_FAIL("ibmsg sent a Return with a payload");
        --b.ib_ctrl;
        ++b.owed_ctrl;
        b.ib_data -= imm.credits;  // what it gives back it no longer holds
        break;
      case kOpKeepalive:  // a feature of a later protocol: beyond the model
        b.known = false;
        --b.ib_ctrl;
        ++b.owed_ctrl;
        break;
      default: FUZZ_FAIL("ibmsg sent opcode %u", op);
    }
    if (b.ib_data < 0)
      FUZZ_FAIL("ibmsg sent beyond the data credits the peer granted (%lld)", (long long)b.ib_data);
    if (b.ib_ctrl < 0)
      FUZZ_FAIL("ibmsg sent beyond the control credits the peer granted (%lld)",
                (long long)b.ib_ctrl);
  }
}

// --- driving ---------------------------------------------------------------------------------

void pump(Run &r) {
  if (r.raw) {
    r.raw->pump();
    process_ibmsg_messages(r);
  }
}

// One round of the loop. Whatever it delivers to the raw peer comes from ibmsg: an RNR or a
// length error there is ibmsg's.
void round(Run &r) {
  pump(r);
  const unsigned long faults = transport_faults();
  ibmsg_dispatch_event_loop_timeout(&r.loop, 0);
  if (transport_faults() != faults && !r.raw_lies)
    FUZZ_FAIL("a send of ibmsg found no receive or too small a buffer (RNR / length error)");
  pump(r);
}

void settle(Run &r, int rounds) {
  for (int i = 0; i < rounds; ++i) round(r);
  check_shared_pool(r.acc);
  check_shared_pool(r.wit_acc);
}

template <class F>
bool run_until(Run &r, F done, int max_rounds) {
  for (int i = 0; i < max_rounds; ++i) {
    if (done()) return true;
    round(r);
  }
  return done();
}

// --- callbacks -------------------------------------------------------------------------------

Sock *sock_of(ibmsg_socket *s) { return static_cast<Sock *>(s->user_data); }

void on_request(ibmsg_connection_request *req) {
  Run &r = *g_run;
  ++r.requests;
  if (!r.accept_into) {
    ibmsg_reject(req, "unexpected");
    return;
  }
  Sock *s = r.accept_into;
  r.accept_into = nullptr;
  r.accept_rc = ibmsg_accept(req, &s->s);
  if (r.accept_rc == IBMSG_OK) s->opened = true;
}

void on_established(ibmsg_socket *s) {
  Sock *k = sock_of(s);
  if (k->closed) ++k->after_close;
  if (++k->established > 1) FUZZ_FAIL("%s socket: connection_established twice", k->name);
}

// Whether m is e. A declined message never arrives, nor does an RTS of memory the peer did not
// register (the read fails).
bool matches(const Expect &e, const ibmsg_buffer *m) {
  if (e.declined || (e.rts && !e.source)) return false;
  if (e.size != m->size || e.has_imm != ((m->flags & IBMSG_MSG_IMM) != 0)) return false;
  if (e.has_imm && e.imm != m->imm) return false;
  if (!e.size) return true;
  if (!m->data) return false;
  if (!e.rts) return memcmp(e.bytes.data(), m->data, e.size) == 0;
  return memcmp(e.source, m->data, e.size) == 0;
}

void on_received(ibmsg_socket *s, ibmsg_buffer *m) {
  Run &r = *g_run;
  Sock *k = sock_of(s);
  if (k->closed) ++k->after_close;
  if (m->status != IBMSG_RECEIVED) FUZZ_FAIL("a received message has status %d", int(m->status));
  if (k != r.acc) {  // the witness
    if (ibmsg_free_msg(m) != IBMSG_OK) FUZZ_FAIL("freeing a witness message failed");
    return;
  }
  if (std::find(r.held.begin(), r.held.end(), m) != r.held.end())
    FUZZ_FAIL("a held message was delivered again before it was freed");
  if (m->flags & IBMSG_MSG_REGION) {
    auto *base = static_cast<uint8_t *>(r.region.addr);
    auto *p = static_cast<uint8_t *>(m->data);
    if (!r.have_region || p < base || p + m->size > base + r.region.length)
      FUZZ_FAIL("a region message lies outside the region");
  }
  // The next message of the peer's that it matches: those before it must have been dropped
  // legitimately (declined; or the peer broke the protocol).
  size_t j = r.next_deliver;
  while (j < r.expect.size() && !matches(r.expect[j], m)) ++j;
  if (j == r.expect.size())
    FUZZ_FAIL("delivered a message of %zu bytes (imm flag %u) that matches none the peer sent "
              "after its last delivered one (%zu of %zu)",
              m->size, m->flags & IBMSG_MSG_IMM, r.next_deliver, r.expect.size());
  for (size_t i = r.next_deliver; i < j; ++i) {
    const Expect &e = r.expect[i];
    if (!e.declined && r.book.claims())
      FUZZ_FAIL("message %zu of the honest peer was skipped (message %zu delivered instead)", i, j);
  }
  r.next_deliver = j + 1;
  ++r.delivered;
  TRACE("delivered message %zu: %zu bytes%s", j, m->size, m->flags & IBMSG_MSG_REGION ? " in the region" : "");
  if (r.hold) {
    r.held.push_back(m);
  } else if (int rc = ibmsg_free_msg(m)) {
    FUZZ_FAIL("ibmsg_free_msg of a received message: %s", ibmsg_err_name(rc));
  }
}

void on_sent(ibmsg_socket *s, ibmsg_buffer *m, int status) {
  Sock *k = sock_of(s);
  if (k->closed) ++k->after_close;
  (void)status;
  auto *o = static_cast<Out *>(m->user_data);
  if (!o) return;  // the witness's messages are not counted
  if (++o->sent_cbs > o->posts) FUZZ_FAIL("message_sent more often than the message was posted");
  if (int rc = ibmsg_free_msg(m)) FUZZ_FAIL("freeing a sent message: %s", ibmsg_err_name(rc));
  o->attached = false;
}

void on_closed(ibmsg_socket *s, int reason) {
  Run &r = *g_run;
  Sock *k = sock_of(s);
  if (++k->closed > 1) FUZZ_FAIL("%s socket: connection_closed twice", k->name);
  k->reason = reason;
  k->disconnect_in_closed = ibmsg_disconnect(s);
  TRACE("%s socket closed: %s", k->name, ibmsg_err_name(reason));
  if (k != r.acc) return;
  const Book &b = r.book;
  if (reason == IBMSG_OK && !b.app_disconnected)
    FUZZ_FAIL("the connection closed with IBMSG_OK without ibmsg_disconnect");
  if (reason != IBMSG_OK && reason != IBMSG_ECONNRESET && reason != IBMSG_EPROTO &&
      reason != IBMSG_EIO)
    FUZZ_FAIL("the connection closed with %s", ibmsg_err_name(reason));
  if (b.claims())
    FUZZ_FAIL("the connection to an honest peer closed with %s", ibmsg_err_name(reason));
}

void on_write_received(ibmsg_socket *s, uint32_t imm, size_t length) {
  Run &r = *g_run;
  Sock *k = sock_of(s);
  if (k->closed) ++k->after_close;
  if (k != r.acc || r.writes.empty()) FUZZ_FAIL("write_received for a write never made");
  if (r.writes.front() != imm || length != 0)
    FUZZ_FAIL("write_received with immediate 0x%x and %zu bytes, the peer wrote 0x%x and 0 bytes",
              imm, length, r.writes.front());
  r.writes.pop_front();
}

void on_incoming(ibmsg_socket *s, ibmsg_incoming *in) {
  Run &r = *g_run;
  Sock *k = sock_of(s);
  if (k->closed) ++k->after_close;
  if (k != r.acc) return;
  // Which of the peer's RTSs it is: the next one of that size and immediate.
  size_t j = r.next_incoming;
  while (j < r.expect.size() &&
         !(r.expect[j].rts && r.expect[j].size == in->size &&
           r.expect[j].has_imm == ((in->flags & IBMSG_MSG_IMM) != 0) &&
           (!r.expect[j].has_imm || r.expect[j].imm == in->imm)))
    ++j;
  if (j == r.expect.size()) FUZZ_FAIL("message_incoming for no RTS of the peer's");
  if (r.expect[j].incoming_seen) FUZZ_FAIL("message_incoming twice for one message");
  r.expect[j].incoming_seen = true;
  r.next_incoming = j + 1;
  TRACE("message_incoming for message %zu (%zu bytes): plan %u", j, in->size,
        r.incoming_plan.empty() ? 0 : r.incoming_plan[r.incoming_step % r.incoming_plan.size()] % 5);
  if (in->size > r.book.ib_max) FUZZ_FAIL("message_incoming for %zu bytes, above the maximum", in->size);
  const uint8_t plan = r.incoming_plan.empty()
                           ? 0
                           : r.incoming_plan[r.incoming_step++ % r.incoming_plan.size()];
  switch (plan % 5) {
    case 0: break;  // a library buffer
    case 1: {
      int rc = ibmsg_incoming_decline(in);
      if (rc != IBMSG_OK) FUZZ_FAIL("ibmsg_incoming_decline: %s", ibmsg_err_name(rc));
      r.expect[j].declined = true;
      if (ibmsg_incoming_decline(in) != IBMSG_ESTATE) FUZZ_FAIL("declined twice");
      break;
    }
    case 2:
    case 3: {  // at the next free bytes of the region; or just beyond its end (IBMSG_ERANGE)
      if (!r.have_region) break;
      size_t off = r.region_next;
      if (plan % 5 == 3) off = plan & 8 ? SIZE_MAX - plan : kRegionSize - in->size + 1 + plan % 7;
      int rc = ibmsg_incoming_to_region(in, &r.region, off);
      const bool fits = off <= kRegionSize && in->size <= kRegionSize - off;
      if (fits && rc != IBMSG_OK) FUZZ_FAIL("ibmsg_incoming_to_region: %s", ibmsg_err_name(rc));
      if (!fits && rc != IBMSG_ERANGE)
        FUZZ_FAIL("ibmsg_incoming_to_region beyond the region: %s", ibmsg_err_name(rc));
      // Fresh bytes for each message: a region message stays intact until it is freed.
      if (rc == IBMSG_OK) r.region_next += (in->size + 63) & ~size_t(63);
      break;
    }
    case 4: {  // a copy of the handle is refused (only the callback's own is taken)
      ibmsg_incoming copy = *in;
      if (ibmsg_incoming_decline(&copy) != IBMSG_EINVAL) FUZZ_FAIL("a copied incoming handle was taken");
      if (r.have_region && ibmsg_incoming_to_region(&copy, &r.region, 0) != IBMSG_EINVAL)
        FUZZ_FAIL("a copied incoming handle was taken");
      break;
    }
  }
  if (r.expect[j].unreadable && !r.expect[j].declined) r.book.breaks("an RTS ibmsg cannot read");
}

// --- the raw peer's side ---------------------------------------------------------------------

// Judges a message the raw peer is about to send and updates the book as if it arrived.
// payload: its bytes (an RTS or FIN for opcode 3). src_ok: an RTS's range lies in memory the peer
// registered with that key.
void judge(Run &r, bool has_imm, uint32_t value, const uint8_t *payload, size_t len, bool src_ok) {
  Book &b = r.book;
  if (!has_imm) {
    b.breaks("a message without immediate");
    return;
  }
  wire::Imm imm;
  wire::decode_imm(value, &imm);
  if (b.shared) wire::split_wants(&imm);
  const uint32_t op = uint32_t(imm.op);
  if (imm.done) {
    if (!b.rndv) b.breaks("done counts without rendezvous");
    else if (imm.done > b.ib_rts.size()) b.breaks("more done than ibmsg's RTSs");
    for (uint32_t i = 0; i < imm.done && !b.ib_rts.empty(); ++i) b.ib_rts.pop_front();
  }
  if (op != kOpReturn) {
    if (imm.credits > b.owed_data) {
      // With shared buffers the peer may grant more than it owes (up to its cap): beyond the model.
      if (b.shared) b.known = false;
      else b.breaks("data credits returned beyond what ibmsg spent");
      b.ib_data += imm.credits;
      b.owed_data = 0;
    } else {
      b.ib_data += imm.credits;
      b.owed_data -= imm.credits;
    }
  }
  if (imm.ctrl_credits > b.owed_ctrl) b.breaks("control credits returned beyond what ibmsg spent");
  b.ib_ctrl += imm.ctrl_credits;
  b.owed_ctrl -= std::min<int64_t>(b.owed_ctrl, imm.ctrl_credits);
  auto spend_data = [&b] {
    if (b.data <= 0) b.breaks("a data message without a data credit");
    --b.data;
  };
  auto spend_ctrl = [&b] {
    if (b.ctrl <= 0) b.breaks("a control message without a control credit");
    --b.ctrl;
  };
  switch (op) {
    case kOpData:
      if (len > b.ib_eager) b.breaks("a data message above the eager size");
      spend_data();
      break;
    case kOpDataImm:
      if (!b.imm) b.breaks("an immediate not agreed on");
      if (len < wire::kImmTrailer) b.breaks("no room for the immediate");
      else if (len - wire::kImmTrailer > b.ib_eager) b.breaks("a data message above the eager size");
      spend_data();
      break;
    case kOpCredit:
      if (len) b.breaks("a credit-only message with a payload");
      spend_ctrl();
      break;
    case kOpRndv: {
      if (!b.rndv) b.breaks("a rendezvous message without rendezvous agreed");
      wire::Rts rts;
      wire::Fin fin;
      if (wire::decode_rts(payload, len, &rts)) {
        if (rts.length > b.ib_max) b.breaks("an RTS above the maximum");
        if (rts.has_imm && !b.imm) b.breaks("an RTS with an immediate not agreed on");
        if (!src_ok) b.breaks("an RTS ibmsg cannot read");
        b.raw_rts.push_back(rts.id);
        spend_data();
      } else if (wire::decode_fin(payload, len, &fin)) {
        if (fin.status != wire::FinStatus::Declined) b.breaks("a FIN that is no decline");
        else if (b.ib_rts.empty() || b.ib_rts.front() != fin.id) b.breaks("a FIN of another RTS");
        if (!b.ib_rts.empty()) b.ib_rts.pop_front();
        spend_ctrl();
      } else {
        b.breaks("neither RTS nor FIN");
      }
      break;
    }
    case kOpReturn:
      if (!b.shared) b.breaks("a Return without shared buffers agreed");
      b.known = false;  // what it may give back depends on the grant: beyond the model
      break;
    case kOpKeepalive: b.known = false; break;  // a later protocol's
    default: b.breaks("a reserved opcode"); break;
  }
}

// Whether [addr, addr + len) lies in one registration of the raw peer's with that key, and its
// bytes there.
const uint8_t *raw_source(const Run &r, uint64_t addr, uint64_t len, uint32_t rkey) {
  for (const Chunk &c : r.chunks) {
    const auto start = reinterpret_cast<uintptr_t>(c.mem);
    if (tp::mr_rkey(c.mr) == rkey && addr >= start && addr - start <= c.len &&
        len <= c.len - (addr - start))
      return reinterpret_cast<const uint8_t *>(uintptr_t(addr));
  }
  return nullptr;
}

// Sends one message of the raw peer's (judged, recorded, its transport faults attributed).
void raw_send(Run &r, uint32_t imm, const std::vector<uint8_t> &payload) {
  if (r.book.disconnected) return;
  pump(r);
  const size_t len = payload.size();
  const uint32_t op = imm >> 28;
  wire::Rts rts;
  const bool is_rts = op == kOpRndv && wire::decode_rts(payload.data(), len, &rts);
  const uint8_t *src = is_rts ? raw_source(r, rts.addr, rts.length, rts.rkey) : nullptr;
  // An RTS of memory the peer cannot serve breaks the protocol once ibmsg reads it: at once, or
  // when message_incoming did not decline it.
  judge(r, true, imm, payload.data(), len, src != nullptr || r.loop.message_incoming != nullptr);
  const bool honest = r.book.claims();
  TRACE("peer -> ibmsg: imm 0x%08x, %zu bytes%s%s (%s; credits %lld/%lld, owes %lld/%lld)", imm,
        len, is_rts ? ", an RTS" : "", is_rts && !src ? " of memory it has not registered" : "",
        r.book.state(),
        (long long)r.book.data, (long long)r.book.ctrl, (long long)r.book.owed_data,
        (long long)r.book.owed_ctrl);
  Expect e;
  bool deliverable = false;
  if (op == kOpData) {
    deliverable = true;
    e.size = uint32_t(len);
    e.bytes = payload;
  } else if (op == kOpDataImm && len >= wire::kImmTrailer) {
    deliverable = true;
    e.size = uint32_t(len - wire::kImmTrailer);
    e.bytes.assign(payload.begin(), payload.end() - wire::kImmTrailer);
    e.has_imm = true;
    e.imm = fuzz::le32(payload.data() + len - wire::kImmTrailer);
  } else if (is_rts && rts.length <= UINT32_MAX) {
    deliverable = true;
    e.rts = true;
    e.size = uint32_t(rts.length);
    e.has_imm = rts.has_imm;
    e.imm = rts.imm;
    e.source = src;
    e.unreadable = !src;
  }
  e.honest = honest;
  if (deliverable) r.expect.push_back(std::move(e));
  const unsigned long faults = transport_faults();
  const int rc = r.raw->send(imm, len ? payload.data() : nullptr, len);
  if (rc != IBMSG_OK) {
    r.book.known = false;  // the book counted a message that did not go
    if (deliverable) r.expect.pop_back();
    return;
  }
  if (transport_faults() != faults && honest)
    FUZZ_FAIL("a send of the honest peer found no receive or too small a buffer at ibmsg");
}

// What the raw peer returns when the input leaves it to the book: everything it owes.
struct Fields {
  uint32_t credits, ctrl, done;
};
Fields owed(const Run &r, bool with_done) {
  const Book &b = r.book;
  const uint32_t cmax = b.shared ? wire::kMaxSharedCreditsPerMsg : wire::kMaxCreditsPerMsg;
  Fields f;
  f.credits = uint32_t(std::min<int64_t>(std::max<int64_t>(b.owed_data, 0), cmax));
  f.ctrl = uint32_t(std::min<int64_t>(std::max<int64_t>(b.owed_ctrl, 0), 0xff));
  f.done = with_done ? uint32_t(std::min<size_t>(b.ib_rts.size(), wire::kMaxDonePerMsg)) : 0;
  return f;
}

Fields fields(Run &r, fuzz::Cursor &c, bool automatic, bool with_done) {
  if (automatic) return owed(r, with_done);
  Fields f;
  f.credits = c.u8() % 6;
  f.ctrl = c.u8() % 4;
  f.done = c.u8() % 3;
  return f;
}

uint32_t compose(const Run &r, uint32_t op, const Fields &f, bool wants) {
  uint32_t credits = f.credits;
  if (wants && r.book.shared) credits |= wire::kWantsBit;
  return make_imm(op, credits, f.ctrl, f.done);
}

// A payload of len bytes: the message's number first (so that each is told apart), then bytes of
// the input.
std::vector<uint8_t> payload(Run &r, fuzz::Cursor &c, size_t len) {
  std::vector<uint8_t> p(len);
  const uint32_t tag = uint32_t(++r.tag);
  for (size_t i = 0; i < len && i < 4; ++i) p[i] = uint8_t(tag >> (8 * i));
  if (len > 4) {
    const size_t take = std::min<size_t>(len - 4, 16);
    c.bytes(p.data() + 4, take);
    for (size_t i = 4 + take; i < len; ++i) p[i] = uint8_t(tag * 31 + i);
  }
  return p;
}

// A chunk of the raw peer's memory of len bytes, registered for remote reads, filled with its
// message's number and a pattern.
const Chunk *new_chunk(Run &r, size_t len) {
  Chunk ch;
  ch.len = len ? len : 1;
  if (ch.len > kArenaSize - r.arena_next) return nullptr;
  ch.mem = arena() + r.arena_next;
  r.arena_next += (ch.len + 63) & ~size_t(63);
  const uint32_t tag = uint32_t(++r.tag);
  memset(ch.mem, int(tag & 0xff), ch.len);
  for (size_t i = 0; i < ch.len && i < 4; ++i) ch.mem[i] = uint8_t(tag >> (8 * i));
  if (tp::mr_register(raw_device(*r.raw), ch.mem, ch.len, tp::kRemoteRead, &ch.mr)) return nullptr;
  r.chunks.push_back(ch);
  return &r.chunks.back();
}

uint32_t rts_length(Run &r, fuzz::Cursor &c) {
  const uint8_t mode = c.u8();
  const uint32_t max = r.book.ib_max ? r.book.ib_max : 1;
  switch (mode % 4) {
    case 0: return 1 + c.u16() % 4096;
    case 1: return max + (mode >> 2) % 3 - 1;  // around the maximum
    case 2: return r.book.ib_eager + (mode >> 2) % 3;  // just above the eager size
    default: return 1 + uint32_t(c.u32() % max);
  }
}

void cmd_rts(Run &r, fuzz::Cursor &c, bool corrupt) {
  const uint8_t fl = c.u8();
  uint32_t length = rts_length(r, c);
  if (length == 0) length = 1;
  if (length > (1u << 20)) length = 1u << 20;
  const Chunk *ch = new_chunk(r, length);
  if (!ch) return;
  wire::Rts rts;
  rts.id = c.u8();
  rts.rkey = tp::mr_rkey(ch->mr);
  rts.has_imm = fl & 1;
  rts.imm = rts.has_imm ? c.u32() : 0;
  rts.addr = reinterpret_cast<uintptr_t>(ch->mem);
  rts.length = length;
  std::vector<uint8_t> p(wire::kRtsSize);
  if (corrupt) {
    switch (c.u8() % 8) {
      case 0: rts.rkey ^= 1u + c.u8(); break;  // a key of nothing (or of another chunk)
      case 1: rts.length += 1 + c.u8(); break;  // beyond the registration
      case 2: rts.length = 0; break;
      case 3: rts.addr = ~uint64_t(0) - c.u8(); break;  // wraps
      case 4: rts.addr -= 1 + c.u8(); break;  // before the registration
      default: break;  // bytes changed below
    }
  }
  wire::encode_rts(rts, p.data());
  if (corrupt) {
    const uint8_t how = c.u8();
    if (how & 1) p[c.u8() % wire::kRtsSize] ^= uint8_t(1u << (c.u8() % 8));
    if (how & 2) p.resize(how & 4 ? wire::kRtsSize - 1 : wire::kRtsSize + 1);
  }
  const Fields f = fields(r, c, !(fl & 2), fl & 4);
  raw_send(r, compose(r, kOpRndv, f, fl & 8), p);
}

void cmd_fin(Run &r, fuzz::Cursor &c) {
  const uint8_t fl = c.u8();
  wire::Fin fin;
  fin.status = wire::FinStatus::Declined;
  fin.id = r.book.ib_rts.empty() ? 0 : r.book.ib_rts.front();
  if (fl & 1) fin.status = wire::FinStatus(c.u8() % 4);
  if (fl & 2) fin.id = c.u32();
  std::vector<uint8_t> p(wire::kFinSize);
  wire::encode_fin(fin, p.data());
  Fields f = fields(r, c, !(fl & 4), false);
  raw_send(r, compose(r, kOpRndv, f, false), p);
}

void cmd_app_send(Run &r, fuzz::Cursor &c) {
  const uint8_t fl = c.u8();
  Sock *a = r.acc;
  if (!a || a->closed || !a->s.impl) return;
  const size_t max = ibmsg_socket_max_msg_size(&a->s);
  size_t size = fl & 1 ? c.u16() : (max ? c.u32() % (max + 1) : 0);
  Out *o = nullptr;
  for (Out &x : r.outs)
    if (!x.attached) {
      o = &x;
      break;
    }
  if (!o) {
    if (r.outs.size() >= 16) return;
    r.outs.emplace_back();
    o = &r.outs.back();
  }
  int rc = ibmsg_alloc_msg(&o->m, &a->s, size);
  if (rc) {
    if (rc != IBMSG_EAGAIN && rc != IBMSG_ENOTCONN && rc != IBMSG_ESTATE &&
        !(rc == IBMSG_EMSGSIZE && size > max))
      FUZZ_FAIL("ibmsg_alloc_msg of %zu bytes (max %zu): %s", size, max, ibmsg_err_name(rc));
    return;
  }
  o->attached = true;
  o->m.user_data = o;
  if (size) memset(o->m.data, 0x5a, size);
  rc = fl & 2 ? ibmsg_post_send_imm(&a->s, &o->m, c.u32()) : ibmsg_post_send(&a->s, &o->m);
  if (rc == IBMSG_OK) {
    ++o->posts;  // the library's until message_sent, which frees it
    return;
  }
  if (rc != IBMSG_EAGAIN && rc != IBMSG_EOPNOTSUPP && rc != IBMSG_ENOTCONN && rc != IBMSG_ESTATE)
    FUZZ_FAIL("ibmsg_post_send: %s", ibmsg_err_name(rc));
  if (int f = ibmsg_free_msg(&o->m)) FUZZ_FAIL("freeing an unposted message: %s", ibmsg_err_name(f));
  o->attached = false;
}

void free_held(Run &r, size_t n) {
  while (n-- && !r.held.empty()) {
    ibmsg_buffer *m = r.held.front();
    r.held.pop_front();
    if (int rc = ibmsg_free_msg(m)) FUZZ_FAIL("ibmsg_free_msg of a held message: %s", ibmsg_err_name(rc));
  }
}

void command(Run &r, fuzz::Cursor &c) {
  const uint8_t op = c.u8();
  TRACE("command %u", op % 16);
  switch (op % 16) {
    case 0:
    case 1: {  // a data message, with or without immediate
      const uint8_t fl = c.u8();
      const bool with_imm = op % 16 == 1;
      size_t len;
      if (fl & 8) len = r.book.ib_eager + (c.u8() % 5) - 2;  // around the eager size
      else len = c.u16() % (kRawBufSize + 1);
      if (len > kRawBufSize - (with_imm ? wire::kImmTrailer : 0))
        len = kRawBufSize - (with_imm ? wire::kImmTrailer : 0);
      std::vector<uint8_t> p = payload(r, c, len);
      if (with_imm) {
        const uint32_t v = c.u32();
        for (int i = 0; i < 4; ++i) p.push_back(uint8_t(v >> (8 * i)));
      }
      const Fields f = fields(r, c, !(fl & 2), fl & 16);
      raw_send(r, compose(r, with_imm ? kOpDataImm : kOpData, f, fl & 4), p);
      break;
    }
    case 2: {  // credit-only
      const uint8_t fl = c.u8();
      const Fields f = fields(r, c, !(fl & 2), fl & 16);
      raw_send(r, compose(r, kOpCredit, f, fl & 4), {});
      break;
    }
    case 3: cmd_rts(r, c, false); break;
    case 4: cmd_rts(r, c, true); break;
    case 5: cmd_fin(r, c); break;
    case 6: {  // Return
      const uint8_t fl = c.u8();
      Fields f = owed(r, false);
      f.credits = 1 + c.u8() % 8;
      raw_send(r, compose(r, kOpReturn, f, fl & 4), {});
      break;
    }
    case 7: {  // anything: an immediate and a payload straight from the input
      const uint32_t imm = c.u32();
      const size_t len = c.u16() % (kRawBufSize + 1);
      std::vector<uint8_t> p(len);
      c.bytes(p.data(), std::min<size_t>(len, 64));
      raw_send(r, imm, p);
      break;
    }
    case 8: {  // an RDMA write with immediate, of no bytes (the fake checks no key then)
      const uint32_t imm = c.u32();
      if (r.book.disconnected) break;
      pump(r);
      Book &b = r.book;
      if (!b.rdma) b.breaks("a write with immediate without one-sided RDMA agreed");
      if (b.data <= 0) b.breaks("a write with immediate without a data credit");
      --b.data;
      const bool honest = b.claims();
      const unsigned long faults = transport_faults();
      if (r.raw->write_imm(imm, 0, 0, nullptr, 0) != IBMSG_OK) {
        b.known = false;
        break;
      }
      if (honest && transport_faults() != faults)
        FUZZ_FAIL("a write with immediate of the honest peer found no receive");
      r.writes.push_back(imm);
      break;
    }
    case 9: {  // a message without immediate
      const size_t len = c.u8();
      std::vector<uint8_t> p(len);
      c.bytes(p.data(), std::min<size_t>(len, 16));
      if (r.book.disconnected) break;
      pump(r);
      r.book.breaks("a message without immediate");
      r.raw->send_without_imm(p.data(), len);
      break;
    }
    case 10: free_held(r, 1 + c.u8() % 4); break;
    case 11: cmd_app_send(r, c); break;
    case 12: settle(r, 1 + c.u8() % 8); break;
    case 13:
      if (!r.book.disconnected) {
        pump(r);
        r.book.disconnected = true;
        r.raw->disconnect();
      }
      break;
    case 14:
      if (r.acc && !r.acc->closed && ibmsg_disconnect(&r.acc->s) == IBMSG_OK)
        r.book.app_disconnected = true;
      break;
    case 15: r.hold = !r.hold; break;
  }
}

// --- setting up --------------------------------------------------------------------------------

ibmsg_options *make_options(Run &r, fuzz::Cursor &c, uint8_t cfg, uint8_t cfg2) {
  ibmsg_options *o = ibmsg_options_new(&r.loop);
  FUZZ_CHECK(o);
  auto set = [o](int opt, int v) {
    if (int rc = ibmsg_options_set(o, opt, &v, sizeof v))
      FUZZ_FAIL("ibmsg_options_set(%d, %d): %s", opt, v, ibmsg_err_name(rc));
  };
  const uint8_t sizes = c.u8();
  static const int kEager[] = {16, 64, 512, 4000};
  static const int kTimes[] = {1, 3, 16, 64};
  const int eager = kEager[sizes & 3];
  const int max = std::min(eager * kTimes[sizes >> 2 & 3], 1 << 18);
  set(IBMSG_OPT_RECV_DEPTH, 1 + (cfg & 7));
  set(IBMSG_OPT_SHARED_RECV, cfg >> 3 & 1);
  set(IBMSG_OPT_RDMA, !(cfg >> 4 & 1));
  set(IBMSG_OPT_EAGER_SIZE, eager);
  set(IBMSG_OPT_MAX_MSG_SIZE, max);
  set(IBMSG_OPT_SEND_DEPTH, 1 + (sizes >> 4 & 3));
  set(IBMSG_OPT_SEND_QUEUE, 4);
  // Adaptive busy polling (IBMSG_BUSY_POLL_ALWAYS would spin 1 ms in every round of the loop).
  static const int kBusyPoll[] = {0, 1, 20, 0};
  set(IBMSG_OPT_BUSY_POLL, kBusyPoll[cfg2 >> 2 & 3]);
  return o;
}

// The raw peer's hello: within what its 32 buffers of 4096 bytes take (depth and control depth
// together at most 32, the eager maximum leaves room for a trailer), so that ibmsg keeping to
// it never overruns them.
wire::Hello raw_hello(fuzz::Cursor &c) {
  wire::Hello h;
  h.features = c.u8();  // bits this side may not know too; mostly the 1.3 ones
  if (h.features & 0x80) h.features &= kKnownFeatures;
  h.recv_depth = 1 + c.u8() % 16;
  h.ctrl_depth = 1 + c.u8() % 8;
  h.max_msg_size = 1 + c.u16() % (kRawBufSize - wire::kMaxTrailer);
  const uint8_t sel = c.u8();
  static const uint32_t kRndv[] = {0, 1, 4, 1024};
  h.rndv_max_size = kRndv[sel & 3] ? h.max_msg_size * kRndv[sel & 3] : 0;
  const uint32_t room = kRawBufs - h.recv_depth - h.ctrl_depth;
  h.cap = sel & 4 ? h.recv_depth + (sel >> 3) % (room + 1) : 0;
  // Requests (1.5) need a session: with it, the peer's Requests and Replies (command 7) reach
  // the responder's and the requester's paths.
  if (h.features & wire::kFeatureRequest) h.session = 0x5e5510ull + h.features;
  return h;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fuzz::Cursor c(data, size);
  fake::reset();
  fake::set_max_srq_wr(16384);
  Run r;
  g_run = &r;
  r.transitions_before = ibmsg::invalid_transitions();
  const int fds_before = open_fds();
  const uint8_t cfg = c.u8();
  const uint8_t cfg2 = c.u8();
  fake::set_max_msg_size(cfg2 & 1 ? 8192 : uint64_t(1) << 20);
  FUZZ_CHECK(ibmsg_init_event_loop(&r.loop) == IBMSG_OK);
  r.loop_alive = true;
  r.loop.connection_request = on_request;
  r.loop.connection_established = on_established;
  r.loop.message_received = on_received;
  r.loop.message_sent = on_sent;
  r.loop.connection_closed = on_closed;
  r.loop.write_received = on_write_received;
  if (cfg >> 5 & 1) r.loop.message_incoming = on_incoming;
  r.hold = cfg >> 7 & 1;
  for (int i = 0; i < 4; ++i) r.incoming_plan.push_back(c.u8());

  ibmsg_options *opts = make_options(r, c, cfg, cfg2);
  r.listener = &new_sock(r, "listener");
  // A fixed port: the fake's port numbers for port 0 run on across its resets (and wrap to 0
  // after some 45000 listeners).
  FUZZ_CHECK(ibmsg_listen_opts(&r.loop, &r.listener->s, nullptr, 18515, 4, opts) == IBMSG_OK);
  r.listener->opened = true;
  unsigned short port = 0;
  FUZZ_CHECK(ibmsg_socket_local_address(&r.listener->s, nullptr, 0, &port) == IBMSG_OK);
  if (r.loop.message_incoming) {
    FUZZ_CHECK(ibmsg_register_region(&r.loop, &r.region, region_memory(), kRegionSize,
                                     IBMSG_ACCESS_LOCAL_WRITE) == IBMSG_OK);
    r.have_region = true;
  }

  // The witness: an ibmsg connection to the same listener (same options: the same shared pool).
  if (cfg >> 6 & 1) {
    r.wit_client = &new_sock(r, "witness client");
    r.wit_acc = &new_sock(r, "witness accepted");
    r.accept_into = r.wit_acc;
    if (int rc = ibmsg_connect_opts(&r.loop, &r.wit_client->s, "127.0.0.1", port, opts))
      FUZZ_FAIL("the witness cannot connect: %s", ibmsg_err_name(rc));
    r.wit_client->opened = true;
    if (!run_until(r, [&r] { return r.wit_client->established && r.wit_acc->established; }, 50))
      FUZZ_FAIL("the witness connection did not come up");
  }

  // The raw peer: its hello from the input, or (cfg2 bit 1) any private data. It connects to the
  // listener, or (cfg2 bit 4) listens and accepts ibmsg's connect with it.
  const bool client = cfg2 & 16;
  r.raw = std::make_unique<Raw>(kRawBufs, kRawBufSize);
  r.acc = &new_sock(r, client ? "connecting" : "accepted");
  std::vector<uint8_t> pdata(wire::kHelloSize);
  wire::Hello rh = raw_hello(c);
  if (cfg2 & 2) {
    r.raw_lies = true;
    pdata.resize(8 + c.u8() % 49);
    c.bytes(pdata.data(), pdata.size());
  } else {
    wire::encode_hello(rh, pdata.data());
  }
  std::vector<uint8_t> padded(pdata);
  padded.resize(56, 0);  // as the transport carries it
  wire::Hello peer;
  const bool hello_ok =
      wire::decode_hello(padded.data(), padded.size(), &peer) == wire::HelloResult::Ok;
  if (client) {
    FUZZ_CHECK(r.raw->listen(18516) == IBMSG_OK);
    if (int rc = ibmsg_connect_opts(&r.loop, &r.acc->s, "127.0.0.1", 18516, opts))
      FUZZ_FAIL("ibmsg_connect_opts: %s", ibmsg_err_name(rc));
    r.acc->opened = true;
    if (!run_until(r, [&r] { return r.raw->state() == Raw::State::Requested; }, 50))
      FUZZ_FAIL("ibmsg's connect request did not arrive");
    FUZZ_CHECK(r.raw->accept(pdata.data(), pdata.size()) == IBMSG_OK);
    run_until(r, [&r] { return r.acc->established || r.acc->closed; }, 50);
  } else {
    r.accept_into = r.acc;
    FUZZ_CHECK(r.raw->connect(port, pdata.data(), pdata.size()) == IBMSG_OK);
    run_until(r, [&r] {
      return (r.raw->state() == Raw::State::Established && r.acc->established) ||
             r.raw->state() == Raw::State::Rejected;
    }, 50);
  }
  const bool up = r.raw->state() == Raw::State::Established && r.acc->established && !r.acc->closed;
  if (hello_ok && !up) FUZZ_FAIL("a connection with a valid hello did not come up");
  if (!hello_ok && client) {
    // The connecting side refuses the accept's hello: it closes with IBMSG_EPROTO.
    if (up || r.acc->established) FUZZ_FAIL("a connection with an invalid hello came up");
    if (!r.acc->closed || r.acc->reason != IBMSG_EPROTO)
      FUZZ_FAIL("ibmsg did not close at an invalid hello with IBMSG_EPROTO (%s)",
                r.acc->closed ? ibmsg_err_name(r.acc->reason) : "open");
  } else if (!hello_ok) {
    if (up || r.requests > (r.wit_acc ? 1 : 0)) FUZZ_FAIL("a connection with an invalid hello was taken");
    if (r.raw->state() != Raw::State::Rejected) FUZZ_FAIL("a connection with an invalid hello was not refused");
    char text[wire::kRejectTextMax + 1];
    if (!wire::decode_reject(r.raw->event_pdata().data(), r.raw->event_pdata().size(), text,
                             sizeof text))
      FUZZ_FAIL("the refusal carries no ibmsg reject text");
  }

  if (up) {
    // The book: both hellos.
    wire::Hello mine;
    const std::vector<uint8_t> &acc_pdata = r.raw->event_pdata();
    if (wire::decode_hello(acc_pdata.data(), acc_pdata.size(), &mine) != wire::HelloResult::Ok)
      FUZZ_FAIL("ibmsg accepted with no valid hello");
    Book &b = r.book;
    b.features = mine.features & peer.features;
    b.known = (b.features & ~kKnownFeatures) == 0;  // a feature the model does not know
    b.rndv = (b.features & wire::kFeatureRndv) && peer.rndv_max_size && mine.rndv_max_size;
    b.shared = b.features & wire::kFeatureShared;
    b.imm = b.features & wire::kFeatureImm;
    b.rdma = b.features & wire::kFeatureRdma;
    b.ib_eager = mine.max_msg_size;
    b.ib_max = b.rndv ? mine.rndv_max_size : mine.max_msg_size;
    b.raw_max = b.rndv ? peer.rndv_max_size : peer.max_msg_size;
    b.data = mine.recv_depth;
    b.ctrl = mine.ctrl_depth;
    b.ib_data = peer.recv_depth;
    b.ib_ctrl = peer.ctrl_depth;
    b.active = true;
    TRACE("up: features 0x%x (rndv %d, shared %d, imm %d, rdma %d); ibmsg's hello: depth %u, cap "
          "%u, eager %u, max %u; the peer's: depth %u, ctrl %u, cap %u, eager %u, max %u%s",
          b.features, b.rndv, b.shared, b.imm, b.rdma, mine.recv_depth, mine.cap,
          mine.max_msg_size, mine.rndv_max_size, peer.recv_depth, peer.ctrl_depth, peer.cap,
          peer.max_msg_size, peer.rndv_max_size, b.known ? "" : " (beyond the model)");
    process_ibmsg_messages(r);
    for (int n = 0; n < kMaxCommands && !c.empty(); ++n) {
      command(r, c);
      settle(r, 3);
    }
    settle(r, 20);
    TRACE("end: %s, %zu messages sent, %lu delivered, %s", b.state(), r.expect.size(), r.delivered,
          r.acc->closed ? ibmsg_err_name(r.acc->reason) : "up");
    // ibmsg holds all its control credits (the peer returned every one): nothing it owes the
    // peer (data credits, done counts, the FIN of a declined message, with the reads behind it)
    // may wait then (credits.hpp: "a peer never waits for credits that exist").
    const bool ctrl_back = b.owed_ctrl == 0;
    if (b.claims()) {
      if (r.acc->closed) FUZZ_FAIL("the connection to an honest peer closed");
      size_t missing = 0;
      for (size_t i = r.next_deliver; i < r.expect.size(); ++i) missing += !r.expect[i].declined;
      if (missing && ctrl_back)
        FUZZ_FAIL("%zu messages of the honest peer were not delivered (%zu sent, %lu delivered)",
                  missing, r.expect.size(), r.delivered);
      if (!r.writes.empty()) FUZZ_FAIL("%zu writes with immediate not reported", r.writes.size());
      if (ctrl_back) {
        // The application frees everything: the peer gets data credits back and learns which
        // of its rendezvous messages are done.
        free_held(r, SIZE_MAX);
        settle(r, 10);
        if (!b.claims()) FUZZ_FAIL("the connection to an honest peer closed");
        if (b.data <= 0)
          FUZZ_FAIL("the honest peer has no data credit left, though the application holds "
                    "nothing and ibmsg holds all its %u control credits", peer.ctrl_depth);
        if (!b.raw_rts.empty())
          FUZZ_FAIL("%zu rendezvous messages of the honest peer are not counted done or declined, "
                    "though ibmsg holds all its %u control credits", b.raw_rts.size(),
                    peer.ctrl_depth);
      }
    } else if (b.known && b.broke && !r.acc->closed &&
               (ctrl_back || strcmp(b.broke_why, "an RTS ibmsg cannot read") != 0)) {
      // (An RTS behind a declined one is read once the FIN went, which may wait for a control
      // credit the peer owes.)
      FUZZ_FAIL("the peer broke the protocol (%s) and the connection stays up", b.broke_why);
    }
  }

  // The witness still works: a message each way.
  if (r.wit_client && !r.wit_client->closed && !r.wit_acc->closed) {
    check_shared_pool(r.wit_acc);
    for (Sock *from : {r.wit_client, r.wit_acc}) {
      ibmsg_buffer m{};
      if (ibmsg_alloc_msg(&m, &from->s, 8) != IBMSG_OK) FUZZ_FAIL("the witness cannot allocate");
      memset(m.data, 1, 8);
      if (int rc = ibmsg_post_send(&from->s, &m)) FUZZ_FAIL("the witness cannot send: %s", ibmsg_err_name(rc));
      settle(r, 5);
      if (m.status != IBMSG_SENT) FUZZ_FAIL("a witness message did not arrive");
      if (ibmsg_free_msg(&m) != IBMSG_OK) FUZZ_FAIL("freeing a witness message failed");
    }
    if (r.wit_client->closed || r.wit_acc->closed) FUZZ_FAIL("the witness connection closed");
  }

  // Teardown: the raw peer goes (its registrations first), then everything of ibmsg's.
  r.book.disconnected = true;
  for (Chunk &ch : r.chunks) tp::mr_deregister(ch.mr);
  r.raw->close();
  run_until(r, [&r] { return !r.acc->opened || r.acc->closed; }, 100);
  if (r.acc->opened && !r.acc->closed) FUZZ_FAIL("the connection did not close after the peer went");
  for (Sock *s : {r.wit_client, r.listener})
    if (s && !s->closed) ibmsg_disconnect(&s->s);
  run_until(r, [&r] {
    for (const Sock &s : r.socks)
      if (s.opened && !s.closed) return false;
    return true;
  }, 100);
  for (const Sock &s : r.socks) {
    if (s.opened && s.closed != 1) FUZZ_FAIL("%s socket: %d closed callbacks", s.name, s.closed);
    if (!s.opened && s.closed) FUZZ_FAIL("%s socket: closed but never set up", s.name);
    if (s.after_close) FUZZ_FAIL("%s socket: %d callbacks after closed", s.name, s.after_close);
    if (s.closed && s.disconnect_in_closed != IBMSG_ENOTCONN)
      FUZZ_FAIL("%s socket: ibmsg_disconnect in its closed callback: %s", s.name,
                ibmsg_err_name(s.disconnect_in_closed));
  }
  free_held(r, SIZE_MAX);
  for (Out &o : r.outs) {
    if (o.sent_cbs != o.posts)
      FUZZ_FAIL("a message posted %d times got %d message_sent", o.posts, o.sent_cbs);
    if (o.attached) FUZZ_FAIL("a posted message is still allocated after its message_sent");
  }
  if (r.have_region && ibmsg_deregister_region(&r.region) != IBMSG_OK)
    FUZZ_FAIL("the region stays busy");
  ibmsg_options_free(opts);
  if (int rc = ibmsg_destroy_event_loop(&r.loop)) FUZZ_FAIL("ibmsg_destroy_event_loop: %s", ibmsg_err_name(rc));
  r.raw.reset();
  const std::string left = fake::open_objects_text();
  if (!left.empty()) FUZZ_FAIL("left open in the transport: %s", left.c_str());
  const fake::Stats &st = fake::stats();
  if (st.misuses) FUZZ_FAIL("%lu misuses of the transport, the first: %s", st.misuses, st.first_misuse.c_str());
  if (ibmsg::invalid_transitions() != r.transitions_before) FUZZ_FAIL("invalid state transitions");
  if (open_fds() != fds_before) FUZZ_FAIL("%d file descriptors open before, %d after", fds_before, open_fds());
  g_run = nullptr;
  return 0;
}
