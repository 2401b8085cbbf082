#include "ctxgen/log.h"

#include <spdlog/sinks/null_sink.h>

namespace ctxgen {

spdlog::logger& log() {
  // The registry owns a registered logger for as long as the application keeps it registered.
  if (auto registered = spdlog::get(kLoggerName)) return *registered;
  static const auto silent =
      std::make_shared<spdlog::logger>(kLoggerName, std::make_shared<spdlog::sinks::null_sink_mt>());
  return *silent;
}

}  // namespace ctxgen
