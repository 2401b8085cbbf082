// ctxgen command line: parse flags, call the library, map errors to documented exit codes
// (docs/cli.md).

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <utility>
#include <iostream>
#include <optional>

#include <spdlog/sinks/stdout_color_sinks.h>

#include <onnx/common/version.h>

#include "command_line.h"
#include "http_cache.h"
#include "progress.h"
#include "targets.h"
#include "ctxgen/backend.h"
#include "ctxgen/error.h"
#include "ctxgen/log.h"
#include "ctxgen/options.h"
#include "ctxgen/outputs.h"
#include "ctxgen/ref_identity.h"
#include "ctxgen/pipeline.h"
#include "ctxgen/report.h"
#ifdef CTXGEN_WITH_VERIFY
#include "ctxgen/runtime.h"
#include "ctxgen/ort_compile.h"
#include "ctxgen/verify.h"
#endif

using ctxgen::Error;
using ctxgen::ErrorCode;

namespace fs = std::filesystem;

namespace {

// --remote-cache URL, or --cache URL (an HTTP cache alone, its entries kept locally for this run).
std::unique_ptr<ctxgen::TemporaryFolder> use_remote_cache(std::string url, bool read_only, ctxgen::CompileOptions& options) {
  using ctxgen::cli::without_credentials;
  std::unique_ptr<ctxgen::TemporaryFolder> scratch;
  std::string option = "--remote-cache";
  const std::string cache = options.cache_dir.string();
  if (ctxgen::cli::looks_like_url(cache)) {
    if (!ctxgen::cli::is_http_url(cache))
      throw Error(ErrorCode::kUsage, "--cache " + without_credentials(cache) + ": give a folder or an http:// or https:// URL");
    if (!url.empty())
      throw Error(ErrorCode::kUsage, "--cache " + without_credentials(cache) + " with --remote-cache " + without_credentials(url) +
                                         ": give --cache a folder, and the URL to --remote-cache");
    url = cache;
    option = "--cache";
    options.cache_dir.clear();
  }
  if (url.empty()) return scratch;  // read-only (set once for a machine) has nothing to apply to
  auto remote = std::make_shared<ctxgen::cli::HttpCache>(url, option, read_only);
  if (options.cache_dir.empty()) {
    scratch = std::make_unique<ctxgen::TemporaryFolder>("--remote-cache");
    options.cache_dir = scratch->path();
  }
  options.remote_cache = std::move(remote);
  return scratch;
}

#ifdef CTXGEN_WITH_VERIFY
// JSON has no infinity or NaN: an SNR of an exact match, say, is null.
nlohmann::json finite_or_null(std::optional<double> v) { return v && std::isfinite(*v) ? nlohmann::json(*v) : nlohmann::json(); }

nlohmann::json statistics_json(const ctxgen::verify::Difference& d) {
  auto summary = [](const ctxgen::verify::ErrorSummary& s) {
    return nlohmann::json{{"max", finite_or_null(s.max)}, {"mean", finite_or_null(s.mean)},
                          {"median", finite_or_null(s.median)}, {"p99", finite_or_null(s.p99)}};
  };
  return {{"shape", d.dims}, {"elements", d.elements}, {"atol", finite_or_null(d.atol)},
          {"quantization_step", d.step > 0 ? nlohmann::json(d.step) : nlohmann::json()},
          {"error_rms", finite_or_null(d.error_rms)},
          {"reference_magnitude", {{"max_abs", finite_or_null(d.reference_max_abs)}, {"rms", finite_or_null(d.reference_rms)}}},
          {"abs_error", summary(d.abs)}, {"rel_error", summary(d.rel)}, {"fraction_outside", d.outside},
          {"cosine", finite_or_null(d.cosine)}, {"snr_db", finite_or_null(d.snr_db)}};
}

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
       {{"models", paths(options.models)}, {"references", paths(options.references)}, {"rtol", options.tolerance.rtol},
        {"atol", finite_or_null(options.tolerance.atol)}, {"error_stat", ctxgen::verify::error_stat_name(options.tolerance.stat)},
        {"min_cosine", finite_or_null(options.tolerance.min_cosine)}, {"min_snr_db", finite_or_null(options.tolerance.min_snr_db)},
        {"max_error_ratio", options.tolerance.max_error_ratio}, {"max_steps", options.tolerance.max_steps},
        {"reference_precision", options.reference_precision == ctxgen::verify::Precision::kFloat64 ? "float64" : "float32"},
        {"seed", options.seed}, {"input_shapes", options.input_shapes},
        {"plugin", options.plugin.empty() ? nlohmann::json() : nlohmann::json(options.plugin.string())}}}};
  if (result) {
    nlohmann::json outputs = nlohmann::json::array();
    for (const auto& o : result->outputs) {
      auto entry = statistics_json(o.difference);
      entry.update({{"model", o.model.string()}, {"output", o.output}, {"reference", o.reference},
                    {"max_abs_diff", finite_or_null(o.difference.abs.max)}, {"max_rel_diff", finite_or_null(o.difference.rel.max)},
                    {"ok", o.difference.within}, {"failed", o.difference.failed}, {"problem", o.difference.problem},
                    {"baseline", o.baseline ? statistics_json(*o.baseline) : nlohmann::json()},
                    {"error_ratio", finite_or_null(o.error_ratio)}});
      outputs.push_back(entry);
    }
    json["checks"] = result->checks;
    json["outputs"] = outputs;
  }
  if (error) json["error"] = ctxgen::error_json(*error);
  return json;
}

std::string statistics_text(const ctxgen::verify::Difference& d) {
  char text[512];
  std::snprintf(text, sizeof text,
                "abs err max %.3g mean %.3g median %.3g p99 %.3g; rel err max %.3g mean %.3g median %.3g p99 %.3g; "
                "%.3g%% outside tolerance; cosine %.9f; SNR %.1f dB",
                d.abs.max, d.abs.mean, d.abs.median, d.abs.p99, d.rel.max, d.rel.mean, d.rel.median, d.rel.p99,
                100 * d.outside, d.cosine, d.snr_db);
  return text;
}

// A line per output, then its statistics: the verdict first, the numbers that explain it below.
void print_outputs(const std::vector<ctxgen::verify::OutputCheck>& outputs) {
  for (const auto& o : outputs) {
    const auto& d = o.difference;
    std::cout << (d.within ? "ok  " : "FAIL") << "  " << o.model.string() << ": output '" << o.output << "'";
    if (!d.problem.empty()) {
      std::cout << ": " << d.problem << "\n";
      continue;
    }
    std::string shape;
    for (size_t i = 0; i < d.dims.size(); ++i) shape += (i ? "x" : "") + std::to_string(d.dims[i]);
    char magnitude[160];
    if (d.step > 0)
      std::snprintf(magnitude, sizeof magnitude, "|reference| max %.3g, rms %.3g; quantized in steps of %.3g, max error %.3g of them",
                    d.reference_max_abs, d.reference_rms, d.step, d.abs.max / d.step);
    else
      std::snprintf(magnitude, sizeof magnitude, "|reference| max %.3g, rms %.3g; atol %.3g", d.reference_max_abs,
                    d.reference_rms, d.atol);
    std::cout << " [" << shape << "] against the " << o.reference << " reference, " << magnitude << "\n";
    std::cout << "      " << statistics_text(d) << "\n";
    if (o.baseline) {
      char ratio[256];
      std::snprintf(ratio, sizeof ratio,
                    "rms error %.3g, %.3g times the rounding allowance (the original's own float32 error, at least 2^-20 "
                    "of the rms)",
                    d.error_rms, o.error_ratio.value_or(0));
      std::cout << "      " << ratio << "\n      the original in float32 on ONNX Runtime's CPU EP: "
                << statistics_text(*o.baseline) << "\n";
    }
    if (!d.within) std::cout << "      fails: " << d.failed << "\n";
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
      mismatches.push_back(o.model.string() + ": output '" + o.output + "' fails against the reference: " +
                           (o.difference.problem.empty() ? o.difference.failed : o.difference.problem));
  std::optional<Error> mismatch;
  if (!mismatches.empty()) mismatch = Error(ErrorCode::kMismatch, mismatches.front());
  if (as_json) std::cout << ctxgen::json_text(verification_json(options, &result, mismatch ? &*mismatch : nullptr), 2) << "\n";
  else
    std::cout << "verify: " << options.models.size() << " model(s), " << result.checks.size() << " check(s) passed, "
              << result.outputs.size() - mismatches.size() << " of " << result.outputs.size() << " output(s) within tolerance\n";
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
          std::cout << b->name() << "\t" << b->identity().backend << "\t" << b->identity().sdk_version << "\t"
                    << b->description() << "\n";
        return 0;
      case Command::kLink: {
        std::vector<fs::path> objects;
        for (const auto& o : ctxgen::cli::model_list(line.link_objects)) objects.push_back(o);
        ctxgen::CompileOptions options = line.given;
        std::vector<std::pair<std::string, ctxgen::LoadOptions>> group;
        if (!line.manifest_path.empty()) {
          const ctxgen::Manifest manifest = ctxgen::read_manifest(line.manifest_path);
          const auto shapes = ctxgen::resolve_shapes(manifest.models, manifest.shapes);
          for (size_t i = 0; i < manifest.models.size(); ++i) group.emplace_back(manifest.models[i].filename().string(), shapes[i]);
          if (options.output_dir.empty()) options.output_dir = manifest.options.output_dir;
          if (options.node_name_prefix.empty()) options.node_name_prefix = manifest.options.node_name_prefix;
          if (options.external_initializers_file.empty()) options.external_initializers_file = manifest.options.external_initializers_file;
          options.read_files = {line.manifest_path};
        }
        const auto summary = ctxgen::link_objects(objects, options, backends, line.manifest_path.empty() ? nullptr : &group);
        if (!line.quiet) (options.report_file == ctxgen::kStdoutReport ? std::cerr : std::cout) << ctxgen::report_text(summary);
        return 0;
      }
      case Command::kCache: {
        if (line.given.cache_dir.empty()) throw Error(ErrorCode::kUsage, "cache: give --cache DIR (or set CTXGEN_CACHE)");
        const fs::path& folder = line.given.cache_dir;
        if (ctxgen::cli::looks_like_url(folder.string()))
          throw Error(ErrorCode::kUsage, "cache " + line.cache_action + " --cache " + ctxgen::cli::without_credentials(folder.string()) +
                                             ": manages a local cache folder, not a remote cache");
        if (line.cache_action == "prune") {
          if (line.cache_max_size.empty()) throw Error(ErrorCode::kUsage, "cache prune: give --max-size SIZE");
          const uint64_t removed = ctxgen::prune_cache(folder, ctxgen::cli::parse_size(line.cache_max_size, "--max-size"));
          if (!line.quiet) std::cout << "removed " << removed << " entries\n";
        } else if (line.cache_action == "clear") {
          ctxgen::clear_cache(folder);
          if (!line.quiet) std::cout << "cleared " << folder.string() << "\n";
        }
        const ctxgen::CacheUsage usage = ctxgen::cache_usage(folder);
        if (!line.quiet)
          std::cout << folder.string() << ": " << usage.entries << " entries, " << ctxgen::human_bytes(usage.entry_bytes)
                    << "; weight hashes of " << usage.hash_files << " files, " << ctxgen::human_bytes(usage.hash_bytes) << "\n";
        return 0;
      }
      case Command::kInspect: {
        if (line.dot || line.svg) {
          const auto* backend = backends.find(line.given.backend);
          if (backend == nullptr)
            throw Error(ErrorCode::kUsage, "unknown backend '" + line.given.backend + "' (see --list-backends)");
          const std::string dot = ctxgen::inspect_dot(
              line.inspect_path, *backend, ctxgen::resolve_shapes({line.inspect_path}, line.shapes).at(0));
          std::cout << (line.svg ? ctxgen::dot_to_svg(dot) : dot);
          return 0;
        }
        const bool backend_given =
            std::find(line.given_keys.begin(), line.given_keys.end(), "backend") != line.given_keys.end();
        if (backend_given || !line.shapes.fix_dims.empty() || !line.shapes.input_shapes.empty() ||
            !line.shapes.fix_values.empty())
          throw Error(ErrorCode::kUsage, "inspect: -e, --fix-dim, --input-shape and --fix-value cut a model for --dot or --svg");
        auto inspected = ctxgen::inspect_json(line.inspect_path);
        std::cout << (line.json ? ctxgen::json_text(inspected, 2) + "\n" : ctxgen::inspect_text(inspected));
        return 0;
      }
      case Command::kVerify: {
#ifdef CTXGEN_WITH_VERIFY
        ctxgen::verify::Options options;
        options.tolerance = {line.rtol, line.atol, *ctxgen::verify::error_stat_named(line.error_stat), line.min_cosine,
                             line.min_snr, line.max_error_ratio, std::nullopt, line.max_steps};
        options.reference_precision =
            line.reference_precision == "float64" ? ctxgen::verify::Precision::kFloat64 : ctxgen::verify::Precision::kFloat32;
        options.seed = line.seed;
        options.input_shapes = ctxgen::resolve_shapes({"verify"}, {{}, line.verify_shapes, {}})[0].input_shapes;
        for (const auto& m : line.verify_models) options.models.emplace_back(m);
        for (const auto& r : line.verify_references) options.references.emplace_back(r);
        options.plugin = line.plugin;
        options.allow_empty = line.given.allow_empty;
        options.runtime = ctxgen::runtime::make_ref_runtime();  // the one backend built in
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
        const auto scratch = use_remote_cache(line.remote_cache, line.remote_read_only, options);
        ctxgen::cli::ProgressDisplay display(!line.quiet);
        options.progress = [&](const ctxgen::Progress& p) { display.show(p); };
        if (!line.object.empty()) {
          if (!line.package.empty() || !line.ep_lib.empty() || ctxgen::cli::target_levels(options.target).size() > 1)
            throw Error(ErrorCode::kUsage, "--object compiles one model for one CPU level with a built-in backend: "
                                           "--package, --ep-lib and several --target-cpu levels do not apply");
          const auto summary = ctxgen::compile_object(models.front(), options, backends, line.object);
          display.clear();
          if (!line.quiet) std::cout << ctxgen::report_text(summary);
          return 0;
        }
        if (!line.package.empty()) {
          if (!line.ep_lib.empty())
            throw Error(ErrorCode::kUsage, "--package cannot be used with --ep-lib: its variants are CPU levels of the "
                                           "built-in backend");
          auto levels = ctxgen::cli::target_levels(options.target);
          if (levels.empty()) levels.emplace_back();  // this machine's level
          ctxgen::cli::compile_package(models, options, levels, backends, line.quiet, line.package);
          display.clear();
          return 0;
        }
        if (const auto levels = ctxgen::cli::target_levels(options.target); levels.size() > 1) {
          if (!line.ep_lib.empty())
            throw Error(ErrorCode::kUsage, "--target-cpu cannot be used with --ep-lib: the library's EP compiles for the "
                                           "targets it knows, set by its --ep-option");
          ctxgen::cli::compile_levels(models, options, levels, backends, line.quiet);
          display.clear();
          return 0;
        }
        ctxgen::RunSummary summary;
        if (line.ep_lib.empty()) {
          summary = ctxgen::compile_models(models, options, backends);
        } else {
#ifdef CTXGEN_WITH_VERIFY
          ctxgen::EpTarget target{line.ep_lib, line.ep, {}, {}};
          const auto add = [](std::map<std::string, std::string>& to, const std::string& text, const std::string& option) {
            if (!to.insert(ctxgen::key_value(text, option)).second)
              throw Error(ErrorCode::kUsage, option + " '" + text + "': that key is given twice");
          };
          for (const auto& option : line.ep_options) add(target.ep_options, option, "--ep-option");
          for (const auto& entry : line.session_config) add(target.session_config, entry, "--session-config");
          summary = ctxgen::compile_with_ep(models, options, target);
#endif
        }
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
