// ctxgen command line: parse flags, call the library, map errors to documented exit codes
// (docs/cli.md).

#include <iostream>
#include <optional>

#include <spdlog/sinks/stdout_color_sinks.h>

#include <onnx/common/version.h>

#include "command_line.h"
#include "progress.h"
#include "ctxgen/backend.h"
#include "ctxgen/error.h"
#include "ctxgen/log.h"
#include "ctxgen/options.h"
#include "ctxgen/ref_identity.h"
#include "ctxgen/pipeline.h"
#include "ctxgen/report.h"
#ifdef CTXGEN_WITH_VERIFY
#include "ctxgen/verify.h"
#endif

using ctxgen::Error;
using ctxgen::ErrorCode;

namespace {

#ifdef CTXGEN_WITH_VERIFY
// verify --json (docs/verify-schema.json); with `error`, the run that failed with it.
nlohmann::json verification_json(const ctxgen::verify::Options& options, const ctxgen::verify::Result* result,
                                 const Error* error) {
  auto paths = [](const std::vector<std::filesystem::path>& list) {
    nlohmann::json out = nlohmann::json::array();
    for (const auto& p : list) out.push_back(p.string());
    return out;
  };
  nlohmann::json json = {
      {"schema_version", 1},
      {"ctxgen_version", CTXGEN_VERSION},
      {"status", error ? "failed" : "ok"},
      {"options",
       {{"models", paths(options.models)}, {"references", paths(options.references)}, {"rtol", options.rtol},
        {"atol", options.atol}, {"seed", options.seed}, {"input_shapes", options.input_shapes},
        {"plugin", options.plugin.empty() ? nlohmann::json() : nlohmann::json(options.plugin.string())}}}};
  if (result) {
    nlohmann::json outputs = nlohmann::json::array();
    for (const auto& o : result->outputs)
      outputs.push_back({{"model", o.model.string()}, {"output", o.output}, {"max_abs_diff", o.difference.max_abs},
                         {"max_rel_diff", o.difference.max_rel}, {"ok", o.difference.within},
                         {"problem", o.difference.problem}});
    json["checks"] = result->checks;
    json["outputs"] = outputs;
  }
  if (error) json["error"] = ctxgen::error_json(*error);
  return json;
}

void print_outputs(const std::vector<ctxgen::verify::OutputCheck>& outputs) {
  for (const auto& o : outputs) {
    char line[128];
    std::snprintf(line, sizeof line, "max abs diff %.3g, max rel diff %.3g", o.difference.max_abs, o.difference.max_rel);
    std::cout << (o.difference.within ? "ok  " : "FAIL") << "  " << o.model.string() << ": output '" << o.output
              << "': " << (o.difference.problem.empty() ? line : o.difference.problem) << "\n";
  }
}

// Text: each model's results as they are known, steps as progress; JSON: one document at the end.
int print_verification(ctxgen::verify::Options options, bool as_json, bool quiet) {
  ctxgen::cli::ProgressDisplay display(!quiet);
  options.step = [&](const std::string& step) { display.show(step); };
  if (!as_json)
    options.model_checked = [&](const ctxgen::verify::Result& found) {
      display.clear();
      for (const auto& c : found.checks) std::cout << "ok  " << c << "\n";
      print_outputs(found.outputs);
      std::cout.flush();
    };
  ctxgen::verify::Result result;
  try {
    result = ctxgen::verify::run_isolated(options);
  } catch (const Error& e) {
    display.clear();
    if (as_json) std::cout << ctxgen::json_text(verification_json(options, nullptr, &e), 2) << std::endl;
    throw;
  }
  display.clear();
  std::vector<std::string> mismatches;
  for (const auto& o : result.outputs)
    if (!o.difference.within)
      mismatches.push_back(o.model.string() + ": output '" + o.output + "' differs from the reference beyond tolerance");
  std::optional<Error> mismatch;
  if (!mismatches.empty()) mismatch = Error(ErrorCode::kMismatch, mismatches.front());
  if (as_json) std::cout << ctxgen::json_text(verification_json(options, &result, mismatch ? &*mismatch : nullptr), 2) << "\n";
  std::cout.flush();  // the results, then why they fail
  for (const auto& message : mismatches) ctxgen::log().error("{}", message);
  return mismatch ? ctxgen::exit_code(ErrorCode::kMismatch) : 0;
}
#endif

void setup_logging(int verbosity, bool quiet) {
  auto logger = spdlog::stderr_color_mt(ctxgen::kLoggerName);
  logger->set_pattern("%^%l%$: %v");
  logger->set_level(quiet ? spdlog::level::err : verbosity >= 2 ? spdlog::level::trace
                                             : verbosity == 1  ? spdlog::level::debug
                                                               : spdlog::level::info);
}

}  // namespace

#ifdef CTXGEN_WITH_VERIFY
constexpr bool kWithVerify = true;
std::string runtime_versions() { return "ONNX Runtime " + Ort::GetVersionString() + ", "; }
#else
constexpr bool kWithVerify = false;
std::string runtime_versions() { return ""; }
#endif

int main(int argc, char** argv) {
  const std::string version = std::string("ctxgen ") + CTXGEN_VERSION + " (" + runtime_versions() + "onnx " +
                              onnx::LAST_RELEASE_VERSION + ", ref " + ctxgen::ref::kSdkVersion + ")";
  const ctxgen::cli::Parsed parsed = ctxgen::cli::parse(argc, argv, kWithVerify, version);
  if (!parsed.line) {
    std::cout << parsed.out;
    std::cerr << parsed.err;
    return parsed.exit_code;
  }
  const ctxgen::cli::CommandLine& line = *parsed.line;
  setup_logging(line.verbosity, line.quiet);

  try {
    using ctxgen::cli::Command;
    ctxgen::BackendRegistry backends = ctxgen::builtin_backends();
    switch (line.command) {
      case Command::kListBackends:
        for (const auto* b : backends.list())
          std::cout << b->name() << "\t" << b->ep_name() << "\t" << b->sdk_version() << "\t" << b->description() << "\n";
        return 0;
      case Command::kInspect: {
        auto inspected = ctxgen::inspect_json(line.inspect_path);
        std::cout << (line.json ? ctxgen::json_text(inspected, 2) + "\n" : ctxgen::inspect_text(inspected));
        return 0;
      }
      case Command::kVerify: {
#ifdef CTXGEN_WITH_VERIFY
        ctxgen::verify::Options options;
        options.rtol = line.rtol;
        options.atol = line.atol;
        options.seed = line.seed;
        options.input_shapes = ctxgen::resolve_shapes({"verify"}, {{}, line.verify_shapes, {}})[0].input_shapes;
        for (const auto& m : line.verify_models) options.models.emplace_back(m);
        for (const auto& r : line.verify_references) options.references.emplace_back(r);
        options.plugin = line.plugin;
        return print_verification(options, line.json, line.quiet);
#else
        break;
#endif
      }
      case Command::kNone:
        std::cout << line.help;
        return ctxgen::exit_code(ErrorCode::kUsage);
      case Command::kCompile:
      case Command::kShare: {
        std::optional<ctxgen::Manifest> manifest;
        if (!line.manifest_path.empty()) manifest = ctxgen::read_manifest(line.manifest_path);
        ctxgen::CompileOptions options;
        const auto models = ctxgen::cli::compile_options(line, manifest ? &*manifest : nullptr, options);
        ctxgen::cli::ProgressDisplay display(!line.quiet);
        options.progress = [&](const ctxgen::Progress& p) { display.show(p); };
        auto summary = ctxgen::compile_models(models, options, backends);
        display.clear();
        // With --report -, standard output carries the JSON alone.
        if (!line.quiet) (options.report_file == ctxgen::kStdoutReport ? std::cerr : std::cout) << ctxgen::report_text(summary);
        return 0;
      }
    }
    return ctxgen::exit_code(ErrorCode::kUsage);
  } catch (const Error& e) {
    ctxgen::log().error("{}", e.what());
    return ctxgen::exit_code(e.code());
  } catch (const std::exception& e) {
    ctxgen::log().error("internal error: {}", e.what());
    return ctxgen::exit_code(ErrorCode::kInternal);
  }
}
