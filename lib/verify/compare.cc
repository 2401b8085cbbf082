#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "ctxgen/model.h"
#include "ctxgen/verify.h"

namespace ctxgen::verify {
namespace {

template <typename T>
double read_as(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return static_cast<double>(v);
}

double read_float16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, sizeof h);
  int exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ff;
  double sign = (h & 0x8000) != 0 ? -1.0 : 1.0;
  if (exponent == 0) return sign * std::ldexp(mantissa, -24);
  if (exponent == 0x1f) return mantissa != 0 ? NAN : sign * INFINITY;
  return sign * std::ldexp(mantissa + 1024, exponent - 25);
}

double read_bfloat16(const uint8_t* p) {
  uint16_t b;
  std::memcpy(&b, p, sizeof b);
  uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

}  // namespace

std::optional<ElementKind> element_kind(ONNXTensorElementDataType type) {
  switch (type) {
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT: return ElementKind{4, read_as<float>, false};
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE: return ElementKind{8, read_as<double>, false};
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16: return ElementKind{2, read_float16, false};
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16: return ElementKind{2, read_bfloat16, false};
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64: return ElementKind{8, read_as<int64_t>, true};
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT64: return ElementKind{8, read_as<uint64_t>, true};
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32: return ElementKind{4, read_as<int32_t>, true};
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT32: return ElementKind{4, read_as<uint32_t>, true};
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT16: return ElementKind{2, read_as<int16_t>, true};
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT16: return ElementKind{2, read_as<uint16_t>, true};
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8: return ElementKind{1, read_as<int8_t>, true};
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8: case ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL:
      return ElementKind{1, read_as<uint8_t>, true};
    default: return std::nullopt;
  }
}


namespace {

std::string number(double v) {
  char text[32];
  std::snprintf(text, sizeof text, "%.3g", v);
  return text;
}

// Nearest-rank quantile; reorders `values`.
double quantile(std::vector<float>& values, double q) {
  if (values.empty()) return 0;
  size_t rank = static_cast<size_t>(std::ceil(q * static_cast<double>(values.size())));
  auto at = values.begin() + static_cast<std::ptrdiff_t>(std::max<size_t>(rank, 1) - 1);
  std::nth_element(values.begin(), at, values.end());
  return *at;
}

// The errors are kept as float: a quantile needs no more, and outputs can be large.
ErrorSummary summarise(std::vector<float>& errors, double sum, double max) {
  ErrorSummary s;
  if (errors.empty()) return s;
  s.max = max;
  s.mean = sum / static_cast<double>(errors.size());
  s.p99 = quantile(errors, 0.99);
  s.median = quantile(errors, 0.5);
  return s;
}

}  // namespace

const char* error_stat_name(ErrorStat stat) {
  switch (stat) {
    case ErrorStat::kElementwise: return "elementwise";
    case ErrorStat::kMax: return "max";
    case ErrorStat::kMean: return "mean";
    case ErrorStat::kMedian: return "median";
    case ErrorStat::kP99: return "p99";
  }
  return "?";
}

std::optional<ErrorStat> error_stat_named(const std::string& name) {
  for (auto stat : {ErrorStat::kElementwise, ErrorStat::kMax, ErrorStat::kMean, ErrorStat::kMedian, ErrorStat::kP99})
    if (name == error_stat_name(stat)) return stat;
  return std::nullopt;
}

double ErrorSummary::of(ErrorStat stat) const {
  switch (stat) {
    case ErrorStat::kMean: return mean;
    case ErrorStat::kMedian: return median;
    case ErrorStat::kP99: return p99;
    default: return max;
  }
}

Difference compare(const Tensor& got, const Tensor& expected, const Tolerance& tolerance) {
  Difference d;
  d.dims = expected.dims;
  if (got.type != expected.type) {
    d.within = false;
    d.problem = "element type " + dtype_name(got.type) + ", expected " + dtype_name(expected.type);
    return d;
  }
  auto kind = element_kind(expected.type);
  if (!kind || got.dims != expected.dims || got.bytes.size() != expected.bytes.size() || expected.bytes.size() % kind->size != 0) {
    d.within = false;
    d.problem = !kind ? "element type " + dtype_name(expected.type) + " cannot be compared"
                      : "shape differs from the expected shape";
    return d;
  }
  const size_t n = expected.bytes.size() / kind->size;
  for (size_t i = 0; i < n; ++i) {
    const double y = std::fabs(kind->read(expected.bytes.data() + i * kind->size));
    if (std::isfinite(y)) d.reference_max_abs = std::max(d.reference_max_abs, y);
  }
  const bool quantized = tolerance.step && *tolerance.step > 0;
  const double rtol = quantized ? 0 : tolerance.rtol;
  d.step = quantized ? *tolerance.step : 0;
  // A quantized output may be as far off as a float one, or `max_steps` steps (and a thousandth
  // of a step over: two dequantized values (q - zero point) * scale, each rounded to float32, are a
  // step apart give or take their rounding). 16-bit steps are finer than float32 rounding in a
  // deep model moves a value.
  const double float_atol = tolerance.atol.value_or(tolerance.rtol * d.reference_max_abs);
  const double atol = d.atol = quantized ? std::max((tolerance.max_steps + 1e-3) * d.step, float_atol) : float_atol;
  const double scale = d.reference_max_abs > 0 ? d.reference_max_abs : 1;
  std::vector<float> abs_errors, rel_errors, judged_rel;
  abs_errors.reserve(n);
  // A statistic judged by rtol needs every element: one whose expected value is 0 and got is not
  // is infinitely wrong relatively (the shown rel statistics leave such elements out).
  const bool judging_rel = tolerance.stat != ErrorStat::kElementwise && !quantized;
  double abs_sum = 0, rel_sum = 0, judged_sum = 0, abs_max = 0, rel_max = 0, judged_max = 0;
  double dot = 0, got_squares = 0, expected_squares = 0, error_squares = 0;
  uint64_t outside = 0, unequal = 0, unmatched = 0, finite = 0;
  for (size_t i = 0; i < n; ++i) {
    const uint8_t* a = got.bytes.data() + i * kind->size;
    const uint8_t* b = expected.bytes.data() + i * kind->size;
    const double x = kind->read(a), y = kind->read(b);
    // Integers compare bit for bit: 64-bit values do not all survive the trip through double.
    if (kind->exact && std::memcmp(a, b, kind->size) != 0) ++unequal;
    const bool equal = x == y || (std::isnan(x) && std::isnan(y));  // x == y: equal infinities too
    // A NaN or an infinity on one side only, or two different infinities: no tolerance covers it.
    const bool one_sided = !equal && !(std::isfinite(x) && std::isfinite(y));
    if (one_sided) ++unmatched;
    double diff = equal ? 0 : std::fabs(x - y);
    if (std::isnan(diff)) diff = INFINITY;
    abs_errors.push_back(static_cast<float>(diff));
    abs_sum += diff;
    abs_max = std::max(abs_max, diff);
    if (y != 0 && std::isfinite(y)) {
      const double rel = diff / std::fabs(y);
      rel_errors.push_back(static_cast<float>(rel));
      rel_sum += rel;
      rel_max = std::max(rel_max, rel);
    }
    if (judging_rel) {
      const double rel = diff == 0 ? 0 : std::isfinite(y) && y != 0 ? diff / std::fabs(y) : INFINITY;
      judged_rel.push_back(static_cast<float>(rel));
      judged_sum += rel;
      judged_max = std::max(judged_max, rel);
    }
    if (one_sided || (diff != 0 && !(diff <= atol + rtol * std::fabs(y)))) ++outside;
    // Sums of squares in units of the reference's largest value, so values near 1e154 do not
    // overflow them. The reference's own magnitude counts its finite values, whatever got holds.
    const double ds = diff / scale, xs = x / scale, ys = y / scale;
    error_squares += ds * ds;
    if (std::isfinite(y)) {
      expected_squares += ys * ys;
      ++finite;
    }
    if (std::isfinite(x) && std::isfinite(y)) {
      dot += xs * ys;
      got_squares += xs * xs;
    }
  }
  d.elements = n;
  d.reference_rms = finite ? scale * std::sqrt(expected_squares / static_cast<double>(finite)) : 0;
  d.error_rms = n ? scale * std::sqrt(error_squares / static_cast<double>(n)) : 0;
  d.abs = summarise(abs_errors, abs_sum, abs_max);
  d.rel = summarise(rel_errors, rel_sum, rel_max);
  d.outside = n ? static_cast<double>(outside) / static_cast<double>(n) : 0;
  // Undefined (NaN, null in JSON) when some element is unmatched, so --min-cosine fails it.
  d.cosine = unmatched                                   ? NAN
             : got_squares == 0 && expected_squares == 0 ? 1
             : got_squares == 0 || expected_squares == 0 ? 0
                                                         : std::clamp(dot / std::sqrt(got_squares * expected_squares), -1.0, 1.0);
  d.snr_db = error_squares == 0 ? INFINITY : 10 * std::log10(expected_squares / error_squares);

  auto fail = [&](std::string why) {
    if (d.within) d.failed = std::move(why);
    d.within = false;
  };
  if (kind->exact && !quantized) {
    if (unequal) fail(std::to_string(unequal) + " of " + std::to_string(n) + " elements differ (integers and booleans must be equal)");
    return d;
  }
  if (unmatched)
    fail(std::to_string(unmatched) + " of " + std::to_string(n) +
         " elements are NaN or infinite on one side only (they must match exactly, whatever the tolerance)");
  if (quantized) {
    if (outside)
      fail(std::to_string(outside) + " of " + std::to_string(n) + " elements (" + number(100 * d.outside) +
           "%) differ by more than " + number(tolerance.max_steps) + " quantization step" +
           (tolerance.max_steps == 1 ? "" : "s") + " of " + number(d.step) + " and more than atol " + number(float_atol));
  } else if (tolerance.stat == ErrorStat::kElementwise) {
    if (outside)
      fail(std::to_string(outside) + " of " + std::to_string(n) + " elements (" + number(100 * d.outside) +
           "%) differ by more than atol + rtol * |expected| = " + number(atol) + " + " + number(rtol) + " * |expected|");
  } else {
    const char* name = error_stat_name(tolerance.stat);
    const double abs = d.abs.of(tolerance.stat), rel = summarise(judged_rel, judged_sum, judged_max).of(tolerance.stat);
    if (abs > atol && rel > tolerance.rtol)
      fail(std::string(name) + " abs error " + number(abs) + " > atol " + number(atol) + " and " + name +
           " rel error " + number(rel) + " > rtol " + number(tolerance.rtol));
  }
  // As many digits as the comparison needs: a cosine of 0.99995 against 0.99999 is not "1 < 1".
  auto precise = [](double v, const char* format) {
    char text[32];
    std::snprintf(text, sizeof text, format, v);
    return std::string(text);
  };
  if (tolerance.min_cosine && !(d.cosine >= *tolerance.min_cosine))
    fail("cosine similarity " + precise(d.cosine, "%.9f") + " < " + precise(*tolerance.min_cosine, "%.9f"));
  if (tolerance.min_snr_db && !(d.snr_db >= *tolerance.min_snr_db))
    fail("SNR " + precise(d.snr_db, "%.2f") + " dB < " + precise(*tolerance.min_snr_db, "%.2f") + " dB");
  return d;
}

}  // namespace ctxgen::verify
