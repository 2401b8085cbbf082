#pragma once
// Where an EPContext node's context binary, and a context binary's weight files, live. The rules
// follow ONNX's checks for external data: the path must be relative, stay inside the model's (or
// binary's) folder, also after following symlinks, and name a non-empty regular file. One
// exception: from inside a model package (a folder, or one above it, holding manifest.json), a
// path may lead into the package's shared assets (<package>/shared_assets/), where the variants of
// the package share files; nowhere else.

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

#include "ctxgen/bytes.h"

namespace ctxgen {

// The folder ep_cache_context paths are relative to: the model's folder, or for a model loaded
// from memory (empty `model_path`) the folder of the ep.context_file_path session option.
// Throws Error(kInvalidModel) naming `node` when neither is known.
std::filesystem::path context_folder(const std::string& model_path,
                                     const std::optional<std::string>& context_file_path,
                                     const std::string& node, const std::string& cache_context);

struct ContextFile {
  std::filesystem::path path;  // canonical: sessions sharing binaries find each other's by it
  FileDescriptor fd;
};

inline constexpr const char* kPackageManifest = "manifest.json";
inline constexpr const char* kPackageSharedAssets = "shared_assets";
// A shared asset's folder is "sha256-<hex>"; a package refers to it as "sha256:<hex>".
inline constexpr const char* kSharedAssetFolderPrefix = "sha256-";
inline constexpr const char* kSharedAssetPrefix = "sha256:";
// The session option a variant names its CPU nodes' weights folder with (ORT's).
inline constexpr const char* kExternalInitializersFolderOption = "session.model_external_initializers_file_folder_path";

// The model package `folder` is in: the nearest folder, `folder` or above, holding a manifest.json
// of a model package (an object with schema_version and a components object, at most
// kMaxManifestBytes).
inline constexpr uint64_t kMaxManifestBytes = uint64_t{16} << 20;
std::optional<std::filesystem::path> package_root(const std::filesystem::path& folder);

// The folder a weightless binary's source data is in (the source model's), found as ONNX Runtime
// documents it: the source model's path if the application gives one (ep.context_source_model_path),
// else the EPContext node's onnx_model_filename in the compiled model's folder `model_folder`, else
// that folder. Throws Error(kInvalidModel) naming `node` when onnx_model_filename leads outside it.
std::filesystem::path source_data_folder(const std::filesystem::path& model_folder,
                                         const std::optional<std::string>& source_model_path,
                                         const std::optional<std::string>& onnx_model_filename, const std::string& node);

// Opens the file `relative` names inside `folder` (or the package's shared assets). Throws
// Error(kInvalidModel) naming `node` and the path when `relative` is empty, absolute, leads
// outside those, or does not name a non-empty regular file. The file judged is the file opened: no
// link followed during the open can lead outside them, whatever changes meanwhile.
ContextFile open_context_file(const std::filesystem::path& folder, const std::string& relative,
                              const std::string& node);
// The same for a weight file that the context binary labelled `binary` in `folder` names.
ContextFile open_weight_file(const std::filesystem::path& folder, const std::string& relative,
                             const std::string& binary);
// The same for a weightless binary's source data, in the source model's folder `folder`.
ContextFile open_source_data(const std::filesystem::path& folder, const std::string& relative,
                             const std::string& binary);

}  // namespace ctxgen
