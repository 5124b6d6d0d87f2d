// Socket set-up, the application's side (setup.cpp).
#pragma once
#include "handles.hpp"
#include "ibmsg.h"

namespace ibmsg {

int socket_listen(Loop *loop, ibmsg_socket *pub, const char *ip, unsigned short port, int max_conn,
                  const Options *opts);
int socket_connect(Loop *loop, ibmsg_socket *pub, const char *ip, unsigned short port,
                   const Options *opts);
int socket_accept(ibmsg_connection_request *req, ibmsg_socket *pub, const Options *opts);
int socket_reject(ibmsg_connection_request *req, const char *reason);

}  // namespace ibmsg
