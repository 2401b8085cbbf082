#pragma once
// The library logs through one named spdlog logger and never configures it: the application owns
// sinks and levels. Without an application logger, messages go nowhere.

#include <memory>

#include <spdlog/spdlog.h>

namespace ctxgen {

inline constexpr const char* kLoggerName = "ctxgen";

// The "ctxgen" logger registered by the application, or a silent one.
spdlog::logger& log();

}  // namespace ctxgen
