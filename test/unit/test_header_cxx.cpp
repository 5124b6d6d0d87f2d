// test_header_cxx.cpp - the C++17 -pedantic half of test_header: ibmsg.h (and ibmsg.hpp when the
// tree has it) compile as C++, and C++ sees the same sizes, offsets and constants as C. The C half
// (test_header.c) asks for each value by the name it gives it.
#include <ibmsg.h>
#if __has_include(<ibmsg.hpp>)
#include <ibmsg.hpp>
#define HEADER_HAVE_HPP 1
#endif

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

// Plain C structs: the library and C programs share them, so C++ must not see anything else.
static_assert(std::is_standard_layout<ibmsg_buffer>::value, "ibmsg_buffer is not standard layout");
static_assert(std::is_standard_layout<ibmsg_socket>::value, "ibmsg_socket is not standard layout");
static_assert(std::is_standard_layout<ibmsg_event_loop>::value,
              "ibmsg_event_loop is not standard layout");
static_assert(std::is_standard_layout<ibmsg_connection_request>::value,
              "ibmsg_connection_request is not standard layout");
static_assert(std::is_trivial<ibmsg_buffer>::value && std::is_trivial<ibmsg_socket>::value &&
                  std::is_trivial<ibmsg_event_loop>::value &&
                  std::is_trivial<ibmsg_connection_request>::value,
              "the public structs must be trivial, as in C (memset, static storage)");
static_assert(IBMSG_VERSION == IBMSG_VERSION_MAJOR * 10000 + IBMSG_VERSION_MINOR * 100 +
                                   IBMSG_VERSION_PATCH,
              "IBMSG_VERSION does not follow its formula");

#ifdef HEADER_HAVE_HPP
// The wrapper's 1.2 additions, with the types a program written against them relies on.
static_assert(std::is_same<decltype(std::declval<ibmsg::message &>().from_region(
                               std::declval<ibmsg::socket &>(), std::declval<ibmsg::region &>(),
                               size_t(), size_t())),
                           bool>::value,
              "message::from_region() returns bool (false: would block)");
static_assert(std::is_same<decltype(std::declval<const ibmsg::message &>().flags()),
                           std::uint32_t>::value,
              "message::flags() is the C flags");
static_assert(std::is_same<decltype(std::declval<ibmsg::incoming &>().to_region(
                               std::declval<ibmsg::region &>(), size_t())),
                           bool>::value,
              "incoming::to_region() returns bool (false: does not fit)");
static_assert(std::is_same<decltype(std::declval<ibmsg::incoming &>().decline()), void>::value,
              "incoming::decline() throws on failure");
static_assert(std::is_same<decltype(std::declval<const ibmsg::incoming &>().size()), size_t>::value &&
                  std::is_same<decltype(std::declval<const ibmsg::incoming &>().imm()),
                               std::uint32_t>::value &&
                  std::is_same<decltype(std::declval<const ibmsg::incoming &>().flags()),
                               std::uint32_t>::value &&
                  std::is_same<decltype(std::declval<const ibmsg::incoming &>().handle()),
                               ibmsg_incoming *>::value,
              "incoming's accessors");
static_assert(!std::is_copy_constructible<ibmsg::incoming>::value &&
                  !std::is_move_constructible<ibmsg::incoming>::value &&
                  !std::is_default_constructible<ibmsg::incoming>::value,
              "an incoming is a view that cannot leave its callback");
static_assert(std::is_same<ibmsg::loop::message_incoming_handler,
                           std::function<void(ibmsg::socket &, ibmsg::incoming &)>>::value,
              "the message_incoming handler type");
static_assert(std::is_same<decltype(std::declval<const ibmsg::socket &>().memory()),
                           ibmsg_memory>::value &&
                  std::is_same<decltype(std::declval<const ibmsg::loop &>().memory()),
                               ibmsg_memory>::value,
              "socket::memory() and loop::memory() return the C struct");
static_assert(std::is_same<decltype(std::declval<const ibmsg::loop &>().stats()),
                           ibmsg_loop_counters>::value,
              "loop::stats() returns the C struct (1.6)");
static_assert(std::is_same<decltype(std::declval<const ibmsg::loop &>().get_option_u64(0)),
                           std::uint64_t>::value &&
                  std::is_same<decltype(std::declval<const ibmsg::options &>().get_u64(0)),
                               std::uint64_t>::value,
              "64-bit option getters");

// Issue 26's additions: a socket's own handlers, send() with a handler per message, byte views,
// std::chrono timeouts, std::error_code, stats and log.
static_assert(std::is_base_of<std::system_error, ibmsg::error>::value &&
                  std::is_base_of<std::runtime_error, ibmsg::error>::value,
              "ibmsg::error is a std::system_error (and still a std::runtime_error)");
static_assert(std::is_same<decltype(std::declval<const ibmsg::error &>().code()), int>::value,
              "ibmsg::error::code() stays the int code");
static_assert(std::is_same<decltype(std::declval<const ibmsg::error &>().error_code()),
                           std::error_code>::value,
              "ibmsg::error::error_code() is the std::error_code");
static_assert(std::is_error_code_enum<ibmsg_error>::value,
              "the C enum converts to std::error_code");
static_assert(std::is_convertible<ibmsg_error, std::error_code>::value,
              "std::error_code ec = IBMSG_ETIMEDOUT compiles");
static_assert(std::is_same<decltype(ibmsg::make_error_code(0)), std::error_code>::value,
              "ibmsg::make_error_code(int)");
static_assert(std::is_same<ibmsg::const_bytes, ibmsg::span<const std::byte>>::value &&
                  std::is_same<ibmsg::mutable_bytes, ibmsg::span<std::byte>>::value,
              "the byte views");
#if defined(__cpp_lib_span) && __cpp_lib_span >= 202002L
static_assert(std::is_same<ibmsg::const_bytes, std::span<const std::byte>>::value,
              "in C++20 the byte views are std::span");
#endif
static_assert(std::is_convertible<ibmsg::mutable_bytes, ibmsg::const_bytes>::value &&
                  !std::is_convertible<ibmsg::const_bytes, ibmsg::mutable_bytes>::value,
              "a writable view converts to a read-only one, not back");
static_assert(std::is_convertible<std::vector<std::byte> &, ibmsg::const_bytes>::value &&
                  !std::is_convertible<std::vector<char> &, ibmsg::const_bytes>::value,
              "byte containers convert to a view; char ones go through as_bytes()");
static_assert(std::is_same<decltype(std::declval<ibmsg::message &>().bytes()),
                           ibmsg::mutable_bytes>::value &&
                  std::is_same<decltype(std::declval<const ibmsg::message &>().bytes()),
                               ibmsg::const_bytes>::value,
              "message::bytes()");
static_assert(std::is_same<decltype(std::declval<ibmsg::message &>().data<char>()), char *>::value &&
                  std::is_same<decltype(std::declval<const ibmsg::message &>().data<std::byte>()),
                               const std::byte *>::value &&
                  std::is_same<decltype(std::declval<ibmsg::message &>().data()), void *>::value,
              "message::data<T>() is typed; data() stays void *");
static_assert(std::is_same<decltype(std::declval<ibmsg::message &>().alloc(
                               std::declval<ibmsg::socket &>(), std::string_view())),
                           bool>::value &&
                  std::is_same<decltype(std::declval<ibmsg::message &>().alloc(
                                   std::declval<ibmsg::socket &>(), ibmsg::const_bytes())),
                               bool>::value,
              "message::alloc() of a view returns bool (false: would block)");
static_assert(std::is_convertible<int, ibmsg::time_limit>::value &&
                  std::is_convertible<std::chrono::milliseconds, ibmsg::time_limit>::value &&
                  std::is_convertible<std::chrono::duration<double>, ibmsg::time_limit>::value,
              "a timeout is an int of ms or any duration");
static_assert(std::is_same<decltype(std::declval<const ibmsg::loop &>().next_timeout()),
                           std::optional<std::chrono::milliseconds>>::value,
              "loop::next_timeout()");
static_assert(std::is_same<decltype(std::declval<ibmsg::loop &>().drain()), bool>::value &&
                  std::is_same<decltype(ibmsg::loop::leaked_loops()), unsigned>::value,
              "loop::drain() and leaked_loops()");
static_assert(std::is_same<decltype(std::declval<const ibmsg::socket &>().stats()),
                           ibmsg_stats>::value,
              "socket::stats() returns the C struct");
static_assert(std::is_same<ibmsg::loop::log_handler,
                           std::function<void(ibmsg::socket *, int, std::string_view)>>::value,
              "the log handler type");
static_assert(std::is_same<ibmsg::socket::received_handler,
                           std::function<void(ibmsg::socket &, ibmsg::message)>>::value &&
                  std::is_same<ibmsg::socket::sent_handler,
                               std::function<void(ibmsg::socket &, ibmsg::message &, int)>>::value &&
                  std::is_same<ibmsg::socket::closed_handler,
                               std::function<void(ibmsg::socket &, int)>>::value &&
                  std::is_same<ibmsg::socket::established_handler,
                               std::function<void(ibmsg::socket &)>>::value,
              "a socket's own handler types are the loop's");
static_assert(std::is_same<decltype(std::declval<ibmsg::socket &>().send(
                               std::declval<ibmsg::message &>(), std::function<void(int)>())),
                           bool>::value &&
                  std::is_same<decltype(std::declval<ibmsg::socket &>().send(
                                   std::string_view(), nullptr)),
                               bool>::value &&
                  std::is_same<decltype(std::declval<ibmsg::socket &>().post(
                                   std::declval<ibmsg::message &>())),
                               bool>::value,
              "send() and post() return bool (false: would block)");
static_assert(std::is_nothrow_move_constructible<ibmsg::socket>::value &&
                  std::is_nothrow_move_assignable<ibmsg::socket>::value,
              "a socket with handlers still moves without throwing");

// Never called: compiled (under -pedantic) so that every overload is resolved and every template
// instantiated. Each option setter call must pick one overload, for any integer type.
void header_cxx_wrapper_calls(ibmsg::loop &lp, ibmsg::options &o, ibmsg::socket &s,
                              ibmsg::region &r, ibmsg::incoming &in, ibmsg::message &m) {
  lp.set_option(IBMSG_OPT_MAX_MSG_SIZE, (std::uint64_t(1) << 32) - 1);
  lp.set_option(IBMSG_OPT_RECV_DEPTH, 8);
  lp.set_option(IBMSG_OPT_RECV_DEPTH, 8u);
  lp.set_option(IBMSG_OPT_RECV_DEPTH, 8L);
  lp.set_option(IBMSG_OPT_RECV_DEPTH, size_t(8));
  lp.set_option(IBMSG_OPT_RECV_DEPTH, static_cast<short>(8));
  lp.set_option(IBMSG_OPT_BUSY_POLL, IBMSG_BUSY_POLL_ALWAYS);
  lp.set_option(IBMSG_OPT_DEVICE, "rxe0");
  o.set(IBMSG_OPT_MAX_MSG_SIZE, 5ull).set(IBMSG_OPT_EAGER_SIZE, 4096).set(IBMSG_OPT_RDMA, 1u);
  (void)lp.get_option_u64(IBMSG_OPT_MAX_MSG_SIZE);
  (void)o.get_u64(IBMSG_OPT_MAX_MSG_SIZE);
  (void)s.memory();
  (void)lp.memory();
  (void)lp.stats();
  if (m.from_region(s, r, 0, 1)) (void)m.post(s);
  if (!in.to_region(r, 0)) in.decline();
  lp.on_message_incoming([](ibmsg::socket &, ibmsg::incoming &) {});
  // Issue 26: every form of send(), the handlers, the timeouts.
  std::unique_ptr<int> owned;
  (void)s.send(m, [o = std::move(owned)](ibmsg::socket &, ibmsg::message, int) {});
  (void)s.send(m, [](int) {});
  (void)s.send(m);
  (void)s.send(m, ibmsg::socket::send_handler());
  (void)s.send_imm(m, 1u, nullptr);
  (void)s.send("text");
  (void)s.send(std::string("text"), [](int) {});
  (void)s.send(m.bytes(), [](int) {});
  (void)s.post(m);
  (void)s.post_imm(m, 2u);
  s.on_established([](ibmsg::socket &) {});
  s.on_received([](ibmsg::socket &, ibmsg::message) {});
  s.on_sent([](ibmsg::socket &, ibmsg::message &, int) {});
  s.on_closed([](ibmsg::socket &, int) {});
  (void)s.stats();
  (void)s.request(m, std::chrono::milliseconds(5), nullptr);
  (void)s.request(m, 5, [](ibmsg::socket &, ibmsg::message, int) {});
  lp.dispatch(std::chrono::microseconds(10));
  lp.dispatch(10);
  lp.set_option(IBMSG_OPT_KEEPALIVE, std::chrono::seconds(1));
  o.set(IBMSG_OPT_CONNECT_TIMEOUT, std::chrono::minutes(1));
  lp.on_log([](ibmsg::socket *, int, std::string_view) {});
  (void)lp.next_timeout();
  (void)lp.drain(std::chrono::seconds(1));
  (void)m.alloc(s, "abc");
  (void)m.alloc(s, 0);
  (void)ibmsg::descriptor::from_bytes(m.bytes());
}
#endif

extern "C" {
size_t header_cxx_layout(const char *what);
size_t header_cxx_layout_count(void);
const char *header_cxx_strerror(int code);
int header_cxx_wrapper_error_matches(void);
}

namespace {

struct Entry {
  const char *what;
  size_t value;
};

// The same list as test_header.c (test_header_layout.h), with the same spelling of each name.
const Entry kLayout[] = {
#include "test_header_layout.h"
};

}  // namespace

// sizeof, offsetof or value of `what` as C++ sees it; (size_t)-1 for a name not in the list.
size_t header_cxx_layout(const char *what) {
  for (const Entry &e : kLayout)
    if (std::strcmp(e.what, what) == 0) return e.value;
  return static_cast<size_t>(-1);
}

size_t header_cxx_layout_count(void) { return sizeof kLayout / sizeof kLayout[0]; }

const char *header_cxx_strerror(int code) { return ibmsg_strerror(code); }

// 1 if ibmsg::error carries the C code, name and text; 0 if not; -1 without ibmsg.hpp.
int header_cxx_wrapper_error_matches(void) {
#ifdef HEADER_HAVE_HPP
  const ibmsg::error e(IBMSG_EMSGSIZE);
  return e.code() == IBMSG_EMSGSIZE && std::strcmp(e.what(), ibmsg_strerror(IBMSG_EMSGSIZE)) == 0 &&
                 std::strcmp(e.name(), "IBMSG_EMSGSIZE") == 0
             ? 1
             : 0;
#else
  return -1;
#endif
}
