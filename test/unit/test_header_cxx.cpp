// test_header_cxx.cpp - the C++17 -pedantic half of test_header: ibmsg.h (and ibmsg.hpp when the
// tree has it) compile as C++, and C++ sees the same sizes, offsets and constants as C. The C half
// (test_header.c) asks for each value by the name it gives it.
#include <ibmsg.h>
#if __has_include(<ibmsg.hpp>)
#include <ibmsg.hpp>
#define HEADER_HAVE_HPP 1
#endif

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <type_traits>
#include <utility>

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
