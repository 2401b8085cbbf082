// QuantizeLinear and DequantizeLinear: float32 to and from the 8- and 16-bit integer types, with a
// scale and zero point per tensor, per index of an axis, or per block along an axis. They compute
// what ONNX Runtime's CPU kernels compute: x / scale rounded half to even, plus the zero point,
// saturated (NaN saturates to the type's lowest value, as x86 min/max give); and
// (x - zero_point) * scale with the difference taken in integers. MatMulNBits, whose 4- or 8-bit
// weights stay packed: they are dequantized a slab of columns at a time as the product runs.
// MatMulInteger and ConvInteger, summing integer products exactly; DynamicQuantizeLinear.

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "kernels.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace ctxgen::runtime {
namespace {

// Where each element finds its scale: x seen as [outer, extent, inner] around the axis; the
// element (o, a, i) reads scale[row_scale(o, a) + i * step].
struct QuantPlan final : OpPlan {
  QuantPlan(const ref::Op& op, const std::vector<const ref::Value*>& in, const ref::Value&) {
    nibbles = op.get_int("bits", 8) == 4;
    nibbles_signed = op.get_int("signed", 0) != 0;
    const Dims x = nibbles ? op.get_ints("dims") : in[0]->dims;  // x itself is packed
    const auto axis = static_cast<size_t>(op.get_int("axis", 0));
    block = op.get_int("block_size", 0);
    if (block == 0 && in[1]->element_count() == 1) {
      inner = product(x);  // one scale: the whole tensor is one row
      return;
    }
    outer = product(x, 0, axis);
    extent = x[axis];
    inner = product(x, axis + 1, x.size());
    per_axis = block == 0;
  }
  int64_t row_scale(int64_t o, int64_t a) const {
    if (block > 0) return (o * ((extent + block - 1) / block) + a / block) * inner;
    return per_axis ? a : 0;
  }
  int64_t step() const { return block > 0 ? 1 : 0; }
  int64_t outer = 1, extent = 1, inner = 1, block = 0;
  bool per_axis = false;
  bool nibbles = false, nibbles_signed = false;  // a DequantizeLinear of a 4-bit weight
};

// Calls f(T{}) with the C++ type of a quantized (or, for DequantizeLinear, int32) dtype.
template <typename F>
void visit_quantized(ref::DType dtype, F&& f) {
  switch (dtype) {
    case ref::DType::kUInt8: return f(uint8_t{});
    case ref::DType::kInt8: return f(int8_t{});
    case ref::DType::kUInt16: return f(uint16_t{});
    case ref::DType::kInt16: return f(int16_t{});
    default: return f(int32_t{});  // the rules leave only int32 (DequantizeLinear of a bias)
  }
}

// Runs row(r, begin, end) over elements [begin, end) of each row r of the plan's view, split over
// the caller's threads: by rows, or within the one row of a tensor with a single scale. An element
// costs about what an Add's does (a third of a nanosecond vectorised): split at 2 a value, a CNN's
// 32x32 images went to the threads and took 8 times as long (14 µs, waking them, against 1.7).
template <typename Row>
void for_rows(const QuantPlan& p, const Output& out, Row&& row) {
  const int64_t rows = p.outer * p.extent;
  if (rows == 1)
    return parallel_ranges(out.parallel, p.inner, 1, [&](int64_t begin, int64_t end) { row(0, begin, end); });
  parallel_ranges(out.parallel, rows, p.inner, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) row(r, 0, p.inner);
  });
}

template <typename Q>
CTXGEN_INLINE void quantize_each(const float* x, float scale, float zero_point, Q* y, int64_t count) {
  for (int64_t i = 0; i < count; ++i) y[i] = quantized_as<Q>(x[i] / scale, zero_point);
}

}  // namespace

CTXGEN_VECTOR_CLONES void quantize_values(const float* x, float scale, float zero_point, uint8_t* y, int64_t count) {
  quantize_each(x, scale, zero_point, y, count);
}
CTXGEN_VECTOR_CLONES void quantize_values(const float* x, float scale, float zero_point, int8_t* y, int64_t count) {
  quantize_each(x, scale, zero_point, y, count);
}
CTXGEN_VECTOR_CLONES void quantize_values(const float* x, float scale, float zero_point, uint16_t* y, int64_t count) {
  quantize_each(x, scale, zero_point, y, count);
}
CTXGEN_VECTOR_CLONES void quantize_values(const float* x, float scale, float zero_point, int16_t* y, int64_t count) {
  quantize_each(x, scale, zero_point, y, count);
}

// [lo, hi] widened to the range of x[0, n), NaN ignored (x < lo and x > hi are false for it): a
// lane per element of a vector, so the loop vectorises.
CTXGEN_VECTOR_CLONES void range_with_zero(const float* x, int64_t n, float& lo, float& hi) {
  constexpr int64_t kLanes = 16;
  float low[kLanes], high[kLanes];
  for (int64_t j = 0; j < kLanes; ++j) low[j] = lo, high[j] = hi;
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int64_t j = 0; j < kLanes; ++j) {
      low[j] = x[i + j] < low[j] ? x[i + j] : low[j];
      high[j] = x[i + j] > high[j] ? x[i + j] : high[j];
    }
  for (; i < n; ++i) {
    low[0] = x[i] < low[0] ? x[i] : low[0];
    high[0] = x[i] > high[0] ? x[i] : high[0];
  }
  for (int64_t j = 0; j < kLanes; ++j) lo = std::min(lo, low[j]), hi = std::max(hi, high[j]);
}

namespace {

template <typename Q>
void quantize(Ins in, const Output& out) {
  const auto& p = plan_of<QuantPlan>(out);
  const float* x = in[0].f32();
  const float* scale = in[1].f32();
  const Q* zero_point = in.size() > 2 && in[2].present() ? in[2].as<Q>() : nullptr;
  Q* y = out.as<Q>();
  for_rows(p, out, [&](int64_t r, int64_t begin, int64_t end) {
    const int64_t s0 = p.row_scale(r / p.extent, r % p.extent), step = p.step();
    const float* xr = x + r * p.inner;
    Q* yr = y + r * p.inner;
    if constexpr (sizeof(Q) <= 2) {  // (visit_quantized also makes an int32 quantize no rule lets run)
      if (step == 0)
        return quantize_values(xr + begin, scale[s0], zero_point ? static_cast<float>(zero_point[s0]) : 0.0f, yr + begin,
                               end - begin);
    }
    for (int64_t i = begin; i < end; ++i)
      yr[i] = quantized_as<Q>(xr[i] / scale[s0 + i * step], zero_point ? static_cast<float>(zero_point[s0 + i * step]) : 0.0f);
  });
}

template <typename Q>
void dequantize(Ins in, const Output& out) {
  using Wide = std::conditional_t<sizeof(Q) < 4, int32_t, int64_t>;  // holds any x - zero_point
  const auto& p = plan_of<QuantPlan>(out);
  const Q* x = in[0].as<Q>();
  const float* scale = in[1].f32();
  const Q* zero_point = in.size() > 2 && in[2].present() ? in[2].as<Q>() : nullptr;
  float* y = out.f32();
  for_rows(p, out, [&](int64_t r, int64_t begin, int64_t end) {
    const int64_t s0 = p.row_scale(r / p.extent, r % p.extent), step = p.step();
    const Q* xr = x + r * p.inner;
    float* yr = y + r * p.inner;
    if (step == 0) {
      const float s = scale[s0];
      const Wide zero = zero_point ? static_cast<Wide>(zero_point[s0]) : 0;
      for (int64_t i = begin; i < end; ++i) yr[i] = static_cast<float>(static_cast<Wide>(xr[i]) - zero) * s;
      return;
    }
    for (int64_t i = begin; i < end; ++i) {
      const int64_t s = s0 + i * step;
      const Wide zero = zero_point ? static_cast<Wide>(zero_point[s]) : 0;
      yr[i] = static_cast<float>(static_cast<Wide>(xr[i]) - zero) * scale[s];
    }
  });
}

// Value i of packed 4-bit integers (two a byte, the first in the low bits), sign-extended for int4.
template <bool Signed>
CTXGEN_INLINE int32_t nibble(const uint8_t* packed, int64_t i) {
  const int32_t v = (packed[i >> 1] >> ((i & 1) * 4)) & 0xF;
  return Signed ? (v ^ 8) - 8 : v;
}

// A 4-bit weight, dequantized once a session (runtime/execute.cc): a plain loop is enough.
template <bool Signed>
void dequantize_4bit(Ins in, const Output& out) {
  const auto& p = plan_of<QuantPlan>(out);
  const uint8_t* x = in[0].bytes();
  const float* scale = in[1].f32();
  const uint8_t* zero_point = in.size() > 2 && in[2].present() ? in[2].bytes() : nullptr;
  float* y = out.f32();
  for_rows(p, out, [&](int64_t r, int64_t begin, int64_t end) {
    const int64_t s0 = p.row_scale(r / p.extent, r % p.extent), step = p.step();
    for (int64_t i = begin; i < end; ++i) {
      const int64_t s = s0 + i * step, at = r * p.inner + i;
      const int32_t zero = zero_point ? nibble<Signed>(zero_point, s) : 0;
      y[at] = static_cast<float>(nibble<Signed>(x, at) - zero) * scale[s];
    }
  });
}

// What MatMulNBits derives from its attributes and dims, and its scratch: a slab of `slab`
// columns of B dequantized (slab x K floats, sized to stay in the second-level cache), and the
// slab's part of y (rows x slab).
struct NBitsPlan final : OpPlan {
  NBitsPlan(const ref::Op& op, const std::vector<const ref::Value*>& in, const ref::Value&)
      : k(op.get_int("K", 1)), n(op.get_int("N", 1)), bits(op.get_int("bits", 4)), block(op.get_int("block_size", 16)),
        blocks((k + block - 1) / block), rows(product(in[0]->dims, 0, in[0]->dims.size() - 1)),
        zero_point_row((blocks * bits + 7) / 8) {
    constexpr int64_t kSlabFloats = int64_t{1} << 16;  // 256 KB
    slab = std::min(n, std::max<int64_t>(16, kSlabFloats / k / 16 * 16));
    scratch_bytes = static_cast<uint64_t>(slab * (k + rows)) * sizeof(float);
  }
  int64_t k, n, bits, block, blocks, rows, zero_point_row, slab = 0;
};

// Columns [begin, end) of B dequantized into rows of `w` (K floats each): what MatMulNBits spends
// most of its time in when A has few rows.
template <int Bits>
CTXGEN_INLINE void dequantize_columns(const NBitsPlan& p, Ins in, int64_t begin, int64_t end, float* w) {
  const uint8_t* b = in[1].bytes();
  const float* scales = in[2].f32();
  const uint8_t* zero_points = in.size() > 3 && in[3].present() ? in[3].bytes() : nullptr;
  const int64_t blob = p.block * Bits / 8;
  for (int64_t col = begin; col < end; ++col, w += p.k) {
    for (int64_t kb = 0; kb < p.blocks; ++kb) {
      const int64_t count = std::min(p.block, p.k - kb * p.block);
      const uint8_t* q = b + (col * p.blocks + kb) * blob;
      const float scale = scales[col * p.blocks + kb];
      float zero = 1 << (Bits - 1);
      if (zero_points) {
        const uint8_t z = zero_points[col * p.zero_point_row + kb * Bits / 8];
        zero = Bits == 8 ? z : (kb % 2 == 0 ? z & 0xF : z >> 4);
      }
      float* to = w + kb * p.block;
      if constexpr (Bits == 8) {
        for (int64_t i = 0; i < count; ++i) to[i] = (static_cast<float>(q[i]) - zero) * scale;
      } else {  // a byte at a time, its two values: a loop that vectorises, where one a value did not
        const int64_t pairs = count / 2;
        for (int64_t j = 0; j < pairs; ++j) {
          to[2 * j] = (static_cast<float>(q[j] & 0xF) - zero) * scale;
          to[2 * j + 1] = (static_cast<float>(q[j] >> 4) - zero) * scale;
        }
        if (count % 2 != 0) to[count - 1] = (static_cast<float>(q[pairs] & 0xF) - zero) * scale;
      }
    }
  }
}

CTXGEN_VECTOR_CLONES void dequantize_4bit_columns(const NBitsPlan& p, Ins in, int64_t begin, int64_t end, float* w) {
  dequantize_columns<4>(p, in, begin, end, w);
}
CTXGEN_VECTOR_CLONES void dequantize_8bit_columns(const NBitsPlan& p, Ins in, int64_t begin, int64_t end, float* w) {
  dequantize_columns<8>(p, in, begin, end, w);
}

// GatherBlockQuantized's view of the weight: [outer, extent, row] around the gather axis, and
// [q_outer, q_extent, q_inner] around the quantize axis, whose blocks the scales follow.
struct GatherBlockPlan final : OpPlan {
  GatherBlockPlan(const ref::Op& op, const std::vector<const ref::Value*>&, const ref::Value&)
      : bits(op.get_int("bits", 4)), block(op.get_int("block_size", 16)), zero(op.get_int("zero_point", 0)),
        zero_row(op.get_int("zero_point_row", 1)), is_signed(op.get_int("signed", 0) != 0) {
    const Dims dims = op.get_ints("dims");
    const auto g = static_cast<size_t>(op.get_int("gather_axis", 0)), q = static_cast<size_t>(op.get_int("quantize_axis", 0));
    outer = product(dims, 0, g);
    extent = dims[g];
    row = product(dims, g + 1, dims.size());
    q_extent = dims[q];
    q_inner = product(dims, q + 1, dims.size());
    q_blocks = (q_extent + block - 1) / block;
  }
  int64_t bits, block, zero, zero_row, outer = 1, extent = 1, row = 1, q_extent = 1, q_inner = 1, q_blocks = 1;
  bool is_signed;

  int32_t value(const uint8_t* packed, int64_t i) const {
    if (bits == 8) return packed[i];
    return is_signed ? nibble<true>(packed, i) : nibble<false>(packed, i);
  }
  // The zero point of scale s: rows of zero_row values, each starting a byte.
  int32_t zero_of(const uint8_t* zero_points, int64_t s) const {
    if (!zero_points) return static_cast<int32_t>(zero);
    const int64_t per_byte = 8 / bits;
    return value(zero_points, s / zero_row * ((zero_row + per_byte - 1) / per_byte * per_byte) + s % zero_row);
  }
};

template <typename Index, typename Out>
void gather_blocks(const GatherBlockPlan& p, Ins in, const Output& out) {
  const uint8_t* data = in[0].bytes();
  const Index* indices = in[1].as<Index>();
  const Out* scales = in[2].as<Out>();
  const uint8_t* zero_points = in.size() > 3 && in[3].present() ? in[3].bytes() : nullptr;
  const int64_t count = in[1].size();
  Out* y = out.as<Out>();
  parallel_ranges(out.parallel, p.outer * count, p.row, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      int64_t index = static_cast<int64_t>(indices[r % count]);
      Out* to = y + r * p.row;
      if (index < -p.extent || index >= p.extent) {  // zeros, as ONNX Runtime's kernel gives
        std::fill(to, to + p.row, Out(0.0f));
        continue;
      }
      if (index < 0) index += p.extent;
      const int64_t first = (r / count * p.extent + index) * p.row;
      for (int64_t i = 0; i < p.row; ++i) {
        const int64_t at = first + i, in_axis = at / p.q_inner % p.q_extent;
        const int64_t s = (at / (p.q_inner * p.q_extent) * p.q_blocks + in_axis / p.block) * p.q_inner + at % p.q_inner;
        to[i] = Out(static_cast<float>(p.value(data, at) - p.zero_of(zero_points, s)) * static_cast<float>(scales[s]));
      }
    }
  });
}

// Which of its node's outputs an op writes (DynamicQuantizeLinear's values, scale or zero point).
struct WhichOutput final : OpPlan {
  WhichOutput(const ref::Op& op, const std::vector<const ref::Value*>&, const ref::Value&) : output(op.get_int("output", 0)) {}
  int64_t output;
};

// ---- integer products ----

// Calls f(T{}) with the C++ type of an 8-bit integer dtype.
template <typename F>
void visit_8bit(ref::DType dtype, F&& f) {
  if (dtype == ref::DType::kUInt8) return f(uint8_t{});
  f(int8_t{});
}

// A zero point as int32: one value, or one per index.
struct ZeroPoints {
  const void* data = nullptr;  // absent: 0
  bool each = false;
  template <typename T>
  int32_t at(int64_t i) const {
    return data ? static_cast<const T*>(data)[each ? i : 0] : 0;
  }
};
ZeroPoints zero_points_of(Ins in, size_t i) {
  if (in.size() <= i || !in[i].present()) return {};
  return {in[i].data, in[i].size() > 1};
}

// y[0, n) += a x (b[0, n) - zero point of b), wrapping as int32 does.
template <typename B>
void add_row_product(int32_t* y, int32_t a, const B* b, const ZeroPoints& zb, int64_t n) {
  for (int64_t j = 0; j < n; ++j)
    y[j] = static_cast<int32_t>(static_cast<uint32_t>(y[j]) +
                                static_cast<uint32_t>(a) * static_cast<uint32_t>(static_cast<int32_t>(b[j]) - zb.at<B>(j)));
}

// y[0, n) += a x b[0, n), wrapping as int32 does: where an integer convolution spends its time, so
// a loop without a zero point to look up per element (which kept it scalar), cloned for AVX2/AVX-512.
CTXGEN_VECTOR_CLONES void add_scaled_row(int32_t* __restrict y, int32_t a, const int32_t* __restrict b, int64_t n) {
  const auto factor = static_cast<uint32_t>(a);
  for (int64_t j = 0; j < n; ++j) y[j] = static_cast<int32_t>(static_cast<uint32_t>(y[j]) + factor * static_cast<uint32_t>(b[j]));
}

struct IntegerProductPlan final : OpPlan {
  IntegerProductPlan(const ref::Op&, const std::vector<const ref::Value*>& in, const ref::Value& out)
      : m(in[0]->dims[in[0]->dims.size() - 2]), k(in[0]->dims.back()), n(out.dims.back()),
        rows(product(in[0]->dims, 0, in[0]->dims.size() - 1)), b_batched(in[1]->dims.size() > 2) {}
  int64_t m, k, n, rows;
  bool b_batched;
};

// The conv's geometry, and the scratch holding one image less its zero point and its im2col; or
// the plan of its int8 convolution on oneDNN, which runs it instead where it can.
struct ConvIntegerPlan final : OpPlan {
  ConvIntegerPlan(const ref::Op& op, const std::vector<const ref::Value*>& in, const ref::Value& out)
      : group(op.get_int("group", 1)), strides(op.get_ints("strides")), pads(op.get_ints("pads")),
        dilations(op.get_ints("dilations")), int8(plan_int8_conv_integer(op, in, out)) {
    if (int8) {
      scratch_bytes = int8->scratch_bytes;
      return;
    }
    const Dims& x = in[0]->dims;
    const Dims& w = in[1]->dims;
    in_spatial.assign(x.begin() + 2, x.end());
    in_strides = strides_of(in_spatial);
    out_spatial.assign(out.dims.begin() + 2, out.dims.end());
    kernel.assign(w.begin() + 2, w.end());
    image = product(x, 1, x.size());
    rows = product(w, 1, w.size());
    scratch_bytes = static_cast<uint64_t>(image + rows * product(out_spatial)) * sizeof(int32_t);
  }
  std::unique_ptr<OpState> make_state() const override { return int8 ? int8->make_state() : nullptr; }
  int64_t group, image = 0, rows = 0;
  Dims strides, pads, dilations, in_spatial, in_strides, out_spatial, kernel;
  std::unique_ptr<OpPlan> int8;
};

template <typename A, typename B>
void integer_matmul(const IntegerProductPlan& p, Ins in, const Output& out) {
  const A* a = in[0].as<A>();
  const B* b = in[1].as<B>();
  const ZeroPoints za = zero_points_of(in, 2), zb = zero_points_of(in, 3);
  int32_t* y = out.as<int32_t>();
  parallel_ranges(out.parallel, p.rows, p.k * p.n, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      int32_t* row = y + r * p.n;
      std::fill(row, row + p.n, 0);
      const B* matrix = b + (p.b_batched ? r / p.m * p.k * p.n : 0);
      for (int64_t i = 0; i < p.k; ++i) {
        const int32_t value = static_cast<int32_t>(a[r * p.k + i]) - za.at<A>(r % p.m);
        if (value != 0) add_row_product(row, value, matrix + i * p.n, zb, p.n);
      }
    }
  });
}

template <typename X, typename W>
void integer_conv(const ConvIntegerPlan& p, Ins in, const Output& out) {
  const X* x = in[0].as<X>();
  const W* w = in[1].as<W>();
  const ZeroPoints zx = zero_points_of(in, 2), zw = zero_points_of(in, 3);
  const Dims& xd = in[0].dims();
  const Dims& wd = in[1].dims();
  auto* shifted = reinterpret_cast<int32_t*>(out.scratch);
  int32_t* col = shifted + p.image;
  const int64_t channels = xd[1] / p.group, m_per_group = wd[0] / p.group, positions = product(p.out_spatial);
  const int64_t plane = product(p.in_spatial);
  for (int64_t batch = 0; batch < xd[0]; ++batch) {
    for (int64_t i = 0; i < p.image; ++i) shifted[i] = static_cast<int32_t>(x[batch * p.image + i]) - zx.at<X>(0);
    for (int64_t g = 0; g < p.group; ++g) {
      im2col(shifted + g * channels * plane, p.in_spatial, p.in_strides, channels, p.kernel, p.out_spatial, p.strides, p.pads,
             p.dilations, col);
      parallel_ranges(out.parallel, m_per_group, p.rows * positions, [&](int64_t begin, int64_t end) {
        for (int64_t mm = begin; mm < end; ++mm) {
          const int64_t m = g * m_per_group + mm;
          int32_t* y = out.as<int32_t>() + (batch * wd[0] + m) * positions;
          std::fill(y, y + positions, 0);
          for (int64_t r = 0; r < p.rows; ++r) {
            const int32_t value = static_cast<int32_t>(w[m * p.rows + r]) - zw.at<W>(m);
            if (value != 0) add_scaled_row(y, value, col + r * positions, positions);
          }
        }
      });
    }
  }
}

#if defined(__x86_64__)
// 64 bytes a step where the CPU permutes bytes (AVX-512 VBMI: Ice Lake and later, Zen 4): two
// two-register permutes look the bytes up in each half of the table, the top bit picks the half.
// Returns how many bytes it looked up.
__attribute__((target("avx512f,avx512bw,avx512vbmi"))) int64_t look_up_vbmi(const uint8_t* x, uint8_t* y, const uint8_t* table,
                                                                          int64_t n) {
  const __m512i t0 = _mm512_loadu_si512(table), t1 = _mm512_loadu_si512(table + 64), t2 = _mm512_loadu_si512(table + 128),
                t3 = _mm512_loadu_si512(table + 192);
  int64_t i = 0;
  for (; i + 64 <= n; i += 64) {
    const __m512i at = _mm512_loadu_si512(x + i);
    const __m512i low = _mm512_permutex2var_epi8(t0, at, t1), high = _mm512_permutex2var_epi8(t2, at, t3);
    _mm512_storeu_si512(y + i, _mm512_mask_blend_epi8(_mm512_movepi8_mask(at), low, high));
  }
  return i;
}
#endif

// y[i] = table[x[i]] for as many of the n bytes as a vector instruction set here can; returns how many.
int64_t look_up_bytes(const uint8_t* x, uint8_t* y, const uint8_t* table, int64_t n) {
#if defined(__x86_64__)
  static const bool vbmi = __builtin_cpu_supports("avx512vbmi") && __builtin_cpu_supports("avx512bw");
  if (vbmi) return look_up_vbmi(x, y, table, n);
#endif
  (void)x, (void)y, (void)table, (void)n;
  return 0;
}

// Requantize's table: the result for each of the 256 values x can take, by DequantizeLinear's
// and QuantizeLinear's own arithmetic (planned once; a run only looks values up).
struct RequantizePlan final : OpPlan {
  RequantizePlan(const ref::Op& op, const std::vector<const ref::Value*>& in, const ref::Value& out) {
    const bool signed_in = in[0]->dtype == ref::DType::kInt8;
    const float x_scale = op.get_float("x_scale", 1.0f), y_scale = op.get_float("y_scale", 1.0f);
    const int32_t x_zero = static_cast<int32_t>(op.get_int("x_zero_point", 0));
    const auto y_zero = static_cast<float>(op.get_int("y_zero_point", 0));
    for (int32_t byte = 0; byte < 256; ++byte) {
      const int32_t x = signed_in ? static_cast<int8_t>(byte) : byte;
      const float dequantized = static_cast<float>(x - x_zero) * x_scale;
      table[static_cast<size_t>(byte)] =
          out.dtype == ref::DType::kInt8 ? static_cast<uint8_t>(quantized_as<int8_t>(dequantized / y_scale, y_zero))
                                         : quantized_as<uint8_t>(dequantized / y_scale, y_zero);
    }
  }
  std::array<uint8_t, 256> table{};
};

}  // namespace

namespace kernels {

const Planner plan_requantize = plan_as<RequantizePlan>;

// A lookup a value instead of dequantizing and quantizing again, whose division bounds the pair
// (a 32 x 32 image of 32 channels: 4.4 + 20 µs; looked up a byte at a time, 26 µs still).
void requantize(Ins in, const Output& out) {
  const auto& table = plan_of<RequantizePlan>(out).table;
  const uint8_t* x = in[0].bytes();
  uint8_t* y = out.bytes();
  parallel_ranges(out.parallel, out.size(), 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin + look_up_bytes(x + begin, y + begin, table.data(), end - begin); i < end; ++i) y[i] = table[x[i]];
  });
}

const Planner plan_quant = plan_as<QuantPlan>;
const Planner plan_matmul_nbits = plan_as<NBitsPlan>;
const Planner plan_gather_block_quantized = plan_as<GatherBlockPlan>;

void gather_block_quantized(Ins in, const Output& out) {
  const auto& p = plan_of<GatherBlockPlan>(out);
  const bool half = out.dtype() == ref::DType::kFloat16;
  if (in[1].dtype() == ref::DType::kInt32)
    return half ? gather_blocks<int32_t, Half>(p, in, out) : gather_blocks<int32_t, float>(p, in, out);
  return half ? gather_blocks<int64_t, Half>(p, in, out) : gather_blocks<int64_t, float>(p, in, out);
}

void quantize_linear(Ins in, const Output& out) {
  visit_quantized(out.dtype(), [&](auto tag) { quantize<decltype(tag)>(in, out); });
}

void dequantize_linear(Ins in, const Output& out) {
  const auto& p = plan_of<QuantPlan>(out);
  if (p.nibbles) return p.nibbles_signed ? dequantize_4bit<true>(in, out) : dequantize_4bit<false>(in, out);
  visit_quantized(in[0].dtype(), [&](auto tag) { dequantize<decltype(tag)>(in, out); });
}

// A slab of columns at a time: dequantized (over the caller's threads), multiplied by A with
// oneDNN's GEMM, copied into its columns of y with the bias. No float copy of more than a slab of
// the weight exists.
void matmul_nbits(Ins in, const Output& out) {
  const auto& p = plan_of<NBitsPlan>(out);
  auto* w = reinterpret_cast<float*>(out.scratch);
  float* part = w + p.slab * p.k;
  const float* bias = in.size() > 4 && in[4].present() ? in[4].f32() : nullptr;
  for (int64_t j0 = 0; j0 < p.n; j0 += p.slab) {
    const int64_t cols = std::min(p.slab, p.n - j0);
    parallel_ranges(out.parallel, cols, p.k, [&](int64_t begin, int64_t end) {
      if (p.bits == 8) dequantize_8bit_columns(p, in, j0 + begin, j0 + end, w + begin * p.k);
      else dequantize_4bit_columns(p, in, j0 + begin, j0 + end, w + begin * p.k);
    });
    gemm_rowmajor(p.rows, cols, p.k, in[0].f32(), w, part, out.parallel, false, true);
    for (int64_t r = 0; r < p.rows; ++r) {
      float* y = out.f32() + r * p.n + j0;
      for (int64_t j = 0; j < cols; ++j) y[j] = part[r * cols + j] + (bias ? bias[j0 + j] : 0.0f);
    }
  }
}

const Planner plan_matmul_integer = plan_as<IntegerProductPlan>;
const Planner plan_which_output = plan_as<WhichOutput>;
const Planner plan_conv_integer = plan_as<ConvIntegerPlan>;

void matmul_integer(Ins in, const Output& out) {
  visit_8bit(in[0].dtype(), [&](auto a) {
    visit_8bit(in[1].dtype(), [&](auto b) { integer_matmul<decltype(a), decltype(b)>(plan_of<IntegerProductPlan>(out), in, out); });
  });
}

void conv_integer(Ins in, const Output& out) {
  if (const auto& p = plan_of<ConvIntegerPlan>(out); p.int8) return int8_conv_integer(*p.int8, in, out);
  visit_8bit(in[0].dtype(), [&](auto x) {
    visit_8bit(in[1].dtype(), [&](auto w) { integer_conv<decltype(x), decltype(w)>(plan_of<ConvIntegerPlan>(out), in, out); });
  });
}

// As ONNX Runtime's CPU kernel computes it: the range widened to hold 0, its scale (1 for an empty
// range, where ONNX's reference takes 1 / 255), the zero point -lo / scale saturated (NaN, from an
// infinite range, saturating high) then rounded half to even, then QuantizeLinear.
void dynamic_quantize_linear(Ins in, const Output& out) {
  const float* x = in[0].f32();
  float lo = 0, hi = 0;
  range_with_zero(x, in[0].size(), lo, hi);
  const float scale = hi == lo ? 1.0f : (hi - lo) / 255.0f;
  const float zero = std::nearbyint(std::max(0.0f, std::min(255.0f, -lo / scale)));
  const int64_t output = plan_of<WhichOutput>(out).output;
  if (output == 1) *out.f32() = scale;
  else if (output == 2) *out.bytes() = static_cast<uint8_t>(zero);
  else quantize_values(x, scale, zero, out.bytes(), in[0].size());
}

}  // namespace kernels
}  // namespace ctxgen::runtime
