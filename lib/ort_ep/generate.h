#pragma once
// Generating EPContext models inside ONNX Runtime (ep.context_enable=1, as ORT's Compile API sets
// it): where the context binary goes, the workspace the sessions of a shared group compile into,
// and the EPContext nodes handed back to ORT, which writes the model around them.

#include <onnxruntime_c_api.h>

#include <filesystem>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "ctxgen/compiled.h"
#include "ctxgen/epcontext.h"
#include "ctxgen/weights.h"

namespace ctxgen::ort_ep {

// What the compiling sessions of a shared group (ep.share_ep_contexts=1) build together: one weight
// store, deduplicated by content exactly as `ctxgen share` does, and every session's graphs. The
// group's first session names the binary; the last (ep.stop_share_ep_contexts=1) writes it and
// empties the workspace for the next group.
struct CompileWorkspace {
  WeightStore store;
  std::vector<CompiledGraph> graphs;
  std::filesystem::path binary;  // empty until the group's first session names it
};

// The process's workspace, held for the caller until `lock` goes.
struct HeldWorkspace {
  std::unique_lock<std::mutex> lock;
  CompileWorkspace& workspace;
};
HeldWorkspace shared_workspace();

// Where a generating session's outputs go: the EPContext model ORT writes (ep.context_file_path,
// else the input model's path minus its extension plus _ctx.onnx), and beside it the binary, named
// as the CLI names it: <input stem>_<backend>.bin for the default model name, else after the
// model (out/app.onnx -> out/app_<backend>.bin). An existing binary of that name is replaced, as
// ORT's own EPs replace theirs. Both are empty for a model loaded from memory without
// ep.context_file_path (it can only embed its context).
struct GenerationPaths {
  std::filesystem::path model;
  std::filesystem::path binary;
  std::string stem;  // the input model's file name without its extension: graph names start with it
  // Throws Error(kUsage) saying what to set when there is no binary path.
  const std::filesystem::path& binary_or_throw() const;
};
GenerationPaths generation_paths(const std::string& input_model, const std::optional<std::string>& context_file_path,
                                 const std::string& backend_name);

// The EPContext node of `graph` (lib/epcontext's epcontext_node) as an OrtNode for ORT to place
// where the fused node `node_name` is: ORT matches the two by name, so the node takes the fused
// node's name and names its graph in partition_name.
OrtNode* create_ep_context_node(const CompiledGraph& graph, const std::string& node_name, bool main,
                                const EpContextSettings& settings, const std::string& model_filename);

}  // namespace ctxgen::ort_ep
