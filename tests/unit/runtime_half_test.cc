// float16 and bfloat16: conversions from float round to nearest even (checked against double
// arithmetic over every half and bfloat16 value and the midpoints between them), back to float is
// exact, and Cast and the data-movement ops carry the 16-bit values.

#include <cmath>
#include <limits>

#include "runtime_test_util.h"

namespace ctxgen::testing {
namespace {

using ref::DType;

float float_of_bits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// Every finite half: back to float and to half again is the same half; the float halfway to the
// next half up rounds to whichever of the two is even, and a float just past it rounds up.
TEST(RuntimeHalf, FloatToHalfRoundsToNearestEvenOverEveryValue) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const auto bits = static_cast<uint16_t>(h);
    const float f = runtime::float_of_half(bits);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(runtime::float_of_half(runtime::half_of(f)))) << h;
      continue;
    }
    ASSERT_EQ(runtime::half_of(f), bits) << h;
    if ((h & 0x7FFF) >= 0x7BFF) continue;  // the largest finite and infinity have no next half
    const float next = runtime::float_of_half(static_cast<uint16_t>(h + 1));
    const double middle = (static_cast<double>(f) + next) / 2;
    if (static_cast<float>(middle) != middle) continue;  // not a float (never, for halves)
    const auto mid = static_cast<float>(middle);
    EXPECT_EQ(runtime::half_of(mid), (h & 1) ? h + 1 : h) << "the tie above " << h;
    EXPECT_EQ(runtime::half_of(std::nextafter(mid, 2 * next)), h + 1) << "just above the tie above " << h;
    EXPECT_EQ(runtime::half_of(std::nextafter(mid, 0.0f * f)), h) << "just below the tie above " << h;
  }
  EXPECT_EQ(runtime::half_of(65519.996f), 0x7BFF);  // 65504, the largest half
  EXPECT_EQ(runtime::half_of(65520.0f), 0x7C00);    // the tie past it: infinity
  EXPECT_EQ(runtime::half_of(1e10f), 0x7C00);
  EXPECT_EQ(runtime::half_of(-std::numeric_limits<float>::infinity()), 0xFC00);
  EXPECT_EQ(runtime::half_of(std::ldexp(1.0f, -25)), 0x0000);  // a tie between 0 and the smallest subnormal
  EXPECT_EQ(runtime::half_of(std::nextafter(std::ldexp(1.0f, -25), 1.0f)), 0x0001);
  EXPECT_EQ(runtime::half_of(-1e-30f), 0x8000);
}

// The array conversions (F16C on x86) give the bits the one-value ones give: every half to float,
// and to half every float of every 2^13th bit pattern (each exponent, ties, NaN payloads, the
// subnormals), in runs of odd lengths so the scalar tails run too.
TEST(RuntimeHalf, ArrayConversionsMatchTheScalarOnes) {
  std::vector<uint16_t> halves(0x10000);
  for (uint32_t h = 0; h < 0x10000; ++h) halves[h] = static_cast<uint16_t>(h);
  std::vector<float> floats(halves.size());
  runtime::floats_of_halves(halves.data(), floats.data(), static_cast<int64_t>(halves.size()));
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float one = runtime::float_of_half(halves[h]);
    ASSERT_EQ(std::isnan(one), std::isnan(floats[h])) << h;
    if (!std::isnan(one)) {
      ASSERT_EQ(std::memcmp(&one, &floats[h], sizeof one), 0) << h;
    }
  }
  std::vector<float> wide;
  for (uint64_t bits = 0; bits < (uint64_t{1} << 32); bits += 1 << 13) {
    wide.push_back(float_of_bits(static_cast<uint32_t>(bits)));
    wide.push_back(float_of_bits(static_cast<uint32_t>(bits) | 0x1000));  // a tie at 13 bits off
    wide.push_back(float_of_bits(static_cast<uint32_t>(bits) | 0x1001));
  }
  for (int64_t length : {int64_t{7}, static_cast<int64_t>(wide.size())}) {
    std::vector<uint16_t> narrow(static_cast<size_t>(length));
    runtime::halves_of(wide.data(), narrow.data(), length);
    for (int64_t i = 0; i < length; ++i) {
      const uint16_t one = runtime::half_of(wide[static_cast<size_t>(i)]);
      ASSERT_EQ(one, narrow[static_cast<size_t>(i)]) << std::hexfloat << wide[static_cast<size_t>(i)];
    }
  }
}

TEST(RuntimeHalf, FloatToBFloat16RoundsToNearestEvenOverEveryValue) {
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const auto bits = static_cast<uint16_t>(b);
    const float f = runtime::float_of_bfloat16(bits);
    const uint32_t wide = b << 16;
    EXPECT_EQ(std::memcmp(&f, &wide, sizeof f), 0) << b;
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(runtime::float_of_bfloat16(runtime::bfloat16_of(f)))) << b;
      continue;
    }
    ASSERT_EQ(runtime::bfloat16_of(f), bits) << b;
    if ((b & 0x7FFF) >= 0x7F7F) continue;
    const float mid = float_of_bits((b << 16) | 0x8000);  // halfway to the next
    EXPECT_EQ(runtime::bfloat16_of(mid), (b & 1) ? b + 1 : b) << b;
    EXPECT_EQ(runtime::bfloat16_of(float_of_bits((b << 16) | 0x8001)), b + 1) << b;
  }
}

TEST(RuntimeHalf, CastAndDataMovementCarryHalfValues) {
  const std::vector<float> x = {1.0f, -2.5f, 65504.0f, 1e-8f, 3.14159f, 70000.0f};
  const Bytes half = run_op_bytes("Cast", {{{6}, f32(x)}}, {6}, DType::kFloat16, {int_attr("to", 10)});
  std::vector<uint16_t> bits = values_of<uint16_t>(half);
  for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(bits[i], runtime::half_of(x[i])) << i;
  const auto back = run_op_as<float>("Cast", {{{6}, half, DType::kFloat16}}, {6}, {int_attr("to", 1)});
  for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(back[i], runtime::float_of_half(bits[i])) << i;
  // Half to bfloat16 and to an integer go through its float value.
  const Bytes brain = run_op_bytes("Cast", {{{6}, half, DType::kFloat16}}, {6}, DType::kBFloat16, {int_attr("to", 16)});
  for (size_t i = 0; i < x.size(); ++i)
    EXPECT_EQ(values_of<uint16_t>(brain)[i], runtime::bfloat16_of(runtime::float_of_half(bits[i]))) << i;
  EXPECT_EQ(run_op_as<int32_t>("Cast", {{{6}, half, DType::kFloat16}}, {6}, {int_attr("to", 6)}),
            (std::vector<int32_t>{1, -2, 65504, 0, 3, std::numeric_limits<int32_t>::lowest()}));
  // Moved unchanged.
  EXPECT_EQ(run_op_bytes("Transpose", {{{2, 3}, half, DType::kFloat16}}, {3, 2}, DType::kFloat16, {ints_attr("perm", {1, 0})}),
            bytes_of<uint16_t>({bits[0], bits[3], bits[1], bits[4], bits[2], bits[5]}));
  // A Pad's float value in half.
  EXPECT_EQ(run_op_bytes("Pad", {{{1}, bytes_of<uint16_t>({bits[0]}), DType::kFloat16}}, {2}, DType::kFloat16,
                         {ints_attr("pads", {1, 0}), int_attr("mode", 0), float_attr("value", -2.5f)}),
            bytes_of<uint16_t>({bits[1], bits[0]}));
}

}  // namespace
}  // namespace ctxgen::testing
