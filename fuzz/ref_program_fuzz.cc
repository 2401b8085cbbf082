// The ref program decoder, validator and executor on arbitrary bytes: a program is either refused
// with Error, or it runs (or fails with Error) without touching memory outside its buffers and in
// time bounded by what validate() accepted.
#include <cstdint>
#include <cstring>
#include <vector>

#include "ctxgen/error.h"
#include "ctxgen/ref_program.h"
#include "ctxgen/runtime.h"

namespace {

constexpr size_t kWeightCount = 4;
// Programs whose buffers need more than this are validated but not run, to keep the fuzzer fast;
// the byte count is what a caller would have to allocate anyway.
constexpr uint64_t kMaxRunBytes = uint64_t{1} << 24;

// Inputs and weights hold bytes of the program itself: small integers, zeros and odd floats, so
// index checks in the kernels meet both valid and invalid indices.
std::vector<uint8_t> filled(uint64_t size, const uint8_t* data, size_t data_size) {
  std::vector<uint8_t> bytes(size);
  for (uint64_t i = 0; i < size; ++i) bytes[i] = data_size == 0 ? 0 : data[i % data_size] % 8;
  return bytes;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ctxgen::ref::Program program;
  try {
    program = ctxgen::ref::deserialize(data, size);
    ctxgen::runtime::validate(program, kWeightCount);
  } catch (const ctxgen::Error&) {
    return 0;
  }
  uint64_t total = program.arena_bytes;
  std::vector<uint64_t> weight_bytes(kWeightCount, 0);
  for (const auto& v : program.values) {
    total += v.byte_size();
    if (v.kind == ctxgen::ref::ValueKind::kWeight) weight_bytes[v.index] = std::max(weight_bytes[v.index], v.byte_size());
  }
  if (total > kMaxRunBytes) return 0;

  std::vector<std::vector<uint8_t>> weights, inputs, outputs;
  for (uint64_t bytes : weight_bytes) weights.push_back(filled(bytes, data, size));
  std::vector<const void*> input_ptrs;
  std::vector<void*> output_ptrs;
  for (int32_t id : program.inputs) {
    inputs.push_back(filled(program.values[static_cast<size_t>(id)].byte_size(), data, size));
    input_ptrs.push_back(inputs.back().data());
  }
  for (int32_t id : program.outputs) {
    outputs.emplace_back(program.values[static_cast<size_t>(id)].byte_size());
    output_ptrs.push_back(outputs.back().data());
  }
  try {
    ctxgen::runtime::execute(program, [&](uint32_t id) { return weights[id].data(); }, input_ptrs, output_ptrs);
  } catch (const ctxgen::Error&) {
  }
  return 0;
}
