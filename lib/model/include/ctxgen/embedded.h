#pragma once
// Embedded weights as views. A reader of protobuf's wire format finds where each large tensor
// embedded in a serialized ModelProto keeps its bytes, and writes the model without those bytes
// for protobuf to parse; the loader then views them in the mapped file, as it views external
// data, instead of protobuf copying them. docs/architecture.md ("Weights stay where they are").

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <onnx/onnx_pb.h>

namespace ctxgen {

// The field a cut tensor kept its bytes in.
enum class EmbeddedField : uint8_t { kRawData, kFloatData, kDoubleData };

struct EmbeddedSpan {
  uint64_t offset = 0;  // into the serialized model
  uint64_t size = 0;
  EmbeddedField field = EmbeddedField::kRawData;
  bool had_location = false;  // the tensor set data_location (to DEFAULT) itself
};

struct SlimModel {
  std::string bytes;                // the model without the cut bytes: what protobuf parses
  std::vector<EmbeddedSpan> spans;  // a cut tensor's marker is its index here
};

// A cut tensor is marked with data_location EXTERNAL and, last in external_data, this key with
// its span's index as value. onnx's shape inference then treats it as it treats external data.
inline constexpr const char* kEmbeddedKey = "ctxgen_embedded";
// Smaller tensors stay in the protobuf: shape inference reads small constants (Reshape shapes),
// and copying them costs little. Integer tensors (int32, int64) stay at any size for the same
// reason: shape arithmetic reads them.
inline constexpr uint64_t kMinEmbeddedView = 1024;

// Cuts the bytes of each tensor that protobuf would parse as an initializer of the graph or of a
// subgraph (`g`, `graphs`), or as a node attribute's tensor (`t`), and that holds at least
// kMinEmbeddedView bytes: its raw_data, or for a float or double tensor without raw_data its one
// packed float_data / double_data field. Everything else is copied as it is. Throws
// Error(kInvalidModel) with "at byte N: ..." (the caller names the file) where protobuf would fail
// too: a field or varint running past its message, a bad wire type or field number, a group that
// does not close, nesting deeper than 128, a packed field that is not whole values. A tensor
// that already carries kEmbeddedKey is refused, so every marker in the parse is ours.
// `passed` hears of each cut tensor's bytes once they are read past: reading a field next to a
// weight maps a whole page-cache folio (megabytes) of a mapped file, which the caller can drop.
using PassedBytes = std::function<void(size_t offset, size_t size)>;
SlimModel slim_model(const uint8_t* data, size_t size, const PassedBytes& passed = {});

// The span a tensor parsed from SlimModel::bytes stands for, or nullptr when it holds its own bytes.
const EmbeddedSpan* embedded_span(const onnx::TensorProto& tensor, const std::vector<EmbeddedSpan>& spans);
// Puts a cut tensor's bytes back (from `data`, the serialized model) exactly as protobuf would
// have parsed them, marker removed and data_location as it was.
void restore_embedded(onnx::TensorProto& tensor, const std::vector<EmbeddedSpan>& spans, const uint8_t* data);

}  // namespace ctxgen
