// ctxgen command line: parse flags, call the library, map errors to documented exit codes
// (docs/cli.md).

#include <iostream>
#include <sstream>

#include <CLI/CLI.hpp>
#include <spdlog/sinks/stdout_color_sinks.h>

#include "ctxgen/backend.h"
#include "ctxgen/error.h"
#include "ctxgen/log.h"
#include "ctxgen/options.h"
#include "ctxgen/pipeline.h"
#include "ctxgen/report.h"
#ifdef CTXGEN_WITH_VERIFY
#include "ctxgen/verify.h"
#endif

namespace fs = std::filesystem;
using ctxgen::Error;
using ctxgen::ErrorCode;

namespace {

// "a.onnx,b.onnx" and separate arguments both name models. An argument that is an existing path is
// taken whole, so a path containing a comma still works.
std::vector<fs::path> model_list(const std::vector<std::string>& args) {
  std::vector<fs::path> models;
  for (const auto& arg : args) {
    if (fs::exists(arg)) {
      models.emplace_back(arg);
      continue;
    }
    std::stringstream parts(arg);
    for (std::string part; std::getline(parts, part, ',');)
      if (!part.empty()) models.emplace_back(part);
  }
  return models;
}

#ifdef CTXGEN_WITH_VERIFY
int print_verification(const ctxgen::verify::Result& result, bool as_json) {
  if (as_json) {
    nlohmann::json outputs = nlohmann::json::array();
    for (const auto& o : result.outputs)
      outputs.push_back({{"model", o.model.string()}, {"output", o.output}, {"max_abs_diff", o.difference.max_abs},
                         {"max_rel_diff", o.difference.max_rel}, {"ok", o.difference.within},
                         {"problem", o.difference.problem}});
    std::cout << ctxgen::json_text(nlohmann::json{{"checks", result.checks}, {"outputs", outputs}, {"ok", result.ok()}}, 2) << "\n";
  } else {
    for (const auto& c : result.checks) std::cout << "ok  " << c << "\n";
    for (const auto& o : result.outputs) {
      char line[128];
      std::snprintf(line, sizeof line, "max abs diff %.3g, max rel diff %.3g", o.difference.max_abs, o.difference.max_rel);
      std::cout << (o.difference.within ? "ok  " : "FAIL") << "  " << o.model.string() << ": output '" << o.output
                << "': " << (o.difference.problem.empty() ? line : o.difference.problem) << "\n";
    }
  }
  if (result.ok()) return 0;
  for (const auto& o : result.outputs)
    if (!o.difference.within)
      ctxgen::log().error("{}: output '{}' differs from the reference beyond tolerance", o.model.string(), o.output);
  return ctxgen::exit_code(ErrorCode::kMismatch);
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

int main(int argc, char** argv) {
  CLI::App app{"ctxgen: compile ONNX models into ONNX Runtime EPContext models and one context binary"};
  app.require_subcommand(0, 1);
  app.fallthrough();  // -v/-q work after the subcommand too
  int verbosity = 0;
  bool quiet = false, list_backends = false;
  app.add_flag("-v,--verbose", verbosity, "More detail (-vv for trace); -v shows why each node stays on CPU");
  app.add_flag("-q,--quiet", quiet, "Only errors");
  app.add_flag("--list-backends", list_backends, "List the backends ctxgen can compile for");
  app.set_version_flag("--version", "ctxgen 0.1.0");

  ctxgen::CompileOptions options, given;  // `given`: what the command line says, over a manifest
  std::vector<std::string> model_args;
  ctxgen::ShapeArgs shape_args;
  std::string report_path, output_file, manifest_path, stop_after;
  auto add_compile_options = [&](CLI::App* cmd) {
    cmd->add_option("-e,--backend", given.backend, "Target backend (see --list-backends)")->capture_default_str();
    cmd->add_option("--output-dir", given.output_dir, "Folder for all outputs (default: the first model's folder)");
    cmd->add_option("--node-name-prefix", given.node_name_prefix, "Prefix for EPContext node, partition and graph names");
    cmd->add_option("--external-initializers-file", given.external_initializers_file,
                    "Write the weights CPU nodes need to this file beside the outputs instead of embedding them");
    cmd->add_flag("--force", given.force, "Overwrite existing outputs");
    cmd->add_flag("--allow-empty", given.allow_empty, "Write a model even when none of its nodes compiled");
    cmd->add_option("--fix-dim", shape_args.fix_dims,
                    "Freeze a symbolic dimension: [MODEL:]NAME=VALUE, MODEL a file stem (repeatable)");
    cmd->add_option("--input-shape", shape_args.input_shapes,
                    "Fix an input's shape: [MODEL:]INPUT=1x3x224x224, MODEL a file stem (repeatable)");
    cmd->add_option("--fix-value", shape_args.fix_values,
                    "Replace an input by a constant: [MODEL:]INPUT=V[,V...], MODEL a file stem (repeatable)");
    cmd->add_option("--report", report_path, "Write a JSON report of the run to this file");
    cmd->add_option("--stop-after", stop_after,
                    "Write <stem>_<PHASE>.onnx, the model after that phase, instead of compiling: load, specialise "
                    "or partition")
        ->check(CLI::IsMember({"load", "specialise", "partition"}));
  };
  auto* compile = app.add_subcommand("compile", "Compile one model: <stem>_ctx.onnx + <stem>_<backend>.bin");
  compile->add_option("model", model_args, "The ONNX model")->required()->expected(1);
  compile->add_option("-o,--output", output_file, "Path of the EPContext model (default <stem>_ctx.onnx)");
  compile->add_flag("--embed", given.embed, "Put the context binary inside the model (embed_mode=1)");
  add_compile_options(compile);
  auto* share = app.add_subcommand("share", "Compile N models that share weights: N _ctx.onnx + one .bin");
  share->add_option("models", model_args, "Models, as a comma-separated list and/or separate arguments");
  share->add_option("--manifest", manifest_path, "A JSON file describing the models, their shapes and the options");
  add_compile_options(share);
  std::string inspect_path;
  bool inspect_as_json = false;
  auto* inspect = app.add_subcommand("inspect", "Show what a _ctx.onnx or a context binary holds");
  inspect->add_option("file", inspect_path, "A _ctx.onnx model or a .bin context binary")->required();
  inspect->add_flag("--json", inspect_as_json, "Print JSON");

#ifdef CTXGEN_WITH_VERIFY
  ctxgen::verify::Options verify_options;
  std::vector<std::string> verify_models, verify_references, verify_shapes;
  std::string plugin;
  bool verify_as_json = false;
  auto* verify = app.add_subcommand("verify", "Check compiled models: integrity, and outputs against the originals in ONNX Runtime");
  verify->add_option("models", verify_models, "Compiled models (_ctx.onnx)")->required();
  verify->add_option("--reference", verify_references, "The original model of each compiled model, in the same order");
  verify->add_option("--rtol", verify_options.rtol, "Relative tolerance")->capture_default_str();
  verify->add_option("--atol", verify_options.atol, "Absolute tolerance")->capture_default_str();
  verify->add_option("--seed", verify_options.seed, "Seed of the random inputs")->capture_default_str();
  verify->add_option("--input-shape", verify_shapes, "Shape for a dynamic input: INPUT=1x128 (repeatable)");
  verify->add_option("--plugin", plugin, "The ctxgen plugin EP library (default: the one built with ctxgen)");
  verify->add_flag("--json", verify_as_json, "Print JSON");
#endif

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int code = app.exit(e);
    return code == 0 ? 0 : ctxgen::exit_code(ErrorCode::kUsage);
  }
  setup_logging(verbosity, quiet);

  try {
    ctxgen::BackendRegistry backends = ctxgen::builtin_backends();
    if (list_backends) {
      for (const auto* b : backends.list())
        std::cout << b->name() << "\t" << b->ep_name() << "\t" << b->sdk_version() << "\t" << b->description() << "\n";
      return 0;
    }
    if (*inspect) {
      auto inspected = ctxgen::inspect_json(inspect_path);
      std::cout << (inspect_as_json ? ctxgen::json_text(inspected, 2) + "\n" : ctxgen::inspect_text(inspected));
      return 0;
    }
#ifdef CTXGEN_WITH_VERIFY
    if (*verify) {
      verify_options.input_shapes = ctxgen::resolve_shapes({"verify"}, {{}, verify_shapes, {}})[0].input_shapes;
      for (const auto& m : verify_models) verify_options.models.emplace_back(m);
      for (const auto& r : verify_references) verify_options.references.emplace_back(r);
      verify_options.plugin = plugin;
      return print_verification(ctxgen::verify::run(verify_options), verify_as_json);
    }
#endif
    if (!*compile && !*share) {
      std::cout << app.help();
      return ctxgen::exit_code(ErrorCode::kUsage);
    }
    std::vector<fs::path> models;
    ctxgen::ShapeArgs manifest_shapes;
    if (!manifest_path.empty()) {
      ctxgen::Manifest manifest = ctxgen::read_manifest(manifest_path);
      models = manifest.models;
      options = manifest.options;
      manifest_shapes = manifest.shapes;
    }
    for (const auto& m : model_list(model_args)) models.push_back(m);
    if (models.empty()) throw Error(ErrorCode::kUsage, "share: give the models, or --manifest FILE");
    auto* cmd = *compile ? compile : share;
    if (cmd->count("--backend") || manifest_path.empty()) options.backend = given.backend;
    if (cmd->count("--output-dir")) options.output_dir = given.output_dir;
    if (cmd->count("--node-name-prefix")) options.node_name_prefix = given.node_name_prefix;
    if (cmd->count("--external-initializers-file")) options.external_initializers_file = given.external_initializers_file;
    options.embed = options.embed || given.embed;
    options.force = given.force;
    options.allow_empty = given.allow_empty;
    options.output_file = output_file;
    if (!stop_after.empty()) options.stop_after = ctxgen::parse_phase(stop_after);
    // Command-line shape options override the manifest's, name by name.
    options.report_file = report_path;
    options.per_model = ctxgen::resolve_shapes(models, manifest_shapes);
    ctxgen::override_with(options.per_model, ctxgen::resolve_shapes(models, shape_args));
    auto summary = ctxgen::compile_models(models, options, backends);
    if (!quiet) std::cout << ctxgen::report_text(summary);
    return 0;
  } catch (const Error& e) {
    ctxgen::log().error("{}", e.what());
    return ctxgen::exit_code(e.code());
  } catch (const std::exception& e) {
    ctxgen::log().error("internal error: {}", e.what());
    return ctxgen::exit_code(ErrorCode::kInternal);
  }
}
