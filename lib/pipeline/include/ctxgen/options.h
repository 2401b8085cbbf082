#pragma once
// What a user says about the models of a run, from the command line or a manifest file, turned
// into CompileOptions: shape options scoped to one model, and share manifests (docs/cli.md).

#include <filesystem>
#include <string>
#include <vector>

#include "ctxgen/pipeline.h"

namespace ctxgen {

// Shape options as given: "[SCOPE:]NAME=VALUE" for --fix-dim, "[SCOPE:]INPUT=1x3x224x224" for
// --input-shape, "[SCOPE:]INPUT=V[,V...]" for --fix-value. Unscoped ones apply to every model;
// SCOPE is the file stem of one model.
struct ShapeArgs {
  std::vector<std::string> fix_dims, input_shapes, fix_values;
};

// One LoadOptions per model in `models` (the order of options.per_model): unscoped values for
// every model, scoped ones (which win) for the model whose file stem is the scope. A prefix that is
// no model's stem is part of the name ("input:0"); load then reports the name it cannot find.
// Throws Error(kUsage) for malformed text or a name given two different values in one scope.
std::vector<LoadOptions> resolve_shapes(const std::vector<std::filesystem::path>& models, const ShapeArgs& args);
// Values in `over` replace those of the same name in `base` (the command line over a manifest).
void override_with(std::vector<LoadOptions>& base, const std::vector<LoadOptions>& over);

// A checked-in description of a share group:
//   {"models": [{"path": "prefill.onnx", "fix_dim": {"seq": 128}, "input_shape": {"ids": [1, 128]}}, ...],
//    "output_dir": "dist", "backend": "ref", "fix_dim": {"batch": 1}, "input_shape": {...},
//    "node_name_prefix": "", "external_initializers_file": "", "embed": false}
// and "fix_value": {"sr": 16000} (or a list) at the top level or per model.
// Paths are relative to the manifest's folder. Unknown keys are errors, so a typo never passes.
struct Manifest {
  std::vector<std::filesystem::path> models;
  ShapeArgs shapes;  // the manifest's shape options, as scoped ShapeArgs
  CompileOptions options;
};
Manifest read_manifest(const std::filesystem::path& path);
// The same from manifest text; `folder` resolves relative paths, `where` names it in errors.
Manifest parse_manifest(const std::string& text, const std::filesystem::path& folder, const std::string& where);

}  // namespace ctxgen
