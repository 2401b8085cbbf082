// Element types and tensor byte extraction: every numeric TensorProto, whatever field holds its
// data, becomes little-endian row-major bytes.

#include <cstring>

#include "ctxgen/error.h"
#include "ctxgen/model.h"
#include "internal.h"

namespace ctxgen {

size_t element_size(int32_t dtype) {
  using T = onnx::TensorProto;
  switch (dtype) {
    case T::FLOAT: case T::INT32: case T::UINT32: return 4;
    case T::DOUBLE: case T::INT64: case T::UINT64: case T::COMPLEX64: return 8;
    case T::COMPLEX128: return 16;
    case T::INT16: case T::UINT16: case T::FLOAT16: case T::BFLOAT16: return 2;
    case T::INT8: case T::UINT8: case T::BOOL: return 1;
    default: return 0;
  }
}

std::string dtype_name(int32_t dtype) {
  if (dtype == kOnnxUInt4) return "uint4";  // newer than onnx 1.12's enum
  if (dtype == kOnnxInt4) return "int4";
  if (onnx::TensorProto_DataType_IsValid(dtype) && dtype != 0) {
    std::string name = onnx::TensorProto_DataType_Name(static_cast<onnx::TensorProto_DataType>(dtype));
    for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return name == "float" ? "float32" : name == "double" ? "float64" : name;
  }
  return "type " + std::to_string(dtype);
}

int64_t TensorData::element_count() const {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

std::vector<uint8_t> tensor_bytes(const onnx::TensorProto& t) {
  std::string what = "tensor '" + t.name() + "'";
  if (t.data_location() == onnx::TensorProto::EXTERNAL)
    throw Error(ErrorCode::kInvalidModel, what + ": external data is not supported here");
  uint64_t need = model_detail::expected_bytes(t, what);
  std::vector<uint8_t> bytes = t.has_raw_data() ? std::vector<uint8_t>(t.raw_data().begin(), t.raw_data().end())
                                                : model_detail::typed_field_bytes(t);
  if (bytes.size() != need)
    throw Error(ErrorCode::kInvalidModel, what + ": holds " + std::to_string(bytes.size()) + " bytes, dims and type need " +
                                              std::to_string(need));
  return bytes;
}

namespace model_detail {

uint64_t expected_bytes(const onnx::TensorProto& t, const std::string& what) {
  const bool nibbles = is_4bit(t.data_type());
  size_t esize = element_size(t.data_type());
  if (esize == 0 && !nibbles) throw Error(ErrorCode::kInvalidModel, what + ": element type " + dtype_name(t.data_type()) + " has no fixed size");
  uint64_t count = 1;
  for (int64_t d : t.dims()) {
    if (d < 0) throw Error(ErrorCode::kInvalidModel, what + ": negative dimension " + std::to_string(d));
    if (d != 0 && count > (uint64_t{1} << 62) / static_cast<uint64_t>(d))
      throw Error(ErrorCode::kInvalidModel, what + ": dimensions overflow");
    count *= static_cast<uint64_t>(d);
  }
  return nibbles ? (count + 1) / 2 : count * esize;
}

namespace {

template <typename Field, typename Out>
std::vector<uint8_t> pack(const Field& field) {
  std::vector<uint8_t> bytes(static_cast<size_t>(field.size()) * sizeof(Out));
  for (int i = 0; i < field.size(); ++i) {
    Out v = static_cast<Out>(field.Get(i));
    std::memcpy(bytes.data() + static_cast<size_t>(i) * sizeof(Out), &v, sizeof(Out));
  }
  return bytes;
}

}  // namespace

// Typed fields (float_data, int32_data, ...) hold one element per entry, narrower types widened
// to int32; raw bytes narrow them back.
std::vector<uint8_t> typed_field_bytes(const onnx::TensorProto& t) {
  using T = onnx::TensorProto;
  switch (t.data_type()) {
    case T::FLOAT: case T::COMPLEX64: return pack<decltype(t.float_data()), float>(t.float_data());
    case T::DOUBLE: case T::COMPLEX128: return pack<decltype(t.double_data()), double>(t.double_data());
    case T::INT64: return pack<decltype(t.int64_data()), int64_t>(t.int64_data());
    case T::UINT64: return pack<decltype(t.uint64_data()), uint64_t>(t.uint64_data());
    case T::UINT32: return pack<decltype(t.uint64_data()), uint32_t>(t.uint64_data());
    case T::INT32: return pack<decltype(t.int32_data()), int32_t>(t.int32_data());
    case T::INT16: return pack<decltype(t.int32_data()), int16_t>(t.int32_data());
    case T::UINT16: case T::FLOAT16: case T::BFLOAT16: return pack<decltype(t.int32_data()), uint16_t>(t.int32_data());
    case T::INT8: return pack<decltype(t.int32_data()), int8_t>(t.int32_data());
    case T::UINT8: case T::BOOL: return pack<decltype(t.int32_data()), uint8_t>(t.int32_data());
    case kOnnxUInt4: case kOnnxInt4: return pack<decltype(t.int32_data()), uint8_t>(t.int32_data());  // a byte (two values) an entry
    default: return {};
  }
}

void clear_typed_fields(onnx::TensorProto& t) {
  t.clear_float_data();
  t.clear_double_data();
  t.clear_int32_data();
  t.clear_int64_data();
  t.clear_uint64_data();
}

}  // namespace model_detail
}  // namespace ctxgen
