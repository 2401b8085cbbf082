#pragma once
// Stage 4, the context binary (<model>_<backend>.bin): a versioned container of compiled graphs
// and deduplicated weight payloads, specified byte by byte in docs/context-binary-format.md.
// The writer plans the whole layout before writing a byte and streams payloads in large
// sequential writes; the reader maps the file and validates every field and bound.

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ctxgen/bytes.h"
#include "ctxgen/compiled.h"

namespace ctxgen {

inline constexpr uint32_t kContextBinaryVersion = 4;
inline constexpr uint64_t kPayloadAlignment = 64;

// Who made the binary, in one value: a backend's compiler writes it (Backend::identity), its
// runtime runs only binaries that carry it (BackendRuntime::identity, ctxgen/backend_runtime.h).
struct BinaryIdentity {
  std::string backend;  // EP name, e.g. the `source` attribute
  std::string sdk_version;
  std::string hardware_architecture;
  uint32_t format_version = kContextBinaryVersion;  // of the container; the reader reads only its own
  bool operator==(const BinaryIdentity&) const = default;
};

// A file whose bytes a binary uses in place of holding them. Its path is relative to the binary's
// folder (a weights file) or to the source model's (source data), and follows the path rules of
// ctxgen/context_path.h.
enum class WeightFileKind : uint32_t {
  // Another context binary holding weights only, which several binaries share (a model package's
  // shared asset), pinned by its content id.
  kWeights = 0,
  // An external-data file of the model the binary was compiled from (a weightless binary): the
  // weights are its tensors' bytes, each pinned by its hash and named, so a changed tensor is named.
  kSourceData = 1,
};

struct WeightFile {
  std::string path;
  WeightFileKind kind = WeightFileKind::kWeights;
  Hash128 content_id;                // kWeights; zero for kSourceData
  std::vector<std::string> tensors;  // kSourceData: the tensor of each weight held there, by weight id
  bool operator==(const WeightFile&) const = default;
};

// A copy of `bytes` aligned as payloads are (kPayloadAlignment), for bytes used in place as a
// mapped binary's are but found elsewhere (in memory, or at any offset of a source data file).
std::shared_ptr<const uint8_t> aligned_copy(const uint8_t* bytes, size_t size);

struct WeightPayload {
  // XXH3-128 of the bytes. Absent for bytes made on demand that no one has hashed yet: the writer
  // hashes them as it writes them, so a packed weight is made once instead of twice.
  std::optional<Hash128> hash;
  Blob blob;
  // For a weight held in weight file `file` (1-based; 0: in this binary): the payload's offset in
  // that file. Such a weight needs its hash and the blob's size, not its bytes (a source data
  // file's weight may be at any offset; a weights file's are aligned).
  uint32_t file = 0;
  uint64_t file_offset = 0;
};

// Receives the binary in order; the file sink writes to a descriptor, the memory sink to a
// string (embed mode).
using ByteSink = std::function<void(const uint8_t* data, size_t size)>;
// Overwrites `size` bytes at `offset` of what a sink has received: the writer's way to fill in
// the weight table once it has hashed the payloads it lacked hashes for.
using BytePatcher = std::function<void(uint64_t offset, const uint8_t* data, size_t size)>;

// What a compiled model records under ep_compatibility_info.<EP name> (the key ONNX Runtime's
// compile API writes and GetModelCompatibilityForEpDevices judges): the format version and the
// identity a loader needs, e.g.
// "ctxgen-context-binary=4;backend=CtxgenRef;sdk=ctxgen-ref 3.7;hardware=x86_64 avx2, oneDNN 2.6.3".
std::string compatibility_info(const BinaryIdentity& identity);
// The identity such a string records, or nullopt when it is not one of ours.
std::optional<BinaryIdentity> parse_compatibility_info(const std::string& info);
inline const std::string kCompatibilityMetadataPrefix = "ep_compatibility_info.";

// Model metadata key of a compiled model: the content_id().hex() of the context binary it was
// compiled with. The plugin EP, verify and inspect refuse a model beside a binary with another id.
inline constexpr const char* kContentIdMetadataKey = "ctxgen.context_binary_id";

// Throws Error(kMismatch) naming both ids when `binary` is not the one whose id `model` (a label
// for messages) recorded.
class ContextBinary;
void check_content_id(const ContextBinary& binary, const std::string& recorded, const std::string& model);

struct WrittenBinary {
  uint64_t bytes = 0;
  Hash128 content_id;  // ContextBinary::content_id() of what was written
};

// Writes the binary through `sink`. Weight ids in the graphs index `weights`. Weights without a
// hash need `patch`: their table entries are rewritten once written. Throws Error(kIo) when the
// sink fails.
WrittenBinary write_context_binary(const BinaryIdentity& identity, const std::vector<CompiledGraph>& graphs,
                                   const std::vector<WeightPayload>& weights, const ByteSink& sink,
                                   const BytePatcher& patch = {}, const std::vector<WeightFile>& weight_files = {});

struct GraphRecord {
  std::string name;
  std::vector<IoSignature> inputs, outputs;
  const uint8_t* program = nullptr;
  uint64_t program_size = 0;
  std::vector<uint32_t> weight_ids;
  std::vector<FixedInput> fixed_inputs;
};

// What the EPContext node of a graph reads, in order: the program's inputs, then its fixed inputs.
std::vector<IoSignature> node_inputs(const GraphRecord& graph);

struct WeightRecord {
  Hash128 hash;
  uint64_t offset = 0;  // from the start of its file; a multiple of kPayloadAlignment but in source data
  uint64_t size = 0;
  uint32_t file = 0;  // 0: this binary; k: weight_files()[k - 1]
};

class ContextBinary {
 public:
  // Where a binary's source data is (the source model's folder), asked only of a binary that has
  // some; none given: the binary's folder. nullopt: not opened (for a reader of the tables only;
  // weight_data() of such a weight throws).
  using SourceFolder = std::function<std::optional<std::filesystem::path>()>;
  // Maps and validates a file, and opens the weight files it names (docs/context-binary-format.md
  // §6): each must be where the path rules allow (ctxgen/context_path.h); a weights file must have
  // the recorded content id and hold each weight used from it; a source data file, looked for in
  // `source_folder`, must hold each weight's bytes with the recorded hash. Throws
  // Error(kInvalidBinary) naming the file, the field, and the value found vs the value expected, or
  // Error(kMismatch) naming the tensor whose bytes changed.
  static std::shared_ptr<const ContextBinary> open(const std::filesystem::path& path, const SourceFolder& source_folder = {});
  // The same for the file open on `fd` (the caller keeps it), which `path` names.
  static std::shared_ptr<const ContextBinary> map(int fd, const std::filesystem::path& path,
                                                  const SourceFolder& source_folder = {});
  // Validates bytes held in memory (embed mode), which cannot name weight files; `owner` keeps them alive.
  static std::shared_ptr<const ContextBinary> from_memory(const uint8_t* data, size_t size,
                                                          std::shared_ptr<const void> owner,
                                                          const std::string& label);

  uint32_t format_version() const { return version_; }
  const BinaryIdentity& identity() const { return identity_; }
  const std::vector<GraphRecord>& graphs() const { return graphs_; }
  const GraphRecord* find_graph(const std::string& name) const;  // nullptr when absent
  const std::vector<WeightRecord>& weights() const { return weights_; }
  const std::vector<WeightFile>& weight_files() const { return weight_files_; }
  // The opened weights file k (1-based, as WeightRecord::file; of kind kWeights).
  const ContextBinary& weight_file(uint32_t k) const;
  // Where weight file k (1-based) was found; empty for source data not opened.
  std::string weight_file_label(uint32_t k) const {
    if (sources_.at(k - 1)) return sources_[k - 1]->path().string();
    return linked_.at(k - 1) ? linked_[k - 1]->label() : std::string();
  }
  const uint8_t* weight_data(uint32_t id) const;
  uint64_t file_size() const { return size_; }
  // XXH3-128 of the metadata, which holds every name, signature, program checksum and weight
  // hash: what identifies the content. A model compiled with this binary records it, so a loader
  // can tell it apart from a binary of another run (docs/context-binary-format.md §7).
  const Hash128& content_id() const { return content_id_; }
  const std::string& label() const { return label_; }
  // Checks that the source data where `source_folder` says holds the bytes this binary runs on (a
  // session using a binary another opened with its own source model); throws as open() does.
  void check_source_data(const SourceFolder& source_folder) const;
  // Re-hashes every weight payload (those in weight files too) and compares with the table, and
  // checks the padding between payloads is zero; throws Error(kInvalidBinary) naming the first
  // weight or byte that changed.
  void verify_payloads() const;

 private:
  ContextBinary() = default;
  static std::shared_ptr<const ContextBinary> from_file(std::shared_ptr<const MappedFile> file,
                                                        const std::filesystem::path& path, const SourceFolder& source_folder);
  static std::shared_ptr<ContextBinary> parse(const uint8_t* data, size_t size, std::shared_ptr<const void> owner,
                                              const std::string& label);
  void link(const std::filesystem::path& folder, const SourceFolder& source_folder);
  void link_weights_file(uint32_t k, const std::filesystem::path& folder);
  void link_source_data(uint32_t k, const std::filesystem::path& source_folder);
  std::shared_ptr<const MappedFile> checked_source_data(uint32_t k, const std::filesystem::path& source_folder) const;
  std::shared_ptr<const void> owner_;
  const uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
  uint64_t metadata_size_ = 0;  // the header and tables: payloads start after them
  Hash128 content_id_;
  std::string label_;
  uint32_t version_ = 0;
  BinaryIdentity identity_;
  std::vector<GraphRecord> graphs_;
  std::vector<WeightRecord> weights_;
  std::vector<WeightFile> weight_files_;
  std::vector<std::shared_ptr<const ContextBinary>> linked_;  // weight_files_, opened (kWeights)
  std::vector<std::shared_ptr<const MappedFile>> sources_;  // weight_files_, mapped (kSourceData)
  // Source data weights at an offset the runtime cannot read in place (ctxgen's kernels need their
  // elements' alignment, at most 8), copied once: by weight id.
  std::vector<std::shared_ptr<const uint8_t>> copies_;
};

}  // namespace ctxgen
