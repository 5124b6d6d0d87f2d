// fuzz_hello.cpp - libFuzzer harness of wire::decode_hello (the private data of a connection
// request or accept, from the peer). The input is the private data, of its own length.
//
// Properties: the result is the one the layout of wire.hpp gives (a reference reading of the
// bytes here); an Ok hello has every field as its bytes say and keeps every documented limit
// (depths 1 .. kMaxDepth / kMaxCtrlDepth, cap at least recv_depth and at most kMaxDepth, a
// nonzero maximum, a rendezvous maximum of 0 or at least the eager one), and re-encodes to a
// hello that decodes to the same fields; OtherMajor reports the peer's version; zero padding
// (what the transport adds) changes nothing for the whole-field lengths 24, 28 and 32 on; bytes
// beyond the 32 of a hello are ignored. ASan sees any read beyond the input.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "fuzz.hpp"
#include "wire.hpp"

namespace wire = ibmsg::wire;

namespace {

bool same(const wire::Hello &a, const wire::Hello &b) {
  return a.major == b.major && a.minor == b.minor && a.features == b.features &&
         a.recv_depth == b.recv_depth && a.ctrl_depth == b.ctrl_depth &&
         a.max_msg_size == b.max_msg_size && a.rndv_max_size == b.rndv_max_size && a.cap == b.cap;
}

const char *name(wire::HelloResult r) {
  switch (r) {
    case wire::HelloResult::Ok: return "Ok";
    case wire::HelloResult::NotIbmsg: return "NotIbmsg";
    case wire::HelloResult::OtherMajor: return "OtherMajor";
    case wire::HelloResult::Invalid: return "Invalid";
  }
  return "?";
}

// The reading of wire.hpp: header (magic, major, minor, kind 1, flags), then features,
// recv_depth, ctrl_depth, max_msg_size (24 bytes, protocol 1.1), rndv_max_size (28), cap (32).
wire::HelloResult reference(const uint8_t *p, size_t len, wire::Hello *h) {
  if (len < 8 || fuzz::le32(p) != wire::kMagic || p[6] != 1) return wire::HelloResult::NotIbmsg;
  h->major = p[4];
  h->minor = p[5];
  if (h->major != wire::kMajor) return wire::HelloResult::OtherMajor;
  if (len < wire::kHelloMinSize) return wire::HelloResult::NotIbmsg;
  h->features = fuzz::le32(p + 8);
  h->recv_depth = fuzz::le32(p + 12);
  h->ctrl_depth = fuzz::le32(p + 16);
  h->max_msg_size = fuzz::le32(p + 20);
  h->rndv_max_size = len >= 28 ? fuzz::le32(p + 24) : 0;
  h->cap = len >= 32 ? fuzz::le32(p + 28) : 0;
  if (h->cap < h->recv_depth) h->cap = h->recv_depth;  // "at least recv_depth"; 0 before 1.3
  const bool ok = h->recv_depth >= 1 && h->recv_depth <= wire::kMaxDepth &&
                  h->cap <= wire::kMaxDepth && h->ctrl_depth >= 1 &&
                  h->ctrl_depth <= wire::kMaxCtrlDepth && h->max_msg_size != 0 &&
                  (h->rndv_max_size == 0 || h->rndv_max_size >= h->max_msg_size);
  return ok ? wire::HelloResult::Ok : wire::HelloResult::Invalid;
}

void check_limits(const wire::Hello &h) {
  FUZZ_CHECK(h.major == wire::kMajor);
  FUZZ_CHECK(h.recv_depth >= 1 && h.recv_depth <= wire::kMaxDepth);
  FUZZ_CHECK(h.ctrl_depth >= 1 && h.ctrl_depth <= wire::kMaxCtrlDepth);
  FUZZ_CHECK(h.cap >= h.recv_depth && h.cap <= wire::kMaxDepth);
  FUZZ_CHECK(h.max_msg_size != 0);
  FUZZ_CHECK(h.rndv_max_size == 0 || h.rndv_max_size >= h.max_msg_size);
  // The credit fields of the immediate can say what the depths need.
  FUZZ_CHECK(h.recv_depth <= wire::kMaxCreditsPerMsg && h.cap <= wire::kMaxCreditsPerMsg);
  FUZZ_CHECK(h.ctrl_depth <= wire::kMaxCtrlCreditsPerMsg);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  // An exact copy on the heap: ASan catches a read of even one byte beyond it.
  std::vector<uint8_t> in(data, data + size);
  const uint8_t *p = size ? in.data() : nullptr;
  wire::Hello got, want;
  const wire::HelloResult r = wire::decode_hello(p, size, &got);
  const wire::HelloResult ref = reference(p, size, &want);
  if (r != ref) FUZZ_FAIL("decode_hello of %zu bytes says %s, the layout says %s", size, name(r), name(ref));

  if (r == wire::HelloResult::OtherMajor) {
    FUZZ_CHECK(got.major == p[4] && got.minor == p[5] && got.major != wire::kMajor);
  }
  if (r == wire::HelloResult::Ok) {
    check_limits(got);
    if (!same(got, want)) FUZZ_FAIL("an Ok hello's fields differ from its bytes");
    // Re-encoded, it decodes to the same fields (and stays within the 56 bytes of a REQ).
    uint8_t again[wire::kHelloSize];
    wire::encode_hello(got, again);
    FUZZ_CHECK(fuzz::le32(again) == wire::kMagic && again[6] == 1 && again[7] == 0);
    wire::Hello back;
    FUZZ_CHECK(wire::decode_hello(again, sizeof again, &back) == wire::HelloResult::Ok);
    if (!same(back, got)) FUZZ_FAIL("a decoded hello does not survive encode + decode");
  }

  // Zero padding to what a connect request carries (56 bytes) is what the transport does; at the
  // lengths that end on a field boundary it must not change the result.
  if (size == wire::kHelloMinSize || size == 28 || (size >= wire::kHelloSize && size < 56)) {
    std::vector<uint8_t> padded(in);
    padded.resize(56, 0);
    wire::Hello pg;
    const wire::HelloResult pr = wire::decode_hello(padded.data(), padded.size(), &pg);
    if (pr != r) FUZZ_FAIL("zero padding %zu bytes to 56 turns %s into %s", size, name(r), name(pr));
    if (r == wire::HelloResult::Ok && !same(pg, got)) FUZZ_FAIL("zero padding changes the fields");
  }
  // Only the first 32 bytes are a hello.
  if (size > wire::kHelloSize) {
    std::vector<uint8_t> head(in.begin(), in.begin() + wire::kHelloSize);
    wire::Hello hg;
    const wire::HelloResult hr = wire::decode_hello(head.data(), head.size(), &hg);
    if (hr != r) FUZZ_FAIL("bytes beyond the hello turn %s into %s", name(hr), name(r));
    if (r == wire::HelloResult::Ok && !same(hg, got)) FUZZ_FAIL("bytes beyond the hello change it");
  }
  return 0;
}
