#include "package.h"

#include <fcntl.h>
#include <nettle/sha2.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <set>

#include <nlohmann/json.hpp>
#include <onnx/onnx_pb.h>

#include "ctxgen/context_path.h"
#include "ctxgen/error.h"
#include "ctxgen/format.h"
#include "ctxgen/outputs.h"
#include "ctxgen/pipeline.h"
#include "ctxgen/runtime.h"

namespace fs = std::filesystem;

namespace ctxgen::cli {
namespace {

constexpr const char* kManifestSchema = "1.0";  // ONNX Runtime 1.29 reads schema major 1

std::string sha256_hex(const uint8_t* data, size_t size) {
  sha256_ctx ctx;
  sha256_init(&ctx);
  // nettle takes lengths as size_t; a mapped file's bytes go in one call.
  sha256_update(&ctx, size, data);
  uint8_t digest[SHA256_DIGEST_SIZE];
  sha256_digest(&ctx, sizeof digest, digest);
  static constexpr char kHex[] = "0123456789abcdef";
  std::string hex;
  for (uint8_t byte : digest) {
    hex += kHex[byte >> 4];
    hex += kHex[byte & 15];
  }
  return hex;
}

std::string file_sha256(const fs::path& path) {
  if (fs::file_size(path) == 0) return sha256_hex(nullptr, 0);
  const auto file = MappedFile::open(path);
  return sha256_hex(file->data(), file->size());
}

// ONNX Runtime's content address of a folder of files (its model_package/README.md): the SHA-256
// of the lines "<file's SHA-256>  <path in the folder>\n", sorted by path.
std::string folder_sha256(const fs::path& folder) {
  std::vector<std::pair<std::string, std::string>> files;
  for (const auto& entry : fs::recursive_directory_iterator(folder))
    if (entry.is_regular_file())
      files.emplace_back(entry.path().lexically_relative(folder).generic_string(), file_sha256(entry.path()));
  std::sort(files.begin(), files.end());
  std::string text;
  for (const auto& [path, hash] : files) text += hash + "  " + path + "\n";
  return sha256_hex(reinterpret_cast<const uint8_t*>(text.data()), text.size());
}

// The package being written: where its files go, and the shared assets made so far.
class Package {
 public:
  explicit Package(fs::path root) : root_(std::move(root)) {}
  const fs::path& root() const { return root_; }
  fs::path assets() const { return root_ / kPackageSharedAssets; }

  // A fresh folder to fill with the files of one shared asset.
  fs::path new_asset() {
    const fs::path folder = assets() / (".new-" + std::to_string(made_++));
    fs::create_directories(folder);
    return folder;
  }
  // Names a folder new_asset() gave by its content; returns the hash.
  std::string seal_asset(const fs::path& folder) {
    const std::string hex = folder_sha256(folder);
    const fs::path named = assets() / (kSharedAssetFolderPrefix + hex);
    if (fs::exists(named)) {
      fs::remove_all(folder);  // the same content is there already
    } else {
      fs::rename(folder, named);
      ++sealed_;
    }
    return hex;
  }
  size_t sealed() const { return sealed_; }

 private:
  fs::path root_;
  size_t made_ = 0;
  size_t sealed_ = 0;
};

// Where a file of the package lives: in one variant's folder, or in a shared asset.
struct Placed {
  std::string asset;     // the asset's SHA-256, or empty
  fs::path folder;       // the folder holding the file, in the package
  std::string name;      // the file's name
  // The path a file in `from` (a folder of the package) names it by.
  std::string relative_to(const fs::path& from) const { return (folder / name).lexically_relative(from).generic_string(); }
};

struct Variant {
  std::string component;  // the input model's stem
  size_t level = 0;       // index into the levels
  fs::path source;        // the level's _ctx.onnx
  onnx::ModelProto model;
  std::string binary;                   // ep_cache_context of its main EPContext nodes, or empty
  std::set<std::string> data_files;     // external data its tensors name
  fs::path folder;                      // its folder in the package
  std::optional<std::string> data_asset;  // the shared asset holding its data files
};

bool is_main_context_node(const onnx::NodeProto& node) {
  if (node.op_type() != "EPContext") return false;
  int64_t main = 1, embed = 0;
  for (const auto& a : node.attribute()) {
    if (a.name() == "main_context") main = a.i();
    if (a.name() == "embed_mode") embed = a.i();
  }
  return main == 1 && embed == 0;
}

std::string cache_context(const onnx::NodeProto& node) {
  for (const auto& a : node.attribute())
    if (a.name() == "ep_cache_context") return a.s();
  return {};
}

void set_cache_context(onnx::NodeProto& node, const std::string& path) {
  for (auto& a : *node.mutable_attribute())
    if (a.name() == "ep_cache_context") a.set_s(path);
}

void collect_data_files(const onnx::GraphProto& graph, std::set<std::string>& files) {
  for (const auto& tensor : graph.initializer())
    if (tensor.data_location() == onnx::TensorProto::EXTERNAL)
      for (const auto& entry : tensor.external_data())
        if (entry.key() == "location") files.insert(entry.value());
  for (const auto& node : graph.node())
    for (const auto& a : node.attribute()) {
      if (a.has_g()) collect_data_files(a.g(), files);
      for (const auto& g : a.graphs()) collect_data_files(g, files);
    }
}

Variant read_variant(const fs::path& model, size_t level, const fs::path& level_folder) {
  Variant v;
  v.component = file_stem(model);
  v.level = level;
  v.source = level_folder / (v.component + "_ctx.onnx");
  std::ifstream in(v.source, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), {});
  if (!in.good() && !in.eof()) throw Error(ErrorCode::kIo, v.source.string() + ": cannot read");
  if (!v.model.ParseFromString(bytes)) throw Error(ErrorCode::kInternal, v.source.string() + ": not an ONNX model");
  for (const auto& node : v.model.graph().node())
    if (is_main_context_node(node)) {
      const std::string named = cache_context(node);
      if (!v.binary.empty() && named != v.binary)
        throw Error(ErrorCode::kInternal, v.source.string() + ": main EPContext nodes name two binaries");
      v.binary = named;
    }
  collect_data_files(v.model.graph(), v.data_files);
  return v;
}

std::string metadata(const onnx::ModelProto& model, const std::string& key) {
  for (const auto& p : model.metadata_props())
    if (p.key() == key) return p.value();
  return {};
}

CompiledGraph compiled(const GraphRecord& record) {
  CompiledGraph graph;
  graph.name = record.name;
  graph.inputs = record.inputs;
  graph.outputs = record.outputs;
  graph.fixed_inputs = record.fixed_inputs;
  graph.program.assign(record.program, record.program + record.program_size);
  graph.weight_ids = record.weight_ids;
  return graph;
}

// A weight of `binary` as bytes to write, viewed in place.
WeightPayload payload_of(const std::shared_ptr<const ContextBinary>& binary, uint32_t id) {
  Blob blob;
  blob.data = binary->weight_data(id);
  blob.size = binary->weights()[id].size;
  blob.owner = binary;
  return WeightPayload{binary->weights()[id].hash, std::move(blob)};
}

struct HashLess {
  bool operator()(const Hash128& a, const Hash128& b) const { return a.high != b.high ? a.high < b.high : a.low < b.low; }
};

// The weights every level's binary holds byte for byte (those no level packs for itself).
std::set<Hash128, HashLess> common_weights(const std::vector<std::shared_ptr<const ContextBinary>>& binaries) {
  std::set<Hash128, HashLess> common;
  if (binaries.size() < 2) return common;
  for (const auto& w : binaries.front()->weights()) common.insert(w.hash);
  for (size_t l = 1; l < binaries.size(); ++l) {
    std::set<Hash128, HashLess> here;
    for (const auto& w : binaries[l]->weights())
      if (common.count(w.hash)) here.insert(w.hash);
    common = std::move(here);
  }
  return common;
}

uint64_t folder_bytes(const fs::path& folder) {
  uint64_t bytes = 0;
  for (const auto& entry : fs::recursive_directory_iterator(folder))
    if (entry.is_regular_file()) bytes += entry.file_size();
  return bytes;
}

// The files of a package, relative to its folder, as ctxgen lists them in the manifest.
std::vector<std::string> files_under(const fs::path& folder) {
  std::vector<std::string> files;
  for (const auto& entry : fs::recursive_directory_iterator(folder))
    if (!entry.is_directory() || entry.is_symlink())  // a link, even to a folder, is a file of the package
      files.push_back(entry.path().lexically_relative(folder).generic_string());
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace

void check_replaceable(const fs::path& package, const std::string& named) {
  const std::string label = named.empty() ? package.string() : named;
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(package, ec))) return;
  if (!fs::is_directory(package, ec))
    throw Error(ErrorCode::kUsage, label + ": --package names a folder, and this is a file");
  if (fs::is_empty(package, ec)) return;
  std::ifstream in(package / kPackageManifest);
  const auto manifest = nlohmann::json::parse(in, nullptr, false);
  std::set<std::string> known = {kPackageManifest};
  const auto& metadata = manifest.is_object() && manifest.contains("additional_metadata") ? manifest["additional_metadata"]
                                                                                          : manifest;
  const bool ours = metadata.is_object() && metadata.contains("producer") && metadata["producer"] == "ctxgen" &&
                    metadata.contains("files") && metadata["files"].is_array();
  if (!ours)
    throw Error(ErrorCode::kUsage, label + ": a folder that is not empty and is not a model package ctxgen wrote (its "
                                           "manifest.json lists its files); --package writes a new or empty folder, "
                                           "or replaces (--force) a package ctxgen wrote");
  for (const auto& file : metadata["files"])
    if (file.is_string()) known.insert(file.get<std::string>());
  std::string extra;
  size_t extras = 0;
  for (const std::string& file : files_under(package))
    if (!known.count(file) && ++extras <= 3) extra += (extra.empty() ? "" : ", ") + file;
  if (extras > 0)
    throw Error(ErrorCode::kUsage, label + ": holds " + std::to_string(extras) +
                                       " file(s) the package ctxgen wrote there does not (" + extra +
                                       (extras > 3 ? ", ..." : "") +
                                       "); replacing the package would delete them: move them out first");
}

void check_names(const std::vector<fs::path>& models, const std::string& data_file) {
  std::set<std::string> seen;
  for (const auto& model : models) {
    const std::string stem = file_stem(model);
    // A component is a folder of the package, next to its manifest and shared assets.
    if (stem.empty() || stem[0] == '.' || stem == kPackageSharedAssets || stem == kPackageManifest)
      throw Error(ErrorCode::kUsage, model.string() + ": a package's component is named by the model's stem, and '" +
                                         stem + "' cannot name one (empty, hidden, '" + kPackageSharedAssets +
                                         "' or '" + kPackageManifest + "'); rename the model");
    try {
      (void)nlohmann::json(stem).dump();
    } catch (const nlohmann::json::exception&) {
      throw Error(ErrorCode::kUsage, model.string() + ": the model's stem is not UTF-8 text, which a package manifest "
                                                      "must name its components in; rename the model");
    }
    if (!seen.insert(stem).second)
      throw Error(ErrorCode::kUsage, model.string() + ": another model has the stem '" + stem +
                                         "', and each names a component of the package; rename one");
  }
  if (data_file.find('/') != std::string::npos || data_file.empty() || data_file[0] == '.' || data_file == kPackageManifest)
    throw Error(ErrorCode::kUsage, "--external-initializers-file " + data_file +
                                       ": in a package it is a file of a variant's folder or of a shared asset, so a "
                                       "plain name, not hidden and not " + kPackageManifest);
}

std::vector<std::string> highest_first(std::vector<std::string> levels) {
  const std::vector<std::string> order = runtime::cpu_levels();
  const auto rank = [&](const std::string& level) { return std::find(order.begin(), order.end(), level) - order.begin(); };
  std::stable_sort(levels.begin(), levels.end(), [&](const auto& a, const auto& b) { return rank(a) > rank(b); });
  return levels;
}

PackageContents write_package(const std::vector<fs::path>& models, const std::vector<LevelOutputs>& levels,
                              const fs::path& folder) {
  Package package(folder);
  PackageContents contents;
  std::vector<Variant> variants;
  for (size_t l = 0; l < levels.size(); ++l)
    for (const auto& model : models) {
      variants.push_back(read_variant(model, l, levels[l].folder));
      variants.back().folder = folder / variants.back().component / levels[l].level;
      fs::create_directories(variants.back().folder);
    }

  // Each level's binary (one per level: `share` writes one for all its models).
  std::vector<std::shared_ptr<const ContextBinary>> binaries(levels.size());
  std::vector<std::string> binary_names(levels.size());
  for (const Variant& v : variants) {
    if (v.binary.empty()) continue;
    if (!binary_names[v.level].empty() && binary_names[v.level] != v.binary)
      throw Error(ErrorCode::kInternal, "the models of level " + levels[v.level].level + " name two context binaries");
    binary_names[v.level] = v.binary;
  }
  for (size_t l = 0; l < levels.size(); ++l) {
    if (binary_names[l].empty())
      throw Error(ErrorCode::kNothingCompiled, "--package: nothing compiled for " + levels[l].level +
                                                   ", so the package would have no variant for its EP");
    binaries[l] = ContextBinary::open(levels[l].folder / binary_names[l]);
  }

  // The weights every level shares, written once: a weights file in a shared asset.
  const std::set<Hash128, HashLess> common = common_weights(binaries);
  std::optional<Placed> shared_weights;
  Hash128 shared_weights_id;
  std::map<Hash128, uint64_t, HashLess> shared_offset;
  if (!common.empty()) {
    std::vector<WeightPayload> payloads;
    std::set<Hash128, HashLess> taken;
    for (uint32_t id = 0; id < binaries[0]->weights().size(); ++id)
      if (common.count(binaries[0]->weights()[id].hash) && taken.insert(binaries[0]->weights()[id].hash).second)
        payloads.push_back(payload_of(binaries[0], id));
    const BinaryIdentity& identity = binaries[0]->identity();
    const fs::path asset = package.new_asset();
    const std::string name = file_stem(binary_names[0]) + "_shared.bin";
    OutputFile out(asset / name);
    shared_weights_id = write_context_binary({identity.backend, identity.sdk_version, "", identity.format_version}, {},
                                             payloads, out.sink(), out.patcher())
                            .content_id;
    out.finish(asset / name);
    const auto written = ContextBinary::open(asset / name);
    for (const WeightRecord& w : written->weights()) {
      shared_offset[w.hash] = w.offset;
      contents.shared_weight_bytes += w.size;
    }
    const std::string hex = package.seal_asset(asset);
    shared_weights = Placed{hex, package.assets() / (kSharedAssetFolderPrefix + hex), name};
  }

  // Each level's binary without the shared weights: in the variant's folder when one model uses
  // it, in a shared asset when the models of a `share` do.
  std::vector<Placed> placed_binaries(levels.size());
  std::vector<std::string> binary_ids(levels.size());
  for (size_t l = 0; l < levels.size(); ++l) {
    const bool shared = models.size() > 1;
    const fs::path target = shared ? package.new_asset() : variants[l * models.size()].folder;
    std::vector<WeightFile> files;
    if (shared_weights) files.push_back({shared_weights->relative_to(target), WeightFileKind::kWeights, shared_weights_id, {}});
    std::vector<WeightPayload> payloads;
    for (uint32_t id = 0; id < binaries[l]->weights().size(); ++id) {
      payloads.push_back(payload_of(binaries[l], id));
      if (!common.count(payloads.back().hash.value())) continue;
      payloads.back().file = 1;
      payloads.back().file_offset = shared_offset.at(*payloads.back().hash);
    }
    std::vector<CompiledGraph> graphs;
    for (const GraphRecord& record : binaries[l]->graphs()) graphs.push_back(compiled(record));
    const fs::path path = target / binary_names[l];
    OutputFile out(path);
    const WrittenBinary written =
        write_context_binary(binaries[l]->identity(), graphs, payloads, out.sink(), out.patcher(), files);
    out.finish(path);
    binary_ids[l] = written.content_id.hex();
    if (shared) {
      const std::string hex = package.seal_asset(target);
      placed_binaries[l] = Placed{hex, package.assets() / (kSharedAssetFolderPrefix + hex), binary_names[l]};
    } else {
      placed_binaries[l] = Placed{"", target, binary_names[l]};
    }
  }

  // The files CPU nodes read their weights from: one shared asset for the variants whose files are
  // the same bytes (every level's, usually), moved into the variant's folder when only it reads them.
  std::map<std::vector<std::pair<std::string, std::string>>, std::vector<size_t>> by_content;
  for (size_t i = 0; i < variants.size(); ++i) {
    if (variants[i].data_files.empty()) continue;
    std::vector<std::pair<std::string, std::string>> key;
    for (const auto& name : variants[i].data_files)
      key.emplace_back(name, file_sha256(levels[variants[i].level].folder / name));
    by_content[key].push_back(i);
  }
  for (const auto& [key, users] : by_content) {
    const Variant& first = variants[users.front()];
    // Moved, not copied: the levels' outputs go with the staging folder.
    if (users.size() == 1) {
      for (const auto& [name, hash] : key) fs::rename(levels[first.level].folder / name, first.folder / name);
      continue;
    }
    const fs::path asset = package.new_asset();
    for (const auto& [name, hash] : key) fs::rename(levels[first.level].folder / name, asset / name);
    const std::string hex = package.seal_asset(asset);
    for (size_t i : users) variants[i].data_asset = hex;
  }

  // The models, naming their level's binary where it now is.
  nlohmann::ordered_json components = nlohmann::ordered_json::object();
  for (Variant& v : variants) {
    for (auto& node : *v.model.mutable_graph()->mutable_node())
      if (is_main_context_node(node)) set_cache_context(node, placed_binaries[v.level].relative_to(v.folder));
    for (auto& p : *v.model.mutable_metadata_props())
      if (p.key() == kContentIdMetadataKey) p.set_value(binary_ids[v.level]);
    const std::string model_file = v.component + "_ctx.onnx";
    std::string bytes;
    if (!v.model.SerializeToString(&bytes))
      throw Error(ErrorCode::kInternal, v.source.string() + ": cannot serialise the package's copy");
    OutputFile out(v.folder / model_file);
    out.write(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    out.finish(v.folder / model_file);

    nlohmann::ordered_json ort = {{"model_file", model_file}};
    // ONNX Runtime resolves a sha256: folder in a variant's session options to the shared asset.
    if (v.data_asset)
      ort["session_options"] = {{kExternalInitializersFolderOption, kSharedAssetPrefix + *v.data_asset}};
    const std::string ep = binaries[v.level]->identity().backend;
    nlohmann::ordered_json variant = {{"variant_directory", v.folder.lexically_relative(folder).generic_string()},
                                      {"ep", ep},
                                      {"device", "cpu"}};
    const std::string compatibility = metadata(v.model, kCompatibilityMetadataPrefix + ep);
    if (!compatibility.empty()) variant["compatibility_string"] = compatibility;
    variant["executor_info"] = {{"ort", ort}};
    if (!components.contains(v.component)) components[v.component] = {{"variants", nlohmann::ordered_json::object()}};
    components[v.component]["variants"][levels[v.level].level] = variant;
    ++contents.variants;
  }
  // The manifest lists every file, so that a later --force replaces only what ctxgen wrote.
  const nlohmann::ordered_json manifest = {
      {"schema_version", kManifestSchema},
      {"package_name", file_stem(models.front())},
      {"components", components},
      {"additional_metadata",
       {{"producer", "ctxgen"}, {"producer_version", CTXGEN_VERSION}, {"files", files_under(folder)}}}};
  const std::string text = manifest.dump(2) + "\n";
  OutputFile out(folder / kPackageManifest);
  out.write(reinterpret_cast<const uint8_t*>(text.data()), text.size());
  out.finish(folder / kPackageManifest);
  contents.shared_assets = package.sealed();
  contents.bytes = folder_bytes(folder);
  // Every file is on disk (OutputFile syncs each); so must the folders' entries be before the
  // package is put in place.
  for (const auto& entry : fs::recursive_directory_iterator(folder))
    if (entry.is_directory() && !entry.is_symlink()) sync_folder(entry.path());
  sync_folder(folder);
  return contents;
}

void sync_folder(const fs::path& folder) {
  const int fd = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  const bool synced = fd >= 0 && ::fsync(fd) == 0;
  const int err = errno;
  if (fd >= 0) ::close(fd);
  if (!synced) throw Error(ErrorCode::kIo, folder.string() + ": flushing the folder to disk failed: " + std::strerror(err));
}

}  // namespace ctxgen::cli
