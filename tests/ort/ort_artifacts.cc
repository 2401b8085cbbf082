#include "ort_artifacts.h"

#include <stdexcept>
#include <string>

#include "ctxgen/bytes.h"
#include "ctxgen/format.h"
#include "ctxgen/ref_identity.h"
#include "ctxgen/runtime.h"
#include "ctxgen/ref_program.h"
#include "test_util.h"

namespace fs = std::filesystem;

namespace ctxgen::ort_test {
namespace {

constexpr int32_t kFloat = 1;  // onnx::TensorProto::FLOAT

std::vector<float> ramp(size_t count, float start, float step) {
  std::vector<float> values(count);
  for (size_t i = 0; i < count; ++i) values[i] = start + step * static_cast<float>(i);
  return values;
}

const std::vector<float>& weight_w() {
  static const std::vector<float> w = ramp(6, -0.5f, 0.3f);
  return w;
}

const std::vector<float>& weight_w2() {
  static const std::vector<float> w2 = ramp(12, 0.6f, -0.15f);
  return w2;
}

ref::Value value(std::vector<int64_t> dims, ref::ValueKind kind, uint64_t index) {
  return {ref::DType::kFloat32, std::move(dims), kind, index};
}

ref::Op op(std::string type, std::vector<int32_t> inputs, std::vector<int32_t> outputs) {
  return {std::move(type), {}, std::move(inputs), std::move(outputs)};
}

IoSignature io(std::string name, std::vector<int64_t> dims) { return {std::move(name), kFloat, std::move(dims)}; }

CompiledGraph graph(std::string name, const ref::Program& program, std::vector<IoSignature> inputs,
                    std::vector<IoSignature> outputs, std::vector<uint32_t> weight_ids) {
  return {std::move(name),         std::move(inputs),     std::move(outputs),
          ref::serialize(program), std::move(weight_ids), program.ops.size(), {}};
}

// y = x + W; W is weight 0.
CompiledGraph add_graph() {
  ref::Program p;
  p.values = {value({2, 3}, ref::ValueKind::kInput, 0), value({2, 3}, ref::ValueKind::kWeight, 0),
              value({2, 3}, ref::ValueKind::kOutput, 0)};
  p.ops = {op("Add", {0, 1}, {2})};
  p.inputs = {0};
  p.outputs = {2};
  return graph("g_add", p, {io("x", {2, 3})}, {io("y", {2, 3})}, {0});
}

// y = Relu(x @ W2) through an arena intermediate; W2 is weight 1.
CompiledGraph matmul_relu_graph() {
  ref::Program p;
  p.values = {value({2, 3}, ref::ValueKind::kInput, 0), value({3, 4}, ref::ValueKind::kWeight, 1),
              value({2, 4}, ref::ValueKind::kArena, 0), value({2, 4}, ref::ValueKind::kOutput, 0)};
  p.ops = {op("MatMul", {0, 1}, {2}), op("Relu", {2}, {3})};
  p.arena_bytes = 64;
  p.inputs = {0};
  p.outputs = {3};
  return graph("g_mm", p, {io("x", {2, 3})}, {io("y", {2, 4})}, {1});
}

// s = a + b, r = Relu(a): two inputs and two outputs, for nodes that feed one value twice or
// leave an output unread.
CompiledGraph pair_graph() {
  ref::Program p;
  p.values = {value({2, 3}, ref::ValueKind::kInput, 0), value({2, 3}, ref::ValueKind::kInput, 1),
              value({2, 3}, ref::ValueKind::kOutput, 0), value({2, 3}, ref::ValueKind::kOutput, 1)};
  p.ops = {op("Add", {0, 1}, {2}), op("Relu", {0}, {3})};
  p.inputs = {0, 1};
  p.outputs = {2, 3};
  return graph("g_pair", p, {io("a", {2, 3}), io("b", {2, 3})}, {io("s", {2, 3}), io("r", {2, 3})}, {});
}

std::vector<uint8_t> float_bytes(const std::vector<float>& values) {
  const auto* data = reinterpret_cast<const uint8_t*>(values.data());
  return {data, data + values.size() * sizeof(float)};
}

WeightPayload weight(const std::vector<float>& values) {
  std::vector<uint8_t> bytes = float_bytes(values);
  const Hash128 hash = xxh3_128(bytes.data(), bytes.size());
  return {hash, Blob::owned(std::move(bytes))};
}

std::string as_string(const std::vector<uint8_t>& bytes) { return {bytes.begin(), bytes.end()}; }

std::string binary_bytes(const BinaryIdentity& identity) {
  std::string bytes;
  write_context_binary(identity, {add_graph(), matmul_relu_graph(), pair_graph()},
                       {weight(weight_w()), weight(weight_w2())},
                       [&](const uint8_t* data, size_t size) { bytes.append(reinterpret_cast<const char*>(data), size); });
  return bytes;
}

}  // namespace

std::vector<float> test_input() { return ramp(6, -1.0f, 0.45f); }

std::string compatibility_info() {
  return ctxgen::compatibility_info({ref::kEpName, ref::kSdkVersion, runtime::hardware_architecture()});
}

void make_artifacts(const fs::path& folder) {
  using testing::write_file;
  const BinaryIdentity ours{ref::kEpName, ref::kSdkVersion, runtime::hardware_architecture()};
  const std::string good = binary_bytes(ours);
  write_file(folder / "model_ref.bin", good);
  write_file(folder / "other_sdk.bin", binary_bytes({ref::kEpName, "ctxgen-ref 0.9", runtime::hardware_architecture()}));
  write_file(folder / "other_cpu.bin", binary_bytes({ref::kEpName, ref::kSdkVersion, kOtherCpu}));
  // The format version is the u32 at byte 8 (docs/context-binary-format.md).
  std::string future = good;
  future.at(8) = static_cast<char>(kContextBinaryVersion + 1);
  write_file(folder / "future_version.bin", future);
  write_file(folder / "empty.bin", "");
  write_file(folder / "W.raw", as_string(float_bytes(weight_w())));
  write_file(folder / "W2.raw", as_string(float_bytes(weight_w2())));
  fs::create_directories(folder / "sub");
  fs::create_directories(folder / "sub_link");
  fs::create_symlink("../model_ref.bin", folder / "sub_link" / "link.bin");
  // Links that stay inside the folder: one relative, one absolute.
  fs::create_symlink("model_ref.bin", folder / "relative_link.bin");
  fs::create_symlink(fs::absolute(folder / "model_ref.bin"), folder / "absolute_link.bin");
  fs::create_symlink("nowhere.bin", folder / "dangling.bin");

  using testing::quote;
  const std::string command = std::string(CTXGEN_PYTHON) + " " + quote(CTXGEN_ORT_MODEL_SCRIPT) + " " +
                              quote(folder) + " --ep-name " + quote(ref::kEpName) + " --sdk-version " +
                              quote(ref::kSdkVersion) + " --hardware " + quote(runtime::hardware_architecture()) +
                              " --compatibility-info " + quote(compatibility_info());
  const testing::CommandResult result = testing::run_command(command);
  if (result.exit_code != 0) throw std::runtime_error("failed: " + command + "\n" + result.output);
}

}  // namespace ctxgen::ort_test
