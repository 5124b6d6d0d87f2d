/*
 * ibmsg-rpc - a key-value store over ibmsg's requests and replies, its messages protobuf.
 *
 *   ibmsg-rpc --server [OPTIONS] [IP]           serve the store until interrupted
 *   ibmsg-rpc [OPTIONS] IP put KEY VALUE        store VALUE under KEY
 *   ibmsg-rpc [OPTIONS] --value-file FILE IP put KEY   store FILE's bytes under KEY
 *   ibmsg-rpc [OPTIONS] IP get KEY              print the value stored under KEY
 *
 * How it uses ibmsg: the client connects, packs one kv.Request (examples/kv.proto, protobuf-c)
 * into a message from ibmsg_alloc_msg() and posts it with ibmsg_post_request() and a timeout.
 * Its done callback gets the reply, lent like a received message: the client unpacks a
 * kv.Reply from it and frees it. A request that got no reply within the timeout
 * (IBMSG_ETIMEDOUT) is sent again with ibmsg_retry_request(), which keeps its identity, up to
 * --retries times; the request message may be posted again once its message_sent has come.
 *
 * The server listens, and each request comes to its message_received callback with
 * IBMSG_MSG_REQUEST in msg->flags. It unpacks it, runs it on the store (an open-addressing hash
 * table in memory), packs the kv.Reply into a message of the same connection and answers with
 * ibmsg_post_reply(); message_sent gives the reply back. The server does nothing about retries:
 * ibmsg runs its callback once per request identity and answers a retry with the reply it
 * kept, so a put that is retried is stored once. When no send buffer is free (IBMSG_EAGAIN) the
 * server keeps the request (it holds a receive credit) with its packed reply and answers it
 * from the next message_sent.
 *
 * ibmsg moves the serialized bytes as they are; protobuf gives them a schema that both sides
 * check when they unpack. Requests and replies of any size go: up to the eager size
 * (IBMSG_OPT_EAGER_SIZE, 16384 bytes by default) through the connection's buffers, above it by
 * rendezvous (the peer reads the message from the sender's buffer), the same calls either way.
 * Keys and values are bounded all the same (MAX_KEY_SIZE, MAX_VALUE_SIZE), and so is the store
 * (MAX_KEYS, MAX_STORE_BYTES). ibmsg keeps no copy of a reply above the eager size for retries:
 * a get of a large value whose request timed out gets no answer to its retries either.
 */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include <ibmsg.h>

#include "kv.pb-c.h"
#include "tool.h"

static const char usage_text[] =
    "Usage: ibmsg-rpc [OPTIONS] IP put KEY VALUE\n"
    "       ibmsg-rpc [OPTIONS] --value-file FILE IP put KEY\n"
    "       ibmsg-rpc [OPTIONS] IP get KEY\n"
    "       ibmsg-rpc --server [OPTIONS] [IP]\n"
    "A key-value store over RDMA: the server keeps the values in memory; the\n"
    "client stores one (put) or prints one (get). Each command is one ibmsg\n"
    "request and its reply, both protobuf messages; a request that gets no reply\n"
    "in time is retried, and the server runs it only once.\n"
    "\n"
    "Modes:\n"
    "      --server          serve the store to the clients that connect to IP\n"
    "                        (default: all addresses), until interrupted\n"
    "\n"
    "Commands:\n"
    "  put KEY VALUE         store VALUE under KEY, replacing what was there;\n"
    "                        prints nothing\n"
    "  put KEY               with --value-file: store the file's bytes\n"
    "  get KEY               print the value stored under KEY and a newline\n"
    "\n"
    "Options:\n"
    "  -p, --port PORT       the server's port (default 12345; with --server, 0\n"
    "                        picks a free port, shown in the 'listening' line)\n"
    "      --timeout MS      client: wait MS milliseconds for each reply\n"
    "                        (default 1000)\n"
    "      --retries N       client: send a request that timed out again, up to N\n"
    "                        times (default 3)\n"
    "  -f, --value-file FILE client, put: the value is FILE's bytes ('-': standard\n"
    "                        input), for values too large for the command line\n"
    "                        (which takes at most 128 KiB per word)\n"
    "  -q, --quiet           server: print only errors\n"
    "  -v, --verbose         print ibmsg's log lines and each connection's counters\n"
    "                        at its close; the server also prints each request,\n"
    "                        the client each retry (the client on stderr)\n"
    "  -h, --help            print this help and exit\n"
    "      --version         print the version and exit\n"
    "\n"
    "The server's \"client N\" is the connection ibmsg's log lines call\n"
    "\"connection N\". Options go before IP. KEY has 1 to 256 bytes, VALUE at most 1048576 (1 MiB);\n"
    "the server holds at most 10000 keys and 256 MiB of values.\n"
    "Exit status: client: 0 on success, 1 on an error (the key is not found, no\n"
    "reply came, the connection failed, the server refused the request); server:\n"
    "0 when ended by SIGINT or SIGTERM, 1 on an error; 2 on bad usage.\n";

/* A key's and a value's most bytes. A request or reply of the largest ones (about 1 MiB) goes
 * by rendezvous; the default maximum message size (IBMSG_OPT_MAX_MSG_SIZE) takes far more. */
#define MAX_KEY_SIZE 256
#define MAX_VALUE_SIZE (1 << 20)
/* The most keys the server holds, and the most bytes of all their values together. */
#define MAX_KEYS 10000
#define MAX_STORE_BYTES ((size_t)256 << 20)
#define DEFAULT_TIMEOUT_MS 1000
#define DEFAULT_RETRIES 3
#define MAX_TIMEOUT_MS 3600000
#define MAX_RETRIES 1000
/* Connections the server keeps open at once. */
#define MAX_CLIENTS 64
/* How long the tool waits for its sockets to close at the end. */
#define CLOSE_TIMEOUT_S 5.0
/* Bytes of a key shown in a message; the rest is cut ("..."). */
#define SHOW_KEY 64

static struct {
  /* the command line */
  int server;
  const char *ip;
  unsigned short port;
  int timeout_ms;            /* client */
  int retries;               /* client */
  Kv__Request__Op op;        /* client: PUT or GET */
  const char *key;           /* client */
  const char *value;         /* client: put (from the command line, or value_buf) */
  size_t value_len;
  const char *value_file;    /* client: put --value-file */
  char *value_buf;           /* client: the bytes read from value_file */
  int quiet;
  int verbose;

  ibmsg_event_loop loop;
  int failed;   /* exit with 1 */
  int stopping; /* closing everything */
  double close_deadline;

  /* --server */
  ibmsg_socket listener;
  int listening; /* its connection_closed has not come */
  struct client *clients;
  unsigned accepted;
  uint64_t requests; /* run, over all clients */

  /* client */
  ibmsg_socket socket;
  int open;         /* its connection_closed has not come */
  int established;
  ibmsg_buffer msg; /* the packed kv.Request: it must keep its address until freed */
  int have_msg;     /* allocated */
  int msg_posted;   /* posted, its message_sent has not come: it may not be posted again */
  ibmsg_request req;
  int retry_wanted; /* the request timed out: retry it once msg is back */
} g;

/* s (len bytes) in double quotes for a message: bytes outside ' '..'~' (and " and \) as \xHH,
 * cut after SHOW_KEY bytes. buf needs SHOW_KEY * 4 + 8 bytes. */
static const char *quote(const char *s, size_t len, char *buf) {
  char *p = buf;
  *p++ = '"';
  for (size_t i = 0; i < len && i < SHOW_KEY; i++) {
    unsigned char ch = (unsigned char)s[i];
    if (ch >= ' ' && ch <= '~' && ch != '"' && ch != '\\')
      *p++ = (char)ch;
    else
      p += sprintf(p, "\\x%02x", ch);
  }
  *p++ = '"';
  if (len > SHOW_KEY)
    p += sprintf(p, "...");
  *p = '\0';
  return buf;
}
#define QUOTE_BUF (SHOW_KEY * 4 + 8)

/* ---- the store: keys and values in an open-addressing hash table ----------------------------- */

struct entry {
  char *key; /* NULL: a free slot */
  size_t key_len;
  uint8_t *value;
  size_t value_len;
};

static struct {
  struct entry *slots;
  size_t capacity; /* a power of two; at most half of it is used */
  size_t count;
  size_t bytes; /* of all values */
} store;

/* FNV-1a: simple, and good enough for a table that grows at half load. */
static uint64_t hash(const char *key, size_t len) {
  uint64_t h = UINT64_C(14695981039346656037);
  for (size_t i = 0; i < len; i++) {
    h ^= (unsigned char)key[i];
    h *= UINT64_C(1099511628211);
  }
  return h;
}

/* The slot that holds key, or the free slot where it would go. */
static struct entry *store_slot(struct entry *slots, size_t capacity, const char *key,
                                size_t len) {
  size_t i = (size_t)hash(key, len) & (capacity - 1);
  while (slots[i].key != NULL &&
         (slots[i].key_len != len || memcmp(slots[i].key, key, len) != 0))
    i = (i + 1) & (capacity - 1);
  return &slots[i];
}

static int store_grow(void) {
  size_t capacity = store.capacity == 0 ? 64 : store.capacity * 2;
  struct entry *slots = calloc(capacity, sizeof *slots);
  if (slots == NULL)
    return -1;
  for (size_t i = 0; i < store.capacity; i++)
    if (store.slots[i].key != NULL)
      *store_slot(slots, capacity, store.slots[i].key, store.slots[i].key_len) = store.slots[i];
  free(store.slots);
  store.slots = slots;
  store.capacity = capacity;
  return 0;
}

static const struct entry *store_get(const char *key, size_t len) {
  const struct entry *e;
  if (store.count == 0)
    return NULL;
  e = store_slot(store.slots, store.capacity, key, len);
  return e->key != NULL ? e : NULL;
}

/* Stores a copy of value under key. Returns NULL, or why not. */
static const char *store_put(const char *key, size_t len, const uint8_t *value,
                             size_t value_len) {
  struct entry *e;
  uint8_t *copy;

  if (store.capacity == 0 && store_grow() != 0)
    return "out of memory";
  e = store_slot(store.slots, store.capacity, key, len);
  if (e->key == NULL) {
    if (store.count >= MAX_KEYS)
      return "the store is full (10000 keys)";
    if (2 * (store.count + 1) > store.capacity) {
      if (store_grow() != 0)
        return "out of memory";
      e = store_slot(store.slots, store.capacity, key, len);
    }
  }
  if (store.bytes - (e->key != NULL ? e->value_len : 0) + value_len > MAX_STORE_BYTES)
    return "the store is full (256 MiB of values)";
  copy = malloc(value_len > 0 ? value_len : 1);
  if (copy == NULL)
    return "out of memory";
  if (value_len > 0)
    memcpy(copy, value, value_len);
  if (e->key == NULL) {
    e->key = malloc(len > 0 ? len : 1);
    if (e->key == NULL) {
      free(copy);
      return "out of memory";
    }
    memcpy(e->key, key, len);
    e->key_len = len;
    store.count++;
  } else {
    store.bytes -= e->value_len;
    free(e->value);
  }
  store.bytes += value_len;
  e->value = copy;
  e->value_len = value_len;
  return NULL;
}

static void store_free(void) {
  for (size_t i = 0; i < store.capacity; i++) {
    free(store.slots[i].key);
    free(store.slots[i].value);
  }
  free(store.slots);
  memset(&store, 0, sizeof store);
}

/* ---- the server ------------------------------------------------------------------------------ */

/* A request whose reply is packed but could not be sent yet (no free send buffer, or the send
 * queue was full): answered from the connection's next message_sent, in order. */
struct pending {
  struct pending *next;
  ibmsg_buffer *request; /* lent by ibmsg until ibmsg_free_msg(): it holds a receive credit */
  uint8_t *bytes;        /* the packed kv.Reply */
  size_t size;
};

/* The server's side of one connection. The socket comes first so that the callbacks' socket
 * pointer is also the client's. */
struct client {
  ibmsg_socket socket;
  struct client *next; /* the list of open connections */
  unsigned long number; /* ibmsg's number of the connection (its log lines'), 0 until known */
  char peer[64];
  unsigned short peer_port;
  uint64_t requests;   /* requests it ran */
  struct pending *pending, **pending_tail;
};

/* Closes the listener and every connection; the loop then runs until their callbacks came. */
static void server_stop(void) {
  int rc;
  if (g.stopping)
    return;
  g.stopping = 1;
  g.close_deadline = tool_now() + CLOSE_TIMEOUT_S;
  if (g.listening) {
    rc = ibmsg_disconnect(&g.listener);
    if (rc != IBMSG_OK && rc != IBMSG_ESTATE) /* ESTATE: it is closing already */
      tool_error("cannot close the listening socket: %s", ibmsg_strerror(rc));
  }
  for (struct client *c = g.clients; c != NULL; c = c->next) {
    rc = ibmsg_disconnect(&c->socket);
    if (rc != IBMSG_OK && rc != IBMSG_ESTATE)
      tool_error("client %lu: cannot disconnect: %s", c->number, ibmsg_strerror(rc));
  }
}

static void server_request(ibmsg_connection_request *request) {
  struct client *c;
  int rc;

  if (g.stopping) {
    ibmsg_reject(request, "ibmsg-rpc is shutting down");
    return;
  }
  c = calloc(1, sizeof *c);
  if (c == NULL) {
    tool_error("out of memory for the connection from %s", request->peer_address);
    ibmsg_reject(request, "ibmsg-rpc is out of memory");
    return;
  }
  snprintf(c->peer, sizeof c->peer, "%s", request->peer_address);
  c->peer_port = request->peer_port;
  c->pending_tail = &c->pending;
  c->socket.user_data = c; /* before the accept: ibmsg's log lines about it find it */
  rc = ibmsg_accept(request, &c->socket);
  if (rc != IBMSG_OK) {
    /* No callback will come for this socket: it was never set up. */
    tool_error("cannot accept the connection from %s port %u: %s", c->peer, c->peer_port,
               ibmsg_strerror(rc));
    free(c);
    return;
  }
  g.accepted++;
  c->next = g.clients;
  g.clients = c;
}

static void server_established(ibmsg_socket *socket) {
  struct client *c = socket->user_data;
  const char *dev = ibmsg_socket_device(socket);
  tool_info(g.quiet, "client %lu from %s port %u (%s)", c->number, c->peer, c->peer_port,
            dev ? dev : "?");
}

/* Runs one request on the store and fills reply. reply->value may point into the store, and
 * reply->error at error: pack it before the store changes. */
static void run_request(struct client *c, const ibmsg_buffer *msg, Kv__Reply *reply,
                        char *error, size_t error_len) {
  Kv__Request *req = kv__request__unpack(NULL, msg->size, msg->data);
  const struct entry *e;
  const char *why, *what = "?";
  char key[QUOTE_BUF];
  size_t key_len = 0;

  error[0] = '\0';
  if (req == NULL) {
    snprintf(error, error_len, "malformed request: not a kv.Request message");
  } else {
    key_len = strlen(req->key);
    quote(req->key, key_len, key);
    if (key_len == 0)
      snprintf(error, error_len, "the key is empty");
    else if (key_len > MAX_KEY_SIZE)
      snprintf(error, error_len, "the key has %zu bytes, more than %d", key_len, MAX_KEY_SIZE);
  }
  if (req != NULL && error[0] == '\0') {
    switch (req->op) {
    case KV__REQUEST__OP__PUT:
      what = "put";
      if (req->value.len > MAX_VALUE_SIZE) {
        snprintf(error, error_len, "the value has %zu bytes, more than %d", req->value.len,
                 MAX_VALUE_SIZE);
        break;
      }
      why = store_put(req->key, key_len, req->value.data, req->value.len);
      if (why != NULL)
        snprintf(error, error_len, "%s", why);
      break;
    case KV__REQUEST__OP__GET:
      what = "get";
      e = store_get(req->key, key_len);
      if (e == NULL) {
        reply->status = KV__REPLY__STATUS__NOT_FOUND;
      } else {
        reply->value.data = e->value;
        reply->value.len = e->value_len;
      }
      break;
    default:
      snprintf(error, error_len, "unknown operation %d", (int)req->op);
      break;
    }
  }
  if (error[0] != '\0') {
    reply->status = KV__REPLY__STATUS__ERROR;
    reply->error = error;
  }
  c->requests++;
  g.requests++;
  if (g.verbose) {
    /* the bytes stored (put) or returned (get) */
    size_t shown = req != NULL && req->op == KV__REQUEST__OP__PUT ? req->value.len
                                                                  : reply->value.len;
    if (req == NULL)
      tool_info(0, "client %lu: request %" PRIu64 ": refused: %s", c->number, c->requests, error);
    else if (reply->status == KV__REPLY__STATUS__ERROR)
      tool_info(0, "client %lu: request %" PRIu64 ": %s %s: refused: %s", c->number, c->requests,
                what, key, error);
    else if (reply->status == KV__REPLY__STATUS__NOT_FOUND)
      tool_info(0, "client %lu: request %" PRIu64 ": %s %s: not found", c->number, c->requests,
                what, key);
    else
      tool_info(0, "client %lu: request %" PRIu64 ": %s %s (%zu byte%s): ok", c->number,
                c->requests, what, key, shown, TOOL_S(shown));
  }
  if (req != NULL)
    kv__request__free_unpacked(req, NULL);
}

/* Answers request with the packed reply: IBMSG_OK, IBMSG_EAGAIN (no send buffer or no room in
 * the send queue now: try again after a message_sent), or another error. On failure the
 * request stays the caller's. */
static int send_reply(struct client *c, ibmsg_buffer *request, const uint8_t *bytes,
                      size_t size) {
  /* The reply's struct must keep its address until ibmsg_free_msg(): server_sent frees it. */
  ibmsg_buffer *reply = malloc(sizeof *reply);
  int rc;

  if (reply == NULL)
    return IBMSG_ENOMEM;
  rc = ibmsg_alloc_msg(reply, &c->socket, size);
  if (rc != IBMSG_OK) {
    free(reply);
    return rc;
  }
  if (size > 0)
    memcpy(reply->data, bytes, size);
  rc = ibmsg_post_reply(&c->socket, request, reply);
  if (rc != IBMSG_OK) {
    ibmsg_free_msg(reply); /* not posted: it is still ours */
    free(reply);
  }
  return rc;
}

/* Answers the connection's pending requests in order, as long as buffers are free. */
static void flush_pending(struct client *c) {
  while (c->pending != NULL) {
    struct pending *p = c->pending;
    int rc = send_reply(c, p->request, p->bytes, p->size);
    if (rc == IBMSG_EAGAIN)
      return;
    if (rc != IBMSG_OK && rc != IBMSG_ENOTCONN) /* ENOTCONN: closing; connection_closed says */
      tool_error("client %lu: cannot send a reply: %s", c->number, ibmsg_strerror(rc));
    c->pending = p->next;
    if (c->pending == NULL)
      c->pending_tail = &c->pending;
    ibmsg_free_msg(p->request); /* answered (or never will be): the credit goes back */
    free(p->bytes);
    free(p);
  }
}

static void server_received(ibmsg_socket *socket, ibmsg_buffer *msg) {
  struct client *c = socket->user_data;
  Kv__Reply reply = KV__REPLY__INIT;
  char error[160];
  struct pending *p;
  uint8_t *bytes;
  size_t size;
  int rc;

  if ((msg->flags & IBMSG_MSG_REQUEST) == 0) {
    /* A plain message has no one waiting for an answer. */
    tool_error("client %lu from %s port %u: a plain message of %zu byte%s, not a request: "
               "ignored (is the peer ibmsg-rpc?)", c->number, c->peer, c->peer_port, msg->size,
               TOOL_S(msg->size));
    ibmsg_free_msg(msg);
    return;
  }
  /* ibmsg calls this once per request identity: a retry of this request never comes here, it
   * gets the reply posted below. */
  run_request(c, msg, &reply, error, sizeof error);
  size = kv__reply__get_packed_size(&reply); /* 0 for a put's OK: every field is default */
  bytes = malloc(size > 0 ? size : 1);
  if (bytes == NULL) {
    tool_error("client %lu: out of memory for a reply", c->number);
    ibmsg_free_msg(msg); /* unanswered: the client's request times out */
    return;
  }
  kv__reply__pack(&reply, bytes);

  rc = c->pending != NULL ? IBMSG_EAGAIN : send_reply(c, msg, bytes, size);
  if (rc == IBMSG_EAGAIN) {
    /* Keep the request (and its credit) until a send buffer is free: server_sent. */
    p = malloc(sizeof *p);
    if (p != NULL) {
      p->next = NULL;
      p->request = msg;
      p->bytes = bytes;
      p->size = size;
      *c->pending_tail = p;
      c->pending_tail = &p->next;
      return;
    }
    rc = IBMSG_ENOMEM;
  }
  if (rc != IBMSG_OK && rc != IBMSG_ENOTCONN) /* ENOTCONN: closing; connection_closed says */
    tool_error("client %lu: cannot send a reply: %s", c->number, ibmsg_strerror(rc));
  ibmsg_free_msg(msg); /* answered: the request's buffer goes back to the client as a credit */
  free(bytes);
}

static void server_sent(ibmsg_socket *socket, ibmsg_buffer *msg, int status) {
  struct client *c = socket->user_data;
  /* ECANCELED: the client went away first; connection_closed tells. */
  if (status != IBMSG_OK && status != IBMSG_ECANCELED)
    tool_error("client %lu: a reply was not delivered: %s", c->number, ibmsg_strerror(status));
  ibmsg_free_msg(msg);
  free(msg); /* send_reply's */
  flush_pending(c);
}

static void server_closed(ibmsg_socket *socket, int reason) {
  struct client *c = socket->user_data;

  if (socket == &g.listener) {
    g.listening = 0;
    if (!g.stopping) {
      tool_error("the listening socket closed: %s", ibmsg_strerror(reason));
      g.failed = 1;
      server_stop();
    }
    return;
  }
  if (g.verbose) {
    char what[48];
    snprintf(what, sizeof what, "client %lu", c->number);
    tool_print_stats(what, socket);
  }
  /* Requests still waiting for a send buffer are not answered now. */
  while (c->pending != NULL) {
    struct pending *p = c->pending;
    c->pending = p->next;
    ibmsg_free_msg(p->request);
    free(p->bytes);
    free(p);
  }
  /* ECONNRESET: the client disconnected, the normal end. A client's failure is the client's:
   * the server reports it and serves the next one. */
  if (reason != IBMSG_OK && reason != IBMSG_ECONNRESET)
    tool_error("client %lu from %s port %u: connection failed after %" PRIu64 " request%s: %s",
               c->number, c->peer, c->peer_port, c->requests, TOOL_S(c->requests),
               ibmsg_strerror(reason));
  else
    tool_info(g.quiet, "client %lu from %s port %u: closed after %" PRIu64 " request%s",
              c->number, c->peer, c->peer_port, c->requests, TOOL_S(c->requests));
  for (struct client **p = &g.clients; *p != NULL; p = &(*p)->next) {
    if (*p == c) {
      *p = c->next;
      break;
    }
  }
  free(c); /* ibmsg never touches the socket after this callback */
}

/* The server's log callback: learns each client's number from ibmsg's first line about its
 * connection, and with -v prints the lines. */
static void server_log(ibmsg_event_loop *loop, ibmsg_socket *socket, int level,
                       const char *text) {
  if (socket != NULL && socket != &g.listener && socket->user_data != NULL) {
    struct client *c = socket->user_data;
    if (c->number == 0)
      c->number = tool_log_number(text);
  }
  if (g.verbose)
    tool_log(loop, socket, level, text);
}

static void run_server(void) {
  char addr[64];
  unsigned short port;
  int rc;

  g.loop.connection_request = server_request;
  g.loop.connection_established = server_established;
  g.loop.message_received = server_received;
  g.loop.message_sent = server_sent;
  g.loop.connection_closed = server_closed;
  g.loop.log = server_log;

  rc = ibmsg_listen(&g.loop, &g.listener, g.ip, g.port, MAX_CLIENTS);
  if (rc != IBMSG_OK) {
    tool_error("cannot listen on %s port %u: %s", g.ip ? g.ip : "all addresses", g.port,
               ibmsg_strerror(rc));
    g.failed = 1;
    return;
  }
  g.listening = 1;
  if (ibmsg_socket_local_address(&g.listener, addr, sizeof addr, &port) != IBMSG_OK) {
    snprintf(addr, sizeof addr, "%s", g.ip ? g.ip : "*");
    port = g.port;
  }
  tool_info(g.quiet, "listening on %s port %u", addr, port);

  /* Everything happens in the callbacks; a signal ends the service. Then the loop runs until
   * the listener and every connection have closed. */
  while (g.listening || g.clients != NULL) {
    rc = ibmsg_dispatch_event_loop_timeout(&g.loop, TOOL_TICK_MS);
    if (rc != IBMSG_OK) {
      tool_error("event loop failed: %s", ibmsg_strerror(rc));
      g.failed = 1;
      break; /* cannot wait for the sockets without a loop */
    }
    if (tool_stop && !g.stopping) {
      tool_info(g.quiet, "interrupted: closing after %u client%s, %" PRIu64 " request%s, "
                "%zu key%s stored", g.accepted, TOOL_S(g.accepted), g.requests,
                TOOL_S(g.requests), store.count, TOOL_S(store.count));
      server_stop();
    }
    if (g.stopping && tool_now() > g.close_deadline) {
      tool_error("the connections did not close within %.0f s", CLOSE_TIMEOUT_S);
      g.failed = 1;
      break;
    }
  }
}

/* ---- the client ------------------------------------------------------------------------------ */

/* -v: a line on stderr (stdout is for the value a get prints). */
static void note(const char *fmt, ...) TOOL_PRINTF(1, 2);
static void note(const char *fmt, ...) {
  va_list ap;
  if (!g.verbose)
    return;
  fprintf(stderr, "%s: ", tool_name);
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
}

/* Ends the run: closes the connection; the loop runs until its connection_closed came. */
static void client_stop(void) {
  int rc;
  if (g.stopping)
    return;
  g.stopping = 1;
  g.close_deadline = tool_now() + CLOSE_TIMEOUT_S;
  rc = ibmsg_disconnect(&g.socket);
  if (rc != IBMSG_OK && rc != IBMSG_ESTATE && rc != IBMSG_ENOTCONN) /* closing or closed */
    tool_error("cannot disconnect: %s", ibmsg_strerror(rc));
}

/* Reports the first error (later ones are its consequences) and ends the run. */
static void fail(const char *fmt, ...) TOOL_PRINTF(1, 2);
static void fail(const char *fmt, ...) {
  char line[512];
  va_list ap;
  if (!g.failed) {
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    tool_error("%s", line);
  }
  g.failed = 1;
  client_stop();
}

/* Sends the request again, with the same identity, once it timed out and its message is back
 * from the library (its message_sent came): the two may come in either order. */
static void maybe_retry(void) {
  int rc;
  if (!g.retry_wanted || g.msg_posted || g.stopping)
    return;
  g.retry_wanted = 0;
  rc = ibmsg_retry_request(&g.socket, &g.msg, &g.req, g.timeout_ms);
  if (rc == IBMSG_OK) {
    g.msg_posted = 1;
    return;
  }
  if (rc == IBMSG_ENOTCONN)
    return; /* the connection is closing under it: connection_closed follows and tells why */
  if (rc == IBMSG_ETIMEDOUT)
    fail("no reply from %s port %u: the request timed out and cannot be retried any more: it "
         "was first sent longer ago than the request window (IBMSG_OPT_REQUEST_WINDOW)",
         g.ip, g.port);
  else
    fail("cannot retry the request: %s", ibmsg_strerror(rc));
}

/* The reply (kv.Reply) came: act on it. */
static void handle_reply(ibmsg_buffer *msg) {
  Kv__Reply *reply = kv__reply__unpack(NULL, msg->size, msg->data);
  size_t size = msg->size;
  char key[QUOTE_BUF];

  ibmsg_free_msg(msg); /* unpacked (copied): the buffer goes back to the server as a credit */
  if (reply == NULL) {
    fail("the reply (%zu byte%s) is not a kv.Reply message (is the server ibmsg-rpc?)", size,
         TOOL_S(size));
    return;
  }
  quote(g.key, strlen(g.key), key);
  switch (reply->status) {
  case KV__REPLY__STATUS__OK:
    if (g.op == KV__REQUEST__OP__GET) {
      if ((reply->value.len > 0 &&
           fwrite(reply->value.data, 1, reply->value.len, stdout) != reply->value.len) ||
          putchar('\n') == EOF || fflush(stdout) != 0) {
        fail("cannot write the value to standard output: %s", strerror(errno));
        break;
      }
      note("get %s: %zu byte%s", key, reply->value.len, TOOL_S(reply->value.len));
    } else {
      note("put %s: stored", key);
    }
    client_stop();
    break;
  case KV__REPLY__STATUS__NOT_FOUND:
    fail("key %s not found", key);
    break;
  case KV__REPLY__STATUS__ERROR:
    fail("the server refused the request: %s", reply->error);
    break;
  default:
    fail("the server answered with status %d, which this ibmsg-rpc does not know",
         (int)reply->status);
    break;
  }
  kv__reply__free_unpacked(reply, NULL);
}

/* The request's done callback: exactly once per post or retry. */
static void client_reply(ibmsg_socket *socket, ibmsg_request *req, ibmsg_buffer *reply,
                         int status) {
  (void)socket;
  if (status == IBMSG_OK) {
    if (req->retries > 0)
      note("the reply came after %d retr%s", req->retries, req->retries == 1 ? "y" : "ies");
    if (g.stopping) { /* interrupted meanwhile: the reply is not wanted any more */
      ibmsg_free_msg(reply);
      return;
    }
    handle_reply(reply);
    return;
  }
  if (g.stopping)
    return; /* IBMSG_ECANCELED after our disconnect, or after an error that was reported */
  if (status == IBMSG_ETIMEDOUT) {
    if (req->retries < g.retries) {
      /* The server may have the request and just be slow, or the request or its reply may be
       * lost: the retry is safe either way, as the server runs the request at most once. */
      note("no reply within %d ms: retry %d of %d", g.timeout_ms, req->retries + 1, g.retries);
      g.retry_wanted = 1;
      maybe_retry();
      return;
    }
    fail("no reply from %s port %u: the request timed out %d time%s (--timeout %d ms, "
         "--retries %d)", g.ip, g.port, req->retries + 1, TOOL_S(req->retries + 1),
         g.timeout_ms, g.retries);
    return;
  }
  /* The connection closed first: connection_closed follows. */
  fail("the connection closed before the reply came: %s", ibmsg_strerror(status));
}

static void client_sent(ibmsg_socket *socket, ibmsg_buffer *msg, int status) {
  (void)socket;
  (void)msg;
  g.msg_posted = 0;
  /* ECANCELED: the connection closed first; the done callback and connection_closed tell. */
  if (status != IBMSG_OK && status != IBMSG_ECANCELED) {
    fail("the request was not delivered: %s", ibmsg_strerror(status));
    return;
  }
  maybe_retry();
}

static void client_received(ibmsg_socket *socket, ibmsg_buffer *msg) {
  (void)socket;
  ibmsg_free_msg(msg); /* the server sends replies only: anything else is not ours to read */
}

/* Connected: pack the request into a message and post it as a request. */
static void client_established(ibmsg_socket *socket) {
  Kv__Request request = KV__REQUEST__INIT;
  const char *dev = ibmsg_socket_device(socket);
  size_t size;
  int rc;

  g.established = 1;
  note("connected to %s port %u (%s)", g.ip, g.port, dev ? dev : "?");
  request.op = g.op;
  request.key = (char *)g.key; /* protobuf-c's struct is not const; pack only reads it */
  if (g.op == KV__REQUEST__OP__PUT) {
    request.value.data = (uint8_t *)g.value;
    request.value.len = g.value_len;
  }
  size = kv__request__get_packed_size(&request);
  rc = ibmsg_alloc_msg(&g.msg, socket, size);
  if (rc != IBMSG_OK) {
    fail("cannot allocate a %zu-byte message: %s", size, ibmsg_strerror(rc));
    return;
  }
  g.have_msg = 1;
  kv__request__pack(&request, g.msg.data);

  g.req.done = client_reply;
  rc = ibmsg_post_request(socket, &g.msg, &g.req, g.timeout_ms);
  if (rc == IBMSG_OK) {
    g.msg_posted = 1;
    return;
  }
  if (rc == IBMSG_EOPNOTSUPP)
    fail("the peer at %s port %u takes no requests: its ibmsg is older than 1.5", g.ip, g.port);
  else if (rc != IBMSG_ENOTCONN) /* ENOTCONN: closing under us; connection_closed tells why */
    fail("cannot send the %zu-byte request: %s", size, ibmsg_strerror(rc));
}

static void client_closed(ibmsg_socket *socket, int reason) {
  if (g.verbose)
    tool_print_stats("connection", socket);
  g.open = 0;
  if (g.stopping)
    return; /* we closed it: after the result, or because of an error that was reported */
  g.failed = 1;
  g.stopping = 1;
  if (!g.established) {
    if (reason == IBMSG_EREJECTED && socket->reject_reason[0] != '\0')
      tool_error("cannot connect to %s port %u: %s: %s", g.ip, g.port, ibmsg_strerror(reason),
                 socket->reject_reason);
    else
      tool_error("cannot connect to %s port %u: %s", g.ip, g.port, ibmsg_strerror(reason));
  } else {
    tool_error("the connection closed before the reply came: %s", ibmsg_strerror(reason));
  }
}

static void run_client(void) {
  int rc;

  g.loop.connection_established = client_established;
  g.loop.message_received = client_received;
  g.loop.message_sent = client_sent;
  g.loop.connection_closed = client_closed;

  rc = ibmsg_connect(&g.loop, &g.socket, g.ip, g.port);
  if (rc != IBMSG_OK) {
    tool_error("cannot connect to %s port %u: %s", g.ip, g.port, ibmsg_strerror(rc));
    g.failed = 1;
    return;
  }
  g.open = 1;

  /* Run until the connection has closed; the callbacks do the work. ibmsg ends the request with
   * its done callback (a reply, a timeout or the close), and a connection that cannot be
   * established with connection_closed within its connect timeout. */
  while (g.open) {
    rc = ibmsg_dispatch_event_loop_timeout(&g.loop, TOOL_TICK_MS);
    if (rc != IBMSG_OK) {
      tool_error("event loop failed: %s", ibmsg_strerror(rc));
      g.failed = 1;
      break; /* cannot wait for the socket without a loop */
    }
    if (tool_stop && !g.stopping)
      fail("interrupted before the reply came");
    if (g.stopping && g.open && tool_now() > g.close_deadline) {
      tool_error("the connection did not close within %.0f s", CLOSE_TIMEOUT_S);
      g.failed = 1;
      break;
    }
  }
}

/* ---- main ------------------------------------------------------------------------------------ */

static int parse_args(int argc, char **argv) {
  enum { OPT_SERVER = 256, OPT_TIMEOUT, OPT_RETRIES, OPT_VERSION };
  static const struct option options[] = {
      {"server", no_argument, NULL, OPT_SERVER},
      {"port", required_argument, NULL, 'p'},
      {"timeout", required_argument, NULL, OPT_TIMEOUT},
      {"retries", required_argument, NULL, OPT_RETRIES},
      {"value-file", required_argument, NULL, 'f'},
      {"quiet", no_argument, NULL, 'q'},
      {"verbose", no_argument, NULL, 'v'},
      {"help", no_argument, NULL, 'h'},
      {"version", no_argument, NULL, OPT_VERSION},
      {NULL, 0, NULL, 0}};
  const char *client_option = NULL; /* the first client-only option given */
  const char *cmd;
  size_t len;
  uint64_t v;
  int opt;

  g.port = TOOL_DEFAULT_PORT;
  g.timeout_ms = DEFAULT_TIMEOUT_MS;
  g.retries = DEFAULT_RETRIES;
  opterr = 0; /* we print our own one-line errors */
  /* '+': options end at the first operand (IP), so that a KEY or VALUE may start with '-'. */
  while ((opt = getopt_long(argc, argv, "+:p:f:qvh", options, NULL)) != -1) {
    switch (opt) {
    case OPT_SERVER: g.server = 1; break;
    case 'p':
      /* 0 (any free port) only makes sense for a server; checked below. */
      if (tool_parse_port("-p", optarg, 1, &g.port) != 0)
        return -1;
      break;
    case OPT_TIMEOUT:
      if (tool_parse_uint("--timeout", optarg, 1, MAX_TIMEOUT_MS, &v) != 0)
        return -1;
      g.timeout_ms = (int)v;
      client_option = client_option ? client_option : "--timeout";
      break;
    case OPT_RETRIES:
      if (tool_parse_uint("--retries", optarg, 0, MAX_RETRIES, &v) != 0)
        return -1;
      g.retries = (int)v;
      client_option = client_option ? client_option : "--retries";
      break;
    case 'f':
      g.value_file = optarg;
      client_option = client_option ? client_option : "--value-file";
      break;
    case 'q': g.quiet = 1; break;
    case 'v': g.verbose = 1; break;
    case 'h': fputs(usage_text, stdout); exit(TOOL_EXIT_OK);
    case OPT_VERSION: tool_print_version(); exit(TOOL_EXIT_OK);
    case ':': tool_usage_error("option %s needs a value", tool_bad_option(argv)); return -1;
    default: tool_usage_error("unknown option %s", tool_bad_option(argv)); return -1;
    }
  }
  if (g.server) {
    if (client_option != NULL) {
      tool_usage_error("%s is a client option: it does not go with --server", client_option);
      return -1;
    }
    if (optind < argc)
      g.ip = argv[optind++];
    if (optind < argc) {
      tool_usage_error("unexpected argument '%s' (a server takes no command)", argv[optind]);
      return -1;
    }
    return 0;
  }
  if (optind >= argc) {
    tool_usage_error("no IP address given");
    return -1;
  }
  g.ip = argv[optind++];
  if (g.port == 0) {
    tool_usage_error("-p 0 (any free port) is for --server only: a client needs the "
                     "server's port");
    return -1;
  }
  if (optind >= argc) {
    tool_usage_error("no command given: put KEY VALUE or get KEY");
    return -1;
  }
  cmd = argv[optind++];
  if (strcmp(cmd, "put") == 0) {
    g.op = KV__REQUEST__OP__PUT;
  } else if (strcmp(cmd, "get") == 0) {
    g.op = KV__REQUEST__OP__GET;
  } else {
    tool_usage_error("unknown command '%s': put KEY VALUE or get KEY", cmd);
    return -1;
  }
  if (optind >= argc) {
    tool_usage_error("%s: no KEY given", cmd);
    return -1;
  }
  g.key = argv[optind++];
  len = strlen(g.key);
  if (len == 0) {
    tool_usage_error("%s: the key is empty", cmd);
    return -1;
  }
  if (len > MAX_KEY_SIZE) {
    tool_usage_error("%s: the key has %zu bytes, more than %d", cmd, len, MAX_KEY_SIZE);
    return -1;
  }
  if (g.value_file != NULL && g.op != KV__REQUEST__OP__PUT) {
    tool_usage_error("--value-file goes with put only, not with %s", cmd);
    return -1;
  }
  if (g.op == KV__REQUEST__OP__PUT && g.value_file == NULL) {
    if (optind >= argc) {
      tool_usage_error("put: no VALUE given");
      return -1;
    }
    g.value = argv[optind++];
    len = strlen(g.value);
    if (len > MAX_VALUE_SIZE) {
      tool_usage_error("put: the value has %zu bytes, more than %d: too long", len,
                       MAX_VALUE_SIZE);
      return -1;
    }
    g.value_len = len;
  } else if (g.op == KV__REQUEST__OP__PUT && optind < argc) {
    tool_usage_error("put: a VALUE and --value-file both given (the value is the file's)");
    return -1;
  }
  if (optind < argc) {
    tool_usage_error("unexpected argument '%s' after the %s command", argv[optind], cmd);
    return -1;
  }
  return 0;
}

/* put --value-file: reads the value, at most MAX_VALUE_SIZE bytes, into g.value_buf. 0, or -1
 * after an error line. */
static int read_value(void) {
  int from_stdin = strcmp(g.value_file, "-") == 0;
  const char *name = from_stdin ? "standard input" : g.value_file;
  FILE *f = from_stdin ? stdin : fopen(g.value_file, "rb");
  size_t n;
  int err = 0, too_long;

  if (f == NULL) {
    tool_error("put: cannot open %s: %s", name, strerror(errno));
    return -1;
  }
  /* One byte more than the most a value may have tells a value that is too long. */
  g.value_buf = malloc((size_t)MAX_VALUE_SIZE + 1);
  if (g.value_buf == NULL) {
    tool_error("put: out of memory for the value");
    if (!from_stdin)
      fclose(f);
    return -1;
  }
  n = fread(g.value_buf, 1, (size_t)MAX_VALUE_SIZE + 1, f);
  if (ferror(f))
    err = errno != 0 ? errno : EIO;
  too_long = n > MAX_VALUE_SIZE;
  if (!from_stdin)
    fclose(f);
  if (err != 0) {
    tool_error("put: cannot read %s: %s", name, strerror(err));
    return -1;
  }
  if (too_long) {
    tool_error("put: the value is too long: %s has more than %d bytes (1 MiB, the most a "
               "value may have)", name, MAX_VALUE_SIZE);
    return -1;
  }
  g.value = g.value_buf;
  g.value_len = n;
  return 0;
}

int main(int argc, char **argv) {
  int rc, open;

  tool_name = "ibmsg-rpc";
  setvbuf(stdout, NULL, _IOLBF, 0); /* a script waiting for "listening" sees it at once */
  if (parse_args(argc, argv) != 0)
    return TOOL_EXIT_USAGE;
  if (g.value_file != NULL && read_value() != 0) {
    free(g.value_buf);
    return TOOL_EXIT_FAILURE;
  }
  tool_catch_signals();

  rc = ibmsg_init_event_loop(&g.loop);
  if (rc != IBMSG_OK) {
    tool_error("cannot create the event loop: %s", ibmsg_strerror(rc));
    return TOOL_EXIT_FAILURE;
  }
  if (g.verbose)
    g.loop.log = tool_log;
  if (g.server)
    run_server();
  else
    run_client();

  /* Nothing may go while a socket is still open, which happens only when the loop itself
   * failed or a close hung. */
  open = g.server ? g.listening || g.clients != NULL : g.open;
  if (!open && g.have_msg) {
    rc = ibmsg_free_msg(&g.msg);
    if (rc != IBMSG_OK) {
      tool_error("cannot free the request message: %s", ibmsg_strerror(rc));
      g.failed = 1;
      open = 1;
    }
  }
  if (!open) {
    rc = ibmsg_destroy_event_loop(&g.loop);
    if (rc != IBMSG_OK) {
      tool_error("cannot destroy the event loop: %s", ibmsg_strerror(rc));
      g.failed = 1;
    }
  }
  store_free();
  free(g.value_buf);
  return g.failed ? TOOL_EXIT_FAILURE : TOOL_EXIT_OK;
}
