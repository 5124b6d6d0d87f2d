// Requests and replies, the responder's side: kept answers, copies (dedup.cpp).
#pragma once
#include "handles.hpp"
#include "ibmsg.h"

namespace ibmsg {

bool answer_on_request(Socket *s, Slot *slot);  // a Request is due: false if it is a copy
// A rendezvous Request announced (not read yet): true if it is a copy (then it is not read).
bool answer_is_copy(Socket *s, Slot *slot);
// s: the connection named (nullptr if closed)
int reply_post(Socket *s, ibmsg_buffer *request, ibmsg_buffer *reply);
void answer_on_free(Slot *slot);  // the application freed a request it did not answer
void answers_closed(Socket *s);   // teardown: copies wait for no reply on it

}  // namespace ibmsg
