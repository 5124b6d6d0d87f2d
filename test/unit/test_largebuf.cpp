// test_largebuf.cpp - the large-buffer size classes and cache (src/largebuf.hpp): every size maps
// to the smallest class that holds it, classes waste at most a quarter, stay page multiples and
// grow with their index; the cache hands back a buffer of the same class (the most recently given
// back), evicts the least recently given back beyond its limit, and a randomized run keeps its
// byte count and lists consistent with a model.
#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <csetjmp>
extern "C" {  // cmocka.h 1.1 has no extern "C" of its own
#include <cmocka.h>
}

#include <cstring>
#include <deque>
#include <map>
#include <random>
#include <vector>

#include "largebuf.hpp"

using ibmsg::kLargeClasses;
using ibmsg::kLargeMin;
using ibmsg::large_class;
using ibmsg::LargeBuf;
using ibmsg::LargeCache;
using ibmsg::LargeList;

namespace {

void check_class(size_t size) {
  unsigned idx;
  size_t bytes;
  if (!large_class(size, &idx, &bytes)) fail_msg("no class for %zu bytes", size);
  if (bytes < size) fail_msg("%zu bytes: class of %zu is too small", size, bytes);
  if (size > kLargeMin && bytes - size > size / 4)
    fail_msg("%zu bytes: class of %zu wastes more than a quarter", size, bytes);
  if (bytes % 16384) fail_msg("%zu bytes: class of %zu is no multiple of 16 KiB", size, bytes);
  if (idx >= kLargeClasses) fail_msg("%zu bytes: index %u out of range", size, idx);
  // The smallest that holds it: the class below (if any) is too small.
  if (idx > 0) {
    unsigned i2;
    size_t b2;
    assert_true(large_class(bytes, &i2, &b2));
    assert_int_equal(i2, idx);  // the class's own size maps to it
    assert_true(b2 == bytes);
  }
}

void every_size_gets_the_smallest_class_that_holds_it(void **) {
  for (size_t s : {size_t(1), size_t(4096), kLargeMin - 1, kLargeMin, kLargeMin + 1,
                   size_t(80 * 1024), size_t(80 * 1024) + 1, size_t(96 * 1024),
                   size_t(1) << 20, (size_t(1) << 20) + 1, size_t(100) << 20,
                   (size_t(1) << 30) - 1, size_t(1) << 30, (size_t(1) << 32) - 1,
                   size_t(1) << 62})
    check_class(s);
  std::mt19937_64 rng(7);
  for (int i = 0; i < 100000; ++i) check_class(size_t(rng() >> (rng() % 40 + 1)) + 1);
}

void classes_have_their_documented_sizes(void **) {
  const size_t want[] = {64 << 10, 80 << 10, 96 << 10, 112 << 10, 128 << 10, 160 << 10};
  unsigned idx;
  size_t bytes;
  for (unsigned i = 0; i < sizeof want / sizeof want[0]; ++i) {
    assert_true(large_class(want[i], &idx, &bytes));
    assert_int_equal(idx, i);
    assert_true(bytes == want[i]);
  }
  assert_true(large_class(size_t(1) << 30, &idx, &bytes));
  assert_int_equal(idx, (30 - 16) * 4);
  // Each class larger than the one before, up to the last.
  size_t prev = 0;
  for (unsigned k = 16; k < 63; ++k)
    for (unsigned q = 0; q < 4; ++q) {
      size_t s = (size_t(1) << k) + q * (size_t(1) << (k - 2));
      assert_true(large_class(s, &idx, &bytes));
      assert_true(bytes == s);
      assert_int_equal(idx, (k - 16) * 4 + q);
      assert_true(bytes > prev);
      prev = bytes;
    }
}

void zero_and_oversized_have_no_class(void **) {
  unsigned idx = 99;
  size_t bytes = 99;
  assert_false(large_class(0, &idx, &bytes));
  assert_false(large_class(SIZE_MAX, &idx, &bytes));
  assert_false(large_class((size_t(1) << 63) + 1, &idx, &bytes));
  assert_int_equal(idx, 99);
  assert_true(large_class(size_t(1) << 63, &idx, &bytes));  // the largest class
  assert_int_equal(idx, kLargeClasses - 4);
}

// A buffer of size's class, as memory.cpp would make one.
LargeBuf *make(size_t size) {
  LargeBuf *b = new LargeBuf();
  assert_true(large_class(size, &b->index, &b->bytes));
  return b;
}

void drain(LargeList *l, std::vector<LargeBuf *> *out) {
  while (LargeBuf *b = l->pop_front()) out->push_back(b);
}

void cache_hands_back_the_same_class_most_recent_first(void **) {
  LargeCache c(size_t(64) << 20);
  LargeList ev;
  assert_null(c.take(1 << 20));  // empty
  LargeBuf *a = make(1 << 20), *b = make(1 << 20), *small = make(100 << 10);
  c.give(a, &ev);
  c.give(b, &ev);
  c.give(small, &ev);
  assert_true(ev.empty());
  assert_int_equal(c.count(), 3);
  assert_true(c.bytes() == a->bytes + b->bytes + small->bytes);
  assert_null(c.take(2 << 20));            // no buffer of that class
  assert_null(c.take(80 << 10));           // nor of a smaller one: no mixing classes
  assert_ptr_equal(c.take(1000000), b);    // the same class as 1 MiB, most recent first
  assert_false(b->cached);
  assert_ptr_equal(c.take(1 << 20), a);
  assert_null(c.take(1 << 20));
  assert_ptr_equal(c.take(97 << 10), small);  // 97 KiB is in the 112 KiB class
  assert_int_equal(c.count(), 0);
  assert_true(c.bytes() == 0);
  c.give(a, &ev);
  c.give(a, &ev);  // twice: no effect
  assert_int_equal(c.count(), 1);
  delete c.take(1 << 20);
  delete b;
  delete small;
}

void cache_evicts_least_recently_given_back_beyond_its_limit(void **) {
  LargeCache c(size_t(3) << 20);
  LargeList ev;
  std::vector<LargeBuf *> out;
  LargeBuf *b1 = make(1 << 20), *b2 = make(1 << 20), *b3 = make(1 << 20), *b4 = make(1 << 20);
  c.give(b1, &ev);
  c.give(b2, &ev);
  c.give(b3, &ev);
  assert_true(ev.empty());
  c.give(b4, &ev);  // one too many: the oldest goes
  drain(&ev, &out);
  assert_int_equal(out.size(), 1);
  assert_ptr_equal(out[0], b1);
  assert_false(b1->cached);
  assert_true(c.bytes() == size_t(3) << 20);
  // Larger than the limit: not cached at all.
  LargeBuf *huge = make(size_t(8) << 20);
  c.give(huge, &ev);
  drain(&ev, &out);
  assert_int_equal(out.size(), 2);
  assert_ptr_equal(out[1], huge);
  assert_false(huge->cached);
  // A lower limit evicts oldest first; clear() evicts the rest.
  c.set_limit(size_t(1) << 20, &ev);
  drain(&ev, &out);
  assert_int_equal(out.size(), 4);
  assert_ptr_equal(out[2], b2);
  assert_ptr_equal(out[3], b3);
  c.clear(&ev);
  drain(&ev, &out);
  assert_int_equal(out.size(), 5);
  assert_ptr_equal(out[4], b4);
  assert_int_equal(c.count(), 0);
  assert_true(c.bytes() == 0);
  for (LargeBuf *b : out) delete b;
}

// Random takes and gives against a model: the bytes and count match, nothing cached exceeds the
// limit, every take returns a buffer of the right class that was cached, evictions are oldest
// first.
void cache_agrees_with_a_model_under_random_use(void **) {
  std::mt19937 rng(99);
  const size_t limit = size_t(40) << 20;
  LargeCache c(limit);
  LargeList ev;
  std::deque<LargeBuf *> model;  // cached, least recently given back first
  std::vector<LargeBuf *> lent;
  const size_t sizes[] = {64 << 10, 100 << 10, 1 << 20, 3 << 20, 5 << 20, 16 << 20, 50 << 20};
  for (int step = 0; step < 20000; ++step) {
    if (rng() % 2 && !lent.empty()) {
      size_t i = rng() % lent.size();
      LargeBuf *b = lent[i];
      lent.erase(lent.begin() + long(i));
      c.give(b, &ev);
      if (b->bytes <= limit) model.push_back(b);
      size_t total = 0;
      for (LargeBuf *m : model) total += m->bytes;
      std::vector<LargeBuf *> out;
      drain(&ev, &out);
      size_t k = 0;
      if (b->bytes > limit) {
        assert_int_equal(out.size(), 1);
        assert_ptr_equal(out[0], b);
        delete b;
        continue;
      }
      while (total > limit) {
        if (k >= out.size() || out[k] != model.front()) fail_msg("step %d: wrong eviction", step);
        total -= model.front()->bytes;
        model.pop_front();
        ++k;
      }
      if (k != out.size()) fail_msg("step %d: %zu evicted, expected %zu", step, out.size(), k);
      for (LargeBuf *e : out) delete e;
    } else {
      size_t want = sizes[rng() % (sizeof sizes / sizeof sizes[0])] - rng() % 1000;
      LargeBuf *b = c.take(want);
      unsigned idx;
      size_t bytes;
      assert_true(large_class(want, &idx, &bytes));
      // The model's most recent of that class, if any.
      LargeBuf *expect = nullptr;
      for (auto it = model.rbegin(); it != model.rend(); ++it)
        if ((*it)->index == idx) {
          expect = *it;
          model.erase(std::next(it).base());
          break;
        }
      assert_ptr_equal(b, expect);
      if (!b) b = make(want);
      assert_false(b->cached);
      assert_int_equal(b->index, idx);
      lent.push_back(b);
    }
    size_t total = 0;
    for (LargeBuf *m : model) total += m->bytes;
    assert_true(c.bytes() == total);
    assert_int_equal(c.count(), model.size());
    assert_true(c.bytes() <= limit);
  }
  c.clear(&ev);
  std::vector<LargeBuf *> out;
  drain(&ev, &out);
  assert_int_equal(out.size(), model.size());
  for (LargeBuf *b : out) delete b;
  for (LargeBuf *b : lent) delete b;
}

}  // namespace

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(every_size_gets_the_smallest_class_that_holds_it),
      cmocka_unit_test(classes_have_their_documented_sizes),
      cmocka_unit_test(zero_and_oversized_have_no_class),
      cmocka_unit_test(cache_hands_back_the_same_class_most_recent_first),
      cmocka_unit_test(cache_evicts_least_recently_given_back_beyond_its_limit),
      cmocka_unit_test(cache_agrees_with_a_model_under_random_use),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
