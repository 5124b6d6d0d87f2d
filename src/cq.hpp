// A device's completion queues (cq.cpp).
#pragma once
#include <cstdint>

#include "handles.hpp"

namespace ibmsg {

// A CQ of the device with room for need more completions (grown, or a new one).
DevCq *device_cq_reserve(Device *dev, uint32_t need, int *err);
void device_cqs_destroy(Device *dev);

}  // namespace ibmsg
