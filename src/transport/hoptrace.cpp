// The hop trace (hoptrace.hpp): fixed arrays of time stamp counter readings, written out once at
// exit, with the counter's rate measured against CLOCK_MONOTONIC over the process's life.
#include "transport/hoptrace.hpp"

#ifdef IBMSG_HOP_TRACE
#include <unistd.h>
#include <x86intrin.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>

namespace ibmsg::tp::hoptrace {
namespace {

constexpr uint32_t kMax = 1u << 20;  // records of each kind; later ones are dropped

struct Trace {
  bool on = false;
  uint64_t *posts = nullptr, *post_ends = nullptr, *found = nullptr, *empty_before = nullptr;
  uint32_t nposts = 0, nends = 0, nfound = 0;
  uint64_t last_empty = 0;
  uint64_t tsc0 = 0;
  timespec t0{};

  Trace() {
    const char *dir = getenv("IBMSG_HOP_TRACE");
    if (!dir || !*dir) return;
    posts = static_cast<uint64_t *>(calloc(kMax, sizeof(uint64_t)));
    post_ends = static_cast<uint64_t *>(calloc(kMax, sizeof(uint64_t)));
    found = static_cast<uint64_t *>(calloc(kMax, sizeof(uint64_t)));
    empty_before = static_cast<uint64_t *>(calloc(kMax, sizeof(uint64_t)));
    if (!posts || !post_ends || !found || !empty_before) return;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    tsc0 = __rdtsc();
    on = true;
  }

  // The file: "IBMSGHOP", the counter's rate in kHz, then each array as a count and its values
  // (all little-endian 64-bit words; test/perf/hops-analyze reads it).
  ~Trace() {
    if (!on) return;
    timespec t1;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    const uint64_t ticks = __rdtsc() - tsc0;
    const double ns = double(t1.tv_sec - t0.tv_sec) * 1e9 + double(t1.tv_nsec - t0.tv_nsec);
    const uint64_t khz = ns > 0 ? uint64_t(double(ticks) / ns * 1e6 + 0.5) : 0;
    char path[4096];
    snprintf(path, sizeof path, "%s/hops-%ld.bin", getenv("IBMSG_HOP_TRACE"), long(getpid()));
    if (FILE *f = fopen(path, "wb")) {
      const uint64_t head[2] = {0x504f4847534d4249ull, khz};  // "IBMSGHOP"
      fwrite(head, sizeof head, 1, f);
      const struct { uint32_t n; const uint64_t *v; } parts[] = {
          {nposts, posts}, {nends, post_ends}, {nfound, found}, {nfound, empty_before}};
      for (const auto &p : parts) {
        const uint64_t n = p.n;
        fwrite(&n, sizeof n, 1, f);
        fwrite(p.v, sizeof(uint64_t), p.n, f);
      }
      fclose(f);
    }
  }
};

Trace trace;

}  // namespace

void post_begin() {
  if (trace.on && trace.nposts < kMax) trace.posts[trace.nposts++] = __rdtsc();
}

void post_end() {
  if (trace.on && trace.nends < kMax) trace.post_ends[trace.nends++] = __rdtsc();
}

void recv_found() {
  if (!trace.on || trace.nfound == kMax) return;
  trace.empty_before[trace.nfound] = trace.last_empty;
  trace.found[trace.nfound++] = __rdtsc();
}

void poll_empty() {
  if (trace.on) trace.last_empty = __rdtsc();
}

}  // namespace ibmsg::tp::hoptrace
#endif
