#pragma once
// The EPContext nodes this EP owns: recognising them, reading their attributes, and checking what
// they and their context binaries claim about who made them against this build.

#include <onnxruntime_c_api.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ctxgen/backend_runtime.h"
#include "ctxgen/compiled.h"
#include "ctxgen/format.h"

namespace ctxgen::ort_ep {

// True for an EPContext node (domain com.microsoft) whose `source` is this EP.
bool is_our_ep_context_node(const OrtNode* node);

struct EpContextNode {
  std::string name;
  bool main_context = true;
  bool embed_mode = true;
  std::string cache_context;  // payload in embed mode, else a path relative to the model folder
  std::string partition_name;
  std::optional<std::string> ep_sdk_version, hardware_architecture;
  std::optional<std::string> onnx_model_filename;  // the source model, beside the compiled one

  // The graph this node runs: partition_name, else the node name.
  const std::string& graph_name() const { return partition_name.empty() ? name : partition_name; }

  // Throws Error(kInvalidModel) naming the node when an attribute has a value it cannot have.
  static EpContextNode read(const OrtNode* node);
  // Throws Error(kMismatch) when the node was made for another SDK version or hardware.
  void check_versions() const;
};

// Throws Error(kMismatch) naming `label` and both values when `binary` was written for another
// backend, SDK version or hardware architecture.
// Throws Error(kMismatch) naming the field, its value and this EP's when the binary cannot run
// here; else says how it runs (packed for a lower CPU level: slower than it could).
Judgement check_binary_identity(const ContextBinary& binary, const std::string& label);

// Throws Error(kMismatch) saying which value differs when the node's inputs or outputs do not match
// the graph's signature in count, element type or (known) dims.
void check_signature(const EpContextNode& node, const GraphRecord& graph, const std::string& label,
                     const std::vector<const OrtValueInfo*>& inputs,
                     const std::vector<const OrtValueInfo*>& outputs);

// "float32", "int64", ... for an ONNX element type code.
std::string elem_type_name(int32_t elem_type);
std::string dims_string(const std::vector<int64_t>& dims);

}  // namespace ctxgen::ort_ep
