// A loop's RDMA devices: opened on the first connection that uses one, watched for completions,
// and released once no connection and no pool references them any more, so that an idle program
// never keeps a removed device from going away.
#include "device.hpp"

#include <memory>
#include <new>

#include "internal.hpp"
#include "wake.hpp"

namespace ibmsg {
namespace {

// A completion-channel event: handled above (completion.cpp), with the loop entered.
void on_channel_readable(struct ev_loop *, ev_io *w, int) {
  Device *dev = static_cast<Device *>(w->data);
  LoopEntered entered(dev->loop);
  dev->loop->hooks->device_ready(dev);
}

}  // namespace

Device *device_get(Loop *loop, tp::DeviceKey key, int *err) {
  for (Device *d = loop->devices.front(); d; d = loop->devices.next(d)) {
    if (d->key == key && !d->removed) {  // a removed one goes once unused; a new one may come
      ++d->refs;
      return d;
    }
  }
  std::unique_ptr<Device> owned(new (std::nothrow) Device());
  *err = owned ? tp::device_open(key, &owned->tp) : IBMSG_ENOMEM;
  if (*err) return nullptr;
  if (tp::device_info(owned->tp).iwarp) {
    // iWARP devices deliver no immediate data, and the credits ride on it (ibmsg(7)).
    tp::device_close(owned->tp);
    *err = IBMSG_ENODEV;
    return nullptr;
  }
  Device *dev = owned.release();
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

}  // namespace ibmsg
