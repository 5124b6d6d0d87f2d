// Shared by the transport's files only: errno values from rdma-core to ibmsg codes, and the verbs
// objects behind the handles.
#pragma once
#include <cerrno>
#include <new>

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include "ibmsg.h"
#include "transport/transport.hpp"

namespace ibmsg::tp {

inline int from_errno(int e) {
  switch (e) {
#define IBMSG__PASS(name, value, text) case value:
    IBMSG_ERRNO_MAP(IBMSG__PASS)
#undef IBMSG__PASS
    return e;
    case ENOENT:
    case ENXIO: return IBMSG_ENODEV;
    case ENETUNREACH: return IBMSG_EHOSTUNREACH;
    default: return IBMSG_ESYS;
  }
}

// The CM handles are librdmacm's own objects: no wrapper to allocate or free.
struct CmChannel : rdma_event_channel {};
struct CmId : rdma_cm_id {};
inline rdma_cm_id *raw(CmId *id) { return id; }
inline CmId *wrap(rdma_cm_id *id) { return static_cast<CmId *>(id); }

ibv_pd *device_pd(Device *d);
ibv_cq *cq_verbs(Cq *c);
ibv_srq *srq_verbs(Srq *s);
ibv_mw *mw_verbs(Mw *w);
ibv_mr *mr_verbs(const Mr *m);

inline int alloc_error() { return errno == ENOMEM ? IBMSG_ENOMEM : IBMSG_ESYS; }

// A new handle H, its rdma-core object made by make(H *) (IBMSG_OK or a code: then the handle
// goes), into *out: the one shape of every create of the transport.
template <class H, class Make>
int make_handle(H **out, Make make) {
  H *h = new (std::nothrow) H();
  if (!h) return IBMSG_ENOMEM;
  const int err = make(h);
  if (err) {
    delete h;
    return err;
  }
  *out = h;
  return IBMSG_OK;
}

}  // namespace ibmsg::tp
