// test_deadlines.cpp - deadline order (src/deadlines.hpp) and the list operations it uses.
#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <csetjmp>
extern "C" {  // cmocka.h 1.1 has no extern "C" of its own
#include <cmocka.h>
}

#include <vector>

#include "deadlines.hpp"

using ibmsg::List;
using ibmsg::ListNode;

namespace {

struct Req {
  int n;
  double deadline;
  ListNode node;
};
using Reqs = List<Req, &Req::node>;

void insert(Reqs &l, Req *r) { ibmsg::deadline_insert<Req, &Req::node, &Req::deadline>(l, r); }

std::vector<int> order(const Reqs &l) {
  std::vector<int> v;
  for (Req *r = l.front(); r; r = l.next(r)) v.push_back(r->n);
  return v;
}

void keeps_deadline_order_whatever_the_insertion_order(void **) {
  std::vector<Req> r = {{0, 5, {}}, {1, 1, {}}, {2, 9, {}}, {3, 3, {}}, {4, 0, {}}, {5, 7, {}}};
  Reqs l;
  for (auto &x : r) insert(l, &x);
  assert_true(order(l) == (std::vector<int>{4, 1, 3, 0, 5, 2}));
  assert_int_equal(l.size(), 6);
}

void equal_deadlines_keep_their_insertion_order(void **) {
  std::vector<Req> r = {{0, 2, {}}, {1, 1, {}}, {2, 2, {}}, {3, 1, {}}, {4, 2, {}}};
  Reqs l;
  for (auto &x : r) insert(l, &x);
  assert_true(order(l) == (std::vector<int>{1, 3, 0, 2, 4}));
}

void prev_and_insert_after_walk_and_place_elements(void **) {
  Req a{0, 0, {}}, b{1, 0, {}}, c{2, 0, {}};
  Reqs l;
  l.push_back(&a);
  l.push_back(&c);
  l.insert_after(&a, &b);
  assert_true(order(l) == (std::vector<int>{0, 1, 2}));
  assert_ptr_equal(l.prev(&c), &b);
  assert_ptr_equal(l.prev(&b), &a);
  assert_null(l.prev(&a));
  l.remove(&b);
  assert_ptr_equal(l.prev(&c), &a);
  assert_int_equal(l.size(), 2);
}

}  // namespace

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(keeps_deadline_order_whatever_the_insertion_order),
      cmocka_unit_test(equal_deadlines_keep_their_insertion_order),
      cmocka_unit_test(prev_and_insert_after_walk_and_place_elements),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
