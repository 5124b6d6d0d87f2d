// What arrives (inbound.cpp).
#pragma once
#include "handles.hpp"
#include "transport/transport.hpp"

namespace ibmsg {

void on_recv_wc(Socket *s, Slot *slot, const tp::Completion &wc);  // inbound.cpp

}  // namespace ibmsg
