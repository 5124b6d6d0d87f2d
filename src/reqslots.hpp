// Request identities of one requester (pure logic; issue 12, work in progress). A request's id
// is its slot's index (low 32 bits) and the slot's generation (high 32 bits): a reply finds its
// request without a search, and a late reply for a slot that was used again since matches
// nothing (another generation). Generations start at 1, so 0 is never an id. Free slots are
// reused last-freed first; the table grows (doubling) and never shrinks.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstdlib>

namespace ibmsg {

template <typename T>
class ReqSlots {
 public:
  ReqSlots() = default;
  ReqSlots(const ReqSlots &) = delete;
  ReqSlots &operator=(const ReqSlots &) = delete;
  ~ReqSlots() { free(slots_); }

  // A new id for req (not null); false when out of memory or at 2^32 - 1 slots.
  bool take(T *req, uint64_t *id) {
    if (free_ == kNone && !grow()) return false;
    const uint32_t i = free_;
    Slot &s = slots_[i];
    free_ = s.next_free;
    s.req = req;
    ++size_;
    *id = uint64_t(s.gen) << 32 | i;
    return true;
  }
  // The request of id, or nullptr: never taken, released, or of an older generation.
  T *find(uint64_t id) const {
    const uint32_t i = uint32_t(id);
    if (i >= cap_) return nullptr;
    const Slot &s = slots_[i];
    return s.req && s.gen == uint32_t(id >> 32) ? s.req : nullptr;
  }
  // Frees the slot of id (nothing if find(id) is nullptr); its next use has another id.
  void release(uint64_t id) {
    if (!find(id)) return;
    Slot &s = slots_[uint32_t(id)];
    s.req = nullptr;
    if (++s.gen == 0) s.gen = 1;
    s.next_free = free_;
    free_ = uint32_t(id);
    --size_;
  }
  size_t size() const { return size_; }

 private:
  static constexpr uint32_t kNone = UINT32_MAX;
  struct Slot {
    T *req;
    uint32_t gen;
    uint32_t next_free;
  };
  bool grow() {
    if (cap_ >= kNone / 2) return false;
    const uint32_t cap = cap_ ? 2 * cap_ : 16;
    Slot *slots = static_cast<Slot *>(realloc(slots_, size_t(cap) * sizeof(Slot)));
    if (!slots) return false;
    slots_ = slots;
    // The new slots go on the free list in index order.
    for (uint32_t i = cap; i-- > cap_;) slots_[i] = Slot{nullptr, 1, i + 1 < cap ? i + 1 : free_};
    free_ = cap_;
    cap_ = cap;
    return true;
  }
  Slot *slots_ = nullptr;
  uint32_t cap_ = 0;
  uint32_t free_ = kNone;
  size_t size_ = 0;
};

}  // namespace ibmsg
