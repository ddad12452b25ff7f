#pragma once

// Reads typed values from a fuzz input; past its end every read returns the low end of its
// range, so any byte string is a valid input. Also the failure report of the fuzz targets.

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace hotswitch {
namespace fuzz {

class FuzzInput {
 public:
  FuzzInput(const uint8_t* data, size_t size) : data_(data), size_(size) {}

  uint64_t bits(int n) {
    uint64_t v = 0;
    for (int i = 0; i < (n + 7) / 8; ++i) v = v << 8 | (pos_ < size_ ? data_[pos_++] : 0);
    return n >= 64 ? v : v & ((uint64_t{1} << n) - 1);
  }
  // A value in [lo, hi].
  int64_t range(int64_t lo, int64_t hi) {
    const uint64_t span = static_cast<uint64_t>(hi - lo) + 1;
    const uint64_t v = span == 0 ? bits(64) : bits(span > 0xffffffffULL ? 64 : 32) % span;
    return lo + static_cast<int64_t>(v);
  }
  bool flag() { return bits(8) & 1; }
  // true with probability about n / 256.
  bool chance(int n) { return static_cast<int>(bits(8)) < n; }
  // A double in [lo, hi].
  double real(double lo, double hi) { return lo + (hi - lo) * static_cast<double>(bits(16)) / 65535.0; }
  bool done() const { return pos_ >= size_; }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

// A broken property: prints it and aborts, so libFuzzer saves the input.
[[noreturn]] inline void fail(const std::string& what) {
  std::fprintf(stderr, "fuzz check failed: %s\n", what.c_str());
  std::abort();
}

}  // namespace fuzz
}  // namespace hotswitch

#define FUZZ_CHECK(cond, ...)                                                             \
  do {                                                                                    \
    if (!(cond)) ::hotswitch::fuzz::fail(::hotswitch::str(#cond, ": ", __VA_ARGS__));     \
  } while (0)
