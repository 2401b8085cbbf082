#pragma once
// What the interop tests need from ONNX Runtime: one process-wide environment with the ctxgen
// plugin EP registered (or not), sessions that use it, runs, and the plugin's counters.

#include <onnxruntime_cxx_api.h>

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace ctxgen::ort_test {

struct PluginStats {
  uint64_t opened = 0, live = 0;
};

class Plugin {
 public:
  static Ort::Env& env();
  // Registers the plugin library with the environment (idempotent).
  static void register_library();
  // Unregisters it; no session using it may exist.
  static void unregister_library();
  // The plugin's OrtEpDevice; registers the library first.
  static Ort::ConstEpDevice device();
  static PluginStats stats();
  // The library under test: the full one, or with CTXGEN_TEST_RUNTIME_ONLY=1 in the environment
  // the runtime-only one (the tests that only run compiled models pass with either).
  static const char* library();
};

// A device whose hardware metadata says is_virtual=1 (offered when virtual devices are allowed).
bool is_virtual(const Ort::ConstEpDevice& device);

using Config = std::map<std::string, std::string>;

// Session options with the plugin EP appended and `config` as session config entries.
Ort::SessionOptions plugin_options(const Config& config = {});

Ort::Session open_session(const std::filesystem::path& model, const Ort::SessionOptions& options);

// Runs a model with one input "X" (float, `dims`) and one output "Y"; returns Y.
std::vector<float> run(Ort::Session& session, const std::vector<float>& x,
                       const std::vector<int64_t>& dims = {2, 3});

// ORT's CPU EP on a plain ONNX model: the reference outputs.
std::vector<float> run_on_cpu(const std::filesystem::path& model, const std::vector<float>& x);

// Deterministic values for every input of `session`, shaped as it declares them (static shapes).
struct Feeds {
  std::vector<std::string> names;
  std::vector<Ort::Value> values;
};
Feeds make_feeds(Ort::Session& session);

// Runs `session` on `feeds`; returns every output, in the session's order, with its name.
struct Fetched {
  std::vector<std::string> names;
  std::vector<Ort::Value> values;
};
Fetched run_all(Ort::Session& session, const Feeds& feeds);

// Copies a model testdata/generate.py made (name relative to its output), with its external data,
// into `folder` (made if needed); returns the copy's path.
std::filesystem::path copy_model(const std::string& name, const std::filesystem::path& folder);

// The names of the files in `folder`.
std::set<std::string> files_in(const std::filesystem::path& folder);

// Every output of `actual` equals, within 1e-4 relative, the same-named output ORT's CPU EP
// computes on `original` from the same feeds (make_feeds); float outputs only.
void expect_matches_original(Ort::Session& actual, const std::filesystem::path& original);

// What ORT assigned to CtxgenRef (its fused subgraphs and the nodes in them), and the names of
// the nodes it left to other EPs; the session must record it (session.record_ep_graph_assignment_info=1).
struct Assigned {
  size_t subgraphs = 0;
  size_t nodes = 0;
  std::set<std::string> elsewhere;
};
Assigned assigned_to_ctxgen(const Ort::Session& session);

struct Failure {
  OrtErrorCode code = ORT_OK;
  std::string message;
};
// The error of creating a session, or nullopt when it succeeds.
std::optional<Failure> session_failure(const std::filesystem::path& model, const Ort::SessionOptions& options);
std::optional<Failure> session_failure(const std::vector<char>& model_bytes, const Ort::SessionOptions& options);

std::vector<char> read_bytes(const std::filesystem::path& path);

}  // namespace ctxgen::ort_test
