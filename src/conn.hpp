// A connection's resources and parameters, and the registry of open sockets (conn.cpp).
#pragma once
#include <sys/socket.h>

#include <cstddef>
#include <cstdint>

#include "ibmsg.h"
#include "state.hpp"
#include "transport/transport.hpp"
#include "wire.hpp"

struct ibmsg__socket;

namespace ibmsg {

void register_open(::ibmsg__socket *s);  // it opened
bool socket_is_open(const ibmsg_socket *pub);  // of an open socket (not yet closed), any loop
// A struct accepted onto another loop counts as open from the accept (IBMSG_ESTATE if it is
// open already, IBMSG_ENOMEM) until that loop has opened it, or failed to: socket_handed.
int socket_hand_over(const ibmsg_socket *pub);
void socket_handed(const ibmsg_socket *pub);
void socket_unregister(::ibmsg__socket *s);  // it closed
// Joins a CQ, creates the QP and the pools, posts every receive buffer (s->dev, s->opts set).
int conn_open(::ibmsg__socket *s);
// Destroys the QP, leaves its CQ, gives the pools back (they go once the application returned
// every buffer). Soft-RoCE leaves the QP's completions in the CQ, naming this socket's memory:
// with drain (teardown) it polls the CQs now; with park (a failed accept: an API call, so no
// callbacks) the receive pool waits for the loop's poll.
void conn_release(::ibmsg__socket *s, bool drain = false, bool park = false);
wire::Hello my_hello(const ::ibmsg__socket *s);
// The hello (encoded into hello) and the transport settings for connect and accept.
void fill_conn_param(const ::ibmsg__socket *s, tp::ConnParam *p, uint8_t *hello);
// Adopts the peer's hello: credits, maximum size, common features.
void set_peer(::ibmsg__socket *s, const wire::Hello &h);
bool set_state(::ibmsg__socket *s, Event ev);
// Whether the socket's id is on the device IBMSG_OPT_DEVICE names (any, if it names none).
bool device_matches(const ::ibmsg__socket *s);
// The numeric address of sa into buf and its port into *port (either may be NULL).
int format_address(const sockaddr *sa, char *buf, size_t len, unsigned short *port);

}  // namespace ibmsg
