// What memory a connection or a loop holds (usage.cpp).
#pragma once

struct ibmsg__socket;
struct ibmsg__loop;
struct ibmsg_memory;

namespace ibmsg {

void memory_of_socket(const ::ibmsg__socket *s, ibmsg_memory *out);  // ibmsg_socket_memory
void memory_of_loop(const ::ibmsg__loop *loop, ibmsg_memory *out);   // ibmsg_loop_memory

}  // namespace ibmsg
