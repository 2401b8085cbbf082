// Elementwise kernels. Each op is a small functor instantiated into its own loop, so the inner
// loops have no indirect calls and the compiler can vectorise them.

#include <algorithm>
#include <cmath>

#include "kernels.h"

namespace ctxgen::runtime {
namespace {

template <typename F>
void binary(const std::vector<Tensor>& in, const Output& out, F f) {
  const float* a = in[0].f32();
  const float* b = in[1].f32();
  float* y = out.f32();
  const Dims& dims = out.dims();
  if (in[0].size() == out.size() && in[1].size() == out.size()) {
    for (int64_t i = 0, n = out.size(); i < n; ++i) y[i] = f(a[i], b[i]);
    return;
  }
  const Dims strides[3] = {strides_of(dims), broadcast_strides(in[0].dims(), dims),
                           broadcast_strides(in[1].dims(), dims)};
  int64_t inner = dims.empty() ? 1 : dims.back();
  int64_t sa = dims.empty() ? 0 : strides[1].back(), sb = dims.empty() ? 0 : strides[2].back();
  for_each_row(dims, strides, [&](const int64_t* at) {
    float* row = y + at[0];
    const float* ra = a + at[1];
    const float* rb = b + at[2];
    for (int64_t i = 0; i < inner; ++i) row[i] = f(ra[i * sa], rb[i * sb]);
  });
}

template <typename F>
void unary(const std::vector<Tensor>& in, const Output& out, F f) {
  const float* x = in[0].f32();
  float* y = out.f32();
  for (int64_t i = 0, n = out.size(); i < n; ++i) y[i] = f(x[i]);
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

}  // namespace

void apply_activation(const ref::Op& op, float* data, int64_t n) {
  float alpha = op.get_float("act_alpha", 0.0f), beta = op.get_float("act_beta", 0.0f);
  switch (static_cast<ref::Activation>(op.get_int("act", 0))) {
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

void add(const ref::Op&, const Ins& in, const Output& out) { binary(in, out, [](float a, float b) { return a + b; }); }
void sub(const ref::Op&, const Ins& in, const Output& out) { binary(in, out, [](float a, float b) { return a - b; }); }
void mul(const ref::Op&, const Ins& in, const Output& out) { binary(in, out, [](float a, float b) { return a * b; }); }
void div(const ref::Op&, const Ins& in, const Output& out) { binary(in, out, [](float a, float b) { return a / b; }); }
void pow(const ref::Op&, const Ins& in, const Output& out) {
  binary(in, out, [](float a, float b) { return std::pow(a, b); });
}

void sqrt(const ref::Op&, const Ins& in, const Output& out) { unary(in, out, [](float x) { return std::sqrt(x); }); }
void exp(const ref::Op&, const Ins& in, const Output& out) { unary(in, out, [](float x) { return std::exp(x); }); }
void erf(const ref::Op&, const Ins& in, const Output& out) { unary(in, out, [](float x) { return std::erf(x); }); }
void neg(const ref::Op&, const Ins& in, const Output& out) { unary(in, out, [](float x) { return -x; }); }
void abs(const ref::Op&, const Ins& in, const Output& out) { unary(in, out, [](float x) { return std::fabs(x); }); }
void relu(const ref::Op&, const Ins& in, const Output& out) { unary(in, out, [](float x) { return std::max(x, 0.0f); }); }
void sigmoid(const ref::Op&, const Ins& in, const Output& out) { unary(in, out, sigmoid_of); }
void tanh(const ref::Op&, const Ins& in, const Output& out) { unary(in, out, [](float x) { return std::tanh(x); }); }
void hard_swish(const ref::Op&, const Ins& in, const Output& out) { unary(in, out, hard_swish_of); }

void leaky_relu(const ref::Op& op, const Ins& in, const Output& out) {
  float alpha = op.get_float("alpha", 0.0f);
  unary(in, out, [=](float x) { return leaky_relu_of(x, alpha); });
}

void hard_sigmoid(const ref::Op& op, const Ins& in, const Output& out) {
  float alpha = op.get_float("alpha", 0.0f), beta = op.get_float("beta", 0.0f);
  unary(in, out, [=](float x) { return hard_sigmoid_of(x, alpha, beta); });
}

void clip(const ref::Op& op, const Ins& in, const Output& out) {
  float lo = op.get_float("min", 0.0f), hi = op.get_float("max", 0.0f);
  unary(in, out, [=](float x) { return clip_of(x, lo, hi); });
}

}  // namespace kernels
}  // namespace ctxgen::runtime
