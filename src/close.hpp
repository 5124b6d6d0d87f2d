// The one close path and the teardown (close.cpp).
#pragma once
#include "handles.hpp"
#include "ibmsg.h"

namespace ibmsg {

// The one close path, for every cause: records the first reason (a socket already closing keeps
// it), moves the socket to Closing and queues its teardown, which runs from the loop.
void close_begin(Socket *s, int reason);  // (lower tiers: socket_close)
constexpr double kLingerS = 1.0;  // how long a disconnect waits to send the done counts it owes
void on_linger_end(Timer *t);
// Runs due teardowns: releases everything and calls each closed callback.
void run_teardowns(Loop *loop);

// The loop's connection_closed for pub (its counters readable meanwhile with
// ibmsg_socket_stats): the teardown's last step, and a failed accept on another loop's.
void closed_callback(Loop *loop, ibmsg_socket *pub, int reason, const ibmsg_stats &stats);

void cancel_sends(Socket *s);  // closing: flight and queue complete (ECANCELED unless done)

}  // namespace ibmsg
