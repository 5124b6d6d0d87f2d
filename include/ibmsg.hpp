/*
 * ibmsg.hpp - header-only C++17 wrapper of the ibmsg C API (ibmsg.h).
 *
 * Move-only RAII classes over the C objects, in the manner of cppzmq over libzmq:
 *
 *   ibmsg::error               an ibmsg error code as an exception (code(), what())
 *   ibmsg::loop                owns an ibmsg_event_loop; the callbacks are std::function
 *   ibmsg::socket              owns a heap-allocated ibmsg_socket (listener or connection)
 *   ibmsg::message             owns one message: a send buffer, or a received message
 *   ibmsg::connection_request  a view of an incoming connection inside the request callback
 *
 * Every class exposes its C object with handle(), so any C function can be used alongside, and
 * adds no behaviour of its own beyond RAII and error translation: a C function that fails throws
 * ibmsg::error carrying its code, except would-block (IBMSG_EAGAIN from message::alloc() and
 * message::post()), which returns false as cppzmq does.
 *
 * A complete program, which says hello to a server and disconnects:
 *
 *     ibmsg::loop loop;      // first: it must outlive the socket and the message
 *     ibmsg::socket conn;
 *     ibmsg::message hello;
 *     loop.on_connection_established([&](ibmsg::socket &s) {
 *       if (hello.alloc(s, 5)) {
 *         std::memcpy(hello.data(), "hello", 5);
 *         if (hello.post(s)) return;
 *       }
 *       s.disconnect();        // would block: not on a new connection
 *     });
 *     loop.on_message_sent([](ibmsg::socket &s, ibmsg::message &, int) { s.disconnect(); });
 *     conn.connect(loop, "192.0.2.1", 12345);
 *     while (conn.is_open()) loop.dispatch();
 *
 * (examples/ibmsg-echo.cpp is a longer one.)
 *
 * Ownership and lifetime, the rules of ibmsg.h carried over:
 *   - the wrappers keep the C structs on the heap, so moving a wrapper never moves a struct the
 *     library points to. The `user_data` fields of the C structs belong to the wrapper (they
 *     point back at the wrapper objects and follow them when they move): do not change them.
 *     To tell connections apart, key on socket::handle(), which stays the same across moves.
 *   - destroying an open ibmsg::socket disconnects it; the C struct lives on until the library's
 *     closed callback, and no callback reaches the application for that socket any more.
 *   - destroying an ibmsg::message frees it; one still queued or in flight is freed when the
 *     library is done with it, and its message_sent callback does not reach the application.
 *   - received messages come to the message_received callback as an owning ibmsg::message:
 *     freed (its credit returned to the peer) when that object dies, so keep it by moving it.
 *   - the loop must outlive its sockets and messages: create it first so that C++ destroys it
 *     last. See loop::~loop() and loop::close().
 *
 * Exceptions thrown by a callback do not cross the C library: the first one is held and
 * rethrown by the dispatch() or process() call that ran the callback (later ones in the same
 * call are dropped). The library's own state stays consistent either way. Callbacks of a loop
 * on the application's libev loop run inside ev_run(), where nothing can be rethrown: such an
 * exception waits for the next dispatch() or process(), so those callbacks should not throw.
 *
 * Threading is that of ibmsg.h: a loop and everything on it belong to one thread at a time.
 */
#ifndef IBMSG_HPP
#define IBMSG_HPP

/** @file ibmsg.hpp
 *  Header-only C++17 wrapper of the ibmsg C API: move-only RAII classes, callbacks as lambdas,
 *  errors as ibmsg::error. See the comment at the top of this file. */

#include <chrono>
#include <cstddef>
#include <exception>
#include <functional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>

#include "ibmsg.h"

namespace ibmsg {

class loop;
class socket;
class message;
class connection_request;

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
 * An ibmsg error code as an exception. what() is ibmsg_strerror(code()).
 */
class error : public std::runtime_error {
 public:
  /** Makes the exception for an ibmsg error code (IBMSG_EINVAL, IBMSG_EREJECTED, ...). */
  explicit error(int code) : std::runtime_error(ibmsg_strerror(code)), code_(code) {}

  /** The ibmsg error code. */
  int code() const noexcept { return code_; }
  /** The code's name, e.g. "IBMSG_EMSGSIZE" (ibmsg_err_name()). */
  const char *name() const noexcept { return ibmsg_err_name(code_); }

 private:
  int code_;
};

namespace detail {
/* Throws ibmsg::error unless rc is IBMSG_OK. */
inline void check(int rc) {
  if (rc != IBMSG_OK) throw error(rc);
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
  /** Sets a string option; returns *this. Throws ibmsg::error. */
  options &set(int option, std::string_view value) {
    detail::check(ibmsg_options_set(o_, option, value.empty() ? "" : value.data(), value.size()));
    return *this;
  }
  /** Reads an int option. Throws ibmsg::error. */
  int get(int option) const {
    int value = 0;
    std::size_t len = sizeof value;
    detail::check(ibmsg_options_get(o_, option, &value, &len));
    return value;
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
 * the library has closed it; no callback for it reaches the application after that.
 */
class socket {
 public:
  /** An empty socket: nothing allocated, status IBMSG_UNCONNECTED. */
  socket() noexcept = default;
  /** Disconnects an open socket (see the class comment) and frees the C struct. */
  ~socket() { reset(); }

  /** Takes over other's C socket; other becomes empty. */
  socket(socket &&other) noexcept
      : s_(std::exchange(other.s_, nullptr)), open_(std::exchange(other.open_, false)) {
    if (s_) s_->user_data = this;
  }
  /** Closes this socket as the destructor does, then takes over other's C socket. */
  socket &operator=(socket &&other) noexcept {
    if (this != &other) {
      reset();
      s_ = std::exchange(other.s_, nullptr);
      open_ = std::exchange(other.open_, false);
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
  /* After that call succeeded (no callback can have run in between). */
  void opened() noexcept {
    s_->user_data = this;
    open_ = true;
  }
  void reset() noexcept;

  ibmsg_socket *s_ = nullptr;
  bool open_ = false;
};

/* ---------------------------------------------------------------------------------------------
 * Message
 * ------------------------------------------------------------------------------------------ */

/**
 * One message: a send buffer from a socket's pool (alloc()), or a received message handed to the
 * message_received callback. Owns it: the destructor calls ibmsg_free_msg() (a received message's
 * buffer goes back to the peer as a credit). A send message that is queued or in flight when it
 * dies is freed by the loop after its message_sent callback, which the application then does not
 * get.
 *
 * While a message is posted the library owns the buffer: do not change data() or size() until
 * its message_sent callback, which gets this object (or the one it was moved to).
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
    if (b_) b_->user_data = this;
  }
  /** Frees this message as the destructor does, then takes over other's. */
  message &operator=(message &&other) noexcept {
    if (this != &other) {
      reset();
      b_ = std::exchange(other.b_, nullptr);
      loop_ = std::exchange(other.loop_, nullptr);
      received_ = std::exchange(other.received_, false);
      if (b_) b_->user_data = this;
    }
    return *this;
  }
  /** Not copyable: one wrapper owns each message. */
  message(const message &) = delete;
  /** Not copyable. */
  message &operator=(const message &) = delete;

  /**
   * Takes a send buffer of s's pool with room for s.max_msg_size() bytes, size() = size
   * (ibmsg_alloc_msg()); a message held before is freed first. Returns false, changing nothing,
   * when all IBMSG_OPT_SEND_DEPTH buffers are in use (IBMSG_EAGAIN: retry after a message_sent
   * callback). Throws ibmsg::error otherwise: IBMSG_EMSGSIZE if size is larger than the
   * maximum, IBMSG_ENOTCONN if s has no buffers (not connected), ...
   */
  [[nodiscard]] bool alloc(socket &s, std::size_t size);

  /**
   * Sends size() bytes of data() on s (ibmsg_post_send()). On success the library owns the
   * message until its message_sent callback. Returns false when the send queue is full
   * (IBMSG_EAGAIN: nothing was sent, retry after a message_sent callback). Throws ibmsg::error
   * otherwise (IBMSG_ENOTCONN, IBMSG_EMSGSIZE, ...).
   */
  [[nodiscard]] bool post(socket &s) {
    int rc = ibmsg_post_send(s.handle(), b_);
    if (rc == IBMSG_EAGAIN) return false;
    detail::check(rc);
    return true;
  }

  /**
   * Frees the message now (ibmsg_free_msg()) and leaves this object empty. Throws ibmsg::error:
   * IBMSG_EBUSY if it is queued or in flight, IBMSG_EINVAL if the message is empty.
   */
  void free() {
    detail::check(ibmsg_free_msg(b_));
    if (!received_) delete b_;
    b_ = nullptr;
    loop_ = nullptr;
    received_ = false;
  }

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

  /** The payload (nullptr for an empty message). Its capacity is the socket's maximum. */
  void *data() noexcept { return b_ ? b_->data : nullptr; }
  /** The payload (nullptr for an empty message). */
  const void *data() const noexcept { return b_ ? b_->data : nullptr; }
  /** Bytes to send, or bytes received (0 for an empty message). */
  std::size_t size() const noexcept { return b_ ? b_->size : 0; }
  /** Sets the number of bytes to send, at most the socket's maximum message size. */
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

  /** The C message, or nullptr for an empty one. Stays the same across moves. */
  ibmsg_buffer *handle() const noexcept { return b_; }
  /** True if the message holds a buffer. */
  explicit operator bool() const noexcept { return b_ != nullptr; }

 private:
  friend class loop;

  /* A received message, owned from now on (the library owns the struct itself). */
  static message adopt_received(ibmsg_buffer *b) noexcept {
    message m;
    m.b_ = b;
    m.received_ = true;
    b->user_data = &m;  // not read by anyone; kept consistent with move
    return m;
  }
  /* The wrapper of a C message, or nullptr for a foreign, released or orphaned one. */
  static message *from(ibmsg_buffer *b) noexcept {
    if (!b || !b->user_data || b->user_data == detail::orphan) return nullptr;
    return static_cast<message *>(b->user_data);
  }
  void reset() noexcept;

  ibmsg_buffer *b_ = nullptr;
  ibmsg_event_loop *loop_ = nullptr;  // send messages: the loop of the socket they came from
  bool received_ = false;
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
    detail::check(ibmsg_accept(r_, s.prepare()));
    s.opened();
  }
  /** accept() with an option set instead of the listener's options. */
  void accept(socket &s, const options &opts) {
    detail::check(ibmsg_accept_opts(r_, s.prepare(), opts.checked()));
    s.opened();
  }
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
 * Loop
 * ------------------------------------------------------------------------------------------ */

/**
 * An event loop: owns a heap-allocated ibmsg_event_loop and the callbacks, which are
 * std::function and run only inside dispatch() / process() (or the application's ev_run() for
 * a loop on the application's libev loop).
 *
 * A callback may be replaced at any time, except from inside itself (that would destroy the
 * std::function while it runs).
 *
 * Teardown: the loop must outlive its sockets and messages. Disconnect the sockets and dispatch
 * until their closed callbacks have run, let the messages die, then let the loop die or call
 * close(). The destructor does not disconnect anything itself; it only finishes what the
 * sockets' and messages' destructors started (see ~loop()).
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
   * Destroys the C loop (ibmsg_destroy_event_loop()). Never throws. The callbacks are dropped
   * first, so that none runs from here. While sockets or messages whose wrappers have died are
   * still closing, a loop with its own libev loop is dispatched for up to close_wait_ms until
   * they are done. If anything is still open or allocated after that, the C loop is leaked on
   * purpose rather than freed under the library's feet.
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
        closed_cb_(std::move(other.closed_cb_)) {
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
      if (l_) l_->user_data = this;
    }
    return *this;
  }
  /** Not copyable: one wrapper owns each C loop. */
  loop(const loop &) = delete;
  /** Not copyable. */
  loop &operator=(const loop &) = delete;

  /** How long the destructor waits for sockets and messages whose wrappers died to close. */
  static constexpr int close_wait_ms = 5000;

  /**
   * Destroys the C loop now and leaves this object empty. Throws ibmsg::error, leaving the loop
   * as it was: IBMSG_EBUSY while a socket is open (or still closing) or a message is allocated.
   */
  void close() {
    detail::check(ibmsg_destroy_event_loop(l_));
    delete std::exchange(l_, nullptr);
    drop_callbacks();
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

  /** Waits for at least one event and processes all that are ready, running callbacks
   *  (ibmsg_dispatch_event_loop()). Throws ibmsg::error, or what a callback threw. */
  void dispatch() { finish(ibmsg_dispatch_event_loop(l_)); }
  /** Like dispatch() but waits at most timeout_ms (0: do not wait). */
  void dispatch(int timeout_ms) { finish(ibmsg_dispatch_event_loop_timeout(l_, timeout_ms)); }

  /** For driving the loop from another event loop: an fd that becomes readable when there is
   *  work for process() (ibmsg_event_loop_fd()), or -1 on failure. */
  int fd() noexcept { return ibmsg_event_loop_fd(l_); }
  /** Processes everything that is ready without waiting (ibmsg_event_loop_process()). Throws
   *  ibmsg::error, or what a callback threw. */
  void process() { finish(ibmsg_event_loop_process(l_)); }
  /** Milliseconds until process() must run even if fd() stays quiet (0: at once; -1: not
   *  until fd() is readable). */
  int timeout() noexcept { return ibmsg_event_loop_timeout(l_); }

  /** Sets an int option (IBMSG_OPT_RECV_DEPTH, ...) for sockets set up afterwards. Throws
   *  ibmsg::error: IBMSG_EINVAL for an unknown option or a value out of range. */
  void set_option(int option, int value) {
    detail::check(ibmsg_setopt(l_, option, &value, sizeof value));
  }
  /** Sets a string option (IBMSG_OPT_SOURCE_ADDR, IBMSG_OPT_DEVICE). Throws ibmsg::error. */
  void set_option(int option, std::string_view value) {
    // An empty string_view may have no data; the library wants a pointer all the same.
    detail::check(ibmsg_setopt(l_, option, value.empty() ? "" : value.data(), value.size()));
  }
  /** Reads an int option. Throws ibmsg::error. */
  int get_option(int option) const {
    int value = 0;
    std::size_t len = sizeof value;
    detail::check(ibmsg_getopt(l_, option, &value, &len));
    return value;
  }
  /** Reads a string option. Throws ibmsg::error. */
  std::string get_option_string(int option) const {
    char buf[1024];
    std::size_t len = sizeof buf;
    detail::check(ibmsg_getopt(l_, option, buf, &len));
    return std::string(buf, len);
  }

  /** The C loop, or nullptr for an empty (moved-from or closed) loop. Stays the same across
   *  moves. */
  ibmsg_event_loop *handle() const noexcept { return l_; }
  /** True if the loop holds a C loop. */
  explicit operator bool() const noexcept { return l_ != nullptr; }

 private:
  friend class socket;
  friend class message;

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
  }
  void reset() noexcept;

  /* The C callbacks. Each keeps the wrappers' bookkeeping, then calls the application's
   * callback, and touches no wrapper after it (the callback may move or destroy them). */
  static void on_request(ibmsg_connection_request *r) noexcept;
  static void on_established(ibmsg_socket *s) noexcept;
  static void on_received(ibmsg_socket *s, ibmsg_buffer *b) noexcept;
  static void on_sent(ibmsg_socket *s, ibmsg_buffer *b, int status) noexcept;
  static void on_closed(ibmsg_socket *s, int reason) noexcept;

  ibmsg_event_loop *l_ = nullptr;
  bool own_ev_ = true;          // false: runs on the application's libev loop
  std::size_t closing_ = 0;     // orphaned sockets and messages the library still holds
  std::exception_ptr pending_;  // the first exception a callback threw
  connection_request_handler request_cb_;
  connection_established_handler established_cb_;
  message_received_handler received_cb_;
  message_sent_handler sent_cb_;
  connection_closed_handler closed_cb_;
};

/* ---------------------------------------------------------------------------------------------
 * Definitions that need the complete classes
 * ------------------------------------------------------------------------------------------ */

inline void socket::listen(loop &l, const char *ip, unsigned short port, int max_connections) {
  detail::check(ibmsg_listen(l.handle(), prepare(), ip, port, max_connections));
  opened();
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

inline bool message::alloc(socket &s, std::size_t size) {
  ibmsg_buffer *b = new ibmsg_buffer();
  int rc = ibmsg_alloc_msg(b, s.handle(), size);
  if (rc != IBMSG_OK) {
    delete b;
    if (rc == IBMSG_EAGAIN) return false;
    throw error(rc);
  }
  reset();
  b_ = b;
  b_->user_data = this;
  loop_ = s.handle()->loop;
  received_ = false;
  return true;
}

inline void message::reset() noexcept {
  if (!b_) return;
  int rc = ibmsg_free_msg(b_);
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
  loop_ = nullptr;
  received_ = false;
}

inline void loop::reset() noexcept {
  if (!l_) return;
  drop_callbacks();
  int rc = ibmsg_destroy_event_loop(l_);
  if (rc == IBMSG_EBUSY && own_ev_) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(close_wait_ms);
    while (rc == IBMSG_EBUSY && closing_ > 0 && std::chrono::steady_clock::now() < deadline) {
      (void)ibmsg_dispatch_event_loop_timeout(l_, 50);
      rc = ibmsg_destroy_event_loop(l_);
    }
  }
  if (rc == IBMSG_OK) delete l_;  // otherwise leaked: the library may still point into it
  l_ = nullptr;
  pending_ = nullptr;
}

inline void loop::on_request(ibmsg_connection_request *r) noexcept {
  loop *self = from(r->loop);
  // A listener whose wrapper died is closing: leave the request undecided, so it is rejected.
  if (!self || !socket::from(r->listener) || !self->request_cb_) return;
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
  if (!self || !sock || !self->established_cb_) return;
  try {
    self->established_cb_(*sock);
  } catch (...) {
    hold(s->loop);
  }
}

inline void loop::on_received(ibmsg_socket *s, ibmsg_buffer *b) noexcept {
  message msg = message::adopt_received(b);  // freed at the end unless the callback keeps it
  loop *self = from(s->loop);
  socket *sock = socket::from(s);
  if (!self || !sock || !self->received_cb_) return;
  try {
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
    return;
  }
  socket *sock = socket::from(s);
  message *msg = message::from(b);
  if (!self || !sock || !msg || !self->sent_cb_) return;
  try {
    self->sent_cb_(*sock, *msg, status);
  } catch (...) {
    hold(s->loop);
  }
}

inline void loop::on_closed(ibmsg_socket *s, int reason) noexcept {
  ibmsg_event_loop *l = s->loop;
  loop *self = from(l);
  if (s->user_data == detail::orphan) {
    delete s;  // the library never touches it again after this callback
    if (self && self->closing_ > 0) --self->closing_;
    return;
  }
  socket *sock = socket::from(s);
  if (!sock) return;
  sock->open_ = false;
  if (!self || !self->closed_cb_) return;
  try {
    self->closed_cb_(*sock, reason);
  } catch (...) {
    hold(l);
  }
}

}  // namespace ibmsg

#endif /* IBMSG_HPP */
