// Releasing a loop's devices once nothing references them (from the loop: the last reference may
// go inside one of the device's own callbacks), and, after a removed device's release, asking
// rdma-core to look at the device list again until the kernel finished the removal.
#include "device_release.hpp"

#include "internal.hpp"
#include "cq.hpp"
#include "memory.hpp"

namespace ibmsg {
namespace {

constexpr int kRescans = 50;            // for 5 s: the kernel finishes the removal meanwhile
constexpr double kRescanInterval = 0.1;

void on_rescan(Timer *t) {
  Loop *loop = t->loop;
  tp::devices_rescan();
  if (--loop->rescans_left > 0) timer_start(&loop->rescan, kRescanInterval);
}

void release(Device *dev) {
  Loop *loop = dev->loop;
  // A removal that only sockets already closing heard of is not marked: ask the system.
  bool removed = dev->removed || tp::device_gone(dev->tp);
  ev_io_stop(loop->ev, &dev->watcher);
  device_large_clear(dev);
  device_cqs_destroy(dev);
  // The device's protection domain may live on (another loop's device object, a region's
  // registration): then whoever lets go of it last has rdma-core rescan.
  const bool domain_kept = tp::device_close(dev->tp, removed);
  loop->devices.remove(dev);
  if (removed && !domain_kept) {
    // rdma-core closes a removed device only once it notices it is gone from the device list,
    // which the kernel updates while the removal goes on: look again for a while.
    tp::devices_rescan();
    if (!loop->rescan.fn) timer_init(&loop->rescan, loop, on_rescan, nullptr);
    loop->rescans_left = kRescans;
    timer_start(&loop->rescan, kRescanInterval);
  }
  delete dev;
}

}  // namespace

void devices_stop_rescans(Loop *loop) {
  if (loop->rescan.fn) timer_stop(&loop->rescan);
}

void devices_collect(Loop *loop) {
  if (!loop->devices_dirty) return;
  loop->devices_dirty = false;
  Device *d = loop->devices.front();
  while (d) {
    Device *next = loop->devices.next(d);
    if (d->refs == 0) release(d);
    d = next;
  }
}

}  // namespace ibmsg
