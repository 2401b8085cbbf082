#pragma once
// Helpers shared by the files of the model stage.

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <onnx/onnx_pb.h>


namespace ctxgen::model_detail {

// Bytes a tensor's dims and type call for; throws Error(kInvalidModel) prefixed with `what`.
uint64_t expected_bytes(const onnx::TensorProto& tensor, const std::string& what);
// The typed data fields of a tensor as raw little-endian bytes.
std::vector<uint8_t> typed_field_bytes(const onnx::TensorProto& tensor);
void clear_typed_fields(onnx::TensorProto& tensor);

// The newest default-domain opset the bundled onnx (Debian's 1.12) knows.
inline constexpr int64_t kOnnxOpset = 17;
// onnx 1.12 knows opsets up to 17. A model beyond them (a newer IR or default-domain opset) is
// checked and inferred with those, but for ops whose meaning changed since.
bool beyond_onnx(const onnx::ModelProto& model);
// Does onnx 1.12 know this op as the model means it? Default-domain ops it lacks at opset 17 or
// whose semantics changed after 17 (in a model beyond 17), and ops of domains it has no schema
// for (com.microsoft ...), are unknown to it.
bool known_to_onnx(const onnx::NodeProto& node, bool beyond);
// Throws Error(kInvalidModel) for a main-graph node reading a value of a type its op does not
// take (types.cc), as ONNX Runtime refuses such a model when it loads it. After shape inference.
void check_input_types(const std::filesystem::path& path, const onnx::ModelProto& model);

}  // namespace ctxgen::model_detail
