// validate() rejects programs that are inconsistent, so execute() never reads or writes out of
// bounds: each case breaks one thing in an otherwise valid program.

#include <cstdint>
#include <functional>
#include <limits>

#include "runtime_test_util.h"

namespace ctxgen::testing {
namespace {

// x [1,2,4,4] -> Conv (w [3,2,3,3], pads 1) -> t [1,3,4,4] (arena) -> Add(t, bias [3,1,1]) -> y.
struct ConvAdd {
  ProgramBuilder b;
  int32_t x, w, t, bias, y;
  ConvAdd() {
    x = b.input({1, 2, 4, 4});
    w = b.weight({3, 2, 3, 3}, 0);
    t = b.arena({1, 3, 4, 4});
    bias = b.weight({3, 1, 1}, 1);
    y = b.output({1, 3, 4, 4});
    b.op("Conv", {x, w, -1}, t,
         {ints_attr("kernel_shape", {3, 3}), ints_attr("strides", {1, 1}), ints_attr("pads", {1, 1, 1, 1}),
          ints_attr("dilations", {1, 1}), int_attr("group", 1), int_attr("act", 1)});
    b.op("Add", {t, bias}, y);
  }
  ref::Program& p() { return b.program(); }
  ref::Op& conv() { return p().ops[0]; }
  ref::Value& value(int32_t id) { return p().values[static_cast<size_t>(id)]; }
};

void expect_invalid(const ref::Program& p, const std::string& part, size_t weights = 2) {
  expect_error([&] { runtime::validate(p, weights); }, ErrorCode::kInvalidBinary, part);
}

void remove_attr(ref::Op& op, const std::string& name) {
  std::erase_if(op.attrs, [&](const ref::Attr& a) { return a.name == name; });
}

TEST(RuntimeValidate, AcceptsTheBaseProgram) {
  ConvAdd c;
  EXPECT_NO_THROW(runtime::validate(c.p(), 2));
}

TEST(RuntimeValidate, RejectsWrongDims) {
  {
    ConvAdd c;
    c.value(c.t).dims = {1, 3, 3, 3};  // Conv output: pads 1 keep 4x4
    expect_invalid(c.p(), "op 0 (Conv): output has dims [1,3,3,3], expected [1,3,4,4]");
  }
  {
    ConvAdd c;
    c.value(c.bias).dims = {2, 1, 1};
    expect_invalid(c.p(), "op 1 (Add): input dims [1,3,4,4] and [2,1,1] do not broadcast");
  }
  {
    ConvAdd c;
    c.value(c.w).dims = {3, 1, 3, 3};
    expect_invalid(c.p(), "group 1 does not fit input [1,2,4,4] and weight [3,1,3,3]");
  }
  {
    ConvAdd c;
    c.conv().attrs[0].ints = {3, 2};
    expect_invalid(c.p(), "attribute 'kernel_shape' [3,2] differs from weight dims [3,2,3,3]");
  }
}

TEST(RuntimeValidate, RejectsBadIds) {
  {
    ConvAdd c;
    c.conv().inputs[0] = 99;
    expect_invalid(c.p(), "op 0 (Conv): input 0 refers to value 99, the program has 5");
  }
  {
    ConvAdd c;
    c.conv().outputs[0] = -1;
    expect_invalid(c.p(), "output refers to value -1");
  }
  {
    ConvAdd c;
    expect_invalid(c.p(), "value 3 (weight) refers to weight 1, the binary has 1", 1);
  }
  {
    ConvAdd c;
    c.value(c.x).index = 1;
    expect_invalid(c.p(), "graph input 0 is value 0 of kind input index 1, expected kind input index 0");
  }
  {
    ConvAdd c;
    c.p().outputs.push_back(c.t);
    expect_invalid(c.p(), "graph output 1 is value 2 of kind arena index 0, expected kind output index 1");
  }
  {
    ConvAdd c;
    c.p().inputs.clear();
    expect_invalid(c.p(), "value 0 (input) has input index 0, but graph input 0 does not exist (0 inputs)");
  }
}

TEST(RuntimeValidate, RejectsArenaOverflow) {
  {
    ConvAdd c;
    c.p().arena_bytes = 128;  // t needs 192
    expect_invalid(c.p(), "value 2 (arena) at offset 0 with 192 bytes ends past the arena of 128 bytes");
  }
  {
    ConvAdd c;
    c.value(c.t).index = std::numeric_limits<uint64_t>::max() - 63;  // offset + size wraps around
    expect_invalid(c.p(), "ends past the arena");
  }
  {
    ConvAdd c;
    c.value(c.t).index = 8;
    expect_invalid(c.p(), "offset 8 is not a multiple of 64");
  }
  {
    ConvAdd c;
    c.value(c.t).dims = {int64_t{1} << 40, int64_t{1} << 40};  // the element count overflows
    expect_invalid(c.p(), "hold more than 2^48 elements");
  }
  {
    ConvAdd c;
    c.value(c.x).dims[0] = -1;
    expect_invalid(c.p(), "are negative");
  }
}

TEST(RuntimeValidate, RejectsUnknownOpsAndMissingAttributes) {
  {
    ConvAdd c;
    c.p().ops[1].type = "Gelu";
    expect_invalid(c.p(), "op 1 has unknown type 'Gelu'");
  }
  {
    ConvAdd c;
    remove_attr(c.conv(), "pads");
    expect_invalid(c.p(), "op 0 (Conv): attribute 'pads' (ints) is missing");
  }
  {
    ConvAdd c;
    c.conv().attrs[4] = float_attr("group", 1);
    expect_invalid(c.p(), "attribute 'group' (int) is missing");
  }
  {
    ConvAdd c;
    c.conv().attrs[1].ints = {0, 1};
    expect_invalid(c.p(), "attribute 'strides' [0,1] has a value outside [1, 2147483647]");
  }
  {
    ConvAdd c;
    c.conv().attrs[5].i = 2;  // LeakyRelu needs act_alpha
    expect_invalid(c.p(), "attribute 'act_alpha' (float) is missing");
  }
  {
    ConvAdd c;
    c.conv().attrs[5].i = 8;
    expect_invalid(c.p(), "attribute 'act' is 8, expected a value in [0, 7]");
  }
}

TEST(RuntimeValidate, RejectsWrongInputCounts) {
  {
    ConvAdd c;
    c.conv().inputs = {c.x};
    expect_invalid(c.p(), "op 0 (Conv): has 1 inputs, expected 2 to 3");
  }
  {
    ConvAdd c;
    c.p().ops[1].inputs.push_back(c.x);
    expect_invalid(c.p(), "op 1 (Add): has 3 inputs, expected 2");
  }
  {
    ConvAdd c;
    c.conv().inputs[1] = -1;
    expect_invalid(c.p(), "required input 1 is absent");
  }
  {
    ConvAdd c;
    c.conv().outputs.push_back(c.y);
    expect_invalid(c.p(), "has 2 outputs, expected 1");
  }
}

TEST(RuntimeValidate, RejectsBadDataflow) {
  {
    ConvAdd c;
    std::swap(c.p().ops[0], c.p().ops[1]);
    expect_invalid(c.p(), "op 0 (Add): input 0 reads value 2 before any op writes it");
  }
  {
    ConvAdd c;
    c.p().ops[1].outputs[0] = c.w;
    expect_invalid(c.p(), "writes value 1 of kind weight, expected an arena or output value");
  }
  {
    ConvAdd c;
    c.p().ops.pop_back();
    expect_invalid(c.p(), "graph output 0 (value 4) is never written");
  }
  {
    // In-place in the arena: the kernels read inputs while writing the output.
    ProgramBuilder b;
    int32_t x = b.input({16});
    int32_t t = b.arena({16}, 0);
    int32_t u = b.arena({16}, 0);
    int32_t y = b.output({16});
    b.op("Relu", {x}, t);
    b.op("Neg", {t}, u);
    b.op("Abs", {u}, y);
    expect_invalid(b.program(), "op 1 (Neg): input 0 (value 1) overlaps the output (value 2) in the arena", 0);
  }
  {
    // A Reshape may write exactly over its input (it copies nothing then), not partly.
    for (const uint64_t at : {uint64_t{0}, uint64_t{64}}) {
      ProgramBuilder b;
      int32_t x = b.input({32});
      int32_t t = b.arena({32}, 0);
      int32_t u = b.arena({2, 16}, at);
      int32_t y = b.output({2, 16});
      b.op("Relu", {x}, t);
      b.op("Reshape", {t}, u, {ints_attr("shape", {2, 16})});
      b.op("Neg", {u}, y);
      if (at == 0) EXPECT_NO_THROW(runtime::validate(b.program(), 0));
      else expect_invalid(b.program(), "op 1 (Reshape): input 0 (value 1) overlaps the output (value 2) in the arena", 0);
    }
  }
}

// One op over small inputs, for the per-op rules.
ref::Program single(const std::string& type, const std::vector<std::pair<Dims, ref::DType>>& inputs, Dims out,
                    std::vector<ref::Attr> attrs, ref::DType out_dtype = ref::DType::kFloat32) {
  ProgramBuilder b;
  std::vector<int32_t> ids;
  for (const auto& [dims, dtype] : inputs) ids.push_back(b.input(dims, dtype));
  int32_t y = b.output(std::move(out), out_dtype);
  b.op(type, ids, y, std::move(attrs));
  return b.program();
}

constexpr ref::DType kF = ref::DType::kFloat32, kI = ref::DType::kInt64, kI32 = ref::DType::kInt32,
                     kB = ref::DType::kBool;

// A packed 2-D Conv computing channels last may read and write channels-last images [N, 1, H, W, C].
TEST(RuntimeValidate, ChannelsLastConvImagesHaveTheirDims) {
  const auto conv = [](Dims x, Dims y, std::vector<ref::Attr> layout) {
    std::vector<ref::Attr> attrs = {ints_attr("kernel_shape", {3, 3}), ints_attr("strides", {1, 1}),
                                    ints_attr("pads", {1, 1, 1, 1}), ints_attr("dilations", {1, 1}), int_attr("group", 1),
                                    int_attr("packed", 1), ints_attr("weight_shape", {16, 8, 3, 3}),
                                    ints_attr("weight_layout", {16, 8, 3, 3, 72, 9, 3, 1})};
    attrs.insert(attrs.end(), layout.begin(), layout.end());
    return single("Conv", {{x, kF}, {{16 * 8 * 9}, kF}}, y, attrs);
  };
  const auto last = int_attr("channels_last", 1), src = int_attr("src_channels_last", 1), dst = int_attr("dst_channels_last", 1);
  EXPECT_NO_THROW(runtime::validate(conv({1, 1, 4, 4, 8}, {1, 1, 4, 4, 16}, {last, src, dst}), 1));
  EXPECT_NO_THROW(runtime::validate(conv({1, 8, 4, 4}, {1, 1, 4, 4, 16}, {last, dst}), 1));
  EXPECT_NO_THROW(runtime::validate(conv({1, 8, 4, 4}, {1, 16, 4, 4}, {last}), 1));
  expect_invalid(conv({1, 8, 4, 4}, {1, 16, 4, 4}, {last, src}),
                 "input 0 has dims [1,8,4,4], expected [N, 1, H, W, C] (channels last)", 1);
  expect_invalid(conv({1, 1, 4, 4, 8}, {1, 16, 4, 4}, {last, src, dst}), "output has dims [1,16,4,4], expected [1,1,4,4,16]", 1);
  expect_invalid(conv({1, 1, 4, 4, 8}, {1, 16, 4, 4}, {src}),
                 "channels-last images on a convolution that does not compute channels last", 1);
  auto plain = conv({1, 8, 4, 4}, {1, 16, 4, 4}, {last});
  std::erase_if(plain.ops[0].attrs, [](const ref::Attr& a) {
    return a.name == "packed" || a.name == "weight_shape" || a.name == "weight_layout";
  });
  plain.values[1].dims = {16, 8, 3, 3};
  expect_invalid(plain, "channels_last on a convolution whose weight is not packed", 1);
}

// A packed weight's recorded layout is handed to oneDNN, which reads wherever it points: it must
// pad the weight's dims into whole blocks and stay inside the weight.
TEST(RuntimeValidate, PackedConvLayoutStaysInsideItsWeight) {
  const auto conv = [](Dims layout, int64_t weight, int64_t group = 1) {
    return single("Conv", {{{1, 8, 4, 4}, kF}, {{weight}, kF}}, {1, 16, 4, 4},
                  {ints_attr("kernel_shape", {3, 3}), ints_attr("strides", {1, 1}), ints_attr("pads", {1, 1, 1, 1}),
                   ints_attr("dilations", {1, 1}), int_attr("group", group), int_attr("packed", 1),
                   ints_attr("weight_shape", {16, 8 / group, 3, 3}), ints_attr("weight_layout", layout)});
  };
  // oneDNN's AVX2 layouts of this weight: OIhw8i8o, and grouped (2 groups of 8 x 4) gOIhw8o.
  EXPECT_NO_THROW(runtime::validate(conv({16, 8, 3, 3, 576, 576, 192, 64, 1, 8, 0, 8}, 1152), 1));
  EXPECT_NO_THROW(runtime::validate(conv({2, 8, 4, 3, 3, 288, 288, 72, 24, 8, 1, 8}, 576, 2), 1));
  EXPECT_NO_THROW(runtime::validate(conv({16, 8, 3, 3, 72, 9, 3, 1}, 1152), 1));
  expect_invalid(conv({16, 8, 3, 3, 72, 9, 3}, 1152), "attribute 'weight_layout' has 7 values, expected 8", 1);
  expect_invalid(conv({16, 8, 3, 3, 576, 576, 192, 64, 4, 8}, 1152), "a block is outside the dims", 1);
  expect_invalid(conv({16, 8, 3, 3, 576, 576, 192, 64, 1, 0}, 1152), "a block is outside the dims", 1);
  // oneDNN would take a block of 2^32 - 8 for -8 in its 32-bit index arithmetic.
  const int64_t huge = (int64_t{1} << 32) - 8;
  expect_invalid(conv({huge, 8, 3, 3, int64_t{1} << 40, 0, 0, 0, 0, huge}, huge), "a block is outside the dims", 1);
  expect_invalid(conv({16, 8, 3, 3, 0, 0, 0, 0, 0, 256, 1, 512}, 1152), "its inner blocks hold more than 2^16 elements", 1);
  expect_invalid(conv({12, 8, 3, 3, 72, 9, 3, 1}, 1152), "dim 0 is not a padding of [16,8,3,3] into whole blocks", 1);
  expect_invalid(conv({16, 8, 3, 3, 576, 576, 192, 64, 1, 7}, 1152), "dim 1 is not a padding", 1);
  expect_invalid(conv({16, 8, 3, 3, 72, -9, 3, 1}, 1152), "dim 1 is not a padding", 1);
  expect_invalid(conv({16, 8, 3, 3, 73, 9, 3, 1}, 1152), "reaches element 1166 of a packed weight of 1152", 1);
  expect_invalid(conv({16, 8, 3, 3, 72, 9, 3, 1}, 1151), "reaches element 1151 of a packed weight of 1151", 1);
  expect_invalid(conv({int64_t{1} << 48, 8, 3, 3, int64_t{1} << 48, 9, 3, 1}, 1152),
                 "its offsets overflow", 1);
  auto unrecorded = conv({16, 8, 3, 3, 72, 9, 3, 1}, 1152);
  remove_attr(unrecorded.ops[0], "weight_layout");
  expect_invalid(unrecorded, "attribute 'weight_layout' (ints) is missing", 1);
}

// A packed ConvTranspose shares Conv's plan: the attributes only a Conv may carry (channels-last
// images, an epilogue) are refused on it, as is output_padding its end padding cannot cover, and
// output channels (weight_shape[1] x group) that would overflow before the layout is checked.
TEST(RuntimeValidate, PackedConvTransposeCarriesOnlyItsOwnAttributes) {
  const auto deconv = [](std::vector<ref::Attr> more, Dims weight_shape = {8, 4, 2, 2}, int64_t group = 1,
                         Dims extra = {0, 0}) {
    std::vector<ref::Attr> attrs = {ints_attr("kernel_shape", {2, 2}), ints_attr("strides", {2, 2}),
                                    ints_attr("pads", {0, 0, 0, 0}), ints_attr("dilations", {1, 1}),
                                    ints_attr("output_padding", extra), int_attr("group", group), int_attr("packed", 1),
                                    ints_attr("weight_shape", weight_shape), ints_attr("weight_layout", {4, 8, 2, 2, 4, 16, 2, 1})};
    attrs.insert(attrs.end(), more.begin(), more.end());
    return single("ConvTranspose", {{{1, 8, 3, 3}, kF}, {{128}, kF}}, {1, 4, 6, 6}, attrs);
  };
  EXPECT_NO_THROW(runtime::validate(deconv({}), 1));
  for (const char* name : {"channels_last", "src_channels_last", "dst_channels_last", "act"})
    expect_invalid(deconv({int_attr(name, 1)}), std::string("attribute '") + name + "' on a ConvTranspose", 1);
  expect_invalid(deconv({float_attr("out_scale", 2.0f)}), "attribute 'out_scale' on a ConvTranspose", 1);
  expect_invalid(deconv({}, {8, 4, 2, 2}, 1, {1, 1}), "a packed ConvTranspose whose output_padding exceeds its end padding", 1);
  expect_invalid(deconv({}, {8, int64_t{1} << 48, 2, 2}, 8), "make over 2^48 output channels", 1);
}

TEST(RuntimeValidate, PerOpShapeRules) {
  expect_invalid(single("MatMul", {{{2, 3}, kF}, {{4, 5}, kF}}, {2, 5}, {}), "inner dims differ: [2,3] x [4,5]", 0);
  expect_invalid(single("MatMul", {{{2, 2, 3}, kF}, {{3, 3, 5}, kF}}, {2, 2, 5}, {}), "batch dims of", 0);
  expect_invalid(single("Gemm", {{{2, 3}, kF}, {{3, 4}, kF}, {{3}, kF}}, {2, 4},
                        {int_attr("transA", 0), int_attr("transB", 0), float_attr("alpha", 1), float_attr("beta", 1)}),
                 "C dims [3] do not broadcast to [2,4]", 0);
  expect_invalid(single("Reshape", {{{2, 3}, kF}}, {5}, {ints_attr("shape", {5})}),
                 "output dims [5] hold 5 elements, input dims [2,3] hold 6", 0);
  // The output dims are the `shape` attribute, not whatever the output value says.
  expect_invalid(single("Reshape", {{{2, 3}, kF}}, {3, 2}, {ints_attr("shape", {6})}), "output has dims [3,2], expected [6]", 0);
  expect_invalid(single("Reshape", {{{2, 3}, kF}}, {6}, {}), "op 0 (Reshape): attribute 'shape' (ints) is missing", 0);
  expect_invalid(single("Concat", {{{2, 3}, kF}, {{3, 3}, kF}}, {2, 6}, {int_attr("axis", 1)}),
                 "input 1 has dims [3,3], which differ from input 0 [2,3] outside axis 1", 0);
  expect_invalid(single("Transpose", {{{2, 3}, kF}}, {3, 2}, {ints_attr("perm", {1, 1})}), "is not a permutation", 0);
  expect_invalid(single("Transpose", {{{2, 3}, kF}}, {2, 3}, {ints_attr("perm", {1, 0})}),
                 "output has dims [2,3], expected [3,2]", 0);
  expect_invalid(single("Softmax", {{{2, 3}, kF}}, {2, 3}, {int_attr("axis", 2), int_attr("coerce_2d", 0)}),
                 "attribute 'axis' is 2, expected a value in [0, 1]", 0);
  expect_invalid(single("LayerNormalization", {{{2, 3}, kF}, {{2}, kF}}, {2, 3}, {int_attr("axis", 1), float_attr("epsilon", 0)}),
                 "input 1 dims [2] do not cover the normalised dims [3]", 0);
  expect_invalid(single("ReduceSum", {{{2, 3}, kF}}, {2}, {ints_attr("axes", {1, 0}), int_attr("keepdims", 0)}),
                 "is not a sorted list of distinct axes", 0);
  expect_invalid(single("ReduceSum", {{{2, 3}, kF}}, {2, 1}, {ints_attr("axes", {1}), int_attr("keepdims", 0)}),
                 "output has dims [2,1], expected [2]", 0);
  expect_invalid(single("Gather", {{{3, 2}, kF}, {{2}, kF}}, {2, 2}, {int_attr("axis", 0)}),
                 "input 1 (indices) has element type float32, expected int64 or int32", 0);
  EXPECT_NO_THROW(runtime::validate(single("Gather", {{{3, 2}, kF}, {{2}, kI32}}, {2, 2}, {int_attr("axis", 0)}), 0));
  expect_invalid(single("Gather", {{{3, 2}, kF}, {{2}, kI}}, {2, 3}, {int_attr("axis", 0)}),
                 "output has dims [2,3], expected [2,2]", 0);
  expect_invalid(single("Relu", {{{2}, kI}}, {2}, {}), "input 0 has element type int64, expected float32", 0);
  expect_invalid(single("BatchNormalization", {{{1, 2, 2}, kF}, {{2}, kF}, {{2}, kF}, {{3}, kF}, {{2}, kF}}, {1, 2, 2},
                        {float_attr("epsilon", 0)}),
                 "input 3 has dims [3], expected [2]", 0);
}

// Each rule computes the output element type from its inputs: mixed types are refused, and the
// output value must have the type the rule computes.
TEST(RuntimeValidate, PerOpElementTypeRules) {
  EXPECT_NO_THROW(runtime::validate(single("Add", {{{2}, kI32}, {{2}, kI32}}, {2}, {}, kI32), 0));
  expect_invalid(single("Add", {{{2}, kI32}, {{2}, kI}}, {2}, {}, kI32),
                 "op 0 (Add): input 1 has element type int64, expected int32", 0);
  expect_invalid(single("Add", {{{2}, kB}, {{2}, kB}}, {2}, {}, kB), "input 0 has element type bool, which this op does not take", 0);
  expect_invalid(single("Add", {{{2}, kI}, {{2}, kI}}, {2}, {}), "output has element type float32, expected int64", 0);
  // A float32 Add may run an epilogue (a fused activation, scalars), an Add of integers not.
  EXPECT_NO_THROW(runtime::validate(single("Add", {{{2}, kF}, {{2}, kF}}, {2}, {int_attr("act", 1), float_attr("out_lo", 0)}), 0));
  expect_invalid(single("Add", {{{2}, kI32}, {{2}, kI32}}, {2}, {int_attr("act", 1)}, kI32), "attribute 'act' on an Add of int32", 0);
  expect_invalid(single("Add", {{{2}, kF}, {{2}, kF}}, {2}, {int_attr("act", 99)}), "act", 0);
  expect_invalid(single("Equal", {{{2}, kF}, {{2}, kF}}, {2}, {}), "output has element type float32, expected bool", 0);
  expect_invalid(single("Less", {{{2}, kB}, {{2}, kB}}, {2}, {}, kB), "input 0 has element type bool, which this op does not take", 0);
  expect_invalid(single("And", {{{2}, kI32}, {{2}, kI32}}, {2}, {}, kB), "input 0 has element type int32, expected bool", 0);
  expect_invalid(single("Where", {{{2}, kF}, {{2}, kF}, {{2}, kF}}, {2}, {}),
                 "input 0 (condition) has element type float32, expected bool", 0);
  expect_invalid(single("Where", {{{2}, kB}, {{2}, kF}, {{2}, kI}}, {2}, {}), "input 2 has element type int64, expected float32", 0);
  expect_invalid(single("Where", {{{3}, kB}, {{2}, kF}, {{2}, kF}}, {2}, {}), "input dims [3] and [2] do not broadcast", 0);
  expect_invalid(single("Cast", {{{2}, kF}}, {2}, {int_attr("to", 8)}), "attribute 'to' is 8, not a ref element type", 0);
  expect_invalid(single("Cast", {{{2}, kF}}, {2}, {int_attr("to", static_cast<int64_t>(kI))}),
                 "output has element type float32, expected int64", 0);
  expect_invalid(single("Sqrt", {{{2}, kI32}}, {2}, {}, kI32), "input 0 has element type int32, expected float32", 0);
  expect_invalid(single("Shape", {{{2, 3, 4}, kF}}, {1}, {int_attr("start", 2), int_attr("end", 1)}, kI),
                 "attribute 'end' is 1, expected a value in [2, 3]", 0);
  expect_invalid(single("Size", {{{2, 3}, kF}}, {1}, {}, kI), "output has dims [1], expected []", 0);
}

TEST(RuntimeValidate, GeneratedAndDataMovementRules) {
  auto constant = [](ref::DType dtype, ref::Attr value, Dims out) {
    return single("ConstantOfShape", {}, out, {int_attr("dtype", static_cast<int64_t>(dtype)), value, ints_attr("shape", {2})},
                  dtype);
  };
  EXPECT_NO_THROW(runtime::validate(constant(kI, int_attr("value", 3), {2}), 0));
  // The fill value is an int attribute for integer types and a float for float32.
  expect_invalid(constant(kI, float_attr("value", 3), {2}), "attribute 'value' (int) is missing", 0);
  expect_invalid(constant(kF, int_attr("value", 3), {2}), "attribute 'value' (float) is missing", 0);
  expect_invalid(constant(kI, int_attr("value", 3), {3}), "output has dims [3], expected [2]", 0);
  expect_invalid(single("Range", {}, {0}, {int_attr("dtype", static_cast<int64_t>(kB)), int_attr("start", 0),
                                           int_attr("delta", 1), int_attr("count", 0)}, kB),
                 "Range of bool", 0);
  expect_invalid(single("Range", {}, {4}, {int_attr("dtype", static_cast<int64_t>(kI)), int_attr("start", 0),
                                           int_attr("delta", 1), int_attr("count", 3)}, kI),
                 "output has dims [4], expected [3]", 0);
  expect_invalid(single("Expand", {{{3}, kF}}, {2}, {ints_attr("shape", {2})}), "input dims [3] do not broadcast to [2]", 0);
  expect_invalid(single("Tile", {{{2, 2}, kF}}, {4, 2}, {ints_attr("repeats", {2})}), "attribute 'repeats' has 1 values, expected 2", 0);
  expect_invalid(single("Trilu", {{{3}, kF}}, {3}, {int_attr("upper", 1), int_attr("k", 0)}), "input has dims [3], expected rank >= 2", 0);
  auto pad = [](Dims x, Dims pads, int64_t mode, Dims out) {
    return single("Pad", {{x, kF}}, out, {ints_attr("pads", pads), int_attr("mode", mode), float_attr("value", 0)});
  };
  EXPECT_NO_THROW(runtime::validate(pad({3}, {2, 2}, 1, {7}), 0));
  expect_invalid(pad({3}, {3, 0}, 1, {6}), "reflect pads [3,0] reach past axis 0 of size 3", 0);
  expect_invalid(pad({0}, {1, 0}, 2, {1}), "pads an empty axis 0 in reflect or edge mode", 0);
  expect_invalid(pad({3}, {-2, -2}, 0, {0}), "pads [-2,-2] remove more than axis 0 holds", 0);
  expect_invalid(pad({3}, {0, 0}, 3, {3}), "attribute 'mode' is 3, expected a value in [0, 2]", 0);
  // ReduceMax/ReduceMin have no value for an empty reduction.
  expect_invalid(single("ReduceMax", {{{2, 0}, kF}}, {2}, {ints_attr("axes", {1}), int_attr("keepdims", 0)}),
                 "reduces the empty axis 1", 0);
  // Data movement keeps the element type.
  EXPECT_NO_THROW(runtime::validate(single("Transpose", {{{2, 3}, kB}}, {3, 2}, {ints_attr("perm", {1, 0})}, kB), 0));
  expect_invalid(single("Transpose", {{{2, 3}, kB}}, {3, 2}, {ints_attr("perm", {1, 0})}),
                 "output has element type float32, expected bool", 0);
}

TEST(RuntimeValidate, ConvScratchStaysBounded) {
  // Each tensor is within 64 GiB, but im2col would need 2^24 x 2^26 elements.
  int64_t side = (int64_t{1} << 13) + 4095;
  expect_invalid(single("Conv", {{{1, 1, side, side}, kF}, {{1, 1, 4096, 4096}, kF}}, {1, 1, 1 << 13, 1 << 13},
                        {ints_attr("kernel_shape", {4096, 4096}), ints_attr("strides", {1, 1}),
                         ints_attr("pads", {0, 0, 0, 0}), ints_attr("dilations", {1, 1}), int_attr("group", 1)}),
                 "needs more than 2^48 elements", 0);
}

TEST(RuntimeValidate, SliceReadsStayInBounds) {
  auto slice = [](Dims starts, Dims steps, Dims out) {
    return single("Slice", {{{2, 4}, kF}}, out, {ints_attr("starts", starts), ints_attr("steps", steps), ints_attr("sizes", out)});
  };
  EXPECT_NO_THROW(runtime::validate(slice({1, 3}, {-1, -2}, {2, 2}), 0));
  expect_invalid(slice({1, 3}, {-1, -2}, {2, 3}), "3 elements from 3 by step -2 on axis 1 run outside [0, 4)", 0);
  expect_invalid(slice({2, 0}, {1, 1}, {1, 4}), "start 2 on axis 0 is outside [0, 2)", 0);
  expect_invalid(slice({0, 0}, {1, INT64_MAX}, {1, 2}), "run outside", 0);
  expect_invalid(slice({0, 3}, {1, INT64_MIN}, {1, 2}), "run outside", 0);
  expect_invalid(slice({0, 0}, {1, 0}, {1, 4}), "step 0 on axis 1", 0);
  // An empty axis reads nothing, so its start is not checked.
  EXPECT_NO_THROW(runtime::validate(slice({0, 9}, {1, 1}, {2, 0}), 0));
  // The output value must have the dims `sizes` gives.
  expect_invalid(single("Slice", {{{2, 4}, kF}}, {2, 3}, {ints_attr("starts", {0, 0}), ints_attr("steps", {1, 1}), ints_attr("sizes", {2, 2})}),
                 "output has dims [2,3], expected [2,2]", 0);
  expect_invalid(single("Slice", {{{2, 4}, kF}}, {2, 2}, {ints_attr("starts", {0, 0}), ints_attr("steps", {1, 1})}),
                 "attribute 'sizes' (ints) is missing", 0);
}

// The rule computes pool output dims exactly: floor, or ceil with `ceil_mode` = 1.
TEST(RuntimeValidate, PoolOutputDimsFollowCeilMode) {
  auto pool = [](Dims out, std::vector<ref::Attr> more = {}, Dims pads = {0, 0, 0, 0}) {
    std::vector<ref::Attr> attrs = {ints_attr("kernel_shape", {2, 2}), ints_attr("strides", {2, 2}), ints_attr("pads", pads),
                                    ints_attr("dilations", {1, 1})};
    attrs.insert(attrs.end(), more.begin(), more.end());
    return single("MaxPool", {{{1, 1, 5, 5}, kF}}, std::move(out), attrs);
  };
  EXPECT_NO_THROW(runtime::validate(pool({1, 1, 2, 2}), 0));                              // floor, ceil_mode absent
  EXPECT_NO_THROW(runtime::validate(pool({1, 1, 2, 2}, {int_attr("ceil_mode", 0)}), 0));  // floor
  EXPECT_NO_THROW(runtime::validate(pool({1, 1, 3, 3}, {int_attr("ceil_mode", 1)}), 0));  // ceil
  // No longer "either": the other rounding, or ceil on one axis only, is refused.
  expect_invalid(pool({1, 1, 3, 2}), "output has dims [1,1,3,2], expected [1,1,2,2]", 0);
  expect_invalid(pool({1, 1, 3, 3}), "output has dims [1,1,3,3], expected [1,1,2,2]", 0);
  expect_invalid(pool({1, 1, 2, 2}, {int_attr("ceil_mode", 1)}), "output has dims [1,1,2,2], expected [1,1,3,3]", 0);
  expect_invalid(pool({1, 1, 4, 2}), "output has dims [1,1,4,2], expected [1,1,2,2]", 0);
  expect_invalid(pool({1, 1, 2, 2}, {int_attr("ceil_mode", 2)}), "attribute 'ceil_mode' is 2, expected a value in [0, 1]", 0);
  // Pads 1 on both ends: ceil((5 + 2 - 2) / 2) + 1 = 4 windows, but the last would start at input
  // index 5, inside the end padding, so ONNX Runtime (and ref) drop it: 3, as floor gives too.
  EXPECT_NO_THROW(runtime::validate(pool({1, 1, 3, 3}, {int_attr("ceil_mode", 1)}, {1, 1, 1, 1}), 0));
  expect_invalid(pool({1, 1, 4, 4}, {int_attr("ceil_mode", 1)}, {1, 1, 1, 1}), "output has dims [1,1,4,4], expected [1,1,3,3]", 0);
  // Input 6, kernel 3, stride 2: ceil gives 3 windows starting at 0, 2, 4 (the last clipped to
  // [4, 6)), floor gives 2.
  auto avg = [](Dims out, int64_t ceil_mode) {
    return single("AveragePool", {{{1, 1, 1, 6}, kF}}, std::move(out),
                  {ints_attr("kernel_shape", {1, 3}), ints_attr("strides", {1, 2}), ints_attr("pads", {0, 0, 0, 0}),
                   int_attr("count_include_pad", 0), int_attr("ceil_mode", ceil_mode)});
  };
  EXPECT_NO_THROW(runtime::validate(avg({1, 1, 1, 3}, 1), 0));
  EXPECT_NO_THROW(runtime::validate(avg({1, 1, 1, 2}, 0), 0));
  expect_invalid(avg({1, 1, 1, 3}, 0), "output has dims [1,1,1,3], expected [1,1,1,2]", 0);
  expect_invalid(single("AveragePool", {{{1, 1, 5, 5}, kF}}, {1, 1, 2, 2},
                        {ints_attr("kernel_shape", {6, 2}), ints_attr("strides", {1, 1}), ints_attr("pads", {0, 0, 0, 0}),
                         int_attr("count_include_pad", 0)}),
                 "window [6,2] on axis 2 is larger than the padded input [1,1,5,5]", 0);
}

// A crafted binary can declare any arena; the bound is what its values need.
TEST(RuntimeValidate, RejectsAnArenaLargerThanItsValues) {
  ConvAdd c;
  c.p().arena_bytes = uint64_t{1} << 40;
  expect_invalid(c.p(), "the arena of 1099511627776 bytes is larger than all its values together (192 bytes)");
  // A value no op writes buys no arena: only written values count.
  ConvAdd unused;
  unused.b.arena({1 << 20});
  expect_invalid(unused.p(), "the arena of 4194496 bytes is larger than all its values together (192 bytes)");
}

// Windows are below 2^31 each, but their product per output is what a kernel loops over.
TEST(RuntimeValidate, RejectsAProgramNeedingMoreThan2To48ElementOperations) {
  ProgramBuilder b;
  const int64_t k = int64_t{1} << 30;
  int32_t x = b.input({1, 1, 4, 4});
  int32_t y = b.output({1, 1, 5, 5});
  b.op("MaxPool", {x}, y,
       {ints_attr("kernel_shape", {k, k}), ints_attr("strides", {1, 1}), ints_attr("pads", {k / 2, k / 2, k / 2, k / 2}),
        ints_attr("dilations", {1, 1})});
  expect_invalid(b.program(), "op 0 (MaxPool): the program needs more than 2^48 element operations per run", 0);
}

// A reduction whose output is empty has nothing to compute, however long the reduced axis: before
// execute() skipped it, the kernel looped 2^40 times over nothing (this test then times out).
TEST(RuntimeValidate, AnOpWithAnEmptyOutputDoesNoWork) {
  ProgramBuilder b;
  int32_t x = b.input({1, int64_t{1} << 40, 0});
  int32_t y = b.output({1, 1, 0});
  b.op("ReduceSum", {x}, y, {ints_attr("axes", {1}), int_attr("keepdims", 1)});
  EXPECT_TRUE(run_bytes(b.program(), {Bytes{}})[0].empty());
}

// An empty input with a non-empty output (a reduction to a scalar, a summed loss) once made the
// kernels walk the input's other axes: [369098755, 514, 0] spun for minutes per run in a checksum-
// valid binary. Now the walk stops at the empty axis, and the positions such an input spans count
// as work, so one spanning more than 2^48 is refused.
TEST(RuntimeValidate, AnEmptyInputIsNotWalkedAndItsSpanCountsAsWork) {
  const int64_t big = 369098755;
  for (const char* type : {"ReduceSum", "ReduceMean", "ReduceL2", "ReduceSumSquare"}) {
    SCOPED_TRACE(type);
    ProgramBuilder b;
    int32_t x = b.input({big, 514, 0});
    int32_t y = b.output({});
    b.op(type, {x}, y, {ints_attr("axes", {}), int_attr("keepdims", 0)});
    EXPECT_EQ(run_bytes(b.program(), {Bytes{}})[0].size(), sizeof(float));
  }
  {
    ProgramBuilder b;
    int32_t x = b.input({big, 514, 0});
    int32_t t = b.input({big, 0}, ref::DType::kInt64);
    int32_t y = b.output({});
    b.op("NegativeLogLikelihoodLoss", {x, t}, y,
         {int_attr("reduction", 1), int_attr("ignore_index", 0), int_attr("has_ignore_index", 0)});
    EXPECT_EQ(values_of<float>(run_bytes(b.program(), {Bytes{}, Bytes{}})[0]), std::vector<float>{0.0f});
  }
  ProgramBuilder b;
  const int64_t side = int64_t{1} << 30;
  int32_t x = b.input({0, side, side});
  int32_t y = b.output({});
  b.op("ReduceSum", {x}, y, {ints_attr("axes", {}), int_attr("keepdims", 0)});
  expect_invalid(b.program(), "op 0 (ReduceSum): the program needs more than 2^48 element operations per run", 0);
}

}  // namespace
}  // namespace ctxgen::testing
