#include "node_view.h"

#include <cstring>

#include "ctxgen/error.h"
#include "ctxgen/runtime.h"

namespace ctxgen::refc {

void refuse(std::string reason) { throw Refusal{std::move(reason)}; }

const char* const kSupportedTypes =
    "ref supports float32, float16, bfloat16, uint8, int8, uint16, int16, int32, int64, bool";

bool is_half(int32_t onnx_type) { return onnx_type == onnx::TensorProto::FLOAT16 || onnx_type == onnx::TensorProto::BFLOAT16; }

bool is_quantized(int32_t onnx_type) {
  return onnx_type == onnx::TensorProto::UINT8 || onnx_type == onnx::TensorProto::INT8 ||
         onnx_type == onnx::TensorProto::UINT16 || onnx_type == onnx::TensorProto::INT16;
}

std::string dims_text(const std::vector<int64_t>& dims) {
  std::string text = "[";
  for (size_t i = 0; i < dims.size(); ++i) {
    if (i) text += ",";
    text += dims[i] < 0 ? "?" : std::to_string(dims[i]);
  }
  return text + "]";
}

std::string values_text(const std::vector<int64_t>& values) {
  std::string text = "[";
  for (size_t i = 0; i < values.size(); ++i) text += (i ? "," : "") + std::to_string(values[i]);
  return text + "]";
}

int64_t element_count(const std::vector<int64_t>& dims) {
  int64_t n = 1;
  for (int64_t d : dims)
    if (d < 0 || __builtin_mul_overflow(n, d, &n) || n > kMaxElements)
      refuse("dims " + dims_text(dims) + " are negative or hold more than 2^48 elements");
  return n;
}

std::vector<int64_t> broadcast_dims(const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
  size_t rank = std::max(a.size(), b.size());
  std::vector<int64_t> out(rank);
  for (size_t i = 0; i < rank; ++i) {
    int64_t da = i < rank - a.size() ? 1 : a[i - (rank - a.size())];
    int64_t db = i < rank - b.size() ? 1 : b[i - (rank - b.size())];
    if (da != db && da != 1 && db != 1)
      refuse("shapes " + dims_text(a) + " and " + dims_text(b) + " do not broadcast");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

int64_t normalise_axis(int64_t axis, int64_t rank, const std::string& what) {
  if (axis < -rank || axis >= rank)
    refuse(what + " " + std::to_string(axis) + " is out of range for rank " + std::to_string(rank));
  return axis < 0 ? axis + rank : axis;
}

NodeView::NodeView(const Model& model, const onnx::NodeProto& node)
    : model_(model), node_(node), opset_(default_opset(*model.proto)) {}

const onnx::AttributeProto* NodeView::find_attr(const std::string& name) const {
  for (const auto& a : node_.attribute())
    if (a.name() == name) return &a;
  return nullptr;
}

bool NodeView::has_attr(const std::string& name) const { return find_attr(name) != nullptr; }

int64_t NodeView::int_attr(const std::string& name, int64_t fallback) const {
  const auto* a = find_attr(name);
  if (!a) return fallback;
  if (a->type() != onnx::AttributeProto::INT) refuse("attribute " + name + " is not an int");
  return a->i();
}

float NodeView::float_attr(const std::string& name, float fallback) const {
  const auto* a = find_attr(name);
  if (!a) return fallback;
  if (a->type() != onnx::AttributeProto::FLOAT) refuse("attribute " + name + " is not a float");
  return a->f();
}

std::string NodeView::string_attr(const std::string& name, const std::string& fallback) const {
  const auto* a = find_attr(name);
  if (!a) return fallback;
  if (a->type() != onnx::AttributeProto::STRING) refuse("attribute " + name + " is not a string");
  return a->s();
}

std::vector<int64_t> NodeView::ints_attr(const std::string& name, std::vector<int64_t> fallback) const {
  const auto* a = find_attr(name);
  if (!a) return fallback;
  if (a->type() != onnx::AttributeProto::INTS) refuse("attribute " + name + " is not a list of ints");
  return {a->ints().begin(), a->ints().end()};
}

std::vector<float> NodeView::floats_attr(const std::string& name) const {
  const auto* a = find_attr(name);
  if (!a) return {};
  if (a->type() != onnx::AttributeProto::FLOATS) refuse("attribute " + name + " is not a list of floats");
  return {a->floats().begin(), a->floats().end()};
}

const onnx::TensorProto* NodeView::tensor_attr(const std::string& name) const {
  const auto* a = find_attr(name);
  if (!a) return nullptr;
  if (a->type() != onnx::AttributeProto::TENSOR) refuse("attribute " + name + " is not a tensor");
  return &a->t();
}

Scalar scalar_of(int32_t dtype, const uint8_t* data, size_t size, const std::string& what) {
  size_t element = element_size(dtype);
  if (element == 0 || size != element) refuse(what + " is not a single element");
  const auto as = [data](auto type) {
    decltype(type) value;
    std::memcpy(&value, data, sizeof value);
    return value;
  };
  Scalar v;
  switch (dtype) {
    case onnx::TensorProto::FLOAT: v.is_float = true; v.f = as(float{}); return v;
    case onnx::TensorProto::INT32: v.i = as(int32_t{}); return v;
    case onnx::TensorProto::INT64: v.i = as(int64_t{}); return v;
    case onnx::TensorProto::BOOL: v.i = data[0] != 0 ? 1 : 0; return v;
    case onnx::TensorProto::UINT8: v.i = as(uint8_t{}); return v;
    case onnx::TensorProto::INT8: v.i = as(int8_t{}); return v;
    case onnx::TensorProto::UINT16: v.i = as(uint16_t{}); return v;
    case onnx::TensorProto::INT16: v.i = as(int16_t{}); return v;
    case onnx::TensorProto::FLOAT16: v.is_float = true; v.f = runtime::float_of_half(as(uint16_t{})); return v;
    case onnx::TensorProto::BFLOAT16: v.is_float = true; v.f = runtime::float_of_bfloat16(as(uint16_t{})); return v;
    default: refuse(what + " has element type " + dtype_name(dtype) + " (" + kSupportedTypes + ")");
  }
}

Scalar scalar_value(const onnx::TensorProto& tensor, const std::string& what) {
  std::vector<uint8_t> bytes;
  try {
    bytes = tensor_bytes(tensor);
  } catch (const Error& e) {
    refuse(what + ": " + e.what());
  }
  return scalar_of(tensor.data_type(), bytes.data(), bytes.size(), what);
}

size_t NodeView::input_count() const {
  size_t n = static_cast<size_t>(node_.input_size());
  while (n > 0 && node_.input(static_cast<int>(n - 1)).empty()) --n;
  return n;
}

bool NodeView::has_input(size_t i) const { return i < input_count() && !input(i).empty(); }

const std::string& NodeView::input(size_t i) const {
  if (i >= input_count()) refuse("missing input " + std::to_string(i));
  return node_.input(static_cast<int>(i));
}

std::string NodeView::input_label(size_t i) const { return "input " + std::to_string(i) + " '" + input(i) + "'"; }

std::vector<int64_t> static_dims(const Model& model, const std::string& name, const std::string& label,
                                 bool must_be_nonempty) {
  std::vector<int64_t> dims;
  if (const auto* type = model.type_of(name)) {
    if (type->elem_type == 0 || !type->dims) refuse("unknown shape on " + label);
    dims = *type->dims;
    if (!type->is_static()) refuse("dynamic shape on " + label + " (dims " + type->dims_text() + ")");
  } else if (const auto* w = model.constant(name)) {
    dims = w->data.dims;
  } else {
    refuse("unknown shape on " + label);
  }
  if (must_be_nonempty && element_count(dims) == 0)
    refuse("zero-sized tensor on " + label + " (dims " + dims_text(dims) + ")");
  return dims;
}

ref::DType ref_dtype(int32_t onnx_type, const std::string& what) {
  switch (onnx_type) {
    case onnx::TensorProto::FLOAT: return ref::DType::kFloat32;
    case onnx::TensorProto::INT32: return ref::DType::kInt32;
    case onnx::TensorProto::INT64: return ref::DType::kInt64;
    case onnx::TensorProto::BOOL: return ref::DType::kBool;
    case onnx::TensorProto::UINT8: return ref::DType::kUInt8;
    case onnx::TensorProto::INT8: return ref::DType::kInt8;
    case onnx::TensorProto::UINT16: return ref::DType::kUInt16;
    case onnx::TensorProto::INT16: return ref::DType::kInt16;
    case onnx::TensorProto::FLOAT16: return ref::DType::kFloat16;
    case onnx::TensorProto::BFLOAT16: return ref::DType::kBFloat16;
    default: refuse("element type " + dtype_name(onnx_type) + " on " + what + " (" + kSupportedTypes + ")");
  }
}

ref::Value constant_value(const TensorData& t, const std::string& what) {
  ref::Value v;
  if (is_4bit(t.dtype)) {
    v.dtype = ref::DType::kUInt8;
    v.dims = {static_cast<int64_t>(t.size)};
    return v;
  }
  v.dtype = ref_dtype(t.dtype, what);
  v.dims = t.dims;
  return v;
}

ref::Value static_value(const Model& model, const std::string& name, const std::string& label) {
  const Weight* constant = model.constant(name);
  if (constant && is_4bit(constant->data.dtype)) return constant_value(constant->data, label);
  const ValueType* type = model.type_of(name);
  ref::Value v;
  v.dtype = ref_dtype(type ? type->elem_type : constant ? constant->data.dtype : 0, label);
  v.dims = static_dims(model, name, label, true);
  return v;
}

std::vector<int64_t> NodeView::input_dims(size_t i) const { return static_dims(model_, input(i), input_label(i), true); }

int32_t NodeView::input_elem_type(size_t i) const {
  if (const auto* type = model_.type_of(input(i)); type && type->elem_type != 0) return type->elem_type;
  if (const auto* w = model_.constant(input(i))) return w->data.dtype;
  refuse("unknown type on " + input_label(i));
}

bool NodeView::is_float(int32_t onnx_type) const {
  return onnx_type == onnx::TensorProto::FLOAT || (narrow_as_float_ && is_half(onnx_type));
}

std::vector<int64_t> NodeView::float_input(size_t i) const {
  if (!has_input(i)) refuse("missing input " + std::to_string(i));
  int32_t type = input_elem_type(i);
  if (!is_float(type))
    refuse("element type " + dtype_name(type) + " on " + input_label(i) + " (ref supports float32)");
  return input_dims(i);
}

ref::Value NodeView::typed_input(size_t i) const {
  if (!has_input(i)) refuse("missing input " + std::to_string(i));
  ref::Value v;
  v.dtype = ref_dtype(input_elem_type(i), input_label(i));
  v.dims = input_dims(i);
  return v;
}

const Weight* NodeView::constant(size_t i) const { return has_input(i) ? model_.constant(input(i)) : nullptr; }

std::vector<int64_t> NodeView::const_ints(size_t i) const {
  const Weight* w = constant(i);
  if (!w) refuse(input_label(i) + " is not a constant");
  const TensorData& t = w->data;
  std::vector<int64_t> values(static_cast<size_t>(t.element_count()));
  if (t.dtype == onnx::TensorProto::INT64 && t.size == values.size() * 8) {
    if (t.size > 0) std::memcpy(values.data(), t.data, t.size);  // an empty vector's data() may be null
  } else if (t.dtype == onnx::TensorProto::INT32 && t.size == values.size() * 4) {
    for (size_t k = 0; k < values.size(); ++k) {
      int32_t v;
      std::memcpy(&v, t.data + 4 * k, 4);
      values[k] = v;
    }
  } else {
    refuse("element type " + dtype_name(t.dtype) + " on " + input_label(i) + " (expected int64 or int32)");
  }
  return values;
}

float NodeView::const_float(size_t i) const {
  const Weight* w = constant(i);
  if (!w) refuse(input_label(i) + " is not a constant");
  const TensorData& t = w->data;
  if (!is_float(t.dtype))
    refuse("element type " + dtype_name(t.dtype) + " on " + input_label(i) + " (ref supports float32)");
  if (t.element_count() != 1) refuse(input_label(i) + " has dims " + dims_text(t.dims) + ", expected a scalar");
  return scalar_of(t.dtype, t.data, t.size, input_label(i)).f;
}

std::vector<float> NodeView::const_floats(size_t i) const {
  const Weight* w = constant(i);
  if (!w) refuse(input_label(i) + " is not a constant");
  const TensorData& t = w->data;
  if (!is_float(t.dtype))
    refuse("element type " + dtype_name(t.dtype) + " on " + input_label(i) + " (expected float32)");
  const size_t element = element_size(t.dtype);
  std::vector<float> values(t.size / element);
  for (size_t k = 0; k < values.size(); ++k) values[k] = scalar_of(t.dtype, t.data + k * element, element, input_label(i)).f;
  return values;
}

Scalar NodeView::const_scalar(size_t i) const {
  const Weight* w = constant(i);
  if (!w) refuse(input_label(i) + " is not a constant");
  return scalar_of(w->data.dtype, w->data.data, w->data.size, input_label(i));
}

const std::string& NodeView::single_output(const std::string& extra_output_reason) const {
  if (node_.output_size() < 1 || node_.output(0).empty()) refuse("output 0 is absent");
  for (int i = 1; i < node_.output_size(); ++i)
    if (!node_.output(i).empty()) refuse(extra_output_reason);
  return node_.output(0);
}

}  // namespace ctxgen::refc
