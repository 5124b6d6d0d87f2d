// Delivery of received messages, and their return (deliver.cpp).
#pragma once

struct ibmsg__socket;
struct ibmsg__slot;
struct ibmsg_buffer;

namespace ibmsg {

// A received message (slot lent, msg filled in) goes to the application, or waits in order
// behind a rendezvous still being read.
void deliver_msg(::ibmsg__socket *s, ::ibmsg__slot *slot);
// Hands the messages at the front of the delivery queue to the application while they are
// complete (after a rendezvous read completed one).
void deliver_ready(::ibmsg__socket *s);
// ibmsg_free_msg.
int msg_free(ibmsg_buffer *msg);

}  // namespace ibmsg
