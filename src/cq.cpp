// The completion queues of a device on a loop, shared by the device's connections: one, grown
// (doubling) as connections come, and another when it cannot grow; polling them, each completion
// going to the connection whose work request it names. Arming and busy polling are poll.cpp's.
#include "cq.hpp"

#include <memory>
#include <new>

#include "internal.hpp"

namespace ibmsg {

DevCq *device_cq_reserve(Device *dev, uint32_t need, int *err) {
  constexpr uint32_t kMinCq = 256;
  const uint32_t max = tp::device_info(dev->tp).max_cqe;
  *err = IBMSG_OK;
  for (DevCq *q = dev->cqs.front(); q; q = dev->cqs.next(q)) {
    if (q->dead) continue;
    const uint64_t want = uint64_t(q->need) + need;
    if (want <= q->size) return q;
    if (want > max) continue;
    // Doubling: growing costs a resize now and then, not one per connection.
    uint64_t size = 2 * uint64_t(q->size);
    if (size < want) size = want;
    if (size > max) size = max;
    if (tp::cq_resize(q->cq, uint32_t(size)) == IBMSG_OK) {
      q->size = uint32_t(size);
      return q;
    }
  }
  // All full (or none yet): another CQ on the device.
  uint64_t size = 2 * uint64_t(need);
  if (size < kMinCq) size = kMinCq;
  if (size > max) size = max;
  if (need > size) {
    *err = IBMSG_EINVAL;  // more than the device's largest CQ for one connection
    return nullptr;
  }
  std::unique_ptr<DevCq> q(new (std::nothrow) DevCq());
  *err = q ? tp::cq_create(dev->tp, uint32_t(size), dev, &q->cq) : IBMSG_ENOMEM;
  if (*err) return nullptr;
  q->size = uint32_t(size);
  dev->cqs.push_back(q.get());
  return q.release();
}

void device_cqs_destroy(Device *dev) {
  while (DevCq *q = dev->cqs.pop_front()) {
    tp::cq_destroy(q->cq);  // its connections are gone, and drained it
    delete q;
  }
}

}  // namespace ibmsg
