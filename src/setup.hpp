// Socket set-up, the application's side (setup.cpp).
#pragma once
#include "handles.hpp"
#include "ibmsg.h"
#include "wire.hpp"

namespace ibmsg {

int socket_listen(Loop *loop, ibmsg_socket *pub, const char *ip, unsigned short port, int max_conn,
                  const Options *opts);
int socket_connect(Loop *loop, ibmsg_socket *pub, const char *ip, unsigned short port,
                   const Options *opts);
// ibmsg_accept on the listener's loop (a spreading listener's go to spread.cpp's accept_spread).
int accept_here(ibmsg_connection_request *req, ibmsg_socket *pub, const Options *opts);
int socket_reject(ibmsg_connection_request *req, const char *reason);

// For spread.cpp, which accepts on another loop what setup.cpp accepts here:
// a new socket for pub on loop (not yet open: nothing to tear down if set-up fails);
Socket *new_socket(Loop *loop, ibmsg_socket *pub, const Options *opts);
// s (new_socket's, with a request's id) set up on its loop and accepted, then open with its
// connect timer running; on failure the id is rejected and s deleted.
int accept_socket(Socket *s, const wire::Hello &hello);

}  // namespace ibmsg
