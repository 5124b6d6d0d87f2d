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

// The same list as test_header.c, with the same spelling of each name.
#define SIZE(t) {"sizeof(" #t ")", sizeof(t)},
#define OFF(t, m) {"offsetof(" #t ", " #m ")", offsetof(t, m)},
#define VAL(c) {#c, static_cast<size_t>(c)},
#define ERR(name, value, text) VAL(IBMSG_##name)
const Entry kLayout[] = {
    SIZE(ibmsg_buffer) OFF(ibmsg_buffer, data) OFF(ibmsg_buffer, size) OFF(ibmsg_buffer, status)
    OFF(ibmsg_buffer, user_data) OFF(ibmsg_buffer, impl) OFF(ibmsg_buffer, reserved)
    SIZE(ibmsg_socket) OFF(ibmsg_socket, status) OFF(ibmsg_socket, user_data)
    OFF(ibmsg_socket, loop) OFF(ibmsg_socket, close_reason) OFF(ibmsg_socket, reject_reason)
    OFF(ibmsg_socket, impl) OFF(ibmsg_socket, reserved)
    SIZE(ibmsg_event_loop) OFF(ibmsg_event_loop, connection_request)
    OFF(ibmsg_event_loop, connection_established) OFF(ibmsg_event_loop, message_received)
    OFF(ibmsg_event_loop, message_sent) OFF(ibmsg_event_loop, connection_closed)
    OFF(ibmsg_event_loop, user_data) OFF(ibmsg_event_loop, impl)
    OFF(ibmsg_event_loop, write_received) OFF(ibmsg_event_loop, message_incoming)
    OFF(ibmsg_event_loop, reserved)
    SIZE(ibmsg_incoming) OFF(ibmsg_incoming, size) OFF(ibmsg_incoming, imm)
    OFF(ibmsg_incoming, flags) OFF(ibmsg_incoming, impl) OFF(ibmsg_incoming, request)
    OFF(ibmsg_incoming, reserved)
    SIZE(ibmsg_memory) OFF(ibmsg_memory, buffers) OFF(ibmsg_memory, shared)
    OFF(ibmsg_memory, large) OFF(ibmsg_memory, reserved)
    SIZE(ibmsg_loop_counters) OFF(ibmsg_loop_counters, remote_access_violations)
    OFF(ibmsg_loop_counters, requests_banned) OFF(ibmsg_loop_counters, reserved)
    VAL(IBMSG_ACCESS_DEVICE_WIDE)
    SIZE(ibmsg_connection_request) OFF(ibmsg_connection_request, status)
    OFF(ibmsg_connection_request, listener) OFF(ibmsg_connection_request, loop)
    OFF(ibmsg_connection_request, peer_address) OFF(ibmsg_connection_request, peer_port)
    OFF(ibmsg_connection_request, impl) OFF(ibmsg_connection_request, reserved)
    SIZE(enum ibmsg_error) SIZE(enum ibmsg_socket_status) SIZE(enum ibmsg_buffer_status)
    SIZE(enum ibmsg_request_status) SIZE(enum ibmsg_option)
    SIZE(ibmsg_connection_request_cb) SIZE(ibmsg_message_sent_cb)
    VAL(IBMSG_OK) IBMSG_ERRNO_MAP(ERR) IBMSG_ERROR_MAP(ERR)
    VAL(IBMSG_UNCONNECTED) VAL(IBMSG_ADDRESS_RESOLVED) VAL(IBMSG_ROUTE_RESOLVED)
    VAL(IBMSG_CONNECTED) VAL(IBMSG_DISCONNECTING) VAL(IBMSG_ERROR) VAL(IBMSG_LISTENING)
    VAL(IBMSG_WAITING) VAL(IBMSG_SENT) VAL(IBMSG_RECEIVED) VAL(IBMSG_SEND_FAILED) VAL(IBMSG_FREED)
    VAL(IBMSG_UNDECIDED) VAL(IBMSG_ACCEPTED) VAL(IBMSG_REJECTED)
    VAL(IBMSG_OPT_RECV_DEPTH) VAL(IBMSG_OPT_SEND_DEPTH) VAL(IBMSG_OPT_SEND_QUEUE)
    VAL(IBMSG_OPT_MAX_MSG_SIZE) VAL(IBMSG_OPT_CONNECT_TIMEOUT) VAL(IBMSG_OPT_RNR_RETRY)
    VAL(IBMSG_OPT_SOURCE_ADDR) VAL(IBMSG_OPT_DEVICE) VAL(IBMSG_OPT_EAGER_SIZE)
    VAL(IBMSG_OPT_SHARED_RECV) VAL(IBMSG_OPT_KEEPALIVE) VAL(IBMSG_OPT_KEEPALIVE_COUNT)
    VAL(IBMSG_OPT_ACK_TIMEOUT) VAL(IBMSG_OPT_RETRY_COUNT) VAL(IBMSG_LOG_ERROR) VAL(IBMSG_LOG_DEBUG)
    VAL(IBMSG_MSG_IMM) VAL(IBMSG_MSG_REGION)
    VAL(IBMSG_VERSION) VAL(IBMSG_ERRNO_MAX) VAL(IBMSG_EBASE)
};
#undef SIZE
#undef OFF
#undef VAL
#undef ERR

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
