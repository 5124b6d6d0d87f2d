// The loop's memory for the destinations of rendezvous reads (rndv_memory.cpp): the library's
// large buffers of received messages, from their first read until the application frees them,
// stay within IBMSG_OPT_RNDV_MEMORY, all the loop's connections together; a connection whose
// next message does not fit waits in the loop's queue, in the order the connections asked.
// It only counts and queues: rndv.cpp takes the buffers and wakes the waiters.
#pragma once
#include "handles.hpp"
#include <cstddef>
#include <cstdint>

namespace ibmsg {

// Bytes of the destination the library allocates for a message of length bytes (its size class;
// SIZE_MAX if none is that large).
size_t rndv_dest_bytes(uint64_t length);
// Room for a destination of bytes, counted now; false: s waits in the queue (or still does). With
// nothing counted, any size gets its turn (one above the cap is declined before it asks: this is
// for a cap lowered meanwhile).
bool rndv_mem_take(Socket *s, size_t bytes);
void rndv_mem_give(Loop *loop, size_t bytes);  // a destination went back
Socket *rndv_mem_first(const Loop *loop);      // the first waiting connection, if any
void rndv_mem_leave(Socket *s);                // s closes: out of the queue

}  // namespace ibmsg
