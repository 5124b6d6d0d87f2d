/*
 * ibmsg.h - reliable messages over RDMA (InfiniBand, RoCE) with callbacks on one event loop.
 *
 * Devices: InfiniBand and RoCE. Not iWARP: iWARP devices deliver no immediate data, on which
 * ibmsg's flow-control credits ride; connections on an iWARP device fail with IBMSG_ENODEV.
 *
 * This header is the whole public C API of ibmsg. It compiles as C99 and as C++.
 *
 * Objects (all caller-allocated structs; the library keeps private state behind `impl`):
 *   ibmsg_event_loop          one libev loop: the RDMA CM event channel and the completion channels
 *   ibmsg_socket              a listening socket or one connection
 *   ibmsg_connection_request  an incoming connection, valid only inside the connection_request callback
 *   ibmsg_buffer              one message: a registered send buffer, or a received message
 *
 * Errors: every function that can fail returns IBMSG_OK (0) or a positive error code. Codes below
 * IBMSG_ERRNO_MAX are errno values (IBMSG_EINVAL == EINVAL ...); codes from IBMSG_EBASE up are
 * ibmsg's own. ibmsg_strerror() describes both. No function aborts, exits or throws.
 *
 * Callback contract (see ibmsg(7)):
 *   - callbacks run only inside ibmsg_dispatch_event_loop() / ibmsg_event_loop_process() / the
 *     application's own ev_run(); never inside another ibmsg call. If a call fails, no callback
 *     fires for it.
 *   - connection_established fires once per connection that becomes IBMSG_CONNECTED.
 *   - message_sent fires exactly once per successful ibmsg_post_send() or ibmsg_post_send_imm(),
 *     with IBMSG_OK or the reason the message was not delivered (for example IBMSG_ECANCELED when
 *     the connection closed while it was queued or in flight).
 *   - an operation's done callback (ibmsg_op) fires exactly once per successful one-sided call
 *     (ibmsg_rdma_write() ...), likewise; write_received once per write-with-immediate arrived.
 *   - connection_closed fires exactly once per socket that ibmsg_listen(), ibmsg_connect() or
 *     ibmsg_accept() set up successfully, after all its message_sent and done callbacks. After it returns
 *     the library never touches that ibmsg_socket again: the application may free or reuse it.
 *
 * Threading: an ibmsg_event_loop and everything created on it belong to one thread at a time:
 * the thread that runs the loop (ibmsg_dispatch_event_loop(), ibmsg_event_loop_process(), or
 * the application's ev_run()) is the only one that may call ibmsg functions on the loop, its
 * sockets, messages, regions and operations. The one exception is ibmsg_event_loop_call(),
 * which any thread may call (not a signal handler): it hands the loop's thread a function to
 * run at its next iteration, which is how other threads get work done on a loop. Different
 * loops may run in different threads. A loop may move to another thread when the application
 * makes sure that the old one is done with it (for example joins it). With IBMSG_DEBUG set in
 * the environment, a call from another thread while the loop's thread is inside the loop fails
 * and says so on stderr.
 *
 * ABI: every caller-allocated struct ends in reserved room (`reserved`), so that later minor
 * versions add fields there without changing the struct's size; programs compiled against 1.x
 * run with any later 1.y (soname libibmsg.so.1). Leave the reserved fields alone.
 */
#ifndef IBMSG_H
#define IBMSG_H

/** @file ibmsg.h
 *  The public C API of ibmsg: reliable messages over RDMA with callbacks on one event loop.
 *  See the comment at the top of this file, ibmsg(7) and the section 3 man pages. */

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/** Marks the exported functions (the library is built with -fvisibility=hidden). */
#if defined(__GNUC__) && __GNUC__ >= 4
#define IBMSG_EXPORT __attribute__((visibility("default")))
#else
#define IBMSG_EXPORT
#endif

/* ---------------------------------------------------------------------------------------------
 * Version
 * ------------------------------------------------------------------------------------------ */

#define IBMSG_VERSION_MAJOR 1 /**< major version: changes break compatibility */
#define IBMSG_VERSION_MINOR 7 /**< minor version: compatible additions */
#define IBMSG_VERSION_PATCH 0 /**< patch level: fixes only */
/** The version as one number, for compile-time checks: 10000 * major + 100 * minor + patch. */
#define IBMSG_VERSION (IBMSG_VERSION_MAJOR * 10000 + IBMSG_VERSION_MINOR * 100 + IBMSG_VERSION_PATCH)

/** Stores the version of the library that is linked (any pointer may be NULL). */
IBMSG_EXPORT void ibmsg_version(int *major, int *minor, int *patch);
/** The linked library's version as "MAJOR.MINOR.PATCH"; a static string. */
IBMSG_EXPORT const char *ibmsg_version_string(void);

/* ---------------------------------------------------------------------------------------------
 * Errors
 * ------------------------------------------------------------------------------------------ */

/** Codes below this are errno values; ibmsg's own codes start at IBMSG_EBASE.
 *
 *  Conventions: IBMSG_EINVAL for a NULL pointer, an uninitialized or destroyed handle, or a value
 *  out of its range; IBMSG_ESTATE for a valid socket in a state the call is not for: a listener
 *  given to a function for connections (sending, requests, memory and counters, regions, the
 *  peer's address: since 1.7 every such function, before some gave IBMSG_EINVAL or
 *  IBMSG_ENOTCONN), a connection given to one for listeners; IBMSG_ENOTCONN for a connection
 *  not (or no longer) connected. */
#define IBMSG_ERRNO_MAX 1000 /**< codes below this are errno values */
#define IBMSG_EBASE 1000     /**< the first of ibmsg's own codes */

/** X-macro of the errno-based codes: X(name, value, text) for each; the values are Linux's. */
#define IBMSG_ERRNO_MAP(X)                                                                        \
  X(EINVAL, 22, "invalid argument")                                                               \
  X(ENOMEM, 12, "out of memory")                                                                  \
  X(EAGAIN, 11, "resource temporarily unavailable: retry after a message_sent or done callback") \
  X(EMSGSIZE, 90, "message larger than the connection's maximum message size")                    \
  X(ENOTCONN, 107, "socket is not connected")                                                     \
  X(EBUSY, 16, "resource busy")                                                                   \
  X(ECONNREFUSED, 111, "connection refused: nothing listens at that address and port")           \
  X(ETIMEDOUT, 110, "timed out")                                                                  \
  X(EHOSTUNREACH, 113, "no RDMA route to the host")                                               \
  X(EADDRINUSE, 98, "address already in use")                                                     \
  X(EADDRNOTAVAIL, 99, "cannot use that local address")                                           \
  X(ECONNRESET, 104, "connection closed by the peer")                                             \
  X(ECANCELED, 125, "canceled: the connection closed first")                                      \
  X(ENODEV, 19, "no such RDMA device, or the device went away")                                   \
  X(EIO, 5, "RDMA transport error")                                                               \
  X(EPROTO, 71, "protocol error: the peer broke the ibmsg protocol")                             \
  X(EACCES, 13, "access not granted: the region or descriptor lacks that right")                 \
  X(EOPNOTSUPP, 95, "not supported on this connection: one-sided RDMA, immediates, atomics, requests") \
  X(ERANGE, 34, "offset and length reach outside the region or descriptor")                     \
  X(EINPROGRESS, 115, "operation in progress")                                                    \
  X(EALREADY, 114, "already done: the request has its reply")

/** X-macro of ibmsg's own codes: X(name, value, text) for each. */
#define IBMSG_ERROR_MAP(X)                                                                        \
  X(EREJECTED, 1000, "connection rejected by the peer")                                           \
  X(ESTATE, 1001, "operation not allowed in the socket's current state")                          \
  X(ENOTALLOC, 1002, "message is not allocated (already freed, or never allocated)")             \
  X(ENOADDR, 1003, "cannot resolve the host name or address")                                     \
  X(ESYS, 1004, "system or verbs call failed")                                                   \
  X(EREMOTEACCESS, 1005, "remote access error: the peer refused the key, range or right")        \
  X(EBADDESC, 1006, "not a valid remote descriptor")                                             \
  X(EDECLINED, 1007, "declined by the receiver (message_incoming)")

/** The error codes. IBMSG_OK is 0. */
enum ibmsg_error {
  IBMSG_OK = 0,
#define IBMSG__ERR_ENUM(name, value, text) IBMSG_##name = value,
  IBMSG_ERRNO_MAP(IBMSG__ERR_ENUM)
  IBMSG_ERROR_MAP(IBMSG__ERR_ENUM)
#undef IBMSG__ERR_ENUM
  IBMSG__ERROR_END
};

/** A short description of any code an ibmsg function returns or a callback gets, or of an errno
 *  value. Never NULL; a static string. */
IBMSG_EXPORT const char *ibmsg_strerror(int code);
/** The code's name ("IBMSG_EAGAIN"), or "IBMSG_UNKNOWN"; a static string. */
IBMSG_EXPORT const char *ibmsg_err_name(int code);

/* ---------------------------------------------------------------------------------------------
 * Types
 * ------------------------------------------------------------------------------------------ */

struct ev_loop;
struct ibmsg__loop;
struct ibmsg__socket;
struct ibmsg__slot;
struct ibmsg__request;
struct ibmsg__req;
struct ibmsg_options;

/** Socket status (the `status` field of ibmsg_socket). */
enum ibmsg_socket_status {
  IBMSG_UNCONNECTED,      /**< not set up, resolving the address after ibmsg_connect(), or closed
                               in an orderly way (either side disconnected) */
  IBMSG_ADDRESS_RESOLVED, /**< ibmsg_connect(): the address resolved to an RDMA device */
  IBMSG_ROUTE_RESOLVED,   /**< connecting: route known, connection request sent (or accepted) */
  IBMSG_CONNECTED,        /**< messages may be posted */
  IBMSG_DISCONNECTING,    /**< ibmsg_disconnect() was called or the peer disconnected */
  IBMSG_ERROR,            /**< closed because of an error; the closed callback says which */
  IBMSG_LISTENING         /**< ibmsg_listen() succeeded */
};

/** Message status (the `status` field of ibmsg_buffer). */
enum ibmsg_buffer_status {
  IBMSG_WAITING,     /**< allocated, or posted and not yet sent */
  IBMSG_SENT,        /**< the peer has it (the send completed successfully) */
  IBMSG_RECEIVED,    /**< a received message, lent to the application until ibmsg_free_msg() */
  IBMSG_SEND_FAILED, /**< posted but not delivered; the message_sent callback got the reason */
  IBMSG_FREED        /**< returned with ibmsg_free_msg() */
};

/** Decision on a connection request (the `status` field of ibmsg_connection_request). */
enum ibmsg_request_status {
  IBMSG_UNDECIDED, /**< neither accepted nor rejected yet: rejected when the callback returns */
  IBMSG_ACCEPTED,  /**< ibmsg_accept() succeeded */
  IBMSG_REJECTED   /**< ibmsg_reject() was called, or ibmsg_accept() failed setting up */
};

typedef struct ibmsg_event_loop ibmsg_event_loop;                 /**< see struct ibmsg_event_loop */
typedef struct ibmsg_socket ibmsg_socket;                         /**< see struct ibmsg_socket */
typedef struct ibmsg_buffer ibmsg_buffer;                         /**< see struct ibmsg_buffer */
typedef struct ibmsg_connection_request ibmsg_connection_request; /**< see its struct */
typedef struct ibmsg_incoming ibmsg_incoming;                     /**< see its struct */

/**
 * One message. For sending, the application owns this struct (it may live on the stack) and
 * ibmsg_alloc_msg() attaches a registered send buffer to it; the struct must stay at
 * the same address until ibmsg_free_msg(). For receiving, the library owns the struct and lends
 * it to the application from the message_received callback until ibmsg_free_msg().
 */
struct ibmsg_buffer {
  void *data;                      /**< ro: the payload (capacity: see ibmsg_alloc_msg) */
  size_t size;                     /**< rw: bytes to send / bytes received */
  enum ibmsg_buffer_status status; /**< ro */
  void *user_data;                 /**< rw: the application's; ibmsg never reads it */
  struct ibmsg__slot *impl;        /**< private */
  uint32_t imm;                    /**< ro: a received message's immediate (IBMSG_MSG_IMM set) */
  uint32_t flags;                  /**< ro: IBMSG_MSG_* flags of a received message */
  /** private: room for later versions (imm and flags took 8 of its bytes in 1.1) */
  void *reserved[4 - 8 / sizeof(void *)];
};

/** Flags of a received message (ibmsg_buffer.flags). */
enum ibmsg_msg_flags {
  IBMSG_MSG_IMM = 1,   /**< the sender attached an immediate (ibmsg_post_send_imm): see imm */
  IBMSG_MSG_REGION = 2, /**< data lies in the application's region (ibmsg_incoming_to_region) */
  IBMSG_MSG_REQUEST = 4 /**< a request (ibmsg_post_request): answer it with ibmsg_post_reply()
                             (since 1.5) */
};

/**
 * A message larger than the eager size (IBMSG_OPT_EAGER_SIZE) that starts to arrive, before any
 * of its data moves: see message_incoming. Valid only during that callback.
 */
struct ibmsg_incoming {
  size_t size;               /**< ro: the message's bytes */
  uint32_t imm;              /**< ro: its immediate, when flags has IBMSG_MSG_IMM */
  uint32_t flags;            /**< ro: IBMSG_MSG_IMM, IBMSG_MSG_REQUEST (a request) or 0 */
  struct ibmsg__slot *impl;  /**< private */
  /** ro: for a reply, the request it answers (its done callback follows with the reply, or
   *  with IBMSG_EDECLINED if the reply is declined); NULL for any other message (since 1.5) */
  struct ibmsg_request *request;
  void *reserved[3];         /**< private: room for later versions (request took one in 1.5) */
};

/**
 * A listening socket or a connection. The application owns the struct; ibmsg_listen(),
 * ibmsg_connect() and ibmsg_accept() initialize it (any previous content is ignored), and it must
 * stay at the same address until its connection_closed callback has returned.
 */
struct ibmsg_socket {
  enum ibmsg_socket_status status; /**< ro */
  void *user_data;                 /**< rw: the application's; ibmsg never reads it */
  ibmsg_event_loop *loop;          /**< ro: the loop the socket belongs to */
  int close_reason;                /**< ro: IBMSG_OK until closed, then the reason it closed */
  char reject_reason[132];         /**< ro: the peer's text when close_reason is IBMSG_EREJECTED */
  struct ibmsg__socket *impl;      /**< private */
  void *reserved[4];               /**< private: room for later versions */
};

/** An incoming connection. Valid only during the connection_request callback, which must call
 *  ibmsg_accept() or ibmsg_reject(); a request left undecided is rejected when the callback
 *  returns. A failed ibmsg_accept() rejects it at once (status IBMSG_REJECTED), except when it
 *  failed with IBMSG_ESTATE or IBMSG_ENOMEM before touching the request. */
struct ibmsg_connection_request {
  enum ibmsg_request_status status; /**< ro */
  ibmsg_socket *listener;           /**< ro: the listening socket the request came to */
  ibmsg_event_loop *loop;           /**< ro */
  const char *peer_address;         /**< ro: numeric address of the peer, e.g. "169.254.7.1" */
  unsigned short peer_port;         /**< ro */
  struct ibmsg__request *impl;      /**< private */
  void *reserved[4];                /**< private: room for later versions */
};

/** Called for each incoming connection on a listening socket. */
typedef void (*ibmsg_connection_request_cb)(ibmsg_connection_request *request);
/** Called once when a connection reaches IBMSG_CONNECTED. */
typedef void (*ibmsg_connection_established_cb)(ibmsg_socket *socket);
/** Called for each received message; the message is lent until ibmsg_free_msg(). */
typedef void (*ibmsg_message_received_cb)(ibmsg_socket *socket, ibmsg_buffer *msg);
/** Called exactly once per posted message: status is IBMSG_OK when the peer has it, else why
 *  not (IBMSG_EDECLINED: the receiver declined it; the connection stays up). */
typedef void (*ibmsg_message_sent_cb)(ibmsg_socket *socket, ibmsg_buffer *msg, int status);
/** Called when a message larger than the eager size starts to arrive, before its data moves
 *  (since 1.2): the callback may name where the data goes (ibmsg_incoming_to_region) or decline
 *  the message (ibmsg_incoming_decline); otherwise it goes into a buffer of the library.
 *  message_received follows once the data is there, in order with the other messages. */
typedef void (*ibmsg_message_incoming_cb)(ibmsg_socket *socket, ibmsg_incoming *in);
/** Levels of log lines (ibmsg_event_loop.log; since 1.4). */
enum ibmsg_log_level {
  IBMSG_LOG_ERROR = 1, /**< a connection closes for an error: why */
  IBMSG_LOG_WARN = 2,  /**< something may be wrong: e.g. a keepalive probe went unanswered */
  IBMSG_LOG_INFO = 3,  /**< connections established and closed */
  IBMSG_LOG_DEBUG = 4  /**< CM events, state changes, credit stalls, keepalive probes */
};
/** Called for each log line of the loop and its sockets (socket NULL for the loop's own); text
 *  is valid during the call only, without a trailing newline. The environment variable
 *  IBMSG_DEBUG (1..4, the highest level printed) prints the same lines to stderr. */
typedef void (*ibmsg_log_cb)(ibmsg_event_loop *loop, ibmsg_socket *socket, int level,
                             const char *text);
/** Called when the peer's ibmsg_rdma_write_imm() completed here: its length bytes are written and
 *  visible in the local region it targeted, imm is its immediate. */
typedef void (*ibmsg_write_received_cb)(ibmsg_socket *socket, uint32_t imm, size_t length);
/** Called exactly once when a socket has closed; reason is IBMSG_OK after ibmsg_disconnect(),
 *  IBMSG_ECONNRESET when the peer disconnected, otherwise the error that closed it. */
typedef void (*ibmsg_connection_closed_cb)(ibmsg_socket *socket, int reason);

/**
 * The event loop. The application owns the struct and sets the callbacks and user_data after
 * ibmsg_init_event_loop(), which sets them all to NULL (no callback).
 */
struct ibmsg_event_loop {
  ibmsg_connection_request_cb connection_request;         /**< rw */
  ibmsg_connection_established_cb connection_established; /**< rw */
  ibmsg_message_received_cb message_received;             /**< rw; NULL: messages are freed unread */
  ibmsg_message_sent_cb message_sent;                     /**< rw */
  ibmsg_connection_closed_cb connection_closed;           /**< rw */
  void *user_data;                                        /**< rw: the application's */
  struct ibmsg__loop *impl;                               /**< private */
  ibmsg_write_received_cb write_received;                 /**< rw; NULL: write-immediates are not reported */
  ibmsg_message_incoming_cb message_incoming;             /**< rw; NULL: library buffers (1.2) */
  ibmsg_log_cb log;                                       /**< rw; NULL: no log lines (1.4) */
  void *reserved[1];                                      /**< private: room for later versions */
};

/* ---------------------------------------------------------------------------------------------
 * Event loop
 * ------------------------------------------------------------------------------------------ */

/** Initializes a loop with its own libev loop (epoll backend). */
IBMSG_EXPORT int ibmsg_init_event_loop(ibmsg_event_loop *loop);
/** Initializes a loop whose watchers run on the application's libev loop `ev`; the application
 *  runs `ev` itself (ev_run) and keeps it alive until ibmsg_destroy_event_loop(). */
IBMSG_EXPORT int ibmsg_init_event_loop_ev(ibmsg_event_loop *loop, struct ev_loop *ev);
/** Frees the loop. Fails with IBMSG_EBUSY while a socket is open (not yet closed), a message
 *  is still allocated or lent, a region is registered, a call posted with
 *  ibmsg_event_loop_call() has not run yet, or when called from one of the loop's callbacks;
 *  then nothing is freed. */
IBMSG_EXPORT int ibmsg_destroy_event_loop(ibmsg_event_loop *loop);
/** Waits for at least one event, processes all that are ready (running callbacks), returns.
 *  IBMSG_EBUSY when called from one of the loop's own callbacks (the loop does not nest). */
IBMSG_EXPORT int ibmsg_dispatch_event_loop(ibmsg_event_loop *loop);
/** Like ibmsg_dispatch_event_loop() but waits at most timeout_ms (0: do not wait). */
IBMSG_EXPORT int ibmsg_dispatch_event_loop_timeout(ibmsg_event_loop *loop, int timeout_ms);

/** For driving ibmsg from another event loop: an fd that becomes readable when ibmsg has work.
 *  Watch it for input and call ibmsg_event_loop_process() when it is readable, and also after
 *  ibmsg_event_loop_timeout() milliseconds. Returns the fd, or -1 if loop is invalid. */
IBMSG_EXPORT int ibmsg_event_loop_fd(ibmsg_event_loop *loop);
/** A function ibmsg_event_loop_call() hands to a loop's thread. */
typedef void (*ibmsg_call_fn)(void *arg);
/** Runs fn(arg) on the loop's thread at the loop's next iteration (since 1.7). The one ibmsg
 *  function that any thread may call, also the loop's own thread and its callbacks (not a
 *  signal handler). Calls run in the order they were posted, each once, like a callback: fn may
 *  call any ibmsg function on the loop (but not dispatch or destroy it); a call fn posts runs at
 *  the next iteration. A sleeping loop wakes up for it, also one driven through
 *  ibmsg_event_loop_fd(). IBMSG_EINVAL if loop is not initialized or fn is NULL, IBMSG_ENOMEM.
 *  ibmsg_destroy_event_loop() fails with IBMSG_EBUSY while calls wait: stop the other threads
 *  posting, dispatch once more, then destroy; posting to a destroyed loop is undefined. */
IBMSG_EXPORT int ibmsg_event_loop_call(ibmsg_event_loop *loop, ibmsg_call_fn fn, void *arg);
/** Processes everything that is ready without waiting (running callbacks). */
IBMSG_EXPORT int ibmsg_event_loop_process(ibmsg_event_loop *loop);
/** Milliseconds until ibmsg_event_loop_process() must run again even if the fd stays quiet
 *  (0: at once, e.g. while a connection busy-polls (IBMSG_OPT_BUSY_POLL); -1: not until the fd
 *  is readable, or loop is invalid: ibmsg_event_loop_next_timeout() tells the two apart). */
IBMSG_EXPORT int ibmsg_event_loop_timeout(ibmsg_event_loop *loop);
/** Stores in *timeout_ms what ibmsg_event_loop_timeout() returns (-1: no timeout, not until the
 *  fd is readable) and returns IBMSG_OK; IBMSG_EINVAL for an invalid loop or NULL timeout_ms
 *  (since 1.7). */
IBMSG_EXPORT int ibmsg_event_loop_next_timeout(ibmsg_event_loop *loop, int *timeout_ms);

/* ---------------------------------------------------------------------------------------------
 * Options: loop-wide defaults for sockets set up afterwards, and option sets for one socket
 * ------------------------------------------------------------------------------------------ */

/** Options for ibmsg_setopt() and ibmsg_getopt(); the defaults are in parentheses. */
enum ibmsg_option {
  IBMSG_OPT_RECV_DEPTH = 1,      /**< int: the most data credits a peer gets (32): receive
                                      buffers per connection, or with IBMSG_OPT_SHARED_RECV its
                                      most from the shared ones; credits return as the
                                      application frees received messages, at the latest when
                                      half of them are owed */
  IBMSG_OPT_SEND_DEPTH = 2,      /**< int: send buffers per connection for ibmsg_alloc_msg (32) */
  IBMSG_OPT_SEND_QUEUE = 3,      /**< int: posted messages and operations queued waiting for credits
                                      or room in flight (32) */
  IBMSG_OPT_MAX_MSG_SIZE = 4,    /**< int, or uint64_t (len 8) for sizes beyond INT_MAX: largest
                                      message in bytes either way, 1 .. 2^32 - 1 (2^32 - 1);
                                      those above IBMSG_OPT_EAGER_SIZE go by rendezvous (1.2).
                                      ibmsg_getopt into an int says at most INT_MAX */
  IBMSG_OPT_CONNECT_TIMEOUT = 5, /**< int: ms for ibmsg_connect() or ibmsg_accept() to reach CONNECTED (5000);
                                      a connect that waits for its turn (IBMSG_OPT_CONNECT_LIMIT)
                                      counts from the start of its attempt */
  IBMSG_OPT_RNR_RETRY = 6,       /**< int 0..7: RNR retries (7); credits make RNR impossible */
  IBMSG_OPT_SOURCE_ADDR = 7,     /**< string: local address ibmsg_connect() binds to ("": any) */
  IBMSG_OPT_DEVICE = 8,          /**< string: RDMA device connections must use, e.g. "rxe0" ("": any) */
  IBMSG_OPT_RDMA = 9,            /**< int 0/1: one-sided RDMA on the connection (1). With 0 the
                                      hello offers none: operations on it fail with
                                      IBMSG_EOPNOTSUPP on both sides, no descriptor is made for
                                      it. With IBMSG_OPT_MAX_MSG_SIZE at most the eager size it
                                      serves no RDMA reads or atomics; otherwise its peer reads
                                      its rendezvous messages, so its queue pair takes reads and
                                      atomics that carry a valid device-wide key
                                      (IBMSG_ACCESS_DEVICE_WIDE) of the device's other
                                      connections (and takes such RDMA writes either way) */
  IBMSG_OPT_RDMA_DEPTH = 10,     /**< int: one-sided operations in flight per connection (16);
                                      more wait in the send queue (IBMSG_OPT_SEND_QUEUE) */
  IBMSG_OPT_BUSY_POLL = 11,      /**< int: busy polling of the connection's completions (0):
                                      0 sleeps until the device signals (events); N > 0 keeps
                                      polling for N microseconds after the connection's last
                                      activity, then sleeps (adaptive); IBMSG_BUSY_POLL_ALWAYS
                                      never sleeps (a dedicated core) */
  IBMSG_OPT_EAGER_SIZE = 12,     /**< int: largest message sent eagerly, through registered
                                      receive buffers (16384 since 1.3, 65536 in 1.2); larger ones
                                      go by rendezvous: the receiver reads them into a buffer of
                                      its own (since 1.2; a 1.1 peer takes eager messages only) */
  IBMSG_OPT_SHARED_RECV = 13,    /**< int 0/1: receive buffers shared by the connections of a
                                      device (1, since 1.3): each connection holds a base of 2
                                      data credits and control buffers, and up to
                                      IBMSG_OPT_RECV_DEPTH credits while its peer has more to
                                      send; 0: IBMSG_OPT_RECV_DEPTH buffers of its own */
  IBMSG_OPT_KEEPALIVE = 14,      /**< int: ms a connection may hear nothing from its peer before
                                      it sends a keepalive probe, and between probes (10000,
                                      since 1.4); 0 turns keepalive off. See ibmsg(7), FAILURES */
  IBMSG_OPT_KEEPALIVE_COUNT = 15, /**< int 2..255: after this many keepalive intervals without
                                      a word from the peer the connection closes with
                                      IBMSG_ETIMEDOUT (3: a dead peer is noticed in 30 s) */
  IBMSG_OPT_ACK_TIMEOUT = 16,    /**< int 0..31: the transport's wait for an acknowledgement
                                      before it resends, 4.096 us * 2^value (18: ~1.07 s); 0:
                                      the connection manager's default */
  IBMSG_OPT_RETRY_COUNT = 17,    /**< int 0..7: resends before the transport gives up and the
                                      connection closes with IBMSG_ETIMEDOUT (7) */
  IBMSG_OPT_REQUEST_WINDOW = 18, /**< int ms (10000), loop-wide: how long a request that got no
                                      reply may be retried (ibmsg_retry_request), and how long a
                                      responder keeps the identity and reply of a request it
                                      answered, to answer a retry without running it again (1.5) */
  IBMSG_OPT_REPLY_CACHE = 19,    /**< int bytes (1048576), loop-wide: the most reply bytes a
                                      responder keeps for retries; a reply beyond it is not kept
                                      and a retry of its request gets no answer (1.5) */
  IBMSG_OPT_RNDV_MEMORY = 20,    /**< int, or uint64_t (len 8), bytes (536870912: 512 MiB),
                                      loop-wide: the most bytes of library-allocated destinations
                                      of large (rendezvous) messages at once, from the start of
                                      their reads until ibmsg_free_msg; more wait their turn, in
                                      order. A message larger than this is declined unless
                                      message_incoming puts it in a region (1.6) */
  IBMSG_OPT_VIOLATION_BAN = 21,  /**< int ms (10000), listener: after a peer made an invalid
                                      remote access, connection requests from its address are
                                      rejected for this long (0: never) (1.6) */
  IBMSG_OPT_CONNECT_LIMIT = 22,  /**< int (16), loop-wide: the most ibmsg_connect() attempts of
                                      the loop under way at once, from the address resolution
                                      to CONNECTED or the close; later ones wait their turn in
                                      order (IBMSG_UNCONNECTED, as while the address of one is
                                      resolved), and their IBMSG_OPT_CONNECT_TIMEOUT
                                      counts from the start of their attempt (1.7) */
  IBMSG_OPT_SHARED_RECV_BUDGET = 23 /**< int, or uint64_t (len 8), bytes (33554432: 32 MiB;
                                      0: none), loop-wide: about what the idle connections of a
                                      device on shared
                                      receive buffers reserve in all, for many connections. A
                                      new connection whose reservation (6 buffers of its eager
                                      size, per connection of the device) would pass it gets
                                      half the eager size, and so on down to 1024 bytes;
                                      larger messages, requests and replies among them, go by
                                      rendezvous. Only a connection that offers rendezvous
                                      (IBMSG_OPT_MAX_MSG_SIZE above the eager size), and not
                                      one accepted from a peer without it (1.7) */
};

/** IBMSG_OPT_BUSY_POLL value: poll without ever sleeping while the connection is open. */
#define IBMSG_BUSY_POLL_ALWAYS (-1)

/** Sets an option: int options take a pointer to int and sizeof(int); string options a char
 *  array and its length (no terminator needed). IBMSG_EINVAL for an unknown option, a wrong
 *  length or a value out of range. */
IBMSG_EXPORT int ibmsg_setopt(ibmsg_event_loop *loop, int option, const void *value, size_t len);
/** Reads an option; *len is the buffer size on entry and the value's size on return (strings
 *  are NUL-terminated when the buffer has room). */
IBMSG_EXPORT int ibmsg_getopt(ibmsg_event_loop *loop, int option, void *value, size_t *len);

/** A set of option values for one socket, passed to ibmsg_listen_opts(), ibmsg_connect_opts()
 *  or ibmsg_accept_opts(). Opaque; the socket copies it, so it may be freed or changed at once. */
typedef struct ibmsg_options ibmsg_options;
/** A new option set holding the loop's current defaults (the built-in defaults if loop is NULL).
 *  NULL if out of memory or loop is not a valid loop. Free it with ibmsg_options_free(). */
IBMSG_EXPORT ibmsg_options *ibmsg_options_new(ibmsg_event_loop *loop);
/** Frees an option set (NULL is ignored). */
IBMSG_EXPORT void ibmsg_options_free(ibmsg_options *opts);
/** Like ibmsg_setopt() on an option set. */
IBMSG_EXPORT int ibmsg_options_set(ibmsg_options *opts, int option, const void *value, size_t len);
/** Like ibmsg_getopt() on an option set. */
IBMSG_EXPORT int ibmsg_options_get(const ibmsg_options *opts, int option, void *value, size_t *len);

/* ---------------------------------------------------------------------------------------------
 * Sockets
 * ------------------------------------------------------------------------------------------ */

/** Listens on ip (IPv4, IPv6 or host name; NULL or "" for all addresses) and port (0: any free
 *  port, see ibmsg_socket_local_address()). At most max_connections accepted connections from this
 *  listener are open at once (requests beyond that are rejected). Closed with ibmsg_disconnect().
 *  IBMSG_ESTATE if socket is still an open socket (its connection_closed has not run yet). */
IBMSG_EXPORT int ibmsg_listen(ibmsg_event_loop *loop, ibmsg_socket *socket, const char *ip,
                              unsigned short port, int max_connections);
/** ibmsg_listen() with the options in opts (NULL: the loop's) instead of the loop's defaults; the
 *  connections the listener accepts take the listener's options unless ibmsg_accept_opts() says
 *  otherwise. */
IBMSG_EXPORT int ibmsg_listen_opts(ibmsg_event_loop *loop, ibmsg_socket *socket, const char *ip,
                                   unsigned short port, int max_connections,
                                   const ibmsg_options *opts);
/** Starts connecting to ip (IPv4, IPv6 or host name) and port. Returns at once; the socket goes
 *  through ADDRESS_RESOLVED and ROUTE_RESOLVED to CONNECTED (connection_established), or to
 *  ERROR (connection_closed with the reason) within IBMSG_OPT_CONNECT_TIMEOUT. IBMSG_ESTATE if
 *  socket is still an open socket. */
IBMSG_EXPORT int ibmsg_connect(ibmsg_event_loop *loop, ibmsg_socket *socket, const char *ip,
                               unsigned short port);
/** ibmsg_connect() with the options in opts (NULL: the loop's). */
IBMSG_EXPORT int ibmsg_connect_opts(ibmsg_event_loop *loop, ibmsg_socket *socket, const char *ip,
                                    unsigned short port, const ibmsg_options *opts);
/** Accepts a request inside the connection_request callback; socket becomes the connection
 *  (status IBMSG_ROUTE_RESOLVED, then IBMSG_CONNECTED with connection_established).
 *  IBMSG_ECONNRESET if the peer went away before it could be accepted; IBMSG_ESTATE if socket is
 *  still an open socket or the request was decided already. */
IBMSG_EXPORT int ibmsg_accept(ibmsg_connection_request *request, ibmsg_socket *socket);
/** ibmsg_accept() with the options in opts (NULL: the listener's) for the new connection. */
IBMSG_EXPORT int ibmsg_accept_opts(ibmsg_connection_request *request, ibmsg_socket *socket,
                                   const ibmsg_options *opts);
/** Accepts a request inside the connection_request callback onto another loop (since 1.7), whose
 *  thread may be another thread: the connection then lives entirely on that loop (its CM events,
 *  completions, timers and callbacks are that loop's) and socket belongs to that loop's thread
 *  from the call on. The accept itself (queue pair, buffers, the answer to the peer) is done by
 *  that loop at its next iteration, through ibmsg_event_loop_call(); a failure there reaches that
 *  loop's connection_closed with the reason, as a failed ibmsg_connect() does. With loop NULL or
 *  the listener's own loop it is ibmsg_accept_opts(). Connections accepted onto other loops count
 *  towards the listener's max_connections. opts NULL: the listener's options. socket must stay
 *  at its address, and is reached only from loop's thread (its callbacks, or a call posted to it
 *  after this one, which runs after the accept there). IBMSG_EINVAL for an invalid loop;
 *  IBMSG_ESTATE as ibmsg_accept(), also for a socket handed to a loop that has not set it up
 *  yet; IBMSG_ENOMEM or IBMSG_ESYS if the request could not be handed over (the request stays
 *  undecided: it may still be accepted here or rejected; in the rare case that it cannot be taken
 *  back from the other loop's channel either, it is rejected: status IBMSG_REJECTED). */
IBMSG_EXPORT int ibmsg_accept_on(ibmsg_connection_request *request, ibmsg_event_loop *loop,
                                 ibmsg_socket *socket, const ibmsg_options *opts);
/** Spreads a listener's connections over loops (since 1.7): from now on ibmsg_accept() and
 *  ibmsg_accept_opts() on its requests accept each onto the next of the count loops in turn
 *  (round robin), as ibmsg_accept_on() would; the listener's own loop may be one of them.
 *  ibmsg_accept_on() still accepts where it says. The array is copied; count 0 (loops NULL) ends
 *  the spreading. The loops must outlive the listener's connections on them. Call it on the
 *  listener's thread. IBMSG_ESTATE for a socket that is not a listener; IBMSG_EINVAL for a
 *  negative count or count above 64, or an invalid loop; IBMSG_ENOMEM. */
IBMSG_EXPORT int ibmsg_listen_spread(ibmsg_socket *listener, ibmsg_event_loop *const *loops,
                                     int count);
/** Rejects a request inside the connection_request callback. The peer's socket closes with
 *  IBMSG_EREJECTED and reason (at most 128 bytes, may be NULL) in its reject_reason field. */
IBMSG_EXPORT int ibmsg_reject(ibmsg_connection_request *request, const char *reason);
/** Closes a socket: a listener stops listening, a connection disconnects (messages still queued
 *  or in flight get message_sent with IBMSG_ECANCELED), a connect in progress stops. The
 *  connection_closed callback follows from the loop. IBMSG_ESTATE if already closing;
 *  IBMSG_ENOTCONN once closed, including inside the socket's own connection_closed callback. */
IBMSG_EXPORT int ibmsg_disconnect(ibmsg_socket *socket);
/** Writes the socket's local address (numeric) into buf and its port into *port (either may be
 *  NULL). For a listener bound to port 0, this is the port picked. */
IBMSG_EXPORT int ibmsg_socket_local_address(const ibmsg_socket *socket, char *buf, size_t len,
                                            unsigned short *port);
/** Like ibmsg_socket_local_address() for the peer of a connection. IBMSG_ESTATE for a listener
 *  (since 1.7; IBMSG_ENOTCONN before), IBMSG_ENOTCONN for a closed socket. */
IBMSG_EXPORT int ibmsg_socket_peer_address(const ibmsg_socket *socket, char *buf, size_t len,
                                           unsigned short *port);
/** The name of the RDMA device the socket uses ("rxe0"), or NULL if none yet. */
IBMSG_EXPORT const char *ibmsg_socket_device(const ibmsg_socket *socket);
/** The largest message this connection can send: the smaller of both sides' maximum once the
 *  peer's hello is known (accepted, or CONNECTED), this side's maximum before; 0 for a listener
 *  or a closed socket. */
IBMSG_EXPORT size_t ibmsg_socket_max_msg_size(const ibmsg_socket *socket);

/** Memory a connection or a loop uses, in bytes of registered memory (ibmsg_socket_memory,
 *  ibmsg_loop_memory; since 1.2). See ibmsg(7), OPTIONS AND MEMORY. */
typedef struct ibmsg_memory {
  size_t buffers;     /**< eager send buffers and receive buffers of its own (a connection: those
                           it holds; a loop: all send slabs and receive buffers of its own) */
  size_t shared;      /**< receive buffers shared by a device's connections (a connection:
                           those reserved for its peer's messages or holding them; a loop: all,
                           and the free large buffers its devices keep for reuse) */
  size_t large;       /**< large buffers of rendezvous messages, in use now */
  size_t reserved[5]; /**< zero: room for later versions */
} ibmsg_memory;
/** What the connection costs now, copied into out, at most size bytes (sizeof(ibmsg_memory);
 *  since 1.7, with the size as ibmsg_socket_stats() takes it, so that a later, larger struct
 *  does not overrun an older caller's). IBMSG_EINVAL for a closed socket or NULL out;
 *  IBMSG_ESTATE for a listener. */
IBMSG_EXPORT int ibmsg_socket_memory_info(const ibmsg_socket *socket, ibmsg_memory *out,
                                          size_t size);
/** ibmsg_socket_memory_info() with size sizeof(ibmsg_memory) as this header has it (since
 *  1.2). IBMSG_ESTATE for a listener (since 1.7; IBMSG_EINVAL before). */
IBMSG_EXPORT int ibmsg_socket_memory(const ibmsg_socket *socket, ibmsg_memory *out);
/** A connection's counters (ibmsg_socket_stats(); since 1.4). */
typedef struct ibmsg_stats {
  uint64_t msgs_sent;           /**< messages the peer has (message_sent with IBMSG_OK) */
  uint64_t bytes_sent;          /**< their payload bytes */
  uint64_t msgs_received;       /**< messages delivered to message_received */
  uint64_t bytes_received;      /**< their payload bytes */
  uint64_t credit_stalls;       /**< times sending stopped for want of the peer's credits */
  uint64_t keepalives_sent;     /**< keepalive probes sent (the peer was silent) */
  uint64_t keepalives_received; /**< probes of the peer, each answered */
  uint64_t keepalive_misses;    /**< intervals a probe went unanswered, and the close */
  uint64_t requests_timed_out;  /**< requests whose done got IBMSG_ETIMEDOUT (1.5) */
  uint64_t replies_dropped;     /**< replies that came for no posted request: late (1.5) */
  uint64_t replies_resent;      /**< kept replies sent again for a retried request (1.5) */
  uint64_t reserved[5];         /**< zero: room for later versions */
} ibmsg_stats;
/** Copies the connection's counters into out, at most size bytes (sizeof(ibmsg_stats)):
 *  for an open connection, and in the connection_closed callback for the closing one.
 *  IBMSG_ESTATE for a listener (since 1.7; IBMSG_EINVAL before); IBMSG_EINVAL otherwise, or
 *  if out is NULL. */
IBMSG_EXPORT int ibmsg_socket_stats(const ibmsg_socket *socket, ibmsg_stats *out,
                                    size_t size);
/** What the loop's connections and devices cost now, including buffers of closed connections
 *  the application still holds, copied into out, at most size bytes (sizeof(ibmsg_memory);
 *  since 1.7). IBMSG_EINVAL for an invalid loop or NULL out. */
IBMSG_EXPORT int ibmsg_loop_memory_info(ibmsg_event_loop *loop, ibmsg_memory *out, size_t size);
/** ibmsg_loop_memory_info() with size sizeof(ibmsg_memory) as this header has it (since 1.2). */
IBMSG_EXPORT int ibmsg_loop_memory(ibmsg_event_loop *loop, ibmsg_memory *out);
/** A loop's counters (ibmsg_loop_stats(); since 1.6). */
typedef struct ibmsg_loop_counters {
  uint64_t remote_access_violations; /**< connections of the loop closed because their peer made
                                          a remote access this side refused (a key, range or
                                          right not granted on that connection) */
  uint64_t requests_banned;          /**< connection requests listeners refused for
                                          IBMSG_OPT_VIOLATION_BAN */
  uint64_t reserved[6];              /**< zero: room for later versions */
} ibmsg_loop_counters;
/** Copies the loop's counters into out, at most size bytes (sizeof(ibmsg_loop_counters); since
 *  1.6). IBMSG_EINVAL if loop is not an initialized loop or out is NULL. */
IBMSG_EXPORT int ibmsg_loop_stats(ibmsg_event_loop *loop, ibmsg_loop_counters *out, size_t size);

/* ---------------------------------------------------------------------------------------------
 * Messages
 * ------------------------------------------------------------------------------------------ */

/** Takes a send buffer (a registered slot of the device's, since 1.3): msg->data points at room
 *  for the larger of size and the eager size (IBMSG_OPT_EAGER_SIZE; above it, a large buffer of
 *  its own), msg->size = size, msg->status = IBMSG_WAITING; msg->size may change up to that room
 *  before posting. IBMSG_EMSGSIZE if size is larger than the maximum, IBMSG_EAGAIN when the
 *  socket holds IBMSG_OPT_SEND_DEPTH messages already, IBMSG_ENOMEM or IBMSG_ESYS if no more
 *  buffers could be registered, IBMSG_ENOTCONN
 *  before the socket has its buffers (they exist from ROUTE_RESOLVED on: connecting once the
 *  route is known, or accepted) or after it closed, IBMSG_ESTATE on a listening socket. */
IBMSG_EXPORT int ibmsg_alloc_msg(ibmsg_buffer *msg, ibmsg_socket *socket, size_t size);
/** Sends msg->size bytes of msg->data. On success the library owns the message until its
 *  message_sent callback; then the application may post it again or free it. (A message
 *  allocated while connecting whose size is above the peer's smaller eager size moves to a
 *  large buffer here: msg->data changes.) Messages are
 *  delivered in order. Without credits the message is queued; IBMSG_EAGAIN when the queue holds
 *  IBMSG_OPT_SEND_QUEUE messages and operations already (nothing was sent: retry after a
 *  message_sent or done callback).
 *  IBMSG_EIO if the transport refused it: the message stays the application's and the
 *  connection closes. */
IBMSG_EXPORT int ibmsg_post_send(ibmsg_socket *socket, ibmsg_buffer *msg);
/** ibmsg_post_send() with a 32-bit immediate the receiver finds in msg->imm (with IBMSG_MSG_IMM
 *  in msg->flags). IBMSG_EOPNOTSUPP if the peer's ibmsg does not take immediates on messages. */
IBMSG_EXPORT int ibmsg_post_send_imm(ibmsg_socket *socket, ibmsg_buffer *msg, uint32_t imm);
/** Returns a message to its pool: a send buffer that is not queued or in flight (IBMSG_EBUSY
 *  otherwise), or a received message (its buffer goes back to the peer as a credit). A message
 *  in a region leaves the region's bytes alone (they are the application's). */
IBMSG_EXPORT int ibmsg_free_msg(ibmsg_buffer *msg);

/* ---------------------------------------------------------------------------------------------
 * One-sided RDMA: memory regions, remote descriptors, operations (see ibmsg(7), ONE-SIDED RDMA)
 * ------------------------------------------------------------------------------------------ */

/** Access rights of a memory region (ibmsg_register_region), an OR of these. Local reads (the
 *  source of a write, of a message) need no flag. */
enum ibmsg_access {
  IBMSG_ACCESS_LOCAL_WRITE = 1,  /**< the region may receive: the destination of ibmsg_rdma_read()
                                      and of an atomic's result */
  IBMSG_ACCESS_REMOTE_READ = 2,  /**< descriptors of the region may let a peer read it */
  IBMSG_ACCESS_REMOTE_WRITE = 4, /**< ... write it (implies IBMSG_ACCESS_LOCAL_WRITE) */
  IBMSG_ACCESS_REMOTE_ATOMIC = 8, /**< ... do atomics on it (implies IBMSG_ACCESS_LOCAL_WRITE) */
  /** ibmsg_region_descriptor() only (since 1.6): a grant any connection of the socket's device
   *  may use, not that connection's alone. Risk: any peer connected to this device, by any
   *  socket of the process, that learns or guesses the key can use it (keys are guessable on
   *  some devices: rxe's have 8 random bits) */
  IBMSG_ACCESS_DEVICE_WIDE = 16
};

/**
 * Application memory registered on a loop for one-sided RDMA. The application owns the struct;
 * ibmsg_register_region() or ibmsg_alloc_region() initializes it, and it must stay at the same
 * address until ibmsg_deregister_region(). The region works on every connection of every loop of
 * the process (since 1.7; before, of its own loop only): it is registered once per RDMA device,
 * whose protection domain the loops on it share, on the devices its loop has open when it is
 * registered and lazily on a device a connection of any loop uses later.
 *
 * Threads: ibmsg_deregister_region() on the thread of the region's own loop; a descriptor is made
 * and revoked on the thread of the loop of the connection it is granted on; messages and
 * operations with the region from the thread of the loop of their connection, any loop. The
 * application keeps other threads from using the region once it deregisters it.
 */
typedef struct ibmsg_region {
  void *addr;                  /**< ro: the first byte */
  size_t length;               /**< ro: bytes */
  unsigned access;             /**< ro: IBMSG_ACCESS_* flags */
  void *user_data;             /**< rw: the application's */
  struct ibmsg__region *impl;  /**< private */
  uintptr_t check;             /**< private */
  void *reserved[4];           /**< private: room for later versions */
} ibmsg_region;

/** Makes msg a message of size bytes at offset in region (since 1.2): ibmsg_post_send() sends
 *  them from there without a copy, at any size (above the eager size the peer reads them, with a
 *  registration of exactly those bytes that ends at message_sent). The bytes must not change
 *  from posting until message_sent; msg->data points at them and msg->size may change as long
 *  as the message stays inside the region (else posting fails with IBMSG_ERANGE). The region
 *  stays busy (ibmsg_deregister_region fails with IBMSG_EBUSY) until ibmsg_free_msg().
 *  The region may be of another loop (since 1.7; before, IBMSG_EINVAL), on socket's loop thread.
 *  Codes as ibmsg_alloc_msg() (IBMSG_ESTATE for a listener; IBMSG_EINVAL before 1.7), and
 *  IBMSG_ERANGE if the bytes reach outside the region. */
IBMSG_EXPORT int ibmsg_msg_from_region(ibmsg_buffer *msg, ibmsg_socket *socket,
                                       ibmsg_region *region, size_t offset, size_t size);
/** From message_incoming: the message's in->size bytes go to region at offset (since 1.2). The
 *  message_received that follows has msg->data there and IBMSG_MSG_REGION in msg->flags; the
 *  region is busy until that message is freed. IBMSG_ERANGE if they do not fit (nothing is
 *  written; the message goes to a library buffer unless the callback chooses again or declines),
 *  IBMSG_EACCES without IBMSG_ACCESS_LOCAL_WRITE, IBMSG_EINVAL outside the callback, IBMSG_ESTATE
 *  once decided; IBMSG_ENOMEM or IBMSG_ESYS if the region cannot be registered on the
 *  connection's device. The region may be of another loop (since 1.7; before, IBMSG_EINVAL). */
IBMSG_EXPORT int ibmsg_incoming_to_region(ibmsg_incoming *in, ibmsg_region *region, size_t offset);
/** From message_incoming: the message is not received; the sender's message_sent gets
 *  IBMSG_EDECLINED and the connection stays up (since 1.2). IBMSG_EINVAL outside the callback,
 *  IBMSG_ESTATE once decided. */
IBMSG_EXPORT int ibmsg_incoming_decline(ibmsg_incoming *in);

/** Bytes of a remote descriptor. */
#define IBMSG_DESCRIPTOR_SIZE 32

/**
 * A remote descriptor: what a peer needs to reach length bytes of a region (address, length,
 * key, rights, a check), in a fixed little-endian layout that the application copies into a
 * message as it is. It grants exactly the bytes it describes, on one connection's device, until
 * it is revoked, its connection closes or its region is deregistered.
 */
typedef struct ibmsg_descriptor {
  unsigned char bytes[IBMSG_DESCRIPTOR_SIZE]; /**< opaque; copy as a whole */
} ibmsg_descriptor;

/** Registers length bytes at addr on loop with the IBMSG_ACCESS_* rights in access: for the
 *  connections of every loop of the process (see ibmsg_region for the threads). IBMSG_EINVAL
 *  for NULL, length 0 or unknown flags; IBMSG_ESTATE if region is registered already;
 *  IBMSG_ENOMEM, or IBMSG_ESYS if a device the loop has open refuses the memory (e.g. read-only
 *  pages with a write right). */
IBMSG_EXPORT int ibmsg_register_region(ibmsg_event_loop *loop, ibmsg_region *region, void *addr,
                                       size_t length, unsigned access);
/** Allocates length bytes (page-aligned, zeroed) and registers them like
 *  ibmsg_register_region(); ibmsg_deregister_region() frees them. IBMSG_ENOMEM if out of
 *  memory. */
IBMSG_EXPORT int ibmsg_alloc_region(ibmsg_event_loop *loop, ibmsg_region *region, size_t length,
                                    unsigned access);
/** Deregisters a region (and frees it if ibmsg_alloc_region() made it); every descriptor of it
 *  stops working. On the thread of the region's loop, while no other thread uses the region.
 *  IBMSG_EBUSY (nothing changes) while one of this side's operations or messages on it, of any
 *  loop's connection, is queued or in flight, while a descriptor of it is still being bound to
 *  its connection (until that loop's next round; since 1.6), or while a descriptor of it granted
 *  to the peer of a connection of another loop is in force (since 1.7: that loop's thread
 *  revokes it, or its connection closes; a device-wide descriptor, bound to no connection, goes
 *  with the region from any loop); IBMSG_EINVAL if it is not a registered region. */
IBMSG_EXPORT int ibmsg_deregister_region(ibmsg_region *region);

/** Makes a descriptor granting the rights in access (IBMSG_ACCESS_REMOTE_*, a subset of the
 *  region's) on exactly the bytes [offset, offset + length) of region, to the peer of the
 *  connection socket only (since 1.6: a memory window bound to its queue pair; a peer on another
 *  connection that uses its key fails with a remote access error, a violation). socket may be of
 *  any loop (since 1.7; before, of the region's loop only); call it on socket's loop thread. A
 *  message posted on socket after the call reaches the peer after the grant is in force; made
 *  before socket is established, it is in force from then. With IBMSG_ACCESS_DEVICE_WIDE in
 *  access the grant is for every connection on socket's device instead, of any loop of the
 *  process (since 1.7; they share the device's protection domain; see its risk there). The range
 *  is registered on its own, so a peer can reach no byte outside it; asking again for the same
 *  range, rights and connection (device, for a device-wide grant) gives the same descriptor.
 *  The connection's close revokes its grants. IBMSG_ERANGE outside the region; IBMSG_EINVAL for
 *  length 0, NULL, no rights or flags that are not remote rights or IBMSG_ACCESS_DEVICE_WIDE;
 *  IBMSG_ESTATE for a listener (since 1.7; IBMSG_EINVAL before); IBMSG_EACCES for rights the
 *  region lacks;
 *  IBMSG_ENOTCONN if socket has no device yet (before ROUTE_RESOLVED) or is closing;
 *  IBMSG_EOPNOTSUPP if socket has IBMSG_OPT_RDMA 0, or its device has no type-2 memory windows
 *  and IBMSG_ACCESS_DEVICE_WIDE is not asked for; IBMSG_EAGAIN while 8 grants of the connection
 *  are being bound (run the loop, then ask again); IBMSG_ENOMEM or IBMSG_ESYS if the
 *  registration fails. */
IBMSG_EXPORT int ibmsg_region_descriptor(ibmsg_region *region, ibmsg_socket *socket, size_t offset,
                                         size_t length, unsigned access, ibmsg_descriptor *out);
/** Revokes a descriptor made by ibmsg_region_descriptor() on region, on the thread of the loop
 *  of the connection it was granted on: the peer's next operation on it fails with a remote
 *  access error (which closes that connection). Operations of the
 *  peer already executing may still complete; a grant revoked while it is still being bound
 *  ends when the bind completes (the loop's next round). IBMSG_EBADDESC if desc is not a
 *  descriptor of region that is still granted (revoked, or its connection closed). */
IBMSG_EXPORT int ibmsg_revoke_descriptor(ibmsg_region *region, const ibmsg_descriptor *desc);
/** Reads a descriptor's length and rights (either pointer may be NULL). IBMSG_EBADDESC if desc
 *  is not a well-formed descriptor (its check fails). */
IBMSG_EXPORT int ibmsg_descriptor_info(const ibmsg_descriptor *desc, size_t *length,
                                       unsigned *access);

/** What a one-sided operation does (ibmsg_op.type). */
enum ibmsg_op_type {
  IBMSG_OP_NONE = 0,   /**< not posted */
  IBMSG_OP_WRITE,      /**< ibmsg_rdma_write() */
  IBMSG_OP_READ,       /**< ibmsg_rdma_read() */
  IBMSG_OP_WRITE_IMM,  /**< ibmsg_rdma_write_imm() */
  IBMSG_OP_CAS,        /**< ibmsg_atomic_cas() */
  IBMSG_OP_FADD        /**< ibmsg_atomic_fadd() */
};

typedef struct ibmsg_op ibmsg_op; /**< see struct ibmsg_op */
/** Called exactly once per successfully posted operation: IBMSG_OK when it completed at the peer
 *  (written, read, or the atomic done), else the reason (IBMSG_ECANCELED: the connection closed
 *  first; IBMSG_EREMOTEACCESS: the peer refused it, which closes the connection; IBMSG_EIO:
 *  another transport error, which closes it too). */
typedef void (*ibmsg_op_cb)(ibmsg_socket *socket, ibmsg_op *op, int status);

/**
 * One one-sided operation. The application owns the struct, sets `done` (and user_data), and
 * keeps it at the same address from the posting call until `done` has been called; then it may
 * post it again.
 */
struct ibmsg_op {
  ibmsg_op_cb done;         /**< rw: the completion callback (NULL: none) */
  void *user_data;          /**< rw: the application's */
  enum ibmsg_op_type type;  /**< ro: set by the posting call */
  int status;               /**< ro: IBMSG_EINPROGRESS while posted, then the status `done` got */
  struct ibmsg__op *impl;   /**< private */
  uintptr_t check;          /**< private */
  void *reserved[4];        /**< private: room for later versions */
};

/** Writes length bytes of local (from local_offset) into the peer's memory that remote describes,
 *  at remote_offset. Checked before anything is posted: IBMSG_EINVAL (NULL, length 0 or above
 *  4 GiB - 1, op still posted), IBMSG_ERANGE (outside local or
 *  remote), IBMSG_EACCES (remote lacks the right), IBMSG_EBADDESC (remote is not a descriptor),
 *  IBMSG_EOPNOTSUPP (this side or the peer has one-sided RDMA off, or an ibmsg without it),
 *  IBMSG_ENOTCONN (not connected), IBMSG_ESTATE (a listener), IBMSG_EAGAIN
 *  (IBMSG_OPT_SEND_QUEUE messages and operations wait already); IBMSG_ENOMEM or IBMSG_ESYS if
 *  local must be registered on the connection's device first and that fails; IBMSG_EIO if the
 *  transport refused the operation (the connection closes). On success `done` follows exactly
 *  once; on failure no callback fires. */
IBMSG_EXPORT int ibmsg_rdma_write(ibmsg_socket *socket, ibmsg_op *op, ibmsg_region *local,
                                  size_t local_offset, size_t length,
                                  const ibmsg_descriptor *remote, size_t remote_offset);
/** Reads length bytes at remote_offset of what remote describes into local at local_offset
 *  (local needs IBMSG_ACCESS_LOCAL_WRITE, else IBMSG_EACCES). Codes as ibmsg_rdma_write(). */
IBMSG_EXPORT int ibmsg_rdma_read(ibmsg_socket *socket, ibmsg_op *op, ibmsg_region *local,
                                 size_t local_offset, size_t length,
                                 const ibmsg_descriptor *remote, size_t remote_offset);
/** ibmsg_rdma_write() whose arrival the peer's write_received callback reports with imm, once the
 *  bytes are visible there. Spends one of the peer's receive credits like a message (it waits
 *  for one like a message). */
IBMSG_EXPORT int ibmsg_rdma_write_imm(ibmsg_socket *socket, ibmsg_op *op, ibmsg_region *local,
                                      size_t local_offset, size_t length,
                                      const ibmsg_descriptor *remote, size_t remote_offset,
                                      uint32_t imm);
/** Atomically: if the 8-byte word at remote_offset (8-byte aligned in the peer's memory, else
 *  IBMSG_EINVAL) equals compare, it becomes swap. The word's previous value (host byte order) is
 *  stored in 8 bytes of local at local_offset (local needs IBMSG_ACCESS_LOCAL_WRITE, else
 *  IBMSG_EACCES). Needs the remote atomic right; IBMSG_EOPNOTSUPP on a device without atomics.
 *  Other codes as ibmsg_rdma_write(). */
IBMSG_EXPORT int ibmsg_atomic_cas(ibmsg_socket *socket, ibmsg_op *op, ibmsg_region *local,
                                  size_t local_offset, const ibmsg_descriptor *remote,
                                  size_t remote_offset, uint64_t compare, uint64_t swap);
/** Atomically adds add to the 8-byte word at remote_offset; the previous value goes to local at
 *  local_offset as with ibmsg_atomic_cas(). */
IBMSG_EXPORT int ibmsg_atomic_fadd(ibmsg_socket *socket, ibmsg_op *op, ibmsg_region *local,
                                   size_t local_offset, const ibmsg_descriptor *remote,
                                   size_t remote_offset, uint64_t add);

/* ---------------------------------------------------------------------------------------------
 * Requests and replies (since 1.5; see ibmsg(7), REQUESTS AND REPLIES)
 * ------------------------------------------------------------------------------------------ */

typedef struct ibmsg_request ibmsg_request; /**< see struct ibmsg_request */
/** Called exactly once per posted request (ibmsg_post_request(), ibmsg_retry_request()): with
 *  status IBMSG_OK and the reply, lent like a received message until ibmsg_free_msg(); or with
 *  reply NULL and IBMSG_ETIMEDOUT (no reply within the timeout: a reply that comes later is
 *  dropped) or the reason the connection closed (IBMSG_ECANCELED after ibmsg_disconnect(),
 *  IBMSG_ECONNRESET, ...). */
typedef void (*ibmsg_reply_cb)(ibmsg_socket *socket, ibmsg_request *req, ibmsg_buffer *reply,
                               int status);

/**
 * One request. The application owns the struct, sets `done` (and user_data), and keeps it at
 * the same address from the posting call until `done` has been called; then it may post it
 * again (a new request) or retry it (the same request again).
 */
struct ibmsg_request {
  ibmsg_reply_cb done;          /**< rw: the reply callback (NULL: none) */
  void *user_data;              /**< rw: the application's */
  uint64_t id;                  /**< ro: the request's identity, unique within its loop */
  int status;                   /**< ro: IBMSG_EINPROGRESS while posted, then what done got */
  int retries;                  /**< ro: times it was retried */
  struct ibmsg__req *impl;      /**< private */
  uintptr_t check;              /**< private */
  void *reserved[4];            /**< private: room for later versions */
};

/** Sends msg as a request; req->done gets the reply, or IBMSG_ETIMEDOUT if none came within
 *  timeout_ms. The message itself is sent as with ibmsg_post_send(): message_sent follows for
 *  it, and it may be posted again (or freed) after that. Requests, replies and messages go in
 *  one order; replies may come in any order. IBMSG_EINVAL (NULL, timeout_ms 0 or negative),
 *  IBMSG_EBUSY (req is posted still), IBMSG_EOPNOTSUPP (the peer's ibmsg has no requests),
 *  and the codes of ibmsg_post_send(). A request of any size up to the connection's maximum
 *  goes (above the eager size by rendezvous, like a message). On failure no
 *  callback fires. */
IBMSG_EXPORT int ibmsg_post_request(ibmsg_socket *socket, ibmsg_buffer *msg, ibmsg_request *req,
                                    int timeout_ms);
/** Sends req again with the same identity, after its done callback said IBMSG_ETIMEDOUT or a
 *  close reason, on the same connection or another one of the same loop to the same responder
 *  (a reconnection). The responder runs a request at most once: a retry of one it has answered
 *  gets the kept reply, one it is still working on gets the reply once it is posted.
 *  IBMSG_ESTATE if req got its reply or was never posted, IBMSG_ETIMEDOUT if it was first posted
 *  longer ago than IBMSG_OPT_REQUEST_WINDOW (its identity is forgotten: post it anew);
 *  otherwise as ibmsg_post_request(). */
IBMSG_EXPORT int ibmsg_retry_request(ibmsg_socket *socket, ibmsg_buffer *msg, ibmsg_request *req,
                                     int timeout_ms);
/** Answers request, a received message with IBMSG_MSG_REQUEST that the application still holds
 *  (it frees it once it replied; freed unanswered, the request's retries get no answer), with
 *  reply, a message of the same connection allocated with ibmsg_alloc_msg() (message_sent
 *  follows for it), of any size (above the eager size by rendezvous; a reply above the loop's
 *  IBMSG_OPT_EAGER_SIZE is not kept for retries). IBMSG_EINVAL if request is not a request or reply is invalid, IBMSG_ENOTALLOC
 *  if request was freed, IBMSG_EALREADY if it was answered already; IBMSG_ENOTCONN if its
 *  connection closed: the reply is kept (IBMSG_OPT_REPLY_CACHE) for the requester's retry over
 *  a new connection, and the message stays the application's. Otherwise as ibmsg_post_send(). */
IBMSG_EXPORT int ibmsg_post_reply(ibmsg_socket *socket, ibmsg_buffer *request,
                                  ibmsg_buffer *reply);

/* ---------------------------------------------------------------------------------------------
 * Names of the original ibmsg, kept so that programs written for it compile unchanged.
 * ------------------------------------------------------------------------------------------ */
/** The original's fixed message size limit (the default IBMSG_OPT_EAGER_SIZE of 1.2). */
#define IBMSG_MAX_MSGSIZE (65536)
#define IBMSG_FCNTL_FAILED IBMSG_ESYS /**< the original ibmsg name of IBMSG_ESYS */
#define IBMSG_GETADDRINFO_FAILED IBMSG_ENOADDR /**< the original ibmsg name of IBMSG_ENOADDR */
#define IBMSG_CREATE_ID_FAILED IBMSG_ESYS /**< the original ibmsg name of IBMSG_ESYS */
#define IBMSG_BIND_FAILED IBMSG_EADDRNOTAVAIL /**< the original ibmsg name of IBMSG_EADDRNOTAVAIL */
#define IBMSG_LISTEN_FAILED IBMSG_ESYS /**< the original ibmsg name of IBMSG_ESYS */
#define IBMSG_ADDRESS_RESOLUTION_FAILED IBMSG_EHOSTUNREACH /**< the original ibmsg name of IBMSG_EHOSTUNREACH */
#define IBMSG_FETCH_EVENT_FAILED IBMSG_ESYS /**< the original ibmsg name of IBMSG_ESYS */
#define IBMSG_ACK_EVENT_FAILED IBMSG_ESYS /**< the original ibmsg name of IBMSG_ESYS */
#define IBMSG_ALLOC_FAILED IBMSG_ENOMEM /**< the original ibmsg name of IBMSG_ENOMEM */
#define IBMSG_MEMORY_REGISTRATION_FAILED IBMSG_ESYS /**< the original ibmsg name of IBMSG_ESYS */
#define IBMSG_POST_SEND_FAILED IBMSG_EIO /**< the original ibmsg name of IBMSG_EIO */
#define IBMSG_DISCONNECT_FAILED IBMSG_ESYS /**< the original ibmsg name of IBMSG_ESYS */
#define IBMSG_FREE_BUFFER_FAILED IBMSG_ENOTALLOC /**< the original ibmsg name of IBMSG_ENOTALLOC */
#define IBMSG_CREATE_QP_FAILED IBMSG_ESYS /**< the original ibmsg name of IBMSG_ESYS */
#define IBMSG_ACCEPT_FAILED IBMSG_ESYS /**< the original ibmsg name of IBMSG_ESYS */
#define IBMSG_EPOLL_FAILED IBMSG_ESYS /**< the original ibmsg name of IBMSG_ESYS */
#define IBMSG_EPOLL_ADD_FD_FAILED IBMSG_ESYS /**< the original ibmsg name of IBMSG_ESYS */
#define IBMSG_EPOLL_WAIT_FAILED IBMSG_ESYS /**< the original ibmsg name of IBMSG_ESYS */

#ifdef __cplusplus
}
#endif

#endif /* IBMSG_H */
