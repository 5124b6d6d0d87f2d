// test_reqslots.cpp - request identities (src/reqslots.hpp): ids find their request, released
// and older-generation ids find nothing, slots are reused with new ids, growth keeps ids valid.
#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <csetjmp>
extern "C" {  // cmocka.h 1.1 has no extern "C" of its own
#include <cmocka.h>
}

#include <set>
#include <vector>

#include "reqslots.hpp"

using ibmsg::ReqSlots;

namespace {

struct Req {
  int n;
};

void ids_find_their_requests(void **) {
  ReqSlots<Req> t;
  Req a{1}, b{2};
  uint64_t ia = 0, ib = 0;
  assert_true(t.take(&a, &ia));
  assert_true(t.take(&b, &ib));
  assert_true(ia != ib);
  assert_true(ia != 0 && ib != 0);
  assert_ptr_equal(t.find(ia), &a);
  assert_ptr_equal(t.find(ib), &b);
  assert_int_equal(t.size(), 2);
}

void unknown_and_released_ids_find_nothing(void **) {
  ReqSlots<Req> t;
  Req a{1};
  uint64_t ia = 0;
  assert_null(t.find(0));
  assert_null(t.find(12345));
  assert_true(t.take(&a, &ia));
  assert_null(t.find(ia + 1));              // a free slot of the same generation
  assert_null(t.find(ia ^ (uint64_t(7) << 32)));  // another generation
  t.release(ia);
  assert_null(t.find(ia));
  assert_int_equal(t.size(), 0);
  t.release(ia);  // twice: nothing happens
  assert_int_equal(t.size(), 0);
}

void a_reused_slot_has_a_new_id_and_the_old_one_stays_dead(void **) {
  ReqSlots<Req> t;
  Req a{1}, b{2};
  uint64_t ia = 0, ib = 0;
  assert_true(t.take(&a, &ia));
  t.release(ia);
  assert_true(t.take(&b, &ib));
  assert_int_equal(uint32_t(ib), uint32_t(ia));  // the same slot, last freed first
  assert_true(ib != ia);
  assert_null(t.find(ia));  // a late reply to the first request
  assert_ptr_equal(t.find(ib), &b);
  t.release(ia);  // releasing the old id leaves the new request alone
  assert_ptr_equal(t.find(ib), &b);
}

void growing_keeps_every_id_valid_and_unique(void **) {
  ReqSlots<Req> t;
  std::vector<Req> reqs(1000);
  std::vector<uint64_t> ids(reqs.size());
  std::set<uint64_t> seen;
  for (size_t i = 0; i < reqs.size(); ++i) {
    reqs[i].n = int(i);
    assert_true(t.take(&reqs[i], &ids[i]));
    assert_true(seen.insert(ids[i]).second);
  }
  for (size_t i = 0; i < reqs.size(); ++i) assert_ptr_equal(t.find(ids[i]), &reqs[i]);
  for (size_t i = 0; i < reqs.size(); i += 2) t.release(ids[i]);
  assert_int_equal(t.size(), reqs.size() / 2);
  for (size_t i = 0; i < reqs.size(); ++i)
    assert_ptr_equal(t.find(ids[i]), i % 2 ? &reqs[i] : nullptr);
  // Slots come back with ids never seen before.
  for (size_t i = 0; i < reqs.size(); i += 2) {
    uint64_t id = 0;
    assert_true(t.take(&reqs[i], &id));
    assert_true(seen.insert(id).second);
  }
  assert_int_equal(t.size(), reqs.size());
}

}  // namespace

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(ids_find_their_requests),
      cmocka_unit_test(unknown_and_released_ids_find_nothing),
      cmocka_unit_test(a_reused_slot_has_a_new_id_and_the_old_one_stays_dead),
      cmocka_unit_test(growing_keeps_every_id_valid_and_unique),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
