// The rule of each ref op: arity, element types, required attributes and the output type they
// imply (the normalised semantics of include/ctxgen/ref_program.h), and the table tying each op
// type to its rule and kernel.

#include "ops.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string_view>
#include <unordered_map>

namespace ctxgen::runtime {
namespace {

using ref::DType;

constexpr int64_t kIntMax = std::numeric_limits<int64_t>::max();
constexpr int64_t kIntMin = std::numeric_limits<int64_t>::min();
using ref::kMaxElements;  // also bounds kernel scratch buffers
using ref::kMaxWindow;

const std::vector<DType> kNumeric = {DType::kFloat32, DType::kInt32, DType::kInt64};
const std::vector<DType> kAny = {DType::kFloat32, DType::kUInt8, DType::kInt8,  DType::kUInt16, DType::kInt16,
                                 DType::kInt32,   DType::kInt64, DType::kBool,  DType::kFloat16, DType::kBFloat16};
const std::vector<DType> kQuantized = {DType::kUInt8, DType::kInt8, DType::kUInt16, DType::kInt16};

int64_t rank_of(const ref::Value& v) { return static_cast<int64_t>(v.dims.size()); }

// ---- elementwise -------------------------------------------------------------------------------

OutType unary(const OpCheck& c) {
  c.arity(1, 1);
  c.expect_inputs(DType::kFloat32);
  return {DType::kFloat32, c.in(0).dims};
}

OutType numeric_unary(const OpCheck& c) {
  c.arity(1, 1);
  return {c.expect_same_inputs(kNumeric), c.in(0).dims};
}

OutType logical_not(const OpCheck& c) {
  c.arity(1, 1);
  c.expect_inputs(DType::kBool);
  return {DType::kBool, c.in(0).dims};
}

OutType with_alpha(const OpCheck& c) {
  c.float_attr("alpha");
  return unary(c);
}

OutType with_alpha_beta(const OpCheck& c) {
  c.float_attr("alpha");
  c.float_attr("beta");
  return unary(c);
}

OutType shrink(const OpCheck& c) {
  c.float_attr("bias");
  c.float_attr("lambd");
  return unary(c);
}

OutType is_inf(const OpCheck& c) {
  c.arity(1, 1);
  c.expect_inputs(DType::kFloat32);
  c.int_attr("detect_positive", 0, 1);
  c.int_attr("detect_negative", 0, 1);
  return {DType::kBool, c.in(0).dims};
}

OutType is_nan(const OpCheck& c) {
  c.arity(1, 1);
  c.expect_inputs(DType::kFloat32);
  return {DType::kBool, c.in(0).dims};
}

OutType selu(const OpCheck& c) {
  c.float_attr("alpha");
  c.float_attr("gamma");
  return unary(c);
}

OutType clip(const OpCheck& c) {
  c.float_attr("min");
  c.float_attr("max");
  return unary(c);
}

Dims broadcast_inputs(const OpCheck& c) {
  Dims dims = c.in(0).dims;
  for (size_t i = 1; i < c.input_count(); ++i) {
    auto next = broadcast(dims, c.in(i).dims);
    c.expect(next.has_value(),
        [&] { return "input dims " + dims_text(dims) + " and " + dims_text(c.in(i).dims) + " do not broadcast"; });
    dims = *next;
  }
  return dims;
}

OutType arithmetic(const OpCheck& c) {
  c.arity(2, 2);
  DType t = c.expect_same_inputs(kNumeric);
  return {t, broadcast_inputs(c)};
}

// Integer remainder with the sign of the divisor (ONNX Mod with fmod=0).
OutType mod(const OpCheck& c) {
  c.arity(2, 2);
  DType t = c.expect_same_inputs({DType::kInt32, DType::kInt64});
  return {t, broadcast_inputs(c)};
}

OutType float_binary(const OpCheck& c) {
  c.arity(2, 2);
  c.expect_inputs(DType::kFloat32);
  return {DType::kFloat32, broadcast_inputs(c)};
}

OutType equal(const OpCheck& c) {
  c.arity(2, 2);
  c.expect_same_inputs(kAny);
  return {DType::kBool, broadcast_inputs(c)};
}

OutType compare(const OpCheck& c) {
  c.arity(2, 2);
  c.expect_same_inputs(kNumeric);
  return {DType::kBool, broadcast_inputs(c)};
}

OutType logical(const OpCheck& c) {
  c.arity(2, 2);
  c.expect_inputs(DType::kBool);
  return {DType::kBool, broadcast_inputs(c)};
}

OutType where(const OpCheck& c) {
  c.arity(3, 3);
  c.expect_dtype(c.in(0), DType::kBool, "input 0 (condition)");
  c.expect_dtype(c.in(2), c.in(1).dtype, "input 2");
  return {c.in(1).dtype, broadcast_inputs(c)};
}

OutType cast(const OpCheck& c) {
  c.arity(1, 1);
  return {c.dtype_attr("to"), c.in(0).dims};
}

// The epilogue of Conv, Gemm, MatMul, BatchNormalization and a float32 Add: `act` optional (none),
// its parameters required by the activations that read them.
void fused_activation(const OpCheck& c) {
  for (const char* name : {"out_scale", "out_shift", "out_lo", "out_hi"})
    if (c.op().attr(name)) c.float_attr(name);
  if (!c.op().attr("act")) return;
  auto act = static_cast<ref::Activation>(c.int_attr("act", 0, static_cast<int64_t>(ref::Activation::kHardSwish)));
  if (act == ref::Activation::kLeakyRelu || act == ref::Activation::kClip || act == ref::Activation::kHardSigmoid)
    c.float_attr("act_alpha");
  if (act == ref::Activation::kClip || act == ref::Activation::kHardSigmoid) c.float_attr("act_beta");
}

// Add, whose float32 result may run an epilogue (fused_activation) as a Conv's does.
OutType add(const OpCheck& c) {
  const OutType out = arithmetic(c);
  for (const char* name : {"act", "out_scale", "out_shift", "out_lo", "out_hi"})
    c.expect(!c.op().attr(name) || out.dtype == DType::kFloat32,
             [&] { return std::string("attribute '") + name + "' on an Add of " + ref::dtype_name(out.dtype); });
  fused_activation(c);
  return out;
}

// ---- constants ---------------------------------------------------------------------------------

// `value` is a float attribute for the float types, an int attribute for the others.
void scalar_attr(const OpCheck& c, DType t, const std::string& name) {
  if (ref::is_float(t)) c.float_attr(name);
  else c.int_attr(name, kIntMin, kIntMax);
}

OutType constant_of_shape(const OpCheck& c) {
  c.arity(0, 0);
  DType t = c.dtype_attr("dtype");
  scalar_attr(c, t, "value");
  return {t, c.bounded(c.ints_attr("shape"), "attribute 'shape'")};
}

OutType range(const OpCheck& c) {
  c.arity(0, 0);
  DType t = c.dtype_attr("dtype");
  // ONNX Runtime's Range takes these (and float64).
  c.expect(t == DType::kFloat32 || t == DType::kInt16 || t == DType::kInt32 || t == DType::kInt64,
           [&] { return "Range of " + ref::dtype_name(t); });
  scalar_attr(c, t, "start");
  scalar_attr(c, t, "delta");
  return {t, {c.int_attr("count", 0, kMaxElements)}};
}

// ---- quantization ------------------------------------------------------------------------------

// The scale (input 1, float32) and optional zero point (input 2, of `zero_point_type`) of a
// QuantizeLinear or DequantizeLinear over x: one value for the whole tensor; one per index of
// x's dim `axis` (dims [x.dims[axis]]); or, with `block_size` > 0, one per block of that many
// consecutive indices along `axis` (x's dims with that dim divided into blocks, rounded up).
// A zero point of `zero_point_type` has the scale's dims; a packed 4-bit one (`packed_zero_point`)
// is the uint8 bytes of that many 4-bit values.
void quant_params(const OpCheck& c, const ref::Value& x, DType zero_point_type, bool packed_zero_point = false) {
  c.expect_dtype(c.in(1), DType::kFloat32, "input 1 (scale)");
  const Dims& s = c.in(1).dims;
  const int64_t axis = c.int_attr("axis", 0, std::max<int64_t>(rank_of(x) - 1, 0));
  const int64_t block = c.int_attr("block_size", 0, kMaxElements);
  const bool per_tensor = block == 0 && s.size() <= 1 && product(s) == 1;
  if (block > 0) {
    c.expect(!x.dims.empty(), "block_size on a scalar");
    Dims blocked = x.dims;
    blocked[static_cast<size_t>(axis)] = (blocked[static_cast<size_t>(axis)] + block - 1) / block;
    c.expect_dims(c.in(1), blocked, "input 1 (scale)");
  } else {
    c.expect(per_tensor || (s.size() == 1 && !x.dims.empty() && s[0] == x.dims[static_cast<size_t>(axis)]), [&] {
      return "input 1 (scale) has dims " + dims_text(s) + ", expected one value or one per index of axis " +
             std::to_string(axis) + " of " + dims_text(x.dims);
    });
  }
  if (const ref::Value* zero_point = c.optional_in(2); zero_point && packed_zero_point) {
    c.expect_dtype(*zero_point, DType::kUInt8, "input 2 (zero point)");
    c.expect(zero_point->element_count() == (product(s) + 1) / 2, [&] {
      return "input 2 (zero point) has " + std::to_string(zero_point->element_count()) + " bytes, expected " +
             std::to_string((product(s) + 1) / 2) + " (4-bit values of the scale's dims " + dims_text(s) + ")";
    });
  } else if (zero_point) {
    c.expect_dtype(*zero_point, zero_point_type, "input 2 (zero point)");
    // One value may be a scalar beside a scale of dims [1], or the reverse, as ONNX Runtime takes.
    if (!per_tensor || zero_point->dims.size() > 1 || product(zero_point->dims) != 1)
      c.expect_dims(*zero_point, s, "input 2 (zero point)");
  }
}

// y = saturate(round_half_even(x / scale) + zero_point), of the integer type `dtype`.
OutType quantize_linear(const OpCheck& c) {
  c.arity(2, 3);
  c.expect_dtype(c.in(0), DType::kFloat32, "input 0");
  const DType t = c.dtype_attr("dtype");
  c.expect(std::find(kQuantized.begin(), kQuantized.end(), t) != kQuantized.end(),
           [&] { return "attribute 'dtype' is " + ref::dtype_name(t) + ", expected an 8- or 16-bit integer type"; });
  quant_params(c, c.in(0), t);
  return {t, c.in(0).dims};
}

// A DequantizeLinear of 8-bit x with one scale and zero point (attributes), then a QuantizeLinear
// of the result to `dtype` (8-bit) with one scale and zero point: y = saturate(round_half_even(
// ((x - x_zero_point) * x_scale) / y_scale) + y_zero_point), in float32 as the two ops compute.
OutType requantize(const OpCheck& c) {
  c.arity(1, 1);
  const DType from = c.in(0).dtype, t = c.dtype_attr("dtype");
  const auto is_8bit = [](DType d) { return d == DType::kUInt8 || d == DType::kInt8; };
  c.expect(is_8bit(from), [&] { return "input 0 is " + ref::dtype_name(from) + ", expected uint8 or int8"; });
  c.expect(is_8bit(t), [&] { return "attribute 'dtype' is " + ref::dtype_name(t) + ", expected uint8 or int8"; });
  c.float_attr("x_scale");
  c.float_attr("y_scale");
  const auto lowest = [](DType d) { return d == DType::kInt8 ? -128 : 0; };
  c.int_attr("x_zero_point", lowest(from), lowest(from) + 255);
  c.int_attr("y_zero_point", lowest(t), lowest(t) + 255);
  return {t, c.in(0).dims};
}

// y = (x - zero_point) * scale, in float32. With `bits` 4, x is a weight of 4-bit integers (int4
// when `signed`, else uint4) of dims `dims`, two a byte, the first in the low bits, as ONNX stores
// them: uint8 [(n + 1) / 2]; its zero point is packed alike.
OutType dequantize_linear(const OpCheck& c) {
  c.arity(2, 3);
  const int64_t bits = c.int_attr_or("bits", 8, 4, 8);
  c.expect(bits == 4 || bits == 8, [&] { return "bits " + std::to_string(bits) + ", expected 4 or 8"; });
  if (bits == 4) {
    c.int_attr("signed", 0, 1);
    ref::Value x;
    x.dims = c.bounded(c.ints_attr("dims"), "attribute 'dims'");
    c.expect_dtype(c.in(0), DType::kUInt8, "input 0");
    c.expect(c.in(0).element_count() == (product(x.dims) + 1) / 2, [&] {
      return "input 0 has " + std::to_string(c.in(0).element_count()) + " bytes, expected " +
             std::to_string((product(x.dims) + 1) / 2) + " (4-bit values of dims " + dims_text(x.dims) + ")";
    });
    quant_params(c, x, DType::kUInt8, true);
    return {DType::kFloat32, x.dims};
  }
  const DType t = c.in(0).dtype;
  c.expect(t == DType::kInt32 || std::find(kQuantized.begin(), kQuantized.end(), t) != kQuantized.end(),
           [&] { return "input 0 has element type " + ref::dtype_name(t) + ", expected an 8-, 16- or 32-bit integer type"; });
  quant_params(c, c.in(0), t);
  return {DType::kFloat32, c.in(0).dims};
}

// com.microsoft MatMulNBits: Y [..., N] = A [..., K] x dequantize(B)^T (+ bias [N]). B [N, blocks,
// block_size * bits / 8] holds each of the N columns' K values `bits` at a time, low bits first, in
// blocks of block_size along K; each block has a scale (N x blocks float32) and a zero point (uint8,
// `bits` at a time, a row of blocks per column; 2^(bits - 1) when absent).
OutType matmul_nbits(const OpCheck& c) {
  c.arity(3, 5);
  c.expect_dtype(c.in(0), DType::kFloat32, "input 0 (A)");
  const int64_t k = c.int_attr("K", 1, kMaxElements), n = c.int_attr("N", 1, kMaxElements);
  const int64_t bits = c.int_attr("bits", 4, 8);
  c.expect(bits == 4 || bits == 8, [&] { return "bits " + std::to_string(bits) + ", expected 4 or 8"; });
  const int64_t block = c.int_attr("block_size", 16, 256);  // what ONNX Runtime's quantizer writes
  c.expect((block & (block - 1)) == 0, [&] { return "block_size " + std::to_string(block) + " is not a power of two"; });
  const int64_t blocks = (k + block - 1) / block;
  const Dims& a = c.in(0).dims;
  c.expect(!a.empty() && a.back() == k, [&] { return "input 0 (A) has dims " + dims_text(a) + ", expected K = " + std::to_string(k) + " last"; });
  c.expect_dtype(c.in(1), DType::kUInt8, "input 1 (B)");
  c.expect_dims(c.in(1), {n, blocks, block * bits / 8}, "input 1 (B)");
  c.expect_dtype(c.in(2), DType::kFloat32, "input 2 (scales)");
  c.expect(product(c.in(2).dims) == n * blocks,
           [&] { return "input 2 (scales) has dims " + dims_text(c.in(2).dims) + ", expected N x blocks = " + std::to_string(n * blocks) + " values"; });
  if (const ref::Value* zero_points = c.optional_in(3)) {
    c.expect_dtype(*zero_points, DType::kUInt8, "input 3 (zero points)");
    c.expect(product(zero_points->dims) == n * ((blocks * bits + 7) / 8), [&] {
      return "input 3 (zero points) has dims " + dims_text(zero_points->dims) + ", expected " +
             std::to_string(n * ((blocks * bits + 7) / 8)) + " bytes";
    });
  }
  if (const ref::Value* bias = c.optional_in(4)) {
    c.expect_dtype(*bias, DType::kFloat32, "input 4 (bias)");
    c.expect_dims(*bias, {n}, "input 4 (bias)");
  }
  Dims y = a;
  y.back() = n;
  return {DType::kFloat32, c.bounded(y, "output")};
}

// com.microsoft GatherBlockQuantized: Gather along `gather_axis` of a weight of dims `dims` quantized
// `bits` at a time in blocks of `block_size` along `quantize_axis`, each gathered value dequantized:
// (q - zero_point) * scale, of the scales' type. The weight is uint8, `bits` a value, low bits first
// (4-bit values sign-extended when `signed`); scales have its dims with the quantize axis divided
// into blocks; the zero points (uint8, `zero_point` when absent) are packed alike in rows of
// `zero_point_row` values, each row starting a byte.
OutType gather_block_quantized(const OpCheck& c) {
  c.arity(3, 4);
  const Dims dims = c.bounded(c.ints_attr("dims"), "attribute 'dims'");
  c.expect(!dims.empty(), "attribute 'dims' is empty: a scalar has nothing to gather");
  const int64_t rank = static_cast<int64_t>(dims.size());
  const auto gather_axis = static_cast<size_t>(c.int_attr("gather_axis", 0, rank - 1));
  const auto quantize_axis = static_cast<size_t>(c.int_attr("quantize_axis", 0, rank - 1));
  const int64_t block = c.int_attr("block_size", 16, kMaxWindow);
  c.expect((block & (block - 1)) == 0, [&] { return "block_size " + std::to_string(block) + " is not a power of two"; });
  const int64_t bits = c.int_attr("bits", 4, 8);
  c.expect(bits == 4 || bits == 8, [&] { return "bits " + std::to_string(bits) + ", expected 4 or 8"; });
  c.int_attr("signed", 0, bits == 4 ? 1 : 0);
  c.int_attr("zero_point", bits == 4 ? -8 : 0, bits == 4 ? 15 : 255);
  c.expect_dtype(c.in(0), DType::kUInt8, "input 0 (data)");
  const int64_t bytes = (product(dims) * bits + 7) / 8;
  c.expect(c.in(0).element_count() == bytes, [&] {
    return "input 0 (data) has " + std::to_string(c.in(0).element_count()) + " bytes, expected " + std::to_string(bytes) +
           " (" + std::to_string(bits) + "-bit values of dims " + dims_text(dims) + ")";
  });
  c.expect(c.in(1).dtype == DType::kInt64 || c.in(1).dtype == DType::kInt32,
           [&] { return "input 1 (indices) has element type " + ref::dtype_name(c.in(1).dtype) + ", expected int64 or int32"; });
  const DType t = c.in(2).dtype;
  c.expect(t == DType::kFloat32 || t == DType::kFloat16,
           [&] { return "input 2 (scales) has element type " + ref::dtype_name(t) + ", expected float32 or float16"; });
  Dims scales = dims;
  scales[quantize_axis] = (scales[quantize_axis] + block - 1) / block;
  c.expect_dims(c.in(2), scales, "input 2 (scales)");
  if (const ref::Value* zero_points = c.optional_in(3)) {
    c.expect_dtype(*zero_points, DType::kUInt8, "input 3 (zero points)");
    const int64_t row = c.int_attr("zero_point_row", 1, std::max<int64_t>(product(scales), 1));
    c.expect(product(scales) % row == 0, [&] {
      return "zero_point_row " + std::to_string(row) + " does not divide the " + std::to_string(product(scales)) + " scales";
    });
    const int64_t want = product(scales) / row * ((row * bits + 7) / 8);
    c.expect(zero_points->element_count() == want, [&] {
      return "input 3 (zero points) has " + std::to_string(zero_points->element_count()) + " bytes, expected " + std::to_string(want);
    });
  }
  Dims out(dims.begin(), dims.begin() + static_cast<int64_t>(gather_axis));
  out.insert(out.end(), c.in(1).dims.begin(), c.in(1).dims.end());
  out.insert(out.end(), dims.begin() + static_cast<int64_t>(gather_axis) + 1, dims.end());
  return {t, c.bounded(out, "output")};
}

// ---- linear algebra ----------------------------------------------------------------------------

// `panels` (0 or 1) of MatMul and Gemm: B [N, K] laid out in panels of 32 columns (PanelWeight),
// which the kernel reads with A as it is.
void product_panels(const OpCheck& c, bool trans_b, bool trans_a) {
  if (c.int_attr_or("panels", 0, 0, 1) == 0) return;
  const Dims& b = c.in(1).dims;
  c.expect(trans_b && !trans_a && b.size() == 2, [&] {
    return "panels with B of dims " + dims_text(b) + ", expected a 2-D B stored [N, K] (transB, not transA)";
  });
}

// Numpy matmul: a 1-D A is a row [1, K], a 1-D B a column [K, 1], and the added dim is not in the
// output. Those views share their bytes with the vectors, so the kernel needs no copy.
OutType matmul(const OpCheck& c) {
  c.arity(2, 2);
  c.expect_inputs(DType::kFloat32);
  const Dims& a = c.in(0).dims;
  const Dims& b = c.in(1).dims;
  c.expect(!a.empty() && !b.empty(),
      [&] { return "inputs have dims " + dims_text(a) + " and " + dims_text(b) + ", expected rank >= 1 each"; });
  // transB: B stored with its last two dims swapped ([..., N, K]), as the compiler packs a constant
  // B or folds a Transpose into it.
  const bool trans_b = c.int_attr_or("transB", 0, 0, 1) != 0;
  c.expect(!trans_b || b.size() >= 2,
      [&] { return "transB with B of dims " + dims_text(b) + ", which has no two dims to swap"; });
  product_panels(c, trans_b, false);
  Dims a2 = a.size() == 1 ? Dims{1, a[0]} : a, b2 = b.size() == 1 ? Dims{b[0], 1} : b;
  if (trans_b) std::swap(b2[b2.size() - 2], b2.back());
  c.expect(a2.back() == b2[b2.size() - 2], [&] { return "inner dims differ: " + dims_text(a) + " x " + dims_text(b); });
  auto out = broadcast({a2.begin(), a2.end() - 2}, {b2.begin(), b2.end() - 2});
  c.expect(out.has_value(),
      [&] { return "batch dims of " + dims_text(a) + " and " + dims_text(b) + " do not broadcast"; });
  if (a.size() > 1) out->push_back(a2[a2.size() - 2]);
  if (b.size() > 1) out->push_back(b2.back());
  fused_activation(c);
  return {DType::kFloat32, *out};
}

OutType gemm(const OpCheck& c) {
  c.arity(2, 3);
  c.expect_inputs(DType::kFloat32);
  bool trans_a = c.int_attr("transA", 0, 1) != 0, trans_b = c.int_attr("transB", 0, 1) != 0;
  c.float_attr("alpha");
  c.float_attr("beta");
  const Dims& a = c.in(0).dims;
  const Dims& b = c.in(1).dims;
  c.expect(a.size() == 2 && b.size() == 2,
      [&] { return "A " + dims_text(a) + " and B " + dims_text(b) + " must be 2-D"; });
  product_panels(c, trans_b, trans_a);
  int64_t m = trans_a ? a[1] : a[0], k = trans_a ? a[0] : a[1];
  int64_t kb = trans_b ? b[1] : b[0], n = trans_b ? b[0] : b[1];
  c.expect(k == kb, [&] { return "inner dims differ: A " + dims_text(a) + ", B " + dims_text(b); });
  const Dims mn = {m, n};
  if (const ref::Value* cv = c.optional_in(2))
    c.expect(cv->dims.size() <= 2 && broadcast(cv->dims, mn) == mn,
             [&] { return "C dims " + dims_text(cv->dims) + " do not broadcast to " + dims_text(mn); });
  fused_activation(c);
  return {DType::kFloat32, mn};
}

// ---- sliding windows ---------------------------------------------------------------------------

struct Window {
  Dims kernel, strides, pads, dilations;
};

// The window attributes of an N-D op over `x`, each checked for count and range.
Window window(const OpCheck& c, const ref::Value& x, bool has_dilations) {
  c.expect(x.dims.size() >= 3, [&] { return "input 0 has dims " + dims_text(x.dims) + ", expected N x C x D1 ..."; });
  size_t n = x.dims.size() - 2;
  Window w;
  w.kernel = c.ints_attr("kernel_shape", n, 1, kMaxWindow);
  w.strides = c.ints_attr("strides", n, 1, kMaxWindow);
  w.pads = c.ints_attr("pads", 2 * n, 0, kMaxWindow);
  w.dilations = has_dilations ? c.ints_attr("dilations", n, 1, kMaxWindow) : Dims(n, 1);
  return w;
}

// Output size of spatial axis `a`, floor or ceil mode. In ceil mode a last window that would start
// in the end padding is dropped, as ONNX Runtime does.
int64_t window_output(const OpCheck& c, const ref::Value& x, const Window& w, size_t a, bool ceil) {
  size_t n = w.kernel.size();
  int64_t in = x.dims[a + 2];
  int64_t span = (w.kernel[a] - 1) * w.dilations[a] + 1;
  int64_t room = in + w.pads[a] + w.pads[a + n] - span;
  c.expect(room >= 0, [&] { return "window " + dims_text(w.kernel) + " on axis " + std::to_string(a + 2) +
                          " is larger than the padded input " + dims_text(x.dims); });
  if (!ceil) return room / w.strides[a] + 1;
  int64_t out = (room + w.strides[a] - 1) / w.strides[a] + 1;
  if ((out - 1) * w.strides[a] >= in + w.pads[a]) --out;
  return out;
}

// The image [N, C, H, W] a channels-last image [N, 1, H, W, C] holds (a ref program's one layout
// besides row-major); checks the tensor is one.
ref::Value channels_first(const OpCheck& c, const ref::Value& v, const std::string& what) {
  const Dims& d = v.dims;
  c.expect(d.size() == 5 && d[1] == 1,
           [&] { return what + " has dims " + dims_text(d) + ", expected [N, 1, H, W, C] (channels last)"; });
  ref::Value image = v;
  image.dims = {d[0], d[4], d[2], d[3]};
  return image;
}

// A packed weight's recorded layout (weight_layout: the padded dims, their strides, then inner
// blocks as (dim, size); kernels_conv.cc reads it) must be a blocked layout of the weight's dims
// as oneDNN counts them whose every element lies inside the weight: oneDNN reads wherever it
// points.
int64_t packed_layout_span(const OpCheck& c, const Dims& dims) {
  const Dims layout = c.ints_attr("weight_layout");
  const size_t rank = dims.size();
  constexpr size_t kMaxBlocks = 12;  // oneDNN's DNNL_MAX_NDIMS
  c.expect(layout.size() >= 2 * rank && layout.size() % 2 == 0 && (layout.size() - 2 * rank) / 2 <= kMaxBlocks, [&] {
    return "attribute 'weight_layout' has " + std::to_string(layout.size()) + " values, expected " +
           std::to_string(2 * rank) + " (padded dims and strides of " + dims_text(dims) + ") and up to " +
           std::to_string(kMaxBlocks) + " (dim, size) blocks";
  });
  const auto bad = [&layout](const char* why) {
    return [&layout, why] { return "attribute 'weight_layout' " + dims_text(layout) + ": " + why; };
  };
  // oneDNN indexes within the inner blocks in 32-bit arithmetic; its own blocks hold at most 256
  // elements (16 x 16), so 2^16 leaves room without coming near that.
  constexpr int64_t kMaxInner = int64_t{1} << 16;
  Dims block(rank, 1);
  int64_t inner = 1;
  for (size_t b = 2 * rank; b < layout.size(); b += 2) {
    const int64_t dim = layout[b], size = layout[b + 1];
    c.expect(dim >= 0 && dim < static_cast<int64_t>(rank) && size >= 1 && size <= kMaxInner, bad("a block is outside the dims"));
    block[static_cast<size_t>(dim)] *= size;
    inner *= size;
    c.expect(inner <= kMaxInner, bad("its inner blocks hold more than 2^16 elements"));
  }
  int64_t last = inner - 1;  // the offset of the last element
  for (size_t i = 0; i < rank; ++i) {
    const int64_t padded = layout[i], stride = layout[rank + i];
    c.expect(padded >= dims[i] && padded <= kMaxElements && padded % block[i] == 0 && stride >= 0 && stride <= kMaxElements,
             [&] {
               return "attribute 'weight_layout' " + dims_text(layout) + ": dim " + std::to_string(i) +
                      " is not a padding of " + dims_text(dims) + " into whole blocks";
             });
    int64_t reach = 0;
    c.expect(!__builtin_mul_overflow(padded / block[i] - 1, stride, &reach) && !__builtin_add_overflow(last, reach, &last),
             bad("its offsets overflow"));
  }
  return last + 1;
}

// A packed weight (Conv, ConvTranspose) is 1-D in the layout oneDNN chose, recorded with it; its
// logical dims are an attribute (weight_shape). oneDNN convolves 1 to 3 spatial dims.
Dims weight_dims(const OpCheck& c, const ref::Value& x, bool packed) {
  if (!packed) return c.in(1).dims;
  c.expect(c.in(1).dims.size() == 1, [&] { return "packed weight dims " + dims_text(c.in(1).dims) + " are not 1-D"; });
  c.expect(x.dims.size() >= 3 && x.dims.size() <= 5,
           [&] { return "a packed convolution over " + std::to_string(x.dims.size() - 2) + " spatial dims"; });
  return c.ints_attr("weight_shape", x.dims.size(), 1, kMaxElements);
}

// The recorded layout of a packed weight of these dims (oneDNN's) lies within the weight.
void expect_packed_layout(const OpCheck& c, const Dims& dims) {
  const int64_t span = packed_layout_span(c, dims);
  c.expect(span <= c.in(1).dims[0], [&] {
    return "attribute 'weight_layout' reaches element " + std::to_string(span - 1) + " of a packed weight of " +
           std::to_string(c.in(1).dims[0]);
  });
}

OutType conv(const OpCheck& c) {
  c.arity(2, 3);
  c.expect_inputs(DType::kFloat32);
  // A packed 2-D convolution may compute channels last (`channels_last`) and then read and write
  // channels-last images (`src_channels_last`, `dst_channels_last`), so that no reorder runs
  // between such ops.
  const bool packed = c.int_attr_or("packed", 0, 0, 1) != 0;
  const bool last = c.int_attr_or("channels_last", 0, 0, 1) != 0;
  const bool src_last = c.int_attr_or("src_channels_last", 0, 0, 1) != 0;
  const bool dst_last = c.int_attr_or("dst_channels_last", 0, 0, 1) != 0;
  c.expect(!last || packed, "channels_last on a convolution whose weight is not packed");
  c.expect(last || (!src_last && !dst_last), "channels-last images on a convolution that does not compute channels last");
  const ref::Value x = src_last ? channels_first(c, c.in(0), "input 0") : c.in(0);
  c.expect(!last || x.dims.size() == 4, "channels_last on a convolution that is not 2-D");
  Window w = window(c, x, true);
  int64_t group = c.int_attr("group", 1, kIntMax);
  const Dims wd = weight_dims(c, x, packed);
  c.expect(wd.size() == x.dims.size(), [&] { return "weight dims " + dims_text(wd) + " do not match input rank " +
                                           std::to_string(x.dims.size()); });
  c.expect(Dims(wd.begin() + 2, wd.end()) == w.kernel,
           [&] { return "attribute 'kernel_shape' " + dims_text(w.kernel) + " differs from weight dims " + dims_text(wd); });
  c.expect(x.dims[1] / group == wd[1] && x.dims[1] % group == 0 && wd[0] % group == 0,
           [&] { return "group " + std::to_string(group) + " does not fit input " + dims_text(x.dims) + " and weight " + dims_text(wd); });
  if (const ref::Value* bias = c.optional_in(2)) c.expect_dims(*bias, {wd[0]}, "bias");
  if (packed) expect_packed_layout(c, onednn_weight_dims(wd, group, false));
  Dims out = {x.dims[0], wd[0]};
  for (size_t a = 0; a < w.kernel.size(); ++a) out.push_back(window_output(c, x, w, a, false));
  // The kernel's im2col scratch holds (C/group x kernel) x output-positions floats.
  int64_t scratch = 0;
  c.expect(!__builtin_mul_overflow(product(wd, 1, wd.size()), product(out, 2, out.size()), &scratch) &&
               scratch <= kMaxElements,
           [&] { return "im2col of weight " + dims_text(wd) + " over output " + dims_text(out) + " needs more than 2^48 elements"; });
  fused_activation(c);
  if (dst_last) out = {out[0], 1, out[2], out[3], out[1]};
  return {DType::kFloat32, out};
}

// PanelWeight: B [K, N] (or [N, K] with transB) as [N, K] in panels of 32 columns.
OutType panel_weight(const OpCheck& c) {
  c.arity(1, 1);
  c.expect_inputs(DType::kFloat32);
  const Dims& b = c.in(0).dims;
  c.expect(b.size() == 2, [&] { return "B has dims " + dims_text(b) + ", expected 2-D"; });
  return {DType::kFloat32, c.int_attr_or("transB", 0, 0, 1) != 0 ? b : Dims{b[1], b[0]}};
}

// A plain Conv (`transposed`: ConvTranspose) weight computed from weights (widened from float16,
// dequantized) is laid out for its packed op once a session, as the compiler lays out a float32
// weight in the .bin.
OutType conv_weight(const OpCheck& c) {
  c.arity(1, 1);
  c.expect_inputs(DType::kFloat32);
  const Dims& wd = c.in(0).dims;
  c.expect(wd.size() >= 3 && wd.size() <= 5, [&] { return "weight dims " + dims_text(wd) + " are not those of a 1-3-D Conv"; });
  c.expect(c.ints_attr("weight_shape", wd.size(), 1, kMaxElements) == wd,
           [&] { return "attribute 'weight_shape' differs from weight dims " + dims_text(wd); });
  const int64_t group = c.int_attr("group", 1, kIntMax);
  const bool transposed = c.int_attr_or("transposed", 0, 0, 1) != 0;
  c.expect(wd[0] % group == 0, [&] { return "group " + std::to_string(group) + " does not divide " + std::to_string(wd[0]); });
  return {DType::kFloat32, {packed_layout_span(c, onednn_weight_dims(wd, group, transposed))}};
}

// ---- integer products ----------------------------------------------------------------------------

// Inputs 0 and 1 of an integer product are uint8 or int8.
void expect_8bit(const OpCheck& c) {
  for (size_t i = 0; i < 2; ++i) {
    const DType t = c.in(i).dtype;
    c.expect(t == DType::kUInt8 || t == DType::kInt8,
             [&] { return "input " + std::to_string(i) + " has element type " + ref::dtype_name(t) + ", expected uint8 or int8"; });
  }
}

// The zero point of input `i` (its own type, as input `of`): one value, or `count` values.
void integer_zero_point(const OpCheck& c, size_t i, size_t of, int64_t count) {
  const ref::Value* zero_point = c.optional_in(i);
  if (!zero_point) return;
  c.expect_dtype(*zero_point, c.in(of).dtype, "input " + std::to_string(i) + " (zero point)");
  const int64_t n = product(zero_point->dims);
  c.expect(zero_point->dims.size() <= 1 && (n == 1 || n == count), [&] {
    return "input " + std::to_string(i) + " (zero point) has dims " + dims_text(zero_point->dims) + ", expected one value or " +
           std::to_string(count);
  });
}

// MatMulInteger: Y int32 [..., M, N] = (A - a_zero_point) x (B - b_zero_point), exactly (wrapping
// as int32 does). A [..., M, K] and B [K, N], or B with A's dims but the last two; 8-bit integers;
// a_zero_point one value or one per row, b_zero_point one value or one per column.
OutType matmul_integer(const OpCheck& c) {
  c.arity(2, 4);
  const Dims& a = c.in(0).dims;
  const Dims& b = c.in(1).dims;
  expect_8bit(c);
  c.expect(a.size() >= 2 && (b.size() == 2 || (b.size() == a.size() && std::equal(a.begin(), a.end() - 2, b.begin()))),
           [&] { return "inputs have dims " + dims_text(a) + " and " + dims_text(b) + ", expected [..., M, K] and [K, N] or [..., K, N]"; });
  c.expect(a.back() == b[b.size() - 2], [&] { return "inner dims differ: " + dims_text(a) + " x " + dims_text(b); });
  integer_zero_point(c, 2, 0, a[a.size() - 2]);
  integer_zero_point(c, 3, 1, b.back());
  Dims y = a;
  y.back() = b.back();
  return {DType::kInt32, y};
}

// ConvInteger: Y int32 = Conv(x - x_zero_point, w - w_zero_point), exactly, the padding holding
// x_zero_point (so it adds nothing); w_zero_point one value or one per output channel.
OutType conv_integer(const OpCheck& c) {
  c.arity(2, 4);
  const ref::Value& x = c.in(0);
  const Dims& wd = c.in(1).dims;
  expect_8bit(c);
  Window w = window(c, x, true);
  const int64_t group = c.int_attr("group", 1, kIntMax);
  c.expect(wd.size() == x.dims.size() && Dims(wd.begin() + 2, wd.end()) == w.kernel,
           [&] { return "weight dims " + dims_text(wd) + " do not fit input " + dims_text(x.dims) + " and kernel " + dims_text(w.kernel); });
  c.expect(x.dims[1] / group == wd[1] && x.dims[1] % group == 0 && wd[0] % group == 0,
           [&] { return "group " + std::to_string(group) + " does not fit input " + dims_text(x.dims) + " and weight " + dims_text(wd); });
  integer_zero_point(c, 2, 0, 1);
  integer_zero_point(c, 3, 1, wd[0]);
  Dims out = {x.dims[0], wd[0]};
  for (size_t a = 0; a < w.kernel.size(); ++a) out.push_back(window_output(c, x, w, a, false));
  int64_t scratch = 0;
  c.expect(!__builtin_mul_overflow(product(wd, 1, wd.size()), product(out, 2, out.size()), &scratch) && scratch <= kMaxElements,
           [&] { return "im2col of weight " + dims_text(wd) + " over output " + dims_text(out) + " needs more than 2^48 elements"; });
  return {DType::kInt32, out};
}

// QLinearConv, ONNX Runtime's fused form of an 8-bit Conv unit: y = saturate(round_half_even(
// (sum (x - x_zero_point) w + bias) * scales[m]) + y_zero_point), sums in int32. x uint8
// [N, C, H, W] (ONNX Runtime on x86 fuses only uint8 images into uint8 outputs); w an int8 weight of the binary (its layout for oneDNN is made once per run state,
// so a value computed at run time would be read stale); bias int32 [M]; `scales` one or M floats
// (x_scale * w_scale[m] / y_scale); output of `dtype` (uint8), Conv's dims.
OutType qlinear_conv(const OpCheck& c) {
  c.arity(2, 3);
  const ref::Value& x = c.in(0);
  c.expect_dtype(x, DType::kUInt8, "input 0");
  c.expect_dtype(c.in(1), DType::kInt8, "input 1 (the weight)");
  c.expect(c.in(1).kind == ref::ValueKind::kWeight, "input 1 (the weight) is not a weight of the binary");
  c.expect(x.dims.size() == 4, [&] { return "input 0 has dims " + dims_text(x.dims) + ", expected N x C x H x W"; });
  Window w = window(c, x, true);
  const Dims& wd = c.in(1).dims;
  const int64_t group = c.int_attr("group", 1, kIntMax);
  c.expect(wd.size() == 4 && Dims(wd.begin() + 2, wd.end()) == w.kernel,
           [&] { return "weight dims " + dims_text(wd) + " do not fit kernel " + dims_text(w.kernel); });
  c.expect(x.dims[1] / group == wd[1] && x.dims[1] % group == 0 && wd[0] % group == 0,
           [&] { return "group " + std::to_string(group) + " does not fit input " + dims_text(x.dims) + " and weight " + dims_text(wd); });
  if (const ref::Value* bias = c.optional_in(2)) {
    c.expect_dtype(*bias, DType::kInt32, "input 2 (bias)");
    c.expect_dims(*bias, {wd[0]}, "input 2 (bias)");
  }
  const ref::Attr* scales = c.op().attr("scales");
  c.expect(scales && scales->kind == ref::Attr::Kind::kFloats &&
               (scales->floats.size() == 1 || static_cast<int64_t>(scales->floats.size()) == wd[0]),
           "attribute 'scales' (floats) must hold one scale or one per output channel");
  for (float f : scales->floats) c.expect(f > 0 && std::isfinite(f), "attribute 'scales' holds a value that is not positive");
  const DType t = c.dtype_attr("dtype");
  c.expect(t == DType::kUInt8, [&] { return "attribute 'dtype' is " + ref::dtype_name(t) + ", expected uint8"; });
  c.int_attr("x_zero_point", 0, 255);
  c.int_attr("y_zero_point", 0, 255);
  Dims out = {x.dims[0], wd[0]};
  for (size_t a = 0; a < w.kernel.size(); ++a) out.push_back(window_output(c, x, w, a, false));
  return {t, out};
}

// DynamicQuantizeLinear: x to uint8 with a scale and zero point from its range (widened to hold 0):
// `output` 0 the values, 1 the scale (float32 scalar), 2 the zero point (uint8 scalar).
OutType dynamic_quantize_linear(const OpCheck& c) {
  c.arity(1, 1);
  c.expect_dtype(c.in(0), DType::kFloat32, "input 0");
  const int64_t output = c.int_attr("output", 0, 2);
  if (output == 0) return {DType::kUInt8, c.in(0).dims};
  return {output == 1 ? DType::kFloat32 : DType::kUInt8, {}};
}

OutType pool(const OpCheck& c, bool is_max) {
  c.arity(1, 1);
  // A maximum of quantized values is the quantized maximum: MaxPool runs on them as they are.
  const DType type = is_max ? c.expect_same_inputs({DType::kFloat32, DType::kUInt8, DType::kInt8, DType::kUInt16, DType::kInt16})
                            : (c.expect_inputs(DType::kFloat32), DType::kFloat32);
  const ref::Value& x = c.in(0);
  Window w = window(c, x, is_max);
  if (!is_max) c.int_attr("count_include_pad", 0, 1);
  bool ceil = c.int_attr_or("ceil_mode", 0, 0, 1) != 0;
  Dims out = {x.dims[0], x.dims[1]};
  for (size_t a = 0; a < w.kernel.size(); ++a) out.push_back(window_output(c, x, w, a, ceil));
  return {type, out};
}

OutType max_pool(const OpCheck& c) { return pool(c, true); }
OutType average_pool(const OpCheck& c) { return pool(c, false); }

// ---- normalisation and reductions --------------------------------------------------------------

OutType softmax(const OpCheck& c) {
  OutType out = unary(c);
  c.expect(!c.in(0).dims.empty(), "input is a scalar");
  c.int_attr("axis", 0, rank_of(c.in(0)) - 1);
  c.int_attr("coerce_2d", 0, 1);
  return out;
}

OutType batch_normalization(const OpCheck& c) {
  c.arity(5, 5);
  c.expect_inputs(DType::kFloat32);
  const Dims& x = c.in(0).dims;
  c.expect(x.size() >= 2, [&] { return "input 0 has dims " + dims_text(x) + ", expected N x C x ..."; });
  const bool last = c.int_attr_or("channels_last", 0, 0, 1) == 1;
  for (size_t i = 1; i <= 4; ++i) c.expect_dims(c.in(i), {last ? x.back() : x[1]}, "input " + std::to_string(i));
  c.float_attr("epsilon");
  fused_activation(c);
  return {DType::kFloat32, x};
}

OutType layer_normalization(const OpCheck& c) {
  c.arity(2, 3);
  c.expect_inputs(DType::kFloat32);
  const Dims& x = c.in(0).dims;
  c.expect(!x.empty(), "input 0 is a scalar");
  auto axis = static_cast<size_t>(c.int_attr("axis", 0, rank_of(c.in(0)) - 1));
  c.float_attr("epsilon");
  int64_t block = product(x, axis, x.size());
  for (size_t i = 1; i <= 2; ++i)
    if (const ref::Value* p = c.optional_in(i))
      c.expect(p->element_count() == block, [&] { return "input " + std::to_string(i) + " dims " + dims_text(p->dims) +
                                                " do not cover the normalised dims " +
                                                dims_text(Dims(x.begin() + static_cast<int64_t>(axis), x.end())); });
  // `output` 0 is Y; 1 and 2 the Mean and InvStdDev of each block, with the normalised dims as 1.
  if (c.int_attr_or("output", 0, 0, 2) == 0) return {DType::kFloat32, x};
  Dims stats = x;
  std::fill(stats.begin() + static_cast<int64_t>(axis), stats.end(), 1);
  return {DType::kFloat32, stats};
}

// NegativeLogLikelihoodLoss: input [N, C, d...], target [N, d...] (int32/int64), optional weight
// [C]; `reduction` 0 none, 1 sum, 2 mean; `ignore_index` when `has_ignore_index`.
OutType nll_loss(const OpCheck& c) {
  c.arity(2, 3);
  const Dims& x = c.in(0).dims;
  const Dims& t = c.in(1).dims;
  c.expect_dtype(c.in(0), DType::kFloat32, "input 0");
  c.expect(c.in(1).dtype == DType::kInt64 || c.in(1).dtype == DType::kInt32,
           [&] { return "input 1 (target) has element type " + ref::dtype_name(c.in(1).dtype) + ", expected int64 or int32"; });
  c.expect(x.size() >= 2, [&] { return "input 0 has dims " + dims_text(x) + ", expected N x C x ..."; });
  Dims want = x;
  want.erase(want.begin() + 1);
  c.expect_dims(c.in(1), want, "input 1 (target)");
  if (const ref::Value* w = c.optional_in(2)) {
    c.expect_dtype(*w, DType::kFloat32, "input 2 (weight)");
    c.expect_dims(*w, {x[1]}, "input 2 (weight)");
  }
  c.int_attr("ignore_index", kIntMin, kIntMax);
  c.int_attr("has_ignore_index", 0, 1);
  return {DType::kFloat32, c.int_attr("reduction", 0, 2) == 0 ? t : Dims{}};
}

// CumSum along `axis`; `exclusive` leaves the element itself out, `reverse` sums from the end.
OutType cum_sum(const OpCheck& c) {
  c.arity(1, 1);
  DType t = c.expect_same_inputs(kNumeric);
  c.expect(!c.in(0).dims.empty(), "input is a scalar");
  c.int_attr("axis", 0, rank_of(c.in(0)) - 1);
  c.int_attr("exclusive", 0, 1);
  c.int_attr("reverse", 0, 1);
  return {t, c.in(0).dims};
}

OutType reduce(const OpCheck& c) {
  c.arity(1, 1);
  c.expect_inputs(DType::kFloat32);
  const Dims& x = c.in(0).dims;
  auto axes = c.ints_attr("axes");
  bool keep = c.int_attr("keepdims", 0, 1) != 0;
  for (size_t i = 0; i < axes.size(); ++i)
    c.expect(axes[i] >= 0 && axes[i] < rank_of(c.in(0)) && (i == 0 || axes[i] > axes[i - 1]),
             [&] { return "attribute 'axes' " + dims_text(axes) + " is not a sorted list of distinct axes below rank " +
                 std::to_string(x.size()); });
  Dims out;
  for (size_t a = 0; a < x.size(); ++a) {
    bool reduced = axes.empty() || std::binary_search(axes.begin(), axes.end(), static_cast<int64_t>(a));
    if (!reduced) out.push_back(x[a]);
    else if (keep) out.push_back(1);
  }
  return {DType::kFloat32, out};
}

// ReduceMax/ReduceMin have no identity element: an empty reduction is refused.
OutType reduce_extreme(const OpCheck& c) {
  OutType out = reduce(c);
  auto axes = c.ints_attr("axes");
  for (size_t a = 0; a < c.in(0).dims.size(); ++a)
    if (axes.empty() || std::binary_search(axes.begin(), axes.end(), static_cast<int64_t>(a)))
      c.expect(c.in(0).dims[a] > 0, [&] { return "reduces the empty axis " + std::to_string(a); });
  return out;
}

// ---- data movement -----------------------------------------------------------------------------

OutType transpose(const OpCheck& c) {
  c.arity(1, 1);
  const Dims& x = c.in(0).dims;
  auto perm = c.ints_attr("perm", x.size(), 0, rank_of(c.in(0)) - 1);
  auto sorted = perm;
  std::sort(sorted.begin(), sorted.end());
  c.expect(std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end(),
           [&] { return "attribute 'perm' " + dims_text(perm) + " is not a permutation"; });
  Dims out;
  for (int64_t p : perm) out.push_back(x[static_cast<size_t>(p)]);
  return {c.in(0).dtype, out};
}

OutType reshape(const OpCheck& c) {
  c.arity(1, 1);
  Dims shape = c.bounded(c.ints_attr("shape"), "attribute 'shape'");
  c.expect(product(shape) == c.in(0).element_count(),
           [&] { return "output dims " + dims_text(shape) + " hold " + std::to_string(product(shape)) + " elements, input dims " +
               dims_text(c.in(0).dims) + " hold " + std::to_string(c.in(0).element_count()); });
  return {c.in(0).dtype, shape};
}

OutType expand(const OpCheck& c) {
  c.arity(1, 1);
  Dims shape = c.ints_attr("shape");
  auto out = broadcast(c.in(0).dims, shape);
  c.expect(out.has_value(),
      [&] { return "input dims " + dims_text(c.in(0).dims) + " do not broadcast to " + dims_text(shape); });
  return {c.in(0).dtype, c.bounded(*out, "output")};
}

OutType tile(const OpCheck& c) {
  c.arity(1, 1);
  const Dims& x = c.in(0).dims;
  auto repeats = c.ints_attr("repeats", x.size(), 0, kMaxElements);
  Dims out = x;
  for (size_t a = 0; a < x.size(); ++a)
    c.expect(!__builtin_mul_overflow(x[a], repeats[a], &out[a]),
        [&] { return "repeats " + dims_text(repeats) + " overflow"; });
  return {c.in(0).dtype, c.bounded(out, "output")};
}

OutType trilu(const OpCheck& c) {
  c.arity(1, 1);
  c.expect(c.in(0).dims.size() >= 2,
      [&] { return "input has dims " + dims_text(c.in(0).dims) + ", expected rank >= 2"; });
  c.int_attr("upper", 0, 1);
  c.int_attr("k", kIntMin, kIntMax);
  return {c.in(0).dtype, c.in(0).dims};
}

OutType concat(const OpCheck& c) {
  c.arity(1, std::numeric_limits<size_t>::max());
  for (size_t i = 0; i < c.input_count(); ++i) c.in(i);  // every input present
  DType t = c.expect_same_inputs(kAny);
  const Dims& first = c.in(0).dims;
  c.expect(!first.empty(), "input 0 is a scalar");
  auto axis = static_cast<size_t>(c.int_attr("axis", 0, static_cast<int64_t>(first.size()) - 1));
  Dims out = first;
  out[axis] = 0;
  for (size_t i = 0; i < c.input_count(); ++i) {
    Dims d = c.in(i).dims;
    c.expect(d.size() == first.size(), [&] { return "input " + std::to_string(i) + " has dims " + dims_text(d) +
                                           ", expected rank " + std::to_string(first.size()); });
    out[axis] += d[axis];
    d[axis] = first[axis];
    c.expect(d == first, [&] { return "input " + std::to_string(i) + " has dims " + dims_text(c.in(i).dims) +
                             ", which differ from input 0 " + dims_text(first) + " outside axis " +
                             std::to_string(axis); });
  }
  return {t, c.bounded(out, "output")};
}

// Every read in[starts + i * steps] must land inside the input, checked without overflow.
OutType slice(const OpCheck& c) {
  c.arity(1, 1);
  const Dims& x = c.in(0).dims;
  auto starts = c.ints_attr("starts", x.size(), kIntMin, kIntMax);
  auto steps = c.ints_attr("steps", x.size(), kIntMin, kIntMax);
  Dims y = c.ints_attr("sizes", x.size(), 0, kMaxElements);
  for (size_t a = 0; a < x.size(); ++a) {
    std::string where = " on axis " + std::to_string(a);
    c.expect(steps[a] != 0, [&] { return "step 0" + where; });
    if (y[a] == 0) continue;
    c.expect(starts[a] >= 0 && starts[a] < x[a],
             [&] { return "start " + std::to_string(starts[a]) + where + " is outside [0, " + std::to_string(x[a]) + ")"; });
    if (y[a] == 1) continue;
    int64_t room = steps[a] > 0 ? x[a] - 1 - starts[a] : starts[a];
    bool fits = steps[a] != kIntMin && (steps[a] > 0 ? steps[a] : -steps[a]) <= room / (y[a] - 1);
    c.expect(fits, [&] { return std::to_string(y[a]) + " elements from " + std::to_string(starts[a]) + " by step " +
                       std::to_string(steps[a]) + where + " run outside [0, " + std::to_string(x[a]) + ")"; });
  }
  return {c.in(0).dtype, y};
}

OutType gather(const OpCheck& c) {
  c.arity(2, 2);
  c.expect(c.in(1).dtype == DType::kInt64 || c.in(1).dtype == DType::kInt32,
           [&] { return "input 1 (indices) has element type " + ref::dtype_name(c.in(1).dtype) + ", expected int64 or int32"; });
  const Dims& d = c.in(0).dims;
  c.expect(!d.empty(), "input 0 is a scalar");
  auto axis = static_cast<size_t>(c.int_attr("axis", 0, rank_of(c.in(0)) - 1));
  const Dims& idx = c.in(1).dims;
  Dims out(d.begin(), d.begin() + static_cast<int64_t>(axis));
  out.insert(out.end(), idx.begin(), idx.end());
  out.insert(out.end(), d.begin() + static_cast<int64_t>(axis) + 1, d.end());
  return {c.in(0).dtype, c.bounded(out, "output")};
}

// pads may be negative (crop), but never below -dim.
OutType pad(const OpCheck& c) {
  c.arity(1, 1);
  const Dims& x = c.in(0).dims;
  auto pads = c.ints_attr("pads", 2 * x.size(), -kMaxElements, kMaxElements);
  auto mode = c.int_attr("mode", 0, 2);  // constant, reflect, edge
  scalar_attr(c, c.in(0).dtype, "value");
  Dims out = x;
  for (size_t a = 0; a < x.size(); ++a) {
    out[a] = x[a] + pads[a] + pads[a + x.size()];
    c.expect(out[a] >= 0,
        [&] { return "pads " + dims_text(pads) + " remove more than axis " + std::to_string(a) + " holds"; });
    bool grows = pads[a] > 0 || pads[a + x.size()] > 0;
    if (mode != 0 && grows) {
      c.expect(x[a] > 0, [&] { return "pads an empty axis " + std::to_string(a) + " in reflect or edge mode"; });
      // Reflection reads x[1..dim-1]: a pad must be shorter than the axis.
      if (mode == 1)
        c.expect(pads[a] < x[a] && pads[a + x.size()] < x[a],
                 [&] { return "reflect pads " + dims_text(pads) + " reach past axis " + std::to_string(a) + " of size " +
                     std::to_string(x[a]); });
    }
  }
  return {c.in(0).dtype, c.bounded(out, "output")};
}

// Resize: `sizes` are the output dims; per axis `scales` map output to input coordinates with
// `coord` (ref_program.h lists the codes); `mode` nearest (with `nearest_mode`) or linear.
OutType resize(const OpCheck& c) {
  c.arity(1, 1);
  // 8-bit images computed in float32 and truncated back, as ONNX Runtime resizes them.
  const DType type = c.expect_same_inputs({DType::kFloat32, DType::kUInt8, DType::kInt8});
  const Dims& x = c.in(0).dims;
  c.int_attr("mode", 0, 1);
  c.int_attr("coord", 0, 5);
  c.int_attr("nearest_mode", 0, 4);
  const ref::Attr* scales = c.op().attr("scales");
  c.expect(scales && scales->kind == ref::Attr::Kind::kFloats && scales->floats.size() == x.size(),
           "attribute 'scales' (floats) must hold one scale per axis");
  for (float f : scales->floats) c.expect(f > 0 && std::isfinite(f), "attribute 'scales' holds a value that is not positive");
  Dims out = c.bounded(c.ints_attr("sizes", x.size(), 1, kMaxElements), "attribute 'sizes'");
  for (size_t a = 0; a < x.size(); ++a) c.expect(x[a] > 0,
      [&] { return "input axis " + std::to_string(a) + " is empty"; });
  return {type, out};
}

// ConvTranspose: W [C, M/group, k...]; `output_padding` adds to the end of each output axis. A
// packed weight (as Conv's) runs through oneDNN's deconvolution, which takes output_padding as
// less padding at the end, so the padding must cover it there.
OutType conv_transpose(const OpCheck& c) {
  c.arity(2, 3);
  c.expect_inputs(DType::kFloat32);
  const ref::Value& x = c.in(0);
  c.expect(x.dims.size() >= 3, [&] { return "input 0 has dims " + dims_text(x.dims) + ", expected N x C x D1 ..."; });
  const bool packed = c.int_attr_or("packed", 0, 0, 1) != 0;
  size_t n = x.dims.size() - 2;
  Dims kernel = c.ints_attr("kernel_shape", n, 1, kMaxWindow), strides = c.ints_attr("strides", n, 1, kMaxWindow);
  Dims pads = c.ints_attr("pads", 2 * n, 0, kMaxWindow), dilations = c.ints_attr("dilations", n, 1, kMaxWindow);
  Dims extra = c.ints_attr("output_padding", n, 0, kMaxWindow);
  int64_t group = c.int_attr("group", 1, kIntMax);
  const Dims wd = weight_dims(c, x, packed);
  c.expect(wd.size() == x.dims.size() && Dims(wd.begin() + 2, wd.end()) == kernel,
           [&] { return "weight dims " + dims_text(wd) + " do not match kernel " + dims_text(kernel); });
  c.expect(wd[0] == x.dims[1] && x.dims[1] % group == 0,
           [&] { return "group " + std::to_string(group) + " does not fit input " + dims_text(x.dims) + " and weight " + dims_text(wd); });
  int64_t channels = 0;
  c.expect(!__builtin_mul_overflow(wd[1], group, &channels) && channels <= kMaxElements,
           [&] { return "weight dims " + dims_text(wd) + " in " + std::to_string(group) + " groups make over 2^48 output channels"; });
  // The Conv kernels this shares its plan with read these; no ConvTranspose the compiler writes has them.
  for (const char* name :
       {"channels_last", "src_channels_last", "dst_channels_last", "act", "out_scale", "out_shift", "out_lo", "out_hi"})
    c.expect(c.op().attr(name) == nullptr, [&] { return std::string("attribute '") + name + "' on a ConvTranspose"; });
  if (packed) {
    for (size_t a = 0; a < n; ++a)
      c.expect(extra[a] <= pads[n + a], "a packed ConvTranspose whose output_padding exceeds its end padding");
    expect_packed_layout(c, onednn_weight_dims(wd, group, true));
  }
  if (const ref::Value* bias = c.optional_in(2)) c.expect_dims(*bias, {channels}, "bias");
  Dims out = {x.dims[0], channels};
  for (size_t a = 0; a < n; ++a) {
    int64_t size = strides[a] * (x.dims[a + 2] - 1) + extra[a] + (kernel[a] - 1) * dilations[a] + 1 - pads[a] - pads[a + n];
    c.expect(size > 0,
        [&] { return "output axis " + std::to_string(a + 2) + " would have size " + std::to_string(size); });
    out.push_back(size);
  }
  return {DType::kFloat32, c.bounded(out, "output")};
}

// GroupNormalization: channels in `groups` groups normalised together; scale and bias per channel.
// InstanceNormalization is this with one channel per group.
OutType group_normalization(const OpCheck& c) {
  c.arity(3, 3);
  c.expect_inputs(DType::kFloat32);
  const Dims& x = c.in(0).dims;
  c.expect(x.size() >= 2, [&] { return "input 0 has dims " + dims_text(x) + ", expected N x C x ..."; });
  int64_t groups = c.int_attr("groups", 1, kIntMax);
  c.expect(x[1] % groups == 0,
      [&] { return std::to_string(groups) + " groups do not divide " + std::to_string(x[1]) + " channels"; });
  for (size_t i = 1; i <= 2; ++i) c.expect_dims(c.in(i), {x[1]}, "input " + std::to_string(i));
  c.float_attr("epsilon");
  return {DType::kFloat32, x};
}

// ArgMax/ArgMin along `axis`; `select_last_index` picks the last of equal extremes.
OutType arg_extreme(const OpCheck& c) {
  c.arity(1, 1);
  c.expect_inputs(DType::kFloat32);
  const Dims& x = c.in(0).dims;
  c.expect(!x.empty(), "input is a scalar");
  auto axis = static_cast<size_t>(c.int_attr("axis", 0, rank_of(c.in(0)) - 1));
  c.expect(x[axis] > 0, [&] { return "reduces the empty axis " + std::to_string(axis); });
  bool keep = c.int_attr("keepdims", 0, 1) != 0;
  c.int_attr("select_last_index", 0, 1);
  Dims out = x;
  if (keep) out[axis] = 1;
  else out.erase(out.begin() + static_cast<int64_t>(axis));
  return {DType::kInt64, out};
}

// GatherElements: indices (int32/int64) of any shape of the data's rank, picking along `axis`.
OutType gather_elements(const OpCheck& c) {
  c.arity(2, 2);
  const Dims& d = c.in(0).dims;
  const Dims& idx = c.in(1).dims;
  c.expect(c.in(1).dtype == DType::kInt64 || c.in(1).dtype == DType::kInt32,
           [&] { return "input 1 (indices) has element type " + ref::dtype_name(c.in(1).dtype) + ", expected int64 or int32"; });
  c.expect(!d.empty() && idx.size() == d.size(),
      [&] { return "indices " + dims_text(idx) + " must have the rank of data " + dims_text(d); });
  auto axis = static_cast<size_t>(c.int_attr("axis", 0, rank_of(c.in(0)) - 1));
  for (size_t a = 0; a < d.size(); ++a)
    c.expect(a == axis || idx[a] <= d[a],
        [&] { return "indices " + dims_text(idx) + " exceed data " + dims_text(d) + " on axis " + std::to_string(a); });
  return {c.in(0).dtype, idx};
}

// GatherND: the last axis of the indices (m values) addresses data dims [b, b + m) after the
// `batch_dims` b shared ones; output = indices dims[:-1] + data dims[b + m:].
OutType gather_nd(const OpCheck& c) {
  c.arity(2, 2);
  const Dims& d = c.in(0).dims;
  const Dims& idx = c.in(1).dims;
  c.expect(c.in(1).dtype == DType::kInt64,
      [&] { return "input 1 (indices) has element type " + ref::dtype_name(c.in(1).dtype) + ", expected int64"; });
  auto b = static_cast<size_t>(c.int_attr("batch_dims", 0, kIntMax));
  c.expect(!idx.empty() && !d.empty() && b < idx.size() && b < d.size(),
      [&] { return "batch_dims " + std::to_string(b) + " do not fit data " +
                                                                              dims_text(d) + " and indices " + dims_text(idx); });
  auto m = static_cast<size_t>(idx.back());
  c.expect(m >= 1 && b + m <= d.size(),
      [&] { return "indices " + dims_text(idx) + " address more dims than data " + dims_text(d) + " has"; });
  c.expect(Dims(d.begin(), d.begin() + static_cast<int64_t>(b)) == Dims(idx.begin(), idx.begin() + static_cast<int64_t>(b)),
           [&] { return "the batch dims of data " + dims_text(d) + " and indices " + dims_text(idx) + " differ"; });
  Dims out(idx.begin(), idx.end() - 1);
  out.insert(out.end(), d.begin() + static_cast<int64_t>(b + m), d.end());
  return {c.in(0).dtype, out};
}

// ScatterElements: data with updates written (or combined: 1 add, 2 mul, 3 max, 4 min) at the
// positions the indices give along `axis`.
OutType scatter_elements(const OpCheck& c) {
  c.arity(3, 3);
  const Dims& d = c.in(0).dims;
  c.expect(c.in(1).dtype == DType::kInt64 || c.in(1).dtype == DType::kInt32,
           [&] { return "input 1 (indices) has element type " + ref::dtype_name(c.in(1).dtype) + ", expected int64 or int32"; });
  c.expect_dtype(c.in(2), c.in(0).dtype, "input 2 (updates)");
  c.expect_dims(c.in(2), c.in(1).dims, "input 2 (updates)");
  c.expect(!d.empty() && c.in(1).dims.size() == d.size(),
      [&] { return "indices " + dims_text(c.in(1).dims) + " must have the rank of data " + dims_text(d); });
  auto axis = static_cast<size_t>(c.int_attr("axis", 0, rank_of(c.in(0)) - 1));
  for (size_t a = 0; a < d.size(); ++a)
    c.expect(a == axis || c.in(1).dims[a] <= d[a],
        [&] { return "indices " + dims_text(c.in(1).dims) + " exceed data " + dims_text(d); });
  int64_t reduction = c.int_attr("reduction", 0, 4);
  c.expect(reduction == 0 || c.in(0).dtype != DType::kBool, "a reduction over bool");
  return {c.in(0).dtype, d};
}

// OneHot: `off` everywhere but `on` at each index (negative ones count from `depth`), with a new
// axis of `depth` at `axis`; indices of any numeric type, values of `dtype`.
OutType one_hot(const OpCheck& c) {
  c.arity(1, 1);
  c.expect(c.in(0).dtype != DType::kBool, "input 0 (indices) is bool");
  const Dims& idx = c.in(0).dims;
  int64_t depth = c.int_attr("depth", 1, kMaxElements);
  auto axis = c.int_attr("axis", 0, rank_of(c.in(0)));
  DType t = c.dtype_attr("dtype");
  scalar_attr(c, t, "on");
  scalar_attr(c, t, "off");
  Dims out = idx;
  out.insert(out.begin() + axis, depth);
  return {t, c.bounded(out, "output")};
}

// EyeLike: a 2-D tensor of the input's dims with ones on diagonal `k`; reads the input's dims only.
OutType eye_like(const OpCheck& c) {
  c.arity(1, 1);
  c.expect(c.in(0).dims.size() == 2, [&] { return "input has dims " + dims_text(c.in(0).dims) + ", expected 2-D"; });
  c.int_attr("k", kIntMin, kIntMax);
  return {c.dtype_attr("dtype"), c.in(0).dims};
}

// Shape and Size read only the dims of their input, never its data.
OutType shape(const OpCheck& c) {
  c.arity(1, 1);
  int64_t rank = rank_of(c.in(0));
  int64_t start = c.int_attr("start", 0, rank), end = c.int_attr("end", start, rank);
  return {DType::kInt64, {end - start}};
}

OutType size(const OpCheck& c) {
  c.arity(1, 1);
  return {DType::kInt64, {}};
}

}  // namespace

const std::vector<OpDef>& op_defs() {
  namespace k = kernels;
  static const std::vector<OpDef> kOps = {
      {"Add", add, k::add, true, plan_broadcast},
      {"Sub", arithmetic, k::sub, true, plan_broadcast},
      {"Mul", arithmetic, k::mul, true, plan_broadcast},
      {"Div", arithmetic, k::div, true, plan_broadcast},
      {"Min", arithmetic, k::min, true, plan_broadcast},
      {"Max", arithmetic, k::max, true, plan_broadcast},
      {"Pow", float_binary, k::pow, true, plan_broadcast},
      {"PRelu", float_binary, k::prelu, true, plan_broadcast},
      {"Equal", equal, k::equal, true, plan_broadcast},
      {"Less", compare, k::less, true, plan_broadcast},
      {"Greater", compare, k::greater, true, plan_broadcast},
      {"LessOrEqual", compare, k::less_or_equal, true, plan_broadcast},
      {"GreaterOrEqual", compare, k::greater_or_equal, true, plan_broadcast},
      {"And", logical, k::logical_and, true, plan_broadcast},
      {"Or", logical, k::logical_or, true, plan_broadcast},
      {"Xor", logical, k::logical_xor, true, plan_broadcast},
      {"Not", logical_not, k::logical_not},
      {"Where", where, k::where, true, plan_broadcast},
      {"Cast", cast, k::cast},
      {"QuantizeLinear", quantize_linear, k::quantize_linear, true, k::plan_quant},
      {"DequantizeLinear", dequantize_linear, k::dequantize_linear, true, k::plan_quant},
      {"Requantize", requantize, k::requantize, true, k::plan_requantize},
      {"Neg", numeric_unary, k::neg},
      {"Abs", numeric_unary, k::abs},
      {"Sqrt", unary, k::sqrt},
      {"Exp", unary, k::exp},
      {"Log", unary, k::log},
      {"Erf", unary, k::erf},
      {"Sin", unary, k::sin},
      {"Cos", unary, k::cos},
      {"Reciprocal", unary, k::reciprocal},
      {"Tan", unary, k::tan},
      {"Asin", unary, k::asin},
      {"Acos", unary, k::acos},
      {"Atan", unary, k::atan},
      {"Sinh", unary, k::sinh},
      {"Cosh", unary, k::cosh},
      {"Asinh", unary, k::asinh},
      {"Acosh", unary, k::acosh},
      {"Atanh", unary, k::atanh},
      {"Sign", unary, k::sign},
      {"Ceil", unary, k::ceil},
      {"Softsign", unary, k::softsign},
      {"ThresholdedRelu", with_alpha, k::thresholded_relu, true, k::plan_alpha},
      {"Celu", with_alpha, k::celu, true, k::plan_celu},
      {"Shrink", shrink, k::shrink, true, k::plan_shrink},
      {"IsInf", is_inf, k::is_inf, true, k::plan_is_inf},
      {"IsNaN", is_nan, k::is_nan},
      {"Mod", mod, k::mod, true, plan_broadcast},
      {"Relu", unary, k::relu},
      {"Sigmoid", unary, k::sigmoid},
      {"Tanh", unary, k::tanh},
      {"Softplus", unary, k::softplus},
      {"HardSwish", unary, k::hard_swish},
      {"LeakyRelu", with_alpha, k::leaky_relu, true, k::plan_alpha},
      {"Elu", with_alpha, k::elu, true, k::plan_alpha},
      {"Selu", selu, k::selu, true, k::plan_selu},
      {"HardSigmoid", with_alpha_beta, k::hard_sigmoid, true, k::plan_alpha_beta},
      {"Clip", clip, k::clip, true, k::plan_clip},
      {"ConstantOfShape", constant_of_shape, k::constant_of_shape, true, k::plan_constant_of_shape},
      {"Range", range, k::range, true, k::plan_range},
      {"Softmax", softmax, k::softmax, true, k::plan_columns},
      {"LogSoftmax", softmax, k::log_softmax, true, k::plan_columns},
      {"Hardmax", softmax, k::hardmax, true, k::plan_columns},
      {"NegativeLogLikelihoodLoss", nll_loss, k::nll_loss, true, k::plan_nll_loss},
      {"CumSum", cum_sum, k::cum_sum, true, k::plan_cum_sum},
      {"MatMul", matmul, k::matmul, true, k::plan_product},
      {"Gemm", gemm, k::gemm, true, k::plan_product},
      {"PanelWeight", panel_weight, k::panel_weight, true, k::plan_panel_weight},
      {"MatMulNBits", matmul_nbits, k::matmul_nbits, true, k::plan_matmul_nbits},
      {"GatherBlockQuantized", gather_block_quantized, k::gather_block_quantized, true, k::plan_gather_block_quantized},
      {"MatMulInteger", matmul_integer, k::matmul_integer, true, k::plan_matmul_integer},
      {"ConvInteger", conv_integer, k::conv_integer, true, k::plan_conv_integer},
      {"QLinearConv", qlinear_conv, k::qlinear_conv, true, k::plan_qlinear_conv},
      {"DynamicQuantizeLinear", dynamic_quantize_linear, k::dynamic_quantize_linear, true, k::plan_which_output},
      {"Conv", conv, k::conv, true, k::plan_conv},
      {"ConvWeight", conv_weight, k::conv_weight, true, k::plan_conv_weight},
      {"MaxPool", max_pool, k::max_pool, true, k::plan_window},
      {"AveragePool", average_pool, k::average_pool, true, k::plan_window},
      {"BatchNormalization", batch_normalization, k::batch_normalization, true, k::plan_batch_normalization},
      {"LayerNormalization", layer_normalization, k::layer_normalization, true, k::plan_normalisation},
      {"ReduceMean", reduce, k::reduce_mean, true, k::plan_reduction},
      {"ReduceSum", reduce, k::reduce_sum, true, k::plan_reduction},
      {"ReduceMax", reduce_extreme, k::reduce_max, true, k::plan_reduction},
      {"ReduceMin", reduce_extreme, k::reduce_min, true, k::plan_reduction},
      {"Transpose", transpose, k::transpose, true, k::plan_transpose},
      {"Reshape", reshape, k::reshape},
      {"Expand", expand, k::expand, true, plan_broadcast},
      {"Tile", tile, k::tile, true, k::plan_input_strides},
      {"Trilu", trilu, k::trilu, true, k::plan_trilu},
      {"Concat", concat, k::concat, true, k::plan_axis},
      {"Slice", slice, k::slice, true, k::plan_slice},
      {"Gather", gather, k::gather, true, k::plan_axis},
      {"Pad", pad, k::pad, true, k::plan_pad},
      {"Resize", resize, k::resize, true, k::plan_resize},
      {"ConvTranspose", conv_transpose, k::conv_transpose, true, k::plan_conv},
      {"GroupNormalization", group_normalization, k::group_normalization, true, k::plan_normalisation},
      {"ArgMax", arg_extreme, k::arg_max, true, k::plan_arg_extreme},
      {"ArgMin", arg_extreme, k::arg_min, true, k::plan_arg_extreme},
      {"GatherElements", gather_elements, k::gather_elements, true, k::plan_axis_strides},
      {"ReduceProd", reduce, k::reduce_prod, true, k::plan_reduction},
      {"ReduceL1", reduce, k::reduce_l1, true, k::plan_reduction},
      {"ReduceL2", reduce, k::reduce_l2, true, k::plan_reduction},
      {"ReduceSumSquare", reduce, k::reduce_sum_square, true, k::plan_reduction},
      {"ReduceLogSum", reduce, k::reduce_log_sum, true, k::plan_reduction},
      {"ReduceLogSumExp", reduce, k::reduce_log_sum_exp, true, k::plan_reduction},
      {"OneHot", one_hot, k::one_hot, true, k::plan_one_hot},
      {"GatherND", gather_nd, k::gather_nd, true, k::plan_gather_nd},
      {"ScatterElements", scatter_elements, k::scatter_elements, true, k::plan_axis_strides},
      {"EyeLike", eye_like, k::eye_like, false, k::plan_eye_like},
      {"Shape", shape, k::shape, false, k::plan_shape},
      {"Size", size, k::size, false},
  };
  return kOps;
}

// Looked up three times per op when a session loads a program (validation, its rule, its plan): a
// scan of the ~150 names was ~3.5% of the creating thread's time in a CNN session (perf), a hash
// lookup 0.6%.
const OpDef* find_op(const std::string& type) {
  static const std::unordered_map<std::string_view, const OpDef*> by_type = [] {
    std::unordered_map<std::string_view, const OpDef*> m;
    for (const OpDef& def : op_defs()) m.emplace(def.type, &def);
    return m;
  }();
  const auto it = by_type.find(type);
  return it == by_type.end() ? nullptr : it->second;
}

}  // namespace ctxgen::runtime
