// Completions (completion.cpp): polling a device's CQs and handing each completion to its
// connection's handler; the device's completion channel and the busy poller.
#pragma once

struct ibmsg__loop;
struct ibmsg__socket;

namespace ibmsg {

struct Device;
namespace tp {
struct Completion;
}

// One completion of s's work request: to the handler of its kind.
void on_completion(::ibmsg__socket *s, const tp::Completion &wc);
// Polls the device's CQs empty, each completion to its connection (callbacks: loop context only);
// how many there were.
int drain_device(Device *dev);
// A CQ of dev failed (marked dead by the caller): the connections on it close with reason.
void device_cq_failed(Device *dev, int reason);
void devices_unpark(::ibmsg__loop *loop);  // polls the CQs of parked pools, then lets them go
// The device's completion channel is readable (Hooks::device_ready).
void device_ready(Device *dev);
void poll_init(::ibmsg__loop *loop);  // the loop's poller (an ev_idle watcher)
void on_cq_ready(void *cq_user, void *arg);  // for tp::device_take_events
// A CQ of the device signalled: poll them, then arm them unless a connection on it polls.
void poll_cq_ready(Device *dev);
void poll_rearm(Device *dev);  // polling on dev stopped: arm its CQ, poll it once more

}  // namespace ibmsg
