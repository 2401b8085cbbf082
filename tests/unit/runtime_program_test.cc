// The program encoding: round trip, and damaged encodings rejected with Error(kInvalidBinary)
// instead of crashing; corruptions that still decode and validate must run without faults.

#include <algorithm>
#include <cstring>
#include <map>
#include <limits>

#include "runtime_test_util.h"

namespace ctxgen::testing {
namespace {

// Every attribute kind, an optional input, int64 values and all four value kinds.
ref::Program sample() {
  ProgramBuilder b;
  int32_t x = b.input({2, 3});
  int32_t idx = b.input({2}, ref::DType::kInt64);
  int32_t w = b.weight({3, 2}, 0);
  int32_t t = b.arena({2, 2});
  int32_t g = b.arena({2, 2});
  int32_t y = b.output({2, 2});
  b.op("Gemm", {x, w, -1}, t,
       {int_attr("transA", 0), int_attr("transB", 0), float_attr("alpha", 1.5f), float_attr("beta", 1)});
  b.op("Gather", {t, idx}, g, {int_attr("axis", 0)});
  b.op("Slice", {g}, y, {ints_attr("starts", {1, 0}), ints_attr("steps", {-1, 1}), ints_attr("sizes", {2, 2})});
  ref::Attr floats;
  floats.name = "unused";
  floats.kind = ref::Attr::Kind::kFloats;
  floats.floats = {0.5f, -2};
  b.program().ops[0].attrs.push_back(floats);
  return b.program();
}

const std::vector<Bytes> kWeights = {f32({1, 0, 0, 1, 1, 1})};

enum class Outcome { kRejected, kRan, kSkipped };

// Runs a program that decoded and validated, with buffers sized from its own values and followed
// by canary bytes, so a write past any buffer shows without a sanitizer (and under ASan, which the
// sanitize label runs, any stray read or write does). Skips programs whose tensors a damaged dim
// made huge.
Outcome run_if_small(const ref::Program& p) {
  constexpr size_t kCanary = 64;
  constexpr uint8_t kCanaryByte = 0xCD;
  auto too_big = [](uint64_t size) { return size > (1u << 20); };
  std::vector<Bytes> inputs, outputs;
  for (int32_t id : p.inputs) {
    uint64_t size = p.values[static_cast<size_t>(id)].byte_size();
    if (too_big(size)) return Outcome::kSkipped;
    inputs.emplace_back(size + kCanary, kCanaryByte);
  }
  for (const auto& v : p.values)
    if (v.kind == ref::ValueKind::kWeight && v.byte_size() > kWeights[0].size()) return Outcome::kSkipped;  // sizes come from the binary
  if (too_big(p.arena_bytes)) return Outcome::kSkipped;
  for (int32_t id : p.outputs) {
    uint64_t size = p.values[static_cast<size_t>(id)].byte_size();
    if (too_big(size)) return Outcome::kSkipped;
    outputs.emplace_back(size + kCanary, kCanaryByte);
  }
  std::vector<const void*> in;
  for (auto& b : inputs) {
    std::fill(b.begin(), b.end() - kCanary, uint8_t{0});
    in.push_back(b.data());
  }
  std::vector<void*> out;
  for (auto& b : outputs) out.push_back(b.data());
  try {
    runtime::execute(p, [&](uint32_t id) { return kWeights.at(id).data(); }, in, out);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kRuntime) << e.what();
  }
  for (const auto* list : {&inputs, &outputs})
    for (const auto& b : *list)
      EXPECT_TRUE(std::all_of(b.end() - kCanary, b.end(), [&](uint8_t c) { return c == kCanaryByte; }))
          << "a kernel wrote past a buffer";
  return Outcome::kRan;
}

Outcome decode_and_run(const Bytes& bytes) {
  ref::Program p;
  try {
    p = ref::deserialize(bytes.data(), bytes.size());
    runtime::validate(p, kWeights.size());
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidBinary) << e.what();
    return Outcome::kRejected;
  }
  return run_if_small(p);
}

TEST(RuntimeProgram, RoundTripKeepsEveryField) {
  ref::Program p = sample();
  Bytes bytes = ref::serialize(p);
  ref::Program q = ref::deserialize(bytes.data(), bytes.size());
  ASSERT_EQ(q.values.size(), p.values.size());
  for (size_t i = 0; i < p.values.size(); ++i) {
    EXPECT_EQ(q.values[i].dtype, p.values[i].dtype);
    EXPECT_EQ(q.values[i].kind, p.values[i].kind);
    EXPECT_EQ(q.values[i].index, p.values[i].index);
    EXPECT_EQ(q.values[i].dims, p.values[i].dims);
  }
  ASSERT_EQ(q.ops.size(), p.ops.size());
  for (size_t k = 0; k < p.ops.size(); ++k) {
    EXPECT_EQ(q.ops[k].type, p.ops[k].type);
    EXPECT_EQ(q.ops[k].inputs, p.ops[k].inputs);
    EXPECT_EQ(q.ops[k].outputs, p.ops[k].outputs);
    ASSERT_EQ(q.ops[k].attrs.size(), p.ops[k].attrs.size());
    for (size_t a = 0; a < p.ops[k].attrs.size(); ++a) {
      const auto &x = q.ops[k].attrs[a], &y = p.ops[k].attrs[a];
      EXPECT_EQ(x.name, y.name);
      EXPECT_EQ(x.kind, y.kind);
      EXPECT_EQ(x.i, y.i);
      EXPECT_EQ(x.f, y.f);
      EXPECT_EQ(x.ints, y.ints);
      EXPECT_EQ(x.floats, y.floats);
    }
  }
  EXPECT_EQ(q.arena_bytes, p.arena_bytes);
  EXPECT_EQ(q.inputs, p.inputs);
  EXPECT_EQ(q.outputs, p.outputs);
  EXPECT_EQ(ref::serialize(q), bytes);
  // And it runs: Gemm [[1,2,3],[4,5,6]] x [[1,0],[0,1],[1,1]] * 1.5 = [[6,7.5],[15,16.5]],
  // Gather rows [1,0], Slice reverses the rows again.
  auto out = run(q, {f32({1, 2, 3, 4, 5, 6}), i64({1, 0})}, kWeights);
  expect_near(out[0], {6, 7.5f, 15, 16.5f});
}

// int32 and bool values survive the encoding, and codes that are no DType are refused.
TEST(RuntimeProgram, ElementTypesRoundTrip) {
  ProgramBuilder b;
  int32_t x = b.input({3}, ref::DType::kInt32);
  int32_t m = b.arena({3}, -1, ref::DType::kBool);
  int32_t y = b.output({3}, ref::DType::kBool);
  b.op("Cast", {x}, m, {int_attr("to", static_cast<int64_t>(ref::DType::kBool))});
  b.op("Not", {m}, y);
  Bytes bytes = ref::serialize(b.program());
  ref::Program q = ref::deserialize(bytes.data(), bytes.size());
  ASSERT_EQ(q.values.size(), 3u);
  EXPECT_EQ(q.values[0].dtype, ref::DType::kInt32);
  EXPECT_EQ(q.values[1].dtype, ref::DType::kBool);
  EXPECT_EQ(q.values[2].dtype, ref::DType::kBool);
  EXPECT_EQ(q.values[1].byte_size(), 3u);
  EXPECT_EQ(run_bytes(q, {i32({0, -5, 1})})[0], (Bytes{1, 0, 0}));
  EXPECT_EQ(ref::dtype_size(ref::DType::kFloat32), 4u);
  EXPECT_EQ(ref::dtype_size(ref::DType::kInt32), 4u);
  EXPECT_EQ(ref::dtype_size(ref::DType::kInt64), 8u);
  EXPECT_EQ(ref::dtype_size(ref::DType::kBool), 1u);
  EXPECT_EQ(ref::dtype_size(ref::DType::kUInt8), 1u);
  EXPECT_EQ(ref::dtype_size(ref::DType::kInt8), 1u);
  EXPECT_EQ(ref::dtype_size(ref::DType::kUInt16), 2u);
  EXPECT_EQ(ref::dtype_size(ref::DType::kInt16), 2u);
  EXPECT_EQ(ref::dtype_size(static_cast<ref::DType>(8)), 0u);
  EXPECT_EQ(ref::dtype_name(ref::DType::kInt32), "int32");
  EXPECT_EQ(ref::dtype_name(ref::DType::kBool), "bool");
  EXPECT_EQ(ref::dtype_name(ref::DType::kUInt16), "uint16");
  // The first value's dtype is byte 12 (after magic, version and value count).
  EXPECT_EQ(ref::dtype_size(ref::DType::kFloat16), 2u);
  EXPECT_EQ(ref::dtype_name(ref::DType::kBFloat16), "bfloat16");
  for (uint8_t code : {uint8_t{0}, uint8_t{8}, uint8_t{11}, uint8_t{17}}) {
    Bytes bad = bytes;
    bad[12] = code;
    expect_error([&] { ref::deserialize(bad.data(), bad.size()); }, ErrorCode::kInvalidBinary,
                 "value 0 has unknown dtype " + std::to_string(code));
  }
}

TEST(RuntimeProgram, EveryTruncationIsRejected) {
  Bytes bytes = ref::serialize(sample());
  for (size_t n = 0; n < bytes.size(); ++n)
    expect_error([&] { ref::deserialize(bytes.data(), n); }, ErrorCode::kInvalidBinary, "ref program");
}

TEST(RuntimeProgram, HeaderAndTrailerDamageIsRejected) {
  Bytes bytes = ref::serialize(sample());
  Bytes bad = bytes;
  bad[0] = 'X';
  expect_error([&] { ref::deserialize(bad.data(), bad.size()); }, ErrorCode::kInvalidBinary, "bad magic");
  bad = bytes;
  bad[4] = 1;  // programs of the previous encoding (no int32/bool, no Reshape `shape`) are refused
  expect_error([&] { ref::deserialize(bad.data(), bad.size()); }, ErrorCode::kInvalidBinary,
               "encoding version 1, this build reads version 2");
  bad = bytes;
  bad[4] = 3;
  expect_error([&] { ref::deserialize(bad.data(), bad.size()); }, ErrorCode::kInvalidBinary,
               "encoding version 3, this build reads version 2");
  bad = bytes;
  bad.push_back(0);
  expect_error([&] { ref::deserialize(bad.data(), bad.size()); }, ErrorCode::kInvalidBinary,
               "1 unexpected bytes after the program");
}

TEST(RuntimeProgram, FlippedCountsAreRejected) {
  Bytes bytes = ref::serialize(sample());
  Bytes bad = bytes;
  std::memset(bad.data() + 8, 0xff, 4);  // value count
  expect_error([&] { ref::deserialize(bad.data(), bad.size()); }, ErrorCode::kInvalidBinary,
               "value count 4294967295 does not fit");
  bad = bytes;
  // First value: dtype, kind, index (8), dims count at byte 12 + 10.
  std::memset(bad.data() + 22, 0x7f, 4);
  expect_error([&] { ref::deserialize(bad.data(), bad.size()); }, ErrorCode::kInvalidBinary, "value dims count");
}

TEST(RuntimeProgram, BadIdsAreRejected) {
  ref::Program p = sample();
  p.ops[1].inputs[1] = 6;
  Bytes bytes = ref::serialize(p);
  expect_error([&] { ref::deserialize(bytes.data(), bytes.size()); }, ErrorCode::kInvalidBinary,
               "op 1 (Gather) input refers to value 6, the program has 6");
  p = sample();
  p.outputs[0] = -3;
  bytes = ref::serialize(p);
  expect_error([&] { ref::deserialize(bytes.data(), bytes.size()); }, ErrorCode::kInvalidBinary,
               "graph output refers to value -3");
  p = sample();
  p.ops[0].outputs[0] = -1;  // -1 means "absent" for inputs only
  bytes = ref::serialize(p);
  expect_error([&] { ref::deserialize(bytes.data(), bytes.size()); }, ErrorCode::kInvalidBinary,
               "op 0 (Gemm) output refers to value -1");
}

// Every single-byte corruption (three patterns per byte) either fails to decode or validate with
// Error(kInvalidBinary), or runs without writing past its buffers (canaries here; any stray access
// under ASan in the sanitize label). Both outcomes must occur, or the test proves nothing.
TEST(RuntimeProgram, EveryByteCorruptionIsRejectedOrRunsSafely) {
  const Bytes bytes = ref::serialize(sample());
  std::map<Outcome, int> outcomes;
  for (size_t at = 0; at < bytes.size(); ++at)
    for (uint8_t pattern : {uint8_t{0x01}, uint8_t{0x80}, uint8_t{0xff}}) {
      Bytes bad = bytes;
      bad[at] ^= pattern;
      SCOPED_TRACE("byte " + std::to_string(at) + " ^ " + std::to_string(pattern));
      ++outcomes[decode_and_run(bad)];
    }
  EXPECT_GT(outcomes[Outcome::kRejected], 100);
  EXPECT_GT(outcomes[Outcome::kRan], 10);
}

}  // namespace
}  // namespace ctxgen::testing
