#pragma once
// Running the built ctxgen on real files and reading what it wrote.

#include <gtest/gtest.h>

#include <onnx/checker.h>

#include <cctype>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "test_util.h"

namespace ctxgen::testing {

inline CommandResult ctxgen(const std::string& args) { return run_command(std::string(CTXGEN_BINARY) + " " + args); }

inline onnx::ModelProto load_proto(const fs::path& path) {
  onnx::ModelProto proto;
  EXPECT_TRUE(proto.ParseFromString(read_file(path))) << path;
  return proto;
}

inline std::set<std::string> files_in(const fs::path& dir) {
  std::set<std::string> names;
  for (const auto& e : fs::recursive_directory_iterator(dir)) names.insert(fs::relative(e.path(), dir).string());
  return names;
}

inline const onnx::AttributeProto* attribute(const onnx::NodeProto& node, const std::string& name) {
  for (const auto& a : node.attribute())
    if (a.name() == name) return &a;
  return nullptr;
}

inline std::vector<const onnx::NodeProto*> epcontext_nodes(const onnx::ModelProto& model) {
  std::vector<const onnx::NodeProto*> nodes;
  for (const auto& n : model.graph().node())
    if (n.op_type() == "EPContext") nodes.push_back(&n);
  return nodes;
}

// Every file under `dir`, by its path relative to it, with its bytes.
inline std::map<std::string, std::string> file_contents(const fs::path& dir) {
  std::map<std::string, std::string> files;
  for (const auto& name : files_in(dir)) files[name] = read_file(dir / name);
  return files;
}

// The same files with the same bytes.
inline void expect_same_files(const std::map<std::string, std::string>& a, const std::map<std::string, std::string>& b) {
  ASSERT_FALSE(a.empty());
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [name, bytes] : a) {
    ASSERT_TRUE(b.count(name)) << name << " is missing";
    EXPECT_TRUE(b.at(name) == bytes) << name << " differs";
  }
}

// A share group of testdata's float, float16 and quantized models.
inline std::vector<fs::path> mixed_group() {
  const fs::path exports = fs::path(CTXGEN_SOURCE_DIR) / "testdata" / "exports";
  const fs::path quantized = fs::path(CTXGEN_SOURCE_DIR) / "testdata" / "quantized";
  return {exports / "decoder_prefill.onnx", exports / "decoder_decode.onnx", exports / "cnn_upsample.onnx",
          quantized / "cnn_upsample_fp16.onnx", quantized / "cnn_upsample_qdq_u8s8.onnx",
          quantized / "decoder_prefill_matmulnbits.onnx"};
}
// Its dims, scoped to the models' stems (each after `prefix`); with `decode`, the decode step's
// too (without them its nodes stay on CPU).
inline std::string mixed_group_shapes(const std::string& prefix = "", bool decode = true) {
  return "--fix-dim batch=1 --fix-dim " + prefix + "decoder_prefill:seq=16 --fix-dim " + prefix +
         "decoder_prefill_matmulnbits:seq=16" +
         (decode ? " --fix-dim " + prefix + "decoder_decode:seq=1 --fix-dim " + prefix + "decoder_decode:past=15" : "");
}

// Copies a generated model (and its external data) into `dir`.
inline fs::path copy_model(const std::string& name, const fs::path& dir) {
  fs::create_directories(dir);
  fs::copy_file(generated_models() / name, dir / fs::path(name).filename(), fs::copy_options::overwrite_existing);
  // External data: <stem>.weights beside the model.
  const fs::path data = generated_models() / fs::path(name).parent_path() / (fs::path(name).stem().string() + ".weights");
  if (fs::exists(data)) fs::copy_file(data, dir / data.filename(), fs::copy_options::overwrite_existing);
  return dir / fs::path(name).filename();
}

// `output` without the progress lines a run prints on stderr when it is not a terminal
// ("[1/2] load m.onnx").
inline std::string without_progress(const std::string& output) {
  std::string kept, line;
  for (size_t at = 0; at < output.size();) {
    size_t end = output.find('\n', at);
    end = end == std::string::npos ? output.size() : end + 1;
    line = output.substr(at, end - at);
    if (!(line.size() > 1 && line[0] == '[' && std::isdigit(static_cast<unsigned char>(line[1])))) kept += line;
    at = end;
  }
  return kept;
}

// Validates a JSON file (or "-": `stdin_text`) against a JSON Schema, with python3-jsonschema.
inline void expect_valid_json(const fs::path& schema, const fs::path& json, const std::string& stdin_text = "") {
  std::string command = std::string(CTXGEN_PYTHON) + " " + CTXGEN_SOURCE_DIR "/tests/support/validate_json.py " +
                        quote(schema) + " " + quote(json);
  TempDir dir;
  if (!stdin_text.empty()) {
    write_file(dir / "stdin.json", stdin_text);
    command += " < " + quote(dir / "stdin.json");
  }
  auto r = run_command(command);
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

}  // namespace ctxgen::testing
