// Compile and link (docs/cli.md, "Objects"). An object is one model compiled on one machine: the
// model, the files its weights are in, and its partitions' compile results as compile cache
// entries. Linking unpacks the objects and runs `share` over their models with the entries as its
// cache, a partition the entries lack being an error: the files are those `share` writes, byte for
// byte, and nothing is compiled.
//
// The file: magic, the header's size, the header (JSON: who made it, the options the model was
// compiled with, each member's name, kind, size and XXH3-128), then the members' bytes in order.

#include <algorithm>
#include <cstring>
#include <set>

#include <nlohmann/json.hpp>

#include "ctxgen/error.h"
#include "ctxgen/outputs.h"
#include "ctxgen/pipeline.h"

namespace fs = std::filesystem;

namespace ctxgen {
namespace {

constexpr char kObjectMagic[8] = {'C', 'T', 'X', 'G', 'O', 'B', 'J', '1'};

nlohmann::json identity_json(const BinaryIdentity& id) {
  return {{"backend", id.backend}, {"sdk_version", id.sdk_version}, {"hardware_architecture", id.hardware_architecture},
          {"format_version", id.format_version}};
}

std::string identity_text(const nlohmann::json& id) {
  return id.value("backend", "?") + " (SDK " + id.value("sdk_version", "?") + ", " + id.value("hardware_architecture", "?") + ")";
}

const Backend& backend_for(const BackendRegistry& backends, const std::string& name, const std::string& target) {
  const Backend* backend = backends.find(name);
  if (backend == nullptr) throw Error(ErrorCode::kUsage, "unknown backend '" + name + "'");
  if (!target.empty()) backend->target(target);
  return *backend;
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
  compile.cache_max_size = 0;  // this run's entries go into the object first
  RunSummary summary = compile_models({model}, compile, backends);

  const Backend& backend = backend_for(backends, options.backend, options.target);
  const LoadOptions load = options.per_model.empty() ? LoadOptions{} : options.per_model.front();
  std::vector<std::pair<nlohmann::json, fs::path>> members;  // description, file
  members.push_back({{{"kind", "model"}, {"name", model.filename().string()}}, model});
  const fs::path folder = external_data_folder(model);
  for (const fs::path& data : summary.models.front().data_files) {
    const fs::path relative = fs::relative(data, folder);
    if (relative.empty() || *relative.begin() == "..")
      throw Error(ErrorCode::kUsage, model.string() + " reads " + data.string() + ", outside its folder: an object holds "
                                     "only files beside the model or below");
    members.push_back({{{"kind", "data"}, {"name", relative.generic_string()}}, data});
  }
  const std::set<std::string> keys(summary.cache.keys.begin(), summary.cache.keys.end());
  for (const std::string& key : keys)
    members.push_back({{{"kind", "entry"}, {"name", key}}, compile.cache_dir / "entries" / key.substr(0, 2) / key});
  nlohmann::json list = nlohmann::json::array();
  std::vector<std::shared_ptr<const MappedFile>> mapped;
  for (auto& [description, path] : members) {
    mapped.push_back(MappedFile::open(path));
    description["size"] = mapped.back()->size();
    description["xxh3_128"] = xxh3_128(mapped.back()->data(), mapped.back()->size()).hex();
    list.push_back(description);
  }
  const nlohmann::json header = {
      {"format", "ctxgen object 1"}, {"ctxgen_version", CTXGEN_VERSION}, {"backend_name", options.backend},
      {"identity", identity_json(backend.identity())}, {"target", options.target}, {"weightless", options.weightless},
      {"load", {{"fix_dims", load.fix_dims}, {"input_shapes", load.input_shapes}, {"fix_values", load.fix_values}}},
      {"members", list}};
  const std::string text = header.dump();
  OutputFile& file = outputs.open(object);
  file.write(reinterpret_cast<const uint8_t*>(kObjectMagic), sizeof kObjectMagic);
  const uint64_t size = text.size();
  file.write(reinterpret_cast<const uint8_t*>(&size), sizeof size);
  file.write(reinterpret_cast<const uint8_t*>(text.data()), text.size());
  for (const auto& m : mapped) file.write(m->data(), m->size());
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
  nlohmann::json header;
  std::vector<Member> members;
  std::shared_ptr<const MappedFile> mapping;
};

ObjectFile read_object(const fs::path& path) {
  check_model_file(path);
  ObjectFile o;
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
    if (o.header.at("format") != "ctxgen object 1") throw refuse("an object of format " + o.header.at("format").dump());
    uint64_t at = 16 + described;
    for (const auto& m : o.header.at("members")) {
      Member member{m.at("kind"), m.at("name"), nullptr, m.at("size")};
      if (member.size > size - at) throw refuse("member " + member.name + " reaches past its end");
      member.data = data + at;
      at += member.size;
      if (xxh3_128(member.data, member.size).hex() != m.at("xxh3_128").get<std::string>())
        throw refuse("member " + member.name + " does not hash to what its header records: the object is damaged");
      const fs::path name(member.name);
      bool plain = !name.empty() && !name.is_absolute();
      for (const auto& part : name) plain = plain && part != ".." && part != ".";
      if (!plain || (member.kind == "entry" && member.name.find_first_not_of("0123456789abcdef") != std::string::npos))
        throw refuse("member name '" + member.name + "' is not a plain relative name");
      o.members.push_back(member);
    }
    if (at != size) throw refuse("bytes after its last member");
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
      const LoadOptions compiled = load_options(read[found].header.at("load"));
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
  const Backend& backend = backend_for(backends, options.backend, options.target);
  const nlohmann::json identity = identity_json(backend.identity());
  if (identity != first.at("identity"))
    throw Error(ErrorCode::kInvalidBinary, objects[0].string() + " was compiled for " + identity_text(first.at("identity")) +
                                               "; this ctxgen compiles for " + identity_text(identity) +
                                               ": link it where it was compiled, or compile it again here");

  // Unpacked side by side, as `share` needs a weightless group's models (one folder).
  const TemporaryFolder staging("link");
  const fs::path models = staging.path() / "models", cache = staging.path() / "cache";
  std::vector<fs::path> inputs;
  options.per_model.clear();
  std::set<fs::path> unpacked;
  for (size_t i = 0; i < read.size(); ++i) {
    for (const Member& m : read[i].members) {
      const fs::path path = m.kind == "entry" ? cache / "entries" / m.name.substr(0, 2) / m.name : models / m.name;
      if (m.kind != "entry" && !unpacked.insert(path).second)
        throw Error(ErrorCode::kUsage, objects[i].string() + " holds " + m.name + ", which another object holds too: the "
                                       "models of one link need different file names");
      if (m.kind == "model") inputs.push_back(path);
      if (!fs::exists(path)) write_member(path, m);
    }
    options.per_model.push_back(load_options(read[i].header.at("load")));
  }
  options.cache_dir = cache;
  options.cache_only = true;
  options.remote_cache = nullptr;
  options.cache_max_size = 0;
  RunSummary summary;
  try {
    summary = compile_models(inputs, options, backends);
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
