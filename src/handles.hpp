// The core's handles, declared (their structs are internal.hpp's and their files'): for headers
// that name them in declarations only.
#pragma once

struct ibmsg__socket;
struct ibmsg__loop;
struct ibmsg__slot;
struct ibmsg__region;
struct ibmsg__op;

namespace ibmsg {

using Socket = ::ibmsg__socket;
using Loop = ::ibmsg__loop;
using Slot = ::ibmsg__slot;
using Region = ::ibmsg__region;
using Op = ::ibmsg__op;
struct Device;
struct DevCq;
struct Pool;
struct Work;
struct LargeMem;
struct SharedRecv;
struct SharedSend;
struct Timer;
struct Grant;
struct Options;
struct PostAs;
struct OpArgs;

}  // namespace ibmsg
