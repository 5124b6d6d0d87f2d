// Batching of work requests (batch.cpp): posted now, or at the end of the loop's round.
#pragma once

struct ibmsg__socket;
struct ibmsg__loop;

namespace ibmsg {

// A work request just queued on s's QP (send_queue: its send queue, else its receive queue) goes
// to the device at once outside callbacks or to an idle send queue, else at the end of the round
// (one list per connection); an immediate error.
int posted(::ibmsg__socket *s, bool send_queue);
// The end of the round: the received messages the callbacks freed go back (Loop::freed, through
// hooks.hpp: freed), then what the round posted goes to the devices; a refused list closes its
// connection. A connection marked ctrl_check first lets what became due ride on its last queued
// message, or sends the credit-only message still due (hooks.hpp: ctrl_send).
void posts_flush(::ibmsg__loop *loop);
// s is to be looked at by posts_flush at the end of the round (it has ctrl_check).
void flush_later(::ibmsg__socket *s);

}  // namespace ibmsg
