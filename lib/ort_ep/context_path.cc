#include "context_path.h"

#include <system_error>

#include "ctxgen/error.h"

namespace fs = std::filesystem;

namespace ctxgen::ort_ep {
namespace {

[[noreturn]] void reject(const std::string& node, const std::string& relative, const std::string& why) {
  throw Error(ErrorCode::kInvalidModel,
              "EPContext node '" + node + "': ep_cache_context '" + relative + "' " + why);
}

fs::path folder_of(const std::string& file) {
  fs::path folder = fs::path(file).parent_path();
  return folder.empty() ? fs::path(".") : folder;
}

bool has_parent_reference(const fs::path& path) {
  for (const fs::path& part : path) {
    if (part == "..") return true;
  }
  return false;
}

}  // namespace

fs::path context_folder(const std::string& model_path, const std::optional<std::string>& context_file_path,
                        const std::string& node, const std::string& cache_context) {
  if (!model_path.empty()) return folder_of(model_path);
  if (context_file_path && !context_file_path->empty()) return folder_of(*context_file_path);
  reject(node, cache_context,
         "cannot be located: the model was loaded from memory, so set the session option "
         "ep.context_file_path to the model's path");
}

fs::path resolve_context_path(const fs::path& folder, const std::string& relative, const std::string& node) {
  if (relative.empty()) {
    reject(node, relative, "is empty; it must name the context binary relative to the model folder '" +
                               folder.string() + "'");
  }
  if (relative.find('\0') != std::string::npos) reject(node, relative, "contains a NUL byte");
  const fs::path rel(relative);
  if (rel.is_absolute() || rel.has_root_path()) {
    reject(node, relative, "is an absolute path; it must be relative to the model folder '" +
                               folder.string() + "'");
  }
  if (has_parent_reference(rel)) {
    reject(node, relative, "contains '..'; it must not point outside the model folder '" +
                               folder.string() + "'");
  }

  std::error_code ec;
  const fs::path base = fs::weakly_canonical(folder, ec);
  if (ec) reject(node, relative, "cannot be resolved: model folder '" + folder.string() + "': " + ec.message());
  const fs::path resolved = fs::weakly_canonical(base / rel, ec);
  if (ec) reject(node, relative, "cannot be resolved in '" + base.string() + "': " + ec.message());
  // A symlink inside the folder may still lead out of it; judge where it really points.
  const fs::path inside = resolved.lexically_relative(base);
  if (inside.empty() || has_parent_reference(inside)) {
    reject(node, relative, "resolves to '" + resolved.string() + "', outside the model folder '" +
                               base.string() + "'");
  }
  if (!fs::is_regular_file(resolved, ec)) {
    reject(node, relative, "names '" + resolved.string() + "', which does not exist or is not a regular file");
  }
  const auto size = fs::file_size(resolved, ec);
  if (ec) reject(node, relative, "names '" + resolved.string() + "', which cannot be read: " + ec.message());
  if (size == 0) reject(node, relative, "names '" + resolved.string() + "', which is empty");
  return resolved;
}

}  // namespace ctxgen::ort_ep
