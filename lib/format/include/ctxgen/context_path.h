#pragma once
// Where an EPContext node's context binary lives. The rules follow ONNX's checks for external
// data: the path must be relative, stay inside the model folder (also after following symlinks),
// and name a non-empty regular file.

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

// Opens the file `relative` names inside `folder`. Throws Error(kInvalidModel) naming `node` and
// the path when `relative` is empty, absolute, contains "..", resolves outside `folder`, or does
// not name a non-empty regular file. The file judged is the file opened: no link followed during
// the open can lead outside `folder`, whatever changes in it meanwhile.
ContextFile open_context_file(const std::filesystem::path& folder, const std::string& relative,
                              const std::string& node);

}  // namespace ctxgen
