#pragma once
// Helpers shared by the files of the model stage.

#include <cstdint>
#include <string>
#include <vector>

#include <onnx/onnx_pb.h>

namespace ctxgen::model_detail {

// Bytes a tensor's dims and type call for; throws Error(kInvalidModel) prefixed with `what`.
uint64_t expected_bytes(const onnx::TensorProto& tensor, const std::string& what);
// The typed data fields of a tensor as raw little-endian bytes.
std::vector<uint8_t> typed_field_bytes(const onnx::TensorProto& tensor);
void clear_typed_fields(onnx::TensorProto& tensor);

}  // namespace ctxgen::model_detail
