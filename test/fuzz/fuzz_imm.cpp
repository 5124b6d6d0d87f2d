// fuzz_imm.cpp - libFuzzer harness of the immediate value of every message: wire::decode_imm and
// wire::split_wants (on what the peer sends) and wire::encode_imm.
//
// Input: records of 17 bytes: a 32-bit immediate as it arrives, then the fields of an Imm to
// encode (credits, ctrl_credits, done: 32 bits each, one byte of opcode (low 4 bits) and wants
// (bit 4)).
//
// Properties: every value decodes, to the same Imm whatever the Imm held before (a reused one
// too); each field stays in its bits (credits 0 .. 0xffff, control credits 0 .. 0xff, done
// 0 .. 15, opcode 0 .. 15, wants false until split_wants) and equals them; encode_imm gives the
// value back exactly, also after split_wants (credits 0 .. 0x7fff, wants = bit 15). encode_imm clamps
// each field to its maximum instead of spilling into the next one (credits to 0x7fff with the
// wants bit, else 0xffff), and its result decodes to the clamped fields.
#include <cstddef>
#include <cstdint>

#include "fuzz.hpp"
#include "wire.hpp"

namespace wire = ibmsg::wire;

namespace {

void check_value(uint32_t v) {
  wire::Imm imm;
  FUZZ_CHECK(wire::decode_imm(v, &imm));
  FUZZ_CHECK(imm.credits == (v & 0xffff));
  FUZZ_CHECK(imm.ctrl_credits == (v >> 16 & 0xff));
  FUZZ_CHECK(imm.done == (v >> 24 & 0x0f) && imm.done <= wire::kMaxDonePerMsg);
  FUZZ_CHECK(unsigned(imm.op) == v >> 28 && unsigned(imm.op) < wire::kOpcodeCount);
  FUZZ_CHECK(!imm.wants);
  if (wire::encode_imm(imm) != v) FUZZ_FAIL("0x%08x decodes and encodes to 0x%08x", v, wire::encode_imm(imm));
  wire::split_wants(&imm);
  FUZZ_CHECK(imm.wants == ((v & wire::kWantsBit) != 0));
  FUZZ_CHECK(imm.credits == (v & wire::kMaxSharedCreditsPerMsg));
  if (wire::encode_imm(imm) != v)
    FUZZ_FAIL("0x%08x with the wants bit split off encodes to 0x%08x", v, wire::encode_imm(imm));
  // Decoded into an Imm that held another message (every field set), the result is the same.
  wire::Imm reused;
  reused.op = wire::Opcode(~v >> 28);
  reused.credits = ~v;
  reused.ctrl_credits = 0x1ff;
  reused.done = 99;
  reused.wants = true;
  FUZZ_CHECK(wire::decode_imm(v, &reused));
  if (reused.op != wire::Opcode(v >> 28) || reused.credits != (v & 0xffff) ||
      reused.ctrl_credits != (v >> 16 & 0xff) || reused.done != (v >> 24 & 0x0f) || reused.wants)
    FUZZ_FAIL("0x%08x decoded into a used Imm keeps something of it (wants %d)", v, reused.wants);
  if (wire::encode_imm(reused) != v)
    FUZZ_FAIL("0x%08x decoded into a used Imm encodes to 0x%08x", v, wire::encode_imm(reused));
}

void check_encode(uint32_t credits, uint32_t ctrl, uint32_t done, uint8_t op, bool wants) {
  wire::Imm in;
  in.credits = credits;
  in.ctrl_credits = ctrl;
  in.done = done;
  in.op = wire::Opcode(op & 0x0f);
  in.wants = wants;
  const uint32_t v = wire::encode_imm(in);
  const uint32_t cmax = wants ? wire::kMaxSharedCreditsPerMsg : wire::kMaxCreditsPerMsg;
  wire::Imm out;
  FUZZ_CHECK(wire::decode_imm(v, &out));
  FUZZ_CHECK(unsigned(out.op) == (op & 0x0fu));
  FUZZ_CHECK(out.ctrl_credits == (ctrl < wire::kMaxCtrlCreditsPerMsg ? ctrl : wire::kMaxCtrlCreditsPerMsg));
  FUZZ_CHECK(out.done == (done < wire::kMaxDonePerMsg ? done : wire::kMaxDonePerMsg));
  if (wants) {
    FUZZ_CHECK(out.credits & wire::kWantsBit);
    wire::split_wants(&out);
    FUZZ_CHECK(out.wants);
  }
  if (out.credits != (credits < cmax ? credits : cmax))
    FUZZ_FAIL("credits %u (wants %d) encode to %u", credits, wants, out.credits);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fuzz::Cursor c(data, size);
  do {
    check_value(c.u32());
    const uint32_t credits = c.u32(), ctrl = c.u32(), done = c.u32();
    const uint8_t b = c.u8();
    check_encode(credits, ctrl, done, b & 0x0f, (b & 0x10) != 0);
  } while (!c.empty());
  return 0;
}
