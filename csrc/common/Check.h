#pragma once

// Error types and the one checking macro of hotswitch.
//
// InvalidArgument is bad input from the caller (surfaces in Python as ValueError) and is
// always raised before any state changes. Fault is a runtime failure (a peer died, a
// transport error; RuntimeError in Python); Timeout is the Fault of a peer that did not
// answer in time.

#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace hotswitch {

class InvalidArgument : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

class Fault : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class Timeout : public Fault {
 public:
  using Fault::Fault;
};

namespace detail {

inline void streamArgs(std::ostringstream&) {}

template <typename T>
void streamOne(std::ostringstream& os, const T& value) {
  os << value;
}

template <typename T>
void streamOne(std::ostringstream& os, const std::vector<T>& values) {
  os << '[';
  for (size_t i = 0; i < values.size(); ++i) {
    os << (i ? ", " : "") << values[i];
  }
  os << ']';
}

template <typename T, typename... Rest>
void streamArgs(std::ostringstream& os, const T& first, const Rest&... rest) {
  streamOne(os, first);
  streamArgs(os, rest...);
}

}  // namespace detail

// Concatenates its arguments as text; vectors print as [a, b, c].
template <typename... Args>
std::string str(const Args&... args) {
  std::ostringstream os;
  detail::streamArgs(os, args...);
  return os.str();
}

}  // namespace hotswitch

// Throws InvalidArgument with the concatenated message when cond is false. The message
// should name the failing values and what was expected: "dp(2) * tp(3) != world(8)".
#define HS_CHECK(cond, ...)                                          \
  do {                                                               \
    if (!(cond)) {                                                   \
      throw ::hotswitch::InvalidArgument(::hotswitch::str(__VA_ARGS__)); \
    }                                                                \
  } while (0)

// Throws Fault: for broken internal invariants and runtime failures, not for bad input.
#define HS_FAULT(...) throw ::hotswitch::Fault(::hotswitch::str(__VA_ARGS__))

#define HS_INTERNAL_CHECK(cond, ...)                                      \
  do {                                                                    \
    if (!(cond)) {                                                        \
      HS_FAULT("internal error at ", __FILE__, ":", __LINE__, ": ", __VA_ARGS__); \
    }                                                                     \
  } while (0)
