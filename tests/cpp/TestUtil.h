#pragma once

// Helpers shared by the C++ tests.

#include <string>

#include "common/Check.h"

namespace hotswitch {
namespace testing {

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
