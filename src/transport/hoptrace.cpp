// The hop trace (hoptrace.hpp): fixed arrays of time stamp counter readings, written out once at
// exit, with the counter's rate measured against CLOCK_MONOTONIC over the process's life.
#include "transport/hoptrace.hpp"

#ifdef IBMSG_HOP_TRACE
#include <unistd.h>
#include <x86intrin.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <initializer_list>

namespace ibmsg::tp::hoptrace {
namespace {

constexpr uint32_t kMax = 1u << 20;  // records of each kind; later ones are dropped

// Meant for one loop per process; a second thread that records loses records or garbles their
// order, but each array index is read once and checked, so nothing is written out of bounds.
struct Rec {
  uint64_t *v = nullptr;
  std::atomic<uint32_t> n{0};
  void add(uint64_t t) {
    const uint32_t i = n.load(std::memory_order_relaxed);
    if (i < kMax) {
      v[i] = t;
      n.store(i + 1, std::memory_order_relaxed);
    }
  }
};

struct Trace {
  std::atomic<bool> on{false};
  Rec posts, post_ends, found, empty_before;  // found and empty_before: one record each per find
  uint64_t last_empty = 0;
  uint64_t tsc0 = 0;
  timespec t0{};
  char dir[4096] = "";

  Trace() {
    const char *d = getenv("IBMSG_HOP_TRACE");
    if (!d || !*d || snprintf(dir, sizeof dir, "%s", d) >= int(sizeof dir)) return;
    for (Rec *r : {&posts, &post_ends, &found, &empty_before}) {
      r->v = static_cast<uint64_t *>(calloc(kMax, sizeof(uint64_t)));
      if (!r->v) return;
    }
    clock_gettime(CLOCK_MONOTONIC, &t0);
    tsc0 = __rdtsc();
    on = true;
  }

  // The file: "IBMSGHOP", the counter's rate in kHz, then each array as a count and its values
  // (all little-endian 64-bit words; test/perf/hops-analyze reads it). The arrays are not freed:
  // a post after this (another static's destructor) records nothing, and touches nothing freed.
  ~Trace() {
    if (!on.exchange(false)) return;
    timespec t1;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    const uint64_t ticks = __rdtsc() - tsc0;
    const double ns = double(t1.tv_sec - t0.tv_sec) * 1e9 + double(t1.tv_nsec - t0.tv_nsec);
    const uint64_t khz = ns > 0 ? uint64_t(double(ticks) / ns * 1e6 + 0.5) : 0;
    char path[4200];
    snprintf(path, sizeof path, "%s/hops-%ld.bin", dir, long(getpid()));
    if (FILE *f = fopen(path, "wb")) {
      const uint64_t head[2] = {0x504f4847534d4249ull, khz};  // "IBMSGHOP"
      fwrite(head, sizeof head, 1, f);
      const uint32_t nfound = found.n.load(), nempty = empty_before.n.load();
      const uint32_t nf = nfound < nempty ? nfound : nempty;
      const struct { uint32_t n; const uint64_t *v; } parts[] = {
          {posts.n.load(), posts.v}, {post_ends.n.load(), post_ends.v}, {nf, found.v},
          {nf, empty_before.v}};
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
  if (trace.on.load(std::memory_order_relaxed)) trace.posts.add(__rdtsc());
}

void post_end() {
  if (trace.on.load(std::memory_order_relaxed)) trace.post_ends.add(__rdtsc());
}

void recv_found() {
  if (!trace.on.load(std::memory_order_relaxed)) return;
  trace.empty_before.add(trace.last_empty);
  trace.found.add(__rdtsc());
}

void poll_empty() {
  if (trace.on.load(std::memory_order_relaxed)) trace.last_empty = __rdtsc();
}

}  // namespace ibmsg::tp::hoptrace
#endif
