// The application's messages (message.cpp).
#pragma once
#include <cstddef>
#include <cstdint>

#include "handles.hpp"
#include "ibmsg.h"

namespace ibmsg {

int msg_alloc(Socket *s, ibmsg_buffer *msg, size_t size);
int msg_post(Socket *s, ibmsg_buffer *msg, bool has_imm, uint32_t imm, const PostAs *as = nullptr);
// Gives msg back (ibmsg_free_msg without the answer: deliver.cpp's msg_free). A received message
// freed inside the loop's callbacks goes back at the end of the round (Loop::freed).
int msg_release(ibmsg_buffer *msg);
// The same for a received message known to be lent (msg_lent).
int msg_give_back(ibmsg_buffer *msg);
// The end of the round (hooks.hpp: freed): the received messages freed in it go back.
void msgs_freed_back(Loop *loop);
bool msg_lent(const ibmsg_buffer *msg);  // a received message lent to the application
int msg_from_region(Socket *s, ibmsg_buffer *msg, ::ibmsg__region *r, size_t off, size_t size);

}  // namespace ibmsg
