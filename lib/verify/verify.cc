#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <random>
#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "ctxgen/context_path.h"
#include "ctxgen/error.h"
#include "ctxgen/format.h"
#include "ctxgen/log.h"
#include "ctxgen/model.h"
#include "ctxgen/verify.h"
#include "float64.h"

namespace fs = std::filesystem;

namespace ctxgen::verify {
namespace {

Error mismatch(const fs::path& model, const std::string& what) { return Error(ErrorCode::kMismatch, model.string() + ": " + what); }

const onnx::AttributeProto* attribute(const onnx::NodeProto& node, const std::string& name) {
  for (const auto& a : node.attribute())
    if (a.name() == name) return &a;
  return nullptr;
}

// Embedded weights are not copied: ONNX Runtime reads the model itself.
onnx::ModelProto parse(const fs::path& path) {
  try {
    return std::move(*parse_model(path).proto);
  } catch (const Error& e) {
    throw Error(ErrorCode::kMismatch, e.what());
  }
}

// A file `model` needs, refused as a failed integrity check naming `what` when it is missing or
// cannot be reached (a symlink loop, a folder that cannot be searched).
void expect_present(const fs::path& model, const std::string& what, const fs::path& file) {
  std::error_code ec;
  if (!fs::exists(file, ec))
    throw mismatch(model, what + " " + file.string() + (ec ? " cannot be reached: " + ec.message() : " is missing"));
}

// A context binary, with load errors reported as a failed integrity check.
// With its original given (--reference), a compiled model is checked and run as an application
// that names it its source model does: a weightless binary finds its weights there.
std::shared_ptr<const ContextBinary> load_context(const fs::path& model, const onnx::NodeProto& node,
                                                  const std::optional<fs::path>& reference, std::vector<std::string>& checks) {
  const auto* cache = attribute(node, "ep_cache_context");
  const auto* embed = attribute(node, "embed_mode");
  if (cache == nullptr) throw mismatch(model, "EPContext node '" + node.name() + "' has main_context=1 but no ep_cache_context");
  try {
    if (embed != nullptr && embed->i() == 1) {
      auto bytes = std::make_shared<std::string>(cache->s());
      checks.push_back("node '" + node.name() + "': embedded context of " + std::to_string(bytes->size()) + " bytes");
      return ContextBinary::from_memory(reinterpret_cast<const uint8_t*>(bytes->data()), bytes->size(), bytes,
                                        "embedded context of node '" + node.name() + "'");
    }
    fs::path bin = model.parent_path() / cache->s();
    expect_present(model, "node '" + node.name() + "': context binary", bin);
    // Found as the plugin EP finds it: inside the model's folder, nowhere else.
    const fs::path folder = model.parent_path().empty() ? fs::path(".") : model.parent_path();
    const ContextFile file = open_context_file(folder, cache->s(), node.name());
    const auto* source_model = attribute(node, "onnx_model_filename");
    auto binary = ContextBinary::map(file.fd.get(), file.path, [&]() -> std::optional<fs::path> {
      return source_data_folder(folder, reference ? std::optional<std::string>(reference->string()) : std::nullopt,
                                source_model ? std::optional<std::string>(source_model->s()) : std::nullopt, node.name());
    });
    checks.push_back(bin.string() + ": present, format v" + std::to_string(binary->format_version()) + ", metadata and programs intact");
    return binary;
  } catch (const Error& e) {
    if (e.code() == ErrorCode::kMismatch) throw;
    throw Error(ErrorCode::kMismatch, e.what());
  }
}

std::string describe(int32_t elem_type, const std::vector<int64_t>& dims) {
  std::string text = dtype_name(elem_type) + " [";
  for (size_t i = 0; i < dims.size(); ++i) text += (i ? "," : "") + (dims[i] < 0 ? std::string("?") : std::to_string(dims[i]));
  return text + "]";
}

// What the model declares for a value (graph input/output or value_info); dims unknown to it are -1.
struct Declared {
  int32_t elem_type = 0;
  std::optional<std::vector<int64_t>> dims;
};

std::map<std::string, Declared> declared_values(const onnx::GraphProto& graph) {
  std::map<std::string, Declared> values;
  auto add = [&](const onnx::ValueInfoProto& v) {
    if (!v.type().has_tensor_type()) return;
    const auto& tensor = v.type().tensor_type();
    Declared d{tensor.elem_type(), std::nullopt};
    if (tensor.has_shape()) {
      d.dims.emplace();
      for (const auto& dim : tensor.shape().dim()) d.dims->push_back(dim.has_dim_value() ? dim.dim_value() : -1);
    }
    values[v.name()] = d;
  };
  for (const auto& v : graph.input()) add(v);
  for (const auto& v : graph.output()) add(v);
  for (const auto& v : graph.value_info()) add(v);
  return values;
}

// The node's inputs (or outputs) against the compiled graph's: same values in the same order, and
// where the model declares their type and shape, the ones the graph was compiled for.
void check_signature(const fs::path& model, const onnx::NodeProto& node, const char* direction,
                     const google::protobuf::RepeatedPtrField<std::string>& names,
                     const std::vector<IoSignature>& compiled, const std::map<std::string, Declared>& declared) {
  std::string where = "EPContext node '" + node.name() + "'";
  if (static_cast<size_t>(names.size()) != compiled.size())
    throw mismatch(model, where + " has " + std::to_string(names.size()) + " " + direction + "s, its compiled graph has " +
                              std::to_string(compiled.size()));
  for (size_t i = 0; i < compiled.size(); ++i) {
    const IoSignature& sig = compiled[i];
    std::string which = where + " " + direction + " " + std::to_string(i) + " '" + names[static_cast<int>(i)] + "'";
    if (names[static_cast<int>(i)] != sig.name) throw mismatch(model, which + ": the compiled graph expects '" + sig.name + "'");
    auto it = declared.find(sig.name);
    if (it == declared.end()) continue;
    const Declared& d = it->second;
    bool type_differs = d.elem_type != 0 && d.elem_type != sig.elem_type;
    bool dims_differ = d.dims && d.dims->size() != sig.dims.size();
    for (size_t k = 0; d.dims && !dims_differ && k < sig.dims.size(); ++k)
      dims_differ = (*d.dims)[k] >= 0 && (*d.dims)[k] != sig.dims[k];
    if (type_differs || dims_differ)
      throw mismatch(model, which + " is declared " + describe(d.elem_type, d.dims.value_or(std::vector<int64_t>{})) +
                                ", the compiled graph was made for " + describe(sig.elem_type, sig.dims));
  }
}

// External weights files already hashed in this run, by path: the models of a group share one,
// which may be gigabytes, so it is read once.
using Hashed = std::map<fs::path, std::string>;

void check_binary(const fs::path& model, const ContextBinary& binary, const BackendRuntime& runtime,
                  std::vector<std::string>& checks) {
  const Judgement judged = runtime.judge(binary.identity());
  if (judged.fit == Fit::kUnsupported) throw mismatch(model, binary.label() + ": " + judged.why);
  if (judged.fit == Fit::kRuns) checks.push_back(binary.label() + ": runs here, though " + judged.why);
  try {
    binary.verify_payloads();
  } catch (const Error& e) {
    throw Error(ErrorCode::kMismatch, e.what());
  }
  checks.push_back(binary.label() + ": " + std::to_string(binary.weights().size()) + " weights re-hashed, all match");
}

// The session options of the model package variant `model` is (docs/cli.md, "Model packages"), as
// ONNX Runtime's package API applies them: the folder its CPU nodes' weights are in, a shared asset.
// None for a model in no package, or in a folder whose manifest.json describes no such variant.
std::map<std::string, std::string> variant_session_config(const fs::path& model) {
  std::error_code ec;
  const fs::path folder = fs::weakly_canonical(fs::absolute(model, ec).parent_path(), ec);
  const std::optional<fs::path> root = package_root(folder);
  if (!root) return {};
  std::ifstream in(*root / kPackageManifest);
  const auto manifest = nlohmann::json::parse(in, nullptr, false);
  try {
    for (const auto& [name, component] : manifest.at("components").items()) {
      for (const auto& [variant_name, variant] : component.at("variants").items()) {
        const auto& ort = variant.at("executor_info").at("ort");
        if (fs::weakly_canonical(*root / variant.value("variant_directory", variant_name), ec) != folder ||
            ort.value("model_file", "") != model.filename().string())
          continue;
        std::map<std::string, std::string> config;
        if (!ort.contains("session_options")) return config;
        for (const auto& [key, value] : ort.at("session_options").items()) {
          const std::string text = value.get<std::string>();
          config[key] = text.rfind(kSharedAssetPrefix, 0) == 0
                            ? (*root / kPackageSharedAssets /
                               (kSharedAssetFolderPrefix + text.substr(std::string(kSharedAssetPrefix).size())))
                                  .string()
                            : text;
        }
        return config;
      }
    }
  } catch (const nlohmann::json::exception&) {
    // Not a manifest of the layout ORT reads: the model is not a variant of a package.
  }
  return {};
}

// The session options a compiled model runs with: its package variant's, and its original as the
// source model of a weightless binary.
std::map<std::string, std::string> session_config(const fs::path& model, const std::optional<fs::path>& reference) {
  std::map<std::string, std::string> config = variant_session_config(model);
  if (reference) config["ep.context_source_model_path"] = reference->string();
  return config;
}

// The weights file the model's initializers point at is the one it was written with: a run killed
// between renames, or a copy of the wrong file, would otherwise feed CPU nodes wrong bytes.
void check_external_weights(const fs::path& model, const onnx::ModelProto& proto, Hashed& hashed,
                            std::vector<std::string>& checks) {
  const auto recorded = metadata_value(proto, kExternalWeightsIdMetadataKey);
  const auto location = external_location(proto.graph());
  if (!recorded || !location) return;
  const auto config = variant_session_config(model);
  const auto folder = config.find(kExternalInitializersFolderOption);
  const fs::path file = (folder != config.end() ? fs::path(folder->second) : model.parent_path()) / *location;
  expect_present(model, "external weights file", file);
  std::error_code ec;
  std::string& found = hashed[fs::weakly_canonical(file, ec)];
  if (found.empty()) {
    try {
      auto mapped = MappedFile::open(file);
      found = xxh3_128(mapped->data(), mapped->size()).hex();
    } catch (const Error& e) {
      throw Error(ErrorCode::kMismatch, e.what());
    }
  }
  if (found != *recorded)
    throw mismatch(model, "was written with the external weights file whose id is " + *recorded + ", but " +
                              file.string() + " has id " + found +
                              ": they come from different compilations; use the file written with the model, or compile again");
  checks.push_back(file.string() + ": the external weights file the model was written with (id " + found + ")");
}

void step(const Options& options, const std::string& what) {
  if (options.step) options.step(what);
}

void check_integrity(const fs::path& model, const std::optional<fs::path>& reference, const onnx::ModelProto& proto,
                     OrtHost& host, const Options& options, Hashed& hashed, std::vector<std::string>& checks) {
  std::vector<const onnx::NodeProto*> nodes;
  std::set<std::string> other_sources;  // of EPContext nodes for other EPs
  for (const auto& node : proto.graph().node()) {
    if (node.op_type() != "EPContext") continue;
    const auto* source = attribute(node, "source");
    if (source != nullptr && source->s() == host.identity().backend) nodes.push_back(&node);
    else other_sources.insert(source != nullptr ? source->s() : "no source");
  }
  if (nodes.empty() && !other_sources.empty()) {
    std::string names;
    for (const auto& name : other_sources) names += (names.empty() ? "" : ", ") + name;
    throw mismatch(model, "its EPContext nodes are for " + names + ", not " + host.identity().backend);
  }
  std::vector<std::shared_ptr<const ContextBinary>> binaries;
  for (const auto* node : nodes) {
    const auto* main = attribute(*node, "main_context");
    if (main == nullptr || main->i() == 1) binaries.push_back(load_context(model, *node, reference, checks));
  }
  // The pairing first: re-hashing the weights of a binary from another compilation is wasted time.
  if (auto recorded = metadata_value(proto, kContentIdMetadataKey)) {
    for (const auto& binary : binaries) {
      check_content_id(*binary, *recorded, model.string());
      checks.push_back(model.string() + ": compiled with context binary " + *recorded + ", which is " + binary->label());
    }
  } else if (!binaries.empty()) {
    log().warn("{}: records no context binary id (an older ctxgen or another tool wrote it); its pairing with the "
               "binary is not checked", model.string());
  }
  for (const auto& binary : binaries) check_binary(model, *binary, *options.runtime, checks);
  check_external_weights(model, proto, hashed, checks);
  auto declared = declared_values(proto.graph());
  for (const auto* node : nodes) {
    const auto* partition = attribute(*node, "partition_name");
    std::string graph = partition != nullptr ? partition->s() : node->name();
    const GraphRecord* record = nullptr;
    for (const auto& binary : binaries)
      if ((record = binary->find_graph(graph)) != nullptr) break;
    if (record == nullptr) throw mismatch(model, "EPContext node '" + node->name() + "': no graph '" + graph + "' in its context binaries");
    check_signature(model, *node, "input", node->input(), node_inputs(*record), declared);
    check_signature(model, *node, "output", node->output(), record->outputs, declared);
  }
  if (nodes.empty() && !options.allow_empty)
    throw mismatch(model, "holds no EPContext node of " + host.identity().backend +
                              ": nothing in it is compiled (pass --allow-empty if that is expected)");
  checks.push_back(model.string() + ": " +
                   (nodes.empty() ? std::string("no EPContext node: nothing in it is compiled (--allow-empty)")
                                  : std::to_string(nodes.size()) +
                                        " EPContext node(s), each matched to its graph with the same inputs and outputs"));
  step(options, "loading " + model.string() + " in ONNX Runtime with " + host.identity().backend);
  host.plugin_session(model, session_config(model, reference));
  checks.push_back(model.string() + ": loads in ONNX Runtime with " + host.identity().backend);
}

// float16 or bfloat16 bits of the nearest value on a grid both hold exactly (multiples of 2^-7
// in [-1, 1]), so no rounding mode is involved.
uint16_t half_float(ONNXTensorElementDataType type, float value) {
  const float v = std::round(value * 128) / 128;
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  if (type == ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16) return static_cast<uint16_t>(bits >> 16);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000);
  if ((bits & 0x7fffffff) == 0) return sign;
  const int exponent = static_cast<int>((bits >> 23) & 0xff) - 127 + 15;  // within float16's normal range here
  return static_cast<uint16_t>(sign | (exponent << 10) | ((bits & 0x7fffff) >> 13));
}

Tensor random_input(const Ort::TypeInfo& type, const std::vector<int64_t>& compiled_dims, const std::string& name,
                    const Options& options, std::mt19937_64& rng) {
  if (type.GetONNXType() != ONNX_TYPE_TENSOR)
    throw Error(ErrorCode::kUsage, "input '" + name + "' is not a tensor; verify feeds random tensors only");
  auto info = type.GetTensorTypeAndShapeInfo();
  Tensor t;
  t.type = info.GetElementType();
  t.dims = info.GetShape();
  // Dims the original leaves open take what the compiled model was specialised for.
  if (compiled_dims.size() == t.dims.size())
    for (size_t d = 0; d < t.dims.size(); ++d)
      if (t.dims[d] < 0) t.dims[d] = compiled_dims[d];
  auto given = options.input_shapes.find(name);
  if (given != options.input_shapes.end()) t.dims = given->second;
  for (int64_t d : t.dims)
    if (d < 0) throw Error(ErrorCode::kUsage, "input '" + name + "' has a dynamic dimension; give its shape with --input-shape " + name + "=...");
  return random_tensor(t.type, t.dims, name, rng);
}

// The inputs ctxgen replaced by constants (--fix-value), as the compiled model records them: the
// original must be fed the same values.
std::map<std::string, Model::FixedValue> fixed_values(const fs::path& model, const onnx::ModelProto& proto) {
  std::map<std::string, Model::FixedValue> values;
  for (const auto& kv : proto.metadata_props()) {
    if (kv.key() != kFixedValuesMetadataKey) continue;
    auto j = nlohmann::json::parse(kv.value(), nullptr, false);
    if (!j.is_object()) throw mismatch(model, "metadata " + kv.key() + " is not a JSON object");
    for (const auto& [name, entry] : j.items()) {
      bool ok = entry.is_object() && entry.contains("dims") && entry.contains("values") && entry["dims"].is_array() &&
                entry["values"].is_array();
      for (const auto& d : ok ? entry["dims"] : nlohmann::json::array()) ok = ok && d.is_number_unsigned();
      for (const auto& v : ok ? entry["values"] : nlohmann::json::array()) ok = ok && v.is_string();
      if (!ok) throw mismatch(model, "metadata " + kv.key() + " '" + name + "' is not {\"dims\": [...], \"values\": [\"...\"]}");
      values[name].dims = entry["dims"].get<std::vector<int64_t>>();
      values[name].values = entry["values"].get<std::vector<std::string>>();
    }
  }
  return values;
}

// A tensor of the original's input type holding the fixed values, parsed as load parsed them.
Tensor fixed_input(const Ort::TypeInfo& type, const std::string& name, const Model::FixedValue& fixed) {
  Tensor t;
  t.type = type.GetTensorTypeAndShapeInfo().GetElementType();  // ORT's codes are ONNX's
  t.dims = fixed.dims;
  try {
    t.bytes = tensor_bytes(tensor_of_values(static_cast<int32_t>(t.type), fixed.dims, fixed.values, "input '" + name + "'"));
  } catch (const Error& e) {
    throw Error(ErrorCode::kMismatch, std::string("recorded fixed value: ") + e.what());
  }
  return t;
}

// Below one part in 2^20 of the output's rms (16 units in the last place of float32), an error
// is rounding whatever the baseline: summing a few hundred terms in another order differs by that
// much. The floor keeps an original that happens to be exact, or whose nodes the float64 reference
// kept in float32, from making any rounding a failure.
void judge_against_baseline(OutputCheck& check, double max_ratio) {
  Difference& d = check.difference;
  const double floor = std::ldexp(d.reference_rms, -20);
  const double ratio = d.error_rms == 0                ? 0
                      : std::isinf(d.error_rms)         ? INFINITY
                                                        : d.error_rms / std::max(check.baseline->error_rms, floor);
  check.error_ratio = ratio;
  if (!(ratio <= max_ratio)) {
    char why[256];
    std::snprintf(why, sizeof why,
                  "its rms error against float64, %.3g, is %.3g times the rounding allowance %.3g (the original's own "
                  "float32 error, at least 2^-20 of the rms); at most %.3g times is rounding",
                  d.error_rms, ratio, std::max(check.baseline->error_rms, floor), max_ratio);
    if (d.within) d.failed = why;
    d.within = false;
  }
}

// The step of each output of `reference` that holds quantized values: a DequantizeLinear with one
// constant scale gives multiples of that scale, a QuantizeLinear integers one apart.
std::map<std::string, double> quantization_steps(const onnx::ModelProto& reference) {
  const auto& graph = reference.graph();
  std::map<std::string, const onnx::TensorProto*> constants;
  for (const auto& t : graph.initializer()) constants[t.name()] = &t;
  for (const auto& node : graph.node())
    if (const auto* value = attribute(node, "value"); node.op_type() == "Constant" && node.output_size() == 1 && value && value->has_t())
      constants[node.output(0)] = &value->t();
  std::set<std::string> outputs;
  for (const auto& o : graph.output()) outputs.insert(o.name());
  std::map<std::string, double> steps;
  for (const auto& node : graph.node()) {
    const bool quantizer = is_onnx_domain(node.domain()) || node.domain() == "com.microsoft";
    if (!quantizer || node.output_size() < 1 || !outputs.count(node.output(0))) continue;
    if (node.op_type() == "QuantizeLinear") steps[node.output(0)] = 1;
    if (node.op_type() != "DequantizeLinear" || node.input_size() < 2) continue;
    const auto scale = constants.find(node.input(1));
    if (scale == constants.end() || scale->second->data_type() != onnx::TensorProto::FLOAT) continue;
    std::vector<uint8_t> bytes;
    try {
      bytes = tensor_bytes(*scale->second);
    } catch (const Error&) {
      continue;  // a scale ONNX Runtime refuses as well
    }
    float step = 0;
    if (bytes.size() == sizeof step) std::memcpy(&step, bytes.data(), sizeof step);
    if (std::isfinite(step) && step > 0) steps[node.output(0)] = step;
  }
  return steps;
}

// A compiled model replaces the original as is: the same inputs and outputs, in the same order,
// of the same element types (dims may be those it was specialised for).
void check_interface(const fs::path& model, Ort::Session& original, Ort::Session& compiled) {
  Ort::AllocatorWithDefaultOptions allocator;
  auto values = [&](Ort::Session& session) {
    std::vector<std::string> list;
    auto add = [&](const char* kind, const std::string& name, const Ort::TypeInfo& type) {
      const bool tensor = type.GetONNXType() == ONNX_TYPE_TENSOR;
      list.push_back(std::string(kind) + " '" + name + "' of type " +
                     (tensor ? dtype_name(type.GetTensorTypeAndShapeInfo().GetElementType()) : "(not a tensor)"));
    };
    for (size_t i = 0; i < session.GetInputCount(); ++i)
      add("input", session.GetInputNameAllocated(i, allocator).get(), session.GetInputTypeInfo(i));
    for (size_t i = 0; i < session.GetOverridableInitializerCount(); ++i)
      add("input with a default", session.GetOverridableInitializerNameAllocated(i, allocator).get(),
          session.GetOverridableInitializerTypeInfo(i));
    for (size_t i = 0; i < session.GetOutputCount(); ++i)
      add("output", session.GetOutputNameAllocated(i, allocator).get(), session.GetOutputTypeInfo(i));
    return list;
  };
  const auto want = values(original), got = values(compiled);
  for (size_t i = 0; i < std::max(want.size(), got.size()); ++i)
    if (i >= want.size() || i >= got.size() || want[i] != got[i])
      throw mismatch(model, "not a drop-in replacement of the original: its " +
                                (i < got.size() ? got[i] : std::string("interface ends")) + " where the original has " +
                                (i < want.size() ? want[i] : std::string("nothing more")));
}

std::vector<OutputCheck> compare_outputs(const fs::path& model, const onnx::ModelProto& proto, const fs::path& reference,
                                         OrtHost& host,
                                         const Options& options) {
  step(options, "loading " + reference.string() + " in ONNX Runtime's CPU EP");
  Ort::Session original = host.cpu_session(reference);
  step(options, "running " + model.string() + " in ONNX Runtime with " + host.identity().backend);
  Ort::Session compiled = host.plugin_session(model, session_config(model, reference));
  check_interface(model, original, compiled);
  Ort::AllocatorWithDefaultOptions allocator;
  std::mt19937_64 rng(options.seed);
  std::vector<std::string> input_names, output_names;
  std::vector<Tensor> inputs;
  std::map<std::string, std::vector<int64_t>> compiled_dims;
  for (size_t i = 0; i < compiled.GetInputCount(); ++i) {
    auto type = compiled.GetInputTypeInfo(i);
    if (type.GetONNXType() == ONNX_TYPE_TENSOR)
      compiled_dims[compiled.GetInputNameAllocated(i, allocator).get()] = type.GetTensorTypeAndShapeInfo().GetShape();
  }
  auto fixed = fixed_values(model, proto);
  for (size_t i = 0; i < original.GetInputCount(); ++i) {
    input_names.emplace_back(original.GetInputNameAllocated(i, allocator).get());
    const std::string& name = input_names.back();
    auto it = fixed.find(name);
    inputs.push_back(it != fixed.end() ? fixed_input(original.GetInputTypeInfo(i), name, it->second)
                                       : random_input(original.GetInputTypeInfo(i), compiled_dims[name], name, options, rng));
  }
  // A fixed input the original gives a default is one ONNX Runtime lists apart, as an overridable
  // initializer: it is fed the fixed value too, or the original would run with its default.
  for (size_t i = 0; i < original.GetOverridableInitializerCount(); ++i) {
    std::string name = original.GetOverridableInitializerNameAllocated(i, allocator).get();
    auto it = fixed.find(name);
    if (it == fixed.end()) continue;
    inputs.push_back(fixed_input(original.GetOverridableInitializerTypeInfo(i), name, it->second));
    input_names.push_back(std::move(name));
  }
  for (size_t i = 0; i < original.GetOutputCount(); ++i)
    output_names.emplace_back(original.GetOutputNameAllocated(i, allocator).get());
  std::vector<const char*> in_ptrs, out_ptrs;
  for (const auto& n : input_names) in_ptrs.push_back(n.c_str());
  for (const auto& n : output_names) out_ptrs.push_back(n.c_str());
  // Both are fed every input; a fixed one the value it was compiled for.
  auto run = [&](Ort::Session& session, const std::string& which, const std::vector<Tensor>& feeds) {
    std::vector<Ort::Value> values;
    for (const auto& feed : feeds) values.push_back(feed.view());
    try {
      return session.Run(Ort::RunOptions{nullptr}, in_ptrs.data(), values.data(), values.size(), out_ptrs.data(), out_ptrs.size());
    } catch (const Ort::Exception& e) {
      throw Error(ErrorCode::kRuntime, which + ": run failed: " + e.what());
    }
  };
  step(options, "running " + reference.string() + " on ONNX Runtime's CPU EP");
  auto copies = [](const std::vector<Ort::Value>& values) {
    std::vector<Tensor> tensors;
    for (const auto& v : values) tensors.push_back(Tensor::from(v));
    return tensors;
  };
  const auto expected = copies(run(original, reference.string(), inputs));
  step(options, "running " + model.string() + " with " + host.identity().backend);
  const auto got = copies(run(compiled, model.string(), inputs));
  const auto steps = quantization_steps(parse(reference));
  std::vector<Tolerance> tolerances(output_names.size(), options.tolerance);
  for (size_t i = 0; i < output_names.size(); ++i)
    if (auto it = steps.find(output_names[i]); it != steps.end()) tolerances[i].step = it->second;
  std::vector<OutputCheck> checks;
  for (size_t i = 0; i < output_names.size(); ++i)
    checks.push_back({model, output_names[i], compare(got[i], expected[i], tolerances[i]), "float32", std::nullopt,
                      std::nullopt});
  // A float32 comparison that fails its tolerance is judged again against float64 before it fails:
  // the output may be no further from exact arithmetic than the original's own float32 run (ONNX
  // Runtime's fused integer kernels for a quantized model, say), which is no finding. Not when the
  // user asked for a cosine or SNR as well: those are criteria against the float32 run.
  const bool rejudge = options.reference_precision != Precision::kFloat64 && !options.tolerance.min_cosine &&
                       !options.tolerance.min_snr_db &&
                       std::any_of(checks.begin(), checks.end(), [](const OutputCheck& c) {
                         return !c.difference.within && c.difference.problem.empty();
                       });
  if (options.reference_precision == Precision::kFloat64 || rejudge) {
    // Their outputs are copied out: the widened weights may take the memory the sessions hold.
    original = Ort::Session(nullptr);
    compiled = Ort::Session(nullptr);
    step(options, "loading " + reference.string() + " in float64 in ONNX Runtime's CPU EP");
    std::string why;
    auto wide = float64_reference(reference, host, why);
    std::vector<Ort::Value> exact;
    if (wide) {
      std::vector<Tensor> wide_inputs;
      for (const auto& input : inputs) wide_inputs.push_back(widened(input));
      step(options, "running " + reference.string() + " in float64 on ONNX Runtime's CPU EP");
      try {
        exact = run(wide->session, reference.string() + " in float64", wide_inputs);
      } catch (const Error& e) {  // a float64 kernel refusing these inputs: no reference, not a finding
        why = e.what();
        wide.reset();
      }
    }
    if (!wide) {
      log().warn("{}: no float64 run ({}); comparing with its float32 run", reference.string(), why);
      // The whole reason is in the warning; each output names its first line.
      const std::string first_line = why.substr(0, why.find('\n'));
      for (auto& check : checks)
        if (!rejudge || !check.difference.within) check.reference = "float32 (no float64 run: " + first_line + ")";
      return checks;
    }
    std::string kept;
    for (const auto& op : wide->float32_ops) kept += (kept.empty() ? "" : ", ") + op;
    for (size_t i = 0; i < output_names.size(); ++i) {
      const Tensor truth = Tensor::from(exact[i]);
      OutputCheck& check = checks[i];
      // A type or shape that differs stays the finding. Integers and booleans must equal the
      // original's float32 run: float64 may break a tie (ArgMax) the other way.
      if (!check.difference.problem.empty() || (rejudge && check.difference.within)) continue;
      if (element_kind(expected[i].type).value_or(ElementKind{0, nullptr, true}).exact && !tolerances[i].step) {
        check.reference = "float32 (integers and booleans must equal the original's float32 run)";
        continue;
      }
      const std::string float32_failure = check.difference.failed;
      check.difference = compare(widened(got[i]), truth, tolerances[i]);
      check.baseline = compare(widened(expected[i]), truth, tolerances[i]);
      // A quantized output's error is whole steps, the original's often none: judged in steps.
      if (!tolerances[i].step) judge_against_baseline(check, options.tolerance.max_error_ratio);
      check.reference = kept.empty() ? "float64" : "float64 (" + kept + " in float32: no float64 kernel)";
      if (!rejudge) continue;
      check.reference += ", after the float32 run failed it (" + float32_failure + ")";
      if (check.difference.within) continue;
      // As far from exact arithmetic as the original's own float32 run: no further at its worst, or
      // (a float output) its rms error within --max-error-ratio times the original's. Quantized
      // networks that round a value to a step here or there differ at their extremes by chance.
      const bool no_further = check.difference.abs.max <= check.baseline->abs.max;
      const bool as_far = check.error_ratio && *check.error_ratio <= options.tolerance.max_error_ratio;
      if (!no_further && !as_far) continue;
      check.difference.within = true;
      check.difference.failed.clear();
      check.reference += no_further ? ", no further from it than the original's own float32 run"
                                    : ", its rms error " + std::to_string(*check.error_ratio).substr(0, 4) +
                                          " times the original's own float32 run's";
    }
  }
  return checks;
}

}  // namespace

std::map<std::string, Tensor> fixed_feeds(const fs::path& compiled, Ort::Session& session) {
  const auto fixed = fixed_values(compiled, parse(compiled));
  std::map<std::string, Tensor> feeds;
  Ort::AllocatorWithDefaultOptions allocator;
  for (size_t i = 0; i < session.GetInputCount(); ++i) {
    const std::string name = session.GetInputNameAllocated(i, allocator).get();
    if (const auto it = fixed.find(name); it != fixed.end()) feeds[name] = fixed_input(session.GetInputTypeInfo(i), name, it->second);
  }
  return feeds;
}

Tensor random_tensor(ONNXTensorElementDataType type, const std::vector<int64_t>& dims, const std::string& name,
                     std::mt19937_64& rng) {
  Tensor t{type, dims, {}};
  size_t count = 1;
  for (int64_t d : t.dims) {
    if (d < 0) throw Error(ErrorCode::kUsage, "input '" + name + "' has a dynamic dimension");
    count *= static_cast<size_t>(d);
  }
  auto kind = element_kind(t.type);
  if (!kind)
    throw Error(ErrorCode::kUsage, "input '" + name + "': element type " + std::to_string(t.type) +
                                       " is not supported by verify (it feeds numbers and booleans)");
  t.bytes.assign(count * kind->size, 0);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  // Small non-negative integers stay valid as indices, counts and axes; bools are 0 or 1.
  std::uniform_int_distribution<int> small(0, t.type == ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL ? 1 : 2);
  for (uint8_t* p = t.bytes.data(); p != t.bytes.data() + t.bytes.size(); p += kind->size) {
    if (t.type == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT) {
      float v = uniform(rng);
      std::memcpy(p, &v, sizeof v);
    } else if (t.type == ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE) {
      double v = uniform(rng);
      std::memcpy(p, &v, sizeof v);
    } else if (!kind->exact) {  // float16, bfloat16
      const uint16_t v = half_float(t.type, uniform(rng));
      std::memcpy(p, &v, sizeof v);
    } else {
      *p = static_cast<uint8_t>(small(rng));  // the low byte: tensors are little-endian
    }
  }
  return t;
}

bool Result::ok() const {
  for (const auto& o : outputs)
    if (!o.difference.within) return false;
  return true;
}

Result run(const Options& options) {
  if (!options.references.empty() && options.references.size() != options.models.size())
    throw Error(ErrorCode::kUsage, "give one --reference per compiled model (" + std::to_string(options.models.size()) +
                                       " models, " + std::to_string(options.references.size()) + " references)");
  if (!options.runtime) throw Error(ErrorCode::kUsage, "verify: no backend runtime given (verify::Options::runtime)");
  OrtHost host(options.plugin.empty() ? default_plugin() : options.plugin, options.runtime->identity());
  Result result;
  Hashed hashed;
  for (size_t i = 0; i < options.models.size(); ++i) {
    std::error_code ec;
    // A missing input is exit 3, as for every command (docs/cli.md).
    for (const auto* list : {&options.models, &options.references})
      if (i < list->size() && !fs::exists((*list)[i], ec))
        throw Error(ErrorCode::kInvalidModel, (*list)[i].string() + ": " + (ec ? ec.message() : "no such file"));
    step(options, "checking " + options.models[i].string());
    onnx::ModelProto proto = parse(options.models[i]);  // read once, for both checks
    Result found;
    const std::optional<fs::path> reference =
        options.references.empty() ? std::nullopt : std::optional<fs::path>(options.references[i]);
    check_integrity(options.models[i], reference, proto, host, options, hashed, found.checks);
    if (!options.references.empty())
      found.outputs = compare_outputs(options.models[i], proto, options.references[i], host, options);
    if (options.model_checked) options.model_checked(found);
    result.checks.insert(result.checks.end(), found.checks.begin(), found.checks.end());
    result.outputs.insert(result.outputs.end(), found.outputs.begin(), found.outputs.end());
  }
  return result;
}

namespace {

// The child's answer on a pipe: length-prefixed strings, so any bytes (names need not be UTF-8)
// and any double (inf, NaN) come back as they were.
class Message {
 public:
  void put(const std::string& text) {
    put_size(text.size());
    bytes_ += text;
  }
  void put_double(double v) { put(format_double(v)); }
  void put_size(uint64_t n) { bytes_.append(reinterpret_cast<const char*>(&n), sizeof n); }
  const std::string& bytes() const { return bytes_; }

  explicit Message(std::string bytes = {}) : bytes_(std::move(bytes)) {}
  uint64_t size() {
    uint64_t n = 0;
    if (bytes_.size() - at_ < sizeof n) throw Error(ErrorCode::kInternal, "verify: truncated answer from the child");
    std::memcpy(&n, bytes_.data() + at_, sizeof n);
    at_ += sizeof n;
    return n;
  }
  std::string get() {
    const uint64_t n = size();
    if (bytes_.size() - at_ < n) throw Error(ErrorCode::kInternal, "verify: truncated answer from the child");
    std::string text = bytes_.substr(at_, n);
    at_ += n;
    return text;
  }
  double get_double() { return std::strtod(get().c_str(), nullptr); }
  bool remaining() const { return at_ < bytes_.size(); }
  // Records arrive in pieces: a reader appends what came, reads whole records, and goes back to
  // the start of one that is not complete yet.
  void append(const char* data, size_t size) { bytes_.append(data, size); }
  size_t position() const { return at_; }
  void rewind(size_t position) { at_ = position; }

 private:
  static std::string format_double(double v) {
    char text[64];
    std::snprintf(text, sizeof text, "%.17g", v);
    return text;
  }
  std::string bytes_;
  size_t at_ = 0;
};

void put(Message& m, const Difference& d) {
  m.put_size(d.dims.size());
  for (int64_t dim : d.dims) m.put(std::to_string(dim));
  m.put_size(d.elements);
  for (double v : {d.reference_max_abs, d.reference_rms, d.error_rms, d.atol, d.step, d.abs.max, d.abs.mean, d.abs.median, d.abs.p99, d.rel.max,
                   d.rel.mean, d.rel.median, d.rel.p99, d.outside, d.cosine, d.snr_db})
    m.put_double(v);
  m.put_size(d.within ? 1 : 0);
  m.put(d.failed);
  m.put(d.problem);
}

Difference get_difference(Message& m) {
  Difference d;
  for (uint64_t n = m.size(); n > 0; --n) d.dims.push_back(std::stoll(m.get()));
  d.elements = m.size();
  for (double* v : {&d.reference_max_abs, &d.reference_rms, &d.error_rms, &d.atol, &d.step, &d.abs.max, &d.abs.mean, &d.abs.median, &d.abs.p99, &d.rel.max,
                    &d.rel.mean, &d.rel.median, &d.rel.p99, &d.outside, &d.cosine, &d.snr_db})
    *v = m.get_double();
  d.within = m.size() == 1;
  d.failed = m.get();
  d.problem = m.get();
  return d;
}

// One model's results as a "model" record.
Message encode(const Result& result) {
  Message m;
  m.put("model");  // decode() reads what follows
  m.put_size(result.checks.size());
  for (const auto& c : result.checks) m.put(c);
  m.put_size(result.outputs.size());
  for (const auto& o : result.outputs) {
    m.put(o.model.string());
    m.put(o.output);
    put(m, o.difference);
    m.put(o.reference);
    m.put_size(o.baseline ? 1 : 0);
    if (o.baseline) {
      put(m, *o.baseline);
      m.put_double(o.error_ratio.value_or(0));
    }
  }
  return m;
}

Result decode(Message& m) {
  Result result;
  for (uint64_t n = m.size(); n > 0; --n) result.checks.push_back(m.get());
  for (uint64_t n = m.size(); n > 0; --n) {
    OutputCheck o;
    o.model = m.get();
    o.output = m.get();
    o.difference = get_difference(m);
    o.reference = m.get();
    if (m.size() == 1) {
      o.baseline = get_difference(m);
      o.error_ratio = m.get_double();
    }
    result.outputs.push_back(std::move(o));
  }
  return result;
}

void write_all(int fd, const std::string& bytes) {
  for (size_t at = 0; at < bytes.size();) {
    ssize_t n = ::write(fd, bytes.data() + at, bytes.size() - at);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    at += static_cast<size_t>(n);
  }
}

}  // namespace

Result run_isolated(const Options& options) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) throw Error(ErrorCode::kInternal, std::string("verify: pipe failed: ") + std::strerror(errno));
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) {
    const int err = errno;
    ::close(fds[0]);
    ::close(fds[1]);
    throw Error(ErrorCode::kInternal, std::string("verify: fork failed: ") + std::strerror(err));
  }
  if (pid == 0) {
    // Records: ("step", what) as each step starts, ("model", results) as each model is done, then
    // ("ok") or ("error", code, message).
    ::close(fds[0]);
    Options child = options;
    child.step = [&](const std::string& what) {
      Message m;
      m.put("step");
      m.put(what);
      write_all(fds[1], m.bytes());
    };
    child.model_checked = [&](const Result& found) { write_all(fds[1], encode(found).bytes()); };
    Message m;
    try {
      run(child);  // its results went out model by model
      m.put("ok");
    } catch (const Error& e) {
      m = Message();
      m.put("error");
      m.put_size(static_cast<uint64_t>(e.code()));
      m.put(e.what());
    } catch (const Ort::Exception& e) {
      m = Message();
      m.put("error");
      m.put_size(static_cast<uint64_t>(ErrorCode::kRuntime));
      m.put(std::string("ONNX Runtime failed: ") + e.what());
    } catch (const std::exception& e) {
      m = Message();
      m.put("error");
      m.put_size(static_cast<uint64_t>(ErrorCode::kInternal));
      m.put(std::string("internal error: ") + e.what());
    }
    write_all(fds[1], m.bytes());
    std::fflush(nullptr);
    ::_exit(0);
  }
  ::close(fds[1]);
  // Steps and each model's results are passed on as they arrive and add up to the result; the
  // answer ("ok" or the error) ends the records.
  Message m;
  std::string last_step = "starting", answer;
  Result answered;
  ErrorCode error_code = ErrorCode::kInternal;
  std::string error_message;
  auto read_records = [&] {
    while (answer.empty() && m.remaining()) {
      const size_t start = m.position();
      try {
        std::string kind = m.get();
        if (kind == "step") {
          last_step = m.get();
          if (options.step) options.step(last_step);
        } else if (kind == "model") {
          Result found = decode(m);
          if (options.model_checked) options.model_checked(found);
          answered.checks.insert(answered.checks.end(), found.checks.begin(), found.checks.end());
          answered.outputs.insert(answered.outputs.end(), found.outputs.begin(), found.outputs.end());
        } else if (kind == "ok") {
          answer = kind;
        } else {
          error_code = static_cast<ErrorCode>(m.size());
          error_message = m.get();
          answer = kind;
        }
      } catch (const Error&) {  // a record cut short: the rest is still coming, or the child died
        m.rewind(start);
        return;
      }
    }
  };
  char buffer[65536];
  for (ssize_t n; (n = ::read(fds[0], buffer, sizeof buffer)) != 0;) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    m.append(buffer, static_cast<size_t>(n));
    read_records();
  }
  ::close(fds[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  // A child that died, or ended without answering (a sanitizer's handler turns the signal into an
  // exit), crashed in the step it was doing; ctxgen's own failures are answers.
  if (answer.empty()) {
    const std::string how = WIFSIGNALED(status) ? "signal " + std::to_string(WTERMSIG(status)) + ", " +
                                                      strsignal(WTERMSIG(status))
                                                : "exit " + std::to_string(WEXITSTATUS(status)) + " without an answer";
    throw Error(ErrorCode::kRuntime, "verify crashed (" + how + ") while " + last_step +
                                         (last_step.find("CPU EP") != std::string::npos
                                              ? "; ONNX Runtime's CPU kernels do this on some inputs, e.g. an "
                                                "integer division of the lowest value by -1 in the model"
                                              : ""));
  }
  if (answer == "error") throw Error(error_code, error_message);
  return answered;
}

}  // namespace ctxgen::verify
