// The one close path and the teardown (close.cpp).
#pragma once
#include "handles.hpp"

namespace ibmsg {

// The one close path, for every cause: records the first reason (a socket already closing keeps
// it), moves the socket to Closing and queues its teardown, which runs from the loop.
void close_begin(Socket *s, int reason);  // (lower tiers: socket_close)
constexpr double kLingerS = 1.0;  // how long a disconnect waits to send the done counts it owes
void on_linger_end(Timer *t);
// Runs due teardowns: releases everything and calls each closed callback.
void run_teardowns(Loop *loop);

void cancel_sends(Socket *s);  // closing: flight and queue complete (ECANCELED unless done)

}  // namespace ibmsg
