#pragma once
// Builds small ref programs by hand and runs them, for the runtime tests.

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "ctxgen/error.h"
#include "ctxgen/ref_program.h"
#include "ctxgen/runtime.h"

namespace ctxgen::testing {

using Dims = std::vector<int64_t>;
using Bytes = std::vector<uint8_t>;

using ref::float_attr;
using ref::int_attr;
using ref::ints_attr;

template <typename T>
Bytes bytes_of(const std::vector<T>& values) {
  Bytes b(values.size() * sizeof(T));
  if (!b.empty()) std::memcpy(b.data(), values.data(), b.size());
  return b;
}
inline Bytes f32(const std::vector<float>& v) { return bytes_of(v); }
inline Bytes i64(const std::vector<int64_t>& v) { return bytes_of(v); }

class ProgramBuilder {
 public:
  int32_t input(Dims dims, ref::DType dtype = ref::DType::kFloat32) {
    int32_t id = add(std::move(dims), ref::ValueKind::kInput, p_.inputs.size(), dtype);
    p_.inputs.push_back(id);
    return id;
  }
  int32_t output(Dims dims) {
    int32_t id = add(std::move(dims), ref::ValueKind::kOutput, p_.outputs.size(), ref::DType::kFloat32);
    p_.outputs.push_back(id);
    return id;
  }
  int32_t weight(Dims dims, uint64_t weight_id, ref::DType dtype = ref::DType::kFloat32) {
    return add(std::move(dims), ref::ValueKind::kWeight, weight_id, dtype);
  }
  // An arena value after every other one, or at `offset` (to share bytes with another value).
  int32_t arena(Dims dims, int64_t offset = -1) {
    ref::Value v;
    v.dims = dims;
    uint64_t at = offset >= 0 ? static_cast<uint64_t>(offset) : p_.arena_bytes;
    uint64_t end = (at + v.byte_size() + 63) / 64 * 64;
    if (end > p_.arena_bytes) p_.arena_bytes = end;
    return add(std::move(dims), ref::ValueKind::kArena, at, ref::DType::kFloat32);
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

// Validates and runs `program`; returns each output as floats.
inline std::vector<std::vector<float>> run(const ref::Program& program, const std::vector<Bytes>& inputs,
                                           const std::vector<Bytes>& weights = {}) {
  runtime::validate(program, weights.size());
  std::vector<const void*> in;
  for (const auto& b : inputs) in.push_back(b.data());
  std::vector<std::vector<float>> outs;
  for (int32_t id : program.outputs)
    outs.emplace_back(static_cast<size_t>(program.values[static_cast<size_t>(id)].element_count()), -12345.0f);
  std::vector<void*> out;
  for (auto& o : outs) out.push_back(o.data());
  std::vector<uint8_t> arena;
  runtime::execute(program, [&](uint32_t id) { return weights.at(id).data(); }, in, out, arena);
  return outs;
}

// Runs a one-op program: inputs given as (dims, bytes), with `out_dims`.
struct In {
  Dims dims;
  Bytes data;
  ref::DType dtype = ref::DType::kFloat32;
};

inline std::vector<float> run_op(const std::string& type, const std::vector<In>& inputs, const Dims& out_dims,
                                 std::vector<ref::Attr> attrs = {}) {
  ProgramBuilder b;
  std::vector<int32_t> ids;
  std::vector<Bytes> data;
  for (const auto& in : inputs) {
    ids.push_back(in.dims.empty() && in.data.empty() ? -1 : b.input(in.dims, in.dtype));
    if (ids.back() >= 0) data.push_back(in.data);
  }
  int32_t y = b.output(out_dims);
  b.op(type, ids, y, std::move(attrs));
  return run(b.program(), data)[0];
}

inline void expect_near(const std::vector<float>& got, const std::vector<float>& want, float tol = 1e-5f) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], tol) << "element " << i;
}

// Runs `f`, expecting Error with `code` whose message contains `part`.
template <typename F>
void expect_error(F&& f, ErrorCode code, const std::string& part) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one containing '" << part << "'";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

}  // namespace ctxgen::testing
