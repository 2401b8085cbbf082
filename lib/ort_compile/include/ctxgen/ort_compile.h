#pragma once
// compile and share through any ONNX Runtime plugin EP (--ep-lib LIB --ep NAME): ORT's Compile API
// does the compiling, one session per model with the shared-workspace session options
// (ep.share_ep_contexts=1, ep.stop_share_ep_contexts=1 on the last), and ctxgen names, checks and
// publishes the outputs as it does its own: <stem>_ctx.onnx per model beside what the EP writes,
// all or nothing, --force, --report and the same exit codes.

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "ctxgen/pipeline.h"

namespace ctxgen {

struct EpTarget {
  std::filesystem::path library;                      // --ep-lib: the plugin EP library
  std::string ep;                                     // --ep: the EP's name, as the library offers it
  std::map<std::string, std::string> ep_options;      // --ep-option KEY=VALUE: provider options
  std::map<std::string, std::string> session_config;  // --session-config KEY=VALUE: session config entries
};

// The EP takes the place of `options.backend` (the report names it); `external_initializers_file`,
// `stop_after` and shape options other than fixed dims do not apply (Error kUsage says so).
// Throws Error as compile_models does.
RunSummary compile_with_ep(const std::vector<std::filesystem::path>& inputs, const CompileOptions& options,
                           const EpTarget& target);

// "KEY=VALUE" as a pair; Error(kUsage) naming `option` for text without '=' or with an empty key.
std::pair<std::string, std::string> key_value(const std::string& text, const std::string& option);

}  // namespace ctxgen
