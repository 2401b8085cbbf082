#pragma once
// Kernel interface of the ref runtime. Kernels run on validated programs only: every dim, id and
// attribute they read has been checked by validate(), so they index without further checks.

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <span>
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

// An op's inputs, in a run's bound tensors.
using Ins = std::span<const Tensor>;

// What an op's kernel keeps from one run to the next of one run state (which one run uses at a
// time), such as the library objects around its buffers.
struct OpState {
  virtual ~OpState() = default;
};

// What an op resolves before its first run, for kernels that need more than their attributes (a
// oneDNN primitive, the size of a scratch buffer): made once per program by the op's planner.
struct OpPlan {
  virtual ~OpPlan() = default;
  // The op's state for a new run state; none for most ops.
  virtual std::unique_ptr<OpState> make_state() const { return nullptr; }
  uint64_t scratch_bytes = 0;  // what the kernel needs of Output::scratch on each run
};

struct Output {
  const ref::Value* value = nullptr;
  void* data = nullptr;
  const ParallelFor* parallel = nullptr;  // the caller's threads, for kernels that split their work
  const OpPlan* plan = nullptr;           // the op's plan, when its type has a planner
  uint8_t* scratch = nullptr;             // plan->scratch_bytes of this run's arena, 64-byte aligned
  OpState* state = nullptr;               // the plan's make_state() in this run state, if it made one

  const Dims& dims() const { return value->dims; }
  int64_t size() const { return value->element_count(); }
  ref::DType dtype() const { return value->dtype; }
  template <typename T>
  T* as() const { return static_cast<T*>(data); }
  float* f32() const { return as<float>(); }
  uint8_t* bytes() const { return static_cast<uint8_t*>(data); }
};

// A 16-bit float as kernels see it: stored as its bits, converted to and from float implicitly,
// so a kernel written for any element type computes it in float32.
template <bool Brain>
struct Float16 {
  uint16_t bits;
  Float16() = default;
  Float16(float value) : bits(Brain ? bfloat16_of(value) : half_of(value)) {}  // NOLINT: converts like a float
  operator float() const { return Brain ? float_of_bfloat16(bits) : float_of_half(bits); }  // NOLINT
};
using Half = Float16<false>;
using BFloat16 = Float16<true>;
template <typename T>
inline constexpr bool is_float_v = std::is_same_v<T, float> || std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>;

// Calls f(T{}) with the C++ type of `dtype`. bool is stored as uint8_t, 0 or 1; uint8 is visited
// as char8_t, an unsigned byte of its own type, so that a kernel can tell it from bool (a Cast to
// uint8 keeps the value, one to bool tests it against zero).
template <typename F>
decltype(auto) visit_dtype(ref::DType dtype, F&& f) {
  switch (dtype) {
    case ref::DType::kInt32: return f(int32_t{});
    case ref::DType::kInt64: return f(int64_t{});
    case ref::DType::kBool: return f(uint8_t{});
    case ref::DType::kUInt8: return f(char8_t{});
    case ref::DType::kInt8: return f(int8_t{});
    case ref::DType::kUInt16: return f(uint16_t{});
    case ref::DType::kInt16: return f(int16_t{});
    case ref::DType::kFloat16: return f(Half{});
    case ref::DType::kBFloat16: return f(BFloat16{});
    case ref::DType::kFloat32: break;
  }
  return f(float{});
}

// Runs an op: its attributes are in its plan (Output::plan), resolved before the first run.
using Kernel = void (*)(Ins in, const Output& out);
// Makes the plan of a validated op (its typed parameters, what its kernel derives from its dims);
// throws Error(kInvalidBinary) when the op cannot run here.
using Planner = std::unique_ptr<OpPlan> (*)(const ref::Op& op, const std::vector<const ref::Value*>& in,
                                            const ref::Value& out);

// The planner of an op whose plan P is constructed from (op, inputs, output).
template <typename P>
std::unique_ptr<OpPlan> plan_as(const ref::Op& op, const std::vector<const ref::Value*>& in, const ref::Value& out) {
  return std::make_unique<P>(op, in, out);
}

// A callable borrowed for the length of a call. Kernels pass lambdas through it instead of
// std::function, which allocates for a lambda that captures more than two references.
template <typename Signature>
class FunctionRef;
template <typename R, typename... Args>
class FunctionRef<R(Args...)> {
 public:
  FunctionRef() = default;
  template <typename F, typename = std::enable_if_t<!std::is_same_v<std::decay_t<F>, FunctionRef>>>
  FunctionRef(F&& f)  // NOLINT: converts like std::function does
      : object_(const_cast<void*>(static_cast<const void*>(std::addressof(f)))),
        call_([](void* object, Args... args) -> R {
          return (*static_cast<std::remove_reference_t<F>*>(object))(std::forward<Args>(args)...);
        }) {}
  R operator()(Args... args) const { return call_(object_, std::forward<Args>(args)...); }
  explicit operator bool() const { return call_ != nullptr; }

 private:
  void* object_ = nullptr;
  R (*call_)(void*, Args...) = nullptr;
};

// Runs body(begin, end) over [0, count): cut into pieces the caller's threads share when the whole
// (count x cost element operations) pays for them, else in one call.
template <typename Body>
void parallel_ranges(const ParallelFor* parallel, int64_t count, int64_t cost, Body&& body) {
  constexpr int64_t kMinWork = int64_t{1} << 16, kPieces = 4;
  if (!parallel || !*parallel || count < 2 || count * cost < kMinWork) return body(int64_t{0}, count);
  const int64_t pieces = count < kPieces ? count : kPieces, size = (count + pieces - 1) / pieces;
  const auto piece = [&](size_t index) {
    const int64_t begin = static_cast<int64_t>(index) * size;
    if (begin < count) body(begin, begin + size < count ? begin + size : count);
  };
  // Through a reference, which std::function keeps without allocating.
  (*parallel)(static_cast<size_t>(pieces), std::cref(piece));
}

// Calls f(n) with n = lanes as a compile-time constant (std::integral_constant) for the counts of
// values kernels keep side by side most often (1 for row-major images, 8 and 16 channels), else
// as it is: a loop over a constant count of floats becomes vector code without a scalar tail.
template <typename F>
decltype(auto) with_lanes(int64_t lanes, F&& f) {
  switch (lanes) {
    case 1: return f(std::integral_constant<int64_t, 1>{});
    case 8: return f(std::integral_constant<int64_t, 8>{});
    case 16: return f(std::integral_constant<int64_t, 16>{});
    default: return f(lanes);
  }
}

// e^x in float32 within 2 units in the last place of std::exp over [-87.3, 88.7], in plain
// arithmetic a loop of it turns into vector code (std::exp is a library call per element, 11 ns
// in Softmax here): x = n ln 2 + r with |r| <= ln 2 / 2, e^r by Cephes' degree-6 polynomial, 2^n
// by the exponent bits. Below the range it gives 0 (where std::exp gives subnormals), above it
// +inf, and NaN for NaN.
inline float exp_approx(float x) {
  constexpr float kLog2e = 1.44269504088896341f, kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
  constexpr float kLow = -87.33654f, kHigh = 88.72283f;
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const auto bits = [](float f) {
    int32_t i;
    std::memcpy(&i, &f, sizeof i);
    return i;
  };
  const auto power_of_two = [](int32_t n) {  // 2^n for n in [-126, 127], from its exponent bits
    const int32_t i = (n + 127) << 23;
    float f;
    std::memcpy(&f, &i, sizeof f);
    return f;
  };
  const float clamped = std::min(std::max(x, kLow), kHigh);  // NaN stays NaN
  const float shifted = clamped * kLog2e + kRound;
  const float n = shifted - kRound;
  const float r = (clamped - n * kLn2Hi) - n * kLn2Lo;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  const int32_t k = bits(shifted) - bits(kRound);  // n, in [-126, 128]: 2^n in two factors
  const float y = p * power_of_two(k / 2) * power_of_two(k - k / 2);
  const float low = x < kLow ? 0.0f : y;
  const float high = x > kHigh ? std::numeric_limits<float>::infinity() : low;
  return x != x ? x : high;
}

// A Conv weight [M, C/group, k...], or with `transpose` a ConvTranspose weight [C, M/group, k...],
// as oneDNN counts it: [M, C/group, k...], [group, M/group, C/group, k...] when grouped; the dims a
// packed weight's recorded layout describes (kernels_conv.cc).
Dims onednn_weight_dims(const Dims& w, int64_t group, bool transpose);

// The im2col matrix of one group of one image (rows: channel and kernel position; columns: output
// position), zero where the window reads padding; for float32 and int32 (kernels_conv.cc).
template <typename T>
void im2col(const T* x, const Dims& in_spatial, const Dims& in_strides, int64_t channels, const Dims& kernel,
            const Dims& out_spatial, const Dims& strides, const Dims& pads, const Dims& dilations, T* col);

// What a GEMM's caller does to columns [j0, j0 + cols) of every row of y once they are computed
// (bias, activation), inside the same task while they are in cache.
using Epilogue = FunctionRef<void(int64_t j0, int64_t cols)>;

// y [m, n] = op(A) [m, k] x op(B) [k, n], all dense row-major (op: transposed when asked), split
// over the caller's threads when large (kernels_linear.cc). With `few_rows` (room for m x n
// floats), a product of at most kFewRows rows by a B stored transposed runs as B·Aᵀ there.
inline constexpr int64_t kFewRows = 32;
void gemm_rowmajor(int64_t m, int64_t n, int64_t k, const float* a, const float* b, float* y, const ParallelFor* parallel,
                   bool trans_a = false, bool trans_b = false, const Epilogue& after = {}, float* few_rows = nullptr);

// Integer arithmetic wraps around as two's complement instead of overflowing (which would be
// undefined behaviour); floats are left as they are.
template <typename T, typename Op>
T wrapping(T a, T b, Op op) {
  if constexpr (std::is_integral_v<T>) {
    // Types narrower than int would be promoted to (signed) int, where a product can overflow.
    using U = std::conditional_t<(sizeof(T) < sizeof(unsigned)), unsigned, std::make_unsigned_t<T>>;
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

// round_half_even(value) + zero_point, saturated to Q; NaN gives Q's lowest value (as x86 min/max
// give in ONNX Runtime's kernels). Adding then subtracting 1.5 * 2^23 rounds a float of magnitude
// below 2^22 to an integer, ties to even, in plain arithmetic a loop vectorises (nearbyint is a
// library call without SSE4.1); values are first held within +-2^22, which saturates them the same.
template <typename Q>
Q quantized_as(float value, float zero_point) {
  constexpr float kRound = 12582912.0f, kBound = 4194304.0f;
  constexpr auto lo = static_cast<float>(std::numeric_limits<Q>::lowest());
  constexpr auto hi = static_cast<float>(std::numeric_limits<Q>::max());
  float q = value >= -kBound ? value : -kBound;  // NaN too
  q = q <= kBound ? q : kBound;
  q = (q + kRound) - kRound + zero_point;
  q = q >= lo ? q : lo;
  return static_cast<Q>(q <= hi ? q : hi);
}

// A hot loop built for AVX-512 and AVX2 as well as the baseline x86-64 (whose 4-wide floats and
// slow conversions to bytes took 2-3 times as long), the build chosen when the library loads. The
// builds compute the same bits: the library is compiled without fused multiply-adds
// (-ffp-contract=off), and no loop given these calls a library function. The loop itself is an
// always-inlined template (CTXGEN_INLINE) that each cloned function calls.
#define CTXGEN_INLINE [[gnu::always_inline]] inline
#if defined(__x86_64__)
#define CTXGEN_VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define CTXGEN_VECTOR_CLONES
#endif

// y[i] = quantized_as(x[i] / scale, zero_point) over a run of values with one scale: where
// QuantizeLinear and QLinearConv's requantization spend their time (CTXGEN_VECTOR_CLONES; one
// function per type, as Clang clones no template).
void quantize_values(const float* x, float scale, float zero_point, uint8_t* y, int64_t count);
void quantize_values(const float* x, float scale, float zero_point, int8_t* y, int64_t count);
void quantize_values(const float* x, float scale, float zero_point, uint16_t* y, int64_t count);
void quantize_values(const float* x, float scale, float zero_point, int16_t* y, int64_t count);

// The plan of the op `out` belongs to, as the type its planner made.
template <typename P>
const P& plan_of(const Output& out) {
  return static_cast<const P&>(*out.plan);
}

// Up to two float attributes of an op, read once (alpha and beta, min and max ...).
struct Scalars final : OpPlan {
  explicit Scalars(float a_ = 0, float b_ = 0) : a(a_), b(b_) {}
  float a, b;
};

// A scalar attribute of an op writing `dtype`, read once and kept as that type's bytes: a float
// attribute for float32, an int one otherwise (validate() checks the kind matches the type).
struct TypedScalar {
  uint64_t bits = 0;
  static TypedScalar of(const ref::Op& op, const std::string& name, ref::DType dtype);
  template <typename T>
  T as() const {
    T value;
    std::memcpy(&value, &bits, sizeof(T));
    return value;
  }
};
struct TypedScalars final : OpPlan {
  explicit TypedScalars(TypedScalar a_, TypedScalar b_ = {}) : a(a_), b(b_) {}
  TypedScalar a, b;
};

// The fused activation (attrs act, act_alpha, act_beta) of an op, read once for a whole tensor or
// for all the pieces of one.
// The epilogue of a Conv, Gemm, MatMul, BatchNormalization or float32 Add: an activation, then a
// Mul and an Add by scalars the lowering folded in (`out_scale`, `out_shift`), each rounded as the
// op it replaces.
struct FusedActivation {
  ref::Activation kind = ref::Activation::kNone;
  float alpha = 0, beta = 0;
  std::optional<float> scale, shift;
  std::optional<float> lo, hi;  // then max(x, lo) and min(x, hi): a Max or Min by a constant
  bool empty() const { return kind == ref::Activation::kNone && !scale && !shift && !lo && !hi; }
  void apply(float* data, int64_t n) const;  // to data[0, n) in place
  // The same over the caller's threads: an epilogue a convolution could not fuse runs over its
  // whole output after it.
  void apply(float* data, int64_t n, const ParallelFor* parallel) const;
};
FusedActivation fused_activation_of(const ref::Op& op);

// The strides of a broadcasting op's output, then of each input seen through the output's dims.
struct BroadcastPlan final : OpPlan {
  Dims dims;                  // the output's, single axes left out and neighbours every operand steps alike merged
  std::vector<Dims> strides;  // over `dims`: the output's, then each input's
  FusedActivation epilogue;   // a float32 Add's, when it has one
};
std::unique_ptr<OpPlan> plan_broadcast(const ref::Op& op, const std::vector<const ref::Value*>& in, const ref::Value& out);

// A 2-D ConvInteger of a weight of the binary on oneDNN's int8 convolution, where the CPU sums
// exactly (kernels_qconv.cc); nullptr where it cannot run there.
std::unique_ptr<OpPlan> plan_int8_conv_integer(const ref::Op& op, const std::vector<const ref::Value*>& in, const ref::Value& out);
void int8_conv_integer(const OpPlan& plan, Ins in, const Output& out);

// The kernels, one per op type; kernels_*.cc hold them by family.
namespace kernels {

// QuantizeLinear, DequantizeLinear, MatMulNBits, GatherBlockQuantized, the integer products and
// DynamicQuantizeLinear (kernels_quant.cc).
void quantize_linear(Ins, const Output&);
void dequantize_linear(Ins, const Output&);
void requantize(Ins, const Output&);
void matmul_nbits(Ins, const Output&);
void gather_block_quantized(Ins, const Output&);
void matmul_integer(Ins, const Output&);
void conv_integer(Ins, const Output&);
void dynamic_quantize_linear(Ins, const Output&);
// An 8-bit Conv unit on oneDNN's int8 convolution (kernels_qconv.cc).
void qlinear_conv(Ins, const Output&);

// Elementwise, comparisons, casts and generated constants (kernels_elementwise.cc).
void add(Ins, const Output&);
void sub(Ins, const Output&);
void mul(Ins, const Output&);
void div(Ins, const Output&);
void min(Ins, const Output&);
void max(Ins, const Output&);
void pow(Ins, const Output&);
void prelu(Ins, const Output&);
void equal(Ins, const Output&);
void less(Ins, const Output&);
void greater(Ins, const Output&);
void less_or_equal(Ins, const Output&);
void greater_or_equal(Ins, const Output&);
void logical_and(Ins, const Output&);
void logical_or(Ins, const Output&);
void logical_xor(Ins, const Output&);
void logical_not(Ins, const Output&);
void where(Ins, const Output&);
void cast(Ins, const Output&);
void neg(Ins, const Output&);
void abs(Ins, const Output&);
void sqrt(Ins, const Output&);
void exp(Ins, const Output&);
void log(Ins, const Output&);
void erf(Ins, const Output&);
void sin(Ins, const Output&);
void cos(Ins, const Output&);
void reciprocal(Ins, const Output&);
void tan(Ins, const Output&);
void asin(Ins, const Output&);
void acos(Ins, const Output&);
void atan(Ins, const Output&);
void sinh(Ins, const Output&);
void cosh(Ins, const Output&);
void asinh(Ins, const Output&);
void acosh(Ins, const Output&);
void atanh(Ins, const Output&);
void sign(Ins, const Output&);
void ceil(Ins, const Output&);
void softsign(Ins, const Output&);
void thresholded_relu(Ins, const Output&);
void celu(Ins, const Output&);
void shrink(Ins, const Output&);
void is_inf(Ins, const Output&);
void is_nan(Ins, const Output&);
void mod(Ins, const Output&);
void relu(Ins, const Output&);
void sigmoid(Ins, const Output&);
void tanh(Ins, const Output&);
void softplus(Ins, const Output&);
void hard_swish(Ins, const Output&);
void leaky_relu(Ins, const Output&);
void elu(Ins, const Output&);
void selu(Ins, const Output&);
void hard_sigmoid(Ins, const Output&);
void clip(Ins, const Output&);
void constant_of_shape(Ins, const Output&);
void range(Ins, const Output&);
void expand(Ins, const Output&);  // a broadcast copy

// Linear algebra and windows (kernels_linear.cc, kernels_pool.cc).
void matmul(Ins, const Output&);
void gemm(Ins, const Output&);
void panel_weight(Ins, const Output&);  // a product's B laid out in panels, as MatMul and Gemm read it with `panels`
void conv(Ins, const Output&);  // kernels_conv.cc
void conv_transpose(Ins, const Output&);  // kernels_conv.cc
// Conv's and ConvTranspose's.
std::unique_ptr<OpPlan> plan_conv(const ref::Op&, const std::vector<const ref::Value*>&, const ref::Value&);
void conv_weight(Ins, const Output&);  // a plain Conv weight laid out as a packed Conv reads it
std::unique_ptr<OpPlan> plan_conv_weight(const ref::Op&, const std::vector<const ref::Value*>&, const ref::Value&);
void max_pool(Ins, const Output&);
void average_pool(Ins, const Output&);
void resize(Ins, const Output&);
std::unique_ptr<OpPlan> plan_resize(const ref::Op&, const std::vector<const ref::Value*>&, const ref::Value&);

// Normalisation and reductions (kernels_norm.cc).
void softmax(Ins, const Output&);
void log_softmax(Ins, const Output&);
void hardmax(Ins, const Output&);
void nll_loss(Ins, const Output&);
void cum_sum(Ins, const Output&);
void batch_normalization(Ins, const Output&);
void layer_normalization(Ins, const Output&);
void reduce_mean(Ins, const Output&);
void reduce_sum(Ins, const Output&);
void reduce_max(Ins, const Output&);
void reduce_min(Ins, const Output&);
void reduce_prod(Ins, const Output&);
void reduce_l1(Ins, const Output&);
void reduce_l2(Ins, const Output&);
void reduce_sum_square(Ins, const Output&);
void reduce_log_sum(Ins, const Output&);
void reduce_log_sum_exp(Ins, const Output&);
void group_normalization(Ins, const Output&);
void arg_max(Ins, const Output&);
void arg_min(Ins, const Output&);

// Data movement (kernels_data.cc).
void transpose(Ins, const Output&);
void reshape(Ins, const Output&);
void tile(Ins, const Output&);
void trilu(Ins, const Output&);
void concat(Ins, const Output&);
void slice(Ins, const Output&);
void gather(Ins, const Output&);
void gather_elements(Ins, const Output&);
void pad(Ins, const Output&);
void shape(Ins, const Output&);  // reads dims only
void size(Ins, const Output&);   // reads dims only
void eye_like(Ins, const Output&);  // reads dims only
void one_hot(Ins, const Output&);
void gather_nd(Ins, const Output&);
void scatter_elements(Ins, const Output&);

// The planners: each op's typed parameters, made once (ops.cc pairs them with the kernels).
std::unique_ptr<OpPlan> plan_celu(const ref::Op&, const std::vector<const ref::Value*>&, const ref::Value&);
std::unique_ptr<OpPlan> plan_shrink(const ref::Op&, const std::vector<const ref::Value*>&, const ref::Value&);
std::unique_ptr<OpPlan> plan_is_inf(const ref::Op&, const std::vector<const ref::Value*>&, const ref::Value&);
std::unique_ptr<OpPlan> plan_alpha(const ref::Op&, const std::vector<const ref::Value*>&, const ref::Value&);
std::unique_ptr<OpPlan> plan_selu(const ref::Op&, const std::vector<const ref::Value*>&, const ref::Value&);
std::unique_ptr<OpPlan> plan_alpha_beta(const ref::Op&, const std::vector<const ref::Value*>&, const ref::Value&);
std::unique_ptr<OpPlan> plan_clip(const ref::Op&, const std::vector<const ref::Value*>&, const ref::Value&);
std::unique_ptr<OpPlan> plan_constant_of_shape(const ref::Op&, const std::vector<const ref::Value*>&, const ref::Value&);
std::unique_ptr<OpPlan> plan_range(const ref::Op&, const std::vector<const ref::Value*>&, const ref::Value&);
std::unique_ptr<OpPlan> plan_transpose(const ref::Op&, const std::vector<const ref::Value*>&, const ref::Value&);
std::unique_ptr<OpPlan> plan_slice(const ref::Op&, const std::vector<const ref::Value*>&, const ref::Value&);
std::unique_ptr<OpPlan> plan_input_strides(const ref::Op&, const std::vector<const ref::Value*>&, const ref::Value&);
std::unique_ptr<OpPlan> plan_shape(const ref::Op&, const std::vector<const ref::Value*>&, const ref::Value&);
std::unique_ptr<OpPlan> plan_gather_nd(const ref::Op&, const std::vector<const ref::Value*>&, const ref::Value&);
std::unique_ptr<OpPlan> plan_eye_like(const ref::Op&, const std::vector<const ref::Value*>&, const ref::Value&);
extern const Planner plan_trilu, plan_axis, plan_axis_strides, plan_pad, plan_one_hot;  // kernels_data.cc
extern const Planner plan_reduction, plan_columns, plan_normalisation, plan_batch_normalization, plan_nll_loss, plan_cum_sum,
    plan_arg_extreme;                                                                     // kernels_norm.cc
extern const Planner plan_window;                                                         // kernels_pool.cc
extern const Planner plan_product, plan_panel_weight;                                     // kernels_linear.cc
extern const Planner plan_qlinear_conv;                                                   // kernels_qconv.cc
extern const Planner plan_quant, plan_requantize, plan_matmul_nbits, plan_gather_block_quantized, plan_matmul_integer,
    plan_conv_integer, plan_which_output;                                                 // kernels_quant.cc

}  // namespace kernels

}  // namespace ctxgen::runtime
