// Per-socket deadlines on the loop (timer.cpp).
#pragma once
#include <ev.h>

#include "handles.hpp"
#include "list.hpp"

namespace ibmsg {

// A one-shot deadline on a loop; fn runs from the loop (with the re-entry guard held).
struct Timer {
  ev_timer w;
  Loop *loop;
  void (*fn)(Timer *);
  void *data;
  ListNode node;  // in the loop's list of running timers
};
void timer_init(Timer *t, Loop *loop, void (*fn)(Timer *), void *data);
void timer_start(Timer *t, double seconds);
void timer_stop(Timer *t);
// Seconds until the first running timer of the loop fires, or -1 if none runs.
double timers_next(Loop *loop);

}  // namespace ibmsg
