// Connections accepted onto other loops (spread.cpp): ibmsg_accept_on, ibmsg_listen_spread.
#pragma once
#include "handles.hpp"
#include "ibmsg.h"

namespace ibmsg {

// ibmsg_accept_on: req's connection handed over to loop `to` (another than the listener's),
// which accepts it at its next iteration. IBMSG_ENOMEM or the CM's error leave req undecided.
int accept_on(ibmsg_connection_request *req, Loop *to, ibmsg_socket *pub, const Options *opts);
// ibmsg_accept on a listener that spreads: onto the next of its loops.
int accept_spread(ibmsg_connection_request *req, ibmsg_socket *pub, const Options *opts);
int listen_spread(Socket *l, Loop *const *loops, int count);  // count 0..kSpreadMax (api.cpp)

}  // namespace ibmsg
