// Error texts and names, and the version: one table for every code (see IBMSG_ERRNO_MAP).
#include <cerrno>
#include <cstring>

#include "internal.hpp"

#define IBMSG__CHECK_ERRNO(name, value, text) \
  static_assert(name == value, "IBMSG_" #name " must equal the system's " #name);
IBMSG_ERRNO_MAP(IBMSG__CHECK_ERRNO)
#undef IBMSG__CHECK_ERRNO

namespace ibmsg {

int from_errno(int e) {
  switch (e) {
#define IBMSG__PASS(name, value, text) case value:
    IBMSG_ERRNO_MAP(IBMSG__PASS)
#undef IBMSG__PASS
    return e;
    case ENOENT:
    case ENXIO: return IBMSG_ENODEV;
    case ENETUNREACH: return IBMSG_EHOSTUNREACH;
    default: return IBMSG_ESYS;
  }
}

}  // namespace ibmsg

extern "C" {

const char *ibmsg_strerror(int code) {
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

const char *ibmsg_err_name(int code) {
  switch (code) {
    case IBMSG_OK: return "IBMSG_OK";
#define IBMSG__NAME(name, value, text) case value: return "IBMSG_" #name;
    IBMSG_ERRNO_MAP(IBMSG__NAME)
    IBMSG_ERROR_MAP(IBMSG__NAME)
#undef IBMSG__NAME
    default: return "IBMSG_UNKNOWN";
  }
}

void ibmsg_version(int *major, int *minor, int *patch) {
  if (major) *major = IBMSG_VERSION_MAJOR;
  if (minor) *minor = IBMSG_VERSION_MINOR;
  if (patch) *patch = IBMSG_VERSION_PATCH;
}

#define IBMSG__STR2(x) #x
#define IBMSG__STR(x) IBMSG__STR2(x)
const char *ibmsg_version_string(void) {
  return IBMSG__STR(IBMSG_VERSION_MAJOR) "." IBMSG__STR(IBMSG_VERSION_MINOR) "." IBMSG__STR(
      IBMSG_VERSION_PATCH);
}

}  // extern "C"
