// Batching of work requests (batch.cpp): posted now, or at the end of the loop's round.
#pragma once

struct ibmsg__socket;
struct ibmsg__loop;

namespace ibmsg {

// A work request just queued on s's QP (send_queue: its send queue, else its receive queue) goes
// to the device at once outside callbacks or to an idle send queue, else at the end of the round
// (one list per connection); an immediate error.
int posted(::ibmsg__socket *s, bool send_queue);
// What the round posted goes to the devices; a refused list closes its connection.
void posts_flush(::ibmsg__loop *loop);

}  // namespace ibmsg
