// Conv and ConvTranspose. A weight ctxgen packed at compile time (attribute packed = 1) runs
// through oneDNN's convolution (deconvolution) for this CPU's feature level, in the layout oneDNN
// chose for it (channels last, or its own blocked layout); any other weight (one computed at run
// time) runs as im2col + GEMM (a scatter loop).

#include <algorithm>
#include <array>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "ctxgen/error.h"
#include "kept.h"
#include "kernels.h"
#include "onednn.h"

namespace ctxgen::runtime {
namespace {

using Tag = dnnl::memory::format_tag;
using Desc = dnnl::memory::desc;

constexpr uint64_t kAlign = 64;
uint64_t aligned(uint64_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

// im2col for images, the common case: a row of the output at a time, its inside span in one loop
// without the per-element index arithmetic of any-rank windows.
template <typename T>
void im2col_2d(const T* x, const Dims& in, int64_t channels, const Dims& kernel, const Dims& out, const Dims& strides,
               const Dims& pads, const Dims& dilations, T* col) {
  const int64_t ih = in[0], iw = in[1], oh = out[0], ow = out[1], sh = strides[0], sw = strides[1];
  for (int64_t c = 0; c < channels; ++c) {
    const T* plane = x + c * ih * iw;
    for (int64_t ky = 0; ky < kernel[0]; ++ky)
      for (int64_t kx = 0; kx < kernel[1]; ++kx) {
        const int64_t dy = ky * dilations[0] - pads[0], dx = kx * dilations[1] - pads[1];
        // Output columns whose input column lands inside: ox in [first, last).
        const int64_t first = std::clamp<int64_t>((-dx + sw - 1) / sw, 0, ow);
        const int64_t last = std::clamp<int64_t>((iw - dx + sw - 1) / sw, first, ow);
        for (int64_t oy = 0; oy < oh; ++oy, col += ow) {
          const int64_t y = oy * sh + dy;
          if (y < 0 || y >= ih) {
            std::fill(col, col + ow, T(0));
            continue;
          }
          const T* row = plane + y * iw;
          std::fill(col, col + first, T(0));
          for (int64_t ox = first; ox < last; ++ox) col[ox] = row[ox * sw + dx];
          std::fill(col + last, col + ow, T(0));
        }
      }
  }
}

}  // namespace

template <typename T>
void im2col(const T* x, const Dims& in_spatial, const Dims& in_strides, int64_t channels, const Dims& kernel,
            const Dims& out_spatial, const Dims& strides, const Dims& pads, const Dims& dilations, T* col) {
  size_t n = in_spatial.size();
  if (n == 2) return im2col_2d(x, in_spatial, channels, kernel, out_spatial, strides, pads, dilations, col);
  int64_t kernel_size = product(kernel), out_size = product(out_spatial), in_size = product(in_spatial);
  AxisIndex kpos(n), opos(n);
  for (int64_t c = 0; c < channels; ++c) {
    const T* plane = x + c * in_size;
    for (int64_t kk = 0; kk < kernel_size; ++kk, col += out_size) {
      for (int64_t rem = kk, a = static_cast<int64_t>(n); a-- > 0;) {
        kpos[static_cast<size_t>(a)] = rem % kernel[static_cast<size_t>(a)];
        rem /= kernel[static_cast<size_t>(a)];
      }
      for (size_t a = 0; a < n; ++a) opos[a] = 0;
      for (int64_t o = 0; o < out_size; ++o) {
        int64_t offset = 0;
        bool inside = true;
        for (size_t a = 0; a < n && inside; ++a) {
          int64_t at = opos[a] * strides[a] - pads[a] + kpos[a] * dilations[a];
          inside = at >= 0 && at < in_spatial[a];
          offset += at * in_strides[a];
        }
        col[o] = inside ? plane[offset] : T(0);
        for (size_t a = n; a-- > 0;) {
          if (++opos[a] < out_spatial[a]) break;
          opos[a] = 0;
        }
      }
    }
  }
}

template void im2col(const float*, const Dims&, const Dims&, int64_t, const Dims&, const Dims&, const Dims&, const Dims&,
                    const Dims&, float*);
template void im2col(const int32_t*, const Dims&, const Dims&, int64_t, const Dims&, const Dims&, const Dims&, const Dims&,
                     const Dims&, int32_t*);

namespace {

bool is_pointwise(const ref::Op& op) {
  for (const char* name : {"kernel_shape", "strides", "dilations"})
    for (int64_t v : op.get_ints(name))
      if (v != 1) return false;
  for (int64_t v : op.get_ints("pads"))
    if (v != 0) return false;
  return true;
}


Tag plain(size_t rank) {
  const Tag tags[] = {Tag::a, Tag::ab, Tag::abc, Tag::abcd, Tag::abcde, Tag::abcdef};
  return tags[rank - 1];
}

Desc plain_desc(const Dims& dims) {
  return Desc(dnnl::memory::dims(dims.begin(), dims.end()), dnnl::memory::data_type::f32, plain(dims.size()));
}

// An image [N, C, H, W] as a ref program holds it: row-major, or channels last ([N, 1, H, W, C]
// in the program, oneDNN's nhwc).
Desc image_desc(const Dims& dims, bool channels_last) {
  if (!channels_last) return plain_desc(dims);
  return Desc(dnnl::memory::dims(dims.begin(), dims.end()), dnnl::memory::data_type::f32, Tag::nhwc);
}

// Activations oneDNN applies exactly as ONNX defines them, inside the convolution's own pass; with
// an output scale, shift or bound after them, the whole epilogue runs after the convolution
// (oneDNN's clip would make a NaN the bound, where Max and Min keep it).
std::optional<std::pair<dnnl::algorithm, std::pair<float, float>>> post_op(const ref::Op& op) {
  for (const char* name : {"out_scale", "out_shift", "out_lo", "out_hi"})
    if (op.attr(name)) return std::nullopt;
  const float alpha = op.get_float("act_alpha", 0.0f), beta = op.get_float("act_beta", 0.0f);
  switch (static_cast<ref::Activation>(op.get_int("act", 0))) {
    case ref::Activation::kRelu: return {{dnnl::algorithm::eltwise_relu, {0.0f, 0.0f}}};
    case ref::Activation::kLeakyRelu: return {{dnnl::algorithm::eltwise_relu, {alpha, 0.0f}}};
    case ref::Activation::kClip: return {{dnnl::algorithm::eltwise_clip, {alpha, beta}}};
    default: return std::nullopt;
  }
}

// The convolution (or deconvolution) of a packed Conv (ConvTranspose): its weight, source and
// destination in whatever layout oneDNN prefers for this CPU (or in the layouts given), and a
// scratchpad the caller provides. The same function makes it when ctxgen packs the weight and when
// the runtime plans the op, so both see the same layout.
using Setup = dnnl::primitive_desc;

bool transposed(const ref::Op& op) { return op.type == "ConvTranspose"; }

// Where a convolution's windows go; a band of rows has pads of its own.
struct Geometry {
  Dims strides, pads, dilations;
};

// A ConvTranspose's output_padding extends the end of each axis: to oneDNN, whose output size
// follows from the pads, that is less padding at the end.
Geometry geometry_of(const ref::Op& op) {
  Geometry g{op.get_ints("strides"), op.get_ints("pads"), op.get_ints("dilations")};
  const Dims extra = op.get_ints("output_padding");
  const size_t n = g.strides.size();
  for (size_t a = 0; a < extra.size() && n + a < g.pads.size(); ++a) g.pads[n + a] -= extra[a];
  return g;
}

Desc any_desc(const Dims& d) {
  return Desc(dnnl::memory::dims(d.begin(), d.end()), dnnl::memory::data_type::f32, Tag::any);
}

Setup setup(const ref::Op& op, const Geometry& g, const Desc& src, const Desc& weight, const Desc& bias,
            const Desc& dst) {
  const size_t spatial = static_cast<size_t>(src.dims().size()) - 2;
  dnnl::memory::dims pad_begin(g.pads.begin(), g.pads.begin() + static_cast<long>(spatial));
  dnnl::memory::dims pad_end(g.pads.begin() + static_cast<long>(spatial), g.pads.end());
  dnnl::memory::dims dilate;  // oneDNN counts the gaps between taps
  for (int64_t d : g.dilations) dilate.push_back(d - 1);
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (auto p = post_op(op)) {
    dnnl::post_ops ops;
    ops.append_eltwise(1.0f, p->first, p->second.first, p->second.second);
    attr.set_post_ops(ops);
  }
  const dnnl::memory::dims strides(g.strides.begin(), g.strides.end());
  onednn::OneThread one;
  if (transposed(op)) {
    const dnnl::deconvolution_forward::desc desc(dnnl::prop_kind::forward_inference, dnnl::algorithm::deconvolution_direct,
                                                 src, weight, bias, dst, strides, dilate, pad_begin, pad_end);
    return dnnl::deconvolution_forward::primitive_desc(desc, attr, onednn::engine());
  }
  const dnnl::convolution_forward::desc desc(dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct, src,
                                             weight, bias, dst, strides, dilate, pad_begin, pad_end);
  return dnnl::convolution_forward::primitive_desc(desc, attr, onednn::engine());
}

// A Conv with channels_last = 1 computes on channels-last images (whose rows are contiguous, so
// that it can be cut into bands of rows); else on the layout oneDNN prefers (blocked on AVX2).
// The weight is `any` when the compiler asks oneDNN for its layout, the recorded one when the
// runtime plans the op.
Setup setup(const ref::Op& op, const Dims& x, const Desc& weight, const Dims& y, bool bias) {
  const bool last = op.get_int("channels_last", 0) != 0;
  return setup(op, geometry_of(op), last ? image_desc(x, true) : any_desc(x), weight, bias ? plain_desc({y[1]}) : Desc(),
               last ? image_desc(y, true) : any_desc(y));
}

Desc any_weight(const ref::Op& op, const Dims& w) {
  return any_desc(onednn_weight_dims(w, op.get_int("group", 1), transposed(op)));
}

// A weight as the model holds it, in oneDNN's terms: a Conv's [M, C/group, k...] is row-major;
// a ConvTranspose's [C, M/group, k...] is oneDNN's [M, C, k...] (grouped [group, M/group,
// C/group, k...]) with the input channels outer.
Desc plain_weight(const Dims& w, int64_t group, bool transpose) {
  const Dims dims = onednn_weight_dims(w, group, transpose);
  if (!transpose) return plain_desc(dims);
  const int64_t taps = product(w, 2, w.size()), outs = w[1], ins = w[0] / group;
  const size_t o = group == 1 ? 0 : 1;  // where oneDNN's output channels are
  Dims strides(dims.size());
  if (group != 1) strides[0] = ins * outs * taps;
  strides[o] = taps;
  strides[o + 1] = outs * taps;
  const Dims spatial = strides_of(Dims(w.begin() + 2, w.end()));
  std::copy(spatial.begin(), spatial.end(), strides.begin() + static_cast<long>(o + 2));
  return Desc(dnnl::memory::dims(dims.begin(), dims.end()), dnnl::memory::data_type::f32,
              dnnl::memory::dims(strides.begin(), strides.end()));
}

// A packed weight's layout, as its Conv records it (attribute weight_layout, over the weight's
// dims as oneDNN counts them): the padded dims, the strides of their outer indices, then each
// inner block as (dim, size), outermost first. The rule (ops.cc) has checked that it lies within
// the weight.
Desc recorded_weight(const ref::Op& op) {
  const Dims dims = onednn_weight_dims(op.get_ints("weight_shape"), op.get_int("group", 1), transposed(op));
  const Dims layout = op.get_ints("weight_layout");
  const size_t rank = dims.size();
  if (layout.size() < 2 * rank || layout.size() % 2 != 0 || (layout.size() - 2 * rank) / 2 > DNNL_MAX_NDIMS)
    throw Error(ErrorCode::kInternal, "a packed Conv without a weight layout of its weight's rank");
  const size_t blocks = (layout.size() - 2 * rank) / 2;
  dnnl_memory_desc_t d{};
  d.ndims = static_cast<int>(rank);
  d.data_type = dnnl_f32;
  d.format_kind = dnnl_blocked;
  for (size_t i = 0; i < rank; ++i) {
    d.dims[i] = dims[i];
    d.padded_dims[i] = layout[i];
    d.format_desc.blocking.strides[i] = layout[rank + i];
  }
  d.format_desc.blocking.inner_nblks = static_cast<int>(blocks);
  for (size_t b = 0; b < blocks; ++b) {
    d.format_desc.blocking.inner_idxs[b] = layout[2 * rank + 2 * b];
    d.format_desc.blocking.inner_blks[b] = layout[2 * rank + 2 * b + 1];
  }
  return Desc(d);
}

// A primitive running part of a convolution: its layouts and its scratchpad's.
struct Part {
  dnnl::primitive primitive;
  Desc src, weight, bias, dst, scratchpad;
};

// One piece of the convolution the caller's threads run side by side: a part's primitive over
// the source, weight, bias and destination at these offsets (elements) into the whole's.
struct Piece {
  size_t part = 0;
  uint64_t src = 0, weight = 0, bias = 0, dst = 0;
};

struct Packed {
  Desc src, dst, src_given, dst_given;
  std::optional<dnnl::reorder> to_src, from_dst;  // when the primitive's layouts are not the given ones
  bool act_fused = false;  // else the plan's activation runs after
  std::vector<Part> parts;
  std::vector<Piece> pieces;
  uint64_t src_at = 0, dst_at = 0, pad_at = 0, pad_step = 0, scratch_bytes = 0;  // bytes in the run's scratch
};

dnnl::memory memory_at(const Desc& desc, const void* data) {
  return dnnl::memory(desc, onednn::engine(), const_cast<void*>(data));
}

// A packed Conv's oneDNN memory objects in a run state.
class Memories final : public OpState, public onednn::MemorySlots {
 public:
  // The given images, the primitive's (when reordered), then per piece its source, weight,
  // destination, scratchpad and bias.
  enum Slot : size_t { kGivenSrc, kGivenDst, kSrc, kDst, kPieces };
  enum PieceSlot : size_t { kPieceSrc, kWeight, kPieceDst, kPad, kBias, kPerPiece };

  explicit Memories(size_t pieces) : MemorySlots(kPieces + kPerPiece * pieces) {}
  using MemorySlots::at;
  const dnnl::memory& at(size_t piece, PieceSlot slot, const Desc& desc, const void* data) {
    return at(kPieces + kPerPiece * piece + slot, desc, data);
  }
};

struct ConvPlan final : OpPlan {
  std::unique_ptr<OpState> make_state() const override {
    return packed ? std::make_unique<Memories>(packed->pieces.size()) : nullptr;
  }
  std::shared_ptr<const Packed> packed;  // absent: im2col + GEMM (scatter), scratch_bytes holding the im2col matrix
  FusedActivation act;
  // The unpacked paths' geometry (spatial axes).
  int64_t group = 1;
  bool pointwise = false;
  Dims strides, pads, dilations, in_spatial, in_strides, out_spatial, out_strides, kernel;
};

// The elements one step of `dim`'s outermost index covers, and that index's block, when `dim` is
// the outermost dimension of a dense blocked layout with no padding along it: then any run of
// whole blocks along `dim` is a contiguous slice laid out like the whole.
std::optional<std::pair<int64_t, int64_t>> outermost(const Desc& desc, int dim) {
  const dnnl_memory_desc_t& d = desc.data;
  if (d.format_kind != dnnl_blocked || d.dims[dim] != d.padded_dims[dim]) return std::nullopt;
  int64_t block = 1;
  for (int i = 0; i < d.format_desc.blocking.inner_nblks; ++i)
    if (d.format_desc.blocking.inner_idxs[i] == dim) block *= d.format_desc.blocking.inner_blks[i];
  const int64_t stride = d.format_desc.blocking.strides[dim];
  if (d.dims[dim] % block != 0 || stride * (d.dims[dim] / block) * 4 != static_cast<int64_t>(desc.get_size()))
    return std::nullopt;
  return std::make_pair(stride, block);
}

// The slice of `whole` holding `count` (whole blocks) along `dim`, its outermost dimension but for
// a batch of one before it, whose stride is then the slice's size, as oneDNN expects of a dense
// tensor (a batch of one is never stepped over, so that stride only names the layout).
Desc cut(const Desc& whole, int dim, int64_t count, int64_t stride, int64_t block) {
  dnnl_memory_desc_t d = whole.data;
  d.dims[dim] = d.padded_dims[dim] = count;
  for (int outer = 0; outer < dim; ++outer) d.format_desc.blocking.strides[outer] = stride * (count / block);
  return Desc(d);
}

// A large convolution of one image is cut into pieces the caller's threads run side by side, each
// reading and writing contiguous slices: along its output rows when it computes channels last,
// else (one group) along its output channels when oneDNN lays the weight and the destination out
// with channels outermost; else it stays whole.
constexpr int64_t kMinSplitWork = int64_t{1} << 18;  // multiply-adds
constexpr int64_t kMaxPieces = 4;  // a power of two
// oneDNN's AVX2 convolution computes up to 4 blocks of 8 output channels per pass over the source;
// pieces of 8 made the exported CNN 1.5 times slower on one thread (0.61 vs 0.39 ms), and no
// faster on two.
constexpr int64_t kMinPieceChannels = 32;

Part whole_part(const Setup& s) {
  onednn::OneThread one;
  return {dnnl::primitive(s), s.src_desc(0), s.weights_desc(0), s.weights_desc(1), s.dst_desc(0), s.scratchpad_desc()};
}

// Bands of output rows of a channels-last convolution of one image: band k computes rows
// [r0, r1) from the input rows they read, padded where the whole is padded. Bands of equal
// geometry share a primitive (the middle ones). The whole is not even described: that costs as
// much as describing a band (~10 µs), and oneDNN caches only what it made a primitive of. A band
// that only oneDNN's reference implementation runs is refused (the whole runs then), as is one
// wholly in the padding.
bool cut_into_bands(const ref::Op& op, const Desc& weight, const Dims& x, const Dims& w, const Dims& y, bool bias,
                    Packed& p) {
  if (y[0] != 1 || product(w) * product(y, 2, y.size()) < kMinSplitWork) return false;
  const Geometry whole = geometry_of(op);
  const Dims &strides = whole.strides, &pads = whole.pads, &dilations = whole.dilations;
  // One band per hardware thread, at most kMaxPieces: each band re-reads the input rows its
  // neighbours read too, and on the project's 2 cores 4 bands ran the exported CNN slower than 2.
  // Asked once: the C++ library reads it from /sys on every call (~10 µs).
  static const auto threads = static_cast<int64_t>(std::max(1u, std::thread::hardware_concurrency()));
  const int64_t bands = std::min({kMaxPieces, threads, y[2]}), ih = x[2], iw = x[3], channels = x[1], out_row = y[3] * y[1];
  if (bands < 2) return false;
  std::map<std::array<int64_t, 4>, size_t> parts;  // (rows in, pad top, pad bottom, rows out) -> part
  std::vector<Part> made;
  std::vector<Piece> pieces;
  try {
    for (int64_t k = 0; k < bands; ++k) {
      const int64_t r0 = k * y[2] / bands, r1 = (k + 1) * y[2] / bands;
      const int64_t first = r0 * strides[0] - pads[0], last = (r1 - 1) * strides[0] - pads[0] + (w[2] - 1) * dilations[0];
      const int64_t begin = std::max<int64_t>(first, 0), end = std::min(last + 1, ih);
      if (end <= begin) return false;  // a band wholly in the padding: the whole runs instead
      const std::array<int64_t, 4> key = {end - begin, begin - first, last + 1 - end, r1 - r0};
      auto it = parts.find(key);
      if (it == parts.end()) {
        Geometry band = whole;
        band.pads = {key[1], pads[1], key[2], pads[3]};
        const Setup s = setup(op, band, image_desc({1, channels, key[0], iw}, true), weight,
                              bias ? plain_desc({y[1]}) : Desc(), image_desc({1, y[1], key[3], y[3]}, true));
        if (std::string_view(s.impl_info_str()).starts_with("ref:")) return false;
        it = parts.emplace(key, made.size()).first;
        made.push_back(whole_part(s));
      }
      pieces.push_back({it->second, static_cast<uint64_t>(begin * iw * channels), 0, 0, static_cast<uint64_t>(r0 * out_row)});
    }
  } catch (const dnnl::error&) {
    return false;
  }
  p.parts = std::move(made);
  p.pieces = std::move(pieces);
  return true;
}

// A strided first convolution: a row-major image of few channels in, as many output channels
// as an AVX-512 block, channels last out. oneDNN's direct kernel reads the planes as they are and
// writes its blocked layout, which for one block is channels last byte for byte: no reorder of the
// input (UltraFace's 3 x 240 x 320: ~55 µs, a third of the convolution's time, and the direct
// kernel is as fast as the channels-last one). It runs whole (a band of rows of planes is not a
// layout the kernel reads); with strides of 2, half the convolution on each of two threads after
// the reorder was no faster.
bool read_planes(const ref::Op& op, const Desc& weight, const Dims& x, const Dims& y, bool bias, Packed& p) {
  constexpr int64_t kBlock = 16;
  if (x.size() != 4 || y[1] != kBlock || x[1] >= kBlock) return false;
  for (int64_t stride : op.get_ints("strides"))
    if (stride < 2) return false;
  try {
    const Desc blocked(dnnl::memory::dims(y.begin(), y.end()), dnnl::memory::data_type::f32, Tag::nChw16c);
    const Setup s = setup(op, geometry_of(op), plain_desc(x), weight, bias ? plain_desc({y[1]}) : Desc(), blocked);
    if (std::string_view(s.impl_info_str()).starts_with("ref:")) return false;
    p.parts = {whole_part(s)};
    p.pieces = {Piece{}};
    return true;
  } catch (const dnnl::error&) {
    return false;
  }
}

void cut_into_pieces(const ref::Op& op, const Setup& whole, const Dims& w, const Dims& y, bool bias,
                     Packed& p) {
  const auto all = [&] {
    p.parts = {whole_part(whole)};
    p.pieces = {Piece{}};
  };
  const Desc weight = whole.weights_desc(0), dst = whole.dst_desc(0);
  const auto ow = outermost(weight, 0);
  const auto od = outermost(dst, 1);
  if (y[0] != 1 || op.get_int("group", 1) != 1 || product(w) * product(y, 2, y.size()) < kMinSplitWork || !ow || !od)
    return all();
  const int64_t block = std::max(ow->second, od->second);
  if (block % ow->second != 0 || block % od->second != 0) return all();
  int64_t pieces = kMaxPieces;
  while (pieces > 1 && (y[1] % (pieces * block) != 0 || y[1] / pieces < kMinPieceChannels)) pieces /= 2;
  if (pieces == 1) return all();
  const int64_t count = y[1] / pieces;
  try {
    const Setup s = setup(op, geometry_of(op), whole.src_desc(0), cut(weight, 0, count, ow->first, ow->second),
                          bias ? plain_desc({count}) : Desc(), cut(dst, 1, count, od->first, od->second));
    if (std::string(s.impl_info_str()) != whole.impl_info_str()) return all();
    p.parts = {whole_part(s)};
    p.pieces.clear();
    for (int64_t i = 0; i < pieces; ++i)
      p.pieces.push_back({0, 0, static_cast<uint64_t>(i * (count / ow->second * ow->first)), static_cast<uint64_t>(i * count),
                          static_cast<uint64_t>(i * (count / od->second * od->first))});
  } catch (const dnnl::error&) {
    all();
  }
}

void run_packed(const Packed& p, const FusedActivation& act, Ins in, const Output& out) {
  onednn::OneThread one;
  std::optional<Memories> own;  // called without a run state (a test): kept for this run alone
  Memories& m = out.state ? static_cast<Memories&>(*out.state) : own.emplace(p.pieces.size());
  const auto* src = static_cast<const float*>(p.to_src ? static_cast<const void*>(out.scratch + p.src_at) : in[0].data);
  auto* dst = static_cast<float*>(p.from_dst ? static_cast<void*>(out.scratch + p.dst_at) : out.data);
  if (p.to_src)
    onednn::reorder(*p.to_src, m.at(Memories::kGivenSrc, p.src_given, in[0].data), m.at(Memories::kSrc, p.src, src));
  const bool has_bias = in.size() > 2 && in[2].present();
  const auto piece = [&](size_t i) {
    onednn::OneThread own;
    const Piece& at = p.pieces[i];
    const Part& c = p.parts[at.part];
    const dnnl_exec_arg_t args[] = {
        {DNNL_ARG_SRC, m.at(i, Memories::kPieceSrc, c.src, src + at.src).get()},
        {DNNL_ARG_WEIGHTS, m.at(i, Memories::kWeight, c.weight, in[1].f32() + at.weight).get()},
        {DNNL_ARG_DST, m.at(i, Memories::kPieceDst, c.dst, dst + at.dst).get()},
        {DNNL_ARG_SCRATCHPAD, m.at(i, Memories::kPad, c.scratchpad, out.scratch + p.pad_at + i * p.pad_step).get()},
        {DNNL_ARG_BIAS, has_bias ? m.at(i, Memories::kBias, c.bias, in[2].f32() + at.bias).get() : nullptr}};
    onednn::execute(c.primitive, args, has_bias ? 5 : 4);
  };
  const size_t pieces = p.pieces.size();
  if (pieces > 1 && out.parallel && *out.parallel)
    (*out.parallel)(pieces, std::cref(piece));
  else
    for (size_t i = 0; i < pieces; ++i) piece(i);
  if (p.from_dst) onednn::reorder(*p.from_dst, m.at(Memories::kDst, p.dst, dst), m.at(Memories::kGivenDst, p.dst_given, out.data));
  if (!p.act_fused) act.apply(out.f32(), out.size(), out.parallel);
}

Error cannot_run(const dnnl::error& e) {
  return Error(ErrorCode::kInvalidBinary,
               std::string("oneDNN cannot run this packed convolution on ") + onednn::architecture() + ": " + e.what());
}

// The plan of a packed Conv: the image layouts, the reorders to and from them, the pieces and
// their primitives.
std::shared_ptr<const Packed> plan_packed(const ref::Op& op, const Desc& weight, const Dims& x, const Dims& out,
                                          bool bias) {
  const Dims w = op.get_ints("weight_shape");
  const bool src_last = op.get_int("src_channels_last", 0) != 0, dst_last = op.get_int("dst_channels_last", 0) != 0;
  const Dims image = src_last ? Dims{x[0], x[4], x[2], x[3]} : x;
  const Dims y = dst_last ? Dims{out[0], out[4], out[2], out[3]} : out;
  auto p = std::make_shared<Packed>();
  onednn::plan_made();
  try {
    // A convolution computing channels last reads and writes nhwc; else oneDNN chooses (blocked).
    // The given image layouts are reordered when they are not the primitive's.
    const bool last = op.get_int("channels_last", 0) != 0;
    std::optional<Setup> whole;
    if (!last) whole = setup(op, image, weight, y, bias);
    p->src = whole ? whole->src_desc(0) : image_desc(image, true);
    p->dst = whole ? whole->dst_desc(0) : image_desc(y, true);
    p->src_given = image_desc(image, src_last);
    p->dst_given = image_desc(y, dst_last);
    p->act_fused = post_op(op).has_value();
    onednn::OneThread one;
    const bool planes = last && !src_last && dst_last && read_planes(op, weight, image, y, bias, *p);
    if (planes) {
      p->src = p->src_given;
      p->dst = p->dst_given;
    }
    uint64_t at = 0;
    if (p->src != p->src_given) {
      p->to_src = dnnl::reorder(dnnl::reorder::primitive_desc(onednn::engine(), p->src_given, onednn::engine(), p->src));
      p->src_at = at;
      at += aligned(p->src.get_size());
    }
    if (p->dst != p->dst_given) {
      p->from_dst = dnnl::reorder(dnnl::reorder::primitive_desc(onednn::engine(), p->dst, onednn::engine(), p->dst_given));
      p->dst_at = at;
      at += aligned(p->dst.get_size());
    }
    if (!planes && (!last || !cut_into_bands(op, weight, image, w, y, bias, *p))) {
      if (!whole) whole = setup(op, image, weight, y, bias);
      cut_into_pieces(op, *whole, w, y, bias, *p);
    }
    p->pad_at = at;  // each piece a scratchpad of its own: they run at once
    for (const Part& part : p->parts) p->pad_step = std::max(p->pad_step, aligned(part.scratchpad.get_size()));
    p->scratch_bytes = at + p->pieces.size() * p->pad_step;
  } catch (const dnnl::error& e) {
    throw cannot_run(e);
  }
  return p;
}

// All a packed Conv's plan is made of: its type, its attributes (geometry, activation, layouts),
// its image dims and whether it has a bias (the weight's own bytes are only read when it runs).
std::string planned_key(const ref::Op& op, const Dims& x, const Dims& y, bool bias) {
  std::string key;
  put(key, op);
  put(key, x);
  put(key, y);
  put(key, bias);
  return key;
}

// Planning a packed Conv costs oneDNN ~10 µs a primitive described (it tries its implementations
// in turn), and its primitive cache is looked up by the description, so it cannot spare that: a
// session on the exported CNN spent ~130 µs of its ~600 µs describing the convolutions an earlier
// session of the process had described already. Plans are immutable (a run keeps its buffers in
// its own state), so the process keeps them, keyed by all they are made of (planned_key), and a
// session loading a model the process has loaded before, or one with the same convolutions, shares
// them (1000 plans kept 123 MB: onednn::kept_plans() says how many).
Kept<Packed>& planned() {
  static Kept<Packed> kept(onednn::kept_plans());
  return kept;
}

}  // namespace

Dims onednn_weight_dims(const Dims& w, int64_t group, bool transpose) {
  Dims dims = w;
  if (transpose) dims[0] = w[1] * group, dims[1] = w[0] / group;
  if (group == 1) return dims;
  Dims g = {group, dims[0] / group};
  g.insert(g.end(), dims.begin() + 1, dims.end());
  return g;
}

std::vector<int64_t> conv_weight_layout(const ref::Op& op, const Dims& x, const Dims& w, const Dims& y, bool bias) {
  dnnl_memory_desc_t d{};
  try {
    d = setup(op, x, any_weight(op, w), y, bias).weights_desc(0).data;
  } catch (const dnnl::error& e) {
    throw Error(ErrorCode::kInternal, std::string("oneDNN cannot run this convolution: ") + e.what());
  }
  const dnnl_blocking_desc_t& b = d.format_desc.blocking;
  bool plain_offsets = d.offset0 == 0;
  for (int i = 0; i < d.ndims; ++i) plain_offsets = plain_offsets && d.padded_offsets[i] == 0;
  if (d.format_kind != dnnl_blocked || d.extra.flags != 0 || !plain_offsets)
    throw Error(ErrorCode::kInternal, "oneDNN lays this convolution's weight out in a form a ref program cannot record");
  std::vector<int64_t> layout(d.padded_dims, d.padded_dims + d.ndims);
  layout.insert(layout.end(), b.strides, b.strides + d.ndims);
  for (int i = 0; i < b.inner_nblks; ++i) {
    layout.push_back(b.inner_idxs[i]);
    layout.push_back(b.inner_blks[i]);
  }
  return layout;
}

uint64_t packed_conv_weight_bytes(const ref::Op& op) { return recorded_weight(op).get_size(); }

uint64_t conv_plans_made() { return onednn::plans_made(); }

namespace {

// A plain weight and its packed layout, as a Conv's attributes (weight_shape, group, weight_layout)
// give them; a ConvWeight's `transposed` says they are a ConvTranspose's.
struct WeightLayouts final : OpPlan {
  Desc plain, packed;
};

WeightLayouts weight_layouts(const ref::Op& op) {
  ref::Op of = op;
  if (op.type == "ConvWeight" && op.get_int("transposed", 0) != 0) of.type = "ConvTranspose";
  WeightLayouts w;
  w.packed = recorded_weight(of);
  w.plain = plain_weight(op.get_ints("weight_shape"), op.get_int("group", 1), transposed(of));
  return w;
}

void lay_out(const WeightLayouts& w, const void* weight, void* packed) {
  dnnl::memory src = memory_at(w.plain, weight), dst = memory_at(w.packed, packed);
  onednn::OneThread one;
  dnnl::reorder(src, dst).execute(onednn::stream(), src, dst);
  onednn::stream().wait();
}

}  // namespace

MadeBytes pack_conv_weight(const ref::Op& op, const uint8_t* weight) {
  try {
    const WeightLayouts w = weight_layouts(op);
    MadeBytes packed(w.packed.get_size());
    lay_out(w, weight, packed.data());
    return packed;
  } catch (const dnnl::error& e) {
    throw Error(ErrorCode::kInternal, std::string("oneDNN cannot pack this convolution's weight: ") + e.what());
  }
}

bool conv_runs_channels_last(const ref::Op& op, const Dims& x, const Dims& w, const Dims& y, bool bias) {
  if (x.size() != 4 || transposed(op)) return false;
  try {
    ref::Op last = op;
    last.attrs.push_back(ref::int_attr("channels_last", 1));
    // As fast as the layout oneDNN prefers when it is the same kernel (its blocked layouts and
    // channels last run at the same rate on AVX2).
    return std::string(setup(last, x, any_weight(op, w), y, bias).impl_info_str()) ==
           setup(op, x, any_weight(op, w), y, bias).impl_info_str();
  } catch (const dnnl::error&) {
    return false;
  }
}

namespace kernels {

std::unique_ptr<OpPlan> plan_conv(const ref::Op& op, const std::vector<const ref::Value*>& in, const ref::Value& out) {
  auto plan = std::make_unique<ConvPlan>();
  plan->act = fused_activation_of(op);
  const Dims& x = in[0]->dims;
  if (op.get_int("packed", 0) == 0) {
    const Dims& w = in[1]->dims;
    plan->group = op.get_int("group", 1);
    plan->pointwise = is_pointwise(op);
    plan->strides = op.get_ints("strides");
    plan->pads = op.get_ints("pads");
    plan->dilations = op.get_ints("dilations");
    plan->in_spatial.assign(x.begin() + 2, x.end());
    plan->in_strides = strides_of(plan->in_spatial);
    plan->out_spatial.assign(out.dims.begin() + 2, out.dims.end());
    plan->out_strides = strides_of(plan->out_spatial);
    plan->kernel.assign(w.begin() + 2, w.end());
    if (!plan->pointwise && !transposed(op))
      plan->scratch_bytes = static_cast<uint64_t>(product(w, 1, w.size()) * product(out.dims, 2, out.dims.size())) * sizeof(float);
    return plan;
  }
  // On the weight's recorded layout, which the bands need before any primitive of the whole exists.
  Desc weight;
  try {
    weight = recorded_weight(op);
  } catch (const dnnl::error& e) {
    throw cannot_run(e);
  }
  const uint64_t weight_bytes = weight.get_size();
  if (weight_bytes != in[1]->byte_size())
    throw Error(ErrorCode::kInvalidBinary, "packed weight of " + std::to_string(in[1]->byte_size()) +
                                               " bytes, its recorded layout (weight_layout) spans " +
                                               std::to_string(weight_bytes));
  const bool bias = in.size() > 2 && in[2] != nullptr;
  plan->packed = planned().find(planned_key(op, x, out.dims, bias), [&] { return plan_packed(op, weight, x, out.dims, bias); });
  plan->scratch_bytes = plan->packed->scratch_bytes;
  return plan;
}

std::unique_ptr<OpPlan> plan_conv_weight(const ref::Op& op, const std::vector<const ref::Value*>&, const ref::Value& out) {
  try {
    auto plan = std::make_unique<WeightLayouts>(weight_layouts(op));
    if (plan->packed.get_size() != out.byte_size())
      throw Error(ErrorCode::kInvalidBinary, "its recorded layout (weight_layout) spans " +
                                                 std::to_string(plan->packed.get_size()) + " bytes, its output " +
                                                 std::to_string(out.byte_size()));
    return plan;
  } catch (const dnnl::error& e) {
    throw cannot_run(e);
  }
}

void conv_weight(Ins in, const Output& out) {
  try {
    lay_out(plan_of<WeightLayouts>(out), in[0].data, out.data);
  } catch (const dnnl::error& e) {
    throw cannot_run(e);
  }
}

void conv(Ins in, const Output& out) {
  const auto& plan = plan_of<ConvPlan>(out);
  if (plan.packed) return run_packed(*plan.packed, plan.act, in, out);
  const Dims& xd = in[0].dims();
  const Dims& wd = in[1].dims();
  const int64_t group = plan.group;
  int64_t batch = xd[0], c_per_group = wd[1], m_per_group = wd[0] / group;
  int64_t in_size = product(plan.in_spatial), out_size = product(plan.out_spatial);
  int64_t rows = c_per_group * product(plan.kernel);  // K of the GEMM
  const bool pointwise = plan.pointwise;
  auto* col = reinterpret_cast<float*>(out.scratch);
  const float* w = in[1].f32();
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t g = 0; g < group; ++g) {
      const float* x = in[0].f32() + (b * xd[1] + g * c_per_group) * in_size;
      if (!pointwise)
        im2col(x, plan.in_spatial, plan.in_strides, c_per_group, plan.kernel, plan.out_spatial, plan.strides, plan.pads,
               plan.dilations, col);
      float* y = out.f32() + (b * wd[0] + g * m_per_group) * out_size;
      gemm_rowmajor(m_per_group, out_size, rows, w + g * m_per_group * rows, pointwise ? x : col, y, out.parallel);
    }
  }
  if (in.size() > 2 && in[2].present()) {
    const float* bias = in[2].f32();
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t m = 0; m < wd[0]; ++m) {
        float* plane = out.f32() + (b * wd[0] + m) * out_size;
        for (int64_t i = 0; i < out_size; ++i) plane[i] += bias[m];
      }
  }
  plan.act.apply(out.f32(), out.size(), out.parallel);
}

// Scatter form: every input element adds x * w[ic, m, k] to the output position it reaches.
void conv_transpose(Ins in, const Output& out) {
  const Dims& xd = in[0].dims();
  const Dims& wd = in[1].dims();
  const Dims& yd = out.dims();
  size_t n = xd.size() - 2;
  const auto& p = plan_of<ConvPlan>(out);
  if (p.packed) return run_packed(*p.packed, p.act, in, out);
  const int64_t group = p.group;
  const Dims &strides = p.strides, &pads = p.pads, &dilations = p.dilations;
  const Dims &in_spatial = p.in_spatial, &out_spatial = p.out_spatial, &kernel = p.kernel;
  int64_t in_size = product(in_spatial), out_size = product(out_spatial), k_size = product(kernel);
  int64_t c_per_group = xd[1] / group, m_per_group = wd[1];
  std::memset(out.data, 0, static_cast<size_t>(out.value->byte_size()));
  const Dims& os = p.out_strides;
  AxisIndex ipos(n);
  for (int64_t b = 0; b < xd[0]; ++b)
    for (int64_t g = 0; g < group; ++g)
      for (int64_t c = 0; c < c_per_group; ++c) {
        int64_t ic = g * c_per_group + c;
        const float* x = in[0].f32() + (b * xd[1] + ic) * in_size;
        for (int64_t i = 0; i < in_size; ++i) {
          for (int64_t rem = i, a = static_cast<int64_t>(n); a-- > 0;) {
            ipos[static_cast<size_t>(a)] = rem % in_spatial[static_cast<size_t>(a)];
            rem /= in_spatial[static_cast<size_t>(a)];
          }
          for (int64_t k = 0; k < k_size; ++k) {
            int64_t offset = 0;
            bool inside = true;
            for (int64_t rem = k, a = static_cast<int64_t>(n); a-- > 0;) {
              auto u = static_cast<size_t>(a);
              int64_t kp = rem % kernel[u];
              rem /= kernel[u];
              int64_t o = ipos[u] * strides[u] + kp * dilations[u] - pads[u];
              inside = inside && o >= 0 && o < out_spatial[u];
              offset += o * os[u];
            }
            if (!inside) continue;
            const float* w = in[1].f32() + (ic * m_per_group) * k_size + k;
            float* y = out.f32() + (b * yd[1] + g * m_per_group) * out_size + offset;
            for (int64_t m = 0; m < m_per_group; ++m) y[m * out_size] += x[i] * w[m * k_size];
          }
        }
      }
  if (in.size() > 2 && in[2].present())
    for (int64_t b = 0; b < yd[0]; ++b)
      for (int64_t m = 0; m < yd[1]; ++m) {
        float* plane = out.f32() + (b * yd[1] + m) * out_size;
        for (int64_t i = 0; i < out_size; ++i) plane[i] += in[2].f32()[m];
      }
}

}  // namespace kernels
}  // namespace ctxgen::runtime
