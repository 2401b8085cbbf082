#include "ctxgen/ort_compile.h"

#include <unistd.h>

#include <onnxruntime_cxx_api.h>

#include <algorithm>
#include <chrono>
#include <set>

#include "ctxgen/error.h"
#include "ctxgen/format.h"
#include "ctxgen/library.h"
#include "ctxgen/log.h"
#include "ctxgen/model.h"
#include "ctxgen/ort_telemetry.h"
#include "ctxgen/outputs.h"
#include "ctxgen/report.h"

namespace fs = std::filesystem;

namespace ctxgen {
namespace {

constexpr const char* kRegistration = "ctxgen_ep_lib";
constexpr size_t kMaxOrtConfigValue = 1024;  // ConfigOptions::kMaxValueLength

void check_options(const std::vector<fs::path>& inputs, const CompileOptions& options, const EpTarget& target) {
  if (inputs.empty()) throw Error(ErrorCode::kUsage, "no input model given");
  if (target.ep.empty()) throw Error(ErrorCode::kUsage, "--ep-lib needs --ep NAME: the EP of the library to compile with");
  const auto refuse = [](bool given, const std::string& what, const std::string& why) {
    if (given) throw Error(ErrorCode::kUsage, what + " cannot be used with --ep-lib: " + why);
  };
  refuse(options.stop_after.has_value(), "--stop-after", "ONNX Runtime compiles the model in one step");
  refuse(!options.target.empty(), "--target-cpu", "the library's EP compiles for the targets it knows, set by its --ep-option");
  refuse(!options.external_initializers_file.empty(), "--external-initializers-file",
         "ONNX Runtime decides where the initializers of the models it writes go");
  refuse(options.weightless, "--weightless", "ctxgen writes weightless binaries with its own backends only");
  for (size_t m = 0; m < options.per_model.size(); ++m) {
    const LoadOptions& load = options.per_model[m];
    refuse(!load.input_shapes.empty(), "--input-shape", "ONNX Runtime fixes dims by name only; use --fix-dim");
    refuse(!load.fix_values.empty(), "--fix-value", "ONNX Runtime cannot turn an input into a constant");
    if (load.fix_dims.empty() || m >= inputs.size()) continue;
    // ORT ignores an override no input has: a typo would pass silently.
    std::set<std::string> named;
    const ParsedModel parsed = parse_model(inputs[m]);
    for (const auto& input : parsed.proto->graph().input())
      for (const auto& dim : input.type().tensor_type().shape().dim()) named.insert(dim.dim_param());
    named.erase("");
    std::string list;
    for (const auto& n : named) list += (list.empty() ? "" : ", ") + n;
    for (const auto& [name, value] : load.fix_dims)
      if (!named.count(name))
        throw Error(ErrorCode::kUsage, inputs[m].string() + ": --fix-dim " + name + ": no dimension of that name in the model's inputs" +
                                           (named.empty() ? " (they have no named dims)" : " (their named dims: " + list + ")"));
  }
  // What ctxgen sets itself, from its own options, would be overwritten without a word.
  const std::map<std::string, std::string> reserved = {
      {"ep.context_enable", "it is what compiling means"},
      {"session.compile_only", "it is what compiling means"},
      {"ep.context_file_path", "give -o or --output-dir"},
      {"ep.context_embed_mode", "give --embed"},
      {"ep.context_node_name_prefix", "give --node-name-prefix"},
      {"ep.share_ep_contexts", "share sets it for a group"},
      {"ep.stop_share_ep_contexts", "share sets it on the group's last model"}};
  for (const auto& [key, value] : target.session_config)
    if (auto it = reserved.find(key); it != reserved.end())
      throw Error(ErrorCode::kUsage, "--session-config " + key + ": ctxgen sets it (" + it->second + ")");
  if (inputs.size() > 1 && options.embed)
    throw Error(ErrorCode::kUsage, "--embed cannot be combined with several models: embedded contexts cannot share one binary");
  if (inputs.size() > 1 && !options.output_file.empty())
    throw Error(ErrorCode::kUsage, "-o names one output model; with several models use --output-dir");
  if (!options.output_file.empty() && !options.output_dir.empty())
    throw Error(ErrorCode::kUsage, "give -o or --output-dir, not both: -o already says where the outputs go");
}

// An ORT failure as ctxgen reports failures: what went wrong, with the exit code that says so.
Error ort_error(const Ort::Exception& e, const fs::path& model, const EpTarget& target, bool allow_empty) {
  const std::string what = e.what();
  const std::string where = model.string() + ": ONNX Runtime with " + target.ep + ": ";
  if (what.find("Unable to compile any nodes") != std::string::npos)
    return Error(ErrorCode::kNothingCompiled, where + what + (allow_empty ? "" : "; pass --allow-empty to write the model anyway"));
  switch (e.GetOrtErrorCode()) {
    case ORT_NO_SUCHFILE:
    case ORT_INVALID_PROTOBUF:
    case ORT_INVALID_GRAPH:
    case ORT_NOT_IMPLEMENTED:
      return Error(ErrorCode::kInvalidModel, where + what);
    case ORT_INVALID_ARGUMENT:
      return Error(ErrorCode::kUsage, where + what);
    default:
      return Error(ErrorCode::kRuntime, where + what);
  }
}

std::string attribute(const onnx::NodeProto& node, const std::string& name) {
  for (const auto& a : node.attribute())
    if (a.name() == name) return a.s();
  return {};
}

// What a compiled model says of itself: its EPContext nodes are the partitions, the other nodes
// stayed with ORT's other EPs.
ModelSummary summarize(const fs::path& input, const fs::path& output, const fs::path& staged, const EpTarget& target) {
  ModelSummary s;
  s.input = input;
  s.output = output;
  s.input_nodes = s.node_count = static_cast<size_t>(parse_model(input).proto->graph().node_size());
  const ParsedModel compiled = parse_model(staged);
  size_t kept = 0;
  for (int i = 0; i < compiled.proto->graph().node_size(); ++i) {
    const auto& node = compiled.proto->graph().node(i);
    if (node.op_type() == "EPContext" && attribute(node, "source") == target.ep) {
      const std::string graph = attribute(node, "partition_name");
      s.partitions.push_back({graph.empty() ? node.name() : graph, 0, static_cast<size_t>(node.input_size()),
                              static_cast<size_t>(node.output_size()), 0, 0});
    } else {
      ++kept;
      s.cpu_nodes.push_back({node_label(node, static_cast<size_t>(i)), node.op_type(), "not taken by " + target.ep});
    }
  }
  s.compiled_nodes = s.input_nodes > kept ? s.input_nodes - kept : 0;
  return s;
}

// The weights of a binary in ctxgen's format (any ctxgen backend's EP writes one): each graph's
// are seen, each entry of the table is unique. Another EP's binary is not read.
void count_weights(const fs::path& file, RunSummary& summary) {
  std::shared_ptr<const ContextBinary> binary;
  try {
    binary = ContextBinary::open(file);
  } catch (const Error&) {
    return;
  }
  auto& w = summary.weights;
  for (const auto& graph : binary->graphs())
    for (uint32_t id : graph.weight_ids) {
      ++w.tensors_seen;
      w.bytes_seen += binary->weights().at(id).size;
    }
  w.tensors_unique += binary->weights().size();
  for (const auto& weight : binary->weights()) w.bytes_unique += weight.size;
  summary.weights_known = true;
}

void run(const std::vector<fs::path>& inputs, const CompileOptions& options, const EpTarget& target,
         RunSummary& summary, bool& outputs_checked) {
  const auto started = std::chrono::steady_clock::now();
  check_options(inputs, options, target);
  const fs::path library = checked_library(target.library, "--ep-lib", ErrorCode::kUsage);
  summary.backend = target.ep;
  const fs::path folder = !options.output_file.empty() ? options.output_file.parent_path()
                          : !options.output_dir.empty() ? options.output_dir
                                                        : inputs.front().parent_path();
  std::vector<fs::path> planned;
  for (const auto& in : inputs)
    planned.push_back(!options.output_file.empty() ? options.output_file : folder / (file_stem(in) + "_ctx.onnx"));
  std::vector<fs::path> checked = planned;
  if (!options.report_file.empty() && options.report_file != kStdoutReport) checked.push_back(options.report_file);
  OutputSet outputs(checked, options.force, read_files(inputs, options));
  outputs_checked = true;
  const StagingFolder staging(folder.empty() ? fs::path(".") : folder, "ep-compile");

  opt_out_of_ort_telemetry();
  Ort::Env env(ORT_LOGGING_LEVEL_WARNING, "ctxgen");
  try {
    env.RegisterExecutionProviderLibrary(kRegistration, library.c_str());
  } catch (const Ort::Exception& e) {
    throw Error(ErrorCode::kUsage, "--ep-lib " + target.library.string() + ": ONNX Runtime cannot load it as a plugin EP library: " + e.what());
  }
  std::set<std::string> offered;
  std::vector<Ort::ConstEpDevice> devices;
  for (const auto& device : env.GetEpDevices()) {
    offered.insert(device.EpName());
    if (device.EpName() == target.ep) devices.push_back(device);
  }
  if (devices.empty()) {
    std::string names;
    for (const auto& name : offered) names += (names.empty() ? "" : ", ") + name;
    throw Error(ErrorCode::kUsage, "--ep " + target.ep + ": no device of ONNX Runtime offers that EP (offered: " + names + ")");
  }

  const bool shared = inputs.size() > 1;
  for (size_t m = 0; m < inputs.size(); ++m) {
    Ort::SessionOptions session;
    // ONNX Runtime refuses an option or entry it cannot hold (a key over 1,024 characters, a value
    // over 8,192 in 1.29) before any EP sees it: the user's option, named, not an internal error.
    try {
      session.AppendExecutionProvider_V2(env, devices, std::unordered_map<std::string, std::string>(
                                                           target.ep_options.begin(), target.ep_options.end()));
    } catch (const Ort::Exception& e) {
      throw Error(ErrorCode::kUsage, std::string("--ep-option: ONNX Runtime refuses the EP's options: ") + e.what());
    }
    for (const auto& [key, value] : target.session_config) {
      try {
        session.AddConfigEntry(key.c_str(), value.c_str());
      } catch (const Ort::Exception& e) {
        throw Error(ErrorCode::kUsage, "--session-config " + key.substr(0, 64) + (key.size() > 64 ? "...: " : ": ") +
                                           "ONNX Runtime refuses it: " + e.what());
      }
    }
    if (shared) session.AddConfigEntry("ep.share_ep_contexts", "1");
    if (shared && m + 1 == inputs.size()) session.AddConfigEntry("ep.stop_share_ep_contexts", "1");
    if (!options.node_name_prefix.empty())
      session.AddConfigEntry("ep.context_node_name_prefix", options.node_name_prefix.c_str());
    if (!options.per_model.empty())
      for (const auto& [name, value] : options.per_model[m].fix_dims) session.AddFreeDimensionOverrideByName(name.c_str(), value);
    if (options.progress) options.progress({"compile", inputs[m], m + 1, inputs.size(), {}, 0, 0});
    const fs::path staged = staging.path() / planned[m].filename();
    // ORT hands EPs no output path longer than this, and they would write beside the input instead.
    if (staged.string().size() > kMaxOrtConfigValue)
      throw Error(ErrorCode::kUsage, staged.string() + ": the output path is longer than the " +
                                         std::to_string(kMaxOrtConfigValue) + " characters ONNX Runtime passes to EPs; use a shorter --output-dir");
    try {
      Ort::ModelCompilationOptions compile(env, session);
      compile.SetInputModelPath(inputs[m].c_str());
      compile.SetOutputModelPath(staged.c_str());
      compile.SetEpContextEmbedMode(options.embed);
      compile.SetFlags(options.allow_empty ? OrtCompileApiFlags_NONE : OrtCompileApiFlags_ERROR_IF_NO_NODES_COMPILED);
      Ort::ThrowOnError(Ort::CompileModel(env, compile));
    } catch (const Ort::Exception& e) {
      throw ort_error(e, inputs[m], target, options.allow_empty);
    }
    summary.models.push_back(summarize(inputs[m], planned[m], staged, target));
  }
  // A model must not point at a binary that is not there (a shared group whose last session
  // compiled nothing, an EP that failed to write): checked before anything is published.
  for (const auto& m : planned) {
    const ParsedModel compiled = parse_model(staging.path() / m.filename());
    for (const auto& node : compiled.proto->graph().node()) {
      if (node.op_type() != "EPContext" || attribute(node, "source") != target.ep) continue;
      const std::string cache = attribute(node, "ep_cache_context");
      bool embedded = false;
      for (const auto& a : node.attribute()) embedded = embedded || (a.name() == "embed_mode" && a.i() == 1);
      if (!embedded && !cache.empty() && !fs::exists(staging.path() / cache))
        throw Error(ErrorCode::kRuntime, m.string() + ": ONNX Runtime with " + target.ep + " wrote no '" + cache +
                                             "', which its EPContext node '" + node.name() + "' points at");
    }
  }
  env.UnregisterExecutionProviderLibrary(kRegistration);
  const auto now = std::chrono::steady_clock::now();
  summary.timings.push_back({"compile", {}, std::chrono::duration<double, std::milli>(now - started).count()});

  // What the EP wrote beside the models (its binaries) is published with them, under the same rules.
  std::vector<fs::path> written;
  for (const auto& e : fs::directory_iterator(staging.path())) written.push_back(e.path());
  std::sort(written.begin(), written.end());
  summary.weights_known = false;
  for (const auto& file : written) {
    const fs::path target_path = folder / file.filename();
    if (std::find(planned.begin(), planned.end(), target_path) != planned.end()) continue;
    const auto same = [&](const fs::path& other) {
      return fs::weakly_canonical(fs::absolute(other)) == fs::weakly_canonical(fs::absolute(target_path));
    };
    if (std::any_of(inputs.begin(), inputs.end(), same) || (!options.report_file.empty() && same(options.report_file)))
      throw Error(ErrorCode::kUsage, target_path.string() + ": " + target.ep + " wrote a file of that name, which " +
                                         "would replace an input model or the report");
    outputs.adopt(file, target_path);
    count_weights(file, summary);
  }
  for (size_t m = 0; m < inputs.size(); ++m) outputs.adopt(staging.path() / planned[m].filename(), planned[m]);
  if (!options.report_file.empty() && options.report_file != kStdoutReport) {
    summary.outputs = outputs.written();
    write_report(outputs, options.report_file, report_json(inputs, options, summary));
  }
  outputs.commit();
  summary.outputs = outputs.written();
}

}  // namespace

std::pair<std::string, std::string> key_value(const std::string& text, const std::string& option) {
  const auto eq = text.find('=');
  if (eq == std::string::npos || eq == 0)
    throw Error(ErrorCode::kUsage, option + " '" + text + "': give KEY=VALUE");
  return {text.substr(0, eq), text.substr(eq + 1)};
}

RunSummary compile_with_ep(const std::vector<fs::path>& inputs, const CompileOptions& given, const EpTarget& target) {
  // The EP compiles: the report names it where it would name the backend.
  CompileOptions options = given;
  options.backend = target.ep;
  return run_reported(inputs, options, [&](RunSummary& summary, bool& outputs_checked) {
    run(inputs, options, target, summary, outputs_checked);
  });
}

}  // namespace ctxgen
