// The rule of each ref op: arity, element types, required attributes and the output dims they
// imply (the normalised semantics of include/ctxgen/ref_program.h), and the table tying each op
// type to its rule and kernel.

#include "ops.h"

#include <algorithm>
#include <limits>

namespace ctxgen::runtime {
namespace {

constexpr int64_t kIntMax = std::numeric_limits<int64_t>::max();
constexpr int64_t kIntMin = std::numeric_limits<int64_t>::min();
// Window attributes are bounded (as the compiler bounds them) so size arithmetic cannot overflow.
constexpr int64_t kMaxWindow = (int64_t{1} << 31) - 1;
// The element bound validate() puts on every value, applied to kernel scratch buffers too.
constexpr int64_t kMaxElements = int64_t{1} << 48;

int64_t rank_of(const ref::Value& v) { return static_cast<int64_t>(v.dims.size()); }

// ---- elementwise -------------------------------------------------------------------------------

void unary(const OpCheck& c) {
  c.arity(1, 1);
  c.expect_float32();
  c.expect_out_dims(c.in(0).dims);
}

void leaky_relu(const OpCheck& c) {
  unary(c);
  c.float_attr("alpha");
}

void hard_sigmoid(const OpCheck& c) {
  unary(c);
  c.float_attr("alpha");
  c.float_attr("beta");
}

void clip(const OpCheck& c) {
  unary(c);
  c.float_attr("min");
  c.float_attr("max");
}

void binary(const OpCheck& c) {
  c.arity(2, 2);
  c.expect_float32();
  auto dims = broadcast(c.in(0).dims, c.in(1).dims);
  c.expect(dims.has_value(), "input dims " + dims_text(c.in(0).dims) + " and " + dims_text(c.in(1).dims) +
                                 " do not broadcast");
  c.expect_out_dims(*dims);
}

// The fused activation of Conv, Gemm and MatMul: `act` optional (none), its parameters required
// by the activations that read them.
void fused_activation(const OpCheck& c) {
  if (!c.op().attr("act")) return;
  auto act = static_cast<ref::Activation>(c.int_attr("act", 0, static_cast<int64_t>(ref::Activation::kHardSwish)));
  if (act == ref::Activation::kLeakyRelu || act == ref::Activation::kClip || act == ref::Activation::kHardSigmoid)
    c.float_attr("act_alpha");
  if (act == ref::Activation::kClip || act == ref::Activation::kHardSigmoid) c.float_attr("act_beta");
}

// ---- linear algebra ----------------------------------------------------------------------------

void matmul(const OpCheck& c) {
  c.arity(2, 2);
  c.expect_float32();
  const Dims& a = c.in(0).dims;
  const Dims& b = c.in(1).dims;
  c.expect(a.size() >= 2 && b.size() >= 2, "inputs have dims " + dims_text(a) + " and " + dims_text(b) +
                                               ", expected rank >= 2 each");
  c.expect(a.back() == b[b.size() - 2], "inner dims differ: " + dims_text(a) + " x " + dims_text(b));
  auto batch = broadcast({a.begin(), a.end() - 2}, {b.begin(), b.end() - 2});
  c.expect(batch.has_value(), "batch dims of " + dims_text(a) + " and " + dims_text(b) + " do not broadcast");
  batch->push_back(a[a.size() - 2]);
  batch->push_back(b.back());
  c.expect_out_dims(*batch);
  fused_activation(c);
}

void gemm(const OpCheck& c) {
  c.arity(2, 3);
  c.expect_float32();
  bool trans_a = c.int_attr("transA", 0, 1) != 0, trans_b = c.int_attr("transB", 0, 1) != 0;
  c.float_attr("alpha");
  c.float_attr("beta");
  const Dims& a = c.in(0).dims;
  const Dims& b = c.in(1).dims;
  c.expect(a.size() == 2 && b.size() == 2, "A " + dims_text(a) + " and B " + dims_text(b) + " must be 2-D");
  int64_t m = trans_a ? a[1] : a[0], k = trans_a ? a[0] : a[1];
  int64_t kb = trans_b ? b[1] : b[0], n = trans_b ? b[0] : b[1];
  c.expect(k == kb, "inner dims differ: A " + dims_text(a) + ", B " + dims_text(b));
  const Dims mn = {m, n};
  if (const ref::Value* cv = c.optional_in(2))
    c.expect(cv->dims.size() <= 2 && broadcast(cv->dims, mn) == mn,
             "C dims " + dims_text(cv->dims) + " do not broadcast to " + dims_text(mn));
  c.expect_out_dims(mn);
  fused_activation(c);
}

// ---- sliding windows ---------------------------------------------------------------------------

struct Window {
  Dims kernel, strides, pads, dilations;
};

// The window attributes of an N-D op over `x`, each checked for count and range.
Window window(const OpCheck& c, const ref::Value& x, bool has_dilations) {
  c.expect(x.dims.size() >= 3, "input 0 has dims " + dims_text(x.dims) + ", expected N x C x D1 ...");
  size_t n = x.dims.size() - 2;
  Window w;
  w.kernel = c.ints_attr("kernel_shape", n, 1, kMaxWindow);
  w.strides = c.ints_attr("strides", n, 1, kMaxWindow);
  w.pads = c.ints_attr("pads", 2 * n, 0, kMaxWindow);
  w.dilations = has_dilations ? c.ints_attr("dilations", n, 1, kMaxWindow) : Dims(n, 1);
  return w;
}

// Output size of spatial axis `a`: floor mode, or ceil mode when `ceil`.
int64_t window_output(const OpCheck& c, const ref::Value& x, const Window& w, size_t a, bool ceil) {
  size_t n = w.kernel.size();
  int64_t span = (w.kernel[a] - 1) * w.dilations[a] + 1;
  int64_t room = x.dims[a + 2] + w.pads[a] + w.pads[a + n] - span;
  c.expect(room >= 0, "window " + dims_text(w.kernel) + " on axis " + std::to_string(a + 2) +
                          " is larger than the padded input " + dims_text(x.dims));
  return (ceil ? (room + w.strides[a] - 1) / w.strides[a] : room / w.strides[a]) + 1;
}

void conv(const OpCheck& c) {
  c.arity(2, 3);
  c.expect_float32();
  const ref::Value& x = c.in(0);
  const ref::Value& wv = c.in(1);
  Window w = window(c, x, true);
  int64_t group = c.int_attr("group", 1, kIntMax);
  c.expect(wv.dims.size() == x.dims.size(), "weight dims " + dims_text(wv.dims) + " do not match input rank " +
                                                std::to_string(x.dims.size()));
  c.expect(Dims(wv.dims.begin() + 2, wv.dims.end()) == w.kernel,
           "attribute 'kernel_shape' " + dims_text(w.kernel) + " differs from weight dims " + dims_text(wv.dims));
  c.expect(x.dims[1] / group == wv.dims[1] && x.dims[1] % group == 0 && wv.dims[0] % group == 0,
           "group " + std::to_string(group) + " does not fit input " + dims_text(x.dims) + " and weight " +
               dims_text(wv.dims));
  if (const ref::Value* bias = c.optional_in(2)) c.expect_dims(*bias, {wv.dims[0]}, "bias");
  Dims out = {x.dims[0], wv.dims[0]};
  for (size_t a = 0; a < w.kernel.size(); ++a) out.push_back(window_output(c, x, w, a, false));
  c.expect_out_dims(out);
  // The kernel's im2col scratch holds (C/group x kernel) x output-positions floats.
  int64_t scratch = 0;
  c.expect(!__builtin_mul_overflow(product(wv.dims, 1, wv.dims.size()), product(out, 2, out.size()), &scratch) &&
               scratch <= kMaxElements,
           "im2col of weight " + dims_text(wv.dims) + " over output " + dims_text(out) + " needs more than 2^48 elements");
  fused_activation(c);
}

// Pool output dims reflect ceil_mode, which is not itself an attribute: each axis may have either
// size.
void pool(const OpCheck& c, bool is_max) {
  c.arity(1, 1);
  c.expect_float32();
  const ref::Value& x = c.in(0);
  Window w = window(c, x, is_max);
  if (!is_max) c.int_attr("count_include_pad", 0, 1);
  const Dims& y = c.out().dims;
  c.expect(y.size() == x.dims.size() && y[0] == x.dims[0] && y[1] == x.dims[1],
           "output has dims " + dims_text(y) + ", expected [" + std::to_string(x.dims[0]) + "," +
               std::to_string(x.dims[1]) + ",...]");
  for (size_t a = 0; a < w.kernel.size(); ++a) {
    int64_t floor = window_output(c, x, w, a, false), ceil = window_output(c, x, w, a, true);
    c.expect(y[a + 2] == floor || y[a + 2] == ceil,
             "output has dims " + dims_text(y) + ", expected " + std::to_string(floor) +
                 (ceil != floor ? " or " + std::to_string(ceil) : std::string()) + " on axis " +
                 std::to_string(a + 2));
  }
}

void max_pool(const OpCheck& c) { pool(c, true); }
void average_pool(const OpCheck& c) { pool(c, false); }

// ---- normalisation and reductions --------------------------------------------------------------

void softmax(const OpCheck& c) {
  unary(c);
  c.expect(!c.in(0).dims.empty(), "input is a scalar");
  c.int_attr("axis", 0, rank_of(c.in(0)) - 1);
  c.int_attr("coerce_2d", 0, 1);
}

void batch_normalization(const OpCheck& c) {
  c.arity(5, 5);
  c.expect_float32();
  const Dims& x = c.in(0).dims;
  c.expect(x.size() >= 2, "input 0 has dims " + dims_text(x) + ", expected N x C x ...");
  for (size_t i = 1; i <= 4; ++i) c.expect_dims(c.in(i), {x[1]}, "input " + std::to_string(i));
  c.float_attr("epsilon");
  c.expect_out_dims(x);
}

void layer_normalization(const OpCheck& c) {
  c.arity(2, 3);
  c.expect_float32();
  const Dims& x = c.in(0).dims;
  c.expect(!x.empty(), "input 0 is a scalar");
  auto axis = static_cast<size_t>(c.int_attr("axis", 0, rank_of(c.in(0)) - 1));
  c.float_attr("epsilon");
  int64_t block = product(x, axis, x.size());
  for (size_t i = 1; i <= 2; ++i)
    if (const ref::Value* p = c.optional_in(i))
      c.expect(p->element_count() == block, "input " + std::to_string(i) + " dims " + dims_text(p->dims) +
                                                " do not cover the normalised dims " +
                                                dims_text(Dims(x.begin() + static_cast<int64_t>(axis), x.end())));
  c.expect_out_dims(x);
}

void reduce(const OpCheck& c) {
  c.arity(1, 1);
  c.expect_float32();
  const Dims& x = c.in(0).dims;
  auto axes = c.ints_attr("axes");
  bool keep = c.int_attr("keepdims", 0, 1) != 0;
  for (size_t i = 0; i < axes.size(); ++i)
    c.expect(axes[i] >= 0 && axes[i] < rank_of(c.in(0)) && (i == 0 || axes[i] > axes[i - 1]),
             "attribute 'axes' " + dims_text(axes) + " is not a sorted list of distinct axes below rank " +
                 std::to_string(x.size()));
  Dims out;
  for (size_t a = 0; a < x.size(); ++a) {
    bool reduced = axes.empty() || std::binary_search(axes.begin(), axes.end(), static_cast<int64_t>(a));
    if (!reduced) out.push_back(x[a]);
    else if (keep) out.push_back(1);
  }
  c.expect_out_dims(out);
}

// ---- data movement -----------------------------------------------------------------------------

void transpose(const OpCheck& c) {
  c.arity(1, 1);
  c.expect_float32();
  const Dims& x = c.in(0).dims;
  auto perm = c.ints_attr("perm", x.size(), 0, rank_of(c.in(0)) - 1);
  auto sorted = perm;
  std::sort(sorted.begin(), sorted.end());
  c.expect(std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end(),
           "attribute 'perm' " + dims_text(perm) + " is not a permutation");
  Dims out;
  for (int64_t p : perm) out.push_back(x[static_cast<size_t>(p)]);
  c.expect_out_dims(out);
}

void reshape(const OpCheck& c) {
  c.arity(1, 1);
  c.expect_dtype(c.out(), c.in(0).dtype, "output");
  c.expect(c.in(0).element_count() == c.out().element_count(),
           "output dims " + dims_text(c.out().dims) + " hold " + std::to_string(c.out().element_count()) +
               " elements, input dims " + dims_text(c.in(0).dims) + " hold " +
               std::to_string(c.in(0).element_count()));
}

void concat(const OpCheck& c) {
  c.arity(1, std::numeric_limits<size_t>::max());
  for (size_t i = 0; i < c.input_count(); ++i) c.in(i);  // every input present
  c.expect_float32();
  const Dims& first = c.in(0).dims;
  c.expect(!first.empty(), "input 0 is a scalar");
  auto axis = static_cast<size_t>(c.int_attr("axis", 0, static_cast<int64_t>(first.size()) - 1));
  Dims out = first;
  out[axis] = 0;
  for (size_t i = 0; i < c.input_count(); ++i) {
    Dims d = c.in(i).dims;
    c.expect(d.size() == first.size(), "input " + std::to_string(i) + " has dims " + dims_text(d) +
                                           ", expected rank " + std::to_string(first.size()));
    out[axis] += d[axis];
    d[axis] = first[axis];
    c.expect(d == first, "input " + std::to_string(i) + " has dims " + dims_text(c.in(i).dims) +
                             ", which differ from input 0 " + dims_text(first) + " outside axis " +
                             std::to_string(axis));
  }
  c.expect_out_dims(out);
}

// Every read in[starts + i * steps] must land inside the input, checked without overflow.
void slice(const OpCheck& c) {
  c.arity(1, 1);
  c.expect_float32();
  const Dims& x = c.in(0).dims;
  const Dims& y = c.out().dims;
  auto starts = c.ints_attr("starts", x.size(), kIntMin, kIntMax);
  auto steps = c.ints_attr("steps", x.size(), kIntMin, kIntMax);
  c.expect(y.size() == x.size(), "output has dims " + dims_text(y) + ", expected rank " + std::to_string(x.size()));
  for (size_t a = 0; a < x.size(); ++a) {
    std::string where = " on axis " + std::to_string(a);
    c.expect(steps[a] != 0, "step 0" + where);
    if (y[a] == 0) continue;
    c.expect(starts[a] >= 0 && starts[a] < x[a],
             "start " + std::to_string(starts[a]) + where + " is outside [0, " + std::to_string(x[a]) + ")");
    if (y[a] == 1) continue;
    int64_t room = steps[a] > 0 ? x[a] - 1 - starts[a] : starts[a];
    bool fits = steps[a] != kIntMin && (steps[a] > 0 ? steps[a] : -steps[a]) <= room / (y[a] - 1);
    c.expect(fits, std::to_string(y[a]) + " elements from " + std::to_string(starts[a]) + " by step " +
                       std::to_string(steps[a]) + where + " run outside [0, " + std::to_string(x[a]) + ")");
  }
}

void gather(const OpCheck& c) {
  c.arity(2, 2);
  c.expect_float32({1});
  c.expect_dtype(c.in(1), ref::DType::kInt64, "input 1 (indices)");
  const Dims& d = c.in(0).dims;
  c.expect(!d.empty(), "input 0 is a scalar");
  auto axis = static_cast<size_t>(c.int_attr("axis", 0, rank_of(c.in(0)) - 1));
  const Dims& idx = c.in(1).dims;
  Dims out(d.begin(), d.begin() + static_cast<int64_t>(axis));
  out.insert(out.end(), idx.begin(), idx.end());
  out.insert(out.end(), d.begin() + static_cast<int64_t>(axis) + 1, d.end());
  c.expect_out_dims(out);
}

}  // namespace

const std::vector<OpDef>& op_defs() {
  namespace k = kernels;
  static const std::vector<OpDef> kOps = {
      {"Add", binary, k::add},
      {"Sub", binary, k::sub},
      {"Mul", binary, k::mul},
      {"Div", binary, k::div},
      {"Pow", binary, k::pow},
      {"Sqrt", unary, k::sqrt},
      {"Exp", unary, k::exp},
      {"Erf", unary, k::erf},
      {"Neg", unary, k::neg},
      {"Abs", unary, k::abs},
      {"Relu", unary, k::relu},
      {"Sigmoid", unary, k::sigmoid},
      {"Tanh", unary, k::tanh},
      {"HardSwish", unary, k::hard_swish},
      {"LeakyRelu", leaky_relu, k::leaky_relu},
      {"HardSigmoid", hard_sigmoid, k::hard_sigmoid},
      {"Clip", clip, k::clip},
      {"Softmax", softmax, k::softmax},
      {"MatMul", matmul, k::matmul},
      {"Gemm", gemm, k::gemm},
      {"Conv", conv, k::conv},
      {"MaxPool", max_pool, k::max_pool},
      {"AveragePool", average_pool, k::average_pool},
      {"BatchNormalization", batch_normalization, k::batch_normalization},
      {"LayerNormalization", layer_normalization, k::layer_normalization},
      {"ReduceMean", reduce, k::reduce_mean},
      {"ReduceSum", reduce, k::reduce_sum},
      {"Transpose", transpose, k::transpose},
      {"Reshape", reshape, k::reshape},
      {"Concat", concat, k::concat},
      {"Slice", slice, k::slice},
      {"Gather", gather, k::gather},
  };
  return kOps;
}

const OpDef* find_op(const std::string& type) {
  for (const OpDef& def : op_defs())
    if (type == def.type) return &def;
  return nullptr;
}

}  // namespace ctxgen::runtime
