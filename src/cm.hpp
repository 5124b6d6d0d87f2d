// Connection-manager events (cm.cpp).
#pragma once
#include "handles.hpp"
#include "transport/transport.hpp"

namespace ibmsg {

void on_cm_event(Loop *loop, const tp::CmEvent &ev);
void on_connect_timeout(Timer *t);
void reject_id(tp::CmId *id, const char *text);
void establish(Socket *s, bool by_data = false);  // it is up (CM event, or data overtook it)

}  // namespace ibmsg
