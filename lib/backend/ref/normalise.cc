// Per-op support rules and normalisation. Each rule reads the node through NodeView, which
// refuses anything not static float32, and returns the op exactly as the ref runtime expects it.

#include "normalise.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <numeric>

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

const std::string kNoExtraOutputs = "more than one output";

NormalisedNode make(const NodeView& v, std::string type, std::vector<std::string> inputs,
                    std::vector<ref::Attr> attrs = {}, const std::string& extra_output_reason = kNoExtraOutputs) {
  NormalisedNode n;
  n.type = std::move(type);
  n.attrs = std::move(attrs);
  n.inputs = std::move(inputs);
  n.output = v.single_output(extra_output_reason);
  n.output_dims = v.output_dims();
  return n;
}

// A byte copy whose output dims give the shape: Reshape, Flatten, Squeeze, Unsqueeze, Identity.
NormalisedNode copy_of_input0(const NodeView& v, const std::string& extra_output_reason = kNoExtraOutputs) {
  v.float_input(0);
  auto n = make(v, "Reshape", {v.input(0)}, {}, extra_output_reason);
  v.expect_same_element_count(0);
  return n;
}

NormalisedNode identity(const NodeView& v) { return copy_of_input0(v); }

// ---- elementwise -------------------------------------------------------------------------------

NormalisedNode unary(const NodeView& v) {
  auto dims = v.float_input(0);
  auto n = make(v, v.op(), {v.input(0)});
  v.expect_output_dims(dims);
  return n;
}

NormalisedNode binary(const NodeView& v) {
  auto a = v.float_input(0);
  auto b = v.float_input(1);
  if (v.opset() < 7 && a != b)
    refuse("legacy broadcast semantics (opset " + std::to_string(v.opset()) + " < 7) with shapes " + dims_text(a) +
           " and " + dims_text(b));
  auto n = make(v, v.op(), {v.input(0), v.input(1)});
  v.expect_output_dims(broadcast_dims(a, b));
  return n;
}

NormalisedNode leaky_relu(const NodeView& v) {
  auto n = unary(v);
  n.attrs = {float_attr("alpha", v.float_attr("alpha", 0.01f))};
  return n;
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
  auto dims = v.float_input(0);
  auto n = make(v, "Clip", {v.input(0)}, {float_attr("min", lo), float_attr("max", hi)});
  v.expect_output_dims(dims);
  return n;
}

// ---- normalisation and softmax -----------------------------------------------------------------

NormalisedNode softmax(const NodeView& v) {
  auto dims = v.float_input(0);
  auto rank = static_cast<int64_t>(dims.size());
  if (rank == 0) refuse("Softmax of a scalar");
  bool legacy = v.opset() < 13;
  int64_t axis = normalise_axis(v.int_attr("axis", legacy ? 1 : -1), rank, "axis");
  auto n = make(v, "Softmax", {v.input(0)}, {int_attr("axis", axis), int_attr("coerce_2d", legacy ? 1 : 0)});
  v.expect_output_dims(dims);
  return n;
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
  auto n = make(v, "BatchNormalization", {v.input(0), v.input(1), v.input(2), v.input(3), v.input(4)},
                {float_attr("epsilon", v.float_attr("epsilon", 1e-5f))}, "BatchNormalization with training outputs");
  v.expect_output_dims(x);
  return n;
}

NormalisedNode layer_norm(const NodeView& v) {
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
  auto n = make(v, "LayerNormalization", inputs,
                {int_attr("axis", axis), float_attr("epsilon", v.float_attr("epsilon", 1e-5f))},
                "LayerNormalization with Mean or InvStdDev output");
  v.expect_output_dims(x);
  return n;
}

// ---- linear algebra ----------------------------------------------------------------------------

NormalisedNode matmul(const NodeView& v) {
  auto a = v.float_input(0);
  auto b = v.float_input(1);
  if (a.empty() || b.empty()) refuse("MatMul of a scalar");
  // Numpy matmul: 1-D operands are promoted to matrices and the added dim removed afterwards.
  auto a2 = a.size() == 1 ? std::vector<int64_t>{1, a[0]} : a;
  auto b2 = b.size() == 1 ? std::vector<int64_t>{b[0], 1} : b;
  int64_t k_a = a2.back(), k_b = b2[b2.size() - 2];
  if (k_a != k_b) refuse("MatMul inner dims differ: " + dims_text(a) + " x " + dims_text(b));
  auto batch = broadcast_dims({a2.begin(), a2.end() - 2}, {b2.begin(), b2.end() - 2});
  if (a.size() != 1) batch.push_back(a2[a2.size() - 2]);
  if (b.size() != 1) batch.push_back(b2.back());
  auto n = make(v, "MatMul", {v.input(0), v.input(1)}, {int_attr("act", 0)});
  v.expect_output_dims(batch);
  return n;
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
  auto n = make(v, "Gemm", inputs,
                {int_attr("transA", trans_a ? 1 : 0), int_attr("transB", trans_b ? 1 : 0),
                 float_attr("alpha", v.float_attr("alpha", 1.0f)), float_attr("beta", v.float_attr("beta", 1.0f)),
                 int_attr("act", 0)});
  v.expect_output_dims({m, nn});
  return n;
}

// ---- sliding windows (Conv, pools) -------------------------------------------------------------

struct Window {
  std::vector<int64_t> kernel, strides, dilations, pads;  // pads: all begins, then all ends
  std::vector<int64_t> output;                            // spatial output dims
};

// Window attributes are bounded so the size arithmetic below cannot overflow.
constexpr int64_t kMaxWindowValue = int64_t{1} << 31;

std::vector<int64_t> window_list(const NodeView& v, const std::string& name, size_t n, int64_t fallback, int64_t min) {
  auto values = v.ints_attr(name, std::vector<int64_t>(n, fallback));
  if (values.size() != n)
    refuse("attribute " + name + " has " + std::to_string(values.size()) + " values, expected " + std::to_string(n));
  for (int64_t x : values)
    if (x < min || x >= kMaxWindowValue)
      refuse("attribute " + name + " " + dims_text(values) + " has a value outside [" + std::to_string(min) + ", 2^31)");
  return values;
}

// Resolves strides, dilations, auto_pad and pads into explicit values and the output size the way
// ONNX shape inference does, so the op matches the inferred output dims.
Window resolve_window(const NodeView& v, const std::vector<int64_t>& in, std::vector<int64_t> kernel,
                      bool has_dilations, bool ceil_mode) {
  size_t n = in.size();
  for (int64_t k : kernel)
    if (k >= kMaxWindowValue) refuse("kernel " + dims_text(kernel) + " is too large");
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

NormalisedNode conv(const NodeView& v) {
  auto x = window_input(v);
  auto w = v.float_input(1);
  if (w.size() != x.size()) refuse("weight dims " + dims_text(w) + " do not match input rank " + std::to_string(x.size()));
  int64_t group = v.int_attr("group", 1);
  if (group < 1 || x[1] != w[1] * group || w[0] % group != 0)
    refuse("group " + std::to_string(group) + " does not fit input " + dims_text(x) + " and weight " + dims_text(w));
  auto kernel = spatial(w);
  if (v.has_attr("kernel_shape") && v.ints_attr("kernel_shape", {}) != kernel)
    refuse("attribute kernel_shape " + dims_text(v.ints_attr("kernel_shape", {})) + " differs from weight dims " + dims_text(w));
  std::vector<std::string> inputs = {v.input(0), v.input(1), ""};
  if (v.has_input(2)) {
    if (v.float_input(2) != std::vector<int64_t>{w[0]}) refuse("bias dims " + dims_text(v.input_dims(2)) + ", expected [" + std::to_string(w[0]) + "]");
    inputs[2] = v.input(2);
  }
  auto win = resolve_window(v, spatial(x), kernel, true, false);
  auto n = make(v, "Conv", inputs,
                {ints_attr("kernel_shape", win.kernel), ints_attr("strides", win.strides), ints_attr("pads", win.pads),
                 ints_attr("dilations", win.dilations), int_attr("group", group), int_attr("act", 0)});
  std::vector<int64_t> out = {x[0], w[0]};
  out.insert(out.end(), win.output.begin(), win.output.end());
  v.expect_output_dims(out);
  return n;
}

NormalisedNode pool(const NodeView& v) {
  bool is_max = v.op() == "MaxPool";
  auto x = window_input(v);
  if (!v.has_attr("kernel_shape")) refuse("attribute kernel_shape is missing");
  auto kernel = window_list(v, "kernel_shape", x.size() - 2, 1, 1);
  if (!is_max && v.has_attr("dilations")) {
    auto d = v.ints_attr("dilations", {});
    if (std::any_of(d.begin(), d.end(), [](int64_t x) { return x != 1; })) refuse("AveragePool with dilations");
  }
  bool ceil_mode = v.opset() >= 10 && v.int_attr("ceil_mode", 0) != 0;
  auto win = resolve_window(v, spatial(x), kernel, is_max, ceil_mode);
  std::vector<ref::Attr> attrs = {ints_attr("kernel_shape", win.kernel), ints_attr("strides", win.strides),
                                  ints_attr("pads", win.pads)};
  if (is_max)
    attrs.push_back(ints_attr("dilations", win.dilations));
  else
    attrs.push_back(int_attr("count_include_pad", v.opset() >= 7 ? v.int_attr("count_include_pad", 0) : 0));
  auto n = make(v, v.op(), {v.input(0)}, attrs, "MaxPool with Indices output");
  std::vector<int64_t> out = {x[0], x[1]};
  out.insert(out.end(), win.output.begin(), win.output.end());
  v.expect_output_dims(out);
  return n;
}

// ---- reductions --------------------------------------------------------------------------------

// Sorted unique non-negative axes; refuses duplicates and out-of-range values.
std::vector<int64_t> normalise_axes(std::vector<int64_t> axes, int64_t rank) {
  for (auto& a : axes) a = normalise_axis(a, rank, "axis");
  std::sort(axes.begin(), axes.end());
  if (std::adjacent_find(axes.begin(), axes.end()) != axes.end()) refuse("repeated axis in " + dims_text(axes));
  return axes;
}

NormalisedNode reduce_over(const NodeView& v, const std::string& type, std::vector<int64_t> axes, bool keepdims) {
  auto x = v.float_input(0);
  std::vector<int64_t> out;
  for (size_t i = 0; i < x.size(); ++i) {
    bool reduced = std::binary_search(axes.begin(), axes.end(), static_cast<int64_t>(i));
    if (!reduced) out.push_back(x[i]);
    else if (keepdims) out.push_back(1);
  }
  auto n = make(v, type, {v.input(0)}, {ints_attr("axes", axes), int_attr("keepdims", keepdims ? 1 : 0)});
  v.expect_output_dims(out);
  return n;
}

NormalisedNode reduce(const NodeView& v) {
  auto rank = static_cast<int64_t>(v.float_input(0).size());
  bool axes_as_input = v.op() == "ReduceSum" ? v.opset() >= 13 : v.opset() >= 18;
  std::vector<int64_t> axes = axes_as_input ? (v.has_input(1) ? v.const_ints(1) : std::vector<int64_t>{})
                                            : v.ints_attr("axes", {});
  if (axes.empty() && v.int_attr("noop_with_empty_axes", 0) != 0) return copy_of_input0(v);
  if (axes.empty()) {
    axes.resize(static_cast<size_t>(rank));
    std::iota(axes.begin(), axes.end(), 0);
  }
  return reduce_over(v, v.op(), normalise_axes(axes, rank), v.int_attr("keepdims", 1) != 0);
}

NormalisedNode global_average_pool(const NodeView& v) {
  auto x = window_input(v);
  std::vector<int64_t> axes(x.size() - 2);
  std::iota(axes.begin(), axes.end(), 2);
  return reduce_over(v, "ReduceMean", axes, true);
}

// ---- shape and data movement -------------------------------------------------------------------

NormalisedNode reshape(const NodeView& v) {
  if (v.opset() >= 5) v.const_ints(1);  // the target shape is baked into the output dims
  return copy_of_input0(v);
}

NormalisedNode flatten(const NodeView& v) {
  auto x = v.float_input(0);
  auto rank = static_cast<int64_t>(x.size());
  int64_t axis = v.int_attr("axis", 1);
  if (axis < 0) axis += rank;
  if (axis < 0 || axis > rank) refuse("axis " + std::to_string(v.int_attr("axis", 1)) + " is out of range for rank " + std::to_string(rank));
  auto n = copy_of_input0(v);
  v.expect_output_dims({element_count({x.begin(), x.begin() + axis}), element_count({x.begin() + axis, x.end()})});
  return n;
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
  auto x = v.float_input(0);
  auto axes = normalise_axes(axes_input_or_attr(v, false), static_cast<int64_t>(x.size()));
  std::vector<int64_t> out;
  for (size_t i = 0; i < x.size(); ++i) {
    bool listed = std::binary_search(axes.begin(), axes.end(), static_cast<int64_t>(i));
    if (listed && x[i] != 1) refuse("cannot squeeze axis " + std::to_string(i) + " of size " + std::to_string(x[i]));
    if (!(listed || (axes.empty() && x[i] == 1))) out.push_back(x[i]);
  }
  auto n = copy_of_input0(v);
  v.expect_output_dims(out);
  return n;
}

NormalisedNode unsqueeze(const NodeView& v) {
  auto x = v.float_input(0);
  auto raw = axes_input_or_attr(v, true);
  auto axes = normalise_axes(raw, static_cast<int64_t>(x.size() + raw.size()));
  std::vector<int64_t> out;
  size_t next = 0;
  for (size_t i = 0; i < x.size() + axes.size(); ++i)
    out.push_back(std::binary_search(axes.begin(), axes.end(), static_cast<int64_t>(i)) ? 1 : x[next++]);
  auto n = copy_of_input0(v);
  v.expect_output_dims(out);
  return n;
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
  return copy_of_input0(v, "Dropout with mask output");
}

NormalisedNode transpose(const NodeView& v) {
  auto x = v.float_input(0);
  std::vector<int64_t> identity(x.size());
  std::iota(identity.begin(), identity.end(), 0);
  std::vector<int64_t> reversed(identity.rbegin(), identity.rend());
  auto perm = v.ints_attr("perm", reversed);
  auto sorted = perm;
  std::sort(sorted.begin(), sorted.end());
  if (sorted != identity) refuse("attribute perm " + dims_text(perm) + " is not a permutation of rank " + std::to_string(x.size()));
  std::vector<int64_t> out;
  for (int64_t p : perm) out.push_back(x[static_cast<size_t>(p)]);
  auto n = make(v, "Transpose", {v.input(0)}, {ints_attr("perm", perm)});
  v.expect_output_dims(out);
  return n;
}

NormalisedNode concat(const NodeView& v) {
  if (v.input_count() == 0) refuse("Concat without inputs");
  auto first = v.float_input(0);
  auto rank = static_cast<int64_t>(first.size());
  if (v.opset() >= 4 && !v.has_attr("axis")) refuse("attribute axis is missing");
  int64_t axis = normalise_axis(v.int_attr("axis", 1), rank, "axis");
  auto out = first;
  out[static_cast<size_t>(axis)] = 0;
  std::vector<std::string> inputs;
  for (size_t i = 0; i < v.input_count(); ++i) {
    auto d = v.float_input(i);
    auto masked = d;
    if (d.size() == first.size()) masked[static_cast<size_t>(axis)] = first[static_cast<size_t>(axis)];
    if (masked != first) refuse("input " + std::to_string(i) + " dims " + dims_text(d) + " do not match input 0 dims " + dims_text(first) + " outside axis " + std::to_string(axis));
    out[static_cast<size_t>(axis)] += d[static_cast<size_t>(axis)];
    inputs.push_back(v.input(i));
  }
  auto n = make(v, "Concat", inputs, {int_attr("axis", axis)});
  v.expect_output_dims(out);
  return n;
}

NormalisedNode slice(const NodeView& v) {
  auto x = v.float_input(0);
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
  auto n = make(v, "Slice", {v.input(0)}, {ints_attr("starts", all_starts), ints_attr("steps", all_steps)});
  v.expect_output_dims(out);
  return n;
}

NormalisedNode gather(const NodeView& v) {
  auto data = v.float_input(0);
  auto rank = static_cast<int64_t>(data.size());
  if (rank == 0) refuse("Gather from a scalar");
  int64_t axis = normalise_axis(v.int_attr("axis", 0), rank, "axis");
  int32_t type = v.input_elem_type(1);
  const Weight* constant = v.constant(1);
  if (type != onnx::TensorProto::INT64 && !(type == onnx::TensorProto::INT32 && constant))
    refuse("element type " + dtype_name(type) + " on input 1 '" + v.input(1) + "' (ref supports int64, or int32 constants)");
  auto indices = v.input_dims(1);
  if (constant) {
    int64_t d = data[static_cast<size_t>(axis)];
    for (int64_t i : v.const_ints(1))
      if (i < -d || i >= d) refuse("index " + std::to_string(i) + " is out of range for axis " + std::to_string(axis) + " of size " + std::to_string(d));
  }
  std::vector<int64_t> out(data.begin(), data.begin() + axis);
  out.insert(out.end(), indices.begin(), indices.end());
  out.insert(out.end(), data.begin() + axis + 1, data.end());
  auto n = make(v, "Gather", {v.input(0), v.input(1)}, {int_attr("axis", axis)});
  v.expect_output_dims(out);
  return n;
}

using Rule = NormalisedNode (*)(const NodeView&);

const std::map<std::string, Rule>& rules() {
  static const std::map<std::string, Rule> kRules = {
      {"Add", binary},          {"Sub", binary},
      {"Mul", binary},          {"Div", binary},
      {"Pow", binary},          {"Sqrt", unary},
      {"Exp", unary},           {"Erf", unary},
      {"Neg", unary},           {"Abs", unary},
      {"Relu", unary},          {"Sigmoid", unary},
      {"Tanh", unary},          {"HardSwish", unary},
      {"LeakyRelu", leaky_relu}, {"HardSigmoid", hard_sigmoid},
      {"Clip", clip},           {"Softmax", softmax},
      {"MatMul", matmul},       {"Gemm", gemm},
      {"Conv", conv},           {"BatchNormalization", batch_norm},
      {"MaxPool", pool},        {"AveragePool", pool},
      {"GlobalAveragePool", global_average_pool},
      {"ReduceMean", reduce},   {"ReduceSum", reduce},
      {"LayerNormalization", layer_norm},
      {"Transpose", transpose}, {"Reshape", reshape},
      {"Flatten", flatten},     {"Squeeze", squeeze},
      {"Unsqueeze", unsqueeze}, {"Concat", concat},
      {"Slice", slice},         {"Gather", gather},
      {"Identity", identity}, {"Dropout", dropout},
  };
  return kRules;
}

}  // namespace

std::vector<std::string> supported_op_types() {
  std::vector<std::string> ops;
  for (const auto& [op, rule] : rules()) ops.push_back(op);
  return ops;
}

NormalisedNode normalise(const Model& model, const onnx::NodeProto& node) {
  if (!node.domain().empty() && node.domain() != "ai.onnx") refuse("domain '" + node.domain() + "' is not supported");
  auto it = rules().find(node.op_type());
  if (it == rules().end()) refuse("unsupported op");
  NodeView view(model, node);
  if (view.opset() < 1) refuse("the model imports no default-domain opset");
  return it->second(view);
}

}  // namespace ctxgen::refc
