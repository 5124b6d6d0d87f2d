/*
 * ibmsg-rdma - one-sided RDMA the classic way: write into a peer's buffer, read it back, compare.
 *
 *   ibmsg-rdma --server [OPTIONS] [IP]         offer a buffer to every client until interrupted
 *   ibmsg-rdma [OPTIONS] --string STRING IP     write STRING into it, read it back, compare
 *   ibmsg-rdma [OPTIONS] -s SIZE IP             the same with SIZE random bytes
 *
 * How it uses ibmsg: the server allocates one region with ibmsg_alloc_region() that peers may
 * read and write. When a connection is established it makes a descriptor of the whole region
 * for that connection (ibmsg_region_descriptor) and sends it in an ordinary message, with the
 * buffer's size. The client checks the descriptor (ibmsg_descriptor_info: length and rights),
 * then writes its bytes into the server's buffer with ibmsg_rdma_write(); from the write's done
 * callback it reads the same range back into a second local region with ibmsg_rdma_read(), and
 * from the read's done callback it compares. The server's CPU takes no part in the transfers:
 * it only hands out the descriptor. Every client gets the same buffer; clients that run at the
 * same time should use ranges of their own (--offset). The server numbers its clients as
 * ibmsg's log lines number their connections: a log callback learns each one's number from the
 * first line about it.
 */
#define _POSIX_C_SOURCE 200809L

#include <getopt.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include <ibmsg.h>

#include "tool.h"

static const char usage_text[] =
    "Usage: ibmsg-rdma [OPTIONS] --string STRING IP\n"
    "       ibmsg-rdma [OPTIONS] -s SIZE IP\n"
    "       ibmsg-rdma --server [OPTIONS] [IP]\n"
    "Show one-sided RDMA: the server offers a buffer to every client; the client\n"
    "writes into it with an RDMA write, reads the same bytes back with an RDMA\n"
    "read, compares, and prints a line starting with SUCCESS if they match.\n"
    "\n"
    "Modes:\n"
    "      --server          allocate a buffer and send its descriptor to every\n"
    "                        client that connects to IP (default: all\n"
    "                        addresses), until interrupted\n"
    "\n"
    "Options:\n"
    "  -p, --port PORT       the server's port (default 12345; with --server, 0\n"
    "                        picks a free port, shown in the 'listening' line)\n"
    "  -b, --buffer-size BYTES\n"
    "                        --server: the size of the buffer (default 1M)\n"
    "      --string STRING   client: write the bytes of STRING (before 1.7: -s)\n"
    "  -s, --size SIZE       client: write SIZE random bytes instead\n"
    "      --repeat N        client: write, read back and compare N times, with\n"
    "                        fresh random bytes each time (default 1)\n"
    "      --offset OFFSET   client: where to write in the server's buffer\n"
    "                        (default 0)\n"
    "  -q, --quiet           print only the result and errors\n"
    "  -v, --verbose         print ibmsg's log lines (connections, errors)\n"
    "  -h, --help            print this help and exit\n"
    "      --version         print the version and exit\n"
    "\n"
    "BYTES, SIZE and OFFSET may end in K, M or G (times 1024, 1024^2, 1024^3).\n"
    "The server's \"client N\" is the connection ibmsg's log lines call\n"
    "\"connection N\".\n"
    "Exit status: client: 0 if every read returned what was written, 1 on an\n"
    "error or a mismatch; server: 0 when ended by SIGINT or SIGTERM, 1 on an\n"
    "error; 2 on bad usage.\n";

#define DEFAULT_BUFFER_SIZE (UINT64_C(1) << 20)
#define MAX_BUFFER_SIZE (UINT64_C(1) << 36) /* 64 GiB: a bound, not a promise */
#define MAX_TRANSFER (UINT64_C(1) << 30)    /* one RDMA operation moves at most this */
/* Connections the server keeps open at once. */
#define MAX_CLIENTS 64
/* The client waits this long for the server's descriptor: longer means the peer is not an
 * ibmsg-rdma server. */
#define DESCRIPTOR_TIMEOUT_S 10.0
/* How long the tool waits for its sockets to close at the end. */
#define CLOSE_TIMEOUT_S 5.0

/* ---- the one message: the server's buffer ----------------------------------------------------
 * A fixed little-endian layout, so that client and server need not be the same build:
 *   bytes 0..7    "ibmsgrdm"
 *   bytes 8..11   version (1)
 *   bytes 12..15  zero
 *   bytes 16..23  the buffer's size in bytes
 *   bytes 24..55  the descriptor (ibmsg_descriptor), as ibmsg made it */
#define OFFER_MAGIC "ibmsgrdm"
#define OFFER_VERSION 1
#define OFFER_SIZE (24 + IBMSG_DESCRIPTOR_SIZE)

static void put_le(unsigned char *p, uint64_t v, int n) {
  for (int i = 0; i < n; i++)
    p[i] = (unsigned char)(v >> (8 * i));
}

static uint64_t get_le(const unsigned char *p, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; i++)
    v |= (uint64_t)p[i] << (8 * i);
  return v;
}

/* The server's side of one connection. The socket comes first so that the callbacks' socket
 * pointer is also the client's. */
struct client {
  ibmsg_socket socket;
  struct client *next; /* the list of open connections */
  unsigned long number; /* ibmsg's number of the connection (its log lines'), 0 until known */
  char peer[64];
  unsigned short peer_port;
  ibmsg_buffer offer;  /* the descriptor message: it must keep its address until freed */
};

static struct {
  /* the command line */
  int server;
  const char *ip;
  unsigned short port;
  uint64_t buffer_size; /* --server */
  char *string;         /* client: --string (registered where it is, in argv) */
  uint64_t size;        /* client: bytes to write (strlen of --string, or -s) */
  uint64_t repeat;
  uint64_t offset;
  int quiet;
  int verbose;

  ibmsg_event_loop loop;
  int failed;   /* exit with 1 */
  int stopping; /* closing everything */
  double close_deadline;

  /* --server */
  ibmsg_region buffer;
  int have_buffer;
  ibmsg_socket listener;
  int listening; /* its connection_closed has not come */
  struct client *clients;
  unsigned accepted;

  /* client */
  ibmsg_socket socket;
  int open;        /* its connection_closed has not come */
  int established;
  int have_offer;  /* the descriptor came */
  ibmsg_descriptor remote;
  uint64_t remote_size;
  ibmsg_region src, dst; /* what is written; where it is read back to */
  int have_src, have_dst;
  ibmsg_op op;     /* the one operation in flight: the write, then the read */
  uint64_t round;  /* rounds done (compared) */
  uint64_t rng;
  double t_connect, t_start, t_end;
} g;

/* ---- the server ------------------------------------------------------------------------------ */

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

/* A client's connection cannot be served: say why and close it. The server goes on. */
static void client_fail(struct client *c, const char *what, int code) {
  tool_error("client %lu from %s port %u: %s: %s", c->number, c->peer, c->peer_port, what,
             ibmsg_strerror(code));
  ibmsg_disconnect(&c->socket); /* IBMSG_ESTATE when it is closing already: fine */
}

static void server_request(ibmsg_connection_request *request) {
  struct client *c;
  int rc;

  if (g.stopping) {
    ibmsg_reject(request, "ibmsg-rdma is shutting down");
    return;
  }
  c = calloc(1, sizeof *c);
  if (c == NULL) {
    tool_error("out of memory for the connection from %s", request->peer_address);
    ibmsg_reject(request, "ibmsg-rdma is out of memory");
    return;
  }
  snprintf(c->peer, sizeof c->peer, "%s", request->peer_address);
  c->peer_port = request->peer_port;
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

/* The connection is up: grant this client read and write on the whole buffer and tell it. */
static void server_established(ibmsg_socket *socket) {
  struct client *c = socket->user_data;
  const char *dev = ibmsg_socket_device(socket);
  ibmsg_descriptor desc;
  unsigned char *p;
  int rc;

  /* The descriptor works on this connection only (a peer on another connection that uses it
   * fails); the connection's close ends it. */
  rc = ibmsg_region_descriptor(&g.buffer, socket, 0, g.buffer.length,
                               IBMSG_ACCESS_REMOTE_READ | IBMSG_ACCESS_REMOTE_WRITE, &desc);
  if (rc != IBMSG_OK) {
    client_fail(c, "cannot make a descriptor of the buffer", rc);
    return;
  }
  rc = ibmsg_alloc_msg(&c->offer, socket, OFFER_SIZE);
  if (rc != IBMSG_OK) {
    client_fail(c, "cannot allocate a message", rc);
    return;
  }
  p = c->offer.data;
  memcpy(p, OFFER_MAGIC, 8);
  put_le(p + 8, OFFER_VERSION, 4);
  put_le(p + 12, 0, 4);
  put_le(p + 16, g.buffer.length, 8);
  memcpy(p + 24, desc.bytes, IBMSG_DESCRIPTOR_SIZE); /* as it is: it has its own layout */
  rc = ibmsg_post_send(socket, &c->offer);
  if (rc != IBMSG_OK) {
    ibmsg_free_msg(&c->offer);
    client_fail(c, "cannot send the descriptor", rc);
    return;
  }
  tool_info(g.quiet, "client %lu from %s port %u (%s): sent the descriptor of the %zu-byte buffer",
            c->number, c->peer, c->peer_port, dev ? dev : "?", g.buffer.length);
}

static void server_sent(ibmsg_socket *socket, ibmsg_buffer *msg, int status) {
  struct client *c = socket->user_data;
  /* ECANCELED: the client went away first; connection_closed tells. */
  if (status != IBMSG_OK && status != IBMSG_ECANCELED)
    client_fail(c, "the descriptor was not delivered", status);
  ibmsg_free_msg(msg);
}

static void server_received(ibmsg_socket *socket, ibmsg_buffer *msg) {
  (void)socket;
  ibmsg_free_msg(msg); /* a client has nothing to say: give the credit back */
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
  /* ECONNRESET: the client disconnected, the normal end. A client's failure is the client's:
   * the server reports it and serves the next one. */
  if (reason != IBMSG_OK && reason != IBMSG_ECONNRESET)
    tool_error("client %lu from %s port %u: connection failed: %s", c->number, c->peer,
               c->peer_port, ibmsg_strerror(reason));
  else
    tool_info(g.quiet, "client %lu from %s port %u: closed", c->number, c->peer, c->peer_port);
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

  /* Zeroed, page-aligned memory that peers may read and write once they have a descriptor. */
  rc = ibmsg_alloc_region(&g.loop, &g.buffer, (size_t)g.buffer_size,
                          IBMSG_ACCESS_REMOTE_READ | IBMSG_ACCESS_REMOTE_WRITE);
  if (rc != IBMSG_OK) {
    tool_error("cannot allocate a %" PRIu64 "-byte buffer: %s", g.buffer_size,
               ibmsg_strerror(rc));
    g.failed = 1;
    return;
  }
  g.have_buffer = 1;
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
  tool_info(g.quiet, "listening on %s port %u, offering a %" PRIu64 "-byte buffer", addr, port,
            g.buffer_size);

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
      tool_info(g.quiet, "interrupted: closing after %u client%s", g.accepted,
                TOOL_S(g.accepted));
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

static void op_done(ibmsg_socket *socket, ibmsg_op *op, int status);

/* One round: new bytes (with --size), then the write; the read follows from op_done. */
static void start_round(void) {
  int rc;
  if (g.string == NULL)
    tool_random_fill(g.src.addr, (size_t)g.size, &g.rng);
  g.op.done = op_done;
  rc = ibmsg_rdma_write(&g.socket, &g.op, &g.src, 0, (size_t)g.size, &g.remote,
                        (size_t)g.offset);
  if (rc == IBMSG_ENOTCONN)
    return; /* the connection is closing under it: connection_closed follows and tells why */
  if (rc != IBMSG_OK)
    fail("cannot post the RDMA write of %" PRIu64 " byte%s: %s", g.size, TOOL_S(g.size),
         ibmsg_strerror(rc));
}

/* The write is done, so the bytes are in the server's buffer: read them back. */
static void start_read(void) {
  const unsigned char *src = g.src.addr;
  unsigned char *dst = g.dst.addr;
  int rc;
  /* Every byte differs from what was written until the read lands, so a read that did not
   * happen cannot pass for one that did. */
  for (uint64_t i = 0; i < g.size; i++)
    dst[i] = (unsigned char)~src[i];
  rc = ibmsg_rdma_read(&g.socket, &g.op, &g.dst, 0, (size_t)g.size, &g.remote,
                       (size_t)g.offset);
  if (rc == IBMSG_ENOTCONN)
    return; /* as in start_round */
  if (rc != IBMSG_OK)
    fail("cannot post the RDMA read of %" PRIu64 " byte%s: %s", g.size, TOOL_S(g.size),
         ibmsg_strerror(rc));
}

static void print_success(void) {
  double seconds = g.t_end - g.t_start;
  /* Written and read back: every byte crossed the wire twice. */
  double mbps = seconds > 0 ? 2.0 * (double)g.size * (double)g.repeat / seconds / 1e6 : 0.0;
  char what[96];

  if (g.string != NULL)
    snprintf(what, sizeof what, "\"%.40s%s\" (%" PRIu64 " byte%s)", g.string,
             g.size > 40 ? "..." : "", g.size, TOOL_S(g.size));
  else
    snprintf(what, sizeof what, "%" PRIu64 " random byte%s", g.size, TOOL_S(g.size));
  printf("SUCCESS: %s written at offset %" PRIu64 " of the server's buffer and read back "
         "identical, %" PRIu64 " time%s in %.3f s (%.2f MB/s)\n",
         what, g.offset, g.repeat, TOOL_S(g.repeat), seconds, mbps);
  fflush(stdout);
}

/* The read is done: its bytes are in dst. */
static void compare(void) {
  const unsigned char *src = g.src.addr, *dst = g.dst.addr;

  if (memcmp(src, dst, (size_t)g.size) != 0) {
    uint64_t i = 0;
    while (src[i] == dst[i])
      i++;
    fail("mismatch in round %" PRIu64 " of %" PRIu64 ": byte %" PRIu64 " (offset %" PRIu64
         " of the server's buffer) read back as 0x%02x, expected 0x%02x",
         g.round + 1, g.repeat, i, g.offset + i, dst[i], src[i]);
    return;
  }
  g.round++;
  if (g.round < g.repeat) {
    start_round();
    return;
  }
  g.t_end = tool_now();
  print_success();
  client_stop();
}

static void op_done(ibmsg_socket *socket, ibmsg_op *op, int status) {
  (void)socket;
  if (g.stopping)
    return; /* ECANCELED while closing, or after an error that was reported */
  if (status == IBMSG_ECANCELED)
    return; /* the connection closed under it: connection_closed follows and tells why */
  if (status != IBMSG_OK) {
    /* IBMSG_EREMOTEACCESS: the server refused the key or the range; the connection closes. */
    fail("the RDMA %s of %" PRIu64 " byte%s at offset %" PRIu64 " failed: %s",
         op->type == IBMSG_OP_READ ? "read" : "write", g.size, TOOL_S(g.size), g.offset,
         ibmsg_strerror(status));
    return;
  }
  if (op->type == IBMSG_OP_WRITE)
    start_read();
  else
    compare();
}

/* The server's one message: the descriptor of its buffer. */
static void client_received(ibmsg_socket *socket, ibmsg_buffer *msg) {
  const unsigned char *p = msg->data;
  size_t length = 0;
  unsigned access = 0;
  int ok = msg->size == OFFER_SIZE && memcmp(p, OFFER_MAGIC, 8) == 0;
  int rc;

  (void)socket;
  if (ok && !g.have_offer) {
    ok = get_le(p + 8, 4) == OFFER_VERSION;
    g.remote_size = get_le(p + 16, 8);
    memcpy(g.remote.bytes, p + 24, IBMSG_DESCRIPTOR_SIZE);
  }
  ibmsg_free_msg(msg); /* copied: the buffer goes back to the server as a credit */
  if (g.stopping)
    return;
  if (!ok || g.have_offer) {
    fail("unexpected message from %s port %u (is it ibmsg-rdma --server of this version?)",
         g.ip, g.port);
    return;
  }
  g.have_offer = 1;

  /* What the descriptor grants is what counts; the size in the message must agree with it. */
  rc = ibmsg_descriptor_info(&g.remote, &length, &access);
  if (rc != IBMSG_OK) {
    fail("the server sent a descriptor that is not valid: %s", ibmsg_strerror(rc));
    return;
  }
  if ((uint64_t)length != g.remote_size) {
    fail("the server says its buffer has %" PRIu64 " bytes but its descriptor grants %zu",
         g.remote_size, length);
    return;
  }
  if ((access & IBMSG_ACCESS_REMOTE_WRITE) == 0 || (access & IBMSG_ACCESS_REMOTE_READ) == 0) {
    fail("the server's descriptor does not grant both RDMA write and read");
    return;
  }
  tool_info(g.quiet, "the server's buffer: %zu bytes, RDMA write and read allowed", length);
  if (g.offset > length || g.size > length - g.offset) {
    fail("%" PRIu64 " byte%s at offset %" PRIu64 " do%s not fit in the server's %zu-byte "
         "buffer (start the server with --buffer-size %" PRIu64 " or more)",
         g.size, TOOL_S(g.size), g.offset, g.size == 1 ? "es" : "", length, g.offset + g.size);
    return;
  }
  g.t_start = tool_now();
  start_round();
}

static void client_established(ibmsg_socket *socket) {
  const char *dev = ibmsg_socket_device(socket);
  g.established = 1;
  tool_info(g.quiet, "connected to %s port %u (%s)", g.ip, g.port, dev ? dev : "?");
  /* Nothing to do until the server's descriptor comes. */
}

static void client_closed(ibmsg_socket *socket, int reason) {
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
  } else if (!g.have_offer) {
    tool_error("the server closed the connection before sending its buffer's descriptor: %s",
               ibmsg_strerror(reason));
  } else {
    tool_error("the connection closed in round %" PRIu64 " of %" PRIu64 ": %s", g.round + 1,
               g.repeat, ibmsg_strerror(reason));
  }
}

static void run_client(void) {
  int rc;

  g.loop.connection_established = client_established;
  g.loop.message_received = client_received;
  g.loop.connection_closed = client_closed;
  if (g.verbose)
    g.loop.log = tool_log;

  /* The source: the string where it is (registered in place; a write reads it, so it needs no
   * right), or fresh memory for random bytes. The destination of the read must be writable. */
  if (g.string != NULL)
    rc = ibmsg_register_region(&g.loop, &g.src, g.string, (size_t)g.size, 0);
  else
    rc = ibmsg_alloc_region(&g.loop, &g.src, (size_t)g.size, 0);
  if (rc != IBMSG_OK) {
    tool_error("cannot %s %" PRIu64 " byte%s to write: %s",
               g.string != NULL ? "register the" : "allocate", g.size, TOOL_S(g.size),
               ibmsg_strerror(rc));
    g.failed = 1;
    return;
  }
  g.have_src = 1;
  rc = ibmsg_alloc_region(&g.loop, &g.dst, (size_t)g.size, IBMSG_ACCESS_LOCAL_WRITE);
  if (rc != IBMSG_OK) {
    tool_error("cannot allocate %" PRIu64 " byte%s to read back into: %s", g.size,
               TOOL_S(g.size), ibmsg_strerror(rc));
    g.failed = 1;
    return;
  }
  g.have_dst = 1;
  g.rng = tool_random_seed();

  rc = ibmsg_connect(&g.loop, &g.socket, g.ip, g.port);
  if (rc != IBMSG_OK) {
    tool_error("cannot connect to %s port %u: %s", g.ip, g.port, ibmsg_strerror(rc));
    g.failed = 1;
    return;
  }
  g.open = 1;
  g.t_connect = tool_now();

  /* Run until the connection has closed; the callbacks do the work. */
  while (g.open) {
    rc = ibmsg_dispatch_event_loop_timeout(&g.loop, TOOL_TICK_MS);
    if (rc != IBMSG_OK) {
      tool_error("event loop failed: %s", ibmsg_strerror(rc));
      g.failed = 1;
      break; /* cannot wait for the socket without a loop */
    }
    if (tool_stop && !g.stopping)
      fail("interrupted in round %" PRIu64 " of %" PRIu64, g.round + 1, g.repeat);
    if (g.established && !g.have_offer && !g.stopping &&
        tool_now() - g.t_connect > DESCRIPTOR_TIMEOUT_S)
      fail("no descriptor from %s port %u within %.0f s (is it ibmsg-rdma --server?)", g.ip,
           g.port, DESCRIPTOR_TIMEOUT_S);
    if (g.stopping && g.open && tool_now() > g.close_deadline) {
      tool_error("the connection did not close within %.0f s", CLOSE_TIMEOUT_S);
      g.failed = 1;
      break;
    }
  }
}

/* ---- main ------------------------------------------------------------------------------------ */

static int parse_args(int argc, char **argv) {
  enum { OPT_SERVER = 256, OPT_STRING, OPT_REPEAT, OPT_OFFSET, OPT_VERSION };
  static const struct option options[] = {
      {"server", no_argument, NULL, OPT_SERVER},
      {"port", required_argument, NULL, 'p'},
      {"buffer-size", required_argument, NULL, 'b'},
      {"string", required_argument, NULL, OPT_STRING},
      {"size", required_argument, NULL, 's'},
      {"repeat", required_argument, NULL, OPT_REPEAT},
      {"offset", required_argument, NULL, OPT_OFFSET},
      {"quiet", no_argument, NULL, 'q'},
      {"verbose", no_argument, NULL, 'v'},
      {"help", no_argument, NULL, 'h'},
      {"version", no_argument, NULL, OPT_VERSION},
      {NULL, 0, NULL, 0}};
  const char *client_option = NULL; /* the first client-only option given */
  int buffer_given = 0, size_given = 0;
  int opt, longindex = -1;

  g.port = TOOL_DEFAULT_PORT;
  g.buffer_size = DEFAULT_BUFFER_SIZE;
  g.repeat = 1;
  opterr = 0; /* we print our own one-line errors */
  while ((opt = getopt_long(argc, argv, ":p:b:s:qvh", options, &longindex)) != -1) {
    int is_long = longindex >= 0;
    longindex = -1;
    switch (opt) {
    case OPT_SERVER: g.server = 1; break;
    case 'p':
      /* 0 (any free port) only makes sense for a server; checked below. */
      if (tool_parse_port("-p", optarg, 1, &g.port) != 0)
        return -1;
      break;
    case 'b':
      if (tool_parse_size("--buffer-size", optarg, 1, MAX_BUFFER_SIZE, &g.buffer_size) != 0)
        return -1;
      buffer_given = 1;
      break;
    case OPT_STRING:
      g.string = optarg;
      client_option = client_option ? client_option : "--string";
      break;
    case 's':
      if (!is_long && (optarg[0] < '0' || optarg[0] > '9')) {
        /* Before 1.7, -s was --string: say so rather than only "not a number". */
        tool_usage_error("-s: '%s' is not a size: -s is --size (since 1.7); a string to write "
                         "goes with --string", optarg);
        return -1;
      }
      if (tool_parse_size(is_long ? "--size" : "-s", optarg, 1, MAX_TRANSFER, &g.size) != 0)
        return -1;
      size_given = 1;
      client_option = client_option ? client_option : is_long ? "--size" : "-s";
      break;
    case OPT_REPEAT:
      if (tool_parse_uint("--repeat", optarg, 1, 1000000000, &g.repeat) != 0)
        return -1;
      client_option = client_option ? client_option : "--repeat";
      break;
    case OPT_OFFSET:
      if (tool_parse_size("--offset", optarg, 0, MAX_BUFFER_SIZE, &g.offset) != 0)
        return -1;
      client_option = client_option ? client_option : "--offset";
      break;
    case 'q': g.quiet = 1; break;
    case 'v': g.verbose = 1; break;
    case 'h': fputs(usage_text, stdout); exit(TOOL_EXIT_OK);
    case OPT_VERSION: tool_print_version(); exit(TOOL_EXIT_OK);
    case ':': tool_usage_error("option %s needs a value", tool_bad_option(argv)); return -1;
    default: tool_usage_error("unknown option %s", tool_bad_option(argv)); return -1;
    }
  }
  if (optind < argc)
    g.ip = argv[optind++];
  if (optind < argc) {
    tool_usage_error("unexpected argument '%s'", argv[optind]);
    return -1;
  }
  if (g.server) {
    if (client_option != NULL) {
      tool_usage_error("%s is a client option: it does not go with --server", client_option);
      return -1;
    }
    return 0;
  }
  if (buffer_given) {
    tool_usage_error("--buffer-size goes with --server");
    return -1;
  }
  if (g.ip == NULL) {
    tool_usage_error("no IP address given");
    return -1;
  }
  if (g.port == 0) {
    tool_usage_error("-p 0 (any free port) is for --server only: a client needs the "
                     "server's port");
    return -1;
  }
  if (g.string != NULL && size_given) {
    tool_usage_error("--string and -s (--size) exclude each other");
    return -1;
  }
  if (g.string == NULL && !size_given) {
    tool_usage_error("nothing to write: give --string STRING or -s SIZE");
    return -1;
  }
  if (g.string != NULL) {
    g.size = strlen(g.string);
    if (g.size == 0) {
      tool_usage_error("--string: the string is empty");
      return -1;
    }
    if (g.size > MAX_TRANSFER) {
      tool_usage_error("--string: the string is longer than %" PRIu64 " bytes", MAX_TRANSFER);
      return -1;
    }
  }
  return 0;
}

int main(int argc, char **argv) {
  int rc, open;

  tool_name = "ibmsg-rdma";
  setvbuf(stdout, NULL, _IOLBF, 0); /* a script waiting for "listening" sees it at once */
  if (parse_args(argc, argv) != 0)
    return TOOL_EXIT_USAGE;
  tool_catch_signals();

  rc = ibmsg_init_event_loop(&g.loop);
  if (rc != IBMSG_OK) {
    tool_error("cannot create the event loop: %s", ibmsg_strerror(rc));
    return TOOL_EXIT_FAILURE;
  }
  if (g.server)
    run_server();
  else
    run_client();

  /* The regions go before the loop (which refuses to go while one is registered); neither may
   * go while a socket is still open, which happens only when the loop itself failed. */
  open = g.server ? g.listening || g.clients != NULL : g.open;
  if (!open) {
    ibmsg_region *regions[] = {&g.buffer, &g.src, &g.dst};
    int have[] = {g.have_buffer, g.have_src, g.have_dst};
    for (int i = 0; i < 3; i++) {
      if (!have[i])
        continue;
      rc = ibmsg_deregister_region(regions[i]);
      if (rc != IBMSG_OK) {
        tool_error("cannot deregister a region: %s", ibmsg_strerror(rc));
        g.failed = 1;
        open = 1;
      }
    }
  }
  if (!open) {
    rc = ibmsg_destroy_event_loop(&g.loop);
    if (rc != IBMSG_OK) {
      tool_error("cannot destroy the event loop: %s", ibmsg_strerror(rc));
      g.failed = 1;
    }
  }
  return g.failed ? TOOL_EXIT_FAILURE : TOOL_EXIT_OK;
}
