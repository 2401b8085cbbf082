#pragma once
// `--target-cpu LEVEL,LEVEL,...`: one compile per CPU level, each in a process of its own (oneDNN
// fixes the level it compiles for once per process), the outputs of level L in OUT/L/, all
// published together or none.

#include <filesystem>
#include <string>
#include <vector>

#include "ctxgen/backend.h"
#include "ctxgen/pipeline.h"

namespace ctxgen::cli {

// The levels of a --target-cpu list ("avx2,avx512_core"); one entry when it names one level.
std::vector<std::string> target_levels(const std::string& target);

// Compiles `models` once per level in forked children (the calling process must be single-threaded
// and must not have asked oneDNN about the CPU yet). Returns the exit code: a child's when it
// failed, 0 when every level's outputs are in place. Each child prints its own progress and
// summary.
int compile_levels(const std::vector<std::filesystem::path>& models, const CompileOptions& options,
                   const std::vector<std::string>& levels, const BackendRegistry& backends, bool quiet);

// `--package DIR`: compiles `models` once per level of `levels` (one entry, "", for this machine's)
// in forked children, as compile_levels does, and writes their outputs as one ONNX Runtime model
// package (package.h), which replaces DIR in one step: a new or empty folder, or (--force) an
// earlier package. Returns the exit code.
int compile_package(const std::vector<std::filesystem::path>& models, CompileOptions options,
                    const std::vector<std::string>& levels, const BackendRegistry& backends, bool quiet,
                    const std::filesystem::path& package);

}  // namespace ctxgen::cli
