/*
 * ibmsg.hpp - header-only C++17 wrapper of the ibmsg C API (ibmsg.h).
 *
 * Move-only RAII classes over the C objects, in the manner of cppzmq over libzmq:
 *
 *   ibmsg::error               an ibmsg error code as an exception: a std::system_error whose
 *                              std::error_code is of ibmsg::error_category()
 *   ibmsg::loop                owns an ibmsg_event_loop; the loop-wide callbacks are std::function
 *   ibmsg::socket              owns a heap-allocated ibmsg_socket (listener or connection), and
 *                              may carry handlers of its own (socket::on_received(), ...)
 *   ibmsg::message             owns one message: a send buffer, or a received message
 *   ibmsg::connection_request  a view of an incoming connection inside the request callback
 *   ibmsg::incoming            a view of a large message that starts to arrive, inside the
 *                              message_incoming callback: where its data goes, or decline it
 *   ibmsg::region              owns a memory region registered for one-sided RDMA
 *   ibmsg::descriptor          a remote descriptor (value type): what a peer needs to reach a range
 *   ibmsg::unanswered_request  a request that got no reply (timed out, or its connection closed),
 *                              handed to a request's handler: retry() sends it again
 *   ibmsg::span, const_bytes   a view of bytes: std::span in C++20, a small span of its own in
 *                              C++17 (the same members that std::span has, of those it offers)
 *   ibmsg::time_limit          a timeout: a std::chrono duration, or an int of milliseconds
 *
 * Every class exposes its C object with handle(), so any C function can be used alongside. A C
 * function that fails throws ibmsg::error carrying its code, except would-block (IBMSG_EAGAIN
 * from message::alloc(), message::from_region(), the posting calls (socket::post(), send(),
 * request(), reply(), ..., message::post()), the one-sided operations and
 * unanswered_request::retry()), which returns false as cppzmq does, and a large message that
 * does not fit where incoming::to_region() would put it (IBMSG_ERANGE), which returns false as
 * well: in both cases nothing changed, and the caller may try again or otherwise.
 *
 * Handlers: each callback of the C API reaches the application as a std::function. For
 * connection_established, message_received, message_sent and connection_closed the socket's
 * own handler runs if it has one (socket::on_established(), on_received(), on_sent(),
 * on_closed()), else the loop's (loop::on_connection_established(), ...); the other callbacks
 * (connection requests, large incoming messages, writes with immediate, log lines) are the
 * loop's. So a connection object of the application sets its socket's handlers (capturing
 * itself) and needs no map from sockets to connections:
 *
 *     struct session {
 *       ibmsg::socket sock;
 *       explicit session(ibmsg::connection_request &req) {
 *         sock.on_received([this](ibmsg::socket &s, ibmsg::message m) { handle(s, m); });
 *         sock.on_closed([this](ibmsg::socket &, int) { delete this; });
 *         req.accept(sock);  // set the handlers first: a spreading listener's connection
 *       }                    // may call back from another thread at once
 *     };
 *
 * Completion per post: socket::send() posts a message and runs a handler of its own once the
 * message is sent or failed (instead of message_sent), with the message handed back; the
 * wrapper keeps the message meanwhile (the application keeps no list of messages in flight).
 * The handler may be move-only (it may hold a received message, or a std::unique_ptr). With
 * byte views, a message is made, filled and sent in one call:
 *
 *     conn.send(std::string_view("hello"), [](int status) { ... });  // false: would block
 *
 * One-sided RDMA: socket::rdma_write(), rdma_read(), rdma_write_imm(), atomic_cas() and
 * atomic_fadd() take a std::function handler instead of an ibmsg_op; the wrapper allocates the
 * ibmsg_op (with the handler) for each operation and frees it after the library's done callback,
 * which the library gives every posted operation, also one canceled by a closing connection. The
 * handler runs exactly once, with IBMSG_OK or the reason (IBMSG_ECANCELED, IBMSG_EREMOTEACCESS,
 * IBMSG_EIO), unless the socket's wrapper died first (then nothing reaches the application, as
 * for messages). A call that fails posts nothing and frees the ibmsg_op at once; no handler runs.
 *
 *     ibmsg::region mem(loop, 4096, IBMSG_ACCESS_LOCAL_WRITE);
 *     ibmsg::descriptor remote = ibmsg::descriptor::from_bytes(msg.bytes());
 *     bool posted = conn.rdma_read(mem, 0, 4096, remote, 0, [&](ibmsg::socket &, int status) {
 *       if (status == IBMSG_OK) use(mem.data());
 *     });
 *
 * Requests and replies (ibmsg 1.5): socket::request() sends a message as a request and takes a
 * std::function handler instead of an ibmsg_request, which the wrapper allocates (with the
 * handler) for each request and frees after the library's done callback, as for the one-sided
 * operations. The handler runs exactly once per request() (and per retry()): with IBMSG_OK and
 * the reply, or with an empty message and IBMSG_ETIMEDOUT (no reply within the timeout; a later
 * reply is dropped) or the reason the connection closed (IBMSG_ECANCELED after disconnect(),
 * IBMSG_ECONNRESET, ...); unless the socket's wrapper died first (then nothing reaches the
 * application, and the reply is freed). The reply is an owning ibmsg::message like a received
 * one: freed when the handler's parameter dies, so move it to keep it. The request message
 * itself gets its message_sent callback as with post(). The responder gets the request in
 * message_received (message::is_request()), keeps it until it answers with socket::reply(), and
 * may drop it after.
 *
 *     conn.on_received([&](ibmsg::socket &s, ibmsg::message m) {
 *       if (!m.is_request()) return;
 *       ibmsg::message answer;
 *       if (answer.alloc(s, std::string_view("ok")) && s.reply(m, answer))
 *         outbox.push_back(std::move(answer));  // until message_sent
 *     });  // m dies here: answered, or never (a request freed unanswered gets no reply)
 *     bool posted = conn.request(msg, 1s, [&](ibmsg::socket &, ibmsg::message reply, int st) {
 *       if (st == IBMSG_OK) use(reply.to_string_view());
 *     });
 *
 * Retrying: a handler with a fourth parameter, an ibmsg::unanswered_request, may send the same
 * request again (ibmsg_retry_request(): the responder runs it at most once, so a retry is safe
 * also for a request the responder has seen). It holds the request after IBMSG_ETIMEDOUT or a
 * close reason (and is empty after IBMSG_OK); unanswered_request::retry(socket, msg, timeout)
 * sends it with a message of that socket, from inside the handler or later (after a
 * reconnection, on the new socket: move the unanswered_request out of the handler to keep it),
 * and the same handler runs again, once, for the retry. Dropping it gives the request up. The
 * wrapper never retries by itself:
 *
 *     bool posted = conn.request(msg, 200ms, [&](ibmsg::socket &s, ibmsg::message reply, int st,
 *                                                ibmsg::unanswered_request req) {
 *       if (st == IBMSG_ETIMEDOUT && req.retries() < 3 && req.retry(s, msg, 200ms)) return;
 *       done(st, std::move(reply));  // IBMSG_OK, or the last failure
 *     });
 *
 * (msg must not be posted when retry() sends it: its message_sent callback came, which it
 * normally has by the time the request timed out; retry() throws otherwise.)
 *
 * Timeouts are ibmsg::time_limit: any std::chrono duration (rounded up to whole milliseconds,
 * at most INT_MAX ms), or an int of milliseconds as before.
 *
 * A complete program, which says hello to a server and disconnects:
 *
 *     ibmsg::loop loop;      // first: it must outlive the socket
 *     ibmsg::socket conn;
 *     conn.on_established([](ibmsg::socket &s) {
 *       if (!s.send(std::string_view("hello"), [](ibmsg::socket &s, ibmsg::message, int) {
 *             s.disconnect();  // sent, or not: either way we are done
 *           }))
 *         s.disconnect();      // would block: not on a new connection
 *     });
 *     conn.connect(loop, "192.0.2.1", 12345);
 *     while (conn.is_open()) loop.dispatch();
 *
 * (examples/ibmsg-echo.cpp is a longer one.)
 *
 * Ownership and lifetime, the rules of ibmsg.h carried over:
 *   - the wrappers keep the C structs on the heap, so moving a wrapper never moves a struct the
 *     library points to. The `user_data` fields of the C loop, sockets and messages belong to
 *     the wrapper (they point back at the wrapper objects, or at the wrapper's keeping of a
 *     message in flight, and follow them when they move): do not change them, and do not give
 *     the loop's callbacks C structs of the application's own (their user_data would be read
 *     as the wrapper's). The C regions' user_data stays the application's. A socket's own
 *     handlers replace a map keyed by socket::handle() (which stays the same across moves).
 *   - destroying an open ibmsg::socket disconnects it; the C struct lives on until the library's
 *     closed callback, and no callback reaches the application for that socket any more.
 *   - destroying an ibmsg::message frees it; one still queued or in flight is freed when the
 *     library is done with it, and its message_sent callback does not reach the application.
 *     A message given to socket::send() is the wrapper's until its handler gets it back.
 *   - received messages come to the message_received callback as an owning ibmsg::message:
 *     freed (its credit returned to the peer) when that object dies, so keep it by moving it.
 *   - a message of a region's bytes (message::from_region(), or received into a region through
 *     incoming::to_region()) keeps the region busy until it is freed; a region that dies before
 *     is deregistered by the loop after the last such message is freed (see region::~region()).
 *   - destroying an ibmsg::region deregisters it (and frees the memory of an allocated one); one
 *     that this side's operations still use is deregistered by the loop later, after the last
 *     of them (deferred deregistration: see region::~region()).
 *   - the loop must outlive its sockets, messages and regions: create it first so that C++
 *     destroys it last. Its destructor never waits: what the sockets', messages' and regions'
 *     destructors left closing must be done by then, which loop::drain() waits for; otherwise
 *     the C loop is leaked on purpose (see loop::~loop()).
 *
 * Exceptions thrown by a callback do not cross the C library: the first one is held and
 * rethrown by the dispatch(), process() or drain() call that ran the callback (later ones in
 * the same call are dropped). The library's own state stays consistent either way. Callbacks of
 * a loop on the application's libev loop run inside ev_run(), where nothing can be rethrown:
 * such an exception waits for the next dispatch() or process(), so those callbacks should not
 * throw.
 *
 * Threading is that of ibmsg.h: a loop and everything on it belong to one thread at a time.
 */
#ifndef IBMSG_HPP
#define IBMSG_HPP

/* One clear error, and nothing after it, for older C++ (doxygen, which defines no __cplusplus,
 * reads on). */
#if defined(__cplusplus) && __cplusplus < 201703L
#error "ibmsg.hpp needs C++17 (-std=c++17 or later)"
#else

/** @file ibmsg.hpp
 *  Header-only C++17 wrapper of the ibmsg C API: move-only RAII classes, callbacks as lambdas,
 *  errors as ibmsg::error. See the comment at the top of this file. */

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <initializer_list>
#include <iterator>
#include <memory>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <tuple>
#include <type_traits>
#include <utility>
#if __cplusplus >= 202002L && defined(__has_include)
#if __has_include(<span>)
#include <span>
#endif
#endif

#include "ibmsg.h"

namespace ibmsg {

class loop;
class socket;
class message;
class connection_request;
class region;
class descriptor;
class incoming;
class unanswered_request;

namespace detail {
/* The user_data of a C struct whose wrapper has died while the library still holds it: the
 * loop's callbacks free such structs instead of calling the application. */
inline char orphan_tag;
inline void *const orphan = &orphan_tag;
}  // namespace detail

/* ---------------------------------------------------------------------------------------------
 * Errors and version
 * ------------------------------------------------------------------------------------------ */

/**
 * The std::error_category of ibmsg's codes ("ibmsg"): message() is ibmsg_strerror(). The codes
 * below IBMSG_ERRNO_MAX are errno values, and compare equal to the std::errc of that value
 * (IBMSG_ETIMEDOUT == std::errc::timed_out); ibmsg's own codes (IBMSG_EREJECTED, ...) to no
 * std::errc.
 */
class error_category_impl final : public std::error_category {
 public:
  /** "ibmsg". */
  const char *name() const noexcept override { return "ibmsg"; }
  /** ibmsg_strerror(code). */
  std::string message(int code) const override { return ibmsg_strerror(code); }
  /** An errno-based code as the std::generic_category() condition of that value; ibmsg's own
   *  codes (and IBMSG_OK) as themselves. */
  std::error_condition default_error_condition(int code) const noexcept override {
    if (code > 0 && code < IBMSG_ERRNO_MAX) return std::error_condition(code, std::generic_category());
    return std::error_condition(code, *this);
  }
};

/** The one error category of ibmsg's codes. */
inline const std::error_category &error_category() noexcept {
  static const error_category_impl category;
  return category;
}

/** An ibmsg code (IBMSG_OK, IBMSG_EINVAL, IBMSG_EREJECTED, ...) as a std::error_code. */
inline std::error_code make_error_code(int code) noexcept {
  return std::error_code(code, error_category());
}

/**
 * An ibmsg error code as an exception: a std::system_error (and so a std::runtime_error) whose
 * code() as a std::system_error is of ibmsg::error_category(); what() is ibmsg_strerror(code()).
 */
class error : public std::system_error {
 public:
  /** Makes the exception for an ibmsg error code (IBMSG_EINVAL, IBMSG_EREJECTED, ...). */
  explicit error(int code) : std::system_error(ibmsg::make_error_code(code)), code_(code) {}

  /** The ibmsg error code (an int, as in ibmsg 1.x's wrapper; std::system_error::code() gives
   *  it as a std::error_code, as does error_code()). */
  int code() const noexcept { return code_; }
  /** The code as a std::error_code of ibmsg::error_category(). */
  std::error_code error_code() const noexcept { return std::system_error::code(); }
  /** The code's name, e.g. "IBMSG_EMSGSIZE" (ibmsg_err_name()). */
  const char *name() const noexcept { return ibmsg_err_name(code_); }
  /** The message of the code (ibmsg_strerror()). */
  const char *what() const noexcept override { return ibmsg_strerror(code_); }

 private:
  int code_;
};

/* ---------------------------------------------------------------------------------------------
 * Byte views and time limits
 * ------------------------------------------------------------------------------------------ */

#if defined(__cpp_lib_span) && __cpp_lib_span >= 202002L
/** A view of contiguous objects: std::span in C++20 (with extent std::dynamic_extent). The
 *  wrapper's functions that take or give bytes use const_bytes and mutable_bytes, so their types
 *  differ between C++17 and C++20: compile every file of a program that passes them between
 *  files with the same standard. */
template <class T>
using span = std::span<T>;
#else
/**
 * A view of count contiguous objects of type T at data, for C++17 (in C++20, ibmsg::span is
 * std::span): a pointer and a size, with the members of std::span that the wrapper's users
 * need. It owns nothing. The wrapper's functions that take or give bytes use const_bytes and
 * mutable_bytes, so their types differ between C++17 and C++20: compile every file of a program
 * that passes them between files with the same standard.
 */
template <class T>
class span {
 public:
  using element_type = T;                          /**< T */
  using value_type = std::remove_cv_t<T>;          /**< T without const */
  using size_type = std::size_t;                   /**< std::size_t */
  using pointer = T *;                             /**< T * */
  using reference = T &;                           /**< T & */
  using iterator = T *;                            /**< a pointer */

  /** An empty view. */
  constexpr span() noexcept = default;
  /** count objects at data. */
  constexpr span(T *data, std::size_t count) noexcept : p_(data), n_(count) {}
  /** An array. */
  template <std::size_t N>
  constexpr span(T (&a)[N]) noexcept : p_(a), n_(N) {}
  /** A view of U as one of T (U * converts to T *: adds const). */
  template <class U, std::enable_if_t<std::is_convertible_v<U (*)[], T (*)[]>, int> = 0>
  constexpr span(const span<U> &other) noexcept : p_(other.data()), n_(other.size()) {}
  /** A contiguous container whose data() converts to T * (std::vector, std::array, ...). */
  template <class C,
            std::enable_if_t<!std::is_array_v<std::remove_reference_t<C>> &&
                                 std::is_convertible_v<std::remove_pointer_t<decltype(
                                                           std::declval<C &>().data())> (*)[],
                                                       T (*)[]>,
                             int> = 0>
  constexpr span(C &c) noexcept(noexcept(c.data()) && noexcept(c.size()))
      : p_(c.data()), n_(c.size()) {}

  /** The first object. */
  constexpr T *data() const noexcept { return p_; }
  /** The number of objects. */
  constexpr std::size_t size() const noexcept { return n_; }
  /** The number of bytes. */
  constexpr std::size_t size_bytes() const noexcept { return n_ * sizeof(T); }
  /** True if size() is 0. */
  constexpr bool empty() const noexcept { return n_ == 0; }
  /** Object i (i < size()). */
  constexpr T &operator[](std::size_t i) const noexcept { return p_[i]; }
  /** The first object, as an iterator. */
  constexpr T *begin() const noexcept { return p_; }
  /** Past the last object. */
  constexpr T *end() const noexcept { return p_ + n_; }
  /** The first count objects. */
  constexpr span first(std::size_t count) const noexcept { return span(p_, count); }
  /** count objects from offset (all the rest for count std::size_t(-1)). */
  constexpr span subspan(std::size_t offset, std::size_t count = std::size_t(-1)) const noexcept {
    return span(p_ + offset, count == std::size_t(-1) ? n_ - offset : count);
  }

 private:
  T *p_ = nullptr;
  std::size_t n_ = 0;
};
#endif

/** Bytes to read: what the wrapper's functions take (message::alloc(), socket::send(), ...). */
using const_bytes = span<const std::byte>;
/** Bytes to write: a message's payload (message::bytes()). */
using mutable_bytes = span<std::byte>;

/** The bytes of a string (no terminator). */
inline const_bytes as_bytes(std::string_view text) noexcept {
  return const_bytes(reinterpret_cast<const std::byte *>(text.data()), text.size());
}
/** Bytes as characters. */
inline std::string_view to_string_view(const_bytes bytes) noexcept {
  return std::string_view(reinterpret_cast<const char *>(bytes.data()), bytes.size());
}

/**
 * A timeout, as the wrapper's functions take it: a std::chrono duration, rounded up to whole
 * milliseconds (so 1 us is 1 ms, not 0) and capped at INT_MAX ms, or an int of milliseconds
 * taken as it is (the wrapper's older signatures; a negative int is passed on, and the function
 * says what it makes of it). A negative duration is -1 ms.
 */
class time_limit {
 public:
  /** ms milliseconds, as they are. */
  constexpr time_limit(int ms) noexcept : ms_(ms) {}  // NOLINT: implicit, as the older ints
  /** A duration, rounded up to whole milliseconds, at most INT_MAX; negative: -1. */
  template <class Rep, class Period>
  constexpr time_limit(std::chrono::duration<Rep, Period> d) noexcept  // NOLINT: implicit
      : ms_(from(d)) {}

  /** The milliseconds. */
  constexpr int ms() const noexcept { return ms_; }
  /** As a std::chrono::milliseconds. */
  constexpr std::chrono::milliseconds duration() const noexcept {
    return std::chrono::milliseconds(ms_);
  }

 private:
  template <class Rep, class Period>
  static constexpr int from(std::chrono::duration<Rep, Period> d) noexcept {
    if (d < std::chrono::duration<Rep, Period>::zero()) return -1;
    using ms_double = std::chrono::duration<double, std::milli>;
    const double v = std::chrono::duration_cast<ms_double>(d).count();
    if (v >= double(INT_MAX)) return INT_MAX;
    int whole = static_cast<int>(v);
    return double(whole) < v ? whole + 1 : whole;
  }
  int ms_;
};

namespace detail {
/* The byte types message::data<T>() gives. */
template <class T>
inline constexpr bool is_byte_v =
    std::is_same_v<std::remove_cv_t<T>, char> || std::is_same_v<std::remove_cv_t<T>, signed char> ||
    std::is_same_v<std::remove_cv_t<T>, unsigned char> || std::is_same_v<std::remove_cv_t<T>, std::byte>;

/* Throws ibmsg::error unless rc is IBMSG_OK. */
inline void check(int rc) {
  if (rc != IBMSG_OK) throw error(rc);
}

/* The integer types other than int (and bool), of at most 64 bits, that the option setters
 * take: see loop::set_option(). */
template <class T>
using if_other_integer =
    std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, int> &&
                         !std::is_same_v<T, bool> && sizeof(T) <= sizeof(std::uint64_t),
                     int>;

/* Sets an integer option from a value of another type than int through set(value, len), as
 * ibmsg_setopt(3) takes integers: a value that fits an int as an int, which every integer option
 * takes; a larger one as a uint64_t with len 8, which the options of sizes beyond INT_MAX take and
 * the others refuse (IBMSG_EINVAL, for the length). So the library, not the wrapper, knows each
 * option's type, and says IBMSG_EINVAL for a value out of range either way. A value below INT_MIN
 * fits neither C type: IBMSG_EINVAL as well. */
template <class T, class Set>
int set_integer(T value, Set &&set) {
  bool fits_int;
  if constexpr (std::is_signed_v<T>) {
    if (static_cast<std::intmax_t>(value) < INT_MIN) return IBMSG_EINVAL;
    fits_int = static_cast<std::intmax_t>(value) <= INT_MAX;
  } else {
    fits_int = static_cast<std::uintmax_t>(value) <= static_cast<std::uintmax_t>(INT_MAX);
  }
  if (fits_int) {
    int v = static_cast<int>(value);
    return set(&v, sizeof v);
  }
  std::uint64_t v = static_cast<std::uint64_t>(value);
  return set(&v, sizeof v);
}

/* Reads an integer option as a std::uint64_t through get(value, len), as ibmsg_getopt(3) gives
 * integers: into a buffer of 8 bytes, which an option of sizes beyond INT_MAX fills as a uint64_t
 * (*len stays 8) and any other integer option as an int (*len becomes sizeof(int)). So any
 * integer option reads whole, without a list of their types here; a negative int is
 * IBMSG_ERANGE, and a value of neither size (a string option) IBMSG_EINVAL. */
template <class Get>
std::uint64_t get_integer(Get &&get) {
  static_assert(sizeof(int) < sizeof(std::uint64_t), "ibmsg_getopt tells int from uint64_t by len");
  std::uint64_t wide = 0;
  std::size_t len = sizeof wide;
  check(get(&wide, &len));
  if (len == sizeof wide) return wide;
  if (len != sizeof(int)) throw error(IBMSG_EINVAL);
  int v = 0;
  std::memcpy(&v, &wide, sizeof v);  // the int is in the buffer's first bytes
  if (v < 0) throw error(IBMSG_ERANGE);
  return static_cast<std::uint64_t>(v);
}
}  // namespace detail

/** The version of the linked library as (major, minor, patch). */
inline std::tuple<int, int, int> version() noexcept {
  int maj = 0, min = 0, pat = 0;  // not major/minor: glibc has macros of those names
  ibmsg_version(&maj, &min, &pat);
  return std::make_tuple(maj, min, pat);
}

/** The version of the linked library as "MAJOR.MINOR.PATCH". */
inline const char *version_string() noexcept { return ibmsg_version_string(); }

/* ---------------------------------------------------------------------------------------------
 * Option sets
 * ------------------------------------------------------------------------------------------ */

class loop;

/**
 * A set of socket options (ibmsg_options_new()) for socket::listen(), socket::connect() and
 * connection_request::accept(): move-only, freed by the destructor. The socket copies the set.
 */
class options {
 public:
  /** The built-in defaults. Throws ibmsg::error (IBMSG_ENOMEM). */
  options() : o_(ibmsg_options_new(nullptr)) {
    if (!o_) throw error(IBMSG_ENOMEM);
  }
  /** The current defaults of loop l. Throws ibmsg::error. */
  explicit options(loop &l);
  ~options() { ibmsg_options_free(o_); }
  options(const options &) = delete;
  options &operator=(const options &) = delete;
  /** Takes over other's set; other becomes empty. */
  options(options &&other) noexcept : o_(other.o_) { other.o_ = nullptr; }
  /** Frees this set and takes over other's. */
  options &operator=(options &&other) noexcept {
    if (this != &other) {
      ibmsg_options_free(o_);
      o_ = other.o_;
      other.o_ = nullptr;
    }
    return *this;
  }

  /** Sets an int option; returns *this. Throws ibmsg::error (IBMSG_EINVAL). */
  options &set(int option, int value) {
    detail::check(ibmsg_options_set(o_, option, &value, sizeof value));
    return *this;
  }
  /** Sets an integer option from another integer type (std::uint64_t, std::size_t, unsigned,
   *  ...), as loop::set_option() does: the options of sizes (ibmsg.h: "int, or uint64_t") take
   *  values beyond INT_MAX, the int options a value that fits an int. Returns *this. Throws
   *  ibmsg::error (IBMSG_EINVAL). */
  template <class T, detail::if_other_integer<T> = 0>
  options &set(int option, T value) {
    detail::check(detail::set_integer(value, [&](const void *v, std::size_t len) {
      return ibmsg_options_set(o_, option, v, len);
    }));
    return *this;
  }
  /** Sets an option of milliseconds from a std::chrono duration, as loop::set_option() does;
   *  returns *this. Throws ibmsg::error (IBMSG_EINVAL). */
  template <class Rep, class Period>
  options &set(int option, std::chrono::duration<Rep, Period> value) {
    return set(option, time_limit(value).ms());
  }
  /** Sets a string option; returns *this. Throws ibmsg::error. */
  options &set(int option, std::string_view value) {
    detail::check(ibmsg_options_set(o_, option, value.empty() ? "" : value.data(), value.size()));
    return *this;
  }
  /** Reads an int option. Throws ibmsg::error. An option of sizes reads as at most INT_MAX
   *  (ibmsg_getopt() into an int): see get_u64(). */
  int get(int option) const {
    int value = 0;
    std::size_t len = sizeof value;
    detail::check(ibmsg_options_get(o_, option, &value, &len));
    return value;
  }
  /** Reads any integer option as loop::get_option_u64() does: an option of sizes whole, also
   *  beyond INT_MAX. Throws ibmsg::error (IBMSG_ERANGE for a negative value). */
  std::uint64_t get_u64(int option) const {
    return detail::get_integer([&](void *v, std::size_t *len) {
      return ibmsg_options_get(o_, option, v, len);
    });
  }

  /** The C option set (nullptr once moved from). */
  const ibmsg_options *handle() const noexcept { return o_; }
  /** The C option set to pass on: a moved-from set is an error (IBMSG_EINVAL), not "defaults". */
  const ibmsg_options *checked() const {
    if (!o_) throw error(IBMSG_EINVAL);
    return o_;
  }

 private:
  ibmsg_options *o_;
};

/* ---------------------------------------------------------------------------------------------
 * Remote descriptor
 * ------------------------------------------------------------------------------------------ */

/**
 * A remote descriptor (ibmsg_descriptor): the IBMSG_DESCRIPTOR_SIZE bytes a peer needs to reach a
 * range of a region, made by region::descriptor() and sent to the peer in a message as they are
 * (bytes(), size()); the peer turns the payload back into a descriptor with from_bytes(). A plain
 * value: copying it copies the bytes, and owns nothing (region::revoke() ends the grant).
 *
 * A default-constructed descriptor is all zero bytes, which is not a valid descriptor: valid() is
 * false, and operations with it throw ibmsg::error (IBMSG_EBADDESC).
 */
class descriptor {
 public:
  /** All zero bytes: not a valid descriptor. */
  descriptor() noexcept : d_() {}
  /** A copy of the C descriptor d (not checked; see valid()). */
  explicit descriptor(const ibmsg_descriptor &d) noexcept : d_(d) {}

  /**
   * The descriptor in size bytes at data, e.g. a received message's payload: checked with
   * ibmsg_descriptor_info(). Throws ibmsg::error (IBMSG_EBADDESC) unless size is
   * IBMSG_DESCRIPTOR_SIZE and the bytes are a well-formed descriptor. The check catches damaged
   * or random bytes; it is no protection against forgery (the peer's key and range are).
   */
  static descriptor from_bytes(const void *data, std::size_t size) {
    if (!data || size != IBMSG_DESCRIPTOR_SIZE) throw error(IBMSG_EBADDESC);
    descriptor d;
    std::memcpy(d.d_.bytes, data, IBMSG_DESCRIPTOR_SIZE);
    detail::check(ibmsg_descriptor_info(&d.d_, nullptr, nullptr));
    return d;
  }

  /** from_bytes() of a byte view, e.g. message::bytes(). */
  static descriptor from_bytes(const_bytes bytes) {
    return from_bytes(bytes.data(), bytes.size());
  }

  /** True if the bytes are a well-formed descriptor (ibmsg_descriptor_info() succeeds). */
  bool valid() const noexcept { return ibmsg_descriptor_info(&d_, nullptr, nullptr) == IBMSG_OK; }
  /** The number of bytes the descriptor grants. Throws ibmsg::error (IBMSG_EBADDESC). */
  std::size_t length() const {
    std::size_t n = 0;
    detail::check(ibmsg_descriptor_info(&d_, &n, nullptr));
    return n;
  }
  /** The rights it grants (IBMSG_ACCESS_REMOTE_*). Throws ibmsg::error (IBMSG_EBADDESC). */
  unsigned access() const {
    unsigned rights = 0;
    detail::check(ibmsg_descriptor_info(&d_, nullptr, &rights));
    return rights;
  }

  /** The bytes to send to the peer: size() of them. */
  const unsigned char *bytes() const noexcept { return d_.bytes; }
  /** The same bytes as a view, e.g. for message::alloc() or socket::send(). */
  const_bytes view() const noexcept {
    return const_bytes(reinterpret_cast<const std::byte *>(d_.bytes), IBMSG_DESCRIPTOR_SIZE);
  }
  /** IBMSG_DESCRIPTOR_SIZE: the number of bytes(). */
  static constexpr std::size_t size() noexcept { return IBMSG_DESCRIPTOR_SIZE; }
  /** The C descriptor. */
  const ibmsg_descriptor &handle() const noexcept { return d_; }

  /** True if a and b are the same bytes (the same grant). */
  friend bool operator==(const descriptor &a, const descriptor &b) noexcept {
    return std::memcmp(a.d_.bytes, b.d_.bytes, IBMSG_DESCRIPTOR_SIZE) == 0;
  }
  /** True if a and b differ in any byte. */
  friend bool operator!=(const descriptor &a, const descriptor &b) noexcept { return !(a == b); }

 private:
  ibmsg_descriptor d_;
};

namespace detail {
/* The C region of an ibmsg::region, on the heap so that moving the wrapper moves nothing the
 * library points to, and so that it can outlive its wrapper until this side's operations and
 * messages on it are done (see region::~region()). */
struct region_box {
  ibmsg_region c{};
  ibmsg_event_loop *loop = nullptr;  // the C loop it is registered on
  std::size_t ops = 0;               // operations posted through the wrapper, handler not yet run
  bool orphan = false;               // the wrapper died: deregister once nothing uses it
  region_box *next = nullptr;        // orphans: the next in the loop wrapper's list
};

/* One request posted through the wrapper (socket::request()): defined with the socket's
 * functions, once message and unanswered_request are complete. */
struct request_box;
/* A message sent through socket::send(), kept with its handler: defined after message. */
struct send_box;
/* The handlers of a socket's own (socket::on_received(), ...): defined after message. */
struct socket_handlers;

/* One operation posted through the wrapper: the ibmsg_op the library holds, and the handler.
 * Allocated by the posting call, freed after the library's done callback. */
struct op_box {
  ibmsg_op op{};
  region_box *local = nullptr;
  std::size_t local_offset = 0;  // atomics: where the previous value lands
  std::function<void(socket &, int)> done;
  std::function<void(socket &, int, std::uint64_t)> atomic_done;
};
}  // namespace detail

/* ---------------------------------------------------------------------------------------------
 * Socket
 * ------------------------------------------------------------------------------------------ */

/**
 * A listening socket or one connection: owns a heap-allocated ibmsg_socket.
 *
 * A default-constructed socket holds nothing (handle() is nullptr) until listen(), connect() or
 * connection_request::accept() sets it up. It is open from then until its connection_closed
 * callback; after that it may be set up again. Moving it is allowed at any time, also while it
 * is open and inside callbacks: callbacks then get the object it was moved to.
 *
 * The destructor of an open socket calls ibmsg_disconnect() and lets the C struct live until
 * the library has closed it; no callback for it reaches the application after that, including
 * the handlers of its one-sided operations, requests and send() (their storage is freed all the
 * same, and the loop counts the socket as closing until then: see loop::drain()).
 *
 * Handlers of its own: on_established(), on_received(), on_sent() and on_closed() set handlers
 * that take this socket's callbacks instead of the loop's (each one that is set; the loop's
 * handler runs for the others). They belong to the wrapper object: they move with it, stay when
 * the socket is set up again, and die with it. Set them before connect() or accept() (a
 * spreading listener's or accept_on()'s connection may call back from another loop's thread at
 * once). A handler may destroy the socket, also from inside itself (the closed handler, for
 * example, may delete the object that holds the socket), but may not replace itself while it
 * runs.
 *
 * Posting: post() and post_imm() send a message that stays the application's (its message_sent
 * callback gives it back: on_sent() or loop::on_message_sent()); send() and send_imm() take the
 * message and run a completion handler of their own once, with the message handed back and the
 * status, instead of message_sent; request() and reply() send a request and a reply. Each
 * returns false if the send buffers or the send queue are full (IBMSG_EAGAIN: nothing was sent),
 * and throws ibmsg::error for what the library refuses (nothing was sent, no handler runs).
 *
 * One-sided operations (rdma_write(), rdma_read(), rdma_write_imm(), atomic_cas(),
 * atomic_fadd()) need a CONNECTED socket whose peer offers one-sided RDMA (IBMSG_OPT_RDMA on
 * both sides). Each successful call runs its handler exactly once from the loop: IBMSG_OK when
 * it completed at the peer; IBMSG_ECANCELED when the connection closed first (queued or in
 * flight; all handlers of a socket run before its connection_closed callback);
 * IBMSG_EREMOTEACCESS when the peer refused it (the connection then closes); IBMSG_EIO for other
 * transport errors. The handler may be empty. A call returns false when IBMSG_OPT_SEND_QUEUE
 * messages and operations wait already (IBMSG_EAGAIN: nothing was posted, the handler is
 * dropped; retry after a handler or message_sent callback), and throws ibmsg::error when the
 * library refuses it (nothing was posted, no handler runs): IBMSG_ERANGE, IBMSG_EACCES,
 * IBMSG_EBADDESC, IBMSG_EOPNOTSUPP, IBMSG_ENOTCONN, IBMSG_EINVAL (for an empty region, too), ...
 * (see ibmsg_rdma_write()). The local region must stay registered, and its bytes untouched while
 * a read or an atomic writes them, until the handler runs (region::~region() keeps it registered
 * until then).
 *
 * Requests (request()) need a CONNECTED socket whose peer's ibmsg has requests (1.5). Each
 * successful call runs its handler exactly once from the loop (see the comment at the top of this
 * file): IBMSG_OK with the reply; IBMSG_ETIMEDOUT; or the reason the connection closed (all
 * handlers of a socket run before its connection_closed callback). The handler may be empty (the
 * reply is then freed unread). A call returns false when the send queue is full (IBMSG_EAGAIN:
 * nothing was sent, the handler is dropped), and throws ibmsg::error when the library refuses the
 * request (nothing was sent, no handler runs): IBMSG_EINVAL (a timeout of 0 or less, an empty
 * message), IBMSG_EOPNOTSUPP (the peer's ibmsg has no requests), IBMSG_EMSGSIZE (above the
 * connection's maximum; above the eager size a request goes by rendezvous, like a message),
 * IBMSG_ENOTCONN, ... (see ibmsg_post_request()).
 */
class socket {
 public:
  /** Handler of a write, read or write-with-immediate: runs exactly once with IBMSG_OK or the
   *  reason it failed (see the class comment). */
  using op_handler = std::function<void(socket &, int status)>;
  /** Handler of an atomic: like op_handler, and previous is the remote word's value before
   *  the atomic (read from the local region at completion; 0 unless status is IBMSG_OK). */
  using atomic_handler = std::function<void(socket &, int status, std::uint64_t previous)>;
  /** Handler of a request (request()): runs exactly once with IBMSG_OK and the reply, a received
   *  message the handler owns (freed when the parameter dies: move it to keep it), or with an
   *  empty message and IBMSG_ETIMEDOUT or the reason the connection closed. */
  using reply_handler = std::function<void(socket &, message reply, int status)>;
  /** reply_handler that may retry the request: after IBMSG_ETIMEDOUT or a close reason, req
   *  holds it (unanswered_request::retry() sends it again and this handler runs again, once);
   *  after IBMSG_OK req is empty. */
  using retry_handler =
      std::function<void(socket &, message reply, int status, unanswered_request req)>;
  /** The socket's own handler when the connection reaches IBMSG_CONNECTED (on_established()). */
  using established_handler = std::function<void(socket &)>;
  /** The socket's own handler of each received message, which it owns (on_received()). */
  using received_handler = std::function<void(socket &, message)>;
  /** The socket's own message_sent handler (on_sent()): once per post() or post_imm(), with
   *  IBMSG_OK when the peer has the message, otherwise why not. */
  using sent_handler = std::function<void(socket &, message &, int status)>;
  /** The socket's own handler when it has closed (on_closed()): reason IBMSG_OK after
   *  disconnect(), IBMSG_ECONNRESET when the peer disconnected, otherwise the error. */
  using closed_handler = std::function<void(socket &, int reason)>;
  /** A handler of send() and send_imm() in its most general form (any callable of either form
   *  is taken, move-only ones too: see send()). */
  using send_handler = std::function<void(socket &, message, int status)>;

  /** An empty socket: nothing allocated, status IBMSG_UNCONNECTED. */
  socket() noexcept = default;
  /** Disconnects an open socket (see the class comment) and frees the C struct. */
  ~socket() { reset(); }

  /** Takes over other's C socket and handlers; other becomes empty. */
  socket(socket &&other) noexcept
      : s_(std::exchange(other.s_, nullptr)),
        open_(std::exchange(other.open_, false)),
        h_(std::move(other.h_)) {
    if (s_) s_->user_data = this;
  }
  /** Closes this socket as the destructor does, then takes over other's C socket and
   *  handlers. */
  socket &operator=(socket &&other) noexcept {
    if (this != &other) {
      reset();
      s_ = std::exchange(other.s_, nullptr);
      open_ = std::exchange(other.open_, false);
      h_ = std::move(other.h_);
      if (s_) s_->user_data = this;
    }
    return *this;
  }
  /** Not copyable: one wrapper owns each C socket. */
  socket(const socket &) = delete;
  /** Not copyable. */
  socket &operator=(const socket &) = delete;

  /**
   * Listens on ip (IPv4, IPv6 or host name; nullptr or "" for all addresses) and port (0: any
   * free port, see local_port()), accepting at most max_connections connections at once.
   * Throws ibmsg::error (IBMSG_ESTATE if this socket is still open).
   */
  void listen(loop &l, const char *ip, unsigned short port, int max_connections);
  /** listen() with an option set instead of the loop's defaults; the connections it accepts take
   *  these options unless accept() is given others. */
  void listen(loop &l, const char *ip, unsigned short port, int max_connections,
              const options &opts);
  /** listen() with the address as a std::string. */
  void listen(loop &l, const std::string &ip, unsigned short port, int max_connections) {
    listen(l, ip.c_str(), port, max_connections);
  }
  /**
   * A listener spreads its connections over loops (since 1.7; ibmsg_listen_spread()): accept()
   * in its request callback accepts each onto the next of loops in turn, with the rules of
   * connection_request::accept_on() for the socket; empty: no more spreading. At most 64 loops;
   * they must outlive the connections on them. Throws ibmsg::error (IBMSG_EINVAL if not a
   * listener).
   */
  void spread(std::initializer_list<loop *> loops);

  /**
   * Starts connecting to ip (IPv4, IPv6 or host name) and port. The loop's connection
   * established callback follows, or the connection closed callback with the reason.
   * Throws ibmsg::error (IBMSG_ESTATE if this socket is still open).
   */
  void connect(loop &l, const char *ip, unsigned short port);
  /** connect() with an option set instead of the loop's defaults. */
  void connect(loop &l, const char *ip, unsigned short port, const options &opts);
  /** connect() with the address as a std::string. */
  void connect(loop &l, const std::string &ip, unsigned short port) {
    connect(l, ip.c_str(), port);
  }

  /**
   * Closes the socket (ibmsg_disconnect()); the connection closed callback follows from the
   * loop. Throws ibmsg::error: IBMSG_ESTATE if it is already closing.
   */
  void disconnect() { detail::check(ibmsg_disconnect(s_)); }

  /** Sets this socket's own handler of connection_established (see the class comment); an
   *  empty one hands the callback to the loop's handler again. Throws std::bad_alloc. */
  void on_established(established_handler h);
  /** Sets this socket's own handler of received messages (see the class comment). */
  void on_received(received_handler h);
  /** Sets this socket's own handler of message_sent for post() and post_imm() (see the class
   *  comment; send() has handlers per message instead). */
  void on_sent(sent_handler h);
  /** Sets this socket's own handler of connection_closed (see the class comment). */
  void on_closed(closed_handler h);

  /**
   * Sends msg.size() bytes of msg, a message allocated on this socket (ibmsg_post_send()). The
   * library owns the message until its message_sent callback (on_sent(), else the loop's),
   * which gets msg (or the object it was moved to). Returns false when the send queue is full
   * (IBMSG_EAGAIN: nothing was sent, retry after a message_sent callback). Throws ibmsg::error
   * otherwise (IBMSG_ENOTCONN, IBMSG_EMSGSIZE, ...). message::post() is the same call.
   */
  [[nodiscard]] bool post(message &msg);
  /** post() with a 32-bit immediate that the receiver finds in message::imm()
   *  (ibmsg_post_send_imm()); IBMSG_EOPNOTSUPP if the peer's ibmsg takes none on messages. */
  [[nodiscard]] bool post_imm(message &msg, std::uint32_t imm);

  /**
   * Sends msg, a message allocated on this socket, and takes it (ibmsg_post_send()): on success
   * msg is left empty, the wrapper keeps the message while it is in flight, and done runs once
   * from the loop, when the peer has it (IBMSG_OK) or it failed (IBMSG_ECANCELED: the connection
   * closed first; IBMSG_EDECLINED: the receiver declined it; ...), instead of any message_sent
   * handler. done is any callable taking (ibmsg::socket &, ibmsg::message, int status), which
   * gets the message back (to post it again, or let it die), or (int status) alone, or nullptr
   * (none); it may be move-only, and is destroyed right after it ran. If the socket's wrapper
   * dies first, done is destroyed without running and the message freed, as for every handler
   * of the socket. Returns false, leaving msg as it was and destroying done without running it,
   * when the send queue is full (IBMSG_EAGAIN); throws ibmsg::error likewise for what the library
   * refuses (IBMSG_ENOTCONN, IBMSG_EMSGSIZE, IBMSG_EINVAL for an empty message, ...).
   */
  template <class F = std::nullptr_t>
  [[nodiscard]] bool send(message &msg, F &&done = nullptr);
  /** send() of a new message holding a copy of data: alloc() then send(). Returns false if
   *  either would block (no message is left behind). */
  template <class F = std::nullptr_t>
  [[nodiscard]] bool send(const_bytes data, F &&done = nullptr);
  /** send() of a new message holding a copy of text's characters (no terminator). */
  template <class F = std::nullptr_t>
  [[nodiscard]] bool send(std::string_view text, F &&done = nullptr) {
    return send(as_bytes(text), std::forward<F>(done));
  }
  /** send() with a 32-bit immediate (ibmsg_post_send_imm()): see post_imm(). */
  template <class F = std::nullptr_t>
  [[nodiscard]] bool send_imm(message &msg, std::uint32_t imm, F &&done = nullptr);

  /**
   * The connection's counters (ibmsg_socket_stats()): messages and bytes sent and received,
   * credit stalls, keepalives, requests timed out, ... Throws ibmsg::error: IBMSG_ESTATE for a
   * listener, IBMSG_EINVAL for an empty socket or one that has closed (inside its closed
   * handler it still answers).
   */
  ibmsg_stats stats() const {
    ibmsg_stats st{};
    detail::check(ibmsg_socket_stats(s_, &st, sizeof st));
    return st;
  }

  /** True from a successful listen(), connect() or accept() until the closed callback. */
  bool is_open() const noexcept { return open_; }
  /** The socket's status (IBMSG_UNCONNECTED for an empty socket). */
  ibmsg_socket_status status() const noexcept { return s_ ? s_->status : IBMSG_UNCONNECTED; }
  /** IBMSG_OK until closed, then the reason it closed. */
  int close_reason() const noexcept { return s_ ? s_->close_reason : IBMSG_OK; }
  /** The peer's text when close_reason() is IBMSG_EREJECTED ("" otherwise). */
  const char *reject_reason() const noexcept { return s_ ? s_->reject_reason : ""; }

  /** The local address, numeric. Throws ibmsg::error. */
  std::string local_address() const {
    char buf[128];
    detail::check(ibmsg_socket_local_address(s_, buf, sizeof buf, nullptr));
    return buf;
  }
  /** The local port; for a listener on port 0, the port picked. Throws ibmsg::error. */
  unsigned short local_port() const {
    unsigned short port = 0;
    detail::check(ibmsg_socket_local_address(s_, nullptr, 0, &port));
    return port;
  }
  /** The peer's address, numeric. Throws ibmsg::error. */
  std::string peer_address() const {
    char buf[128];
    detail::check(ibmsg_socket_peer_address(s_, buf, sizeof buf, nullptr));
    return buf;
  }
  /** The peer's port. Throws ibmsg::error. */
  unsigned short peer_port() const {
    unsigned short port = 0;
    detail::check(ibmsg_socket_peer_address(s_, nullptr, 0, &port));
    return port;
  }
  /** The RDMA device's name ("rxe0"), or nullptr if none yet. */
  const char *device() const noexcept { return ibmsg_socket_device(s_); }
  /** The largest message this connection can send (0 if not connected). */
  std::size_t max_msg_size() const noexcept { return ibmsg_socket_max_msg_size(s_); }
  /**
   * What the connection costs now, in bytes of registered memory (ibmsg_socket_memory()): its
   * eager buffers, and the large buffers its rendezvous messages hold. Throws ibmsg::error
   * (IBMSG_ESTATE for a listener; IBMSG_EINVAL for a closed or an empty socket).
   */
  ibmsg_memory memory() const {
    ibmsg_memory m{};
    detail::check(ibmsg_socket_memory_info(s_, &m, sizeof m));  // (ibmsg 1.7)
    return m;
  }

  /**
   * Writes length bytes of local, from local_offset, into the peer's memory that remote
   * describes, at remote_offset (ibmsg_rdma_write()); done runs once it is there. Returns
   * false if the send queue is full; throws ibmsg::error (see the class comment).
   */
  [[nodiscard]] bool rdma_write(region &local, std::size_t local_offset, std::size_t length,
                                const descriptor &remote, std::size_t remote_offset,
                                op_handler done);
  /**
   * Reads length bytes at remote_offset of what remote describes into local at local_offset
   * (ibmsg_rdma_read(); local needs IBMSG_ACCESS_LOCAL_WRITE); the bytes are there when done
   * runs with IBMSG_OK. Returns false if the send queue is full; throws ibmsg::error.
   */
  [[nodiscard]] bool rdma_read(region &local, std::size_t local_offset, std::size_t length,
                               const descriptor &remote, std::size_t remote_offset,
                               op_handler done);
  /**
   * rdma_write() that the peer's loop reports to its write_received handler with imm, once the
   * bytes are visible there (ibmsg_rdma_write_imm()); it spends one of the peer's receive
   * credits like a message. Returns false if the send queue is full; throws ibmsg::error.
   */
  [[nodiscard]] bool rdma_write_imm(region &local, std::size_t local_offset, std::size_t length,
                                    const descriptor &remote, std::size_t remote_offset,
                                    std::uint32_t imm, op_handler done);
  /**
   * Atomically replaces the 8-byte word at remote_offset of what remote describes (8-byte
   * aligned in the peer's memory) with swap if it equals compare (ibmsg_atomic_cas()). The
   * word's previous value lands in 8 bytes of local at local_offset (local needs
   * IBMSG_ACCESS_LOCAL_WRITE) and is passed to done. Returns false if the send queue is full;
   * throws ibmsg::error (IBMSG_EINVAL for an unaligned word).
   */
  [[nodiscard]] bool atomic_cas(region &local, std::size_t local_offset, const descriptor &remote,
                                std::size_t remote_offset, std::uint64_t compare,
                                std::uint64_t swap, atomic_handler done);
  /**
   * Atomically adds add to the 8-byte word at remote_offset of what remote describes
   * (ibmsg_atomic_fadd()); its previous value lands in local at local_offset and is passed to
   * done, as with atomic_cas(). Returns false if the send queue is full; throws ibmsg::error.
   */
  [[nodiscard]] bool atomic_fadd(region &local, std::size_t local_offset, const descriptor &remote,
                                 std::size_t remote_offset, std::uint64_t add,
                                 atomic_handler done);

  /**
   * Sends msg, a message allocated on this socket, as a request (ibmsg_post_request()); done
   * runs once with the reply, or with IBMSG_ETIMEDOUT if none came within timeout (a
   * std::chrono duration, or an int of milliseconds), or with the reason the connection closed.
   * msg gets its message_sent callback as with post(), independently of done. Returns false if
   * the send queue is full; throws ibmsg::error (see the class comment; IBMSG_EINVAL for a
   * timeout of 0 or less).
   */
  [[nodiscard]] bool request(message &msg, time_limit timeout, reply_handler done);
  /** request() whose handler may retry it: see retry_handler and unanswered_request. */
  [[nodiscard]] bool request(message &msg, time_limit timeout, retry_handler done);
  /** request() without a handler: the reply, if any, is freed unread. */
  [[nodiscard]] bool request(message &msg, time_limit timeout, std::nullptr_t) {
    return request(msg, timeout, reply_handler());
  }
  /**
   * Answers request, a received message of this socket with is_request() that the application
   * still holds, with reply, a message allocated on this socket (ibmsg_post_reply()); reply
   * gets its message_sent callback as with message::post(). The request may be dropped after
   * (before, it is never answered: a request freed unanswered gets no reply, nor do its
   * retries). Returns false if the send queue is full (IBMSG_EAGAIN: nothing was sent, the
   * request is still unanswered). Throws ibmsg::error: IBMSG_EINVAL if request is not a request
   * (a plain message, a send message, an empty one), IBMSG_EALREADY if it was answered already,
   * IBMSG_EMSGSIZE above the maximum, IBMSG_ENOTCONN if the connection closed (the library
   * keeps the reply's bytes for a retry over a new connection; reply stays the application's),
   * ... (see ibmsg_post_reply()).
   */
  [[nodiscard]] bool reply(message &request, message &reply);

  /** The C socket, or nullptr for an empty socket. Stays the same across moves. */
  ibmsg_socket *handle() const noexcept { return s_; }
  /** True if the socket holds a C socket. */
  explicit operator bool() const noexcept { return s_ != nullptr; }

 private:
  friend class loop;
  friend class connection_request;

  /* The wrapper of a C socket, or nullptr for a foreign or orphaned one. */
  static socket *from(ibmsg_socket *s) noexcept {
    if (!s || !s->user_data || s->user_data == detail::orphan) return nullptr;
    return static_cast<socket *>(s->user_data);
  }
  /* Before the C call that initializes the struct: an open struct must not be reinitialized. */
  ibmsg_socket *prepare() {
    if (open_) throw error(IBMSG_ESTATE);
    if (!s_) s_ = new ibmsg_socket();
    return s_;
  }
  /* After that call succeeded (no callback can have run in between), or just before an accept
   * (undo_open with its result). */
  void opened() noexcept {
    s_->user_data = this;
    open_ = true;
  }
  void undo_open(int rc) {
    if (rc == IBMSG_OK) return;
    open_ = false;
    detail::check(rc);
  }
  void reset() noexcept;
  /* Posts one operation through call(op, local C region); see the class comment. */
  template <class Call>
  bool post_op(region &local, std::size_t local_offset, op_handler done,
               atomic_handler atomic_done, Call &&call);
  /* The done callback of every operation posted through the wrapper. */
  static void on_op_done(ibmsg_socket *s, ibmsg_op *op, int status) noexcept;
  /* Posts a request whose box holds the handler; see request(). */
  bool post_request(message &msg, int timeout_ms, std::unique_ptr<detail::request_box> box);
  /* Posts msg from box, which takes it and holds the handler; see send(). */
  bool post_box(message &msg, const std::uint32_t *imm, std::unique_ptr<detail::send_box> box);
  /* The handlers of the socket's own, made on first use. */
  detail::socket_handlers &handlers();
  /* The done callback of every request posted or retried through the wrapper. */
  static void on_reply(ibmsg_socket *s, ibmsg_request *req, ibmsg_buffer *reply,
                       int status) noexcept;

  ibmsg_socket *s_ = nullptr;
  bool open_ = false;
  // Shared with a callback that runs one of them, so that the handler may destroy the socket.
  std::shared_ptr<detail::socket_handlers> h_;
};

/* ---------------------------------------------------------------------------------------------
 * Message
 * ------------------------------------------------------------------------------------------ */

/**
 * One message: a send buffer from a socket's pool (alloc()), a send message of a region's bytes
 * (from_region()), or a received message handed to the message_received callback. Owns it: the
 * destructor calls ibmsg_free_msg() (a received message's buffer goes back to the peer as a
 * credit; the bytes of a message in a region stay as they are). A send message that is queued or
 * in flight when it dies is freed by the loop after its message_sent callback, which the
 * application then does not get.
 *
 * While a message is posted the library owns the buffer: do not change data() or size() until
 * its message_sent callback, which gets this object (or the one it was moved to). For a message
 * of a region, that goes for the region's bytes too.
 */
class message {
 public:
  /** An empty message (handle() is nullptr). */
  message() noexcept = default;
  /** Frees the message (see the class comment). */
  ~message() { reset(); }

  /** Takes over other's message; other becomes empty. Allowed while posted. */
  message(message &&other) noexcept
      : b_(std::exchange(other.b_, nullptr)),
        loop_(std::exchange(other.loop_, nullptr)),
        received_(std::exchange(other.received_, false)) {
    if (b_ && !received_) b_->user_data = this;
  }
  /** Frees this message as the destructor does, then takes over other's. */
  message &operator=(message &&other) noexcept {
    if (this != &other) {
      reset();
      b_ = std::exchange(other.b_, nullptr);
      loop_ = std::exchange(other.loop_, nullptr);
      received_ = std::exchange(other.received_, false);
      if (b_ && !received_) b_->user_data = this;
    }
    return *this;
  }
  /** Not copyable: one wrapper owns each message. */
  message(const message &) = delete;
  /** Not copyable. */
  message &operator=(const message &) = delete;

  /**
   * Takes a send buffer of s's pool with room for the larger of size and the connection's eager
   * size (IBMSG_OPT_EAGER_SIZE; above it, a large buffer of its own), size() = size
   * (ibmsg_alloc_msg()); a message held before is freed first. Returns false, changing nothing,
   * when all IBMSG_OPT_SEND_DEPTH buffers are in use (IBMSG_EAGAIN: retry after a message_sent
   * callback). Throws ibmsg::error otherwise: IBMSG_EMSGSIZE if size is larger than the
   * maximum (s.max_msg_size()), IBMSG_ENOTCONN if s has no buffers (not connected), ...
   */
  [[nodiscard]] bool alloc(socket &s, std::size_t size);
  /** alloc() of data.size() bytes, then a copy of data into them. */
  [[nodiscard]] bool alloc(socket &s, const_bytes data) {
    if (!alloc(s, data.size())) return false;
    if (!data.empty()) std::memcpy(b_->data, data.data(), data.size());
    return true;
  }
  /** alloc() of text.size() bytes, then a copy of text's characters (no terminator). */
  [[nodiscard]] bool alloc(socket &s, std::string_view text) { return alloc(s, as_bytes(text)); }

  /**
   * Makes this a send message of the size bytes at offset in r, a region of s's loop, sent from
   * there without a copy (ibmsg_msg_from_region()): data() points at them, size() = size; a
   * message held before is freed first. It takes one of s's IBMSG_OPT_SEND_DEPTH send buffers
   * like alloc(). Do not change the bytes from post() until the message_sent callback. The
   * region stays busy until this message is freed (region::deregister() throws IBMSG_EBUSY
   * until then; see region::~region()). Returns false, changing nothing, when all send buffers
   * are in use (IBMSG_EAGAIN). Throws ibmsg::error otherwise: IBMSG_ERANGE if the bytes reach
   * beyond the region, IBMSG_ESTATE for a listener (IBMSG_EINVAL before ibmsg 1.7),
   * IBMSG_EINVAL for an empty region, IBMSG_EMSGSIZE, IBMSG_ENOTCONN, ...
   */
  [[nodiscard]] bool from_region(socket &s, region &r, std::size_t offset, std::size_t size);

  /**
   * Sends size() bytes of data() on s (ibmsg_post_send()): socket::post(), which is where the
   * other posting calls are (send(), request(), reply()); kept here for the programs that call
   * it so. On success the library owns the message until its message_sent callback. Returns
   * false when the send queue is full (IBMSG_EAGAIN: nothing was sent, retry after a
   * message_sent callback). Throws ibmsg::error otherwise (IBMSG_ENOTCONN, IBMSG_EMSGSIZE, ...).
   */
  [[nodiscard]] bool post(socket &s) {
    int rc = ibmsg_post_send(s.handle(), b_);
    if (rc == IBMSG_EAGAIN) return false;
    detail::check(rc);
    return true;
  }

  /**
   * post() with a 32-bit immediate, which the receiver finds in imm() (with has_imm() true)
   * (ibmsg_post_send_imm(); socket::post_imm()). Returns false when the send queue is full; throws ibmsg::error as
   * post() does, and IBMSG_EOPNOTSUPP if the peer's ibmsg takes no immediates on messages.
   */
  [[nodiscard]] bool post_imm(socket &s, std::uint32_t imm) {
    int rc = ibmsg_post_send_imm(s.handle(), b_, imm);
    if (rc == IBMSG_EAGAIN) return false;
    detail::check(rc);
    return true;
  }

  /**
   * Frees the message now (ibmsg_free_msg()) and leaves this object empty. Throws ibmsg::error:
   * IBMSG_EBUSY if it is queued or in flight, IBMSG_EINVAL if the message is empty.
   */
  void free();

  /**
   * Gives the message up without freeing it and returns it (nullptr if empty); this object
   * becomes empty. The caller must call ibmsg_free_msg() on it, and for a send message (not
   * received()) `delete` the struct afterwards. A released message that is posted gets no
   * message_sent callback through this wrapper.
   */
  ibmsg_buffer *release() noexcept {
    ibmsg_buffer *b = std::exchange(b_, nullptr);
    if (b) b->user_data = nullptr;
    loop_ = nullptr;
    received_ = false;
    return b;
  }

  /** The payload (nullptr for an empty message). Its room: see alloc() and from_region(). */
  void *data() noexcept { return b_ ? b_->data : nullptr; }
  /** The payload (nullptr for an empty message). */
  const void *data() const noexcept { return b_ ? b_->data : nullptr; }
  /** The payload as bytes of type T: char, signed char, unsigned char or std::byte (nullptr for
   *  an empty message). Other types: copy them out with std::memcpy (alignment). */
  template <class T>
  T *data() noexcept {
    static_assert(detail::is_byte_v<T>, "data<T>(): T is a byte type (char, unsigned char, std::byte)");
    return static_cast<T *>(data());
  }
  /** The payload as bytes of type T (see data<T>()). */
  template <class T>
  const T *data() const noexcept {
    static_assert(detail::is_byte_v<T>, "data<T>(): T is a byte type (char, unsigned char, std::byte)");
    return static_cast<const T *>(data());
  }
  /** The payload's size() bytes, to write (empty for an empty message). */
  mutable_bytes bytes() noexcept {
    return b_ ? mutable_bytes(static_cast<std::byte *>(b_->data), b_->size) : mutable_bytes();
  }
  /** The payload's size() bytes (empty for an empty message). */
  const_bytes bytes() const noexcept {
    return b_ ? const_bytes(static_cast<const std::byte *>(b_->data), b_->size) : const_bytes();
  }
  /** Bytes to send, or bytes received (0 for an empty message). */
  std::size_t size() const noexcept { return b_ ? b_->size : 0; }
  /** Sets the number of bytes to send: within the room of alloc(), or up to the region's end
   *  for from_region() (post() throws otherwise: IBMSG_EMSGSIZE, IBMSG_ERANGE). */
  void set_size(std::size_t size) noexcept {
    if (b_) b_->size = size;
  }
  /** The payload as characters. */
  std::string_view to_string_view() const noexcept {
    return b_ ? std::string_view(static_cast<const char *>(b_->data), b_->size)
              : std::string_view();
  }
  /** The message's status (IBMSG_FREED for an empty message). */
  ibmsg_buffer_status status() const noexcept { return b_ ? b_->status : IBMSG_FREED; }
  /** True for a message from the message_received callback. */
  bool received() const noexcept { return received_; }
  /** True for a received message that the sender posted with an immediate (post_imm()). */
  bool has_imm() const noexcept { return b_ && received_ && (b_->flags & IBMSG_MSG_IMM) != 0; }
  /** A received message's immediate (0 unless has_imm()). */
  std::uint32_t imm() const noexcept { return has_imm() ? b_->imm : 0; }
  /** A received message's IBMSG_MSG_* flags (0 for a send message): IBMSG_MSG_IMM,
   *  IBMSG_MSG_REGION when its data() lies in a region (incoming::to_region()), and
   *  IBMSG_MSG_REQUEST for a request. */
  std::uint32_t flags() const noexcept { return b_ && received_ ? b_->flags : 0; }
  /** True for a received message that the sender posted as a request (socket::request()):
   *  answer it with socket::reply() before dropping it. */
  bool is_request() const noexcept {
    return b_ && received_ && (b_->flags & IBMSG_MSG_REQUEST) != 0;
  }

  /** The C message, or nullptr for an empty one. Stays the same across moves. */
  ibmsg_buffer *handle() const noexcept { return b_; }
  /** True if the message holds a buffer. */
  explicit operator bool() const noexcept { return b_ != nullptr; }

 private:
  friend class loop;
  friend class socket;
  friend struct detail::send_box;

  /* A received message (or a reply), owned from now on (the library owns the struct itself). */
  static message adopt_received(ibmsg_buffer *b, ibmsg_event_loop *l) noexcept {
    message m;
    m.b_ = b;
    m.loop_ = l;
    m.received_ = true;
    b->user_data = nullptr;  // a received message is found through no C callback
    return m;
  }
  /* The wrapper of a C message, or nullptr for a foreign, released or orphaned one. */
  static message *from(ibmsg_buffer *b) noexcept {
    if (!b || !b->user_data || b->user_data == detail::orphan) return nullptr;
    return static_cast<message *>(b->user_data);
  }
  /* Takes over b, which a C call just filled for s; see alloc(). */
  void adopt_sent(ibmsg_buffer *b, socket &s) noexcept;
  void reset() noexcept;

  ibmsg_buffer *b_ = nullptr;
  ibmsg_event_loop *loop_ = nullptr;  // the loop of the socket it came from or arrived on
  bool received_ = false;
  // Set only on the message a send_box keeps (socket::send()), never moved with it: tells
  // loop::on_sent that the message_sent callback is the box's.
  detail::send_box *box_ = nullptr;
};

/* ---------------------------------------------------------------------------------------------
 * Connection request
 * ------------------------------------------------------------------------------------------ */

/**
 * An incoming connection, as the loop's connection request callback gets it: a view of the C
 * request, valid only during that callback. Call accept() or reject(); a request left
 * undecided is rejected when the callback returns.
 */
class connection_request {
 public:
  /** Not copyable. */
  connection_request(const connection_request &) = delete;
  /** Not copyable. */
  connection_request &operator=(const connection_request &) = delete;
  /** Moves the view; it still refers to the same request. */
  connection_request(connection_request &&) noexcept = default;
  /** Moves the view; it still refers to the same request. */
  connection_request &operator=(connection_request &&) noexcept = default;
  /** Does nothing: the library owns the request. */
  ~connection_request() = default;

  /**
   * Accepts the connection into s, which becomes open (status IBMSG_ROUTE_RESOLVED, then
   * IBMSG_CONNECTED with the established callback). Throws ibmsg::error (IBMSG_ESTATE if s
   * is still open).
   */
  void accept(socket &s) {
    // Opened first: a spreading listener's connection belongs to another loop, whose thread may
    // call back for it before the C call returns here.
    ibmsg_socket *c = s.prepare();
    s.opened();
    s.undo_open(ibmsg_accept(r_, c));
  }
  /** accept() with an option set instead of the listener's options. */
  void accept(socket &s, const options &opts) {
    ibmsg_socket *c = s.prepare();
    s.opened();
    s.undo_open(ibmsg_accept_opts(r_, c, opts.checked()));
  }
  /**
   * Accepts the connection into s on another loop l (since 1.7; ibmsg_accept_on()): it lives
   * entirely on l from now on (l's callbacks, l's thread), and s belongs to l's thread, which may
   * call back for it at once: keep s where it is (allocate it on the heap, for example) and
   * reach, move or destroy it only from l's thread (l's callbacks, or loop::call() on l, which
   * runs after the accept there). A set-up that fails on l closes s there (l's closed callback).
   * With l the listener's own loop it is accept(). Throws ibmsg::error.
   */
  void accept_on(loop &l, socket &s);
  /** accept_on() with an option set instead of the listener's options. */
  void accept_on(loop &l, socket &s, const options &opts);
  /** Rejects the connection; the peer closes with IBMSG_EREJECTED and reason (at most 128
   *  bytes; nullptr for none) as its reject_reason. Throws ibmsg::error. */
  void reject(const char *reason = nullptr) { detail::check(ibmsg_reject(r_, reason)); }

  /** The peer's numeric address. */
  const char *peer_address() const noexcept { return r_->peer_address; }
  /** The peer's port. */
  unsigned short peer_port() const noexcept { return r_->peer_port; }
  /** IBMSG_UNDECIDED, IBMSG_ACCEPTED or IBMSG_REJECTED. */
  ibmsg_request_status status() const noexcept { return r_->status; }
  /** The listening socket the request came to. */
  socket &listener() const noexcept { return *socket::from(r_->listener); }

  /** The C request. */
  ibmsg_connection_request *handle() const noexcept { return r_; }

 private:
  friend class loop;
  explicit connection_request(ibmsg_connection_request *r) noexcept : r_(r) {}

  ibmsg_connection_request *r_;
};

/* ---------------------------------------------------------------------------------------------
 * Memory region
 * ------------------------------------------------------------------------------------------ */

/**
 * Memory registered on a loop for one-sided RDMA (ibmsg_region): the local memory of the
 * socket's operations, and the memory descriptor() lets a peer reach. Move-only; the C region is
 * on the heap, so moving the wrapper is allowed at any time, also while operations use it.
 *
 * Destruction: the destructor deregisters the region (ibmsg_deregister_region()), which revokes
 * every descriptor of it and frees the memory of an allocated region. It never throws. While
 * the region is busy, the library refuses that (IBMSG_EBUSY): while operations posted through
 * the wrapper with this region as local memory are queued or in flight (pending() > 0), and
 * while a message of its bytes exists (message::from_region(), or a message that
 * incoming::to_region() put there, from that call until the received message is freed). The
 * destructor then leaves the region registered and the loop deregisters it (and frees allocated
 * memory) as soon as it is no longer busy: right after the last of those operations completes,
 * before its handler runs (they do complete, at the latest as canceled when their connection
 * closes), after the last of those messages is freed, or when the connection closes that would
 * have received a message into it (deferred deregistration: the loop wrapper keeps such regions
 * in a list, and looks at it after each message freed, operation done and socket closed). Until
 * then loop::drain() waits for it like for a closing socket (the loop's destructor does not
 * wait: see loop::~loop()). For memory the application registered (the pointer constructor), this means:
 * the memory must stay valid until then, because a read, an atomic or an incoming message may
 * still write into it, and a posted message is read from it. To be sure, call deregister()
 * instead, which throws IBMSG_EBUSY and changes nothing while the region is busy, and destroy
 * the memory only after it succeeded. Operations and messages made with the C API on handle()
 * (and messages given up with message::release()) are not watched: with such a use pending,
 * deregister() yourself.
 *
 * The region must die before its loop (ibmsg_destroy_event_loop() fails while a region is
 * registered). The C region's user_data is the application's; the wrapper does not use it.
 */
class region {
 public:
  /** An empty region (handle() is nullptr). */
  region() noexcept = default;
  /**
   * Registers length bytes at addr, which the application owns and keeps valid until the
   * region is deregistered, on loop l with the IBMSG_ACCESS_* rights in rights
   * (ibmsg_register_region()). Throws ibmsg::error: IBMSG_EINVAL for nullptr, length 0 or
   * unknown flags; IBMSG_ENOMEM, or IBMSG_ESYS if a device the loop has open refuses the memory
   * (for example read-only pages with a write right).
   */
  region(loop &l, void *addr, std::size_t length, unsigned rights);
  /**
   * Allocates length bytes (page-aligned, zeroed) and registers them on loop l with the
   * IBMSG_ACCESS_* rights in rights (ibmsg_alloc_region()); deregistering frees them. Throws
   * ibmsg::error (IBMSG_ENOMEM, IBMSG_EINVAL, ...).
   */
  region(loop &l, std::size_t length, unsigned rights);
  /** Deregisters the region, now or after its pending operations (see the class comment). */
  ~region() { reset(); }

  /** Takes over other's region; other becomes empty. Allowed while operations use it. */
  region(region &&other) noexcept : b_(std::exchange(other.b_, nullptr)) {}
  /** Deregisters this region as the destructor does, then takes over other's. */
  region &operator=(region &&other) noexcept {
    if (this != &other) {
      reset();
      b_ = std::exchange(other.b_, nullptr);
    }
    return *this;
  }
  /** Not copyable: one wrapper owns each region. */
  region(const region &) = delete;
  /** Not copyable. */
  region &operator=(const region &) = delete;

  /**
   * Deregisters the region now (ibmsg_deregister_region()) and leaves this object empty; every
   * descriptor of it stops working. Throws ibmsg::error, changing nothing: IBMSG_EBUSY while one
   * of this side's operations uses it as local memory, IBMSG_EINVAL if the region is empty.
   */
  void deregister() {
    detail::check(ibmsg_deregister_region(b_ ? &b_->c : nullptr));
    delete std::exchange(b_, nullptr);
  }

  /**
   * A descriptor granting the peer of s the rights in rights (IBMSG_ACCESS_REMOTE_*, a subset
   * of the region's) on exactly the bytes [offset, offset + length) of this region
   * (ibmsg_region_descriptor()); send its bytes() to the peer. Asking again for the same range
   * and rights gives the same descriptor without registering anything; registering costs a
   * system call, so make descriptors at set-up. Throws ibmsg::error: IBMSG_ERANGE outside the
   * region, IBMSG_EACCES for rights the region lacks, IBMSG_EINVAL for length 0 or rights that
   * are not remote ones, IBMSG_ENOTCONN if s has no device yet.
   */
  ibmsg::descriptor descriptor(socket &s, std::size_t offset, std::size_t length,
                               unsigned rights) {
    ibmsg_descriptor d{};
    detail::check(ibmsg_region_descriptor(handle(), s.handle(), offset, length, rights, &d));
    return ibmsg::descriptor(d);
  }
  /**
   * Revokes d, a descriptor of this region (ibmsg_revoke_descriptor()): the peer's next
   * operation on it fails with a remote access error, which closes that connection; operations
   * already executing may complete. Throws ibmsg::error (IBMSG_EBADDESC if d is not a
   * descriptor of this region that is still granted).
   */
  void revoke(const ibmsg::descriptor &d) {
    detail::check(ibmsg_revoke_descriptor(handle(), &d.handle()));
  }

  /** The first byte (nullptr for an empty region). */
  void *data() noexcept { return b_ ? b_->c.addr : nullptr; }
  /** The first byte (nullptr for an empty region). */
  const void *data() const noexcept { return b_ ? b_->c.addr : nullptr; }
  /** The length in bytes (0 for an empty region). */
  std::size_t size() const noexcept { return b_ ? b_->c.length : 0; }
  /** The IBMSG_ACCESS_* rights, including IBMSG_ACCESS_LOCAL_WRITE implied by a remote write
   *  or atomic right (0 for an empty region). */
  unsigned access() const noexcept { return b_ ? b_->c.access : 0; }
  /** Operations posted through the wrapper with this region as local memory whose handler has
   *  not run yet (messages of the region are not counted). */
  std::size_t pending() const noexcept { return b_ ? b_->ops : 0; }

  /** The C region, or nullptr for an empty one. Stays the same across moves. */
  ibmsg_region *handle() const noexcept { return b_ ? &b_->c : nullptr; }
  /** True if the region holds a registration. */
  explicit operator bool() const noexcept { return b_ != nullptr; }

 private:
  friend class socket;
  friend class loop;

  void reset() noexcept;
  /* After an operation on b completed: an orphaned region is deregistered after its last. */
  static void op_done(detail::region_box *b) noexcept;

  detail::region_box *b_ = nullptr;
};

/* ---------------------------------------------------------------------------------------------
 * Incoming large message
 * ------------------------------------------------------------------------------------------ */

/**
 * A message larger than the connection's eager size that starts to arrive, as the loop's
 * message_incoming callback gets it, before any of its data moves: a view of the C
 * ibmsg_incoming, valid only during that callback. It can be neither copied nor moved, so that
 * it does not outlive the callback by accident. The callback decides where the data goes:
 *   - nothing: the library reads it into a buffer of its own (as without the callback);
 *   - to_region(): into a region of the application, where message_received finds it;
 *   - decline(): the message is not received; the sender's message_sent gets IBMSG_EDECLINED
 *     and the connection goes on.
 * A message is decided once. If the callback throws (see the comment at the top of this file),
 * what it decided before the exception stands; undecided, the message goes to a library buffer.
 */
class incoming {
 public:
  /** Not copyable. */
  incoming(const incoming &) = delete;
  /** Not copyable. */
  incoming &operator=(const incoming &) = delete;
  /** Not movable: valid only in the callback. */
  incoming(incoming &&) = delete;
  /** Not movable. */
  incoming &operator=(incoming &&) = delete;
  /** Does nothing: the library owns the C struct. */
  ~incoming() = default;

  /** The message's size in bytes. */
  std::size_t size() const noexcept { return in_->size; }
  /** Its IBMSG_MSG_* flags: IBMSG_MSG_IMM, IBMSG_MSG_REQUEST or 0. */
  std::uint32_t flags() const noexcept { return in_->flags; }
  /** True if the sender posted it with an immediate (message::post_imm()). */
  bool has_imm() const noexcept { return (in_->flags & IBMSG_MSG_IMM) != 0; }
  /** Its immediate (0 unless has_imm()). */
  std::uint32_t imm() const noexcept { return has_imm() ? in_->imm : 0; }
  /** True if it is a request (socket::request() of the peer; since 1.5). */
  bool is_request() const noexcept { return (in_->flags & IBMSG_MSG_REQUEST) != 0; }
  /** True if it is the reply to a request of this side (socket::request(); since 1.5): declined,
   *  the request's callback gets IBMSG_EDECLINED. */
  bool is_reply() const noexcept { return in_->request != nullptr; }

  /**
   * Puts the message's size() bytes at offset in r, a region of the connection's loop with
   * IBMSG_ACCESS_LOCAL_WRITE (ibmsg_incoming_to_region()). The message_received callback that
   * follows, in order with the connection's other messages, gets a message whose data() is
   * there and whose flags() have IBMSG_MSG_REGION; do not use those bytes before. The region is
   * busy until that message is freed (or the connection closes first: then the message is
   * dropped, and the bytes may be written in part).
   *
   * Returns false, deciding nothing and writing nothing, if the message does not fit
   * (IBMSG_ERANGE: offset + size() reaches beyond the region): the callback may choose another
   * place, decline(), or return (a library buffer). Throws ibmsg::error otherwise: IBMSG_EACCES
   * without IBMSG_ACCESS_LOCAL_WRITE, IBMSG_EINVAL for an empty region or one of another loop,
   * IBMSG_ESTATE if the message was decided already, IBMSG_ENOMEM or IBMSG_ESYS if the region
   * cannot be registered on the connection's device.
   */
  [[nodiscard]] bool to_region(region &r, std::size_t offset) {
    int rc = ibmsg_incoming_to_region(in_, r.handle(), offset);
    if (rc == IBMSG_ERANGE) return false;
    detail::check(rc);
    return true;
  }
  /**
   * Declines the message (ibmsg_incoming_decline()): none of it is read, no message_received
   * follows, the sender's message_sent callback gets IBMSG_EDECLINED, and the connection goes
   * on. Throws ibmsg::error (IBMSG_ESTATE if the message was decided already).
   */
  void decline() { detail::check(ibmsg_incoming_decline(in_)); }

  /** The C struct, valid only during the callback. */
  ibmsg_incoming *handle() const noexcept { return in_; }

 private:
  friend class loop;
  explicit incoming(ibmsg_incoming *in) noexcept : in_(in) {}

  ibmsg_incoming *in_;
};

/* ---------------------------------------------------------------------------------------------
 * Unanswered request
 * ------------------------------------------------------------------------------------------ */

/**
 * A request that got no reply, as a socket::retry_handler gets it after IBMSG_ETIMEDOUT or the
 * reason its connection closed: owns the request's storage (its ibmsg_request and the handler)
 * while the library does not hold it. Move-only. retry() sends the request again with the same
 * identity (ibmsg_retry_request()) and hands it back to the library: the same handler then runs
 * once more, with the reply or the next failure, and gets the request back in a new
 * unanswered_request if it fails again. Dropping it gives the request up (nothing is sent; the
 * responder forgets it after IBMSG_OPT_REQUEST_WINDOW).
 *
 * An empty one (default-constructed, moved from, retried, or the one a handler gets with
 * IBMSG_OK) holds nothing: retry() throws ibmsg::error (IBMSG_EINVAL).
 */
class unanswered_request {
 public:
  /** An empty one (holds no request). */
  unanswered_request() noexcept = default;
  /** Gives the request up (frees its storage and the handler). */
  ~unanswered_request() { reset(); }

  /** Takes over other's request; other becomes empty. */
  unanswered_request(unanswered_request &&other) noexcept
      : b_(std::exchange(other.b_, nullptr)) {}
  /** Gives up this request as the destructor does, then takes over other's. */
  unanswered_request &operator=(unanswered_request &&other) noexcept {
    if (this != &other) {
      reset();
      b_ = std::exchange(other.b_, nullptr);
    }
    return *this;
  }
  /** Not copyable: a request is sent again at most once at a time. */
  unanswered_request(const unanswered_request &) = delete;
  /** Not copyable. */
  unanswered_request &operator=(const unanswered_request &) = delete;

  /**
   * Sends the request again with msg, a message allocated on s that is not posted (a new one,
   * or the first one after its message_sent callback), with the same identity
   * (ibmsg_retry_request()); s may be the socket it was sent on or, after that closed, a new
   * connection of the same loop to the same responder. The responder runs a request at most
   * once: a retry of one it answered gets the kept reply. On success this object becomes empty
   * and the handler runs once more from the loop, on s. Returns false if the send queue is full
   * (IBMSG_EAGAIN: nothing was sent, this object keeps the request). Throws ibmsg::error, keeping
   * the request (nothing was sent, no handler runs): IBMSG_EINVAL for an empty one or a timeout
   * of 0 or less, IBMSG_ETIMEDOUT if it was first sent longer ago than IBMSG_OPT_REQUEST_WINDOW
   * (the responder may have forgotten it: send it anew with socket::request()), IBMSG_ENOTCONN,
   * and the other codes of socket::request().
   */
  [[nodiscard]] bool retry(socket &s, message &msg, time_limit timeout);

  /** The request's identity, unique within its loop; the same for every retry (0 if empty). */
  std::uint64_t id() const noexcept;
  /** How many times it was retried so far (0 if empty). */
  int retries() const noexcept;
  /** Why it failed last: IBMSG_ETIMEDOUT or a close reason (IBMSG_OK if empty). */
  int status() const noexcept;
  /** The C request, or nullptr if empty: to read; posting it through the C API is not allowed
   *  (retry() does that). */
  const ibmsg_request *handle() const noexcept;
  /** True if it holds a request. */
  explicit operator bool() const noexcept { return b_ != nullptr; }

 private:
  friend class socket;
  explicit unanswered_request(detail::request_box *b) noexcept : b_(b) {}
  void reset() noexcept;

  detail::request_box *b_ = nullptr;
};

/* ---------------------------------------------------------------------------------------------
 * Loop
 * ------------------------------------------------------------------------------------------ */

/**
 * An event loop: owns a heap-allocated ibmsg_event_loop and the callbacks, which are
 * std::function and run only inside dispatch() / process() / drain() (or the application's
 * ev_run() for a loop on the application's libev loop). A socket's own handlers
 * (socket::on_received(), ...) take its callbacks before the loop's.
 *
 * A callback may be replaced at any time, except from inside itself (that would destroy the
 * std::function while it runs).
 *
 * Teardown: the loop must outlive its sockets, messages and regions. Disconnect the sockets and
 * dispatch until their closed callbacks have run (or let the sockets die: they disconnect),
 * let the messages and regions die, call drain() for what is still closing, then let the loop
 * die or call close(). The destructor never waits (see ~loop()): what is still closing when it
 * runs makes it leak the C loop.
 */
class loop {
 public:
  /** Callback for each incoming connection on a listening socket; call accept() or reject(). */
  using connection_request_handler = std::function<void(connection_request &)>;
  /** Callback once per connection that reaches IBMSG_CONNECTED. */
  using connection_established_handler = std::function<void(socket &)>;
  /** Callback for each received message; the callback owns it (freed when it dies). */
  using message_received_handler = std::function<void(socket &, message)>;
  /** Callback exactly once per successful message::post(): status IBMSG_OK when the peer has it,
   *  otherwise why not (IBMSG_ECANCELED: the connection closed first). */
  using message_sent_handler = std::function<void(socket &, message &, int status)>;
  /** Callback exactly once when a socket has closed: reason IBMSG_OK after disconnect(),
   *  IBMSG_ECONNRESET when the peer disconnected, otherwise the error that closed it. The
   *  socket may be destroyed inside the callback. */
  using connection_closed_handler = std::function<void(socket &, int reason)>;
  /** Callback when the peer's socket::rdma_write_imm() completed here: its length bytes are
   *  written and visible in the local region it targeted, imm is its immediate. It runs in
   *  order with the messages of that connection. */
  using write_received_handler =
      std::function<void(socket &, std::uint32_t imm, std::size_t length)>;
  /** Callback when a message larger than the eager size starts to arrive, before its data
   *  moves: it may put the data into a region or decline the message (see ibmsg::incoming),
   *  which exists only during the callback. Messages up to the eager size never reach it. */
  using message_incoming_handler = std::function<void(socket &, incoming &)>;
  /** Callback for each log line (on_log()): the socket's wrapper or nullptr, the level, the
   *  text. */
  using log_handler = std::function<void(socket *, int level, std::string_view text)>;

  /** A loop with its own libev loop (ibmsg_init_event_loop()). Throws ibmsg::error. */
  loop() { init(nullptr); }

  /** A loop whose watchers run on the application's libev loop ev, which the application runs
   *  itself and keeps alive until this loop is gone (ibmsg_init_event_loop_ev()). Throws
   *  ibmsg::error (IBMSG_EINVAL if ev is nullptr). */
  explicit loop(struct ev_loop *ev) {
    if (!ev) throw error(IBMSG_EINVAL);
    init(ev);
  }

  /**
   * Destroys the C loop (ibmsg_destroy_event_loop()). Never throws, and never waits. The
   * callbacks are dropped first, so that none runs from here. Then, with the loop's own libev
   * loop, what is ready at once is processed without waiting (ibmsg_event_loop_process()):
   * calls posted with call() that have not run yet run here, and events that have arrived
   * finish what they can. If anything is still open, allocated or registered after that
   * (sockets, messages or regions whose wrappers died and that are still closing or busy, or
   * ones the application still holds), the C loop is leaked on purpose rather than freed under
   * the library's feet: its memory, registrations and file descriptors stay until the process
   * ends, leaked_loops() counts it, and one line on stderr says so. To have nothing leaked,
   * call drain() before the loop dies (or close(), which says IBMSG_EBUSY).
   */
  ~loop() { reset(); }

  /** Takes over other's C loop and callbacks; other becomes empty. */
  loop(loop &&other) noexcept
      : l_(std::exchange(other.l_, nullptr)),
        own_ev_(other.own_ev_),
        closing_(std::exchange(other.closing_, 0)),
        pending_(std::exchange(other.pending_, nullptr)),
        request_cb_(std::move(other.request_cb_)),
        established_cb_(std::move(other.established_cb_)),
        received_cb_(std::move(other.received_cb_)),
        sent_cb_(std::move(other.sent_cb_)),
        closed_cb_(std::move(other.closed_cb_)),
        write_cb_(std::move(other.write_cb_)),
        incoming_cb_(std::move(other.incoming_cb_)),
        log_cb_(std::move(other.log_cb_)),
        orphans_(std::exchange(other.orphans_, nullptr)) {
    if (l_) l_->user_data = this;
  }
  /** Destroys this loop as the destructor does, then takes over other's. */
  loop &operator=(loop &&other) noexcept {
    if (this != &other) {
      reset();
      l_ = std::exchange(other.l_, nullptr);
      own_ev_ = other.own_ev_;
      closing_ = std::exchange(other.closing_, 0);
      pending_ = std::exchange(other.pending_, nullptr);
      request_cb_ = std::move(other.request_cb_);
      established_cb_ = std::move(other.established_cb_);
      received_cb_ = std::move(other.received_cb_);
      sent_cb_ = std::move(other.sent_cb_);
      closed_cb_ = std::move(other.closed_cb_);
      write_cb_ = std::move(other.write_cb_);
      incoming_cb_ = std::move(other.incoming_cb_);
      log_cb_ = std::move(other.log_cb_);
      orphans_ = std::exchange(other.orphans_, nullptr);
      if (l_) l_->user_data = this;
    }
    return *this;
  }
  /** Not copyable: one wrapper owns each C loop. */
  loop(const loop &) = delete;
  /** Not copyable. */
  loop &operator=(const loop &) = delete;

  /**
   * Dispatches until nothing the wrapper holds for the loop is closing any more, or limit has
   * passed (a std::chrono duration, or an int of milliseconds; 5 s by default); returns true if
   * nothing is left. What it waits for: sockets whose wrappers died while open (until their
   * closed callbacks), messages that died while queued or in flight (until their message_sent),
   * messages given to socket::send() (until their handlers ran) and regions that died while
   * busy (until they are deregistered). It does not close the sockets the application still
   * holds: disconnect them first, or let them die. Callbacks run as in dispatch(), and what one
   * throws is rethrown. For a loop on the application's libev loop it only processes what is
   * ready, once, without waiting (the application's ev_run() does the rest). Throws
   * ibmsg::error (IBMSG_EINVAL for an empty loop).
   */
  bool drain(time_limit limit = std::chrono::seconds(5)) {
    if (!l_) throw error(IBMSG_EINVAL);
    release_regions();
    if (!own_ev_) {
      finish(ibmsg_event_loop_process(l_));
      release_regions();
      return closing_ == 0;
    }
    const auto deadline = std::chrono::steady_clock::now() + limit.duration();
    while (closing_ > 0) {
      const auto left = deadline - std::chrono::steady_clock::now();
      if (left <= decltype(left)::zero()) break;
      finish(ibmsg_dispatch_event_loop_timeout(
          l_, time_limit(std::min<std::chrono::steady_clock::duration>(left, std::chrono::milliseconds(50))).ms()));
      release_regions();
    }
    return closing_ == 0;
  }

  /** How many C loops the destructors of ibmsg::loop in this process have leaked because
   *  something was still open or closing (see ~loop()). */
  static unsigned leaked_loops() noexcept { return leaked_count().load(); }

  /**
   * Destroys the C loop now and leaves this object empty. Throws ibmsg::error, leaving the loop
   * as it was: IBMSG_EBUSY while a socket is open (or still closing), a message is allocated or
   * a region is registered (also one whose wrapper died while it was busy: see
   * region::~region()).
   */
  void close() {
    detail::check(ibmsg_destroy_event_loop(l_));
    delete std::exchange(l_, nullptr);
    drop_callbacks();
    drop_regions();
  }

  /** Sets the callback for incoming connections (none: every request is rejected). */
  void on_connection_request(connection_request_handler cb) { request_cb_ = std::move(cb); }
  /** Sets the callback for established connections. */
  void on_connection_established(connection_established_handler cb) {
    established_cb_ = std::move(cb);
  }
  /** Sets the callback for received messages (none: messages are freed unread). */
  void on_message_received(message_received_handler cb) { received_cb_ = std::move(cb); }
  /** Sets the callback for sent messages. */
  void on_message_sent(message_sent_handler cb) { sent_cb_ = std::move(cb); }
  /** Sets the callback for closed sockets. */
  void on_connection_closed(connection_closed_handler cb) { closed_cb_ = std::move(cb); }
  /** Sets the callback for the peers' writes with immediate (none: they are not reported). */
  void on_write_received(write_received_handler cb) { write_cb_ = std::move(cb); }
  /** Sets the callback for large messages that start to arrive (none: library buffers). */
  void on_message_incoming(message_incoming_handler cb) { incoming_cb_ = std::move(cb); }
  /** Sets the callback for the loop's log lines (ibmsg_event_loop.log; none: no lines, and the
   *  library does not make them). It gets the socket's wrapper, or nullptr for the loop's own
   *  lines and for a socket whose wrapper has died; level is an ibmsg_log_level
   *  (IBMSG_LOG_ERROR ... IBMSG_LOG_DEBUG); text is valid during the call only. It may run
   *  inside other calls of the wrapper than dispatch() (disconnect(), ...); what it throws is
   *  held and rethrown by the next dispatch() or process(). Lines go to stderr too when
   *  IBMSG_DEBUG is set in the environment (the library does that). */
  void on_log(log_handler cb) {
    log_cb_ = std::move(cb);
    if (l_) l_->log = log_cb_ ? on_log_line : nullptr;
  }

  /** Waits for at least one event and processes all that are ready, running callbacks
   *  (ibmsg_dispatch_event_loop()). Throws ibmsg::error, or what a callback threw. */
  void dispatch() { finish(ibmsg_dispatch_event_loop(l_)); }
  /** Like dispatch() but waits at most timeout (a std::chrono duration, or an int of
   *  milliseconds; 0: do not wait). */
  void dispatch(time_limit timeout) {
    finish(ibmsg_dispatch_event_loop_timeout(l_, timeout.ms()));
  }

  /** For driving the loop from another event loop: an fd that becomes readable when there is
   *  work for process() (ibmsg_event_loop_fd()), or -1 on failure. */
  int fd() noexcept { return ibmsg_event_loop_fd(l_); }
  /** Processes everything that is ready without waiting (ibmsg_event_loop_process()). Throws
   *  ibmsg::error, or what a callback threw. */
  void process() { finish(ibmsg_event_loop_process(l_)); }
  /** Milliseconds until process() must run even if fd() stays quiet (0: at once; -1: not
   *  until fd() is readable, or an empty loop): see next_timeout(). */
  int timeout() noexcept { return ibmsg_event_loop_timeout(l_); }
  /** How long until process() must run even if fd() stays quiet (zero: at once), or no value
   *  when nothing but fd() will make it run. Throws ibmsg::error (IBMSG_EINVAL for an empty
   *  loop). */
  std::optional<std::chrono::milliseconds> next_timeout() const {
    int ms = -1;
    detail::check(ibmsg_event_loop_next_timeout(l_, &ms));  // (ibmsg 1.7)
    if (ms < 0) return std::nullopt;
    return std::chrono::milliseconds(ms);
  }

  /** Runs fn on the loop's thread at the loop's next iteration (ibmsg_event_loop_call(); since
   *  1.7): the one member any thread may call, as long as the loop object is neither moved nor
   *  destroyed meanwhile. Calls run in the order posted, each once, as callbacks do; what fn
   *  throws is rethrown by the dispatch() or process() that ran it. Throws ibmsg::error
   *  (IBMSG_EINVAL for an empty fn, IBMSG_ENOMEM) or std::bad_alloc; then fn never runs. The
   *  destructor runs calls still waiting (see ~loop()). */
  void call(std::function<void()> fn) {
    if (!fn) throw error(IBMSG_EINVAL);
    std::unique_ptr<call_box> box(new call_box{l_, std::move(fn)});
    detail::check(ibmsg_event_loop_call(l_, on_call, box.get()));
    box.release();  // on_call frees it
  }

  /** Sets an int option (IBMSG_OPT_RECV_DEPTH, ...) for sockets set up afterwards. Throws
   *  ibmsg::error: IBMSG_EINVAL for an unknown option or a value out of range. */
  void set_option(int option, int value) {
    detail::check(ibmsg_setopt(l_, option, &value, sizeof value));
  }
  /** Sets an option of milliseconds (IBMSG_OPT_CONNECT_TIMEOUT, IBMSG_OPT_KEEPALIVE,
   *  IBMSG_OPT_REQUEST_WINDOW, IBMSG_OPT_VIOLATION_BAN) from a std::chrono duration, rounded up
   *  to whole milliseconds (see time_limit). Throws ibmsg::error (IBMSG_EINVAL). */
  template <class Rep, class Period>
  void set_option(int option, std::chrono::duration<Rep, Period> value) {
    set_option(option, time_limit(value).ms());
  }
  /** Sets a string option (IBMSG_OPT_SOURCE_ADDR, IBMSG_OPT_DEVICE). Throws ibmsg::error. */
  void set_option(int option, std::string_view value) {
    // An empty string_view may have no data; the library wants a pointer all the same.
    detail::check(ibmsg_setopt(l_, option, value.empty() ? "" : value.data(), value.size()));
  }
  /**
   * Sets an integer option from a value of another integer type (std::uint64_t, std::size_t,
   * unsigned, long, ...) for sockets set up afterwards, the same way for every option: a value
   * that fits an int goes to the library as an int, a larger one as a uint64_t (len 8), so the
   * options of sizes (ibmsg.h: "int, or uint64_t", e.g. IBMSG_OPT_MAX_MSG_SIZE and
   * IBMSG_OPT_RNDV_MEMORY) take the whole value, also beyond INT_MAX, and the int options refuse
   * what does not fit an int. Throws ibmsg::error: IBMSG_EINVAL for an unknown option or a value
   * out of range.
   */
  template <class T, detail::if_other_integer<T> = 0>
  void set_option(int option, T value) {
    detail::check(detail::set_integer(value, [&](const void *v, std::size_t len) {
      return ibmsg_setopt(l_, option, v, len);
    }));
  }
  /** Reads an int option. Throws ibmsg::error. An option of sizes (e.g. IBMSG_OPT_MAX_MSG_SIZE)
   *  reads as at most INT_MAX, as ibmsg_getopt() into an int says: see get_option_u64(). */
  int get_option(int option) const {
    int value = 0;
    std::size_t len = sizeof value;
    detail::check(ibmsg_getopt(l_, option, &value, &len));
    return value;
  }
  /** Reads any integer option as a std::uint64_t, through a uint64_t buffer that ibmsg_getopt()
   *  fills with the option's own type: an option of sizes whole, also beyond INT_MAX; an int
   *  option as get_option() does. Throws ibmsg::error (IBMSG_ERANGE for a negative value, e.g.
   *  IBMSG_BUSY_POLL_ALWAYS). Not for the string options: see get_option_string(). */
  std::uint64_t get_option_u64(int option) const {
    return detail::get_integer([&](void *v, std::size_t *len) {
      return ibmsg_getopt(l_, option, v, len);
    });
  }
  /** Reads a string option. Throws ibmsg::error. */
  std::string get_option_string(int option) const {
    char buf[1024];
    std::size_t len = sizeof buf;
    detail::check(ibmsg_getopt(l_, option, buf, &len));
    return std::string(buf, len);
  }

  /**
   * What the loop costs now, in bytes of registered memory (ibmsg_loop_memory()): the eager
   * buffers of its connections (also of closed ones whose messages are still held), the free
   * large buffers its devices keep, and the large buffers in use. Throws ibmsg::error
   * (IBMSG_EINVAL for an empty loop).
   */
  ibmsg_memory memory() const {
    ibmsg_memory m{};
    detail::check(ibmsg_loop_memory_info(l_, &m, sizeof m));  // (ibmsg 1.7)
    return m;
  }

  /** The loop's counters (ibmsg_loop_stats(); since 1.6): its peers' remote access violations
   *  and the connection requests refused for them. Throws ibmsg::error (IBMSG_EINVAL for an
   *  empty loop). */
  ibmsg_loop_counters stats() const {
    ibmsg_loop_counters c{};
    detail::check(ibmsg_loop_stats(l_, &c, sizeof c));
    return c;
  }

  /** The C loop, or nullptr for an empty (moved-from or closed) loop. Stays the same across
   *  moves. */
  ibmsg_event_loop *handle() const noexcept { return l_; }
  /** True if the loop holds a C loop. */
  explicit operator bool() const noexcept { return l_ != nullptr; }

 private:
  friend class socket;
  friend class message;
  friend class region;
  friend struct detail::send_box;

  void init(struct ev_loop *ev) {
    l_ = new ibmsg_event_loop();
    own_ev_ = ev == nullptr;
    int rc = ev ? ibmsg_init_event_loop_ev(l_, ev) : ibmsg_init_event_loop(l_);
    if (rc != IBMSG_OK) {
      delete std::exchange(l_, nullptr);
      throw error(rc);
    }
    l_->connection_request = on_request;
    l_->connection_established = on_established;
    l_->message_received = on_received;
    l_->message_sent = on_sent;
    l_->connection_closed = on_closed;
    l_->write_received = on_write;
    l_->message_incoming = on_incoming;
    l_->user_data = this;
  }
  static loop *from(ibmsg_event_loop *l) noexcept {
    return l ? static_cast<loop *>(l->user_data) : nullptr;
  }

  /* After a C call that ran callbacks: a callback's exception first, then the call's error. */
  void finish(int rc) {
    if (pending_) std::rethrow_exception(std::exchange(pending_, nullptr));
    detail::check(rc);
  }
  /* Inside a trampoline's catch: the wrapper is found again through the C loop, which does
   * not move, because the callback may have moved the wrapper. */
  static void hold(ibmsg_event_loop *l) noexcept {
    loop *self = from(l);
    if (self && !self->pending_) self->pending_ = std::current_exception();
  }
  void drop_callbacks() noexcept {
    request_cb_ = nullptr;
    established_cb_ = nullptr;
    received_cb_ = nullptr;
    sent_cb_ = nullptr;
    closed_cb_ = nullptr;
    write_cb_ = nullptr;
    incoming_cb_ = nullptr;
    log_cb_ = nullptr;
    if (l_) l_->log = nullptr;
  }
  /* Deregisters (and frees) the orphaned regions that are no longer busy: after anything that
   * may have made one so (a message freed, a connection closed, an operation done). */
  void release_regions() noexcept;
  /* The C loop is gone: so are the registrations of the orphaned regions left in the list. */
  void drop_regions() noexcept;
  /* After the loop of l freed a message or closed a socket. */
  static void released(ibmsg_event_loop *l) noexcept {
    if (loop *self = from(l))
      if (self->orphans_) self->release_regions();
  }
  void reset() noexcept;

  /* The C callbacks. Each keeps the wrappers' bookkeeping, then calls the application's
   * callback, and touches no wrapper after it (the callback may move or destroy them). */
  static void on_request(ibmsg_connection_request *r) noexcept;
  static void on_established(ibmsg_socket *s) noexcept;
  static void on_received(ibmsg_socket *s, ibmsg_buffer *b) noexcept;
  static void on_sent(ibmsg_socket *s, ibmsg_buffer *b, int status) noexcept;
  static void on_closed(ibmsg_socket *s, int reason) noexcept;
  static void on_write(ibmsg_socket *s, std::uint32_t imm, std::size_t length) noexcept;
  static void on_incoming(ibmsg_socket *s, ibmsg_incoming *in) noexcept;
  static void on_log_line(ibmsg_event_loop *l, ibmsg_socket *s, int level,
                          const char *text) noexcept;
  /* The C loops leaked by destructors, process-wide: counted, and kept in a list that is never
   * freed, so that they stay reachable (a leak checker at exit does not report them). */
  static std::atomic<unsigned> &leaked_count() noexcept {
    static std::atomic<unsigned> n{0};
    return n;
  }
  struct leaked_node {
    ibmsg_event_loop *l;
    leaked_node *next;
  };
  static void keep_leaked(ibmsg_event_loop *l) noexcept {
    static std::atomic<leaked_node *> head{nullptr};  // trivially destructible: never freed
    leaked_node *n = new (std::nothrow) leaked_node{l, head.load()};
    if (n)
      while (!head.compare_exchange_weak(n->next, n)) {
      }
    ++leaked_count();
  }
  /* A call() on its way to the loop's thread. */
  struct call_box {
    ibmsg_event_loop *l;
    std::function<void()> fn;
  };
  static void on_call(void *arg) noexcept {
    std::unique_ptr<call_box> box(static_cast<call_box *>(arg));
    try {
      box->fn();
    } catch (...) {
      hold(box->l);
    }
  }

  ibmsg_event_loop *l_ = nullptr;
  bool own_ev_ = true;          // false: runs on the application's libev loop
  std::size_t closing_ = 0;     // orphaned sockets, messages and regions the library still
                                // holds, and messages of send() in flight: what drain() awaits
  std::exception_ptr pending_;  // the first exception a callback threw
  connection_request_handler request_cb_;
  connection_established_handler established_cb_;
  message_received_handler received_cb_;
  message_sent_handler sent_cb_;
  connection_closed_handler closed_cb_;
  write_received_handler write_cb_;
  message_incoming_handler incoming_cb_;
  log_handler log_cb_;
  detail::region_box *orphans_ = nullptr;  // regions whose wrappers died while they were busy
  bool dying_ = false;  // in reset(): no handler of the application runs any more
};

/* ---------------------------------------------------------------------------------------------
 * Definitions that need the complete classes
 * ------------------------------------------------------------------------------------------ */

inline void socket::listen(loop &l, const char *ip, unsigned short port, int max_connections) {
  detail::check(ibmsg_listen(l.handle(), prepare(), ip, port, max_connections));
  opened();
}

inline void socket::spread(std::initializer_list<loop *> loops) {
  ibmsg_event_loop *handles[64];
  if (loops.size() > 64) throw error(IBMSG_EINVAL);
  int n = 0;
  for (loop *l : loops) handles[n++] = l ? l->handle() : nullptr;
  detail::check(ibmsg_listen_spread(s_, n ? handles : nullptr, n));
}

inline void connection_request::accept_on(loop &l, socket &s) {
  ibmsg_socket *c = s.prepare();
  s.opened();
  s.undo_open(ibmsg_accept_on(r_, l.handle(), c, nullptr));
}

inline void connection_request::accept_on(loop &l, socket &s, const options &opts) {
  ibmsg_socket *c = s.prepare();
  s.opened();
  s.undo_open(ibmsg_accept_on(r_, l.handle(), c, opts.checked()));
}

inline void socket::connect(loop &l, const char *ip, unsigned short port) {
  detail::check(ibmsg_connect(l.handle(), prepare(), ip, port));
  opened();
}

inline void socket::listen(loop &l, const char *ip, unsigned short port, int max_connections,
                           const options &opts) {
  detail::check(ibmsg_listen_opts(l.handle(), prepare(), ip, port, max_connections, opts.checked()));
  opened();
}

inline void socket::connect(loop &l, const char *ip, unsigned short port, const options &opts) {
  detail::check(ibmsg_connect_opts(l.handle(), prepare(), ip, port, opts.checked()));
  opened();
}

inline options::options(loop &l) : o_(nullptr) {
  if (!l.handle()) throw error(IBMSG_EINVAL);
  o_ = ibmsg_options_new(l.handle());
  if (!o_) throw error(IBMSG_ENOMEM);
}

inline void socket::reset() noexcept {
  if (!s_) return;
  if (open_) {
    // IBMSG_ESTATE means it is closing already: the closed callback comes either way, and
    // frees the struct (see loop::on_closed).
    (void)ibmsg_disconnect(s_);
    s_->user_data = detail::orphan;
    if (loop *l = loop::from(s_->loop)) ++l->closing_;
    open_ = false;
  } else {
    delete s_;
  }
  s_ = nullptr;
}

namespace detail {
/* The handlers of a socket's own (socket::on_received(), ...). */
struct socket_handlers {
  socket::established_handler established;
  socket::received_handler received;
  socket::sent_handler sent;
  socket::closed_handler closed;
};

/* True for a std::function: an empty one is no handler. */
template <class F>
struct is_std_function : std::false_type {};
template <class Sig>
struct is_std_function<std::function<Sig>> : std::true_type {};

/* A message sent through socket::send(), kept with the handler while it is in flight: the
 * message's user_data points at msg, whose box_ points back here. Made by send(), freed by
 * loop::on_sent after the handler ran (or without running it, when the socket's wrapper died). */
struct send_box {
  message msg;
  virtual ~send_box() = default;
  virtual void complete(socket &s, message m, int status) = 0;
};

/* send_box with the handler F (any callable send() takes, or std::nullptr_t). */
template <class F>
struct send_box_of final : send_box {
  F f;
  template <class G>
  explicit send_box_of(G &&g) : f(std::forward<G>(g)) {}
  void complete(socket &s, message m, int status) override {
    if constexpr (std::is_same_v<F, std::nullptr_t>) {
      (void)s;
      (void)status;
    } else {
      if constexpr (is_std_function<F>::value) {
        if (!f) return;
      }
      if constexpr (std::is_invocable_v<F &, socket &, message, int>)
        f(s, std::move(m), status);
      else
        f(status);
    }
  }
};

template <class F>
std::unique_ptr<send_box> make_send_box(F &&f) {
  using G = std::decay_t<F>;
  static_assert(std::is_same_v<G, std::nullptr_t> ||
                    std::is_invocable_v<G &, socket &, message, int> ||
                    std::is_invocable_v<G &, int>,
                "a send() handler takes (ibmsg::socket &, ibmsg::message, int status), "
                "(int status), or is nullptr");
  return std::unique_ptr<send_box>(new send_box_of<G>(std::forward<F>(f)));
}
}  // namespace detail

inline detail::socket_handlers &socket::handlers() {
  if (!h_) h_ = std::make_shared<detail::socket_handlers>();
  return *h_;
}
inline void socket::on_established(established_handler h) { handlers().established = std::move(h); }
inline void socket::on_received(received_handler h) { handlers().received = std::move(h); }
inline void socket::on_sent(sent_handler h) { handlers().sent = std::move(h); }
inline void socket::on_closed(closed_handler h) { handlers().closed = std::move(h); }

inline bool socket::post(message &msg) { return msg.post(*this); }
inline bool socket::post_imm(message &msg, std::uint32_t imm) { return msg.post_imm(*this, imm); }

template <class F>
bool socket::send(message &msg, F &&done) {
  return post_box(msg, nullptr, detail::make_send_box(std::forward<F>(done)));
}

template <class F>
bool socket::send_imm(message &msg, std::uint32_t imm, F &&done) {
  return post_box(msg, &imm, detail::make_send_box(std::forward<F>(done)));
}

template <class F>
bool socket::send(const_bytes data, F &&done) {
  message m;
  if (!m.alloc(*this, data)) return false;
  return send(m, std::forward<F>(done));  // m is freed here unless sent
}

inline bool socket::post_box(message &msg, const std::uint32_t *imm,
                             std::unique_ptr<detail::send_box> box) {
  if (!msg) throw error(IBMSG_EINVAL);
  box->msg = std::move(msg);  // its user_data follows: the box's message is the one posted
  ibmsg_buffer *b = box->msg.handle();
  // No callback runs inside the call: the box is the library's only once it succeeded.
  int rc = imm ? ibmsg_post_send_imm(s_, b, *imm) : ibmsg_post_send(s_, b);
  if (rc != IBMSG_OK) {
    msg = std::move(box->msg);  // the caller's, as it was
    if (rc == IBMSG_EAGAIN) return false;
    throw error(rc);
  }
  box->msg.box_ = box.get();
  if (loop *l = loop::from(s_->loop)) ++l->closing_;  // drain() waits for it
  box.release();  // freed by loop::on_sent
  return true;
}

inline bool message::alloc(socket &s, std::size_t size) {
  ibmsg_buffer *b = new ibmsg_buffer();
  int rc = ibmsg_alloc_msg(b, s.handle(), size);
  if (rc != IBMSG_OK) {
    delete b;
    if (rc == IBMSG_EAGAIN) return false;
    throw error(rc);
  }
  adopt_sent(b, s);
  return true;
}

inline bool message::from_region(socket &s, region &r, std::size_t offset, std::size_t size) {
  ibmsg_buffer *b = new ibmsg_buffer();
  int rc = ibmsg_msg_from_region(b, s.handle(), r.handle(), offset, size);
  if (rc != IBMSG_OK) {
    delete b;
    if (rc == IBMSG_EAGAIN) return false;
    throw error(rc);
  }
  adopt_sent(b, s);
  return true;
}

inline void message::adopt_sent(ibmsg_buffer *b, socket &s) noexcept {
  reset();
  b_ = b;
  b_->user_data = this;
  loop_ = s.handle()->loop;
  received_ = false;
}

inline void message::free() {
  detail::check(ibmsg_free_msg(b_));
  if (!received_) delete b_;
  b_ = nullptr;
  received_ = false;
  loop::released(std::exchange(loop_, nullptr));  // it may have kept a region busy
}

inline void message::reset() noexcept {
  if (!b_) return;
  int rc = ibmsg_free_msg(b_);
  bool freed = rc == IBMSG_OK;
  if (!received_) {
    if (rc == IBMSG_EBUSY) {
      // Queued or in flight: loop::on_sent frees it.
      b_->user_data = detail::orphan;
      if (loop *l = loop::from(loop_)) ++l->closing_;
    } else {
      delete b_;
    }
  }
  b_ = nullptr;
  received_ = false;
  ibmsg_event_loop *l = std::exchange(loop_, nullptr);
  if (freed) loop::released(l);  // it may have kept a region busy
}

inline void loop::reset() noexcept {
  if (!l_) return;
  drop_callbacks();
  dying_ = true;  // the sockets' own handlers and the per-post ones do not run either
  release_regions();
  int rc = ibmsg_destroy_event_loop(l_);
  if (rc == IBMSG_EBUSY && own_ev_) {
    // What is ready runs now, once, without waiting: calls posted with call() that have not
    // run yet (they would be lost), and events that have arrived.
    (void)ibmsg_event_loop_process(l_);
    release_regions();
    rc = ibmsg_destroy_event_loop(l_);
  }
  if (rc == IBMSG_OK) {
    delete l_;
    drop_regions();
  } else {
    // Leaked: the library may still point into it, and nothing may find this (dead) wrapper
    // through it; the orphans stay with it. A wait here could block for as long as a peer
    // takes to answer, so the destructor leaves that to drain().
    l_->user_data = nullptr;
    keep_leaked(l_);
    std::fprintf(stderr,
                 "ibmsg.hpp: an ibmsg::loop died with %zu of the wrapper's sockets, messages or "
                 "regions still closing, or objects of the application still open (%s): its C "
                 "loop is leaked; call loop::drain() before the loop dies\n",
                 closing_, ibmsg_err_name(rc));
  }
  l_ = nullptr;
  orphans_ = nullptr;
  pending_ = nullptr;
  closing_ = 0;
  dying_ = false;  // empty now; move-assignment may fill it again
}

inline void loop::release_regions() noexcept {
  for (detail::region_box **p = &orphans_; *p;) {
    detail::region_box *b = *p;
    // IBMSG_EBUSY: still busy (through the C API, too). Anything else means it is gone:
    // IBMSG_EINVAL if the application deregistered it through handle().
    if (b->ops > 0 || ibmsg_deregister_region(&b->c) == IBMSG_EBUSY) {
      p = &b->next;
      continue;
    }
    *p = b->next;
    if (closing_ > 0) --closing_;
    delete b;
  }
}

inline void loop::drop_regions() noexcept {
  while (detail::region_box *b = orphans_) {
    orphans_ = b->next;
    delete b;
  }
}

inline region::region(loop &l, void *addr, std::size_t length, unsigned rights)
    : b_(new detail::region_box()) {
  b_->loop = l.handle();
  int rc = ibmsg_register_region(l.handle(), &b_->c, addr, length, rights);
  if (rc != IBMSG_OK) {
    delete std::exchange(b_, nullptr);
    throw error(rc);
  }
}

inline region::region(loop &l, std::size_t length, unsigned rights)
    : b_(new detail::region_box()) {
  b_->loop = l.handle();
  int rc = ibmsg_alloc_region(l.handle(), &b_->c, length, rights);
  if (rc != IBMSG_OK) {
    delete std::exchange(b_, nullptr);
    throw error(rc);
  }
}

inline void region::reset() noexcept {
  detail::region_box *b = std::exchange(b_, nullptr);
  if (!b) return;
  if (ibmsg_deregister_region(&b->c) == IBMSG_EBUSY) {
    // Operations or messages still use it: the loop deregisters it once they are done
    // (loop::release_regions()).
    b->orphan = true;
    if (loop *l = loop::from(b->loop)) {
      ++l->closing_;
      b->next = l->orphans_;
      l->orphans_ = b;
    }
    return;
  }
  delete b;  // deregistered (or IBMSG_EINVAL: deregistered already through handle())
}

inline void region::op_done(detail::region_box *b) noexcept {
  if (b->ops > 0) --b->ops;
  if (!b->orphan || b->ops > 0) return;
  if (loop::from(b->loop)) {
    loop::released(b->loop);  // deregisters it unless messages still use it
  } else if (ibmsg_deregister_region(&b->c) != IBMSG_EBUSY) {
    delete b;  // the loop's wrapper is gone, and with it the list: it is in none
  }
}

template <class Call>
bool socket::post_op(region &local, std::size_t local_offset, op_handler done,
                     atomic_handler atomic_done, Call &&call) {
  std::unique_ptr<detail::op_box> box(new detail::op_box());
  box->op.done = on_op_done;
  box->op.user_data = box.get();
  box->local = local.b_;
  box->local_offset = local_offset;
  box->done = std::move(done);
  box->atomic_done = std::move(atomic_done);
  // No callback runs inside the call: the box is the library's only once it succeeded.
  int rc = call(&box->op, local.handle());
  if (rc == IBMSG_EAGAIN) return false;
  detail::check(rc);
  ++local.b_->ops;
  box.release();  // freed by on_op_done
  return true;
}

inline bool socket::rdma_write(region &local, std::size_t local_offset, std::size_t length,
                               const descriptor &remote, std::size_t remote_offset,
                               op_handler done) {
  return post_op(local, local_offset, std::move(done), nullptr,
                 [&](ibmsg_op *op, ibmsg_region *r) {
                   return ibmsg_rdma_write(s_, op, r, local_offset, length, &remote.handle(),
                                           remote_offset);
                 });
}

inline bool socket::rdma_read(region &local, std::size_t local_offset, std::size_t length,
                              const descriptor &remote, std::size_t remote_offset,
                              op_handler done) {
  return post_op(local, local_offset, std::move(done), nullptr,
                 [&](ibmsg_op *op, ibmsg_region *r) {
                   return ibmsg_rdma_read(s_, op, r, local_offset, length, &remote.handle(),
                                          remote_offset);
                 });
}

inline bool socket::rdma_write_imm(region &local, std::size_t local_offset, std::size_t length,
                                   const descriptor &remote, std::size_t remote_offset,
                                   std::uint32_t imm, op_handler done) {
  return post_op(local, local_offset, std::move(done), nullptr,
                 [&](ibmsg_op *op, ibmsg_region *r) {
                   return ibmsg_rdma_write_imm(s_, op, r, local_offset, length, &remote.handle(),
                                               remote_offset, imm);
                 });
}

inline bool socket::atomic_cas(region &local, std::size_t local_offset, const descriptor &remote,
                               std::size_t remote_offset, std::uint64_t compare,
                               std::uint64_t swap, atomic_handler done) {
  return post_op(local, local_offset, nullptr, std::move(done),
                 [&](ibmsg_op *op, ibmsg_region *r) {
                   return ibmsg_atomic_cas(s_, op, r, local_offset, &remote.handle(),
                                           remote_offset, compare, swap);
                 });
}

inline bool socket::atomic_fadd(region &local, std::size_t local_offset, const descriptor &remote,
                                std::size_t remote_offset, std::uint64_t add,
                                atomic_handler done) {
  return post_op(local, local_offset, nullptr, std::move(done),
                 [&](ibmsg_op *op, ibmsg_region *r) {
                   return ibmsg_atomic_fadd(s_, op, r, local_offset, &remote.handle(),
                                            remote_offset, add);
                 });
}

inline void socket::on_op_done(ibmsg_socket *s, ibmsg_op *op, int status) noexcept {
  // The library is done with the ibmsg_op: the box is freed whatever happens below.
  std::unique_ptr<detail::op_box> box(static_cast<detail::op_box *>(op->user_data));
  const bool atomic = static_cast<bool>(box->atomic_done);
  std::uint64_t previous = 0;
  if (atomic && status == IBMSG_OK)
    std::memcpy(&previous, static_cast<const unsigned char *>(box->local->c.addr) +
                               box->local_offset, sizeof previous);
  region::op_done(box->local);  // may deregister and free an orphaned region
  box->local = nullptr;
  loop *self = loop::from(s->loop);
  socket *sock = from(s);
  if (!self || self->dying_ || !sock) return;
  try {
    if (atomic)
      box->atomic_done(*sock, status, previous);
    else if (box->done)
      box->done(*sock, status);
  } catch (...) {
    loop::hold(s->loop);
  }
}

namespace detail {
/* One request posted through the wrapper: the ibmsg_request the library holds, and the handler.
 * Allocated by socket::request(); the library's while posted, then freed after its done
 * callback, or handed to a retry_handler in an unanswered_request (which frees it when it dies
 * or gives it back to the library with retry()). */
struct request_box {
  ibmsg_request req{};
  socket::reply_handler done;
  // Shared: the handler gets the unanswered_request that owns the box, and may drop it (and the
  // box) while it runs.
  std::shared_ptr<const socket::retry_handler> retry_done;
};
}  // namespace detail

inline bool socket::request(message &msg, time_limit timeout, reply_handler done) {
  std::unique_ptr<detail::request_box> box(new detail::request_box());
  box->done = std::move(done);
  return post_request(msg, timeout.ms(), std::move(box));
}

inline bool socket::request(message &msg, time_limit timeout, retry_handler done) {
  std::unique_ptr<detail::request_box> box(new detail::request_box());
  if (done) box->retry_done = std::make_shared<const retry_handler>(std::move(done));
  return post_request(msg, timeout.ms(), std::move(box));
}

inline bool socket::post_request(message &msg, int timeout_ms,
                                 std::unique_ptr<detail::request_box> box) {
  box->req.done = on_reply;
  box->req.user_data = box.get();
  // No callback runs inside the call: the box is the library's only once it succeeded.
  int rc = ibmsg_post_request(s_, msg.handle(), &box->req, timeout_ms);
  if (rc == IBMSG_EAGAIN) return false;
  detail::check(rc);
  box.release();  // freed by on_reply, or by the unanswered_request it hands on
  return true;
}

inline bool socket::reply(message &request, message &reply) {
  int rc = ibmsg_post_reply(s_, request.handle(), reply.handle());
  if (rc == IBMSG_EAGAIN) return false;
  detail::check(rc);
  return true;
}

inline void socket::on_reply(ibmsg_socket *s, ibmsg_request *req, ibmsg_buffer *reply,
                             int status) noexcept {
  // The library is done with the ibmsg_request: the box is the wrapper's again, freed at the end
  // unless a retry_handler's unanswered_request takes it.
  std::unique_ptr<detail::request_box> box(static_cast<detail::request_box *>(req->user_data));
  // Lent like a received message: freed at the end unless the handler keeps it.
  message msg = reply ? message::adopt_received(reply, s->loop) : message();
  loop *self = loop::from(s->loop);
  socket *sock = from(s);
  if (!self || self->dying_ || !sock) return;
  try {
    if (box->retry_done) {
      std::shared_ptr<const retry_handler> handler = box->retry_done;
      unanswered_request pending;
      if (status != IBMSG_OK) pending = unanswered_request(box.release());
      (*handler)(*sock, std::move(msg), status, std::move(pending));
    } else if (box->done) {
      box->done(*sock, std::move(msg), status);
    }
  } catch (...) {
    loop::hold(s->loop);
  }
}

inline bool unanswered_request::retry(socket &s, message &msg, time_limit timeout) {
  if (!b_) throw error(IBMSG_EINVAL);
  // No callback runs inside the call; on failure the box stays here.
  int rc = ibmsg_retry_request(s.handle(), msg.handle(), &b_->req, timeout.ms());
  if (rc == IBMSG_EAGAIN) return false;
  detail::check(rc);
  b_ = nullptr;  // the library's until its done callback (socket::on_reply)
  return true;
}

inline std::uint64_t unanswered_request::id() const noexcept { return b_ ? b_->req.id : 0; }
inline int unanswered_request::retries() const noexcept { return b_ ? b_->req.retries : 0; }
inline int unanswered_request::status() const noexcept { return b_ ? b_->req.status : IBMSG_OK; }
inline const ibmsg_request *unanswered_request::handle() const noexcept {
  return b_ ? &b_->req : nullptr;
}
inline void unanswered_request::reset() noexcept { delete std::exchange(b_, nullptr); }

inline void loop::on_request(ibmsg_connection_request *r) noexcept {
  loop *self = from(r->loop);
  // A listener whose wrapper died is closing: leave the request undecided, so it is rejected.
  if (!self || self->dying_ || !socket::from(r->listener) || !self->request_cb_) return;
  try {
    connection_request req(r);
    self->request_cb_(req);
  } catch (...) {
    hold(r->loop);
  }
}

inline void loop::on_established(ibmsg_socket *s) noexcept {
  loop *self = from(s->loop);
  socket *sock = socket::from(s);
  if (!self || self->dying_ || !sock) return;
  // A copy: the handler may destroy the socket, and with it the socket's reference.
  std::shared_ptr<detail::socket_handlers> h = sock->h_;
  try {
    if (h && h->established)
      h->established(*sock);
    else if (self->established_cb_)
      self->established_cb_(*sock);
  } catch (...) {
    hold(s->loop);
  }
}

inline void loop::on_received(ibmsg_socket *s, ibmsg_buffer *b) noexcept {
  // Freed at the end unless the callback keeps it.
  message msg = message::adopt_received(b, s->loop);
  loop *self = from(s->loop);
  socket *sock = socket::from(s);
  if (!self || self->dying_ || !sock) return;
  std::shared_ptr<detail::socket_handlers> h = sock->h_;  // see on_established
  try {
    if (h && h->received)
      h->received(*sock, std::move(msg));
    else if (self->received_cb_)
      self->received_cb_(*sock, std::move(msg));
  } catch (...) {
    hold(s->loop);
  }
}

inline void loop::on_sent(ibmsg_socket *s, ibmsg_buffer *b, int status) noexcept {
  loop *self = from(s->loop);
  if (b->user_data == detail::orphan) {
    (void)ibmsg_free_msg(b);
    delete b;
    if (self && self->closing_ > 0) --self->closing_;
    released(s->loop);  // a message of a region kept it busy
    return;
  }
  socket *sock = socket::from(s);
  message *msg = message::from(b);
  if (msg && msg->box_) {
    // A message of socket::send(): the box's handler gets it back, then the box is freed.
    std::unique_ptr<detail::send_box> box(msg->box_);
    if (self && self->closing_ > 0) --self->closing_;
    message out(std::move(box->msg));
    // The socket's wrapper died (or the loop's is dying): the message and the handler go.
    if (!self || self->dying_ || !sock) return;
    try {
      box->complete(*sock, std::move(out), status);
    } catch (...) {
      hold(s->loop);
    }
    return;
  }
  if (!self || self->dying_ || !sock || !msg) return;
  std::shared_ptr<detail::socket_handlers> h = sock->h_;  // see on_established
  try {
    if (h && h->sent)
      h->sent(*sock, *msg, status);
    else if (self->sent_cb_)
      self->sent_cb_(*sock, *msg, status);
  } catch (...) {
    hold(s->loop);
  }
}

inline void loop::on_write(ibmsg_socket *s, std::uint32_t imm, std::size_t length) noexcept {
  loop *self = from(s->loop);
  socket *sock = socket::from(s);
  if (!self || self->dying_ || !sock || !self->write_cb_) return;
  try {
    self->write_cb_(*sock, imm, length);
  } catch (...) {
    hold(s->loop);
  }
}

inline void loop::on_incoming(ibmsg_socket *s, ibmsg_incoming *in) noexcept {
  loop *self = from(s->loop);
  socket *sock = socket::from(s);
  // A socket whose wrapper died is closing: the message stays undecided (a library buffer).
  if (!self || self->dying_ || !sock || !self->incoming_cb_) return;
  try {
    incoming view(in);
    self->incoming_cb_(*sock, view);
  } catch (...) {
    hold(s->loop);
  }
}

inline void loop::on_closed(ibmsg_socket *s, int reason) noexcept {
  ibmsg_event_loop *l = s->loop;
  loop *self = from(l);
  released(l);  // messages it was to receive into regions are dropped: they are free again
  if (s->user_data == detail::orphan) {
    delete s;  // the library never touches it again after this callback
    if (self && self->closing_ > 0) --self->closing_;
    return;
  }
  socket *sock = socket::from(s);
  if (!sock) return;
  sock->open_ = false;
  if (!self || self->dying_) return;
  // A copy: the closed handler may well destroy the socket.
  std::shared_ptr<detail::socket_handlers> h = sock->h_;
  try {
    if (h && h->closed)
      h->closed(*sock, reason);
    else if (self->closed_cb_)
      self->closed_cb_(*sock, reason);
  } catch (...) {
    hold(l);
  }
}

inline void loop::on_log_line(ibmsg_event_loop *l, ibmsg_socket *s, int level,
                              const char *text) noexcept {
  loop *self = from(l);
  if (!self || self->dying_ || !self->log_cb_) return;
  try {
    self->log_cb_(s ? socket::from(s) : nullptr, level, std::string_view(text ? text : ""));
  } catch (...) {
    hold(l);
  }
}

}  // namespace ibmsg

/** The C enum's codes as std::error_code (found by argument-dependent lookup: ibmsg_error is in
 *  the global namespace): std::error_code ec = IBMSG_ETIMEDOUT; ec == std::errc::timed_out. */
inline std::error_code make_error_code(ibmsg_error code) noexcept {
  return ibmsg::make_error_code(static_cast<int>(code));
}

namespace std {
/** ibmsg_error converts to std::error_code (ibmsg::error_category()). */
template <>
struct is_error_code_enum<ibmsg_error> : true_type {};
}  // namespace std

#endif /* C++17 */
#endif /* IBMSG_HPP */
