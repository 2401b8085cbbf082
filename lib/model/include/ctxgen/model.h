#pragma once
// Stage 1, load: an ONNX model file becomes a Model, a protobuf graph plus views of its weight
// bytes. Weight bytes are never copied: external data and large embedded tensors are views of the
// mapped files, small embedded ones are moved out of the protobuf into shared buffers.

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <onnx/onnx_pb.h>

#include "ctxgen/bytes.h"
#include "ctxgen/embedded.h"

namespace ctxgen {

// Bytes of one tensor: little-endian, row-major, as ONNX raw_data would hold them.
struct TensorData {
  int32_t dtype = 0;  // onnx::TensorProto_DataType
  std::vector<int64_t> dims;
  const uint8_t* data = nullptr;
  size_t size = 0;
  std::shared_ptr<const void> owner;  // keeps `data` alive
  std::shared_ptr<const MappedFile> file;  // set when the bytes come from external data
  size_t file_offset = 0;

  Blob blob() const { return Blob{data, size, owner, file, file_offset, {}, {}, {}}; }

  int64_t element_count() const;
};

// Where a weight was found; used in messages and reports.
enum class WeightOrigin { kInitializer, kConstantNode, kSubgraphInitializer, kSubgraphConstantNode, kFolded };

// After loading, a weight's TensorProto holds no bytes: its data_location is EXTERNAL with the single
// entry {kWeightRefKey: index into Model::weights}. Copies of the graph keep that reference; the
// writer replaces it with embedded bytes or a real external-data location.
inline constexpr const char* kWeightRefKey = "ctxgen_weight";

struct Weight {
  std::string name;
  WeightOrigin origin = WeightOrigin::kInitializer;
  std::string graph;               // "main", or "<node name>/<attribute>" for subgraphs
  onnx::TensorProto* tensor = nullptr;  // inside Model::proto; holds a kWeightRefKey reference
  bool external = false;           // came from external data
  TensorData data;
};

// Static or partly symbolic type of a value after shape inference.
struct ValueType {
  int32_t elem_type = 0;                     // 0 = unknown
  std::optional<std::vector<int64_t>> dims;  // nullopt = unknown rank; -1 = unknown dim
  std::vector<std::string> dim_names;        // an unknown dim's symbolic name, by position ("" or absent: none)
  bool is_static() const;
  // The dims for messages, an unknown one by its name: "[batch,3,32,32]", "[?,8]" when unnamed.
  std::string dims_text() const;
};

struct LoadOptions {
  std::map<std::string, int64_t> fix_dims;                  // --fix-dim NAME=VALUE
  std::map<std::string, std::vector<int64_t>> input_shapes;  // --input-shape INPUT=1x3x224x224
  std::map<std::string, std::vector<std::string>> fix_values;  // --fix-value INPUT=V[,V...]: the input becomes a constant
  // Large embedded weights are views of the mapped model file (ctxgen/embedded.h). false: protobuf
  // copies them, the reference the views are tested against.
  bool embedded_views = true;
};

// Model metadata key recording the inputs --fix-value replaced, values as text:
// {"sr": {"dims": [], "values": ["16000"]}}. verify feeds these values to the original model.
inline constexpr const char* kFixedValuesMetadataKey = "ctxgen.fixed_values";
// Model metadata key of a compiled model whose initializers live in an external weights file
// (--external-initializers-file): the XXH3-128 of that file, hex. verify refuses a model beside a
// weights file with another hash, naming both.
inline constexpr const char* kExternalWeightsIdMetadataKey = "ctxgen.external_weights_id";

struct Model {
  std::filesystem::path path;
  std::unique_ptr<onnx::ModelProto> proto;
  // Every numeric tensor in the model, in a fixed order (main graph first, then subgraphs in
  // node order). Constant nodes holding a tensor are hoisted into initializers of their graph at
  // load time, so a weight always has a TensorProto in some graph's initializer list.
  std::vector<Weight> weights;
  // Main-graph constants by name -> index into `weights`. An initializer that is also a graph
  // input (IR >= 4) can be overridden at run time and is therefore not a constant.
  std::unordered_map<std::string, size_t> constants;
  // Types of main-graph values (inputs, outputs, intermediates) after shape inference.
  std::unordered_map<std::string, ValueType> value_types;
  // Inputs --fix-value turned into constants: their dims, and the values as given (as text). A
  // compiled model keeps such an input where the original had it, as the original declared it,
  // and checks at run time that it is fed `bytes`.
  struct FixedValue {
    std::vector<int64_t> dims;
    std::vector<std::string> values;
    std::vector<uint8_t> bytes;         // the values as the input's type holds them
    onnx::ValueInfoProto declared;      // the input as the original declares it
    size_t position = 0;                // among the original's inputs
    bool had_default = false;           // the original gave it a default value (an initializer)
  };
  std::map<std::string, FixedValue> fixed_values;

  const onnx::GraphProto& graph() const { return proto->graph(); }
  const Weight* constant(const std::string& name) const;
  const ValueType* type_of(const std::string& name) const;
};

// A model file parsed without copying its large embedded weights: their bytes stay in the mapped
// file, their tensors marked (ctxgen/embedded.h). For readers that only look at the graph;
// load_model takes the weights as views. Throws Error(kInvalidModel) naming the file and what is
// wrong. views = false: protobuf copies every byte (see LoadOptions::embedded_views).
struct ParsedModel {
  std::unique_ptr<onnx::ModelProto> proto;
  std::shared_ptr<const MappedFile> file;  // set when a tensor was cut
  std::vector<EmbeddedSpan> spans;
  // Bytes a host already holds (ONNX Runtime's initializers, for the plugin EP): a tensor marked
  // with kHeldKey and an index here is a view of them, as a cut tensor is a view of the file.
  std::vector<TensorData> held;
  // Bytes a tensor embeds in the file: its cut span's, or its raw_data's.
  uint64_t held_bytes(const onnx::TensorProto& tensor) const;
};
ParsedModel parse_model(const std::filesystem::path& path, bool views = true);

// Marks a tensor of a ParsedModel as the view ParsedModel::held[index] (data_location EXTERNAL,
// so onnx's shape inference skips it, as it skips external data).
inline constexpr const char* kHeldKey = "ctxgen_held";
void mark_held(onnx::TensorProto& tensor, size_t index);

// Throws Error(kInvalidModel) "<path>: no such file" (or a directory) unless `path` is a file a
// model could be read from: what a run checks of its inputs before anything of its outputs, so a
// mistyped model path is named as such, not as an output that exists already.
void check_model_file(const std::filesystem::path& path);

// Loads, validates (onnx checker), hoists constants, applies fixed dims/shapes and runs shape
// inference. Throws Error(kInvalidModel) naming the file and the problem.
Model load_model(const std::filesystem::path& path, const LoadOptions& options = {});
// The same for a model already parsed, or built in memory by a host; `path` names it in messages
// and is where its external data is looked for.
Model load_model(ParsedModel parsed, const std::filesystem::path& path, const LoadOptions& options = {});

// The folder a model's external data locations are relative to, canonical: where a weightless
// binary compiled from it finds its weights.
std::filesystem::path external_data_folder(const std::filesystem::path& model_path);

// The ValueType a declared type gives (tensor types only; other types are unknown).
ValueType value_type_of(const onnx::TypeProto& type);

// `message`'s bytes with map fields in key order, so equal messages give equal bytes: what the
// outputs are written with, and what compile cache keys are made of.
std::string deterministic_bytes(const google::protobuf::MessageLite& message);

// The default ONNX domain, spelled "" or "ai.onnx".
inline bool is_onnx_domain(const std::string& domain) { return domain.empty() || domain == "ai.onnx"; }
// The default-domain opset a model imports (0 when it imports none).
int64_t default_opset(const onnx::ModelProto& model);

// The value of a model metadata entry (the first with that key), or nullopt.
std::optional<std::string> metadata_value(const onnx::ModelProto& model, const std::string& key);
// The external-data file the first tensor stored outside the model names (main graph and
// subgraphs), or nullopt when every tensor is inside.
std::optional<std::string> external_location(const onnx::GraphProto& graph);
// Makes `value` the one entry under `key` (an empty value removes the key).
void set_metadata(onnx::ModelProto& model, const std::string& key, const std::string& value);

// A node's name, or "#<index>" when it has none.
std::string node_label(const onnx::NodeProto& node, size_t index);
// Names a node for messages: "'conv_3' (Conv)", or "#12 (Conv)" when it has no name.
std::string describe_node(const onnx::NodeProto& node, size_t index);

// Every value a node reads, including the outer-scope values its subgraphs read implicitly.
std::vector<std::string> node_reads(const onnx::NodeProto& node);
// The names an initializer of `graph` must have to matter: read by a node, a graph output, or a
// graph input it gives a default value.
std::unordered_set<std::string> names_in_use(const onnx::GraphProto& graph);

// ONNX's 4-bit integer types (opset 21), which onnx 1.12's enum does not name: two values a byte,
// the first in the low four bits, so a tensor of n values holds (n + 1) / 2 bytes.
inline constexpr int32_t kOnnxUInt4 = 21;
inline constexpr int32_t kOnnxInt4 = 22;
inline bool is_4bit(int32_t dtype) { return dtype == kOnnxUInt4 || dtype == kOnnxInt4; }

size_t element_size(int32_t dtype);  // 0 for types without a fixed size (string, the 4-bit types)
std::string dtype_name(int32_t dtype);

// A numeric tensor's data as little-endian raw bytes, from raw_data or its typed fields. Throws
// Error(kInvalidModel) for external or string data, or bytes that do not match dims and type.
std::vector<uint8_t> tensor_bytes(const onnx::TensorProto& tensor);

// A tensor of `elem_type` (float, double, int32, int64, bool) and `dims` holding values given as
// text, as --fix-value takes them. Throws Error(kUsage) naming `what` for text that is not a
// whole value of the type, or another type.
onnx::TensorProto tensor_of_values(int32_t elem_type, const std::vector<int64_t>& dims, const std::vector<std::string>& texts,
                                   const std::string& what);

// The Model::weights index a tensor refers to, or -1 when it holds its own bytes.
int64_t weight_ref(const onnx::TensorProto& tensor);

}  // namespace ctxgen
