#pragma once
// What the ctxgen command line says, parsed but not acted on, so the parser can be tested and
// fuzzed without touching a file.

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "ctxgen/options.h"
#include "ctxgen/pipeline.h"

namespace ctxgen::cli {

enum class Command { kNone, kListBackends, kCompile, kShare, kInspect, kVerify, kCache, kLink };

struct CommandLine {
  Command command = Command::kNone;
  int verbosity = 0;
  bool quiet = false;
  std::string help;  // shown when no command is given

  // compile / share: `given` is what the command line says; `given_keys` which of its manifest
  // keys were given, so they override a manifest's and the others do not.
  CompileOptions given;
  std::vector<std::string> given_keys;
  std::vector<std::string> model_args;
  ShapeArgs shapes;
  std::string manifest_path, stop_after;
  std::string remote_cache;  // --remote-cache URL (main.cc makes its HTTP client)
  bool remote_read_only = false;  // --remote-cache-read-only
  std::string cache_max_size;  // --cache-max-size, and `cache prune --max-size`: "10G", "512M", bytes
  std::string cache_action;    // cache: stats, prune or clear
  std::string object;          // compile --object OUT.ctxo
  std::vector<std::string> link_objects;  // link A.ctxo B.ctxo ...
  // --ep-lib: compile through ONNX Runtime's Compile API with that library's EP (builds with ORT).
  std::string ep_lib, ep;
  std::vector<std::string> ep_options, session_config;  // KEY=VALUE each
  std::string package;  // --package DIR: an ONNX Runtime model package of the levels' outputs

  std::string inspect_path;
  bool json = false;  // inspect and verify
  bool dot = false, svg = false;  // inspect: the partitioning as a picture

  std::vector<std::string> verify_models, verify_references, verify_shapes;
  double rtol = 1e-3;
  std::optional<double> atol;
  std::string error_stat = "elementwise", reference_precision = "float32";
  std::optional<double> min_cosine, min_snr;
  double max_error_ratio = 4;
  double max_steps = 1;
  uint64_t seed = 1;
  std::string plugin;
};

// "10G", "512M", "64K" (binary units; a trailing B or iB allowed) or a number of bytes.
// Throws Error(kUsage) naming `option` for anything else.
uint64_t parse_size(const std::string& text, const std::string& option);

// Either a command line to run or what to print and the exit code (help, `help CMD`, --version,
// a parse error as one `error:` line). `with_verify`: whether this build has the verify command;
// `version`: what -V/--version prints.
struct Parsed {
  std::optional<CommandLine> line;
  int exit_code = 0;
  std::string out, err;
};
Parsed parse(int argc, const char* const* argv, bool with_verify, const std::string& version);

// "a.onnx,b.onnx" and separate arguments both name models. An argument that is an existing path
// is taken whole, so a path containing a comma still works.
std::vector<std::filesystem::path> model_list(const std::vector<std::string>& args);

// The options of a compile/share run: a manifest's (if any), overridden by the command line's.
// Returns the models in order.
std::vector<std::filesystem::path> compile_options(const CommandLine& line, const Manifest* manifest,
                                                   CompileOptions& options);

}  // namespace ctxgen::cli
