#pragma once
// `--target-cpu LEVEL,LEVEL,...`: one compile per CPU level, one after another (the level is each
// compile's own setting), the outputs of level L in OUT/L/, all published together or none.

#include <filesystem>
#include <string>
#include <vector>

#include "ctxgen/backend.h"
#include "ctxgen/pipeline.h"

namespace ctxgen::cli {

// The levels of a --target-cpu list ("avx2,avx512_core"); one entry when it names one level.
std::vector<std::string> target_levels(const std::string& target);

// Compiles `models` once per level, each into a staging folder, and puts every level's outputs in
// place; throws the first failing level's Error, leaving no level's outputs.
// Each level prints its own progress; the summaries follow once all are in place.
void compile_levels(const std::vector<std::filesystem::path>& models, const CompileOptions& options,
                   const std::vector<std::string>& levels, const BackendRegistry& backends, bool quiet);

// `--package DIR`: compiles `models` once per level of `levels` (one entry, "", for this machine's)
// as compile_levels does, and writes their outputs as one ONNX Runtime model
// package (package.h), which replaces DIR in one step: a new or empty folder, or (--force) an
// earlier package.
void compile_package(const std::vector<std::filesystem::path>& models, CompileOptions options,
                    const std::vector<std::string>& levels, const BackendRegistry& backends, bool quiet,
                    const std::filesystem::path& package);

}  // namespace ctxgen::cli
