#pragma once
// Builds small ref programs by hand and runs them, for the runtime tests.

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <string>
#include <type_traits>
#include <vector>

#include "allocations.h"
#include "ctxgen/error.h"
#include "ctxgen/program_builder.h"
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
inline Bytes i32(const std::vector<int32_t>& v) { return bytes_of(v); }
// bool tensors hold one byte per element, 0 or 1.
inline Bytes b8(const std::vector<uint8_t>& v) { return v; }

// The element values of `bytes` read as T.
template <typename T>
std::vector<T> values_of(const Bytes& bytes) {
  std::vector<T> values(bytes.size() / sizeof(T));
  if (!values.empty()) std::memcpy(values.data(), bytes.data(), values.size() * sizeof(T));
  return values;
}

// The ref element type stored as T (bool as uint8_t; uint8, stored the same, is named by its dtype).
template <typename T>
constexpr ref::DType dtype_of() {
  if constexpr (std::is_same_v<T, float>) return ref::DType::kFloat32;
  else if constexpr (std::is_same_v<T, int32_t>) return ref::DType::kInt32;
  else if constexpr (std::is_same_v<T, int64_t>) return ref::DType::kInt64;
  else if constexpr (std::is_same_v<T, int8_t>) return ref::DType::kInt8;
  else if constexpr (std::is_same_v<T, int16_t>) return ref::DType::kInt16;
  else if constexpr (std::is_same_v<T, uint16_t>) return ref::DType::kUInt16;
  else {
    static_assert(std::is_same_v<T, uint8_t>, "float, int8/16/32/64_t, uint16_t or uint8_t (bool; uint8 by its dtype)");
    return ref::DType::kBool;
  }
}

using ref::ProgramBuilder;

// Runs every task on the calling thread, one after another: the kernels take their split paths
// without a thread pool's own allocations.
inline void serial_tasks(size_t tasks, const std::function<void(size_t)>& body) {
  for (size_t t = 0; t < tasks; ++t) body(t);
}

// Whether `program` runs a packed Conv or ConvTranspose, a QLinearConv, a ConvWeight, or a
// ConvInteger, MatMul or Gemm of a weight: oneDNN allocates inside each primitive call, and the
// memory objects around a buffer that moved are made again.
inline bool calls_onednn_primitive(const ref::Program& program) {
  for (const ref::Op& op : program.ops)
    if (((op.type == "Conv" || op.type == "ConvTranspose") && op.get_int("packed", 0) != 0) || op.type == "QLinearConv" ||
        op.type == "ConvWeight" ||
        ((op.type == "ConvInteger" || op.type == "MatMul" || op.type == "Gemm") &&
         program.values[static_cast<size_t>(op.inputs[1])].kind == ref::ValueKind::kWeight))
      return true;
  return false;
}

// Validates and runs `program`; returns the bytes of each output (sized from its dtype and dims,
// pre-filled with 0xAB so unwritten bytes show). Without `parallel`, the program runs a second
// time on other copies of the inputs into other outputs (as ONNX Runtime's buffers move from run
// to run; the first run's copies are overwritten, so a kernel still reading them shows), its
// kernels split into tasks (serial_tasks): that run must write the same bytes and, but for
// oneDNN's own primitive calls, allocate nothing (as every run after the first does).
inline std::vector<Bytes> run_bytes(const ref::Program& program, const std::vector<Bytes>& inputs,
                                    const std::vector<Bytes>& weights = {}, const runtime::ParallelFor& parallel = {}) {
  runtime::validate(program, weights.size());
  std::vector<Bytes> first = inputs;
  std::vector<const void*> in;
  for (const auto& b : first) in.push_back(b.data());
  std::vector<Bytes> outs, again;
  for (int32_t id : program.outputs)
    outs.emplace_back(static_cast<size_t>(program.values[static_cast<size_t>(id)].byte_size()), uint8_t{0xAB});
  again = outs;
  std::vector<void*> out, out_again;
  for (auto& o : outs) out.push_back(o.data());
  for (auto& o : again) out_again.push_back(o.data());
  runtime::PreparedProgram prepared(program, [&](uint32_t id) { return weights.at(id).data(); });
  prepared.run(in, out, parallel);
  if (!parallel) {
    const runtime::ParallelFor split = serial_tasks;
    for (auto& b : first) std::fill(b.begin(), b.end(), uint8_t{0xCD});
    const std::vector<Bytes> moved = inputs;
    std::vector<const void*> in_again;
    for (const auto& m : moved) in_again.push_back(m.data());
    const uint64_t before = allocations_so_far();
    prepared.run(in_again, out_again, split);
    const uint64_t allocated = allocations_so_far() - before;
    EXPECT_TRUE(allocated == 0 || calls_onednn_primitive(program)) << "a second run of the program allocated " << allocated << " times";
    EXPECT_EQ(again, outs) << "a second run, split into tasks, wrote other bytes";
  }
  return outs;
}

// Validates and runs `program`, whose outputs are float32; returns each output as floats.
inline std::vector<std::vector<float>> run(const ref::Program& program, const std::vector<Bytes>& inputs,
                                           const std::vector<Bytes>& weights = {}) {
  for (int32_t id : program.outputs)
    EXPECT_EQ(program.values[static_cast<size_t>(id)].dtype, ref::DType::kFloat32) << "run() reads float32 outputs only";
  std::vector<std::vector<float>> outs;
  for (const auto& b : run_bytes(program, inputs, weights)) outs.push_back(values_of<float>(b));
  return outs;
}

// One input of a one-op program.
struct In {
  Dims dims;
  Bytes data;
  ref::DType dtype = ref::DType::kFloat32;
};

// The output bytes of a one-op program: inputs given as (dims, bytes, dtype), an input with no
// dims and no bytes is absent; the output has `out_dims` and `out_dtype`.
inline Bytes run_op_bytes(const std::string& type, const std::vector<In>& inputs, const Dims& out_dims,
                          ref::DType out_dtype, std::vector<ref::Attr> attrs = {}) {
  ProgramBuilder b;
  std::vector<int32_t> ids;
  std::vector<Bytes> data;
  for (const auto& in : inputs) {
    ids.push_back(in.dims.empty() && in.data.empty() ? -1 : b.input(in.dims, in.dtype));
    if (ids.back() >= 0) data.push_back(in.data);
  }
  int32_t y = b.output(out_dims, out_dtype);
  b.op(type, ids, y, std::move(attrs));
  return run_bytes(b.program(), data)[0];
}

// A one-op program whose output is of the element type stored as T, its values read exactly.
template <typename T>
std::vector<T> run_op_as(const std::string& type, const std::vector<In>& inputs, const Dims& out_dims,
                         std::vector<ref::Attr> attrs = {}) {
  return values_of<T>(run_op_bytes(type, inputs, out_dims, dtype_of<T>(), std::move(attrs)));
}

inline std::vector<float> run_op(const std::string& type, const std::vector<In>& inputs, const Dims& out_dims,
                                 std::vector<ref::Attr> attrs = {}) {
  return run_op_as<float>(type, inputs, out_dims, std::move(attrs));
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
