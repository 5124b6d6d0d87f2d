// Queue pair numbers to connections (pure logic): a receive taken from a shared receive queue
// names no connection, only its queue pair's number. Open addressing with linear probing; grows
// (doubling) past half full; never allocates while it has room. The key may also be an address
// (PtrMap, K = uint64_t: the process's open sockets by their struct's address).
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstdlib>

namespace ibmsg {

template <typename T, typename K = uint32_t>
class QpMap {
 public:
  QpMap() = default;
  QpMap(const QpMap &) = delete;
  QpMap &operator=(const QpMap &) = delete;
  ~QpMap() { free(slots_); }

  // false when out of memory (the map is as before).
  bool put(K qp, T *value) {
    if (2 * (used_ + 1) > cap_ && !grow()) return false;
    Slot *free_slot = nullptr;
    for (size_t i = hash(qp);; i = (i + 1) & (cap_ - 1)) {
      Slot &s = slots_[i];
      if (s.state == kFull && s.qp == qp) {
        s.value = value;
        return true;
      }
      if (s.state == kGone && !free_slot) free_slot = &s;
      if (s.state == kEmpty) {
        if (!free_slot) {
          free_slot = &s;
          ++used_;
        }
        break;
      }
    }
    *free_slot = Slot{qp, kFull, value};
    ++size_;
    return true;
  }
  T *get(K qp) const {
    if (!cap_) return nullptr;
    for (size_t i = hash(qp);; i = (i + 1) & (cap_ - 1)) {
      const Slot &s = slots_[i];
      if (s.state == kEmpty) return nullptr;
      if (s.state == kFull && s.qp == qp) return s.value;
    }
  }
  void erase(K qp) {
    if (!cap_) return;
    for (size_t i = hash(qp);; i = (i + 1) & (cap_ - 1)) {
      Slot &s = slots_[i];
      if (s.state == kEmpty) return;
      if (s.state == kFull && s.qp == qp) {
        s.state = kGone;  // probing goes on past it
        s.value = nullptr;
        --size_;
        return;
      }
    }
  }
  size_t size() const { return size_; }

 private:
  enum : uint8_t { kEmpty = 0, kFull, kGone };
  struct Slot {
    K qp;
    uint8_t state;
    T *value;
  };
  size_t hash(uint32_t qp) const { return size_t(qp * 2654435761u) & (cap_ - 1); }
  size_t hash(uint64_t key) const {  // an address: its low bits are alignment, mix them in
    key ^= key >> 33;
    key *= 0xff51afd7ed558ccdull;
    key ^= key >> 33;
    return size_t(key) & (cap_ - 1);
  }
  bool grow() {
    size_t cap = cap_ ? 2 * cap_ : 16;
    while (2 * (size_ + 1) > cap) cap *= 2;
    Slot *old = slots_;
    const size_t old_cap = cap_;
    slots_ = static_cast<Slot *>(calloc(cap, sizeof(Slot)));
    if (!slots_) {
      slots_ = old;
      return false;
    }
    cap_ = cap;
    used_ = size_ = 0;
    for (size_t i = 0; i < old_cap; ++i)
      if (old[i].state == kFull) put(old[i].qp, old[i].value);
    free(old);
    return true;
  }

  Slot *slots_ = nullptr;
  size_t cap_ = 0;   // a power of two
  size_t used_ = 0;  // slots not empty (full or gone)
  size_t size_ = 0;  // full ones
};

template <typename T>
using PtrMap = QpMap<T, uint64_t>;

}  // namespace ibmsg
