// Error texts and names from one table for every code (see IBMSG_ERRNO_MAP), and the count of
// invalid state transitions.
#include "errors.hpp"

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "internal.hpp"

#define IBMSG__CHECK_ERRNO(name, value, text) \
  static_assert(name == value, "IBMSG_" #name " must equal the system's " #name);
IBMSG_ERRNO_MAP(IBMSG__CHECK_ERRNO)
#undef IBMSG__CHECK_ERRNO

namespace ibmsg {
namespace {
std::atomic<unsigned long> g_invalid_transitions{0};
}

void note_invalid_transition(State from, Event ev) {
  ++g_invalid_transitions;
  // A bug in the core, never the application's fault: say so where a developer looks.
  if (getenv("IBMSG_DEBUG"))
    fprintf(stderr, "ibmsg: bug: invalid transition from %s (event %d)\n", state_name(from),
            int(ev));
}

unsigned long invalid_transitions() { return g_invalid_transitions.load(); }

const char *error_text(int code) {
  switch (code) {
    case IBMSG_OK: return "success";
#define IBMSG__TEXT(name, value, text) case value: return text;
    IBMSG_ERRNO_MAP(IBMSG__TEXT)
    IBMSG_ERROR_MAP(IBMSG__TEXT)
#undef IBMSG__TEXT
    default: break;
  }
  if (code > 0 && code < IBMSG_ERRNO_MAX) return strerror(code);
  return "unknown ibmsg error code";
}

const char *error_name(int code) {
  switch (code) {
    case IBMSG_OK: return "IBMSG_OK";
#define IBMSG__NAME(name, value, text) case value: return "IBMSG_" #name;
    IBMSG_ERRNO_MAP(IBMSG__NAME)
    IBMSG_ERROR_MAP(IBMSG__NAME)
#undef IBMSG__NAME
    default: return "IBMSG_UNKNOWN";
  }
}

}  // namespace ibmsg

