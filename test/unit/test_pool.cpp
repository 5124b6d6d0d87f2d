// test_pool.cpp - message pools (src/pool.hpp): slot sizes and alignment, taking and returning
// send slots, and the checks that tell a slot from garbage.
#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <csetjmp>
extern "C" {  // cmocka.h 1.1 has no extern "C" of its own
#include <cmocka.h>
}

#include <cstring>

#include "pool.hpp"

using ibmsg::Pool;
using ibmsg::Slot;
using ibmsg::SlotState;

namespace {

// Creates a pool or fails the test. cmocka's longjmp on a failed assertion leaks the pool, which
// is harmless in a test process.
Pool *create(bool recv, uint32_t count, size_t slot_size) {
  Pool *p = ibmsg::pool_create(recv, count, slot_size);
  if (!p) fail_msg("pool_create(recv=%d, count=%u, slot_size=%zu) returned nullptr", recv, count,
                   slot_size);
  return p;
}

void assert_slot_size(size_t requested, size_t expected) {
  Pool *p = create(false, 2, requested);
  if (p->slot_size != expected)
    fail_msg("slot_size for a %zu-byte maximum is %zu, expected %zu", requested, p->slot_size,
             expected);
  ibmsg::pool_destroy(p);
}

// --- sizes --------------------------------------------------------------------------------------

void slot_size_is_rounded_up_to_64_bytes(void **) {
  assert_slot_size(1, 64);
  assert_slot_size(63, 64);
  assert_slot_size(65, 128);
  assert_slot_size(100, 128);
  assert_slot_size(65536 + 1, 65536 + 64);
}

void slot_size_that_is_a_multiple_of_64_is_kept(void **) {
  assert_slot_size(64, 64);
  assert_slot_size(4096, 4096);
  assert_slot_size(65536, 65536);
}

void zero_max_size_still_gives_usable_slots(void **) {
  Pool *p = create(false, 3, 0);
  assert_int_equal(p->slot_size, 64);  // one cache line per slot, so slots stay distinct
  Slot *a = ibmsg::pool_get(p);
  Slot *b = ibmsg::pool_get(p);
  assert_non_null(a);
  assert_non_null(b);
  assert_true(a->buf != b->buf);  // distinct buffers even for empty messages
  ibmsg::pool_put(p, a);
  ibmsg::pool_put(p, b);
  ibmsg::pool_destroy(p);
}

void pool_records_its_kind_count_and_bytes(void **) {
  Pool *s = create(false, 5, 100);
  Pool *r = create(true, 7, 100);
  assert_false(s->recv);
  assert_true(r->recv);
  assert_int_equal(s->count, 5);
  assert_int_equal(r->count, 7);
  assert_int_equal(s->bytes, 5 * s->slot_size);  // the block a memory region will cover
  assert_int_equal(r->bytes, 7 * r->slot_size);
  assert_int_equal(s->out, 0);  // nothing handed out yet
  assert_int_equal(r->out, 0);
  ibmsg::pool_destroy(s);
  ibmsg::pool_destroy(r);
}

// --- layout -------------------------------------------------------------------------------------

void memory_is_page_aligned(void **) {
  Pool *p = create(true, 3, 100);
  assert_int_equal(reinterpret_cast<uintptr_t>(p->mem) % 4096, 0);
  ibmsg::pool_destroy(p);
}

void slots_are_64_byte_aligned_and_inside_the_block(void **) {
  Pool *p = create(true, 9, 200);
  for (uint32_t i = 0; i < p->count; ++i) {
    const Slot &s = p->slots[i];
    if (reinterpret_cast<uintptr_t>(s.buf) % 64 != 0)
      fail_msg("slot %u's buffer %p is not 64-byte aligned", i, static_cast<void *>(s.buf));
    if (s.buf < p->mem || s.buf + p->slot_size > p->mem + p->bytes)
      fail_msg("slot %u's buffer lies outside the pool's memory", i);
  }
  ibmsg::pool_destroy(p);
}

void slots_do_not_overlap(void **) {
  Pool *p = create(true, 6, 100);
  // Fill every slot completely with its own byte, then check nothing was overwritten.
  for (uint32_t i = 0; i < p->count; ++i) memset(p->slots[i].buf, int('A' + i), p->slot_size);
  for (uint32_t i = 0; i < p->count; ++i)
    for (size_t j = 0; j < p->slot_size; ++j)
      if (p->slots[i].buf[j] != uint8_t('A' + i))
        fail_msg("byte %zu of slot %u was overwritten by slot %c", j, i, p->slots[i].buf[j]);
  ibmsg::pool_destroy(p);
}

void slots_know_their_pool_and_start_free(void **) {
  Pool *p = create(false, 4, 64);
  for (uint32_t i = 0; i < p->count; ++i) {
    assert_ptr_equal(p->slots[i].pool, p);
    assert_true(p->slots[i].state == SlotState::Free);
    assert_true(ibmsg::slot_valid(&p->slots[i]));
  }
  ibmsg::pool_destroy(p);
}

// --- send pools: get and put --------------------------------------------------------------------

void pool_get_hands_out_every_slot_then_nullptr(void **) {
  const uint32_t count = 5;
  Pool *p = create(false, count, 64);
  Slot *got[count];
  for (uint32_t i = 0; i < count; ++i) {
    got[i] = ibmsg::pool_get(p);
    if (!got[i]) fail_msg("pool_get returned nullptr after %u of %u slots", i, count);
  }
  assert_null(ibmsg::pool_get(p));  // exhausted
  assert_null(ibmsg::pool_get(p));  // and stays so
  for (uint32_t i = 0; i < count; ++i)
    for (uint32_t j = i + 1; j < count; ++j)
      if (got[i] == got[j]) fail_msg("pool_get returned the same slot twice (%u and %u)", i, j);
  ibmsg::pool_destroy(p);
}

void pool_get_marks_the_slot_allocated(void **) {
  Pool *p = create(false, 2, 64);
  Slot *s = ibmsg::pool_get(p);
  assert_non_null(s);
  assert_true(s->state == SlotState::Allocated);
  assert_ptr_equal(s->pool, p);
  ibmsg::pool_destroy(p);
}

void pool_put_makes_a_slot_available_again(void **) {
  Pool *p = create(false, 1, 64);
  Slot *s = ibmsg::pool_get(p);
  assert_non_null(s);
  assert_null(ibmsg::pool_get(p));
  ibmsg::pool_put(p, s);
  assert_true(s->state == SlotState::Free);
  Slot *again = ibmsg::pool_get(p);
  assert_ptr_equal(again, s);
  ibmsg::pool_destroy(p);
}

void pool_put_forgets_the_applications_message(void **) {
  Pool *p = create(false, 1, 64);
  Slot *s = ibmsg::pool_get(p);
  ibmsg_buffer msg;
  memset(&msg, 0, sizeof msg);
  s->msg = &msg;  // as msg_alloc attaches it
  ibmsg::pool_put(p, s);
  assert_null(s->msg);  // a freed slot must not point at a struct the application may reuse
  ibmsg::pool_destroy(p);
}

void out_counts_slots_handed_out(void **) {
  Pool *p = create(false, 3, 64);
  Slot *a = ibmsg::pool_get(p);
  assert_int_equal(p->out, 1);
  Slot *b = ibmsg::pool_get(p);
  Slot *c = ibmsg::pool_get(p);
  assert_int_equal(p->out, 3);
  assert_null(ibmsg::pool_get(p));
  assert_int_equal(p->out, 3);  // a failed get must not count
  ibmsg::pool_put(p, b);
  assert_int_equal(p->out, 2);
  ibmsg::pool_put(p, a);
  ibmsg::pool_put(p, c);
  assert_int_equal(p->out, 0);
  ibmsg::pool_destroy(p);
}

void many_get_put_cycles_keep_every_slot_reachable(void **) {
  const uint32_t count = 4;
  Pool *p = create(false, count, 64);
  for (int round = 0; round < 100; ++round) {
    Slot *got[count];
    for (uint32_t i = 0; i < count; ++i) {
      got[i] = ibmsg::pool_get(p);
      if (!got[i]) fail_msg("round %d: only %u of %u slots could be taken", round, i, count);
    }
    // return them in a different order each round
    for (uint32_t i = 0; i < count; ++i) ibmsg::pool_put(p, got[(i + uint32_t(round)) % count]);
  }
  assert_int_equal(p->out, 0);
  ibmsg::pool_destroy(p);
}

// --- recv pools ---------------------------------------------------------------------------------

void recv_pool_slots_lend_their_own_buffer_struct(void **) {
  Pool *p = create(true, 4, 64);
  for (uint32_t i = 0; i < p->count; ++i) {
    Slot &s = p->slots[i];
    assert_ptr_equal(s.msg, &s.own);  // the struct lent to the application lives in the slot
    assert_ptr_equal(s.own.impl, &s);  // and leads back to it from ibmsg_free_msg
  }
  ibmsg::pool_destroy(p);
}

void recv_pool_has_no_free_list(void **) {
  // Receive slots are posted to the QP, never taken with pool_get.
  Pool *p = create(true, 4, 64);
  assert_true(p->free_list.empty());
  assert_null(ibmsg::pool_get(p));
  ibmsg::pool_destroy(p);
}

void send_pool_slots_have_no_message_until_allocated(void **) {
  Pool *p = create(false, 2, 64);
  for (uint32_t i = 0; i < p->count; ++i) assert_null(p->slots[i].msg);
  ibmsg::pool_destroy(p);
}

// --- slot_valid ---------------------------------------------------------------------------------

void slot_valid_rejects_nullptr(void **) { assert_false(ibmsg::slot_valid(nullptr)); }

void slot_valid_rejects_garbage(void **) {
  Slot zeroed;
  memset(static_cast<void *>(&zeroed), 0, sizeof zeroed);
  assert_false(ibmsg::slot_valid(&zeroed));
  Slot junk;
  memset(static_cast<void *>(&junk), 0xa5, sizeof junk);
  assert_false(ibmsg::slot_valid(&junk));
}

void slot_valid_accepts_real_slots_of_both_kinds(void **) {
  Pool *s = create(false, 1, 64);
  Pool *r = create(true, 1, 64);
  assert_true(ibmsg::slot_valid(&s->slots[0]));
  assert_true(ibmsg::slot_valid(&r->slots[0]));
  assert_true(ibmsg::slot_valid(r->slots[0].own.impl));  // what ibmsg_free_msg checks
  ibmsg::pool_destroy(s);
  ibmsg::pool_destroy(r);
}

void pool_destroy_accepts_nullptr(void **) {
  ibmsg::pool_destroy(nullptr);  // must not crash
  Pool *p = create(false, 1, 64);
  ibmsg::pool_destroy(p);
}

}  // namespace

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(slot_size_is_rounded_up_to_64_bytes),
      cmocka_unit_test(slot_size_that_is_a_multiple_of_64_is_kept),
      cmocka_unit_test(zero_max_size_still_gives_usable_slots),
      cmocka_unit_test(pool_records_its_kind_count_and_bytes),
      cmocka_unit_test(memory_is_page_aligned),
      cmocka_unit_test(slots_are_64_byte_aligned_and_inside_the_block),
      cmocka_unit_test(slots_do_not_overlap),
      cmocka_unit_test(slots_know_their_pool_and_start_free),
      cmocka_unit_test(pool_get_hands_out_every_slot_then_nullptr),
      cmocka_unit_test(pool_get_marks_the_slot_allocated),
      cmocka_unit_test(pool_put_makes_a_slot_available_again),
      cmocka_unit_test(pool_put_forgets_the_applications_message),
      cmocka_unit_test(out_counts_slots_handed_out),
      cmocka_unit_test(many_get_put_cycles_keep_every_slot_reachable),
      cmocka_unit_test(recv_pool_slots_lend_their_own_buffer_struct),
      cmocka_unit_test(recv_pool_has_no_free_list),
      cmocka_unit_test(send_pool_slots_have_no_message_until_allocated),
      cmocka_unit_test(slot_valid_rejects_nullptr),
      cmocka_unit_test(slot_valid_rejects_garbage),
      cmocka_unit_test(slot_valid_accepts_real_slots_of_both_kinds),
      cmocka_unit_test(pool_destroy_accepts_nullptr),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
