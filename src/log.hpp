// Log lines (log.cpp): to the loop's log callback, and to stderr with IBMSG_DEBUG set; formatted
// only when one of them takes the level.
#pragma once
#include "internal.hpp"  // (it reads the loop: included at internal.hpp's end)

namespace ibmsg {

inline bool log_on(const Loop *loop, int level) { return loop->pub->log || level <= loop->debug; }
void log_write(Loop *loop, const ::ibmsg__socket *s, int level, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
void log_init(Loop *loop);  // reads IBMSG_DEBUG

}  // namespace ibmsg

#define IBMSG_LOG(s, level, ...)                                 \
  do {                                                           \
    if (::ibmsg::log_on((s)->loop, level))                       \
      ::ibmsg::log_write((s)->loop, (s), level, __VA_ARGS__);    \
  } while (0)
