// What a lower tier tells a higher one (tiers.hpp): the few events that must travel upward go
// through these functions, which the loop tier registers (loop.cpp, kHooks) and the lower tiers
// call by pointer, never by name. Each says what happened, not what to do about it.
#pragma once

struct ibmsg__socket;
struct ibmsg__loop;

namespace ibmsg {

struct Device;

struct Hooks {
  // A connection must close (a resource failed, the peer broke the protocol, a work request
  // failed): the one close path (close.cpp).
  void (*close)(::ibmsg__socket *s, int reason);
  // Data credits or done counts became due to a connection's peer, or room for a control
  // message came: it sends a credit-only message if nothing else carries them (datapath.cpp);
  // inside the loop's callbacks, at the end of the round (ctrl_check), when a message the
  // callbacks posted may have carried them already.
  void (*ctrl_due)(::ibmsg__socket *s);
  // The end of the round for a connection with ctrl_check: what is due rides on the data message
  // the round queued last, if any; a credit-only message if still due.
  void (*ctrl_send)(::ibmsg__socket *s);
  // The accepting side's first message arrived before the CM's ESTABLISHED event: the
  // connection is up (cm.cpp).
  void (*data_established)(::ibmsg__socket *s);
  // A device's completion channel is readable (completion.cpp).
  void (*device_ready)(Device *dev);
  // The end of a round in which callbacks freed received messages (Loop::freed): their buffers
  // go back, before the round's posts go (message.cpp).
  void (*freed)(::ibmsg__loop *loop);
};

}  // namespace ibmsg
