// fuzz_reject.cpp - libFuzzer harness of wire::decode_reject (the private data of a CM rejection,
// from the peer, decoded into ibmsg_socket.reject_reason) and wire::encode_reject.
//
// Input: byte 0 is the size of the output buffer (0 .. 255: below, at and above
// kRejectTextMax + 1), the rest is the private data. The output buffer is a heap block of exactly
// that size, so ASan catches a write of even one byte beyond it.
//
// Properties: decode_reject accepts exactly the data with the ibmsg magic and the reject kind (any
// version) of at least the header, and only into a buffer of at least one byte; refused, it leaves
// the buffer alone; accepted, it writes the text up to the first NUL of the data, cut at
// kRejectTextMax bytes and at out_size - 1, then a NUL, and nothing else; the text re-encodes
// with encode_reject to 8 + its length bytes that decode to the same text. encode_reject of the
// rest of the input as a C string writes at most kRejectMaxSize bytes and cuts the text at
// kRejectTextMax.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "fuzz.hpp"
#include "wire.hpp"

namespace wire = ibmsg::wire;

namespace {

constexpr uint8_t kUntouched = 0xa5;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size == 0) return 0;
  const size_t out_size = data[0];
  std::vector<uint8_t> in(data + 1, data + size);
  const size_t len = in.size();
  const uint8_t *p = len ? in.data() : nullptr;

  // malloc(0) under ASan is a block that no byte may be written to.
  char *out = static_cast<char *>(malloc(out_size));
  FUZZ_CHECK(out_size == 0 || out);
  if (out_size) memset(out, kUntouched, out_size);
  const bool ok = wire::decode_reject(p, len, out, out_size);
  const bool want = len >= wire::kRejectHeader && fuzz::le32(p) == wire::kMagic && p[6] == 2 &&
                    out_size > 0;
  if (ok != want)
    FUZZ_FAIL("decode_reject of %zu bytes into %zu says %d, the layout says %d", len, out_size, ok,
              want);
  if (!ok) {
    for (size_t i = 0; i < out_size; ++i)
      if (uint8_t(out[i]) != kUntouched) FUZZ_FAIL("a refused reject wrote byte %zu", i);
    free(out);
    return 0;
  }
  // The text: the bytes after the header up to the first NUL, at most kRejectTextMax and at most
  // out_size - 1 of them.
  size_t limit = len - wire::kRejectHeader;
  if (limit > wire::kRejectTextMax) limit = wire::kRejectTextMax;
  if (limit > out_size - 1) limit = out_size - 1;
  const size_t n = strnlen(reinterpret_cast<const char *>(p + wire::kRejectHeader), limit);
  FUZZ_CHECK(memchr(out, '\0', out_size) != nullptr);  // terminated within the buffer
  const size_t got = strlen(out);
  if (got != n) FUZZ_FAIL("the text is %zu bytes, expected %zu", got, n);
  FUZZ_CHECK(got <= wire::kRejectTextMax && got < out_size);
  FUZZ_CHECK(memcmp(out, p + wire::kRejectHeader, n) == 0);
  for (size_t i = n + 1; i < out_size; ++i)
    if (uint8_t(out[i]) != kUntouched) FUZZ_FAIL("decode_reject wrote byte %zu after the NUL", i);

  // Round trip through encode_reject.
  uint8_t enc[wire::kRejectMaxSize + 16];
  memset(enc, kUntouched, sizeof enc);
  const size_t elen = wire::encode_reject(out, enc);
  FUZZ_CHECK(elen == wire::kRejectHeader + n);
  for (size_t i = wire::kRejectMaxSize; i < sizeof enc; ++i) FUZZ_CHECK(enc[i] == kUntouched);
  char back[wire::kRejectTextMax + 1];
  FUZZ_CHECK(wire::decode_reject(enc, elen, back, sizeof back));
  FUZZ_CHECK(strcmp(back, out) == 0);
  free(out);

  // encode_reject of an arbitrary text: cut at kRejectTextMax, never beyond kRejectMaxSize.
  std::vector<char> text(in.begin(), in.end());
  text.push_back('\0');
  memset(enc, kUntouched, sizeof enc);
  const size_t tlen = wire::encode_reject(text.data(), enc);
  const size_t tn = strlen(text.data()) < wire::kRejectTextMax ? strlen(text.data()) : wire::kRejectTextMax;
  FUZZ_CHECK(tlen == wire::kRejectHeader + tn && tlen <= wire::kRejectMaxSize);
  for (size_t i = tlen; i < sizeof enc; ++i) FUZZ_CHECK(enc[i] == kUntouched);
  FUZZ_CHECK(wire::decode_reject(enc, tlen, back, sizeof back));
  FUZZ_CHECK(strlen(back) == tn && memcmp(back, text.data(), tn) == 0);
  return 0;
}
