// test_cxx_handlers.cpp - the C++ wrapper's own behaviour (ibmsg.hpp, issue 26) over the fake
// transport, on the host: a socket's own handlers before the loop's, send() with a completion
// handler per message (the message handed back, move-only handlers, would-block and refusals
// leave the message as it was), messages from and to byte views, std::chrono timeouts,
// std::error_code, the stats and log wrappers, post() and request() on the socket, and the
// loop's teardown: drain() waits, the destructor never does (it leaks the C loop and says so,
// checked in a child process so the leak stays there).
//
// cmocka fails a test with longjmp, which skips C++ destructors: a failed test leaks its loop,
// harmless in a test process. Callbacks record; the test bodies check.
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <climits>
#include <csetjmp>
#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <system_error>
#include <vector>
extern "C" {  // cmocka.h 1.1 has no extern "C" of its own
#include <cmocka.h>
}

#include "fake.hpp"
#include "ibmsg.hpp"

namespace fake = ibmsg::fake;
using namespace std::chrono_literals;

namespace {

// The ibmsg::error code f throws, or 0 if none.
template <class F>
int code_of(F &&f) {
  try {
    f();
  } catch (const ibmsg::error &e) {
    return e.code();
  }
  return 0;
}

// A loop, a listener on it and a client connected to it; the server side of the connection is
// `server`, accepted with the handlers set_server_handlers gives it. The loop's own handlers
// count what reaches them.
struct pair_fixture {
  ibmsg::loop lp;
  ibmsg::socket listener, client, server;
  int loop_established = 0, loop_received = 0, loop_sent = 0, loop_closed = 0;
  std::vector<std::string> loop_texts;
  std::function<void(ibmsg::socket &)> before_accept;

  pair_fixture() {
    lp.on_connection_request([this](ibmsg::connection_request &r) {
      if (before_accept) before_accept(server);
      r.accept(server);
    });
    lp.on_connection_established([this](ibmsg::socket &) { ++loop_established; });
    lp.on_message_received([this](ibmsg::socket &, ibmsg::message m) {
      ++loop_received;
      loop_texts.emplace_back(m.to_string_view());
    });
    lp.on_message_sent([this](ibmsg::socket &, ibmsg::message &, int) { ++loop_sent; });
    lp.on_connection_closed([this](ibmsg::socket &, int) { ++loop_closed; });
  }

  template <class F>
  bool run(F done, int rounds = 500) {
    for (int i = 0; i < rounds && !done(); ++i) lp.dispatch(1ms);
    return done();
  }

  void listen() { listener.listen(lp, nullptr, 0, 8); }
  void connect() {
    if (!listener.is_open()) listen();
    client.connect(lp, "127.0.0.1", listener.local_port());
    assert_true(run([&] {
      return client.status() == IBMSG_CONNECTED && server.status() == IBMSG_CONNECTED;
    }));
  }
  // Disconnects both and the listener, and dispatches until they closed.
  void close_all() {
    if (client.is_open() && client.status() == IBMSG_CONNECTED) client.disconnect();
    if (listener.is_open()) listener.disconnect();
    assert_true(run([&] { return !client.is_open() && !server.is_open() && !listener.is_open(); }));
  }
};

std::string text(const ibmsg::message &m) { return std::string(m.to_string_view()); }

/* ---- a socket's own handlers -------------------------------------------------------------- */

void socket_handlers_take_the_callbacks_before_the_loops(void **) {
  fake::reset();
  pair_fixture f;
  int est = 0, sent = 0, closed = 0, server_closed = 0;
  std::vector<std::string> got;
  int sent_status = -1;
  ibmsg::socket *est_sock = nullptr, *recv_sock = nullptr;
  f.client.on_established([&](ibmsg::socket &s) {
    ++est;
    est_sock = &s;
  });
  f.client.on_sent([&](ibmsg::socket &, ibmsg::message &, int st) {
    ++sent;
    sent_status = st;
  });
  f.client.on_closed([&](ibmsg::socket &, int) { ++closed; });
  f.before_accept = [&](ibmsg::socket &s) {
    s.on_received([&](ibmsg::socket &rs, ibmsg::message m) {
      recv_sock = &rs;
      got.push_back(text(m) + (m.has_imm() ? "+" + std::to_string(m.imm()) : ""));
    });
    s.on_closed([&](ibmsg::socket &, int reason) { server_closed = reason == IBMSG_ECONNRESET ? 1 : -1; });
  };
  f.connect();
  assert_int_equal(est, 1);
  assert_ptr_equal(est_sock, &f.client);
  assert_int_equal(f.loop_established, 1);  // the server's: it has no handler of its own for it

  ibmsg::message m;
  assert_true(m.alloc(f.client, std::string_view("one")));
  assert_true(f.client.post(m));  // post() on the socket: its own on_sent
  assert_true(f.run([&] { return sent == 1 && got.size() == 1; }));
  assert_int_equal(sent_status, IBMSG_OK);
  assert_string_equal(got[0].c_str(), "one");
  assert_ptr_equal(recv_sock, &f.server);
  // The server posts: it has no sent handler, the client none for received: the loop's run.
  ibmsg::message back;
  assert_true(back.alloc(f.server, std::string_view("two")));
  assert_true(back.post(f.server));
  assert_true(f.run([&] { return f.loop_sent == 1 && f.loop_received == 1; }));
  assert_string_equal(f.loop_texts.at(0).c_str(), "two");
  assert_int_equal(sent, 1);

  // An empty handler hands the callback back to the loop.
  f.client.on_sent(nullptr);
  assert_true(f.client.post_imm(m, 7));  // post_imm() on the socket, as post()
  assert_true(f.run([&] { return f.loop_sent == 2 && got.size() == 2; }));
  assert_int_equal(sent, 1);
  assert_int_equal(f.server.stats().msgs_received, 2);
  assert_string_equal(got[1].c_str(), "one+7");

  f.close_all();
  assert_int_equal(closed, 1);
  assert_int_equal(server_closed, 1);
  assert_int_equal(f.loop_closed, 1);  // the listener's
}

void socket_handlers_move_with_the_socket(void **) {
  fake::reset();
  pair_fixture f;
  int received = 0;
  ibmsg::socket *seen = nullptr;
  ibmsg::socket moved;
  f.before_accept = [&](ibmsg::socket &s) {
    s.on_received([&](ibmsg::socket &rs, ibmsg::message) {
      ++received;
      seen = &rs;
    });
  };
  f.connect();
  moved = std::move(f.server);
  assert_true(f.client.send(std::string_view("x")));
  assert_true(f.run([&] { return received == 1; }));
  assert_ptr_equal(seen, &moved);
  assert_int_equal(f.loop_received, 0);
  moved.disconnect();
  assert_true(f.run([&] { return !moved.is_open() && !f.client.is_open(); }));
  f.close_all();
}

struct session {
  ibmsg::socket sock;
  int *deleted;
  explicit session(int *d) : deleted(d) {
    sock.on_closed([this](ibmsg::socket &, int) { delete this; });
  }
  ~session() { ++*deleted; }
};

void closed_handler_may_delete_the_object_that_holds_its_socket(void **) {
  fake::reset();
  pair_fixture f;
  int deleted = 0;
  f.lp.on_connection_request([&](ibmsg::connection_request &r) {
    auto s = std::make_unique<session>(&deleted);
    r.accept(s->sock);
    s.release();  // deleted by its closed handler
  });
  f.listen();  // (f.server stays empty: the session takes the connection)
  f.client.connect(f.lp, "127.0.0.1", f.listener.local_port());
  assert_true(f.run([&] { return f.client.status() == IBMSG_CONNECTED; }));
  f.client.disconnect();
  assert_true(f.run([&] { return deleted == 1 && !f.client.is_open(); }));
  f.close_all();
}

/* ---- send() with a handler per message ---------------------------------------------------- */

void send_hands_the_message_back_once_and_not_to_message_sent(void **) {
  fake::reset();
  pair_fixture f;
  f.connect();
  ibmsg::message m;
  assert_true(m.alloc(f.client, std::string_view("hello")));
  ibmsg_buffer *h = m.handle();
  int calls = 0, status = -1;
  ibmsg::message back;
  ibmsg::socket *on = nullptr;
  assert_true(f.client.send(m, [&](ibmsg::socket &s, ibmsg::message b, int st) {
    ++calls;
    status = st;
    on = &s;
    back = std::move(b);
  }));
  assert_false(static_cast<bool>(m));  // taken
  assert_true(f.run([&] { return calls == 1 && f.loop_received == 1; }));
  for (int i = 0; i < 5; ++i) f.lp.dispatch(0);
  assert_int_equal(calls, 1);
  assert_int_equal(status, IBMSG_OK);
  assert_ptr_equal(on, &f.client);
  assert_ptr_equal(back.handle(), h);  // the same message, to post again
  assert_int_equal(f.loop_sent, 0);
  assert_string_equal(f.loop_texts.at(0).c_str(), "hello");
  // It goes again, with a handler of the status alone, then with none.
  int st2 = -1;
  assert_true(f.client.send(back, [&](int st) { st2 = st; }));
  assert_true(f.run([&] { return st2 == IBMSG_OK && f.loop_received == 2; }));
  assert_true(f.client.send(std::string_view("none"), nullptr));
  assert_true(f.client.send(std::string_view("default")));
  assert_true(f.run([&] { return f.loop_received == 4; }));
  assert_int_equal(f.loop_sent, 0);
  assert_true(f.lp.drain(0));  // nothing of send() is left in flight
  f.close_all();
}

void send_of_bytes_and_text_and_with_an_immediate(void **) {
  fake::reset();
  pair_fixture f;
  std::vector<ibmsg::message> kept;
  f.before_accept = [&](ibmsg::socket &s) {
    s.on_received([&](ibmsg::socket &, ibmsg::message m) { kept.push_back(std::move(m)); });
  };
  f.connect();
  const std::array<std::byte, 4> raw{std::byte{1}, std::byte{2}, std::byte{0}, std::byte{255}};
  const std::vector<std::byte> vec(3, std::byte{9});
  int done = 0;
  assert_true(f.client.send(ibmsg::const_bytes(raw), [&](int st) { done += st == IBMSG_OK; }));
  assert_true(f.client.send(vec, [&](int st) { done += st == IBMSG_OK; }));
  assert_true(f.client.send(std::string("text"), [&](int st) { done += st == IBMSG_OK; }));
  ibmsg::message m;
  assert_true(m.alloc(f.client, std::string_view("imm")));
  assert_true(f.client.send_imm(m, 0xabcdu, [&](int st) { done += st == IBMSG_OK; }));
  assert_true(f.run([&] { return done == 4 && kept.size() == 4; }));
  assert_int_equal(kept[0].size(), 4);
  assert_memory_equal(kept[0].bytes().data(), raw.data(), 4);
  assert_int_equal(kept[0].bytes()[3], 255);
  assert_int_equal(kept[1].bytes().size(), 3);
  assert_int_equal(static_cast<int>(kept[1].bytes()[2]), 9);
  assert_string_equal(text(kept[2]).c_str(), "text");
  assert_true(kept[3].has_imm());
  assert_int_equal(kept[3].imm(), 0xabcdu);
  assert_false(kept[2].has_imm());
  kept.clear();
  f.close_all();
}

void send_handler_may_be_move_only_and_is_destroyed_after_it_ran(void **) {
  fake::reset();
  pair_fixture f;
  f.connect();
  auto token = std::make_shared<int>(0);
  std::weak_ptr<int> watch = token;
  auto owned = std::make_unique<std::shared_ptr<int>>(std::move(token));
  int ran = 0;
  assert_true(f.client.send(std::string_view("m"), [p = std::move(owned), &ran](int) { ++ran; }));
  assert_false(watch.expired());  // held by the handler while the message is in flight
  assert_true(f.run([&] { return ran == 1; }));
  assert_true(watch.expired());
  f.close_all();
}

void send_that_is_refused_leaves_the_message_and_runs_no_handler(void **) {
  fake::reset();
  pair_fixture f;
  // Few credits and a queue of one: posting while the wire is paused fills the queue soon.
  f.lp.set_option(IBMSG_OPT_SHARED_RECV, 0);
  f.lp.set_option(IBMSG_OPT_RECV_DEPTH, 2);
  f.lp.set_option(IBMSG_OPT_SEND_QUEUE, 1);
  f.lp.set_option(IBMSG_OPT_SEND_DEPTH, 16);
  f.connect();
  auto token = std::make_shared<int>(0);
  std::weak_ptr<int> watch = token;
  int ran = 0;
  // An empty message: IBMSG_EINVAL, nothing taken, the handler destroyed unrun.
  ibmsg::message empty;
  assert_int_equal(code_of([&] { (void)f.client.send(empty, [t = token, &ran](int) { ++ran; }); }),
                   IBMSG_EINVAL);
  // The send queue full: false, the message stays the caller's as it was.
  fake::pause_wire(true);
  int sent = 0, ok = 0;
  ibmsg::message m;
  ibmsg_buffer *h = nullptr;
  bool refused = false;
  for (int i = 0; i < 16 && !refused; ++i) {
    assert_true(m.alloc(f.client, std::string_view("q")));
    h = m.handle();
    if (f.client.send(m, [&](int st) { ok += st == IBMSG_OK; }))
      ++sent;
    else
      refused = true;
  }
  assert_true(refused);
  assert_ptr_equal(m.handle(), h);
  assert_int_equal(m.status(), IBMSG_WAITING);
  // The byte form would block too: false, its handler dropped unrun.
  assert_false(f.client.send(std::string_view("no room"), [t = std::move(token), &ran](int) { ++ran; }));
  assert_true(watch.expired());
  fake::pause_wire(false);
  assert_true(f.run([&] { return ok == sent; }));
  assert_true(f.client.send(m));  // it goes now
  assert_true(f.run([&] { return f.loop_received == sent + 1; }));
  assert_int_equal(ran, 0);
  assert_true(f.lp.drain(1s));
  f.close_all();
}

void send_handler_of_a_socket_that_died_does_not_run(void **) {
  fake::reset();
  pair_fixture f;
  f.connect();
  auto token = std::make_shared<int>(0);
  std::weak_ptr<int> watch = token;
  int ran = 0;
  fake::pause_wire(true);  // in flight when the socket dies
  assert_true(f.client.send(std::string_view("late"), [t = std::move(token), &ran](int) { ++ran; }));
  { ibmsg::socket gone = std::move(f.client); }  // disconnects, orphaned
  fake::pause_wire(false);
  assert_true(f.lp.drain(5s));
  assert_int_equal(ran, 0);
  assert_true(watch.expired());
  f.close_all();
}

/* ---- messages and byte views ---------------------------------------------------------------- */

void messages_from_and_to_byte_views(void **) {
  fake::reset();
  pair_fixture f;
  f.connect();
  ibmsg::message m;
  assert_true(m.alloc(f.client, std::string_view("abc")));
  assert_int_equal(m.size(), 3);
  assert_memory_equal(m.data<char>(), "abc", 3);
  assert_ptr_equal(m.data<unsigned char>(), m.data());
  assert_ptr_equal(m.bytes().data(), m.data());
  assert_int_equal(m.bytes().size(), 3);
  m.data<char>()[0] = 'x';
  assert_string_equal(text(m).c_str(), "xbc");
  const ibmsg::message &cm = m;
  assert_int_equal(static_cast<char>(cm.bytes()[0]), 'x');
  assert_ptr_equal(cm.data<std::byte>(), cm.data());
  const std::byte four[4] = {std::byte{4}, std::byte{3}, std::byte{2}, std::byte{1}};
  assert_true(m.alloc(f.client, ibmsg::const_bytes(four)));  // the old one is freed first
  assert_int_equal(m.size(), 4);
  assert_memory_equal(m.data(), four, 4);
  assert_true(m.alloc(f.client, std::string_view()));
  assert_int_equal(m.size(), 0);
  ibmsg::message none;
  assert_null(none.data<char>());
  assert_true(none.bytes().empty());
  // as_bytes / to_string_view, and the descriptor from a byte view.
  ibmsg::const_bytes b = ibmsg::as_bytes("hey");
  assert_int_equal(b.size(), 3);
  assert_string_equal(std::string(ibmsg::to_string_view(b)).c_str(), "hey");
  assert_int_equal(code_of([&] { ibmsg::descriptor::from_bytes(b); }), IBMSG_EBADDESC);
  ibmsg::descriptor d;
  assert_int_equal(d.view().size(), IBMSG_DESCRIPTOR_SIZE);
  assert_ptr_equal(d.view().data(), d.bytes());
  m.free();
  f.close_all();
}

void the_span_of_its_own_views_containers_and_parts(void **) {
  std::vector<std::byte> v(10);
  ibmsg::mutable_bytes all(v);
  assert_int_equal(all.size(), 10);
  assert_ptr_equal(all.data(), v.data());
  ibmsg::const_bytes ro = all;  // adds const
  assert_int_equal(ro.size_bytes(), 10);
  auto part = ro.subspan(2, 3);
  assert_int_equal(part.size(), 3);
  assert_ptr_equal(part.data(), v.data() + 2);
  assert_int_equal(ro.subspan(7).size(), 3);
  assert_int_equal(ro.first(4).size(), 4);
  std::size_t n = 0;
  for (std::byte x : ro) n += x == std::byte{0};
  assert_int_equal(n, 10);
  assert_true(ibmsg::const_bytes().empty());
}

/* ---- timeouts --------------------------------------------------------------------------------- */

void time_limits_round_up_and_cap(void **) {
  assert_int_equal(ibmsg::time_limit(250).ms(), 250);
  assert_int_equal(ibmsg::time_limit(-7).ms(), -7);  // ints pass as they are
  assert_int_equal(ibmsg::time_limit(2s).ms(), 2000);
  assert_int_equal(ibmsg::time_limit(1us).ms(), 1);
  assert_int_equal(ibmsg::time_limit(1500us).ms(), 2);
  assert_int_equal(ibmsg::time_limit(0ns).ms(), 0);
  assert_int_equal(ibmsg::time_limit(-3ms).ms(), -1);
  assert_int_equal(ibmsg::time_limit(std::chrono::hours(1000)).ms(), INT_MAX);
  assert_int_equal(ibmsg::time_limit(std::chrono::duration<double>(0.0015)).ms(), 2);
  assert_true(ibmsg::time_limit(3s).duration() == 3000ms);
}

void chrono_options_dispatch_and_next_timeout(void **) {
  fake::reset();
  ibmsg::loop lp;
  lp.set_option(IBMSG_OPT_CONNECT_TIMEOUT, 3s);
  assert_int_equal(lp.get_option(IBMSG_OPT_CONNECT_TIMEOUT), 3000);
  lp.set_option(IBMSG_OPT_KEEPALIVE, 1500us);
  assert_int_equal(lp.get_option(IBMSG_OPT_KEEPALIVE), 2);
  ibmsg::options o;
  o.set(IBMSG_OPT_REQUEST_WINDOW, std::chrono::seconds(2)).set(IBMSG_OPT_KEEPALIVE, 0ms);
  assert_int_equal(o.get(IBMSG_OPT_REQUEST_WINDOW), 2000);
  assert_int_equal(o.get(IBMSG_OPT_KEEPALIVE), 0);
  // Nothing to do: a dispatch of 20 ms waits about that long, not forever and not not at all.
  auto t0 = std::chrono::steady_clock::now();
  lp.dispatch(20ms);
  auto waited = std::chrono::steady_clock::now() - t0;
  assert_true(waited >= 15ms && waited < 2s);
  lp.dispatch(0ms);
  std::optional<std::chrono::milliseconds> next = lp.next_timeout();
  assert_true(!next || *next >= 0ms);
  assert_int_equal(next ? int(next->count()) : -1, lp.timeout());
  ibmsg::loop gone = std::move(lp);
  assert_int_equal(code_of([&] { (void)lp.next_timeout(); }), IBMSG_EINVAL);
  assert_int_equal(code_of([&] { (void)lp.drain(); }), IBMSG_EINVAL);
}

void request_and_retry_take_chrono_timeouts(void **) {
  fake::reset();
  pair_fixture f;
  std::vector<ibmsg::message> requests;  // held, unanswered, until the test answers
  f.before_accept = [&](ibmsg::socket &s) {
    s.on_received([&](ibmsg::socket &, ibmsg::message m) {
      if (m.is_request()) requests.push_back(std::move(m));
    });
  };
  f.connect();
  ibmsg::message q;
  assert_true(q.alloc(f.client, std::string_view("q")));
  int calls = 0, status = -1, retries = -1;
  std::string reply;
  assert_true(f.client.request(q, 30ms, [&](ibmsg::socket &s, ibmsg::message r, int st,
                                            ibmsg::unanswered_request u) {
    ++calls;
    status = st;
    if (st == IBMSG_ETIMEDOUT && u.retries() == 0) {
      retries = 0;
      assert_true(u.retry(s, q, std::chrono::seconds(5)));
      return;
    }
    retries = u ? u.retries() : 1;
    reply = text(r);
  }));
  // No answer within 30 ms: the handler retries, with a limit of 5 s.
  assert_true(f.run([&] { return calls == 1; }, 2000));
  assert_int_equal(status, IBMSG_ETIMEDOUT);
  assert_true(f.run([&] { return requests.size() >= 1; }));
  ibmsg::message a;
  assert_true(a.alloc(f.server, std::string_view("answer")));
  assert_true(f.server.reply(requests.back(), a));
  assert_true(f.run([&] { return calls == 2; }));
  assert_int_equal(status, IBMSG_OK);
  assert_string_equal(reply.c_str(), "answer");
  assert_true(f.run([&] { return a.status() != IBMSG_WAITING; }));
  requests.clear();
  // An int of milliseconds still works; 0 is refused.
  assert_int_equal(code_of([&] { (void)f.client.request(q, 0ms, nullptr); }), IBMSG_EINVAL);
  f.close_all();
}

/* ---- errors, stats, log ------------------------------------------------------------------------ */

void errors_are_error_codes_of_the_ibmsg_category(void **) {
  std::error_code ec = IBMSG_ETIMEDOUT;
  assert_string_equal(ec.category().name(), "ibmsg");
  assert_true(ec == std::errc::timed_out);
  assert_true(ec.message() == ibmsg_strerror(IBMSG_ETIMEDOUT));
  assert_true(ibmsg::make_error_code(IBMSG_EINVAL) == std::errc::invalid_argument);
  std::error_code own = IBMSG_EREJECTED;
  assert_true(own == ibmsg::make_error_code(IBMSG_EREJECTED));
  assert_false(own == std::errc::connection_refused);
  assert_true(own.message() == ibmsg_strerror(IBMSG_EREJECTED));
  assert_false(static_cast<bool>(ibmsg::make_error_code(IBMSG_OK)));
  try {
    throw ibmsg::error(IBMSG_ECONNREFUSED);
  } catch (const std::system_error &e) {
    assert_true(e.code() == std::errc::connection_refused);
    assert_true(e.code() == ibmsg::make_error_code(IBMSG_ECONNREFUSED));
    assert_string_equal(e.what(), ibmsg_strerror(IBMSG_ECONNREFUSED));
  }
  const ibmsg::error e(IBMSG_ESTATE);
  assert_int_equal(e.code(), IBMSG_ESTATE);
  assert_true(e.error_code() == ibmsg::make_error_code(IBMSG_ESTATE));
  assert_string_equal(e.name(), "IBMSG_ESTATE");
}

void stats_count_the_connections_messages(void **) {
  fake::reset();
  pair_fixture f;
  f.connect();
  int done = 0;
  for (int i = 0; i < 3; ++i) assert_true(f.client.send(std::string_view("12345"), [&](int) { ++done; }));
  assert_true(f.run([&] { return done == 3 && f.loop_received == 3; }));
  ibmsg_stats st = f.client.stats();
  assert_int_equal(st.msgs_sent, 3);
  assert_int_equal(st.bytes_sent, 15);
  assert_int_equal(f.server.stats().msgs_received, 3);
  assert_int_equal(code_of([&] { (void)f.listener.stats(); }), IBMSG_ESTATE);
  assert_int_equal(code_of([&] { (void)f.listener.memory(); }), IBMSG_ESTATE);
  assert_true(f.client.memory().buffers > 0);
  assert_true(f.lp.memory().buffers > 0);
  ibmsg::socket empty;
  assert_int_equal(code_of([&] { (void)empty.stats(); }), IBMSG_EINVAL);
  f.close_all();
}

void log_lines_reach_the_handler_with_the_socket(void **) {
  fake::reset();
  pair_fixture f;
  int lines = 0, of_client = 0, info = 0;
  f.lp.on_log([&](ibmsg::socket *s, int level, std::string_view t) {
    ++lines;
    if (s == &f.client) ++of_client;
    if (level == IBMSG_LOG_INFO && !t.empty()) ++info;
  });
  f.connect();
  f.close_all();
  assert_true(lines > 0);
  assert_true(of_client > 0);
  assert_true(info > 0);
  // Without a handler, no line reaches it.
  f.lp.on_log(nullptr);
  int before = lines;
  f.connect();
  f.close_all();
  assert_int_equal(lines, before);
}

void what_a_log_handler_throws_comes_out_of_dispatch(void **) {
  fake::reset();
  pair_fixture f;
  f.lp.on_log([](ibmsg::socket *, int, std::string_view) { throw std::runtime_error("log"); });
  bool caught = false;
  try {
    f.listen();
    f.client.connect(f.lp, "127.0.0.1", f.listener.local_port());
    for (int i = 0; i < 100; ++i) f.lp.dispatch(1ms);
  } catch (const std::runtime_error &e) {
    caught = std::strcmp(e.what(), "log") == 0;
  }
  assert_true(caught);
  f.lp.on_log(nullptr);
  f.run([&] { return f.client.status() == IBMSG_CONNECTED; });
  f.close_all();
}

/* ---- teardown ---------------------------------------------------------------------------------- */

void drain_waits_for_what_died_and_the_loop_is_freed(void **) {
  fake::reset();
  unsigned leaked = ibmsg::loop::leaked_loops();
  auto f = std::make_unique<pair_fixture>();
  f->connect();
  fake::pause_wire(true);
  ibmsg::message m;
  assert_true(m.alloc(f->client, std::string_view("in flight")));
  assert_true(m.post(f->client));
  assert_true(f->client.send(std::string_view("sent")));
  {  // everything dies but the loop: orphans closing
    ibmsg::message gone = std::move(m);
    ibmsg::socket a = std::move(f->client), b = std::move(f->server), c = std::move(f->listener);
  }
  fake::pause_wire(false);
  assert_true(f->lp.drain(5s));
  auto t0 = std::chrono::steady_clock::now();
  f.reset();  // the loop's destructor: nothing left, freed
  assert_true(std::chrono::steady_clock::now() - t0 < 1s);
  assert_int_equal(ibmsg::loop::leaked_loops(), leaked);
  assert_string_equal(fake::open_objects_text().c_str(), "");
}

void loop_destructor_never_waits_and_leaks_what_is_still_open(void **) {
  fake::reset();
  std::fflush(nullptr);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {  // the child leaks; _exit() skips the leak check at exit
    int rc = 0;
    try {
      auto lp = std::make_unique<ibmsg::loop>();
      auto *open = new ibmsg::socket;  // never closed: the C loop cannot be destroyed
      open->listen(*lp, nullptr, 0, 1);
      auto t0 = std::chrono::steady_clock::now();
      lp.reset();
      auto took = std::chrono::steady_clock::now() - t0;
      if (took >= 1s) rc = 2;
      if (ibmsg::loop::leaked_loops() != 1) rc = 3;
    } catch (...) {
      rc = 4;
    }
    std::fflush(nullptr);
    _exit(rc);
  }
  int status = 0;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0);
}

void closing_the_loop_is_refused_while_a_send_is_in_flight(void **) {
  fake::reset();
  pair_fixture f;
  f.connect();
  fake::pause_wire(true);
  int ran = 0;
  assert_true(f.client.send(std::string_view("x"), [&](int) { ++ran; }));
  assert_false(f.lp.drain(0));  // a send in flight is what drain() waits for
  f.close_all();  // the connection closes: the send's handler ran (canceled, or sent)
  fake::pause_wire(false);
  assert_int_equal(ran, 1);
  assert_true(f.lp.drain(0));
}

}  // namespace

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(socket_handlers_take_the_callbacks_before_the_loops),
      cmocka_unit_test(socket_handlers_move_with_the_socket),
      cmocka_unit_test(closed_handler_may_delete_the_object_that_holds_its_socket),
      cmocka_unit_test(send_hands_the_message_back_once_and_not_to_message_sent),
      cmocka_unit_test(send_of_bytes_and_text_and_with_an_immediate),
      cmocka_unit_test(send_handler_may_be_move_only_and_is_destroyed_after_it_ran),
      cmocka_unit_test(send_that_is_refused_leaves_the_message_and_runs_no_handler),
      cmocka_unit_test(send_handler_of_a_socket_that_died_does_not_run),
      cmocka_unit_test(messages_from_and_to_byte_views),
      cmocka_unit_test(the_span_of_its_own_views_containers_and_parts),
      cmocka_unit_test(time_limits_round_up_and_cap),
      cmocka_unit_test(chrono_options_dispatch_and_next_timeout),
      cmocka_unit_test(request_and_retry_take_chrono_timeouts),
      cmocka_unit_test(errors_are_error_codes_of_the_ibmsg_category),
      cmocka_unit_test(stats_count_the_connections_messages),
      cmocka_unit_test(log_lines_reach_the_handler_with_the_socket),
      cmocka_unit_test(what_a_log_handler_throws_comes_out_of_dispatch),
      cmocka_unit_test(drain_waits_for_what_died_and_the_loop_is_freed),
      cmocka_unit_test(loop_destructor_never_waits_and_leaks_what_is_still_open),
      cmocka_unit_test(closing_the_loop_is_refused_while_a_send_is_in_flight),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
