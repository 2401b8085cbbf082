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

namespace ctxgen::runtime {
namespace {

// y = f(a, b, ...) over inputs broadcast numpy-style to the output dims; In are the input element
// types, R the output's.
template <typename R, typename... In, typename F, size_t... I>
void broadcast_map(const std::vector<Tensor>& in, const Output& out, F f, std::index_sequence<I...>) {
  constexpr size_t kInputs = sizeof...(In);
  R* y = out.as<R>();
  const std::tuple<const In*...> src{in[I].template as<In>()...};
  const Dims& dims = out.dims();
  if (((in[I].size() == out.size()) && ...)) {
    parallel_ranges(out.parallel, out.size(), 1, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) y[i] = f(std::get<I>(src)[i]...);
    });
    return;
  }
  const Dims strides[kInputs + 1] = {strides_of(dims), broadcast_strides(in[I].dims(), dims)...};
  int64_t inner = dims.empty() ? 1 : dims.back();
  int64_t step[kInputs] = {(dims.empty() ? 0 : strides[I + 1].back())...};
  for_each_row(dims, strides, [&](const int64_t* at) {
    R* row = y + at[0];
    for (int64_t i = 0; i < inner; ++i) row[i] = f(std::get<I>(src)[at[I + 1] + i * step[I]]...);
  });
}

template <typename R, typename... In, typename F>
void map(const std::vector<Tensor>& in, const Output& out, F f) {
  broadcast_map<R, In...>(in, out, f, std::index_sequence_for<In...>{});
}

// A binary op on every numeric type, the output of the inputs' type.
template <typename F>
void arithmetic(const std::vector<Tensor>& in, const Output& out, F f) {
  visit_dtype(in[0].dtype(), [&](auto tag) {
    using T = decltype(tag);
    map<T, T, T>(in, out, [&](T a, T b) { return f(a, b); });
  });
}

// A comparison of two inputs of one type, giving bool.
template <typename F>
void comparison(const std::vector<Tensor>& in, const Output& out, F f) {
  visit_dtype(in[0].dtype(), [&](auto tag) {
    using T = decltype(tag);
    map<uint8_t, T, T>(in, out, [&](T a, T b) { return static_cast<uint8_t>(f(a, b)); });
  });
}

template <typename F>
void unary(const std::vector<Tensor>& in, const Output& out, F f) {
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
float sigmoid_of(float x) { return 1.0f / (1.0f + std::exp(-x)); }
// NaN stays NaN, as in ONNX Clip; std::clamp would turn it into a bound on some inputs.
float clip_of(float x, float lo, float hi) { return x < lo ? lo : (x > hi ? hi : x); }
float leaky_relu_of(float x, float alpha) { return x < 0 ? alpha * x : x; }

template <typename F>
void in_place(float* data, int64_t n, F f) {
  for (int64_t i = 0; i < n; ++i) data[i] = f(data[i]);
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
  else if constexpr (std::is_same_v<From, float> && std::is_integral_v<To>) return float_to_int<To>(x);
  else return static_cast<To>(x);
}

}  // namespace

FusedActivation fused_activation_of(const ref::Op& op) {
  return {static_cast<ref::Activation>(op.get_int("act", 0)), op.get_float("act_alpha", 0.0f), op.get_float("act_beta", 0.0f)};
}

void FusedActivation::apply(float* data, int64_t n) const {
  const float alpha = this->alpha, beta = this->beta;  // captured by value below
  switch (kind) {
    case ref::Activation::kNone: return;
    case ref::Activation::kRelu: return in_place(data, n, [](float x) { return std::max(x, 0.0f); });
    case ref::Activation::kLeakyRelu: return in_place(data, n, [=](float x) { return leaky_relu_of(x, alpha); });
    case ref::Activation::kSigmoid: return in_place(data, n, sigmoid_of);
    case ref::Activation::kTanh: return in_place(data, n, [](float x) { return std::tanh(x); });
    case ref::Activation::kClip: return in_place(data, n, [=](float x) { return clip_of(x, alpha, beta); });
    case ref::Activation::kHardSigmoid:
      return in_place(data, n, [=](float x) { return hard_sigmoid_of(x, alpha, beta); });
    case ref::Activation::kHardSwish: return in_place(data, n, hard_swish_of);
  }
}

namespace kernels {

using Ins = std::vector<Tensor>;

void add(const ref::Op&, const Ins& in, const Output& out) {
  arithmetic(in, out, [](auto a, auto b) { return wrapping_add(a, b); });
}
void sub(const ref::Op&, const Ins& in, const Output& out) {
  arithmetic(in, out, [](auto a, auto b) { return wrapping_sub(a, b); });
}
void mul(const ref::Op&, const Ins& in, const Output& out) {
  arithmetic(in, out, [](auto a, auto b) { return wrapping_mul(a, b); });
}
void div(const ref::Op&, const Ins& in, const Output& out) {
  arithmetic(in, out, [](auto a, auto b) { return div_of(a, b); });
}
void min(const ref::Op&, const Ins& in, const Output& out) {
  arithmetic(in, out, [](auto a, auto b) { return std::min(a, b); });
}
void max(const ref::Op&, const Ins& in, const Output& out) {
  arithmetic(in, out, [](auto a, auto b) { return std::max(a, b); });
}
void pow(const ref::Op&, const Ins& in, const Output& out) {
  map<float, float, float>(in, out, [](float a, float b) { return std::pow(a, b); });
}
void prelu(const ref::Op&, const Ins& in, const Output& out) {
  map<float, float, float>(in, out, [](float x, float slope) { return x < 0 ? slope * x : x; });
}

void equal(const ref::Op&, const Ins& in, const Output& out) {
  comparison(in, out, [](auto a, auto b) { return a == b; });
}
void less(const ref::Op&, const Ins& in, const Output& out) {
  comparison(in, out, [](auto a, auto b) { return a < b; });
}
void greater(const ref::Op&, const Ins& in, const Output& out) {
  comparison(in, out, [](auto a, auto b) { return a > b; });
}
void less_or_equal(const ref::Op&, const Ins& in, const Output& out) {
  comparison(in, out, [](auto a, auto b) { return a <= b; });
}
void greater_or_equal(const ref::Op&, const Ins& in, const Output& out) {
  comparison(in, out, [](auto a, auto b) { return a >= b; });
}
void logical_and(const ref::Op&, const Ins& in, const Output& out) {
  map<uint8_t, uint8_t, uint8_t>(in, out, [](uint8_t a, uint8_t b) { return static_cast<uint8_t>(a && b); });
}
void logical_or(const ref::Op&, const Ins& in, const Output& out) {
  map<uint8_t, uint8_t, uint8_t>(in, out, [](uint8_t a, uint8_t b) { return static_cast<uint8_t>(a || b); });
}
void logical_xor(const ref::Op&, const Ins& in, const Output& out) {
  map<uint8_t, uint8_t, uint8_t>(in, out, [](uint8_t a, uint8_t b) { return static_cast<uint8_t>((a != 0) != (b != 0)); });
}
void logical_not(const ref::Op&, const Ins& in, const Output& out) {
  map<uint8_t, uint8_t>(in, out, [](uint8_t a) { return static_cast<uint8_t>(a == 0); });
}

void where(const ref::Op&, const Ins& in, const Output& out) {
  visit_dtype(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    map<T, uint8_t, T, T>(in, out, [](uint8_t c, T a, T b) { return c ? a : b; });
  });
}

void cast(const ref::Op&, const Ins& in, const Output& out) {
  visit_dtype(in[0].dtype(), [&](auto from) {
    visit_dtype(out.dtype(), [&](auto to) {
      using From = decltype(from);
      using To = decltype(to);
      map<To, From>(in, out, [](From x) { return convert<To>(x); });
    });
  });
}

void neg(const ref::Op&, const Ins& in, const Output& out) {
  visit_dtype(in[0].dtype(), [&](auto tag) {
    using T = decltype(tag);
    map<T, T>(in, out, [](T x) { return wrapping_sub(T(0), x); });
  });
}
void abs(const ref::Op&, const Ins& in, const Output& out) {
  visit_dtype(in[0].dtype(), [&](auto tag) {
    using T = decltype(tag);
    map<T, T>(in, out, [](T x) { return x < T(0) ? wrapping_sub(T(0), x) : x; });
  });
}

void sqrt(const ref::Op&, const Ins& in, const Output& out) { unary(in, out, [](float x) { return std::sqrt(x); }); }
void exp(const ref::Op&, const Ins& in, const Output& out) { unary(in, out, [](float x) { return std::exp(x); }); }
void log(const ref::Op&, const Ins& in, const Output& out) { unary(in, out, [](float x) { return std::log(x); }); }
void erf(const ref::Op&, const Ins& in, const Output& out) { unary(in, out, [](float x) { return std::erf(x); }); }
void sin(const ref::Op&, const Ins& in, const Output& out) { unary(in, out, [](float x) { return std::sin(x); }); }
void cos(const ref::Op&, const Ins& in, const Output& out) { unary(in, out, [](float x) { return std::cos(x); }); }
void reciprocal(const ref::Op&, const Ins& in, const Output& out) { unary(in, out, [](float x) { return 1.0f / x; }); }
void tan(const ref::Op&, const Ins& in, const Output& out) { unary(in, out, [](float x) { return std::tan(x); }); }
void asin(const ref::Op&, const Ins& in, const Output& out) { unary(in, out, [](float x) { return std::asin(x); }); }
void acos(const ref::Op&, const Ins& in, const Output& out) { unary(in, out, [](float x) { return std::acos(x); }); }
void atan(const ref::Op&, const Ins& in, const Output& out) { unary(in, out, [](float x) { return std::atan(x); }); }
void sinh(const ref::Op&, const Ins& in, const Output& out) { unary(in, out, [](float x) { return std::sinh(x); }); }
void cosh(const ref::Op&, const Ins& in, const Output& out) { unary(in, out, [](float x) { return std::cosh(x); }); }
void asinh(const ref::Op&, const Ins& in, const Output& out) { unary(in, out, [](float x) { return std::asinh(x); }); }
void acosh(const ref::Op&, const Ins& in, const Output& out) { unary(in, out, [](float x) { return std::acosh(x); }); }
void atanh(const ref::Op&, const Ins& in, const Output& out) { unary(in, out, [](float x) { return std::atanh(x); }); }
void ceil(const ref::Op&, const Ins& in, const Output& out) { unary(in, out, [](float x) { return std::ceil(x); }); }
void sign(const ref::Op&, const Ins& in, const Output& out) {
  unary(in, out, [](float x) { return x > 0 ? 1.0f : (x < 0 ? -1.0f : x); });  // 0 and NaN stay
}
void softsign(const ref::Op&, const Ins& in, const Output& out) {
  unary(in, out, [](float x) { return x / (1.0f + std::fabs(x)); });
}
void thresholded_relu(const ref::Op& op, const Ins& in, const Output& out) {
  float alpha = op.get_float("alpha", 0.0f);
  unary(in, out, [=](float x) { return x > alpha ? x : 0.0f; });
}
void celu(const ref::Op& op, const Ins& in, const Output& out) {
  float alpha = op.get_float("alpha", 1.0f);
  unary(in, out, [=](float x) { return std::max(0.0f, x) + std::min(0.0f, alpha * (std::exp(x / alpha) - 1.0f)); });
}
void shrink(const ref::Op& op, const Ins& in, const Output& out) {
  float bias = op.get_float("bias", 0.0f), lambd = op.get_float("lambd", 0.0f);
  unary(in, out, [=](float x) { return x < -lambd ? x + bias : (x > lambd ? x - bias : 0.0f); });
}
void is_inf(const ref::Op& op, const Ins& in, const Output& out) {
  bool pos = op.get_int("detect_positive", 1) != 0, neg = op.get_int("detect_negative", 1) != 0;
  map<uint8_t, float>(in, out, [=](float x) { return static_cast<uint8_t>(std::isinf(x) && (x > 0 ? pos : neg)); });
}
void is_nan(const ref::Op&, const Ins& in, const Output& out) {
  map<uint8_t, float>(in, out, [](float x) { return static_cast<uint8_t>(std::isnan(x)); });
}
// The remainder takes the sign of the divisor, as Python's % (ONNX Mod with fmod=0).
void mod(const ref::Op&, const Ins& in, const Output& out) {
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

void relu(const ref::Op&, const Ins& in, const Output& out) { unary(in, out, [](float x) { return std::max(x, 0.0f); }); }
void sigmoid(const ref::Op&, const Ins& in, const Output& out) { unary(in, out, sigmoid_of); }
void tanh(const ref::Op&, const Ins& in, const Output& out) { unary(in, out, [](float x) { return std::tanh(x); }); }
void hard_swish(const ref::Op&, const Ins& in, const Output& out) { unary(in, out, hard_swish_of); }
// log(1 + e^x) without overflow for large x.
void softplus(const ref::Op&, const Ins& in, const Output& out) {
  unary(in, out, [](float x) { return x > 0 ? x + std::log1p(std::exp(-x)) : std::log1p(std::exp(x)); });
}

void leaky_relu(const ref::Op& op, const Ins& in, const Output& out) {
  float alpha = op.get_float("alpha", 0.0f);
  unary(in, out, [=](float x) { return leaky_relu_of(x, alpha); });
}

void elu(const ref::Op& op, const Ins& in, const Output& out) {
  float alpha = op.get_float("alpha", 0.0f);
  unary(in, out, [=](float x) { return x >= 0 ? x : alpha * (std::exp(x) - 1.0f); });
}

void selu(const ref::Op& op, const Ins& in, const Output& out) {
  float alpha = op.get_float("alpha", 0.0f), gamma = op.get_float("gamma", 0.0f);
  unary(in, out, [=](float x) { return x > 0 ? gamma * x : gamma * (alpha * std::exp(x) - alpha); });
}

void hard_sigmoid(const ref::Op& op, const Ins& in, const Output& out) {
  float alpha = op.get_float("alpha", 0.0f), beta = op.get_float("beta", 0.0f);
  unary(in, out, [=](float x) { return hard_sigmoid_of(x, alpha, beta); });
}

void clip(const ref::Op& op, const Ins& in, const Output& out) {
  float lo = op.get_float("min", 0.0f), hi = op.get_float("max", 0.0f);
  unary(in, out, [=](float x) { return clip_of(x, lo, hi); });
}

void constant_of_shape(const ref::Op& op, const Ins&, const Output& out) {
  visit_dtype(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    std::fill(out.as<T>(), out.as<T>() + out.size(), scalar_of<T>(op, "value"));
  });
}

// start, start + delta, ... accumulated element by element, as ONNX Runtime computes Range.
void range(const ref::Op& op, const Ins&, const Output& out) {
  visit_dtype(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    T value = scalar_of<T>(op, "start"), delta = scalar_of<T>(op, "delta");
    for (int64_t i = 0, n = out.size(); i < n; ++i) {
      out.as<T>()[i] = value;
      value = wrapping_add(value, delta);
    }
  });
}

void expand(const ref::Op&, const Ins& in, const Output& out) {
  visit_dtype(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    map<T, T>(in, out, [](T x) { return x; });
  });
}

}  // namespace kernels
}  // namespace ctxgen::runtime
