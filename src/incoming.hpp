// Where a large message goes: the message_incoming callback's choice (incoming.cpp).
#pragma once
#include "handles.hpp"
#include "ibmsg.h"
#include <cstddef>

namespace ibmsg {

// The RTS in slot (its RndvIn filled in, slot->own lent) arrived: the application's callback may
// choose a region or decline it (in.region, in.declined); one that needs a library buffer beyond
// the loop's rendezvous memory is declined. answers: the request a reply answers, if any.
void incoming_choose(Socket *s, Slot *slot, ibmsg_request *answers);
int incoming_to_region(ibmsg_incoming *in, ::ibmsg__region *r, size_t off);
int incoming_decline(ibmsg_incoming *in);

}  // namespace ibmsg
