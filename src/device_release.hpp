// Releasing unused devices (device_release.cpp).
#pragma once

struct ibmsg__loop;

namespace ibmsg {

void devices_collect(::ibmsg__loop *loop);  // releases the devices no one references (from the loop)
void devices_stop_rescans(::ibmsg__loop *loop);  // after a removed device's release (the loop goes)

}  // namespace ibmsg
