#pragma once
// Builds ref programs by hand, value by value and op by op: what the runtime's tests and kernel
// benchmarks run, without the compiler in between.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "ctxgen/ref_program.h"

namespace ctxgen::ref {

class ProgramBuilder {
 public:
  using Dims = std::vector<int64_t>;

  int32_t input(Dims dims, ref::DType dtype = ref::DType::kFloat32) {
    int32_t id = add(std::move(dims), ref::ValueKind::kInput, p_.inputs.size(), dtype);
    p_.inputs.push_back(id);
    return id;
  }
  int32_t output(Dims dims, ref::DType dtype = ref::DType::kFloat32) {
    int32_t id = add(std::move(dims), ref::ValueKind::kOutput, p_.outputs.size(), dtype);
    p_.outputs.push_back(id);
    return id;
  }
  int32_t weight(Dims dims, uint64_t weight_id, ref::DType dtype = ref::DType::kFloat32) {
    return add(std::move(dims), ref::ValueKind::kWeight, weight_id, dtype);
  }
  // An arena value after every other one, or at `offset` (to share bytes with another value).
  int32_t arena(Dims dims, int64_t offset = -1, ref::DType dtype = ref::DType::kFloat32) {
    ref::Value v;
    v.dtype = dtype;
    v.dims = dims;
    uint64_t at = offset >= 0 ? static_cast<uint64_t>(offset) : p_.arena_bytes;
    uint64_t end = (at + v.byte_size() + 63) / 64 * 64;
    if (end > p_.arena_bytes) p_.arena_bytes = end;
    return add(std::move(dims), ref::ValueKind::kArena, at, dtype);
  }
  ref::Op& op(const std::string& type, std::vector<int32_t> inputs, int32_t output, std::vector<ref::Attr> attrs = {}) {
    ref::Op o;
    o.type = type;
    o.inputs = std::move(inputs);
    o.outputs = {output};
    o.attrs = std::move(attrs);
    p_.ops.push_back(std::move(o));
    return p_.ops.back();
  }
  ref::Program& program() { return p_; }

 private:
  int32_t add(Dims dims, ref::ValueKind kind, uint64_t index, ref::DType dtype) {
    ref::Value v;
    v.dtype = dtype;
    v.dims = std::move(dims);
    v.kind = kind;
    v.index = index;
    p_.values.push_back(std::move(v));
    return static_cast<int32_t>(p_.values.size() - 1);
  }
  ref::Program p_;
};

}  // namespace ctxgen::ref
