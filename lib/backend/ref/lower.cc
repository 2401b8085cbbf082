#include "lower.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <set>
#include <unordered_map>

#include "ctxgen/error.h"
#include "ctxgen/log.h"
#include "ctxgen/runtime.h"
#include "memory_plan.h"
#include "node_view.h"
#include "normalise.h"

namespace ctxgen::refc {
namespace {

using ref::ValueKind;

Error internal(const std::string& what) { return Error(ErrorCode::kInternal, "ref compiler: " + what); }

std::vector<float> floats_of(const Blob& blob) {
  std::vector<float> values(blob.size / sizeof(float));
  if (!values.empty()) std::memcpy(values.data(), blob.pin().data, values.size() * sizeof(float));  // data() may be null
  return values;
}

// Everything a transform of a weight depends on besides its bytes, as text: equal text and equal
// bytes make equal packed bytes.
std::string describe(const ref::Op& op, const std::vector<std::vector<int64_t>>& dims) {
  std::string text = op.type;
  for (const auto& d : dims) text += " " + dims_text(d);
  for (const auto& a : op.attrs) {
    text += " " + a.name + "=" + std::to_string(a.i) + "/" + std::to_string(a.f);
    for (int64_t v : a.ints) text += "," + std::to_string(v);
    for (float v : a.floats) text += "," + std::to_string(v);
  }
  return text;
}

Blob blob_of(const std::vector<float>& values) {
  std::vector<uint8_t> bytes(values.size() * sizeof(float));
  if (!bytes.empty()) std::memcpy(bytes.data(), values.data(), bytes.size());
  return Blob::owned(std::move(bytes));
}

// The program while it is being built and transformed. Weight values keep their bytes here until
// they are interned; values no op uses any more are dropped when the program is finished.
struct Draft {
  ref::Program program;
  std::vector<std::string> names;          // per value, for messages
  std::vector<std::optional<Blob>> bytes;  // per value, set for weights
  // --weightless: the model's external-data files, which the binary will refer to.
  std::set<const MappedFile*> source_files;
  const runtime::CpuTarget* cpu = nullptr;  // the level the weights are laid out for

  int32_t add(std::string name, ref::DType dtype, std::vector<int64_t> dims, ValueKind kind, uint64_t index = 0) {
    ref::Value v;
    v.dtype = dtype;
    v.dims = std::move(dims);
    v.kind = kind;
    v.index = index;
    program.values.push_back(std::move(v));
    names.push_back(std::move(name));
    bytes.emplace_back();
    return static_cast<int32_t>(program.values.size() - 1);
  }
  int32_t add_weight(std::string name, ref::DType dtype, std::vector<int64_t> dims, Blob blob) {
    int32_t id = add(std::move(name), dtype, std::move(dims), ValueKind::kWeight);
    bytes.back() = std::move(blob);
    return id;
  }
  ref::Value& value(int32_t id) { return program.values[static_cast<size_t>(id)]; }
  bool is_weight(int32_t id) const { return id >= 0 && bytes[static_cast<size_t>(id)].has_value(); }
  const Blob& weight(int32_t id) const { return *bytes[static_cast<size_t>(id)]; }
  // A weight the binary will refer to where the model stores it: it keeps that layout.
  bool in_source_data(int32_t id) const {
    return is_weight(id) && !weight(id).make && source_files.count(weight(id).file.get()) > 0;
  }
};

// ---- building from ONNX ------------------------------------------------------------------------

class Lowerer {
 public:
  Lowerer(const Model& model, const Partition& partition) : model_(model), partition_(partition) {
    for (size_t i = 0; i < partition.outputs.size(); ++i) output_position_[partition.outputs[i]] = i;
  }

  // The Casts normalise added around ops that compute half values in float32, by op index in the
  // draft run() returns.
  const std::set<size_t>& float_casts() const { return float_casts_; }

  Draft run() {
    for (size_t i = 0; i < partition_.inputs.size(); ++i) add_input(i);
    for (size_t index : partition_.nodes) {
      if (index >= static_cast<size_t>(model_.graph().node_size()))
        throw internal("partition node index " + std::to_string(index) + " is outside the graph");
      lower_node(model_.graph().node(static_cast<int>(index)), index);
    }
    for (size_t i = 0; i < partition_.outputs.size(); ++i) add_output(i);
    return std::move(draft_);
  }

 private:
  void add_input(size_t position) {
    const std::string& name = partition_.inputs[position];
    const ValueType* type = model_.type_of(name);
    if (!type || !type->is_static())
      throw internal("partition input '" + name + "' has no static type");
    int32_t id = draft_.add(name, dtype_of(type->elem_type, "partition input '" + name + "'"), *type->dims,
                            ValueKind::kInput, position);
    draft_.program.inputs.push_back(id);
    by_name_[name] = id;
  }

  static ref::DType dtype_of(int32_t onnx_type, const std::string& what) {
    try {
      return ref_dtype(onnx_type, what);
    } catch (const Refusal& r) {
      throw internal(r.reason);
    }
  }

  int32_t add_constant(const std::string& name, const Weight& w) {
    ref::Value v;
    try {
      v = constant_value(w.data, "constant '" + name + "'");
    } catch (const Refusal& r) {
      throw internal(r.reason);
    }
    return draft_.add_weight(name, v.dtype, v.dims, w.data.blob());
  }

  int32_t read(const std::string& name) {
    if (auto it = by_name_.find(name); it != by_name_.end()) return it->second;
    if (const Weight* w = model_.constant(name)) return by_name_[name] = add_constant(name, *w);
    throw internal("value '" + name + "' is read before any partition node produces it, and is neither a partition input nor a constant");
  }

  int32_t write(const std::string& name, const ref::Value& type) {
    if (by_name_.count(name)) throw internal("value '" + name + "' is produced twice");
    auto out = output_position_.find(name);
    int32_t id = out == output_position_.end()
                     ? draft_.add(name, type.dtype, type.dims, ValueKind::kArena)
                     : draft_.add(name, type.dtype, type.dims, ValueKind::kOutput, out->second);
    by_name_[name] = id;
    return id;
  }

  void lower_node(const onnx::NodeProto& node, size_t index) {
    std::vector<NormalisedNode> parts;
    try {
      parts = normalise_all(model_, node);
    } catch (const Refusal& r) {
      throw internal("node " + describe_node(node, index) + " is not supported by ref: " + r.reason);
    }
    for (auto& n : parts) {
      ref::Op op;
      op.type = n.type;
      op.attrs = std::move(n.attrs);
      for (const auto& in : n.inputs) op.inputs.push_back(in.empty() ? -1 : read(in));
      op.outputs.push_back(write(n.output, n.output_type));
      if (n.computes_in_float) float_casts_.insert(draft_.program.ops.size());
      draft_.program.ops.push_back(std::move(op));
    }
  }

  // An output no partition node produces (a constant or a partition input passed through) gets a
  // copy, because program outputs are buffers the caller owns.
  void add_output(size_t position) {
    const std::string& name = partition_.outputs[position];
    int32_t source = read(name);
    if (draft_.value(source).kind != ValueKind::kOutput) {
      ref::Value src = draft_.value(source);  // a copy: add() may move the values
      int32_t out = draft_.add(name, src.dtype, src.dims, ValueKind::kOutput, position);
      ref::Op copy;
      copy.type = "Reshape";
      copy.attrs = {ints_attr("shape", src.dims)};
      copy.inputs = {source};
      copy.outputs = {out};
      draft_.program.ops.push_back(std::move(copy));
      source = out;
    }
    draft_.program.outputs.push_back(source);
  }

  const Model& model_;
  const Partition& partition_;
  std::unordered_map<std::string, size_t> output_position_;
  std::unordered_map<std::string, int32_t> by_name_;
  Draft draft_;
  std::set<size_t> float_casts_;
};

// ---- graph passes ------------------------------------------------------------------------------

std::vector<int32_t> producers(const Draft& d) {
  std::vector<int32_t> producer(d.program.values.size(), -1);
  for (size_t i = 0; i < d.program.ops.size(); ++i)
    for (int32_t v : d.program.ops[i].outputs) producer[static_cast<size_t>(v)] = static_cast<int32_t>(i);
  return producer;
}

std::vector<std::vector<size_t>> readers(const Draft& d) {
  std::vector<std::vector<size_t>> reads(d.program.values.size());
  for (size_t i = 0; i < d.program.ops.size(); ++i)
    for (int32_t v : d.program.ops[i].inputs) {
      if (v < 0) continue;
      auto& r = reads[static_cast<size_t>(v)];
      if (r.empty() || r.back() != i) r.push_back(i);
    }
  return reads;
}

// May the op producing `v` absorb op `reader`? Only when nothing else sees `v`: no other op reads
// it and it is not a partition output.
bool only_read_by(Draft& d, const std::vector<std::vector<size_t>>& reads, int32_t v, size_t reader) {
  return d.value(v).kind == ValueKind::kArena && reads[static_cast<size_t>(v)] == std::vector<size_t>{reader};
}

// Values the runtime computes once a session because they are computed from weights alone
// (runtime/execute.cc): weights the model stores at another precision, dequantized or widened to
// float32, which the folder keeps as stored (evaluate.cc).
std::vector<bool> computed_from_weights(const Draft& d) {
  std::vector<bool> constant(d.program.values.size(), false);
  for (size_t v = 0; v < constant.size(); ++v) constant[v] = d.is_weight(static_cast<int32_t>(v));
  for (const ref::Op& op : d.program.ops) {
    const bool all = !op.inputs.empty() && std::all_of(op.inputs.begin(), op.inputs.end(), [&](int32_t v) {
      return v < 0 || constant[static_cast<size_t>(v)];
    });
    for (int32_t v : op.outputs) constant[static_cast<size_t>(v)] = all && d.program.values[static_cast<size_t>(v)].kind == ValueKind::kArena;
  }
  return constant;
}

void set_attr(ref::Op& op, ref::Attr attr) {
  for (auto& a : op.attrs)
    if (a.name == attr.name) {
      a = std::move(attr);
      return;
    }
  op.attrs.push_back(std::move(attr));
}

void drop_ops(Draft& d, const std::vector<bool>& removed) {
  std::vector<ref::Op> kept;
  for (size_t i = 0; i < d.program.ops.size(); ++i)
    if (!removed[i]) kept.push_back(std::move(d.program.ops[i]));
  d.program.ops = std::move(kept);
}

// An op that gives its input back unchanged (a Reshape to the same dims: what Identity, Dropout, a
// Concat of one input and a Pad of zero pads become, as torch exports DenseNet's transitions) is
// dropped and its readers read its input: it would cost a copy, or, between channels-last images,
// two transposes. One writing a partition output stays.
void drop_identities(Draft& d) {
  std::vector<int32_t> same(d.program.values.size());
  std::iota(same.begin(), same.end(), 0);
  std::vector<bool> removed(d.program.ops.size(), false);
  for (size_t i = 0; i < d.program.ops.size(); ++i) {
    ref::Op& op = d.program.ops[i];
    for (int32_t& v : op.inputs)
      if (v >= 0) v = same[static_cast<size_t>(v)];
    const int32_t y = op.outputs[0];
    if (op.type != "Reshape" || d.value(y).kind != ValueKind::kArena || d.value(op.inputs[0]).dims != d.value(y).dims) continue;
    same[static_cast<size_t>(y)] = op.inputs[0];
    removed[i] = true;
  }
  drop_ops(d, removed);
}

// Folds ops into the op producing one of their inputs. For each op and each input `y` only it
// reads, `absorb(op, y, target)` (target: the op writing `y`) says whether target took op in; the
// target then writes op's output, and op goes.
template <typename Absorb>
void absorb_into_producers(Draft& d, Absorb absorb) {
  auto producer = producers(d);
  const auto reads = readers(d);
  auto& ops = d.program.ops;
  std::vector<bool> removed(ops.size(), false);
  for (size_t i = 0; i < ops.size(); ++i)
    for (const int32_t y : ops[i].inputs) {
      if (y < 0 || producer[static_cast<size_t>(y)] < 0 || !only_read_by(d, reads, y, i)) continue;
      const int32_t p = producer[static_cast<size_t>(y)];
      ref::Op& target = ops[static_cast<size_t>(p)];
      if (!absorb(ops[i], y, target)) continue;
      target.outputs[0] = ops[i].outputs[0];
      producer[static_cast<size_t>(ops[i].outputs[0])] = p;
      removed[i] = true;
      break;
    }
  drop_ops(d, removed);
}

// What a per-output-channel affine after a Conv does to it: y' = y * scale + shift per channel m.
struct ChannelAffine {
  std::vector<double> scale, shift;
};

// W'[m] = W[m] * scale[m], B'[m] = B[m] * scale[m] + shift[m], computed in double so folding adds
// no error beyond the final rounding.
void fold_into_conv(Draft& d, ref::Op& conv, const ChannelAffine& a, const std::string& name) {
  auto w = floats_of(d.weight(conv.inputs[1]));
  const size_t channels = a.scale.size();
  std::vector<float> bias = conv.inputs[2] >= 0 ? floats_of(d.weight(conv.inputs[2])) : std::vector<float>(channels, 0.0f);
  size_t per_channel = w.size() / channels;
  for (size_t m = 0; m < channels; ++m) {
    for (size_t k = 0; k < per_channel; ++k) w[m * per_channel + k] = static_cast<float>(w[m * per_channel + k] * a.scale[m]);
    bias[m] = static_cast<float>(bias[m] * a.scale[m] + a.shift[m]);
  }
  const auto w_dims = d.value(conv.inputs[1]).dims;
  conv.inputs[1] = d.add_weight(name + "/folded_weight", ref::DType::kFloat32, w_dims, blob_of(w));
  conv.inputs[2] = d.add_weight(name + "/folded_bias", ref::DType::kFloat32, {static_cast<int64_t>(channels)}, blob_of(bias));
}

// BatchNormalization: scale / sqrt(var + eps), and beta - mean times that.
ChannelAffine batch_norm_affine(const Draft& d, const ref::Op& bn) {
  const auto scale = floats_of(d.weight(bn.inputs[1])), beta = floats_of(d.weight(bn.inputs[2]));
  const auto mean = floats_of(d.weight(bn.inputs[3])), var = floats_of(d.weight(bn.inputs[4]));
  const double eps = bn.get_float("epsilon", 1e-5f);
  ChannelAffine a;
  for (size_t m = 0; m < scale.size(); ++m) {
    a.scale.push_back(scale[m] / std::sqrt(static_cast<double>(var[m]) + eps));
    a.shift.push_back(beta[m] - mean[m] * a.scale.back());
  }
  return a;
}

// A float32 weight that broadcasts along the channels of a Conv output `y` alone (a scalar,
// [M, 1, 1], [1, M, 1, 1], ...: broadcast from the right, so [M] would run along the last axis),
// as its M values (one repeated for a scalar); nullopt otherwise.
std::optional<std::vector<double>> per_channel(Draft& d, int32_t v, const std::vector<int64_t>& y) {
  if (!d.is_weight(v) || d.value(v).dtype != ref::DType::kFloat32) return std::nullopt;
  const auto& c = d.value(v).dims;
  if (c.size() > y.size() || y.size() < 2) return std::nullopt;
  const size_t offset = y.size() - c.size();
  int64_t count = 1;
  for (size_t i = 0; i < c.size(); ++i) {
    if (c[i] == 1) continue;
    if (offset + i != 1 || c[i] != y[1]) return std::nullopt;
    count = c[i];
  }
  const auto values = floats_of(d.weight(v));
  std::vector<double> out(static_cast<size_t>(y[1]));
  for (size_t m = 0; m < out.size(); ++m) out[m] = values[count == 1 ? 0 : m];
  return out;
}

// A Mul or Add of a Conv output and a per-channel constant, as exports write a BatchNorm they
// decomposed or a learnable affine (PaddleOCR v4: x * scale + bias after each Conv).
std::optional<ChannelAffine> arithmetic_affine(Draft& d, const ref::Op& op, int32_t y) {
  if ((op.type != "Mul" && op.type != "Add") || op.inputs.size() != 2) return std::nullopt;
  const auto& dims = d.value(y).dims;
  if (d.value(op.outputs[0]).dims != dims) return std::nullopt;
  const int32_t other = op.inputs[0] == y ? op.inputs[1] : op.inputs[0];
  auto values = per_channel(d, other, dims);
  if (!values) return std::nullopt;
  ChannelAffine a;
  if (op.type == "Mul") {
    a.scale = std::move(*values);
    a.shift.assign(a.scale.size(), 0.0);
  } else {
    a.shift = std::move(*values);
    a.scale.assign(a.shift.size(), 1.0);
  }
  return a;
}

// A per-channel affine after a Conv with constant weights (a BatchNormalization, or a Mul or Add by
// a per-channel constant) and read by nothing else is folded into the Conv's weight and bias, one
// after another along a chain: the Conv then writes the affine's output.
void fold_affines_into_convs(Draft& d) {
  absorb_into_producers(d, [&](const ref::Op& op, int32_t y, ref::Op& conv) {
    const bool bn = op.type == "BatchNormalization";
    if ((!bn && op.type != "Mul" && op.type != "Add") || (bn && y != op.inputs[0]) || conv.type != "Conv") return false;
    if (!d.is_weight(conv.inputs[1]) || d.value(conv.inputs[1]).dtype != ref::DType::kFloat32 ||
        (conv.inputs[2] >= 0 && !d.is_weight(conv.inputs[2])))
      return false;
    std::optional<ChannelAffine> affine;
    if (!bn)
      affine = arithmetic_affine(d, op, y);
    else if (std::all_of(op.inputs.begin() + 1, op.inputs.end(), [&](int32_t v) { return d.is_weight(v); }))
      affine = batch_norm_affine(d, op);
    if (!affine) return false;
    const std::string name = d.names[static_cast<size_t>(op.outputs[0])];
    log().debug("ref: folded {} '{}' into the Conv producing '{}'", op.type, name, d.names[static_cast<size_t>(y)]);
    fold_into_conv(d, conv, *affine, name);
    return true;
  });
}

// A float32 value cast to float16 (or bfloat16) and straight back by the Casts normalise added
// (`float_casts`, op indexes) is read as it was: ref computes the ops of a half-precision model
// that do not take half values in float32 (normalise.cc), and keeps float32 between such ops,
// rounding to 16 bits only where an op moves half values, a half value leaves the partition or the
// model casts itself, as ONNX Runtime's CPU EP does.
void skip_half_round_trips(Draft& d, const std::set<size_t>& float_casts) {
  const auto producer = producers(d);
  auto& ops = d.program.ops;
  std::vector<bool> removed(ops.size(), false);
  std::unordered_map<int32_t, int32_t> same;  // a cast back's float32 output -> the float32 value it equals
  const auto half = [&](int32_t v) {
    const ref::DType t = d.value(v).dtype;
    return (t == ref::DType::kFloat16 || t == ref::DType::kBFloat16) && d.value(v).kind == ValueKind::kArena;
  };
  for (size_t i = 0; i < ops.size(); ++i) {
    ref::Op& back = ops[i];
    if (!float_casts.count(i) || d.value(back.outputs[0]).dtype != ref::DType::kFloat32 || !half(back.inputs[0])) continue;
    const int32_t p = producer[static_cast<size_t>(back.inputs[0])];
    if (p < 0 || !float_casts.count(static_cast<size_t>(p))) continue;
    int32_t wide = ops[static_cast<size_t>(p)].inputs[0];
    if (d.value(wide).dtype != ref::DType::kFloat32) continue;
    if (auto it = same.find(wide); it != same.end()) wide = it->second;
    if (d.value(back.outputs[0]).kind == ValueKind::kArena) {
      same[back.outputs[0]] = wide;
      removed[i] = true;
    } else {  // a partition output: a copy of the float32 value
      back.type = "Reshape";
      back.attrs = {ints_attr("shape", d.value(wide).dims)};
      back.inputs = {wide};
    }
  }
  for (auto& op : ops)
    for (auto& v : op.inputs)
      if (auto it = same.find(v); it != same.end()) v = it->second;
  drop_ops(d, removed);
  // The casts to 16 bits nothing reads any more.
  const auto reads = readers(d);
  removed.assign(ops.size(), false);
  for (size_t i = 0; i < ops.size(); ++i)
    removed[i] = ops[i].type == "Cast" && half(ops[i].outputs[0]) && reads[static_cast<size_t>(ops[i].outputs[0])].empty();
  drop_ops(d, removed);
}

// The value of a zero point (or 0 when absent): one uint8 or int8 weight, else nullopt.
std::optional<int64_t> zero_point_of(const Draft& d, int32_t v) {
  if (v < 0) return 0;
  const ref::Value& value = d.program.values[static_cast<size_t>(v)];
  if (!d.is_weight(v) || value.element_count() != 1) return std::nullopt;
  const uint8_t byte = d.weight(v).pin().data[0];
  if (value.dtype == ref::DType::kUInt8) return byte;
  if (value.dtype == ref::DType::kInt8) return static_cast<int8_t>(byte);
  return std::nullopt;
}

// The values of a float32 weight, or nullopt.
std::optional<std::vector<float>> weight_floats(const Draft& d, int32_t v) {
  if (v < 0 || !d.is_weight(v) || d.program.values[static_cast<size_t>(v)].dtype != ref::DType::kFloat32) return std::nullopt;
  return floats_of(d.weight(v));
}

// Whether an int8 weight's zero points (absent, or a weight of zeros) are all 0.
bool zero_points_are_zero(const Draft& d, int32_t v) {
  if (v < 0) return true;
  if (!d.is_weight(v)) return false;
  const PinnedBytes bytes = d.weight(v).pin();
  return std::all_of(bytes.data, bytes.data + bytes.size, [](uint8_t b) { return b == 0; });
}

// Drops the ops of these types whose outputs nothing reads any more, and then those feeding them.
void drop_unread(Draft& d, const std::set<std::string>& types) {
  auto& ops = d.program.ops;
  for (bool dropped = true; dropped;) {
    const auto reads = readers(d);
    std::vector<bool> removed(ops.size(), false);
    dropped = false;
    for (size_t i = 0; i < ops.size(); ++i) {
      const int32_t out = ops[i].outputs[0];
      removed[i] = types.count(ops[i].type) && d.value(out).kind == ValueKind::kArena && reads[static_cast<size_t>(out)].empty();
      dropped = dropped || removed[i];
    }
    drop_ops(d, removed);
  }
}

// Whether a DequantizeLinear and a QuantizeLinear use one scale and zero point for the whole
// tensor, the same, for the same integer type: then quantizing what an op that only moves or
// selects values made of the dequantized values gives the integers that op makes of them. The
// scale must be a positive normal float below 2^100: a negative one reverses the order a MaxPool
// reads, and a zero, subnormal or huge one does not give the integers back.
bool same_quantization(const Draft& d, const ref::Op& dq, const ref::Op& q) {
  const auto scalar_weight = [&](const ref::Op& op, size_t i) -> std::optional<std::vector<uint8_t>> {
    if (op.inputs.size() <= i || op.inputs[i] < 0) return std::vector<uint8_t>{};  // absent: 0
    const int32_t v = op.inputs[i];
    if (!d.is_weight(v) || d.program.values[static_cast<size_t>(v)].element_count() != 1) return std::nullopt;
    const PinnedBytes b = d.weight(v).pin();
    return std::vector<uint8_t>(b.data, b.data + b.size);
  };
  const auto s1 = scalar_weight(dq, 1), s2 = scalar_weight(q, 1), z1 = scalar_weight(dq, 2), z2 = scalar_weight(q, 2);
  if (!s1 || !s2 || !z1 || !z2 || *s1 != *s2 || d.program.values[static_cast<size_t>(dq.inputs[1])].dtype != ref::DType::kFloat32)
    return false;
  float scale = 0;
  std::memcpy(&scale, s1->data(), sizeof scale);
  const auto is_zero = [](const std::vector<uint8_t>& z) { return std::all_of(z.begin(), z.end(), [](uint8_t b) { return b == 0; }); };
  return scale >= std::numeric_limits<float>::min() && scale < 0x1p100f && (*z1 == *z2 || (is_zero(*z1) && is_zero(*z2))) &&
         d.program.values[static_cast<size_t>(dq.inputs[0])].dtype == d.program.values[static_cast<size_t>(q.outputs[0])].dtype;
}

// A DequantizeLinear -> ops -> QuantizeLinear chain of ops that only move or select values (a
// MaxPool, whose maximum is the quantized maximum, Reshape, Transpose, Slice, Gather, Expand, Tile),
// with one scale and zero point at both ends, runs those ops on the integers: what ONNX Runtime's
// QDQ transformer does with these units, and exact (a dequantized value quantized with its own
// scale gives it back). A MaxPool qualifies only if no window lies wholly in its padding (which
// gives 0, not the zero point), that is, every begin pad is below its kernel. So does a Resize of
// 8-bit values, as ONNX Runtime's CPU EP runs it (not exact: it truncates its blend where the unit
// rounds, so an output may be a step lower).
void move_quantized_values(Draft& d) {
  static const std::set<std::string> kMoving = {"MaxPool", "Reshape", "Transpose", "Slice", "Gather", "Expand", "Tile", "Resize"};
  const auto reads = readers(d);
  auto& ops = d.program.ops;
  const auto moves = [&](const ref::Op& op) {
    if (!kMoving.count(op.type) || d.value(op.outputs[0]).kind != ValueKind::kArena) return false;
    if (op.type != "MaxPool") return true;
    const auto kernel = op.get_ints("kernel_shape"), pads = op.get_ints("pads");
    for (size_t a = 0; a < kernel.size(); ++a)
      if (pads[a] >= kernel[a]) return false;
    return true;
  };
  const auto only_reader = [&](int32_t v) -> ref::Op* {
    const auto& r = reads[static_cast<size_t>(v)];
    return r.size() == 1 && ops[r[0]].inputs[0] == v &&
                   std::count(ops[r[0]].inputs.begin(), ops[r[0]].inputs.end(), v) == 1
               ? &ops[r[0]]
               : nullptr;
  };
  std::vector<bool> removed(ops.size(), false);
  for (const ref::Op& dq : ops) {
    if (dq.type != "DequantizeLinear") continue;
    // Each chain from the dequantized value (a skip connection reads it elsewhere too).
    for (size_t first : reads[static_cast<size_t>(dq.outputs[0])]) {
      std::vector<ref::Op*> chain;
      ref::Op* next = ops[first].inputs[0] == dq.outputs[0] ? &ops[first] : nullptr;
      for (; next && moves(*next); next = only_reader(next->outputs[0])) chain.push_back(next);
      if (chain.empty() || !next || next->type != "QuantizeLinear" || !same_quantization(d, dq, *next)) continue;
      const ref::DType integer = d.value(dq.inputs[0]).dtype;
      const bool resizes = std::any_of(chain.begin(), chain.end(), [](const ref::Op* op) { return op->type == "Resize"; });
      if (resizes && integer != ref::DType::kUInt8 && integer != ref::DType::kInt8) continue;  // as ONNX Runtime
      log().debug("ref: {} ops after '{}' move quantized values", chain.size(), d.names[static_cast<size_t>(dq.outputs[0])]);
      chain.front()->inputs[0] = dq.inputs[0];
      for (ref::Op* op : chain) d.value(op->outputs[0]).dtype = integer;
      chain.back()->outputs = next->outputs;
      removed[static_cast<size_t>(next - ops.data())] = true;
    }
  }
  drop_ops(d, removed);
  drop_unread(d, {"DequantizeLinear"});
}

// A Concat of dequantized values whose result is quantized with one scale concatenates integers:
// an input quantized as the result is taken as it is (exactly: see move_quantized_values), any
// other is requantized on its own (its DequantizeLinear, then the result's QuantizeLinear: the
// unit's own arithmetic, element by element), so only the inputs that need it pay for it. What
// ONNX Runtime's QLinearConcat computes.
void concat_quantized(Draft& d) {
  const auto producer = producers(d);
  const auto reads = readers(d);
  std::vector<ref::Op> ops;
  std::vector<bool> dropped(d.program.ops.size(), false);
  for (size_t i = 0; i < d.program.ops.size(); ++i) {
    if (dropped[i]) continue;
    ref::Op op = d.program.ops[i];
    const int32_t y = op.outputs[0];
    const auto& y_reads = reads[static_cast<size_t>(y)];
    const ref::Op* q = y_reads.size() == 1 ? &d.program.ops[y_reads[0]] : nullptr;
    const auto dequantized = [&](int32_t v) -> const ref::Op* {
      const int32_t p = producer[static_cast<size_t>(v)];
      return p >= 0 && d.program.ops[static_cast<size_t>(p)].type == "DequantizeLinear" ? &d.program.ops[static_cast<size_t>(p)] : nullptr;
    };
    const bool unit = op.type == "Concat" && d.value(y).kind == ValueKind::kArena && q && q->type == "QuantizeLinear" &&
                      q->inputs[0] == y && d.value(q->inputs[1]).element_count() == 1 &&
                      std::all_of(op.inputs.begin(), op.inputs.end(), [&](int32_t v) { return dequantized(v) != nullptr; });
    if (!unit) {
      ops.push_back(std::move(op));
      continue;
    }
    for (int32_t& v : op.inputs) {
      const ref::Op& dq = *dequantized(v);
      if (same_quantization(d, dq, *q)) {
        v = dq.inputs[0];
        continue;
      }
      ref::Op requantize = *q;
      requantize.inputs[0] = v;
      requantize.outputs = {d.add(d.names[static_cast<size_t>(v)] + "/requantized", d.value(q->outputs[0]).dtype, d.value(v).dims,
                                  ValueKind::kArena)};
      v = requantize.outputs[0];
      ops.push_back(std::move(requantize));
    }
    op.outputs = q->outputs;
    dropped[y_reads[0]] = true;
    log().debug("ref: Concat '{}' concatenates quantized values", d.names[static_cast<size_t>(op.outputs[0])]);
    ops.push_back(std::move(op));
  }
  d.program.ops = std::move(ops);
  drop_unread(d, {"DequantizeLinear"});
}

// A Pad of zeros around an image's spatial axes read by a Conv is the Conv's own padding (what
// tf2onnx writes for TensorFlow's asymmetric SAME padding before a strided convolution): the
// Conv reads the unpadded image with its pads widened, and the padded copy is never made.
void fold_pads_into_convs(Draft& d) {
  const auto producer = producers(d);
  for (ref::Op& conv : d.program.ops) {
    if (conv.type != "Conv" || d.value(conv.inputs[0]).dtype != ref::DType::kFloat32 || d.value(conv.inputs[0]).dims.size() < 3)
      continue;
    const int32_t p = producer[static_cast<size_t>(conv.inputs[0])];
    if (p < 0) continue;
    const ref::Op& pad = d.program.ops[static_cast<size_t>(p)];
    const std::vector<int64_t> added = pad.get_ints("pads");
    const size_t rank = d.value(conv.inputs[0]).dims.size(), spatial = rank - 2;
    std::vector<int64_t> pads = conv.get_ints("pads");
    if (pad.type != "Pad" || pad.get_int("mode", 0) != 0 || pad.get_float("value", 1.0f) != 0.0f || added.size() != 2 * rank ||
        pads.size() != 2 * spatial || added[0] != 0 || added[1] != 0 || added[rank] != 0 || added[rank + 1] != 0 ||
        std::any_of(added.begin(), added.end(), [](int64_t a) { return a < 0; }))
      continue;
    for (size_t a = 0; a < spatial; ++a) {
      pads[a] += added[2 + a];
      pads[spatial + a] += added[rank + 2 + a];
    }
    log().debug("ref: the Pad writing '{}' folded into its Conv", d.names[static_cast<size_t>(conv.inputs[0])]);
    set_attr(conv, ints_attr("pads", pads));
    conv.inputs[0] = pad.inputs[0];
  }
  drop_unread(d, {"Pad"});
}

// A QuantizeLinear of a DequantizeLinear's result, both 8-bit with one constant scale and zero
// point, becomes one Requantize: the pair's arithmetic looked up in a table of the 256 values the
// integer can take, as ONNX Runtime's QLinearConcat requantizes its inputs. Such pairs are what
// concat_quantized leaves for an input quantized otherwise, and what a QDQ model holds between two
// units of different scales that move_quantized_values could not join.
void requantize_pairs(Draft& d) {
  const auto producer = producers(d);
  const auto is_8bit = [&](int32_t v) {
    return d.value(v).dtype == ref::DType::kUInt8 || d.value(v).dtype == ref::DType::kInt8;
  };
  const auto optional_input = [](const ref::Op& op, size_t i) { return op.inputs.size() > i ? op.inputs[i] : -1; };
  for (ref::Op& q : d.program.ops) {
    const int32_t p = q.type == "QuantizeLinear" && q.get_int("block_size", 0) == 0 ? producer[static_cast<size_t>(q.inputs[0])] : -1;
    if (p < 0) continue;
    const ref::Op& dq = d.program.ops[static_cast<size_t>(p)];
    if (dq.type != "DequantizeLinear" || dq.get_int("block_size", 0) != 0 || dq.get_int("bits", 8) != 8 ||
        !is_8bit(dq.inputs[0]) || !is_8bit(q.outputs[0]))
      continue;
    const auto xs = weight_floats(d, dq.inputs[1]), ys = weight_floats(d, q.inputs[1]);
    const auto xz = zero_point_of(d, optional_input(dq, 2)), yz = zero_point_of(d, optional_input(q, 2));
    if (!xs || !ys || !xz || !yz || xs->size() != 1 || ys->size() != 1) continue;
    ref::Op requantize;
    requantize.type = "Requantize";
    requantize.attrs = {float_attr("x_scale", (*xs)[0]), int_attr("x_zero_point", *xz), float_attr("y_scale", (*ys)[0]),
                        int_attr("y_zero_point", *yz), int_attr("dtype", static_cast<int64_t>(d.value(q.outputs[0]).dtype))};
    requantize.inputs = {dq.inputs[0]};
    requantize.outputs = q.outputs;
    log().debug("ref: '{}' requantized by a table", d.names[static_cast<size_t>(q.outputs[0])]);
    q = std::move(requantize);
  }
  drop_unread(d, {"DequantizeLinear"});
}

// 8-bit Conv units become one QLinearConv on oneDNN's int8 convolution, as ONNX Runtime fuses
// them on x86 (integer sums, one requantization; docs/ops.md, "Quantized models"): a 2-D Conv
// reading a uint8 image through a DequantizeLinear with one scale, an int8 weight through one with
// one scale or one per output channel and zero points of 0, and an int32 bias through one whose
// scale is x_scale * w_scale (a weight, or the Mul a QLinearConv becomes), its result read only by
// a QuantizeLinear to uint8 with one scale. The integers stay in the .bin as they are. Only where
// oneDNN's int8 sums are exact (the compiling CPU's level, which the binary records, has VNNI).
void fuse_quantized_convs(Draft& d) {
  if (!d.cpu->exact_int8()) return;
  const auto producer = producers(d);
  const auto reads = readers(d);
  auto& ops = d.program.ops;
  const auto made_by = [&](int32_t v, const char* type) -> const ref::Op* {
    const int32_t p = v < 0 ? -1 : producer[static_cast<size_t>(v)];
    return p >= 0 && ops[static_cast<size_t>(p)].type == type && ops[static_cast<size_t>(p)].get_int("block_size", 0) == 0
               ? &ops[static_cast<size_t>(p)]
               : nullptr;
  };
  const auto unsigned_8bit = [&](int32_t v) { return d.value(v).dtype == ref::DType::kUInt8; };
  std::vector<bool> removed(ops.size(), false);
  for (size_t i = 0; i < ops.size(); ++i) {
    const ref::Op& conv = ops[i];
    if (conv.type != "Conv" || conv.get_int("act", 0) != 0 || d.value(conv.inputs[0]).dims.size() != 4) continue;
    const int32_t y = conv.outputs[0];
    if (d.value(y).kind != ValueKind::kArena || reads[static_cast<size_t>(y)].size() != 1) continue;
    const size_t q_at = reads[static_cast<size_t>(y)][0];
    const ref::Op& q = ops[q_at];
    const ref::Op* dx = made_by(conv.inputs[0], "DequantizeLinear");
    const ref::Op* dw = made_by(conv.inputs[1], "DequantizeLinear");
    if (q.type != "QuantizeLinear" || q.get_int("block_size", 0) != 0 || !dx || !dw || !unsigned_8bit(dx->inputs[0]) ||
        !unsigned_8bit(q.outputs[0]) || !d.is_weight(dw->inputs[0]) || d.value(dw->inputs[0]).dtype != ref::DType::kInt8)
      continue;
    const auto xs = weight_floats(d, dx->inputs[1]), ws = weight_floats(d, dw->inputs[1]), ys = weight_floats(d, q.inputs[1]);
    const auto xz = zero_point_of(d, dx->inputs.size() > 2 ? dx->inputs[2] : -1);
    const auto yz = zero_point_of(d, q.inputs.size() > 2 ? q.inputs[2] : -1);
    const int64_t m = d.value(conv.inputs[1]).dims[0];
    if (!xs || !ws || !ys || !xz || !yz || xs->size() != 1 || ys->size() != 1 ||
        (ws->size() != 1 && (static_cast<int64_t>(ws->size()) != m || dw->get_int("axis", 0) != 0)) ||
        !zero_points_are_zero(d, dw->inputs.size() > 2 ? dw->inputs[2] : -1))
      continue;
    std::vector<float> scales;  // as ONNX Runtime's QLinearConv computes them
    for (float w : *ws) scales.push_back((*xs)[0] * w / (*ys)[0]);
    if (!std::all_of(scales.begin(), scales.end(), [](float f) { return std::isfinite(f) && f > 0; })) continue;
    std::vector<int32_t> inputs = {dx->inputs[0], dw->inputs[0]};
    if (conv.inputs.size() > 2 && conv.inputs[2] >= 0) {
      const ref::Op* db = made_by(conv.inputs[2], "DequantizeLinear");
      if (!db || !d.is_weight(db->inputs[0]) || d.value(db->inputs[0]).dtype != ref::DType::kInt32 ||
          !zero_points_are_zero(d, db->inputs.size() > 2 ? db->inputs[2] : -1))
        continue;
      // The bias's scale: x_scale * w_scale, stored or made by a Mul of the two.
      bool matches = false;
      if (const auto bs = weight_floats(d, db->inputs[1])) {
        matches = bs->size() == ws->size() || bs->size() == 1;
        for (size_t k = 0; matches && k < ws->size(); ++k) matches = (*bs)[bs->size() == 1 ? 0 : k] == (*xs)[0] * (*ws)[k];
      } else if (const ref::Op* mul = made_by(db->inputs[1], "Mul")) {
        matches = mul->inputs == std::vector<int32_t>{dx->inputs[1], dw->inputs[1]};
      }
      if (!matches) continue;
      inputs.push_back(db->inputs[0]);
    }
    ref::Op fused;
    fused.type = "QLinearConv";
    for (const char* name : {"kernel_shape", "strides", "pads", "dilations", "group"})
      if (const ref::Attr* a = conv.attr(name)) fused.attrs.push_back(*a);
    fused.attrs.push_back(floats_attr("scales", scales));
    fused.attrs.push_back(int_attr("x_zero_point", *xz));
    fused.attrs.push_back(int_attr("y_zero_point", *yz));
    fused.attrs.push_back(int_attr("dtype", static_cast<int64_t>(d.value(q.outputs[0]).dtype)));
    fused.inputs = std::move(inputs);
    fused.outputs = {q.outputs[0]};
    log().debug("ref: fused the 8-bit Conv unit writing '{}' into a QLinearConv", d.names[static_cast<size_t>(q.outputs[0])]);
    ops[i] = std::move(fused);
    removed[q_at] = true;
  }
  drop_ops(d, removed);
  drop_unread(d, {"DequantizeLinear", "Mul"});  // what the fused units no longer read
}

// A ConvInteger with a constant weight computes in float32 when that is exact: every sum it makes
// is an integer within 2^24 (255 times the sum of an output channel's |w - w_zero_point|), which
// float32 holds exactly in any order of addition. Then it is a DequantizeLinear of the image
// (scale 1, its zero point), a Conv on oneDNN's float convolution with the weight dequantized and
// laid out once a session (it stays int8 in the .bin), and a Cast of the exact sums to int32:
// the integer sums' loops ran the dynamically quantized background-removal model 9 times slower
// than ONNX Runtime. Where the compiling CPU's int8 convolutions are exact (VNNI, which the binary
// records), a 2-D ConvInteger of a weight stays: it runs on oneDNN's int8 convolution, faster still
// (docs/ops.md, "Quantized models").
void convinteger_in_float(Draft& d) {
  const bool int8 = d.cpu->exact_int8();
  std::vector<ref::Op> ops;
  for (ref::Op& op : d.program.ops) {
    const auto input = [&](size_t i) { return op.inputs.size() > i ? op.inputs[i] : -1; };
    const int32_t x = input(0), w = input(1), xz = input(2), wz = input(3);
    if (op.type != "ConvInteger" || !d.is_weight(w) || (wz >= 0 && !d.is_weight(wz)) || (int8 && d.value(x).dims.size() == 4)) {
      ops.push_back(std::move(op));
      continue;
    }
    const ref::Value wv = d.value(w);
    const int64_t m = wv.dims[0], per_channel = wv.element_count() / std::max<int64_t>(m, 1);
    const bool signed_w = wv.dtype == ref::DType::kInt8;
    const PinnedBytes wb = d.weight(w).pin();
    std::optional<PinnedBytes> zb;
    if (wz >= 0) zb.emplace(d.weight(wz).pin());
    const auto value_of = [&](const uint8_t* bytes, size_t i) { return signed_w ? int64_t{static_cast<int8_t>(bytes[i])} : int64_t{bytes[i]}; };
    bool exact = true;
    for (int64_t c = 0; exact && c < m; ++c) {
      const int64_t zero = zb ? value_of(zb->data, zb->size > 1 ? static_cast<size_t>(c) : 0) : 0;
      int64_t sum = 0;
      for (int64_t r = 0; r < per_channel; ++r) sum += std::abs(value_of(wb.data, static_cast<size_t>(c * per_channel + r)) - zero);
      exact = 255 * sum < (int64_t{1} << 24);
    }
    if (!exact) {
      ops.push_back(std::move(op));
      continue;
    }
    const std::string name = d.names[static_cast<size_t>(op.outputs[0])];
    const bool per_channel_zero = zb && zb->size > 1;
    const auto ones = [&](int64_t count) {
      return d.add_weight(name + "/ones", ref::DType::kFloat32, count == 1 ? std::vector<int64_t>{} : std::vector<int64_t>{count},
                          blob_of(std::vector<float>(static_cast<size_t>(count), 1.0f)));
    };
    const auto dequantize = [&](int32_t v, int32_t zero, int32_t scale) {
      ref::Op dq;
      dq.type = "DequantizeLinear";
      dq.attrs = {int_attr("axis", 0), int_attr("block_size", 0)};
      dq.inputs = {v, scale};
      if (zero >= 0) dq.inputs.push_back(zero);
      dq.outputs = {d.add(d.names[static_cast<size_t>(v)] + "/float32", ref::DType::kFloat32, d.value(v).dims, ValueKind::kArena)};
      ops.push_back(dq);
      return dq.outputs[0];
    };
    const int32_t xf = dequantize(x, xz, ones(1));
    const int32_t wf = dequantize(w, wz, ones(per_channel_zero ? m : 1));
    ref::Op conv;
    conv.type = "Conv";
    conv.attrs = op.attrs;
    conv.inputs = {xf, wf};
    conv.outputs = {d.add(name + "/float32", ref::DType::kFloat32, d.value(op.outputs[0]).dims, ValueKind::kArena)};
    ref::Op cast;
    cast.type = "Cast";
    cast.attrs = {int_attr("to", static_cast<int64_t>(ref::DType::kInt32))};
    cast.inputs = conv.outputs;
    cast.outputs = op.outputs;
    log().debug("ref: ConvInteger '{}' computes in float32, exactly", name);
    ops.push_back(std::move(conv));
    ops.push_back(std::move(cast));
  }
  d.program.ops = std::move(ops);
}

// The value of a float32 weight of one element.
std::optional<float> scalar_weight(const Draft& d, int32_t v) {
  if (!d.is_weight(v) || d.program.values[static_cast<size_t>(v)].dtype != ref::DType::kFloat32 ||
      d.program.values[static_cast<size_t>(v)].element_count() != 1)
    return std::nullopt;
  return floats_of(d.weight(v))[0];
}

// Exporters without a HardSwish op (PaddlePaddle's, older opsets) write x * Clip(x + 3, 0, 6) / 6
// (or * (1/6)): four passes over the image, where HardSwish is one the Conv before it absorbs.
// Recognised when the intermediate values are read by the chain alone; the result differs from
// the four ops' by float32 rounding (x/6 + 0.5 in place of (x + 3)/6).
void recognise_hard_swish(Draft& d) {
  auto producer = producers(d);
  auto reads = readers(d);
  auto& ops = d.program.ops;
  std::vector<bool> removed(ops.size(), false);
  const auto op_of = [&](int32_t v, const char* type) -> std::optional<size_t> {
    if (v < 0 || producer[static_cast<size_t>(v)] < 0) return std::nullopt;
    const auto at = static_cast<size_t>(producer[static_cast<size_t>(v)]);
    if (ops[at].type != type || removed[at]) return std::nullopt;
    return at;
  };
  const auto other = [](const ref::Op& op, int32_t v) { return op.inputs[0] == v ? op.inputs[1] : op.inputs[0]; };
  for (size_t i = 0; i < ops.size(); ++i) {
    ref::Op& last = ops[i];
    if ((last.type != "Div" && last.type != "Mul") || last.inputs.size() != 2) continue;
    const bool div = last.type == "Div";
    const std::optional<float> k = scalar_weight(d, last.inputs[1]);
    if (!k || *k != (div ? 6.0f : 1.0f / 6.0f)) continue;
    const auto mul = op_of(last.inputs[0], "Mul");
    if (!mul || ops[*mul].inputs.size() != 2 || !only_read_by(d, reads, last.inputs[0], i)) continue;
    for (const int32_t c : ops[*mul].inputs) {
      const auto clip = op_of(c, "Clip");
      if (!clip || ops[*clip].get_float("min", 1) != 0.0f || ops[*clip].get_float("max", 0) != 6.0f ||
          !only_read_by(d, reads, c, *mul))
        continue;
      const int32_t x = other(ops[*mul], c);
      const auto add = op_of(ops[*clip].inputs[0], "Add");
      if (!add || ops[*add].inputs.size() != 2 || !only_read_by(d, reads, ops[*clip].inputs[0], *clip)) continue;
      const ref::Op& plus = ops[*add];
      if ((plus.inputs[0] != x && plus.inputs[1] != x) || scalar_weight(d, other(plus, x)) != 3.0f) continue;
      if (d.value(x).dims != d.value(last.outputs[0]).dims || d.value(x).dtype != ref::DType::kFloat32) continue;
      log().debug("ref: x * Clip(x + 3, 0, 6) / 6 giving '{}' is HardSwish", d.names[static_cast<size_t>(last.outputs[0])]);
      removed[*mul] = removed[*clip] = removed[*add] = true;
      last.type = "HardSwish";
      last.inputs = {x};
      last.attrs.clear();
      break;
    }
  }
  drop_ops(d, removed);
}

// Pow(x, 2) of a constant exponent is x * x, the same bits (x squared is rounded once either way):
// one multiply a value where Pow calls powf (openWakeWord's mel spectrogram squares two 5 x 257
// spectra, 15 µs each).
void square_pows(Draft& d) {
  for (ref::Op& op : d.program.ops) {
    if (op.type != "Pow" || op.inputs.size() != 2 || scalar_weight(d, op.inputs[1]) != 2.0f) continue;
    const int32_t x = op.inputs[0];
    if (d.value(x).dtype != ref::DType::kFloat32 || d.value(x).dims != d.value(op.outputs[0]).dims) continue;
    op.type = "Mul";
    op.inputs = {x, x};
  }
}

// The ops whose kernels run an epilogue (FusedActivation) over their results: a BatchNormalization
// no Conv took (DenseNet's before each Relu) among them, and a float32 Add (a residual connection
// and the Relu after it, as BlazeFace's blocks end: one pass over the image instead of two).
bool has_epilogue(Draft& d, const ref::Op& op) {
  if (op.type == "Add") return d.value(op.outputs[0]).dtype == ref::DType::kFloat32;
  return op.type == "Conv" || op.type == "Gemm" || op.type == "MatMul" || op.type == "BatchNormalization";
}

void fuse_activations(Draft& d) {
  absorb_into_producers(d, [&](const ref::Op& act, int32_t y, ref::Op& target) {
    const ref::Activation kind = activation_of(act.type);
    if (kind == ref::Activation::kNone || y != act.inputs[0] || !has_epilogue(d, target) || target.get_int("act", 0) != 0)
      return false;
    // The normalised activations list their float parameters in act_alpha, act_beta order:
    // LeakyRelu alpha; HardSigmoid alpha, beta; Clip min, max.
    std::vector<float> params;
    for (const auto& a : act.attrs)
      if (a.kind == ref::Attr::Kind::kFloat) params.push_back(a.f);
    params.resize(2, 0.0f);
    log().debug("ref: fused {} '{}' into {} '{}'", act.type, d.names[static_cast<size_t>(act.outputs[0])], target.type,
                d.names[static_cast<size_t>(y)]);
    set_attr(target, int_attr("act", static_cast<int64_t>(kind)));
    set_attr(target, float_attr("act_alpha", params[0]));
    set_attr(target, float_attr("act_beta", params[1]));
    return true;
  });
}

// A Mul and then an Add by scalar constants after a Conv, Gemm or MatMul (and its fused
// activation), read by nothing else, join its epilogue (`out_scale`, `out_shift`): PaddleOCR v4's
// affine after each HardSwish, attention's scaling. Then a Max and a Min by scalar constants
// (`out_lo`, `out_hi`): tf2onnx's Max(LeakyRelu(x), -0.4) in openWakeWord's speech embedding. Each
// is rounded or compared as the op it replaces, so the results are the same bits; in any other
// order (an Add then a Mul, two Muls, a Mul after a Max) the ops stay.
void fold_scalar_epilogues(Draft& d) {
  absorb_into_producers(d, [&](const ref::Op& op, int32_t y, ref::Op& target) {
    // The epilogue's order, which its attributes follow: nothing joins before what is there already.
    static const std::vector<std::pair<std::string, const char*>> kOrder = {
        {"Mul", "out_scale"}, {"Add", "out_shift"}, {"Max", "out_lo"}, {"Min", "out_hi"}};
    const auto at = std::find_if(kOrder.begin(), kOrder.end(), [&](const auto& o) { return o.first == op.type; });
    if (at == kOrder.end() || op.inputs.size() != 2) return false;
    // Max and Min keep their first input when it is NaN: the Conv's result must be that one.
    if ((op.type == "Max" || op.type == "Min") && op.inputs[0] != y) return false;
    const std::optional<float> value = scalar_weight(d, op.inputs[0] == y ? op.inputs[1] : op.inputs[0]);
    if (!value || !has_epilogue(d, target) || d.value(y).dtype != ref::DType::kFloat32 ||
        d.value(op.outputs[0]).dims != d.value(y).dims ||
        std::any_of(at, kOrder.end(), [&](const auto& o) { return target.attr(o.second) != nullptr; }))
      return false;
    log().debug("ref: {} by {} giving '{}' joins the epilogue of {} '{}'", op.type, *value,
                d.names[static_cast<size_t>(op.outputs[0])], target.type, d.names[static_cast<size_t>(y)]);
    set_attr(target, float_attr(at->second, *value));
    return true;
  });
}

// A Transpose swapping the last two dims of a MatMul's B, and read by nothing else, is the
// MatMul's transB: exported attention computes Q x K^T so, and the GEMM reads K as it is instead
// of a transposed copy.
void fold_transposes_into_matmuls(Draft& d) {
  auto producer = producers(d);
  auto reads = readers(d);
  auto& ops = d.program.ops;
  std::vector<bool> removed(ops.size(), false);
  for (size_t i = 0; i < ops.size(); ++i) {
    ref::Op& matmul = ops[i];
    if (matmul.type != "MatMul" || matmul.get_int("transB", 0) != 0) continue;
    const int32_t b = matmul.inputs[1];
    const int32_t p = producer[static_cast<size_t>(b)];
    if (p < 0 || ops[static_cast<size_t>(p)].type != "Transpose" || !only_read_by(d, reads, b, i)) continue;
    const auto perm = ops[static_cast<size_t>(p)].get_ints("perm");
    const size_t rank = perm.size();
    bool swaps_last_two = rank >= 2 && perm[rank - 2] == static_cast<int64_t>(rank - 1) &&
                          perm[rank - 1] == static_cast<int64_t>(rank - 2);
    for (size_t a = 0; a + 2 < rank && swaps_last_two; ++a) swaps_last_two = perm[a] == static_cast<int64_t>(a);
    if (!swaps_last_two) continue;
    log().debug("ref: folded Transpose '{}' into MatMul '{}' as transB", d.names[static_cast<size_t>(b)],
                d.names[static_cast<size_t>(matmul.outputs[0])]);
    matmul.inputs[1] = ops[static_cast<size_t>(p)].inputs[0];
    set_attr(matmul, int_attr("transB", 1));
    removed[static_cast<size_t>(p)] = true;
  }
  drop_ops(d, removed);
}

// A MatMul whose B [K, N] is a 4-bit weight dequantized in blocks along K (what ONNX Runtime's
// weight-only quantizer writes in QDQ form) is the MatMulNBits it stands for, as ONNX Runtime
// fuses it too: the weight stays 4 bits in memory, dequantized a slab at a time as the product
// runs, never a float32 copy. The .bin holds MatMulNBits' layout of the same values: each column's
// blocks of K values two a byte, made unsigned (int4 q - z = (q + 8) - (z + 8)), the scales and
// zero points column by column.
void matmuls_of_4bit_weights(Draft& d) {
  const auto producer = producers(d);
  for (ref::Op& op : d.program.ops) {
    if (op.type != "MatMul" || op.get_int("transB", 0) != 0 || op.get_int("act", 0) != 0) continue;
    const int32_t p = producer[static_cast<size_t>(op.inputs[1])];
    if (p < 0) continue;
    const ref::Op& dq = d.program.ops[static_cast<size_t>(p)];
    if (dq.type != "DequantizeLinear" || dq.get_int("bits", 8) != 4) continue;
    const std::vector<int64_t> dims = dq.get_ints("dims");
    const int64_t block = dq.get_int("block_size", 0);
    const int32_t w = dq.inputs[0], scale = dq.inputs[1], zero = dq.inputs.size() > 2 ? dq.inputs[2] : -1;
    if (dims.size() != 2 || dq.get_int("axis", 0) != 0 ||
        block < 16 || block > 256 || (block & (block - 1)) != 0 || !d.is_weight(w) || !d.is_weight(scale) ||
        d.value(scale).dtype != ref::DType::kFloat32 || (zero >= 0 && !d.is_weight(zero)))
      continue;
    const int64_t k = dims[0], n = dims[1], blocks = (k + block - 1) / block, flip = dq.get_int("signed", 0) != 0 ? 8 : 0;
    const std::string name = d.names[static_cast<size_t>(w)];
    const Blob qb = d.weight(w), sb = d.weight(scale);
    const std::optional<Blob> zb = zero >= 0 ? std::optional<Blob>(d.weight(zero)) : std::nullopt;
    const std::string shape = std::to_string(k) + "x" + std::to_string(n) + "/" + std::to_string(block);
    const auto nibble = [](const uint8_t* packed, int64_t i) { return (packed[i >> 1] >> ((i & 1) * 4)) & 0xF; };
    const size_t b_bytes = static_cast<size_t>(n * blocks * block / 2);
    Blob b = Blob::made(b_bytes, qb, "MatMulNBits B of " + shape + (flip ? " int4" : " uint4"), [=] {
      MadeBytes out(b_bytes, 0);
      const PinnedBytes q = qb.pin();
      for (int64_t c = 0; c < n; ++c)
        for (int64_t r = 0; r < k; ++r) {
          const int64_t to = c * blocks * block + r;  // the column's blocks, padded to whole blocks
          out[static_cast<size_t>(to >> 1)] |= static_cast<uint8_t>((nibble(q.data, r * n + c) ^ flip) << ((to & 1) * 4));
        }
      qb.release();
      return out;
    });
    const size_t s_bytes = static_cast<size_t>(n * blocks) * sizeof(float);
    Blob scales = Blob::made(s_bytes, sb, "MatMulNBits scales of " + shape, [=] {
      return runtime::transpose_matrix(sb.pin().data, static_cast<size_t>(blocks), static_cast<size_t>(n));
    });
    op.type = "MatMulNBits";
    op.inputs = {op.inputs[0], d.add_weight(name + "/nbits", ref::DType::kUInt8, {n, blocks, block / 2}, std::move(b)),
                 d.add_weight(name + "/nbits_scales", ref::DType::kFloat32, {n, blocks}, std::move(scales)), -1, -1};
    // A uint4 weight's zero point is 0 when absent; MatMulNBits' is 8, an int4 weight's after the flip.
    if (zb || !flip) {
      const int64_t row = (blocks + 1) / 2;
      const size_t z_bytes = static_cast<size_t>(n * row);
      Blob zeros = zb ? Blob::made(z_bytes, *zb, "MatMulNBits zero points of " + shape, [=] {
                          MadeBytes out(z_bytes, 0);
                          const PinnedBytes z = zb->pin();
                          for (int64_t c = 0; c < n; ++c)
                            for (int64_t kb = 0; kb < blocks; ++kb)
                              out[static_cast<size_t>(c * row + kb / 2)] |=
                                  static_cast<uint8_t>((nibble(z.data, kb * n + c) ^ flip) << ((kb & 1) * 4));
                          return out;
                        })
                      : Blob::owned(std::vector<uint8_t>(z_bytes, 0));
      op.inputs[3] = d.add_weight(name + "/nbits_zero_points", ref::DType::kUInt8, {n, row}, std::move(zeros));
    }
    op.attrs = {int_attr("K", k), int_attr("N", n), int_attr("bits", 4), int_attr("block_size", block)};
    log().debug("ref: MatMul of the 4-bit weight '{}' runs as MatMulNBits", name);
  }
  drop_unread(d, {"DequantizeLinear"});
}

// Per value, whether an op other than a product reading it as B reads it (a Gather of a table).
std::vector<bool> read_beyond_products(const Draft& d) {
  std::vector<bool> beyond(d.program.values.size(), false);
  for (const ref::Op& op : d.program.ops) {
    const bool product = op.type == "MatMul" || op.type == "Gemm";
    for (size_t i = 0; i < op.inputs.size(); ++i)
      if (op.inputs[i] >= 0 && (!product || i != 1)) beyond[static_cast<size_t>(op.inputs[i])] = true;
  }
  return beyond;
}

// Whether B [K, N] (or [N, K] when `nk`) is best kept [N, K]: an exported tied embedding's output
// projection reads the table its Gather reads, as it is with transB, or as a transposed copy the
// model stores apart. [N, K] is then the table's bytes, which the store keeps once, where B in
// panels would be a second copy of a model's largest tensor.
bool tied_to_a_table(Draft& d, const std::vector<bool>& beyond, int32_t b, bool nk, int64_t k, int64_t n) {
  if (nk) return beyond[static_cast<size_t>(b)];
  const Blob& mine = d.weight(b);
  std::optional<MadeBytes> transposed;
  for (size_t v = 0; v < beyond.size(); ++v) {
    const auto id = static_cast<int32_t>(v);
    if (id == b || !beyond[v] || !d.is_weight(id) || d.weight(id).make || d.weight(id).size != mine.size ||
        d.value(id).dtype != ref::DType::kFloat32 || d.value(id).dims != std::vector<int64_t>{n, k})
      continue;
    if (!transposed) {
      transposed = runtime::transpose_matrix(mine.pin().data, static_cast<size_t>(k), static_cast<size_t>(n));
      mine.release();
    }
    const Blob& other = d.weight(id);
    const bool same = std::memcmp(other.pin().data, transposed->data(), mine.size) == 0;
    other.release();
    if (same) return true;
  }
  return false;
}

// A constant B of MatMul (2-D) or Gemm (A as it is) is laid out in panels of 32 columns
// (attribute `panels`, docs/ref-program-format.md), which the runtime's own kernel streams once per
// 12 rows of A: whole transformers ran faster this way than on oneDNN's GEMM over B stored [N, K] on
// AVX-512, decode, 16-token steps and prefill alike (docs/benchmarks.md, "Weight layout", which
// also has the single products, some at par and on AVX2 a few slower). The layout holds B's bytes in
// another order whatever the CPU level, so `share` and model packages still store a weight once.
// Returns the value the op reads for B [K, N] (or [N, K] when `nk`) and whether it is in panels; a
// PanelWeight goes to `ops` when B is laid out at run time.
std::pair<int32_t, bool> lay_out_product_weight(Draft& d, const std::vector<bool>& beyond, int32_t b, bool nk, int64_t k,
                                                int64_t n, std::vector<ref::Op>& ops) {
  const std::string name = d.names[static_cast<size_t>(b)];
  if (!d.is_weight(b) || d.in_source_data(b)) {
    // Computed once a session (dequantized, widened), or where the model stores it (weightless):
    // laid out once a session.
    ref::Op lay;
    lay.type = "PanelWeight";
    lay.attrs = {int_attr("transB", nk ? 1 : 0)};
    lay.inputs = {b};
    lay.outputs = {d.add(name + "/panels", ref::DType::kFloat32, {n, k}, ValueKind::kArena)};
    ops.push_back(std::move(lay));
    return {ops.back().outputs[0], true};
  }
  const Blob source = d.weight(b);
  const auto kk = static_cast<size_t>(k), nn = static_cast<size_t>(n);
  const std::string shape = std::to_string(k) + "x" + std::to_string(n);
  if (tied_to_a_table(d, beyond, b, nk, k, n)) {
    log().debug("ref: the product weight '{}' stays [N, K], the bytes of a table another op reads", name);
    if (nk) return {b, false};
    // Made when stored and again when written, never held: a model's weights may be gigabytes.
    return {d.add_weight(name + "/nk", ref::DType::kFloat32, {n, k}, Blob::made(source.size, source, "transpose " + shape, [source, kk, nn] {
                           auto bytes = runtime::transpose_matrix(source.pin().data, kk, nn);
                           source.release();
                           return bytes;
                         })),
            false};
  }
  log().debug("ref: laid out the product weight '{}' in panels", name);
  return {d.add_weight(name + "/panels", ref::DType::kFloat32, {n, k},
                       Blob::made(source.size, source, "panels " + shape + (nk ? " of NxK" : " of KxN"), [source, kk, nn, nk] {
                         auto bytes = runtime::panels_of(source.pin().data, kk, nn, nk);
                         source.release();
                         return bytes;
                       })),
          true};
}

// One laid-out copy per weight, shared by every op reading it.
void pack_matmul_weights(Draft& d) {
  std::map<std::pair<int32_t, bool>, std::pair<int32_t, bool>> packed;  // (weight, stored [N, K]) -> (B read, in panels)
  const std::vector<bool> constant = computed_from_weights(d), beyond = read_beyond_products(d);
  std::vector<ref::Op> ops;
  for (auto& op : d.program.ops) {
    const int32_t b = op.inputs.size() > 1 ? op.inputs[1] : -1;
    if ((op.type != "Gemm" && op.type != "MatMul") || b < 0 || !constant[static_cast<size_t>(b)] ||
        op.get_int("transA", 0) != 0 || d.value(b).dims.size() != 2 || d.value(b).dtype != ref::DType::kFloat32) {
      ops.push_back(std::move(op));
      continue;
    }
    const bool nk = op.get_int("transB", 0) != 0;
    const auto dims = d.value(b).dims;
    auto it = packed.find({b, nk});
    if (it == packed.end())
      it = packed.emplace(std::make_pair(b, nk), lay_out_product_weight(d, beyond, b, nk, nk ? dims[1] : dims[0], nk ? dims[0] : dims[1], ops))
               .first;
    op.inputs[1] = it->second.first;
    set_attr(op, int_attr("transB", 1));
    if (it->second.second) set_attr(op, int_attr("panels", 1));
    ops.push_back(std::move(op));
  }
  d.program.ops = std::move(ops);
}

// Packs the weight of one Conv or ConvTranspose (laid out in the .bin, or by a ConvWeight op the
// runtime runs once a session when the weight is computed from weights); ConvWeight goes to `ops`
// before the op. oneDNN's deconvolution takes a ConvTranspose's output_padding out of its end
// padding, so one whose output_padding exceeds that keeps its plain weight.
void pack_conv(Draft& d, ref::Op& op, std::vector<ref::Op>& ops) {
  const int32_t w = op.inputs[1];
  const std::vector<int64_t> x = d.value(op.inputs[0]).dims, wd = d.value(w).dims, y = d.value(op.outputs[0]).dims;
  if (x.size() < 3 || x.size() > 5 || d.value(w).dtype != ref::DType::kFloat32) return;
  const std::vector<int64_t> extra = op.get_ints("output_padding"), pads = op.get_ints("pads");
  for (size_t a = 0; a < extra.size(); ++a)
    if (extra[a] > pads[extra.size() + a])
      return log().debug("ref: ConvTranspose '{}' keeps its plain weight (output_padding exceeds the end padding)",
                         d.names[static_cast<size_t>(op.outputs[0])]);
  ref::Op packed = op;
  set_attr(packed, int_attr("packed", 1));
  set_attr(packed, ints_attr("weight_shape", wd));
  const bool bias = op.inputs.size() > 2 && op.inputs[2] >= 0;
  size_t size = 0;
  try {
    // Before packing: the weight is laid out for the primitive of that layout.
    if (d.cpu->conv_runs_channels_last(packed, x, wd, y, bias)) set_attr(packed, int_attr("channels_last", 1));
    // Recorded so that the runtime makes its primitive for this layout without asking again.
    set_attr(packed, ints_attr("weight_layout", d.cpu->conv_weight_layout(packed, x, wd, y, bias)));
    size = runtime::packed_conv_weight_bytes(packed);
  } catch (const runtime::CpuTargetFailure&) {
    throw;
  } catch (const Error& e) {
    log().debug("ref: {} '{}' keeps its plain weight ({})", op.type, d.names[static_cast<size_t>(op.outputs[0])], e.what());
    return;
  }
  const std::vector<int64_t> packed_dims = {static_cast<int64_t>(size / sizeof(float))};
  const std::string name = d.names[static_cast<size_t>(w)] + "/packed";
  log().debug("ref: packed {} weight '{}' for {}", op.type, d.names[static_cast<size_t>(w)], d.cpu->architecture());
  if (d.is_weight(w) && !d.in_source_data(w)) {
    const Blob source = d.weight(w);
    // Made when stored and written, like the MatMul weights.
    const auto pack = [packed, source] {
      auto bytes = runtime::pack_conv_weight(packed, source.pin().data);
      source.release();
      return bytes;
    };
    packed.inputs[1] = d.add_weight(name, ref::DType::kFloat32, packed_dims,
                                    Blob::made(size, source, describe(packed, {x, wd, y, {bias ? 1 : 0}}), pack));
  } else {
    ref::Op lay;
    lay.type = "ConvWeight";
    lay.attrs = {ints_attr("weight_shape", wd), int_attr("group", op.get_int("group", 1)),
                 ints_attr("weight_layout", packed.get_ints("weight_layout"))};
    if (op.type == "ConvTranspose") lay.attrs.push_back(int_attr("transposed", 1));
    lay.inputs = {w};
    const ref::Value& v = d.value(w);
    if (runtime::infer_output(lay, {&v}, "ConvWeight").dims != packed_dims) return;
    lay.outputs = {d.add(name, ref::DType::kFloat32, packed_dims, ValueKind::kArena)};
    packed.inputs[1] = lay.outputs[0];
    ops.push_back(std::move(lay));
  }
  op = std::move(packed);
}

// A Conv (ConvTranspose) with a constant weight runs through oneDNN's convolution
// (deconvolution), which wants the weight in a blocked layout of its own for this CPU's feature
// level: laying it out here, once, is what an NPU compiler does for its MAC arrays, and the
// runtime then convolves straight from the mapped .bin. The layout belongs to the CPU level (the
// binary's hardware architecture names it). A weight the model stores at another precision
// (float16, int8 through a DequantizeLinear) stays so in the .bin and is laid out by a ConvWeight
// op the runtime runs once a session. A convolution oneDNN cannot run keeps its plain weight and
// runs as im2col + GEMM (a ConvTranspose as a scatter loop).
void pack_conv_weights(Draft& d) {
  const std::vector<bool> constant = computed_from_weights(d);
  std::vector<ref::Op> ops;
  for (auto& op : d.program.ops) {
    if ((op.type == "Conv" || op.type == "ConvTranspose") && constant[static_cast<size_t>(op.inputs[1])])
      pack_conv(d, op, ops);
    ops.push_back(std::move(op));
  }
  d.program.ops = std::move(ops);
}

// Images channels last. A packed 2-D Conv computes on channels-last images ([N, H, W, C]) when
// oneDNN runs that as fast as its own blocked layout (pack_conv_weights), because their rows are
// contiguous and the runtime can cut the convolution into bands of rows for the session's threads.
// It would reorder each row-major image to that and back; so a Conv writes its image channels last
// when every op reading it can take that, and reads such an image as it is, and the ops that keep
// channels apart (pools, a global average pool, Resize over H and W, Concat on channels,
// elementwise activations and arithmetic of images, BatchNormalization, Slice, ShuffleNet's
// channel shuffle) run on channels-last images as they are, until an op needs the row-major
// image: there one Transpose (and Reshape) lays it out again, once per image. A channels-last
// image is an ordinary tensor [N, 1, H, W, C] in the program (the channels a last spatial axis the
// windows do not move along), so every other stage sees ordinary ops.
class ChannelsLast {
 public:
  explicit ChannelsLast(Draft& d) : d_(d), reads_(readers(d)), last_(d.program.values.size(), false) {}

  void run() {
    std::vector<ref::Op> ops = std::move(d_.program.ops);
    d_.program.ops.clear();
    ops_ = &ops;
    for (size_t i = 0; i < ops.size(); ++i) {
      ref::Op op = ops[i];
      if (auto it = rewritten_.find(i); it != rewritten_.end()) {
        d_.program.ops.push_back(std::move(it->second));
        continue;
      }
      if (shuffle_channels(op)) {
        d_.program.ops.push_back(std::move(op));
        continue;
      }
      if (is_channels_last_conv(op)) {
        place_conv(op);
      } else if (reads_one(op) && runs_channels_last(op) && writes_arena(op)) {
        // A BatchNormalization's parameters are per channel, the same in either layout.
        const size_t images = op.type == "BatchNormalization" ? 1 : op.inputs.size();
        for (size_t i = 0; i < images; ++i) op.inputs[i] = channels_last(op.inputs[i]);
        adapt_attrs(op);
        set_channels_last(op.outputs[0]);
      } else {
        for (auto& v : op.inputs) v = plain(v);
      }
      d_.program.ops.push_back(std::move(op));
    }
  }

 private:
  static bool is_channels_last_conv(const ref::Op& op) { return op.type == "Conv" && op.get_int("channels_last", 0) == 1; }

  bool writes_arena(const ref::Op& op) { return d_.value(op.outputs[0]).kind == ValueKind::kArena; }

  bool reads_one(const ref::Op& op) const {
    return std::any_of(op.inputs.begin(), op.inputs.end(), [&](int32_t v) { return v >= 0 && last_[static_cast<size_t>(v)]; });
  }

  // The dims of v as an image: a channels-last value's [N, 1, H, W, C] are [N, C, H, W].
  std::vector<int64_t> image_dims(int32_t v) const {
    const auto& dims = d_.value(v).dims;
    if (!last_[static_cast<size_t>(v)]) return dims;
    return {dims[0], dims[4], dims[2], dims[3]};
  }

  // Can `op` run on channels-last images (every input channels last), giving what it gives on
  // the row-major images, channels last? True for ops that keep each channel apart.
  bool runs_channels_last(const ref::Op& op) const {
    const auto image = [&](int32_t v) { return d_.value(v).dtype == ref::DType::kFloat32 && image_dims(v).size() == 4; };
    if (op.inputs.empty() || op.inputs[0] < 0 || !image(op.inputs[0])) return false;
    const auto x = image_dims(op.inputs[0]);
    if (op.type == "MaxPool" || op.type == "AveragePool") return true;
    if (op.type == "Resize") {
      // Channels stay where they are at scale 1 under every coordinate rule but
      // tf_half_pixel_for_nearest (4), which moves them by half a position.
      const auto* scales = op.attr("scales");
      const auto sizes = op.get_ints("sizes");
      return op.get_int("coord", 0) != 4 && scales->floats[0] == 1.0f && scales->floats[1] == 1.0f && sizes[0] == x[0] &&
             sizes[1] == x[1];
    }
    if (op.type == "Concat") return op.get_int("axis", 0) == 1 && std::all_of(op.inputs.begin(), op.inputs.end(), image);
    if (activation_of(op.type) != ref::Activation::kNone) return op.inputs.size() == 1;
    if (op.type == "BatchNormalization" || op.type == "Slice") return true;
    // A global average pool (a squeeze-and-excitation block's): over H and W, into an image of
    // one pixel, whose channels lie the same way in either layout.
    if (op.type == "ReduceMean")
      return op.get_ints("axes") == std::vector<int64_t>{2, 3} && d_.value(op.outputs[0]).dims.size() == 4;
    // Images of one shape, or one broadcast over the other (the excitation's per-channel scales,
    // an image of one pixel), as numpy broadcasts them in either layout.
    static const std::set<std::string> arithmetic = {"Add", "Sub", "Mul", "Div", "Max", "Min"};
    if (!arithmetic.count(op.type) || op.inputs.size() != 2) return false;
    const auto y = d_.value(op.outputs[0]).dims;
    return std::all_of(op.inputs.begin(), op.inputs.end(), [&](int32_t v) {
      if (d_.is_weight(v) || !image(v)) return false;
      const auto dims = image_dims(v);
      for (size_t a = 0; a < dims.size(); ++a)
        if (dims[a] != y[a] && dims[a] != 1) return false;
      return true;
    });
  }

  // The one op reading v, when one op alone reads it and v is not a partition output.
  std::optional<size_t> only_reader(int32_t v) const {
    const auto& readers = reads_[static_cast<size_t>(v)];
    if (readers.size() != 1 || d_.value(v).kind != ValueKind::kArena) return std::nullopt;
    return readers.front();
  }

  // ShuffleNet's channel shuffle of a channels-last image: a Reshape of [N, C, H, W] to
  // [N, G, C/G, H, W], a Transpose (0, 2, 1, 3, 4) and a Reshape back, each read by the next
  // alone. On the image channels last that is a transpose within each pixel: Reshape to
  // [N, H, W, G, C/G], Transpose (0, 1, 2, 4, 3), Reshape to [N, 1, H, W, C], channels last.
  bool shuffle_channels(ref::Op& op) {
    if (op.type != "Reshape" || op.inputs.size() != 1 || !last_[static_cast<size_t>(op.inputs[0])]) return false;
    const auto x = image_dims(op.inputs[0]);  // [N, C, H, W]
    const auto shape = op.get_ints("shape");
    if (shape.size() != 5 || shape[0] != x[0] || shape[1] < 1 || shape[1] * shape[2] != x[1] || shape[3] != x[2] ||
        shape[4] != x[3])
      return false;
    const auto t = only_reader(op.outputs[0]);
    if (!t || (*ops_)[*t].type != "Transpose" || (*ops_)[*t].get_ints("perm") != std::vector<int64_t>{0, 2, 1, 3, 4}) return false;
    const auto back = only_reader((*ops_)[*t].outputs[0]);
    if (!back || (*ops_)[*back].type != "Reshape" || (*ops_)[*back].get_ints("shape") != x ||
        d_.value((*ops_)[*back].outputs[0]).kind != ValueKind::kArena)
      return false;
    const int64_t groups = shape[1], each = shape[2];
    set_attr(op, ints_attr("shape", {x[0], x[2], x[3], groups, each}));
    d_.value(op.outputs[0]).dims = {x[0], x[2], x[3], groups, each};
    ref::Op transpose = (*ops_)[*t];
    set_attr(transpose, ints_attr("perm", {0, 1, 2, 4, 3}));
    d_.value(transpose.outputs[0]).dims = {x[0], x[2], x[3], each, groups};
    ref::Op reshape = (*ops_)[*back];
    set_attr(reshape, ints_attr("shape", last_dims(x)));
    set_channels_last(reshape.outputs[0]);
    rewritten_[*t] = std::move(transpose);
    rewritten_[*back] = std::move(reshape);
    return true;
  }

  void place_conv(ref::Op& op) {
    int32_t& x = op.inputs[0];
    if (last_[static_cast<size_t>(x)]) set_attr(op, int_attr("src_channels_last", 1));
    const int32_t y = op.outputs[0];
    const auto& readers = reads_[static_cast<size_t>(y)];
    const bool all_take_it = writes_arena(op) && !readers.empty() && std::all_of(readers.begin(), readers.end(), [&](size_t r) {
      const ref::Op& reader = (*ops_)[r];
      return is_channels_last_conv(reader) ? reader.inputs[0] == y
                                           : d_.value(reader.outputs[0]).kind == ValueKind::kArena && runs_channels_last(reader);
    });
    if (!all_take_it) return;
    set_attr(op, int_attr("dst_channels_last", 1));
    set_channels_last(y);
  }

  static std::vector<int64_t> last_dims(const std::vector<int64_t>& image) { return {image[0], 1, image[2], image[3], image[1]}; }

  void set_channels_last(int32_t v) {
    auto& dims = d_.value(v).dims;
    dims = last_dims(dims);
    last_[static_cast<size_t>(v)] = true;
  }

  // The attributes of an op over [N, 1, H, W, C]: for pools the channels are a third spatial axis
  // the window does not move along; Resize leaves that axis as it is; Concat joins along it.
  static void adapt_attrs(ref::Op& op) {
    if (op.type == "MaxPool" || op.type == "AveragePool") {
      for (const char* name : {"kernel_shape", "strides", "dilations"}) {
        if (!op.attr(name)) continue;
        auto v = op.get_ints(name);
        v.push_back(1);
        set_attr(op, ints_attr(name, v));
      }
      const auto pads = op.get_ints("pads");
      set_attr(op, ints_attr("pads", {pads[0], pads[1], 0, pads[2], pads[3], 0}));
    } else if (op.type == "Resize") {
      auto scales = op.attr("scales")->floats;
      scales.push_back(1.0f);
      set_attr(op, floats_attr("scales", scales));
      set_attr(op, ints_attr("sizes", last_dims(op.get_ints("sizes"))));
    } else if (op.type == "Concat") {
      set_attr(op, int_attr("axis", 4));
    } else if (op.type == "BatchNormalization") {
      set_attr(op, int_attr("channels_last", 1));
    } else if (op.type == "Slice") {
      // Per axis of [N, C, H, W], taken to [N, 1, H, W, C]; the new axis is one whole element.
      for (const auto& [name, whole] : {std::pair{"starts", 0}, std::pair{"steps", 1}, std::pair{"sizes", 1}}) {
        const auto v = op.get_ints(name);
        set_attr(op, ints_attr(name, {v[0], whole, v[2], v[3], v[1]}));
      }
    }
  }

  int32_t add_op(const std::string& type, std::vector<ref::Attr> attrs, int32_t in, std::vector<int64_t> dims,
                 const std::string& suffix) {
    const ref::Value& from = d_.value(in);
    const int32_t out = d_.add(d_.names[static_cast<size_t>(in)] + suffix, from.dtype, std::move(dims), ValueKind::kArena);
    last_.push_back(false);
    ref::Op op;
    op.type = type;
    op.attrs = std::move(attrs);
    op.inputs = {in};
    op.outputs = {out};
    d_.program.ops.push_back(std::move(op));
    return out;
  }

  // v row-major: itself, or its channels-last image laid out again (once per value).
  int32_t plain(int32_t v) {
    if (v < 0 || !last_[static_cast<size_t>(v)]) return v;
    if (auto it = plain_.find(v); it != plain_.end()) return it->second;
    const std::vector<int64_t> image = image_dims(v);
    const std::vector<int64_t> p = d_.value(v).dims;  // [N, 1, H, W, C]
    const int32_t t = add_op("Transpose", {ints_attr("perm", {0, 1, 4, 2, 3})}, v, {p[0], 1, p[4], p[2], p[3]}, "/nchw");
    return plain_[v] = add_op("Reshape", {ints_attr("shape", image)}, t, image, "/image");
  }

  // v channels last: itself, or the row-major image laid out so (once per value).
  int32_t channels_last(int32_t v) {
    if (v < 0 || last_[static_cast<size_t>(v)]) return v;
    if (auto it = last_of_.find(v); it != last_of_.end()) return it->second;
    const std::vector<int64_t> x = d_.value(v).dims;  // [N, C, H, W]
    const int32_t r = add_op("Reshape", {ints_attr("shape", {x[0], 1, x[1], x[2], x[3]})}, v, {x[0], 1, x[1], x[2], x[3]}, "/5d");
    const int32_t t = add_op("Transpose", {ints_attr("perm", {0, 1, 3, 4, 2})}, r, last_dims(x), "/nhwc");
    last_[static_cast<size_t>(t)] = true;
    return last_of_[v] = t;
  }

  Draft& d_;
  std::vector<std::vector<size_t>> reads_;  // by the ops' positions before this pass
  std::vector<bool> last_;                  // per value: a channels-last image
  const std::vector<ref::Op>* ops_ = nullptr;
  std::map<int32_t, int32_t> plain_, last_of_;
  std::map<size_t, ref::Op> rewritten_;  // ops of a channel shuffle, by their positions before this pass
};

// ---- finishing ---------------------------------------------------------------------------------

// Keeps only values the program uses, numbered inputs first and then in order of first use, so
// the numbering depends on nothing but the program.
Draft compact(Draft& d) {
  Draft out;
  std::vector<int32_t> renumber(d.program.values.size(), -1);
  auto keep = [&](int32_t& v) {
    if (v < 0) return;
    auto& slot = renumber[static_cast<size_t>(v)];
    if (slot < 0) {
      const ref::Value& src = d.value(v);
      slot = out.add(d.names[static_cast<size_t>(v)], src.dtype, src.dims, src.kind, src.index);
      out.bytes.back() = d.bytes[static_cast<size_t>(v)];
    }
    v = slot;
  };
  for (auto& v : d.program.inputs) keep(v);
  for (auto& op : d.program.ops) {
    for (auto& v : op.inputs) keep(v);
    for (auto& v : op.outputs) keep(v);
  }
  for (auto& v : d.program.outputs) keep(v);
  out.program.ops = std::move(d.program.ops);
  out.program.inputs = std::move(d.program.inputs);
  out.program.outputs = std::move(d.program.outputs);
  return out;
}

std::vector<IoSignature> signatures(const Draft& d, const std::vector<int32_t>& ids,
                                    const std::vector<std::string>& names) {
  std::vector<IoSignature> sigs;
  for (size_t i = 0; i < ids.size(); ++i) {
    const ref::Value& v = d.program.values[static_cast<size_t>(ids[i])];
    sigs.push_back({names[i], static_cast<int32_t>(v.dtype), v.dims});
  }
  return sigs;
}

}  // namespace

LoweredPartition lower_partition(const Model& model, const Partition& partition, WeightStore& store, const LowerTarget& target) {
  Lowerer lowerer(model, partition);
  Draft draft = lowerer.run();
  draft.cpu = target.cpu.get();
  if (target.weightless)
    for (const Weight& w : model.weights)
      if (w.external && w.data.file) draft.source_files.insert(w.data.file.get());
  skip_half_round_trips(draft, lowerer.float_casts());
  drop_identities(draft);
  move_quantized_values(draft);
  concat_quantized(draft);
  fuse_quantized_convs(draft);
  requantize_pairs(draft);
  convinteger_in_float(draft);
  matmuls_of_4bit_weights(draft);
  fold_pads_into_convs(draft);
  fold_affines_into_convs(draft);
  recognise_hard_swish(draft);
  square_pows(draft);
  fuse_activations(draft);
  fold_scalar_epilogues(draft);
  fold_transposes_into_matmuls(draft);
  pack_matmul_weights(draft);
  pack_conv_weights(draft);
  ChannelsLast(draft).run();
  Draft done = compact(draft);

  LoweredPartition lowered;
  for (size_t v = 0; v < done.program.values.size(); ++v) {
    if (!done.bytes[v]) continue;
    uint32_t id = store.intern(*done.bytes[v]);
    done.program.values[v].index = id;
    lowered.weight_ids.push_back(id);
  }
  std::sort(lowered.weight_ids.begin(), lowered.weight_ids.end());
  lowered.weight_ids.erase(std::unique(lowered.weight_ids.begin(), lowered.weight_ids.end()), lowered.weight_ids.end());
  plan_memory(done.program);
  lowered.inputs = signatures(done, done.program.inputs, partition.inputs);
  lowered.outputs = signatures(done, done.program.outputs, partition.outputs);
  lowered.program = std::move(done.program);
  return lowered;
}

}  // namespace ctxgen::refc
