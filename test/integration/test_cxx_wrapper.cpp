// Integration test of the C++ wrapper ibmsg.hpp on a real RDMA device (Soft-RoCE in the test VM):
// each test function checks one behaviour of the wrapper over a connection to itself on
// IBMSG_TEST_ADDR. Every wait is bounded, so a bug fails a test instead of hanging it.
//
// cmocka fails a test with longjmp, which skips C++ destructors: a failed test leaks its loop
// (never dispatched again), which is harmless in a test process. Nothing fails from inside a
// callback: callbacks record, the test body checks.
#include <ev.h>
#include <poll.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
extern "C" {  // cmocka.h 1.1 has no extern "C" of its own
#include <cmocka.h>
}

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <list>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "ibmsg.hpp"

namespace {

const char *addr;  // IBMSG_TEST_ADDR

// The wrappers are move-only, and moving never throws.
static_assert(!std::is_copy_constructible_v<ibmsg::loop> &&
              !std::is_copy_assignable_v<ibmsg::loop>);
static_assert(!std::is_copy_constructible_v<ibmsg::socket> &&
              !std::is_copy_assignable_v<ibmsg::socket>);
static_assert(!std::is_copy_constructible_v<ibmsg::message> &&
              !std::is_copy_assignable_v<ibmsg::message>);
static_assert(!std::is_copy_constructible_v<ibmsg::connection_request>);
// An incoming message is a view that cannot leave its callback.
static_assert(!std::is_copy_constructible_v<ibmsg::incoming> &&
              !std::is_move_constructible_v<ibmsg::incoming>);
static_assert(std::is_nothrow_move_constructible_v<ibmsg::loop> &&
              std::is_nothrow_move_assignable_v<ibmsg::loop>);
static_assert(std::is_nothrow_move_constructible_v<ibmsg::socket> &&
              std::is_nothrow_move_assignable_v<ibmsg::socket>);
static_assert(std::is_nothrow_move_constructible_v<ibmsg::message> &&
              std::is_nothrow_move_assignable_v<ibmsg::message>);
static_assert(std::is_base_of_v<std::runtime_error, ibmsg::error>);
static_assert(!std::is_copy_constructible_v<ibmsg::region> &&
              !std::is_copy_assignable_v<ibmsg::region>);
static_assert(std::is_nothrow_move_constructible_v<ibmsg::region> &&
              std::is_nothrow_move_assignable_v<ibmsg::region>);
// A descriptor is a plain value of IBMSG_DESCRIPTOR_SIZE bytes.
static_assert(std::is_nothrow_copy_constructible_v<ibmsg::descriptor> &&
              std::is_nothrow_copy_assignable_v<ibmsg::descriptor>);
static_assert(ibmsg::descriptor::size() == IBMSG_DESCRIPTOR_SIZE);

#define CHECK(cond, ...)                        \
  do {                                          \
    if (!(cond)) {                              \
      print_error("check failed: %s\n", #cond); \
      fail_msg(__VA_ARGS__);                    \
    }                                           \
  } while (0)

constexpr int wait_ms = 5000;

// The ibmsg::error code f throws, or 0 if it throws none. (Tests fail outside catch blocks:
// a longjmp out of a handler would leave the exception behind.)
template <class F>
int error_code_of(F &&f) {
  try {
    f();
  } catch (const ibmsg::error &e) {
    return e.code();
  }
  return 0;
}

const char *code_name(int code) { return code ? ibmsg_err_name(code) : "no error"; }

// Runs a test body; an exception out of it fails the test with its text.
template <class F>
void guarded(F &&body) {
  static char what[512];
  try {
    body();
    return;
  } catch (const ibmsg::error &e) {
    std::snprintf(what, sizeof what, "unexpected ibmsg::error %s: %s", e.name(), e.what());
  } catch (const std::exception &e) {
    std::snprintf(what, sizeof what, "unexpected exception: %s", e.what());
  }
  fail_msg("%s", what);
}

std::string text_of(const ibmsg::message &m) { return std::string(m.to_string_view()); }

// A loop with a listener, and a client connected to it through the listener's accepted
// server socket, all on IBMSG_TEST_ADDR. The callbacks record what happened; a test may
// replace any of them.
struct peers {
  struct received_msg {
    ibmsg::socket *sock;
    ibmsg_socket *handle;
    std::string data;
    bool has_imm;
    std::uint32_t imm;
    std::uint32_t flags;
    const void *where;  // data() when it arrived
  };
  struct sent_msg {
    ibmsg::socket *sock;
    ibmsg::message *msg;
    ibmsg_buffer *handle;
    int status;
  };
  struct closed_socket {
    ibmsg::socket *sock;
    ibmsg_socket *handle;
    int reason;
  };

  ibmsg::loop lp;
  ibmsg::socket listener, server, client;
  ibmsg_socket *listener_h = nullptr, *server_h = nullptr, *client_h = nullptr;
  unsigned short port = 0;
  std::vector<ibmsg::socket *> established;
  std::vector<received_msg> received;
  std::vector<sent_msg> sent;
  std::vector<closed_socket> closed;
  bool hold = false;  // keep received messages in `held` instead of freeing
  std::vector<ibmsg::message> held;
  std::list<ibmsg::message> outbox;  // messages posted with send()
  std::function<void(int)> step;     // runs the loop once, waiting at most the given ms

  explicit peers(ibmsg::loop &&l = ibmsg::loop()) : lp(std::move(l)) {
    step = [this](int ms) { lp.dispatch(ms); };
    lp.set_option(IBMSG_OPT_RNR_RETRY, 0);  // a credit bug must fail loudly, not retry
    lp.on_connection_request([this](ibmsg::connection_request &r) {
      r.accept(server);
      server_h = server.handle();
    });
    lp.on_connection_established([this](ibmsg::socket &s) { established.push_back(&s); });
    lp.on_message_received([this](ibmsg::socket &s, ibmsg::message m) {
      received.push_back({&s, s.handle(), text_of(m), m.has_imm(), m.imm(), m.flags(), m.data()});
      if (hold) held.push_back(std::move(m));
    });
    lp.on_message_sent([this](ibmsg::socket &s, ibmsg::message &m, int status) {
      sent.push_back({&s, &m, m.handle(), status});
    });
    lp.on_connection_closed([this](ibmsg::socket &s, int reason) {
      closed.push_back({&s, s.handle(), reason});
    });
  }

  // Dispatches until done() or ms have passed; returns done().
  template <class F>
  bool wait(F done, int ms = wait_ms) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
    while (!done()) {
      if (std::chrono::steady_clock::now() >= deadline) return false;
      step(20);
    }
    return true;
  }

  void listen() {
    listener.listen(lp, addr, 0, 8);
    listener_h = listener.handle();
    port = listener.local_port();
  }

  void connect() {
    listen();
    client.connect(lp, addr, port);
    client_h = client.handle();
    CHECK(wait([&] { return established.size() == 2; }),
          "%zu of 2 sockets established within %d ms", established.size(), wait_ms);
  }

  // The reason handle closed with, or -1 if it has not closed.
  int closed_reason(ibmsg_socket *h) const {
    for (const auto &c : closed)
      if (c.handle == h) return c.reason;
    return -1;
  }

  void send(ibmsg::socket &s, const std::string &text) {
    ibmsg::message m;
    CHECK(m.alloc(s, text.size()), "alloc of %zu bytes would block", text.size());
    std::memcpy(m.data(), text.data(), text.size());
    CHECK(m.post(s), "post of \"%s\" would block", text.c_str());
    outbox.push_back(std::move(m));
  }

  // Closes everything in order and destroys the loop: close() fails with IBMSG_EBUSY if a
  // socket or a message was left behind.
  void close_all() {
    for (ibmsg::socket *s : {&client, &server})
      if (s->is_open() && s->status() != IBMSG_DISCONNECTING) s->disconnect();
    CHECK(wait([&] { return !client.is_open() && !server.is_open(); }),
          "connections still open after %d ms", wait_ms);
    if (listener.is_open()) listener.disconnect();
    CHECK(wait([&] { return !listener.is_open(); }), "listener still open after %d ms", wait_ms);
    outbox.clear();
    held.clear();
    int code = error_code_of([&] { lp.close(); });
    CHECK(code == 0, "closing the loop at the end: %s", code_name(code));
  }
};

/* ---- error ----------------------------------------------------------------------------------- */

void error_carries_code_and_text(void **) {
  ibmsg::error e(IBMSG_EMSGSIZE);
  CHECK(e.code() == IBMSG_EMSGSIZE, "code() is %d", e.code());
  CHECK(std::strcmp(e.what(), ibmsg_strerror(IBMSG_EMSGSIZE)) == 0, "what() is \"%s\"", e.what());
  CHECK(std::strcmp(e.name(), "IBMSG_EMSGSIZE") == 0, "name() is \"%s\"", e.name());
  const std::exception &base = e;
  CHECK(std::strcmp(base.what(), e.what()) == 0, "std::exception::what() differs");
}

/* ---- loop ------------------------------------------------------------------------------------ */

void options_round_trip(void **) {
  guarded([] {
    ibmsg::loop lp;
    lp.set_option(IBMSG_OPT_RECV_DEPTH, 7);
    CHECK(lp.get_option(IBMSG_OPT_RECV_DEPTH) == 7, "RECV_DEPTH reads back %d",
          lp.get_option(IBMSG_OPT_RECV_DEPTH));
    lp.set_option(IBMSG_OPT_DEVICE, "rxe0");
    CHECK(lp.get_option_string(IBMSG_OPT_DEVICE) == "rxe0", "DEVICE reads back \"%s\"",
          lp.get_option_string(IBMSG_OPT_DEVICE).c_str());
    lp.set_option(IBMSG_OPT_DEVICE, std::string_view());
    CHECK(lp.get_option_string(IBMSG_OPT_DEVICE).empty(), "DEVICE not cleared");
    int code = error_code_of([&] { lp.set_option(IBMSG_OPT_RNR_RETRY, 8); });
    CHECK(code == IBMSG_EINVAL, "RNR_RETRY 8: %s, expected IBMSG_EINVAL", code_name(code));
    code = error_code_of([&] { lp.set_option(9999, 1); });
    CHECK(code == IBMSG_EINVAL, "unknown option: %s, expected IBMSG_EINVAL", code_name(code));
    lp.close();
    CHECK(!lp && lp.handle() == nullptr, "a closed loop still has a handle");
  });
}

void option_sets_start_from_the_defaults_and_check_values(void **) {
  guarded([] {
    ibmsg::loop lp;
    lp.set_option(IBMSG_OPT_RECV_DEPTH, 9);
    ibmsg::options from_loop(lp), builtin;
    CHECK(from_loop.get(IBMSG_OPT_RECV_DEPTH) == 9, "a set made from the loop has RECV_DEPTH %d",
          from_loop.get(IBMSG_OPT_RECV_DEPTH));
    CHECK(builtin.get(IBMSG_OPT_RECV_DEPTH) == 32, "a default set has RECV_DEPTH %d",
          builtin.get(IBMSG_OPT_RECV_DEPTH));
    builtin.set(IBMSG_OPT_MAX_MSG_SIZE, 700).set(IBMSG_OPT_DEVICE, "rxe0");
    CHECK(builtin.get(IBMSG_OPT_MAX_MSG_SIZE) == 700, "MAX_MSG_SIZE reads back %d",
          builtin.get(IBMSG_OPT_MAX_MSG_SIZE));
    int code = error_code_of([&] { builtin.set(IBMSG_OPT_MAX_MSG_SIZE, 0); });
    CHECK(code == IBMSG_EINVAL, "MAX_MSG_SIZE 0: %s, expected IBMSG_EINVAL", code_name(code));
    ibmsg::options moved(std::move(builtin));
    CHECK(moved.handle() != nullptr && builtin.handle() == nullptr, "move did not take the set");
    lp.close();
  });
}

// Every integer option of ibmsg_setopt(3): two values in range, one out of range, and whether
// it is an option of sizes ("int, or uint64_t" in ibmsg.h) with its largest value. The wrapper
// itself keeps no such list: these are the expectations it must meet by asking the library.
struct integer_option {
  int id;
  const char *name;
  long long good, good2;  // in range, different (either may be the default)
  long long bad;           // out of range (IBMSG_EINVAL)
  std::uint64_t wide_max;  // an option of sizes: its largest value; 0: an int option
};
constexpr integer_option integer_options[] = {
    {IBMSG_OPT_RECV_DEPTH, "RECV_DEPTH", 100, 101, 16385, 0},
    {IBMSG_OPT_SEND_DEPTH, "SEND_DEPTH", 100, 101, 0, 0},
    {IBMSG_OPT_SEND_QUEUE, "SEND_QUEUE", 1000, 1001, (1 << 20) + 1, 0},
    {IBMSG_OPT_MAX_MSG_SIZE, "MAX_MSG_SIZE", 700, 701, 0, (std::uint64_t(1) << 32) - 1},
    {IBMSG_OPT_CONNECT_TIMEOUT, "CONNECT_TIMEOUT", 1234, 1235, 0, 0},
    {IBMSG_OPT_RNR_RETRY, "RNR_RETRY", 3, 4, 8, 0},
    {IBMSG_OPT_RDMA, "RDMA", 0, 1, 2, 0},
    {IBMSG_OPT_RDMA_DEPTH, "RDMA_DEPTH", 8, 9, 4097, 0},
    {IBMSG_OPT_BUSY_POLL, "BUSY_POLL", 50, 51, -2, 0},
    {IBMSG_OPT_EAGER_SIZE, "EAGER_SIZE", 8192, 8193, (1 << 30) + 1, 0},
    {IBMSG_OPT_SHARED_RECV, "SHARED_RECV", 0, 1, 2, 0},
    {IBMSG_OPT_KEEPALIVE, "KEEPALIVE", 2000, 2001, -1, 0},
    {IBMSG_OPT_KEEPALIVE_COUNT, "KEEPALIVE_COUNT", 5, 6, 1, 0},
    {IBMSG_OPT_ACK_TIMEOUT, "ACK_TIMEOUT", 14, 15, 32, 0},
    {IBMSG_OPT_RETRY_COUNT, "RETRY_COUNT", 2, 3, 8, 0},
    {IBMSG_OPT_REQUEST_WINDOW, "REQUEST_WINDOW", 500, 501, 0, 0},
    {IBMSG_OPT_REPLY_CACHE, "REPLY_CACHE", 4096, 4097, -1, 0},
    {IBMSG_OPT_RNDV_MEMORY, "RNDV_MEMORY", 4096, 4097, 0, std::uint64_t(1) << 48},
    {IBMSG_OPT_VIOLATION_BAN, "VIOLATION_BAN", 250, 251, -1, 0},
    {IBMSG_OPT_CONNECT_LIMIT, "CONNECT_LIMIT", 8, 9, 0, 0},
    {IBMSG_OPT_SHARED_RECV_BUDGET, "SHARED_RECV_BUDGET", 4096, 4097, -1, std::uint64_t(1) << 48},
};

// Sets and reads every integer option through set(id, value) (a generic lambda over the
// wrapper's set_option() or options::set()), get(id) and get_u64(id), in int and in other
// integer types: each reads back what was set, the bad value is IBMSG_EINVAL and changes
// nothing, a value beyond INT_MAX reaches an option of sizes whole and is IBMSG_EINVAL for an
// int option. Fails if the wrapper passes an option in a type the library does not take.
template <class Set, class Get, class GetU64>
void every_integer_option(const char *where, Set &&set, Get &&get, GetU64 &&get_u64) {
  const long long above_int = static_cast<long long>(INT_MAX) + 1;
  for (const integer_option &o : integer_options) {
    auto u64 = [&] { return static_cast<unsigned long long>(get_u64(o.id)); };
    // As an int.
    set(o.id, static_cast<int>(o.good));
    CHECK(get(o.id) == o.good && u64() == static_cast<unsigned long long>(o.good),
          "%s %s: int %lld reads back %d (%llu)", where, o.name, o.good, get(o.id), u64());
    int code = error_code_of([&] { set(o.id, static_cast<int>(o.bad)); });
    CHECK(code == IBMSG_EINVAL, "%s %s: int %lld: %s, expected IBMSG_EINVAL", where, o.name,
          o.bad, code_name(code));
    code = error_code_of([&] { set(o.id, o.bad); });
    CHECK(code == IBMSG_EINVAL, "%s %s: long long %lld: %s, expected IBMSG_EINVAL", where,
          o.name, o.bad, code_name(code));
    if (o.bad >= 0) {
      code = error_code_of([&] { set(o.id, static_cast<std::uint64_t>(o.bad)); });
      CHECK(code == IBMSG_EINVAL, "%s %s: uint64_t %lld: %s, expected IBMSG_EINVAL", where,
            o.name, o.bad, code_name(code));
    }
    CHECK(get(o.id) == o.good, "%s %s: %d after the refusals, expected %lld", where, o.name,
          get(o.id), o.good);
    // Other integer types, switching between good and good2 so that each set shows.
    set(o.id, o.good2);  // long long
    CHECK(get(o.id) == o.good2 && u64() == static_cast<unsigned long long>(o.good2),
          "%s %s: long long %lld reads %d (%llu)", where, o.name, o.good2, get(o.id), u64());
    set(o.id, static_cast<std::uint64_t>(o.good));
    CHECK(get(o.id) == o.good && u64() == static_cast<unsigned long long>(o.good),
          "%s %s: uint64_t %lld reads %d (%llu)", where, o.name, o.good, get(o.id), u64());
    set(o.id, static_cast<unsigned short>(o.good2));
    CHECK(get(o.id) == o.good2, "%s %s: unsigned short %lld reads %d", where, o.name, o.good2,
          get(o.id));
    set(o.id, static_cast<std::size_t>(o.good));
    CHECK(u64() == static_cast<unsigned long long>(o.good), "%s %s: size_t %lld reads %llu",
          where, o.name, o.good, u64());
    code = error_code_of([&] { set(o.id, static_cast<long long>(INT_MIN) - 1); });
    CHECK(code == IBMSG_EINVAL, "%s %s: INT_MIN - 1: %s, expected IBMSG_EINVAL", where, o.name,
          code_name(code));
    if (!o.wide_max) {
      // Beyond INT_MAX: an int option refuses it whatever the type, and keeps its value.
      code = error_code_of([&] { set(o.id, static_cast<std::uint64_t>(above_int)); });
      CHECK(code == IBMSG_EINVAL, "%s %s: INT_MAX + 1: %s, expected IBMSG_EINVAL", where, o.name,
            code_name(code));
      code = error_code_of([&] { set(o.id, std::uint64_t(1) << 32); });
      CHECK(code == IBMSG_EINVAL, "%s %s: 2^32: %s, expected IBMSG_EINVAL", where, o.name,
            code_name(code));
      CHECK(get(o.id) == o.good, "%s %s: %d after INT_MAX + 1, expected %lld", where, o.name,
            get(o.id), o.good);
      continue;
    }
    // An option of sizes: beyond INT_MAX whole (as an int at most INT_MAX), up to its largest.
    set(o.id, static_cast<std::uint64_t>(above_int));
    CHECK(u64() == static_cast<unsigned long long>(above_int) && get(o.id) == INT_MAX,
          "%s %s: INT_MAX + 1 reads %llu (as an int %d)", where, o.name, u64(), get(o.id));
    set(o.id, o.wide_max);
    CHECK(u64() == o.wide_max, "%s %s: its largest, %llu, reads %llu", where, o.name,
          static_cast<unsigned long long>(o.wide_max), u64());
    code = error_code_of([&] { set(o.id, o.wide_max + 1); });
    CHECK(code == IBMSG_EINVAL, "%s %s: its largest + 1: %s, expected IBMSG_EINVAL", where,
          o.name, code_name(code));
    code = error_code_of([&] { set(o.id, -above_int); });
    CHECK(code == IBMSG_EINVAL, "%s %s: -(INT_MAX + 1): %s, expected IBMSG_EINVAL", where,
          o.name, code_name(code));
    CHECK(u64() == o.wide_max, "%s %s: %llu after the refusals", where, o.name, u64());
    set(o.id, static_cast<int>(o.good));
    CHECK(u64() == static_cast<unsigned long long>(o.good), "%s %s: back to %lld reads %llu",
          where, o.name, o.good, u64());
  }
  // A string option is no integer: get_u64 does not make one of its bytes.
  int code = error_code_of([&] { (void)get_u64(IBMSG_OPT_DEVICE); });
  CHECK(code == IBMSG_EINVAL, "%s DEVICE (\"\") as an integer: %s, expected IBMSG_EINVAL", where,
        code_name(code));
  // The table above has every option: one after the last is unknown (add a new one above).
  code = error_code_of([&] { set(IBMSG_OPT_SHARED_RECV_BUDGET + 1, 1LL); });
  CHECK(code == IBMSG_EINVAL, "%s option %d: %s: a new option? add it to integer_options", where,
        IBMSG_OPT_SHARED_RECV_BUDGET + 1, code_name(code));
  code = error_code_of([&] { (void)get_u64(9999); });
  CHECK(code == IBMSG_EINVAL, "%s option 9999 read: %s, expected IBMSG_EINVAL", where,
        code_name(code));
}

void every_integer_option_through_loop_and_option_set(void **) {
  guarded([] {
    static_assert(sizeof integer_options / sizeof integer_options[0] ==
                      IBMSG_OPT_SHARED_RECV_BUDGET - 2,  // all but SOURCE_ADDR and DEVICE
                  "integer_options misses an option");
    ibmsg::loop lp;
    every_integer_option(
        "loop", [&](int id, auto v) { lp.set_option(id, v); },
        [&](int id) { return lp.get_option(id); }, [&](int id) { return lp.get_option_u64(id); });
    ibmsg::options set;
    every_integer_option(
        "options", [&](int id, auto v) { set.set(id, v); }, [&](int id) { return set.get(id); },
        [&](int id) { return set.get_u64(id); });
    lp.close();
  });
}

/* ---- connections ----------------------------------------------------------------------------- */

void option_sets_apply_to_listen_connect_and_accept(void **) {
  guarded([] {
    peers p;
    ibmsg::options small, smaller;
    small.set(IBMSG_OPT_MAX_MSG_SIZE, 1000);
    smaller.set(IBMSG_OPT_MAX_MSG_SIZE, 400);
    p.lp.on_connection_request([&](ibmsg::connection_request &r) {
      r.accept(p.server, smaller);
      p.server_h = p.server.handle();
    });
    p.listener.listen(p.lp, addr, 0, 8, small);
    p.port = p.listener.local_port();
    p.client.connect(p.lp, addr, p.port, small);
    CHECK(p.wait([&] { return p.established.size() == 2; }), "%zu of 2 sockets established",
          p.established.size());
    CHECK(p.server.max_msg_size() == 400, "accepted socket's max size %zu, expected 400",
          p.server.max_msg_size());
    CHECK(p.client.max_msg_size() == 400, "client's max size %zu, expected 400 (the smaller)",
          p.client.max_msg_size());
    p.close_all();
  });
}

void listen_on_port_0_and_connect_fires_established(void **) {
  guarded([] {
    peers p;
    p.listen();
    CHECK(p.port != 0, "the listener on port 0 reports port 0");
    CHECK(p.listener.status() == IBMSG_LISTENING, "listener status %d", p.listener.status());
    p.client.connect(p.lp, addr, p.port);
    CHECK(p.wait([&] { return p.established.size() == 2; }), "%zu of 2 sockets established",
          p.established.size());
    bool client_seen = std::count(p.established.begin(), p.established.end(), &p.client) == 1;
    bool server_seen = std::count(p.established.begin(), p.established.end(), &p.server) == 1;
    CHECK(client_seen && server_seen, "established callback got the wrong sockets");
    CHECK(p.client.status() == IBMSG_CONNECTED, "client status %d", p.client.status());
    CHECK(p.server.status() == IBMSG_CONNECTED, "server status %d", p.server.status());
    CHECK(p.client.peer_port() == p.port, "client's peer port %u, listener's %u",
          p.client.peer_port(), p.port);
    CHECK(p.server.peer_address() == addr, "server's peer is %s", p.server.peer_address().c_str());
    CHECK(p.client.device() != nullptr, "connected client has no device");
    CHECK(p.client.max_msg_size() > 0, "connected client has max_msg_size 0");
    p.close_all();
  });
}

void messages_exchanged_both_ways_arrive_intact(void **) {
  guarded([] {
    peers p;
    p.connect();
    constexpr int n = 300;
    auto size_of = [](int i) { return std::size_t(1 + (i * 977) % 8000); };
    auto fill = [](unsigned char *d, std::size_t size, int tag, int i) {
      for (std::size_t j = 0; j < size; ++j)
        d[j] = static_cast<unsigned char>(tag * 31 + i * 7 + j * 13 + (j >> 8));
    };
    struct stream {
      stream(ibmsg::socket *f, int t) : from(f), tag(t) {}
      ibmsg::socket *from;
      int tag;
      int posted = 0, sent_ok = 0, sent_failed = 0, received = 0, first_bad = -1;
      std::list<ibmsg::message> in_flight;
    };
    stream up(&p.client, 1), down(&p.server, 2);
    auto stream_from = [&](ibmsg::socket &s) -> stream & {
      return s.handle() == p.client_h ? up : down;
    };
    auto pump = [&](stream &st) {
      while (st.posted < n) {
        ibmsg::message m;
        if (!m.alloc(*st.from, size_of(st.posted))) return;
        fill(static_cast<unsigned char *>(m.data()), m.size(), st.tag, st.posted);
        if (!m.post(*st.from)) return;
        st.in_flight.push_back(std::move(m));
        ++st.posted;
      }
    };
    p.lp.on_message_sent([&](ibmsg::socket &s, ibmsg::message &m, int status) {
      stream &st = stream_from(s);
      (status == IBMSG_OK ? st.sent_ok : st.sent_failed)++;
      st.in_flight.remove_if([&](const ibmsg::message &x) { return &x == &m; });
      pump(st);
    });
    p.lp.on_message_received([&](ibmsg::socket &s, ibmsg::message m) {
      stream &st = s.handle() == p.client_h ? down : up;  // what the client receives came down
      std::vector<unsigned char> want(size_of(st.received));
      fill(want.data(), want.size(), st.tag, st.received);
      bool ok = m.received() && m.size() == want.size() &&
                std::memcmp(m.data(), want.data(), want.size()) == 0;
      if (!ok && st.first_bad < 0) st.first_bad = st.received;
      ++st.received;
    });
    pump(up);
    pump(down);
    CHECK(p.wait(
              [&] {
                return up.received == n && down.received == n && up.sent_ok + up.sent_failed == n &&
                       down.sent_ok + down.sent_failed == n;
              },
              20000),
          "up: %d posted, %d sent, %d received; down: %d posted, %d sent, %d received", up.posted,
          up.sent_ok, up.received, down.posted, down.sent_ok, down.received);
    CHECK(up.first_bad < 0, "client to server: message %d arrived damaged", up.first_bad);
    CHECK(down.first_bad < 0, "server to client: message %d arrived damaged", down.first_bad);
    CHECK(up.sent_failed == 0 && down.sent_failed == 0, "%d + %d sends failed", up.sent_failed,
          down.sent_failed);
    p.close_all();
  });
}

/* ---- errors and would-block ------------------------------------------------------------------ */

void alloc_larger_than_max_throws_emsgsize(void **) {
  guarded([] {
    peers p;
    p.connect();
    ibmsg::message m;
    int code = error_code_of([&] { (void)m.alloc(p.client, p.client.max_msg_size() + 1); });
    CHECK(code == IBMSG_EMSGSIZE, "alloc of max + 1 bytes: %s, expected IBMSG_EMSGSIZE",
          code_name(code));
    CHECK(!m && m.handle() == nullptr, "the failed alloc left a message behind");
    // The default maximum is 4 GiB - 1: allocate what fits in the test VM.
    const std::size_t max = p.client.max_msg_size();
    CHECK(m.alloc(p.client, max < (16u << 20) ? max : (16u << 20)), "alloc would block");
    m = ibmsg::message();
    p.close_all();
  });
}

void disconnect_twice_throws_estate(void **) {
  guarded([] {
    peers p;
    p.connect();
    p.client.disconnect();
    int code = error_code_of([&] { p.client.disconnect(); });
    CHECK(code == IBMSG_ESTATE, "second disconnect: %s, expected IBMSG_ESTATE", code_name(code));
    p.close_all();
  });
}

void listen_on_a_port_in_use_throws_eaddrinuse(void **) {
  guarded([] {
    peers p;
    p.listen();
    ibmsg::socket second;
    int code = error_code_of([&] { second.listen(p.lp, addr, p.port, 1); });
    CHECK(code == IBMSG_EADDRINUSE, "second listener on port %u: %s, expected IBMSG_EADDRINUSE",
          p.port, code_name(code));
    CHECK(!second.is_open(), "the failed listen left the socket open");
    p.close_all();
  });
}

void alloc_with_pool_empty_returns_false(void **) {
  guarded([] {
    peers p;
    p.lp.set_option(IBMSG_OPT_SEND_DEPTH, 4);
    p.connect();
    std::vector<ibmsg::message> taken;
    bool blocked = false;
    while (!blocked && taken.size() < 100) {
      ibmsg::message m;
      if (m.alloc(p.client, 16))
        taken.push_back(std::move(m));
      else
        blocked = true;
    }
    CHECK(blocked, "alloc never returned false (%zu messages taken)", taken.size());
    CHECK(taken.size() == 4, "alloc returned false after %zu messages, SEND_DEPTH is 4",
          taken.size());
    taken.pop_back();  // frees one
    ibmsg::message again;
    CHECK(again.alloc(p.client, 16), "alloc still blocks after a message was freed");
    taken.clear();
    again = ibmsg::message();
    p.close_all();
  });
}

void post_with_full_queue_returns_false(void **) {
  guarded([] {
    constexpr int recv_depth = 4, send_queue = 2;
    peers p;
    p.lp.set_option(IBMSG_OPT_RECV_DEPTH, recv_depth);
    p.lp.set_option(IBMSG_OPT_SEND_QUEUE, send_queue);
    p.connect();
    p.hold = true;  // no credits go back to the client
    ibmsg::message m;
    bool blocked = false;
    int posted = 0;
    while (!blocked && posted < 100) {
      CHECK(m.alloc(p.client, 8), "alloc blocked after %d messages", posted);
      std::memcpy(m.data(), "12345678", 8);
      if (m.post(p.client)) {
        p.outbox.push_back(std::move(m));
        ++posted;
        p.step(5);  // let the server take what it can
      } else {
        blocked = true;
      }
    }
    CHECK(blocked, "post never returned false (%d posted)", posted);
    CHECK(posted >= send_queue && posted <= recv_depth + send_queue,
          "post returned false after %d messages (RECV_DEPTH %d, SEND_QUEUE %d)", posted,
          recv_depth, send_queue);
    CHECK(m.status() == IBMSG_WAITING, "the message that was not posted has status %d", m.status());
    p.hold = false;
    p.held.clear();  // the credits go back: the queue drains
    CHECK(p.wait([&] { return int(p.sent.size()) == posted; }), "%zu of %d messages sent",
          p.sent.size(), posted);
    CHECK(m.post(p.client), "post still blocks after the queue drained");
    p.outbox.push_back(std::move(m));
    CHECK(p.wait([&] { return int(p.received.size()) == posted + 1; }),
          "%zu of %d messages received", p.received.size(), posted + 1);
    for (const auto &s : p.sent)
      CHECK(s.status == IBMSG_OK, "a send failed: %s", code_name(s.status));
    p.close_all();
  });
}

/* ---- moves ----------------------------------------------------------------------------------- */

void moved_socket_keeps_working(void **) {
  guarded([] {
    peers p;
    p.connect();
    ibmsg::socket moved(std::move(p.client));
    CHECK(!p.client && p.client.handle() == nullptr && !p.client.is_open(),
          "the moved-from socket still holds something");
    CHECK(moved.handle() == p.client_h && moved.is_open(), "the moved-to socket lost the C socket");
    p.send(moved, "up");
    p.send(p.server, "down");
    CHECK(p.wait([&] { return p.received.size() == 2 && p.sent.size() == 2; }),
          "%zu received, %zu sent", p.received.size(), p.sent.size());
    for (const auto &r : p.received) {
      if (r.handle == p.client_h) {
        CHECK(r.sock == &moved, "the client's message_received got the moved-from socket");
        CHECK(r.data == "down", "the client received \"%s\"", r.data.c_str());
      }
    }
    for (const auto &s : p.sent)
      if (s.sock->handle() == p.client_h)
        CHECK(s.sock == &moved, "the client's message_sent got the moved-from socket");
    p.client = std::move(moved);  // and back, by assignment
    p.client.disconnect();
    CHECK(p.wait([&] { return p.closed_reason(p.client_h) >= 0; }), "the client did not close");
    for (const auto &c : p.closed)
      if (c.handle == p.client_h)
        CHECK(c.sock == &p.client, "connection_closed got the moved-from wrapper");
    p.close_all();
  });
}

void moved_loop_keeps_working(void **) {
  guarded([] {
    peers p;
    p.connect();
    ibmsg::loop moved(std::move(p.lp));
    CHECK(!p.lp && p.lp.handle() == nullptr, "the moved-from loop still holds something");
    p.step = [&](int ms) { moved.dispatch(ms); };
    p.send(p.client, "through the moved loop");
    CHECK(p.wait([&] { return p.received.size() == 1 && p.sent.size() == 1; }),
          "%zu received, %zu sent through the moved loop", p.received.size(), p.sent.size());
    CHECK(p.received[0].data == "through the moved loop", "received \"%s\"",
          p.received[0].data.c_str());
    p.lp = std::move(moved);  // and back, by assignment
    p.step = [&](int ms) { p.lp.dispatch(ms); };
    p.close_all();
  });
}

void moved_message_in_flight_gets_sent_callback(void **) {
  guarded([] {
    peers p;
    p.connect();
    ibmsg::message m;
    CHECK(m.alloc(p.client, 5), "alloc would block");
    std::memcpy(m.data(), "hello", 5);
    ibmsg_buffer *h = m.handle();
    CHECK(m.post(p.client), "post would block");
    ibmsg::message moved(std::move(m));
    CHECK(!m && moved.handle() == h, "the move did not carry the C message");
    CHECK(p.wait([&] { return p.sent.size() == 1; }), "no message_sent callback");
    CHECK(p.sent[0].msg == &moved, "message_sent got the moved-from message");
    CHECK(p.sent[0].status == IBMSG_OK, "sent with %s", code_name(p.sent[0].status));
    CHECK(moved.status() == IBMSG_SENT, "status %d after message_sent", moved.status());
    moved.free();
    CHECK(!moved, "free() left the message behind");
    p.close_all();
  });
}

/* ---- RAII --------------------------------------------------------------------------------------
 */

void message_dropped_in_flight_is_freed_after_sending(void **) {
  guarded([] {
    peers p;
    p.connect();
    {
      ibmsg::message m;
      CHECK(m.alloc(p.client, 4), "alloc would block");
      std::memcpy(m.data(), "gone", 4);
      CHECK(m.post(p.client), "post would block");
    }  // in flight: the loop frees it once it is sent
    CHECK(p.wait([&] { return p.received.size() == 1; }), "the dropped message never arrived");
    CHECK(p.received[0].data == "gone", "received \"%s\"", p.received[0].data.c_str());
    p.step(50);
    CHECK(p.sent.empty(), "message_sent reached the application for a dropped message");
    p.close_all();  // fails with IBMSG_EBUSY if the message was never freed
  });
}

void destroyed_socket_disconnects(void **) {
  guarded([] {
    peers p;
    p.connect();
    { ibmsg::socket gone(std::move(p.client)); }
    CHECK(p.wait([&] { return p.closed_reason(p.server_h) >= 0; }),
          "the server did not close after the client's wrapper died");
    CHECK(p.closed_reason(p.server_h) == IBMSG_ECONNRESET, "server closed with %s",
          code_name(p.closed_reason(p.server_h)));
    p.step(50);
    CHECK(p.closed_reason(p.client_h) < 0,
          "connection_closed reached the application for a "
          "destroyed socket");
    p.close_all();  // fails with IBMSG_EBUSY if the client never closed
  });
}

void received_message_held_until_wrapper_dies(void **) {
  guarded([] {
    peers p;
    p.hold = true;
    p.connect();
    p.send(p.client, "keep me");
    CHECK(p.wait([&] { return p.held.size() == 1; }), "nothing received");
    CHECK(p.held[0].received() && p.held[0].status() == IBMSG_RECEIVED,
          "held message: received() %d, status %d", p.held[0].received(), p.held[0].status());
    CHECK(text_of(p.held[0]) == "keep me", "held \"%s\"", text_of(p.held[0]).c_str());
    p.client.disconnect();
    CHECK(p.wait([&] { return !p.client.is_open() && !p.server.is_open(); }), "no close");
    p.listener.disconnect();
    CHECK(p.wait([&] { return !p.listener.is_open(); }), "listener did not close");
    p.outbox.clear();
    int code = error_code_of([&] { p.lp.close(); });
    CHECK(code == IBMSG_EBUSY, "closing the loop with a message held: %s, expected IBMSG_EBUSY",
          code_name(code));
    p.held.clear();  // the wrapper frees it
    code = error_code_of([&] { p.lp.close(); });
    CHECK(code == 0, "closing the loop after the message died: %s", code_name(code));
  });
}

void destructors_then_drain_close_everything(void **) {
  guarded([] {
    const unsigned leaked = ibmsg::loop::leaked_loops();
    auto p = std::make_unique<peers>();  // the loop is its first member: destroyed last
    p->connect();
    p->send(p->client, "in flight while everything dies");
    p->hold = true;
    p->send(p->server, "held while everything dies");
    CHECK(p->wait([&] { return !p->held.empty(); }), "nothing received");
    {  // messages, then sockets (disconnected) die; the loop stays
      p->held.clear();
      p->outbox.clear();
      ibmsg::socket a = std::move(p->client), b = std::move(p->server), c = std::move(p->listener);
    }
    auto start = std::chrono::steady_clock::now();
    CHECK(p->lp.drain(std::chrono::seconds(30)), "drain(): still closing after 30 s");
    auto drained = std::chrono::steady_clock::now();
    p.reset();  // the loop: nothing left, so it is freed at once
    auto ms = [](auto d) {
      return static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(d).count());
    };
    print_message("drain() took %lld ms, the destructor %lld ms\n", ms(drained - start),
                  ms(std::chrono::steady_clock::now() - drained));
    CHECK(ibmsg::loop::leaked_loops() == leaked, "the destructor leaked the C loop after drain()");
    CHECK(std::chrono::steady_clock::now() - drained < std::chrono::seconds(1),
          "the destructor took %lld ms", ms(std::chrono::steady_clock::now() - drained));
  });
}

void loop_destructor_does_not_wait_for_closing_sockets(void **) {
  guarded([] {
    unsigned leaked = ibmsg::loop::leaked_loops();
    auto p = std::make_unique<peers>();
    p->connect();
    auto start = std::chrono::steady_clock::now();
    // Destroyed in member order: the sockets disconnect, then the loop dies while they close.
    // It does not wait: what is ready runs once, then the C loop is freed if nothing is left
    // (both ends of a connection on one loop may well be closed by then), else leaked.
    p.reset();
    auto ms = [&] {
      return static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                        std::chrono::steady_clock::now() - start)
                                        .count());
    };
    CHECK(ms() < 1000, "the loop's destructor took %lld ms", ms());
    print_message("sockets closing: the destructor took %lld ms and %s the C loop\n", ms(),
                  ibmsg::loop::leaked_loops() == leaked ? "freed" : "leaked");
    // A listener the application never closes: the C loop cannot go, and is leaked at once.
    leaked = ibmsg::loop::leaked_loops();
    auto lp = std::make_unique<ibmsg::loop>();
    auto *kept = new ibmsg::socket;  // never closed, never freed: the test leaks it on purpose
    kept->listen(*lp, addr, 0, 1);
    start = std::chrono::steady_clock::now();
    lp.reset();
    CHECK(ms() < 1000, "the loop's destructor took %lld ms", ms());
    CHECK(ibmsg::loop::leaked_loops() == leaked + 1, "leaked_loops() is %u, expected %u",
          ibmsg::loop::leaked_loops(), leaked + 1);
  });
}

/* ---- closed callback ---------------------------------------------------------------------------
 */

void closed_callback_gets_reason(void **) {
  guarded([] {
    peers p;
    p.connect();
    p.client.disconnect();
    CHECK(p.wait([&] { return p.closed.size() == 2; }), "%zu of 2 sockets closed", p.closed.size());
    CHECK(p.closed_reason(p.client_h) == IBMSG_OK, "client (disconnected) closed with %s",
          code_name(p.closed_reason(p.client_h)));
    CHECK(p.closed_reason(p.server_h) == IBMSG_ECONNRESET,
          "server (peer disconnected) closed "
          "with %s",
          code_name(p.closed_reason(p.server_h)));
    CHECK(p.server.close_reason() == IBMSG_ECONNRESET, "server.close_reason() is %s",
          code_name(p.server.close_reason()));
    p.listener.disconnect();
    CHECK(p.wait([&] { return p.closed.size() == 3; }), "the listener did not close");
    CHECK(p.closed_reason(p.listener_h) == IBMSG_OK, "listener closed with %s",
          code_name(p.closed_reason(p.listener_h)));
    CHECK(p.closed.back().sock == &p.listener, "connection_closed got the wrong wrapper");
    p.close_all();
  });
}

void connect_refused_closes_with_econnrefused(void **) {
  guarded([] {
    peers p;
    p.lp.set_option(IBMSG_OPT_CONNECT_TIMEOUT, 3000);
    p.listen();  // only to find a free port
    p.listener.disconnect();
    CHECK(p.wait([&] { return !p.listener.is_open(); }), "listener did not close");
    p.client.connect(p.lp, addr, p.port);
    p.client_h = p.client.handle();
    CHECK(p.wait([&] { return !p.client.is_open(); }), "connect to a closed port still open");
    CHECK(p.closed_reason(p.client_h) == IBMSG_ECONNREFUSED,
          "closed with %s, expected "
          "IBMSG_ECONNREFUSED",
          code_name(p.closed_reason(p.client_h)));
    CHECK(p.established.empty(), "established fired for a refused connection");
    p.close_all();
  });
}

void reject_closes_peer_with_erejected_and_text(void **) {
  guarded([] {
    peers p;
    std::string peer;
    ibmsg::socket *listener = nullptr;
    int status = -1;
    p.lp.on_connection_request([&](ibmsg::connection_request &r) {
      peer = r.peer_address();
      listener = &r.listener();
      r.reject("go away");
      status = r.status();
    });
    p.listen();
    p.client.connect(p.lp, addr, p.port);
    p.client_h = p.client.handle();
    CHECK(p.wait([&] { return !p.client.is_open(); }), "rejected client still open");
    CHECK(p.closed_reason(p.client_h) == IBMSG_EREJECTED,
          "closed with %s, expected "
          "IBMSG_EREJECTED",
          code_name(p.closed_reason(p.client_h)));
    CHECK(std::strcmp(p.client.reject_reason(), "go away") == 0, "reject_reason \"%s\"",
          p.client.reject_reason());
    CHECK(peer == addr, "request's peer address %s", peer.c_str());
    CHECK(listener == &p.listener, "request's listener() is the wrong wrapper");
    CHECK(status == IBMSG_REJECTED, "request status %d after reject()", status);
    p.close_all();
  });
}

/* ---- exceptions from callbacks -----------------------------------------------------------------
 */

void callback_exception_rethrown_from_dispatch(void **) {
  guarded([] {
    peers p;
    int established = 0, caught = 0;
    std::string what;
    p.lp.on_connection_established([&](ibmsg::socket &) {
      ++established;
      throw std::logic_error("thrown by a callback");
    });
    p.listen();
    p.client.connect(p.lp, addr, p.port);
    auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(wait_ms);
    while (established < 2 && std::chrono::steady_clock::now() < deadline) {
      try {
        p.lp.dispatch(20);
      } catch (const std::logic_error &e) {
        ++caught;
        what = e.what();
      }
    }
    CHECK(established == 2, "%d of 2 established callbacks ran", established);
    CHECK(caught >= 1, "no exception came out of dispatch()");
    CHECK(what == "thrown by a callback", "dispatch() threw \"%s\"", what.c_str());
    CHECK(p.client.status() == IBMSG_CONNECTED, "client status %d after the exceptions",
          p.client.status());
    p.close_all();
  });
}

/* ---- other ways to run the loop ----------------------------------------------------------------
 */

void fd_and_process_drive_the_loop(void **) {
  guarded([] {
    peers p;
    int fd = p.lp.fd();
    CHECK(fd >= 0, "fd() returned %d", fd);
    p.step = [&](int ms) {
      int t = p.lp.timeout();
      struct pollfd pfd = {fd, POLLIN, 0};
      poll(&pfd, 1, t >= 0 && t < ms ? t : ms);
      p.lp.process();
    };
    p.connect();
    p.send(p.client, "polled");
    CHECK(p.wait([&] { return p.received.size() == 1; }), "nothing received");
    CHECK(p.received[0].data == "polled", "received \"%s\"", p.received[0].data.c_str());
    p.close_all();
  });
}

void application_ev_loop_runs_callbacks(void **) {
  struct ev_loop *ev = ev_loop_new(EVFLAG_AUTO);
  CHECK(ev != nullptr, "ev_loop_new failed");
  ev_timer tick;  // bounds each ev_run(EVRUN_ONCE)
  ev_timer_init(
      &tick, [](struct ev_loop *, ev_timer *, int) {}, 0.02, 0.02);
  ev_timer_start(ev, &tick);
  guarded([&] {
    int code = error_code_of([] { ibmsg::loop bad(static_cast<struct ev_loop *>(nullptr)); });
    CHECK(code == IBMSG_EINVAL, "loop(nullptr): %s, expected IBMSG_EINVAL", code_name(code));
    peers p{ibmsg::loop(ev)};
    p.step = [&](int) { ev_run(ev, EVRUN_ONCE); };
    p.connect();
    p.send(p.server, "on the application's loop");
    CHECK(p.wait([&] { return p.received.size() == 1; }), "nothing received");
    CHECK(p.received[0].sock == &p.client, "received on the wrong socket");
    p.close_all();
  });
  ev_timer_stop(ev, &tick);
  ev_loop_destroy(ev);
}

/* ---- one-sided RDMA ---------------------------------------------------------------------------
 */

constexpr unsigned kRemoteRW = IBMSG_ACCESS_REMOTE_READ | IBMSG_ACCESS_REMOTE_WRITE;

// What the handler of one operation saw.
struct op_rec {
  int calls = 0;
  int status = -1;
  std::uint64_t previous = 0;
  ibmsg::socket *sock = nullptr;
};

ibmsg::socket::op_handler record(op_rec &r) {
  return [&r](ibmsg::socket &s, int status) {
    ++r.calls;
    r.status = status;
    r.sock = &s;
  };
}

ibmsg::socket::atomic_handler record_atomic(op_rec &r) {
  return [&r](ibmsg::socket &s, int status, std::uint64_t previous) {
    ++r.calls;
    r.status = status;
    r.previous = previous;
    r.sock = &s;
  };
}

std::uint64_t word_at(const ibmsg::region &r, std::size_t offset) {
  std::uint64_t v;
  std::memcpy(&v, static_cast<const unsigned char *>(r.data()) + offset, sizeof v);
  return v;
}

// Sends d from the server to the client in a message, as an application does, and returns what
// the client makes of the payload.
ibmsg::descriptor share(peers &p, const ibmsg::descriptor &d) {
  std::size_t before = p.received.size();
  p.send(p.server, std::string(reinterpret_cast<const char *>(d.bytes()), d.size()));
  CHECK(p.wait([&] { return p.received.size() == before + 1; }), "the descriptor never arrived");
  const std::string &payload = p.received.back().data;
  CHECK(p.received.back().sock == &p.client, "the descriptor arrived at the wrong socket");
  return ibmsg::descriptor::from_bytes(payload.data(), payload.size());
}

void region_write_then_read_back_is_byte_exact(void **) {
  guarded([] {
    peers p;
    p.connect();
    constexpr std::size_t n = 256 * 1024 + 13, off = 7;
    ibmsg::region target(p.lp, n + 64, kRemoteRW);
    CHECK(target && target.size() == n + 64 && target.data() != nullptr, "allocated region: %zu bytes",
          target.size());
    CHECK(target.access() == (kRemoteRW | IBMSG_ACCESS_LOCAL_WRITE),
          "access() is %#x: remote write implies local write", target.access());
    ibmsg::descriptor mine = target.descriptor(p.server, off, n, kRemoteRW);
    CHECK(mine.valid() && mine.length() == n && mine.access() == kRemoteRW,
          "descriptor: valid %d, length %zu, access %#x", mine.valid(), mine.length(), mine.access());
    CHECK(target.descriptor(p.server, off, n, kRemoteRW) == mine,
          "asking again for the same range and rights gave another descriptor");
    ibmsg::descriptor remote = share(p, mine);
    CHECK(remote == mine, "the descriptor changed on the way");

    std::vector<unsigned char> src_mem(n + 16);  // the application's memory, registered
    for (std::size_t j = 0; j < src_mem.size(); ++j)
      src_mem[j] = static_cast<unsigned char>(j * 7 + (j >> 9) + 1);
    ibmsg::region src(p.lp, src_mem.data(), src_mem.size(), 0);
    CHECK(src.data() == src_mem.data() && src.size() == src_mem.size() && src.access() == 0,
          "registered region: data %p, size %zu, access %#x", src.data(), src.size(),
          src.access());
    ibmsg::region dst(p.lp, n + 16, IBMSG_ACCESS_LOCAL_WRITE);

    op_rec w, r;
    CHECK(p.client.rdma_write(src, 5, n, remote, 0, record(w)), "rdma_write would block");
    CHECK(src.pending() == 1, "pending() is %zu while the write is posted", src.pending());
    CHECK(p.wait([&] { return w.calls > 0; }), "the write's handler did not run");
    CHECK(w.status == IBMSG_OK, "write: %s", code_name(w.status));
    CHECK(w.sock == &p.client, "the write's handler got the wrong socket");
    CHECK(src.pending() == 0, "pending() is %zu after the handler", src.pending());
    const unsigned char *t = static_cast<const unsigned char *>(target.data());
    CHECK(std::memcmp(t + off, src_mem.data() + 5, n) == 0, "written bytes differ");
    CHECK(t[off - 1] == 0 && t[off + n] == 0, "bytes beside the granted range changed");

    CHECK(p.client.rdma_read(dst, 3, n, remote, 0, record(r)), "rdma_read would block");
    CHECK(p.wait([&] { return r.calls > 0; }), "the read's handler did not run");
    CHECK(r.status == IBMSG_OK, "read: %s", code_name(r.status));
    CHECK(std::memcmp(static_cast<const unsigned char *>(dst.data()) + 3, src_mem.data() + 5, n) == 0,
          "read bytes differ");
    p.step(50);
    CHECK(w.calls == 1 && r.calls == 1, "handlers ran %d and %d times", w.calls, r.calls);
    src.deregister();
    CHECK(!src && src.handle() == nullptr && src.data() == nullptr, "deregister() left it behind");
    dst = ibmsg::region();  // deregistered by the assignment
    target = ibmsg::region();
    p.close_all();  // IBMSG_EBUSY if a region were still registered
  });
}

void write_imm_reaches_on_write_received(void **) {
  guarded([] {
    peers p;
    struct seen {
      ibmsg::socket *sock;
      std::uint32_t imm;
      std::size_t length;
      bool bytes_visible;
    };
    std::vector<seen> writes;
    ibmsg::region target(p.lp, 8192, IBMSG_ACCESS_REMOTE_WRITE);
    ibmsg::region src(p.lp, 8192, 0);
    std::memset(src.data(), 0x5a, src.size());
    p.lp.on_write_received([&](ibmsg::socket &s, std::uint32_t imm, std::size_t length) {
      const unsigned char *t = static_cast<const unsigned char *>(target.data());
      bool visible = std::all_of(t + 100, t + 100 + length, [](unsigned char c) { return c == 0x5a; });
      writes.push_back({&s, imm, length, visible});
    });
    p.connect();
    ibmsg::descriptor remote = share(p, target.descriptor(p.server, 100, 4000, IBMSG_ACCESS_REMOTE_WRITE));
    op_rec w;
    CHECK(p.client.rdma_write_imm(src, 0, 4000, remote, 0, 0xdeadbeef, record(w)),
          "rdma_write_imm would block");
    CHECK(p.wait([&] { return w.calls > 0 && !writes.empty(); }),
          "handler ran %d times, write_received %zu times", w.calls, writes.size());
    CHECK(w.status == IBMSG_OK, "write_imm: %s", code_name(w.status));
    CHECK(writes[0].sock == &p.server, "write_received got the wrong socket");
    CHECK(writes[0].imm == 0xdeadbeef && writes[0].length == 4000,
          "write_received got imm %#x, length %zu", writes[0].imm, writes[0].length);
    CHECK(writes[0].bytes_visible, "the bytes were not there when write_received ran");
    p.step(50);
    CHECK(writes.size() == 1 && w.calls == 1, "write_received ran %zu times, the handler %d",
          writes.size(), w.calls);
    src = ibmsg::region();
    target = ibmsg::region();
    p.close_all();
  });
}

void atomics_pass_previous_values_to_lambdas(void **) {
  guarded([] {
    peers p;
    p.connect();
    ibmsg::region counter(p.lp, 64, IBMSG_ACCESS_REMOTE_ATOMIC);
    ibmsg::region results(p.lp, 64, IBMSG_ACCESS_LOCAL_WRITE);
    ibmsg::descriptor remote = share(p, counter.descriptor(p.server, 8, 16, IBMSG_ACCESS_REMOTE_ATOMIC));
    // Posted together: they execute, and their handlers run, in posting order.
    op_rec fadd[5];
    for (int i = 0; i < 5; ++i)
      CHECK(p.client.atomic_fadd(results, 8 * i, remote, 0, i + 1, record_atomic(fadd[i])),
            "atomic_fadd %d would block", i);
    CHECK(p.wait([&] { return fadd[4].calls > 0; }), "the last fadd's handler did not run");
    const std::uint64_t before[5] = {0, 1, 3, 6, 10};
    for (int i = 0; i < 5; ++i) {
      CHECK(fadd[i].calls == 1 && fadd[i].status == IBMSG_OK, "fadd %d: %d calls, %s", i,
            fadd[i].calls, code_name(fadd[i].status));
      CHECK(fadd[i].previous == before[i], "fadd %d: previous %llu, expected %llu", i,
            static_cast<unsigned long long>(fadd[i].previous),
            static_cast<unsigned long long>(before[i]));
      CHECK(word_at(results, 8 * i) == before[i], "fadd %d: the local region holds %llu", i,
            static_cast<unsigned long long>(word_at(results, 8 * i)));
    }
    CHECK(word_at(counter, 8) == 15, "the counter is %llu after adding 1..5",
          static_cast<unsigned long long>(word_at(counter, 8)));

    op_rec hit, miss;
    CHECK(p.client.atomic_cas(results, 40, remote, 0, 15, 100, record_atomic(hit)), "cas would block");
    CHECK(p.wait([&] { return hit.calls > 0; }), "the cas handler did not run");
    CHECK(hit.status == IBMSG_OK && hit.previous == 15, "matching cas: %s, previous %llu",
          code_name(hit.status), static_cast<unsigned long long>(hit.previous));
    CHECK(word_at(counter, 8) == 100, "after a matching cas the word is %llu",
          static_cast<unsigned long long>(word_at(counter, 8)));
    CHECK(p.client.atomic_cas(results, 48, remote, 8, 1, 7, record_atomic(miss)), "cas would block");
    CHECK(p.wait([&] { return miss.calls > 0; }), "the second cas handler did not run");
    CHECK(miss.status == IBMSG_OK && miss.previous == 0, "cas on the second word: %s, previous %llu",
          code_name(miss.status), static_cast<unsigned long long>(miss.previous));
    CHECK(word_at(counter, 16) == 0 && word_at(counter, 8) == 100,
          "a cas whose compare failed changed memory: %llu, %llu",
          static_cast<unsigned long long>(word_at(counter, 16)),
          static_cast<unsigned long long>(word_at(counter, 8)));
    results = ibmsg::region();
    counter = ibmsg::region();
    p.close_all();
  });
}

void message_post_imm_carries_the_immediate(void **) {
  guarded([] {
    peers p;
    p.connect();
    ibmsg::message m;
    CHECK(m.alloc(p.client, 4), "alloc would block");
    std::memcpy(m.data(), "imm!", 4);
    CHECK(m.post_imm(p.client, 0x12345678), "post_imm would block");
    p.outbox.push_back(std::move(m));
    p.send(p.client, "none");
    CHECK(p.wait([&] { return p.received.size() == 2; }), "%zu of 2 messages received",
          p.received.size());
    CHECK(p.received[0].data == "imm!" && p.received[0].has_imm && p.received[0].imm == 0x12345678,
          "first message \"%s\": has_imm %d, imm %#x", p.received[0].data.c_str(),
          p.received[0].has_imm, p.received[0].imm);
    CHECK(p.received[1].data == "none" && !p.received[1].has_imm && p.received[1].imm == 0,
          "second message \"%s\": has_imm %d, imm %#x", p.received[1].data.c_str(),
          p.received[1].has_imm, p.received[1].imm);
    p.close_all();
  });
}

void operation_errors_throw_and_post_nothing(void **) {
  guarded([] {
    peers p;
    p.connect();
    int code = error_code_of([&] { ibmsg::region bad(p.lp, 0, IBMSG_ACCESS_LOCAL_WRITE); });
    CHECK(code == IBMSG_EINVAL, "region of 0 bytes: %s, expected IBMSG_EINVAL", code_name(code));
    ibmsg::region target(p.lp, 4096, IBMSG_ACCESS_REMOTE_READ | IBMSG_ACCESS_REMOTE_ATOMIC);
    ibmsg::region plain(p.lp, 4096, 0);  // no local write
    ibmsg::region empty;
    code = error_code_of([&] { (void)target.descriptor(p.server, 4000, 100, IBMSG_ACCESS_REMOTE_READ); });
    CHECK(code == IBMSG_ERANGE, "descriptor past the end: %s, expected IBMSG_ERANGE", code_name(code));
    code = error_code_of([&] { (void)target.descriptor(p.server, 0, 100, IBMSG_ACCESS_REMOTE_WRITE); });
    CHECK(code == IBMSG_EACCES, "descriptor with a right the region lacks: %s, expected IBMSG_EACCES",
          code_name(code));
    ibmsg::descriptor remote =
        share(p, target.descriptor(p.server, 0, 1024, IBMSG_ACCESS_REMOTE_READ | IBMSG_ACCESS_REMOTE_ATOMIC));

    // Bytes that are no descriptor.
    ibmsg::descriptor none;
    CHECK(!none.valid(), "a default descriptor is valid");
    code = error_code_of([&] { (void)none.length(); });
    CHECK(code == IBMSG_EBADDESC, "length() of a default descriptor: %s", code_name(code));
    code = error_code_of([&] { (void)ibmsg::descriptor::from_bytes(remote.bytes(), remote.size() - 1); });
    CHECK(code == IBMSG_EBADDESC, "from_bytes of 31 bytes: %s, expected IBMSG_EBADDESC", code_name(code));
    unsigned char damaged[IBMSG_DESCRIPTOR_SIZE];
    std::memcpy(damaged, remote.bytes(), sizeof damaged);
    damaged[20] ^= 1;
    code = error_code_of([&] { (void)ibmsg::descriptor::from_bytes(damaged, sizeof damaged); });
    CHECK(code == IBMSG_EBADDESC, "from_bytes of a damaged descriptor: %s, expected IBMSG_EBADDESC",
          code_name(code));

    auto token = std::make_shared<int>(0);  // every handler holds it: its storage is freed
    int calls = 0;
    auto counting = [&calls, token](ibmsg::socket &, int) { ++calls; };
    auto counting_atomic = [&calls, token](ibmsg::socket &, int, std::uint64_t) { ++calls; };
    // Each attempt has exactly one fault, so the order of the library's checks does not matter.
    struct attempt {
      const char *what;
      int expected;
      std::function<bool()> post;
    };
    const attempt attempts[] = {
        {"read past the descriptor", IBMSG_ERANGE,
         [&] { return p.client.rdma_read(target, 0, 100, remote, 1000, counting); }},
        {"write without the write right", IBMSG_EACCES,
         [&] { return p.client.rdma_write(plain, 0, 100, remote, 0, counting); }},
        {"read into a region without local write", IBMSG_EACCES,
         [&] { return p.client.rdma_read(plain, 0, 100, remote, 0, counting); }},
        {"read past the local region", IBMSG_ERANGE,
         [&] { return p.client.rdma_read(target, 4090, 100, remote, 0, counting); }},
        {"read of 0 bytes", IBMSG_EINVAL,
         [&] { return p.client.rdma_read(target, 0, 0, remote, 0, counting); }},
        {"read from a default descriptor", IBMSG_EBADDESC,
         [&] { return p.client.rdma_read(target, 0, 8, none, 0, counting); }},
        {"read into an empty region", IBMSG_EINVAL,
         [&] { return p.client.rdma_read(empty, 0, 8, remote, 0, counting); }},
        {"fadd on an unaligned word", IBMSG_EINVAL,
         [&] { return p.client.atomic_fadd(target, 0, remote, 4, 1, counting_atomic); }},
        {"cas into a region without local write", IBMSG_EACCES,
         [&] { return p.client.atomic_cas(plain, 0, remote, 0, 0, 1, counting_atomic); }},
        {"read on the listener", IBMSG_ESTATE,
         [&] { return p.listener.rdma_read(target, 0, 8, remote, 0, counting); }},
    };
    for (const attempt &a : attempts) {
      code = error_code_of([&] { (void)a.post(); });
      CHECK(code == a.expected, "%s: %s, expected %s", a.what, code_name(code), code_name(a.expected));
    }
    CHECK(plain.pending() == 0 && target.pending() == 0, "a failed call left pending operations");
    p.step(50);
    CHECK(calls == 0, "%d handlers ran for calls that failed", calls);
    CHECK(token.use_count() == 3, "%ld holders of the token: a failed call kept its handler",
          token.use_count());
    code = error_code_of([&] { target.revoke(none); });
    CHECK(code == IBMSG_EBADDESC, "revoking a default descriptor: %s", code_name(code));
    code = error_code_of([&] { empty.deregister(); });
    CHECK(code == IBMSG_EINVAL, "deregistering an empty region: %s", code_name(code));
    plain = ibmsg::region();
    target = ibmsg::region();
    p.close_all();
  });
}

void rdma_options_work_through_the_generic_setters(void **) {
  guarded([] {
    peers p;
    CHECK(p.lp.get_option(IBMSG_OPT_RDMA) == 1, "loop's RDMA default %d", p.lp.get_option(IBMSG_OPT_RDMA));
    CHECK(p.lp.get_option(IBMSG_OPT_RDMA_DEPTH) == 16, "loop's RDMA_DEPTH default %d",
          p.lp.get_option(IBMSG_OPT_RDMA_DEPTH));
    p.lp.set_option(IBMSG_OPT_RDMA_DEPTH, 4);
    CHECK(p.lp.get_option(IBMSG_OPT_RDMA_DEPTH) == 4, "RDMA_DEPTH reads back %d",
          p.lp.get_option(IBMSG_OPT_RDMA_DEPTH));
    int code = error_code_of([&] { p.lp.set_option(IBMSG_OPT_RDMA_DEPTH, 0); });
    CHECK(code == IBMSG_EINVAL, "RDMA_DEPTH 0: %s, expected IBMSG_EINVAL", code_name(code));
    code = error_code_of([&] { p.lp.set_option(IBMSG_OPT_RDMA, 2); });
    CHECK(code == IBMSG_EINVAL, "RDMA 2: %s, expected IBMSG_EINVAL", code_name(code));
    ibmsg::options off(p.lp);
    CHECK(off.get(IBMSG_OPT_RDMA_DEPTH) == 4, "a set from the loop has RDMA_DEPTH %d",
          off.get(IBMSG_OPT_RDMA_DEPTH));
    off.set(IBMSG_OPT_RDMA, 0);
    CHECK(off.get(IBMSG_OPT_RDMA) == 0, "RDMA reads back %d from the set", off.get(IBMSG_OPT_RDMA));

    // A client without one-sided RDMA: its operations and descriptors are refused.
    p.listen();
    p.client.connect(p.lp, addr, p.port, off);
    p.client_h = p.client.handle();
    CHECK(p.wait([&] { return p.established.size() == 2; }), "%zu of 2 sockets established",
          p.established.size());
    ibmsg::region target(p.lp, 4096, IBMSG_ACCESS_REMOTE_WRITE);
    ibmsg::region src(p.lp, 4096, 0);
    ibmsg::descriptor remote = share(p, target.descriptor(p.server, 0, 4096, IBMSG_ACCESS_REMOTE_WRITE));
    op_rec w;
    code = error_code_of([&] { (void)p.client.rdma_write(src, 0, 8, remote, 0, record(w)); });
    CHECK(code == IBMSG_EOPNOTSUPP, "write with RDMA off: %s, expected IBMSG_EOPNOTSUPP",
          code_name(code));
    code = error_code_of([&] { (void)target.descriptor(p.client, 0, 8, IBMSG_ACCESS_REMOTE_WRITE); });
    CHECK(code == IBMSG_EOPNOTSUPP, "descriptor on a socket with RDMA off: %s, expected "
          "IBMSG_EOPNOTSUPP", code_name(code));
    p.step(50);
    CHECK(w.calls == 0, "the refused write's handler ran");
    src = ibmsg::region();
    target = ibmsg::region();
    p.close_all();
  });
}

void full_send_queue_returns_false_and_drops_the_handler(void **) {
  guarded([] {
    peers p;
    p.lp.set_option(IBMSG_OPT_RDMA_DEPTH, 1);
    p.lp.set_option(IBMSG_OPT_SEND_QUEUE, 2);
    p.connect();
    ibmsg::region target(p.lp, 1 << 20, IBMSG_ACCESS_REMOTE_WRITE);
    ibmsg::region src(p.lp, 1 << 20, 0);
    ibmsg::descriptor remote = share(p, target.descriptor(p.server, 0, 1 << 20, IBMSG_ACCESS_REMOTE_WRITE));
    auto token = std::make_shared<int>(0);
    std::vector<int> statuses;
    auto handler = [&statuses, token](ibmsg::socket &, int status) { statuses.push_back(status); };
    int posted = 0;
    bool blocked = false;
    // Nothing completes between the calls (no dispatch): 1 in flight and 2 queued, then full.
    while (!blocked && posted < 10) {
      if (p.client.rdma_write(src, 0, 1 << 20, remote, 0, handler))
        ++posted;
      else
        blocked = true;
    }
    CHECK(blocked && posted == 3, "blocked %d after %d writes (RDMA_DEPTH 1, SEND_QUEUE 2)",
          blocked, posted);
    CHECK(src.pending() == 3, "pending() is %zu", src.pending());
    CHECK(token.use_count() == 2 + 3, "%ld holders of the token with 3 writes posted",
          token.use_count());
    CHECK(p.wait([&] { return statuses.size() == 3; }), "%zu of 3 handlers ran", statuses.size());
    for (int st : statuses) CHECK(st == IBMSG_OK, "a write: %s", code_name(st));
    CHECK(p.client.rdma_write(src, 0, 1 << 20, remote, 0, handler), "still blocked after draining");
    CHECK(p.wait([&] { return statuses.size() == 4; }), "the fourth handler did not run");
    p.step(50);
    CHECK(statuses.size() == 4, "%zu handler calls for 4 writes", statuses.size());
    CHECK(token.use_count() == 2, "%ld holders of the token after all handlers: storage leaked",
          token.use_count());
    src = ibmsg::region();
    target = ibmsg::region();
    p.close_all();
  });
}

void handlers_run_once_when_the_connection_closes_in_flight(void **) {
  guarded([] {
    peers p;
    p.connect();
    constexpr std::size_t mib = 1 << 20;
    ibmsg::region target(p.lp, mib, kRemoteRW | IBMSG_ACCESS_REMOTE_ATOMIC);
    ibmsg::region local(p.lp, mib, IBMSG_ACCESS_LOCAL_WRITE);
    ibmsg::descriptor remote =
        share(p, target.descriptor(p.server, 0, mib, kRemoteRW | IBMSG_ACCESS_REMOTE_ATOMIC));
    auto token = std::make_shared<int>(0);
    constexpr int writes = 30, reads = 4, fadds = 4, n = writes + reads + fadds;
    std::vector<int> calls(n, 0), status(n, -1);
    std::size_t handled_before_closed = 0;
    std::size_t handled = 0;
    bool client_closed = false;
    p.lp.on_connection_closed([&](ibmsg::socket &s, int reason) {
      p.closed.push_back({&s, s.handle(), reason});
      if (s.handle() == p.client_h) {
        client_closed = true;
        handled_before_closed = handled;
      }
    });
    auto on = [&, token](int i) {
      return [&, token, i](ibmsg::socket &, int st) {
        ++calls[i];
        status[i] = st;
        ++handled;
      };
    };
    for (int i = 0; i < n; ++i) {
      bool ok;
      if (i < writes)
        ok = p.client.rdma_write(local, 0, mib, remote, 0, on(i));
      else if (i < writes + reads)
        ok = p.client.rdma_read(local, 0, mib, remote, 0, on(i));
      else
        ok = p.client.atomic_fadd(local, 8 * (i - writes - reads), remote, 0, 1,
                                  [h = on(i)](ibmsg::socket &s, int st, std::uint64_t) { h(s, st); });
      CHECK(ok, "operation %d would block", i);
    }
    CHECK(local.pending() == std::size_t(n), "pending() is %zu with %d posted", local.pending(), n);
    p.client.disconnect();  // before any completion was processed
    CHECK(p.wait([&] { return client_closed; }), "the client did not close");
    p.step(50);
    int ok = 0, canceled = 0;
    for (int i = 0; i < n; ++i) {
      CHECK(calls[i] == 1, "operation %d: its handler ran %d times", i, calls[i]);
      CHECK(status[i] == IBMSG_OK || status[i] == IBMSG_ECANCELED, "operation %d: %s", i,
            code_name(status[i]));
      (status[i] == IBMSG_OK ? ok : canceled)++;
    }
    std::printf("# %d operations completed, %d canceled by the disconnect\n", ok, canceled);
    CHECK(handled_before_closed == std::size_t(n),
          "%zu of %d handlers had run when connection_closed came", handled_before_closed, n);
    CHECK(local.pending() == 0, "pending() is %zu after the close", local.pending());
    CHECK(token.use_count() == 2, "%ld holders of the token after every handler ran",
          token.use_count());
    local.deregister();  // IBMSG_EBUSY if the library still counted an operation on it
    target = ibmsg::region();
    p.close_all();
  });
}

void operations_of_a_destroyed_socket_free_their_handlers(void **) {
  guarded([] {
    peers p;
    p.connect();
    ibmsg::region target(p.lp, 1 << 20, IBMSG_ACCESS_REMOTE_WRITE);
    ibmsg::region src(p.lp, 1 << 20, 0);
    ibmsg::descriptor remote = share(p, target.descriptor(p.server, 0, 1 << 20, IBMSG_ACCESS_REMOTE_WRITE));
    auto token = std::make_shared<int>(0);
    int calls = 0;
    for (int i = 0; i < 8; ++i)
      CHECK(p.client.rdma_write(src, 0, 1 << 20, remote, 0,
                                [&calls, token](ibmsg::socket &, int) { ++calls; }),
            "write %d would block", i);
    { ibmsg::socket gone(std::move(p.client)); }  // disconnects; nothing reaches us any more
    CHECK(p.wait([&] { return token.use_count() == 1; }),
          "%ld holders of the token: the operations of the dead socket kept their handlers",
          token.use_count());
    CHECK(calls == 0, "%d handlers ran for a destroyed socket", calls);
    CHECK(src.pending() == 0, "pending() is %zu", src.pending());
    src.deregister();
    target = ibmsg::region();
    p.close_all();
  });
}

void region_destroyed_after_its_operations_completed(void **) {
  guarded([] {
    peers p;
    p.connect();
    ibmsg::region target(p.lp, 4096, IBMSG_ACCESS_REMOTE_WRITE);
    ibmsg::descriptor remote = share(p, target.descriptor(p.server, 0, 4096, IBMSG_ACCESS_REMOTE_WRITE));
    op_rec w;
    {
      std::vector<char> mem(4096, 'x');
      ibmsg::region src(p.lp, mem.data(), mem.size(), 0);
      CHECK(p.client.rdma_write(src, 0, 4096, remote, 0, record(w)), "write would block");
      CHECK(p.wait([&] { return w.calls > 0; }), "the write's handler did not run");
      CHECK(src.pending() == 0, "pending() is %zu after the handler", src.pending());
    }  // deregistered here, then the memory goes
    CHECK(w.status == IBMSG_OK, "write: %s", code_name(w.status));
    CHECK(static_cast<const char *>(target.data())[4095] == 'x', "the write did not land");
    target = ibmsg::region();
    p.close_all();  // IBMSG_EBUSY if the region were still registered
  });
}

void region_destroyed_while_in_use_is_deregistered_after_the_last_operation(void **) {
  guarded([] {
    peers p;
    p.connect();
    constexpr std::size_t n = 4 << 20;
    ibmsg::region target(p.lp, n, IBMSG_ACCESS_REMOTE_READ);
    std::memset(target.data(), 0x33, n);
    ibmsg::descriptor remote = share(p, target.descriptor(p.server, 0, n, IBMSG_ACCESS_REMOTE_READ));
    op_rec r1, r2;
    int seen_pending = -1;
    {
      ibmsg::region dst(p.lp, n, IBMSG_ACCESS_LOCAL_WRITE);
      CHECK(p.client.rdma_read(dst, 0, n, remote, 0, record(r1)), "read would block");
      CHECK(p.client.rdma_read(dst, 0, n, remote, 0, record(r2)), "read would block");
      seen_pending = int(dst.pending());
      int code = error_code_of([&] { dst.deregister(); });
      CHECK(code == IBMSG_EBUSY, "deregister() with reads in flight: %s, expected IBMSG_EBUSY",
            code_name(code));
      CHECK(dst && dst.size() == n, "the refused deregister() changed the region");
    }  // the destructor cannot deregister: the loop does after the second read
    CHECK(seen_pending == 2, "pending() was %d with 2 reads posted", seen_pending);
    CHECK(p.wait([&] { return r1.calls > 0 && r2.calls > 0; }), "handlers ran %d and %d times",
          r1.calls, r2.calls);
    CHECK(r1.status == IBMSG_OK && r2.status == IBMSG_OK, "reads: %s, %s", code_name(r1.status),
          code_name(r2.status));
    target = ibmsg::region();
    p.close_all();  // IBMSG_EBUSY if the orphaned region were never deregistered
  });
}

void drain_waits_for_a_region_still_in_use(void **) {
  guarded([] {
    auto p = std::make_unique<peers>();
    p->connect();
    ibmsg::region target(p->lp, 1 << 20, IBMSG_ACCESS_REMOTE_WRITE);
    ibmsg::descriptor remote = share(*p, target.descriptor(p->server, 0, 1 << 20, IBMSG_ACCESS_REMOTE_WRITE));
    auto token = std::make_shared<int>(0);
    {
      ibmsg::region src(p->lp, 1 << 20, 0);
      for (int i = 0; i < 8; ++i)
        CHECK(p->client.rdma_write(src, 0, 1 << 20, remote, 0, [token](ibmsg::socket &, int) {}),
              "write %d would block", i);
    }  // orphaned with 8 writes pending
    target.deregister();
    const unsigned leaked = ibmsg::loop::leaked_loops();
    {  // sockets die (disconnect); drain() waits for them and the region
      ibmsg::socket a = std::move(p->client), b = std::move(p->server), c = std::move(p->listener);
    }
    CHECK(p->lp.drain(std::chrono::seconds(30)), "drain(): still closing after 30 s");
    p.reset();
    CHECK(ibmsg::loop::leaked_loops() == leaked, "the C loop was leaked after drain()");
    CHECK(token.use_count() == 1, "%ld holders of the token after the loop died",
          token.use_count());
  });
}

void moved_region_keeps_working(void **) {
  guarded([] {
    peers p;
    p.connect();
    ibmsg::region target(p.lp, 8192, kRemoteRW);
    ibmsg::descriptor remote = share(p, target.descriptor(p.server, 0, 8192, kRemoteRW));
    ibmsg::region a(p.lp, 8192, IBMSG_ACCESS_LOCAL_WRITE);
    std::memset(a.data(), 0x77, a.size());
    ibmsg_region *h = a.handle();
    void *data = a.data();
    op_rec w, r;
    CHECK(p.client.rdma_write(a, 0, 8192, remote, 0, record(w)), "write would block");
    ibmsg::region b(std::move(a));  // while the write is posted
    CHECK(!a && a.handle() == nullptr && a.data() == nullptr && a.size() == 0 && a.pending() == 0,
          "the moved-from region still holds something");
    CHECK(b.handle() == h && b.data() == data && b.size() == 8192 && b.pending() == 1,
          "the moved-to region: handle %p, size %zu, pending %zu", static_cast<void *>(b.handle()),
          b.size(), b.pending());
    CHECK(p.wait([&] { return w.calls > 0; }), "the write's handler did not run");
    CHECK(w.status == IBMSG_OK && b.pending() == 0, "write: %s, pending %zu", code_name(w.status),
          b.pending());
    int code = error_code_of([&] { (void)p.client.rdma_read(a, 0, 8, remote, 0, record(r)); });
    CHECK(code == IBMSG_EINVAL, "read into a moved-from region: %s, expected IBMSG_EINVAL",
          code_name(code));
    ibmsg::region c(p.lp, 4096, 0);
    c = std::move(b);  // deregisters c's own region, takes b's
    CHECK(c.handle() == h && !b, "move assignment did not carry the region");
    std::memset(c.data(), 0, c.size());
    CHECK(p.client.rdma_read(c, 0, 8192, remote, 0, record(r)), "read would block");
    CHECK(p.wait([&] { return r.calls > 0; }), "the read's handler did not run");
    const unsigned char *d = static_cast<const unsigned char *>(c.data());
    CHECK(r.status == IBMSG_OK && d[0] == 0x77 && d[8191] == 0x77, "read back through the moved "
          "region: %s, bytes %#x %#x", code_name(r.status), d[0], d[8191]);
    c = ibmsg::region();
    target = ibmsg::region();
    p.close_all();  // IBMSG_EBUSY if c's first region was not deregistered by the assignment
  });
}

void revoked_descriptor_fails_the_peers_operation(void **) {
  guarded([] {
    peers p;
    p.connect();
    ibmsg::region target(p.lp, 4096, IBMSG_ACCESS_REMOTE_WRITE);
    ibmsg::region src(p.lp, 4096, 0);
    ibmsg::descriptor mine = target.descriptor(p.server, 0, 4096, IBMSG_ACCESS_REMOTE_WRITE);
    ibmsg::descriptor remote = share(p, mine);
    target.revoke(mine);
    int code = error_code_of([&] { target.revoke(mine); });
    CHECK(code == IBMSG_EBADDESC, "revoking twice: %s, expected IBMSG_EBADDESC", code_name(code));
    op_rec w;
    CHECK(p.client.rdma_write(src, 0, 64, remote, 0, record(w)), "write would block");
    CHECK(p.wait([&] { return w.calls > 0 && !p.client.is_open(); }),
          "handler ran %d times, client open %d", w.calls, p.client.is_open());
    CHECK(w.status == IBMSG_EREMOTEACCESS, "write on a revoked descriptor: %s, expected "
          "IBMSG_EREMOTEACCESS", code_name(w.status));
    CHECK(p.closed_reason(p.client_h) == IBMSG_EREMOTEACCESS, "the client closed with %s",
          code_name(p.closed_reason(p.client_h)));
    src = ibmsg::region();
    target = ibmsg::region();
    p.close_all();
  });
}

/* ---- 1.2: large messages, regions, memory ---------------------------------------------------
 */

// The bytes a message of size n filled with pattern tag holds.
std::string pattern(std::size_t n, int tag) {
  std::string d(n, '\0');
  for (std::size_t j = 0; j < n; ++j) d[j] = static_cast<char>(tag * 29 + j * 7 + (j >> 10));
  return d;
}

void wide_option_values_reach_max_msg_size(void **) {
  guarded([] {
    peers p;
    const std::uint64_t max = (std::uint64_t(1) << 32) - 1, three_gib = std::uint64_t(3) << 30;
    p.lp.set_option(IBMSG_OPT_MAX_MSG_SIZE, max);
    CHECK(p.lp.get_option_u64(IBMSG_OPT_MAX_MSG_SIZE) == max, "MAX_MSG_SIZE reads back %llu",
          static_cast<unsigned long long>(p.lp.get_option_u64(IBMSG_OPT_MAX_MSG_SIZE)));
    CHECK(p.lp.get_option(IBMSG_OPT_MAX_MSG_SIZE) == INT_MAX, "as an int it reads %d",
          p.lp.get_option(IBMSG_OPT_MAX_MSG_SIZE));
    int code = error_code_of([&] { p.lp.set_option(IBMSG_OPT_MAX_MSG_SIZE, max + 1); });
    CHECK(code == IBMSG_EINVAL, "MAX_MSG_SIZE 2^32: %s, expected IBMSG_EINVAL", code_name(code));
    code = error_code_of([&] { p.lp.set_option(IBMSG_OPT_MAX_MSG_SIZE, -1L); });
    CHECK(code == IBMSG_EINVAL, "MAX_MSG_SIZE -1L: %s, expected IBMSG_EINVAL", code_name(code));
    CHECK(p.lp.get_option_u64(IBMSG_OPT_MAX_MSG_SIZE) == max, "a refused value changed it");
    // The int options take other integer types too, but never a truncated value.
    p.lp.set_option(IBMSG_OPT_RECV_DEPTH, std::size_t(9));
    CHECK(p.lp.get_option(IBMSG_OPT_RECV_DEPTH) == 9 &&
              p.lp.get_option_u64(IBMSG_OPT_RECV_DEPTH) == 9,
          "RECV_DEPTH from a size_t reads back %d", p.lp.get_option(IBMSG_OPT_RECV_DEPTH));
    code = error_code_of([&] { p.lp.set_option(IBMSG_OPT_RECV_DEPTH, (std::uint64_t(1) << 32) + 9); });
    CHECK(code == IBMSG_EINVAL, "RECV_DEPTH 2^32 + 9: %s, expected IBMSG_EINVAL", code_name(code));
    CHECK(p.lp.get_option(IBMSG_OPT_RECV_DEPTH) == 9, "RECV_DEPTH is %d after the refusal",
          p.lp.get_option(IBMSG_OPT_RECV_DEPTH));
    p.lp.set_option(IBMSG_OPT_RECV_DEPTH, 32);
    p.lp.set_option(IBMSG_OPT_BUSY_POLL, IBMSG_BUSY_POLL_ALWAYS);
    code = error_code_of([&] { (void)p.lp.get_option_u64(IBMSG_OPT_BUSY_POLL); });
    CHECK(code == IBMSG_ERANGE, "a negative option as uint64: %s, expected IBMSG_ERANGE",
          code_name(code));
    p.lp.set_option(IBMSG_OPT_BUSY_POLL, 0);

    ibmsg::options set;
    set.set(IBMSG_OPT_MAX_MSG_SIZE, three_gib).set(IBMSG_OPT_EAGER_SIZE, 8192u);
    CHECK(set.get_u64(IBMSG_OPT_MAX_MSG_SIZE) == three_gib && set.get(IBMSG_OPT_MAX_MSG_SIZE) == INT_MAX,
          "the set's MAX_MSG_SIZE reads %llu (as an int %d)",
          static_cast<unsigned long long>(set.get_u64(IBMSG_OPT_MAX_MSG_SIZE)),
          set.get(IBMSG_OPT_MAX_MSG_SIZE));
    CHECK(set.get(IBMSG_OPT_EAGER_SIZE) == 8192, "EAGER_SIZE from an unsigned reads %d",
          set.get(IBMSG_OPT_EAGER_SIZE));
    // Connections with a maximum beyond INT_MAX: the smaller of both sides'.
    p.listen();
    p.client.connect(p.lp, addr, p.port, set);
    p.client_h = p.client.handle();
    CHECK(p.wait([&] { return p.established.size() == 2; }), "%zu of 2 sockets established",
          p.established.size());
    CHECK(p.client.max_msg_size() == three_gib && p.server.max_msg_size() == three_gib,
          "max_msg_size(): client %zu, server %zu, expected 3 GiB", p.client.max_msg_size(),
          p.server.max_msg_size());
    p.close_all();
  });
}

void message_from_region_arrives_byte_exact(void **) {
  guarded([] {
    peers p;
    p.connect();
    const std::size_t eager = std::size_t(p.lp.get_option(IBMSG_OPT_EAGER_SIZE));
    const std::size_t big = 3 * eager + 1001, small = 300, off = 4096 + 5;
    ibmsg::region src(p.lp, off + big + 64, 0);
    const std::string want_big = pattern(big, 1), want_small = pattern(small, 2);
    char *bytes = static_cast<char *>(src.data());
    std::memcpy(bytes + off, want_big.data(), big);
    std::memcpy(bytes + 3, want_small.data(), small);

    ibmsg::message large, little;
    CHECK(large.from_region(p.client, src, off, big), "from_region of %zu bytes would block", big);
    CHECK(large.data() == bytes + off && large.size() == big && large.status() == IBMSG_WAITING &&
              !large.received() && large.flags() == 0,
          "the message: data %p (region + off %p), size %zu, status %d, flags %#x", large.data(),
          static_cast<void *>(bytes + off), large.size(), large.status(), large.flags());
    CHECK(little.from_region(p.client, src, 3, small), "from_region of %zu bytes would block",
          small);

    // Each with one fault; a failed call leaves the message empty.
    ibmsg::region empty;
    ibmsg::message bad;
    int code = error_code_of([&] { (void)bad.from_region(p.client, src, off, src.size()); });
    CHECK(code == IBMSG_ERANGE, "from_region past the end: %s, expected IBMSG_ERANGE",
          code_name(code));
    code = error_code_of([&] { (void)bad.from_region(p.listener, src, 0, 8); });
    CHECK(code == IBMSG_ESTATE,  // misuse on a listener: one code everywhere (1.7)
          "from_region on the listener: %s, expected IBMSG_ESTATE",
          code_name(code));
    code = error_code_of([&] { (void)bad.from_region(p.client, empty, 0, 8); });
    CHECK(code == IBMSG_EINVAL, "from_region of an empty region: %s, expected IBMSG_EINVAL",
          code_name(code));
    CHECK(!bad, "a failed from_region left a message behind");

    CHECK(large.post(p.client), "post of the large message would block");
    CHECK(little.post(p.client), "post of the small message would block");
    CHECK(p.wait([&] { return p.received.size() == 2 && p.sent.size() == 2; }),
          "%zu of 2 received, %zu of 2 sent", p.received.size(), p.sent.size());
    for (const auto &st : p.sent)
      CHECK(st.status == IBMSG_OK, "a message of the region: %s", code_name(st.status));
    CHECK(p.received[0].data.size() == big && p.received[0].data == want_big,
          "the %zu-byte message above the eager size (%zu) arrived as %zu bytes, %s", big, eager,
          p.received[0].data.size(), p.received[0].data == want_big ? "equal" : "different");
    CHECK(p.received[1].data == want_small, "the small message arrived different (%zu bytes)",
          p.received[1].data.size());
    CHECK(p.received[0].sock == &p.server && p.received[0].flags == 0,
          "received on the wrong socket, or with flags %#x", p.received[0].flags);

    code = error_code_of([&] { src.deregister(); });
    CHECK(code == IBMSG_EBUSY, "deregister() with its messages alive: %s, expected IBMSG_EBUSY",
          code_name(code));
    // Posted again, after message_sent: still the region's bytes.
    bytes[off] = 'Z';
    CHECK(large.post(p.client), "second post would block");
    CHECK(p.wait([&] { return p.received.size() == 3 && p.sent.size() == 3; }),
          "the second post: %zu received, %zu sent", p.received.size(), p.sent.size());
    CHECK(p.received[2].data.size() == big && p.received[2].data[0] == 'Z' &&
              p.received[2].data.compare(1, big - 1, want_big, 1, big - 1) == 0,
          "the repost did not carry the region's current bytes");
    // The region dies first: the loop deregisters it once the messages are freed, which
    // close_all() does only after the connections closed (its close() fails with IBMSG_EBUSY if
    // the region stayed registered).
    src = ibmsg::region();
    p.outbox.push_back(std::move(large));
    p.outbox.push_back(std::move(little));
    p.close_all();
  });
}

void message_incoming_places_one_message_and_declines_another(void **) {
  guarded([] {
    peers p;
    p.hold = true;
    p.connect();
    const std::size_t eager = std::size_t(p.lp.get_option(IBMSG_OPT_EAGER_SIZE));
    const std::size_t placed_size = 2 * eager + 77, declined_size = 3 * eager, off = 4096 + 3;
    ibmsg::region inbox(p.lp, 1 << 20, IBMSG_ACCESS_LOCAL_WRITE);
    ibmsg::region read_only(p.lp, 1 << 20, 0);
    struct seen {
      ibmsg::socket *sock;
      std::size_t size;
      bool has_imm;
      std::uint32_t imm;
      std::uint32_t flags;
      bool too_far, placed;
      int no_write_right, decided_again;
    };
    std::vector<seen> incoming;
    p.lp.on_message_incoming([&](ibmsg::socket &s, ibmsg::incoming &in) {
      seen x{&s, in.size(), in.has_imm(), in.imm(), in.flags(), false, false, 0, 0};
      if (in.size() == declined_size) {
        in.decline();
        x.decided_again = error_code_of([&] { in.decline(); });
      } else {
        x.too_far = !in.to_region(inbox, inbox.size() - in.size() + 1);
        x.no_write_right = error_code_of([&] { (void)in.to_region(read_only, 0); });
        x.placed = in.to_region(inbox, off);
        x.decided_again = error_code_of([&] { in.decline(); });
      }
      incoming.push_back(x);
    });
    const std::string want = pattern(placed_size, 3);
    ibmsg::message placed, declined;
    CHECK(placed.alloc(p.client, placed_size), "alloc would block");
    std::memcpy(placed.data(), want.data(), placed_size);
    CHECK(placed.post_imm(p.client, 0xabc), "post_imm would block");
    CHECK(declined.alloc(p.client, declined_size), "alloc would block");
    std::memset(declined.data(), 'd', declined_size);
    CHECK(declined.post(p.client), "post would block");
    ibmsg_buffer *placed_h = placed.handle(), *declined_h = declined.handle();
    p.outbox.push_back(std::move(placed));
    p.outbox.push_back(std::move(declined));
    p.send(p.client, "after");  // small: never reaches message_incoming
    CHECK(p.wait([&] { return p.sent.size() == 3 && p.received.size() == 2; }),
          "%zu of 3 sent, %zu of 2 received", p.sent.size(), p.received.size());

    CHECK(incoming.size() == 2, "message_incoming ran %zu times for 2 large messages",
          incoming.size());
    const seen &a = incoming[0], &b = incoming[1];
    CHECK(a.sock == &p.server && a.size == placed_size && a.has_imm && a.imm == 0xabc &&
              a.flags == IBMSG_MSG_IMM,
          "the first incoming: size %zu, has_imm %d, imm %#x, flags %#x", a.size, a.has_imm,
          a.imm, a.flags);
    CHECK(a.too_far, "to_region() past the region's end did not return false");
    CHECK(a.no_write_right == IBMSG_EACCES, "to_region() without local write: %s, expected "
          "IBMSG_EACCES", code_name(a.no_write_right));
    CHECK(a.placed, "to_region() into room did not return true");
    CHECK(a.decided_again == IBMSG_ESTATE, "decline() after to_region(): %s, expected IBMSG_ESTATE",
          code_name(a.decided_again));
    CHECK(b.size == declined_size && !b.has_imm && b.imm == 0 && b.flags == 0,
          "the second incoming: size %zu, has_imm %d, flags %#x", b.size, b.has_imm, b.flags);
    CHECK(b.decided_again == IBMSG_ESTATE, "decline() twice: %s, expected IBMSG_ESTATE",
          code_name(b.decided_again));

    const peers::received_msg &r = p.received[0];
    const char *at = static_cast<const char *>(inbox.data()) + off;
    CHECK(r.sock == &p.server && (r.flags & IBMSG_MSG_REGION) && (r.flags & IBMSG_MSG_IMM) &&
              r.imm == 0xabc,
          "the placed message: flags %#x, imm %#x", r.flags, r.imm);
    CHECK(r.where == at, "its data() is %p, expected the region at the offset, %p", r.where,
          static_cast<const void *>(at));
    CHECK(r.data == want && std::memcmp(at, want.data(), placed_size) == 0,
          "the placed message's bytes differ (%zu bytes)", r.data.size());
    CHECK(p.received[1].data == "after" && !(p.received[1].flags & IBMSG_MSG_REGION),
          "the second message received is \"%s\", flags %#x", p.received[1].data.c_str(),
          p.received[1].flags);
    int placed_status = -1, declined_status = -1;
    for (const auto &st : p.sent) {
      if (st.handle == placed_h) placed_status = st.status;
      else if (st.handle == declined_h) declined_status = st.status;
      else CHECK(st.status == IBMSG_OK, "the small message: %s", code_name(st.status));
    }
    CHECK(placed_status == IBMSG_OK, "the placed message's sender got %s", code_name(placed_status));
    CHECK(declined_status == IBMSG_EDECLINED, "the declined message's sender got %s, expected "
          "IBMSG_EDECLINED", code_name(declined_status));
    CHECK(p.client.status() == IBMSG_CONNECTED && p.server.status() == IBMSG_CONNECTED,
          "after the decline: client status %d, server status %d", p.client.status(),
          p.server.status());
    p.send(p.client, "still up");
    CHECK(p.wait([&] { return p.received.size() == 3; }), "nothing arrived after the decline");
    CHECK(p.received[2].data == "still up", "received \"%s\"", p.received[2].data.c_str());

    // The held message keeps the region busy; the region dies first, and the loop deregisters
    // it when close_all() frees the message after the connections closed.
    int code = error_code_of([&] { inbox.deregister(); });
    CHECK(code == IBMSG_EBUSY, "deregister() with a message in it held: %s, expected IBMSG_EBUSY",
          code_name(code));
    inbox = ibmsg::region();
    read_only = ibmsg::region();
    p.close_all();
  });
}

void message_incoming_exception_leaves_the_message_to_the_library(void **) {
  guarded([] {
    peers p;
    p.connect();
    int calls = 0, caught = 0;
    std::string what;
    p.lp.on_message_incoming([&](ibmsg::socket &, ibmsg::incoming &) {
      ++calls;
      throw std::logic_error("thrown by message_incoming");
    });
    const std::size_t n = std::size_t(p.lp.get_option(IBMSG_OPT_EAGER_SIZE)) + 1;
    const std::string want = pattern(n, 4);
    p.send(p.client, want);
    auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(wait_ms);
    while ((p.received.empty() || p.sent.empty()) && std::chrono::steady_clock::now() < deadline) {
      try {
        p.lp.dispatch(20);
      } catch (const std::logic_error &e) {
        ++caught;
        what = e.what();
      }
    }
    CHECK(calls == 1, "message_incoming ran %d times", calls);
    CHECK(caught == 1 && what == "thrown by message_incoming",
          "dispatch() threw %d times, \"%s\"", caught, what.c_str());
    CHECK(p.received.size() == 1 && p.received[0].data == want &&
              !(p.received[0].flags & IBMSG_MSG_REGION),
          "%zu received; the undecided message should come in a library buffer",
          p.received.size());
    CHECK(p.sent.size() == 1 && p.sent[0].status == IBMSG_OK, "the sender got %s",
          p.sent.empty() ? "nothing" : code_name(p.sent[0].status));
    p.close_all();
  });
}

void memory_of_connections_and_loop(void **) {
  guarded([] {
    peers p;
    ibmsg::socket none;
    int code = error_code_of([&] { (void)none.memory(); });
    CHECK(code == IBMSG_EINVAL, "memory() of an empty socket: %s, expected IBMSG_EINVAL",
          code_name(code));
    p.connect();
    code = error_code_of([&] { (void)p.listener.memory(); });
    CHECK(code == IBMSG_ESTATE, "memory() of a listener: %s, expected IBMSG_ESTATE",
          code_name(code));
    const ibmsg_memory c = p.client.memory(), s = p.server.memory();
    // Shared receive buffers (the default): each holds its part of them, no buffers of its own
    // while it has no message.
    CHECK(c.shared > 0 && s.shared > 0, "shared buffers: client %zu, server %zu bytes", c.shared,
          s.shared);
    CHECK(c.buffers == 0 && s.buffers == 0, "own buffers: client %zu, server %zu bytes", c.buffers,
          s.buffers);
    CHECK(c.large == 0, "the client holds %zu bytes of large buffers before any", c.large);
    const ibmsg_memory l = p.lp.memory();
    CHECK(l.shared >= c.shared + s.shared, "the loop's shared %zu < client %zu + server %zu",
          l.shared, c.shared, s.shared);

    const std::size_t n = 4 * std::size_t(p.lp.get_option(IBMSG_OPT_EAGER_SIZE));
    ibmsg::message m;
    CHECK(m.alloc(p.client, n), "alloc of %zu bytes would block", n);
    const std::size_t held = p.client.memory().large;
    CHECK(held >= n, "a %zu-byte message held: the client's large is %zu", n, held);
    CHECK(p.lp.memory().large >= held, "the loop's large %zu < the client's %zu",
          p.lp.memory().large, held);
    m = ibmsg::message();
    CHECK(p.client.memory().large == 0, "the client's large is %zu after the free",
          p.client.memory().large);

    p.client.disconnect();
    CHECK(p.wait([&] { return !p.client.is_open(); }), "the client did not close");
    code = error_code_of([&] { (void)p.client.memory(); });
    CHECK(code == IBMSG_EINVAL, "memory() of a closed socket: %s, expected IBMSG_EINVAL",
          code_name(code));
    p.close_all();
    code = error_code_of([&] { (void)p.lp.memory(); });
    CHECK(code == IBMSG_EINVAL, "memory() of a closed loop: %s, expected IBMSG_EINVAL",
          code_name(code));
  });
}

/* ---- requests and replies -------------------------------------------------------------------- */

// What a request's handler saw, call by call.
struct reply_rec {
  int calls = 0;
  int status = -1;              // the last call's
  std::vector<int> statuses;    // every call's
  std::string data;             // the last reply's bytes
  bool had_reply = false;       // the last call got a non-empty message
  bool reply_received = false;  // ... that says received()
  bool reply_is_request = false;
  ibmsg::socket *sock = nullptr;
  std::vector<ibmsg::message> kept;  // replies moved out of the handler
  bool keep = false;

  void saw(ibmsg::socket &s, ibmsg::message &reply, int st) {
    ++calls;
    status = st;
    statuses.push_back(st);
    sock = &s;
    had_reply = static_cast<bool>(reply);
    reply_received = reply.received();
    reply_is_request = reply.is_request();
    data = text_of(reply);
    if (keep) kept.push_back(std::move(reply));
  }
};

// A message of text allocated on s, not posted. Fails the test if it would block.
ibmsg::message text_msg(ibmsg::socket &s, const std::string &text) {
  ibmsg::message m;
  CHECK(m.alloc(s, text.size()), "alloc of %zu bytes would block", text.size());
  std::memcpy(m.data(), text.data(), text.size());
  return m;
}

// The message_sent status of handle, or -1 if none came.
int sent_status(const peers &p, ibmsg_buffer *handle) {
  for (const auto &s : p.sent)
    if (s.handle == handle) return s.status;
  return -1;
}

void request_answered_through_reply_runs_the_lambda_once(void **) {
  guarded([] {
    peers p;
    // Few receive buffers of its own per connection: replies (and requests) that were not freed
    // would use up the credits within the round trips below.
    p.lp.set_option(IBMSG_OPT_SHARED_RECV, 0);
    p.lp.set_option(IBMSG_OPT_RECV_DEPTH, 4);
    struct seen_request {
      bool is_request;
      std::uint32_t flags;
      std::string data;
      bool replied;
      int again;  // the code of a second reply to it
    };
    std::vector<seen_request> seen;
    bool answer = true;  // answer inside the callback; otherwise hold the request
    p.lp.on_message_received([&](ibmsg::socket &s, ibmsg::message m) {
      p.received.push_back({&s, s.handle(), text_of(m), m.has_imm(), m.imm(), m.flags(), m.data()});
      seen.push_back({m.is_request(), m.flags(), text_of(m), false, 0});
      if (!m.is_request()) return;
      if (!answer) {
        p.held.push_back(std::move(m));
        return;
      }
      ibmsg::message r;
      std::string text = "re:" + text_of(m);
      if (!r.alloc(s, text.size())) return;
      std::memcpy(r.data(), text.data(), text.size());
      seen.back().replied = s.reply(m, r);
      if (seen.back().replied) p.outbox.push_back(std::move(r));
      ibmsg::message r2;
      if (r2.alloc(s, 1)) seen.back().again = error_code_of([&] { (void)s.reply(m, r2); });
    });
    p.connect();

    auto token = std::make_shared<int>(0);
    reply_rec a;
    a.keep = true;
    ibmsg::message ping = text_msg(p.client, "ping");
    CHECK(p.client.request(ping, wait_ms,
                           [&a, token](ibmsg::socket &s, ibmsg::message reply, int st) {
                             a.saw(s, reply, st);
                           }),
          "request would block");
    CHECK(p.wait([&] { return a.calls > 0; }), "the request's handler did not run");
    CHECK(seen.size() == 1 && seen[0].is_request && (seen[0].flags & IBMSG_MSG_REQUEST) &&
              seen[0].data == "ping",
          "the server saw %zu messages; the first: request %d, flags %#x, \"%s\"", seen.size(),
          seen.empty() ? -1 : seen[0].is_request, seen.empty() ? 0 : seen[0].flags,
          seen.empty() ? "" : seen[0].data.c_str());
    CHECK(seen[0].replied, "reply() would block");
    CHECK(seen[0].again == IBMSG_EALREADY, "a second reply to the request: %s, expected IBMSG_EALREADY",
          code_name(seen[0].again));
    CHECK(a.status == IBMSG_OK, "the handler got %s", code_name(a.status));
    CHECK(a.sock == &p.client, "the handler got the wrong socket");
    CHECK(a.had_reply && a.reply_received && !a.reply_is_request,
          "reply: present %d, received %d, is_request %d", a.had_reply, a.reply_received,
          a.reply_is_request);
    CHECK(a.data == "re:ping", "the reply's bytes are \"%s\"", a.data.c_str());
    CHECK(a.kept.size() == 1 && text_of(a.kept[0]) == "re:ping" && a.kept[0].received(),
          "the reply moved out of the handler: %zu kept", a.kept.size());
    CHECK(p.wait([&] { return sent_status(p, ping.handle()) >= 0; }),
          "no message_sent for the request message");
    CHECK(sent_status(p, ping.handle()) == IBMSG_OK, "the request message: %s",
          code_name(sent_status(p, ping.handle())));
    p.step(50);
    CHECK(a.calls == 1, "the handler ran %d times", a.calls);
    CHECK(token.use_count() == 1, "%ld holders of the token: the request kept its handler",
          token.use_count());
    a.kept.clear();  // freed: its credit goes back

    // A plain message is no request.
    p.send(p.client, "plain");
    CHECK(p.wait([&] { return seen.size() == 2; }), "the plain message did not arrive");
    CHECK(!seen[1].is_request && !(seen[1].flags & IBMSG_MSG_REQUEST),
          "a plain message: is_request %d, flags %#x", seen[1].is_request, seen[1].flags);

    // Round trips whose handlers drop the replies, answered later from outside the callback:
    // more than the receive credits, so every reply and request must be freed on the way.
    answer = false;
    for (int i = 0; i < 12; ++i) {
      reply_rec r;
      bool ok_handler_was_empty = false;
      ibmsg::message m = text_msg(p.client, "q" + std::to_string(i));
      CHECK(p.client.request(m, wait_ms,
                             [&](ibmsg::socket &s, ibmsg::message reply, int st,
                                 ibmsg::unanswered_request req) {
                               ok_handler_was_empty = !req && req.id() == 0;
                               r.saw(s, reply, st);
                             }),
            "request %d would block", i);
      CHECK(p.wait([&] { return p.held.size() == 1; }), "request %d did not arrive", i);
      ibmsg::message ans = text_msg(p.server, "a" + std::to_string(i));
      CHECK(p.server.reply(p.held[0], ans), "reply %d would block", i);
      p.held.clear();  // answered: the request may go
      CHECK(p.wait([&] { return r.calls > 0; }), "round trip %d: the handler did not run", i);
      CHECK(r.status == IBMSG_OK && r.data == "a" + std::to_string(i),
            "round trip %d: %s, \"%s\"", i, code_name(r.status), r.data.c_str());
      CHECK(ok_handler_was_empty, "round trip %d: the unanswered_request after IBMSG_OK holds one",
            i);
      CHECK(p.wait([&] {
              return sent_status(p, m.handle()) >= 0 && sent_status(p, ans.handle()) >= 0;
            }),
            "round trip %d: message_sent missing", i);
      CHECK(sent_status(p, ans.handle()) == IBMSG_OK, "round trip %d: the reply message: %s", i,
            code_name(sent_status(p, ans.handle())));
      p.sent.clear();
    }
    ping = ibmsg::message();
    p.close_all();  // IBMSG_EBUSY if a reply or request were never freed
  });
}

void large_request_and_reply_show_in_message_incoming(void **) {
  guarded([] {
    peers p;
    p.hold = true;  // the server keeps the request and answers below
    p.connect();
    const std::size_t eager = std::size_t(p.lp.get_option(IBMSG_OPT_EAGER_SIZE));
    const std::size_t req_size = 3 * eager + 5, reply_size = 5 * eager + 9;
    ibmsg::region inbox(p.lp, 1 << 20, IBMSG_ACCESS_LOCAL_WRITE);
    struct seen {
      ibmsg::socket *sock;
      std::size_t size;
      bool is_request, is_reply;
    };
    std::vector<seen> incoming;
    p.lp.on_message_incoming([&](ibmsg::socket &s, ibmsg::incoming &in) {
      incoming.push_back({&s, in.size(), in.is_request(), in.is_reply()});
      if (in.is_reply()) CHECK(in.to_region(inbox, 0), "the reply does not fit the region");
    });
    const std::string want_req = pattern(req_size, 5), want_reply = pattern(reply_size, 6);
    ibmsg::message m;
    CHECK(m.alloc(p.client, req_size), "alloc would block");
    std::memcpy(m.data(), want_req.data(), req_size);
    auto token = std::make_shared<int>(0);
    reply_rec r;
    bool in_region = false;
    CHECK(p.client.request(m, wait_ms,
                           [&r, &in_region, token](ibmsg::socket &s, ibmsg::message reply, int st) {
                             in_region = (reply.flags() & IBMSG_MSG_REGION) != 0;
                             r.saw(s, reply, st);
                           }),
          "request would block");
    CHECK(p.wait([&] { return p.held.size() == 1; }), "the large request did not arrive");
    CHECK(p.held[0].is_request() && text_of(p.held[0]) == want_req,
          "the request arrived as %zu bytes, is_request %d", p.held[0].size(),
          p.held[0].is_request());
    ibmsg::message ans;
    CHECK(ans.alloc(p.server, reply_size), "alloc would block");
    std::memcpy(ans.data(), want_reply.data(), reply_size);
    CHECK(p.server.reply(p.held[0], ans), "the reply would block");
    CHECK(p.wait([&] { return r.calls == 1; }), "the handler did not run");
    CHECK(r.status == IBMSG_OK && r.data == want_reply && in_region,
          "the handler got %s, %zu bytes, in the region %d", code_name(r.status), r.data.size(),
          in_region);
    CHECK(incoming.size() == 2, "message_incoming ran %zu times", incoming.size());
    CHECK(incoming[0].sock == &p.server && incoming[0].size == req_size &&
              incoming[0].is_request && !incoming[0].is_reply,
          "the request's incoming: size %zu, is_request %d, is_reply %d", incoming[0].size,
          incoming[0].is_request, incoming[0].is_reply);
    CHECK(incoming[1].sock == &p.client && incoming[1].size == reply_size &&
              !incoming[1].is_request && incoming[1].is_reply,
          "the reply's incoming: size %zu, is_request %d, is_reply %d", incoming[1].size,
          incoming[1].is_request, incoming[1].is_reply);
    CHECK(p.wait([&] { return sent_status(p, ans.handle()) == IBMSG_OK; }),
          "the reply's message_sent");
    p.held.clear();
    m = ibmsg::message();
    ans = ibmsg::message();
    inbox = ibmsg::region();  // (the reply in it was freed when the handler returned)
    p.close_all();
  });
}

void request_to_a_silent_server_times_out_in_the_lambda(void **) {
  guarded([] {
    peers p;
    p.hold = true;  // the server keeps the requests and never answers
    p.connect();
    auto token = std::make_shared<int>(0);
    reply_rec r;
    std::chrono::steady_clock::time_point at;
    ibmsg::message m = text_msg(p.client, "anyone?");
    const auto posted = std::chrono::steady_clock::now();
    CHECK(p.client.request(m, 200,
                           [&r, &at, token](ibmsg::socket &s, ibmsg::message reply, int st) {
                             at = std::chrono::steady_clock::now();
                             r.saw(s, reply, st);
                           }),
          "request would block");
    CHECK(p.wait([&] { return r.calls > 0; }), "the handler did not run within %d ms", wait_ms);
    const long ms =
        long(std::chrono::duration_cast<std::chrono::milliseconds>(at - posted).count());
    CHECK(r.status == IBMSG_ETIMEDOUT, "the handler got %s, expected IBMSG_ETIMEDOUT",
          code_name(r.status));
    CHECK(!r.had_reply && r.data.empty(), "a timed-out request got a reply message");
    CHECK(ms >= 190, "it timed out after %ld ms, before its 200 ms", ms);
    CHECK(p.received.size() == 1 && p.held.size() == 1 && p.held[0].is_request(),
          "the server holds %zu messages", p.held.size());
    CHECK(token.use_count() == 1, "%ld holders of the token after the handler",
          token.use_count());
    // A reply after the timeout is dropped: the handler does not run again.
    ibmsg::message late = text_msg(p.server, "too late");
    CHECK(p.server.reply(p.held[0], late), "the late reply would block");
    CHECK(p.wait([&] { return sent_status(p, late.handle()) >= 0; }), "the late reply was not sent");
    p.step(100);
    CHECK(r.calls == 1, "the handler ran %d times", r.calls);
    m = ibmsg::message();
    late = ibmsg::message();
    p.close_all();
  });
}

void timed_out_request_retried_from_the_lambda_gets_the_reply_once(void **) {
  guarded([] {
    peers p;
    p.hold = true;
    p.connect();
    auto token = std::make_shared<int>(0);
    reply_rec r;
    std::vector<std::uint64_t> ids;
    std::vector<int> retries_seen;
    int retry_code = -1;
    bool retried = false;
    ibmsg::message m = text_msg(p.client, "slow one");
    ibmsg::socket::retry_handler handler = [&, token](ibmsg::socket &s, ibmsg::message reply, int st,
                                                      ibmsg::unanswered_request req) {
      ids.push_back(req.id());
      retries_seen.push_back(req.retries());
      r.saw(s, reply, st);
      if (st == IBMSG_ETIMEDOUT && req.retries() == 0) {
        retry_code = error_code_of([&] { retried = req.retry(s, m, wait_ms); });
      }
    };
    CHECK(p.client.request(m, 150, handler), "request would block");
    handler = nullptr;  // the request holds its own copy
    CHECK(p.wait([&] { return r.calls > 0; }), "the first handler call did not come");
    CHECK(r.statuses[0] == IBMSG_ETIMEDOUT, "first call: %s", code_name(r.statuses[0]));
    CHECK(ids[0] != 0 && retries_seen[0] == 0, "first call: id %llu, retries %d",
          static_cast<unsigned long long>(ids[0]), retries_seen[0]);
    CHECK(retry_code == 0 && retried, "retry() from the handler: %s, sent %d",
          code_name(retry_code), retried);
    // The retry reached the server while it still works on the request: not delivered again.
    p.step(100);
    CHECK(p.received.size() == 1 && p.held.size() == 1,
          "the server got %zu messages for one request and its retry", p.received.size());
    ibmsg::message ans = text_msg(p.server, "done at last");
    CHECK(p.server.reply(p.held[0], ans), "reply would block");
    CHECK(p.wait([&] { return r.calls > 1; }), "the retry's handler did not run");
    CHECK(r.statuses[1] == IBMSG_OK && r.data == "done at last", "second call: %s, \"%s\"",
          code_name(r.statuses[1]), r.data.c_str());
    CHECK(ids[1] == 0, "the unanswered_request after IBMSG_OK holds id %llu",
          static_cast<unsigned long long>(ids[1]));
    p.step(100);
    CHECK(r.calls == 2, "the handler ran %d times for a request and one retry", r.calls);
    CHECK(p.received.size() == 1, "the server got %zu messages", p.received.size());
    CHECK(token.use_count() == 1, "%ld holders of the token after the reply", token.use_count());
    m = ibmsg::message();
    ans = ibmsg::message();
    p.close_all();
  });
}

void requests_outstanding_at_disconnect_get_ecanceled_once(void **) {
  guarded([] {
    peers p;
    p.hold = true;
    p.connect();
    auto token = std::make_shared<int>(0);
    constexpr int n = 4;
    reply_rec r[n];
    std::size_t handled = 0, handled_before_closed = 0;
    bool client_closed = false;
    int retry_code = -1;
    ibmsg::unanswered_request kept;
    p.lp.on_connection_closed([&](ibmsg::socket &s, int reason) {
      p.closed.push_back({&s, s.handle(), reason});
      if (s.handle() == p.client_h) {
        client_closed = true;
        handled_before_closed = handled;
      }
    });
    std::vector<ibmsg::message> msgs;
    for (int i = 0; i < n; ++i) msgs.push_back(text_msg(p.client, "req" + std::to_string(i)));
    for (int i = 0; i < n; ++i) {
      bool ok;
      if (i % 2 == 0) {
        ok = p.client.request(msgs[i], 10 * wait_ms,
                              [&, token, i](ibmsg::socket &s, ibmsg::message reply, int st) {
                                r[i].saw(s, reply, st);
                                ++handled;
                              });
      } else {
        ok = p.client.request(msgs[i], 10 * wait_ms,
                              [&, token, i](ibmsg::socket &s, ibmsg::message reply, int st,
                                            ibmsg::unanswered_request req) {
                                r[i].saw(s, reply, st);
                                ++handled;
                                if (i == 1) {
                                  // The closing socket takes no retry; the request stays ours.
                                  retry_code = error_code_of(
                                      [&] { (void)req.retry(s, msgs[i], wait_ms); });
                                  kept = std::move(req);
                                }
                              });
      }
      CHECK(ok, "request %d would block", i);
    }
    CHECK(p.wait([&] { return p.held.size() == std::size_t(n); }), "%zu of %d requests arrived",
          p.held.size(), n);
    p.client.disconnect();
    CHECK(p.wait([&] { return client_closed; }), "the client did not close");
    p.step(50);
    for (int i = 0; i < n; ++i) {
      CHECK(r[i].calls == 1, "request %d: the handler ran %d times", i, r[i].calls);
      CHECK(r[i].status == IBMSG_ECANCELED && !r[i].had_reply,
            "request %d: %s, expected IBMSG_ECANCELED", i, code_name(r[i].status));
    }
    CHECK(handled_before_closed == std::size_t(n),
          "%zu of %d handlers had run when connection_closed came", handled_before_closed, n);
    CHECK(retry_code == IBMSG_ENOTCONN, "retry() on the closing socket: %s, expected IBMSG_ENOTCONN",
          code_name(retry_code));
    CHECK(kept && kept.status() == IBMSG_ECANCELED && kept.id() != 0 && kept.handle() != nullptr,
          "the kept request: held %d, status %s", static_cast<bool>(kept), code_name(kept.status()));
    CHECK(token.use_count() == 2, "%ld holders of the token: one request kept", token.use_count());
    kept = ibmsg::unanswered_request();  // given up: its handler goes
    CHECK(token.use_count() == 1, "%ld holders of the token after giving it up", token.use_count());
    msgs.clear();
    p.close_all();
  });
}

void request_retried_over_a_new_connection_after_the_peer_closed(void **) {
  guarded([] {
    peers p;
    p.hold = true;
    p.connect();
    reply_rec r;
    ibmsg::unanswered_request pending;
    ibmsg::message m = text_msg(p.client, "survive this");
    CHECK(p.client.request(m, 10 * wait_ms,
                           [&](ibmsg::socket &s, ibmsg::message reply, int st,
                               ibmsg::unanswered_request req) {
                             r.saw(s, reply, st);
                             pending = std::move(req);
                           }),
          "request would block");
    CHECK(p.wait([&] { return p.held.size() == 1; }), "the request did not arrive");
    ibmsg::message ans = text_msg(p.server, "answered after all");  // before the close
    p.server.disconnect();
    CHECK(p.wait([&] { return r.calls > 0; }), "the handler did not run when the peer closed");
    CHECK(r.status == IBMSG_ECONNRESET && !r.had_reply, "the handler got %s, expected IBMSG_ECONNRESET",
          code_name(r.status));
    CHECK(p.wait([&] { return !p.client.is_open() && !p.server.is_open(); }),
          "the connection did not close");
    CHECK(r.status == p.closed_reason(p.client_h), "the handler got %s, the client closed with %s",
          code_name(r.status), code_name(p.closed_reason(p.client_h)));
    CHECK(r.calls == 1, "the handler ran %d times", r.calls);
    CHECK(pending && pending.retries() == 0, "the request was not kept");

    // The responder answers on the closed connection: the library keeps the reply for a retry.
    int code = error_code_of([&] { (void)p.server.reply(p.held[0], ans); });
    CHECK(code == IBMSG_ENOTCONN, "reply on the closed connection: %s, expected IBMSG_ENOTCONN",
          code_name(code));
    ans = ibmsg::message();
    m = ibmsg::message();
    p.held.clear();

    // A new connection of the same loop: the retry gets the kept reply; the server's handler
    // does not see the request again.
    const std::size_t before = p.established.size();
    p.client.connect(p.lp, addr, p.port);
    CHECK(p.wait([&] { return p.established.size() == before + 2; }), "the reconnection failed");
    ibmsg::message again = text_msg(p.client, "survive this");
    CHECK(pending.retry(p.client, again, wait_ms), "retry would block");
    CHECK(!pending, "a retried request stays in the unanswered_request");
    CHECK(p.wait([&] { return r.calls > 1; }), "the retry's handler did not run");
    CHECK(r.status == IBMSG_OK && r.data == "answered after all" && r.sock == &p.client,
          "the retry got %s, \"%s\"", code_name(r.status), r.data.c_str());
    p.step(100);
    CHECK(r.calls == 2, "the handler ran %d times", r.calls);
    CHECK(p.received.size() == 1, "the server's handler saw the request %zu times", p.received.size());
    again = ibmsg::message();
    p.close_all();
  });
}

void request_and_reply_errors_throw_and_send_nothing(void **) {
  guarded([] {
    peers p;
    std::vector<ibmsg::message> plain;
    p.lp.on_message_received([&](ibmsg::socket &s, ibmsg::message m) {
      p.received.push_back({&s, s.handle(), text_of(m), m.has_imm(), m.imm(), m.flags(), m.data()});
      plain.push_back(std::move(m));
    });
    p.connect();
    auto token = std::make_shared<int>(0);
    int calls = 0;
    auto counting = [&calls, token](ibmsg::socket &, ibmsg::message, int) { ++calls; };
    auto counting_retry = [&calls, token](ibmsg::socket &, ibmsg::message, int,
                                          ibmsg::unanswered_request) { ++calls; };
    ibmsg::message m = text_msg(p.client, "x");
    ibmsg::message empty;
    ibmsg::message big;
    CHECK(big.alloc(p.client, 64), "alloc of 64 bytes would block");
    big.set_size(p.client.max_msg_size() + 1);
    struct attempt {
      const char *what;
      int expected;
      std::function<bool()> post;
    };
    const attempt attempts[] = {
        {"timeout 0", IBMSG_EINVAL, [&] { return p.client.request(m, 0, counting); }},
        {"negative timeout", IBMSG_EINVAL, [&] { return p.client.request(m, -5, counting_retry); }},
        {"an empty message", IBMSG_EINVAL, [&] { return p.client.request(empty, 100, counting); }},
        {"above the connection's maximum", IBMSG_EMSGSIZE,
         [&] { return p.client.request(big, 100, counting_retry); }},
    };
    for (const attempt &a : attempts) {
      int code = error_code_of([&] { (void)a.post(); });
      CHECK(code == a.expected, "request with %s: %s, expected %s", a.what, code_name(code),
            code_name(a.expected));
    }
    ibmsg::unanswered_request none;
    int code = error_code_of([&] { (void)none.retry(p.client, m, 100); });
    CHECK(code == IBMSG_EINVAL, "retry() of an empty unanswered_request: %s", code_name(code));
    CHECK(!none && none.id() == 0 && none.handle() == nullptr,
          "an empty unanswered_request holds something");

    // Replies: to a plain message, to a send message, with an empty reply.
    p.send(p.client, "not a request");
    CHECK(p.wait([&] { return plain.size() == 1; }), "the plain message did not arrive");
    CHECK(!plain[0].is_request(), "a plain message is a request");
    ibmsg::message ans = text_msg(p.server, "no");
    code = error_code_of([&] { (void)p.server.reply(plain[0], ans); });
    CHECK(code == IBMSG_EINVAL, "reply to a plain message: %s, expected IBMSG_EINVAL", code_name(code));
    ibmsg::message own = text_msg(p.server, "mine");
    code = error_code_of([&] { (void)p.server.reply(own, ans); });
    CHECK(code == IBMSG_EINVAL, "reply to a send message: %s, expected IBMSG_EINVAL", code_name(code));
    CHECK(!own.is_request(), "a send message is a request");
    p.step(50);
    CHECK(calls == 0, "%d handlers ran for calls that failed", calls);
    CHECK(token.use_count() == 3, "%ld holders of the token: a failed call kept its handler",
          token.use_count());
    CHECK(sent_status(p, ans.handle()) < 0, "the refused reply was sent");
    plain.clear();
    m = ibmsg::message();
    big = ibmsg::message();
    ans = ibmsg::message();
    own = ibmsg::message();
    p.close_all();
  });
}

void requests_of_a_destroyed_socket_free_their_handlers(void **) {
  guarded([] {
    peers p;
    p.hold = true;
    p.connect();
    auto token = std::make_shared<int>(0);
    int calls = 0;
    std::vector<ibmsg::message> msgs;
    for (int i = 0; i < 4; ++i) msgs.push_back(text_msg(p.client, "r" + std::to_string(i)));
    for (int i = 0; i < 4; ++i) {
      bool ok = i % 2 ? p.client.request(msgs[i], 10 * wait_ms,
                                         [&calls, token](ibmsg::socket &, ibmsg::message, int) {
                                           ++calls;
                                         })
                      : p.client.request(msgs[i], 10 * wait_ms,
                                         [&calls, token](ibmsg::socket &, ibmsg::message, int,
                                                         ibmsg::unanswered_request) { ++calls; });
      CHECK(ok, "request %d would block", i);
    }
    CHECK(p.wait([&] { return p.held.size() == 4; }), "%zu of 4 requests arrived", p.held.size());
    { ibmsg::socket gone(std::move(p.client)); }  // disconnects; nothing reaches us any more
    CHECK(p.wait([&] { return token.use_count() == 1; }),
          "%ld holders of the token: the requests of the dead socket kept their handlers",
          token.use_count());
    CHECK(calls == 0, "%d handlers ran for a destroyed socket", calls);
    msgs.clear();
    p.close_all();
  });
}

/* ---- issue 26: a socket's own handlers, send() with a handler per message, byte views -------- */

// The pattern of the per-message payloads below: byte j of message i.
std::byte pattern_byte(std::size_t i, std::size_t j) {
  return std::byte(static_cast<unsigned char>((i * 131 + j * 7) & 0xff));
}

void socket_handlers_and_send_handlers_echo_over_a_real_connection(void **) {
  guarded([] {
    peers p;
    // Sizes of both kinds: eager, and above the eager size (rendezvous: the peer reads them).
    const std::size_t sizes[] = {0, 1, 64, 4096, 16384, 16385, 100000, 1 << 20};
    const std::size_t n = sizeof sizes / sizeof sizes[0];
    int server_sent_ok = 0, server_sent_other = 0, client_done = 0, client_done_bad = 0;
    int established = 0, closed = 0;
    std::vector<std::string> bad;
    std::size_t echoes = 0;
    // The server echoes each message with send(), holding the received message (its credit) in
    // the send's handler until the echo is out: no list, no map.
    p.server.on_received([&](ibmsg::socket &s, ibmsg::message m) {
      ibmsg::const_bytes data = m.bytes();
      if (!s.send(data, [&, held = std::move(m)](ibmsg::socket &, ibmsg::message back, int st) {
            if (st == IBMSG_OK && back && back.size() == held.size()) ++server_sent_ok;
            else ++server_sent_other;
          }))
        bad.push_back("the server's echo would block");
    });
    p.client.on_established([&](ibmsg::socket &) { ++established; });
    p.client.on_received([&](ibmsg::socket &, ibmsg::message m) {
      const std::size_t i = echoes++;
      if (i >= n || m.size() != sizes[i]) {
        bad.push_back("echo " + std::to_string(i) + " has " + std::to_string(m.size()) + " bytes");
        return;
      }
      ibmsg::const_bytes b = std::as_const(m).bytes();
      for (std::size_t j = 0; j < b.size(); ++j)
        if (b[j] != pattern_byte(i, j)) {
          bad.push_back("echo " + std::to_string(i) + " differs at byte " + std::to_string(j));
          return;
        }
    });
    p.client.on_closed([&](ibmsg::socket &, int) { ++closed; });
    p.listen();
    p.client.connect(p.lp, addr, p.port);
    p.client_h = p.client.handle();
    CHECK(p.wait([&] { return established == 1 && p.established.size() == 1; }),
          "established: the client's own handler %d times, the loop's %zu", established,
          p.established.size());
    for (std::size_t i = 0; i < n; ++i) {
      std::vector<std::byte> payload(sizes[i]);
      for (std::size_t j = 0; j < payload.size(); ++j) payload[j] = pattern_byte(i, j);
      bool posted = p.client.send(payload, [&](int st) {
        if (st == IBMSG_OK) ++client_done;
        else ++client_done_bad;
      });
      CHECK(posted, "send %zu would block", i);
    }
    CHECK(p.wait([&] { return echoes == n && server_sent_ok == int(n); }, 30000),
          "%zu of %zu echoes, %d server sends done", echoes, n, server_sent_ok);
    CHECK(bad.empty(), "%s", bad.empty() ? "" : bad.front().c_str());
    CHECK(client_done == int(n) && client_done_bad == 0 && server_sent_other == 0,
          "send handlers: client %d ok %d not, server %d not", client_done, client_done_bad,
          server_sent_other);
    // Nothing of this reached the loop's handlers: the sockets' own took it all.
    CHECK(p.received.empty() && p.sent.empty(), "the loop's handlers got %zu received, %zu sent",
          p.received.size(), p.sent.size());
    CHECK(p.established.size() == 1, "the loop's established handler ran %zu times (server only)",
          p.established.size());
    ibmsg_stats st = p.client.stats();
    CHECK(st.msgs_sent == n && st.msgs_received == n, "client stats: %llu sent, %llu received",
          static_cast<unsigned long long>(st.msgs_sent),
          static_cast<unsigned long long>(st.msgs_received));
    p.client.disconnect();
    CHECK(p.wait([&] { return closed == 1 && !p.server.is_open(); }), "closed %d", closed);
    CHECK(p.closed_reason(p.client_h) == -1, "the loop's closed handler got the client's close");
    CHECK(p.lp.drain(std::chrono::seconds(10)), "drain() left something closing");
    p.close_all();
  });
}

void send_handlers_run_once_each_before_the_closed_handler(void **) {
  guarded([] {
    peers p;
    p.connect();
    constexpr int n = 20;
    int calls = 0, ok = 0, canceled = 0, other = 0, calls_at_close = -1;
    p.client.on_closed([&](ibmsg::socket &, int) { calls_at_close = calls; });
    int posted = 0;
    for (int i = 0; i < n; ++i) {
      if (!p.client.send(std::string(50000, char('a' + i % 26)), [&](ibmsg::socket &, ibmsg::message m, int st) {
            ++calls;
            if (!m) ++other;  // the message comes back either way
            if (st == IBMSG_OK) ++ok;
            else if (st == IBMSG_ECANCELED) ++canceled;
            else ++other;
          }))
        break;
      ++posted;
    }
    p.client.disconnect();  // at once: what is queued or in flight is canceled
    CHECK(p.wait([&] { return calls_at_close >= 0; }), "the client did not close");
    CHECK(calls == posted && calls_at_close == posted,
          "%d handler calls for %d sends, %d before the closed handler", calls, posted,
          calls_at_close);
    CHECK(other == 0, "%d calls with another status or without the message", other);
    print_message("%d sends: %d delivered, %d canceled by the close\n", posted, ok, canceled);
    CHECK(p.lp.drain(std::chrono::seconds(10)), "drain() left something closing");
    p.close_all();
  });
}

void log_handler_gets_the_connections_lines(void **) {
  guarded([] {
    peers p;
    int of_client = 0, info = 0;
    p.lp.on_log([&](ibmsg::socket *s, int level, std::string_view text) {
      if (s == &p.client) ++of_client;
      if (level == IBMSG_LOG_INFO && !text.empty()) ++info;
    });
    p.connect();
    p.client.disconnect();
    CHECK(p.wait([&] { return !p.client.is_open() && !p.server.is_open(); }), "not closed");
    CHECK(of_client > 0 && info > 0, "%d lines of the client, %d at INFO", of_client, info);
    p.lp.on_log(nullptr);
    p.close_all();
  });
}

}  // namespace

int main() {
  addr = std::getenv("IBMSG_TEST_ADDR");
  if (!addr || !*addr) {
    std::fprintf(stderr, "IBMSG_TEST_ADDR not set\n");
    return 1;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(error_carries_code_and_text),
      cmocka_unit_test(socket_handlers_and_send_handlers_echo_over_a_real_connection),
      cmocka_unit_test(send_handlers_run_once_each_before_the_closed_handler),
      cmocka_unit_test(log_handler_gets_the_connections_lines),
      cmocka_unit_test(options_round_trip),
      cmocka_unit_test(option_sets_start_from_the_defaults_and_check_values),
      cmocka_unit_test(every_integer_option_through_loop_and_option_set),
      cmocka_unit_test(option_sets_apply_to_listen_connect_and_accept),
      cmocka_unit_test(listen_on_port_0_and_connect_fires_established),
      cmocka_unit_test(messages_exchanged_both_ways_arrive_intact),
      cmocka_unit_test(alloc_larger_than_max_throws_emsgsize),
      cmocka_unit_test(disconnect_twice_throws_estate),
      cmocka_unit_test(listen_on_a_port_in_use_throws_eaddrinuse),
      cmocka_unit_test(alloc_with_pool_empty_returns_false),
      cmocka_unit_test(post_with_full_queue_returns_false),
      cmocka_unit_test(moved_socket_keeps_working),
      cmocka_unit_test(moved_loop_keeps_working),
      cmocka_unit_test(moved_message_in_flight_gets_sent_callback),
      cmocka_unit_test(message_dropped_in_flight_is_freed_after_sending),
      cmocka_unit_test(destroyed_socket_disconnects),
      cmocka_unit_test(received_message_held_until_wrapper_dies),
      cmocka_unit_test(destructors_then_drain_close_everything),
      cmocka_unit_test(loop_destructor_does_not_wait_for_closing_sockets),
      cmocka_unit_test(closed_callback_gets_reason),
      cmocka_unit_test(connect_refused_closes_with_econnrefused),
      cmocka_unit_test(reject_closes_peer_with_erejected_and_text),
      cmocka_unit_test(callback_exception_rethrown_from_dispatch),
      cmocka_unit_test(fd_and_process_drive_the_loop),
      cmocka_unit_test(application_ev_loop_runs_callbacks),
      cmocka_unit_test(region_write_then_read_back_is_byte_exact),
      cmocka_unit_test(write_imm_reaches_on_write_received),
      cmocka_unit_test(atomics_pass_previous_values_to_lambdas),
      cmocka_unit_test(message_post_imm_carries_the_immediate),
      cmocka_unit_test(operation_errors_throw_and_post_nothing),
      cmocka_unit_test(rdma_options_work_through_the_generic_setters),
      cmocka_unit_test(full_send_queue_returns_false_and_drops_the_handler),
      cmocka_unit_test(handlers_run_once_when_the_connection_closes_in_flight),
      cmocka_unit_test(operations_of_a_destroyed_socket_free_their_handlers),
      cmocka_unit_test(region_destroyed_after_its_operations_completed),
      cmocka_unit_test(region_destroyed_while_in_use_is_deregistered_after_the_last_operation),
      cmocka_unit_test(drain_waits_for_a_region_still_in_use),
      cmocka_unit_test(moved_region_keeps_working),
      cmocka_unit_test(revoked_descriptor_fails_the_peers_operation),
      cmocka_unit_test(wide_option_values_reach_max_msg_size),
      cmocka_unit_test(message_from_region_arrives_byte_exact),
      cmocka_unit_test(message_incoming_places_one_message_and_declines_another),
      cmocka_unit_test(message_incoming_exception_leaves_the_message_to_the_library),
      cmocka_unit_test(memory_of_connections_and_loop),
      cmocka_unit_test(request_answered_through_reply_runs_the_lambda_once),
      cmocka_unit_test(large_request_and_reply_show_in_message_incoming),
      cmocka_unit_test(request_to_a_silent_server_times_out_in_the_lambda),
      cmocka_unit_test(timed_out_request_retried_from_the_lambda_gets_the_reply_once),
      cmocka_unit_test(requests_outstanding_at_disconnect_get_ecanceled_once),
      cmocka_unit_test(request_retried_over_a_new_connection_after_the_peer_closed),
      cmocka_unit_test(request_and_reply_errors_throw_and_send_nothing),
      cmocka_unit_test(requests_of_a_destroyed_socket_free_their_handlers),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
