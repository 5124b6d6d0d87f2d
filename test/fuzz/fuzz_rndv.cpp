// fuzz_rndv.cpp - libFuzzer harness of the rendezvous messages (the payload of a message of
// opcode Rendezvous, from the peer): wire::rndv_kind, wire::decode_rts, wire::decode_fin.
//
// Input: the payload, of its own length.
//
// Properties: rndv_kind says Rts for exactly the payloads of kind 1 of 32 bytes, or of 56 when
// flag bits 1..2 name a request or reply (a trailer follows, protocol 1.5), Fin for exactly the
// 8-byte ones of kind 2, and nothing else; decode_rts accepts exactly such an RTS with every
// reserved bit zero (flags other than bits 0..2, flag bits 1..2 both set, bytes 2..3, the
// immediate without its flag), a nonzero length and a range that does not wrap; an accepted one
// has every field as its bytes say, is what rndv_kind calls an RTS, and re-encodes to the same
// 32 bytes (the trailer is decode_req_trailer's, not decode_rts's); decode_fin accepts
// exactly a FIN of 8 bytes with a known status (0 .. 2) and zero bytes 2..3, and re-encodes to
// the same 8 bytes. ASan sees any read beyond the payload.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "fuzz.hpp"
#include "wire.hpp"

namespace wire = ibmsg::wire;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  std::vector<uint8_t> in(data, data + size);
  const uint8_t *p = size ? in.data() : nullptr;

  wire::RndvKind kind = wire::RndvKind(0);
  const bool is_kind = wire::rndv_kind(p, size, &kind);
  const bool rts_shape = size >= wire::kRtsSize && p[0] == 1 &&
                         size == (p[1] & 6 ? wire::kRtsSize + wire::kReqTrailer : wire::kRtsSize);
  const bool fin_shape = size == wire::kFinSize && p[0] == 2;
  if (is_kind != (rts_shape || fin_shape))
    FUZZ_FAIL("rndv_kind of %zu bytes (kind byte %d) says %d", size, size ? p[0] : -1, is_kind);
  if (is_kind) FUZZ_CHECK(kind == (rts_shape ? wire::RndvKind::Rts : wire::RndvKind::Fin));

  wire::Rts r;
  const bool rts = wire::decode_rts(p, size, &r);
  bool want = rts_shape && (p[1] & ~7u) == 0 && (p[1] & 6) != 6 && p[2] == 0 && p[3] == 0;
  if (want) {
    const bool has_imm = p[1] & 1;
    const uint64_t addr = fuzz::le64(p + 16), length = fuzz::le64(p + 24);
    // The end, addr + length, is an address too: it must not wrap past 2^64 - 1.
    want = (has_imm || fuzz::le32(p + 12) == 0) && length != 0 && length <= UINT64_MAX - addr;
  }
  if (rts != want) FUZZ_FAIL("decode_rts of %zu bytes says %d, the layout says %d", size, rts, want);
  if (rts) {
    FUZZ_CHECK(is_kind && kind == wire::RndvKind::Rts);
    FUZZ_CHECK(r.has_imm == ((p[1] & 1) != 0));
    FUZZ_CHECK(r.req == (p[1] >> 1 & 3));
    FUZZ_CHECK(r.id == fuzz::le32(p + 4) && r.rkey == fuzz::le32(p + 8));
    FUZZ_CHECK(r.imm == fuzz::le32(p + 12));
    FUZZ_CHECK(r.addr == fuzz::le64(p + 16) && r.length == fuzz::le64(p + 24));
    FUZZ_CHECK(r.length != 0 && r.addr + r.length > r.addr);  // a nonzero, non-wrapping length
    uint8_t again[wire::kRtsSize];
    wire::encode_rts(r, again);
    if (memcmp(again, p, wire::kRtsSize) != 0) FUZZ_FAIL("an accepted RTS re-encodes differently");
  }

  wire::Fin f;
  const bool fin = wire::decode_fin(p, size, &f);
  const bool fwant = fin_shape && p[1] <= 2 && p[2] == 0 && p[3] == 0;
  if (fin != fwant) FUZZ_FAIL("decode_fin of %zu bytes says %d, the layout says %d", size, fin, fwant);
  if (fin) {
    FUZZ_CHECK(is_kind && kind == wire::RndvKind::Fin);
    FUZZ_CHECK(uint8_t(f.status) == p[1] && f.id == fuzz::le32(p + 4));
    uint8_t again[wire::kFinSize];
    wire::encode_fin(f, again);
    if (memcmp(again, p, wire::kFinSize) != 0) FUZZ_FAIL("an accepted FIN re-encodes differently");
  }
  FUZZ_CHECK(!(rts && fin));
  return 0;
}
