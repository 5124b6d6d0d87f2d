#include "largebuf.hpp"

namespace ibmsg {

bool large_class(size_t size, unsigned *index, size_t *bytes) {
  if (size == 0 || uint64_t(size) > uint64_t(1) << 63) return false;
  if (size <= kLargeMin) {
    *index = 0;
    *bytes = kLargeMin;
    return true;
  }
  // 2^k < size <= 2^(k+1), k >= 16.
  unsigned k = 63 - unsigned(__builtin_clzll(uint64_t(size - 1)));
  const uint64_t base = uint64_t(1) << k;
  const uint64_t quarter = base >> 2;
  const uint64_t steps = (uint64_t(size) - base + quarter - 1) / quarter;  // 1..4
  unsigned idx;
  uint64_t b;
  if (steps == 4) {
    if (k + 1 > 63) return false;
    idx = (k + 1 - 16) * 4;
    b = base << 1;
  } else {
    idx = (k - 16) * 4 + unsigned(steps);
    b = base + steps * quarter;
  }
  if (idx >= kLargeClasses || b > SIZE_MAX) return false;
  *index = idx;
  *bytes = size_t(b);
  return true;
}

LargeBuf *LargeCache::take(size_t size) {
  unsigned idx;
  size_t bytes;
  if (!large_class(size, &idx, &bytes)) return nullptr;
  LargeBuf *b = free_[idx].back();  // the most recently given back: its pages are warm
  if (b) unlink(b);
  return b;
}

void LargeCache::give(LargeBuf *b, LargeList *evicted) {
  if (b->cached) return;
  if (b->index >= kLargeClasses || b->bytes > limit_) {
    evicted->push_back(b);
    return;
  }
  b->cached = true;
  free_[b->index].push_back(b);
  lru_.push_back(b);
  bytes_ += b->bytes;
  trim(evicted);
}

void LargeCache::set_limit(size_t limit, LargeList *evicted) {
  limit_ = limit;
  trim(evicted);
}

void LargeCache::trim(LargeList *evicted) {
  while (bytes_ > limit_) {
    LargeBuf *old = lru_.front();
    unlink(old);
    evicted->push_back(old);
  }
}

void LargeCache::unlink(LargeBuf *b) {
  free_[b->index].remove(b);
  lru_.remove(b);
  bytes_ -= b->bytes;
  b->cached = false;
}

}  // namespace ibmsg
