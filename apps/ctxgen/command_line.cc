#include "command_line.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <map>
#include <sstream>

#include <CLI/CLI.hpp>

#include "ctxgen/error.h"

namespace fs = std::filesystem;

namespace ctxgen::cli {

namespace {

// A finite number that `ok` accepts, `what` saying which, in one line when it is not.
CLI::Validator number(const std::string& what, bool (*ok)(double)) {
  return CLI::Validator(
      [=](std::string& text) {
        char* end = nullptr;
        const double v = std::strtod(text.c_str(), &end);
        const bool valid = end != text.c_str() && *end == '\0' && std::isfinite(v) && ok(v);
        return valid ? std::string() : "must be a number " + what;
      },
      what);
}

// A path written out: an empty one would mean "not given" to what reads the option, which
// writes its outputs elsewhere than asked.
const CLI::Validator kPath(
    [](std::string& text) { return text.empty() ? std::string("must be a path, not an empty string") : std::string(); }, "PATH");

}  // namespace

namespace {

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

// " (did you mean 'X'?)" for the known word within two edits of `word`, else "".
std::string did_you_mean(const std::string& word, const std::vector<std::string>& known) {
  std::string best;
  size_t distance = 3;
  for (const auto& k : known)
    if (const size_t d = edit_distance(word, k); d < distance) distance = d, best = k;
  return best.empty() ? "" : " (did you mean '" + best + "'?)";
}

// What a failed parse tripped on when it is a word ctxgen does not know: the command (argv[1]), or
// an option of it. "" when every word is known (the values were wrong instead).
std::string mistyped_word(CLI::App& app, int argc, const char* const* argv) {
  if (argc < 2 || argv[1][0] == '-') return "";
  std::vector<std::string> commands;
  for (const CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) commands.push_back(sub->get_name());
  const std::string command = argv[1];
  if (std::find(commands.begin(), commands.end(), command) == commands.end())
    return "no command '" + command + "'" + did_you_mean(command, commands);
  const CLI::App* sub = app.get_subcommand(command);
  std::vector<std::string> options;  // the command's and those of ctxgen itself
  for (const CLI::App* scope : {static_cast<const CLI::App*>(&app), sub})
    for (const CLI::Option* option : scope->get_options())
      for (const auto& name : option->get_lnames()) options.push_back("--" + name);
  for (int i = 2; i < argc; ++i) {
    const std::string word = argv[i];
    if (word.rfind("--", 0) != 0 || word == "--") continue;
    const std::string name = word.substr(0, word.find('='));
    if (std::find(options.begin(), options.end(), name) == options.end())
      return "no option '" + name + "' for " + command + did_you_mean(name, options);
  }
  return "";
}

}  // namespace

Parsed parse(int argc, const char* const* argv, bool with_verify, const std::string& version) {
  CLI::App app{"ctxgen: compile ONNX models into ONNX Runtime EPContext models and one context binary", "ctxgen"};
  app.require_subcommand(0, 1);
  app.fallthrough();  // -v/-q work after the subcommand too
  CommandLine line;
  bool list_backends = false;
  app.add_flag("-v,--verbose", line.verbosity, "More detail (-vv for trace); -v shows why each node stays on CPU");
  app.add_flag("-q,--quiet", line.quiet, "Only errors");
  app.add_flag("--list-backends", list_backends, "List the backends ctxgen can compile for");
  app.set_version_flag("-V,--version", version);

  CompileOptions& given = line.given;
  auto add_compile_options = [&](CLI::App* cmd) {
    cmd->add_option("-e,--backend", given.backend, "Target backend (see --list-backends)")->capture_default_str();
    cmd->add_option("--output-dir", given.output_dir, "Folder for all outputs (default: the first model's folder)")->check(kPath);
    cmd->add_option("--target-cpu", given.target,
                    "Compile for this CPU level (oneDNN's names: avx2, avx512_core, ...; default: this machine's)");
    cmd->add_option("--package", line.package,
                    "Write an ONNX Runtime model package into this folder: one variant per --target-cpu level")
        ->check([](const std::string& folder) { return folder.empty() ? std::string("names no folder") : std::string(); });
    cmd->add_option("--node-name-prefix", given.node_name_prefix, "Prefix for EPContext node, partition and graph names");
    cmd->add_option("--external-initializers-file", given.external_initializers_file,
                    "Write the weights CPU nodes need to this file beside the outputs instead of embedding them");
    cmd->add_flag("--weightless", given.weightless,
                  "Leave the weights the models store in external data there: the binary refers to them by offset and hash");
    cmd->add_flag("--force", given.force, "Overwrite existing outputs");
    cmd->add_flag("--allow-empty", given.allow_empty, "Write a model even when none of its nodes compiled");
    cmd->add_option("--fix-dim", line.shapes.fix_dims,
                    "Freeze a symbolic dimension: [MODEL:]NAME=VALUE, MODEL a file stem (repeatable)");
    cmd->add_option("--input-shape", line.shapes.input_shapes,
                    "Fix an input's shape: [MODEL:]INPUT=1x3x224x224, MODEL a file stem (repeatable)");
    cmd->add_option("--fix-value", line.shapes.fix_values,
                    "Replace an input by a constant: [MODEL:]INPUT=V[,V...], MODEL a file stem (repeatable)");
    cmd->add_option("--report", given.report_file, "Write a JSON report of the run to this file");
    cmd->add_option("--cache", given.cache_dir,
                    "Keep each partition's compile result in this folder (or an http(s):// cache) and reuse it in later "
                    "runs (default: $CTXGEN_CACHE)")
        ->envname("CTXGEN_CACHE");
    cmd->add_option("--cache-max-size", line.cache_max_size,
                    "With --cache: after the run, remove the least recently used entries until the rest fit in SIZE "
                    "(10G, 512M; default: $CTXGEN_CACHE_MAX_SIZE, else no bound)")
        ->envname("CTXGEN_CACHE_MAX_SIZE");
    cmd->add_option("--remote-cache", line.remote_cache,
                    "With --cache DIR: fetch the entries DIR lacks from this http(s):// cache and store new ones there "
                    "(default: $CTXGEN_REMOTE_CACHE)")
        ->envname("CTXGEN_REMOTE_CACHE");
    cmd->add_flag("--remote-cache-read-only", line.remote_read_only,
                  "Only fetch from the remote cache, never store in it: a developer machine reading what CI writes "
                  "(default: $CTXGEN_REMOTE_CACHE_READ_ONLY)")
        ->envname("CTXGEN_REMOTE_CACHE_READ_ONLY");
    if (with_verify) {
      cmd->add_option("--ep-lib", line.ep_lib, "Compile with an ONNX Runtime plugin EP library, through ORT's Compile API");
      cmd->add_option("--ep", line.ep, "With --ep-lib: the EP of the library to compile with");
      cmd->add_option("--ep-option", line.ep_options, "With --ep-lib: a provider option KEY=VALUE (repeatable)");
      cmd->add_option("--session-config", line.session_config,
                      "With --ep-lib: a session config entry KEY=VALUE (repeatable)");
    }
    cmd->add_option("--stop-after", line.stop_after,
                    "Write <stem>_<PHASE>.onnx, the model after that phase, instead of compiling: load, specialise "
                    "or partition")
        ->check(CLI::IsMember({"load", "specialise", "partition"}));
  };
  auto* compile = app.add_subcommand("compile", "Compile one model: <stem>_ctx.onnx + <stem>_<backend>.bin");
  compile->add_option("model", line.model_args, "The ONNX model")->required()->expected(1);
  compile->add_option("-o,--output", given.output_file, "Path of the EPContext model (default <stem>_ctx.onnx)")->check(kPath);
  compile->add_flag("--embed", given.embed, "Put the context binary inside the model (embed_mode=1)");
  compile->add_option("--object", line.object,
                      "Write an object for `ctxgen link` instead: the model, its weights' files and its compile results")
      ->check(kPath);
  compile->add_option("--manifest", line.manifest_path,
                      "With --object: the share manifest the model belongs to, which gives its shape options");
  add_compile_options(compile);
  auto* share = app.add_subcommand("share", "Compile N models that share weights: N _ctx.onnx + one .bin");
  share->add_option("models", line.model_args, "Models, as a comma-separated list and/or separate arguments");
  share->add_option("--manifest", line.manifest_path, "A JSON file describing the models, their shapes and the options");
  add_compile_options(share);
  auto* inspect = app.add_subcommand("inspect", "Show what a _ctx.onnx or a context binary holds");
  inspect->add_option("file", line.inspect_path, "A _ctx.onnx model or a .bin context binary; with --dot/--svg any model")
      ->required();
  auto* json = inspect->add_flag("--json", line.json, "Print JSON");
  auto* dot = inspect->add_flag("--dot", line.dot,
                                "Draw the partitioning in Graphviz's DOT language: each partition a coloured cluster, each "
                                "CPU node with its reason (a model not compiled yet is cut as compile would cut it)");
  auto* svg = inspect->add_flag("--svg", line.svg, "The same drawing as SVG, through Graphviz's dot");
  json->excludes(dot)->excludes(svg);
  dot->excludes(svg);
  inspect->add_option("-e,--backend", given.backend, "With --dot/--svg: the backend to cut for")->capture_default_str();
  inspect->add_option("--fix-dim", line.shapes.fix_dims, "With --dot/--svg: as for compile (repeatable)");
  inspect->add_option("--input-shape", line.shapes.input_shapes, "With --dot/--svg: as for compile (repeatable)");
  inspect->add_option("--fix-value", line.shapes.fix_values, "With --dot/--svg: as for compile (repeatable)");

  CLI::App* verify = nullptr;
  if (with_verify) {
    verify = app.add_subcommand("verify", "Check compiled models: integrity, and outputs against the originals in ONNX Runtime");
    verify->add_option("models", line.verify_models, "Compiled models (_ctx.onnx)")->required();
    verify->add_option("--reference", line.verify_references, "The original model of each compiled model, in the same order");
    verify->add_option("--rtol", line.rtol, "Relative tolerance")->check(number(">= 0", [](double v) { return v >= 0; }))->capture_default_str();
    verify->add_option("--atol", line.atol, "Absolute tolerance (default: rtol times each output's largest |expected|)")
        ->check(number(">= 0", [](double v) { return v >= 0; }));
    verify->add_option("--error-stat", line.error_stat, "What the tolerance applies to: every element, or the max, mean, median or p99 of the errors")
        ->check(CLI::IsMember({"elementwise", "max", "mean", "median", "p99"}))
        ->capture_default_str();
    verify->add_option("--min-cosine", line.min_cosine, "Also require this cosine similarity per output (e.g. 0.9999)")
        ->check(number("in [-1, 1]", [](double v) { return v >= -1 && v <= 1; }));
    verify->add_option("--min-snr", line.min_snr, "Also require this signal-to-noise ratio per output, in dB")
        ->check(number("(dB)", [](double) { return true; }));
    verify->add_option("--reference-precision", line.reference_precision,
                       "Run the original in float32, or in float64 where ONNX Runtime can (and measure its float32 error)")
        ->check(CLI::IsMember({"float32", "float64"}))
        ->capture_default_str();
    verify->add_option("--max-error-ratio", line.max_error_ratio,
                       "With a float64 reference: the most an output's rms error may be, as a multiple of the original's own float32 error")
        ->check(number("> 0", [](double v) { return v > 0; }))
        ->capture_default_str();
    verify->add_option("--max-steps", line.max_steps,
                       "How many quantization steps a quantized output (of a DequantizeLinear or QuantizeLinear) may be off")
        ->check(number(">= 0", [](double v) { return v >= 0; }))
        ->capture_default_str();
    verify->add_option("--seed", line.seed, "Seed of the random inputs")->capture_default_str();
    verify->add_option("--input-shape", line.verify_shapes, "Shape for a dynamic input: INPUT=1x128 (repeatable)");
    verify->add_option("--plugin", line.plugin, "The ctxgen plugin EP library (default: the one built with ctxgen)");
    verify->add_flag("--json", line.json, "Print JSON");
    verify->add_flag("--allow-empty", line.given.allow_empty, "Pass a model in which nothing is compiled (written with compile --allow-empty)");
  }

  auto* link = app.add_subcommand("link", "Link objects (compile --object) into what share writes for their models");
  link->add_option("objects", line.link_objects, "Objects (.ctxo)")->required();
  link->add_option("--output-dir", given.output_dir, "Folder for all outputs (default: the manifest's output_dir)")->check(kPath);
  link->add_option("--node-name-prefix", given.node_name_prefix, "Prefix for EPContext node, partition and graph names");
  link->add_option("--external-initializers-file", given.external_initializers_file,
                   "Write the weights CPU nodes need to this file beside the outputs instead of embedding them");
  link->add_option("--report", given.report_file, "Write a JSON report of the run to this file");
  link->add_flag("--force", given.force, "Overwrite existing outputs");
  link->add_flag("--allow-empty", given.allow_empty, "Write a model even when none of its nodes compiled");
  link->add_option("--manifest", line.manifest_path,
                   "The share manifest of the objects' models: their order, shape options and output options");
  auto* cache = app.add_subcommand("cache", "Show, prune or clear a compile cache folder (--cache)");
  cache->add_option("action", line.cache_action, "stats, prune or clear")
      ->required()
      ->check(CLI::IsMember({"stats", "prune", "clear"}));
  cache->add_option("--cache", line.given.cache_dir, "The cache folder (default: $CTXGEN_CACHE)")->envname("CTXGEN_CACHE");
  cache->add_option("--max-size", line.cache_max_size, "prune: remove the least recently used entries until the rest fit (10G, 512M)");

  std::string help_topic;
  auto* help = app.add_subcommand("help", "Show the help of a command: ctxgen help compile");
  help->add_option("command", help_topic, "compile, share, inspect, cache" + std::string(with_verify ? " or verify" : ""));

  // Taken before parsing: once a command is parsed, CLI11's help() shows that command's.
  line.help = app.help();
  Parsed parsed;
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    std::ostringstream out, err;
    const int code = app.exit(e, out, err);
    parsed.exit_code = code == 0 ? 0 : exit_code(ErrorCode::kUsage);
    parsed.out = out.str();
    if (code != 0) {
      // One line, like every other error, naming where to read more; a mistyped command or option
      // named with the one meant (CLI11 would say "arguments were not expected" or miscount them).
      const CLI::App* at = app.get_subcommands().empty() ? &app : app.get_subcommands().front();
      const std::string mistyped = mistyped_word(app, argc, argv);
      parsed.err = "error: " + (mistyped.empty() ? std::string(e.what()) : mistyped) + " (see 'ctxgen help" +
                   (at == &app ? std::string() : " " + at->get_name()) + "')\n";
    }
    return parsed;
  }
  if (*help) {
    if (help_topic.empty()) {
      parsed.out = line.help;
      return parsed;
    }
    try {
      parsed.out = app.get_subcommand(help_topic)->help("ctxgen");
    } catch (const CLI::OptionNotFound&) {
      parsed.exit_code = exit_code(ErrorCode::kUsage);
      parsed.err = "error: help: no command '" + help_topic + "' (see 'ctxgen help')\n";
    }
    return parsed;
  }
  const CLI::App* cmd = *compile ? compile : share;
  line.command = list_backends           ? Command::kListBackends
                 : *compile              ? Command::kCompile
                 : *share                ? Command::kShare
                 : *inspect              ? Command::kInspect
                 : *cache                ? Command::kCache
                 : *link                 ? Command::kLink
                 : verify && *verify     ? Command::kVerify
                                         : Command::kNone;
  for (const char* key : {"backend", "target-cpu", "output-dir", "node-name-prefix", "external-initializers-file"}) {
    if (cmd->count(std::string("--") + key) > 0) line.given_keys.emplace_back(key);
  }
  if (*inspect && inspect->count("--backend") > 0) line.given_keys.emplace_back("backend");
  // The EP of another library compiles instead of a built-in backend, and only with its library.
  const bool compiling = *compile || *share;
  if (compiling && line.ep_lib.empty() &&
      (!line.ep.empty() || !line.ep_options.empty() || !line.session_config.empty())) {
    parsed.exit_code = exit_code(ErrorCode::kUsage);
    parsed.err = "error: --ep, --ep-option and --session-config need --ep-lib LIB (see 'ctxgen help " + cmd->get_name() + "')\n";
    return parsed;
  }
  if (compiling && !line.ep_lib.empty() && (!line.given.cache_dir.empty() || !line.remote_cache.empty())) {
    // Asked for on the command line it is an error; CTXGEN_CACHE, set for every run of a CI
    // machine, does not apply.
    if (std::any_of(argv + 1, argv + argc, [](const char* a) {
          return std::string(a).rfind("--cache", 0) == 0 || std::string(a).rfind("--remote-cache", 0) == 0;
        })) {
      parsed.exit_code = exit_code(ErrorCode::kUsage);
      parsed.err = "error: --cache keeps what a built-in backend compiles; with --ep-lib the library's EP compiles (see "
                   "'ctxgen help " + cmd->get_name() + "')\n";
      return parsed;
    }
    line.given.cache_dir.clear();
    line.remote_cache.clear();
  }
  if (compiling && !line.ep_lib.empty() && cmd->count("--backend") > 0) {
    parsed.exit_code = exit_code(ErrorCode::kUsage);
    parsed.err = "error: -e names a built-in backend; with --ep-lib the library's EP (--ep) compiles (see 'ctxgen help " +
                 cmd->get_name() + "')\n";
    return parsed;
  }
  // A ratio to the float32 baseline only exists with a float64 reference: alone it would do nothing.
  if (verify && *verify && verify->count("--max-error-ratio") > 0 && line.reference_precision != "float64") {
    parsed.exit_code = exit_code(ErrorCode::kUsage);
    parsed.err = "error: --max-error-ratio needs --reference-precision float64 (see 'ctxgen help verify')\n";
    return parsed;
  }
  parsed.line = std::move(line);
  return parsed;
}

std::vector<fs::path> model_list(const std::vector<std::string>& args) {
  std::vector<fs::path> models;
  for (const auto& arg : args) {
    std::error_code ec;  // a list longer than a file name can be is not a file, not an error
    if (fs::exists(arg, ec)) {
      models.emplace_back(arg);
      continue;
    }
    std::stringstream parts(arg);
    for (std::string part; std::getline(parts, part, ',');)
      if (!part.empty()) models.emplace_back(part);
  }
  return models;
}

uint64_t parse_size(const std::string& text, const std::string& option) {
  size_t digits = 0;
  while (digits < text.size() && std::isdigit(static_cast<unsigned char>(text[digits]))) ++digits;
  std::string unit = text.substr(digits);
  for (const char* suffix : {"iB", "B"})
    if (unit.size() > std::strlen(suffix) && unit.compare(unit.size() - std::strlen(suffix), std::string::npos, suffix) == 0)
      unit.resize(unit.size() - std::strlen(suffix));
  static const std::map<std::string, int> kShifts = {{"", 0}, {"K", 10}, {"M", 20}, {"G", 30}, {"T", 40}};
  const auto shift = kShifts.find(unit);
  if (digits == 0 || digits > 15 || shift == kShifts.end() || std::stoull(text.substr(0, digits)) > (UINT64_MAX >> shift->second))
    throw Error(ErrorCode::kUsage, option + " '" + text + "': give a size such as 10G, 512M or a number of bytes");
  return std::stoull(text.substr(0, digits)) << shift->second;
}

std::vector<fs::path> compile_options(const CommandLine& line, const Manifest* manifest, CompileOptions& options) {
  std::vector<fs::path> models;
  ShapeArgs manifest_shapes;
  if (manifest != nullptr && !line.object.empty()) {
    // compile MODEL --object --manifest: one model of the group, with the group's options for it.
    const auto mine = model_list(line.model_args);
    if (mine.size() != 1) throw Error(ErrorCode::kUsage, "--object: give one model");
    size_t index = manifest->models.size();
    for (size_t i = 0; i < manifest->models.size(); ++i)
      if (manifest->models[i].filename() == mine.front().filename()) index = i;
    if (index == manifest->models.size())
      throw Error(ErrorCode::kUsage, mine.front().string() + " is none of the models of " + line.manifest_path);
    CommandLine alone = line;
    alone.manifest_path.clear();
    compile_options(alone, nullptr, options);
    const auto given = [&](const char* key) {
      return std::find(line.given_keys.begin(), line.given_keys.end(), key) != line.given_keys.end();
    };
    if (!given("backend")) options.backend = manifest->options.backend;
    if (!given("target-cpu")) options.target = manifest->options.target;
    options.weightless = options.weightless || manifest->options.weightless;
    options.per_model = {resolve_shapes(manifest->models, manifest->shapes)[index]};
    override_with(options.per_model, resolve_shapes(mine, line.shapes));
    options.read_files = {line.manifest_path};
    return mine;
  }
  if (manifest != nullptr && line.command == Command::kCompile)
    throw Error(ErrorCode::kUsage, "compile takes --manifest with --object (share takes a manifest)");
  if (manifest != nullptr) {
    models = manifest->models;
    options = manifest->options;
    manifest_shapes = manifest->shapes;
  }
  for (const auto& m : model_list(line.model_args)) models.push_back(m);
  if (models.empty()) throw Error(ErrorCode::kUsage, "share: give the models, or --manifest FILE");
  const auto given = [&](const char* key) {
    return std::find(line.given_keys.begin(), line.given_keys.end(), key) != line.given_keys.end();
  };
  if (given("backend") || manifest == nullptr) options.backend = line.given.backend;
  if (given("target-cpu")) options.target = line.given.target;
  if (given("output-dir")) options.output_dir = line.given.output_dir;
  if (given("node-name-prefix")) options.node_name_prefix = line.given.node_name_prefix;
  if (given("external-initializers-file")) options.external_initializers_file = line.given.external_initializers_file;
  options.embed = options.embed || line.given.embed;
  options.weightless = options.weightless || line.given.weightless;
  options.force = line.given.force;
  options.allow_empty = line.given.allow_empty;
  options.output_file = line.given.output_file;
  options.report_file = line.given.report_file;
  options.cache_dir = line.given.cache_dir;
  if (!line.cache_max_size.empty()) {
    if (options.cache_dir.empty()) throw Error(ErrorCode::kUsage, "--cache-max-size bounds a cache: give --cache DIR");
    options.cache_max_size = parse_size(line.cache_max_size, "--cache-max-size");
  }
  if (manifest != nullptr) options.read_files = {line.manifest_path};
  if (!line.stop_after.empty()) options.stop_after = parse_phase(line.stop_after);
  // Command-line shape options override the manifest's, name by name.
  options.per_model = resolve_shapes(models, manifest_shapes);
  override_with(options.per_model, resolve_shapes(models, line.shapes));
  return models;
}

}  // namespace ctxgen::cli
