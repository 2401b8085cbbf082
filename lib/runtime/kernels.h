#pragma once
// Kernel interface of the ref runtime. Kernels run on validated programs only: every dim, id and
// attribute they read has been checked by validate(), so they index without further checks.

#include <cstdint>
#include <vector>

#include "ctxgen/ref_program.h"
#include "shape.h"

namespace ctxgen::runtime {

struct Tensor {
  const ref::Value* value = nullptr;  // nullptr for an absent optional input
  const void* data = nullptr;

  bool present() const { return value != nullptr; }
  const Dims& dims() const { return value->dims; }
  int64_t size() const { return value->element_count(); }
  const float* f32() const { return static_cast<const float*>(data); }
  const int64_t* i64() const { return static_cast<const int64_t*>(data); }
};

struct Output {
  const ref::Value* value = nullptr;
  void* data = nullptr;

  const Dims& dims() const { return value->dims; }
  int64_t size() const { return value->element_count(); }
  float* f32() const { return static_cast<float*>(data); }
};

using Kernel = void (*)(const ref::Op& op, const std::vector<Tensor>& in, const Output& out);

// Applies the fused activation (attrs act, act_alpha, act_beta) of `op` to data[0, n) in place.
void apply_activation(const ref::Op& op, float* data, int64_t n);

// The kernels, one per op type; kernels_*.cc hold them by family.
namespace kernels {

// Elementwise (kernels_elementwise.cc).
void add(const ref::Op&, const std::vector<Tensor>&, const Output&);
void sub(const ref::Op&, const std::vector<Tensor>&, const Output&);
void mul(const ref::Op&, const std::vector<Tensor>&, const Output&);
void div(const ref::Op&, const std::vector<Tensor>&, const Output&);
void pow(const ref::Op&, const std::vector<Tensor>&, const Output&);
void sqrt(const ref::Op&, const std::vector<Tensor>&, const Output&);
void exp(const ref::Op&, const std::vector<Tensor>&, const Output&);
void erf(const ref::Op&, const std::vector<Tensor>&, const Output&);
void neg(const ref::Op&, const std::vector<Tensor>&, const Output&);
void abs(const ref::Op&, const std::vector<Tensor>&, const Output&);
void relu(const ref::Op&, const std::vector<Tensor>&, const Output&);
void leaky_relu(const ref::Op&, const std::vector<Tensor>&, const Output&);
void hard_sigmoid(const ref::Op&, const std::vector<Tensor>&, const Output&);
void hard_swish(const ref::Op&, const std::vector<Tensor>&, const Output&);
void sigmoid(const ref::Op&, const std::vector<Tensor>&, const Output&);
void tanh(const ref::Op&, const std::vector<Tensor>&, const Output&);
void clip(const ref::Op&, const std::vector<Tensor>&, const Output&);

// Linear algebra and windows (kernels_linear.cc, kernels_pool.cc).
void matmul(const ref::Op&, const std::vector<Tensor>&, const Output&);
void gemm(const ref::Op&, const std::vector<Tensor>&, const Output&);
void conv(const ref::Op&, const std::vector<Tensor>&, const Output&);
void max_pool(const ref::Op&, const std::vector<Tensor>&, const Output&);
void average_pool(const ref::Op&, const std::vector<Tensor>&, const Output&);

// Normalisation and reductions (kernels_norm.cc).
void softmax(const ref::Op&, const std::vector<Tensor>&, const Output&);
void batch_normalization(const ref::Op&, const std::vector<Tensor>&, const Output&);
void layer_normalization(const ref::Op&, const std::vector<Tensor>&, const Output&);
void reduce_mean(const ref::Op&, const std::vector<Tensor>&, const Output&);
void reduce_sum(const ref::Op&, const std::vector<Tensor>&, const Output&);

// Data movement (kernels_data.cc).
void transpose(const ref::Op&, const std::vector<Tensor>&, const Output&);
void reshape(const ref::Op&, const std::vector<Tensor>&, const Output&);
void concat(const ref::Op&, const std::vector<Tensor>&, const Output&);
void slice(const ref::Op&, const std::vector<Tensor>&, const Output&);
void gather(const ref::Op&, const std::vector<Tensor>&, const Output&);

}  // namespace kernels

}  // namespace ctxgen::runtime
