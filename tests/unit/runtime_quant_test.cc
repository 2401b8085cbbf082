// QuantizeLinear and DequantizeLinear: rounding, saturation, the three ways of giving scales, and
// quantized values passing through data-movement ops unchanged; MatMulNBits.

#include <array>
#include <cmath>
#include <limits>
#include <tuple>

#include "runtime_test_util.h"

namespace ctxgen::testing {
namespace {

using ref::DType;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

std::vector<ref::Attr> quant(int64_t axis, int64_t block, DType dtype) {
  return {int_attr("axis", axis), int_attr("block_size", block), int_attr("dtype", static_cast<int64_t>(dtype))};
}
std::vector<ref::Attr> dequant(int64_t axis, int64_t block) { return {int_attr("axis", axis), int_attr("block_size", block)}; }

TEST(RuntimeQuant, QuantizeRoundsHalfToEvenAndSaturates) {
  // scale 0.5: x / scale = 2x. Halves go to the even neighbour, out-of-range values and infinities
  // saturate, NaN gives the lowest value (as ONNX Runtime's x86 kernel does).
  const std::vector<float> x = {0.25f, 0.75f, 1.25f, -0.25f, -0.75f, 3.0f, 1000.0f, -1000.0f, kInf, -kInf, kNaN, 63.4f};
  const Dims d = {static_cast<int64_t>(x.size())};
  const Bytes y = run_op_bytes("QuantizeLinear", {{d, f32(x)}, {{}, f32({0.5f})}, {{}, bytes_of<uint8_t>({128}), DType::kUInt8}},
                               d, DType::kUInt8, quant(0, 0, DType::kUInt8));
  EXPECT_EQ(y, (Bytes{128, 130, 130, 128, 126, 134, 255, 0, 255, 0, 0, 255}));
  const auto s8 = run_op_as<int8_t>("QuantizeLinear", {{d, f32(x)}, {{1}, f32({0.5f})}, {{1}, bytes_of<int8_t>({-3}), DType::kInt8}},
                                    d, quant(0, 0, DType::kInt8));
  EXPECT_EQ(s8, (std::vector<int8_t>{-3, -1, -1, -3, -5, 3, 127, -128, 127, -128, -128, 124}));
  // No zero point: 0; 16-bit ranges.
  const auto u16 = run_op_as<uint16_t>("QuantizeLinear", {{{3}, f32({-1.0f, 70000.0f, 1234.5f})}, {{}, f32({1.0f})}}, {3},
                                       quant(0, 0, DType::kUInt16));
  EXPECT_EQ(u16, (std::vector<uint16_t>{0, 65535, 1234}));
  const auto s16 = run_op_as<int16_t>("QuantizeLinear", {{{3}, f32({-40000.0f, 40000.0f, -2.5f})}, {{}, f32({1.0f})}}, {3},
                                      quant(0, 0, DType::kInt16));
  EXPECT_EQ(s16, (std::vector<int16_t>{-32768, 32767, -2}));
}

TEST(RuntimeQuant, ScalesPerAxisAndPerBlock) {
  // [2,3] per axis 1: column c has scale 2^c and zero point c.
  const auto axis = run_op_as<int8_t>(
      "QuantizeLinear",
      {{{2, 3}, f32({2, 2, 2, -8, -8, -8})}, {{3}, f32({1, 2, 4})}, {{3}, bytes_of<int8_t>({0, 1, 2}), DType::kInt8}}, {2, 3},
      quant(1, 0, DType::kInt8));
  EXPECT_EQ(axis, (std::vector<int8_t>{2, 2, 2, -8, -3, 0}));
  // Per axis 0 of [2,3]: row r has scale r + 1.
  const auto rows = run_op_as<int16_t>("QuantizeLinear", {{{2, 3}, f32({1, 2, 3, 4, 6, 8})}, {{2}, f32({1, 2})}}, {2, 3},
                                       quant(0, 0, DType::kInt16));
  EXPECT_EQ(rows, (std::vector<int16_t>{1, 2, 3, 2, 3, 4}));
  // Blocks of 2 along axis 1 of [2,5] (the last block short): scales [2,3].
  const std::vector<float> scales = {1, 10, 100, 2, 20, 200};
  const auto blocked = run_op_as<int16_t>(
      "QuantizeLinear", {{{2, 5}, f32({10, 10, 10, 10, 1000, 10, 10, 40, 40, 400})}, {{2, 3}, f32(scales)}}, {2, 5},
      quant(1, 2, DType::kInt16));
  EXPECT_EQ(blocked, (std::vector<int16_t>{10, 10, 1, 1, 10, 5, 5, 2, 2, 2}));
  // Dequantizing with the same scales gives each element's block back.
  const auto back = run_op("DequantizeLinear", {{{2, 5}, bytes_of<int16_t>(blocked), DType::kInt16}, {{2, 3}, f32(scales)}},
                           {2, 5}, dequant(1, 2));
  expect_near(back, {10, 10, 10, 10, 1000, 10, 10, 40, 40, 400});
  // Blocks along axis 0 of [3,2], block 2: scales [2,2].
  const auto down = run_op("DequantizeLinear",
                           {{{3, 2}, bytes_of<int8_t>({1, 1, 1, 1, 1, 1}), DType::kInt8}, {{2, 2}, f32({1, 2, 3, 4})},
                            {{2, 2}, bytes_of<int8_t>({0, 0, 0, -1}), DType::kInt8}},
                           {3, 2}, dequant(0, 2));
  expect_near(down, {1, 2, 1, 2, 3, 8});
}

TEST(RuntimeQuant, DequantizeEveryIntegerType) {
  const Dims d = {4};
  expect_near(run_op("DequantizeLinear", {{d, bytes_of<uint8_t>({0, 128, 255, 1}), DType::kUInt8}, {{}, f32({0.5f})},
                                          {{}, bytes_of<uint8_t>({128}), DType::kUInt8}}, d, dequant(0, 0)),
              {-64, 0, 63.5f, -63.5f});
  expect_near(run_op("DequantizeLinear", {{d, bytes_of<int8_t>({-128, 127, 0, -1}), DType::kInt8}, {{}, f32({2.0f})},
                                          {{}, bytes_of<int8_t>({127}), DType::kInt8}}, d, dequant(0, 0)),
              {-510, 0, -254, -256});
  expect_near(run_op("DequantizeLinear", {{d, bytes_of<uint16_t>({0, 65535, 32768, 1}), DType::kUInt16}, {{}, f32({1.0f})},
                                          {{}, bytes_of<uint16_t>({32768}), DType::kUInt16}}, d, dequant(0, 0)),
              {-32768, 32767, 0, -32767});
  expect_near(run_op("DequantizeLinear", {{d, bytes_of<int16_t>({-32768, 32767, 0, 5}), DType::kInt16}, {{}, f32({1.0f})},
                                          {{}, bytes_of<int16_t>({32767}), DType::kInt16}}, d, dequant(0, 0)),
              {-65535, 0, -32767, -32762});
  // int32 (a quantized bias), no zero point, per axis.
  expect_near(run_op("DequantizeLinear", {{{2, 2}, i32({-2147483647, 3, 4, 5}), DType::kInt32}, {{2}, f32({1.0f, 0.25f})}},
                     {2, 2}, dequant(1, 0)),
              {-2147483647.0f, 0.75f, 4, 1.25f});
}

// Requantize gives what a DequantizeLinear and a QuantizeLinear give one after the other, for
// every byte, every pair of 8-bit types, long runs (a vector's worth at a time) and their tails.
TEST(RuntimeQuant, RequantizeIsDequantizeThenQuantize) {
  Bytes x;
  for (int i = 0; i < 3 * 256 + 5; ++i) x.push_back(static_cast<uint8_t>((i * 37 + i / 256) & 255));
  const Dims d = {static_cast<int64_t>(x.size())};
  for (DType from : {DType::kUInt8, DType::kInt8})
    for (DType to : {DType::kUInt8, DType::kInt8})
      for (const auto& [x_scale, y_scale] : {std::pair{0.37f, 0.11f}, std::pair{0.02f, 0.5f}, std::pair{1.0f, 1.0f}}) {
        const int64_t x_zero = from == DType::kInt8 ? -3 : 131, y_zero = to == DType::kInt8 ? 7 : 60;
        const Bytes dequantized = run_op_bytes(
            "DequantizeLinear",
            {{d, x, from}, {{}, f32({x_scale})}, {{}, Bytes{static_cast<uint8_t>(x_zero)}, from}}, d, DType::kFloat32,
            dequant(0, 0));
        const Bytes expected =
            run_op_bytes("QuantizeLinear", {{d, dequantized}, {{}, f32({y_scale})}, {{}, Bytes{static_cast<uint8_t>(y_zero)}, to}}, d,
                         to, quant(0, 0, to));
        const Bytes got = run_op_bytes("Requantize", {{d, x, from}}, d, to,
                                       {float_attr("x_scale", x_scale), int_attr("x_zero_point", x_zero),
                                        float_attr("y_scale", y_scale), int_attr("y_zero_point", y_zero),
                                        int_attr("dtype", static_cast<int64_t>(to))});
        EXPECT_EQ(got, expected) << ref::dtype_name(from) << " -> " << ref::dtype_name(to) << ", scales " << x_scale << ", "
                                 << y_scale;
      }
}

TEST(RuntimeQuant, ARoundTripIsWithinHalfAStep) {
  // Split over threads (run_bytes' second run) or not, each element comes back within scale / 2.
  std::vector<float> x(5000);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(static_cast<float>(i)) * 3.0f;
  const Dims d = {50, 100};
  const float scale = 6.0f / 255.0f;
  const Bytes q = run_op_bytes("QuantizeLinear", {{d, f32(x)}, {{}, f32({scale})}, {{}, bytes_of<uint8_t>({127}), DType::kUInt8}},
                               d, DType::kUInt8, quant(0, 0, DType::kUInt8));
  const auto back = run_op("DequantizeLinear", {{d, q, DType::kUInt8}, {{}, f32({scale})}, {{}, bytes_of<uint8_t>({127}), DType::kUInt8}},
                           d, dequant(0, 0));
  for (size_t i = 0; i < x.size(); ++i) EXPECT_LE(std::fabs(back[i] - x[i]), scale / 2 * 1.0001f) << "element " << i;
}

TEST(RuntimeQuant, QuantizedValuesPassThroughDataMovementUnchanged) {
  const Bytes u8 = {0, 200, 255, 7, 128, 1};
  EXPECT_EQ(run_op_bytes("Transpose", {{{2, 3}, u8, DType::kUInt8}}, {3, 2}, DType::kUInt8, {ints_attr("perm", {1, 0})}),
            (Bytes{0, 7, 200, 128, 255, 1}));
  EXPECT_EQ(run_op_bytes("Concat", {{{1, 3}, Bytes{1, 2, 3}, DType::kUInt8}, {{1, 3}, Bytes{4, 5, 6}, DType::kUInt8}}, {2, 3},
                         DType::kUInt8, {int_attr("axis", 0)}),
            (Bytes{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(run_op_as<int16_t>("Gather", {{{3}, bytes_of<int16_t>({-5, 6, -7}), DType::kInt16}, {{2}, i64({2, 0}), DType::kInt64}}, {2},
                               {int_attr("axis", 0)}),
            (std::vector<int16_t>{-7, -5}));
  // uint8 is not bool: a Cast keeps its value (bool would give 1) and comes back from float.
  EXPECT_EQ(run_op_bytes("Cast", {{{6}, u8, DType::kUInt8}}, {6}, DType::kInt64, {int_attr("to", 7)}),
            i64({0, 200, 255, 7, 128, 1}));
  EXPECT_EQ(run_op_bytes("Cast", {{{3}, f32({200.0f, 255.9f, 3.0f})}}, {3}, DType::kUInt8, {int_attr("to", 2)}), (Bytes{200, 255, 3}));
  EXPECT_EQ(run_op_bytes("Cast", {{{3}, Bytes{0, 200, 1}, DType::kUInt8}}, {3}, DType::kBool, {int_attr("to", 9)}), (Bytes{0, 1, 1}));
  EXPECT_EQ(run_op_bytes("Pad", {{{2}, bytes_of<int8_t>({-1, 2}), DType::kInt8}}, {4}, DType::kInt8,
                         {ints_attr("pads", {1, 1}), int_attr("mode", 0), int_attr("value", -128)}),
            bytes_of<int8_t>({-128, -1, 2, -128}));
}

TEST(RuntimeQuant, RulesRefuseMismatchedScalesZeroPointsAndTypes) {
  auto check = [](const std::string& type, const std::vector<In>& inputs, DType out, std::vector<ref::Attr> attrs,
                  const std::string& part) {
    expect_error([&] { run_op_bytes(type, inputs, inputs[0].dims, out, attrs); }, ErrorCode::kInvalidBinary, part);
  };
  const In x = {{2, 3}, f32({1, 2, 3, 4, 5, 6})};
  // A zero point of another type than the output's.
  check("QuantizeLinear", {x, {{}, f32({1})}, {{}, bytes_of<int8_t>({0}), DType::kInt8}}, DType::kUInt8,
        quant(0, 0, DType::kUInt8), "input 2 (zero point) has element type int8, expected uint8");
  // Scales that are neither one value nor one per index of the axis, nor blocks.
  check("QuantizeLinear", {x, {{2}, f32({1, 1})}}, DType::kUInt8, quant(1, 0, DType::kUInt8),
        "input 1 (scale) has dims [2], expected one value or one per index of axis 1 of [2,3]");
  check("DequantizeLinear", {{{2, 3}, Bytes(6), DType::kUInt8}, {{2, 1}, f32({1, 1})}}, DType::kFloat32, dequant(1, 2),
        "input 1 (scale) has dims [2,1], expected [2,2]");
  check("DequantizeLinear", {{{2, 3}, Bytes(6), DType::kUInt8}, {{3}, f32({1, 1, 1})}, {{2}, Bytes(2), DType::kUInt8}},
        DType::kFloat32, dequant(1, 0), "input 2 (zero point) has dims [2], expected [3]");
  // Float or bool as the quantized type.
  check("QuantizeLinear", {x, {{}, f32({1})}}, DType::kFloat32, quant(0, 0, DType::kFloat32),
        "attribute 'dtype' is float32, expected an 8- or 16-bit integer type");
  check("DequantizeLinear", {{{2, 3}, Bytes(6), DType::kBool}, {{}, f32({1})}}, DType::kFloat32, dequant(0, 0),
        "input 0 has element type bool, expected an 8-, 16- or 32-bit integer type");
}

// A 4-bit weight stays packed, two values a byte, the first in the low bits: int4 values
// sign-extend, uint4 ones do not; zero points are packed alike; an odd count leaves half a byte.
TEST(RuntimeQuant, FourBitWeightsDequantizeFromTheirPackedBytes) {
  auto four_bit = [](int64_t axis, int64_t block, bool is_signed, Dims dims) {
    std::vector<ref::Attr> attrs = dequant(axis, block);
    attrs.push_back(int_attr("bits", 4));
    attrs.push_back(int_attr("signed", is_signed ? 1 : 0));
    attrs.push_back(ints_attr("dims", std::move(dims)));
    return attrs;
  };
  // [5] int4 values 1, -1, 7, -8, 3, one scale 0.5: bytes 0xF1, 0x87, 0x03.
  const Bytes x = {0xF1, 0x87, 0x03};
  expect_near(run_op("DequantizeLinear", {{{3}, x, DType::kUInt8}, {{}, f32({0.5f})}}, {5}, four_bit(0, 0, true, {5})),
              {0.5f, -0.5f, 3.5f, -4.0f, 1.5f});
  // The same bytes as uint4 (1, 15, 7, 8, 3) with a zero point of 8.
  expect_near(run_op("DequantizeLinear", {{{3}, x, DType::kUInt8}, {{}, f32({1.0f})}, {{1}, {0x08}, DType::kUInt8}}, {5},
                     four_bit(0, 0, false, {5})),
              {-7, 7, -1, 0, -5});
  // [3,2] int4 in blocks of 2 along axis 0 (scales [2,2]), int4 zero points 0, 1, -1, 2 packed.
  const Bytes w = {0x21, 0x43, 0x65};  // 1, 2, 3, 4, 5, 6
  expect_near(run_op("DequantizeLinear",
                     {{{3}, w, DType::kUInt8}, {{2, 2}, f32({1, 2, 3, 4})}, {{2}, {0x10, 0x2F}, DType::kUInt8}}, {3, 2},
                     four_bit(0, 2, true, {3, 2})),
              {1, 2, 3, 6, 18, 16});
  // Per axis 1 of [2,3] uint4, no zero point.
  expect_near(run_op("DequantizeLinear", {{{3}, w, DType::kUInt8}, {{3}, f32({1, 10, 100})}}, {2, 3}, four_bit(1, 0, false, {2, 3})),
              {1, 20, 300, 4, 50, 600});
  const auto rule = [&](Bytes packed, std::vector<In> rest, const std::string& part) {
    std::vector<In> inputs = {{{static_cast<int64_t>(packed.size())}, packed, DType::kUInt8}};
    inputs.insert(inputs.end(), rest.begin(), rest.end());
    expect_error([&] { run_op_bytes("DequantizeLinear", inputs, {5}, DType::kFloat32, four_bit(0, 0, true, {5})); },
                 ErrorCode::kInvalidBinary, part);
  };
  rule({1, 2}, {{{}, f32({1})}}, "input 0 has 2 bytes, expected 3 (4-bit values of dims [5])");
  rule({1, 2, 3}, {{{}, f32({1})}, {{2}, {0, 0}, DType::kUInt8}}, "input 2 (zero point) has 2 bytes, expected 1");
}

std::vector<ref::Attr> gather_blocks(Dims dims, int64_t gather_axis, int64_t quantize_axis, int64_t block, int64_t bits,
                                     bool is_signed, int64_t zero_point, int64_t zero_point_row) {
  return {ints_attr("dims", std::move(dims)), int_attr("gather_axis", gather_axis), int_attr("quantize_axis", quantize_axis),
          int_attr("block_size", block), int_attr("bits", bits), int_attr("signed", is_signed ? 1 : 0),
          int_attr("zero_point", zero_point), int_attr("zero_point_row", zero_point_row)};
}

// GatherBlockQuantized against values dequantized by hand: int4 rows with packed zero points, a
// negative index counting from the end, an index out of range giving zeros (as ONNX Runtime's
// kernel does), rows of zero points that start a byte each, float16 scales and output.
TEST(RuntimeQuant, GatherBlockQuantizedDequantizesTheRowsItGathers) {
  // A [3, 32] int4 table, value (r * 32 + c) % 16 - 8, blocks of 16 along axis 1: scales [3, 2].
  std::vector<int> q(96);
  for (size_t i = 0; i < q.size(); ++i) q[i] = static_cast<int>(i % 16) - 8;
  Bytes table(48, 0);
  for (size_t i = 0; i < q.size(); ++i) table[i / 2] |= static_cast<uint8_t>((q[i] & 0xF) << (i % 2 * 4));
  const std::vector<float> scales = {1, 2, 3, 4, 5, 6};
  const std::vector<int> zeros = {0, 1, -1, 2, -8, 7};
  Bytes zero_points(3, 0);
  for (size_t i = 0; i < zeros.size(); ++i) zero_points[i / 2] |= static_cast<uint8_t>((zeros[i] & 0xF) << (i % 2 * 4));
  const auto y = run_op("GatherBlockQuantized",
                        {{{48}, table, DType::kUInt8}, {{3}, bytes_of<int64_t>({2, -3, 3}), DType::kInt64}, {{3, 2}, f32(scales)},
                         {{3}, zero_points, DType::kUInt8}},
                        {3, 32}, gather_blocks({3, 32}, 0, 1, 16, 4, true, 0, 6));
  for (int64_t c = 0; c < 32; ++c) {
    const auto at = [&](int64_t r) { return static_cast<size_t>(r * 32 + c); };
    const size_t s2 = static_cast<size_t>(2 * 2 + c / 16), s0 = static_cast<size_t>(c / 16);
    EXPECT_EQ(y[static_cast<size_t>(c)], static_cast<float>(q[at(2)] - zeros[s2]) * scales[s2]) << c;
    EXPECT_EQ(y[static_cast<size_t>(32 + c)], static_cast<float>(q[at(0)] - zeros[s0]) * scales[s0]) << c;
    EXPECT_EQ(y[static_cast<size_t>(64 + c)], 0.0f) << c;
  }
  // uint8 holding 4-bit values along the last axis of [2, 48]: 3 blocks a row, zero points two
  // bytes a row (the third block's in the low bits of the second byte), float16 scales of 0.5.
  Bytes packed(48);
  for (size_t i = 0; i < packed.size(); ++i) packed[i] = static_cast<uint8_t>(i % 16 * 0x11);  // both values i % 16
  const Bytes zp = {0x21, 0x03, 0x54, 0x06};                                                  // rows (1, 2, 3), (4, 5, 6)
  const uint16_t half = runtime::half_of(0.5f);
  const auto h = values_of<uint16_t>(run_op_bytes("GatherBlockQuantized",
                                     {{{2, 24}, packed, DType::kUInt8}, {{1}, bytes_of<int32_t>({1}), DType::kInt32},
                                      {{2, 3}, bytes_of<uint16_t>({half, half, half, half, half, half}), DType::kFloat16},
                                      {{2, 2}, zp, DType::kUInt8}},
                                     {1, 48}, DType::kFloat16, gather_blocks({2, 48}, 0, 1, 16, 4, false, 8, 3)));
  for (int64_t c = 0; c < 48; ++c) {
    const float want = static_cast<float>((24 + c / 2) % 16 - (4 + c / 16)) * 0.5f;
    EXPECT_EQ(runtime::float_of_half(h[static_cast<size_t>(c)]), want) << c;
  }
  const auto rule = [](std::vector<In> inputs, std::vector<ref::Attr> attrs, const std::string& part) {
    expect_error([&] { run_op_bytes("GatherBlockQuantized", inputs, {1, 32}, DType::kFloat32, attrs); }, ErrorCode::kInvalidBinary,
                 part);
  };
  const In ids = {{1}, bytes_of<int64_t>({0}), DType::kInt64};
  const In two_scales = {{1, 2}, f32({1, 1})};
  rule({{{15}, Bytes(15), DType::kUInt8}, ids, two_scales}, gather_blocks({1, 32}, 0, 1, 16, 4, false, 0, 2),
       "input 0 (data) has 15 bytes, expected 16");
  rule({{{16}, Bytes(16), DType::kUInt8}, ids, {{1, 1}, f32({1})}}, gather_blocks({1, 32}, 0, 1, 16, 4, false, 0, 2),
       "input 2 (scales) has dims [1,1], expected [1,2]");
  rule({{{16}, Bytes(16), DType::kUInt8}, ids, two_scales}, gather_blocks({1, 32}, 0, 1, 24, 4, false, 0, 2),
       "block_size 24 is not a power of two");
  rule({{{16}, Bytes(16), DType::kUInt8}, ids, two_scales, {{2}, Bytes(2), DType::kUInt8}},
       gather_blocks({1, 32}, 0, 1, 16, 4, false, 0, 2), "input 3 (zero points) has 2 bytes, expected 1");
}

// MatMulNBits against the product with its weights dequantized by hand: 4 and 8 bits, with and
// without zero points and bias, K not a multiple of the block (the last block short), rows of A
// split over threads or not (run_bytes runs both).
// Small K: one slab of columns; K = 4096: slabs of 16 columns, the last one short.
TEST(RuntimeQuant, MatMulNBitsMultipliesByItsDequantizedBlocks) {
  for (const auto& [m, k, n, block] : std::vector<std::array<int64_t, 4>>{{3, 40, 5, 16}, {2, 4096, 40, 128}}) {
    const int64_t blocks = (k + block - 1) / block;
    for (int bits : {4, 8}) {
      for (bool with_zero_points : {false, true}) {
        for (bool with_bias : {false, true}) {
          SCOPED_TRACE(std::to_string(bits) + " bits, zero points " + std::to_string(with_zero_points) + ", bias " +
                       std::to_string(with_bias));
          const int top = (1 << bits) - 1;
          std::vector<int> q(static_cast<size_t>(n * blocks * block), 0);  // past K: padding, never read
          for (int64_t c = 0; c < n; ++c)
            for (int64_t i = 0; i < k; ++i) q[static_cast<size_t>(c * blocks * block + i)] = static_cast<int>((c * 7 + i * 5) % (top + 1));
          const int64_t blob = block * bits / 8;
          Bytes b(static_cast<size_t>(n * blocks * blob), 0);
          for (size_t i = 0; i < q.size(); ++i) {
            if (bits == 8) b[i] = static_cast<uint8_t>(q[i]);
            else b[i / 2] |= static_cast<uint8_t>(q[i] << (i % 2 == 0 ? 0 : 4));
          }
          std::vector<float> scales(static_cast<size_t>(n * blocks));
          for (size_t i = 0; i < scales.size(); ++i) scales[i] = 0.01f * static_cast<float>(i + 1);
          std::vector<int> zeros(static_cast<size_t>(n * blocks), 1 << (bits - 1));
          const int64_t zero_row = (blocks * bits + 7) / 8;
          Bytes zero_points(static_cast<size_t>(n * zero_row), 0);
          if (with_zero_points)
            for (int64_t c = 0; c < n; ++c)
              for (int64_t kb = 0; kb < blocks; ++kb) {
                const int z = static_cast<int>((c + 2 * kb) % (top + 1));
                zeros[static_cast<size_t>(c * blocks + kb)] = z;
                if (bits == 8) zero_points[static_cast<size_t>(c * zero_row + kb)] = static_cast<uint8_t>(z);
                else zero_points[static_cast<size_t>(c * zero_row + kb / 2)] |= static_cast<uint8_t>(z << (kb % 2 == 0 ? 0 : 4));
              }
          std::vector<float> bias(static_cast<size_t>(n));
          for (size_t i = 0; i < bias.size(); ++i) bias[i] = 0.25f * static_cast<float>(i % 7) - 0.5f;
          std::vector<float> a(static_cast<size_t>(m * k));
          for (size_t i = 0; i < a.size(); ++i) a[i] = std::cos(static_cast<float>(i));
          std::vector<In> inputs = {{{m, k}, f32(a)}, {{n, blocks, blob}, b, DType::kUInt8}, {{n * blocks}, f32(scales)},
                                    with_zero_points ? In{{n * zero_row}, zero_points, DType::kUInt8} : In{},
                                    with_bias ? In{{n}, f32(bias)} : In{}};
          const auto y = run_op("MatMulNBits", inputs, {m, n},
                                {int_attr("K", k), int_attr("N", n), int_attr("bits", bits), int_attr("block_size", block)});
          for (int64_t r = 0; r < m; ++r)
            for (int64_t c = 0; c < n; ++c) {
              double want = with_bias ? bias[static_cast<size_t>(c)] : 0;
              for (int64_t i = 0; i < k; ++i) {
                const size_t at = static_cast<size_t>(c * blocks + i / block);
                want += static_cast<double>(a[static_cast<size_t>(r * k + i)]) *
                        (q[static_cast<size_t>(c * blocks * block + i)] - zeros[at]) * scales[at];
              }
              EXPECT_NEAR(y[static_cast<size_t>(r * n + c)], want, 1e-4 * (1 + std::fabs(want))) << r << "," << c;
            }
        }
      }
    }
  }
}

TEST(RuntimeQuant, MatMulNBitsRuleChecksThePacking) {
  auto check = [](std::vector<In> inputs, std::vector<ref::Attr> attrs, const std::string& part) {
    expect_error([&] { run_op_bytes("MatMulNBits", inputs, {1, 4}, DType::kFloat32, attrs); }, ErrorCode::kInvalidBinary, part);
  };
  const std::vector<ref::Attr> attrs = {int_attr("K", 32), int_attr("N", 4), int_attr("bits", 4), int_attr("block_size", 16)};
  const In a = {{1, 32}, f32(std::vector<float>(32, 1.0f))};
  const In scales = {{8}, f32(std::vector<float>(8, 1.0f))};
  check({a, {{4, 2, 16}, Bytes(128), DType::kUInt8}, scales}, attrs, "input 1 (B) has dims [4,2,16], expected [4,2,8]");
  check({a, {{4, 2, 8}, Bytes(64), DType::kUInt8}, {{4}, f32({1, 1, 1, 1})}}, attrs, "expected N x blocks = 8 values");
  check({a, {{4, 2, 8}, Bytes(64), DType::kUInt8}, scales, {{8}, Bytes(8), DType::kUInt8}}, attrs, "expected 4 bytes");
  check({a, {{4, 2, 8}, Bytes(64), DType::kUInt8}, scales},
        {int_attr("K", 32), int_attr("N", 4), int_attr("bits", 5), int_attr("block_size", 16)}, "bits 5, expected 4 or 8");
  check({a, {{4, 2, 8}, Bytes(64), DType::kUInt8}, scales},
        {int_attr("K", 32), int_attr("N", 4), int_attr("bits", 4), int_attr("block_size", 24)}, "block_size 24 is not a power of two");
}

// MatMulInteger against the sums of products done by hand: uint8 x int8, a zero point per row of
// A and per column of B, a batched A with a 2-D B and with a batched B.
TEST(RuntimeQuant, MatMulIntegerIsExact) {
  const int64_t batch = 2, m = 3, k = 5, n = 4;
  std::vector<uint8_t> a(static_cast<size_t>(batch * m * k));
  std::vector<int8_t> b(static_cast<size_t>(batch * k * n));
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<uint8_t>((i * 37 + 11) % 256);
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<int8_t>((i * 53 + 7) % 256 - 128);
  const std::vector<uint8_t> za = {3, 250, 128};
  const std::vector<int8_t> zb = {-128, 0, 5, 127};
  for (bool batched_b : {false, true}) {
    const Dims bd = batched_b ? Dims{batch, k, n} : Dims{k, n};
    const auto y = run_op_as<int32_t>("MatMulInteger",
                                      {{{batch, m, k}, Bytes(a.begin(), a.end()), DType::kUInt8}, {bd, bytes_of(b), DType::kInt8},
                                       {{m}, Bytes(za.begin(), za.end()), DType::kUInt8}, {{n}, bytes_of(zb), DType::kInt8}},
                                      {batch, m, n});
    for (int64_t t = 0; t < batch; ++t)
      for (int64_t r = 0; r < m; ++r)
        for (int64_t c = 0; c < n; ++c) {
          int32_t want = 0;
          for (int64_t i = 0; i < k; ++i)
            want += (a[static_cast<size_t>((t * m + r) * k + i)] - za[static_cast<size_t>(r)]) *
                    (b[static_cast<size_t>(((batched_b ? t : 0) * k + i) * n + c)] - zb[static_cast<size_t>(c)]);
          EXPECT_EQ(y[static_cast<size_t>((t * m + r) * n + c)], want) << batched_b << t << r << c;
        }
  }
}

// ConvInteger against a direct convolution: padding holds the input's zero point (adds nothing),
// two groups, a weight zero point per output channel.
// A ConvInteger of a weight of the binary runs on oneDNN's int8 convolution where the CPU sums
// exactly (VNNI): the same int32 sums as the integer loops that run it with the weight as an input,
// for uint8 and int8 images and weights, zero points of any size (w - w_zero_point spans more than
// int8: the split into int8 weights), per tensor or per channel, padding, strides, dilations and
// groups.
TEST(RuntimeQuant, AConvIntegerOfAWeightGivesTheIntegerLoopsSums) {
  if (!runtime::runs_qlinear_conv()) GTEST_SKIP() << "this CPU's int8 convolutions are not exact (no VNNI)";
  struct Case {
    DType x, w;
    bool zero_each;
    int64_t group, stride, dilation;
  };
  for (const Case& k : {Case{DType::kUInt8, DType::kUInt8, false, 1, 1, 1}, Case{DType::kUInt8, DType::kUInt8, true, 2, 2, 1},
                        Case{DType::kInt8, DType::kInt8, true, 1, 1, 2}, Case{DType::kUInt8, DType::kInt8, false, 4, 1, 1}}) {
    SCOPED_TRACE(std::to_string(static_cast<int>(k.x)) + "/" + std::to_string(static_cast<int>(k.w)) + " group " +
                 std::to_string(k.group) + " stride " + std::to_string(k.stride) + " dilation " + std::to_string(k.dilation));
    const int64_t c = 8, h = 9, w = 7, m = 12, kh = 3, kw = 3;
    Bytes x(static_cast<size_t>(2 * c * h * w)), wt(static_cast<size_t>(m * (c / k.group) * kh * kw));
    for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<uint8_t>((i * 29 + 3) % 256);
    for (size_t i = 0; i < wt.size(); ++i) wt[i] = static_cast<uint8_t>((i * 41 + 17) % 256);
    const Bytes zx = {k.x == DType::kUInt8 ? uint8_t{131} : uint8_t{0xF9}};
    Bytes zw(k.zero_each ? static_cast<size_t>(m) : 1);
    // uint8 per tensor: 0, so 255 - 0 needs three int8 parts.
    for (size_t i = 0; i < zw.size(); ++i)
      zw[i] = static_cast<uint8_t>(k.w == DType::kUInt8 ? (k.zero_each ? 255 - i * 20 : 0) : 0x80 + i * 20);
    const auto span = [&](int64_t in, int64_t kernel) { return (in + 2 - k.dilation * (kernel - 1) - 1) / k.stride + 1; };
    const Dims y_dims = {2, m, span(h, kh), span(w, kw)};
    const std::vector<ref::Attr> attrs = {ints_attr("kernel_shape", {kh, kw}), ints_attr("strides", {k.stride, k.stride}),
                                          ints_attr("pads", {1, 1, 1, 1}), ints_attr("dilations", {k.dilation, k.dilation}),
                                          int_attr("group", k.group)};
    const Dims w_dims = {m, c / k.group, kh, kw}, zw_dims = {static_cast<int64_t>(zw.size())};
    const Bytes loops = run_op_bytes("ConvInteger", {{{2, c, h, w}, x, k.x}, {w_dims, wt, k.w}, {{}, zx, k.x}, {zw_dims, zw, k.w}},
                                     y_dims, DType::kInt32, attrs);
    ProgramBuilder b;
    const int32_t xi = b.input({2, c, h, w}, k.x), zi = b.input({}, k.x), y = b.output(y_dims, DType::kInt32);
    b.op("ConvInteger", {xi, b.weight(w_dims, 0, k.w), zi, b.weight(zw_dims, 1, k.w)}, y, attrs);
    EXPECT_EQ(run_bytes(b.program(), {x, zx}, {wt, zw})[0], loops);
  }
}

TEST(RuntimeQuant, ConvIntegerIsExactWithPaddingGroupsAndZeroPoints) {
  const int64_t c = 4, h = 4, w = 5, m = 6, kh = 3, kw = 2, group = 2;
  std::vector<int8_t> x(static_cast<size_t>(c * h * w));
  std::vector<uint8_t> wt(static_cast<size_t>(m * (c / group) * kh * kw));
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<int8_t>((i * 29 + 3) % 256 - 128);
  for (size_t i = 0; i < wt.size(); ++i) wt[i] = static_cast<uint8_t>((i * 41 + 17) % 256);
  const int8_t zx = -7;
  const std::vector<uint8_t> zw = {0, 1, 128, 200, 255, 9};
  const int64_t oh = h + 2 - kh + 1, ow = w + 1 - kw + 1;  // pads: 1 top, 1 bottom, 1 left, 0 right
  const auto y = run_op_as<int32_t>("ConvInteger",
                                    {{{1, c, h, w}, bytes_of(x), DType::kInt8}, {{m, c / group, kh, kw}, Bytes(wt.begin(), wt.end()), DType::kUInt8},
                                     {{}, bytes_of<int8_t>({zx}), DType::kInt8}, {{m}, Bytes(zw.begin(), zw.end()), DType::kUInt8}},
                                    {1, m, oh, ow},
                                    {ints_attr("kernel_shape", {kh, kw}), ints_attr("strides", {1, 1}), ints_attr("pads", {1, 1, 1, 0}),
                                     ints_attr("dilations", {1, 1}), int_attr("group", group)});
  for (int64_t o = 0; o < m; ++o)
    for (int64_t i = 0; i < oh; ++i)
      for (int64_t j = 0; j < ow; ++j) {
        int32_t want = 0;
        const int64_t g = o / (m / group);
        for (int64_t ci = 0; ci < c / group; ++ci)
          for (int64_t a = 0; a < kh; ++a)
            for (int64_t b = 0; b < kw; ++b) {
              const int64_t yy = i + a - 1, xx = j + b - 1;
              if (yy < 0 || yy >= h || xx < 0 || xx >= w) continue;
              want += (x[static_cast<size_t>(((g * (c / group) + ci) * h + yy) * w + xx)] - zx) *
                      (wt[static_cast<size_t>(((o * (c / group) + ci) * kh + a) * kw + b)] - zw[static_cast<size_t>(o)]);
            }
        EXPECT_EQ(y[static_cast<size_t>((o * oh + i) * ow + j)], want) << o << i << j;
      }
}

// QLinearConv against its integer arithmetic done by hand: a uint8 image with a zero point, int8
// weights, an int32 bias, a scale per output channel, padding, strides and groups, and halves that
// round to even before an odd zero point is added. Where the CPU has no VNNI, oneDNN's int8 sums
// are not exact and the op refuses to run (the compiler does not make it there).
TEST(RuntimeQuant, QLinearConvIsExactInteger) {
  if (!runtime::runs_qlinear_conv()) GTEST_SKIP() << "this CPU has no VNNI: QLinearConv is not made for it";
  for (const auto& [group, stride, x_zero, y_zero] :
       std::vector<std::array<int64_t, 4>>{{1, 1, 3, 7}, {2, 2, 128, 0}, {1, 2, 0, 255}}) {
    SCOPED_TRACE(std::to_string(group) + " groups, stride " + std::to_string(stride));
    const int64_t n = 2, c = 4, h = 5, w = 6, m = 4, kh = 3, kw = 3;
    const DType x_type = DType::kUInt8, y_type = DType::kUInt8;
    Bytes x(static_cast<size_t>(n * c * h * w));
    for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<uint8_t>((i * 73 + 5) % 256);
    const std::vector<int32_t> bias = {100, -250, 0, 77};
    const std::vector<float> scales = {0.001f, 0.0005f, 0.002f, 0.00125f};
    ProgramBuilder b;
    const int32_t xi = b.input({n, c, h, w}, x_type);
    const int32_t wi = b.weight({m, c / group, kh, kw}, 0, DType::kInt8);
    const int32_t bi = b.weight({m}, 1, DType::kInt32);
    const int64_t oh = (h + 2 - kh) / stride + 1, ow = (w + 2 - kw) / stride + 1;
    const int32_t y = b.output({n, m, oh, ow}, y_type);
    ref::Attr sc;
    sc.name = "scales";
    sc.kind = ref::Attr::Kind::kFloats;
    sc.floats = scales;
    b.op("QLinearConv", {xi, wi, bi}, y,
         {ints_attr("kernel_shape", {kh, kw}), ints_attr("strides", {stride, stride}), ints_attr("pads", {1, 1, 1, 1}),
          ints_attr("dilations", {1, 1}), int_attr("group", group), sc, int_attr("x_zero_point", x_zero),
          int_attr("y_zero_point", y_zero), int_attr("dtype", static_cast<int64_t>(y_type))});
    // Two weights through the same program: the second session shares the first's plan (its
    // primitives, made once for the process) but convolves with its own weight.
    for (int weights = 0; weights < 2; ++weights) {
      SCOPED_TRACE("weight " + std::to_string(weights));
      std::vector<int8_t> wt(static_cast<size_t>(m * (c / group) * kh * kw));
      for (size_t i = 0; i < wt.size(); ++i) wt[i] = static_cast<int8_t>((i * (weights == 0 ? 31 : 17) + 9) % 256 - 128);
      const uint64_t plans_before = runtime::conv_plans_made();
      const Bytes got = run_bytes(b.program(), {x}, {bytes_of(wt), bytes_of(bias)})[0];
      if (weights == 1) {
        EXPECT_EQ(runtime::conv_plans_made(), plans_before);
      }
      const auto value = [&](size_t i) { return static_cast<int>(x[i]); };
      for (int64_t ni = 0; ni < n; ++ni)
        for (int64_t mi = 0; mi < m; ++mi)
          for (int64_t i = 0; i < oh; ++i)
            for (int64_t j = 0; j < ow; ++j) {
              int32_t acc = bias[static_cast<size_t>(mi)];
              const int64_t g = mi / (m / group);
              for (int64_t ci = 0; ci < c / group; ++ci)
                for (int64_t a = 0; a < kh; ++a)
                  for (int64_t bb = 0; bb < kw; ++bb) {
                    const int64_t yy = i * stride + a - 1, xx = j * stride + bb - 1;
                    if (yy < 0 || yy >= h || xx < 0 || xx >= w) continue;
                    acc += (value(static_cast<size_t>(((ni * c + g * (c / group) + ci) * h + yy) * w + xx)) - x_zero) *
                           wt[static_cast<size_t>(((mi * (c / group) + ci) * kh + a) * kw + bb)];
                  }
              const float q = std::nearbyint(static_cast<float>(acc) * scales[static_cast<size_t>(mi)]) + static_cast<float>(y_zero);
              const int want = static_cast<int>(std::clamp(q, 0.0f, 255.0f));
              EXPECT_EQ(static_cast<int>(got[static_cast<size_t>(((ni * m + mi) * oh + i) * ow + j)]), want) << ni << mi << i << j;
            }
    }
  }
}

TEST(RuntimeQuant, DynamicQuantizeLinearTakesItsRangeWithZero) {
  auto run = [](const std::vector<float>& x, int64_t output, DType type) {
    return run_op_bytes("DynamicQuantizeLinear", {{{static_cast<int64_t>(x.size())}, f32(x)}},
                        output == 0 ? Dims{static_cast<int64_t>(x.size())} : Dims{}, type, {int_attr("output", output)});
  };
  // [-1, 3]: scale 4/255, zero point round(255/4) = 64.
  const std::vector<float> x = {-1.0f, 0.0f, 3.0f, 1.0f};
  EXPECT_EQ(values_of<float>(run(x, 1, DType::kFloat32))[0], 4.0f / 255.0f);
  EXPECT_EQ(run(x, 2, DType::kUInt8), (Bytes{64}));
  EXPECT_EQ(run(x, 0, DType::kUInt8), (Bytes{0, 64, 255, 128}));
  // Positive values only: the range still holds 0, so the zero point is 0.
  EXPECT_EQ(run({2.0f, 4.0f}, 2, DType::kUInt8), (Bytes{0}));
  // All zeros: scale 1, as ONNX Runtime takes it (ONNX's reference takes 1/255).
  EXPECT_EQ(values_of<float>(run({0.0f, 0.0f}, 1, DType::kFloat32))[0], 1.0f);
  EXPECT_EQ(run({0.0f, 0.0f}, 0, DType::kUInt8), (Bytes{0, 0}));
  // An infinite range: the zero point saturates high, as in ONNX Runtime, instead of converting NaN.
  EXPECT_EQ(run({-std::numeric_limits<float>::infinity(), 1.0f}, 2, DType::kUInt8), (Bytes{255}));
}

// K = 0: a product of nothing is zero, and planning it divides by nothing.
TEST(RuntimeQuant, MatMulIntegerOverAnEmptyInnerDimIsZero) {
  EXPECT_EQ(run_op_as<int32_t>("MatMulInteger", {{{2, 0}, Bytes{}, DType::kUInt8}, {{0, 3}, Bytes{}, DType::kInt8}}, {2, 3}),
            (std::vector<int32_t>(6, 0)));
}

// Products of 16-bit values wrap as the type does: 65535 x 65535 promoted to int would overflow it.
TEST(RuntimeQuant, SixteenBitProductsWrapWithoutOverflow) {
  EXPECT_EQ(run_op_as<uint16_t>("ScatterElements",
                                {{{1}, bytes_of<uint16_t>({65535}), DType::kUInt16}, {{1}, i64({0}), DType::kInt64},
                                 {{1}, bytes_of<uint16_t>({65535}), DType::kUInt16}},
                                {1}, {int_attr("axis", 0), int_attr("reduction", 2)}),
            (std::vector<uint16_t>{1}));
}

}  // namespace
}  // namespace ctxgen::testing
