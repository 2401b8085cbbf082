#pragma once
// Kernel interface of the ref runtime. Kernels run on validated programs only: every dim, id and
// attribute they read has been checked by validate(), so they index without further checks.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "ctxgen/ref_program.h"
#include "ctxgen/runtime.h"
#include "shape.h"

namespace ctxgen::runtime {

struct Tensor {
  const ref::Value* value = nullptr;  // nullptr for an absent optional input
  const void* data = nullptr;

  bool present() const { return value != nullptr; }
  const Dims& dims() const { return value->dims; }
  int64_t size() const { return value->element_count(); }
  ref::DType dtype() const { return value->dtype; }
  template <typename T>
  const T* as() const { return static_cast<const T*>(data); }
  const float* f32() const { return as<float>(); }
  const int64_t* i64() const { return as<int64_t>(); }
  const uint8_t* bytes() const { return static_cast<const uint8_t*>(data); }
};

// What an op resolves before its first run, for kernels that need more than their attributes (a
// oneDNN primitive, the size of a scratch buffer): made once per program by the op's planner.
struct OpPlan {
  virtual ~OpPlan() = default;
  uint64_t scratch_bytes = 0;  // what the kernel needs of Output::scratch on each run
};

struct Output {
  const ref::Value* value = nullptr;
  void* data = nullptr;
  const ParallelFor* parallel = nullptr;  // the caller's threads, for kernels that split their work
  const OpPlan* plan = nullptr;           // the op's plan, when its type has a planner
  uint8_t* scratch = nullptr;             // plan->scratch_bytes of this run's arena, 64-byte aligned

  const Dims& dims() const { return value->dims; }
  int64_t size() const { return value->element_count(); }
  ref::DType dtype() const { return value->dtype; }
  template <typename T>
  T* as() const { return static_cast<T*>(data); }
  float* f32() const { return as<float>(); }
  uint8_t* bytes() const { return static_cast<uint8_t*>(data); }
};

// Calls f(T{}) with the C++ type of `dtype` (bool is stored as uint8_t, 0 or 1).
template <typename F>
decltype(auto) visit_dtype(ref::DType dtype, F&& f) {
  switch (dtype) {
    case ref::DType::kInt32: return f(int32_t{});
    case ref::DType::kInt64: return f(int64_t{});
    case ref::DType::kBool: return f(uint8_t{});
    case ref::DType::kFloat32: break;
  }
  return f(float{});
}

using Kernel = void (*)(const ref::Op& op, const std::vector<Tensor>& in, const Output& out);
// Makes the plan of a validated op; throws Error(kInvalidBinary) when the op cannot run here.
using Planner = std::unique_ptr<OpPlan> (*)(const ref::Op& op, const std::vector<const ref::Value*>& in,
                                            const ref::Value& out);

// Runs body(begin, end) over [0, count): cut into pieces the caller's threads share when the whole
// (count x cost element operations) pays for them, else in one call.
inline void parallel_ranges(const ParallelFor* parallel, int64_t count, int64_t cost,
                            const std::function<void(int64_t begin, int64_t end)>& body) {
  constexpr int64_t kMinWork = int64_t{1} << 16, kPieces = 4;
  if (!parallel || !*parallel || count < 2 || count * cost < kMinWork) return body(0, count);
  const int64_t pieces = count < kPieces ? count : kPieces, size = (count + pieces - 1) / pieces;
  (*parallel)(static_cast<size_t>(pieces), [&](size_t piece) {
    const int64_t begin = static_cast<int64_t>(piece) * size;
    if (begin < count) body(begin, begin + size < count ? begin + size : count);
  });
}

// What a GEMM's caller does to columns [j0, j0 + cols) of every row of y once they are computed
// (bias, activation), inside the same task while they are in cache.
using Epilogue = std::function<void(int64_t j0, int64_t cols)>;

// y [m, n] = op(A) [m, k] x op(B) [k, n], all dense row-major (op: transposed when asked), split
// over the caller's threads when large (kernels_linear.cc).
void gemm_rowmajor(int64_t m, int64_t n, int64_t k, const float* a, const float* b, float* y, const ParallelFor* parallel,
                   bool trans_a = false, bool trans_b = false, const Epilogue& after = {});

// Integer arithmetic wraps around as two's complement instead of overflowing (which would be
// undefined behaviour); floats are left as they are.
template <typename T, typename Op>
T wrapping(T a, T b, Op op) {
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(op(static_cast<U>(a), static_cast<U>(b)));
  } else {
    return op(a, b);
  }
}
template <typename T>
T wrapping_add(T a, T b) { return wrapping(a, b, std::plus<>()); }
template <typename T>
T wrapping_sub(T a, T b) { return wrapping(a, b, std::minus<>()); }
template <typename T>
T wrapping_mul(T a, T b) { return wrapping(a, b, std::multiplies<>()); }

// A scalar attribute of an op writing `T`: float for float32, int otherwise (validate() checks the
// kind matches the output type).
template <typename T>
T scalar_of(const ref::Op& op, const std::string& name) {
  if constexpr (std::is_same_v<T, float>) return op.get_float(name, 0.0f);
  else if constexpr (std::is_same_v<T, uint8_t>) return op.get_int(name, 0) != 0 ? 1 : 0;  // bool
  else return static_cast<T>(op.get_int(name, 0));
}

// The fused activation (attrs act, act_alpha, act_beta) of an op, read once for a whole tensor or
// for all the pieces of one.
struct FusedActivation {
  ref::Activation kind = ref::Activation::kNone;
  float alpha = 0, beta = 0;
  void apply(float* data, int64_t n) const;  // to data[0, n) in place
};
FusedActivation fused_activation_of(const ref::Op& op);
inline void apply_activation(const ref::Op& op, float* data, int64_t n) { fused_activation_of(op).apply(data, n); }

// The kernels, one per op type; kernels_*.cc hold them by family.
namespace kernels {

// Elementwise, comparisons, casts and generated constants (kernels_elementwise.cc).
void add(const ref::Op&, const std::vector<Tensor>&, const Output&);
void sub(const ref::Op&, const std::vector<Tensor>&, const Output&);
void mul(const ref::Op&, const std::vector<Tensor>&, const Output&);
void div(const ref::Op&, const std::vector<Tensor>&, const Output&);
void min(const ref::Op&, const std::vector<Tensor>&, const Output&);
void max(const ref::Op&, const std::vector<Tensor>&, const Output&);
void pow(const ref::Op&, const std::vector<Tensor>&, const Output&);
void prelu(const ref::Op&, const std::vector<Tensor>&, const Output&);
void equal(const ref::Op&, const std::vector<Tensor>&, const Output&);
void less(const ref::Op&, const std::vector<Tensor>&, const Output&);
void greater(const ref::Op&, const std::vector<Tensor>&, const Output&);
void less_or_equal(const ref::Op&, const std::vector<Tensor>&, const Output&);
void greater_or_equal(const ref::Op&, const std::vector<Tensor>&, const Output&);
void logical_and(const ref::Op&, const std::vector<Tensor>&, const Output&);
void logical_or(const ref::Op&, const std::vector<Tensor>&, const Output&);
void logical_xor(const ref::Op&, const std::vector<Tensor>&, const Output&);
void logical_not(const ref::Op&, const std::vector<Tensor>&, const Output&);
void where(const ref::Op&, const std::vector<Tensor>&, const Output&);
void cast(const ref::Op&, const std::vector<Tensor>&, const Output&);
void neg(const ref::Op&, const std::vector<Tensor>&, const Output&);
void abs(const ref::Op&, const std::vector<Tensor>&, const Output&);
void sqrt(const ref::Op&, const std::vector<Tensor>&, const Output&);
void exp(const ref::Op&, const std::vector<Tensor>&, const Output&);
void log(const ref::Op&, const std::vector<Tensor>&, const Output&);
void erf(const ref::Op&, const std::vector<Tensor>&, const Output&);
void sin(const ref::Op&, const std::vector<Tensor>&, const Output&);
void cos(const ref::Op&, const std::vector<Tensor>&, const Output&);
void reciprocal(const ref::Op&, const std::vector<Tensor>&, const Output&);
void tan(const ref::Op&, const std::vector<Tensor>&, const Output&);
void asin(const ref::Op&, const std::vector<Tensor>&, const Output&);
void acos(const ref::Op&, const std::vector<Tensor>&, const Output&);
void atan(const ref::Op&, const std::vector<Tensor>&, const Output&);
void sinh(const ref::Op&, const std::vector<Tensor>&, const Output&);
void cosh(const ref::Op&, const std::vector<Tensor>&, const Output&);
void asinh(const ref::Op&, const std::vector<Tensor>&, const Output&);
void acosh(const ref::Op&, const std::vector<Tensor>&, const Output&);
void atanh(const ref::Op&, const std::vector<Tensor>&, const Output&);
void sign(const ref::Op&, const std::vector<Tensor>&, const Output&);
void ceil(const ref::Op&, const std::vector<Tensor>&, const Output&);
void softsign(const ref::Op&, const std::vector<Tensor>&, const Output&);
void thresholded_relu(const ref::Op&, const std::vector<Tensor>&, const Output&);
void celu(const ref::Op&, const std::vector<Tensor>&, const Output&);
void shrink(const ref::Op&, const std::vector<Tensor>&, const Output&);
void is_inf(const ref::Op&, const std::vector<Tensor>&, const Output&);
void is_nan(const ref::Op&, const std::vector<Tensor>&, const Output&);
void mod(const ref::Op&, const std::vector<Tensor>&, const Output&);
void relu(const ref::Op&, const std::vector<Tensor>&, const Output&);
void sigmoid(const ref::Op&, const std::vector<Tensor>&, const Output&);
void tanh(const ref::Op&, const std::vector<Tensor>&, const Output&);
void softplus(const ref::Op&, const std::vector<Tensor>&, const Output&);
void hard_swish(const ref::Op&, const std::vector<Tensor>&, const Output&);
void leaky_relu(const ref::Op&, const std::vector<Tensor>&, const Output&);
void elu(const ref::Op&, const std::vector<Tensor>&, const Output&);
void selu(const ref::Op&, const std::vector<Tensor>&, const Output&);
void hard_sigmoid(const ref::Op&, const std::vector<Tensor>&, const Output&);
void clip(const ref::Op&, const std::vector<Tensor>&, const Output&);
void constant_of_shape(const ref::Op&, const std::vector<Tensor>&, const Output&);
void range(const ref::Op&, const std::vector<Tensor>&, const Output&);
void expand(const ref::Op&, const std::vector<Tensor>&, const Output&);  // a broadcast copy

// Linear algebra and windows (kernels_linear.cc, kernels_pool.cc).
void matmul(const ref::Op&, const std::vector<Tensor>&, const Output&);
void gemm(const ref::Op&, const std::vector<Tensor>&, const Output&);
void conv(const ref::Op&, const std::vector<Tensor>&, const Output&);  // kernels_conv.cc
std::unique_ptr<OpPlan> plan_conv(const ref::Op&, const std::vector<const ref::Value*>&, const ref::Value&);
void max_pool(const ref::Op&, const std::vector<Tensor>&, const Output&);
void average_pool(const ref::Op&, const std::vector<Tensor>&, const Output&);
void conv_transpose(const ref::Op&, const std::vector<Tensor>&, const Output&);
void resize(const ref::Op&, const std::vector<Tensor>&, const Output&);
std::unique_ptr<OpPlan> plan_resize(const ref::Op&, const std::vector<const ref::Value*>&, const ref::Value&);

// Normalisation and reductions (kernels_norm.cc).
void softmax(const ref::Op&, const std::vector<Tensor>&, const Output&);
void log_softmax(const ref::Op&, const std::vector<Tensor>&, const Output&);
void hardmax(const ref::Op&, const std::vector<Tensor>&, const Output&);
void nll_loss(const ref::Op&, const std::vector<Tensor>&, const Output&);
void cum_sum(const ref::Op&, const std::vector<Tensor>&, const Output&);
void batch_normalization(const ref::Op&, const std::vector<Tensor>&, const Output&);
void layer_normalization(const ref::Op&, const std::vector<Tensor>&, const Output&);
void reduce_mean(const ref::Op&, const std::vector<Tensor>&, const Output&);
void reduce_sum(const ref::Op&, const std::vector<Tensor>&, const Output&);
void reduce_max(const ref::Op&, const std::vector<Tensor>&, const Output&);
void reduce_min(const ref::Op&, const std::vector<Tensor>&, const Output&);
void reduce_prod(const ref::Op&, const std::vector<Tensor>&, const Output&);
void reduce_l1(const ref::Op&, const std::vector<Tensor>&, const Output&);
void reduce_l2(const ref::Op&, const std::vector<Tensor>&, const Output&);
void reduce_sum_square(const ref::Op&, const std::vector<Tensor>&, const Output&);
void reduce_log_sum(const ref::Op&, const std::vector<Tensor>&, const Output&);
void reduce_log_sum_exp(const ref::Op&, const std::vector<Tensor>&, const Output&);
void group_normalization(const ref::Op&, const std::vector<Tensor>&, const Output&);
void arg_max(const ref::Op&, const std::vector<Tensor>&, const Output&);
void arg_min(const ref::Op&, const std::vector<Tensor>&, const Output&);

// Data movement (kernels_data.cc).
void transpose(const ref::Op&, const std::vector<Tensor>&, const Output&);
void reshape(const ref::Op&, const std::vector<Tensor>&, const Output&);
void tile(const ref::Op&, const std::vector<Tensor>&, const Output&);
void trilu(const ref::Op&, const std::vector<Tensor>&, const Output&);
void concat(const ref::Op&, const std::vector<Tensor>&, const Output&);
void slice(const ref::Op&, const std::vector<Tensor>&, const Output&);
void gather(const ref::Op&, const std::vector<Tensor>&, const Output&);
void gather_elements(const ref::Op&, const std::vector<Tensor>&, const Output&);
void pad(const ref::Op&, const std::vector<Tensor>&, const Output&);
void shape(const ref::Op&, const std::vector<Tensor>&, const Output&);  // reads dims only
void size(const ref::Op&, const std::vector<Tensor>&, const Output&);   // reads dims only
void eye_like(const ref::Op&, const std::vector<Tensor>&, const Output&);  // reads dims only
void one_hot(const ref::Op&, const std::vector<Tensor>&, const Output&);
void gather_nd(const ref::Op&, const std::vector<Tensor>&, const Output&);
void scatter_elements(const ref::Op&, const std::vector<Tensor>&, const Output&);

}  // namespace kernels

}  // namespace ctxgen::runtime
