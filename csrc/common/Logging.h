#pragma once

// Leveled logging with a subsystem tag ("layout", "planner", "switch", "transport").
// The level comes from HOTSWITCH_LOG_LEVEL (trace, debug, info, warn, error, off; default
// warn), read once. Messages are only formatted when their level is enabled.

#include <string>

#include "common/Check.h"

namespace hotswitch {

enum class LogLevel { kTrace = 0, kDebug, kInfo, kWarn, kError, kOff };

// The level in force; parsed from HOTSWITCH_LOG_LEVEL on first use. Thread-safe.
LogLevel logLevel();

// Overrides the level (tests, Python's hotswitch.set_log_level). Thread-safe.
void setLogLevel(LogLevel level);

// Parses "trace".."off"; throws InvalidArgument naming the value otherwise.
LogLevel parseLogLevel(const std::string& name);

// Writes one line "[hotswitch] [subsystem] message" at the given level. Thread-safe.
void logMessage(LogLevel level, const char* subsystem, const std::string& message);

}  // namespace hotswitch

#define HS_LOG(level, subsystem, ...)                                             \
  do {                                                                            \
    if ((level) >= ::hotswitch::logLevel()) {                                     \
      ::hotswitch::logMessage((level), (subsystem), ::hotswitch::str(__VA_ARGS__)); \
    }                                                                             \
  } while (0)

#define HS_LOG_DEBUG(subsystem, ...) HS_LOG(::hotswitch::LogLevel::kDebug, subsystem, __VA_ARGS__)
#define HS_LOG_INFO(subsystem, ...) HS_LOG(::hotswitch::LogLevel::kInfo, subsystem, __VA_ARGS__)
#define HS_LOG_WARN(subsystem, ...) HS_LOG(::hotswitch::LogLevel::kWarn, subsystem, __VA_ARGS__)
