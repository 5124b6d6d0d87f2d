// fuzz_descriptor.cpp - libFuzzer harness of wire::decode_descriptor (the 32 bytes of an
// ibmsg_descriptor, which an application copies out of a peer's message and hands to
// ibmsg_rdma_* and ibmsg_descriptor_info) and wire::encode_descriptor.
//
// Input: up to 28 bytes are the descriptor's first 28, zero-padded, sealed with a correct check
// (so that the fuzzer reaches the field checks behind it); 29 and more are the descriptor as it
// is (zero-padded to 32; what lies beyond is ignored). From byte 32 on, the fields of a
// Descriptor to encode (access: 1 byte, rkey: 4, addr: 8, length: 8).
//
// Properties: decode_descriptor accepts exactly the layout of wire.hpp: magic 0xd35c, version 1,
// rights nonzero and within IBMSG_ACCESS_REMOTE_*, bytes 24..27 zero, the FNV-1a check of bytes
// 0..27 (computed here from its definition), a nonzero length and a range that does not wrap; an
// accepted one has every field as its bytes say and re-encodes to the same 32 bytes.
// encode_descriptor of any fields decodes again exactly when those fields are acceptable, to the
// same fields.
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "fuzz.hpp"
#include "wire.hpp"

namespace wire = ibmsg::wire;

namespace {

bool fields_ok(uint8_t access, uint64_t addr, uint64_t length) {
  return access != 0 && (access & ~wire::kDescRights) == 0 && length != 0 &&
         length <= UINT64_MAX - addr;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  uint8_t d[wire::kDescriptorSize] = {};
  memcpy(d, data, size < sizeof d ? size : sizeof d);
  if (size <= 28) {
    const uint32_t check = fuzz::fnv1a(d, 28);
    for (int i = 0; i < 4; ++i) d[28 + i] = uint8_t(check >> (8 * i));
  }
  // A heap copy of exactly 32 bytes: ASan sees a read beyond it.
  uint8_t *in = static_cast<uint8_t *>(malloc(sizeof d));
  FUZZ_CHECK(in);
  memcpy(in, d, sizeof d);

  wire::Descriptor got;
  const bool ok = wire::decode_descriptor(in, &got);
  const bool header = d[0] == 0x5c && d[1] == 0xd3 && d[2] == 1 && fuzz::le32(d + 24) == 0 &&
                      fuzz::le32(d + 28) == fuzz::fnv1a(d, 28);
  const bool want = header && fields_ok(d[3], fuzz::le64(d + 8), fuzz::le64(d + 16));
  if (ok != want) FUZZ_FAIL("decode_descriptor says %d, the layout says %d", ok, want);
  if (ok) {
    FUZZ_CHECK(got.access == d[3] && got.rkey == fuzz::le32(d + 4));
    FUZZ_CHECK(got.addr == fuzz::le64(d + 8) && got.length == fuzz::le64(d + 16));
    FUZZ_CHECK(got.length != 0 && got.addr + got.length > got.addr);
    uint8_t again[wire::kDescriptorSize];
    wire::encode_descriptor(got, again);
    if (memcmp(again, d, sizeof d) != 0) FUZZ_FAIL("an accepted descriptor re-encodes differently");
  }
  free(in);

  if (size > 32) {
    fuzz::Cursor c(data + 32, size - 32);
    wire::Descriptor e;
    e.access = c.u8();
    e.rkey = c.u32();
    e.addr = c.u64();
    e.length = c.u64();
    uint8_t enc[wire::kDescriptorSize];
    wire::encode_descriptor(e, enc);
    FUZZ_CHECK(fuzz::le32(enc + 28) == fuzz::fnv1a(enc, 28));
    wire::Descriptor back;
    const bool eok = wire::decode_descriptor(enc, &back);
    if (eok != fields_ok(e.access, e.addr, e.length))
      FUZZ_FAIL("an encoded descriptor (rights 0x%x, length %llu) decodes: %d", e.access,
                (unsigned long long)e.length, eok);
    if (eok)
      FUZZ_CHECK(back.access == e.access && back.rkey == e.rkey && back.addr == e.addr &&
                 back.length == e.length);
  }
  return 0;
}
