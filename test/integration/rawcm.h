/*
 * rawcm.h - the connection manager's part of the raw peers that test_hostile.c and
 * test_requests.c write with librdmacm (both programs link with $(RDMA_LIBS)): the event channel
 * (non-blocking) and the ID, the events seen as flags, the address of the test's listener
 * resolved, and the ID's end. What a peer does beyond (its queue pair, its private data, what it
 * sends) is its own.
 *
 * Included after harness.h; everything here is static to the program.
 */
#ifndef IBMSG_TEST_RAWCM_H
#define IBMSG_TEST_RAWCM_H

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <rdma/rdma_cma.h>
#include <stdio.h>
#include <string.h>

typedef struct {
  struct rdma_event_channel *ch;
  struct rdma_cm_id *id;
  int has_qp; /* rdma_create_qp succeeded on id */
  int addr_resolved, route_resolved, established, rejected, disconnected;
  int cm_error; /* the event of a failure: address, route, unreachable, connect, device removal */
} rawcm;

/* Notes a CM event in the flags. */
static void rawcm_note(rawcm *cm, enum rdma_cm_event_type event) {
  switch (event) {
  case RDMA_CM_EVENT_ADDR_RESOLVED: cm->addr_resolved = 1; break;
  case RDMA_CM_EVENT_ROUTE_RESOLVED: cm->route_resolved = 1; break;
  case RDMA_CM_EVENT_ESTABLISHED: cm->established = 1; break;
  case RDMA_CM_EVENT_REJECTED: cm->rejected = 1; break;
  case RDMA_CM_EVENT_DISCONNECTED: cm->disconnected = 1; break;
  case RDMA_CM_EVENT_ADDR_ERROR:
  case RDMA_CM_EVENT_ROUTE_ERROR:
  case RDMA_CM_EVENT_UNREACHABLE:
  case RDMA_CM_EVENT_CONNECT_ERROR:
  case RDMA_CM_EVENT_DEVICE_REMOVAL: cm->cm_error = event; break;
  default: break;
  }
}

/* Creates the channel (non-blocking) and the ID (its context: the peer) and starts resolving the
 * address of the test's listener (ctx->addr, ctx->port); the peer then waits for addr_resolved
 * or cm_error. */
static void rawcm_resolve_addr(h_ctx *ctx, rawcm *cm, void *peer) {
  struct addrinfo hints, *res = NULL;
  char port[8];
  int flags, rc;

  cm->ch = rdma_create_event_channel();
  H_CHECK(cm->ch != NULL, "rdma_create_event_channel: %s", strerror(errno));
  flags = fcntl(cm->ch->fd, F_GETFL);
  H_CHECK(fcntl(cm->ch->fd, F_SETFL, flags | O_NONBLOCK) == 0, "fcntl: %s", strerror(errno));
  H_CHECK(rdma_create_id(cm->ch, &cm->id, peer, RDMA_PS_TCP) == 0, "rdma_create_id: %s",
          strerror(errno));
  memset(&hints, 0, sizeof hints);
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  snprintf(port, sizeof port, "%u", (unsigned)ctx->port);
  H_CHECK(getaddrinfo(ctx->addr, port, &hints, &res) == 0 && res, "cannot resolve %s", ctx->addr);
  rc = rdma_resolve_addr(cm->id, NULL, res->ai_addr, 2000);
  freeaddrinfo(res);
  H_CHECK(rc == 0, "rdma_resolve_addr: %s", strerror(errno));
}

/* Ends the ID: disconnects it if it is connected, destroys its queue pair and the ID. poll(peer)
 * takes the peer's events before, and after the disconnect (an ID cannot be destroyed with
 * events not acknowledged). The channel stays (the peer destroys it last). */
static void rawcm_destroy_id(rawcm *cm, void (*poll)(void *peer), void *peer) {
  poll(peer);
  if (!cm->id) return;
  if (cm->established && !cm->disconnected) rdma_disconnect(cm->id);
  poll(peer);
  if (cm->has_qp) rdma_destroy_qp(cm->id);
  rdma_destroy_id(cm->id);
}

#endif
