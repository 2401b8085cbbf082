// 8-bit convolutions on oneDNN's int8 convolution, only where its sums are exact (VNNI), the image
// reordered channels last (oneDNN's int8 kernels run on nhwc, its nchw path is the reference loop)
// and the weight laid out for the primitive once per run state.
//
// QLinearConv: int32 sums scaled per output channel into float32, then rounded half to even,
// shifted by the output's zero point and saturated, as ONNX Runtime's QLinearConv requantizes
// (oneDNN would round after adding the zero point, which breaks ties the other way for an odd zero
// point).
//
// ConvInteger of a weight of the binary: its int32 sums exactly. oneDNN takes the image's zero
// point (at run time: a DynamicQuantizeLinear makes it) but no weight zero point, and int8 weights
// only; so the weight less its zero point, w - w_zero_point in [-255, 255], is split into int8
// weights, a = clamp(w - w_zero_point, -128, 127) and what is left split alike (most of it 0; a
// third part only for a difference of 255), and the sums of each further convolution are added to
// the first's (oneDNN's sum post-op).

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <new>
#include <limits>
#include <optional>
#include <vector>

#include "ctxgen/error.h"
#include "kept.h"
#include "kernels.h"
#include "onednn.h"

namespace ctxgen::runtime {
namespace {

using Desc = dnnl::memory::desc;
using Tag = dnnl::memory::format_tag;
using DataType = dnnl::memory::data_type;

constexpr uint64_t kAlign = 64;
uint64_t aligned(uint64_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

DataType data_type_of(ref::DType t) { return t == ref::DType::kUInt8 ? DataType::u8 : DataType::s8; }

dnnl::memory::dims dims_of(const Dims& d) { return dnnl::memory::dims(d.begin(), d.end()); }

struct Free {
  void operator()(uint8_t* p) const { std::free(p); }
};
using Laid = std::unique_ptr<uint8_t, Free>;  // a weight laid out for a primitive
Laid laid_bytes(uint64_t bytes) {
  Laid laid(static_cast<uint8_t*>(std::aligned_alloc(kAlign, aligned(bytes))));
  if (!laid) throw std::bad_alloc();
  return laid;
}

// oneDNN's memory objects around a run's buffers, made again only for a buffer that moved (making
// one allocates).
template <size_t Slots>
struct Memories {
  std::pair<const void*, dnnl::memory> slots[Slots];
  const dnnl::memory& at(size_t slot, const Desc& desc, const void* data) {
    auto& [where, memory] = slots[slot];
    if (!memory || where != data) {
      memory = dnnl::memory(desc, onednn::engine(), const_cast<void*>(data));
      where = data;
    }
    return memory;
  }
};

// What an 8-bit 2-D convolution takes from its op: the image as given (nchw) and channels last,
// the int8 weight as given (grouped as oneDNN wants it), and the convolution with `bias` and `dst`.
struct Int8Geometry {
  Int8Geometry(const ref::Op& op, const ref::Value& x, const Dims& w)
      : strides(op.get_ints("strides")), pads(op.get_ints("pads")), src_given(dims_of(x.dims), data_type_of(x.dtype), Tag::nchw),
        src(dims_of(x.dims), data_type_of(x.dtype), Tag::nhwc) {
    const int64_t group = op.get_int("group", 1);
    const Dims wg = group == 1 ? w : Dims{group, w[0] / group, w[1], w[2], w[3]};
    weight_given = Desc(dims_of(wg), DataType::s8, group == 1 ? Tag::oihw : Tag::goihw);
    weight_any = Desc(dims_of(wg), DataType::s8, Tag::any);
    for (int64_t d : op.get_ints("dilations")) dilate.push_back(d - 1);  // oneDNN counts the gaps between taps
  }
  dnnl::convolution_forward::desc convolution(const Desc& bias, const Desc& dst) const {
    return {dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct, src, weight_any, bias, dst,
            dims_of(strides), dilate, {pads[0], pads[1]}, {pads[2], pads[3]}};
  }
  Dims strides, pads;
  dnnl::memory::dims dilate;
  Desc src_given, src, weight_given, weight_any;
};

struct QConv {
  QConv(const ref::Op& op, const std::vector<const ref::Value*>& in, const ref::Value& out)
      : count(product(out.dims)), y_zero_point(static_cast<float>(op.get_int("y_zero_point", 0))), unsigned_out(out.dtype == ref::DType::kUInt8) {
    if (!onednn::exact_int8_convolution())
      throw Error(ErrorCode::kInvalidBinary, "QLinearConv needs exact int8 convolutions (VNNI), which " +
                                                 onednn::architecture() + " does not have");
    const Int8Geometry g(op, *in[0], in[1]->dims);
    src_given = g.src_given;
    src = g.src;
    weight_given = g.weight_given;
    dst = Desc(dims_of(out.dims), DataType::f32, Tag::nhwc);
    quantized = Desc(dims_of(out.dims), data_type_of(out.dtype), Tag::nhwc);
    dst_given = Desc(dims_of(out.dims), data_type_of(out.dtype), Tag::nchw);
    const bool bias = in.size() > 2 && in[2] != nullptr;
    this->bias = bias ? Desc({in[1]->dims[0]}, DataType::s32, Tag::x) : Desc();
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    const std::vector<float> scales = op.attr("scales")->floats;
    attr.set_output_scales(scales.size() == 1 ? 0 : 1 << 1, scales);
    if (const int64_t zero = op.get_int("x_zero_point", 0); zero != 0) attr.set_zero_points(DNNL_ARG_SRC, 0, {static_cast<int>(zero)});
    try {
      onednn::OneThread one;
      const dnnl::convolution_forward::primitive_desc pd(g.convolution(this->bias, dst), attr, onednn::engine());
      primitive = dnnl::convolution_forward(pd);
      weight = pd.weights_desc();
      to_src = dnnl::reorder(dnnl::reorder::primitive_desc(onednn::engine(), src_given, onednn::engine(), src));
      to_weight = dnnl::reorder(dnnl::reorder::primitive_desc(onednn::engine(), weight_given, onednn::engine(), weight));
      to_dst = dnnl::reorder(dnnl::reorder::primitive_desc(onednn::engine(), quantized, onednn::engine(), dst_given));
      pad = pd.scratchpad_desc();
    } catch (const dnnl::error& e) {
      throw Error(ErrorCode::kInvalidBinary, std::string("oneDNN cannot run this QLinearConv: ") + e.what());
    }
    src_at = 0;
    dst_at = aligned(src.get_size());
    quantized_at = dst_at + aligned(dst.get_size());
    pad_at = quantized_at + aligned(quantized.get_size());
    scratch_bytes = pad_at + pad.get_size();
  }

  // The weight in the primitive's layout, made from the binary's on the first run of a run state
  // (kept only once made whole), and oneDNN's memory objects around the run's buffers, made again
  // only for a buffer that moved.
  struct State final : OpState, Memories<8> {
    enum Slot : size_t { kGivenSrc, kSrc, kWeight, kDst, kPad, kBias, kQuantized, kGivenDst };
    Laid weight;
  };

  int64_t count;  // of the output
  float y_zero_point;
  bool unsigned_out;
  Desc src_given, src, dst, quantized, dst_given, weight_given, weight, bias, pad;
  dnnl::convolution_forward primitive;
  dnnl::reorder to_src, to_weight, to_dst;
  uint64_t src_at = 0, dst_at = 0, quantized_at = 0, pad_at = 0, scratch_bytes = 0;
};

// ConvInteger's convolutions (see the top of the file): `first` on the weight's clamped part,
// `rest` adding the sums of each further part to its output.
struct Int8ConvInteger {
  Int8ConvInteger(const ref::Op& op, const std::vector<const ref::Value*>& in, const ref::Value& out)
      : x_zero_point(in.size() > 2 && in[2] != nullptr) {
    const Int8Geometry g(op, *in[0], in[1]->dims);
    src_given = g.src_given;
    src = g.src;
    weight_given = g.weight_given;
    dst = Desc(dims_of(out.dims), DataType::s32, Tag::nhwc);
    dst_given = Desc(dims_of(out.dims), DataType::s32, Tag::nchw);
    const auto desc = g.convolution(Desc(), dst);
    auto make = [&](bool add) {
      dnnl::primitive_attr attr;
      attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
      if (x_zero_point) attr.set_zero_points(DNNL_ARG_SRC, 0, {DNNL_RUNTIME_S32_VAL});
      if (add) {
        dnnl::post_ops sum;
        sum.append_sum(1.0f);
        attr.set_post_ops(sum);
      }
      return dnnl::convolution_forward::primitive_desc(desc, attr, onednn::engine());
    };
    onednn::OneThread one;
    const auto first_pd = make(false), rest_pd = make(true);
    first = dnnl::convolution_forward(first_pd);
    rest = dnnl::convolution_forward(rest_pd);
    weight = first_pd.weights_desc();
    if (rest_pd.weights_desc() != weight) throw dnnl::error(dnnl_unimplemented, "the two convolutions lay the weight out differently");
    to_src = dnnl::reorder(dnnl::reorder::primitive_desc(onednn::engine(), src_given, onednn::engine(), src));
    to_weight = dnnl::reorder(dnnl::reorder::primitive_desc(onednn::engine(), weight_given, onednn::engine(), weight));
    to_dst = dnnl::reorder(dnnl::reorder::primitive_desc(onednn::engine(), dst, onednn::engine(), dst_given));
    pad = first_pd.scratchpad_desc().get_size() >= rest_pd.scratchpad_desc().get_size() ? first_pd.scratchpad_desc()
                                                                                           : rest_pd.scratchpad_desc();
    dst_at = aligned(src.get_size());
    pad_at = dst_at + aligned(dst.get_size());
    scratch_bytes = pad_at + pad.get_size();
  }

  struct State final : OpState, Memories<8> {
    enum Slot : size_t { kGivenSrc, kSrc, kDst, kPad, kGivenDst, kParts };
    std::vector<Laid> parts;  // none until the first run; then the first, and the others not all 0
    int32_t x_zero_point = 0;
    dnnl::memory zero_point;  // around x_zero_point
  };

  // The parts of the split, laid out for the primitives.
  void lay_out(Ins in, State& state) const {
    const Dims& w = in[1].dims();
    const int64_t channels = w[0], per_channel = product(w, 1, w.size());
    std::vector<int32_t> left(static_cast<size_t>(channels * per_channel));  // w - w_zero_point, less the parts so far
    const bool zero_each = in.size() > 3 && in[3].present() && in[3].size() > 1;
    for (int64_t m = 0; m < channels; ++m) {
      int32_t zero = 0;
      if (in.size() > 3 && in[3].present())
        zero = in[3].dtype() == ref::DType::kUInt8 ? in[3].as<uint8_t>()[zero_each ? m : 0] : in[3].as<int8_t>()[zero_each ? m : 0];
      for (int64_t i = m * per_channel; i < (m + 1) * per_channel; ++i)
        left[static_cast<size_t>(i)] = (in[1].dtype() == ref::DType::kUInt8 ? in[1].as<uint8_t>()[i] : in[1].as<int8_t>()[i]) - zero;
    }
    std::vector<int8_t> part(left.size());
    std::vector<Laid> parts;  // the state's only once all are made
    for (bool first = true; first || std::any_of(left.begin(), left.end(), [](int32_t v) { return v != 0; }); first = false) {
      for (size_t i = 0; i < left.size(); ++i) {
        part[i] = static_cast<int8_t>(std::clamp(left[i], -128, 127));
        left[i] -= part[i];
      }
      Laid buffer = laid_bytes(weight.get_size());
      onednn::reorder(to_weight, dnnl::memory(weight_given, onednn::engine(), part.data()),
                      dnnl::memory(weight, onednn::engine(), buffer.get()));
      parts.push_back(std::move(buffer));
    }
    state.parts = std::move(parts);
    state.zero_point = dnnl::memory({{1}, DataType::s32, Tag::x}, onednn::engine(), &state.x_zero_point);
  }

  bool x_zero_point;
  Desc src_given, src, dst, dst_given, weight_given, weight, pad;
  dnnl::convolution_forward first, rest;
  dnnl::reorder to_src, to_weight, to_dst;
  uint64_t dst_at = 0, pad_at = 0, scratch_bytes = 0;
};

// Describing an 8-bit convolution to oneDNN costs what a packed Conv's does (~10 µs a primitive,
// and there are four: 7% of a session on the quantized CNN), so its primitives are kept for the
// process the same way (kernels_conv.cc, planned()), keyed by all they are made of; a run's
// buffers and laid-out weights are in its own state.
template <class Conv>
struct KeptPlan final : OpPlan {
  std::shared_ptr<const Conv> conv;
  std::unique_ptr<OpState> make_state() const override { return std::make_unique<typename Conv::State>(); }
};

template <class Conv>
std::unique_ptr<OpPlan> plan_kept(const ref::Op& op, const std::vector<const ref::Value*>& in, const ref::Value& out) {
  static Kept<Conv> kept(onednn::kept_plans());
  std::string key;
  put(key, op);
  for (const ref::Value* v : {in[0], in[1], in.size() > 2 ? in[2] : nullptr, &out}) {
    put(key, v != nullptr);
    if (v == nullptr) continue;
    put(key, v->dtype);
    put(key, v->dims);
  }
  auto plan = std::make_unique<KeptPlan<Conv>>();
  plan->conv = kept.find(key, [&] {
    onednn::plan_made();
    return std::make_shared<const Conv>(op, in, out);
  });
  plan->scratch_bytes = plan->conv->scratch_bytes;
  return plan;
}

}  // namespace

std::unique_ptr<OpPlan> plan_int8_conv_integer(const ref::Op& op, const std::vector<const ref::Value*>& in, const ref::Value& out) {
  const bool weights = in[1]->kind == ref::ValueKind::kWeight &&
                       (in.size() < 4 || in[3] == nullptr || in[3]->kind == ref::ValueKind::kWeight);
  if (!onednn::exact_int8_convolution() || in[0]->dims.size() != 4 || !weights) return nullptr;
  try {
    return plan_kept<Int8ConvInteger>(op, in, out);
  } catch (const dnnl::error&) {
    return nullptr;  // a geometry oneDNN has no int8 kernel for: the integer loops run it
  }
}

void int8_conv_integer(const OpPlan& plan, Ins in, const Output& out) {
  const Int8ConvInteger& p = *static_cast<const KeptPlan<Int8ConvInteger>&>(plan).conv;
  onednn::OneThread one;
  std::optional<Int8ConvInteger::State> own;  // called without a run state (a test): made for this run alone
  auto& state = out.state ? static_cast<Int8ConvInteger::State&>(*out.state) : own.emplace();
  if (state.parts.empty()) p.lay_out(in, state);
  using Slot = Int8ConvInteger::State::Slot;
  uint8_t* scratch = out.scratch;
  const dnnl::memory& src = state.at(Slot::kSrc, p.src, scratch);
  const dnnl::memory& dst = state.at(Slot::kDst, p.dst, scratch + p.dst_at);
  onednn::reorder(p.to_src, state.at(Slot::kGivenSrc, p.src_given, in[0].data), src);
  if (p.x_zero_point) state.x_zero_point = in[0].dtype() == ref::DType::kUInt8 ? in[2].as<uint8_t>()[0] : in[2].as<int8_t>()[0];
  for (size_t k = 0; k < state.parts.size(); ++k) {
    const dnnl_exec_arg_t args[] = {{DNNL_ARG_SRC, src.get()},
                                    {DNNL_ARG_WEIGHTS, state.at(Slot::kParts + k, p.weight, state.parts[k].get()).get()},
                                    {DNNL_ARG_DST, dst.get()},
                                    {DNNL_ARG_SCRATCHPAD, state.at(Slot::kPad, p.pad, scratch + p.pad_at).get()},
                                    {DNNL_ARG_ATTR_ZERO_POINTS | DNNL_ARG_SRC, state.zero_point.get()}};
    onednn::execute(k == 0 ? p.first : p.rest, args, p.x_zero_point ? 5 : 4);
  }
  onednn::reorder(p.to_dst, dst, state.at(Slot::kGivenDst, p.dst_given, out.data));
}

namespace kernels {

const Planner plan_qlinear_conv = plan_kept<QConv>;

void qlinear_conv(Ins in, const Output& out) {
  const QConv& p = *plan_of<KeptPlan<QConv>>(out).conv;
  onednn::OneThread one;
  std::optional<QConv::State> own;  // called without a run state (a test): made for this run alone
  auto& state = out.state ? static_cast<QConv::State&>(*out.state) : own.emplace();
  using Slot = QConv::State::Slot;
  if (!state.weight) {
    Laid laid = laid_bytes(p.weight.get_size());
    onednn::reorder(p.to_weight, dnnl::memory(p.weight_given, onednn::engine(), const_cast<void*>(in[1].data)),
                    dnnl::memory(p.weight, onednn::engine(), laid.get()));
    state.weight = std::move(laid);
  }
  uint8_t* scratch = out.scratch;
  onednn::reorder(p.to_src, state.at(Slot::kGivenSrc, p.src_given, in[0].data), state.at(Slot::kSrc, p.src, scratch + p.src_at));
  const bool bias = in.size() > 2 && in[2].present();
  const dnnl_exec_arg_t args[] = {
      {DNNL_ARG_SRC, state.at(Slot::kSrc, p.src, scratch + p.src_at).get()},
      {DNNL_ARG_WEIGHTS, state.at(Slot::kWeight, p.weight, state.weight.get()).get()},
      {DNNL_ARG_DST, state.at(Slot::kDst, p.dst, scratch + p.dst_at).get()},
      {DNNL_ARG_SCRATCHPAD, state.at(Slot::kPad, p.pad, scratch + p.pad_at).get()},
      {DNNL_ARG_BIAS, bias ? state.at(Slot::kBias, p.bias, in[2].data).get() : nullptr}};
  onednn::execute(p.primitive, args, bias ? 5 : 4);
  const auto* sums = reinterpret_cast<const float*>(scratch + p.dst_at);
  // The scaled sums rounded half to even, shifted, saturated, still channels last: in the order
  // they lie, a loop that vectorises (read across channels for a row-major output, with the plan's
  // fields reloaded after every byte stored, it stayed scalar: 29 µs for the CNN's average
  // QLinearConv, 4 times its convolution); then laid out row-major by oneDNN.
  if (p.unsigned_out) quantize_values(sums, 1.0f, p.y_zero_point, reinterpret_cast<uint8_t*>(scratch + p.quantized_at), p.count);
  else quantize_values(sums, 1.0f, p.y_zero_point, reinterpret_cast<int8_t*>(scratch + p.quantized_at), p.count);
  onednn::reorder(p.to_dst, state.at(Slot::kQuantized, p.quantized, scratch + p.quantized_at),
                  state.at(Slot::kGivenDst, p.dst_given, out.data));
}

}  // namespace kernels

bool runs_qlinear_conv() { return onednn::exact_int8_convolution(); }
}  // namespace ctxgen::runtime
