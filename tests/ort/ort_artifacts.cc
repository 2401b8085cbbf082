#include "ort_artifacts.h"

#include <cstdlib>
#include <fstream>
#include <stdexcept>
#include <string>

#include "ctxgen/bytes.h"
#include "ctxgen/format.h"
#include "ctxgen/ref_identity.h"
#include "ctxgen/ref_program.h"

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

CompiledGraph graph(std::string name, const ref::Program& program, std::vector<int64_t> in_dims,
                    std::vector<int64_t> out_dims, uint32_t weight_id) {
  return {std::move(name),          {{"x", kFloat, std::move(in_dims)}}, {{"y", kFloat, std::move(out_dims)}},
          ref::serialize(program), {weight_id},                          program.ops.size()};
}

// y = x + W; W is weight 0.
CompiledGraph add_graph() {
  ref::Program p;
  p.values = {value({2, 3}, ref::ValueKind::kInput, 0), value({2, 3}, ref::ValueKind::kWeight, 0),
              value({2, 3}, ref::ValueKind::kOutput, 0)};
  p.ops = {op("Add", {0, 1}, {2})};
  p.inputs = {0};
  p.outputs = {2};
  return graph("g_add", p, {2, 3}, {2, 3}, 0);
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
  return graph("g_mm", p, {2, 3}, {2, 4}, 1);
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

void write_file(const fs::path& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw std::runtime_error("cannot write " + path.string());
}

std::vector<uint8_t> binary_bytes(const BinaryIdentity& identity) {
  std::vector<uint8_t> bytes;
  write_context_binary(identity, {add_graph(), matmul_relu_graph()}, {weight(weight_w()), weight(weight_w2())},
                       [&](const uint8_t* data, size_t size) { bytes.insert(bytes.end(), data, data + size); });
  return bytes;
}

std::string quoted(const std::string& text) { return "'" + text + "'"; }

}  // namespace

std::vector<float> test_input() { return ramp(6, -1.0f, 0.45f); }

fs::path make_artifacts() {
  std::string pattern = (fs::temp_directory_path() / "ctxgen-ort-XXXXXX").string();
  if (mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed for " + pattern);
  const fs::path folder = pattern;

  const BinaryIdentity ours{ref::kEpName, ref::kSdkVersion, ref::kHardwareArchitecture};
  const std::vector<uint8_t> good = binary_bytes(ours);
  write_file(folder / "model_ref.bin", good);
  write_file(folder / "other_sdk.bin", binary_bytes({ref::kEpName, "ctxgen-ref 0.9", ref::kHardwareArchitecture}));
  // The format version is the u32 at byte 8 (docs/context-binary-format.md).
  std::vector<uint8_t> future = good;
  future.at(8) = 2;
  write_file(folder / "future_version.bin", future);
  write_file(folder / "empty.bin", {});
  write_file(folder / "W.raw", float_bytes(weight_w()));
  write_file(folder / "W2.raw", float_bytes(weight_w2()));
  fs::create_directories(folder / "sub");
  fs::create_directories(folder / "sub_link");
  fs::create_symlink("../model_ref.bin", folder / "sub_link" / "link.bin");

  const std::string command = std::string(CTXGEN_PYTHON) + " " + quoted(CTXGEN_ORT_MODEL_SCRIPT) + " " +
                              quoted(folder.string()) + " --ep-name " + quoted(ref::kEpName) +
                              " --sdk-version " + quoted(ref::kSdkVersion) + " --hardware " +
                              quoted(ref::kHardwareArchitecture);
  if (std::system(command.c_str()) != 0) throw std::runtime_error("failed: " + command);
  return folder;
}

}  // namespace ctxgen::ort_test
