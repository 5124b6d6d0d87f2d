// fuzz.hpp - what the libFuzzer harnesses of test/fuzz share: a property check that stops the
// run (libFuzzer keeps the input as a crash), little-endian reads of the input, and a cursor that
// takes values off the front of an input (zeros once it is used up).
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

// A property of the code under test does not hold: says which, then aborts (the input is saved as
// a crash by libFuzzer).
#define FUZZ_CHECK(cond)                                                                       \
  do {                                                                                         \
    if (!(cond)) {                                                                             \
      fprintf(stderr, "%s:%d: property violated: %s\n", __FILE__, __LINE__, #cond);          \
      abort();                                                                                 \
    }                                                                                          \
  } while (0)

// The same with a formatted explanation.
#define FUZZ_FAIL(...)                                                   \
  do {                                                                   \
    fprintf(stderr, "%s:%d: property violated: ", __FILE__, __LINE__); \
    fprintf(stderr, __VA_ARGS__);                                        \
    fputc('\n', stderr);                                                 \
    abort();                                                             \
  } while (0)

namespace fuzz {

inline uint32_t le32(const uint8_t *p) {
  return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
}
inline uint64_t le64(const uint8_t *p) { return uint64_t(le32(p)) | uint64_t(le32(p + 4)) << 32; }

// FNV-1a, written down again from its definition (32-bit offset basis and prime), so that the
// descriptor check is not judged by the code under test.
inline uint32_t fnv1a(const uint8_t *p, size_t n) {
  uint32_t h = 0x811c9dc5u;
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x01000193u;
  return h;
}

// Takes values off the front of a fuzz input.
class Cursor {
 public:
  Cursor(const uint8_t *data, size_t size) : p_(data), n_(size) {}
  bool empty() const { return n_ == 0; }
  size_t left() const { return n_; }
  uint8_t u8() {
    if (!n_) return 0;
    --n_;
    return *p_++;
  }
  uint16_t u16() { return uint16_t(u8() | u8() << 8); }
  uint32_t u32() { return uint32_t(u16()) | uint32_t(u16()) << 16; }
  uint64_t u64() { return uint64_t(u32()) | uint64_t(u32()) << 32; }
  // Up to n bytes into out (zeros where the input ends).
  void bytes(uint8_t *out, size_t n) {
    size_t k = n < n_ ? n : n_;
    if (k) memcpy(out, p_, k);
    if (n > k) memset(out + k, 0, n - k);
    p_ += k;
    n_ -= k;
  }

 private:
  const uint8_t *p_;
  size_t n_;
};

}  // namespace fuzz
