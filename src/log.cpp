// Log lines: CM events, state changes, credit stalls, keepalive probes and misses, and why
// connections close. They go to the loop's log callback (ibmsg_event_loop.log) and, with the
// environment variable IBMSG_DEBUG set to a level (1 errors ... 4 debug; "1" and up also prints the
// levels below it), to stderr as "LOG: " lines, as the original ibmsg printed them.
#include "log.hpp"

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <unistd.h>

#include "internal.hpp"

namespace ibmsg {
namespace {

const char *level_name(int level) {
  switch (level) {
    case IBMSG_LOG_ERROR: return "error";
    case IBMSG_LOG_WARN: return "warn";
    case IBMSG_LOG_INFO: return "info";
    default: return "debug";
  }
}

}  // namespace

void log_init(Loop *loop) {
  const char *v = getenv("IBMSG_DEBUG");
  int level = v ? atoi(v) : 0;
  // Any other word than a number turns on everything.
  if (v && *v && level == 0 && !(v[0] == '0' && v[1] == '\0')) level = IBMSG_LOG_DEBUG;
  loop->debug = level < 0 ? 0 : level > IBMSG_LOG_DEBUG ? IBMSG_LOG_DEBUG : level;
}

void log_write(Loop *loop, const Socket *s, int level, const char *fmt, ...) {
  char text[256];
  int n = 0;
  if (s) n = snprintf(text, sizeof text, "connection %llu: ", (unsigned long long)s->res.serial);
  if (n < 0) n = 0;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(text + n, sizeof text - size_t(n), fmt, ap);
  va_end(ap);
  if (level <= loop->debug)
    fprintf(stderr, "LOG: ibmsg[%ld] %s: %s\n", long(getpid()), level_name(level), text);
  if (auto cb = loop->pub->log) cb(loop->pub, s ? s->pub : nullptr, level, text);
}

}  // namespace ibmsg
