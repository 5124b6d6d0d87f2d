// One small intrusive doubly linked list for every list in the core (as libuv's queue.h and
// nng's list.h): the node lives in the element, so insertion and removal are O(1) and never
// allocate. An element may sit in several lists through several nodes.
#pragma once
#include <cstddef>

namespace ibmsg {

struct ListNode {
  ListNode *prev = nullptr;
  ListNode *next = nullptr;
  bool linked() const { return next != nullptr; }
};

// T holds a ListNode member Node; the list does not own its elements.
template <typename T, ListNode T::*Node>
class List {
 public:
  List() { head_.prev = head_.next = &head_; }
  List(const List &) = delete;
  List &operator=(const List &) = delete;

  bool empty() const { return head_.next == &head_; }
  size_t size() const { return size_; }
  T *front() const { return empty() ? nullptr : owner(head_.next); }
  T *back() const { return empty() ? nullptr : owner(head_.prev); }
  // The element after e, or nullptr at the end.
  T *next(const T *e) const {
    const ListNode *n = (e->*Node).next;
    return n == &head_ ? nullptr : owner(n);
  }

  // The element before e, or nullptr at the front.
  T *prev(const T *e) const {
    const ListNode *n = (e->*Node).prev;
    return n == &head_ ? nullptr : owner(n);
  }

  void push_back(T *e) { insert_before(&head_, &(e->*Node)); }
  // e right after pos, an element of this list.
  void insert_after(T *pos, T *e) { insert_before((pos->*Node).next, &(e->*Node)); }
  void push_front(T *e) { insert_before(head_.next, &(e->*Node)); }
  void remove(T *e) {
    ListNode *n = &(e->*Node);
    if (!n->linked()) return;
    n->prev->next = n->next;
    n->next->prev = n->prev;
    n->prev = n->next = nullptr;
    --size_;
  }
  T *pop_front() {
    T *e = front();
    if (e) remove(e);
    return e;
  }

 private:
  static T *owner(const ListNode *n) {
    // The element that embeds n: the member's offset, measured on (unconstructed) storage of a
    // T, since offsetof does not take a member pointer.
    alignas(T) static char probe[sizeof(T)];
    const T *t = reinterpret_cast<const T *>(probe);
    const size_t off = size_t(reinterpret_cast<const char *>(&(t->*Node)) - probe);
    return reinterpret_cast<T *>(reinterpret_cast<char *>(const_cast<ListNode *>(n)) - off);
  }
  void insert_before(ListNode *pos, ListNode *n) {
    n->prev = pos->prev;
    n->next = pos;
    pos->prev->next = n;
    pos->prev = n;
    ++size_;
  }

  ListNode head_;
  size_t size_ = 0;
};

}  // namespace ibmsg
