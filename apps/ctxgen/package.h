#pragma once
// `--package DIR`: the outputs of each --target-cpu level as one ONNX Runtime model package
// (manifest.json; one component per input model, named by its stem, with one variant per level;
// every file more than one variant needs stored once, content-addressed, under shared_assets/).
// The weights no level repacks go into one weights file the levels' binaries share
// (docs/context-binary-format.md §6). docs/cli.md, "Model packages".

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace ctxgen::cli {

// What compile or share wrote for one CPU level.
struct LevelOutputs {
  std::string level;
  std::filesystem::path folder;
};

struct PackageContents {
  uint64_t bytes = 0;  // every file of the package
  size_t variants = 0;
  size_t shared_assets = 0;
  uint64_t shared_weight_bytes = 0;  // in the weights file the levels share
};

// Writes the package of `models`' outputs into `folder` (empty), each component's variants
// declared in the order of `levels`: the caller lists the highest level first, so that ONNX
// Runtime, which breaks ties between variants that run equally well by that order, picks the best
// level that runs.
PackageContents write_package(const std::vector<std::filesystem::path>& models, const std::vector<LevelOutputs>& levels,
                              const std::filesystem::path& folder);

// What --package may replace: nothing, an empty folder, or a package ctxgen wrote that holds only
// the files its manifest lists. Throws Error(kUsage) naming what is in the way.
// `named` names the folder in messages when it is not where the user put it.
void check_replaceable(const std::filesystem::path& package, const std::string& named = "");
// The component names the models give and the CPU weights' file name, as a package can hold
// them; throws Error(kUsage) naming a model (or the file) whose name it cannot.
void check_names(const std::vector<std::filesystem::path>& models, const std::string& data_file);

// fsync of a folder, so the entries made in it are on disk. Throws Error(kIo) naming it.
void sync_folder(const std::filesystem::path& folder);

// `levels` from the highest down, by the runtime's order of CPU levels.
std::vector<std::string> highest_first(std::vector<std::string> levels);

}  // namespace ctxgen::cli
