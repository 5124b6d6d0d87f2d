// Send buffers: slots of the device's slabs (send_slots.cpp).
#pragma once
#include "handles.hpp"
#include "ibmsg.h"

namespace ibmsg {

int send_join(Socket *s);   // conn_open: the device's send buffers of its size
void send_leave(Socket *s);  // conn_release: its messages still allocated belong to none now
Slot *send_get(Socket *s, int *err);  // a slot for a message (IBMSG_EAGAIN at the send depth)
void send_put(Slot *slot);            // the application freed it (or an allocation failed)
void send_free(Slot *slot);  // the same, with its large buffer and its region's hold
void send_memory(const Device *dev, ibmsg_memory *out);

}  // namespace ibmsg
