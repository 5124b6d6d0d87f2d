// Connect pacing (pace.cpp): at most IBMSG_OPT_CONNECT_LIMIT outgoing connection attempts of a
// loop are under way at once; further ibmsg_connect() calls wait their turn, in order.
#pragma once
#include <sys/socket.h>

#include <cstdint>

#include "handles.hpp"

namespace ibmsg {

enum class PaceState : uint8_t { None, Waiting, UnderWay };

// The addresses of an attempt that waits (new'd while it waits, deleted when it starts or ends).
struct PaceWait {
  sockaddr_storage src, dst;
  bool have_src;
};

// s (open, state ResolvingAddr, its id made) starts now if the loop has room: its address is
// resolved and its connect timer started; IBMSG_OK, or the error of the start (nothing counted:
// the caller tears s down). Otherwise it waits with a copy of its addresses (IBMSG_ENOMEM if
// none can be made).
int pace_connect(Socket *s, const sockaddr_storage *src, const sockaddr_storage &dst);
// s's attempt ended (established, or s closes, also while it waited): the next waiting ones
// start.
void pace_done(Socket *s);

}  // namespace ibmsg
