// The loop's memory for rendezvous destinations: rndv_memory.hpp.
#include "rndv_memory.hpp"

#include "internal.hpp"
#include "largebuf.hpp"

namespace ibmsg {

size_t rndv_dest_bytes(uint64_t length) {
  unsigned index;
  size_t bytes;
  return large_class(size_t(length), &index, &bytes) ? bytes : SIZE_MAX;
}

bool rndv_mem_take(Socket *s, size_t bytes) {
  Loop *loop = s->loop;
  auto &waiters = loop->rndv_mem_waiters;
  const bool my_turn = s->rndv_mem_node.linked() ? waiters.front() == s : waiters.empty();
  if (!my_turn || (loop->rndv_mem && bytes > loop->opts.rndv_memory - loop->rndv_mem)) {
    if (!s->rndv_mem_node.linked()) waiters.push_back(s);
    return false;
  }
  if (s->rndv_mem_node.linked()) waiters.remove(s);
  loop->rndv_mem += bytes;
  return true;
}

void rndv_mem_give(Loop *loop, size_t bytes) {
  loop->rndv_mem -= bytes < loop->rndv_mem ? bytes : loop->rndv_mem;
}

Socket *rndv_mem_first(const Loop *loop) { return loop->rndv_mem_waiters.front(); }

void rndv_mem_leave(Socket *s) {
  if (s->rndv_mem_node.linked()) s->loop->rndv_mem_waiters.remove(s);
}

}  // namespace ibmsg
