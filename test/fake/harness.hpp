// harness.hpp - the fixture of the unit tests that run the core over the fake transport
// (test_connection, test_onesided, test_rndv, test_shared_recv, test_poll), through the public C
// API: a fresh loop (and a second one when a test needs a second device) on a reset fake, the
// sockets a test opens with what their callbacks reported (Conn), raw peers, and a teardown that
// closes what the test left open and then checks what must hold after any scenario:
//   - each socket that was set up closed exactly once (lives times), never one that was not, no
//     callback after its closed callback;
//   - one message_sent per posted message, one done per posted one-sided operation, all of them
//     before connection_closed (sent_before_closed) and in posting order (sent_in_order);
//   - received messages in order and intact (by the payload kind the test sends, Payload);
//   - ibmsg_disconnect inside the closed callback says IBMSG_ENOTCONN (disconnect_in_closed);
//   - every region deregisters, the loops destroy, nothing is left open in the fake, no RNR, no
//     unexpected length error, no misuse of the transport and no invalid state transition.
// Every complaint is collected first and reported at once, so that a failed test still cleans up
// for the next one. A test file picks what differs (the H fields under "configuration") in its
// setup through fixture_setup.
#pragma once
#include <csetjmp>
#include <cstdarg>
#include <cstddef>
#include <cstdint>
extern "C" {  // cmocka.h 1.1 has no extern "C" of its own
#include <cmocka.h>
}

#include <deque>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "fake.hpp"
#include "ibmsg.h"
#include "wire.hpp"

#define expect_code(actual, expected)                                           \
  do {                                                                          \
    int a_ = (actual), e_ = (expected);                                         \
    if (a_ != e_)                                                               \
      fail_msg("%s: got %s (%d), expected %s", #actual, ibmsg_err_name(a_), a_, \
               ibmsg_err_name(e_));                                             \
  } while (0)

// Runs the loops until cond, failing the test with what the sockets did if it never comes true.
#define RUN_UNTIL(h, cond)                                                             \
  do {                                                                                 \
    if (!::ibmsg::fake::harness::run_until(h, [&] { return bool(cond); }))             \
      fail_msg("never happened: %s%s", #cond, ::ibmsg::fake::harness::state_text(h).c_str()); \
  } while (0)

namespace ibmsg::fake::harness {

using Raw = RawPeer;

// What the messages of a test carry and how a receiver checks them.
enum class Payload {
  Seq,        // the sender's sequence number, then its low byte repeated; both checked
  SeqNumber,  // the same; only the number is checked (a shorter message counts as one)
  Pattern,    // message k of a connection: pattern_word(k, ...) (fill_pattern), byte for byte
  Stream,     // message k: size_of(k) bytes of pattern_byte(k, i)
};

// The Pattern payload: every 4-byte word differs from its neighbours and from the same word of
// other messages, so a chunk read to the wrong place or a message out of order shows.
uint32_t pattern_word(uint64_t k, size_t w);
void fill_pattern(void *data, size_t n, uint64_t k);
// The offset of the first byte that differs from message k's pattern; n if none does.
size_t pattern_mismatch(const void *data, size_t n, uint64_t k);
// The Stream payload: sizes from 1 byte to the eager size, bytes that depend on k.
inline size_t size_of(uint64_t k) { return k % 50 == 49 ? 16384 : 1 + (k * 977) % 3000; }
inline uint8_t pattern_byte(uint64_t k, size_t i) {
  return uint8_t((k * 131 + i * 7 + (i >> 8)) ^ 0x5a);
}

double now_ms();  // CLOCK_MONOTONIC

struct Conn;
struct H;

// A send buffer the test owns (it stays at its address while allocated).
struct Out {
  ibmsg_buffer m{};
  bool allocated = false;
  int posts = 0;     // successful posts
  int sent_cbs = 0;  // message_sent callbacks
  int seq = -1;      // the connection's posting number of its last post
  int id = -1;       // the message's number on its connection
};

// A received message the application holds, and its number on the connection.
struct Held {
  ibmsg_buffer *m;
  uint64_t k;
  operator ibmsg_buffer *() const { return m; }
};

// A one-sided operation the test owns (at the same address until its done callback).
struct OpRec {
  ibmsg_op op{};
  int id = 0;
  Conn *conn = nullptr;
  int posts = 0, dones = 0;
  int status = -1;        // what done got
  int status_field = -1;  // op.status inside done
  int seq = -1;           // the connection's posting number
  std::function<void()> when_done;
};

// A region the test owns.
struct Reg {
  ibmsg_region r{};
  bool live = false;
  std::vector<uint8_t> own;  // the memory of a registered (not allocated) region
  uint8_t *p() const { return static_cast<uint8_t *>(r.addr); }
};

// One ibmsg_socket and what its callbacks reported.
struct Conn {
  ibmsg_socket s{};
  H *h = nullptr;
  const char *name = "";
  bool opened = false;  // listen/connect/accept succeeded: one closed callback must follow
  int lives = 1;        // set-ups of this struct (it may be set up again once closed)
  unsigned short local_port = 0, peer_port = 0;  // when it was established
  int established = 0;
  int closed = 0;
  int close_reason = -1;
  int status_at_close = -1;
  int disconnect_in_closed = -1;  // what ibmsg_disconnect said inside the closed callback
  int sent_at_close = -1;         // message_sent callbacks before the closed callback
  int after_close = 0;            // callbacks after the closed callback (must stay 0)
  std::function<void()> when_closed;  // runs inside the closed callback
  // posting order: every successful post (message or operation) takes the next number, every
  // message_sent / done must come with the next expected one
  int next_post = 0, next_cb = 0, bad_cb_order = 0;
  int ops_posted = 0, ops_done = 0, ops_done_at_close = -1, msgs_done_at_close = -1;
  int msgs_posted = 0, msgs_done = 0;
  std::string trace;  // "op0=OK msg1=ECANCELED closed=OK ..."
  // sending
  std::deque<Out> outs;
  uint64_t next_send_seq = 0;
  int sent_ok = 0, sent_canceled = 0, sent_other = 0;  // by status; each sent buffer is freed
  int free_errors = 0;           // send buffers of failed posts that did not free
  std::vector<size_t> tx_sizes;  // by message number
  std::vector<int> tx_status;    // by message number: what message_sent said (-1: nothing yet)
  std::function<void(int id, int status)> on_sent_hook;
  // receiving
  bool verify = true;  // Pattern / Stream: received messages carry it (not from a raw peer)
  bool hold = false;   // keep received messages until the test frees them
  std::deque<Held> held;
  uint64_t received = 0;
  uint64_t next_seq = 0;
  int bad_order = 0;    // Seq: out of order, duplicated or corrupted
  int bad_payload = 0;  // Pattern / Stream
  std::string first_bad;
  std::string last_payload;  // Seq, SeqNumber
  double last_rx_ms = 0;
  std::vector<std::pair<unsigned, uint32_t>> rx_imm;  // (flags, imm) of each received message
  std::vector<size_t> rx_sizes;
  std::function<void(ibmsg_buffer *)> on_msg;  // inside message_received, before hold / free
  // replies sent from message_received (ping-pong)
  int replies_left = 0;
  int reply_errors = 0;
  uint64_t disconnect_at = 0;  // > 0: ibmsg_disconnect inside the callback of that message
  int disconnect_rc = -1;
  std::function<void()> on_rx;  // inside message_received, last
  // white-box records of message_received, for the test's rx_probe
  int rx_armed = 0;
  bool rx_seen = false;
  CqInfo rx_first{}, rx_last{};
  int rx_polling = 0;
  int rx_unread = 0;
  // write-immediates received
  std::vector<uint32_t> write_imms;
  std::vector<size_t> write_lens;
  std::function<void(uint32_t, size_t)> on_write;
};

// What connection_request does.
enum class Policy { Accept, Reject, Leave, AcceptInto };

struct H {
  ibmsg_event_loop loop;
  bool loop_alive = false;
  ibmsg_event_loop loop2;  // a second loop, when a test needs a second device (init_loop)
  bool loop2_alive = false;
  std::deque<Conn> conns;  // a deque: references stay valid
  std::deque<OpRec> ops;
  std::deque<Reg> regs;
  std::deque<ibmsg_region> regions;  // deregistered by the teardown if still registered
  std::vector<std::unique_ptr<Raw>> raws;
  std::vector<ibmsg_options *> opts;
  // what connection_request does
  Policy policy = Policy::Accept;
  const char *reject_text = nullptr;
  ibmsg_options *accept_opts = nullptr;
  ibmsg_event_loop *accept_on = nullptr;  // Accept: with ibmsg_accept_on onto this loop
  Conn *accept_into = nullptr;
  bool hold_accepted = false;
  int requests = 0;
  int accept_rc = -1;
  std::vector<Conn *> accepted;
  unsigned long transitions_before = 0;         // ibmsg::invalid_transitions() at the start
  int inner_dispatch = -1, inner_destroy = -1;  // loop calls made from inside a callback
  unsigned long length_errors_expected = 0;     // a test that makes a peer lie about its buffers
  std::vector<Conn *> up, open, holding;        // a randomized test's (a failure leaks nothing)

  // --- configuration (fixture_setup's configure) ---
  Payload payload = Payload::Seq;
  bool disconnect_in_closed = false;  // call (and check) ibmsg_disconnect in connection_closed
  bool sent_in_order = false;         // message_sent / done in posting order per connection
  bool sent_before_closed = false;    // every message_sent before connection_closed
  int max_rounds = 400;               // run_until's default
  int settle_rounds = 10;             // settle's default
  int backlog = 8;                    // listener's default max_conn
  uint32_t raw_recv_bufs = 32;        // new_raw's default
  // Runs first in message_received (after the counting), e.g. to record white-box state.
  std::function<void(Conn &, ibmsg_buffer *)> rx_probe;
  // More checks of the teardown, while the loop still lives (after everything closed).
  std::function<void(H *, std::string *errs)> extra_checks;
};

inline H *h_of(void **state) { return static_cast<H *>(*state); }

// "ECANCELED" for IBMSG_ECANCELED.
std::string short_name(int code);
void add_trace(Conn *c, const std::string &what);

// --- callbacks (set on every loop of the fixture) ---
void on_request(ibmsg_connection_request *req);
void on_established(ibmsg_socket *s);
void on_received(ibmsg_socket *s, ibmsg_buffer *m);
void on_sent(ibmsg_socket *s, ibmsg_buffer *m, int status);
void on_closed(ibmsg_socket *s, int reason);
void on_done(ibmsg_socket *s, ibmsg_op *op, int status);  // an OpRec's
void on_write_received(ibmsg_socket *s, uint32_t imm, size_t len);

// --- setup and teardown ---

// Resets the fake, makes the fixture with its loop, lets configure set it up (a non-zero return
// fails the setup), notes the invalid transitions so far.
int fixture_setup(void **state, const std::function<int(H *)> &configure = nullptr);
int teardown(void **state);
// Initializes l (h->loop2, or h->loop) with the fixture's callbacks and marks it alive.
void init_loop(H *h, ibmsg_event_loop *l);

// --- driving the loops ---

// One round: pumps the raw peers, dispatches the loop (and the second one, without waiting).
void dispatch_once(H *h, int timeout_ms);

// Runs the loops (and pumps the raw peers) until done() or max_rounds rounds (<= 0: the
// fixture's max_rounds).
template <class F>
bool run_until(H *h, F done, int max_rounds = 0, int timeout_ms = 1) {
  if (max_rounds <= 0) max_rounds = h->max_rounds;
  for (int i = 0; i < max_rounds; ++i) {
    for (auto &r : h->raws) r->pump();
    if (done()) return true;
    dispatch_once(h, timeout_ms);
  }
  for (auto &r : h->raws) r->pump();
  return done();
}

// What the sockets did, for a condition that never came true.
std::string state_text(H *h);
// Lets whatever is pending happen (rounds <= 0: the fixture's settle_rounds).
void settle(H *h, int rounds = 0);

// --- sockets ---

Conn &new_conn(H *h, const char *name);
Raw *new_raw(H *h, uint32_t recv_bufs = 0, uint32_t buf_size = 4096);  // 0: h->raw_recv_bufs
ibmsg_options *options(H *h, std::initializer_list<std::pair<int, int>> values);
unsigned short port_of(Conn &l);
Conn &listener(H *h, const ibmsg_options *o = nullptr, int max_conn = 0);  // 0: h->backlog
Conn &client(H *h, unsigned short port, const ibmsg_options *o = nullptr,
             ibmsg_event_loop *loop = nullptr);
Conn &client(H *h, unsigned short port, const ibmsg_options *o, const char *ip);

struct Pair {
  Conn *l, *c, *a;  // listener, client, accepted
};
// A client of listener l (on loop, default h->loop), both sides established.
Pair connect_to(H *h, Conn &l, const ibmsg_options *co = nullptr, ibmsg_event_loop *loop = nullptr);
// A listener and a connection to it: the accepted side takes the listener's options (lo), or
// h->accept_opts if set.
Pair connected(H *h, const ibmsg_options *lo = nullptr, const ibmsg_options *co = nullptr,
               ibmsg_event_loop *client_loop = nullptr);

// --- messages ---

// Fills m as the connection's message k (Seq: number k).
void fill(ibmsg_buffer *m, uint64_t k, Payload kind = Payload::Seq);
// A posting call succeeded: it takes the connection's next posting number.
inline int take_post(Conn &c) { return c.next_post++; }
// Allocates a send buffer of size bytes filled as the connection's next message; nullptr with
// *rc if the allocation failed.
Out *alloc_out(Conn &c, size_t size, int *rc);
// The bookkeeping of a successful post of o: the connection's next message.
void note_post(Conn &c, Out &o);
// Posts o (its size as it is now) as the connection's next message; the code of the call.
int post_out(Conn &c, Out &o, bool with_imm = false, uint32_t imm = 0);
// Allocates, fills and posts one message (with an immediate if with_imm); the code of the call
// that failed (its buffer is freed again then). Calls no cmocka check: it runs in callbacks too.
int send_msg(Conn &c, size_t size, bool with_imm = false, uint32_t imm = 0);
// The connection's next Stream message (size_of its number).
int send_next(Conn &c);
// Checks a received message k against the payload (Pattern, Stream; nothing for the others).
void check_payload(Conn *c, const ibmsg_buffer *m, uint64_t k, const char *when);
void note_bad(Conn *c, const std::string &what);
// Frees n held messages (all by default), checking each is still intact.
void free_held(Conn &c, size_t n = SIZE_MAX);

// --- raw peers ---

struct RawPair {
  Raw *r;
  Conn *l, *a;
  wire::Hello mine{};  // the ibmsg side's hello (where the test decodes it)
};
// A raw client that connects to listener l with pdata and is established on both sides (the
// accepted socket expects no payload pattern from it).
RawPair raw_connect(H *h, Conn &l, const void *pdata, size_t len);
// A raw client connected to an ibmsg listener whose connections post recv_depth buffers for data;
// the accepted socket holds what it receives.
RawPair raw_client(H *h, const wire::Hello &hello, int recv_depth = 4,
                   std::initializer_list<std::pair<int, int>> more = {});

}  // namespace ibmsg::fake::harness
