// test_wire.cpp - the wire format (src/wire.hpp): the immediate value of every message, the Hello
// of connection set-up and its feature bits, the Reject with its reason text, and the remote
// descriptor (ibmsg_descriptor) with its check, and the rendezvous RTS and FIN.
#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <csetjmp>
extern "C" {  // cmocka.h 1.1 has no extern "C" of its own
#include <cmocka.h>
}

#include <cstring>
#include <random>

#include "ibmsg.h"
#include "wire.hpp"

namespace wire = ibmsg::wire;

namespace {

// --- byte layouts ---------------------------------------------------------------------------

// Fails unless buf starts with the n bytes of expected; `what` names the message in the failure.
void assert_bytes(const uint8_t *buf, const uint8_t *expected, size_t n, const char *what) {
  for (size_t i = 0; i < n; ++i)
    if (buf[i] != expected[i])
      fail_msg("%s byte %zu is 0x%02x, expected 0x%02x", what, i, buf[i], expected[i]);
}

// Fails unless buf[from, size) still holds the 0xee the test filled it with: `encoder` wrote
// nothing past `limit` (bytes from on).
void assert_untouched_from(const uint8_t *buf, size_t from, size_t size, const char *encoder,
                           const char *limit) {
  for (size_t i = from; i < size; ++i)
    if (buf[i] != 0xee) fail_msg("%s wrote byte %zu, past %s", encoder, i, limit);
}

// --- Imm ----------------------------------------------------------------------------------------

unsigned op_value(wire::Opcode op) { return unsigned(op); }

// Encodes imm, decodes the result and checks that every field survived.
void assert_imm_round_trip(uint32_t credits, uint32_t ctrl_credits, wire::Opcode op) {
  wire::Imm in;
  in.credits = credits;
  in.ctrl_credits = ctrl_credits;
  in.op = op;
  wire::Imm out;
  out.credits = 12345;  // must be overwritten
  out.ctrl_credits = 123;
  out.op = wire::Opcode((op_value(op) + 1) % wire::kOpcodeCount);
  uint32_t v = wire::encode_imm(in);
  if (!wire::decode_imm(v, &out))
    fail_msg("decode_imm rejected 0x%08x, encoded from credits %u, ctrl_credits %u, opcode %u", v,
             credits, ctrl_credits, op_value(op));
  if (out.credits != credits || out.ctrl_credits != ctrl_credits || out.op != op)
    fail_msg("credits %u, ctrl_credits %u, opcode %u came back as %u, %u, %u (immediate 0x%08x)",
             credits, ctrl_credits, op_value(op), out.credits, out.ctrl_credits, op_value(out.op),
             v);
}

void imm_round_trips_zero(void **) { assert_imm_round_trip(0, 0, wire::Opcode::Data); }

void imm_round_trips_one_of_each(void **) { assert_imm_round_trip(1, 1, wire::Opcode::Data); }

void imm_round_trips_max_credits(void **) {
  assert_imm_round_trip(wire::kMaxCreditsPerMsg, wire::kMaxCtrlCreditsPerMsg, wire::Opcode::Data);
}

void imm_round_trips_the_credit_opcode_alone(void **) {
  assert_imm_round_trip(0, 0, wire::Opcode::Credit);
}

void imm_round_trips_everything_set(void **) {
  assert_imm_round_trip(wire::kMaxCreditsPerMsg, wire::kMaxCtrlCreditsPerMsg, wire::Opcode(15));
}

void imm_round_trips_fields_independently(void **) {
  // Each field at its maximum with the others zero: no field may leak into another.
  assert_imm_round_trip(wire::kMaxCreditsPerMsg, 0, wire::Opcode::Data);
  assert_imm_round_trip(0, wire::kMaxCtrlCreditsPerMsg, wire::Opcode::Data);
  assert_imm_round_trip(0, 0, wire::Opcode(15));
  assert_imm_round_trip(0x8000, 0x80, wire::Opcode(8));  // top bit of each field
}

void imm_round_trips_every_opcode(void **) {
  // All 16 values decode, reserved ones too: whether an opcode is allowed is the core's decision.
  for (unsigned op = 0; op < wire::kOpcodeCount; ++op) {
    assert_imm_round_trip(0, 0, wire::Opcode(op));
    assert_imm_round_trip(0x1234, 0x56, wire::Opcode(op));
    assert_imm_round_trip(wire::kMaxCreditsPerMsg, wire::kMaxCtrlCreditsPerMsg, wire::Opcode(op));
  }
}

void imm_opcode_count_covers_the_four_opcode_bits(void **) {
  assert_int_equal(wire::kOpcodeCount, 16);
}

void imm_opcodes_have_their_documented_values(void **) {
  // These numbers travel on the wire: renumbering them breaks every older peer.
  assert_int_equal(op_value(wire::Opcode::Data), 0);
  assert_int_equal(op_value(wire::Opcode::Credit), 1);
  assert_int_equal(op_value(wire::Opcode::Keepalive), 2);
  assert_int_equal(op_value(wire::Opcode::Rendezvous), 3);
  assert_int_equal(op_value(wire::Opcode::RdmaNotice), 4);
  assert_int_equal(op_value(wire::Opcode::Request), 7);
  assert_int_equal(op_value(wire::Opcode::Reply), 8);
}

void imm_default_is_a_data_message_returning_nothing(void **) {
  wire::Imm imm;
  assert_int_equal(wire::encode_imm(imm), 0);
}

// Encodes the fields and checks the exact immediate value.
void assert_imm_encodes_to(uint32_t credits, uint32_t ctrl_credits, wire::Opcode op,
                           uint32_t expected) {
  wire::Imm imm;
  imm.credits = credits;
  imm.ctrl_credits = ctrl_credits;
  imm.op = op;
  uint32_t v = wire::encode_imm(imm);
  if (v != expected)
    fail_msg("credits 0x%x, ctrl_credits 0x%x, opcode %u encode to 0x%08x, expected 0x%08x",
             credits, ctrl_credits, op_value(op), v, expected);
}

void imm_layout_matches_the_documented_bits(void **) {
  // bits 0..15 credits, 16..23 control credits, 24..27 zero, 28..31 opcode
  assert_imm_encodes_to(0x1234, 0x56, wire::Opcode::Credit, 0x10561234u);
  assert_imm_encodes_to(0x1234, 0x56, wire::Opcode::RdmaNotice, 0x40561234u);
  assert_imm_encodes_to(0, 0, wire::Opcode(15), 0xf0000000u);
  assert_imm_encodes_to(0xffff, 0xff, wire::Opcode::Data, 0x00ffffffu);
}

// Encodes oversized counts and checks that they are clamped and that the opcode survives.
void assert_imm_clamps(uint32_t credits, uint32_t ctrl_credits, wire::Opcode op) {
  wire::Imm imm;
  imm.credits = credits;
  imm.ctrl_credits = ctrl_credits;
  imm.op = op;
  uint32_t v = wire::encode_imm(imm);
  wire::Imm out;
  if (!wire::decode_imm(v, &out))
    fail_msg("credits 0x%x, ctrl_credits 0x%x spilled into the reserved bits: 0x%08x", credits,
             ctrl_credits, v);
  if (out.credits != wire::kMaxCreditsPerMsg || out.ctrl_credits != wire::kMaxCtrlCreditsPerMsg)
    fail_msg("credits 0x%x, ctrl_credits 0x%x came back as 0x%x, 0x%x, expected the maxima",
             credits, ctrl_credits, out.credits, out.ctrl_credits);
  // An oversized count must not turn a data message into a credit-only one, or the reverse.
  if (out.op != op)
    fail_msg("credits 0x%x, ctrl_credits 0x%x changed opcode %u into %u", credits, ctrl_credits,
             op_value(op), op_value(out.op));
}

void imm_encode_clamps_oversized_fields_instead_of_spilling(void **) {
  assert_imm_clamps(wire::kMaxCreditsPerMsg + 1, wire::kMaxCtrlCreditsPerMsg + 1,
                    wire::Opcode::Data);
  assert_imm_clamps(wire::kMaxCreditsPerMsg + 1, wire::kMaxCtrlCreditsPerMsg + 1,
                    wire::Opcode::Credit);
  assert_imm_clamps(0xffffffffu, 0xffffffffu, wire::Opcode::Data);
  assert_imm_clamps(0xffffffffu, 0xffffffffu, wire::Opcode::Credit);
}

// Bits 24..27 count rendezvous messages read (protocol 1.2); each bit lands in done alone.
void imm_done_count_round_trips(void **) {
  for (uint32_t done = 0; done <= wire::kMaxDonePerMsg; ++done) {
    wire::Imm in;
    in.op = wire::Opcode::Credit;
    in.credits = 0xffff;
    in.ctrl_credits = 0xff;
    in.done = done;
    const uint32_t v = wire::encode_imm(in);
    if ((v >> 24 & 0x0f) != done) fail_msg("done %u encoded as 0x%08x", done, v);
    wire::Imm out;
    assert_true(wire::decode_imm(v, &out));
    if (out.done != done || out.credits != 0xffff || out.ctrl_credits != 0xff ||
        out.op != wire::Opcode::Credit)
      fail_msg("0x%08x decoded to done %u, credits %u/%u", v, out.done, out.credits,
               out.ctrl_credits);
  }
  for (int bit = 24; bit < 28; ++bit) {
    wire::Imm out;
    assert_true(wire::decode_imm(1u << bit, &out));
    assert_int_equal(out.done, 1u << (bit - 24));
    assert_int_equal(out.credits, 0);
    assert_int_equal(out.ctrl_credits, 0);
  }
  wire::Imm big;
  big.done = 1000;  // clamped, never spilling into the opcode
  assert_int_equal(wire::encode_imm(big), 0x0f000000u);
}

void imm_decode_accepts_every_unreserved_bit(void **) {
  wire::Imm out;
  assert_true(wire::decode_imm(0xffffffffu, &out));
  assert_int_equal(out.done, 15);
  assert_int_equal(out.credits, 0xffff);
  assert_int_equal(out.ctrl_credits, 0xff);
  assert_int_equal(op_value(out.op), 15);
}

// Found by test/fuzz/fuzz_imm: decode_imm into an Imm that held another message kept its wants
// field, so that a reused Imm with wants set re-encoded credits 0x8001 as 0xffff. Every field of
// the result comes from the value alone.
void imm_decode_into_a_used_imm_depends_on_the_value_only(void **) {
  for (uint32_t v : {0x00008001u, 0x10018000u, 0x00010003u, 0xffffffffu, 0u}) {
    wire::Imm used;
    used.op = wire::Opcode::Return;
    used.credits = 12345;
    used.ctrl_credits = 7;
    used.done = 3;
    used.wants = true;
    assert_true(wire::decode_imm(v, &used));
    if (used.wants) fail_msg("0x%08x decoded into a used Imm keeps its wants field", v);
    assert_int_equal(used.credits, v & 0xffff);
    assert_int_equal(used.ctrl_credits, v >> 16 & 0xff);
    assert_int_equal(used.done, v >> 24 & 0x0f);
    assert_int_equal(op_value(used.op), v >> 28);
    if (wire::encode_imm(used) != v)
      fail_msg("0x%08x decoded into a used Imm encodes to 0x%08x", v, wire::encode_imm(used));
  }
}

// --- Hello --------------------------------------------------------------------------------------

const char *result_name(wire::HelloResult r) {
  switch (r) {
    case wire::HelloResult::Ok: return "Ok";
    case wire::HelloResult::NotIbmsg: return "NotIbmsg";
    case wire::HelloResult::OtherMajor: return "OtherMajor";
    case wire::HelloResult::Invalid: return "Invalid";
  }
  return "(not a HelloResult)";
}

wire::Hello make_hello(uint32_t recv_depth, uint32_t ctrl_depth, uint32_t max_msg_size) {
  wire::Hello h;
  h.recv_depth = recv_depth;
  h.ctrl_depth = ctrl_depth;
  h.max_msg_size = max_msg_size;
  return h;
}

// Decodes len bytes of data and checks the result.
void assert_hello_result(const void *data, size_t len, wire::HelloResult expected, wire::Hello *out,
                         const char *what) {
  wire::HelloResult r = wire::decode_hello(data, len, out);
  if (r != expected)
    fail_msg("decode_hello of %s returned %s, expected %s", what, result_name(r),
             result_name(expected));
}

// Encodes h, decodes it and checks the result.
wire::Hello assert_hello_decodes_as(const wire::Hello &h, wire::HelloResult expected,
                                    const char *what) {
  uint8_t buf[wire::kHelloSize];
  wire::encode_hello(h, buf);
  wire::Hello out;
  assert_hello_result(buf, sizeof buf, expected, &out, what);
  return out;
}

// Encodes a valid hello, changes byte `index` to `value` and checks the result.
void assert_hello_with_byte_is(size_t index, uint8_t value, wire::HelloResult expected,
                               const char *what) {
  uint8_t buf[wire::kHelloSize];
  wire::encode_hello(make_hello(8, 4, 1024), buf);
  buf[index] = value;
  wire::Hello out;
  assert_hello_result(buf, sizeof buf, expected, &out, what);
}

void hello_round_trips(void **) {
  wire::Hello out = assert_hello_decodes_as(make_hello(32, 4, 65536), wire::HelloResult::Ok,
                                            "a valid hello");
  assert_int_equal(out.major, wire::kMajor);
  assert_int_equal(out.minor, wire::kMinor);
  assert_int_equal(out.features, wire::kFeatures);
  assert_int_equal(out.recv_depth, 32);
  assert_int_equal(out.ctrl_depth, 4);
  assert_int_equal(out.max_msg_size, 65536);
}

void hello_round_trips_the_largest_values(void **) {
  wire::Hello out = assert_hello_decodes_as(
      make_hello(wire::kMaxDepth, wire::kMaxCtrlDepth, 0xffffffffu), wire::HelloResult::Ok,
      "a hello at the limits");
  assert_int_equal(out.recv_depth, wire::kMaxDepth);
  assert_int_equal(out.ctrl_depth, wire::kMaxCtrlDepth);
  assert_int_equal(out.max_msg_size, 0xffffffffu);
}

void hello_round_trips_the_smallest_values(void **) {
  wire::Hello out =
      assert_hello_decodes_as(make_hello(1, 1, 1), wire::HelloResult::Ok, "a hello of ones");
  assert_int_equal(out.recv_depth, 1);
  assert_int_equal(out.ctrl_depth, 1);
  assert_int_equal(out.max_msg_size, 1);
}

void hello_limits_fit_the_credit_fields_of_the_immediate(void **) {
  // A peer could never return more credits in one message than the immediate can carry.
  assert_int_equal(wire::kMaxDepth, wire::kMaxCreditsPerMsg);
  assert_int_equal(wire::kMaxCtrlDepth, wire::kMaxCtrlCreditsPerMsg);
}

void hello_layout_is_little_endian_byte_by_byte(void **) {
  uint8_t buf[wire::kHelloSize + 8];
  memset(buf, 0xee, sizeof buf);
  wire::Hello h = make_hello(0x01020304u, 0x0a0b0c0du, 0x00010000u);
  h.features = 0x11223344u;
  h.rndv_max_size = 0x40000000u;
  h.cap = 0x0000fedcu;
  h.session = 0x0102030405060708ull;
  wire::encode_hello(h, buf);
  const uint8_t expected[wire::kHelloSize] = {
      0x53, 0x4d, 0x42, 0x49,  // magic 0x49424d53 ("IBMS" read as a big-endian word)
      0x01,                    // major
      wire::kMinor,            // minor (feature_bits_have_their_documented_values pins it)
      0x01,                    // kind: hello
      0x00,                    // zero
      0x44, 0x33, 0x22, 0x11,  // features
      0x04, 0x03, 0x02, 0x01,  // recv_depth
      0x0d, 0x0c, 0x0b, 0x0a,  // ctrl_depth
      0x00, 0x00, 0x01, 0x00,  // max_msg_size
      0x00, 0x00, 0x00, 0x40,  // rndv_max_size
      0xdc, 0xfe, 0x00, 0x00,  // cap
      0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01,  // session
  };
  assert_bytes(buf, expected, sizeof expected, "hello");
  assert_untouched_from(buf, wire::kHelloSize, sizeof buf, "encode_hello", "kHelloSize");
}

void hello_cap_is_at_least_the_depth_and_absent_before_1_3(void **) {
  wire::Hello h = make_hello(8, 4, 1024);
  h.cap = 100;
  wire::Hello out = assert_hello_decodes_as(h, wire::HelloResult::Ok, "a hello with a cap");
  assert_int_equal(out.cap, 100);
  h.cap = 0;  // none said: the depth
  assert_int_equal(assert_hello_decodes_as(h, wire::HelloResult::Ok, "cap 0").cap, 8);
  h.cap = 3;  // below the depth: the depth
  assert_int_equal(assert_hello_decodes_as(h, wire::HelloResult::Ok, "cap 3").cap, 8);
  h.cap = wire::kMaxDepth + 1;
  assert_hello_decodes_as(h, wire::HelloResult::Invalid, "a cap beyond the credit field");
  // A 1.2 hello (28 bytes) has no cap: the depth.
  h.cap = 100;
  uint8_t buf[wire::kHelloSize];
  wire::encode_hello(h, buf);
  assert_hello_result(buf, 28, wire::HelloResult::Ok, &out, "a 28-byte hello");
  assert_int_equal(out.cap, 8);
}

void wants_bit_is_bit_15_of_the_credits(void **) {
  wire::Imm imm;
  imm.op = wire::Opcode::Data;
  imm.credits = 5;
  imm.wants = true;
  const uint32_t v = wire::encode_imm(imm);
  assert_int_equal(v, 0x00008005u);
  wire::Imm out;
  assert_true(wire::decode_imm(v, &out));
  assert_int_equal(out.credits, 0x8005);  // as a peer without the feature would read it
  wire::split_wants(&out);
  assert_true(out.wants);
  assert_int_equal(out.credits, 5);
  // With the bit, at most 32767 credits a message: more are cut, never spilling into it.
  imm.credits = 0x9000;
  assert_int_equal(wire::encode_imm(imm), 0x0000ffffu);
  imm.wants = false;
  assert_int_equal(wire::encode_imm(imm), 0x00009000u);
  // Return is opcode 6.
  imm.op = wire::Opcode::Return;
  imm.credits = 3;
  assert_int_equal(wire::encode_imm(imm), 0x60000003u);
}

void hello_carries_the_version_of_the_struct(void **) {
  // The core may answer with a version of its choosing: encode_hello writes what it is given.
  uint8_t buf[wire::kHelloSize];
  wire::Hello h = make_hello(8, 4, 1024);
  h.major = 0x21;
  h.minor = 0x22;
  wire::encode_hello(h, buf);
  assert_int_equal(buf[4], 0x21);
  assert_int_equal(buf[5], 0x22);
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
  assert_hello_result(buf, sizeof buf, wire::HelloResult::Ok, &out, "a hello padded to 56 bytes");
  assert_int_equal(out.recv_depth, 8);
  assert_int_equal(out.max_msg_size, 1024);
}

void hello_round_trips_the_rendezvous_maximum(void **) {
  for (uint32_t m : {0u, 65536u, 65537u, 1u << 30, 0xffffffffu}) {
    wire::Hello h = make_hello(8, 4, 65536);
    h.rndv_max_size = m;
    wire::Hello out = assert_hello_decodes_as(h, wire::HelloResult::Ok, "a hello with rndv_max_size");
    assert_int_equal(out.rndv_max_size, m);
    assert_int_equal(out.max_msg_size, 65536);
  }
}

void hello_of_protocol_1_1_without_rndv_max_size_decodes_with_none(void **) {
  // 24 bytes, as a 1.1 peer sends it (padding, if any, is zeros: the same).
  uint8_t buf[wire::kHelloSize];
  wire::Hello h = make_hello(8, 4, 1024);
  h.minor = 1;
  h.rndv_max_size = 1 << 20;
  wire::encode_hello(h, buf);
  wire::Hello out;
  assert_hello_result(buf, wire::kHelloMinSize, wire::HelloResult::Ok, &out, "a 24-byte hello");
  assert_int_equal(out.rndv_max_size, 0);
  assert_int_equal(out.max_msg_size, 1024);
  assert_hello_result(buf, wire::kHelloMinSize - 1, wire::HelloResult::NotIbmsg, &out,
                      "a 23-byte hello");
}

void hello_with_rndv_max_size_below_the_eager_maximum_is_invalid(void **) {
  wire::Hello h = make_hello(8, 4, 1024);
  h.rndv_max_size = 1023;
  assert_hello_decodes_as(h, wire::HelloResult::Invalid, "rndv_max_size below max_msg_size");
  h.rndv_max_size = 1;
  assert_hello_decodes_as(h, wire::HelloResult::Invalid, "rndv_max_size of 1");
  h.rndv_max_size = 1024;
  assert_hello_decodes_as(h, wire::HelloResult::Ok, "rndv_max_size equal to max_msg_size");
}

void hello_of_a_higher_minor_with_unknown_features_is_ok(void **) {
  // A newer peer of the same major connects; the core keeps only the features both know.
  wire::Hello h = make_hello(8, 4, 1024);
  h.minor = wire::kMinor + 1;
  h.features = 0xffffffffu;
  wire::Hello out =
      assert_hello_decodes_as(h, wire::HelloResult::Ok, "a hello of a higher minor");
  assert_int_equal(out.major, wire::kMajor);
  assert_int_equal(out.minor, wire::kMinor + 1);
  assert_int_equal(out.features, 0xffffffffu);  // passed through, not masked
  assert_int_equal(out.recv_depth, 8);
}

void hello_of_the_highest_minor_is_ok(void **) {
  wire::Hello h = make_hello(8, 4, 1024);
  h.minor = 0xff;
  wire::Hello out = assert_hello_decodes_as(h, wire::HelloResult::Ok, "a hello of minor 255");
  assert_int_equal(out.minor, 0xff);
}

void hello_of_another_major_is_other_major_with_its_version(void **) {
  const uint8_t majors[] = {0, uint8_t(wire::kMajor + 1), 0xff};
  for (uint8_t major : majors) {
    wire::Hello h = make_hello(8, 4, 1024);
    h.major = major;
    h.minor = 7;
    uint8_t buf[wire::kHelloSize];
    wire::encode_hello(h, buf);
    wire::Hello out;
    out.major = wire::kMajor;  // must be overwritten
    out.minor = 0;
    wire::HelloResult r = wire::decode_hello(buf, sizeof buf, &out);
    if (r != wire::HelloResult::OtherMajor)
      fail_msg("decode_hello of major %u returned %s, expected OtherMajor", major,
               result_name(r));
    if (out.major != major || out.minor != 7)
      fail_msg("decode_hello of version %u.7 reported version %u.%u", major, out.major,
               out.minor);
  }
}

void hello_of_another_major_is_not_judged_by_this_majors_fields(void **) {
  // A later major may lay the rest out differently: a zero where this major has recv_depth must
  // not make it Invalid, and the rest must not be read into out.
  wire::Hello h = make_hello(0, 0, 0);
  h.major = wire::kMajor + 1;
  uint8_t buf[wire::kHelloSize];
  wire::encode_hello(h, buf);
  wire::Hello out;
  out.recv_depth = 77;
  assert_hello_result(buf, sizeof buf, wire::HelloResult::OtherMajor, &out,
                      "a hello of the next major with zero fields");
  assert_int_equal(out.recv_depth, 77);
}

void hello_of_another_major_shorter_than_a_hello_is_other_major(void **) {
  // The next major's hello may be shorter; its 8-byte header is enough to name the version.
  wire::Hello h = make_hello(8, 4, 1024);
  h.major = wire::kMajor + 1;
  h.minor = 3;
  uint8_t buf[wire::kHelloSize];
  wire::encode_hello(h, buf);
  for (size_t len = 8; len < wire::kHelloSize; ++len) {
    wire::Hello out;
    wire::HelloResult r = wire::decode_hello(buf, len, &out);
    if (r != wire::HelloResult::OtherMajor || out.major != wire::kMajor + 1 || out.minor != 3)
      fail_msg("decode_hello of %zu bytes of version %u.3 returned %s with version %u.%u", len,
               unsigned(wire::kMajor + 1), result_name(r), out.major, out.minor);
  }
}

void hello_of_another_major_shorter_than_the_header_is_not_ibmsg(void **) {
  wire::Hello h = make_hello(8, 4, 1024);
  h.major = wire::kMajor + 1;
  uint8_t buf[wire::kHelloSize];
  wire::encode_hello(h, buf);
  for (size_t len = 0; len < 8; ++len) {
    wire::Hello out;
    wire::HelloResult r = wire::decode_hello(buf, len, &out);
    if (r != wire::HelloResult::NotIbmsg)
      fail_msg("decode_hello of %zu bytes returned %s, expected NotIbmsg", len, result_name(r));
  }
}

void hello_with_zero_recv_depth_is_invalid(void **) {
  // A peer that grants no credits could never be sent to.
  assert_hello_decodes_as(make_hello(0, 4, 1024), wire::HelloResult::Invalid,
                          "a hello with recv_depth 0");
}

void hello_with_recv_depth_beyond_the_limit_is_invalid(void **) {
  assert_hello_decodes_as(make_hello(wire::kMaxDepth + 1, 4, 1024), wire::HelloResult::Invalid,
                          "a hello with recv_depth kMaxDepth + 1");
  assert_hello_decodes_as(make_hello(0xffffffffu, 4, 1024), wire::HelloResult::Invalid,
                          "a hello with recv_depth 0xffffffff");
}

void hello_with_zero_ctrl_depth_is_invalid(void **) {
  assert_hello_decodes_as(make_hello(8, 0, 1024), wire::HelloResult::Invalid,
                          "a hello with ctrl_depth 0");
}

void hello_with_ctrl_depth_beyond_the_limit_is_invalid(void **) {
  assert_hello_decodes_as(make_hello(8, wire::kMaxCtrlDepth + 1, 1024),
                          wire::HelloResult::Invalid, "a hello with ctrl_depth kMaxCtrlDepth + 1");
  assert_hello_decodes_as(make_hello(8, 0xffffffffu, 1024), wire::HelloResult::Invalid,
                          "a hello with ctrl_depth 0xffffffff");
}

void hello_with_zero_max_msg_size_is_invalid(void **) {
  assert_hello_decodes_as(make_hello(8, 4, 0), wire::HelloResult::Invalid,
                          "a hello with max_msg_size 0");
}

void hello_with_wrong_magic_is_not_ibmsg(void **) {
  assert_hello_with_byte_is(0, 0x54, wire::HelloResult::NotIbmsg, "a wrong magic (byte 0)");
  assert_hello_with_byte_is(1, 0x4e, wire::HelloResult::NotIbmsg, "a wrong magic (byte 1)");
  assert_hello_with_byte_is(2, 0x43, wire::HelloResult::NotIbmsg, "a wrong magic (byte 2)");
  assert_hello_with_byte_is(3, 0x48, wire::HelloResult::NotIbmsg, "a wrong magic (byte 3)");
}

void hello_with_wrong_kind_is_not_ibmsg(void **) {
  assert_hello_with_byte_is(6, 2, wire::HelloResult::NotIbmsg, "a reject's kind byte");
  assert_hello_with_byte_is(6, 0, wire::HelloResult::NotIbmsg, "kind 0");
  assert_hello_with_byte_is(6, 3, wire::HelloResult::NotIbmsg, "kind 3");
}

void hello_too_short_is_not_ibmsg(void **) {
  uint8_t buf[wire::kHelloSize];
  wire::encode_hello(make_hello(8, 4, 1024), buf);
  for (size_t len = 0; len < wire::kHelloMinSize; ++len) {
    wire::Hello out;
    wire::HelloResult r = wire::decode_hello(buf, len, &out);
    if (r != wire::HelloResult::NotIbmsg)
      fail_msg("decode_hello of %zu bytes of this major returned %s, expected NotIbmsg", len,
               result_name(r));
  }
  // From protocol 1.1's size on it decodes; a cut rndv_max_size counts as none.
  for (size_t len = wire::kHelloMinSize; len < wire::kHelloSize; ++len) {
    wire::Hello out;
    assert_hello_result(buf, len, wire::HelloResult::Ok, &out, "a hello cut in its rndv_max_size");
    assert_int_equal(out.rndv_max_size, 0);
  }
}

void hello_null_data_is_not_ibmsg(void **) {
  wire::Hello out;
  assert_hello_result(nullptr, wire::kHelloSize, wire::HelloResult::NotIbmsg, &out,
                      "a null pointer");
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
  assert_untouched_from(buf, wire::kRejectMaxSize, sizeof buf, "encode_reject", "kRejectMaxSize");
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
  const uint8_t expected[] = {
      0x53, 0x4d, 0x42, 0x49,  // magic
      0x01,                    // major
      wire::kMinor,            // minor
      0x02,                    // kind: reject
      0x00,                    // zero
      'n',  'o',
  };
  assert_int_equal(len, sizeof expected);
  assert_bytes(buf, expected, sizeof expected, "reject");
}

void reject_fits_the_private_data_of_a_reject(void **) {
  assert_true(wire::kRejectMaxSize <= 148);  // an IB REJ carries 148 bytes of private data
}

void reject_with_wrong_magic_or_kind_is_rejected(void **) {
  uint8_t buf[wire::kRejectMaxSize];
  char text[wire::kRejectTextMax + 1];
  const size_t bytes[] = {0, 1, 2, 3, 6};  // magic, kind
  for (size_t b : bytes) {
    size_t len = wire::encode_reject("why", buf);
    buf[b] ^= 0x10;
    if (wire::decode_reject(buf, len, text, sizeof text))
      fail_msg("decode_reject accepted a reject with header byte %zu changed", b);
  }
}

void reject_from_another_version_still_decodes_its_text(void **) {
  // The text is how a peer of another major learns why it was refused: only magic and kind count.
  const uint8_t versions[][2] = {{uint8_t(wire::kMajor + 1), 0}, {0, 0}, {0xff, 0xff},
                                 {wire::kMajor, uint8_t(wire::kMinor + 1)}};
  for (const auto &v : versions) {
    uint8_t buf[wire::kRejectMaxSize];
    size_t len = wire::encode_reject("version 1.0 required", buf);
    buf[4] = v[0];
    buf[5] = v[1];
    char text[wire::kRejectTextMax + 1] = "";
    if (!wire::decode_reject(buf, len, text, sizeof text))
      fail_msg("decode_reject refused the reject of version %u.%u", v[0], v[1]);
    if (strcmp(text, "version 1.0 required") != 0)
      fail_msg("the reject of version %u.%u decoded to \"%s\"", v[0], v[1], text);
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
  wire::encode_reject("\x01\x01\x01\x01\x01\x01\x01\x01\x01\x01\x01\x01\x01\x01\x01\x01", reject);
  wire::Hello out;
  assert_hello_result(reject, sizeof reject, wire::HelloResult::NotIbmsg, &out, "a reject");
}


// --- DataImm and feature bits -------------------------------------------------------------------

void imm_data_imm_is_opcode_5_with_a_4_byte_trailer(void **) {
  assert_int_equal(op_value(wire::Opcode::DataImm), 5);
  assert_int_equal(wire::kImmTrailer, 4);
  assert_imm_encodes_to(0x1234, 0x56, wire::Opcode::DataImm, 0x50561234u);
  assert_imm_round_trip(0, 0, wire::Opcode::DataImm);
  assert_imm_round_trip(wire::kMaxCreditsPerMsg, wire::kMaxCtrlCreditsPerMsg,
                        wire::Opcode::DataImm);
  wire::Imm out;
  assert_true(wire::decode_imm(0x50000000u, &out));
  assert_true(out.op == wire::Opcode::DataImm);
}

void feature_bits_have_their_documented_values(void **) {
  // These bits travel in every hello: renumbering them breaks every older peer.
  assert_int_equal(wire::kFeatureRdma, 1u << 0);
  assert_int_equal(wire::kFeatureImm, 1u << 1);
  assert_int_equal(wire::kFeatureRndv, 1u << 2);
  assert_int_equal(wire::kFeatureShared, 1u << 3);
  assert_int_equal(wire::kFeatureKeepalive, 1u << 4);
  assert_int_equal(wire::kFeatureRequest, 1u << 5);
  assert_int_equal(wire::kFeatures, wire::kFeatureRdma | wire::kFeatureImm | wire::kFeatureRndv |
                                        wire::kFeatureShared | wire::kFeatureKeepalive |
                                        wire::kFeatureRequest);
  assert_int_equal(wire::kFeatureRdma & wire::kFeatureImm, 0);
  // The features came with protocol 1.1 (a 1.0 peer sends features 0), rendezvous with 1.2,
  // shared receive buffers with 1.3, keepalive with 1.4, requests with 1.5.
  assert_int_equal(wire::kMajor, 1);
  assert_int_equal(wire::kMinor, 5);
  wire::Hello h;
  assert_int_equal(h.features, wire::kFeatures);  // a hello offers everything by default
}

void feature_bits_round_trip_through_the_hello_one_by_one(void **) {
  for (uint32_t f : {0u, wire::kFeatureRdma, wire::kFeatureImm, wire::kFeatures, 0x80000000u}) {
    uint8_t buf[wire::kHelloSize];
    wire::Hello h = make_hello(8, 4, 1024);
    h.features = f;
    wire::encode_hello(h, buf);
    assert_int_equal(buf[8], f & 0xff);  // little-endian at bytes 8..11
    assert_int_equal(buf[11], f >> 24);
    wire::Hello out;
    assert_hello_result(buf, sizeof buf, wire::HelloResult::Ok, &out, "a hello with features");
    if (out.features != f) fail_msg("features 0x%08x came back as 0x%08x", f, out.features);
  }
}

// --- Descriptor ---------------------------------------------------------------------------------

// FNV-1a, 32 bits, written from its definition (offset basis 2166136261, prime 16777619).
uint32_t reference_fnv1a(const uint8_t *p, size_t n) {
  uint32_t h = 0x811c9dc5u;
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 0x01000193u;
  }
  return h;
}

void descriptor_reference_check_matches_published_fnv1a_values(void **) {
  // Published FNV-1a 32-bit test vectors: the reference above is right.
  assert_int_equal(reference_fnv1a(reinterpret_cast<const uint8_t *>(""), 0), 0x811c9dc5u);
  assert_int_equal(reference_fnv1a(reinterpret_cast<const uint8_t *>("a"), 1), 0xe40c292cu);
  assert_int_equal(reference_fnv1a(reinterpret_cast<const uint8_t *>("foobar"), 6), 0xbf9cf968u);
}

wire::Descriptor make_desc(uint8_t access, uint32_t rkey, uint64_t addr, uint64_t length) {
  wire::Descriptor d;
  d.access = access;
  d.rkey = rkey;
  d.addr = addr;
  d.length = length;
  return d;
}

// Stores the check of bytes 0..27 in bytes 28..31 (to build well-formed descriptors by hand).
void seal(uint8_t b[wire::kDescriptorSize]) {
  uint32_t c = reference_fnv1a(b, 28);
  for (int i = 0; i < 4; ++i) b[28 + i] = uint8_t(c >> (8 * i));
}

void assert_desc_round_trip(const wire::Descriptor &d) {
  uint8_t b[wire::kDescriptorSize];
  wire::encode_descriptor(d, b);
  wire::Descriptor out = make_desc(0x77, 0x77, 0x77, 0x77);
  if (!wire::decode_descriptor(b, &out))
    fail_msg("decode rejected access 0x%x, rkey 0x%x, addr 0x%llx, length 0x%llx", d.access,
             d.rkey, (unsigned long long)d.addr, (unsigned long long)d.length);
  if (out.access != d.access || out.rkey != d.rkey || out.addr != d.addr || out.length != d.length)
    fail_msg("access 0x%x, rkey 0x%x, addr 0x%llx, length 0x%llx came back as 0x%x, 0x%x, "
             "0x%llx, 0x%llx",
             d.access, d.rkey, (unsigned long long)d.addr, (unsigned long long)d.length,
             out.access, out.rkey, (unsigned long long)out.addr, (unsigned long long)out.length);
}

void descriptor_round_trips(void **) {
  assert_desc_round_trip(make_desc(IBMSG_ACCESS_REMOTE_WRITE, 0x1234, 0x7f0000001000ull, 4096));
  assert_desc_round_trip(make_desc(IBMSG_ACCESS_REMOTE_READ | IBMSG_ACCESS_REMOTE_WRITE |
                                       IBMSG_ACCESS_REMOTE_ATOMIC,
                                   0xffffffffu, 0, 1));
  assert_desc_round_trip(make_desc(IBMSG_ACCESS_REMOTE_READ, 0, 1, UINT64_MAX - 1));  // to the top
  assert_desc_round_trip(make_desc(IBMSG_ACCESS_REMOTE_ATOMIC, 0x80000001u, 0x8000000000000000ull,
                                   0x7fffffffffffffffull));
}

// The rights byte holds IBMSG_ACCESS_REMOTE_* bits only, at least one: anything else is not a
// descriptor ibmsg made, even with a correct check.
void descriptor_with_no_or_unknown_rights_is_rejected(void **) {
  for (unsigned rights = 0; rights < 256; ++rights) {
    uint8_t b[wire::kDescriptorSize];
    wire::encode_descriptor(make_desc(uint8_t(rights), 1, 0x1000, 64), b);
    wire::Descriptor out;
    bool valid = rights != 0 && (rights & ~unsigned(IBMSG_ACCESS_REMOTE_READ | IBMSG_ACCESS_REMOTE_WRITE |
                                                   IBMSG_ACCESS_REMOTE_ATOMIC)) == 0;
    if (wire::decode_descriptor(b, &out) != valid)
      fail_msg("rights 0x%02x: decode says %s", rights, valid ? "invalid" : "valid");
  }
}

void descriptor_sizes_agree(void **) {
  assert_int_equal(wire::kDescriptorSize, 32);
  assert_int_equal(IBMSG_DESCRIPTOR_SIZE, wire::kDescriptorSize);
  assert_int_equal(sizeof(ibmsg_descriptor), wire::kDescriptorSize);
}

void descriptor_layout_is_little_endian_byte_by_byte(void **) {
  uint8_t buf[wire::kDescriptorSize + 8];
  memset(buf, 0xee, sizeof buf);
  wire::encode_descriptor(make_desc(0x06, 0x11223344u, 0x0102030405060708ull, 0x1000), buf);
  uint8_t expected[wire::kDescriptorSize] = {
      0x5c, 0xd3,                                      // magic 0xd35c
      0x01,                                            // version
      0x06,                                            // rights
      0x44, 0x33, 0x22, 0x11,                          // rkey
      0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01,  // address
      0x00, 0x10, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,  // length
      0x00, 0x00, 0x00, 0x00,                          // zero
      0, 0, 0, 0,                                      // check: below
  };
  seal(expected);
  assert_bytes(buf, expected, sizeof expected, "descriptor");
  assert_untouched_from(buf, wire::kDescriptorSize, sizeof buf, "encode_descriptor",
                        "kDescriptorSize");
}

void descriptor_every_single_bit_flip_is_rejected(void **) {
  const wire::Descriptor ds[] = {
      make_desc(IBMSG_ACCESS_REMOTE_WRITE, 0x1234, 0x7f0000001000ull, 4096),
      make_desc(0x0e, 0xffffffffu, 0xfffffffffffff000ull, 0x1000),
      make_desc(0, 0, 0, 1),
  };
  for (const wire::Descriptor &d : ds) {
    uint8_t b[wire::kDescriptorSize];
    wire::encode_descriptor(d, b);
    for (size_t bit = 0; bit < 8 * wire::kDescriptorSize; ++bit) {
      uint8_t f[wire::kDescriptorSize];
      memcpy(f, b, sizeof f);
      f[bit / 8] ^= uint8_t(1u << (bit % 8));
      wire::Descriptor out;
      if (wire::decode_descriptor(f, &out))
        fail_msg("a descriptor with bit %zu (byte %zu) flipped decodes", bit, bit / 8);
    }
  }
}

void descriptor_random_bytes_are_rejected(void **) {
  std::mt19937 rng(20240601);
  for (int n = 0; n < 100000; ++n) {
    uint8_t b[wire::kDescriptorSize];
    for (uint8_t &x : b) x = uint8_t(rng());
    wire::Descriptor out;
    if (wire::decode_descriptor(b, &out)) fail_msg("random descriptor %d decodes", n);
  }
}

// Random bytes behind a right header (magic, version, zero bytes): the check alone rejects them.
void descriptor_random_bytes_with_a_valid_header_fail_the_check(void **) {
  std::mt19937 rng(7);
  for (int n = 0; n < 100000; ++n) {
    uint8_t b[wire::kDescriptorSize];
    for (uint8_t &x : b) x = uint8_t(rng());
    b[0] = 0x5c;
    b[1] = 0xd3;
    b[2] = 1;
    memset(b + 24, 0, 4);
    if (reference_fnv1a(b, 28) == (uint32_t(b[28]) | uint32_t(b[29]) << 8 |
                                   uint32_t(b[30]) << 16 | uint32_t(b[31]) << 24))
      continue;  // (a chance of 2^-32 per string: the check happens to be right)
    wire::Descriptor out;
    if (wire::decode_descriptor(b, &out)) fail_msg("descriptor %d with a wrong check decodes", n);
  }
}

void descriptor_of_zero_length_is_rejected(void **) {
  uint8_t b[wire::kDescriptorSize];
  wire::encode_descriptor(make_desc(IBMSG_ACCESS_REMOTE_WRITE, 1, 0x1000, 0), b);
  wire::Descriptor out;
  assert_false(wire::decode_descriptor(b, &out));
}

void descriptor_whose_range_wraps_is_rejected(void **) {
  const wire::Descriptor wrapping[] = {
      make_desc(IBMSG_ACCESS_REMOTE_WRITE, 1, 0xfffffffffffff000ull, 0x2000),
      make_desc(IBMSG_ACCESS_REMOTE_WRITE, 1, 2, UINT64_MAX),
      make_desc(IBMSG_ACCESS_REMOTE_WRITE, 1, UINT64_MAX, UINT64_MAX),
  };
  for (const wire::Descriptor &d : wrapping) {
    uint8_t b[wire::kDescriptorSize];
    wire::encode_descriptor(d, b);
    wire::Descriptor out;
    if (wire::decode_descriptor(b, &out))
      fail_msg("addr 0x%llx, length 0x%llx wraps around, yet decodes", (unsigned long long)d.addr,
               (unsigned long long)d.length);
  }
}

// Well-formed apart from one field, with the check recomputed: the field alone rejects it.
void descriptor_with_a_right_check_but_a_wrong_header_is_rejected(void **) {
  uint8_t good[wire::kDescriptorSize];
  wire::encode_descriptor(make_desc(IBMSG_ACCESS_REMOTE_READ, 9, 0x1000, 64), good);
  struct Change {
    const char *what;
    size_t at;
    uint8_t value;
  };
  const Change changes[] = {
      {"magic, low byte", 0, 0x5d},  {"magic, high byte", 1, 0xd4}, {"version 0", 2, 0},
      {"version 2", 2, 2},           {"reserved byte 24", 24, 1},   {"reserved byte 27", 27, 0x80},
  };
  wire::Descriptor out;
  uint8_t b[wire::kDescriptorSize];
  memcpy(b, good, sizeof b);
  seal(b);
  assert_memory_equal(b, good, sizeof b);  // seal() computes the same check as the encoder
  assert_true(wire::decode_descriptor(b, &out));
  for (const Change &c : changes) {
    memcpy(b, good, sizeof b);
    b[c.at] = c.value;
    seal(b);
    if (wire::decode_descriptor(b, &out)) fail_msg("a descriptor with a wrong %s decodes", c.what);
  }
}

// --- rendezvous: RTS and FIN ----------------------------------------------------------------------

wire::Rts make_rts(uint32_t id, uint32_t rkey, bool has_imm, uint32_t imm, uint64_t addr,
                   uint64_t length) {
  wire::Rts r;
  r.id = id;
  r.rkey = rkey;
  r.has_imm = has_imm;
  r.imm = imm;
  r.addr = addr;
  r.length = length;
  return r;
}

void assert_rts_round_trip(const wire::Rts &in) {
  uint8_t b[wire::kRtsSize];
  wire::encode_rts(in, b);
  wire::RndvKind kind;
  assert_true(wire::rndv_kind(b, sizeof b, &kind));
  assert_true(kind == wire::RndvKind::Rts);
  wire::Rts out;
  assert_true(wire::decode_rts(b, sizeof b, &out));
  assert_int_equal(out.id, in.id);
  assert_int_equal(out.rkey, in.rkey);
  assert_int_equal(out.has_imm, in.has_imm);
  assert_int_equal(out.imm, in.has_imm ? in.imm : 0);
  assert_true(out.addr == in.addr);
  assert_true(out.length == in.length);
}

void rts_round_trips(void **) {
  assert_rts_round_trip(make_rts(1, 2, false, 0, 0x1000, 1));
  assert_rts_round_trip(make_rts(0xffffffffu, 0xfedcba98u, true, 0xffffffffu, 0x7f0000001000ull,
                                 0xffffffffull));
  assert_rts_round_trip(make_rts(7, 9, true, 0, 0, 1ull << 40));  // beyond 32 bits
  // An immediate without has_imm is not carried.
  wire::Rts r = make_rts(3, 4, false, 0x1234, 0x2000, 10);
  uint8_t b[wire::kRtsSize];
  wire::encode_rts(r, b);
  wire::Rts out;
  assert_true(wire::decode_rts(b, sizeof b, &out));
  assert_false(out.has_imm);
  assert_int_equal(out.imm, 0);
}

void rts_layout_is_little_endian_byte_by_byte(void **) {
  uint8_t b[wire::kRtsSize + 4];
  memset(b, 0xee, sizeof b);
  wire::encode_rts(make_rts(0x11223344u, 0x55667788u, true, 0x99aabbccu, 0x0102030405060708ull,
                            0x1112131415161718ull),
                   b);
  const uint8_t expected[wire::kRtsSize] = {
      1,    1,    0,    0,    0x44, 0x33, 0x22, 0x11, 0x88, 0x77, 0x66, 0x55, 0xcc, 0xbb, 0xaa, 0x99,
      0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01, 0x18, 0x17, 0x16, 0x15, 0x14, 0x13, 0x12, 0x11};
  assert_bytes(b, expected, wire::kRtsSize, "RTS");
  assert_untouched_from(b, wire::kRtsSize, sizeof b, "encode_rts", "kRtsSize");
}

void rts_naming_a_request_or_reply_carries_its_trailer(void **) {
  for (uint8_t req : {uint8_t(1), uint8_t(2)}) {
    wire::Rts r = make_rts(5, 6, false, 0, 0x4000, 100000);
    r.req = req;
    uint8_t b[wire::kRtsSize + wire::kReqTrailer + 1];
    memset(b, 0xee, sizeof b);
    wire::encode_rts(r, b);
    assert_int_equal(b[1], req << 1);  // flags bits 1..2
    assert_int_equal(b[wire::kRtsSize], 0xee);  // the trailer is the caller's to write
    wire::ReqTrailer t;
    t.id = 77;
    t.floor = req == 1 ? 70 : 0;
    wire::encode_req_trailer(t, b + wire::kRtsSize);
    const size_t n = wire::kRtsSize + wire::kReqTrailer;
    wire::RndvKind kind;
    assert_true(wire::rndv_kind(b, n, &kind));
    assert_true(kind == wire::RndvKind::Rts);
    wire::Rts out;
    assert_true(wire::decode_rts(b, n, &out));
    assert_int_equal(out.req, req);
    assert_int_equal(out.length, 100000);
    wire::ReqTrailer tout;
    assert_true(wire::decode_req_trailer(b, n, &tout));
    assert_int_equal(tout.id, 77);
    // Without its trailer, or with more, it is no RTS; nor is a plain one with a trailer.
    assert_false(wire::rndv_kind(b, wire::kRtsSize, &kind));
    assert_false(wire::decode_rts(b, wire::kRtsSize, &out));
    assert_false(wire::decode_rts(b, n + 1, &out));
    uint8_t plain[wire::kRtsSize + wire::kReqTrailer];
    r.req = 0;
    wire::encode_rts(r, plain);
    assert_false(wire::decode_rts(plain, sizeof plain, &out));
    assert_false(wire::rndv_kind(plain, sizeof plain, &kind));
  }
  // Both bits: neither request nor reply.
  uint8_t b[wire::kRtsSize + wire::kReqTrailer] = {};
  wire::encode_rts(make_rts(5, 6, false, 0, 0x4000, 100000), b);
  b[1] = 6;
  wire::Rts out;
  assert_false(wire::decode_rts(b, sizeof b, &out));
  // A one-byte payload is no RTS (and is not read beyond).
  const uint8_t one = 1;
  wire::RndvKind kind;
  assert_false(wire::rndv_kind(&one, 1, &kind));
}

void fin_round_trips_every_status_and_layout(void **) {
  for (auto st : {wire::FinStatus::Done, wire::FinStatus::Declined, wire::FinStatus::Failed}) {
    wire::Fin f;
    f.id = 0xa1b2c3d4u;
    f.status = st;
    uint8_t b[wire::kFinSize + 2];
    memset(b, 0xee, sizeof b);
    wire::encode_fin(f, b);
    const uint8_t expected[wire::kFinSize] = {2, uint8_t(st), 0, 0, 0xd4, 0xc3, 0xb2, 0xa1};
    assert_memory_equal(b, expected, wire::kFinSize);
    assert_int_equal(b[wire::kFinSize], 0xee);
    wire::RndvKind kind;
    assert_true(wire::rndv_kind(b, wire::kFinSize, &kind));
    assert_true(kind == wire::RndvKind::Fin);
    wire::Fin out;
    assert_true(wire::decode_fin(b, wire::kFinSize, &out));
    assert_int_equal(out.id, f.id);
    assert_true(out.status == st);
  }
}

void rts_with_bad_fields_is_rejected(void **) {
  uint8_t good[wire::kRtsSize];
  wire::encode_rts(make_rts(1, 2, true, 3, 0x1000, 64), good);
  wire::Rts out;
  assert_true(wire::decode_rts(good, sizeof good, &out));
  // Any reserved bit, an unknown kind or flag.
  for (size_t byte : {size_t(0), size_t(1), size_t(2), size_t(3)})
    for (int bit = 0; bit < 8; ++bit) {
      uint8_t b[wire::kRtsSize];
      memcpy(b, good, sizeof b);
      b[byte] ^= uint8_t(1u << bit);
      bool flag_bit0 = byte == 1 && bit == 0;  // has_imm off: valid only without an immediate
      if (wire::decode_rts(b, sizeof b, &out) && !flag_bit0)
        fail_msg("an RTS with bit %d of byte %zu flipped decodes", bit, byte);
    }
  // has_imm off with an immediate left in the field.
  uint8_t b[wire::kRtsSize];
  memcpy(b, good, sizeof b);
  b[1] = 0;
  assert_false(wire::decode_rts(b, sizeof b, &out));
  // Zero length, a wrapping range.
  wire::encode_rts(make_rts(1, 2, false, 0, 0x1000, 0), b);
  assert_false(wire::decode_rts(b, sizeof b, &out));
  wire::encode_rts(make_rts(1, 2, false, 0, UINT64_MAX - 10, 11), b);
  assert_false(wire::decode_rts(b, sizeof b, &out));
  wire::encode_rts(make_rts(1, 2, false, 0, UINT64_MAX - 10, 10), b);
  assert_true(wire::decode_rts(b, sizeof b, &out));
  // Wrong sizes, NULL.
  assert_false(wire::decode_rts(good, sizeof good - 1, &out));
  uint8_t longer[wire::kRtsSize + 1] = {};
  memcpy(longer, good, sizeof good);
  assert_false(wire::decode_rts(longer, sizeof longer, &out));
  assert_false(wire::decode_rts(nullptr, sizeof good, &out));
  wire::RndvKind kind;
  assert_false(wire::rndv_kind(good, sizeof good - 1, &kind));
  assert_false(wire::rndv_kind(nullptr, 0, &kind));
  // An RTS is not a FIN.
  assert_false(wire::decode_fin(good, wire::kFinSize, nullptr));
}

void fin_with_bad_fields_is_rejected(void **) {
  wire::Fin f;
  f.id = 5;
  uint8_t good[wire::kFinSize];
  wire::encode_fin(f, good);
  wire::Fin out;
  for (size_t byte = 0; byte < 4; ++byte)
    for (int bit = 0; bit < 8; ++bit) {
      uint8_t b[wire::kFinSize];
      memcpy(b, good, sizeof b);
      b[byte] ^= uint8_t(1u << bit);
      bool other_status = byte == 1 && (b[1] == 1 || b[1] == 2);
      if (wire::decode_fin(b, sizeof b, &out) != other_status)
        fail_msg("a FIN with bit %d of byte %zu flipped: wrong decode result", bit, byte);
    }
  uint8_t b[wire::kFinSize];
  memcpy(b, good, sizeof b);
  b[1] = 3;  // no such status
  assert_false(wire::decode_fin(b, sizeof b, &out));
  assert_false(wire::decode_fin(good, sizeof good - 1, &out));
  assert_false(wire::decode_fin(nullptr, sizeof good, &out));
  wire::RndvKind kind;
  assert_false(wire::rndv_kind(good, wire::kRtsSize, &kind));  // a FIN of an RTS's size
}

void rndv_random_payloads_never_decode_wrongly(void **) {
  std::mt19937 rng(12345);
  wire::Rts rts;
  wire::Fin fin;
  wire::RndvKind kind;
  for (int i = 0; i < 100000; ++i) {
    uint8_t b[wire::kRtsSize];
    for (auto &x : b) x = uint8_t(rng());
    size_t len = rng() % 2 ? wire::kRtsSize : wire::kFinSize;
    bool k = wire::rndv_kind(b, len, &kind);
    bool r = wire::decode_rts(b, len, &rts);
    bool f = wire::decode_fin(b, len, &fin);
    if (r && (!k || kind != wire::RndvKind::Rts)) fail_msg("an RTS that rndv_kind does not call one");
    if (f && (!k || kind != wire::RndvKind::Fin)) fail_msg("a FIN that rndv_kind does not call one");
    if (r && (rts.length == 0 || rts.addr + rts.length < rts.addr)) fail_msg("a bad range decoded");
  }
}

}  // namespace

// --- request trailer (kFeatureRequest) ---------------------------------------------------------

void req_trailer_round_trips_at_the_end_of_a_payload(void **) {
  uint8_t msg[40];
  memset(msg, 0xaa, sizeof msg);  // the payload before it is the application's: anything
  wire::ReqTrailer t;
  t.id = 0x0123456789abcdefull;
  t.has_imm = true;
  t.retry = true;
  t.imm = 0xfeedbeef;
  t.floor = 0x1122334455667788ull;
  wire::encode_req_trailer(t, msg + sizeof msg - wire::kReqTrailer);
  wire::ReqTrailer d;
  assert_true(wire::decode_req_trailer(msg, sizeof msg, &d));
  assert_true(d.id == t.id);
  assert_true(d.has_imm && d.retry);
  assert_int_equal(d.imm, 0xfeedbeef);
  assert_true(d.floor == t.floor);
  assert_int_equal(msg[sizeof msg - wire::kReqTrailer - 1], 0xaa);  // the payload is untouched
  // the documented layout: id little-endian first, flags, zeros, imm, floor
  const uint8_t *p = msg + sizeof msg - wire::kReqTrailer;
  assert_int_equal(p[0], 0xef);
  assert_int_equal(p[7], 0x01);
  assert_int_equal(p[8], 3);
  assert_int_equal(p[12], 0xef);
  assert_int_equal(p[15], 0xfe);
  assert_int_equal(p[16], 0x88);
  assert_int_equal(p[23], 0x11);
  assert_int_equal(wire::kReqTrailer, 24);
}

void req_trailer_without_imm_carries_zero_there(void **) {
  uint8_t out[wire::kReqTrailer];
  wire::ReqTrailer t;
  t.id = 7;
  t.imm = 0x1234;  // ignored without has_imm
  wire::encode_req_trailer(t, out);
  wire::ReqTrailer d;
  d.imm = 99;
  d.has_imm = true;
  assert_true(wire::decode_req_trailer(out, sizeof out, &d));
  assert_true(d.id == 7);
  assert_false(d.has_imm);
  assert_false(d.retry);
  assert_int_equal(d.imm, 0);
}

void req_trailer_refuses_reserved_bits_and_short_payloads(void **) {
  uint8_t out[wire::kReqTrailer];
  wire::ReqTrailer t, d;
  t.id = 1;
  wire::encode_req_trailer(t, out);
  assert_false(wire::decode_req_trailer(out, wire::kReqTrailer - 1, &d));
  assert_false(wire::decode_req_trailer(nullptr, wire::kReqTrailer, &d));
  for (int bit = 2; bit < 8; ++bit) {
    uint8_t bad[wire::kReqTrailer];
    memcpy(bad, out, sizeof bad);
    bad[8] = uint8_t(1u << bit);
    assert_false(wire::decode_req_trailer(bad, sizeof bad, &d));
  }
  for (int i = 9; i < 12; ++i) {
    uint8_t bad[wire::kReqTrailer];
    memcpy(bad, out, sizeof bad);
    bad[i] = 1;
    assert_false(wire::decode_req_trailer(bad, sizeof bad, &d));
  }
  uint8_t bad[wire::kReqTrailer];
  memcpy(bad, out, sizeof bad);
  bad[13] = 1;  // an immediate without flag bit 0
  assert_false(wire::decode_req_trailer(bad, sizeof bad, &d));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(imm_round_trips_zero),
      cmocka_unit_test(imm_round_trips_one_of_each),
      cmocka_unit_test(imm_round_trips_max_credits),
      cmocka_unit_test(imm_round_trips_the_credit_opcode_alone),
      cmocka_unit_test(imm_round_trips_everything_set),
      cmocka_unit_test(imm_round_trips_fields_independently),
      cmocka_unit_test(imm_round_trips_every_opcode),
      cmocka_unit_test(imm_opcode_count_covers_the_four_opcode_bits),
      cmocka_unit_test(imm_opcodes_have_their_documented_values),
      cmocka_unit_test(imm_default_is_a_data_message_returning_nothing),
      cmocka_unit_test(req_trailer_round_trips_at_the_end_of_a_payload),
      cmocka_unit_test(req_trailer_without_imm_carries_zero_there),
      cmocka_unit_test(req_trailer_refuses_reserved_bits_and_short_payloads),
      cmocka_unit_test(imm_layout_matches_the_documented_bits),
      cmocka_unit_test(imm_encode_clamps_oversized_fields_instead_of_spilling),
      cmocka_unit_test(imm_done_count_round_trips),
      cmocka_unit_test(imm_decode_accepts_every_unreserved_bit),
      cmocka_unit_test(imm_decode_into_a_used_imm_depends_on_the_value_only),
      cmocka_unit_test(hello_round_trips),
      cmocka_unit_test(hello_round_trips_the_largest_values),
      cmocka_unit_test(hello_round_trips_the_smallest_values),
      cmocka_unit_test(hello_limits_fit_the_credit_fields_of_the_immediate),
      cmocka_unit_test(hello_layout_is_little_endian_byte_by_byte),
      cmocka_unit_test(hello_cap_is_at_least_the_depth_and_absent_before_1_3),
      cmocka_unit_test(wants_bit_is_bit_15_of_the_credits),
      cmocka_unit_test(hello_carries_the_version_of_the_struct),
      cmocka_unit_test(hello_fits_the_private_data_of_a_connect_request),
      cmocka_unit_test(hello_decodes_when_padded_by_the_transport),
      cmocka_unit_test(hello_of_a_higher_minor_with_unknown_features_is_ok),
      cmocka_unit_test(hello_of_the_highest_minor_is_ok),
      cmocka_unit_test(hello_of_another_major_is_other_major_with_its_version),
      cmocka_unit_test(hello_of_another_major_is_not_judged_by_this_majors_fields),
      cmocka_unit_test(hello_of_another_major_shorter_than_a_hello_is_other_major),
      cmocka_unit_test(hello_of_another_major_shorter_than_the_header_is_not_ibmsg),
      cmocka_unit_test(hello_with_zero_recv_depth_is_invalid),
      cmocka_unit_test(hello_with_recv_depth_beyond_the_limit_is_invalid),
      cmocka_unit_test(hello_with_zero_ctrl_depth_is_invalid),
      cmocka_unit_test(hello_with_ctrl_depth_beyond_the_limit_is_invalid),
      cmocka_unit_test(hello_with_zero_max_msg_size_is_invalid),
      cmocka_unit_test(hello_with_wrong_magic_is_not_ibmsg),
      cmocka_unit_test(hello_with_wrong_kind_is_not_ibmsg),
      cmocka_unit_test(hello_too_short_is_not_ibmsg),
      cmocka_unit_test(hello_null_data_is_not_ibmsg),
      cmocka_unit_test(reject_round_trips_text),
      cmocka_unit_test(reject_without_text_decodes_to_empty_text),
      cmocka_unit_test(reject_text_is_cut_at_the_maximum),
      cmocka_unit_test(reject_text_of_exactly_the_maximum_is_kept_whole),
      cmocka_unit_test(reject_padded_with_zeros_decodes_to_the_text),
      cmocka_unit_test(reject_decode_of_a_longer_area_stops_at_the_maximum),
      cmocka_unit_test(reject_decode_never_writes_past_a_small_buffer),
      cmocka_unit_test(reject_layout_is_the_header_then_the_text),
      cmocka_unit_test(reject_fits_the_private_data_of_a_reject),
      cmocka_unit_test(reject_with_wrong_magic_or_kind_is_rejected),
      cmocka_unit_test(reject_from_another_version_still_decodes_its_text),
      cmocka_unit_test(reject_too_short_or_null_is_rejected),
      cmocka_unit_test(hello_and_reject_are_not_mistaken_for_each_other),
      cmocka_unit_test(imm_data_imm_is_opcode_5_with_a_4_byte_trailer),
      cmocka_unit_test(feature_bits_have_their_documented_values),
      cmocka_unit_test(feature_bits_round_trip_through_the_hello_one_by_one),
      cmocka_unit_test(descriptor_reference_check_matches_published_fnv1a_values),
      cmocka_unit_test(descriptor_round_trips),
      cmocka_unit_test(descriptor_sizes_agree),
      cmocka_unit_test(descriptor_layout_is_little_endian_byte_by_byte),
      cmocka_unit_test(descriptor_every_single_bit_flip_is_rejected),
      cmocka_unit_test(descriptor_random_bytes_are_rejected),
      cmocka_unit_test(descriptor_random_bytes_with_a_valid_header_fail_the_check),
      cmocka_unit_test(descriptor_of_zero_length_is_rejected),
      cmocka_unit_test(descriptor_with_no_or_unknown_rights_is_rejected),
      cmocka_unit_test(descriptor_whose_range_wraps_is_rejected),
      cmocka_unit_test(descriptor_with_a_right_check_but_a_wrong_header_is_rejected),
      cmocka_unit_test(hello_round_trips_the_rendezvous_maximum),
      cmocka_unit_test(hello_of_protocol_1_1_without_rndv_max_size_decodes_with_none),
      cmocka_unit_test(hello_with_rndv_max_size_below_the_eager_maximum_is_invalid),
      cmocka_unit_test(rts_round_trips),
      cmocka_unit_test(rts_layout_is_little_endian_byte_by_byte),
      cmocka_unit_test(rts_naming_a_request_or_reply_carries_its_trailer),
      cmocka_unit_test(fin_round_trips_every_status_and_layout),
      cmocka_unit_test(rts_with_bad_fields_is_rejected),
      cmocka_unit_test(fin_with_bad_fields_is_rejected),
      cmocka_unit_test(rndv_random_payloads_never_decode_wrongly),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
