// Elementwise kernels, comparisons, casts and generated constants. Each op is a small functor
// instantiated into its own loop per element type, so the inner loops have no indirect calls and
// the compiler can vectorise them. Integer arithmetic wraps as two's complement and division by
// zero is an error, never undefined behaviour.

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "ctxgen/error.h"
#include "kernels.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#ifdef CTXGEN_VECTOR_MATH  // set by CMake where libmvec has these (x86-64 glibc >= 2.35)
// glibc's vector math (libmvec, glibc >= 2.35): four floats a call, in the variant the loader
// picks for this CPU. Over every float, erf and tanh stay within 2 ulp of std::erf and std::tanh,
// at a tenth of their time here (an exported GELU is an Erf or a Tanh per MLP element).
extern "C" __m128 _ZGVbN4v_erff(__m128);
extern "C" __m128 _ZGVbN4v_tanhf(__m128);
#endif

namespace ctxgen::runtime {
namespace {

#if defined(__x86_64__)
// Converting in software took ~5 ns a value, as long as the float16 CNN's convolutions took: F16C
// (on every x86-64 CPU since 2012) converts 8 a cycle, rounding to nearest even and quieting NaNs
// as half_of does. Chosen at run time: the library is built for the baseline x86-64. Every CPU
// with AVX2 has F16C, and AVX2 is what both GCC and Clang can ask the CPU about.
bool has_f16c() {
  static const bool has = __builtin_cpu_supports("avx2");
  return has;
}

__attribute__((target("avx,f16c"))) int64_t halves_f16c(const float* from, uint16_t* to, int64_t count) {
  int64_t i = 0;
  for (; i + 8 <= count; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(to + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(from + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  return i;
}

__attribute__((target("avx,f16c"))) int64_t floats_f16c(const uint16_t* from, float* to, int64_t count) {
  int64_t i = 0;
  for (; i + 8 <= count; i += 8)
    _mm256_storeu_ps(to + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(from + i))));
  return i;
}
#endif

// y = f(a, b, ...) over inputs broadcast numpy-style to the output dims; In are the input element
// types, R the output's. Inputs of the output's size are read in one flat loop; otherwise the op's
// BroadcastPlan holds every input's strides.
template <typename R, typename... In, typename F, size_t... I>
void broadcast_map(Ins in, const Output& out, F f, std::index_sequence<I...>) {
  constexpr size_t kInputs = sizeof...(In);
  R* y = out.as<R>();
  const std::tuple<const In*...> src{in[I].template as<In>()...};
  if (((in[I].size() == out.size()) && ...)) {
    parallel_ranges(out.parallel, out.size(), 1, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) y[i] = f(std::get<I>(src)[i]...);
    });
    return;
  }
  const auto& plan = static_cast<const BroadcastPlan&>(*out.plan);
  const Dims& dims = plan.dims;
  const Dims* strides = plan.strides.data();  // the output's, then each input's
  int64_t inner = dims.empty() ? 1 : dims.back();
  int64_t step[kInputs] = {(dims.empty() ? 0 : strides[I + 1].back())...};
  for_each_row<kInputs + 1>(dims, strides, [&](const int64_t* at) {
    R* row = y + at[0];
    for (int64_t i = 0; i < inner; ++i) row[i] = f(std::get<I>(src)[at[I + 1] + i * step[I]]...);
  });
}

template <typename R, typename... In, typename F>
void map(Ins in, const Output& out, F f) {
  broadcast_map<R, In...>(in, out, f, std::index_sequence_for<In...>{});
}

// A binary op on every numeric type, the output of the inputs' type.
template <typename F>
void arithmetic(Ins in, const Output& out, F f) {
  visit_dtype(in[0].dtype(), [&](auto tag) {
    using T = decltype(tag);
    map<T, T, T>(in, out, [&](T a, T b) { return f(a, b); });
  });
}

// A comparison of two inputs of one type, giving bool.
template <typename F>
void comparison(Ins in, const Output& out, F f) {
  visit_dtype(in[0].dtype(), [&](auto tag) {
    using T = decltype(tag);
    map<uint8_t, T, T>(in, out, [&](T a, T b) { return static_cast<uint8_t>(f(a, b)); });
  });
}

template <typename F>
void unary(Ins in, const Output& out, F f) {
  const float* x = in[0].f32();
  float* y = out.f32();
  parallel_ranges(out.parallel, out.size(), 4, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) y[i] = f(x[i]);
  });
}

// Integer division truncates toward zero, as ONNX Runtime's does.
template <typename T>
T div_of(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    if (b == 0) throw Error(ErrorCode::kRuntime, "integer division by zero");
    if (std::is_signed_v<T> && b == T(-1)) return wrapping_sub(T(0), a);
  }
  return a / b;
}

float hard_sigmoid_of(float x, float alpha, float beta) { return std::clamp(alpha * x + beta, 0.0f, 1.0f); }
float hard_swish_of(float x) { return x * hard_sigmoid_of(x, 1.0f / 6.0f, 0.5f); }
float sigmoid_of(float x) { return 1.0f / (1.0f + exp_approx(-x)); }
// NaN stays NaN, as in ONNX Clip; std::clamp would turn it into a bound on some inputs.
float clip_of(float x, float lo, float hi) { return x < lo ? lo : (x > hi ? hi : x); }
float leaky_relu_of(float x, float alpha) { return x < 0 ? alpha * x : x; }

template <typename F>
void in_place(float* data, int64_t n, F f) {
  for (int64_t i = 0; i < n; ++i) data[i] = f(data[i]);
}

// y = erf(x) or tanh(x) over n floats (y may be x).
#ifdef CTXGEN_VECTOR_MATH
using Vector4 = __m128 (*)(__m128);
// Four at a time, the last few through the same call, so that a value's result does not depend
// on where it stands.
template <Vector4 F>
void in_fours(const float* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) _mm_storeu_ps(y + i, F(_mm_loadu_ps(x + i)));
  if (i == n) return;
  float tail[4] = {};
  std::copy(x + i, x + n, tail);
  _mm_storeu_ps(tail, F(_mm_loadu_ps(tail)));
  std::copy(tail, tail + (n - i), y + i);
}
void erf_n(const float* x, float* y, int64_t n) { in_fours<_ZGVbN4v_erff>(x, y, n); }
void tanh_n(const float* x, float* y, int64_t n) { in_fours<_ZGVbN4v_tanhf>(x, y, n); }
#else
void erf_n(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = std::erf(x[i]);
}
void tanh_n(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = std::tanh(x[i]);
}
#endif

// A unary float op given as a function over a run of floats.
void unary_n(Ins in, const Output& out, void (*f)(const float*, float*, int64_t)) {
  const float* x = in[0].f32();
  float* y = out.f32();
  parallel_ranges(out.parallel, out.size(), 4, [&](int64_t begin, int64_t end) { f(x + begin, y + begin, end - begin); });
}

// A float converted to an integer type: truncation toward zero; NaN and values out of range give
// the type's lowest value (what x86 conversion instructions produce), instead of undefined behaviour.
template <typename To>
To float_to_int(float x) {
  constexpr auto lo = static_cast<double>(std::numeric_limits<To>::lowest());
  constexpr auto hi = static_cast<double>(std::numeric_limits<To>::max());
  double t = std::trunc(static_cast<double>(x));
  return t >= lo && t <= hi ? static_cast<To>(t) : std::numeric_limits<To>::lowest();
}

template <typename To, typename From>
To convert(From x) {
  if constexpr (std::is_same_v<To, uint8_t>) return x != From(0) ? 1 : 0;  // to bool
  else if constexpr (is_float_v<From> && std::is_integral_v<To>) return float_to_int<To>(static_cast<float>(x));
  else if constexpr (is_float_v<From> && is_float_v<To>) return To(static_cast<float>(x));
  else return static_cast<To>(x);
}

}  // namespace

uint16_t half_of(float value) {
  uint32_t x;
  std::memcpy(&x, &value, sizeof x);
  const auto sign = static_cast<uint16_t>((x >> 16) & 0x8000);
  const uint32_t magnitude = x & 0x7FFFFFFF;
  if (magnitude > 0x7F800000) return static_cast<uint16_t>(sign | 0x7E00 | ((magnitude >> 13) & 0x3FF));  // NaN, quiet
  // Rounds the `shift` low bits off `significand`, to nearest, ties to even.
  const auto rounded = [](uint32_t significand, uint32_t shift) {
    const uint32_t kept = significand >> shift, rest = significand & ((1u << shift) - 1), half = 1u << (shift - 1);
    return kept + (rest > half || (rest == half && (kept & 1)) ? 1 : 0);
  };
  if (magnitude >= 0x38800000) {  // 2^-14 and up: a normal half, or infinity once rounding carries past 65504
    const uint32_t exponent = (magnitude >> 23) - 112;  // rebiased: 127 -> 15
    if (exponent >= 31) return static_cast<uint16_t>(sign | 0x7C00);
    return static_cast<uint16_t>(sign | std::min<uint32_t>(rounded((exponent << 23) | (magnitude & 0x7FFFFF), 13), 0x7C00));
  }
  const uint32_t shift = 126 - (magnitude >> 23);  // to units of 2^-24, the smallest half
  if (shift > 24) return sign;                     // below 2^-25, or 2^-25 itself (a tie, to even): zero
  return static_cast<uint16_t>(sign | rounded((magnitude & 0x7FFFFF) | 0x800000, shift));
}

float float_of_half(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000) << 16, exponent = (bits >> 10) & 0x1F, mantissa = bits & 0x3FF;
  uint32_t x;
  if (exponent == 0) {
    const float subnormal = static_cast<float>(mantissa) * 5.9604644775390625e-8f;  // mantissa x 2^-24, exact
    std::memcpy(&x, &subnormal, sizeof x);
    x |= sign;
  } else {
    x = sign | (exponent == 31 ? 0x7F800000 : (exponent + 112) << 23) | (mantissa << 13);
  }
  float f;
  std::memcpy(&f, &x, sizeof f);
  return f;
}

float float_of_bfloat16(uint16_t bits) {
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &wide, sizeof f);
  return f;
}

uint16_t bfloat16_of(float value) {
  uint32_t x;
  std::memcpy(&x, &value, sizeof x);
  if ((x & 0x7FFFFFFF) > 0x7F800000) return static_cast<uint16_t>((x >> 16) | 0x40);  // NaN, quiet
  return static_cast<uint16_t>((x + 0x7FFF + ((x >> 16) & 1)) >> 16);
}

void halves_of(const float* from, uint16_t* to, int64_t count) {
  int64_t i = 0;
#if defined(__x86_64__)
  if (has_f16c()) i = halves_f16c(from, to, count);
#endif
  for (; i < count; ++i) to[i] = half_of(from[i]);
}

void floats_of_halves(const uint16_t* from, float* to, int64_t count) {
  int64_t i = 0;
#if defined(__x86_64__)
  if (has_f16c()) i = floats_f16c(from, to, count);
#endif
  for (; i < count; ++i) to[i] = float_of_half(from[i]);
}

// Neighbouring axes every operand steps through alike are one: a scalar times boxes [1, 4420, 2]
// is one row of 8840 values, not 4420 rows of 2.
std::unique_ptr<OpPlan> plan_broadcast(const ref::Op& op, const std::vector<const ref::Value*>& in, const ref::Value& out) {
  std::vector<Dims> strides = {strides_of(out.dims)};
  for (const ref::Value* v : in) strides.push_back(broadcast_strides(v->dims, out.dims));
  auto plan = std::make_unique<BroadcastPlan>();
  plan->epilogue = fused_activation_of(op);
  plan->strides.resize(strides.size());
  for (size_t a = 0; a < out.dims.size(); ++a) {
    if (out.dims[a] == 1) continue;
    bool joins = !plan->dims.empty();
    for (size_t k = 0; joins && k < strides.size(); ++k) joins = plan->strides[k].back() == strides[k][a] * out.dims[a];
    if (joins) plan->dims.back() *= out.dims[a];
    else plan->dims.push_back(out.dims[a]);
    for (size_t k = 0; k < strides.size(); ++k) {
      if (joins) plan->strides[k].back() = strides[k][a];
      else plan->strides[k].push_back(strides[k][a]);
    }
  }
  return plan;
}

TypedScalar TypedScalar::of(const ref::Op& op, const std::string& name, ref::DType dtype) {
  TypedScalar scalar;
  visit_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    T value;
    if constexpr (is_float_v<T>) value = T(op.get_float(name, 0.0f));
    else if constexpr (std::is_same_v<T, uint8_t>) value = op.get_int(name, 0) != 0 ? 1 : 0;  // bool
    else value = static_cast<T>(op.get_int(name, 0));
    std::memcpy(&scalar.bits, &value, sizeof(T));
  });
  return scalar;
}

FusedActivation fused_activation_of(const ref::Op& op) {
  FusedActivation a{static_cast<ref::Activation>(op.get_int("act", 0)), op.get_float("act_alpha", 0.0f),
                    op.get_float("act_beta", 0.0f), std::nullopt, std::nullopt, std::nullopt, std::nullopt};
  if (op.attr("out_scale")) a.scale = op.get_float("out_scale", 1.0f);
  if (op.attr("out_shift")) a.shift = op.get_float("out_shift", 0.0f);
  if (op.attr("out_lo")) a.lo = op.get_float("out_lo", 0.0f);
  if (op.attr("out_hi")) a.hi = op.get_float("out_hi", 0.0f);
  return a;
}

namespace {

void activate(ref::Activation kind, float alpha, float beta, float* data, int64_t n) {
  switch (kind) {
    case ref::Activation::kNone: return;
    case ref::Activation::kRelu: return in_place(data, n, [](float x) { return std::max(x, 0.0f); });
    case ref::Activation::kLeakyRelu: return in_place(data, n, [=](float x) { return leaky_relu_of(x, alpha); });
    case ref::Activation::kSigmoid: return in_place(data, n, [](float x) { return sigmoid_of(x); });
    case ref::Activation::kTanh: return tanh_n(data, data, n);
    case ref::Activation::kClip: return in_place(data, n, [=](float x) { return clip_of(x, alpha, beta); });
    case ref::Activation::kHardSigmoid:
      return in_place(data, n, [=](float x) { return hard_sigmoid_of(x, alpha, beta); });
    case ref::Activation::kHardSwish: return in_place(data, n, [](float x) { return hard_swish_of(x); });
  }
}

}  // namespace

void FusedActivation::apply(float* data, int64_t n) const {
  activate(kind, alpha, beta, data, n);
  // Without one of them the other is not applied at all: adding 0 would turn -0 into +0.
  const float s = scale.value_or(1.0f), t = shift.value_or(0.0f);
  if (scale && shift) in_place(data, n, [=](float x) { return x * s + t; });  // fp-contract is off: two roundings
  else if (scale) in_place(data, n, [=](float x) { return x * s; });
  else if (shift) in_place(data, n, [=](float x) { return x + t; });
  // As the Max and Min kernels take them, the result first: a NaN stays NaN.
  if (lo) in_place(data, n, [l = *lo](float x) { return std::max(x, l); });
  if (hi) in_place(data, n, [h = *hi](float x) { return std::min(x, h); });
}

void FusedActivation::apply(float* data, int64_t n, const ParallelFor* parallel) const {
  parallel_ranges(parallel, n, 2, [&](int64_t begin, int64_t end) { apply(data + begin, end - begin); });
}

namespace kernels {

void add(Ins in, const Output& out) {
  const FusedActivation& epilogue = static_cast<const BroadcastPlan&>(*out.plan).epilogue;
  if (epilogue.empty()) return arithmetic(in, out, [](auto a, auto b) { return wrapping_add(a, b); });
  // float32 (validation): the epilogue over each few thousand sums while they are in L1.
  const float *a = in[0].f32(), *b = in[1].f32();
  float* y = out.f32();
  if (in[0].size() != out.size() || in[1].size() != out.size()) {
    map<float, float, float>(in, out, [](float p, float q) { return p + q; });
    return epilogue.apply(y, out.size(), out.parallel);
  }
  constexpr int64_t kChunk = 4096;
  parallel_ranges(out.parallel, out.size(), 2, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; i += kChunk) {
      const int64_t n = std::min(kChunk, end - i);
      for (int64_t k = i; k < i + n; ++k) y[k] = a[k] + b[k];
      epilogue.apply(y + i, n);
    }
  });
}
void sub(Ins in, const Output& out) {
  arithmetic(in, out, [](auto a, auto b) { return wrapping_sub(a, b); });
}
void mul(Ins in, const Output& out) {
  arithmetic(in, out, [](auto a, auto b) { return wrapping_mul(a, b); });
}
void div(Ins in, const Output& out) {
  arithmetic(in, out, [](auto a, auto b) { return div_of(a, b); });
}
void min(Ins in, const Output& out) {
  arithmetic(in, out, [](auto a, auto b) { return std::min(a, b); });
}
void max(Ins in, const Output& out) {
  arithmetic(in, out, [](auto a, auto b) { return std::max(a, b); });
}
void pow(Ins in, const Output& out) {
  map<float, float, float>(in, out, [](float a, float b) { return std::pow(a, b); });
}
void prelu(Ins in, const Output& out) {
  map<float, float, float>(in, out, [](float x, float slope) { return x < 0 ? slope * x : x; });
}

void equal(Ins in, const Output& out) {
  comparison(in, out, [](auto a, auto b) { return a == b; });
}
void less(Ins in, const Output& out) {
  comparison(in, out, [](auto a, auto b) { return a < b; });
}
void greater(Ins in, const Output& out) {
  comparison(in, out, [](auto a, auto b) { return a > b; });
}
void less_or_equal(Ins in, const Output& out) {
  comparison(in, out, [](auto a, auto b) { return a <= b; });
}
void greater_or_equal(Ins in, const Output& out) {
  comparison(in, out, [](auto a, auto b) { return a >= b; });
}
void logical_and(Ins in, const Output& out) {
  map<uint8_t, uint8_t, uint8_t>(in, out, [](uint8_t a, uint8_t b) { return static_cast<uint8_t>(a && b); });
}
void logical_or(Ins in, const Output& out) {
  map<uint8_t, uint8_t, uint8_t>(in, out, [](uint8_t a, uint8_t b) { return static_cast<uint8_t>(a || b); });
}
void logical_xor(Ins in, const Output& out) {
  map<uint8_t, uint8_t, uint8_t>(in, out, [](uint8_t a, uint8_t b) { return static_cast<uint8_t>((a != 0) != (b != 0)); });
}
void logical_not(Ins in, const Output& out) {
  map<uint8_t, uint8_t>(in, out, [](uint8_t a) { return static_cast<uint8_t>(a == 0); });
}

void where(Ins in, const Output& out) {
  visit_dtype(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    map<T, uint8_t, T, T>(in, out, [](uint8_t c, T a, T b) { return c ? a : b; });
  });
}

void cast(Ins in, const Output& out) {
  const ref::DType from = in[0].dtype(), to = out.dtype();
  if (from == ref::DType::kFloat32 && to == ref::DType::kFloat16)
    return parallel_ranges(out.parallel, out.size(), 1, [&](int64_t begin, int64_t end) {
      halves_of(in[0].f32() + begin, out.as<uint16_t>() + begin, end - begin);
    });
  if (from == ref::DType::kFloat16 && to == ref::DType::kFloat32)
    return parallel_ranges(out.parallel, out.size(), 1, [&](int64_t begin, int64_t end) {
      floats_of_halves(in[0].as<uint16_t>() + begin, out.f32() + begin, end - begin);
    });
  visit_dtype(in[0].dtype(), [&](auto from) {
    visit_dtype(out.dtype(), [&](auto to) {
      using From = decltype(from);
      using To = decltype(to);
      map<To, From>(in, out, [](From x) { return convert<To>(x); });
    });
  });
}

void neg(Ins in, const Output& out) {
  visit_dtype(in[0].dtype(), [&](auto tag) {
    using T = decltype(tag);
    map<T, T>(in, out, [](T x) { return wrapping_sub(T(0), x); });
  });
}
void abs(Ins in, const Output& out) {
  visit_dtype(in[0].dtype(), [&](auto tag) {
    using T = decltype(tag);
    map<T, T>(in, out, [](T x) { return x < T(0) ? wrapping_sub(T(0), x) : x; });
  });
}

void sqrt(Ins in, const Output& out) { unary(in, out, [](float x) { return std::sqrt(x); }); }
void exp(Ins in, const Output& out) { unary(in, out, [](float x) { return exp_approx(x); }); }
void log(Ins in, const Output& out) { unary(in, out, [](float x) { return std::log(x); }); }
void erf(Ins in, const Output& out) { unary_n(in, out, erf_n); }
void sin(Ins in, const Output& out) { unary(in, out, [](float x) { return std::sin(x); }); }
void cos(Ins in, const Output& out) { unary(in, out, [](float x) { return std::cos(x); }); }
void reciprocal(Ins in, const Output& out) { unary(in, out, [](float x) { return 1.0f / x; }); }
void tan(Ins in, const Output& out) { unary(in, out, [](float x) { return std::tan(x); }); }
void asin(Ins in, const Output& out) { unary(in, out, [](float x) { return std::asin(x); }); }
void acos(Ins in, const Output& out) { unary(in, out, [](float x) { return std::acos(x); }); }
void atan(Ins in, const Output& out) { unary(in, out, [](float x) { return std::atan(x); }); }
void sinh(Ins in, const Output& out) { unary(in, out, [](float x) { return std::sinh(x); }); }
void cosh(Ins in, const Output& out) { unary(in, out, [](float x) { return std::cosh(x); }); }
void asinh(Ins in, const Output& out) { unary(in, out, [](float x) { return std::asinh(x); }); }
void acosh(Ins in, const Output& out) { unary(in, out, [](float x) { return std::acosh(x); }); }
void atanh(Ins in, const Output& out) { unary(in, out, [](float x) { return std::atanh(x); }); }
void ceil(Ins in, const Output& out) { unary(in, out, [](float x) { return std::ceil(x); }); }
void sign(Ins in, const Output& out) {
  unary(in, out, [](float x) { return x > 0 ? 1.0f : (x < 0 ? -1.0f : x); });  // 0 and NaN stay
}
void softsign(Ins in, const Output& out) {
  unary(in, out, [](float x) { return x / (1.0f + std::fabs(x)); });
}
void thresholded_relu(Ins in, const Output& out) {
  const float alpha = plan_of<Scalars>(out).a;
  unary(in, out, [=](float x) { return x > alpha ? x : 0.0f; });
}
void celu(Ins in, const Output& out) {
  const float alpha = plan_of<Scalars>(out).a;
  unary(in, out, [=](float x) { return std::max(0.0f, x) + std::min(0.0f, alpha * (std::exp(x / alpha) - 1.0f)); });
}
void shrink(Ins in, const Output& out) {
  const float bias = plan_of<Scalars>(out).a, lambd = plan_of<Scalars>(out).b;
  unary(in, out, [=](float x) { return x < -lambd ? x + bias : (x > lambd ? x - bias : 0.0f); });
}
void is_inf(Ins in, const Output& out) {
  const bool pos = plan_of<Scalars>(out).a != 0, neg = plan_of<Scalars>(out).b != 0;
  map<uint8_t, float>(in, out, [=](float x) { return static_cast<uint8_t>(std::isinf(x) && (x > 0 ? pos : neg)); });
}
void is_nan(Ins in, const Output& out) {
  map<uint8_t, float>(in, out, [](float x) { return static_cast<uint8_t>(std::isnan(x)); });
}
// The remainder takes the sign of the divisor, as Python's % (ONNX Mod with fmod=0).
void mod(Ins in, const Output& out) {
  visit_dtype(in[0].dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_integral_v<T> && std::is_signed_v<T>) {
      map<T, T, T>(in, out, [](T a, T b) {
        if (b == 0) throw Error(ErrorCode::kRuntime, "integer modulo by zero");
        if (b == T(-1)) return T(0);
        T r = static_cast<T>(a % b);
        return r != 0 && ((r < 0) != (b < 0)) ? static_cast<T>(r + b) : r;
      });
    }
  });
}

void relu(Ins in, const Output& out) { unary(in, out, [](float x) { return std::max(x, 0.0f); }); }
void sigmoid(Ins in, const Output& out) { unary(in, out, [](float x) { return sigmoid_of(x); }); }
void tanh(Ins in, const Output& out) { unary_n(in, out, tanh_n); }
void hard_swish(Ins in, const Output& out) { unary(in, out, [](float x) { return hard_swish_of(x); }); }
// log(1 + e^x) without overflow for large x.
void softplus(Ins in, const Output& out) {
  unary(in, out, [](float x) { return x > 0 ? x + std::log1p(std::exp(-x)) : std::log1p(std::exp(x)); });
}

void leaky_relu(Ins in, const Output& out) {
  const float alpha = plan_of<Scalars>(out).a;
  unary(in, out, [=](float x) { return leaky_relu_of(x, alpha); });
}

void elu(Ins in, const Output& out) {
  const float alpha = plan_of<Scalars>(out).a;
  unary(in, out, [=](float x) { return x >= 0 ? x : alpha * (std::exp(x) - 1.0f); });
}

void selu(Ins in, const Output& out) {
  const float alpha = plan_of<Scalars>(out).a, gamma = plan_of<Scalars>(out).b;
  unary(in, out, [=](float x) { return x > 0 ? gamma * x : gamma * (alpha * std::exp(x) - alpha); });
}

void hard_sigmoid(Ins in, const Output& out) {
  const float alpha = plan_of<Scalars>(out).a, beta = plan_of<Scalars>(out).b;
  unary(in, out, [=](float x) { return hard_sigmoid_of(x, alpha, beta); });
}

void clip(Ins in, const Output& out) {
  const float lo = plan_of<Scalars>(out).a, hi = plan_of<Scalars>(out).b;
  unary(in, out, [=](float x) { return clip_of(x, lo, hi); });
}

void constant_of_shape(Ins, const Output& out) {
  visit_dtype(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    std::fill(out.as<T>(), out.as<T>() + out.size(), plan_of<TypedScalars>(out).a.as<T>());
  });
}

// start, start + delta, ... accumulated element by element, as ONNX Runtime computes Range.
void range(Ins, const Output& out) {
  visit_dtype(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    T value = plan_of<TypedScalars>(out).a.as<T>(), delta = plan_of<TypedScalars>(out).b.as<T>();
    for (int64_t i = 0, n = out.size(); i < n; ++i) {
      out.as<T>()[i] = value;
      value = wrapping_add(value, delta);
    }
  });
}

void expand(Ins in, const Output& out) {
  visit_dtype(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    map<T, T>(in, out, [](T x) { return x; });
  });
}

// Each op's attributes, read once.
std::unique_ptr<OpPlan> plan_celu(const ref::Op& op, const std::vector<const ref::Value*>&, const ref::Value&) {
  return std::make_unique<Scalars>(op.get_float("alpha", 1.0f));
}
std::unique_ptr<OpPlan> plan_shrink(const ref::Op& op, const std::vector<const ref::Value*>&, const ref::Value&) {
  return std::make_unique<Scalars>(op.get_float("bias", 0.0f), op.get_float("lambd", 0.0f));
}
std::unique_ptr<OpPlan> plan_is_inf(const ref::Op& op, const std::vector<const ref::Value*>&, const ref::Value&) {
  return std::make_unique<Scalars>(op.get_int("detect_positive", 1) != 0 ? 1.0f : 0.0f,
                                   op.get_int("detect_negative", 1) != 0 ? 1.0f : 0.0f);
}
std::unique_ptr<OpPlan> plan_alpha(const ref::Op& op, const std::vector<const ref::Value*>&, const ref::Value&) {
  return std::make_unique<Scalars>(op.get_float("alpha", 0.0f));
}
std::unique_ptr<OpPlan> plan_selu(const ref::Op& op, const std::vector<const ref::Value*>&, const ref::Value&) {
  return std::make_unique<Scalars>(op.get_float("alpha", 0.0f), op.get_float("gamma", 0.0f));
}
std::unique_ptr<OpPlan> plan_alpha_beta(const ref::Op& op, const std::vector<const ref::Value*>&, const ref::Value&) {
  return std::make_unique<Scalars>(op.get_float("alpha", 0.0f), op.get_float("beta", 0.0f));
}
std::unique_ptr<OpPlan> plan_clip(const ref::Op& op, const std::vector<const ref::Value*>&, const ref::Value&) {
  return std::make_unique<Scalars>(op.get_float("min", 0.0f), op.get_float("max", 0.0f));
}
std::unique_ptr<OpPlan> plan_constant_of_shape(const ref::Op& op, const std::vector<const ref::Value*>&, const ref::Value& out) {
  return std::make_unique<TypedScalars>(TypedScalar::of(op, "value", out.dtype));
}
std::unique_ptr<OpPlan> plan_range(const ref::Op& op, const std::vector<const ref::Value*>&, const ref::Value& out) {
  return std::make_unique<TypedScalars>(TypedScalar::of(op, "start", out.dtype), TypedScalar::of(op, "delta", out.dtype));
}

}  // namespace kernels
}  // namespace ctxgen::runtime
