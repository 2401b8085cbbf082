// QLinearConv on oneDNN's int8 convolution: the image reordered channels last (oneDNN's int8
// kernels run on nhwc, its nchw path is the reference loop), the weight laid out for the primitive
// with its zero-point compensation once per run state, int32 sums scaled per output channel into
// float32, then rounded half to even, shifted by the output's zero point and saturated, as ONNX
// Runtime's QLinearConv requantizes (oneDNN would round after adding the zero point, which breaks
// ties the other way for an odd zero point). Only where oneDNN's int8 sums are exact (VNNI).

#include <cmath>
#include <cstdlib>
#include <memory>
#include <new>
#include <limits>
#include <optional>

#include "ctxgen/error.h"
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

struct QConvPlan final : OpPlan {
  QConvPlan(const ref::Op& op, const std::vector<const ref::Value*>& in, const ref::Value& out)
      : count(product(out.dims)), y_zero_point(static_cast<float>(op.get_int("y_zero_point", 0))), unsigned_out(out.dtype == ref::DType::kUInt8) {
    if (!onednn::exact_int8_convolution())
      throw Error(ErrorCode::kInvalidBinary, "QLinearConv needs exact int8 convolutions (VNNI), which " +
                                                 onednn::architecture() + " does not have");
    const Dims& x = in[0]->dims;
    const Dims& w = in[1]->dims;
    const int64_t group = op.get_int("group", 1);
    const Dims strides = op.get_ints("strides"), pads = op.get_ints("pads"), dilations = op.get_ints("dilations");
    src_given = Desc(dims_of(x), data_type_of(in[0]->dtype), Tag::nchw);
    src = Desc(dims_of(x), data_type_of(in[0]->dtype), Tag::nhwc);
    dst = Desc(dims_of(out.dims), DataType::f32, Tag::nhwc);
    quantized = Desc(dims_of(out.dims), data_type_of(out.dtype), Tag::nhwc);
    dst_given = Desc(dims_of(out.dims), data_type_of(out.dtype), Tag::nchw);
    Dims wg = group == 1 ? w : Dims{group, w[0] / group, w[1], w[2], w[3]};
    weight_given = Desc(dims_of(wg), DataType::s8, group == 1 ? Tag::oihw : Tag::goihw);
    const Desc weight_any(dims_of(wg), DataType::s8, Tag::any);
    const bool bias = in.size() > 2 && in[2] != nullptr;
    this->bias = bias ? Desc({w[0]}, DataType::s32, Tag::x) : Desc();
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    const std::vector<float> scales = op.attr("scales")->floats;
    attr.set_output_scales(scales.size() == 1 ? 0 : 1 << 1, scales);
    if (const int64_t zero = op.get_int("x_zero_point", 0); zero != 0) attr.set_zero_points(DNNL_ARG_SRC, 0, {static_cast<int>(zero)});
    dnnl::memory::dims dilate;  // oneDNN counts the gaps between taps
    for (int64_t d : dilations) dilate.push_back(d - 1);
    try {
      onednn::OneThread one;
      const dnnl::convolution_forward::desc desc(dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct,
                                                 src, weight_any, this->bias, dst, dims_of(strides), dilate,
                                                 {pads[0], pads[1]}, {pads[2], pads[3]});
      const dnnl::convolution_forward::primitive_desc pd(desc, attr, onednn::engine());
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

  std::unique_ptr<OpState> make_state() const override { return std::make_unique<State>(); }

  // The weight in the primitive's layout, made from the binary's on the first run of a run state
  // (kept only once made whole), and oneDNN's memory objects around the run's buffers, made again
  // only for a buffer that moved.
  struct State final : OpState {
    enum Slot : size_t { kGivenSrc, kSrc, kWeight, kDst, kPad, kBias, kQuantized, kGivenDst, kSlots };
    struct Free {
      void operator()(uint8_t* p) const { std::free(p); }
    };
    std::unique_ptr<uint8_t, Free> weight;
    std::pair<const void*, dnnl::memory> memories[kSlots];
    const dnnl::memory& at(Slot slot, const Desc& desc, const void* data) {
      auto& [where, memory] = memories[slot];
      if (!memory || where != data) {
        memory = dnnl::memory(desc, onednn::engine(), const_cast<void*>(data));
        where = data;
      }
      return memory;
    }
  };

  int64_t count;  // of the output
  float y_zero_point;
  bool unsigned_out;
  Desc src_given, src, dst, quantized, dst_given, weight_given, weight, bias, pad;
  dnnl::convolution_forward primitive;
  dnnl::reorder to_src, to_weight, to_dst;
  uint64_t src_at = 0, dst_at = 0, quantized_at = 0, pad_at = 0;
};

}  // namespace

namespace kernels {

const Planner plan_qlinear_conv = plan_as<QConvPlan>;

void qlinear_conv(Ins in, const Output& out) {
  const auto& p = plan_of<QConvPlan>(out);
  onednn::OneThread one;
  std::optional<QConvPlan::State> own;  // called without a run state (a test): made for this run alone
  auto& state = out.state ? static_cast<QConvPlan::State&>(*out.state) : own.emplace();
  using Slot = QConvPlan::State::Slot;
  if (!state.weight) {
    const size_t bytes = aligned(p.weight.get_size());
    std::unique_ptr<uint8_t, QConvPlan::State::Free> laid(static_cast<uint8_t*>(std::aligned_alloc(kAlign, bytes)));
    if (!laid) throw std::bad_alloc();
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
