// Options: their values and limits, from the table of options (IBMSG_OPTION_MAP in options.hpp).
// The loop keeps the defaults (ibmsg_setopt); an ibmsg_options set starts as a copy of them and is
// handed to ibmsg_listen_opts/connect_opts/accept_opts.
#include "options.hpp"

#include <cstring>
#include <limits>
#include <type_traits>

#include "internal.hpp"

namespace ibmsg {
namespace {

// Each row's default within its range, and its range within what its field holds.
template <class T, class D, class L, class H>
constexpr bool default_in_range(const D &def, L lo, H hi) {
  if constexpr (std::is_same_v<T, Name>) {
    size_t n = 0;
    while (def[n]) ++n;
    return lo >= 0 && size_t(hi) < sizeof(T) && n >= size_t(lo) && n <= size_t(hi);
  } else if constexpr (std::is_same_v<T, int>) {
    return (long long)lo >= INT_MIN && (long long)hi <= INT_MAX && lo <= hi &&
           (long long)def >= (long long)lo && (long long)def <= (long long)hi;
  } else {  // a size: an int, or a uint64_t (0 only where it means something: no limit)
    return lo >= 0 && (unsigned long long)hi <= std::numeric_limits<T>::max() &&
           (unsigned long long)def >= (unsigned long long)lo &&
           (unsigned long long)def <= (unsigned long long)hi;
  }
}
#define IBMSG__CHECK_OPTION(id, field, type, min, max, def, scope, unit)    \
  static_assert(default_in_range<type>(def, min, max),                      \
                "IBMSG_OPT_" #id ": the default or the range does not fit");
IBMSG_OPTION_MAP(IBMSG__CHECK_OPTION)
#undef IBMSG__CHECK_OPTION

// Setting and reading one field, by its type: an int takes an int; a size an int or a uint64_t
// (len 8, for sizes beyond INT_MAX); a Name a string of up to len bytes, which needs no NUL.
int set_field(int *f, const void *value, size_t len, long long lo, long long hi) {
  int v;
  if (len != sizeof v) return IBMSG_EINVAL;
  memcpy(&v, value, sizeof v);
  if (v < lo || v > hi) return IBMSG_EINVAL;
  *f = v;
  return IBMSG_OK;
}

template <class T>
int set_size(T *f, const void *value, size_t len, unsigned long long lo, unsigned long long hi) {
  uint64_t v;
  if (len == sizeof(int)) {
    int i;
    memcpy(&i, value, sizeof i);
    if (i < 0) return IBMSG_EINVAL;
    v = uint64_t(i);
  } else if (len == sizeof v) {
    memcpy(&v, value, sizeof v);
  } else {
    return IBMSG_EINVAL;
  }
  if (v < lo || v > hi) return IBMSG_EINVAL;
  *f = T(v);
  return IBMSG_OK;
}
int set_field(uint32_t *f, const void *value, size_t len, unsigned long long lo,
              unsigned long long hi) {
  return set_size(f, value, len, lo, hi);
}
int set_field(uint64_t *f, const void *value, size_t len, unsigned long long lo,
              unsigned long long hi) {
  return set_size(f, value, len, lo, hi);
}

int set_field(Name *f, const void *value, size_t len, size_t lo, size_t hi) {
  const char *s = static_cast<const char *>(value);
  size_t n = strnlen(s, len);
  if (n < lo || n > hi) return IBMSG_EINVAL;
  memcpy(*f, s, n);
  (*f)[n] = '\0';
  return IBMSG_OK;
}

int get_field(const int *f, void *value, size_t *len) {
  if (*len < sizeof(int)) return IBMSG_EINVAL;
  memcpy(value, f, sizeof(int));
  *len = sizeof(int);
  return IBMSG_OK;
}

// Into a uint64_t if len says so; an int gets at most INT_MAX (as large as it can say).
int get_size(uint64_t v64, void *value, size_t *len) {
  if (*len == sizeof(uint64_t)) {
    memcpy(value, &v64, sizeof v64);
    return IBMSG_OK;
  }
  if (*len < sizeof(int)) return IBMSG_EINVAL;
  int v = v64 > uint64_t(INT_MAX) ? INT_MAX : int(v64);
  memcpy(value, &v, sizeof v);
  *len = sizeof v;
  return IBMSG_OK;
}
int get_field(const uint32_t *f, void *value, size_t *len) { return get_size(*f, value, len); }
int get_field(const uint64_t *f, void *value, size_t *len) { return get_size(*f, value, len); }

int get_field(const Name *f, void *value, size_t *len) {
  size_t n = strlen(*f);
  if (*len < n) return IBMSG_EINVAL;
  memcpy(value, *f, n);
  if (*len > n) static_cast<char *>(value)[n] = '\0';
  *len = n;
  return IBMSG_OK;
}

}  // namespace

const Options *options_of(const ibmsg_options *o, bool *bad) {
  *bad = o && o->magic != kOptionsMagic;
  return o && !*bad ? &o->opts : nullptr;
}

int options_set(Options *o, int option, const void *value, size_t len) {
  if (!value) return IBMSG_EINVAL;
  switch (option) {
#define IBMSG__SET(id, field, type, min, max, def, scope, unit) \
  case IBMSG_OPT_##id: return set_field(&o->field, value, len, min, max);
    IBMSG_OPTION_MAP(IBMSG__SET)
#undef IBMSG__SET
    default: return IBMSG_EINVAL;
  }
}

int options_get(const Options *o, int option, void *value, size_t *len) {
  if (!value || !len) return IBMSG_EINVAL;
  switch (option) {
#define IBMSG__GET(id, field, type, min, max, def, scope, unit) \
  case IBMSG_OPT_##id: return get_field(&o->field, value, len);
    IBMSG_OPTION_MAP(IBMSG__GET)
#undef IBMSG__GET
    default: return IBMSG_EINVAL;
  }
}

}  // namespace ibmsg
