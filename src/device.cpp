// A loop's RDMA devices: opened on the first connection that uses one, watched for completions,
// and released once no connection and no pool references them any more, so that an idle program
// never keeps a removed device from going away.
#include <new>

#include "internal.hpp"

namespace ibmsg {
namespace {

// A completion-channel event. The device's CQs are polled first, so that what woke the loop is
// handed out (and a reply posted) before the system call that reads the event; then the
// transport reads and acks it, and the core arms the CQ and polls it once more, unless a
// connection busy-polls (poll.cpp), so nothing that completes in between is missed.
//
// A channel that fails (a removed device's stays readable, and reading it fails) would wake the
// loop for ever: it is no longer watched, its CQs are not used again, the device's connections on
// this loop close, and later connections open the device anew.
void on_channel_readable(struct ev_loop *ev, ev_io *w, int) {
  Device *dev = static_cast<Device *>(w->data);
  LoopEntered entered(dev->loop);
  drain_device(dev);
  int err = tp::device_take_events(dev->tp, on_cq_ready, nullptr);
  if (err == IBMSG_OK) return;
  ev_io_stop(ev, w);
  loop_watch_fd(dev->loop, w->fd, false);
  dev->removed = true;
  for (DevCq *q = dev->cqs.front(); q; q = dev->cqs.next(q)) q->dead = true;
  // Every connection on it, also one still being set up (it would join a CQ nobody watches).
  Loop *loop = dev->loop;
  for (Socket *s = loop->sockets.front(); s; s = loop->sockets.next(s))
    if (s->dev == dev) socket_close(s, err);
}

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
  tp::device_close(dev->tp);
  loop->devices.remove(dev);
  if (removed) {
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

Device *device_get(Loop *loop, tp::DeviceKey key, int *err) {
  for (Device *d = loop->devices.front(); d; d = loop->devices.next(d)) {
    if (d->key == key && !d->removed) {  // a removed one goes once unused; a new one may come
      ++d->refs;
      return d;
    }
  }
  Device *dev = new (std::nothrow) Device();
  if (!dev) {
    *err = IBMSG_ENOMEM;
    return nullptr;
  }
  *err = tp::device_open(key, &dev->tp);
  if (*err) {
    delete dev;
    return nullptr;
  }
  if (tp::device_info(dev->tp).iwarp) {
    // iWARP devices deliver no immediate data, and the credits ride on it (ibmsg(7)).
    tp::device_close(dev->tp);
    delete dev;
    *err = IBMSG_ENODEV;
    return nullptr;
  }
  dev->loop = loop;
  dev->key = key;
  dev->refs = 1;
  int fd = tp::device_fd(dev->tp);
  ev_io_init(&dev->watcher, on_channel_readable, fd, EV_READ);
  dev->watcher.data = dev;
  ev_io_start(loop->ev, &dev->watcher);
  loop_watch_fd(loop, fd);
  loop->devices.push_back(dev);
  return dev;
}

void device_put(Device *dev) {
  if (--dev->refs > 0) return;
  // Released from the loop: the last reference may go inside one of the device's own callbacks.
  dev->loop->devices_dirty = true;
  loop_kick(dev->loop);
}

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
