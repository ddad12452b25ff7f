#pragma once

// Helpers shared by the C++ tests.

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "common/Check.h"

namespace hotswitch {
namespace testing {

// n sequence lengths, lognormal (median ~665 tokens) and clamped to [1, 32768].
inline std::vector<int64_t> longTailed(int n, unsigned seed) {
  std::mt19937 gen(seed);
  std::lognormal_distribution<double> dist(6.5, 1.3);
  std::vector<int64_t> out;
  for (int i = 0; i < n; ++i) out.push_back(std::clamp<int64_t>(static_cast<int64_t>(dist(gen)), 1, 32768));
  return out;
}

// The message of the InvalidArgument that fn() throws, or "no error".
template <typename Fn>
std::string invalidArgumentMessage(Fn fn) {
  try {
    fn();
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace testing
}  // namespace hotswitch
