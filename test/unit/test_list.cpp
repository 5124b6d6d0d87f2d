// test_list.cpp - the intrusive list of the core (src/list.hpp): order, O(1) removal from any
// place, membership, and elements that sit in two lists at once.
#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <csetjmp>
extern "C" {  // cmocka.h 1.1 has no extern "C" of its own
#include <cmocka.h>
}

#include <initializer_list>
#include <vector>

#include "list.hpp"

using ibmsg::List;
using ibmsg::ListNode;

namespace {

struct Item {
  int value;
  ListNode a;
  ListNode b;
};
using ListA = List<Item, &Item::a>;
using ListB = List<Item, &Item::b>;

std::vector<int> values(const ListA &l) {
  std::vector<int> v;
  for (Item *it = l.front(); it; it = l.next(it)) v.push_back(it->value);
  return v;
}

void assert_values(const ListA &l, std::vector<int> expected) {
  std::vector<int> got = values(l);
  if (got != expected) {
    fail_msg("list holds %zu items (first %d), expected %zu (first %d)", got.size(),
             got.empty() ? -1 : got[0], expected.size(), expected.empty() ? -1 : expected[0]);
  }
  assert_int_equal(l.size(), expected.size());
}

// push_back of each item, in order.
template <typename L>
void push_all(L &l, std::initializer_list<Item *> items) {
  for (Item *it : items) l.push_back(it);
}

void new_list_is_empty(void **) {
  ListA l;
  assert_true(l.empty());
  assert_int_equal(l.size(), 0);
  assert_null(l.front());
  assert_null(l.back());
  assert_null(l.pop_front());
}

void push_back_keeps_insertion_order(void **) {
  Item x{1, {}, {}}, y{2, {}, {}}, z{3, {}, {}};
  ListA l;
  push_all(l, {&x, &y, &z});
  assert_values(l, {1, 2, 3});
  assert_ptr_equal(l.front(), &x);
  assert_ptr_equal(l.back(), &z);
}

void push_front_puts_the_item_first(void **) {
  Item x{1, {}, {}}, y{2, {}, {}};
  ListA l;
  l.push_back(&x);
  l.push_front(&y);
  assert_values(l, {2, 1});
}

void remove_from_the_middle_front_and_back(void **) {
  Item it[5];
  ListA l;
  for (int i = 0; i < 5; ++i) {
    it[i].value = i;
    l.push_back(&it[i]);
  }
  l.remove(&it[2]);
  assert_values(l, {0, 1, 3, 4});
  l.remove(&it[0]);
  assert_values(l, {1, 3, 4});
  l.remove(&it[4]);
  assert_values(l, {1, 3});
  assert_false(it[2].a.linked());
}

void removing_an_unlinked_item_changes_nothing(void **) {
  Item x{1, {}, {}}, y{2, {}, {}};
  ListA l;
  l.push_back(&x);
  l.remove(&y);
  l.remove(&y);
  assert_values(l, {1});
  l.remove(&x);
  l.remove(&x);
  assert_true(l.empty());
}

void pop_front_takes_items_in_order(void **) {
  Item x{1, {}, {}}, y{2, {}, {}};
  ListA l;
  push_all(l, {&x, &y});
  assert_ptr_equal(l.pop_front(), &x);
  assert_false(x.a.linked());
  assert_ptr_equal(l.pop_front(), &y);
  assert_null(l.pop_front());
  assert_true(l.empty());
}

void an_item_can_be_in_two_lists_through_two_nodes(void **) {
  Item x{1, {}, {}}, y{2, {}, {}};
  ListA la;
  ListB lb;
  push_all(la, {&x, &y});
  push_all(lb, {&y, &x});
  la.remove(&x);
  assert_values(la, {2});
  assert_ptr_equal(lb.front(), &y);
  assert_ptr_equal(lb.next(&y), &x);
  assert_null(lb.next(&x));
  assert_true(x.b.linked());
}

void a_removed_item_can_be_added_again(void **) {
  Item x{1, {}, {}}, y{2, {}, {}};
  ListA l;
  push_all(l, {&x, &y});
  l.remove(&x);
  l.push_back(&x);
  assert_values(l, {2, 1});
}

void many_random_removals_keep_the_list_consistent(void **) {
  const int n = 1000;
  std::vector<Item> items(n);
  ListA l;
  for (int i = 0; i < n; ++i) {
    items[i].value = i;
    l.push_back(&items[i]);
  }
  std::vector<int> expected;
  uint32_t seed = 12345;
  for (int i = 0; i < n; ++i) {
    seed = seed * 1103515245u + 12345u;
    if ((seed >> 16) % 3 == 0) l.remove(&items[i]);
    else expected.push_back(i);
  }
  assert_values(l, expected);
}

}  // namespace

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(new_list_is_empty),
      cmocka_unit_test(push_back_keeps_insertion_order),
      cmocka_unit_test(push_front_puts_the_item_first),
      cmocka_unit_test(remove_from_the_middle_front_and_back),
      cmocka_unit_test(removing_an_unlinked_item_changes_nothing),
      cmocka_unit_test(pop_front_takes_items_in_order),
      cmocka_unit_test(an_item_can_be_in_two_lists_through_two_nodes),
      cmocka_unit_test(a_removed_item_can_be_added_again),
      cmocka_unit_test(many_random_removals_keep_the_list_consistent),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
