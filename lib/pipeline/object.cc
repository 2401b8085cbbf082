// Compile and link (docs/cli.md, "Objects"). An object is one model compiled on one machine: the
// model as compiling left it (specialised, cut into partitions), the weights it still reads, and
// its partitions' compile results as compile cache entries. Linking takes each object's model as
// it stands and runs only what is left of `share`: the partitions come from the entries (one they
// lack is an error, never compiled), then the binary and the models are written: the files are
// those `share` writes, byte for byte.
//
// The file: magic, the header's size, the header (JSON: who made it, the options the model was
// compiled with, the model's state beside its graph, each member's name, kind, size and
// XXH3-128), then the members' bytes in order: the graph (kind "model"), the files its external
// weights are in ("data"), the bytes of its other weights ("weights"), the entries ("entry").

#include <algorithm>
#include <cstring>
#include <limits>
#include <optional>
#include <set>
#include <stdexcept>
#include <tuple>
#include <unordered_set>

#include <nlohmann/json.hpp>

#include "ctxgen/error.h"
#include "ctxgen/outputs.h"
#include "ctxgen/pipeline.h"
#include "job.h"

namespace fs = std::filesystem;

namespace ctxgen {
namespace {

constexpr char kObjectMagic[8] = {'C', 'T', 'X', 'G', 'O', 'B', 'J', '1'};
constexpr const char* kObjectFormat = "ctxgen object 2";

nlohmann::json identity_json(const BinaryIdentity& id) {
  return {{"backend", id.backend}, {"sdk_version", id.sdk_version}, {"hardware_architecture", id.hardware_architecture},
          {"format_version", id.format_version}};
}

std::string identity_text(const nlohmann::json& id) {
  return id.value("backend", "?") + " (SDK " + id.value("sdk_version", "?") + ", " + id.value("hardware_architecture", "?") + ")";
}

// The weights a graph and its subgraphs still read: the main graph's initializers in use, and
// every subgraph's.
void weights_read(const onnx::GraphProto& graph, const std::unordered_set<std::string>* used, std::set<int64_t>& read) {
  for (const auto& t : graph.initializer())
    if (weight_ref(t) >= 0 && (used == nullptr || used->count(t.name()))) read.insert(weight_ref(t));
  for (const auto& node : graph.node())
    for (const auto& a : node.attribute()) {
      if (a.has_g()) weights_read(a.g(), nullptr, read);
      for (const auto& g : a.graphs()) weights_read(g, nullptr, read);
    }
}

// The bytes of an object's "weights" member: each distinct byte string once, at a multiple of 64.
struct HeldBytes {
  std::string bytes;
  std::map<std::tuple<uint64_t, uint64_t, uint64_t>, std::vector<uint64_t>> by_content;  // hash, size -> offsets

  uint64_t hold(const uint8_t* data, size_t size) {
    const Hash128 hash = xxh3_128(data, size);
    auto& same = by_content[{hash.high, hash.low, size}];
    for (uint64_t at : same)
      if (std::memcmp(bytes.data() + at, data, size) == 0) return at;
    bytes.resize((bytes.size() + 63) / 64 * 64, '\0');
    same.push_back(bytes.size());
    bytes.append(reinterpret_cast<const char*>(data), size);
    return same.back();
  }
};

// What the graph (the "model" member) does not say of a compiled job: its weights (each in a file
// of external data, held in the "weights" member, or, folded away, nowhere), constants, value
// types, fixed inputs, and what the stages before compiling found.
nlohmann::json describe_job(const Job& job, const fs::path& folder, HeldBytes& held, std::set<fs::path>& data_files) {
  const Model& model = job.model;
  std::set<int64_t> read;
  const auto used = names_in_use(model.graph());
  weights_read(model.graph(), &used, read);
  nlohmann::json weights = nlohmann::json::array();
  for (size_t i = 0; i < model.weights.size(); ++i) {
    const Weight& w = model.weights[i];
    nlohmann::json j = {{"name", w.name}, {"origin", static_cast<int>(w.origin)}, {"graph", w.graph}, {"external", w.external},
                        {"dtype", w.data.dtype}, {"dims", w.data.dims}, {"size", w.data.size}};
    if (w.data.file && w.external && w.data.file->path() != model.path) {
      const fs::path relative = fs::relative(w.data.file->path(), folder);
      if (relative.empty() || *relative.begin() == "..")
        throw Error(ErrorCode::kUsage, model.path.string() + " reads " + w.data.file->path().string() +
                                           ", outside its folder: an object holds only files beside the model or below");
      data_files.insert(w.data.file->path());
      j["data"] = relative.generic_string();
      j["offset"] = w.data.file_offset;
    } else if (read.count(static_cast<int64_t>(i)) && w.data.data != nullptr) {
      j["held"] = held.hold(w.data.data, w.data.size);
      w.data.blob().release();
    } else {
      j["size"] = 0;  // folded into others and read by nothing: its bytes may be gone
    }
    weights.push_back(std::move(j));
  }
  nlohmann::json types = nlohmann::json::object();
  for (const auto& [name, type] : model.value_types)
    types[name] = {{"elem_type", type.elem_type}, {"dims", type.dims ? nlohmann::json(*type.dims) : nlohmann::json()},
                   {"dim_names", type.dim_names}};
  nlohmann::json fixed = nlohmann::json::object();
  for (const auto& [name, v] : model.fixed_values) {
    const std::string declared = deterministic_bytes(v.declared);
    fixed[name] = {{"dims", v.dims}, {"values", v.values}, {"bytes", v.bytes}, {"position", v.position},
                   {"had_default", v.had_default}, {"declared", held.hold(reinterpret_cast<const uint8_t*>(declared.data()), declared.size())},
                   {"declared_size", declared.size()}};
  }
  nlohmann::json partitions = nlohmann::json::array(), cpu_nodes = nlohmann::json::array();
  for (const Partition& p : job.plan.partitions)
    partitions.push_back({{"nodes", p.nodes}, {"inputs", p.inputs}, {"outputs", p.outputs}, {"constants", p.constants}});
  for (const CpuNode& c : job.plan.cpu_nodes) cpu_nodes.push_back({{"node", c.node}, {"reason", c.reason}});
  const SpecialiseSummary& sp = job.specialised;
  return {{"input_nodes", job.input_nodes},
          {"specialised", {{"folded_nodes", sp.folded_nodes}, {"removed_nodes", sp.removed_nodes}, {"typed_values", sp.typed_values},
                           {"inlined_branches", sp.inlined_branches}, {"folded_by_op", sp.folded_by_op}}},
          {"weights", weights},
          {"constants", model.constants},
          {"value_types", types},
          {"fixed_values", fixed},
          {"partitions", partitions},
          {"cpu_nodes", cpu_nodes}};
}

}  // namespace

RunSummary compile_object(const fs::path& model, const CompileOptions& options, const BackendRegistry& backends,
                          const fs::path& object) {
  if (options.embed || options.stop_after || !options.output_file.empty() || !options.external_initializers_file.empty() ||
      !options.output_dir.empty() || !options.report_file.empty())
    throw Error(ErrorCode::kUsage, "--object writes the object alone: -o, --output-dir, --embed, "
                                   "--external-initializers-file, --report and --stop-after belong to link");
  // The object is checked as an output before any work: it may not replace the model or an
  // existing file without --force.
  OutputSet outputs({object}, options.force, read_files({model}, options));
  StagingFolder staging(object.parent_path().empty() ? fs::path(".") : object.parent_path(), "object", object.filename().string());
  CompileOptions compile = options;
  compile.output_dir = staging.path() / "out";  // planned and checked, but nothing is written
  compile.compile_only = true;
  if (compile.cache_dir.empty()) compile.cache_dir = staging.path() / "cache";
  compile.cache_max_size.reset();  // this run's entries go into the object first

  // Each member: its description, and its bytes, made here or in a file.
  struct Written {
    nlohmann::json description;
    std::string made;
    std::shared_ptr<const MappedFile> file;
    const uint8_t* data() const { return file ? file->data() : reinterpret_cast<const uint8_t*>(made.data()); }
    size_t size() const { return file ? file->size() : made.size(); }
  };
  std::vector<Written> members;
  nlohmann::json job_description;
  JobHooks hooks;
  BinaryIdentity identity;
  hooks.compiled = [&](std::vector<Job>& jobs, const CacheStats& cache, const BinaryIdentity& compiled_for) {
    identity = compiled_for;
    const Job& job = jobs.front();
    HeldBytes held;
    std::set<fs::path> data_files;
    job_description = describe_job(job, external_data_folder(model), held, data_files);
    members.push_back({{{"kind", "model"}, {"name", model.filename().string()}}, deterministic_bytes(*job.model.proto), nullptr});
    members.push_back({{{"kind", "weights"}, {"name", "weights"}}, std::move(held.bytes), nullptr});
    for (const fs::path& data : data_files)
      members.push_back({{{"kind", "data"}, {"name", fs::relative(data, external_data_folder(model)).generic_string()}}, "",
                         MappedFile::open(data)});
    for (const std::string& key : std::set<std::string>(cache.keys.begin(), cache.keys.end()))
      members.push_back({{{"kind", "entry"}, {"name", key}}, "",
                         MappedFile::open(cache_entry_path(compile.cache_dir, key))});
  };
  RunSummary summary = run_reported({model}, compile, [&](RunSummary& s, bool& checked) {
    run_stages({model}, compile, backends, hooks, s, checked);
  });

  const LoadOptions load = options.per_model.empty() ? LoadOptions{} : options.per_model.front();
  nlohmann::json list = nlohmann::json::array();
  for (Written& m : members) {
    m.description["size"] = m.size();
    m.description["xxh3_128"] = xxh3_128(m.data(), m.size()).hex();
    list.push_back(m.description);
  }
  const nlohmann::json header = {
      {"format", kObjectFormat}, {"ctxgen_version", CTXGEN_VERSION}, {"backend_name", options.backend},
      {"identity", identity_json(identity)}, {"target", options.target}, {"weightless", options.weightless},
      {"load", {{"fix_dims", load.fix_dims}, {"input_shapes", load.input_shapes}, {"fix_values", load.fix_values}}},
      {"job", job_description}, {"members", list}};
  const std::string text = header.dump();
  OutputFile& file = outputs.open(object);
  file.write(reinterpret_cast<const uint8_t*>(kObjectMagic), sizeof kObjectMagic);
  const uint64_t size = text.size();
  file.write(reinterpret_cast<const uint8_t*>(&size), sizeof size);
  file.write(reinterpret_cast<const uint8_t*>(text.data()), text.size());
  for (const Written& m : members) file.write(m.data(), m.size());
  outputs.finished(file.finish(object));
  outputs.commit();
  summary.outputs = outputs.written();
  return summary;
}

namespace {

struct Member {
  std::string kind, name;
  const uint8_t* data = nullptr;
  uint64_t size = 0;
};

struct ObjectFile {
  std::filesystem::path path;
  nlohmann::json header;  // its fields link reads whole are of their types (read_object)
  LoadOptions load;       // the shape options it was compiled with
  std::vector<Member> members;
  std::shared_ptr<const MappedFile> mapping;
};

LoadOptions load_options(const nlohmann::json& load);

ObjectFile read_object(const fs::path& path) {
  check_model_file(path);
  ObjectFile o;
  o.path = path;
  o.mapping = MappedFile::open(path);
  const uint8_t* data = o.mapping->data();
  const uint64_t size = o.mapping->size();
  const auto refuse = [&](const std::string& why) { return Error(ErrorCode::kInvalidBinary, path.string() + ": " + why); };
  if (size < 16 || std::memcmp(data, kObjectMagic, 8) != 0) throw refuse("not a ctxgen object (compile --object writes them)");
  uint64_t described = 0;
  std::memcpy(&described, data + 8, 8);
  if (described > size - 16) throw refuse("its header reaches past its end");
  o.header = nlohmann::json::parse(data + 16, data + 16 + described, nullptr, false);
  if (o.header.is_discarded() || !o.header.is_object()) throw refuse("its header is not JSON");
  try {
    if (o.header.at("format") != kObjectFormat)
      throw refuse("an object of format " + o.header.at("format").dump() + "; this ctxgen reads \"" + kObjectFormat +
                   "\": compile it again with this one");
    uint64_t at = 16 + described;
    for (const auto& m : o.header.at("members")) {
      Member member{m.at("kind"), m.at("name"), nullptr, m.at("size")};
      if (member.size > size - at) throw refuse("member " + member.name + " reaches past its end");
      member.data = data + at;
      at += member.size;
      if (xxh3_128(member.data, member.size).hex() != m.at("xxh3_128").get<std::string>())
        throw refuse("member " + member.name + " does not hash to what its header records: the object is damaged");
      // Names as compile --object writes them: a model's file name, a data file's path below the
      // model's folder, an entry's key.
      const fs::path name(member.name);
      bool plain = !name.empty() && !name.is_absolute() && name.lexically_normal() == name && member.name.back() != '/';
      for (const auto& part : name) plain = plain && part != ".." && part != ".";
      if (member.kind == "model") plain = plain && name.filename() == name;
      if (member.kind == "entry") plain = member.name.size() == 32 && member.name.find_first_not_of("0123456789abcdef") == std::string::npos;
      if (!plain) throw refuse("member name '" + member.name + "' is not a name compile --object writes");
      o.members.push_back(member);
    }
    if (at != size) throw refuse("bytes after its last member");
    // What link compares and names before it reads the model: found, and of their types.
    const auto& h = o.header;
    const auto& id = h.at("identity");
    if (!h.at("ctxgen_version").is_string() || !h.at("backend_name").is_string() || !h.at("target").is_string() ||
        !h.at("weightless").is_boolean() || !id.is_object() || !id.at("backend").is_string() ||
        !id.at("sdk_version").is_string() || !id.at("hardware_architecture").is_string())
      throw refuse("its header is not an object's: a field of another type");
    o.load = load_options(h.at("load"));
    // The model and its data files unpack side by side: no name may be a folder another needs.
    std::set<fs::path> files;
    for (const Member& m : o.members)
      if ((m.kind == "model" || m.kind == "data") && !files.insert(m.name).second) throw refuse("two members named " + m.name);
    for (const fs::path& file : files)
      for (fs::path folder = file.parent_path(); !folder.empty(); folder = folder.parent_path())
        if (files.count(folder)) throw refuse("member " + folder.string() + " is a file where member " + file.string() + " needs a folder");
  } catch (const nlohmann::json::exception& e) {
    throw refuse(std::string("its header is not an object's: ") + e.what());
  }
  if (std::count_if(o.members.begin(), o.members.end(), [](const Member& m) { return m.kind == "model"; }) != 1)
    throw refuse("it holds no model, or more than one");
  return o;
}

void write_member(const fs::path& path, const Member& m) {
  fs::create_directories(path.parent_path());
  OutputFile file(path);
  file.write(m.data, m.size);
  file.finish(path);
}

}  // namespace

namespace {

std::string model_name(const ObjectFile& o) {
  for (const Member& m : o.members)
    if (m.kind == "model") return m.name;
  return "";
}

LoadOptions load_options(const nlohmann::json& load) {
  LoadOptions l;
  l.fix_dims = load.at("fix_dims").get<std::map<std::string, int64_t>>();
  l.input_shapes = load.at("input_shapes").get<std::map<std::string, std::vector<int64_t>>>();
  l.fix_values = load.at("fix_values").get<std::map<std::string, std::vector<std::string>>>();
  return l;
}

// Each weight's TensorProto, found by the reference it holds; false when one refers to no weight.
bool point_weights(onnx::GraphProto& graph, std::vector<Weight>& weights) {
  for (auto& t : *graph.mutable_initializer()) {
    const int64_t ref = weight_ref(t);
    if (ref >= static_cast<int64_t>(weights.size())) return false;
    if (ref >= 0) weights[static_cast<size_t>(ref)].tensor = &t;
  }
  for (auto& node : *graph.mutable_node())
    for (auto& a : *node.mutable_attribute()) {
      if (a.has_g() && !point_weights(*a.mutable_g(), weights)) return false;
      for (auto& g : *a.mutable_graphs())
        if (!point_weights(g, weights)) return false;
    }
  return true;
}

// The bytes a tensor of `dtype` and `dims` holds; nullopt for dims no tensor has.
std::optional<uint64_t> tensor_bytes_of(int32_t dtype, const std::vector<int64_t>& dims) {
  uint64_t count = 1;
  for (int64_t d : dims)
    if (d < 0 || __builtin_mul_overflow(count, static_cast<uint64_t>(d), &count)) return std::nullopt;
  if (is_4bit(dtype)) return (count + 1) / 2;
  uint64_t bytes = 0;
  if (element_size(dtype) == 0 || __builtin_mul_overflow(count, element_size(dtype), &bytes)) return std::nullopt;
  return bytes;
}

// The job compile --object described (describe_job), its model at `path`: beside it the object's
// files of external data, unpacked; its other weights views of the object.
void read_job(Job& job, const ObjectFile& o, const fs::path& path) {
  const auto refuse = [&](const std::string& why) { return Error(ErrorCode::kInvalidBinary, o.path.string() + ": " + why); };
  const nlohmann::json& d = o.header.at("job");
  const Member* graph = nullptr;
  const Member* held = nullptr;
  for (const Member& m : o.members) {
    if (m.kind == "model") graph = &m;
    if (m.kind == "weights") held = &m;
  }
  if (held == nullptr) throw refuse("it holds no weights member");
  Model& model = job.model;
  model.path = path;
  model.proto = std::make_unique<onnx::ModelProto>();
  if (graph->size > static_cast<uint64_t>(std::numeric_limits<int>::max()) ||
      !model.proto->ParseFromArray(graph->data, static_cast<int>(graph->size)))
    throw refuse("its model member is not an ONNX model");
  // Counts, sizes and indices are whole numbers; a float or a negative one is a damaged header.
  const auto whole = [&](const nlohmann::json& j) -> uint64_t {
    if (!j.is_number_unsigned()) throw refuse("its header holds " + j.dump() + " where a count or an index belongs");
    return j.get<uint64_t>();
  };
  std::set<std::string> data_members;
  for (const Member& m : o.members)
    if (m.kind == "data") data_members.insert(m.name);
  // Views of the object's bytes keep the mapping, not a file: they are not external data.
  const auto bytes_at = [&](uint64_t offset, uint64_t size) {
    if (offset > held->size || size > held->size - offset) throw refuse("a weight reaches past its weights member");
    TensorData data;
    data.data = held->data + offset;
    data.size = size;
    data.owner = o.mapping;
    return data;
  };
  std::map<std::string, std::shared_ptr<const MappedFile>> files;
  std::vector<bool> has_bytes;
  for (const auto& j : d.at("weights")) {
    Weight w;
    w.name = j.at("name");
    const uint64_t origin = whole(j.at("origin"));
    if (origin > static_cast<uint64_t>(WeightOrigin::kFolded)) throw refuse("a weight of no known origin");
    w.origin = static_cast<WeightOrigin>(origin);
    w.graph = j.at("graph");
    w.external = j.at("external");
    w.data.dtype = j.at("dtype");
    w.data.dims = j.at("dims").get<std::vector<int64_t>>();
    const uint64_t size = whole(j.at("size"));
    has_bytes.push_back(j.contains("data") || j.contains("held"));
    if (has_bytes.back() && tensor_bytes_of(w.data.dtype, w.data.dims) != size)
      throw refuse("weight '" + w.name + "' holds " + std::to_string(size) + " bytes, not what its type and dims need");
    if (j.contains("data")) {
      // One of the object's files, never a path of the header's choosing.
      const std::string name = j.at("data");
      if (!data_members.count(name)) throw refuse("weight '" + w.name + "' is in '" + name + "', which the object does not hold");
      auto& file = files[name];
      if (!file) file = MappedFile::open(path.parent_path() / name);
      const uint64_t offset = whole(j.at("offset"));
      if (offset > file->size() || size > file->size() - offset) throw refuse("weight '" + w.name + "' reaches past " + name);
      w.data.data = file->data() + offset;
      w.data.size = size;
      w.data.owner = file;
      w.data.file = file;
      w.data.file_offset = offset;
    } else if (j.contains("held")) {
      const TensorData bytes = bytes_at(whole(j.at("held")), size);
      w.data.data = bytes.data;
      w.data.size = bytes.size;
      w.data.owner = bytes.owner;
    }
    model.weights.push_back(std::move(w));
  }
  if (!point_weights(*model.proto->mutable_graph(), model.weights)) throw refuse("its model refers to a weight it does not hold");
  // Every weight the graph still reads has its bytes.
  std::set<int64_t> read;
  const auto used = names_in_use(model.graph());
  weights_read(model.graph(), &used, read);
  for (int64_t w : read)
    if (!has_bytes[static_cast<size_t>(w)]) throw refuse("its model reads weight '" + model.weights[static_cast<size_t>(w)].name +
                                                         "', whose bytes it does not hold");
  for (const auto& [name, index] : d.at("constants").items()) {
    if (whole(index) >= model.weights.size()) throw refuse("constant '" + name + "' is no weight");
    model.constants[name] = whole(index);
  }
  for (const auto& [name, j] : d.at("value_types").items()) {
    ValueType& type = model.value_types[name];
    type.elem_type = j.at("elem_type");
    if (!j.at("dims").is_null()) type.dims = j.at("dims").get<std::vector<int64_t>>();
    type.dim_names = j.at("dim_names").get<std::vector<std::string>>();
  }
  for (const auto& [name, j] : d.at("fixed_values").items()) {
    Model::FixedValue& v = model.fixed_values[name];
    v.dims = j.at("dims").get<std::vector<int64_t>>();
    v.values = j.at("values").get<std::vector<std::string>>();
    v.bytes = j.at("bytes").get<std::vector<uint8_t>>();
    v.position = whole(j.at("position"));
    v.had_default = j.at("had_default");
    const TensorData declared = bytes_at(whole(j.at("declared")), whole(j.at("declared_size")));
    if (declared.size > static_cast<uint64_t>(std::numeric_limits<int>::max()) ||
        !v.declared.ParseFromArray(declared.data, static_cast<int>(declared.size)))
      throw refuse("input '" + name + "' is declared unreadably");
  }
  job.input_nodes = d.at("input_nodes");
  const nlohmann::json& sp = d.at("specialised");
  job.specialised = {sp.at("folded_nodes"), sp.at("removed_nodes"), sp.at("typed_values"), sp.at("inlined_branches"),
                     sp.at("folded_by_op").get<std::map<std::string, size_t>>()};
  // Each node of the graph in one partition or on CPU, exactly once.
  std::vector<bool> placed(static_cast<size_t>(model.graph().node_size()), false);
  const auto node_index = [&](const nlohmann::json& j) {
    const uint64_t node = whole(j);
    if (node >= placed.size()) throw refuse("its partitions name a node its model lacks");
    if (placed[node]) throw refuse("its partitions place node " + std::to_string(node) + " twice");
    placed[node] = true;
    return static_cast<size_t>(node);
  };
  for (const auto& j : d.at("partitions")) {
    Partition p;
    for (const auto& n : j.at("nodes")) p.nodes.push_back(node_index(n));
    p.inputs = j.at("inputs").get<std::vector<std::string>>();
    p.outputs = j.at("outputs").get<std::vector<std::string>>();
    p.constants = j.at("constants").get<std::vector<std::string>>();
    if (p.nodes.empty()) throw refuse("a partition of no nodes");
    job.plan.partitions.push_back(std::move(p));
  }
  for (const auto& j : d.at("cpu_nodes")) job.plan.cpu_nodes.push_back({node_index(j.at("node")), j.at("reason")});
  if (std::find(placed.begin(), placed.end(), false) != placed.end()) throw refuse("its partitions leave a node out");
}

}  // namespace

RunSummary link_objects(const std::vector<fs::path>& given, CompileOptions options, const BackendRegistry& backends,
                        const std::vector<std::pair<std::string, LoadOptions>>* group) {
  if (given.empty()) throw Error(ErrorCode::kUsage, "link: give the objects");
  if (options.output_dir.empty()) throw Error(ErrorCode::kUsage, "link: give --output-dir");
  std::vector<ObjectFile> read;
  std::vector<fs::path> objects = given;
  for (const fs::path& object : objects) read.push_back(read_object(object));
  if (group != nullptr) {
    // The manifest's order, one object per model, each compiled as the manifest says.
    std::vector<ObjectFile> ordered;
    std::vector<fs::path> ordered_paths;
    for (const auto& [name, load] : *group) {
      size_t found = read.size();
      for (size_t i = 0; i < read.size(); ++i)
        if (model_name(read[i]) == name) {
          if (found != read.size())
            throw Error(ErrorCode::kUsage, "link: " + objects[found].string() + " and " + objects[i].string() + " both hold " + name);
          found = i;
        }
      if (found == read.size()) throw Error(ErrorCode::kUsage, "link: no object holds " + name + ", a model of the manifest");
      const LoadOptions& compiled = read[found].load;
      if (compiled.fix_dims != load.fix_dims || compiled.input_shapes != load.input_shapes || compiled.fix_values != load.fix_values)
        throw Error(ErrorCode::kUsage, "link: " + objects[found].string() + " was compiled with other shape options than the "
                                       "manifest gives " + name + ": compile it with --manifest");
      ordered.push_back(std::move(read[found]));
      ordered_paths.push_back(objects[found]);
    }
    if (ordered.size() != read.size())
      throw Error(ErrorCode::kUsage, "link: " + std::to_string(read.size()) + " objects for the manifest's " +
                                         std::to_string(ordered.size()) + " models");
    read = std::move(ordered);
    objects = std::move(ordered_paths);
  }
  // Every object from this ctxgen, for one backend, SDK and CPU level, with the same options.
  const nlohmann::json& first = read.front().header;
  for (size_t i = 0; i < read.size(); ++i) {
    const nlohmann::json& h = read[i].header;
    const std::string who = objects[i].string();
    if (h.value("ctxgen_version", "") != CTXGEN_VERSION)
      throw Error(ErrorCode::kInvalidBinary, who + " was compiled by ctxgen " + h.value("ctxgen_version", "?") +
                                                 "; this is ctxgen " + CTXGEN_VERSION + ": compile it again with this one");
    if (h.at("backend_name") != first.at("backend_name") || h.at("target") != first.at("target") ||
        h.at("weightless") != first.at("weightless") || h.at("identity") != first.at("identity"))
      throw Error(ErrorCode::kUsage, who + " was compiled for " + identity_text(h.at("identity")) +
                                         (h.value("weightless", false) ? ", weightless" : "") + ", " + objects[0].string() +
                                         " for " + identity_text(first.at("identity")) +
                                         (first.value("weightless", false) ? ", weightless" : "") +
                                         ": the objects of one link are compiled alike");
  }
  options.backend = first.at("backend_name");
  options.target = first.at("target");
  options.weightless = first.at("weightless");
  const nlohmann::json identity = identity_json(configured_backend(backends, options)->identity());
  if (identity != first.at("identity"))
    throw Error(ErrorCode::kInvalidBinary, objects[0].string() + " was compiled for " + identity_text(first.at("identity")) +
                                               "; this ctxgen compiles for " + identity_text(identity) +
                                               ": link it where it was compiled, or compile it again here");

  // The files of external data side by side, as `share` needs a weightless group's models (one
  // folder); the entries as a cache.
  const TemporaryFolder staging("link");
  const fs::path models = staging.path() / "models", cache = staging.path() / "cache";
  std::vector<fs::path> inputs;
  options.per_model.clear();
  std::set<fs::path> unpacked;
  for (size_t i = 0; i < read.size(); ++i) {
    // Each object's model and data in a folder of their own, as the models were compiled, but for
    // a weightless group's: share reads those from one folder.
    const fs::path folder = options.weightless ? models : models / std::to_string(i);
    for (const Member& m : read[i].members) {
      const fs::path path = m.kind == "entry" ? cache_entry_path(cache, m.name) : folder / m.name;
      // Another object's file where this one needs a folder, or the reverse (one folder: weightless).
      const auto clashes = [&] {
        for (fs::path up = path.parent_path(); up != folder && up.has_relative_path(); up = up.parent_path())
          if (unpacked.count(up)) return true;
        for (const fs::path& other : unpacked) {
          const fs::path from_here = other.lexically_relative(path);
          if (from_here.empty() || *from_here.begin() != "..") return true;
        }
        return false;
      };
      if ((m.kind == "model" || m.kind == "data") && (clashes() || !unpacked.insert(path).second))
        throw Error(ErrorCode::kUsage, objects[i].string() + " holds " + m.name + ", which another object holds too (or a "
                                       "file or folder of that name): the weightless models of one link are read from "
                                       "one folder, so they need different file names");
      if (m.kind == "model") inputs.push_back(path);
      if ((m.kind == "data" || m.kind == "entry") && !fs::exists(path)) write_member(path, m);
    }
    options.per_model.push_back(read[i].load);
  }
  options.cache_dir = cache;
  options.cache_only = true;
  options.remote_cache = nullptr;
  options.cache_max_size.reset();
  options.read_files.insert(options.read_files.end(), objects.begin(), objects.end());
  JobHooks hooks;
  hooks.prepared = [&](Job& job, size_t m) {
    try {
      read_job(job, read[m], inputs[m]);
    } catch (const nlohmann::json::exception& e) {
      throw Error(ErrorCode::kInvalidBinary, objects[m].string() + ": its header is not an object's: " + e.what());
    } catch (const std::logic_error& e) {  // a weight reference that is not a number (weight_ref)
      throw Error(ErrorCode::kInvalidBinary, objects[m].string() + ": its model's weight references are damaged: " + e.what());
    }
  };
  RunSummary summary;
  try {
    summary = run_reported(inputs, options, [&](RunSummary& s, bool& checked) {
      run_stages(inputs, options, backends, hooks, s, checked);
    });
  } catch (const Error& e) {
    // Named by the objects, not by where link unpacked them.
    std::string message = e.what();
    for (size_t i = 0; i < inputs.size(); ++i)
      for (size_t at; (at = message.find(inputs[i].string())) != std::string::npos;)
        message.replace(at, inputs[i].string().size(), objects[i].string() + " (" + inputs[i].filename().string() + ")");
    throw Error(e.code(), message);
  }
  for (size_t i = 0; i < summary.models.size() && i < objects.size(); ++i) summary.models[i].input = objects[i];
  return summary;
}

}  // namespace ctxgen
