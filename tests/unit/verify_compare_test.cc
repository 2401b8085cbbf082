// verify's statistics and criteria on tensors whose errors are known.

#include <cmath>
#include <cstring>

#include <gtest/gtest.h>

#include "ctxgen/verify.h"

namespace ctxgen::verify {
namespace {

Tensor floats(const std::vector<float>& values) {
  Tensor t{ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, {static_cast<int64_t>(values.size())}, {}};
  t.bytes.resize(values.size() * 4);
  if (!values.empty()) std::memcpy(t.bytes.data(), values.data(), t.bytes.size());
  return t;
}

Tensor doubles(const std::vector<double>& values) {
  Tensor t{ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE, {static_cast<int64_t>(values.size())}, {}};
  t.bytes.resize(values.size() * 8);
  if (!values.empty()) std::memcpy(t.bytes.data(), values.data(), t.bytes.size());
  return t;
}

Tolerance tolerance(double rtol, std::optional<double> atol, ErrorStat stat = ErrorStat::kElementwise) {
  Tolerance t;
  t.rtol = rtol;
  t.atol = atol;
  t.stat = stat;
  return t;
}

// 100 elements of 1, the last 10 off by 0.1, 0.2, ..., 1.0.
std::pair<Tensor, Tensor> ten_percent_off() {
  std::vector<float> expected(100, 1.0f), got(100, 1.0f);
  for (int i = 0; i < 10; ++i) got[90 + i] = 1.0f + 0.1f * static_cast<float>(i + 1);
  return {floats(got), floats(expected)};
}

TEST(VerifyCompare, TheErrorDistribution) {
  auto [got, expected] = ten_percent_off();
  Difference d = compare(got, expected, tolerance(1e-3, 1e-3));
  EXPECT_EQ(d.dims, std::vector<int64_t>{100});
  EXPECT_EQ(d.elements, 100u);
  EXPECT_DOUBLE_EQ(d.reference_max_abs, 1);
  EXPECT_DOUBLE_EQ(d.reference_rms, 1);
  EXPECT_NEAR(d.abs.max, 1.0, 1e-6);
  EXPECT_NEAR(d.abs.mean, 0.055, 1e-6);  // (0.1 + ... + 1.0) / 100
  EXPECT_EQ(d.abs.median, 0);
  EXPECT_NEAR(d.abs.p99, 0.9, 1e-6);  // nearest rank: the 99th of 100
  EXPECT_NEAR(d.rel.max, 1.0, 1e-6);  // expected is 1 everywhere
  EXPECT_DOUBLE_EQ(d.outside, 0.1);
  EXPECT_NEAR(d.error_rms, std::sqrt(3.85 / 100), 1e-6);  // sum of (k/10)^2, k = 1..10
  EXPECT_NEAR(d.snr_db, 10 * std::log10(100 / 3.85), 1e-5);
  EXPECT_GT(d.cosine, 0.98);
  EXPECT_LT(d.cosine, 1);
  EXPECT_FALSE(d.within);
  EXPECT_NE(d.failed.find("10 of 100 elements (10%)"), std::string::npos) << d.failed;
}

TEST(VerifyCompare, EachStatisticCanCarryTheTolerance) {
  auto [got, expected] = ten_percent_off();
  // The median is 0 and the mean 0.055: only the max and the p99 see the ten bad elements.
  EXPECT_TRUE(compare(got, expected, tolerance(1e-3, 1e-3, ErrorStat::kMedian)).within);
  EXPECT_TRUE(compare(got, expected, tolerance(0.06, 0.06, ErrorStat::kMean)).within);
  EXPECT_FALSE(compare(got, expected, tolerance(0.05, 0.05, ErrorStat::kMean)).within);
  auto p99 = compare(got, expected, tolerance(0.5, 0.5, ErrorStat::kP99));
  EXPECT_FALSE(p99.within);
  EXPECT_NE(p99.failed.find("p99 abs error 0.9 > atol 0.5 and p99 rel error 0.9 > rtol 0.5"), std::string::npos) << p99.failed;
  EXPECT_TRUE(compare(got, expected, tolerance(0.91, 0.91, ErrorStat::kP99)).within);
  EXPECT_FALSE(compare(got, expected, tolerance(0.9, 0.9, ErrorStat::kMax)).within);
  // Either the abs or the rel statistic within its bound passes, as in Polygraphy.
  EXPECT_TRUE(compare(got, expected, tolerance(1e-9, 1.0, ErrorStat::kMax)).within);
  EXPECT_TRUE(compare(got, expected, tolerance(1.0, 1e-9, ErrorStat::kMax)).within);
  // An element expected 0 and got otherwise is infinitely wrong relatively: a statistic of the
  // rel error does not pass it by leaving it out.
  Tensor zeros = floats({0, 0, 0, 1}), off = floats({3, 3, 3, 1});
  for (auto stat : {ErrorStat::kMax, ErrorStat::kMean, ErrorStat::kMedian, ErrorStat::kP99})
    EXPECT_FALSE(compare(off, zeros, tolerance(0.1, 0.1, stat)).within) << error_stat_name(stat);
}

TEST(VerifyCompare, TheDefaultAtolFollowsTheOutputsMagnitude) {
  // Float32 rounding error in a value comes from the magnitudes summed into it: an element that
  // cancelled to near zero carries the error of its large neighbours.
  Tensor expected = floats({1000.0f, -1000.0f, 0.001f});
  Tensor got = floats({1000.0f, -1000.0f, 0.5f});
  Difference d = compare(got, expected, tolerance(1e-3, std::nullopt));
  EXPECT_DOUBLE_EQ(d.atol, 1.0);  // rtol * max |expected|
  EXPECT_TRUE(d.within);
  EXPECT_GT(d.rel.max, 100);  // the relative error of that element says nothing
  EXPECT_FALSE(compare(got, expected, tolerance(1e-3, 1e-5)).within);
  EXPECT_FALSE(compare(floats({1000.0f, -1000.0f, 2.0f}), expected, tolerance(1e-3, std::nullopt)).within);
}

TEST(VerifyCompare, CosineAndSnrAsFurtherCriteria) {
  Tensor expected = floats({1, 2, 3, 4});
  Tensor got = floats({1, 2, 3, 4.4f});
  Tolerance t = tolerance(1, 1);
  Difference d = compare(got, expected, t);
  EXPECT_TRUE(d.within);
  EXPECT_NEAR(d.snr_db, 10 * std::log10(30 / 0.16), 1e-4);
  t.min_snr_db = 30;
  d = compare(got, expected, t);
  EXPECT_FALSE(d.within);
  EXPECT_NE(d.failed.find("SNR 22.73 dB < 30.00 dB"), std::string::npos) << d.failed;
  t.min_snr_db.reset();
  t.min_cosine = 0.9999;
  d = compare(got, expected, t);
  EXPECT_FALSE(d.within);
  EXPECT_NE(d.failed.find("cosine similarity"), std::string::npos) << d.failed;
  t.min_cosine = 0.99;
  EXPECT_TRUE(compare(got, expected, t).within);
  // Opposite signs: cosine -1 however small the tolerance's complaint.
  EXPECT_NEAR(compare(floats({-1, -2}), floats({1, 2}), t).cosine, -1, 1e-12);
}

TEST(VerifyCompare, EqualTensorsAndSpecialValues) {
  Tensor a = floats({0, NAN, INFINITY, -2});
  Difference same = compare(a, a, tolerance(0, 0));
  EXPECT_TRUE(same.within) << same.failed;
  EXPECT_EQ(same.abs.max, 0);
  EXPECT_TRUE(std::isinf(same.snr_db));
  EXPECT_DOUBLE_EQ(same.cosine, 1);
  Difference nan = compare(floats({0, 1, INFINITY, -2}), a, tolerance(1, 1));
  EXPECT_FALSE(nan.within);
  EXPECT_TRUE(std::isinf(nan.abs.max));
  EXPECT_FALSE(compare(floats({0, NAN, 1e30f, -2}), a, tolerance(1, 1)).within);  // rtol * inf bounds nothing
  // Unmatched NaNs and infinities fail whatever the statistic, and leave the cosine undefined.
  Tensor many = floats(std::vector<float>(100, 1.0f));
  Tensor one_inf = many;
  const float inf = INFINITY;
  std::memcpy(one_inf.bytes.data(), &inf, 4);
  for (auto stat : {ErrorStat::kMedian, ErrorStat::kP99, ErrorStat::kMean}) {
    Difference d = compare(many, one_inf, tolerance(1, 1, stat));
    EXPECT_FALSE(d.within) << error_stat_name(stat);
    EXPECT_NE(d.failed.find("1 of 100 elements are NaN or infinite on one side only"), std::string::npos) << d.failed;
    EXPECT_TRUE(std::isnan(d.cosine));
    EXPECT_DOUBLE_EQ(d.outside, 0.01);  // counted outside too
  }
  // The reference's magnitude is its own, whatever the other side holds.
  EXPECT_DOUBLE_EQ(compare(one_inf, many, tolerance(1, 1)).reference_rms, 1);
  // Huge values: the norms do not overflow into a NaN cosine, and a finite difference that
  // overflows is an error, not an unmatched infinity.
  EXPECT_NEAR(compare(doubles({1e200, 1e200}), doubles({1e200, 1e200}), tolerance(0, 0)).cosine, 1, 1e-12);
  Difference overflow = compare(doubles({1e308}), doubles({-1e308}), tolerance(1e-3, std::nullopt));
  EXPECT_FALSE(overflow.within);
  EXPECT_EQ(overflow.failed.find("NaN or infinite"), std::string::npos) << overflow.failed;
  // Rounding in the dot product does not take the cosine above 1.
  Tensor tenths = floats(std::vector<float>(1000, 0.1f));
  EXPECT_LE(compare(tenths, tenths, tolerance(0, 0)).cosine, 1.0);
  Difference zeros = compare(floats({0, 0}), floats({0, 0}), tolerance(0, 0));
  EXPECT_TRUE(zeros.within);
  EXPECT_DOUBLE_EQ(zeros.cosine, 1);
  EXPECT_EQ(zeros.rel.max, 0);  // no element has a relative error
  Difference empty = compare(floats({}), floats({}), tolerance(0, 0));
  EXPECT_TRUE(empty.within);
  EXPECT_EQ(empty.elements, 0u);
}

TEST(VerifyCompare, IntegersMustBeEqualAndTypesMustMatch) {
  Tensor a{ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64, {2}, std::vector<uint8_t>(16, 0)};
  Tensor b = a;
  b.bytes[8] = 1;
  Difference d = compare(b, a, tolerance(1e9, 1e9, ErrorStat::kMedian));  // no tolerance applies
  EXPECT_FALSE(d.within);
  EXPECT_NE(d.failed.find("1 of 2 elements differ"), std::string::npos) << d.failed;
  Tensor wide{ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE, {2}, std::vector<uint8_t>(16, 0)};
  Difference types = compare(floats({0, 0}), wide, tolerance(1, 1));
  EXPECT_FALSE(types.within);
  EXPECT_NE(types.problem.find("element type float32, expected float64"), std::string::npos) << types.problem;
  Difference shape = compare(floats({0, 0, 0}), floats({0, 0}), tolerance(1, 1));
  EXPECT_NE(shape.problem.find("shape differs"), std::string::npos);
}

TEST(VerifyCompare, StatisticNames) {
  for (auto stat : {ErrorStat::kElementwise, ErrorStat::kMax, ErrorStat::kMean, ErrorStat::kMedian, ErrorStat::kP99})
    EXPECT_EQ(error_stat_named(error_stat_name(stat)), stat);
  EXPECT_FALSE(error_stat_named("p95"));
}

}  // namespace
}  // namespace ctxgen::verify
