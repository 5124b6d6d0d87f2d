// librdmacm: the event channel, ids, address and route resolution, connect / accept / reject /
// disconnect, addresses.
#include <fcntl.h>

#include <cstdint>
#include <cstring>
#include <new>

#include "transport/verbs.hpp"

namespace ibmsg::tp {

static_assert(kMaxRdAtomic == RDMA_MAX_RESP_RES && kMaxRdAtomic == RDMA_MAX_INIT_DEPTH,
              "kMaxRdAtomic is librdmacm's \"as many as possible\"");

namespace {

CmEventType type_of(rdma_cm_event_type t) {
  switch (t) {
    case RDMA_CM_EVENT_ADDR_RESOLVED: return CmEventType::AddrResolved;
    case RDMA_CM_EVENT_ADDR_ERROR: return CmEventType::AddrError;
    case RDMA_CM_EVENT_ROUTE_RESOLVED: return CmEventType::RouteResolved;
    case RDMA_CM_EVENT_ROUTE_ERROR: return CmEventType::RouteError;
    case RDMA_CM_EVENT_CONNECT_REQUEST: return CmEventType::ConnectRequest;
    case RDMA_CM_EVENT_ESTABLISHED: return CmEventType::Established;
    case RDMA_CM_EVENT_REJECTED: return CmEventType::Rejected;
    case RDMA_CM_EVENT_UNREACHABLE: return CmEventType::Unreachable;
    case RDMA_CM_EVENT_CONNECT_ERROR: return CmEventType::ConnectError;
    case RDMA_CM_EVENT_DISCONNECTED: return CmEventType::Disconnected;
    case RDMA_CM_EVENT_DEVICE_REMOVAL: return CmEventType::DeviceRemoval;
    default: return CmEventType::Other;
  }
}

rdma_conn_param conn_param(const ConnParam &p) {
  rdma_conn_param c;
  memset(&c, 0, sizeof c);
  c.private_data = p.pdata;
  c.private_data_len = p.plen;
  c.responder_resources = p.responder_resources;
  c.initiator_depth = p.initiator_depth;
  c.retry_count = p.retry_count;
  c.rnr_retry_count = p.rnr_retry_count;
  return c;
}

}  // namespace

int cm_channel_create(CmChannel **out) {
  rdma_event_channel *ch = rdma_create_event_channel();
  if (!ch) return errno == ENODEV || errno == ENOENT ? IBMSG_ENODEV : IBMSG_ESYS;
  int flags = fcntl(ch->fd, F_GETFL);
  if (flags < 0 || fcntl(ch->fd, F_SETFL, flags | O_NONBLOCK) < 0) {
    rdma_destroy_event_channel(ch);
    return IBMSG_ESYS;
  }
  *out = static_cast<CmChannel *>(ch);
  return IBMSG_OK;
}

void cm_channel_destroy(CmChannel *ch) { rdma_destroy_event_channel(ch); }
int cm_channel_fd(const CmChannel *ch) { return ch->fd; }

int cm_get_event(CmChannel *ch, CmEvent *out) {
  rdma_cm_event *ev;
  if (rdma_get_cm_event(ch, &ev)) return IBMSG_EAGAIN;
  out->type = type_of(ev->event);
  out->status = ev->status;
  out->id = wrap(ev->id);
  out->listen_id = ev->listen_id ? wrap(ev->listen_id) : nullptr;
  out->plen = 0;
  if (ev->param.conn.private_data && ev->param.conn.private_data_len) {
    // (a uint8_t: never more than kPrivateDataMax, the buffer's size)
    static_assert(kPrivateDataMax > UINT8_MAX, "pdata holds any private data length");
    out->plen = ev->param.conn.private_data_len;
    memcpy(out->pdata, ev->param.conn.private_data, out->plen);
  }
  rdma_ack_cm_event(ev);
  return IBMSG_OK;
}

int cm_id_create(CmChannel *ch, void *user, CmId **out) {
  rdma_cm_id *id;
  if (rdma_create_id(ch, &id, user, RDMA_PS_TCP))
    return errno == ENODEV || errno == ENOENT ? IBMSG_ENODEV : IBMSG_ESYS;
  *out = wrap(id);
  return IBMSG_OK;
}

void cm_id_destroy(CmId *id) {
  if (id->qp) rdma_destroy_qp(raw(id));
  rdma_destroy_id(raw(id));
}

void *cm_id_user(const CmId *id) { return id->context; }
void cm_id_set_user(CmId *id, void *user) { id->context = user; }

int cm_migrate(CmId *id, CmChannel *to) {
  if (rdma_migrate_id(raw(id), to) == 0) return IBMSG_OK;
  return errno == ENOMEM ? IBMSG_ENOMEM : IBMSG_ESYS;
}

int cm_bind(CmId *id, const sockaddr *addr) {
  if (rdma_bind_addr(raw(id), const_cast<sockaddr *>(addr)))
    return errno == EADDRINUSE ? IBMSG_EADDRINUSE : IBMSG_EADDRNOTAVAIL;
  return IBMSG_OK;
}

int cm_listen(CmId *id, int backlog) {
  if (rdma_listen(raw(id), backlog)) return errno == EADDRINUSE ? IBMSG_EADDRINUSE : from_errno(errno);
  return IBMSG_OK;
}

int cm_resolve_addr(CmId *id, const sockaddr *src, const sockaddr *dst, int timeout_ms) {
  if (rdma_resolve_addr(raw(id), const_cast<sockaddr *>(src), const_cast<sockaddr *>(dst),
                        timeout_ms))
    return errno == EADDRNOTAVAIL || errno == EINVAL ? IBMSG_EADDRNOTAVAIL : from_errno(errno);
  return IBMSG_OK;
}

int cm_resolve_route(CmId *id, int timeout_ms) {
  return rdma_resolve_route(raw(id), timeout_ms) ? from_errno(errno) : IBMSG_OK;
}

namespace {

// The QP's ack timeout, before connect or accept moves it to RTS.
int set_ack_timeout(CmId *id, const ConnParam &p) {
  if (!p.ack_timeout) return IBMSG_OK;
  uint8_t t = p.ack_timeout;
  return rdma_set_option(raw(id), RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT, &t, sizeof t)
             ? from_errno(errno)
             : IBMSG_OK;
}

}  // namespace

int cm_connect(CmId *id, const ConnParam &p) {
  if (int err = set_ack_timeout(id, p)) return err;
  rdma_conn_param c = conn_param(p);
  return rdma_connect(raw(id), &c) ? from_errno(errno) : IBMSG_OK;
}

void cm_notify_established(CmId *id) {
  rdma_notify(raw(id), IBV_EVENT_COMM_EST);  // EISCONN: the CM got there first, as wanted
}

int cm_accept(CmId *id, const ConnParam &p) {
  if (int err = set_ack_timeout(id, p)) return err;
  rdma_conn_param c = conn_param(p);
  if (rdma_accept(raw(id), &c) == 0) return IBMSG_OK;
  // The kernel refuses to accept a request whose peer gave up (timed out, or rejected by a
  // stale state): to the application, the peer went away.
  if (errno == EINVAL || errno == ECONNRESET || errno == ENOTCONN || errno == ETIMEDOUT)
    return IBMSG_ECONNRESET;
  return from_errno(errno);
}

int cm_reject(CmId *id, const void *pdata, uint8_t plen) {
  return rdma_reject(raw(id), pdata, plen) ? from_errno(errno) : IBMSG_OK;
}

int cm_disconnect(CmId *id) { return rdma_disconnect(raw(id)) ? from_errno(errno) : IBMSG_OK; }

DeviceKey cm_device(const CmId *id) { return id->verbs; }

void devices_rescan() {
  // librdmacm syncs its list here and closes the removed devices whose last id is gone.
  if (ibv_context **list = rdma_get_devices(nullptr)) rdma_free_devices(list);
}

const char *cm_device_name(const CmId *id) {
  return id->verbs ? ibv_get_device_name(id->verbs->device) : nullptr;
}

const sockaddr *cm_local_addr(const CmId *id) { return rdma_get_local_addr(const_cast<CmId *>(id)); }
const sockaddr *cm_peer_addr(const CmId *id) { return rdma_get_peer_addr(const_cast<CmId *>(id)); }

}  // namespace ibmsg::tp
