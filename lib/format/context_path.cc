#include "ctxgen/context_path.h"

#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <fstream>
#include <system_error>
#include <vector>

#include <nlohmann/json.hpp>

#include "ctxgen/error.h"

namespace fs = std::filesystem;

namespace ctxgen {
namespace {

// `subject` names the path and who gives it: "EPContext node 'n': ep_cache_context 'x.bin'".
[[noreturn]] void reject(const std::string& subject, const std::string& why) {
  throw Error(ErrorCode::kInvalidModel, subject + " " + why);
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

constexpr const char* kNotAFile = "does not exist or is not a regular file";

// A path as a message can carry it: a NUL would end the message there.
std::string printable(const std::string& path) {
  std::string text;
  for (char c : path) text += c == '\0' ? std::string("\\0") : std::string(1, c);
  return text;
}
// O_NONBLOCK: a FIFO opens without waiting for a writer, then is refused as not a regular file;
// O_NOCTTY: a terminal opened so is never made the process's.
constexpr int kReadFlags = O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY;

[[noreturn]] void reject_file(const std::string& subject, const fs::path& file, const std::string& why) {
  reject(subject, "names '" + file.string() + "', which " + why);
}

void check_relative(const fs::path& folder, const std::string& relative, const std::string& subject,
                    const std::string& folder_name) {
  if (relative.empty())
    reject(subject, "is empty; it must name a file relative to the " + folder_name + " '" + folder.string() + "'");
  if (relative.find('\0') != std::string::npos) reject(subject, "contains a NUL byte");
  const fs::path rel(relative);
  if (rel.is_absolute() || rel.has_root_path())
    reject(subject, "is an absolute path; it must be relative to the " + folder_name + " '" + folder.string() + "'");
}


// The kernel resolves the path and keeps it beneath the folder (openat2, RESOLVE_BENEATH) in one
// call; the canonical path is then the open file's. Nothing when that fails for any reason (its
// errno in `error`): the path-based resolution below then decides, and names what is wrong.
std::optional<ContextFile> open_beneath(const fs::path& folder, const std::string& relative, int& error) {
  error = 0;
  const FileDescriptor dir(::open(folder.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (dir.get() < 0) return std::nullopt;
  open_how how{};
  how.flags = kReadFlags;
  how.resolve = RESOLVE_BENEATH;
  FileDescriptor file(static_cast<int>(::syscall(SYS_openat2, dir.get(), relative.c_str(), &how, sizeof how)));
  error = file.get() < 0 ? errno : 0;
  if (file.get() < 0) return std::nullopt;
  char target[PATH_MAX];
  const std::string link = "/proc/self/fd/" + std::to_string(file.get());
  const ssize_t n = ::readlink(link.c_str(), target, sizeof target);
  // Not a path when /proc is missing or the name is too long; another file's (or one ending in
  // " (deleted)") when the file was renamed over or removed since it was opened.
  if (n <= 0 || static_cast<size_t>(n) == sizeof target || target[0] != '/') return std::nullopt;
  const std::string path(target, static_cast<size_t>(n));
  struct stat named {}, opened {};
  if (::stat(path.c_str(), &named) != 0 || ::fstat(file.get(), &opened) != 0 || named.st_dev != opened.st_dev ||
      named.st_ino != opened.st_ino)
    return std::nullopt;
  return ContextFile{fs::path(path), std::move(file)};
}

// Where openat2 is missing (Linux before 5.6, seccomp filters that make it fail) or refuses what the
// rules allow (an absolute symlink to a file in the folder), and to name what is wrong. The checked
// path is then opened a component at a time from the folder, following no link: resolved, it has
// none, so a link found on the way was put there since the check and is refused.
ContextFile open_by_path(const fs::path& folder, const std::string& relative, const std::string& subject,
                         const std::string& folder_kind) {
  std::error_code ec;
  const fs::path base = fs::weakly_canonical(folder, ec);
  if (ec) reject(subject, "cannot be resolved: " + folder_kind + " '" + folder.string() + "': " + ec.message());
  const fs::path resolved = fs::weakly_canonical(base / relative, ec);
  if (ec) reject(subject, "cannot be resolved in '" + base.string() + "': " + ec.message());
  // A symlink inside the folder may still lead out of it; judge where it really points.
  const fs::path inside = resolved.lexically_relative(base);
  if (inside.empty() || has_parent_reference(inside))
    reject(subject, "resolves to '" + resolved.string() + "', outside the " + folder_kind + " '" + base.string() + "'");
  FileDescriptor at(::open(base.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  std::vector<fs::path> parts;
  for (const fs::path& part : inside)
    if (!part.empty() && part != ".") parts.push_back(part);
  for (size_t i = 0; at.get() >= 0 && i < parts.size(); ++i) {
    const bool last = i + 1 == parts.size();
    at = FileDescriptor(::openat(at.get(), parts[i].c_str(),
                                 last ? kReadFlags | O_NOFOLLOW : O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  }
  if (at.get() < 0) {
    const int err = errno;
    // ELOOP: a link with nothing behind it (weakly_canonical keeps a dangling link's own name).
    if (err == ENOENT || err == ENOTDIR || err == ELOOP) reject_file(subject, resolved, kNotAFile);
    reject_file(subject, resolved, std::string("cannot be opened: ") + std::strerror(err));
  }
  return ContextFile{resolved, std::move(at)};
}

// Opens `relative` inside `folder`, or, from a folder inside a model package, inside the package's
// shared assets: the one place a path with ".." may lead, so that the variants of a package share
// files without reaching anything else.
ContextFile open_relative(const fs::path& folder, const std::string& relative, const std::string& subject,
                          const std::string& folder_name) {
  check_relative(folder, relative, subject, folder_name);
  const fs::path rel(relative);
  fs::path base = folder;
  std::string inside = relative;
  std::string folder_kind = folder_name;
  std::optional<fs::path> assets;  // the shared assets the file must be in
  if (has_parent_reference(rel)) {
    const std::optional<fs::path> root = package_root(folder);
    if (!root)
      reject(subject, "contains '..'; it must not point outside the " + folder_name + " '" + folder.string() +
                          "' (only a file inside a model package may reach the package's " + kPackageSharedAssets +
                          "/)");
    // The kernel resolves the path from the package's root, each '..' and link as it comes, and
    // keeps it beneath the root; where it ends is then judged.
    std::error_code ec;
    base = *root;
    inside = (fs::weakly_canonical(folder, ec).lexically_relative(*root) / rel).string();
    folder_kind = "model package";
    assets = *root / kPackageSharedAssets;
  }
  int error = 0;
  std::optional<ContextFile> opened = open_beneath(base, inside, error);
  // Within a package the kernel's word on a path through a missing folder stands: resolved on
  // paper, "a/missing/../b" would reach b.
  if (!opened && assets && (error == ENOENT || error == ENOTDIR))
    reject_file(subject, base / inside, kNotAFile);
  ContextFile file = opened ? std::move(*opened) : open_by_path(base, inside, subject, folder_kind);
  if (assets) {
    const fs::path within = file.path.lexically_relative(*assets);
    if (within.empty() || has_parent_reference(within))
      reject(subject, "leads out of the " + folder_name + " '" + folder.string() + "' to '" + file.path.string() +
                          "', which is not in the shared assets '" + assets->string() + "' of the model package");
  }
  struct stat st {};
  if (::fstat(file.fd.get(), &st) != 0) {
    const int err = errno;
    reject_file(subject, file.path, std::string("cannot be read: ") + std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) reject_file(subject, file.path, kNotAFile);
  if (st.st_size == 0) reject_file(subject, file.path, "is empty");
  return file;
}

}  // namespace

fs::path context_folder(const std::string& model_path, const std::optional<std::string>& context_file_path,
                        const std::string& node, const std::string& cache_context) {
  if (!model_path.empty()) return folder_of(model_path);
  if (context_file_path && !context_file_path->empty()) return folder_of(*context_file_path);
  reject("EPContext node '" + node + "': ep_cache_context '" + cache_context + "'",
         "cannot be located: the model was loaded from memory, so set the session option "
         "ep.context_file_path to the model's path");
}

std::optional<fs::path> package_root(const fs::path& folder) {
  std::error_code ec;
  fs::path at = fs::weakly_canonical(folder, ec);
  if (ec) return std::nullopt;
  for (;; at = at.parent_path()) {
    if (fs::is_regular_file(at / kPackageManifest, ec) && fs::file_size(at / kPackageManifest, ec) <= kMaxManifestBytes) {
      // Only a model package's manifest makes a package: another tool's manifest.json (a web
      // extension's, a stray one in a home folder) opens no shared assets.
      std::ifstream in(at / kPackageManifest);
      const auto manifest = nlohmann::json::parse(in, nullptr, false);
      if (manifest.is_object() && manifest.contains("schema_version") && manifest.contains("components") &&
          manifest["components"].is_object())
        return at;
    }
    if (at == at.parent_path()) return std::nullopt;
  }
}

std::filesystem::path source_data_folder(const std::filesystem::path& model_folder,
                                         const std::optional<std::string>& source_model_path,
                                         const std::optional<std::string>& onnx_model_filename, const std::string& node) {
  namespace fs = std::filesystem;
  if (source_model_path && !source_model_path->empty()) {
    const fs::path folder = fs::path(*source_model_path).parent_path();
    return folder.empty() ? fs::path(".") : folder;
  }
  if (!onnx_model_filename) return model_folder;
  // A name the model gives stays inside its folder, as the data paths inside that folder do.
  const fs::path name(*onnx_model_filename);
  const fs::path folder = (model_folder / name).parent_path();
  std::error_code ec;
  const fs::path root = fs::weakly_canonical(model_folder, ec), real = fs::weakly_canonical(folder, ec);
  if (name.is_absolute() || std::find(name.begin(), name.end(), "..") != name.end() ||
      std::mismatch(root.begin(), root.end(), real.begin(), real.end()).first != root.end())
    throw Error(ErrorCode::kInvalidModel, "EPContext node '" + node + "': onnx_model_filename '" + *onnx_model_filename +
                                              "' leads outside the model's folder");
  return folder;
}

ContextFile open_context_file(const fs::path& folder, const std::string& relative, const std::string& node) {
  return open_relative(folder, relative, "EPContext node '" + node + "': ep_cache_context '" + printable(relative) + "'",
                       "model folder");
}

ContextFile open_weight_file(const fs::path& folder, const std::string& relative, const std::string& binary) {
  return open_relative(folder, relative, binary + ": weight file '" + printable(relative) + "'", "binary's folder");
}

ContextFile open_source_data(const fs::path& folder, const std::string& relative, const std::string& binary) {
  return open_relative(folder, relative, binary + ": source data '" + printable(relative) + "'", "source model's folder");
}

}  // namespace ctxgen
