// A list kept in deadline order (pure logic; requests.cpp uses it): the requests of a
// connection by the time they time out, so that one timer for the front serves them all. Most
// requests of a connection share one timeout and arrive in deadline order: the insertion walks
// from the back and usually stops at once. Equal deadlines keep their insertion order.
#pragma once
#include "list.hpp"

namespace ibmsg {

template <typename T, ListNode T::*Node, double T::*Deadline>
void deadline_insert(List<T, Node> &list, T *e) {
  T *p = list.back();
  while (p && p->*Deadline > e->*Deadline) p = list.prev(p);
  if (p) list.insert_after(p, e);
  else list.push_front(e);
}

}  // namespace ibmsg
