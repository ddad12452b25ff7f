#include "common/Logging.h"

#include <atomic>
#include <cstdlib>
#include <mutex>

// spdlog is used header-only so that the library links nothing beyond the standard library
// and torch: the same sources build against any PyTorch ABI.
#ifndef SPDLOG_HEADER_ONLY
#define SPDLOG_HEADER_ONLY
#endif
#ifndef FMT_HEADER_ONLY
#define FMT_HEADER_ONLY
#endif
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

namespace hotswitch {
namespace {

constexpr const char* kLevelEnv = "HOTSWITCH_LOG_LEVEL";

LogLevel levelFromEnv() {
  const char* value = std::getenv(kLevelEnv);
  if (value == nullptr || *value == '\0') {
    return LogLevel::kWarn;
  }
  try {
    return parseLogLevel(value);
  } catch (const InvalidArgument&) {
    return LogLevel::kWarn;
  }
}

std::atomic<int>& levelStorage() {
  static std::atomic<int> level{static_cast<int>(levelFromEnv())};
  return level;
}

spdlog::logger& logger() {
  static std::shared_ptr<spdlog::logger> instance = [] {
    auto sink = std::make_shared<spdlog::sinks::stderr_sink_mt>();
    auto made = std::make_shared<spdlog::logger>("hotswitch", sink);
    made->set_pattern("[%H:%M:%S.%e] [hotswitch] [%l] %v");
    made->set_level(spdlog::level::trace);
    return made;
  }();
  return *instance;
}

}  // namespace

LogLevel logLevel() {
  return static_cast<LogLevel>(levelStorage().load(std::memory_order_relaxed));
}

void setLogLevel(LogLevel level) {
  levelStorage().store(static_cast<int>(level), std::memory_order_relaxed);
}

LogLevel parseLogLevel(const std::string& name) {
  static const char* kNames[] = {"trace", "debug", "info", "warn", "error", "off"};
  for (int i = 0; i < 6; ++i) {
    if (name == kNames[i]) {
      return static_cast<LogLevel>(i);
    }
  }
  HS_CHECK(false, "log level '", name, "' is not one of trace, debug, info, warn, error, off");
  return LogLevel::kOff;
}

void logMessage(LogLevel level, const char* subsystem, const std::string& message) {
  static const spdlog::level::level_enum kMap[] = {
      spdlog::level::trace, spdlog::level::debug, spdlog::level::info,
      spdlog::level::warn,  spdlog::level::err,   spdlog::level::off};
  logger().log(kMap[static_cast<int>(level)], "[{}] {}", subsystem, message);
}

}  // namespace hotswitch
