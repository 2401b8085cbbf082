// Lowering of partitions by the ref compiler: normalised op forms, graph passes (BatchNorm
// folding, activation fusion, Gemm packing, 1-D MatMul), value kinds, memory plan, determinism.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <thread>

#include "../../lib/backend/ref/lower.h"
#include "../../lib/backend/ref/memory_plan.h"
#include "backend_test_util.h"
#include "ctxgen/error.h"
#include "ctxgen/runtime.h"

namespace ctxgen {
namespace {

using ref::ValueKind;
using testing::TestModel;
using testing::whole_graph;

struct Lowered {
  WeightStore store;
  refc::LoweredPartition result;
  const ref::Program& program() const { return result.program; }
};

std::unique_ptr<Lowered> lower(const Model& m, const Partition& p) {
  auto l = std::make_unique<Lowered>();
  l->result = refc::lower_partition(m, p, l->store);
  return l;
}
std::unique_ptr<Lowered> lower(const Model& m) { return lower(m, whole_graph(m)); }

std::vector<std::string> op_types(const ref::Program& p) {
  std::vector<std::string> types;
  for (const auto& op : p.ops) types.push_back(op.type);
  return types;
}

const ref::Op& only_op(const ref::Program& p, const std::string& type) {
  const ref::Op* found = nullptr;
  for (const auto& op : p.ops)
    if (op.type == type) {
      EXPECT_EQ(found, nullptr) << "several " << type << " ops";
      found = &op;
    }
  if (!found) throw std::runtime_error("no " + type + " op");
  return *found;
}

const ref::Value& value(const ref::Program& p, int32_t id) { return p.values.at(static_cast<size_t>(id)); }

std::vector<float> weight_floats(const Lowered& l, int32_t id) {
  const ref::Value& v = value(l.program(), id);
  EXPECT_EQ(v.kind, ValueKind::kWeight);
  const PinnedBytes b = l.store.entry(static_cast<uint32_t>(v.index)).blob.pin();
  std::vector<float> out(b.size / 4);
  std::memcpy(out.data(), b.data, b.size);
  return out;
}

// Validates and runs a lowered program with its weights from the store; returns each output's bytes.
std::vector<std::vector<uint8_t>> run_lowered(const Lowered& l, const std::vector<std::vector<uint8_t>>& inputs) {
  const ref::Program& p = l.program();
  runtime::validate(p, l.store.size());
  std::vector<const void*> in;
  for (const auto& b : inputs) in.push_back(b.data());
  std::vector<std::vector<uint8_t>> outs;
  for (int32_t id : p.outputs) outs.emplace_back(value(p, id).byte_size(), uint8_t{0xAB});
  std::vector<void*> out;
  for (auto& o : outs) out.push_back(o.data());
  std::vector<PinnedBytes> weights;  // packed weights are made on demand
  for (uint32_t id = 0; id < l.store.size(); ++id) weights.push_back(l.store.entry(id).blob.pin());
  runtime::execute(p, [&](uint32_t id) { return weights.at(id).data; }, in, out);
  return outs;
}

template <typename T>
std::vector<uint8_t> bytes_of(const std::vector<T>& values) {
  std::vector<uint8_t> b(values.size() * sizeof(T));
  if (!b.empty()) std::memcpy(b.data(), values.data(), b.size());
  return b;
}

template <typename T>
std::vector<T> values_of(const std::vector<uint8_t>& bytes) {
  std::vector<T> v(bytes.size() / sizeof(T));
  if (!v.empty()) std::memcpy(v.data(), bytes.data(), v.size() * sizeof(T));
  return v;
}

// The output named `name` of a lowered program run on `inputs`.
std::vector<float> output_named(const Lowered& l, const std::vector<std::vector<uint8_t>>& inputs, const std::string& name) {
  const auto outs = run_lowered(l, inputs);
  for (size_t i = 0; i < l.result.outputs.size(); ++i)
    if (l.result.outputs[i].name == name) return values_of<float>(outs[i]);
  ADD_FAILURE() << "no output " << name;
  return {};
}

std::vector<float> iota_floats(size_t n, float scale) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = scale * static_cast<float>(static_cast<int>(i % 7) - 3);
  return v;
}

// Independent checker of a memory plan: aligned, inside the arena, and no two arena values that
// are alive at the same time (from the op writing one to the last op reading it) share a byte, but
// for a Reshape's output placed exactly on its input (values are never written twice).
void check_memory_plan(const ref::Program& p) {
  size_t n = p.values.size();
  std::set<std::pair<size_t, size_t>> same;  // (input, output) of Reshapes on one place
  for (const auto& op : p.ops) {
    if (op.type != "Reshape" || op.inputs[0] < 0) continue;
    const auto x = static_cast<size_t>(op.inputs[0]), y = static_cast<size_t>(op.outputs[0]);
    if (p.values[x].kind == ValueKind::kArena && p.values[y].kind == ValueKind::kArena && p.values[x].index == p.values[y].index)
      same.insert({std::min(x, y), std::max(x, y)});
  }
  // Chains of them: every pair of one chain.
  for (bool grew = true; grew;) {
    grew = false;
    for (const auto& [a, b] : std::set<std::pair<size_t, size_t>>(same))
      for (const auto& [c, d] : std::set<std::pair<size_t, size_t>>(same))
        if (b == c && same.insert({a, d}).second) grew = true;
  }
  std::vector<size_t> first(n, SIZE_MAX), last(n, 0);
  for (size_t i = 0; i < p.ops.size(); ++i) {
    for (int32_t v : p.ops[i].outputs) first[static_cast<size_t>(v)] = std::min(first[static_cast<size_t>(v)], i);
    for (int32_t v : p.ops[i].inputs)
      if (v >= 0) last[static_cast<size_t>(v)] = std::max(last[static_cast<size_t>(v)], i);
  }
  for (size_t a = 0; a < n; ++a) {
    const auto& va = p.values[a];
    if (va.kind != ValueKind::kArena) continue;
    ASSERT_NE(first[a], SIZE_MAX) << "arena value " << a << " never written";
    EXPECT_EQ(va.index % 64, 0u) << "value " << a;
    EXPECT_LE(va.index + va.byte_size(), p.arena_bytes) << "value " << a;
    for (size_t b = a + 1; b < n; ++b) {
      const auto& vb = p.values[b];
      if (vb.kind != ValueKind::kArena) continue;
      bool live_together = first[a] <= std::max(last[b], first[b]) && first[b] <= std::max(last[a], first[a]);
      bool overlap = va.index < vb.index + vb.byte_size() && vb.index < va.index + va.byte_size();
      EXPECT_FALSE(live_together && overlap && !same.count({a, b})) << "values " << a << " and " << b << " overlap while both live";
    }
  }
}

// ---- normalised forms --------------------------------------------------------------------------

TEST(RefLower, SoftmaxAxisAndCoercionFollowTheOpset) {
  auto old = lower(TestModel(11).input("x", {2, 3, 4}).node("Softmax", {"x"}, {"y"}).output("y").load());
  const auto& a = only_op(old->program(), "Softmax");
  EXPECT_EQ(a.get_int("axis", -1), 1);
  EXPECT_EQ(a.get_int("coerce_2d", -1), 1);
  auto now = lower(TestModel(13).input("x", {2, 3, 4}).node("Softmax", {"x"}, {"y"}).output("y").load());
  const auto& b = only_op(now->program(), "Softmax");
  EXPECT_EQ(b.get_int("axis", -1), 2);
  EXPECT_EQ(b.get_int("coerce_2d", -1), 0);
}

// One rule serves both: InstanceNormalization is GroupNormalization with a group per channel.
TEST(RefLower, InstanceNormalizationIsGroupNormalization) {
  auto l = lower(TestModel()
                     .input("x", {1, 3, 4})
                     .floats("s", {3}, {1, 2, 3})
                     .floats("b", {3}, {0, 0, 1})
                     .node("InstanceNormalization", {"x", "s", "b"}, {"y"})
                     .attr("epsilon", 0.01f)
                     .output("y")
                     .load());
  ASSERT_EQ(op_types(l->program()), std::vector<std::string>{"GroupNormalization"});
  const auto& op = l->program().ops[0];
  EXPECT_EQ(op.get_int("groups", 0), 3);
  EXPECT_FLOAT_EQ(op.get_float("epsilon", 0), 0.01f);
}

TEST(RefLower, ShapeOpsBecomeReshapeCopies) {
  auto l = lower(TestModel(13)
                     .input("x", {1, 2, 3})
                     .int64s("axes", {1}, {0})
                     .int64s("shape", {2}, {3, -1})
                     .node("Squeeze", {"x", "axes"}, {"a"})
                     .node("Unsqueeze", {"a", "axes"}, {"b"})
                     .node("Flatten", {"b"}, {"c"})
                     .node("Identity", {"c"}, {"d"})
                     .node("Reshape", {"d", "shape"}, {"e"})
                     .output("e")
                     .load());
  // The Identity gives its input back: it goes (RefLower.OpsGivingTheirInputBackGo).
  EXPECT_EQ(op_types(l->program()), std::vector<std::string>(4, "Reshape"));
  for (const auto& op : l->program().ops) {
    // The axes/shape constants are resolved into one `shape` attribute: the output dims.
    ASSERT_EQ(op.attrs.size(), 1u);
    EXPECT_EQ(op.attrs[0].name, "shape");
    EXPECT_EQ(op.get_ints("shape"), value(l->program(), op.outputs[0]).dims);
    EXPECT_EQ(op.inputs.size(), 1u);
  }
  EXPECT_EQ(value(l->program(), l->program().ops[0].outputs[0]).dims, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(value(l->program(), l->program().ops[2].outputs[0]).dims, (std::vector<int64_t>{1, 6}));
  EXPECT_EQ(value(l->program(), l->program().outputs[0]).dims, (std::vector<int64_t>{3, 2}));
  EXPECT_TRUE(l->result.weight_ids.empty());
}

// Identity, a Concat of one input and a Pad of zero pads (torch's DenseNet transitions) give their
// input back: they go, and what reads them reads it (here a Relu, which the Conv then absorbs),
// unless they write a partition output.
TEST(RefLower, OpsGivingTheirInputBackGo) {
  const auto model = [](bool expose) {
    TestModel t(9);
    t.input("x", {1, 2, 4, 4}).floats("w", {3, 2, 1, 1}, iota_floats(6, 0.5f))
        .node("Conv", {"x", "w"}, {"c"})
        .node("Pad", {"c"}, {"p"})
        .attr("pads", std::vector<int64_t>(8, 0))
        .node("Concat", {"p"}, {"k"})
        .attr("axis", int64_t{1})
        .node("Identity", {"k"}, {"i"})
        .node("Relu", {"i"}, {"y"})
        .output("y");
    if (expose) t.output("i");
    return t.load();
  };
  auto l = lower(model(false));
  ASSERT_EQ(op_types(l->program()), std::vector<std::string>{"Conv"});
  EXPECT_EQ(l->program().ops[0].get_int("act", 0), static_cast<int64_t>(ref::Activation::kRelu));
  const auto x = bytes_of(iota_floats(2 * 4 * 4, -0.75f));
  const auto exposed = lower(model(true));
  EXPECT_EQ(op_types(exposed->program()), (std::vector<std::string>{"Conv", "Reshape", "Relu"}));
  EXPECT_EQ(output_named(*l, {x}, "y"), output_named(*exposed, {x}, "y"));
}

TEST(RefLower, SliceStartsAndStepsCoverEveryAxisClamped) {
  const int64_t big = std::numeric_limits<int64_t>::max();
  auto l = lower(TestModel(13)
                     .input("x", {4, 5, 6})
                     .int64s("starts", {2}, {-100, big})
                     .int64s("ends", {2}, {big, 1})
                     .int64s("axes", {2}, {-1, 1})
                     .int64s("steps", {2}, {2, -2})
                     .node("Slice", {"x", "starts", "ends", "axes", "steps"}, {"y"})
                     .output("y")
                     .load());
  const auto& op = only_op(l->program(), "Slice");
  EXPECT_EQ(op.get_ints("starts"), (std::vector<int64_t>{0, 4, 0}));
  EXPECT_EQ(op.get_ints("steps"), (std::vector<int64_t>{1, -2, 2}));
  EXPECT_EQ(op.get_ints("sizes"), (std::vector<int64_t>{4, 2, 3}));
  EXPECT_EQ(op.inputs.size(), 1u);
  EXPECT_EQ(value(l->program(), op.outputs[0]).dims, (std::vector<int64_t>{4, 2, 3}));
}

TEST(RefLower, ReduceAxesSortedNonNegativeAndGlobalPoolIsReduceMean) {
  auto l = lower(TestModel(13)
                     .input("x", {2, 3, 4, 5})
                     .node("ReduceMean", {"x"}, {"m"}).attr("axes", std::vector<int64_t>{-1, 1}).attr("keepdims", int64_t{0})
                     .node("GlobalAveragePool", {"x"}, {"g"})
                     .output("m")
                     .output("g")
                     .load());
  const auto& ops = l->program().ops;
  ASSERT_EQ(op_types(l->program()), (std::vector<std::string>{"ReduceMean", "ReduceMean"}));
  EXPECT_EQ(ops[0].get_ints("axes"), (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(ops[0].get_int("keepdims", -1), 0);
  EXPECT_EQ(ops[1].get_ints("axes"), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(ops[1].get_int("keepdims", -1), 1);
  EXPECT_EQ(value(l->program(), ops[1].outputs[0]).dims, (std::vector<int64_t>{2, 3, 1, 1}));
}

TEST(RefLower, ClipBoundsBecomeAttributes) {
  auto l = lower(TestModel(13).input("x", {4}).floats("lo", {}, {-1.5f}).node("Clip", {"x", "lo"}, {"y"}).output("y").load());
  const auto& op = only_op(l->program(), "Clip");
  EXPECT_EQ(op.inputs.size(), 1u);
  EXPECT_EQ(op.get_float("min", 0), -1.5f);
  EXPECT_EQ(op.get_float("max", 0), std::numeric_limits<float>::infinity());
}

TEST(RefLower, ConvAutoPadBecomesExplicitPads) {
  auto conv = [](const std::string& pad) {
    auto l = lower(TestModel()
                       .input("x", {1, 1, 5, 5})
                       .floats("w", {1, 1, 2, 2}, {1, 1, 1, 1})
                       .node("Conv", {"x", "w"}, {"y"}).attr("auto_pad", pad).attr("strides", std::vector<int64_t>{2, 2})
                       .output("y")
                       .load());
    const auto& op = only_op(l->program(), "Conv");
    EXPECT_EQ(op.get_ints("kernel_shape"), (std::vector<int64_t>{2, 2}));
    EXPECT_EQ(op.get_ints("dilations"), (std::vector<int64_t>{1, 1}));
    EXPECT_EQ(op.get_int("group", 0), 1);
    EXPECT_EQ(op.inputs[2], -1);
    return std::make_pair(op.get_ints("pads"), value(l->program(), op.outputs[0]).dims);
  };
  // out = ceil(5 / 2) = 3; total pad = (3 - 1) * 2 + 2 - 5 = 1.
  EXPECT_EQ(conv("SAME_UPPER"), std::make_pair(std::vector<int64_t>{0, 0, 1, 1}, std::vector<int64_t>{1, 1, 3, 3}));
  EXPECT_EQ(conv("SAME_LOWER"), std::make_pair(std::vector<int64_t>{1, 1, 0, 0}, std::vector<int64_t>{1, 1, 3, 3}));
  EXPECT_EQ(conv("VALID"), std::make_pair(std::vector<int64_t>{0, 0, 0, 0}, std::vector<int64_t>{1, 1, 2, 2}));
}

TEST(RefLower, PoolCeilModeIsInTheOutputDims) {
  auto l = lower(TestModel()
                     .input("x", {1, 1, 5, 5})
                     .node("MaxPool", {"x"}, {"y"}).attr("kernel_shape", std::vector<int64_t>{2, 2})
                     .attr("strides", std::vector<int64_t>{2, 2}).attr("ceil_mode", int64_t{1})
                     .node("AveragePool", {"x"}, {"z"}).attr("kernel_shape", std::vector<int64_t>{3, 3})
                     .attr("pads", std::vector<int64_t>{1, 1, 1, 1}).attr("count_include_pad", int64_t{1})
                     .output("y")
                     .output("z")
                     .load());
  const auto& mp = only_op(l->program(), "MaxPool");
  EXPECT_EQ(value(l->program(), mp.outputs[0]).dims, (std::vector<int64_t>{1, 1, 3, 3}));
  EXPECT_EQ(mp.get_ints("pads"), (std::vector<int64_t>{0, 0, 0, 0}));
  EXPECT_EQ(mp.get_ints("dilations"), (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(mp.get_int("ceil_mode", -1), 1);
  const auto& ap = only_op(l->program(), "AveragePool");
  EXPECT_EQ(ap.get_int("count_include_pad", -1), 1);
  EXPECT_EQ(ap.get_int("ceil_mode", -1), 0);
  EXPECT_EQ(ap.get_ints("strides"), (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(value(l->program(), ap.outputs[0]).dims, (std::vector<int64_t>{1, 1, 5, 5}));
}

// The runtime takes int32 indices directly, so int32 constant indices stay int32 weights (no
// widening to int64) and the program gathers the right rows.
TEST(RefLower, GatherInt32ConstantIndicesStayInt32) {
  auto l = lower(TestModel().input("d", {5, 2}).int32s("i", {3}, {0, -1, 4}).node("Gather", {"d", "i"}, {"y"})
                     .attr("axis", int64_t{-2}).output("y").load());
  const auto& op = only_op(l->program(), "Gather");
  EXPECT_EQ(op.get_int("axis", -1), 0);
  const auto& idx = value(l->program(), op.inputs[1]);
  EXPECT_EQ(idx.dtype, ref::DType::kInt32);
  EXPECT_EQ(idx.dims, (std::vector<int64_t>{3}));
  ASSERT_EQ(idx.kind, ValueKind::kWeight);
  const Blob& b = l->store.entry(static_cast<uint32_t>(idx.index)).blob;
  ASSERT_EQ(b.size, 12u);
  int32_t got[3];
  std::memcpy(got, b.data, 12);
  EXPECT_EQ(got[0], 0);
  EXPECT_EQ(got[1], -1);
  EXPECT_EQ(got[2], 4);
  // Rows 0, 4 (as -1) and 4 of [[0,1],[2,3],...,[8,9]].
  auto out = run_lowered(*l, {bytes_of(std::vector<float>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9})});
  EXPECT_EQ(values_of<float>(out[0]), (std::vector<float>{0, 1, 8, 9, 8, 9}));
}

TEST(RefLower, GatherInt32RuntimeIndicesAreAProgramInput) {
  auto l = lower(TestModel().input("d", {5, 2}).input("i", {2}, onnx::TensorProto::INT32)
                     .node("Gather", {"d", "i"}, {"y"}).output("y").load());
  const auto& p = l->program();
  const auto& op = only_op(p, "Gather");
  EXPECT_EQ(value(p, op.inputs[1]).kind, ValueKind::kInput);
  EXPECT_EQ(value(p, op.inputs[1]).dtype, ref::DType::kInt32);
  ASSERT_EQ(l->result.inputs.size(), 2u);
  for (const auto& sig : l->result.inputs) {
    if (sig.name == "i") {
      EXPECT_EQ(sig.elem_type, onnx::TensorProto::INT32);
    }
  }
  // Inputs in partition order.
  std::vector<std::vector<uint8_t>> in(2);
  for (size_t k = 0; k < 2; ++k)
    in[k] = l->result.inputs[k].name == "d" ? bytes_of(std::vector<float>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9})
                                            : bytes_of(std::vector<int32_t>{3, -5});
  EXPECT_EQ(values_of<float>(run_lowered(*l, in)[0]), (std::vector<float>{6, 7, 0, 1}));
}

// Integer and bool values keep their element types through lowering: the shape arithmetic of
// exported models (Shape, Gather, Mul on int64, comparisons, Where, Cast) runs in the program.
TEST(RefLower, IntegerAndBoolValuesKeepTheirTypes) {
  auto l = lower(TestModel(15)
                     .input("x", {2, 3})
                     .int64s("k", {}, {1})
                     .int64s("two", {}, {2})
                     .floats("c", {}, {3.5f})
                     .node("Shape", {"x"}, {"s"})
                     .node("Gather", {"s", "k"}, {"n"}).attr("axis", int64_t{0})
                     .node("Mul", {"n", "two"}, {"m"})
                     .node("Less", {"x", "c"}, {"lt"})
                     .node("Not", {"lt"}, {"t"})
                     .node("Cast", {"m"}, {"f"}).attr("to", int64_t{onnx::TensorProto::FLOAT})
                     .node("Where", {"t", "x", "f"}, {"y"})
                     .output("m", onnx::TensorProto::INT64)
                     .output("t", onnx::TensorProto::BOOL)
                     .output("y")
                     .load());
  const auto& p = l->program();
  EXPECT_EQ(op_types(p), (std::vector<std::string>{"Shape", "Gather", "Mul", "Less", "Not", "Cast", "Where"}));
  EXPECT_EQ(only_op(p, "Shape").get_int("start", -1), 0);
  EXPECT_EQ(only_op(p, "Shape").get_int("end", -1), 2);
  EXPECT_EQ(value(p, only_op(p, "Shape").outputs[0]).dtype, ref::DType::kInt64);
  EXPECT_EQ(value(p, only_op(p, "Gather").outputs[0]).dims, (std::vector<int64_t>{}));
  EXPECT_EQ(value(p, only_op(p, "Less").outputs[0]).dtype, ref::DType::kBool);
  EXPECT_EQ(only_op(p, "Cast").get_int("to", -1), static_cast<int64_t>(ref::DType::kFloat32));
  ASSERT_EQ(l->result.outputs.size(), 3u);
  std::map<std::string, int32_t> types;
  for (const auto& sig : l->result.outputs) types[sig.name] = sig.elem_type;
  EXPECT_EQ(types["m"], onnx::TensorProto::INT64);
  EXPECT_EQ(types["t"], onnx::TensorProto::BOOL);
  EXPECT_EQ(types["y"], onnx::TensorProto::FLOAT);
  auto outs = run_lowered(*l, {bytes_of(std::vector<float>{1, 2, 3, 4, 5, 6})});
  for (size_t i = 0; i < 3; ++i) {
    const std::string& name = l->result.outputs[i].name;
    // m = 3 * 2; t = !(x < 3.5); y = t ? x : float(m).
    if (name == "m") {
      EXPECT_EQ(values_of<int64_t>(outs[i]), (std::vector<int64_t>{6}));
    } else if (name == "t") {
      EXPECT_EQ(outs[i], (std::vector<uint8_t>{0, 0, 0, 1, 1, 1}));
    } else {
      EXPECT_EQ(values_of<float>(outs[i]), (std::vector<float>{6, 6, 6, 4, 5, 6}));
    }
  }
  check_memory_plan(p);
}

TEST(RefLower, TransposeDefaultPermIsReversed) {
  auto l = lower(TestModel().input("x", {2, 3, 4}).node("Transpose", {"x"}, {"y"}).output("y").load());
  EXPECT_EQ(only_op(l->program(), "Transpose").get_ints("perm"), (std::vector<int64_t>{2, 1, 0}));
}

// ---- graph passes ------------------------------------------------------------------------------

struct ConvBn {
  std::vector<float> w = iota_floats(2 * 3 * 3 * 3, 0.25f), bias = {0.5f, -0.25f};
  std::vector<float> scale = {1.5f, 0.5f}, beta = {0.1f, -0.2f}, mean = {0.3f, -0.4f}, var = {0.8f, 2.0f};
  float eps = 1e-3f;

  TestModel model(const std::string& after_bn) const {
    TestModel t;
    t.input("x", {1, 3, 6, 6}).floats("w", {2, 3, 3, 3}, w).floats("bias", {2}, bias).floats("s", {2}, scale)
        .floats("b", {2}, beta).floats("m", {2}, mean).floats("v", {2}, var)
        .node("Conv", {"x", "w", "bias"}, {"c"})
        .node("BatchNormalization", {"c", "s", "b", "m", "v"}, {"n"}).attr("epsilon", eps);
    if (!after_bn.empty()) t.node(after_bn, {"n"}, {"y"}).output("y");
    else t.output("n");
    return t;
  }
};

TEST(RefLower, BatchNormFoldsIntoConvWithExactWeights) {
  ConvBn cb;
  auto l = lower(cb.model("").load());
  ASSERT_EQ(op_types(l->program()), std::vector<std::string>{"Conv"});
  const auto& conv = l->program().ops[0];
  EXPECT_EQ(value(l->program(), conv.outputs[0]).kind, ValueKind::kOutput);
  // The folded weight is stored packed for oneDNN: the folded values, laid out as packing lays
  // them out (all 27 x 2 distinct, so a misplaced one shows).
  auto w = weight_floats(*l, conv.inputs[1]);
  auto b = weight_floats(*l, conv.inputs[2]);
  ASSERT_EQ(conv.get_int("packed", 0), 1);
  ASSERT_EQ(conv.get_ints("weight_shape"), (std::vector<int64_t>{2, 3, 3, 3}));
  ASSERT_EQ(b.size(), 2u);
  std::vector<float> folded(cb.w.size());
  for (size_t m = 0; m < 2; ++m) {
    float s = cb.scale[m] / std::sqrt(cb.var[m] + cb.eps);
    for (size_t k = 0; k < 27; ++k) folded[m * 27 + k] = cb.w[m * 27 + k] * s;
    EXPECT_NEAR(b[m], (cb.bias[m] - cb.mean[m]) * s + cb.beta[m], 1e-6f);
  }
  ASSERT_EQ(conv.get_ints("weight_layout"), runtime::conv_weight_layout(conv, {1, 3, 6, 6}, {2, 3, 3, 3}, {1, 2, 4, 4}, true));
  const auto packed = runtime::pack_conv_weight(conv, reinterpret_cast<const uint8_t*>(folded.data()));
  std::vector<float> want(packed.size() / sizeof(float));
  std::memcpy(want.data(), packed.data(), packed.size());
  ASSERT_EQ(w.size(), want.size());
  for (size_t i = 0; i < w.size(); ++i) EXPECT_NEAR(w[i], want[i], 1e-6f) << "element " << i;
  EXPECT_EQ(value(l->program(), conv.inputs[1]).dims, (std::vector<int64_t>{static_cast<int64_t>(want.size())}));
}

// A weight computed at run time cannot be packed: that Conv reads it as it is (im2col + GEMM).
TEST(RefLower, ConvWithAComputedWeightStaysPlain) {
  auto l = lower(TestModel()
                     .input("x", {1, 3, 6, 6})
                     .input("w", {2, 3, 3, 3})
                     .node("Conv", {"x", "w"}, {"y"})
                     .output("y")
                     .load());
  const auto& conv = only_op(l->program(), "Conv");
  EXPECT_EQ(conv.get_int("packed", 0), 0);
  EXPECT_EQ(value(l->program(), conv.inputs[1]).dims, (std::vector<int64_t>{2, 3, 3, 3}));
}

TEST(RefLower, ConvBnReluBecomesOneFusedConv) {
  auto l = lower(ConvBn().model("Relu").load());
  ASSERT_EQ(op_types(l->program()), std::vector<std::string>{"Conv"});
  EXPECT_EQ(l->program().ops[0].get_int("act", 0), static_cast<int64_t>(ref::Activation::kRelu));
}

TEST(RefLower, BatchNormStaysWhenConvOutputIsSeenElsewhere) {
  // The Conv output is a graph output: folding would change it.
  auto t = ConvBn().model("");
  t.output("c");
  auto l = lower(t.load());
  EXPECT_EQ(op_types(l->program()), (std::vector<std::string>{"Conv", "BatchNormalization"}));
  const auto& bn = only_op(l->program(), "BatchNormalization");
  EXPECT_FLOAT_EQ(bn.get_float("epsilon", 0), 1e-3f);
  // A second reader inside the partition blocks folding too.
  auto t2 = ConvBn().model("");
  t2.node("Neg", {"c"}, {"z"}).output("z");
  EXPECT_EQ(op_types(lower(t2.load())->program()), (std::vector<std::string>{"Conv", "BatchNormalization", "Neg"}));
}

// Exporters that decompose BatchNorm, or add a learnable affine after each Conv (PaddleOCR v4),
// write Conv -> Mul(per-channel constant) -> Add(constant): folded into the Conv's weight and bias,
// a chain at a time, giving what the three ops give. A constant that varies along another axis, or
// a Conv output read elsewhere, stays.
TEST(RefLower, PerChannelMulAndAddFoldIntoConv) {
  const std::vector<float> w = iota_floats(2 * 3 * 3 * 3, 0.25f), bias = {0.5f, -0.25f};
  const auto model = [&](const std::vector<int64_t>& scale_dims, const std::vector<float>& scale, bool expose) {
    TestModel t;
    t.input("x", {1, 3, 6, 6}).floats("w", {2, 3, 3, 3}, w).floats("bias", {2}, bias).floats("s", scale_dims, scale)
        .floats("t", {1}, {0.75f})
        .node("Conv", {"x", "w", "bias"}, {"c"})
        .node("Mul", {"s", "c"}, {"m"})
        .node("Add", {"m", "t"}, {"y"})
        .output("y");
    if (expose) t.output("c");
    return t.load();
  };
  const auto x = bytes_of(iota_floats(3 * 6 * 6, 0.5f));
  // The expected values: the three ops, computed on their own.
  const auto want = [&](const std::vector<int64_t>& scale_dims, const std::vector<float>& scale) {
    return output_named(*lower(model(scale_dims, scale, true)), {x}, "y");
  };
  for (const auto& [dims, scale] : std::vector<std::pair<std::vector<int64_t>, std::vector<float>>>{
           {{1}, {1.5f}}, {{2, 1, 1}, {1.5f, -0.5f}}, {{1, 2, 1, 1}, {0.25f, 2.0f}}}) {
    auto l = lower(model(dims, scale, false));
    EXPECT_EQ(op_types(l->program()), std::vector<std::string>{"Conv"});
    const auto got = output_named(*l, {x}, "y"), expected = want(dims, scale);
    ASSERT_EQ(got.size(), expected.size());
    for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], expected[i], 1e-5f * (1 + std::fabs(expected[i]))) << i;
  }
  EXPECT_EQ(op_types(lower(model({1}, {1.5f}, true))->program()), (std::vector<std::string>{"Conv", "Mul", "Add"}));
  EXPECT_EQ(op_types(lower(model({1, 1, 1, 4}, {1, 2, 3, 4}, false))->program()),
            (std::vector<std::string>{"Conv", "Mul", "Add"}));
}

// x * Clip(x + 3, 0, 6) / 6 (or * (1/6)), as PaddlePaddle exports HardSwish, is one HardSwish that
// the Conv before it absorbs; the result is HardSwish's. With a step read elsewhere, or other
// constants, the ops stay.
TEST(RefLower, DecomposedHardSwishIsRecognised) {
  const auto model = [](const std::string& last, float k, float three, bool expose) {
    TestModel t;
    t.input("x", {1, 3, 6, 6}).floats("w", {2, 3, 1, 1}, iota_floats(6, 0.5f)).floats("three", {}, {three})
        .floats("zero", {}, {0.0f}).floats("six", {}, {6.0f}).floats("k", {}, {k})
        .node("Conv", {"x", "w"}, {"c"})
        .node("Add", {"c", "three"}, {"a"})
        .node("Clip", {"a", "zero", "six"}, {"r"})
        .node("Mul", {"c", "r"}, {"m"})
        .node(last, {"m", "k"}, {"y"})
        .output("y");
    if (expose) t.output("r");
    return t.load();
  };
  const auto x = bytes_of(iota_floats(3 * 6 * 6, 0.75f));
  for (const auto& [last, k] : std::vector<std::pair<std::string, float>>{{"Div", 6.0f}, {"Mul", 1.0f / 6.0f}}) {
    SCOPED_TRACE(last);
    auto l = lower(model(last, k, 3.0f, false));
    ASSERT_EQ(op_types(l->program()), std::vector<std::string>{"Conv"});
    EXPECT_EQ(l->program().ops[0].get_int("act", 0), static_cast<int64_t>(ref::Activation::kHardSwish));
    const auto got = output_named(*l, {x}, "y"), steps = output_named(*lower(model(last, k, 3.0f, true)), {x}, "y");
    ASSERT_EQ(got.size(), steps.size());
    for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], steps[i], 1e-6f * (1 + std::fabs(steps[i]))) << i;
  }
  // The Clip then joins the Add's epilogue.
  EXPECT_EQ(op_types(lower(model("Div", 6.0f, 3.0f, true))->program()), (std::vector<std::string>{"Conv", "Add", "Mul", "Div"}));
  EXPECT_EQ(op_types(lower(model("Div", 6.0f, 2.0f, false))->program()), (std::vector<std::string>{"Conv", "Add", "Mul", "Div"}));
  EXPECT_EQ(op_types(lower(model("Div", 5.0f, 3.0f, false))->program()), (std::vector<std::string>{"Conv", "Add", "Mul", "Div"}));
}

// Pow(x, 2) of a constant exponent is Mul(x, x), giving powf's bits for every kind of float;
// another exponent, or one whose dims widen the output, stays a Pow.
TEST(RefLower, PowOfTwoIsAProduct) {
  const auto model = [](const std::vector<int64_t>& exponent_dims, float exponent) {
    TestModel t;
    t.input("x", {2, 4}).floats("e", exponent_dims, {exponent}).node("Pow", {"x", "e"}, {"y"}).output("y");
    return t.load();
  };
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> x = {-0.0f, 0.0f, -3.5f, 1.0e-20f, 3.0e19f, -inf, std::numeric_limits<float>::quiet_NaN(), 0.1f};
  auto l = lower(model({}, 2.0f));
  EXPECT_EQ(op_types(l->program()), std::vector<std::string>{"Mul"});
  const auto got = output_named(*l, {bytes_of(x)}, "y");
  ASSERT_EQ(got.size(), x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const float want = std::pow(x[i], 2.0f);
    EXPECT_EQ(std::memcmp(&got[i], &want, sizeof want), 0) << x[i] << ": " << got[i] << " vs " << want;
  }
  EXPECT_EQ(op_types(lower(model({}, 3.0f))->program()), std::vector<std::string>{"Pow"});
  EXPECT_EQ(op_types(lower(model({1, 1, 1}, 2.0f))->program()), std::vector<std::string>{"Pow"});
}

// A Mul and then an Add by scalars after a Conv's (or a MatMul's) fused activation join its
// epilogue, giving the same bits as the ops; an Add before the Mul, a second Mul, or ops reading a
// value seen elsewhere, stay.
TEST(RefLower, ScalarMulThenAddJoinTheEpilogue) {
  const auto model = [](const std::string& first, const std::string& second, bool expose) {
    TestModel t;
    t.input("x", {1, 3, 6, 6}).input("w", {2, 3, 3, 3}).floats("s", {1}, {0.4763231f}).floats("t", {}, {-0.0075732437f})
        .node("Conv", {"x", "w"}, {"c"})
        .node("HardSwish", {"c"}, {"h"})
        .node(first, {"h", first == "Mul" ? "s" : "t"}, {"a"})
        .node(second, {second == "Mul" ? "s" : "t", "a"}, {"y"})
        .output("y");
    if (expose) t.output("h");
    return t.load();
  };
  // The weight is an input: the Conv cannot take the affine into its weights.
  std::vector<float> xs = iota_floats(3 * 6 * 6, 0.75f), ws = iota_floats(2 * 3 * 3 * 3, 0.125f);
  xs[5] = -0.0f;
  const std::vector<std::vector<uint8_t>> in = {bytes_of(xs), bytes_of(ws)};
  auto l = lower(model("Mul", "Add", false));
  ASSERT_EQ(op_types(l->program()), std::vector<std::string>{"Conv"});
  const ref::Op& conv = l->program().ops[0];
  EXPECT_EQ(conv.get_int("act", 0), static_cast<int64_t>(ref::Activation::kHardSwish));
  EXPECT_EQ(conv.get_float("out_scale", 0), 0.4763231f);
  EXPECT_EQ(conv.get_float("out_shift", 0), -0.0075732437f);
  EXPECT_EQ(bytes_of(output_named(*l, in, "y")), bytes_of(output_named(*lower(model("Mul", "Add", true)), in, "y")));
  EXPECT_EQ(op_types(lower(model("Mul", "Add", true))->program()), (std::vector<std::string>{"Conv", "Mul", "Add"}));
  EXPECT_EQ(lower(model("Mul", "Add", true))->program().ops[0].get_int("act", 0), static_cast<int64_t>(ref::Activation::kHardSwish));
  EXPECT_EQ(op_types(lower(model("Add", "Mul", false))->program()), (std::vector<std::string>{"Conv", "Mul"}));
  EXPECT_EQ(op_types(lower(model("Mul", "Mul", false))->program()), (std::vector<std::string>{"Conv", "Mul"}));
  // A MatMul scaled as attention scales its scores.
  const auto matmul = [](bool expose) {
    TestModel t;
    t.input("a", {4, 8}).input("b", {8, 5}).floats("k", {}, {0.125f})
        .node("MatMul", {"a", "b"}, {"p"})
        .node("Mul", {"p", "k"}, {"y"})
        .output("y");
    if (expose) t.output("p");
    return lower(t.load());
  };
  const std::vector<std::vector<uint8_t>> ab = {bytes_of(iota_floats(32, 0.5f)), bytes_of(iota_floats(40, 0.25f))};
  ASSERT_EQ(op_types(matmul(false)->program()), std::vector<std::string>{"MatMul"});
  ASSERT_EQ(op_types(matmul(true)->program()), (std::vector<std::string>{"MatMul", "Mul"}));
  EXPECT_EQ(bytes_of(output_named(*matmul(false), ab, "y")), bytes_of(output_named(*matmul(true), ab, "y")));
}

// A Max and then a Min by scalars after a Conv's fused activation (tf2onnx's Max(LeakyRelu(x),
// -0.4)) join its epilogue as bounds, inside oneDNN's pass for a packed Conv, in ref's own for
// the others: the same bits as the ops, NaN included. A Max whose constant comes first stays (it
// would give the constant for a NaN).
TEST(RefLower, ScalarMaxThenMinJoinTheEpilogue) {
  const auto model = [](bool constant_weight, bool expose, bool constant_first) {
    TestModel t;
    t.input("x", {1, 3, 7, 7}).floats("lo", {}, {-0.4f}).floats("hi", {1}, {0.9f});
    if (constant_weight) t.floats("w", {8, 3, 3, 3}, iota_floats(8 * 27, 0.125f));
    else t.input("w", {8, 3, 3, 3});
    t.node("Conv", {"x", "w"}, {"c"}).attr("pads", std::vector<int64_t>{1, 1, 1, 1})
        .node("LeakyRelu", {"c"}, {"l"}).attr("alpha", 0.2f)
        .node("Max", constant_first ? std::vector<std::string>{"lo", "l"} : std::vector<std::string>{"l", "lo"}, {"m"})
        .node("Min", {"m", "hi"}, {"y"})
        .output("y");
    if (expose) t.output("l");
    return lower(t.load());
  };
  std::vector<float> xs = iota_floats(3 * 7 * 7, 2.5f);
  xs[20] = std::numeric_limits<float>::quiet_NaN();
  const std::vector<std::vector<uint8_t>> in = {bytes_of(xs), bytes_of(iota_floats(8 * 27, 0.125f))};
  for (bool constant_weight : {true, false}) {
    SCOPED_TRACE(constant_weight ? "packed Conv" : "Conv of an input weight");
    const auto feed = constant_weight ? std::vector<std::vector<uint8_t>>{in[0]} : in;
    const auto fused = model(constant_weight, false, false);
    ASSERT_EQ(op_types(fused->program()), std::vector<std::string>{"Conv"});
    const ref::Op& conv = fused->program().ops[0];
    EXPECT_EQ(conv.get_int("act", 0), static_cast<int64_t>(ref::Activation::kLeakyRelu));
    EXPECT_EQ(conv.get_float("out_lo", 0), -0.4f);
    EXPECT_EQ(conv.get_float("out_hi", 0), 0.9f);
    const auto apart = model(constant_weight, true, false);
    EXPECT_EQ(op_types(apart->program()), (std::vector<std::string>{"Conv", "Max", "Min"}));
    const auto got = output_named(*fused, feed, "y"), want = output_named(*apart, feed, "y");
    EXPECT_EQ(bytes_of(got), bytes_of(want));
    EXPECT_TRUE(std::any_of(got.begin(), got.end(), [](float v) { return std::isnan(v); }));
    EXPECT_TRUE(std::any_of(got.begin(), got.end(), [](float v) { return v == -0.4f; }));
    EXPECT_EQ(op_types(model(constant_weight, false, true)->program()), (std::vector<std::string>{"Conv", "Max", "Min"}));
  }
}

TEST(RefLower, ActivationsFuseOnlyWhenLegal) {
  auto gemm = [](const std::string& act, bool expose) {
    TestModel t;
    t.input("a", {2, 4}).input("b", {4, 3}).node("Gemm", {"a", "b"}, {"g"}).node(act, {"g"}, {"y"});
    if (act == "LeakyRelu") t.attr("alpha", 0.25f);
    t.output("y");
    if (expose) t.output("g");
    return lower(t.load());
  };
  auto leaky = gemm("LeakyRelu", false);
  ASSERT_EQ(op_types(leaky->program()), std::vector<std::string>{"Gemm"});
  EXPECT_EQ(leaky->program().ops[0].get_int("act", 0), static_cast<int64_t>(ref::Activation::kLeakyRelu));
  EXPECT_EQ(leaky->program().ops[0].get_float("act_alpha", 0), 0.25f);
  EXPECT_EQ(op_types(gemm("HardSwish", false)->program()), std::vector<std::string>{"Gemm"});
  EXPECT_EQ(op_types(gemm("Relu", true)->program()), (std::vector<std::string>{"Gemm", "Relu"}));
  EXPECT_EQ(op_types(gemm("Exp", false)->program()), (std::vector<std::string>{"Gemm", "Exp"}));

  auto hs = lower(TestModel(13).input("a", {2, 4}).input("b", {4, 3}).floats("lo", {}, {-1}).floats("hi", {}, {2})
                      .node("MatMul", {"a", "b"}, {"g"}).node("Clip", {"g", "lo", "hi"}, {"c"})
                      .node("HardSigmoid", {"c"}, {"y"}).attr("alpha", 0.3f).output("y").load());
  ASSERT_EQ(op_types(hs->program()), (std::vector<std::string>{"MatMul", "HardSigmoid"}));
  EXPECT_EQ(hs->program().ops[0].get_float("act_alpha", 0), -1.0f);
  EXPECT_EQ(hs->program().ops[0].get_float("act_beta", 0), 2.0f);

  // A float32 Add (a residual connection) takes the activation after it too, giving the two ops'
  // bits (NaN, -0).
  const auto add = [](bool expose) {
    TestModel t;
    t.input("a", {6}).input("b", {6}).node("Add", {"a", "b"}, {"s"}).node("Relu", {"s"}, {"y"}).output("y");
    if (expose) t.output("s");
    return lower(t.load());
  };
  const auto fused = add(false), apart = add(true);
  ASSERT_EQ(op_types(fused->program()), std::vector<std::string>{"Add"});
  EXPECT_EQ(fused->program().ops[0].get_int("act", 0), static_cast<int64_t>(ref::Activation::kRelu));
  EXPECT_EQ(op_types(apart->program()), (std::vector<std::string>{"Add", "Relu"}));
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<std::vector<uint8_t>> feed = {bytes_of(std::vector<float>{1.5f, -2.0f, -0.0f, nan, 0.25f, -1e30f}),
                                   bytes_of(std::vector<float>{-1.0f, 1.0f, -0.0f, 1.0f, -0.5f, -1e30f})};
  EXPECT_EQ(bytes_of(output_named(*fused, feed, "y")), bytes_of(output_named(*apart, feed, "y")));
}

// A constant B is stored [N, K] (transB = 1) for MatMul and Gemm alike; a Gemm B already stored
// so is left as it is, one read by two ops is packed once, and a B computed at run time keeps its
// layout.
// An image pipeline: Conv, pools, both Resize modes, a Concat on channels, same-shape Add and an
// activation. `expose` also makes every Conv's image a graph output, which keeps every image
// row-major.
TestModel image_pipeline(bool expose) {
  TestModel t;
  t.input("x", {1, 3, 12, 12})
      .floats("w1", {16, 3, 3, 3}, iota_floats(16 * 27, 0.05f))
      .floats("b1", {16}, iota_floats(16, 0.1f))
      .floats("w2", {16, 16, 3, 3}, iota_floats(16 * 144, 0.01f))
      .floats("w3", {24, 32, 3, 3}, iota_floats(24 * 288, 0.02f))
      .floats("up", {4}, {1, 1, 2, 2})
      .node("Conv", {"x", "w1", "b1"}, {"c1"}).attr("pads", std::vector<int64_t>{1, 1, 1, 1})
      .node("Relu", {"c1"}, {"r1"})
      .node("MaxPool", {"r1"}, {"p1"}).attr("kernel_shape", std::vector<int64_t>{2, 2}).attr("strides", std::vector<int64_t>{2, 2})
      .node("Conv", {"p1", "w2"}, {"c2"}).attr("pads", std::vector<int64_t>{1, 1, 1, 1})
      .node("Resize", {"c2", "", "up"}, {"u1"}).attr("mode", std::string("nearest"))
      .node("Concat", {"u1", "r1"}, {"k"}).attr("axis", int64_t{1})
      .node("Conv", {"k", "w3"}, {"c3"}).attr("pads", std::vector<int64_t>{1, 1, 1, 1}).attr("strides", std::vector<int64_t>{2, 2})
      .node("Sigmoid", {"c3"}, {"s3"})
      .node("Add", {"c3", "s3"}, {"a"})
      .node("AveragePool", {"a"}, {"ap"}).attr("kernel_shape", std::vector<int64_t>{3, 3})
      .attr("pads", std::vector<int64_t>{1, 1, 1, 1})
      .node("Resize", {"ap", "", "up"}, {"y"}).attr("mode", std::string("linear"))
      .node("ReduceMean", {"a"}, {"m"}).attr("axes", std::vector<int64_t>{2, 3})
      .output("y").output("m");
  if (expose) t.output("r1").output("c2").output("c3");
  return t;
}

// A Pad of zeros on the spatial axes (tf2onnx's SAME padding before a strided depthwise Conv)
// becomes the Conv's padding: the same values as the Conv padding by itself, no Pad op. A Pad of
// another value stays.
TEST(RefLower, AZeroPadBeforeAConvIsItsPadding) {
  const auto model = [](bool pad_op, float value) {
    TestModel t;
    t.input("x", {1, 3, 6, 7}).floats("w", {3, 1, 3, 3}, iota_floats(27, 0.1f)).floats("value", {}, {value});
    if (pad_op) {
      t.int64s("pads", {8}, {0, 0, 0, 1, 0, 0, 1, 1})
          .node("Pad", {"x", "pads", "value"}, {"padded"})
          .node("Conv", {"padded", "w"}, {"y"});
    } else {
      t.node("Conv", {"x", "w"}, {"y"}).attr("pads", std::vector<int64_t>{0, 1, 1, 1});
    }
    t.attr("group", int64_t{3}).attr("strides", std::vector<int64_t>{2, 2});
    return t.output("y").load();
  };
  const auto folded = lower(model(true, 0.0f)), own = lower(model(false, 0.0f)), kept = lower(model(true, 0.5f));
  const auto types = op_types(folded->program());
  EXPECT_EQ(std::count(types.begin(), types.end(), std::string("Pad")), 0);
  EXPECT_EQ(std::count(types.begin(), types.end(), std::string("Conv")), 1);
  const auto kept_types = op_types(kept->program());
  EXPECT_EQ(std::count(kept_types.begin(), kept_types.end(), std::string("Pad")), 1);
  const auto x = testing::bytes_of_floats(iota_floats(3 * 6 * 7, 0.3f));
  EXPECT_EQ(run_lowered(*folded, {x}), run_lowered(*own, {x}));
}

TEST(RefLower, ImagesStayChannelsLastBetweenConvolutions) {
  auto last = lower(image_pipeline(false).load());
  auto plain = lower(image_pipeline(true).load());
  const ref::Program& p = last->program();
  if (p.ops[0].get_int("channels_last", 0) == 0)
    GTEST_SKIP() << "oneDNN does not convolve channels last at full speed on " << runtime::hardware_architecture();
  // Every image between the convolutions is [N, 1, H, W, C]. Row-major images are made only
  // where an op needs them: for the Resize writing output y, and for the ReduceMean.
  std::map<std::string, int> count;
  for (const auto& op : p.ops) ++count[op.type];
  EXPECT_EQ(count["Transpose"], 2) << ::testing::PrintToString(op_types(p));
  EXPECT_EQ(count["Conv"], 3);
  int reads_channels_last = 0;
  for (const auto& op : p.ops) {
    const auto& dims = value(p, op.outputs[0]).dims;
    if (op.type == "Conv") {
      EXPECT_EQ(op.get_int("channels_last", 0), 1);
      EXPECT_EQ(op.get_int("dst_channels_last", 0), 1);
      reads_channels_last += op.get_int("src_channels_last", 0);
    } else if (op.type == "MaxPool" || op.type == "AveragePool" || op.type == "Concat" || op.type == "Add") {
      ASSERT_EQ(dims.size(), 5u) << op.type;
      EXPECT_EQ(dims[1], 1) << op.type;
    }
    if (op.type == "Concat") {
      EXPECT_EQ(dims, (std::vector<int64_t>{1, 1, 12, 12, 32}));
    }
  }
  EXPECT_EQ(reads_channels_last, 2);  // the first reads the row-major input
  for (const auto& op : plain->program().ops) EXPECT_NE(op.type, "Transpose");
  check_memory_plan(p);

  // The same results, bit for bit: each kernel sums in the same order in either layout.
  std::vector<float> x(3 * 12 * 12);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.37f * static_cast<float>(i));
  const auto outputs = [&](const Lowered& l) {
    const auto bytes = run_lowered(l, {bytes_of(x)});
    std::map<std::string, std::vector<float>> by_name;
    for (size_t i = 0; i < bytes.size(); ++i) by_name[l.result.outputs[i].name] = values_of<float>(bytes[i]);
    return by_name;
  };
  auto got = outputs(*last), want = outputs(*plain);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got["y"], want["y"]);
  EXPECT_EQ(got["m"], want["m"]);
}

// Two convolutions of an image x [1, 3, 10, 10] joined on channels into "k" [1, 16, 10, 10], then
// `tail` (ending in output "y"), lowered twice: as it is, and with the convolutions' images
// partition outputs, which keeps them row-major: the program the channels-last one must equal.
struct JoinedImages {
  std::unique_ptr<Lowered> last, plain;
  explicit JoinedImages(const std::function<void(TestModel&)>& tail) {
    const auto model = [&](bool expose) {
      TestModel t;
      t.input("x", {1, 3, 10, 10})
          .floats("w1", {8, 3, 3, 3}, iota_floats(8 * 27, 0.05f))
          .floats("w2", {8, 3, 3, 3}, iota_floats(8 * 27, -0.03f))
          .node("Conv", {"x", "w1"}, {"c1"}).attr("pads", std::vector<int64_t>{1, 1, 1, 1})
          .node("Conv", {"x", "w2"}, {"c2"}).attr("pads", std::vector<int64_t>{1, 1, 1, 1})
          .node("Concat", {"c1", "c2"}, {"k"}).attr("axis", int64_t{1});
      tail(t);
      t.output("y");
      if (expose) t.output("c1").output("c2");
      return t.load();
    };
    last = lower(model(false));
    plain = lower(model(true));
  }
  bool channels_last() const { return last->program().ops[0].get_int("channels_last", 0) == 1; }
  std::vector<float> y(const Lowered& l) const {
    std::vector<float> x(3 * 10 * 10);
    for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.37f * static_cast<float>(i));
    return output_named(l, {bytes_of(x)}, "y");
  }
};

// DenseNet's block: the features joined so far (a Concat, read by the next Concat too) pass a
// BatchNormalization and a Relu into a Conv. The BatchNormalization runs on the channels-last
// image with the Relu as its epilogue, so the joined images are never laid out row-major again;
// the results are those of the row-major program, bit for bit.
TEST(RefLower, ABatchNormalizationBetweenConcatsRunsChannelsLastWithItsRelu) {
  const JoinedImages joined([](TestModel& t) {
    t.floats("w3", {8, 16, 3, 3}, iota_floats(8 * 144, 0.01f))
        .floats("s", {16}, iota_floats(16, 0.5f)).floats("b", {16}, iota_floats(16, -0.2f))
        .floats("m", {16}, iota_floats(16, 0.1f)).floats("v", {16}, std::vector<float>(16, 0.7f))
        .node("BatchNormalization", {"k", "s", "b", "m", "v"}, {"n"})
        .node("Relu", {"n"}, {"r"})
        .node("Conv", {"r", "w3"}, {"c3"}).attr("pads", std::vector<int64_t>{1, 1, 1, 1})
        .node("Concat", {"k", "c3"}, {"y"}).attr("axis", int64_t{1});
  });
  if (!joined.channels_last())
    GTEST_SKIP() << "oneDNN does not convolve channels last at full speed on " << runtime::hardware_architecture();
  const ref::Program& p = joined.last->program();
  const auto types = op_types(p);
  EXPECT_EQ(std::count(types.begin(), types.end(), std::string("Relu")), 0);
  // Row-major once, for the output.
  EXPECT_EQ(std::count(types.begin(), types.end(), std::string("Transpose")), 1) << ::testing::PrintToString(types);
  const auto& bn = only_op(p, "BatchNormalization");
  EXPECT_EQ(bn.get_int("channels_last", 0), 1);
  EXPECT_EQ(bn.get_int("act", 0), static_cast<int64_t>(ref::Activation::kRelu));
  EXPECT_EQ(only_op(joined.plain->program(), "BatchNormalization").get_int("channels_last", 0), 0);
  check_memory_plan(p);
  const auto got = joined.y(*joined.last);
  EXPECT_EQ(got.size(), 24u * 10 * 10);
  EXPECT_EQ(got, joined.y(*joined.plain));
}

// A squeeze-and-excitation block (MobileNetV3's, PaddleOCR's): a global average pool, two 1x1
// Convs on the one pixel, and the image scaled by the result per channel. Channels last the pool
// is a ReduceMean over H and W of [N, 1, H, W, C] into [N, 1, 1, 1, C] and the scaling a Mul
// broadcasting that over the image, so nothing is laid out row-major between the convolutions; the
// results are the row-major program's, bit for bit (the pool's sums are exact in double here).
TEST(RefLower, ASqueezeAndExcitationBlockStaysChannelsLast) {
  const JoinedImages joined([](TestModel& t) {
    t.floats("w3", {4, 16, 1, 1}, iota_floats(64, 0.02f)).floats("w4", {16, 4, 1, 1}, iota_floats(64, -0.03f))
        .floats("w5", {8, 16, 3, 3}, iota_floats(8 * 144, 0.01f))
        .node("GlobalAveragePool", {"k"}, {"g"})
        .node("Conv", {"g", "w3"}, {"e1"})
        .node("Relu", {"e1"}, {"r"})
        .node("Conv", {"r", "w4"}, {"e2"})
        .node("HardSigmoid", {"e2"}, {"h"})
        .node("Mul", {"k", "h"}, {"scaled"})
        .node("Conv", {"scaled", "w5"}, {"y"}).attr("pads", std::vector<int64_t>{1, 1, 1, 1});
  });
  if (!joined.channels_last())
    GTEST_SKIP() << "oneDNN does not convolve channels last at full speed on " << runtime::hardware_architecture();
  const ref::Program& p = joined.last->program();
  const auto types = op_types(p);
  // No layout op at all: the last Conv writes the row-major output itself.
  EXPECT_EQ(types, (std::vector<std::string>{"Conv", "Conv", "Concat", "ReduceMean", "Conv", "Conv", "Mul", "Conv"}));
  EXPECT_EQ(value(p, only_op(p, "ReduceMean").outputs[0]).dims, (std::vector<int64_t>{1, 1, 1, 1, 16}));
  EXPECT_EQ(value(p, only_op(p, "Mul").outputs[0]).dims, (std::vector<int64_t>{1, 1, 10, 10, 16}));
  check_memory_plan(p);
  const auto got = joined.y(*joined.last);
  EXPECT_EQ(got.size(), 8u * 10 * 10);
  EXPECT_EQ(got, joined.y(*joined.plain));
}

// ShuffleNet v2's unit: Concat, the channel shuffle (Reshape, Transpose, Reshape) and a Split into
// halves, one into the next Conv. Channels last the shuffle is a transpose within each pixel and
// the halves are slices along the last axis, so no image is laid out row-major between the
// convolutions; the results are the row-major program's, bit for bit.
TEST(RefLower, ShuffleNetsChannelShuffleAndSplitStayChannelsLast) {
  const JoinedImages joined([](TestModel& t) {
    t.floats("w3", {8, 8, 1, 1}, iota_floats(64, 0.02f))
        .int64s("to5", {5}, {1, 2, 8, 10, 10}).int64s("to4", {4}, {1, 16, 10, 10}).int64s("halves", {2}, {8, 8})
        .node("Reshape", {"k", "to5"}, {"g"})
        .node("Transpose", {"g"}, {"t"}).attr("perm", std::vector<int64_t>{0, 2, 1, 3, 4})
        .node("Reshape", {"t", "to4"}, {"s"})
        .node("Split", {"s", "halves"}, {"a", "b"}).attr("axis", int64_t{1})
        .node("Conv", {"b", "w3"}, {"c3"})
        .node("Concat", {"a", "c3"}, {"y"}).attr("axis", int64_t{1});
  });
  if (!joined.channels_last())
    GTEST_SKIP() << "oneDNN does not convolve channels last at full speed on " << runtime::hardware_architecture();
  const ref::Program& p = joined.last->program();
  const auto types = op_types(p);
  // The shuffle's Transpose, and one for the output.
  EXPECT_EQ(std::count(types.begin(), types.end(), std::string("Transpose")), 2) << ::testing::PrintToString(types);
  size_t slices = 0;
  for (const auto& op : p.ops) {
    if (op.type != "Slice") continue;
    ++slices;
    EXPECT_EQ(value(p, op.outputs[0]).dims, (std::vector<int64_t>{1, 1, 10, 10, 8}));
  }
  EXPECT_EQ(slices, 2u);
  check_memory_plan(p);
  EXPECT_EQ(joined.y(*joined.last), joined.y(*joined.plain));
}

// Where column n of row k of a B [n_total, k_total] laid out in panels of 32 columns lies.
size_t in_panels(int64_t k, int64_t n, int64_t k_total, int64_t n_total) {
  const int64_t p = n / 32, width = std::min<int64_t>(32, n_total - p * 32);
  return static_cast<size_t>(p * 32 * k_total + k * width + n % 32);
}

TEST(RefLower, ConstantMatMulAndGemmWeightsAreLaidOutInPanels) {
  std::vector<float> b = iota_floats(4 * 3, 1.0f);  // [K=4, N=3]
  auto l = lower(TestModel()
                     .input("a", {2, 5, 4})
                     .input("a2", {2, 4})
                     .floats("b", {4, 3}, b)
                     .node("MatMul", {"a", "b"}, {"y"})
                     .node("Gemm", {"a2", "b"}, {"z"})
                     .output("y")
                     .output("z")
                     .load());
  ASSERT_EQ(op_types(l->program()), (std::vector<std::string>{"MatMul", "Gemm"}));
  const auto& matmul = l->program().ops[0];
  const auto& gemm = l->program().ops[1];
  for (const ref::Op* op : {&matmul, &gemm}) {
    EXPECT_EQ(op->get_int("transB", -1), 1);
    EXPECT_EQ(op->get_int("panels", -1), 1);
  }
  EXPECT_EQ(matmul.inputs[1], gemm.inputs[1]);
  EXPECT_EQ(value(l->program(), matmul.inputs[1]).dims, (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(weight_floats(*l, matmul.inputs[1]), b);  // one panel of 3 columns: K rows of 3, as stored

  // B stored [N, K] (transB) is transposed a panel at a time.
  std::vector<float> bt = iota_floats(3 * 4, 1.0f);  // [N=3, K=4]
  auto t = lower(TestModel().input("a", {2, 4}).floats("b", {3, 4}, bt).node("Gemm", {"a", "b"}, {"y"})
                     .attr("transB", int64_t{1}).output("y").load());
  const auto& op = only_op(t->program(), "Gemm");
  EXPECT_EQ(op.get_int("panels", -1), 1);
  const auto laid = weight_floats(*t, op.inputs[1]);
  for (size_t k = 0; k < 4; ++k)
    for (size_t n = 0; n < 3; ++n) EXPECT_EQ(laid[k * 3 + n], bt[n * 4 + k]);

  // A B computed at run time is read as it is; A transposed keeps B too.
  auto r = lower(TestModel().input("a", {2, 4}).input("b", {4, 3}).node("MatMul", {"a", "b"}, {"y"}).output("y").load());
  EXPECT_EQ(only_op(r->program(), "MatMul").get_int("transB", 0), 0);
  EXPECT_EQ(only_op(r->program(), "MatMul").get_int("panels", 0), 0);
  auto ta = lower(TestModel().input("a", {4, 2}).floats("b", {4, 3}, b).node("Gemm", {"a", "b"}, {"y"})
                      .attr("transA", int64_t{1}).output("y").load());
  EXPECT_EQ(only_op(ta->program(), "Gemm").get_int("panels", 0), 0);
  EXPECT_EQ(weight_floats(*ta, only_op(ta->program(), "Gemm").inputs[1]), b);

  // Large weights, with a column count 32 does not divide (32 full panels and one of 7), stored
  // either way; the products match the plain ones.
  for (const bool nk : {false, true}) {
    SCOPED_TRACE(nk ? "stored [N, K]" : "stored [K, N]");
    const int64_t k = 1024, n = 1031;
    std::vector<float> big = iota_floats(static_cast<size_t>(k * n), 0.5f);
    auto large = lower(TestModel().input("a", {1, k}).floats("b", nk ? std::vector<int64_t>{n, k} : std::vector<int64_t>{k, n}, big)
                           .node("Gemm", {"a", "b"}, {"y"}).attr("transB", int64_t{nk ? 1 : 0}).output("y").load());
    auto laid_big = weight_floats(*large, only_op(large->program(), "Gemm").inputs[1]);
    ASSERT_EQ(laid_big.size(), big.size());
    size_t wrong = 0;
    for (int64_t kk = 0; kk < k; ++kk)
      for (int64_t nn = 0; nn < n; ++nn)
        wrong += laid_big[in_panels(kk, nn, k, n)] != big[static_cast<size_t>(nk ? nn * k + kk : kk * n + nn)];
    EXPECT_EQ(wrong, 0u);
  }
}

// An exported tied embedding: the table [V, H] for a Gather and its transpose [H, V] as the output
// projection's B, or the table itself read with transB. That B stays [N, K] (the table's bytes,
// stored once) instead of going to panels; a B of the same dims whose [N, K] form no other op
// reads goes to panels.
TEST(RefLower, ATiedEmbeddingsOutputProjectionKeepsTheTablesBytes) {
  const int64_t v = 40, h = 8;
  const std::vector<float> table = iota_floats(static_cast<size_t>(v * h), 0.25f);
  std::vector<float> transposed(table.size());
  for (int64_t r = 0; r < v; ++r)
    for (int64_t c = 0; c < h; ++c) transposed[static_cast<size_t>(c * v + r)] = table[static_cast<size_t>(r * h + c)];
  for (const bool tied : {true, false}) {
    SCOPED_TRACE(tied ? "tied" : "untied");
    std::vector<float> b = transposed;
    if (!tied) b[5] += 1.0f;
    auto l = lower(TestModel()
                       .input("ids", {3}, onnx::TensorProto::INT64)
                       .floats("table", {v, h}, table)
                       .floats("head", {h, v}, b)
                       .node("Gather", {"table", "ids"}, {"e"})
                       .node("MatMul", {"e", "head"}, {"y"})
                       .output("y")
                       .load());
    const auto& matmul = only_op(l->program(), "MatMul");
    EXPECT_EQ(matmul.get_int("transB", -1), 1);
    EXPECT_EQ(matmul.get_int("panels", 0), tied ? 0 : 1);
    if (tied) {
      EXPECT_EQ(weight_floats(*l, matmul.inputs[1]), table);
    }
    const auto y = run_lowered(*l, {bytes_of(std::vector<int64_t>{0, 39, 7})});
    std::vector<float> got(static_cast<size_t>(3 * v));
    std::memcpy(got.data(), y[0].data(), got.size() * sizeof(float));
    const int64_t ids[] = {0, 39, 7};
    for (int64_t r = 0; r < 3; ++r)
      for (int64_t c = 0; c < v; ++c) {
        double want = 0;
        for (int64_t i = 0; i < h; ++i)
          want += static_cast<double>(table[static_cast<size_t>(ids[r] * h + i)]) * b[static_cast<size_t>(i * v + c)];
        EXPECT_NEAR(got[static_cast<size_t>(r * v + c)], want, 1e-3 * std::abs(want) + 1e-4) << r << "," << c;
      }
  }
  // The table itself as the B of a Gemm with transB (F.linear's export), once read by the Gather
  // too and once not.
  for (const bool gathered : {true, false}) {
    SCOPED_TRACE(gathered ? "transB, gathered" : "transB alone");
    TestModel t;
    t.input("x", {2, h}).floats("table", {v, h}, table).node("Gemm", {"x", "table"}, {"y"}).attr("transB", int64_t{1});
    t.output("y");
    if (gathered) t.input("ids", {3}, onnx::TensorProto::INT64).node("Gather", {"table", "ids"}, {"e"}).output("e");
    auto l = lower(t.load());
    const auto& gemm = only_op(l->program(), "Gemm");
    EXPECT_EQ(gemm.get_int("panels", 0), gathered ? 0 : 1);
    EXPECT_EQ(l->result.weight_ids.size(), 1u);  // the table once, as it is or in panels
  }
}

// A Transpose of the last two dims feeding only a MatMul's B becomes its transB (2-D and batched);
// one that moves other dims, or is read elsewhere too, stays.
TEST(RefLower, TransposeOfTheLastTwoDimsFoldsIntoMatMul) {
  // s = q x Transpose(k, perm), with kt also a partition output when `kt_seen`.
  auto attention = [](std::vector<int64_t> q, std::vector<int64_t> k, std::vector<int64_t> perm, bool kt_seen) {
    TestModel t;
    t.input("q", q).input("k", k).node("Transpose", {"k"}, {"kt"}).attr("perm", perm).node("MatMul", {"q", "kt"}, {"s"})
        .output("s");
    if (kt_seen) t.output("kt");
    return lower(t.load());
  };
  auto two = attention({5, 8}, {6, 8}, {1, 0}, false);
  ASSERT_EQ(op_types(two->program()), std::vector<std::string>{"MatMul"});
  EXPECT_EQ(two->program().ops[0].get_int("transB", 0), 1);
  const ref::Value& b = value(two->program(), two->program().ops[0].inputs[1]);  // k itself
  EXPECT_EQ(b.kind, ValueKind::kInput);
  EXPECT_EQ(b.dims, (std::vector<int64_t>{6, 8}));

  auto heads = attention({1, 2, 5, 8}, {1, 2, 6, 8}, {0, 1, 3, 2}, false);
  ASSERT_EQ(op_types(heads->program()), std::vector<std::string>{"MatMul"});
  EXPECT_EQ(heads->program().ops[0].get_int("transB", 0), 1);

  const std::vector<std::string> kept = {"Transpose", "MatMul"};
  EXPECT_EQ(op_types(attention({2, 5, 8}, {8, 2, 6}, {1, 0, 2}, false)->program()), kept);  // other dims
  EXPECT_EQ(op_types(attention({5, 8}, {6, 8}, {1, 0}, true)->program()), kept);            // read elsewhere
}

// A 1-D operand is a row (A) or a column (B) with the same bytes, so numpy's vector products need
// no copies: the MatMul reads the vectors as they are, and the outputs drop the added dims.
TEST(RefLower, OneDimensionalMatMulOperandsAreReadInPlace) {
  auto l = lower(TestModel().input("a", {4}).floats("b", {3}, {1, 2, 3}).input("c", {2, 4, 3})
                     .node("MatMul", {"a", "c"}, {"ac"}).node("MatMul", {"c", "b"}, {"cb"})
                     .output("ac").output("cb").load());
  const auto& p = l->program();
  ASSERT_EQ(op_types(p), (std::vector<std::string>{"MatMul", "MatMul"}));
  EXPECT_EQ(value(p, p.ops[0].inputs[0]).dims, (std::vector<int64_t>{4}));
  EXPECT_EQ(value(p, p.ops[1].inputs[1]).dims, (std::vector<int64_t>{3}));
  EXPECT_EQ(value(p, p.ops[1].inputs[1]).kind, ValueKind::kWeight);
  EXPECT_EQ(value(p, p.outputs[0]).dims, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(value(p, p.outputs[1]).dims, (std::vector<int64_t>{2, 4}));
}

// ---- values, signatures, edge cases ------------------------------------------------------------

TEST(RefLower, ValueKindsAndSignatures) {
  auto m = TestModel().input("x", {2, 3}).input("y", {2, 3}).floats("w", {3}, {1, 2, 3}).floats("w2", {3}, {1, 2, 3})
               .node("Add", {"x", "w"}, {"a"}).node("Mul", {"a", "y"}, {"b"}).node("Sub", {"b", "w"}, {"c"})
               .node("Add", {"c", "w2"}, {"d"}).output("d").output("a").load();
  auto part = whole_graph(m);
  auto l = lower(m, part);
  const auto& p = l->program();
  ASSERT_EQ(p.inputs.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(value(p, p.inputs[i]).kind, ValueKind::kInput);
    EXPECT_EQ(value(p, p.inputs[i]).index, i);
  }
  ASSERT_EQ(p.outputs.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(value(p, p.outputs[i]).kind, ValueKind::kOutput);
    EXPECT_EQ(value(p, p.outputs[i]).index, i);
  }
  // "w" is read twice but is one value; "w2" has the same bytes, so the store holds one entry.
  EXPECT_EQ(p.ops[0].inputs[1], p.ops[2].inputs[1]);
  EXPECT_EQ(l->result.weight_ids, std::vector<uint32_t>{0});
  EXPECT_EQ(l->store.size(), 1u);
  // "a" is a partition output that later ops read too.
  size_t a_pos = static_cast<size_t>(std::find(part.outputs.begin(), part.outputs.end(), "a") - part.outputs.begin());
  ASSERT_LT(a_pos, 2u);
  EXPECT_EQ(p.ops[1].inputs[0], p.outputs[a_pos]);
  ASSERT_EQ(l->result.inputs.size(), 2u);
  EXPECT_EQ(l->result.inputs[0], (IoSignature{part.inputs[0], onnx::TensorProto::FLOAT, {2, 3}}));
  EXPECT_EQ(l->result.outputs[0].name, part.outputs[0]);
  check_memory_plan(p);
}

TEST(RefLower, OutputsNotProducedInsideAreCopied) {
  auto m = TestModel().input("x", {3}).floats("k", {3}, {1, 2, 3}).node("Identity", {"x"}, {"y"}).output("y")
               .output("k", onnx::TensorProto::FLOAT, std::vector<int64_t>{3}).load();
  Partition part;
  part.nodes = {0};
  part.inputs = {"x"};
  part.outputs = {"y", "k"};
  part.constants = {"k"};
  auto l = lower(m, part);
  const auto& p = l->program();
  ASSERT_EQ(op_types(p), (std::vector<std::string>{"Reshape", "Reshape"}));
  EXPECT_EQ(value(p, p.ops[0].inputs[0]).kind, ValueKind::kInput);
  EXPECT_EQ(value(p, p.ops[0].outputs[0]).kind, ValueKind::kOutput);
  EXPECT_EQ(value(p, p.ops[1].inputs[0]).kind, ValueKind::kWeight);
  EXPECT_EQ(p.ops[1].outputs[0], p.outputs[1]);
  EXPECT_EQ(value(p, p.outputs[1]).index, 1u);
}

TEST(RefLower, RefusedNodeOrBrokenPartitionIsAnInternalError) {
  auto m = TestModel().input("x", {2}).node("Round", {"x"}, {"y"}).output("y").load();
  Partition part;
  part.nodes = {0};
  part.inputs = {"x"};
  part.outputs = {"y"};
  WeightStore store;
  try {
    refc::lower_partition(m, part, store);
    FAIL() << "lowering a refused node succeeded";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInternal);
    EXPECT_NE(std::string(e.what()).find("node 'y_node' (Round) is not supported by ref: unsupported op"), std::string::npos) << e.what();
  }
  auto ok = TestModel().input("x", {2}).node("Relu", {"x"}, {"y"}).output("y").load();
  Partition missing_input;
  missing_input.nodes = {0};
  missing_input.outputs = {"y"};
  EXPECT_THROW(refc::lower_partition(ok, missing_input, store), Error);
}

TEST(RefLower, CompileFillsTheCompiledGraph) {
  auto m = ConvBn().model("Relu").load();
  auto part = whole_graph(m);
  WeightStore store;
  auto graph = make_ref_backend()->compile(m, part, "g0", store);
  EXPECT_EQ(graph.name, "g0");
  EXPECT_EQ(graph.node_count, 3u);
  EXPECT_EQ(graph.weight_ids, (std::vector<uint32_t>{0, 1}));
  ASSERT_EQ(graph.inputs.size(), 1u);
  EXPECT_EQ(graph.inputs[0], (IoSignature{"x", onnx::TensorProto::FLOAT, {1, 3, 6, 6}}));
  EXPECT_EQ(graph.outputs[0], (IoSignature{"y", onnx::TensorProto::FLOAT, {1, 2, 4, 4}}));
  auto program = ref::deserialize(graph.program.data(), graph.program.size());
  ASSERT_EQ(program.ops.size(), 1u);
  EXPECT_EQ(program.ops[0].type, "Conv");
  EXPECT_EQ(program.ops[0].get_int("act", 0), 1);
}

// ---- memory plan and determinism ---------------------------------------------------------------

// A random DAG of Add/Relu/Concat/Slice over [rows, 16] float tensors (rows tracked so every
// node is valid), giving values of varied sizes and lifetimes.
TestModel random_dag(unsigned seed, int nodes) {
  std::mt19937 rng(seed);
  TestModel t;
  t.input("in", {8, 16}).int64s("s0", {1}, {0}).int64s("s1", {1}, {8}).int64s("ax", {1}, {0});
  std::vector<std::pair<std::string, int64_t>> avail = {{"in", 8}};
  for (int i = 0; i < nodes; ++i) {
    std::string out = "v" + std::to_string(i);
    auto [a, rows] = avail[rng() % avail.size()];
    std::vector<std::string> same;
    for (const auto& [name, r] : avail)
      if (r == rows) same.push_back(name);
    switch (rng() % 4) {
      case 0: t.node("Add", {a, same[rng() % same.size()]}, {out}); break;
      case 1: t.node("Relu", {a}, {out}); break;
      case 2:
        if (rows <= 32) {
          t.node("Concat", {a, a}, {out}).attr("axis", int64_t{0});
          rows *= 2;
          break;
        }
        [[fallthrough]];
      default:
        t.node("Slice", {a, "s0", "s1", "ax"}, {out});
        rows = 8;
        break;
    }
    avail.emplace_back(out, rows);
  }
  t.output(avail.back().first);
  return t;
}

TEST(RefLower, MemoryPlanNeverOverlapsLiveValuesAndReusesSpace) {
  for (unsigned seed = 1; seed <= 20; ++seed) {
    auto m = random_dag(seed, 40).load();
    auto l = lower(m);
    SCOPED_TRACE("seed " + std::to_string(seed));
    check_memory_plan(l->program());
    uint64_t total = 0;
    for (const auto& v : l->program().values)
      if (v.kind == ValueKind::kArena) total += (v.byte_size() + 63) / 64 * 64;
    EXPECT_LE(l->program().arena_bytes, total);
  }
  // A chain needs only two live buffers at a time.
  TestModel chain;
  chain.input("x", {256});
  std::string prev = "x";
  for (int i = 0; i < 10; ++i) {
    chain.node("Relu", {prev}, {"r" + std::to_string(i)});
    prev = "r" + std::to_string(i);
  }
  chain.output(prev);
  auto l = lower(chain.load());
  EXPECT_EQ(l->program().arena_bytes, 2u * 1024u);
  // A Reshape's output is its input's bytes, along a chain of them: nothing is copied.
  auto reshaped = lower(TestModel()
                            .input("x", {4, 64})
                            .int64s("flat", {1}, {256})
                            .int64s("square", {2}, {16, 16})
                            .node("Relu", {"x"}, {"r"})
                            .node("Reshape", {"r", "flat"}, {"f"})
                            .node("Reshape", {"f", "square"}, {"s"})
                            .node("Neg", {"s"}, {"y"})
                            .output("y")
                            .load());
  const ref::Program& p = reshaped->program();
  ASSERT_EQ(op_types(p), (std::vector<std::string>{"Relu", "Reshape", "Reshape", "Neg"}));
  EXPECT_EQ(value(p, p.ops[1].outputs[0]).index, value(p, p.ops[0].outputs[0]).index);
  EXPECT_EQ(value(p, p.ops[2].outputs[0]).index, value(p, p.ops[0].outputs[0]).index);
  EXPECT_EQ(p.arena_bytes, 1024u);
  check_memory_plan(p);
  std::vector<float> x(256);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 9) - 4.0f;
  const auto y = output_named(*reshaped, {bytes_of(x)}, "y");
  for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(y[i], -std::max(x[i], 0.0f)) << i;
}

TEST(RefLower, PlanMemoryHandlesCraftedPrograms) {
  ref::Program p;
  auto add_value = [&](int64_t n, ValueKind kind) {
    ref::Value v;
    v.dims = {n};
    v.kind = kind;
    p.values.push_back(v);
    return static_cast<int32_t>(p.values.size() - 1);
  };
  int32_t in = add_value(10, ValueKind::kInput);
  int32_t a = add_value(100, ValueKind::kArena), b = add_value(3, ValueKind::kArena), c = add_value(50, ValueKind::kArena);
  int32_t unused = add_value(7, ValueKind::kArena);  // written, never read
  int32_t out = add_value(10, ValueKind::kOutput);
  auto op = [&](std::vector<int32_t> ins, std::vector<int32_t> outs) {
    ref::Op o;
    o.type = "Add";
    o.inputs = std::move(ins);
    o.outputs = std::move(outs);
    p.ops.push_back(o);
  };
  op({in}, {a});
  op({a}, {b, unused});
  op({b, a}, {c});
  op({c}, {out});
  refc::plan_memory(p);
  check_memory_plan(p);
  EXPECT_EQ(value(p, in).index, 0u);  // non-arena values keep their index
  ref::Program broken = p;
  broken.ops.erase(broken.ops.begin());  // value a read but never written
  EXPECT_THROW(refc::plan_memory(broken), Error);
}

TEST(RefLower, CompilationIsDeterministic) {
  auto m1 = random_dag(7, 30).load();
  auto m2 = random_dag(7, 30).load();
  auto backend = make_ref_backend();
  WeightStore s1, s2;
  auto g1 = backend->compile(m1, whole_graph(m1), "g", s1);
  auto g2 = backend->compile(m2, whole_graph(m2), "g", s2);
  EXPECT_EQ(g1.program, g2.program);
  auto m3 = ConvBn().model("Relu").load();
  auto m4 = ConvBn().model("Relu").load();
  EXPECT_EQ(backend->compile(m3, whole_graph(m3), "g", s1).program, backend->compile(m4, whole_graph(m4), "g", s2).program);
}

// The CPU level is a setting of each compile, not of the process: compiles for several levels run
// one after another and at once in one process, each laying weights out for its own level (oneDNN
// fixes a process's level once: the others are asked of a helper process running at theirs).
TEST(RefLower, CompilesForSeveralCpuLevelsInOneProcess) {
  const auto model = [] {
    return TestModel().input("x", {1, 16, 12, 12}).floats("w", {32, 16, 3, 3}, iota_floats(32 * 16 * 9, 0.01f))
        .node("Conv", {"x", "w"}, {"y"}).output("y").load();
  };
  const Model m = model();
  const auto compiled = [&](const std::string& level) {
    const auto backend = make_ref_backend({level});
    WeightStore store;
    const CompiledGraph g = backend->compile(m, whole_graph(m), "g", store);
    const ref::Program p = ref::deserialize(g.program.data(), g.program.size());
    return std::make_pair(backend->identity().hardware_architecture, only_op(p, "Conv").get_ints("weight_layout"));
  };
  const std::string host = runtime::cpu_level();
  const auto [first_architecture, first_layout] = compiled("avx2");
  EXPECT_NE(first_architecture.find(" avx2, oneDNN"), std::string::npos) << first_architecture;
  ASSERT_FALSE(first_layout.empty());
  EXPECT_EQ(compiled("").first, runtime::hardware_architecture());
  EXPECT_EQ(compiled(host), compiled(""));
  EXPECT_NE(compiled("sse41").first.find(" sse41, oneDNN"), std::string::npos);
  EXPECT_EQ(compiled("avx2"), std::make_pair(first_architecture, first_layout));
  // AVX-512 kernels read weights in blocks of 16 channels, AVX2's in blocks of 8.
  if (host.rfind("avx512", 0) == 0) {
    EXPECT_NE(compiled("").second, first_layout);
  }
  // At once: each compile its own level.
  std::pair<std::string, std::vector<int64_t>> at_once[2];
  std::thread a([&] { at_once[0] = compiled("sse41"); }), b([&] { at_once[1] = compiled("avx2"); });
  a.join();
  b.join();
  EXPECT_EQ(at_once[0], compiled("sse41"));
  EXPECT_EQ(at_once[1], std::make_pair(first_architecture, first_layout));
  // The process itself stays at its level.
  EXPECT_EQ(runtime::cpu_level(), host);
  EXPECT_THROW(make_ref_backend({"avx3"}), Error);
}


// Every node of a QDQ unit runs on ref, in one program; the weight and bias stay int8 and int32 in
// the store, and the result is what dequantize, convolve, quantize computes.
TEST(RefLower, AQdqConvUnitCompilesWholeKeepingItsIntegers) {
  struct Case {
    std::string domain;
    int32_t type;
    std::vector<uint8_t> zero_point;
    ref::DType dtype;
  };
  // 16-bit units (com.microsoft) are typed by the specialise stage first: SpecialiseTest covers them.
  for (const Case& c : {Case{"", onnx::TensorProto::UINT8, {128}, ref::DType::kUInt8},
                        Case{"", onnx::TensorProto::INT8, {0xFB}, ref::DType::kInt8}}) {
    SCOPED_TRACE(c.type);
    auto l = lower(testing::qdq_conv_unit(c.domain, c.type, c.zero_point).load());
    const auto& p = l->program();
    size_t quantize = 0, dequantize = 0;
    for (const auto& op : p.ops) {
      quantize += op.type == "QuantizeLinear";
      dequantize += op.type == "DequantizeLinear";
    }
    EXPECT_EQ(quantize, 2u);
    EXPECT_EQ(dequantize, 4u);
    std::map<ref::DType, int> weight_types;
    for (const auto& v : p.values) {
      if (v.kind == ValueKind::kWeight) ++weight_types[v.dtype];
    }
    // The weight and its zero point (and, for int8 activations, x's and y's zero points).
    EXPECT_EQ(weight_types[ref::DType::kInt8], c.dtype == ref::DType::kInt8 ? 4 : 2) << "the weight stays int8";
    EXPECT_EQ(weight_types[ref::DType::kInt32], 1) << "the bias stays int32";
    for (const auto& v : p.values) {
      if (v.kind == ValueKind::kWeight && v.dtype == ref::DType::kFloat32) {
        EXPECT_LE(v.element_count(), 2) << "only the scales are float32: nothing was dequantized at compile time";
      }
    }
    const std::vector<float> x = {0.1f, -0.2f, 0.3f, 0.45f, 0.5f, -0.6f, 0.7f, 0.8f, 0.9f};
    auto y = run_lowered(*l, {testing::bytes_of_floats(x)});
    std::vector<float> got(8);
    std::memcpy(got.data(), y[0].data(), 32);
    // The same in plain arithmetic: x rounded to steps of 0.05, the convolution, y to steps of 0.02.
    const bool u8 = c.type == onnx::TensorProto::UINT8;
    const double zp = u8 ? 128 : -5, bottom = u8 ? 0 : -128, top = u8 ? 255 : 127;
    auto q = [&](double v, double s) { return std::clamp(std::nearbyint(v / s) + zp, bottom, top); };
    std::vector<double> xd(9);
    for (size_t i = 0; i < 9; ++i) xd[i] = (q(x[i], 0.05f) - zp) * 0.05f;
    const double w[2][4] = {{0.1 * 1, 0.1 * 2, 0.1 * 3, 0.1 * 4}, {0.02 * -1, 0.02 * -2, 0.02 * -3, 0.02 * 127}};
    const double bias[2] = {10 * 0.005, -10 * 0.001};
    for (int m = 0; m < 2; ++m)
      for (int r = 0; r < 2; ++r)
        for (int col = 0; col < 2; ++col) {
          double s = bias[m] + w[m][0] * xd[r * 3 + col] + w[m][1] * xd[r * 3 + col + 1] + w[m][2] * xd[(r + 1) * 3 + col] +
                     w[m][3] * xd[(r + 1) * 3 + col + 1];
          EXPECT_NEAR(got[static_cast<size_t>(m * 4 + r * 2 + col)], (q(s, 0.02f) - zp) * 0.02f, 1e-6) << m << r << col;
        }
  }
}


// A MatMul weight reached through a DequantizeLinear stays int8 in the store; the runtime
// dequantizes it and lays it out in panels once a session (both ops read weights alone).
TEST(RefLower, ADequantizedMatMulWeightIsLaidOutOnceASession) {
  auto l = lower(TestModel(13)
                     .input("x", {2, 3})
                     .tensor("w", {3, 2}, onnx::TensorProto::INT8, {1, 0xFF, 2, 0xFE, 3, 0x7F})
                     .floats("s", {}, {0.5f})
                     .node("DequantizeLinear", {"w", "s"}, {"wf"})
                     .node("MatMul", {"x", "wf"}, {"y"})
                     .output("y")
                     .load());
  const auto& p = l->program();
  ASSERT_EQ(op_types(p), (std::vector<std::string>{"DequantizeLinear", "PanelWeight", "MatMul"}));
  EXPECT_EQ(only_op(p, "MatMul").get_int("transB", 0), 1);
  EXPECT_EQ(only_op(p, "MatMul").get_int("panels", 0), 1);
  EXPECT_EQ(value(p, p.ops[0].inputs[0]).dtype, ref::DType::kInt8);
  auto y = run_lowered(*l, {testing::bytes_of_floats({1, 2, 3, -1, 0, 1})});
  std::vector<float> got(4);
  std::memcpy(got.data(), y[0].data(), 16);
  // w = [[1, -1], [2, -2], [3, 127]] / 2
  EXPECT_EQ(got, (std::vector<float>{7.0f, 188.0f, 1.0f, 64.0f}));
}

// 4-bit values packed two a byte, the first in the low bits, as ONNX stores int4 and uint4.
std::vector<uint8_t> packed_4bit(const std::vector<int>& values) {
  std::vector<uint8_t> bytes((values.size() + 1) / 2, 0);
  for (size_t i = 0; i < values.size(); ++i) bytes[i / 2] |= static_cast<uint8_t>((values[i] & 0xF) << (i % 2 * 4));
  return bytes;
}

// onnx 1.12 does not type opset 21's DequantizeLinear (the specialise stage does, in the pipeline):
// the model declares the type of its output.
void declare_float(TestModel& m, const std::string& name, const std::vector<int64_t>& dims) {
  auto* t = m.proto().mutable_graph()->add_value_info();
  t->set_name(name);
  t->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::FLOAT);
  for (int64_t d : dims) t->mutable_type()->mutable_tensor_type()->mutable_shape()->add_dim()->set_dim_value(d);
}

// A MatMul of a 4-bit weight dequantized in blocks along K (ONNX Runtime's weight-only QDQ form)
// runs as MatMulNBits on the weight's 4 bits: int4 without zero points, and uint4 with them over
// a K that ends in a short block. The product is the float one of the dequantized weight.
TEST(RefLower, AFourBitMatMulWeightRunsAsMatMulNBits) {
  for (const bool is_signed : {true, false}) {
    SCOPED_TRACE(is_signed ? "int4" : "uint4");
    const int64_t k = is_signed ? 32 : 40, n = 3, block = 16, blocks = (k + block - 1) / block;
    std::vector<int> q(static_cast<size_t>(k * n)), z(static_cast<size_t>(blocks * n), 0);
    for (size_t i = 0; i < q.size(); ++i) q[i] = static_cast<int>(i * 7 % 16) - (is_signed ? 8 : 0);
    for (size_t i = 0; i < z.size() && !is_signed; ++i) z[i] = static_cast<int>(i * 5 % 16);
    std::vector<float> scales(static_cast<size_t>(blocks * n)), x(static_cast<size_t>(2 * k));
    for (size_t i = 0; i < scales.size(); ++i) scales[i] = 0.125f * static_cast<float>(i + 1);
    for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(static_cast<int>(i % 5) - 2);
    const int32_t type = is_signed ? kOnnxInt4 : kOnnxUInt4;
    TestModel m(21);
    m.input("x", {2, k}).tensor("w", {k, n}, type, packed_4bit(q)).floats("s", {blocks, n}, scales);
    if (!is_signed) m.tensor("z", {blocks, n}, type, packed_4bit(z));
    m.node("DequantizeLinear", {"w", "s", is_signed ? "" : "z"}, {"wf"}).attr("axis", int64_t{0}).attr("block_size", block);
    m.node("MatMul", {"x", "wf"}, {"y"}).output("y");
    declare_float(m, "wf", {k, n});
    auto l = lower(m.load());
    const auto& p = l->program();
    ASSERT_EQ(op_types(p), (std::vector<std::string>{"MatMulNBits"}));
    EXPECT_EQ(value(p, p.ops[0].inputs[1]).dims, (std::vector<int64_t>{n, blocks, block / 2}));
    EXPECT_EQ(value(p, p.ops[0].inputs[1]).dtype, ref::DType::kUInt8);
    auto y = run_lowered(*l, {testing::bytes_of_floats(x)});
    std::vector<float> got(static_cast<size_t>(2 * n));
    std::memcpy(got.data(), y[0].data(), got.size() * sizeof(float));
    for (int64_t r = 0; r < 2; ++r)
      for (int64_t c = 0; c < n; ++c) {
        float want = 0;  // small whole multiples of 1/8: exact in any order
        for (int64_t i = 0; i < k; ++i) {
          const size_t s = static_cast<size_t>(i / block * n + c);
          want += x[static_cast<size_t>(r * k + i)] * static_cast<float>(q[static_cast<size_t>(i * n + c)] - z[s]) * scales[s];
        }
        EXPECT_EQ(got[static_cast<size_t>(r * n + c)], want) << r << "," << c;
      }
  }
  // Blocks along N are not MatMulNBits' layout: the weight is dequantized once a session instead.
  TestModel m(21);
  m.input("x", {1, 2}).tensor("w", {2, 32}, kOnnxInt4, packed_4bit(std::vector<int>(64, -3))).floats("s", {2, 2}, {1, 2, 3, 4});
  m.node("DequantizeLinear", {"w", "s"}, {"wf"}).attr("axis", int64_t{1}).attr("block_size", int64_t{16});
  m.node("MatMul", {"x", "wf"}, {"y"}).output("y");
  declare_float(m, "wf", {2, 32});
  auto l = lower(m.load());
  EXPECT_EQ(op_types(l->program()), (std::vector<std::string>{"DequantizeLinear", "PanelWeight", "MatMul"}));
  auto y = run_lowered(*l, {testing::bytes_of_floats({1, 1})});
  std::vector<float> got(32);
  std::memcpy(got.data(), y[0].data(), 128);
  EXPECT_EQ(got[0], -12.0f);   // -3 * 1 + -3 * 3
  EXPECT_EQ(got[31], -18.0f);  // -3 * 2 + -3 * 4
}

// A QDQ Concat concatenates integers: an input quantized as the result is copied as it is, the
// other requantized on its own, with the unit's arithmetic (halves to even).
TEST(RefLower, AQdqConcatConcatenatesIntegers) {
  const int32_t kU8 = onnx::TensorProto::UINT8;
  auto l = lower(TestModel(13)
                     .input("a", {1, 2}, kU8)
                     .input("b", {1, 3}, kU8)
                     .floats("half", {}, {0.5f})
                     .floats("quarter", {}, {0.25f})
                     .tensor("z", {}, kU8, {0})
                     .node("DequantizeLinear", {"a", "half", "z"}, {"af"})
                     .node("DequantizeLinear", {"b", "quarter", "z"}, {"bf"})
                     .node("Concat", {"af", "bf"}, {"c"})
                     .attr("axis", int64_t{1})
                     .node("QuantizeLinear", {"c", "half", "z"}, {"y"})
                     .output("y", kU8)
                     .load());
  // The other input's DequantizeLinear and QuantizeLinear: one Requantize, a table of their results.
  EXPECT_EQ(op_types(l->program()), (std::vector<std::string>{"Requantize", "Concat"}));
  // b / 2: 1 -> 0 (0.5 to even), 3 -> 2 (1.5 to even), 200 -> 100
  EXPECT_EQ(run_lowered(*l, {{7, 255}, {1, 3, 200}})[0], (std::vector<uint8_t>{7, 255, 0, 2, 100}));
}

// A ConvInteger with a constant weight computes in float32 where every sum is exact there (the
// weight stays uint8 in the store, dequantized and laid out once a session), and gives the exact
// integer sums; with weights whose sums could pass 2^24 it keeps its integer kernel.
TEST(RefLower, AConvIntegerWhoseSumsFitFloat32ComputesInFloat32) {
  const int32_t kU8 = onnx::TensorProto::UINT8;
  const std::vector<uint8_t> w = {1, 2, 130, 255, 0, 128, 128, 127};  // [2, 1, 2, 2], zero point 128
  const std::vector<uint8_t> x = {0, 255, 7, 100, 3, 250, 9, 1, 128}, xz = {3};
  // (x - 3) convolved with (w - 128), in plain integers.
  std::vector<int32_t> expected;
  for (int m = 0; m < 2; ++m)
    for (int r = 0; r < 2; ++r)
      for (int c = 0; c < 2; ++c) {
        const auto tap = [&](int k, int at) { return (w[static_cast<size_t>(m * 4 + k)] - 128) * (x[static_cast<size_t>(at)] - 3); };
        expected.push_back(tap(0, r * 3 + c) + tap(1, r * 3 + c + 1) + tap(2, (r + 1) * 3 + c) + tap(3, (r + 1) * 3 + c + 1));
      }
  auto l = lower(TestModel(13)
                     .input("x", {1, 1, 3, 3}, kU8)
                     .input("xz", {}, kU8)
                     .tensor("w", {2, 1, 2, 2}, kU8, w)
                     .tensor("wz", {}, kU8, {128})
                     .node("ConvInteger", {"x", "w", "xz", "wz"}, {"y"})
                     .output("y", onnx::TensorProto::INT32)
                     .load());
  // Where the compiling CPU's int8 convolutions are exact, a 2-D one stays, for oneDNN's.
  const bool int8 = runtime::runs_qlinear_conv();
  const auto types = op_types(l->program());
  EXPECT_EQ(std::count(types.begin(), types.end(), std::string("ConvInteger")), int8 ? 1 : 0);
  EXPECT_EQ(std::count(types.begin(), types.end(), std::string("Conv")), int8 ? 0 : 1);
  EXPECT_EQ(types.back(), int8 ? "ConvInteger" : "Cast");
  for (const auto& v : l->program().values) {
    if (v.kind == ValueKind::kWeight && v.element_count() == 8) {
      EXPECT_EQ(v.dtype, ref::DType::kUInt8) << "the weight stays uint8";
    }
  }
  auto y = run_lowered(*l, {x, xz});
  std::vector<int32_t> got(8);
  std::memcpy(got.data(), y[0].data(), 32);
  EXPECT_EQ(got, expected);

  // A 1-D one computes in float32 on every CPU: row 0 of the image, the kernels' top rows.
  auto line = lower(TestModel(13)
                        .input("x", {1, 1, 3}, kU8)
                        .input("xz", {}, kU8)
                        .tensor("w", {2, 1, 2}, kU8, {w[0], w[1], w[4], w[5]})
                        .tensor("wz", {}, kU8, {128})
                        .node("ConvInteger", {"x", "w", "xz", "wz"}, {"y"})
                        .output("y", onnx::TensorProto::INT32)
                        .load());
  EXPECT_EQ(op_types(line->program()).back(), "Cast");
  y = run_lowered(*line, {{x[0], x[1], x[2]}, xz});
  std::vector<int32_t> row(4);
  std::memcpy(row.data(), y[0].data(), 16);
  const auto tap = [&](int k, int at) { return (w[static_cast<size_t>(k)] - 128) * (x[static_cast<size_t>(at)] - 3); };
  EXPECT_EQ(row, (std::vector<int32_t>{tap(0, 0) + tap(1, 1), tap(0, 1) + tap(1, 2), tap(4, 0) + tap(5, 1), tap(4, 1) + tap(5, 2)}));

  // 600 channels of |0 - 128|: 255 x 76,800 passes 2^24.
  auto wide = lower(TestModel(13)
                        .input("x", {1, 600, 1, 1}, kU8)
                        .tensor("w", {1, 600, 1, 1}, kU8, std::vector<uint8_t>(600, 0))
                        .tensor("wz", {}, kU8, {128})
                        .node("ConvInteger", {"x", "w", "", "wz"}, {"y"})
                        .output("y", onnx::TensorProto::INT32)
                        .load());
  EXPECT_EQ(op_types(wide->program()), (std::vector<std::string>{"ConvInteger"}));
}

// With the bias scale exactly x_scale * w_scale, the unit becomes one QLinearConv reading the
// integers as stored, and computes ONNX Runtime's fused arithmetic: integer sums, one rounding.
TEST(RefLower, An8BitConvUnitBecomesOneQLinearConv) {
  if (!runtime::runs_qlinear_conv()) GTEST_SKIP() << "this CPU has no VNNI: 8-bit Conv units stay as they are";
  auto l = lower(testing::qdq_conv_unit("", onnx::TensorProto::UINT8, {128}, true).load());
  const auto& p = l->program();
  EXPECT_EQ(op_types(p), (std::vector<std::string>{"QuantizeLinear", "QLinearConv", "DequantizeLinear"}));
  const ref::Op& conv = only_op(p, "QLinearConv");
  EXPECT_EQ(value(p, conv.inputs[1]).dtype, ref::DType::kInt8);
  EXPECT_EQ(value(p, conv.inputs[2]).dtype, ref::DType::kInt32);
  EXPECT_EQ(conv.get_int("x_zero_point", -1), 128);
  const std::vector<float> x = {0.1f, -0.2f, 0.3f, 0.45f, 0.5f, -0.6f, 0.7f, 0.8f, 0.9f};
  auto y = run_lowered(*l, {testing::bytes_of_floats(x)});
  std::vector<float> got(8);
  std::memcpy(got.data(), y[0].data(), 32);
  const int w[2][4] = {{1, 2, 3, 4}, {-1, -2, -3, 127}};
  const int bias[2] = {10, -10};
  const float ws[2] = {0.1f, 0.02f};
  for (int m = 0; m < 2; ++m)
    for (int r = 0; r < 2; ++r)
      for (int c = 0; c < 2; ++c) {
        const auto q = [&](int i) { return static_cast<int>(std::clamp(std::nearbyint(x[static_cast<size_t>(i)] / 0.05f) + 128, 0.0f, 255.0f)) - 128; };
        const int acc = bias[m] + w[m][0] * q(r * 3 + c) + w[m][1] * q(r * 3 + c + 1) + w[m][2] * q((r + 1) * 3 + c) +
                        w[m][3] * q((r + 1) * 3 + c + 1);
        const float scale = 0.05f * ws[m] / 0.02f;
        const float yq = std::clamp(std::nearbyint(static_cast<float>(acc) * scale) + 128, 0.0f, 255.0f);
        EXPECT_EQ(got[static_cast<size_t>(m * 4 + r * 2 + c)], (yq - 128) * 0.02f) << m << r << c;
      }
}

// Units the fused op cannot express stay as they are: a weight scale of 0 (a pruned channel) makes
// a requantization scale of 0, and an int8 image is not a unit ONNX Runtime fuses on x86.
TEST(RefLower, ConvUnitsTheFusedOpCannotExpressStay) {
  auto zero_scale = testing::qdq_conv_unit("", onnx::TensorProto::UINT8, {128}, true);
  for (auto& t : *zero_scale.proto().mutable_graph()->mutable_initializer())
    if (t.name() == "w_scale") {
      const float scales[2] = {0.1f, 0.0f};
      t.set_raw_data(std::string(reinterpret_cast<const char*>(scales), sizeof scales));
    }
  const auto zero_ops = op_types(lower(zero_scale.load())->program());
  EXPECT_EQ(std::count(zero_ops.begin(), zero_ops.end(), std::string("Conv")), 1);
  const auto signed_ops = op_types(lower(testing::qdq_conv_unit("", onnx::TensorProto::INT8, {0xFB}, true).load())->program());
  EXPECT_EQ(std::count(signed_ops.begin(), signed_ops.end(), std::string("Conv")), 1);
  EXPECT_EQ(std::count(signed_ops.begin(), signed_ops.end(), std::string("QLinearConv")), 0);
}

// A float16 model: the ops that do not take half values compute in float32 between Casts, with no
// round trip through 16 bits between two of them (Conv and its Relu fuse again); the Transpose moves
// half values; the weight stays float16 in the store, widened and laid out for the packed Conv by
// ops the runtime runs once a session.
TEST(RefLower, HalfPrecisionOpsComputeInFloat32AndKeepTheirWeightsHalf) {
  auto half_bytes = [](const std::vector<float>& v) {
    std::vector<uint8_t> b;
    for (float f : v) {
      const uint16_t h = runtime::half_of(f);
      b.push_back(static_cast<uint8_t>(h & 0xFF));
      b.push_back(static_cast<uint8_t>(h >> 8));
    }
    return b;
  };
  const int32_t kHalf = onnx::TensorProto::FLOAT16;
  auto l = lower(TestModel(13)
                     .input("x", {1, 1, 3, 3}, kHalf)
                     .tensor("w", {2, 1, 2, 2}, kHalf, half_bytes({0.5f, -1.0f, 0.25f, 2.0f, 1.0f, 1.0f, -1.0f, 0.125f}))
                     .node("Conv", {"x", "w"}, {"c"})
                     .node("Relu", {"c"}, {"r"})
                     .node("Transpose", {"r"}, {"t"})
                     .attr("perm", std::vector<int64_t>{0, 1, 3, 2})
                     .node("Sigmoid", {"t"}, {"y"})
                     .output("y", kHalf)
                     .load());
  const auto& p = l->program();
  EXPECT_EQ(op_types(p),
            (std::vector<std::string>{"Cast", "Cast", "ConvWeight", "Conv", "Cast", "Transpose", "Cast", "Sigmoid", "Cast"}));
  EXPECT_EQ(only_op(p, "Conv").get_int("act", 0), static_cast<int64_t>(ref::Activation::kRelu));
  EXPECT_EQ(only_op(p, "Conv").get_int("packed", 0), 1);
  EXPECT_EQ(only_op(p, "ConvWeight").inputs[0], p.ops[1].outputs[0]);  // the weight's Cast
  for (const auto& v : p.values) {
    if (v.kind == ValueKind::kWeight) {
      EXPECT_EQ(v.dtype, ref::DType::kFloat16);
    }
  }
  const std::vector<float> x = {0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f, 0.7f, 0.8f, 0.9f};
  auto y = run_lowered(*l, {half_bytes(x)});
  const float w[2][4] = {{0.5f, -1.0f, 0.25f, 2.0f}, {1.0f, 1.0f, -1.0f, 0.125f}};
  auto h = [](float v) { return runtime::float_of_half(runtime::half_of(v)); };
  for (int m = 0; m < 2; ++m)
    for (int r = 0; r < 2; ++r)
      for (int c = 0; c < 2; ++c) {
        const float s = w[m][0] * h(x[r * 3 + c]) + w[m][1] * h(x[r * 3 + c + 1]) + w[m][2] * h(x[(r + 1) * 3 + c]) +
                        w[m][3] * h(x[(r + 1) * 3 + c + 1]);
        // Rounded to half where the Transpose moves it, and at the output.
        const float want = h(1.0f / (1.0f + std::exp(-h(std::max(s, 0.0f)))));
        uint16_t got;
        std::memcpy(&got, y[0].data() + 2 * (m * 4 + c * 2 + r), 2);  // transposed
        EXPECT_NEAR(runtime::float_of_half(got), want, 1e-3) << m << r << c;
      }
}

// The model's own Casts through float16 round: only the Casts ref adds to compute half values in
// float32 are skipped in pairs.
TEST(RefLower, AModelsOwnCastToHalfStillRounds) {
  auto l = lower(TestModel(13)
                     .input("x", {2})
                     .node("Cast", {"x"}, {"h"})
                     .attr("to", int64_t{onnx::TensorProto::FLOAT16})
                     .node("Cast", {"h"}, {"f"})
                     .attr("to", int64_t{onnx::TensorProto::FLOAT})
                     .node("Relu", {"f"}, {"y"})
                     .output("y")
                     .load());
  EXPECT_EQ(op_types(l->program()), (std::vector<std::string>{"Cast", "Cast", "Relu"}));
  const auto y = run_lowered(*l, {testing::bytes_of_floats({1e5f, 1.0009765625f + 1e-4f})});
  std::vector<float> got(2);
  std::memcpy(got.data(), y[0].data(), 8);
  EXPECT_EQ(got[0], std::numeric_limits<float>::infinity()) << "past 65504: infinity in float16";
  EXPECT_EQ(got[1], 1.0009765625f) << "rounded to float16's step near 1";
}

// Quantized integers that the quantizer leaves without QDQ around a MaxPool or a Resize (ONNX
// Runtime runs them on uint8) are pooled and resized as they are; a float op such as Add stays
// refused. A QDQ unit around a MaxPool or a Reshape with one scale and zero point runs the op on
// the integers, exactly; with another scale after the op, the unit stays. A QDQ Resize of 8-bit
// values runs on them as ONNX Runtime runs it, its blend truncated.
TEST(RefLower, MaxPoolAndResizeRunOnQuantizedValues) {
  const int32_t kU8 = onnx::TensorProto::UINT8;
  auto l = lower(TestModel(13)
                     .input("x", {1, 1, 2, 4}, kU8)
                     .node("MaxPool", {"x"}, {"y"})
                     .attr("kernel_shape", std::vector<int64_t>{2, 2})
                     .attr("strides", std::vector<int64_t>{2, 2})
                     .output("y", kU8)
                     .load());
  EXPECT_EQ(op_types(l->program()), (std::vector<std::string>{"MaxPool"}));
  const auto y = run_lowered(*l, {{3, 250, 7, 8, 255, 0, 9, 1}});
  EXPECT_EQ(y[0], (std::vector<uint8_t>{255, 9}));
  auto add = TestModel(14).input("a", {2}, kU8).input("b", {2}, kU8).node("Add", {"a", "b"}, {"c"}).output("c", kU8).load();
  EXPECT_FALSE(testing::support_of(add, "Add").supported);
  // Before opset 14 Add takes no uint8: ONNX Runtime refuses such a model, and so does the loader.
  EXPECT_THROW(TestModel(13).input("a", {2}, kU8).input("b", {2}, kU8).node("Add", {"a", "b"}, {"c"}).output("c", kU8).load(),
               Error);

  const auto unit = [](float out_scale, float in_scale = 0.25f) {
    return lower(TestModel(13)
                     .input("x", {1, 1, 2, 4}, onnx::TensorProto::UINT8)
                     .floats("s", {}, {in_scale})
                     .floats("s2", {}, {out_scale})
                     .tensor("z", {}, onnx::TensorProto::UINT8, {3})
                     .node("DequantizeLinear", {"x", "s", "z"}, {"xf"})
                     .node("MaxPool", {"xf"}, {"p"})
                     .attr("kernel_shape", std::vector<int64_t>{2, 2})
                     .attr("strides", std::vector<int64_t>{2, 2})
                     .node("Reshape", {"p", "shape"}, {"r"})
                     .int64s("shape", {2}, {1, 2})
                     .node("QuantizeLinear", {"r", "s2", "z"}, {"y"})
                     .output("y", onnx::TensorProto::UINT8)
                     .load());
  };
  auto same = unit(0.25f);
  EXPECT_EQ(op_types(same->program()), (std::vector<std::string>{"MaxPool", "Reshape"}));
  for (const auto& v : same->program().values) EXPECT_EQ(v.dtype, ref::DType::kUInt8) << "no float values left";
  EXPECT_EQ(run_lowered(*same, {{3, 250, 7, 8, 255, 0, 9, 1}})[0], (std::vector<uint8_t>{255, 9}));
  auto other = unit(0.5f);
  EXPECT_EQ(op_types(other->program()), (std::vector<std::string>{"DequantizeLinear", "MaxPool", "Reshape", "QuantizeLinear"}));
  // (250 - 3) / 4 / 0.5 + 3 = 126.5 -> 126 (half to even); (9 - 3) / 4 / 0.5 + 3 = 6
  EXPECT_EQ(run_lowered(*other, {{3, 250, 7, 8, 255, 0, 9, 1}})[0], (std::vector<uint8_t>{129, 6}));
  const auto resize = [](bool qdq) {
    TestModel t(13);
    t.input("x", {1, 1, 1, 2}, onnx::TensorProto::UINT8).floats("s", {}, {0.5f}).tensor("z", {}, onnx::TensorProto::UINT8, {0});
    t.floats("scales", {4}, {1, 1, 1, 2});
    if (qdq) t.node("DequantizeLinear", {"x", "s", "z"}, {"xf"});
    t.node("Resize", {qdq ? "xf" : "x", "", "scales"}, {qdq ? "r" : "y"}).attr("mode", std::string("linear"));
    if (qdq) t.node("QuantizeLinear", {"r", "s", "z"}, {"y"});
    return lower(t.output("y", onnx::TensorProto::UINT8).load());
  };
  for (bool qdq : {false, true}) {
    SCOPED_TRACE(qdq ? "QDQ" : "bare");
    auto r = resize(qdq);
    EXPECT_EQ(op_types(r->program()), (std::vector<std::string>{"Resize"}));
    // half_pixel, 2 -> 4: 10, 10.75 (0.25 of the way: truncated), 11.25 -> 11, 12
    EXPECT_EQ(run_lowered(*r, {{10, 12}})[0], (std::vector<uint8_t>{10, 10, 11, 12}));
  }
  // A negative scale reverses the order: the maximum of the values is the minimum of the integers.
  auto reversed = unit(-0.25f, -0.25f);
  EXPECT_EQ(op_types(reversed->program()), (std::vector<std::string>{"DequantizeLinear", "MaxPool", "Reshape", "QuantizeLinear"}));
  EXPECT_EQ(run_lowered(*reversed, {{3, 250, 7, 8, 255, 0, 9, 1}})[0], (std::vector<uint8_t>{0, 1}));
}

}  // namespace
}  // namespace ctxgen
