// Per-op support rules and normalisation. Each rule reads the node through NodeView, which
// refuses anything not static or of a type ref does not hold, and returns the op exactly as the
// ref runtime expects it. The output type is not computed here: normalise() asks the runtime's
// rule for the op (runtime::infer_output), the one definition of every op's shape.

#include "normalise.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <numeric>

#include "ctxgen/error.h"
#include "ctxgen/runtime.h"
#include "node_view.h"

namespace ctxgen::refc {

ref::Activation activation_of(const std::string& op_type) {
  static const std::map<std::string, ref::Activation> kActivations = {
      {"Relu", ref::Activation::kRelu},       {"LeakyRelu", ref::Activation::kLeakyRelu},
      {"Sigmoid", ref::Activation::kSigmoid}, {"Tanh", ref::Activation::kTanh},
      {"Clip", ref::Activation::kClip},       {"HardSigmoid", ref::Activation::kHardSigmoid},
      {"HardSwish", ref::Activation::kHardSwish},
  };
  auto it = kActivations.find(op_type);
  return it == kActivations.end() ? ref::Activation::kNone : it->second;
}

namespace {

// The newest default-domain opset whose op semantics the rules below implement.
constexpr int64_t kNewestRuleOpset = 21;

const std::string kNoExtraOutputs = "more than one output";

NormalisedNode make(const NodeView& v, std::string type, std::vector<std::string> inputs,
                    std::vector<ref::Attr> attrs = {}, const std::string& extra_output_reason = kNoExtraOutputs) {
  NormalisedNode n;
  n.type = std::move(type);
  n.attrs = std::move(attrs);
  n.inputs = std::move(inputs);
  n.output = v.single_output(extra_output_reason);
  return n;
}

// A byte copy to `shape`: Reshape, Flatten, Squeeze, Unsqueeze, Identity, Dropout.
NormalisedNode reshaped(const NodeView& v, std::vector<int64_t> shape,
                        const std::string& extra_output_reason = kNoExtraOutputs) {
  v.typed_input(0);
  return make(v, "Reshape", {v.input(0)}, {ints_attr("shape", std::move(shape))}, extra_output_reason);
}

NormalisedNode identity(const NodeView& v) { return reshaped(v, v.typed_input(0).dims); }

// ---- elementwise -------------------------------------------------------------------------------

NormalisedNode unary(const NodeView& v) {
  v.float_input(0);
  return make(v, v.op(), {v.input(0)});
}

// Ops the runtime takes on several element types (Neg, Abs, Not, Cast's input ...).
NormalisedNode typed_unary(const NodeView& v) {
  v.typed_input(0);
  return make(v, v.op(), {v.input(0)});
}

NormalisedNode binary(const NodeView& v) {
  auto a = v.typed_input(0).dims;
  auto b = v.typed_input(1).dims;
  if (v.opset() < 7 && a != b)
    refuse("legacy broadcast semantics (opset " + std::to_string(v.opset()) + " < 7) with shapes " + dims_text(a) +
           " and " + dims_text(b));
  return make(v, v.op(), {v.input(0), v.input(1)});
}

// Min/Max take any number of inputs; ref takes one (a copy) or two.
NormalisedNode min_max(const NodeView& v) {
  if (v.input_count() == 1) return identity(v);
  if (v.input_count() != 2) refuse(v.op() + " with " + std::to_string(v.input_count()) + " inputs (ref takes 1 or 2)");
  return binary(v);
}

NormalisedNode where(const NodeView& v) {
  for (size_t i = 0; i < 3; ++i) v.typed_input(i);
  return make(v, "Where", {v.input(0), v.input(1), v.input(2)});
}

NormalisedNode cast(const NodeView& v) {
  v.typed_input(0);
  auto to = v.op() == "CastLike" ? v.typed_input(1).dtype : ref_dtype(static_cast<int32_t>(v.int_attr("to", 0)), "attribute to");
  return make(v, "Cast", {v.input(0)}, {int_attr("to", static_cast<int64_t>(to))});
}

NormalisedNode leaky_relu(const NodeView& v) {
  auto n = unary(v);
  n.attrs = {float_attr("alpha", v.float_attr("alpha", 0.01f))};
  return n;
}

// Elu, Celu and ThresholdedRelu: one float `alpha`, 1.0 by default.
NormalisedNode alpha_one(const NodeView& v) {
  auto n = unary(v);
  n.attrs = {float_attr("alpha", v.float_attr("alpha", 1.0f))};
  return n;
}

NormalisedNode selu(const NodeView& v) {
  auto n = unary(v);
  n.attrs = {float_attr("alpha", v.float_attr("alpha", 1.67326319217681884765625f)),
             float_attr("gamma", v.float_attr("gamma", 1.05070102214813232421875f))};
  return n;
}

NormalisedNode shrink(const NodeView& v) {
  auto n = unary(v);
  n.attrs = {float_attr("bias", v.float_attr("bias", 0.0f)), float_attr("lambd", v.float_attr("lambd", 0.5f))};
  return n;
}

NormalisedNode is_inf(const NodeView& v) {
  auto n = unary(v);
  n.attrs = {int_attr("detect_positive", v.int_attr("detect_positive", 1) != 0 ? 1 : 0),
             int_attr("detect_negative", v.int_attr("detect_negative", 1) != 0 ? 1 : 0)};
  return n;
}

// Integer Mod only: fmod=1 (the float remainder) stays on CPU.
NormalisedNode mod(const NodeView& v) {
  if (v.int_attr("fmod", 0) != 0) refuse("Mod with fmod=1 (ref takes integer Mod)");
  return binary(v);
}

NormalisedNode hard_sigmoid(const NodeView& v) {
  auto n = unary(v);
  n.attrs = {float_attr("alpha", v.float_attr("alpha", 0.2f)), float_attr("beta", v.float_attr("beta", 0.5f))};
  return n;
}

NormalisedNode clip(const NodeView& v) {
  float lo = -std::numeric_limits<float>::infinity();
  float hi = std::numeric_limits<float>::infinity();
  if (v.opset() < 11) {
    lo = v.float_attr("min", lo);
    hi = v.float_attr("max", hi);
  } else {
    if (v.has_input(1)) lo = v.const_float(1);
    if (v.has_input(2)) hi = v.const_float(2);
  }
  v.float_input(0);
  return make(v, "Clip", {v.input(0)}, {float_attr("min", lo), float_attr("max", hi)});
}

// ---- quantization ------------------------------------------------------------------------------

// Ops of the com.microsoft domain ref takes: ONNX Runtime's tool writes 16-bit QuantizeLinear and
// DequantizeLinear there below opset 21, with the default domain's semantics, the QLinear ops of
// its QOperator form, and its weight-only quantizer's MatMulNBits.
const std::set<std::string> kMicrosoftOps = {
    "QuantizeLinear", "DequantizeLinear", "MatMulNBits", "GatherBlockQuantized", "QLinearAdd", "QLinearMul", "QLinearSigmoid", "QLinearLeakyRelu",
    "QLinearSoftmax", "QLinearGlobalAveragePool", "QLinearConcat", "QGemm"};

// A QuantizeLinear or DequantizeLinear's `axis` and `block_size`: axis 0 for a single scale, where
// ONNX ignores it; before opset 13 ONNX has no axis, so the scale must be a single value.
std::vector<ref::Attr> quant_attrs(const NodeView& v, const std::vector<int64_t>& x) {
  auto scale = v.float_input(1);
  const int64_t block = v.int_attr("block_size", 0);
  if (block < 0) refuse("block_size " + std::to_string(block));
  const bool per_tensor = block == 0 && scale.size() <= 1 && element_count(scale) == 1;
  if (!per_tensor && v.opset() < 13 && is_onnx_domain(v.domain()))
    refuse("scale of dims " + dims_text(scale) + " before opset 13, which quantizes per tensor only");
  int64_t axis = per_tensor ? 0 : normalise_axis(v.int_attr("axis", 1), static_cast<int64_t>(x.size()), "axis");
  return {int_attr("axis", axis), int_attr("block_size", block)};
}

std::vector<std::string> quant_inputs(const NodeView& v) {
  return {v.input(0), v.input(1), v.has_input(2) ? v.input(2) : ""};
}

// The output type is the zero point's, else `output_dtype` (opset 21), else uint8.
NormalisedNode quantize_linear(const NodeView& v) {
  auto x = v.float_input(0);
  const int64_t output_dtype = v.int_attr("output_dtype", 0);
  ref::DType t = ref::DType::kUInt8;
  if (v.has_input(2)) {
    t = v.typed_input(2).dtype;
    if (!is_quantized(v.input_elem_type(2)))
      refuse("zero point of element type " + ref::dtype_name(t) + " (ref quantizes to uint8, int8, uint16 or int16)");
  }
  else if (output_dtype != 0) t = ref_dtype(static_cast<int32_t>(output_dtype), "attribute output_dtype");
  if (v.has_input(2) && output_dtype != 0 && output_dtype != static_cast<int64_t>(t))
    refuse("output_dtype " + dtype_name(static_cast<int32_t>(output_dtype)) + " differs from the zero point's type " +
           ref::dtype_name(t));
  auto attrs = quant_attrs(v, x);
  attrs.push_back(int_attr("dtype", static_cast<int64_t>(t)));
  return make(v, "QuantizeLinear", quant_inputs(v), std::move(attrs));
}

// A 4-bit weight (int4 or uint4, opset 21; or com.microsoft) stays packed, as the model stores it:
// the op unpacks it (`bits` 4, `signed` for int4) into `dims`. Ref holds 4-bit constants only:
// ONNX Runtime's tools write 4 bits for weights, never for activations.
const Weight& four_bit_constant(const NodeView& v, size_t i) {
  const Weight* w = v.constant(i);
  if (!w)
    refuse(v.input_label(i) + " of element type " + dtype_name(v.input_elem_type(i)) +
           " is computed at run time (ref takes 4-bit constants only)");
  return *w;
}

NormalisedNode dequantize_4bit(const NodeView& v) {
  const int32_t type = v.input_elem_type(0);
  const Weight* w = &four_bit_constant(v, 0);
  if (v.has_input(2) && (v.input_elem_type(2) != type || !v.constant(2)))
    refuse("zero point '" + v.input(2) + "' is not a constant " + dtype_name(type) + " tensor like input 0");
  auto attrs = quant_attrs(v, w->data.dims);
  attrs.push_back(int_attr("bits", 4));
  attrs.push_back(int_attr("signed", type == kOnnxInt4 ? 1 : 0));
  attrs.push_back(ints_attr("dims", w->data.dims));
  return make(v, "DequantizeLinear", quant_inputs(v), std::move(attrs));
}

NormalisedNode dequantize_linear(const NodeView& v) {
  if (is_4bit(v.input_elem_type(0))) return dequantize_4bit(v);
  auto x = v.typed_input(0).dims;
  return make(v, "DequantizeLinear", quant_inputs(v), quant_attrs(v, x));
}

// MatMulNBits with packed uint8 zero points or none; `accuracy_level` only allows a backend to
// compute in less than float32, which ref does not.
NormalisedNode matmul_nbits(const NodeView& v) {
  v.float_input(0);
  if (v.has_input(4)) refuse("MatMulNBits with g_idx (act-order quantization)");
  if (v.has_input(3) && v.input_elem_type(3) != onnx::TensorProto::UINT8)
    refuse("MatMulNBits with zero points of element type " + dtype_name(v.input_elem_type(3)) +
           " (ref takes packed uint8 zero points)");
  if (v.has_input(5)) v.float_input(5);
  return make(v, "MatMulNBits",
              {v.input(0), v.input(1), v.input(2), v.has_input(3) ? v.input(3) : "", v.has_input(5) ? v.input(5) : ""},
              {int_attr("K", v.int_attr("K", 0)), int_attr("N", v.int_attr("N", 0)), int_attr("bits", v.int_attr("bits", 4)),
               int_attr("block_size", v.int_attr("block_size", 0))});
}

// GatherBlockQuantized, as ONNX Runtime's weight-only quantizer writes it for embeddings: an int4 or
// uint4 constant of its own dims (zero points packed over the flat scales, 0 when absent), or uint8
// holding `bits` 4 or 8 values a byte along the last axis, which it quantizes and gathers along 0
// (zero points packed per row of scales, 2^(bits - 1) when absent). Scales float32 or float16, the
// output's type.
NormalisedNode gather_block_quantized(const NodeView& v) {
  const int32_t type = v.input_elem_type(0);
  const bool nibbles = is_4bit(type);
  int64_t bits = v.int_attr("bits", 4);
  std::vector<int64_t> dims;
  if (nibbles) {
    const Weight* w = &four_bit_constant(v, 0);
    if (bits != 4) refuse("bits " + std::to_string(bits) + " with " + dtype_name(type) + " data");
    dims = w->data.dims;
  } else {
    if (type != onnx::TensorProto::UINT8) refuse("data of element type " + dtype_name(type) + " (ref takes uint8, int4 or uint4)");
    if (bits != 4 && bits != 8) refuse("bits " + std::to_string(bits) + " (ref takes 4 or 8)");
    dims = v.typed_input(0).dims;
    dims.back() *= 8 / bits;
  }
  const auto rank = static_cast<int64_t>(dims.size());
  const int64_t gather_axis = normalise_axis(v.int_attr("gather_axis", 0), rank, "gather_axis");
  const int64_t quantize_axis = normalise_axis(v.int_attr("quantize_axis", 1), rank, "quantize_axis");
  if (!nibbles && (gather_axis != 0 || quantize_axis != rank - 1))
    refuse("uint8 data gathered along axis " + std::to_string(gather_axis) + " and quantized along " +
           std::to_string(quantize_axis) + " (ONNX Runtime takes 0 and the last)");
  const int32_t scale_type = v.input_elem_type(2);
  if (scale_type != onnx::TensorProto::FLOAT && scale_type != onnx::TensorProto::FLOAT16)
    refuse("scales of element type " + dtype_name(scale_type) + " (ref takes float32 or float16)");
  const auto scale_dims = v.input_dims(2);
  if (v.has_input(3) && (v.input_elem_type(3) != type || (nibbles && !v.constant(3))))
    refuse("zero points '" + v.input(3) + "' are not " + (nibbles ? "a constant " : "") + dtype_name(type) + " tensor like the data");
  const int64_t zero_row = nibbles ? element_count(scale_dims) : scale_dims.empty() ? 1 : scale_dims.back();
  return make(v, "GatherBlockQuantized", {v.input(0), v.input(1), v.input(2), v.has_input(3) ? v.input(3) : ""},
              {ints_attr("dims", dims), int_attr("gather_axis", gather_axis), int_attr("quantize_axis", quantize_axis),
               int_attr("block_size", v.int_attr("block_size", 128)), int_attr("bits", bits),
               int_attr("signed", type == kOnnxInt4 ? 1 : 0), int_attr("zero_point", nibbles ? 0 : int64_t{1} << (bits - 1)),
               int_attr("zero_point_row", std::max<int64_t>(zero_row, 1))});
}

// ---- generated constants -----------------------------------------------------------------------

// A scalar of `dtype` as the attribute kind the runtime reads: float for float32, int otherwise.
ref::Attr scalar_attr(const std::string& name, ref::DType dtype, const Scalar& value) {
  if (ref::is_float(dtype)) return float_attr(name, value.is_float ? value.f : static_cast<float>(value.i));
  if (!value.is_float) return int_attr(name, value.i);
  // A float for integer data (Pad's `value` attribute before opset 11): only whole numbers convert.
  if (!(std::fabs(value.f) < 9.0e15f) || std::trunc(value.f) != value.f)
    refuse(name + " " + std::to_string(value.f) + " is not a whole number for a tensor of " + ref::dtype_name(dtype));
  return int_attr(name, static_cast<int64_t>(value.f));
}

NormalisedNode constant_of_shape(const NodeView& v) {
  auto shape = v.const_ints(0);
  ref::DType dtype = ref::DType::kFloat32;
  Scalar value{true, 0.0f, 0};
  if (const onnx::TensorProto* fill = v.tensor_attr("value")) {
    dtype = ref_dtype(fill->data_type(), "attribute value");
    value = scalar_value(*fill, "attribute value");
  }
  return make(v, "ConstantOfShape", {},
              {int_attr("dtype", static_cast<int64_t>(dtype)), scalar_attr("value", dtype, value), ints_attr("shape", shape)});
}

// The element count ONNX Runtime computes: ceil((limit - start) / delta), at least 0; for floats
// (limit - start) in float, then the division in double; for integers all in double.
NormalisedNode range(const NodeView& v) {
  ref::DType dtype = ref_dtype(v.input_elem_type(0), "input 0 '" + v.input(0) + "'");
  if (dtype == ref::DType::kBool) refuse("Range of bool");
  Scalar start = v.const_scalar(0), limit = v.const_scalar(1), delta = v.const_scalar(2);
  int64_t count = 0;
  if (dtype == ref::DType::kFloat32) {
    if (delta.f == 0) refuse("Range with delta 0");
    double n = std::ceil(static_cast<double>(limit.f - start.f) / delta.f);
    if (!(n < static_cast<double>(kMaxElements))) refuse("Range of more than 2^48 elements");
    count = n > 0 ? static_cast<int64_t>(n) : 0;
  } else {
    // ONNX Runtime counts integer ranges in double too (so 2^53 + 1 .. 2^53 + 4 has 4 elements).
    if (delta.i == 0) refuse("Range with delta 0");
    double n = std::ceil((static_cast<double>(limit.i) - static_cast<double>(start.i)) / static_cast<double>(delta.i));
    if (!(n < static_cast<double>(kMaxElements))) refuse("Range of more than 2^48 elements");
    count = n > 0 ? static_cast<int64_t>(n) : 0;
  }
  return make(v, "Range", {},
              {int_attr("dtype", static_cast<int64_t>(dtype)), scalar_attr("start", dtype, start),
               scalar_attr("delta", dtype, delta), int_attr("count", count)});
}

// ---- normalisation and softmax -----------------------------------------------------------------

NormalisedNode softmax(const NodeView& v) {
  auto dims = v.float_input(0);
  auto rank = static_cast<int64_t>(dims.size());
  if (rank == 0) refuse(v.op() + " of a scalar");
  bool legacy = v.opset() < 13;
  int64_t axis = normalise_axis(v.int_attr("axis", legacy ? 1 : -1), rank, "axis");
  return make(v, v.op(), {v.input(0)}, {int_attr("axis", axis), int_attr("coerce_2d", legacy ? 1 : 0)});
}

NormalisedNode batch_norm(const NodeView& v) {
  if (v.int_attr("training_mode", 0) != 0) refuse("BatchNormalization in training mode");
  if (v.opset() < 9 && v.int_attr("spatial", 1) != 1) refuse("BatchNormalization with spatial=0");
  auto x = v.float_input(0);
  if (x.size() < 2) refuse("input 0 has rank " + std::to_string(x.size()) + ", expected N x C x ...");
  for (size_t i = 1; i <= 4; ++i) {
    auto p = v.float_input(i);
    if (p != std::vector<int64_t>{x[1]})
      refuse("input " + std::to_string(i) + " '" + v.input(i) + "' has dims " + dims_text(p) + ", expected [" +
             std::to_string(x[1]) + "]");
  }
  return make(v, "BatchNormalization", {v.input(0), v.input(1), v.input(2), v.input(3), v.input(4)},
              {float_attr("epsilon", v.float_attr("epsilon", 1e-5f))}, "BatchNormalization with training outputs");
}

// InstanceNormalization is GroupNormalization with one channel per group.
NormalisedNode instance_norm(const NodeView& v) {
  auto x = v.float_input(0);
  if (x.size() < 3) refuse("input 0 has rank " + std::to_string(x.size()) + ", expected N x C x D1 ...");
  for (size_t i = 1; i <= 2; ++i) v.float_input(i);
  return make(v, "GroupNormalization", {v.input(0), v.input(1), v.input(2)},
              {int_attr("groups", x[1]), float_attr("epsilon", v.float_attr("epsilon", 1e-5f))});
}

// ---- linear algebra ----------------------------------------------------------------------------

NormalisedNode matmul(const NodeView& v) {
  v.float_input(0);
  v.float_input(1);
  return make(v, "MatMul", {v.input(0), v.input(1)}, {int_attr("act", 0)});
}

NormalisedNode gemm(const NodeView& v) {
  auto a = v.float_input(0);
  auto b = v.float_input(1);
  if (a.size() != 2 || b.size() != 2) refuse("Gemm inputs must be 2-D, found " + dims_text(a) + " and " + dims_text(b));
  int64_t trans_a = v.int_attr("transA", 0), trans_b = v.int_attr("transB", 0);
  int64_t m = trans_a ? a[1] : a[0], k = trans_a ? a[0] : a[1];
  int64_t kb = trans_b ? b[1] : b[0], nn = trans_b ? b[0] : b[1];
  if (k != kb) refuse("Gemm inner dims differ: A " + dims_text(a) + ", B " + dims_text(b));
  std::vector<std::string> inputs = {v.input(0), v.input(1), ""};
  if (v.has_input(2)) {
    auto c = v.float_input(2);
    std::vector<int64_t> mn = {m, nn};
    bool legacy_exact = v.opset() < 7 && v.int_attr("broadcast", 0) == 0;
    if ((legacy_exact && c != mn) || c.size() > 2 || broadcast_dims(c, mn) != mn)
      refuse("Gemm C dims " + dims_text(c) + " do not broadcast to " + dims_text(mn));
    inputs[2] = v.input(2);
  }
  return make(v, "Gemm", inputs,
              {int_attr("transA", trans_a ? 1 : 0), int_attr("transB", trans_b ? 1 : 0),
               float_attr("alpha", v.float_attr("alpha", 1.0f)), float_attr("beta", v.float_attr("beta", 1.0f)),
               int_attr("act", 0)});
}

// ---- sliding windows (Conv, pools) -------------------------------------------------------------

struct Window {
  std::vector<int64_t> kernel, strides, dilations, pads;  // pads: all begins, then all ends
  std::vector<int64_t> output;                            // spatial output dims
};


std::vector<int64_t> window_list(const NodeView& v, const std::string& name, size_t n, int64_t fallback, int64_t min) {
  auto values = v.ints_attr(name, std::vector<int64_t>(n, fallback));
  if (values.size() != n)
    refuse("attribute " + name + " has " + std::to_string(values.size()) + " values, expected " + std::to_string(n));
  for (int64_t x : values)
    if (x < min || x > ref::kMaxWindow)
      refuse("attribute " + name + " " + values_text(values) + " has a value outside [" + std::to_string(min) + ", 2^31)");
  return values;
}

// Resolves strides, dilations, auto_pad and pads into explicit values and the output size the way
// ONNX shape inference does, so the op matches the inferred output dims.
Window resolve_window(const NodeView& v, const std::vector<int64_t>& in, std::vector<int64_t> kernel,
                      bool has_dilations, bool ceil_mode) {
  size_t n = in.size();
  for (int64_t k : kernel)
    if (k > ref::kMaxWindow) refuse("kernel " + values_text(kernel) + " is too large");
  Window w;
  w.kernel = std::move(kernel);
  w.strides = window_list(v, "strides", n, 1, 1);
  w.dilations = has_dilations ? window_list(v, "dilations", n, 1, 1) : std::vector<int64_t>(n, 1);
  std::string auto_pad = v.string_attr("auto_pad", "NOTSET");
  w.pads.assign(2 * n, 0);
  w.output.resize(n);
  for (size_t i = 0; i < n; ++i) {
    int64_t span = (w.kernel[i] - 1) * w.dilations[i] + 1;
    if (auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER") {
      w.output[i] = (in[i] + w.strides[i] - 1) / w.strides[i];
      int64_t total = std::max<int64_t>(0, (w.output[i] - 1) * w.strides[i] + span - in[i]);
      w.pads[i] = auto_pad == "SAME_UPPER" ? total / 2 : total - total / 2;
      w.pads[i + n] = total - w.pads[i];
      continue;
    }
    if (auto_pad == "NOTSET") {
      w.pads = window_list(v, "pads", 2 * n, 0, 0);
    } else if (auto_pad != "VALID") {
      refuse("attribute auto_pad=" + auto_pad + " is not supported");
    }
    int64_t room = in[i] + w.pads[i] + w.pads[i + n] - span;
    if (room < 0) refuse("window " + dims_text(w.kernel) + " is larger than the padded input");
    w.output[i] = (ceil_mode ? (room + w.strides[i] - 1) / w.strides[i] : room / w.strides[i]) + 1;
  }
  return w;
}

std::vector<int64_t> spatial(const std::vector<int64_t>& dims) { return {dims.begin() + 2, dims.end()}; }

std::vector<int64_t> window_input(const NodeView& v) {
  auto x = v.float_input(0);
  if (x.size() < 3) refuse("input 0 has rank " + std::to_string(x.size()) + ", expected N x C x D1 ...");
  return x;
}

// A Conv's attributes for input dims x and weight dims w, checked.
std::vector<ref::Attr> conv_attrs(const NodeView& v, const std::vector<int64_t>& x, const std::vector<int64_t>& w) {
  if (x.size() < 3) refuse("input 0 has rank " + std::to_string(x.size()) + ", expected N x C x D1 ...");
  if (w.size() != x.size()) refuse("weight dims " + dims_text(w) + " do not match input rank " + std::to_string(x.size()));
  int64_t group = v.int_attr("group", 1);
  if (group < 1 || x[1] != w[1] * group || w[0] % group != 0)
    refuse("group " + std::to_string(group) + " does not fit input " + dims_text(x) + " and weight " + dims_text(w));
  auto kernel = spatial(w);
  if (v.has_attr("kernel_shape") && v.ints_attr("kernel_shape", {}) != kernel)
    refuse("attribute kernel_shape " + dims_text(v.ints_attr("kernel_shape", {})) + " differs from weight dims " + dims_text(w));
  auto win = resolve_window(v, spatial(x), kernel, true, false);
  return {ints_attr("kernel_shape", win.kernel), ints_attr("strides", win.strides), ints_attr("pads", win.pads),
          ints_attr("dilations", win.dilations), int_attr("group", group)};
}

NormalisedNode conv(const NodeView& v) {
  auto x = window_input(v);
  auto w = v.float_input(1);
  if (w.size() != x.size()) refuse("weight dims " + dims_text(w) + " do not match input rank " + std::to_string(x.size()));
  std::vector<std::string> inputs = {v.input(0), v.input(1), ""};
  if (v.has_input(2)) {
    if (v.float_input(2) != std::vector<int64_t>{w[0]}) refuse("bias dims " + dims_text(v.input_dims(2)) + ", expected [" + std::to_string(w[0]) + "]");
    inputs[2] = v.input(2);
  }
  auto attrs = conv_attrs(v, x, w);
  attrs.push_back(int_attr("act", 0));
  return make(v, "Conv", inputs, std::move(attrs));
}

// MatMulInteger and ConvInteger: exact integer products (their zero points optional inputs).
NormalisedNode integer_product(const NodeView& v) {
  std::vector<std::string> inputs = {v.input(0), v.input(1), v.has_input(2) ? v.input(2) : "", v.has_input(3) ? v.input(3) : ""};
  if (v.op() == "MatMulInteger") return make(v, "MatMulInteger", inputs);
  return make(v, "ConvInteger", inputs, conv_attrs(v, v.input_dims(0), v.input_dims(1)));
}

NormalisedNode pool(const NodeView& v) {
  bool is_max = v.op() == "MaxPool";
  // A MaxPool takes quantized integers as they are (QOperator models leave it on uint8).
  auto x = is_max && is_quantized(v.input_elem_type(0)) ? v.input_dims(0) : window_input(v);
  if (x.size() < 3) refuse("input 0 has rank " + std::to_string(x.size()) + ", expected N x C x D1 ...");
  if (!v.has_attr("kernel_shape")) refuse("attribute kernel_shape is missing");
  auto kernel = window_list(v, "kernel_shape", x.size() - 2, 1, 1);
  if (!is_max && v.has_attr("dilations")) {
    auto d = v.ints_attr("dilations", {});
    if (std::any_of(d.begin(), d.end(), [](int64_t x) { return x != 1; })) refuse("AveragePool with dilations");
  }
  bool ceil_mode = v.opset() >= 10 && v.int_attr("ceil_mode", 0) != 0;
  auto win = resolve_window(v, spatial(x), kernel, is_max, ceil_mode);
  std::vector<ref::Attr> attrs = {ints_attr("kernel_shape", win.kernel), ints_attr("strides", win.strides),
                                  ints_attr("pads", win.pads), int_attr("ceil_mode", ceil_mode ? 1 : 0)};
  if (is_max)
    attrs.push_back(ints_attr("dilations", win.dilations));
  else
    attrs.push_back(int_attr("count_include_pad", v.opset() >= 7 ? v.int_attr("count_include_pad", 0) : 0));
  return make(v, v.op(), {v.input(0)}, attrs, "MaxPool with Indices output");
}

// ---- reductions --------------------------------------------------------------------------------

// Sorted unique non-negative axes; refuses duplicates and out-of-range values.
std::vector<int64_t> normalise_axes(std::vector<int64_t> axes, int64_t rank) {
  for (auto& a : axes) a = normalise_axis(a, rank, "axis");
  std::sort(axes.begin(), axes.end());
  if (std::adjacent_find(axes.begin(), axes.end()) != axes.end()) refuse("repeated axis in " + values_text(axes));
  return axes;
}

NormalisedNode reduce_over(const NodeView& v, const std::string& type, std::vector<int64_t> axes, bool keepdims) {
  v.float_input(0);
  return make(v, type, {v.input(0)}, {ints_attr("axes", axes), int_attr("keepdims", keepdims ? 1 : 0)});
}

NormalisedNode reduce(const NodeView& v) {
  auto x = v.float_input(0);
  auto rank = static_cast<int64_t>(x.size());
  bool axes_as_input = v.op() == "ReduceSum" ? v.opset() >= 13 : v.opset() >= 18;
  std::vector<int64_t> axes = axes_as_input ? (v.has_input(1) ? v.const_ints(1) : std::vector<int64_t>{})
                                            : v.ints_attr("axes", {});
  if (axes.empty() && v.int_attr("noop_with_empty_axes", 0) != 0) {
    // Only the reductions without an elementwise part are then a copy; ReduceL2 still takes |x|
    // and so on, which ref does not express as a reduction over no axes.
    static const std::set<std::string> kCopies = {"ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceLogSumExp"};
    if (!kCopies.count(v.op())) refuse(v.op() + " with noop_with_empty_axes and no axes");
    return reshaped(v, x);
  }
  if (axes.empty()) {
    axes.resize(static_cast<size_t>(rank));
    std::iota(axes.begin(), axes.end(), 0);
  }
  return reduce_over(v, v.op(), normalise_axes(axes, rank), v.int_attr("keepdims", 1) != 0);
}

NormalisedNode global_max_pool(const NodeView& v) {
  auto x = window_input(v);
  std::vector<int64_t> axes(x.size() - 2);
  std::iota(axes.begin(), axes.end(), 2);
  return reduce_over(v, "ReduceMax", axes, true);
}

NormalisedNode global_average_pool(const NodeView& v) {
  auto x = window_input(v);
  std::vector<int64_t> axes(x.size() - 2);
  std::iota(axes.begin(), axes.end(), 2);
  return reduce_over(v, "ReduceMean", axes, true);
}

// ---- shape and data movement -------------------------------------------------------------------

// The ONNX target shape resolved against the input: 0 copies the input dim (unless allowzero),
// one -1 takes what is left.
std::vector<int64_t> resolve_shape(const std::vector<int64_t>& in, std::vector<int64_t> shape, bool allow_zero) {
  int64_t known = 1, infer_at = -1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == 0 && !allow_zero) {
      if (i >= in.size()) refuse("shape " + values_text(shape) + " copies dim " + std::to_string(i) + " of input " + dims_text(in));
      shape[i] = in[i];
    }
    if (shape[i] == -1) {
      if (infer_at >= 0) refuse("shape " + values_text(shape) + " has more than one -1");
      infer_at = static_cast<int64_t>(i);
    } else if (shape[i] < 0) {
      refuse("shape " + values_text(shape) + " has a negative dim");
    } else {
      known = element_count({known, shape[i]});
    }
  }
  int64_t total = element_count(in);
  if (infer_at >= 0) {
    if (known == 0 || total % known != 0) refuse("cannot reshape " + dims_text(in) + " to " + values_text(shape));
    shape[static_cast<size_t>(infer_at)] = total / known;
  }
  if (element_count(shape) != total) refuse("cannot reshape " + dims_text(in) + " to " + values_text(shape));
  return shape;
}

NormalisedNode reshape(const NodeView& v) {
  auto x = v.typed_input(0).dims;
  auto shape = v.opset() >= 5 ? v.const_ints(1) : v.ints_attr("shape", {});
  return reshaped(v, resolve_shape(x, shape, v.opset() >= 14 && v.int_attr("allowzero", 0) != 0));
}

NormalisedNode flatten(const NodeView& v) {
  auto x = v.typed_input(0).dims;
  auto rank = static_cast<int64_t>(x.size());
  int64_t axis = v.int_attr("axis", 1);
  if (axis < 0) axis += rank;
  if (axis < 0 || axis > rank) refuse("axis " + std::to_string(v.int_attr("axis", 1)) + " is out of range for rank " + std::to_string(rank));
  return reshaped(v, {element_count({x.begin(), x.begin() + axis}), element_count({x.begin() + axis, x.end()})});
}

std::vector<int64_t> axes_input_or_attr(const NodeView& v, bool required) {
  if (v.opset() >= 13) {
    if (v.has_input(1)) return v.const_ints(1);
  } else if (v.has_attr("axes")) {
    return v.ints_attr("axes", {});
  }
  if (required) refuse("no axes given");
  return {};
}

NormalisedNode squeeze(const NodeView& v) {
  auto x = v.typed_input(0).dims;
  auto axes = normalise_axes(axes_input_or_attr(v, false), static_cast<int64_t>(x.size()));
  std::vector<int64_t> out;
  for (size_t i = 0; i < x.size(); ++i) {
    bool listed = std::binary_search(axes.begin(), axes.end(), static_cast<int64_t>(i));
    if (listed && x[i] != 1) refuse("cannot squeeze axis " + std::to_string(i) + " of size " + std::to_string(x[i]));
    if (!(listed || (axes.empty() && x[i] == 1))) out.push_back(x[i]);
  }
  return reshaped(v, out);
}

NormalisedNode unsqueeze(const NodeView& v) {
  auto x = v.typed_input(0).dims;
  auto raw = axes_input_or_attr(v, true);
  auto axes = normalise_axes(raw, static_cast<int64_t>(x.size() + raw.size()));
  std::vector<int64_t> out;
  size_t next = 0;
  for (size_t i = 0; i < x.size() + axes.size(); ++i)
    out.push_back(std::binary_search(axes.begin(), axes.end(), static_cast<int64_t>(i)) ? 1 : x[next++]);
  return reshaped(v, out);
}

NormalisedNode dropout(const NodeView& v) {
  if (v.opset() < 7 && v.int_attr("is_test", 0) == 0) refuse("Dropout in training form (is_test=0, opset < 7)");
  if (v.opset() >= 12) {
    if (v.has_input(1) && !v.constant(1)) refuse("input 1 '" + v.input(1) + "' is not a constant");
    if (v.has_input(2)) {
      const Weight* mode = v.constant(2);
      if (!mode) refuse("input 2 '" + v.input(2) + "' is not a constant");
      if (mode->data.size < 1 || mode->data.data[0] != 0) refuse("Dropout in training mode");
    }
  }
  return reshaped(v, v.typed_input(0).dims, "Dropout with mask output");
}

NormalisedNode transpose(const NodeView& v) {
  auto x = v.typed_input(0).dims;
  std::vector<int64_t> identity(x.size());
  std::iota(identity.begin(), identity.end(), 0);
  std::vector<int64_t> reversed(identity.rbegin(), identity.rend());
  auto perm = v.ints_attr("perm", reversed);
  auto sorted = perm;
  std::sort(sorted.begin(), sorted.end());
  if (sorted != identity) refuse("attribute perm " + values_text(perm) + " is not a permutation of rank " + std::to_string(x.size()));
  return make(v, "Transpose", {v.input(0)}, {ints_attr("perm", perm)});
}

NormalisedNode concat(const NodeView& v) {
  if (v.input_count() == 0) refuse("Concat without inputs");
  if (v.input_count() == 1) return identity(v);  // a list of one, as torch exports DenseNet's
  auto first = v.typed_input(0).dims;
  auto rank = static_cast<int64_t>(first.size());
  if (v.opset() >= 4 && !v.has_attr("axis")) refuse("attribute axis is missing");
  int64_t axis = normalise_axis(v.int_attr("axis", 1), rank, "axis");
  auto out = first;
  out[static_cast<size_t>(axis)] = 0;
  std::vector<std::string> inputs;
  for (size_t i = 0; i < v.input_count(); ++i) {
    auto d = v.typed_input(i).dims;
    auto masked = d;
    if (d.size() == first.size()) masked[static_cast<size_t>(axis)] = first[static_cast<size_t>(axis)];
    if (masked != first) refuse("input " + std::to_string(i) + " dims " + dims_text(d) + " do not match input 0 dims " + dims_text(first) + " outside axis " + std::to_string(axis));
    out[static_cast<size_t>(axis)] += d[static_cast<size_t>(axis)];
    inputs.push_back(v.input(i));
  }
  return make(v, "Concat", inputs, {int_attr("axis", axis)});
}

NormalisedNode slice(const NodeView& v) {
  auto x = v.typed_input(0).dims;
  auto rank = static_cast<int64_t>(x.size());
  std::vector<int64_t> starts, ends, axes, steps;
  if (v.opset() < 10) {
    starts = v.ints_attr("starts", {});
    ends = v.ints_attr("ends", {});
    axes = v.ints_attr("axes", {});
  } else {
    starts = v.const_ints(1);
    ends = v.const_ints(2);
    if (v.has_input(3)) axes = v.const_ints(3);
    if (v.has_input(4)) steps = v.const_ints(4);
  }
  if (axes.empty()) {
    axes.resize(starts.size());
    std::iota(axes.begin(), axes.end(), 0);
  }
  if (steps.empty()) steps.assign(starts.size(), 1);
  if (ends.size() != starts.size() || axes.size() != starts.size() || steps.size() != starts.size())
    refuse("starts, ends, axes and steps differ in length");
  std::vector<int64_t> all_starts(x.size(), 0), all_steps(x.size(), 1), out = x;
  std::vector<bool> seen(x.size(), false);
  for (size_t k = 0; k < starts.size(); ++k) {
    auto axis = static_cast<size_t>(normalise_axis(axes[k], rank, "axis"));
    if (seen[axis]) refuse("repeated axis " + std::to_string(axis));
    seen[axis] = true;
    int64_t d = x[axis], step = steps[k];
    if (step == 0) refuse("step 0 on axis " + std::to_string(axis));
    // Clamp as ONNX does; values like INT64_MAX mean "to the end".
    auto clamp = [&](int64_t i, int64_t lo, int64_t hi) { return std::clamp(i < 0 ? i + d : i, lo, hi); };
    int64_t s = step > 0 ? clamp(starts[k], 0, d) : clamp(starts[k], 0, d - 1);
    int64_t e = step > 0 ? clamp(ends[k], 0, d) : clamp(ends[k], -1, d - 1);
    // Written so nothing overflows, whatever the step (INT64_MIN has no negation).
    int64_t stride = step > 0 ? step : (step == std::numeric_limits<int64_t>::min() ? std::numeric_limits<int64_t>::max() : -step);
    int64_t span = step > 0 ? e - s : s - e;
    int64_t len = span > 0 ? (span - 1) / stride + 1 : 0;
    all_starts[axis] = s;
    all_steps[axis] = step;
    out[axis] = len;
  }
  return make(v, "Slice", {v.input(0)},
              {ints_attr("starts", all_starts), ints_attr("steps", all_steps), ints_attr("sizes", out)});
}

NormalisedNode gather(const NodeView& v) {
  auto data = v.typed_input(0).dims;
  auto rank = static_cast<int64_t>(data.size());
  if (rank == 0) refuse("Gather from a scalar");
  int64_t axis = normalise_axis(v.int_attr("axis", 0), rank, "axis");
  int32_t type = v.input_elem_type(1);
  const Weight* constant = v.constant(1);
  if (type != onnx::TensorProto::INT64 && type != onnx::TensorProto::INT32)
    refuse("element type " + dtype_name(type) + " on input 1 '" + v.input(1) + "' (indices must be int64 or int32)");
  v.input_dims(1);
  if (constant) {
    int64_t d = data[static_cast<size_t>(axis)];
    for (int64_t i : v.const_ints(1))
      if (i < -d || i >= d) refuse("index " + std::to_string(i) + " is out of range for axis " + std::to_string(axis) + " of size " + std::to_string(d));
  }
  return make(v, "Gather", {v.input(0), v.input(1)}, {int_attr("axis", axis)});
}

NormalisedNode expand(const NodeView& v) {
  v.typed_input(0);
  return make(v, "Expand", {v.input(0)}, {ints_attr("shape", v.const_ints(1))});
}

NormalisedNode tile(const NodeView& v) {
  v.typed_input(0);
  return make(v, "Tile", {v.input(0)}, {ints_attr("repeats", v.const_ints(1))});
}

NormalisedNode trilu(const NodeView& v) {
  v.typed_input(0);
  int64_t k = 0;
  if (v.has_input(1)) {
    auto values = v.const_ints(1);
    if (values.size() != 1) refuse("input 1 'k' has " + std::to_string(values.size()) + " values, expected one");
    k = values[0];
  }
  return make(v, "Trilu", {v.input(0)}, {int_attr("upper", v.int_attr("upper", 1) != 0 ? 1 : 0), int_attr("k", k)});
}

// Pads before opset 11 are attributes, then a constant input (with optional axes from 18).
NormalisedNode pad(const NodeView& v) {
  auto x = v.typed_input(0);
  auto rank = static_cast<int64_t>(x.dims.size());
  std::string mode = v.string_attr("mode", "constant");
  int64_t mode_code = mode == "constant" ? 0 : mode == "reflect" ? 1 : mode == "edge" ? 2 : -1;
  if (mode_code < 0) refuse("Pad mode '" + mode + "'");
  std::vector<int64_t> pads;
  Scalar value{x.dtype == ref::DType::kFloat32, 0.0f, 0};
  if (v.opset() < 11) {
    pads = v.ints_attr(v.opset() < 2 ? "paddings" : "pads", {});
    value = Scalar{true, v.float_attr("value", 0.0f), 0};
  } else {
    pads = v.const_ints(1);
    if (v.has_input(2)) value = v.const_scalar(2);
    if (v.has_input(3)) {
      auto axes = v.const_ints(3);
      if (pads.size() != 2 * axes.size()) refuse("pads " + values_text(pads) + " do not match axes " + values_text(axes));
      std::vector<int64_t> full(2 * x.dims.size(), 0);
      std::vector<bool> seen(x.dims.size(), false);
      for (size_t k = 0; k < axes.size(); ++k) {
        auto a = static_cast<size_t>(normalise_axis(axes[k], rank, "axis"));
        if (seen[a]) refuse("repeated axis " + std::to_string(a));
        seen[a] = true;
        full[a] = pads[k];
        full[a + x.dims.size()] = pads[k + axes.size()];
      }
      pads = full;
    }
  }
  if (pads.size() != 2 * x.dims.size()) refuse("pads " + values_text(pads) + " do not fit rank " + std::to_string(rank));
  if (std::all_of(pads.begin(), pads.end(), [](int64_t p) { return p == 0; })) return identity(v);
  return make(v, "Pad", {v.input(0)},
              {ints_attr("pads", pads), int_attr("mode", mode_code), scalar_attr("value", x.dtype, value)});
}

// Resize (opset 10+) and Upsample: scales or sizes must be constants; tf_crop_and_resize, cubic,
// antialias and aspect-ratio policies stay on CPU.
NormalisedNode resize(const NodeView& v) {
  // 8-bit images are resized as they are (QOperator models leave a Resize on uint8).
  const int32_t type = v.input_elem_type(0);
  auto x = type == onnx::TensorProto::UINT8 || type == onnx::TensorProto::INT8 ? v.input_dims(0) : v.float_input(0);
  size_t rank = x.size();
  bool legacy = v.op() == "Upsample" || v.opset() < 11;
  std::string mode = v.string_attr("mode", "nearest");
  if (mode == "bilinear") mode = "linear";
  if (mode != "nearest" && mode != "linear") refuse(v.op() + " mode '" + mode + "'");
  static const std::map<std::string, int64_t> kCoord = {
      {"half_pixel", 0},    {"asymmetric", 1},                {"pytorch_half_pixel", 2},
      {"align_corners", 3}, {"tf_half_pixel_for_nearest", 4}, {"half_pixel_symmetric", 5}};
  static const std::map<std::string, int64_t> kNearest = {
      {"round_prefer_floor", 0}, {"round_prefer_ceil", 1}, {"floor", 2}, {"ceil", 3}};
  int64_t coord = 1, nearest = 4;  // before opset 11: asymmetric, and ORT's simple rounding
  std::vector<float> scales;
  std::vector<int64_t> sizes;
  if (legacy) {
    // Upsample before opset 9 takes its scales as an attribute, later ones as an input.
    bool attribute = v.op() == "Upsample" && v.opset() < 9;
    if (attribute && !v.has_attr("scales")) refuse("attribute scales is missing");
    scales = attribute ? v.floats_attr("scales") : v.const_floats(1);
  } else {
    std::string c = v.string_attr("coordinate_transformation_mode", "half_pixel");
    std::string n = v.string_attr("nearest_mode", "round_prefer_floor");
    if (!kCoord.count(c)) refuse("coordinate_transformation_mode '" + c + "'");
    if (!kNearest.count(n)) refuse("nearest_mode '" + n + "'");
    coord = kCoord.at(c);
    nearest = kNearest.at(n);
    if (v.int_attr("antialias", 0) != 0) refuse("Resize with antialias");
    if (v.string_attr("keep_aspect_ratio_policy", "stretch") != "stretch") refuse("Resize keep_aspect_ratio_policy other than stretch");
    if (v.has_input(2) && !v.const_floats(2).empty()) scales = v.const_floats(2);
    if (v.has_input(3)) sizes = v.const_ints(3);
    if (scales.empty() == sizes.empty()) refuse("Resize needs exactly one of scales and sizes");
    if (v.has_attr("axes")) {
      // Scales or sizes given for some axes only: the others keep scale 1.
      auto axes = v.ints_attr("axes", {});
      std::vector<float> all_scales(rank, 1.0f);
      std::vector<int64_t> all_sizes = x;
      for (size_t k = 0; k < axes.size(); ++k) {
        auto a = static_cast<size_t>(normalise_axis(axes[k], static_cast<int64_t>(rank), "axis"));
        if (!scales.empty() && k < scales.size()) all_scales[a] = scales[k];
        if (!sizes.empty() && k < sizes.size()) all_sizes[a] = sizes[k];
      }
      if (!scales.empty()) scales = all_scales;
      else sizes = all_sizes;
    }
  }
  if (!sizes.empty()) {
    if (sizes.size() != rank) refuse("sizes " + values_text(sizes) + " do not fit rank " + std::to_string(rank));
    for (int64_t d : sizes)
      if (d < 1) refuse("sizes " + values_text(sizes) + " hold a size below 1");
    for (size_t a = 0; a < rank; ++a) scales.push_back(static_cast<float>(sizes[a]) / static_cast<float>(x[a]));
  } else {
    if (scales.size() != rank) refuse(std::to_string(scales.size()) + " scales for rank " + std::to_string(rank));
    for (size_t a = 0; a < rank; ++a) {
      if (!(scales[a] > 0) || !std::isfinite(scales[a])) refuse("scale " + std::to_string(scales[a]) + " is not positive");
      sizes.push_back(static_cast<int64_t>(scales[a] * static_cast<float>(x[a])));
    }
  }
  return make(v, "Resize", {v.input(0)},
              {int_attr("mode", mode == "linear" ? 1 : 0), int_attr("coord", coord), int_attr("nearest_mode", nearest),
               ref::floats_attr("scales", scales), ints_attr("sizes", sizes)});
}

// ConvTranspose with explicit pads (auto_pad SAME_* and output_shape stay on CPU).
NormalisedNode conv_transpose(const NodeView& v) {
  auto x = window_input(v);
  auto w = v.float_input(1);
  size_t n = x.size() - 2;
  if (w.size() != x.size()) refuse("weight dims " + dims_text(w) + " do not match input rank " + std::to_string(x.size()));
  std::string auto_pad = v.string_attr("auto_pad", "NOTSET");
  if (auto_pad != "NOTSET" && auto_pad != "VALID") refuse("ConvTranspose with auto_pad=" + auto_pad);
  if (v.has_attr("output_shape")) refuse("ConvTranspose with output_shape");
  auto kernel = spatial(w);
  if (v.has_attr("kernel_shape") && v.ints_attr("kernel_shape", {}) != kernel)
    refuse("attribute kernel_shape " + dims_text(v.ints_attr("kernel_shape", {})) + " differs from weight dims " + dims_text(w));
  std::vector<std::string> inputs = {v.input(0), v.input(1), v.has_input(2) ? v.input(2) : ""};
  return make(v, "ConvTranspose", inputs,
              {ints_attr("kernel_shape", kernel), ints_attr("strides", window_list(v, "strides", n, 1, 1)),
               ints_attr("pads", auto_pad == "VALID" ? std::vector<int64_t>(2 * n, 0) : window_list(v, "pads", 2 * n, 0, 0)),
               ints_attr("dilations", window_list(v, "dilations", n, 1, 1)),
               ints_attr("output_padding", window_list(v, "output_padding", n, 0, 0)),
               int_attr("group", v.int_attr("group", 1))});
}

// GroupNormalization: scale and bias per channel (opset 21); opset 18's per-group form only when
// every group is one channel.
NormalisedNode group_norm(const NodeView& v) {
  auto x = v.float_input(0);
  int64_t groups = v.int_attr("num_groups", 0);
  if (x.size() < 2 || groups < 1) refuse("GroupNormalization of " + dims_text(x) + " in " + std::to_string(groups) + " groups");
  for (size_t i = 1; i <= 2; ++i)
    if (v.float_input(i) != std::vector<int64_t>{x[1]})
      refuse("input " + std::to_string(i) + " '" + v.input(i) + "' has dims " + dims_text(v.input_dims(i)) +
             ", expected one value per channel [" + std::to_string(x[1]) + "]");
  if (v.int_attr("stash_type", 1) != 1) refuse("GroupNormalization with stash_type other than float32");
  return make(v, "GroupNormalization", {v.input(0), v.input(1), v.input(2)},
              {int_attr("groups", groups), float_attr("epsilon", v.float_attr("epsilon", 1e-5f))});
}

NormalisedNode arg_extreme(const NodeView& v) {
  auto x = v.float_input(0);
  int64_t axis = normalise_axis(v.int_attr("axis", 0), static_cast<int64_t>(x.size()), "axis");
  return make(v, v.op(), {v.input(0)},
              {int_attr("axis", axis), int_attr("keepdims", v.int_attr("keepdims", 1) != 0 ? 1 : 0),
               int_attr("select_last_index", v.int_attr("select_last_index", 0) != 0 ? 1 : 0)});
}

NormalisedNode gather_elements(const NodeView& v) {
  auto data = v.typed_input(0).dims;
  v.typed_input(1);
  int64_t axis = normalise_axis(v.int_attr("axis", 0), static_cast<int64_t>(data.size()), "axis");
  return make(v, "GatherElements", {v.input(0), v.input(1)}, {int_attr("axis", axis)});
}

// OneHot: depth a constant scalar, values a constant [off, on] pair.
NormalisedNode one_hot(const NodeView& v) {
  auto indices = v.typed_input(0);
  auto depth = v.const_scalar(1);
  if (depth.is_float && !(depth.f >= 1 && depth.f < static_cast<float>(kMaxElements)))
    refuse("depth " + std::to_string(depth.f) + " is not a count");
  int64_t d = depth.is_float ? static_cast<int64_t>(depth.f) : depth.i;
  const Weight* values = v.constant(2);
  if (!values) refuse("input 2 'values' is not a constant");
  ref::DType dtype = ref_dtype(values->data.dtype, "input 2 'values'");
  if (values->data.element_count() != 2) refuse("input 2 'values' does not hold [off, on]");
  auto element = [&](size_t k) {
    size_t size = values->data.size / 2;
    return scalar_of(values->data.dtype, values->data.data + k * size, size, "input 2 'values'");
  };
  int64_t axis = normalise_axis(v.int_attr("axis", -1), static_cast<int64_t>(indices.dims.size()) + 1, "axis");
  return make(v, "OneHot", {v.input(0)},
              {int_attr("depth", d), int_attr("axis", axis), int_attr("dtype", static_cast<int64_t>(dtype)),
               scalar_attr("off", dtype, element(0)), scalar_attr("on", dtype, element(1))});
}

NormalisedNode gather_nd(const NodeView& v) {
  v.typed_input(0);
  v.typed_input(1);
  return make(v, "GatherND", {v.input(0), v.input(1)}, {int_attr("batch_dims", v.int_attr("batch_dims", 0))});
}

NormalisedNode scatter_elements(const NodeView& v) {
  auto data = v.typed_input(0).dims;
  v.typed_input(1);
  v.typed_input(2);
  std::string reduction = v.string_attr("reduction", "none");
  static const std::map<std::string, int64_t> kReductions = {{"none", 0}, {"add", 1}, {"mul", 2}, {"max", 3}, {"min", 4}};
  if (!kReductions.count(reduction)) refuse("reduction '" + reduction + "'");
  int64_t axis = normalise_axis(v.int_attr("axis", 0), static_cast<int64_t>(data.size()), "axis");
  return make(v, "ScatterElements", {v.input(0), v.input(1), v.input(2)},
              {int_attr("axis", axis), int_attr("reduction", kReductions.at(reduction))});
}

NormalisedNode eye_like(const NodeView& v) {
  auto x = v.typed_input(0);
  ref::DType dtype = v.has_attr("dtype") ? ref_dtype(static_cast<int32_t>(v.int_attr("dtype", 1)), "attribute dtype") : x.dtype;
  return make(v, "EyeLike", {v.input(0)}, {int_attr("k", v.int_attr("k", 0)), int_attr("dtype", static_cast<int64_t>(dtype))});
}

NormalisedNode cum_sum(const NodeView& v) {
  auto x = v.typed_input(0).dims;
  auto axis_values = v.const_ints(1);
  if (axis_values.size() != 1) refuse("input 1 'axis' holds " + std::to_string(axis_values.size()) + " values, expected one");
  int64_t axis = normalise_axis(axis_values[0], static_cast<int64_t>(x.size()), "axis");
  return make(v, "CumSum", {v.input(0)},
              {int_attr("axis", axis), int_attr("exclusive", v.int_attr("exclusive", 0) != 0 ? 1 : 0),
               int_attr("reverse", v.int_attr("reverse", 0) != 0 ? 1 : 0)});
}

// The dims of a tensor as data: Shape (with start/end from opset 15) and Size. They read no data,
// so the folder evaluates them from static dims alone.
NormalisedNode shape(const NodeView& v) {
  auto x = v.typed_input(0).dims;
  auto rank = static_cast<int64_t>(x.size());
  int64_t start = v.opset() >= 15 ? v.int_attr("start", 0) : 0;
  int64_t end = v.opset() >= 15 ? v.int_attr("end", rank) : rank;
  auto clamp = [&](int64_t i) { return std::clamp(i < 0 ? i + rank : i, int64_t{0}, rank); };
  return make(v, "Shape", {v.input(0)}, {int_attr("start", clamp(start)), int_attr("end", std::max(clamp(start), clamp(end)))});
}

NormalisedNode size(const NodeView& v) {
  v.typed_input(0);
  return make(v, "Size", {v.input(0)});
}

using Rule = NormalisedNode (*)(const NodeView&);

const std::map<std::string, Rule>& rules() {
  static const std::map<std::string, Rule> kRules = {
      {"Add", binary},          {"Sub", binary},
      {"Mul", binary},          {"Div", binary},
      {"Pow", binary},          {"Sqrt", unary},
      {"Exp", unary},           {"Erf", unary},
      {"Neg", typed_unary},     {"Abs", typed_unary},
      {"Relu", unary},          {"Sigmoid", unary},
      {"Tanh", unary},          {"HardSwish", unary},
      {"LeakyRelu", leaky_relu}, {"HardSigmoid", hard_sigmoid},
      {"Clip", clip},           {"Softmax", softmax},
      {"MatMul", matmul},       {"Gemm", gemm},
      {"Conv", conv},           {"BatchNormalization", batch_norm},
      {"MaxPool", pool},        {"AveragePool", pool},
      {"GlobalAveragePool", global_average_pool},
      {"ReduceMean", reduce},   {"ReduceSum", reduce},
      {"Transpose", transpose}, {"Reshape", reshape},
      {"Flatten", flatten},     {"Squeeze", squeeze},
      {"Unsqueeze", unsqueeze}, {"Concat", concat},
      {"Slice", slice},         {"Gather", gather},
      {"Identity", identity}, {"Dropout", dropout},
      {"Min", min_max},         {"Max", min_max},
      {"Where", where},
      {"Equal", binary},        {"Less", binary},
      {"Greater", binary},      {"LessOrEqual", binary},
      {"GreaterOrEqual", binary}, {"And", binary},
      {"Or", binary},           {"Xor", binary},
      {"Not", typed_unary},     {"Cast", cast},
      {"CastLike", cast},
      {"Log", unary},           {"Sin", unary},
      {"Cos", unary},           {"Reciprocal", unary},
      {"Softplus", unary},      {"Elu", alpha_one},
      {"Selu", selu},           {"LogSoftmax", softmax},
      {"Hardmax", softmax},     {"CumSum", cum_sum},
      {"Tan", unary},           {"Asin", unary},
      {"Acos", unary},          {"Atan", unary},
      {"Sinh", unary},          {"Cosh", unary},
      {"Asinh", unary},         {"Acosh", unary},
      {"Atanh", unary},         {"Sign", unary},
      {"Ceil", unary},          {"Softsign", unary},
      {"ThresholdedRelu", alpha_one},
      {"Celu", alpha_one},      {"Shrink", shrink},
      {"IsInf", is_inf},        {"IsNaN", unary},
      {"Mod", mod},             {"GlobalMaxPool", global_max_pool},
      {"OneHot", one_hot},      {"EyeLike", eye_like},
      {"GatherND", gather_nd},  {"ScatterElements", scatter_elements},
      {"ReduceMax", reduce},    {"ReduceMin", reduce},
      {"InstanceNormalization", instance_norm},
      {"ConstantOfShape", constant_of_shape}, {"Range", range},
      {"Expand", expand},       {"Tile", tile},
      {"Trilu", trilu},         {"Pad", pad},
      {"Shape", shape},         {"Size", size},
      {"Resize", resize},       {"Upsample", resize},
      {"ConvTranspose", conv_transpose},
      {"GroupNormalization", group_norm},
      {"ArgMax", arg_extreme},  {"ArgMin", arg_extreme},
      {"GatherElements", gather_elements},
      {"ReduceProd", reduce},   {"ReduceL1", reduce},
      {"ReduceL2", reduce},     {"ReduceSumSquare", reduce},
      {"ReduceLogSum", reduce}, {"ReduceLogSumExp", reduce},
      {"QuantizeLinear", quantize_linear}, {"DequantizeLinear", dequantize_linear},
      {"MatMulNBits", matmul_nbits}, {"GatherBlockQuantized", gather_block_quantized},
      {"MatMulInteger", integer_product}, {"ConvInteger", integer_product},
  };
  return kRules;
}

// Ops with several outputs, lowered to one ref op per output.
using MultiRule = std::vector<NormalisedNode> (*)(const NodeView&);

// Builds the parts of a node that becomes several ref ops; values between them are internal,
// named after the node's first output so they stay unique.
class Parts {
 public:
  explicit Parts(const NodeView& v) : v_(v) {}
  // Adds `type` reading `inputs` and writing `output`, one of the node's outputs, or a fresh
  // internal value when `output` is empty; returns the value written.
  std::string add(std::string type, std::vector<std::string> inputs, std::vector<ref::Attr> attrs, std::string output = {}) {
    NormalisedNode n;
    n.type = std::move(type);
    n.inputs = std::move(inputs);
    n.attrs = std::move(attrs);
    n.internal = output.empty();
    n.output = n.internal ? v_.output(0) + "/ctxgen_" + std::to_string(parts_.size()) : std::move(output);
    parts_.push_back(n);
    return n.output;
  }
  // The node's one output, written by the last part of a node that has only one.
  std::string out() const { return v_.single_output(kNoExtraOutputs); }
  std::vector<NormalisedNode> take() { return std::move(parts_); }

 private:
  const NodeView& v_;
  std::vector<NormalisedNode> parts_;
};


// Split: one Slice per output, along `axis`, sizes from the `split` list or equal parts.
std::vector<NormalisedNode> split(const NodeView& v) {
  auto x = v.typed_input(0).dims;
  auto rank = static_cast<int64_t>(x.size());
  auto axis = static_cast<size_t>(normalise_axis(v.int_attr("axis", 0), rank, "axis"));
  std::vector<int64_t> sizes;
  if (v.opset() < 13) sizes = v.ints_attr("split", {});
  else if (v.has_input(1)) sizes = v.const_ints(1);
  auto outputs = static_cast<int64_t>(v.has_attr("num_outputs") ? v.int_attr("num_outputs", 0) : v.output_count());
  if (outputs < 1) refuse("Split into " + std::to_string(outputs) + " outputs");
  if (outputs != static_cast<int64_t>(v.output_count()))
    refuse("Split into " + std::to_string(outputs) + " parts has " + std::to_string(v.output_count()) + " outputs");
  if (sizes.empty()) {
    // Equal parts; from opset 18 the last may be smaller (ceil division), before that it must divide.
    int64_t part = (x[axis] + outputs - 1) / outputs;
    if (v.opset() < 18 && x[axis] % outputs != 0)
      refuse("axis " + std::to_string(axis) + " of size " + std::to_string(x[axis]) + " does not split into " +
             std::to_string(outputs) + " equal parts");
    for (int64_t k = 0, left = x[axis]; k < outputs; ++k, left -= part) sizes.push_back(std::min(part, left));
  }
  if (static_cast<int64_t>(sizes.size()) != outputs || static_cast<int64_t>(v.output_count()) != outputs)
    refuse("split sizes " + values_text(sizes) + " do not match the " + std::to_string(v.output_count()) + " outputs");
  Parts parts(v);
  int64_t start = 0;
  for (size_t k = 0; k < sizes.size(); ++k) {
    if (sizes[k] < 0 || sizes[k] > x[axis] - start) refuse("split sizes " + values_text(sizes) + " exceed axis size " + std::to_string(x[axis]));
    if (v.output(k).empty()) refuse("output " + std::to_string(k) + " is absent");
    std::vector<int64_t> starts(x.size(), 0), steps(x.size(), 1), out = x;
    starts[axis] = start;
    out[axis] = sizes[k];
    parts.add("Slice", {v.input(0)}, {ints_attr("starts", starts), ints_attr("steps", steps), ints_attr("sizes", out)},
              v.output(k));
    start += sizes[k];
  }
  if (start != x[axis]) refuse("split sizes " + values_text(sizes) + " do not add up to axis size " + std::to_string(x[axis]));
  return parts.take();
}

// Sum of any number of inputs: a copy, or a chain of Adds.
std::vector<NormalisedNode> sum(const NodeView& v) {
  if (v.input_count() == 0) refuse("Sum without inputs");
  for (size_t i = 0; i < v.input_count(); ++i) v.typed_input(i);
  Parts parts(v);
  if (v.input_count() == 1) {
    parts.add("Reshape", {v.input(0)}, {ints_attr("shape", v.typed_input(0).dims)}, parts.out());
    return parts.take();
  }
  std::string acc = v.input(0);
  for (size_t i = 1; i < v.input_count(); ++i)
    acc = parts.add("Add", {acc, v.input(i)}, {}, i + 1 == v.input_count() ? parts.out() : "");
  return parts.take();
}

// Einsum of two operands that is a batched matrix product ("bij,bjk->bik", "bhqd,bhkd->bhqk",
// "i,j->ij" ...), or of one operand that is a permutation ("ij->ji"): lowered to Transpose,
// Reshape and MatMul. Sums over letters of one operand, diagonals and "..." stay on CPU.
std::vector<NormalisedNode> einsum(const NodeView& v) {
  std::string eq;
  for (char c : v.string_attr("equation", "")) if (c != ' ') eq += c;
  auto arrow = eq.find("->");
  if (arrow == std::string::npos || eq.find("...") != std::string::npos)
    refuse("Einsum equation '" + eq + "' (ref takes explicit '->' without '...')");
  std::string out = eq.substr(arrow + 2), lhs = eq.substr(0, arrow);
  std::vector<std::string> ops;
  for (size_t at = 0;;) {
    auto comma = lhs.find(',', at);
    ops.push_back(lhs.substr(at, comma == std::string::npos ? std::string::npos : comma - at));
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  if (ops.size() != v.input_count() || ops.empty() || ops.size() > 2)
    refuse("Einsum with " + std::to_string(ops.size()) + " operands (ref takes one or two)");
  std::map<char, int64_t> size;
  for (size_t k = 0; k < ops.size(); ++k) {
    auto dims = v.float_input(k);
    if (dims.size() != ops[k].size()) refuse("Einsum operand " + std::to_string(k) + " '" + ops[k] + "' does not match dims " + dims_text(dims));
    for (size_t i = 0; i < dims.size(); ++i) {
      char c = ops[k][i];
      if (ops[k].find(c) != i) refuse("Einsum repeats '" + std::string(1, c) + "' in one operand");
      if (size.count(c) && size[c] != dims[i]) refuse("Einsum letter '" + std::string(1, c) + "' has two sizes");
      size[c] = dims[i];
    }
  }
  for (char c : out)
    if (!size.count(c) || out.find(c) != out.rfind(c)) refuse("Einsum output '" + out + "' is not a set of input letters");
  auto in = [&](const std::string& s, char c) { return s.find(c) != std::string::npos; };
  auto permutation = [](const std::string& from, const std::string& to) {
    std::vector<int64_t> perm;
    for (char c : to) perm.push_back(static_cast<int64_t>(from.find(c)));
    return perm;
  };
  auto dims_of = [&](const std::string& letters) {
    std::vector<int64_t> dims;
    for (char c : letters) dims.push_back(size[c]);
    return dims;
  };
  Parts parts(v);
  // Transposes `value` from `from` to `to` letter order, unless it already is.
  auto transposed = [&](const std::string& value, const std::string& from, const std::string& to, bool last) {
    if (from == to && !last) return value;
    return parts.add("Transpose", {value}, {ints_attr("perm", permutation(from, to))}, last ? parts.out() : "");
  };
  if (ops.size() == 1) {
    if (ops[0].size() != out.size()) refuse("Einsum '" + eq + "' sums over an operand");
    transposed(v.input(0), ops[0], out, true);
    return parts.take();
  }
  const std::string &a = ops[0], &b = ops[1];
  std::string batch, free_a, free_b, contracted;
  for (char c : a) {
    if (in(b, c)) (in(out, c) ? batch : contracted) += c;
    else if (in(out, c)) free_a += c;
    else refuse("Einsum '" + eq + "' sums '" + std::string(1, c) + "' over one operand");
  }
  for (char c : b)
    if (!in(a, c)) {
      if (!in(out, c)) refuse("Einsum '" + eq + "' sums '" + std::string(1, c) + "' over one operand");
      free_b += c;
    }
  auto product = [&](const std::string& letters) { return element_count(dims_of(letters)); };
  auto as_matrix = [&](const std::string& value, const std::string& letters, std::vector<int64_t> tail) {
    std::vector<int64_t> shape = dims_of(batch);
    shape.insert(shape.end(), tail.begin(), tail.end());
    if (shape == dims_of(letters)) return value;
    return parts.add("Reshape", {value}, {ints_attr("shape", shape)});
  };
  std::string a_order = batch + free_a + contracted, b_order = batch + contracted + free_b;
  std::string am = as_matrix(transposed(v.input(0), a, a_order, false), a_order, {product(free_a), product(contracted)});
  std::string bm = as_matrix(transposed(v.input(1), b, b_order, false), b_order, {product(contracted), product(free_b)});
  std::string result_order = batch + free_a + free_b;
  bool needs_shape = dims_of(batch).size() + 2 != result_order.size() ||
                     dims_of(free_a) != std::vector<int64_t>{product(free_a)} || dims_of(free_b) != std::vector<int64_t>{product(free_b)};
  bool needs_perm = result_order != out;
  std::string y = parts.add("MatMul", {am, bm}, {int_attr("act", 0)}, !needs_shape && !needs_perm ? parts.out() : "");
  if (needs_shape) y = parts.add("Reshape", {y}, {ints_attr("shape", dims_of(result_order))}, !needs_perm ? parts.out() : "");
  if (needs_perm) transposed(y, result_order, out, true);
  return parts.take();
}

// LayerNormalization: Y, and the Mean and InvStdDev outputs when asked for, each one ref op.
std::vector<NormalisedNode> layer_norm(const NodeView& v) {
  if (v.int_attr("stash_type", 1) != 1) refuse("LayerNormalization with stash_type other than float32");
  auto x = v.float_input(0);
  auto rank = static_cast<int64_t>(x.size());
  int64_t axis = normalise_axis(v.int_attr("axis", -1), rank, "axis");
  std::vector<int64_t> normalised(x.begin() + axis, x.end());
  std::vector<std::string> inputs = {v.input(0), v.input(1), v.has_input(2) ? v.input(2) : ""};
  for (size_t i = 1; i <= 2; ++i) {
    if (!v.has_input(i)) continue;
    // The runtime indexes Scale and B by position in the normalised block, so they must cover it.
    auto p = v.float_input(i);
    if (element_count(p) != element_count(normalised) || broadcast_dims(p, normalised) != normalised)
      refuse("input " + std::to_string(i) + " '" + v.input(i) + "' dims " + dims_text(p) +
             " do not match the normalised dims " + dims_text(normalised));
  }
  Parts parts(v);
  for (size_t k = 0; k < v.output_count() && k < 3; ++k)
    if (!v.output(k).empty())
      parts.add("LayerNormalization", inputs,
                {int_attr("axis", axis), float_attr("epsilon", v.float_attr("epsilon", 1e-5f)),
                 int_attr("output", static_cast<int64_t>(k))},
                v.output(k));
  auto all = parts.take();
  if (all.empty()) refuse("no output is used");
  return all;
}

// The NegativeLogLikelihoodLoss attributes, for it and for SoftmaxCrossEntropyLoss.
std::vector<ref::Attr> loss_attrs(const NodeView& v) {
  std::string reduction = v.string_attr("reduction", "mean");
  int64_t code = reduction == "none" ? 0 : reduction == "sum" ? 1 : reduction == "mean" ? 2 : -1;
  if (code < 0) refuse("reduction '" + reduction + "'");
  return {int_attr("reduction", code), int_attr("ignore_index", v.int_attr("ignore_index", 0)),
          int_attr("has_ignore_index", v.has_attr("ignore_index") ? 1 : 0)};
}

std::vector<NormalisedNode> nll_loss(const NodeView& v) {
  v.float_input(0);
  v.typed_input(1);
  Parts parts(v);
  parts.add("NegativeLogLikelihoodLoss", {v.input(0), v.input(1), v.has_input(2) ? v.input(2) : ""}, loss_attrs(v), parts.out());
  return parts.take();
}

// SoftmaxCrossEntropyLoss = LogSoftmax over the classes (axis 1), then NegativeLogLikelihoodLoss;
// the log-probabilities are its second output when asked for.
std::vector<NormalisedNode> softmax_cross_entropy(const NodeView& v) {
  auto x = v.float_input(0);
  v.typed_input(1);
  if (x.size() < 2) refuse("scores of dims " + dims_text(x) + ", expected N x C x ...");
  if (v.output(0).empty()) refuse("output 0 is absent");
  Parts parts(v);
  bool log_prob = v.output_count() > 1 && !v.output(1).empty();
  std::string p = parts.add("LogSoftmax", {v.input(0)}, {int_attr("axis", 1), int_attr("coerce_2d", 0)},
                            log_prob ? v.output(1) : "");
  parts.add("NegativeLogLikelihoodLoss", {p, v.input(1), v.has_input(2) ? v.input(2) : ""}, loss_attrs(v), v.output(0));
  return parts.take();
}

// DepthToSpace (DCR or CRD) and SpaceToDepth: Reshape, Transpose, Reshape.
std::vector<NormalisedNode> depth_space(const NodeView& v) {
  auto x = v.typed_input(0).dims;
  if (x.size() != 4) refuse(v.op() + " of dims " + dims_text(x) + ", expected N x C x H x W");
  int64_t b = v.int_attr("blocksize", 0), n = x[0], c = x[1], h = x[2], w = x[3];
  if (b < 1) refuse("blocksize " + std::to_string(b));
  std::vector<int64_t> split, perm, shape;
  if (v.op() == "SpaceToDepth") {
    if (h % b != 0 || w % b != 0) refuse("H and W of " + dims_text(x) + " are not multiples of blocksize " + std::to_string(b));
    split = {n, c, h / b, b, w / b, b};
    perm = {0, 3, 5, 1, 2, 4};
    shape = {n, c * b * b, h / b, w / b};
  } else {
    if (c % (b * b) != 0) refuse("C of " + dims_text(x) + " is not a multiple of blocksize² " + std::to_string(b * b));
    bool crd = v.string_attr("mode", "DCR") == "CRD";
    split = crd ? std::vector<int64_t>{n, c / (b * b), b, b, h, w} : std::vector<int64_t>{n, b, b, c / (b * b), h, w};
    perm = crd ? std::vector<int64_t>{0, 1, 4, 2, 5, 3} : std::vector<int64_t>{0, 3, 4, 1, 5, 2};
    shape = {n, c / (b * b), h * b, w * b};
  }
  Parts parts(v);
  std::string s = parts.add("Reshape", {v.input(0)}, {ints_attr("shape", split)});
  s = parts.add("Transpose", {s}, {ints_attr("perm", perm)});
  parts.add("Reshape", {s}, {ints_attr("shape", shape)}, parts.out());
  return parts.take();
}

// PRelu broadcasts the slope to X only. Before opset 7 a slope of C values is per channel (axis
// 1); it is viewed as [C, 1, ...] first.
std::vector<NormalisedNode> prelu(const NodeView& v) {
  auto x = v.float_input(0);
  auto slope = v.float_input(1);
  Parts parts(v);
  std::string s = v.input(1);
  if (v.opset() < 7 && slope.size() == 1 && x.size() >= 2 && slope[0] == x[1] && x[1] != 1) {
    slope.assign(x.size() - 1, 1);
    slope[0] = x[1];
    s = parts.add("Reshape", {s}, {ints_attr("shape", slope)});
  }
  if (broadcast_dims(x, slope) != x) refuse("slope dims " + values_text(slope) + " do not broadcast to X dims " + dims_text(x));
  parts.add("PRelu", {v.input(0), s}, {}, parts.out());
  return parts.take();
}

// ---- QOperator form ----------------------------------------------------------------------------

// DequantizeLinear of input `i` with the scale and zero point at `i + 1` and `i + 2`: one scale, or
// one per index of `axis`.
std::string dequantized(Parts& parts, const NodeView& v, size_t i, int64_t axis) {
  const auto scale = v.float_input(i + 1);
  const bool per_tensor = scale.size() <= 1 && element_count(scale) == 1;
  return parts.add("DequantizeLinear", {v.input(i), v.input(i + 1), v.has_input(i + 2) ? v.input(i + 2) : ""},
                   {int_attr("axis", per_tensor ? 0 : axis), int_attr("block_size", 0)});
}

// The float result `y` quantized with the scale and zero point at inputs `i` and `i + 1`.
void quantized(Parts& parts, const NodeView& v, const std::string& y, size_t i) {
  if (!v.has_input(i + 1)) refuse("input " + std::to_string(i + 1) + " (the output's zero point) is absent");
  const ref::DType t = v.typed_input(i + 1).dtype;
  parts.add("QuantizeLinear", {y, v.input(i), v.input(i + 1)},
            {int_attr("axis", 0), int_attr("block_size", 0), int_attr("dtype", static_cast<int64_t>(t))}, parts.out());
}

// The int32 bias at input `i` dequantized with scale a_scale x b_scale (inputs 1 and 4), one value
// or one per index of the bias's last dim.
std::string dequantized_bias(Parts& parts, const NodeView& v, size_t i) {
  const std::string scale = parts.add("Mul", {v.input(1), v.input(4)}, {});
  const int64_t axis = std::max<int64_t>(static_cast<int64_t>(v.input_dims(i).size()) - 1, 0);
  return parts.add("DequantizeLinear", {v.input(i), scale, ""}, {int_attr("axis", axis), int_attr("block_size", 0)});
}

// QLinearConv: what its QDQ unit computes (docs/ops.md, "Quantized models"): x and w dequantized
// (w per output channel), the int32 bias dequantized with scale x_scale * w_scale, a float32 Conv,
// the result quantized.
std::vector<NormalisedNode> qlinear_conv(const NodeView& v) {
  const auto x = v.input_dims(0), w = v.input_dims(3);
  const auto attrs = conv_attrs(v, x, w);
  Parts parts(v);
  const std::string xf = dequantized(parts, v, 0, 0), wf = dequantized(parts, v, 3, 0);
  std::string bias;
  if (v.has_input(8)) {
    if (v.input_dims(8) != std::vector<int64_t>{w[0]}) refuse("bias dims " + dims_text(v.input_dims(8)) + ", expected [" + std::to_string(w[0]) + "]");
    bias = dequantized_bias(parts, v, 8);
  }
  quantized(parts, v, parts.add("Conv", {xf, wf, bias}, attrs), 6);
  return parts.take();
}

// QLinearMatMul: a dequantized per tensor or per row, b per tensor or per column, a float32
// MatMul, the result quantized.
std::vector<NormalisedNode> qlinear_matmul(const NodeView& v) {
  const auto a = v.input_dims(0), b = v.input_dims(3);
  Parts parts(v);
  const std::string af = dequantized(parts, v, 0, static_cast<int64_t>(a.size()) - 2);
  const std::string bf = dequantized(parts, v, 3, static_cast<int64_t>(b.size()) - 1);
  quantized(parts, v, parts.add("MatMul", {af, bf}, {int_attr("act", 0)}), 6);
  return parts.take();
}

// The com.microsoft QLinear ops ONNX Runtime's tool writes in QOperator form: each is its QDQ
// unit, like QLinearConv (inputs as triples value, scale, zero point; the output's scale and zero
// point last, or first for QLinearConcat).
std::vector<NormalisedNode> qlinear_microsoft(const NodeView& v) {
  const std::string& op = v.op();
  const int64_t rank = static_cast<int64_t>(v.input_dims(0).size());
  if (v.int_attr("channels_last", 0) != 0) refuse(op + " with channels_last");
  Parts parts(v);
  if (op == "QLinearConcat") {
    if (v.input_count() < 5 || (v.input_count() - 2) % 3 != 0) refuse("QLinearConcat with " + std::to_string(v.input_count()) + " inputs");
    std::vector<std::string> values;
    for (size_t i = 2; i < v.input_count(); i += 3) values.push_back(dequantized(parts, v, i, 0));
    const int64_t concat_rank = static_cast<int64_t>(v.input_dims(2).size());
    const auto y = parts.add("Concat", values, {int_attr("axis", normalise_axis(v.int_attr("axis", 0), concat_rank, "axis"))});
    quantized(parts, v, y, 0);
    return parts.take();
  }
  if (op == "QLinearAdd" || op == "QLinearMul") {
    const auto a = dequantized(parts, v, 0, 0), b = dequantized(parts, v, 3, 0);
    quantized(parts, v, parts.add(op == "QLinearAdd" ? "Add" : "Mul", {a, b}, {}), 6);
    return parts.take();
  }
  if (op == "QGemm") {
    const int64_t trans_a = v.int_attr("transA", 0), trans_b = v.int_attr("transB", 0);
    const auto a = dequantized(parts, v, 0, 0), b = dequantized(parts, v, 3, trans_b ? 0 : 1);
    std::string bias;
    if (v.has_input(6)) {
      // C's scale is alpha x a_scale x b_scale.
      if (v.float_attr("alpha", 1.0f) != 1.0f) refuse("QGemm with a bias and alpha other than 1");
      bias = dequantized_bias(parts, v, 6);
    }
    const std::vector<ref::Attr> attrs = {int_attr("transA", trans_a ? 1 : 0), int_attr("transB", trans_b ? 1 : 0),
                                          float_attr("alpha", v.float_attr("alpha", 1.0f)), float_attr("beta", 1.0f),
                                          int_attr("act", 0)};
    if (!v.has_input(7)) {  // no output scale: the float result
      parts.add("Gemm", {a, b, bias}, attrs, parts.out());
      return parts.take();
    }
    quantized(parts, v, parts.add("Gemm", {a, b, bias}, attrs), 7);
    return parts.take();
  }
  const auto x = dequantized(parts, v, 0, 0);
  std::string y;
  if (op == "QLinearSigmoid") y = parts.add("Sigmoid", {x}, {});
  else if (op == "QLinearLeakyRelu") y = parts.add("LeakyRelu", {x}, {float_attr("alpha", v.float_attr("alpha", 0.01f))});
  else if (op == "QLinearSoftmax")
    y = parts.add("Softmax", {x}, {int_attr("axis", normalise_axis(v.int_attr("axis", -1), rank, "axis")),
                                   int_attr("coerce_2d", v.int_attr("opset", 13) < 13 ? 1 : 0)});
  else {  // QLinearGlobalAveragePool
    if (rank < 3) refuse("input 0 has rank " + std::to_string(rank) + ", expected N x C x D1 ...");
    std::vector<int64_t> axes(static_cast<size_t>(rank - 2));
    std::iota(axes.begin(), axes.end(), 2);
    y = parts.add("ReduceMean", {x}, {ints_attr("axes", axes), int_attr("keepdims", 1)});
  }
  quantized(parts, v, y, 3);
  return parts.take();
}

// DynamicQuantizeLinear: its scale and its zero point (each a ref op reading the input's range),
// and its values as the QuantizeLinear with them they are (x / scale rounded half to even, plus
// the zero point, saturated), which runs at the speed of one.
std::vector<NormalisedNode> dynamic_quantize_linear(const NodeView& v) {
  v.float_input(0);
  Parts parts(v);
  const auto named = [&](size_t k) { return k < v.output_count() ? v.output(k) : std::string(); };
  const bool values = !named(0).empty();
  std::string scale, zero;
  if (values || !named(1).empty()) scale = parts.add("DynamicQuantizeLinear", {v.input(0)}, {int_attr("output", 1)}, named(1));
  if (values || !named(2).empty()) zero = parts.add("DynamicQuantizeLinear", {v.input(0)}, {int_attr("output", 2)}, named(2));
  if (values)
    parts.add("QuantizeLinear", {v.input(0), scale, zero},
              {int_attr("axis", 0), int_attr("block_size", 0), int_attr("dtype", static_cast<int64_t>(ref::DType::kUInt8))}, named(0));
  return parts.take();
}

const std::map<std::string, MultiRule>& multi_rules() {
  static const std::map<std::string, MultiRule> kRules = {
      {"Split", split},
      {"Sum", sum},
      {"Einsum", einsum},
      {"PRelu", prelu},
      {"LayerNormalization", layer_norm},
      {"NegativeLogLikelihoodLoss", nll_loss},
      {"SoftmaxCrossEntropyLoss", softmax_cross_entropy},
      {"DepthToSpace", depth_space},
      {"SpaceToDepth", depth_space},
      {"QLinearConv", qlinear_conv},
      {"QLinearMatMul", qlinear_matmul},
      {"QLinearAdd", qlinear_microsoft},
      {"QLinearMul", qlinear_microsoft},
      {"QLinearSigmoid", qlinear_microsoft},
      {"QLinearLeakyRelu", qlinear_microsoft},
      {"QLinearSoftmax", qlinear_microsoft},
      {"QLinearGlobalAveragePool", qlinear_microsoft},
      {"QLinearConcat", qlinear_microsoft},
      {"QGemm", qlinear_microsoft},
      {"DynamicQuantizeLinear", dynamic_quantize_linear}};
  return kRules;
}

}  // namespace

int32_t elem_type_of(const Model& model, const std::string& name) {
  if (const ValueType* type = model.type_of(name); type && type->elem_type != 0) return type->elem_type;
  if (const Weight* constant = model.constant(name)) return constant->data.dtype;
  return 0;
}

std::vector<std::string> supported_op_types() {
  std::vector<std::string> ops;
  for (const auto& [op, rule] : rules()) ops.push_back(op);
  for (const auto& [op, rule] : multi_rules()) ops.push_back(op);
  std::sort(ops.begin(), ops.end());
  return ops;
}

namespace {

// The output type of a normalised node from the runtime's rule, checked against what shape
// inference (or an earlier propagation) says of the output.
void finish(const Model& model, NormalisedNode& n, const std::map<std::string, ref::Value>& earlier) {
  std::vector<ref::Value> values(n.inputs.size());
  std::vector<const ref::Value*> inputs;
  for (size_t i = 0; i < n.inputs.size(); ++i) {
    if (n.inputs[i].empty()) {
      inputs.push_back(nullptr);
      continue;
    }
    if (auto it = earlier.find(n.inputs[i]); it != earlier.end()) {
      inputs.push_back(&it->second);
      continue;
    }
    values[i] = static_value(model, n.inputs[i], "input '" + n.inputs[i] + "'");
    inputs.push_back(&values[i]);
  }
  ref::Op op;
  op.type = n.type;
  op.attrs = n.attrs;
  try {
    n.output_type = runtime::infer_output(op, inputs, n.type);
  } catch (const Error& e) {
    refuse(e.what());
  }
  std::string label = "output '" + n.output + "'";
  // What the runtime would refuse to hold is refused here, so it never fails at run time.
  for (size_t i = 0; i <= inputs.size(); ++i) {
    const ref::Value* v = i < inputs.size() ? inputs[i] : &n.output_type;
    if (v && v->byte_size() > ref::kMaxValueBytes)
      refuse((i < inputs.size() ? "input '" + n.inputs[i] + "'" : label) + " would hold " +
             std::to_string(v->byte_size()) + " bytes; ref holds at most 2^36 bytes (64 GiB) per tensor");
  }
  if (element_count(n.output_type.dims) == 0)
    refuse("zero-sized tensor on " + label + " (dims " + dims_text(n.output_type.dims) + ")");
  if (const ValueType* known = model.type_of(n.output)) {
    if (known->elem_type != 0 && known->elem_type != static_cast<int32_t>(n.output_type.dtype))
      refuse("element type " + dtype_name(known->elem_type) + " on " + label + " differs from " +
             ref::dtype_name(n.output_type.dtype) + " computed by ref");
    bool differs = known->dims && known->dims->size() != n.output_type.dims.size();
    for (size_t d = 0; known->dims && !differs && d < known->dims->size(); ++d)
      differs = (*known->dims)[d] >= 0 && (*known->dims)[d] != n.output_type.dims[d];
    if (differs)
      refuse("inferred dims " + dims_text(*known->dims) + " of " + label + " differ from " +
             dims_text(n.output_type.dims) + " computed by ref");
  }
}

// Output types from the runtime's rules, each part reading the values of the parts before it.
void finish_all(const Model& model, std::vector<NormalisedNode>& parts) {
  std::map<std::string, ref::Value> earlier;
  for (auto& n : parts) {
    finish(model, n, earlier);
    earlier[n.output] = n.output_type;
  }
}

// The parts of a node over half-precision values, which every op that does not take them computes
// in float32 between Casts (ONNX Runtime's CPU EP computes them the same way): each such input read
// through a Cast to float32, each such output written by a Cast from it. An output whose type is
// unknown takes that of the node's first such input.
std::vector<NormalisedNode> in_float32(const Model& model, const onnx::NodeProto& node, std::vector<NormalisedNode> parts) {
  const std::string& prefix = node.output(0);
  std::vector<NormalisedNode> out;
  std::map<std::string, std::string> widened;  // half input -> its float32 copy
  std::set<std::string> made;                  // by the parts so far
  int32_t half = 0;
  auto cast = [&](std::string from, std::string to, ref::DType type, bool internal) {
    NormalisedNode c;
    c.type = "Cast";
    c.attrs = {int_attr("to", static_cast<int64_t>(type))};
    c.inputs = {std::move(from)};
    c.output = std::move(to);
    c.internal = internal;
    c.computes_in_float = true;
    out.push_back(std::move(c));
  };
  for (auto& part : parts) {
    for (auto& input : part.inputs) {
      if (input.empty() || made.count(input) || !is_half(elem_type_of(model, input))) continue;
      half = half ? half : elem_type_of(model, input);
      auto [it, added] = widened.emplace(input, prefix + "/float32_" + std::to_string(widened.size()));
      if (added) cast(input, it->second, ref::DType::kFloat32, true);
      input = it->second;
    }
    made.insert(part.output);
    const int32_t declared = part.internal ? 0 : elem_type_of(model, part.output);
    const int32_t target = declared ? declared : half;
    if (part.internal || !is_half(target)) {
      out.push_back(std::move(part));
      continue;
    }
    std::string real = part.output;
    part.output = real + "/float32";
    part.internal = true;
    made.insert(part.output);
    out.push_back(std::move(part));
    cast(out.back().output, real, ref_dtype(target, "output '" + real + "'"), false);
  }
  return out;
}

}  // namespace

std::vector<NormalisedNode> normalise_all(const Model& model, const onnx::NodeProto& node) {
  if (!is_onnx_domain(node.domain()) && !(node.domain() == "com.microsoft" && kMicrosoftOps.count(node.op_type())))
    refuse("domain '" + node.domain() + "' is not supported");
  auto multi = multi_rules().find(node.op_type());
  auto single = rules().find(node.op_type());
  if (multi == multi_rules().end() && single == rules().end()) refuse("unsupported op");
  NodeView view(model, node);
  if (view.opset() < 1) refuse("the model imports no default-domain opset");
  if (view.opset() > kNewestRuleOpset)
    refuse("opset " + std::to_string(view.opset()) + ": ref knows the semantics of ops up to opset " + std::to_string(kNewestRuleOpset));
  auto apply = [&] {
    std::vector<NormalisedNode> parts;
    if (multi != multi_rules().end()) parts = multi->second(view);
    else parts.push_back(single->second(view));
    return parts;
  };
  // Parts may read values earlier parts of the same node write (an Einsum's transposed operands).
  try {
    auto parts = apply();
    finish_all(model, parts);
    return parts;
  } catch (const Refusal&) {
    bool narrow = false;
    for (const auto* names : {&node.input(), &node.output()})
      for (const auto& name : *names) narrow = narrow || (!name.empty() && is_half(elem_type_of(model, name)));
    if (!narrow) throw;
  }
  view.compute_in_float();
  auto parts = in_float32(model, node, apply());
  finish_all(model, parts);
  return parts;
}

NormalisedNode normalise(const Model& model, const onnx::NodeProto& node) {
  auto parts = normalise_all(model, node);
  if (parts.size() != 1) refuse(node.op_type() + " with " + std::to_string(parts.size()) + " outputs");
  return std::move(parts.front());
}

}  // namespace ctxgen::refc
