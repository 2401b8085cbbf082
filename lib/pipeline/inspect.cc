// `ctxgen inspect`: what went where in an EPContext model, what a context binary holds, and what a
// model package (--package) is made of.

#include <algorithm>
#include <fstream>
#include <set>
#include <sstream>

#include "ctxgen/backend.h"
#include "ctxgen/context_path.h"
#include "ctxgen/error.h"
#include "ctxgen/format.h"
#include "ctxgen/model.h"
#include "ctxgen/report.h"

namespace fs = std::filesystem;

namespace ctxgen {
namespace {

nlohmann::json signature_json(const std::vector<IoSignature>& sigs) {
  nlohmann::json list = nlohmann::json::array();
  for (const auto& s : sigs) list.push_back({{"name", s.name}, {"type", dtype_name(s.elem_type)}, {"dims", s.dims}});
  return list;
}

nlohmann::json inspect_binary(const fs::path& path) {
  // Only the tables: a weightless binary's source data is checked where its model is run (verify).
  auto binary = ContextBinary::open(path, [] { return std::nullopt; });
  uint64_t weight_bytes = 0, elsewhere_bytes = 0;
  std::vector<size_t> elsewhere(binary->weight_files().size());
  for (const auto& w : binary->weights()) {
    weight_bytes += w.size;
    if (w.file == 0) continue;
    elsewhere_bytes += w.size;
    ++elsewhere[w.file - 1];
  }
  nlohmann::json files = nlohmann::json::array();
  for (size_t k = 0; k < binary->weight_files().size(); ++k) {
    const WeightFile& file = binary->weight_files()[k];
    const bool source = file.kind == WeightFileKind::kSourceData;
    files.push_back({{"path", file.path},
                     {"kind", source ? "source_data" : "weights"},
                     {"resolved", binary->weight_file_label(static_cast<uint32_t>(k + 1))},
                     {"content_id", source ? "" : file.content_id.hex()},
                     {"weights_used", elsewhere[k]}});
  }
  nlohmann::json graphs = nlohmann::json::array();
  for (const auto& g : binary->graphs()) {
    nlohmann::json fixed = nlohmann::json::array();
    for (const auto& f : g.fixed_inputs)
      fixed.push_back({{"name", f.io.name}, {"type", dtype_name(f.io.elem_type)}, {"dims", f.io.dims},
                       {"value", fixed_values_text(f.io.elem_type, f.value.data(), f.value.size() / fixed_element_size(f.io.elem_type))}});
    graphs.push_back({{"name", g.name}, {"inputs", signature_json(g.inputs)}, {"outputs", signature_json(g.outputs)},
                      {"fixed_inputs", fixed}, {"program_bytes", g.program_size}, {"weights", g.weight_ids.size()}});
  }
  const auto& id = binary->identity();
  return {{"kind", "context_binary"},
          {"path", path.string()},
          {"size", binary->file_size()},
          {"format_version", binary->format_version()},
          {"backend", id.backend},
          {"sdk_version", id.sdk_version},
          {"hardware_architecture", id.hardware_architecture},
          {"content_id", binary->content_id().hex()},
          {"graphs", graphs},
          {"weights", {{"count", binary->weights().size()}, {"bytes", weight_bytes}, {"bytes_in_weight_files", elsewhere_bytes}}},
          {"weight_files", files}};
}

uint64_t bytes_under(const fs::path& folder) {
  uint64_t bytes = 0;
  std::error_code ec;
  for (const auto& entry : fs::recursive_directory_iterator(folder, ec))
    if (entry.is_regular_file(ec)) bytes += entry.file_size(ec);
  return bytes;
}

nlohmann::json inspect_package(const fs::path& path) {
  const fs::path manifest_path = path / kPackageManifest;
  std::ifstream in(manifest_path);
  const nlohmann::ordered_json manifest = nlohmann::ordered_json::parse(in, nullptr, false);
  if (manifest.is_discarded() || !manifest.is_object() || !manifest.contains("components") ||
      !manifest["components"].is_object())
    throw Error(ErrorCode::kInvalidModel, manifest_path.string() + ": not a model package manifest (no components object)");
  nlohmann::ordered_json components = nlohmann::ordered_json::array();
  try {
    for (const auto& [name, component] : manifest["components"].items()) {
      nlohmann::ordered_json variants = nlohmann::ordered_json::array();
      if (component.is_object() && component.contains("variants") && component["variants"].is_object())
        for (const auto& [variant_name, v] : component["variants"].items()) {
          const std::string folder = v.value("variant_directory", variant_name);
          const nlohmann::ordered_json ort = v.contains("executor_info") ? v["executor_info"].value("ort", nlohmann::ordered_json()) : nullptr;
          const std::string model_file = ort.is_object() ? ort.value("model_file", "") : "";
          const std::string where = manifest_path.string() + ": component '" + name + "', variant '" + variant_name + "': ";
          // Where it really is: a link in the package may lead out of it.
          const auto outside = [&](const fs::path& p) {
            std::error_code ec;
            const fs::path inside = fs::weakly_canonical(path / p, ec).lexically_relative(fs::weakly_canonical(path, ec));
            return p.is_absolute() || inside.empty() || *inside.begin() == "..";
          };
          if (outside(folder))
            throw Error(ErrorCode::kInvalidModel, where + "variant_directory '" + folder + "' is outside the package");
          const fs::path file(model_file);
          if (file.is_absolute() || std::find(file.begin(), file.end(), "..") != file.end() || outside(fs::path(folder) / file))
            throw Error(ErrorCode::kInvalidModel, where + "model_file '" + model_file + "' is outside the package");
          if (!fs::is_regular_file(path / folder / model_file))
            throw Error(ErrorCode::kInvalidModel, where + "its model '" + (fs::path(folder) / model_file).string() + "' is missing");
          variants.push_back({{"name", variant_name},
                              {"ep", v.value("ep", "")},
                              {"device", v.value("device", "")},
                              {"compatibility_string", v.value("compatibility_string", "")},
                              {"directory", folder},
                              {"model_file", model_file},
                              {"session_options", ort.is_object() ? ort.value("session_options", nlohmann::ordered_json::object())
                                                                  : nlohmann::ordered_json::object()},
                              {"bytes", bytes_under(path / folder)}});
        }
      components.push_back({{"name", name}, {"variants", variants}});
    }
  } catch (const nlohmann::json::exception& e) {
    throw Error(ErrorCode::kInvalidModel, manifest_path.string() + ": not a model package manifest ORT reads: " + e.what());
  }
  nlohmann::ordered_json assets = nlohmann::ordered_json::array();
  std::error_code ec;
  std::vector<fs::path> folders;
  for (const auto& entry : fs::directory_iterator(path / kPackageSharedAssets, ec)) folders.push_back(entry.path());
  std::sort(folders.begin(), folders.end());
  for (const auto& folder : folders) {
    nlohmann::ordered_json files = nlohmann::ordered_json::array();
    for (const auto& entry : fs::recursive_directory_iterator(folder, ec))
      if (entry.is_regular_file(ec))
        files.push_back({{"name", entry.path().lexically_relative(folder).generic_string()}, {"bytes", entry.file_size(ec)}});
    assets.push_back({{"name", folder.filename().string()}, {"files", files}, {"bytes", bytes_under(folder)}});
  }
  return nlohmann::json::parse(nlohmann::ordered_json({{"kind", "model_package"},
                                                       {"path", path.string()},
                                                       {"package_name", manifest.value("package_name", "")},
                                                       {"schema_version", manifest.value("schema_version", "")},
                                                       {"components", components},
                                                       {"shared_assets", assets},
                                                       {"bytes", bytes_under(path)}})
                                   .dump());
}

nlohmann::json attribute_json(const onnx::AttributeProto& a) {
  switch (a.type()) {
    case onnx::AttributeProto::INT: return a.i();
    case onnx::AttributeProto::FLOAT: return a.f();
    case onnx::AttributeProto::STRING:
      // An embedded context is binary and large; show its size instead.
      if (a.name() == "ep_cache_context" && (a.s().size() > 256 || a.s().find('\0') != std::string::npos))
        return "<embedded context, " + std::to_string(a.s().size()) + " bytes>";
      return a.s();
    default: return "<" + onnx::AttributeProto_AttributeType_Name(a.type()) + ">";
  }
}

// The context binaries the model's main-context nodes name beside it, each checked against the id
// the model recorded: a mismatched pair is an error, a missing binary is shown as missing.
nlohmann::json context_binaries(const fs::path& path, const onnx::ModelProto& proto) {
  const auto recorded = metadata_value(proto, kContentIdMetadataKey);
  // EPContext nodes of ctxgen's backends point at ctxgen context binaries; another EP's binaries
  // are its own business.
  std::set<std::string> ours;
  const BackendRegistry backends = builtin_backends();
  for (const Backend* backend : backends.list()) ours.insert(backend->identity().backend);
  nlohmann::json list = nlohmann::json::array();
  std::set<fs::path> seen;
  for (const auto& node : proto.graph().node()) {
    std::optional<std::string> cache, source;
    bool main = true, embedded = false;
    for (const auto& a : node.attribute()) {
      if (a.name() == "ep_cache_context") cache = a.s();
      if (a.name() == "source") source = a.s();
      if (a.name() == "main_context") main = a.i() == 1;
      if (a.name() == "embed_mode") embedded = a.i() == 1;
    }
    if (node.op_type() != "EPContext" || !source || !ours.count(*source) || !main || embedded || !cache || cache->empty())
      continue;
    const fs::path bin = path.parent_path() / *cache;
    if (!seen.insert(bin).second) continue;
    std::error_code ec;
    if (!fs::exists(bin, ec)) {  // anything else (a FIFO, a folder) is refused by open()
      list.push_back({{"path", bin.string()}, {"missing", true}});
      continue;
    }
    std::shared_ptr<const ContextBinary> binary;
    try {
      // Found as the plugin EP finds it: inside the model's folder, nowhere else.
      const ContextFile file = open_context_file(path.parent_path().empty() ? fs::path(".") : path.parent_path(), *cache, node.name());
      binary = ContextBinary::map(file.fd.get(), file.path, [] { return std::nullopt; });
    } catch (const Error& e) {  // shown, so the model can still be inspected
      list.push_back({{"path", bin.string()}, {"missing", false}, {"error", e.what()}});
      continue;
    }
    if (recorded) check_content_id(*binary, *recorded, path.string());
    list.push_back({{"path", bin.string()}, {"content_id", binary->content_id().hex()}, {"missing", false}});
  }
  return list;
}

// A graph's inputs or outputs: name, element type, dims (an open one by its name, as --fix-dim
// takes it, or "?").
nlohmann::json values_json(const google::protobuf::RepeatedPtrField<onnx::ValueInfoProto>& values) {
  nlohmann::json list = nlohmann::json::array();
  for (const auto& v : values) {
    const ValueType type = value_type_of(v.type());
    nlohmann::json dims = nullptr;
    if (type.dims) {
      dims = nlohmann::json::array();
      for (size_t i = 0; i < type.dims->size(); ++i) {
        const int64_t d = (*type.dims)[i];
        const std::string name = i < type.dim_names.size() ? type.dim_names[i] : "";
        dims.push_back(d >= 0 ? nlohmann::json(d) : nlohmann::json(name.empty() ? "?" : name));
      }
    }
    list.push_back({{"name", v.name()}, {"type", type.elem_type ? dtype_name(type.elem_type) : "unknown"},
                    {"dims", dims}, {"dims_text", type.dims_text()}});
  }
  return list;
}

nlohmann::json inspect_model(const fs::path& path) {
  const ParsedModel parsed = parse_model(path);
  const onnx::ModelProto& proto = *parsed.proto;
  const auto& graph = proto.graph();
  nlohmann::json contexts = nlohmann::json::array();
  std::map<std::string, size_t> ops;
  for (const auto& node : graph.node()) {
    if (node.op_type() != "EPContext") {
      ++ops[node.op_type()];
      continue;
    }
    nlohmann::json attrs = nlohmann::json::object();
    for (const auto& a : node.attribute()) attrs[a.name()] = attribute_json(a);
    contexts.push_back({{"name", node.name()}, {"inputs", node.input()}, {"outputs", node.output()}, {"attributes", attrs}});
  }
  nlohmann::json fallback = nlohmann::json::array(), specialised = nullptr;
  for (const auto& kv : proto.metadata_props()) {
    if (kv.key() == kFallbackMetadataKey) fallback = nlohmann::json::parse(kv.value(), nullptr, false);
    if (kv.key() == kSpecialisedMetadataKey) specialised = nlohmann::json::parse(kv.value(), nullptr, false);
  }
  const auto recorded_id = metadata_value(proto, kContentIdMetadataKey);
  uint64_t init_bytes = 0;
  bool external = false;
  for (const auto& t : graph.initializer()) {
    init_bytes += parsed.held_bytes(t);
    external = external || (t.data_location() == onnx::TensorProto::EXTERNAL && !embedded_span(t, parsed.spans));
  }
  return {{"kind", "epcontext_model"},
          {"path", path.string()},
          {"producer", proto.producer_name() + " " + proto.producer_version()},
          {"graph", graph.name()},
          {"inputs", values_json(graph.input())},
          {"outputs", values_json(graph.output())},
          {"content_id", recorded_id ? nlohmann::json(*recorded_id) : nlohmann::json(nullptr)},
          {"context_binaries", context_binaries(path, proto)},
          {"epcontext_nodes", contexts},
          {"cpu_node_ops", ops},
          {"cpu_nodes", fallback},
          {"specialised", specialised},
          {"initializers", {{"count", graph.initializer_size()}, {"embedded_bytes", init_bytes}, {"external", external}}}};
}

}  // namespace

nlohmann::json inspect_json(const fs::path& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) throw Error(ErrorCode::kInvalidModel, path.string() + ": no such file");
  if (fs::is_directory(path, ec)) {
    if (!fs::is_regular_file(path / kPackageManifest, ec))
      throw Error(ErrorCode::kInvalidModel, path.string() + ": a folder without " + kPackageManifest +
                                                ", so not a model package (inspect takes a model, a .bin or a package)");
    return inspect_package(path);
  }
  return path.extension() == ".bin" ? inspect_binary(path) : inspect_model(path);
}

std::string inspect_text(const nlohmann::json& j) {
  std::ostringstream out;
  out << j["path"].get<std::string>() << "\n";
  if (j["kind"] == "context_binary") {
    out << "  context binary v" << j["format_version"] << ", " << human_bytes(j["size"]) << ", backend "
        << j["backend"].get<std::string>() << " (" << j["sdk_version"].get<std::string>() << ", "
        << j["hardware_architecture"].get<std::string>() << ")\n";
    out << "  content id: " << j["content_id"].get<std::string>() << "\n";
    out << "  weights: " << j["weights"]["count"] << ", " << human_bytes(j["weights"]["bytes"]);
    if (!j["weight_files"].empty())
      out << " (" << human_bytes(j["weights"]["bytes_in_weight_files"]) << " of them in weight files)";
    out << "\n";
    for (const auto& f : j["weight_files"]) {
      if (f["kind"] == "source_data")
        out << "  source data " << f["path"].get<std::string>() << ": " << f["weights_used"]
            << " tensor(s) of the source model, read where it keeps them (beside it)\n";
      else
        out << "  weight file " << f["path"].get<std::string>() << ": " << f["weights_used"] << " weight(s), id "
            << f["content_id"].get<std::string>() << "\n";
    }
    for (const auto& g : j["graphs"]) {
      out << "  graph " << g["name"].get<std::string>() << ": " << g["inputs"].size() << " input(s), "
          << g["outputs"].size() << " output(s), " << g["weights"] << " weight(s), program "
          << human_bytes(g["program_bytes"]) << "\n";
      for (const auto& f : g["fixed_inputs"])
        out << "    fixed input " << f["name"].get<std::string>() << " = " << f["value"].get<std::string>()
            << " (compiled for this value: a run must feed it)\n";
    }
    return out.str();
  }
  if (j["kind"] == "model_package") {
    size_t variants = 0;
    for (const auto& c : j["components"]) variants += c["variants"].size();
    out << "  model package '" << j["package_name"].get<std::string>() << "' (schema " << j["schema_version"].get<std::string>()
        << "): " << j["components"].size() << " component(s), " << variants << " variant(s), " << j["shared_assets"].size()
        << " shared asset(s), " << human_bytes(j["bytes"]) << "\n";
    for (const auto& c : j["components"]) {
      out << "  component " << c["name"].get<std::string>() << "\n";
      for (const auto& v : c["variants"]) {
        out << "    variant " << v["name"].get<std::string>() << ": " << v["ep"].get<std::string>() << " on "
            << v["device"].get<std::string>() << ", " << v["directory"].get<std::string>() << "/"
            << v["model_file"].get<std::string>() << ", " << human_bytes(v["bytes"]) << "\n";
        if (!v["compatibility_string"].get<std::string>().empty())
          out << "      compatibility: " << v["compatibility_string"].get<std::string>() << "\n";
        for (const auto& [key, value] : v["session_options"].items())
          out << "      session option " << key << " = " << value.get<std::string>() << "\n";
      }
    }
    for (const auto& a : j["shared_assets"]) {
      std::string names;
      for (const auto& f : a["files"]) names += (names.empty() ? "" : ", ") + f["name"].get<std::string>();
      out << "  shared asset " << a["name"].get<std::string>() << ": " << names << ", " << human_bytes(a["bytes"]) << "\n";
    }
    return out.str();
  }
  out << "  producer: " << j["producer"].get<std::string>() << "\n";
  for (const char* kind : {"input", "output"})
    for (const auto& v : j[std::string(kind) + "s"])
      out << "  " << kind << " " << v["name"].get<std::string>() << ": " << v["type"].get<std::string>() << " "
          << v["dims_text"].get<std::string>() << "\n";
  if (j["epcontext_nodes"].empty()) out << "  no EPContext node: this model is not compiled (ctxgen compile makes one)\n";
  for (const auto& b : j["context_binaries"])
    out << "  context binary " << b["path"].get<std::string>() << ": "
        << (b["missing"].get<bool>() ? std::string("missing")
            : b.contains("error")    ? "unreadable: " + b["error"].get<std::string>()
                                     : "id " + b["content_id"].get<std::string>() +
                                           (j["content_id"].is_string() ? ", the one this model was compiled with"
                                                                        : "; the model records no id (compiled by an "
                                                                          "older ctxgen or another tool)"))
        << "\n";
  for (const auto& c : j["epcontext_nodes"]) {
    out << "  EPContext " << c["name"].get<std::string>() << ": " << c["inputs"].size() << " input(s), "
        << c["outputs"].size() << " output(s)\n";
    for (const auto& [key, value] : c["attributes"].items()) out << "    " << key << " = " << value.dump() << "\n";
  }
  if (const auto& sp = j["specialised"]; sp.is_object() && sp.contains("nodes_folded")) {
    out << "  specialised: " << sp["nodes_in_input"] << " input nodes, " << sp["nodes_folded"] << " folded into constants, "
        << sp["nodes_removed"] << " removed as dead, " << sp["branches_inlined"] << " If branch(es) inlined\n";
    std::string ops;
    for (const auto& [op, count] : sp["folded_by_op"].items()) ops += (ops.empty() ? "" : ", ") + count.dump() + " " + op;
    if (!ops.empty()) out << "    folded: " << ops << "\n";
  }
  size_t cpu = 0;
  for (const auto& [op, count] : j["cpu_node_ops"].items()) cpu += count.get<size_t>();
  out << (j["epcontext_nodes"].empty() ? "  nodes: " : "  CPU nodes: ") << cpu << "\n";
  for (const auto& c : j["cpu_nodes"])
    out << "    " << c["node"].get<std::string>() << " (" << c["op_type"].get<std::string>()
        << "): " << c["reason"].get<std::string>() << "\n";
  return out.str();
}

}  // namespace ctxgen
