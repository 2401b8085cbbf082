// Data movement: Transpose, Reshape (a byte copy), Concat, Slice and Gather.

#include <cstring>
#include <string>

#include "ctxgen/error.h"
#include "kernels.h"

namespace ctxgen::runtime::kernels {

void transpose(const ref::Op& op, const std::vector<Tensor>& in, const Output& out) {
  Dims perm = op.get_ints("perm");
  Dims in_strides = strides_of(in[0].dims());
  Dims gathered(perm.size());  // input stride of each output axis
  for (size_t a = 0; a < perm.size(); ++a) gathered[a] = in_strides[static_cast<size_t>(perm[a])];
  const Dims& od = out.dims();
  const Dims strides[2] = {strides_of(od), gathered};
  int64_t inner = od.empty() ? 1 : od.back(), step = od.empty() ? 0 : gathered.back();
  const float* x = in[0].f32();
  float* y = out.f32();
  for_each_row(od, strides, [&](const int64_t* at) {
    for (int64_t i = 0; i < inner; ++i) y[at[0] + i] = x[at[1] + i * step];
  });
}

void reshape(const ref::Op&, const std::vector<Tensor>& in, const Output& out) {
  std::memcpy(out.data, in[0].data, static_cast<size_t>(out.value->byte_size()));
}

void concat(const ref::Op& op, const std::vector<Tensor>& in, const Output& out) {
  auto axis = static_cast<size_t>(op.get_int("axis", 0));
  const Dims& od = out.dims();
  int64_t outer = product(od, 0, axis), inner = product(od, axis + 1, od.size());
  int64_t out_row = od[axis] * inner;
  int64_t at = 0;  // start of this input's block within an output row
  for (const Tensor& t : in) {
    int64_t row = t.dims()[axis] * inner;
    for (int64_t o = 0; o < outer; ++o)
      std::memcpy(out.f32() + o * out_row + at, t.f32() + o * row, static_cast<size_t>(row) * sizeof(float));
    at += row;
  }
}

void slice(const ref::Op& op, const std::vector<Tensor>& in, const Output& out) {
  const Dims& od = out.dims();
  if (product(od) == 0) return;  // starts of empty axes are not meaningful
  Dims starts = op.get_ints("starts"), steps = op.get_ints("steps");
  Dims in_strides = strides_of(in[0].dims());
  Dims stepped(steps.size(), 0);  // input stride per output axis; a single-element axis never steps
  int64_t base = 0;
  for (size_t a = 0; a < steps.size(); ++a) {
    if (od[a] > 1) stepped[a] = steps[a] * in_strides[a];
    base += starts[a] * in_strides[a];
  }
  const Dims strides[2] = {strides_of(od), stepped};
  int64_t inner = od.empty() ? 1 : od.back(), step = od.empty() ? 0 : stepped.back();
  const float* x = in[0].f32() + base;
  float* y = out.f32();
  for_each_row(od, strides, [&](const int64_t* at) {
    for (int64_t i = 0; i < inner; ++i) y[at[0] + i] = x[at[1] + i * step];
  });
}

void gather(const ref::Op& op, const std::vector<Tensor>& in, const Output& out) {
  const Dims& d = in[0].dims();
  auto axis = static_cast<size_t>(op.get_int("axis", 0));
  int64_t outer = product(d, 0, axis), extent = d[axis], inner = product(d, axis + 1, d.size());
  const int64_t* indices = in[1].i64();
  int64_t count = in[1].size();
  for (int64_t k = 0; k < count; ++k)
    if (indices[k] < -extent || indices[k] >= extent)
      throw Error(ErrorCode::kRuntime, "Gather index " + std::to_string(indices[k]) + " out of range [" +
                                           std::to_string(-extent) + ", " + std::to_string(extent) + ")");
  auto bytes = static_cast<size_t>(inner) * sizeof(float);
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t k = 0; k < count; ++k) {
      int64_t i = indices[k] < 0 ? indices[k] + extent : indices[k];
      std::memcpy(out.f32() + (o * count + k) * inner, in[0].f32() + (o * extent + i) * inner, bytes);
    }
}

}  // namespace ctxgen::runtime::kernels
