// harness.cpp - the fixture of the unit tests over the fake transport (harness.hpp).
#include "harness.hpp"

#include <time.h>

#include <cstdio>
#include <cstring>

#include "internal.hpp"
#include "errors.hpp"    // ibmsg::invalid_transitions

namespace ibmsg::fake::harness {

// --- payloads ---

uint32_t pattern_word(uint64_t k, size_t w) {
  uint32_t x = uint32_t(w) * 0x9e3779b1u ^ (uint32_t(k) * 0x85ebca77u + 0x27d4eb2fu);
  x ^= uint32_t(uint64_t(w) >> 32);
  x ^= x >> 15;
  x *= 0x2c1b3c6du;
  x ^= x >> 12;
  x *= 0x297a2d39u;
  x ^= x >> 15;
  return x;
}

void fill_pattern(void *data, size_t n, uint64_t k) {
  auto p = static_cast<uint8_t *>(data);
  for (size_t i = 0; i < n; i += 4) {
    const uint32_t x = pattern_word(k, i / 4);
    memcpy(p + i, &x, n - i < 4 ? n - i : 4);
  }
}

size_t pattern_mismatch(const void *data, size_t n, uint64_t k) {
  if (n && !data) return 0;
  auto p = static_cast<const uint8_t *>(data);
  for (size_t i = 0; i < n; i += 4) {
    const uint32_t x = pattern_word(k, i / 4);
    const size_t m = n - i < 4 ? n - i : 4;
    if (memcmp(p + i, &x, m) == 0) continue;
    const auto *xb = reinterpret_cast<const uint8_t *>(&x);
    for (size_t j = 0; j < m; ++j)
      if (p[i + j] != xb[j]) return i + j;
  }
  return n;
}

double now_ms() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return double(ts.tv_sec) * 1e3 + double(ts.tv_nsec) / 1e6;
}

void fill(ibmsg_buffer *m, uint64_t k, Payload kind) {
  auto p = static_cast<uint8_t *>(m->data);
  switch (kind) {
    case Payload::Pattern: fill_pattern(m->data, m->size, k); return;
    case Payload::Stream:
      for (size_t i = 0; i < m->size; ++i) p[i] = pattern_byte(k, i);
      return;
    case Payload::Seq:
    case Payload::SeqNumber:
      if (m->size >= 8) memcpy(p, &k, 8);
      for (size_t i = 8; i < m->size; ++i) p[i] = uint8_t(k);
      return;
  }
}

void note_bad(Conn *c, const std::string &what) {
  if (c->bad_payload++ == 0) c->first_bad = what;
}

void check_payload(Conn *c, const ibmsg_buffer *m, uint64_t k, const char *when) {
  if (!c->verify) return;
  char buf[160];
  if (c->h->payload == Payload::Pattern) {
    const size_t bad = pattern_mismatch(m->data, m->size, k);
    if (bad == m->size) return;
    snprintf(buf, sizeof buf, "message %llu of %zu bytes %s: byte %zu differs",
             (unsigned long long)k, m->size, when, bad);
    note_bad(c, buf);
  } else if (c->h->payload == Payload::Stream) {
    bool ok = m->size == size_of(k);
    auto *d = static_cast<const uint8_t *>(m->data);
    for (size_t i = 0; ok && i < m->size; ++i) ok = d[i] == pattern_byte(k, i);
    if (ok) return;
    snprintf(buf, sizeof buf, "message %llu of %zu bytes wrong %s", (unsigned long long)k,
             m->size, when);
    note_bad(c, buf);
  }
}

// Seq, SeqNumber: the number in the first 8 bytes follows the last one (and the bytes after it
// are its low byte).
static void check_seq(Conn *c, const ibmsg_buffer *m) {
  if (m->size < 8) {
    if (c->h->payload == Payload::SeqNumber) ++c->next_seq;  // too short for its number
    return;
  }
  uint64_t seq;
  memcpy(&seq, m->data, 8);
  if (seq != c->next_seq) ++c->bad_order;
  c->next_seq = seq + 1;
  if (c->h->payload != Payload::Seq) return;
  auto p = static_cast<const uint8_t *>(m->data);
  for (size_t i = 8; i < m->size; ++i)
    if (p[i] != uint8_t(seq)) {
      ++c->bad_order;
      break;
    }
}

std::string short_name(int code) {
  std::string n = ibmsg_err_name(code);
  return n.compare(0, 6, "IBMSG_") == 0 ? n.substr(6) : n;
}

void add_trace(Conn *c, const std::string &what) {
  if (!c->trace.empty()) c->trace += ' ';
  c->trace += what;
}

// A message_sent or done with posting number seq arrived.
static void check_cb_order(Conn *c, int seq) {
  if (seq != c->next_cb) ++c->bad_cb_order;
  c->next_cb = seq + 1;
}

// --- callbacks ---

void on_request(ibmsg_connection_request *req) {
  H *h = static_cast<H *>(req->loop->user_data);
  ++h->requests;
  switch (h->policy) {
    case Policy::Reject: expect_code(ibmsg_reject(req, h->reject_text), IBMSG_OK); return;
    case Policy::Leave: return;
    case Policy::AcceptInto: h->accept_rc = ibmsg_accept(req, &h->accept_into->s); return;
    case Policy::Accept: break;
  }
  Conn &c = new_conn(h, "accepted");
  c.hold = h->hold_accepted;
  h->accept_rc = h->accept_on ? ibmsg_accept_on(req, h->accept_on, &c.s, h->accept_opts)
                              : ibmsg_accept_opts(req, &c.s, h->accept_opts);
  if (h->accept_rc == IBMSG_OK) {
    c.opened = true;
    h->accepted.push_back(&c);
  }
}

static Conn *conn_of(ibmsg_socket *s) {
  Conn *c = static_cast<Conn *>(s->user_data);
  if (c->closed >= c->lives) ++c->after_close;
  return c;
}

void on_established(ibmsg_socket *s) {
  Conn *c = conn_of(s);
  ++c->established;
  ibmsg_socket_local_address(s, nullptr, 0, &c->local_port);
  ibmsg_socket_peer_address(s, nullptr, 0, &c->peer_port);
}

void on_received(ibmsg_socket *s, ibmsg_buffer *m) {
  Conn *c = conn_of(s);
  H *h = c->h;
  const uint64_t k = c->received++;
  c->last_rx_ms = now_ms();
  c->rx_imm.emplace_back(m->flags, m->imm);
  c->rx_sizes.push_back(m->size);
  if (h->rx_probe) h->rx_probe(*c, m);
  if (h->payload == Payload::Seq || h->payload == Payload::SeqNumber) {
    c->last_payload.assign(static_cast<const char *>(m->data), m->size);
    check_seq(c, m);
  } else {
    if (h->payload == Payload::Pattern && m->status != IBMSG_RECEIVED)
      note_bad(c, "message " + std::to_string(k) + " arrived with status " +
                      std::to_string(int(m->status)));
    check_payload(c, m, k, "on arrival");
  }
  if (c->on_msg) c->on_msg(m);
  if (c->hold) {
    c->held.push_back(Held{m, k});
  } else if (int rc = ibmsg_free_msg(m)) {
    if (h->payload == Payload::Seq || h->payload == Payload::SeqNumber) ++c->bad_order;
    else note_bad(c, "freeing message " + std::to_string(k) + ": " + ibmsg_err_name(rc));
  }
  if (c->replies_left > 0) {
    --c->replies_left;
    if (send_msg(*c, 16) != IBMSG_OK) ++c->reply_errors;
  }
  if (c->disconnect_at && c->received == c->disconnect_at) c->disconnect_rc = ibmsg_disconnect(s);
  if (c->on_rx) c->on_rx();
}

void on_sent(ibmsg_socket *s, ibmsg_buffer *m, int status) {
  Conn *c = conn_of(s);
  Out *o = static_cast<Out *>(m->user_data);
  ++o->sent_cbs;
  ++c->msgs_done;
  check_cb_order(c, o->seq);
  add_trace(c, "msg" + std::to_string(o->id) + "=" + short_name(status));
  if (status == IBMSG_OK) ++c->sent_ok;
  else if (status == IBMSG_ECANCELED) ++c->sent_canceled;
  else ++c->sent_other;
  if (o->id >= 0 && size_t(o->id) < c->tx_status.size()) c->tx_status[size_t(o->id)] = status;
  const int id = o->id;
  if (ibmsg_free_msg(m) == IBMSG_OK) o->allocated = false;
  if (c->on_sent_hook) c->on_sent_hook(id, status);
}

void on_done(ibmsg_socket *s, ibmsg_op *op, int status) {
  Conn *c = conn_of(s);
  OpRec *o = static_cast<OpRec *>(op->user_data);
  ++o->dones;
  o->status = status;
  o->status_field = op->status;
  ++c->ops_done;
  if (o->conn != c) ++c->bad_cb_order;
  check_cb_order(c, o->seq);
  add_trace(c, "op" + std::to_string(o->id) + "=" + short_name(status));
  if (o->when_done) o->when_done();
}

void on_write_received(ibmsg_socket *s, uint32_t imm, size_t len) {
  Conn *c = conn_of(s);
  c->write_imms.push_back(imm);
  c->write_lens.push_back(len);
  if (c->on_write) c->on_write(imm, len);
}

void on_closed(ibmsg_socket *s, int reason) {
  Conn *c = static_cast<Conn *>(s->user_data);
  ++c->closed;
  c->close_reason = reason;
  c->status_at_close = s->status;
  c->sent_at_close = c->sent_ok + c->sent_canceled + c->sent_other;
  c->ops_done_at_close = c->ops_done;
  c->msgs_done_at_close = c->msgs_done;
  if (c->h->disconnect_in_closed) c->disconnect_in_closed = ibmsg_disconnect(s);
  add_trace(c, "closed=" + short_name(reason));
  if (c->when_closed) c->when_closed();
}

// --- the loops ---

// Initializes l with the fixture's callbacks; whether that worked.
static bool start_loop(H *h, ibmsg_event_loop *l) {
  if (ibmsg_init_event_loop(l) != IBMSG_OK) return false;
  (l == &h->loop ? h->loop_alive : h->loop2_alive) = true;
  l->user_data = h;
  l->connection_request = on_request;
  l->connection_established = on_established;
  l->message_received = on_received;
  l->message_sent = on_sent;
  l->connection_closed = on_closed;
  return true;
}

void init_loop(H *h, ibmsg_event_loop *l) {
  if (!start_loop(h, l)) fail_msg("ibmsg_init_event_loop failed");
}

void dispatch_once(H *h, int timeout_ms) {
  for (auto &r : h->raws) r->pump();
  ibmsg_dispatch_event_loop_timeout(&h->loop, timeout_ms);
  if (h->loop2_alive) ibmsg_dispatch_event_loop_timeout(&h->loop2, 0);
}

std::string state_text(H *h) {
  std::string s;
  for (Conn &c : h->conns) {
    if (!c.opened) continue;
    char buf[200];
    snprintf(buf, sizeof buf,
             "\n  %s (port %u, status %d): posted %d, sent_ok %d, done %d, received %llu: ", c.name,
             c.local_port, int(c.s.status), c.msgs_posted, c.sent_ok, c.msgs_done,
             (unsigned long long)c.received);
    s += buf;
    s += c.trace.size() > 300 ? "..." + c.trace.substr(c.trace.size() - 300) : c.trace;
  }
  return s;
}

void settle(H *h, int rounds) {
  run_until(h, [] { return false; }, rounds > 0 ? rounds : h->settle_rounds, 1);
}

// --- sockets ---

Conn &new_conn(H *h, const char *name) {
  Conn &c = h->conns.emplace_back();
  c.h = h;
  c.name = name;
  c.s.user_data = &c;
  return c;
}

Raw *new_raw(H *h, uint32_t recv_bufs, uint32_t buf_size) {
  if (!recv_bufs) recv_bufs = h->raw_recv_bufs;
  return h->raws.emplace_back(std::make_unique<Raw>(recv_bufs, buf_size)).get();
}

ibmsg_options *options(H *h, std::initializer_list<std::pair<int, int>> values) {
  ibmsg_options *o = ibmsg_options_new(&h->loop);
  if (!o) fail_msg("ibmsg_options_new failed");
  h->opts.push_back(o);
  for (auto &v : values)
    expect_code(ibmsg_options_set(o, v.first, &v.second, sizeof(int)), IBMSG_OK);
  return o;
}

unsigned short port_of(Conn &l) {
  unsigned short p = 0;
  expect_code(ibmsg_socket_local_address(&l.s, nullptr, 0, &p), IBMSG_OK);
  return p;
}

Conn &listener(H *h, const ibmsg_options *o, int max_conn) {
  Conn &l = new_conn(h, "listener");
  expect_code(ibmsg_listen_opts(&h->loop, &l.s, nullptr, 0, max_conn ? max_conn : h->backlog, o),
              IBMSG_OK);
  l.opened = true;
  return l;
}

static Conn &client_on(H *h, unsigned short port, const ibmsg_options *o, ibmsg_event_loop *loop,
                       const char *ip) {
  Conn &c = new_conn(h, "client");
  expect_code(ibmsg_connect_opts(loop ? loop : &h->loop, &c.s, ip, port, o), IBMSG_OK);
  c.opened = true;
  return c;
}

Conn &client(H *h, unsigned short port, const ibmsg_options *o, ibmsg_event_loop *loop) {
  return client_on(h, port, o, loop, "127.0.0.1");
}

Conn &client(H *h, unsigned short port, const ibmsg_options *o, const char *ip) {
  return client_on(h, port, o, nullptr, ip);
}

Pair connect_to(H *h, Conn &l, const ibmsg_options *co, ibmsg_event_loop *loop) {
  const size_t before = h->accepted.size();
  Conn &c = client(h, port_of(l), co, loop);
  RUN_UNTIL(h, c.established && h->accepted.size() > before && h->accepted.back()->established);
  return Pair{&l, &c, h->accepted.back()};
}

Pair connected(H *h, const ibmsg_options *lo, const ibmsg_options *co,
               ibmsg_event_loop *client_loop) {
  return connect_to(h, listener(h, lo), co, client_loop);
}

// --- messages ---

Out *alloc_out(Conn &c, size_t size, int *rc) {
  Out *o = nullptr;
  for (Out &x : c.outs)
    if (!x.allocated) {
      o = &x;
      break;
    }
  if (!o) o = &c.outs.emplace_back();
  *rc = ibmsg_alloc_msg(&o->m, &c.s, size);
  if (*rc) return nullptr;
  o->allocated = true;
  o->m.user_data = o;
  fill(&o->m, c.next_send_seq, c.h->payload);
  return o;
}

void note_post(Conn &c, Out &o) {
  ++o.posts;
  ++c.msgs_posted;
  o.seq = take_post(c);
  o.id = int(c.next_send_seq);
  c.tx_sizes.push_back(o.m.size);
  c.tx_status.push_back(-1);
  ++c.next_send_seq;
}

int post_out(Conn &c, Out &o, bool with_imm, uint32_t imm) {
  int rc = with_imm ? ibmsg_post_send_imm(&c.s, &o.m, imm) : ibmsg_post_send(&c.s, &o.m);
  if (rc) return rc;
  note_post(c, o);
  return IBMSG_OK;
}

int send_msg(Conn &c, size_t size, bool with_imm, uint32_t imm) {
  int rc;
  Out *o = alloc_out(c, size, &rc);
  if (!o) return rc;
  rc = post_out(c, *o, with_imm, imm);
  if (rc) {
    if (ibmsg_free_msg(&o->m) == IBMSG_OK) o->allocated = false;
    else ++c.free_errors;
  }
  return rc;
}

int send_next(Conn &c) { return send_msg(c, size_of(c.next_send_seq)); }

void free_held(Conn &c, size_t n) {
  for (; n && !c.held.empty(); --n) {
    Held x = c.held.front();
    c.held.pop_front();
    check_payload(&c, x.m, x.k, "when freed");
    expect_code(ibmsg_free_msg(x.m), IBMSG_OK);
  }
}

// --- raw peers ---

RawPair raw_connect(H *h, Conn &l, const void *pdata, size_t len) {
  Raw *r = new_raw(h);
  expect_code(r->connect(port_of(l), pdata, len), IBMSG_OK);
  RUN_UNTIL(h, r->state() == Raw::State::Established && !h->accepted.empty() &&
                   h->accepted.back()->established);
  h->accepted.back()->verify = false;  // a raw peer sends no pattern
  return RawPair{r, &l, h->accepted.back()};
}

RawPair raw_client(H *h, const wire::Hello &hello, int recv_depth,
                   std::initializer_list<std::pair<int, int>> more) {
  ibmsg_options *o = options(h, {{IBMSG_OPT_RECV_DEPTH, recv_depth}});
  for (auto &v : more) expect_code(ibmsg_options_set(o, v.first, &v.second, sizeof(int)), IBMSG_OK);
  Conn &l = listener(h, o);
  h->hold_accepted = true;
  uint8_t b[wire::kHelloSize];
  wire::encode_hello(hello, b);
  return raw_connect(h, l, b, sizeof b);
}

// --- setup and the checks after every test ---

int fixture_setup(void **state, const std::function<int(H *)> &configure) {
  reset();
  H *h = new H();
  if (!start_loop(h, &h->loop)) return -1;
  if (configure)
    if (int rc = configure(h)) return rc;
  h->transitions_before = ibmsg::invalid_transitions();
  *state = h;
  return 0;
}

// Adds one line to the teardown's complaints.
static void complain(std::string *errs, const char *fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  *errs += "\n  ";
  *errs += buf;
}

// What must hold of one socket after the test; frees what it still holds.
static void check_conn(H *h, Conn &c, bool all_closed, std::string *errs) {
  if (c.opened && c.closed != c.lives)
    complain(errs, "%s socket: %d closed callbacks, expected exactly %d%s", c.name, c.closed,
             c.lives, all_closed ? "" : " (it never closed)");
  if (!c.opened && c.closed)
    complain(errs, "%s socket that was never set up got a closed callback", c.name);
  if (c.after_close)
    complain(errs, "%s socket: %d callbacks after its closed callback", c.name, c.after_close);
  if (h->disconnect_in_closed && c.closed && c.disconnect_in_closed != IBMSG_ENOTCONN)
    complain(errs, "%s socket: ibmsg_disconnect inside its closed callback returned %s", c.name,
             ibmsg_err_name(c.disconnect_in_closed));
  if (c.bad_order)
    complain(errs, "%s socket: %d messages out of order or corrupted", c.name, c.bad_order);
  if (h->sent_in_order && c.bad_cb_order)
    complain(errs, "%s socket: %d message_sent/done callbacks out of posting order (%s)", c.name,
             c.bad_cb_order, c.trace.c_str());
  if (c.closed && c.ops_done_at_close != c.ops_posted)
    complain(errs, "%s socket: %d of %d done callbacks before its closed callback", c.name,
             c.ops_done_at_close, c.ops_posted);
  if (h->sent_before_closed && c.closed && c.msgs_done_at_close != c.msgs_posted)
    complain(errs, "%s socket: %d of %d message_sent callbacks before its closed callback",
             c.name, c.msgs_done_at_close, c.msgs_posted);
  if (c.reply_errors)
    complain(errs, "%s socket: %d replies failed to go out", c.name, c.reply_errors);
  // Still lent after the close: the payload must be intact until it is freed.
  for (const Held &x : c.held) {
    check_payload(&c, x.m, x.k, "when freed after the test");
    if (int rc = ibmsg_free_msg(x.m))
      complain(errs, "%s socket: freeing a received message: %s", c.name, ibmsg_err_name(rc));
  }
  c.held.clear();
  if (c.bad_payload)
    complain(errs, "%s socket: %d received messages wrong (%s)", c.name, c.bad_payload,
             c.first_bad.c_str());
  if (c.free_errors)
    complain(errs, "%s socket: %d send buffers of failed posts did not free", c.name,
             c.free_errors);
  for (Out &o : c.outs) {
    if (o.posts != o.sent_cbs)
      complain(errs, "%s socket: a message posted %d times got %d message_sent callbacks", c.name,
               o.posts, o.sent_cbs);
    if (o.allocated)
      if (int rc = ibmsg_free_msg(&o.m))
        complain(errs, "%s socket: freeing a send buffer: %s", c.name, ibmsg_err_name(rc));
    o.allocated = false;
  }
}

static void destroy_loop(ibmsg_event_loop *l, bool *alive, const char *which, std::string *errs) {
  if (!*alive) return;
  if (int rc = ibmsg_destroy_event_loop(l))
    complain(errs, "ibmsg_destroy_event_loop%s: %s", which, ibmsg_err_name(rc));
  else *alive = false;
}

int teardown(void **state) {
  H *h = h_of(state);
  std::string errs;
  // Hooks may point into the test's stack frame, which is gone (a failed test jumped out of it).
  for (Conn &c : h->conns) {
    c.on_msg = nullptr;
    c.on_rx = nullptr;
    c.on_write = nullptr;
    c.on_sent_hook = nullptr;
    c.when_closed = nullptr;
    c.replies_left = 0;
  }
  for (OpRec &o : h->ops) o.when_done = nullptr;
  before_cq_arm(nullptr, nullptr);
  pause_wire(false);
  delay_send_completions(false);
  hold_established(false);
  release_established();
  bool all_closed = true;
  if (h->loop_alive) {
    for (Conn &c : h->conns)
      if (c.opened && c.closed < c.lives) ibmsg_disconnect(&c.s);
    all_closed = run_until(h, [h] {
      for (Conn &c : h->conns)
        if (c.opened && c.closed < c.lives) return false;
      return true;
    });
  }
  for (Conn &c : h->conns) check_conn(h, c, all_closed, &errs);
  for (OpRec &o : h->ops)
    if (o.posts != o.dones)
      complain(&errs, "operation %d: posted %d times, %d done callbacks", o.id, o.posts, o.dones);
  for (Reg &g : h->regs) {
    if (!g.live) continue;
    if (int rc = ibmsg_deregister_region(&g.r))
      complain(&errs, "deregistering a region: %s", ibmsg_err_name(rc));
    else g.live = false;
  }
  for (ibmsg_region &r : h->regions)
    if (r.impl)
      if (int rc = ibmsg_deregister_region(&r))
        complain(&errs, "ibmsg_deregister_region: %s", ibmsg_err_name(rc));
  for (auto &r : h->raws) r->close();
  settle(h, 3);
  if (h->loop_alive && h->extra_checks) h->extra_checks(h, &errs);
  destroy_loop(&h->loop2, &h->loop2_alive, " (second loop)", &errs);
  destroy_loop(&h->loop, &h->loop_alive, "", &errs);
  const bool destroyed = !h->loop_alive && !h->loop2_alive;
  for (ibmsg_options *o : h->opts) ibmsg_options_free(o);
  std::string left = open_objects_text();
  if (!left.empty()) complain(&errs, "left open in the transport: %s", left.c_str());
  const Stats &st = stats();
  if (st.misuses)
    complain(&errs, "%lu misuses of the transport, the first: %s", st.misuses,
             st.first_misuse.c_str());
  if (st.rnr_errors) complain(&errs, "%lu sends found no posted receive (RNR)", st.rnr_errors);
  if (st.length_errors != h->length_errors_expected)
    complain(&errs, "%lu sends were longer than the receive buffer (%lu expected)",
             st.length_errors, h->length_errors_expected);
  // The count is the process's: this test's share is what it added.
  if (unsigned long n = ibmsg::invalid_transitions() - h->transitions_before)
    complain(&errs, "%lu invalid state transitions (IBMSG_DEBUG=1 names them)", n);
  if (destroyed) delete h;  // else the loop may still point into it
  if (errs.empty()) return 0;
  static char text[8192];  // fail_msg does not return: nothing may be left to destroy
  snprintf(text, sizeof text, "%s", errs.c_str());
  std::string().swap(errs);
  fail_msg("after the test:%s", text);
  return 0;
}

}  // namespace ibmsg::fake::harness
