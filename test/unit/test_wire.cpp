// test_wire.cpp - the wire format (src/wire.hpp): the immediate value of every message, the Hello
// of connection set-up and the Reject with its reason text.
#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <csetjmp>
extern "C" {  // cmocka.h 1.1 has no extern "C" of its own
#include <cmocka.h>
}

#include <cstring>

#include "wire.hpp"

namespace wire = ibmsg::wire;

namespace {

// Encodes imm, decodes the result and checks that every field survived.
void assert_imm_round_trip(uint32_t credits, uint32_t ctrl_credits, bool ctrl) {
  wire::Imm in;
  in.credits = credits;
  in.ctrl_credits = ctrl_credits;
  in.ctrl = ctrl;
  wire::Imm out;
  out.credits = 12345;  // must be overwritten
  out.ctrl_credits = 123;
  out.ctrl = !ctrl;
  uint32_t v = wire::encode_imm(in);
  if (!wire::decode_imm(v, &out))
    fail_msg("decode_imm rejected 0x%08x, encoded from credits %u, ctrl_credits %u, ctrl %d", v,
             credits, ctrl_credits, ctrl);
  assert_int_equal(out.credits, credits);
  assert_int_equal(out.ctrl_credits, ctrl_credits);
  assert_int_equal(out.ctrl, ctrl);
}

// --- Imm ----------------------------------------------------------------------------------------

void imm_round_trips_zero(void **) { assert_imm_round_trip(0, 0, false); }

void imm_round_trips_one_of_each(void **) { assert_imm_round_trip(1, 1, false); }

void imm_round_trips_max_credits(void **) {
  assert_imm_round_trip(wire::kMaxCreditsPerMsg, wire::kMaxCtrlCreditsPerMsg, false);
}

void imm_round_trips_the_ctrl_bit_alone(void **) { assert_imm_round_trip(0, 0, true); }

void imm_round_trips_everything_set(void **) {
  assert_imm_round_trip(wire::kMaxCreditsPerMsg, wire::kMaxCtrlCreditsPerMsg, true);
}

void imm_round_trips_fields_independently(void **) {
  // Each field at its maximum with the others zero: no field may leak into another.
  assert_imm_round_trip(wire::kMaxCreditsPerMsg, 0, false);
  assert_imm_round_trip(0, wire::kMaxCtrlCreditsPerMsg, false);
  assert_imm_round_trip(0x8000, 0x80, true);  // top bit of each field
}

void imm_layout_matches_the_documented_bits(void **) {
  wire::Imm imm;
  imm.credits = 0x1234;
  imm.ctrl_credits = 0x56;
  imm.ctrl = true;
  // bits 0..15 credits, 16..23 control credits, 24 CTRL, 25..31 zero
  assert_int_equal(wire::encode_imm(imm), 0x01561234u);
}

void imm_encode_clamps_oversized_fields_instead_of_spilling(void **) {
  wire::Imm imm;
  imm.credits = wire::kMaxCreditsPerMsg + 1;         // would carry into the control credits
  imm.ctrl_credits = wire::kMaxCtrlCreditsPerMsg + 1;  // would carry into the CTRL bit
  uint32_t v = wire::encode_imm(imm);
  wire::Imm out;
  assert_true(wire::decode_imm(v, &out));  // no reserved bit may be set
  assert_int_equal(out.credits, wire::kMaxCreditsPerMsg);
  assert_int_equal(out.ctrl_credits, wire::kMaxCtrlCreditsPerMsg);
  assert_false(out.ctrl);  // an oversized count must not turn a data message into a credit-only one
}

void imm_decode_rejects_each_reserved_bit(void **) {
  for (int bit = 25; bit < 32; ++bit) {
    wire::Imm out;
    if (wire::decode_imm(1u << bit, &out))
      fail_msg("decode_imm accepted reserved bit %d (0x%08x)", bit, 1u << bit);
    if (wire::decode_imm((1u << bit) | 0x01000001u, &out))
      fail_msg("decode_imm accepted reserved bit %d next to valid fields", bit);
  }
}

void imm_decode_accepts_every_unreserved_bit(void **) {
  wire::Imm out;
  assert_true(wire::decode_imm(0x01ffffffu, &out));
  assert_int_equal(out.credits, 0xffff);
  assert_int_equal(out.ctrl_credits, 0xff);
  assert_true(out.ctrl);
}

// --- Hello --------------------------------------------------------------------------------------

wire::Hello make_hello(uint32_t recv_depth, uint32_t ctrl_depth, uint32_t max_msg_size) {
  wire::Hello h;
  h.recv_depth = recv_depth;
  h.ctrl_depth = ctrl_depth;
  h.max_msg_size = max_msg_size;
  return h;
}

void hello_round_trips(void **) {
  uint8_t buf[wire::kHelloSize];
  wire::encode_hello(make_hello(32, 4, 65536), buf);
  wire::Hello out;
  assert_true(wire::decode_hello(buf, sizeof buf, &out));
  assert_int_equal(out.recv_depth, 32);
  assert_int_equal(out.ctrl_depth, 4);
  assert_int_equal(out.max_msg_size, 65536);
}

void hello_round_trips_extreme_values(void **) {
  uint8_t buf[wire::kHelloSize];
  wire::encode_hello(make_hello(0xffffffffu, 1, 0), buf);  // a zero max_msg_size is valid
  wire::Hello out;
  assert_true(wire::decode_hello(buf, sizeof buf, &out));
  assert_int_equal(out.recv_depth, 0xffffffffu);
  assert_int_equal(out.ctrl_depth, 1);
  assert_int_equal(out.max_msg_size, 0);
}

void hello_layout_is_little_endian_byte_by_byte(void **) {
  uint8_t buf[wire::kHelloSize];
  memset(buf, 0xee, sizeof buf);
  wire::encode_hello(make_hello(0x01020304u, 0x0a0b0c0du, 0x00010000u), buf);
  const uint8_t expected[wire::kHelloSize] = {
      0x53, 0x4d, 0x42, 0x49,  // magic 0x49424d53 ("IBMS" read as a big-endian word)
      0x01, 0x00,              // version 1
      0x01,                    // kind: hello
      0x00,                    // reserved
      0x04, 0x03, 0x02, 0x01,  // recv_depth
      0x0d, 0x0c, 0x0b, 0x0a,  // ctrl_depth
      0x00, 0x00, 0x01, 0x00,  // max_msg_size
  };
  for (size_t i = 0; i < sizeof expected; ++i)
    if (buf[i] != expected[i])
      fail_msg("hello byte %zu is 0x%02x, expected 0x%02x", i, buf[i], expected[i]);
}

void hello_fits_the_private_data_of_a_connect_request(void **) {
  // An IB/RoCE REQ leaves 56 bytes of private data; rdma_cm takes some for itself on iWARP, but
  // the hello must at least fit the REQ.
  assert_true(wire::kHelloSize <= 56);
}

void hello_decodes_when_padded_by_the_transport(void **) {
  uint8_t buf[56];
  memset(buf, 0, sizeof buf);
  wire::encode_hello(make_hello(8, 4, 1024), buf);
  wire::Hello out;
  assert_true(wire::decode_hello(buf, sizeof buf, &out));
  assert_int_equal(out.recv_depth, 8);
  assert_int_equal(out.max_msg_size, 1024);
}

// Encodes a valid hello, changes byte `index` to `value` and checks that it is rejected.
void assert_hello_rejected_with_byte(size_t index, uint8_t value, const char *what) {
  uint8_t buf[wire::kHelloSize];
  wire::encode_hello(make_hello(8, 4, 1024), buf);
  buf[index] = value;
  wire::Hello out;
  if (wire::decode_hello(buf, sizeof buf, &out)) fail_msg("decode_hello accepted %s", what);
}

void hello_with_wrong_magic_is_rejected(void **) {
  assert_hello_rejected_with_byte(0, 0x54, "a wrong magic (first byte)");
  assert_hello_rejected_with_byte(3, 0x48, "a wrong magic (last byte)");
}

void hello_with_wrong_version_is_rejected(void **) {
  assert_hello_rejected_with_byte(4, 2, "version 2");
  assert_hello_rejected_with_byte(5, 1, "version 257");
  assert_hello_rejected_with_byte(4, 0, "version 0");
}

void hello_with_wrong_kind_is_rejected(void **) {
  assert_hello_rejected_with_byte(6, 2, "a reject's kind byte");
  assert_hello_rejected_with_byte(6, 0, "kind 0");
}

void hello_too_short_is_rejected(void **) {
  uint8_t buf[wire::kHelloSize];
  wire::encode_hello(make_hello(8, 4, 1024), buf);
  wire::Hello out;
  for (size_t len = 0; len < wire::kHelloSize; ++len)
    if (wire::decode_hello(buf, len, &out)) fail_msg("decode_hello accepted %zu bytes", len);
}

void hello_null_data_is_rejected(void **) {
  wire::Hello out;
  assert_false(wire::decode_hello(nullptr, wire::kHelloSize, &out));
}

void hello_with_zero_depths_is_rejected(void **) {
  // A peer that grants no credits could never be sent to.
  uint8_t buf[wire::kHelloSize];
  wire::Hello out;
  wire::encode_hello(make_hello(0, 4, 1024), buf);
  assert_false(wire::decode_hello(buf, sizeof buf, &out));  // zero recv_depth
  wire::encode_hello(make_hello(8, 0, 1024), buf);
  assert_false(wire::decode_hello(buf, sizeof buf, &out));  // zero ctrl_depth
}

// --- Reject -------------------------------------------------------------------------------------

void reject_round_trips_text(void **) {
  uint8_t buf[wire::kRejectMaxSize];
  size_t len = wire::encode_reject("server full", buf);
  assert_int_equal(len, wire::kRejectHeader + strlen("server full"));
  char text[wire::kRejectTextMax + 1];
  assert_true(wire::decode_reject(buf, len, text, sizeof text));
  assert_string_equal(text, "server full");
}

void reject_without_text_decodes_to_empty_text(void **) {
  uint8_t buf[wire::kRejectMaxSize];
  size_t len = wire::encode_reject(nullptr, buf);
  assert_int_equal(len, wire::kRejectHeader);
  char text[wire::kRejectTextMax + 1];
  memset(text, 'x', sizeof text);
  assert_true(wire::decode_reject(buf, len, text, sizeof text));
  assert_string_equal(text, "");
  len = wire::encode_reject("", buf);
  assert_int_equal(len, wire::kRejectHeader);
}

void reject_text_is_cut_at_the_maximum(void **) {
  char longtext[wire::kRejectTextMax + 50];
  for (size_t i = 0; i < sizeof longtext - 1; ++i) longtext[i] = char('a' + i % 26);
  longtext[sizeof longtext - 1] = '\0';
  uint8_t buf[wire::kRejectMaxSize + 16];
  memset(buf, 0xee, sizeof buf);
  size_t len = wire::encode_reject(longtext, buf);
  assert_int_equal(len, wire::kRejectMaxSize);
  for (size_t i = wire::kRejectMaxSize; i < sizeof buf; ++i)
    if (buf[i] != 0xee) fail_msg("encode_reject wrote byte %zu, past kRejectMaxSize", i);
  char text[wire::kRejectTextMax + 1];
  assert_true(wire::decode_reject(buf, len, text, sizeof text));
  assert_int_equal(strlen(text), wire::kRejectTextMax);
  assert_memory_equal(text, longtext, wire::kRejectTextMax);
}

void reject_text_of_exactly_the_maximum_is_kept_whole(void **) {
  char exact[wire::kRejectTextMax + 1];
  memset(exact, 'r', wire::kRejectTextMax);
  exact[wire::kRejectTextMax] = '\0';
  uint8_t buf[wire::kRejectMaxSize];
  size_t len = wire::encode_reject(exact, buf);
  char text[wire::kRejectTextMax + 1];
  assert_true(wire::decode_reject(buf, len, text, sizeof text));
  assert_string_equal(text, exact);
}

void reject_padded_with_zeros_decodes_to_the_text(void **) {
  // The CM delivers the REJ's whole private data area, zero-padded past what was sent.
  uint8_t buf[148];
  memset(buf, 0, sizeof buf);
  wire::encode_reject("busy", buf);
  char text[wire::kRejectTextMax + 1];
  assert_true(wire::decode_reject(buf, sizeof buf, text, sizeof text));
  assert_string_equal(text, "busy");
}

void reject_decode_of_a_longer_area_stops_at_the_maximum(void **) {
  // Private data longer than header + kRejectTextMax without a NUL: the text still ends at
  // kRejectTextMax, even when the output buffer has room for more.
  uint8_t buf[wire::kRejectMaxSize + 12];
  memset(buf, 'z', sizeof buf);
  wire::encode_reject(nullptr, buf);
  char text[2 * wire::kRejectTextMax];
  assert_true(wire::decode_reject(buf, sizeof buf, text, sizeof text));
  assert_int_equal(strlen(text), wire::kRejectTextMax);
}

void reject_decode_never_writes_past_a_small_buffer(void **) {
  uint8_t buf[wire::kRejectMaxSize];
  size_t len = wire::encode_reject("abcdefgh", buf);
  char text[8];
  memset(text, 'x', sizeof text);
  assert_true(wire::decode_reject(buf, len, text, 5));
  assert_string_equal(text, "abcd");  // cut and terminated within the 5 bytes
  assert_int_equal(text[5], 'x');
}

void reject_layout_is_the_header_then_the_text(void **) {
  uint8_t buf[wire::kRejectMaxSize];
  size_t len = wire::encode_reject("no", buf);
  const uint8_t expected[] = {0x53, 0x4d, 0x42, 0x49, 0x01, 0x00, 0x02, 0x00, 'n', 'o'};
  assert_int_equal(len, sizeof expected);
  for (size_t i = 0; i < sizeof expected; ++i)
    if (buf[i] != expected[i])
      fail_msg("reject byte %zu is 0x%02x, expected 0x%02x", i, buf[i], expected[i]);
}

void reject_fits_the_private_data_of_a_reject(void **) {
  assert_true(wire::kRejectMaxSize <= 148);  // an IB REJ carries 148 bytes of private data
}

void reject_with_wrong_header_is_rejected(void **) {
  uint8_t buf[wire::kRejectMaxSize];
  char text[wire::kRejectTextMax + 1];
  const size_t bytes[] = {0, 4, 6};  // magic, version, kind
  for (size_t b : bytes) {
    size_t len = wire::encode_reject("why", buf);
    buf[b] ^= 0x10;
    if (wire::decode_reject(buf, len, text, sizeof text))
      fail_msg("decode_reject accepted a reject with header byte %zu changed", b);
  }
}

void reject_too_short_or_null_is_rejected(void **) {
  uint8_t buf[wire::kRejectMaxSize];
  char text[wire::kRejectTextMax + 1];
  wire::encode_reject("why", buf);
  for (size_t len = 0; len < wire::kRejectHeader; ++len)
    if (wire::decode_reject(buf, len, text, sizeof text))
      fail_msg("decode_reject accepted %zu bytes", len);
  assert_false(wire::decode_reject(nullptr, sizeof buf, text, sizeof text));
  size_t len = wire::encode_reject("why", buf);
  assert_false(wire::decode_reject(buf, len, text, 0));  // no room even for the terminator
}

void hello_and_reject_are_not_mistaken_for_each_other(void **) {
  uint8_t hello[wire::kRejectMaxSize];
  memset(hello, 0, sizeof hello);
  wire::encode_hello(make_hello(8, 4, 1024), hello);
  char text[wire::kRejectTextMax + 1];
  assert_false(wire::decode_reject(hello, sizeof hello, text, sizeof text));

  uint8_t reject[wire::kRejectMaxSize];
  memset(reject, 1, sizeof reject);  // non-zero "depths" after the header
  wire::encode_reject("\x01\x01\x01\x01\x01\x01\x01\x01\x01\x01\x01\x01", reject);
  wire::Hello out;
  assert_false(wire::decode_hello(reject, sizeof reject, &out));
}

}  // namespace

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(imm_round_trips_zero),
      cmocka_unit_test(imm_round_trips_one_of_each),
      cmocka_unit_test(imm_round_trips_max_credits),
      cmocka_unit_test(imm_round_trips_the_ctrl_bit_alone),
      cmocka_unit_test(imm_round_trips_everything_set),
      cmocka_unit_test(imm_round_trips_fields_independently),
      cmocka_unit_test(imm_layout_matches_the_documented_bits),
      cmocka_unit_test(imm_encode_clamps_oversized_fields_instead_of_spilling),
      cmocka_unit_test(imm_decode_rejects_each_reserved_bit),
      cmocka_unit_test(imm_decode_accepts_every_unreserved_bit),
      cmocka_unit_test(hello_round_trips),
      cmocka_unit_test(hello_round_trips_extreme_values),
      cmocka_unit_test(hello_layout_is_little_endian_byte_by_byte),
      cmocka_unit_test(hello_fits_the_private_data_of_a_connect_request),
      cmocka_unit_test(hello_decodes_when_padded_by_the_transport),
      cmocka_unit_test(hello_with_wrong_magic_is_rejected),
      cmocka_unit_test(hello_with_wrong_version_is_rejected),
      cmocka_unit_test(hello_with_wrong_kind_is_rejected),
      cmocka_unit_test(hello_too_short_is_rejected),
      cmocka_unit_test(hello_null_data_is_rejected),
      cmocka_unit_test(hello_with_zero_depths_is_rejected),
      cmocka_unit_test(reject_round_trips_text),
      cmocka_unit_test(reject_without_text_decodes_to_empty_text),
      cmocka_unit_test(reject_text_is_cut_at_the_maximum),
      cmocka_unit_test(reject_text_of_exactly_the_maximum_is_kept_whole),
      cmocka_unit_test(reject_padded_with_zeros_decodes_to_the_text),
      cmocka_unit_test(reject_decode_of_a_longer_area_stops_at_the_maximum),
      cmocka_unit_test(reject_decode_never_writes_past_a_small_buffer),
      cmocka_unit_test(reject_layout_is_the_header_then_the_text),
      cmocka_unit_test(reject_fits_the_private_data_of_a_reject),
      cmocka_unit_test(reject_with_wrong_header_is_rejected),
      cmocka_unit_test(reject_too_short_or_null_is_rejected),
      cmocka_unit_test(hello_and_reject_are_not_mistaken_for_each_other),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
