// Large buffers (pure logic): the sizes the buffers of rendezvous messages come in, and the cache
// of free ones that keeps their registrations between messages, so that sending or receiving a
// large message registers nothing in the steady state. Mapping, registering and releasing the
// buffers is memory.cpp's; a device owns its cache.
//
// Size classes: 64 KiB, then four per power of two (2^k, 1.25, 1.5 and 1.75 times 2^k), so a
// buffer is at most a quarter larger than asked for (a fifth of it is waste at worst), and every
// class is a multiple of 16 KiB (of any page size up to that).
#pragma once
#include <cstddef>
#include <cstdint>

#include "list.hpp"

namespace ibmsg {

constexpr size_t kLargeMin = size_t(64) * 1024;
constexpr unsigned kLargeClasses = 4 * 48;  // up to 2^63 bytes

// The class of a buffer for size bytes, and its size; false if there is none (0 or more than
// the largest class).
bool large_class(size_t size, unsigned *index, size_t *bytes);

// A free or lent large buffer. The cache links the free ones; mem and the registration are the
// owner's (memory.cpp), whose object embeds or extends this one.
struct LargeBuf {
  ListNode lru;         // in the cache: least recently given back first
  ListNode free_link;   // in its class's free list
  size_t bytes = 0;     // its class's size
  unsigned index = 0;   // its class
  bool cached = false;  // in the cache (else lent, or being released)
};

using LargeList = List<LargeBuf, &LargeBuf::lru>;

// Free buffers by class, at most limit bytes of them; beyond that, the least recently given back
// are evicted (handed to the caller for releasing).
class LargeCache {
 public:
  explicit LargeCache(size_t limit) : limit_(limit) {}
  LargeCache(const LargeCache &) = delete;
  LargeCache &operator=(const LargeCache &) = delete;

  // A free buffer of size's class (the most recently given back), or nullptr: the caller makes a
  // new one of large_class's size.
  LargeBuf *take(size_t size);
  // Gives b back; what no longer fits under the limit (b itself when it is larger than the
  // limit) goes to evicted, oldest first.
  void give(LargeBuf *b, LargeList *evicted);
  // A new limit; what exceeds it goes to evicted.
  void set_limit(size_t limit, LargeList *evicted);
  // Everything, e.g. when the device closes.
  void clear(LargeList *evicted) { set_limit(0, evicted); }

  size_t bytes() const { return bytes_; }
  size_t count() const { return lru_.size(); }
  size_t limit() const { return limit_; }

 private:
  void trim(LargeList *evicted);
  void unlink(LargeBuf *b);

  List<LargeBuf, &LargeBuf::free_link> free_[kLargeClasses];
  LargeList lru_;
  size_t bytes_ = 0;
  size_t limit_;
};

}  // namespace ibmsg
