#include "ctxgen/outputs.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <set>
#include <vector>

#include <xxhash.h>

#include "ctxgen/bytes.h"
#include "ctxgen/error.h"
#include "ctxgen/report.h"

namespace fs = std::filesystem;

namespace ctxgen {
namespace {

XXH3_state_t* hash_state(void* state) { return static_cast<XXH3_state_t*>(state); }

Error io_error(const fs::path& path, const std::string& what) {
  return Error(ErrorCode::kIo, path.string() + ": " + what);
}

// Temporaries are ".<file>.ctxgen-<pid>.tmp" (OutputSet::temp_for).
bool is_temporary(const std::string& name) {
  auto mark = name.rfind(".ctxgen-");
  if (name.empty() || name[0] != '.' || mark == std::string::npos || name.size() < 4 ||
      name.compare(name.size() - 4, 4, ".tmp") != 0)
    return false;
  std::string pid = name.substr(mark + 8, name.size() - 4 - (mark + 8));
  return !pid.empty() && pid.find_first_not_of("0123456789") == std::string::npos;
}

constexpr const char* kStagingKinds[] = {"ep-compile", "targets", "package", "object"};

}  // namespace

StagingFolder::StagingFolder(const fs::path& folder, const std::string& kind, const std::string& owner)
    : path_(folder / ("." + (owner.empty() ? "" : owner + ".") + kind + ".ctxgen-" + std::to_string(::getpid()) + ".tmp")) {
  if (std::find(std::begin(kStagingKinds), std::end(kStagingKinds), kind) == std::end(kStagingKinds))
    throw Error(ErrorCode::kInternal, "a staging folder of unknown kind '" + kind + "'");
  std::error_code ec;
  fs::create_directory(path_, ec);
  if (ec) throw Error(ErrorCode::kIo, path_.string() + ": cannot create the staging folder: " + ec.message());
}

StagingFolder::~StagingFolder() {
  std::error_code ec;
  fs::remove_all(path_, ec);
}

fs::path resolved_path(const fs::path& path, ErrorCode code) {
  std::error_code ec;
  fs::path absolute = fs::absolute(path, ec);
  if (!ec) absolute = fs::weakly_canonical(absolute, ec);
  if (ec) throw Error(code, path.string() + ": cannot be resolved: " + ec.message());
  return absolute;
}

OutputFile::OutputFile(const fs::path& temp_path) : temp_(temp_path) {
  fd_ = ::open(temp_.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) throw io_error(temp_.parent_path(), std::string("cannot create output: ") + std::strerror(errno));
  state_ = XXH3_createState();
  XXH3_128bits_reset(hash_state(state_));
}

OutputFile::~OutputFile() {
  if (fd_ >= 0) ::close(fd_);
  XXH3_freeState(hash_state(state_));
}

void OutputFile::write(const uint8_t* data, size_t size) {
  XXH3_128bits_update(hash_state(state_), data, size);
  size_ += size;
  while (size > 0) {
    ssize_t n = ::write(fd_, data, std::min<size_t>(size, size_t{1} << 30));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw io_error(temp_, std::string("write failed: ") + std::strerror(errno));
    data += n;
    size -= static_cast<size_t>(n);
  }
  // The disk writes what is written so far while the next weights are made, instead of all of it
  // at the final fsync; the kernel would otherwise wait for gigabytes of dirty pages first.
  constexpr uint64_t kWriteback = uint64_t{64} << 20;
  if (size_ - flushed_ >= kWriteback) {
    ::sync_file_range(fd_, static_cast<off_t>(flushed_), static_cast<off_t>(size_ - flushed_), SYNC_FILE_RANGE_WRITE);
    flushed_ = size_;
  }
}

void OutputFile::patch(uint64_t offset, const uint8_t* data, size_t size) {
  if (offset + size > size_) throw io_error(temp_, "patch past the end of what was written");
  patched_ = true;
  while (size > 0) {
    ssize_t n = ::pwrite(fd_, data, size, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw io_error(temp_, std::string("write failed: ") + std::strerror(errno));
    data += n;
    offset += static_cast<uint64_t>(n);
    size -= static_cast<size_t>(n);
  }
}

// The hash of what the file holds after patches, read back from the page cache while the disk is
// still writing it out.
void OutputFile::rehash() {
  XXH3_128bits_reset(hash_state(state_));
  std::vector<uint8_t> buffer(size_t{16} << 20);
  for (uint64_t at = 0; at < size_;) {
    ssize_t n = ::pread(fd_, buffer.data(), std::min<uint64_t>(buffer.size(), size_ - at), static_cast<off_t>(at));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw io_error(temp_, std::string("cannot read back: ") + (n < 0 ? std::strerror(errno) : "file shrank"));
    XXH3_128bits_update(hash_state(state_), buffer.data(), static_cast<size_t>(n));
    at += static_cast<uint64_t>(n);
  }
}

OutputSummary OutputFile::finish(const fs::path& final_path) {
  if (patched_) rehash();
  if (::fsync(fd_) != 0) throw io_error(temp_, std::string("fsync failed: ") + std::strerror(errno));
  if (::close(fd_) != 0) {
    fd_ = -1;
    throw io_error(temp_, std::string("close failed: ") + std::strerror(errno));
  }
  fd_ = -1;
  XXH128_hash_t h = XXH3_128bits_digest(hash_state(state_));
  return OutputSummary{final_path, size_, Hash128{h.low64, h.high64}};
}

OutputSet::OutputSet(std::vector<fs::path> paths, bool force, const std::vector<fs::path>& inputs)
    : paths_(std::move(paths)), force_(force) {
  std::map<fs::path, fs::path> read;  // sets and maps: a manifest may list thousands of models
  for (const auto& in : inputs) read.emplace(resolved_path(in, ErrorCode::kUsage), in);
  std::set<fs::path> resolved;
  for (const auto& path : paths_) {
    const fs::path target = resolved_path(path, ErrorCode::kUsage);
    if (auto it = read.find(target); it != read.end())
      throw Error(ErrorCode::kUsage, path.string() + ": an output would overwrite " + it->second.string() + ", which this run reads");
    if (!resolved.insert(target).second)
      throw Error(ErrorCode::kUsage, "two outputs would both be written to " + path.string() +
                                         " (model, binary, weights file and report each need their own path)");
  }
  // Every check before any folder is made, so a refusal leaves nothing behind.
  for (const auto& path : paths_) {
    std::error_code ec;
    fs::path folder = path.parent_path().empty() ? fs::path(".") : path.parent_path();
    if (fs::exists(folder, ec) && !fs::is_directory(folder, ec))
      throw io_error(folder, "output folder is not a directory");
    if (fs::is_directory(path, ec)) throw io_error(path, "an output path is a directory");
    if (fs::exists(path, ec) && !force)
      throw Error(ErrorCode::kOutputExists, path.string() + ": output exists already; remove it or pass --force");
  }
  for (const auto& path : paths_) {
    std::error_code ec;
    fs::path folder = path.parent_path().empty() ? fs::path(".") : path.parent_path();
    // Folders this run creates are removed again if it fails.
    std::vector<fs::path> missing;  // innermost first
    for (fs::path f = fs::absolute(folder); !f.empty() && !fs::exists(f, ec); f = f.parent_path()) missing.push_back(f);
    // mkdir itself, outermost first: its errno says why (libstdc++'s create_directories can report
    // "Success" for a folder the file system refuses, as under /proc).
    for (auto it = missing.rbegin(); it != missing.rend(); ++it) {
      if (::mkdir(it->c_str(), 0777) == 0) {
        created_.insert(created_.begin(), *it);
      } else if (errno != EEXIST || !fs::is_directory(*it, ec)) {  // EEXIST: another run made it, or it is no folder
        const int err = errno == EEXIST ? ENOTDIR : errno;
        for (const auto& made : created_) fs::remove(made, ec);
        throw io_error(folder, "cannot create output folder: " + std::string(std::strerror(err)));
      }
    }
  }
  try {
    for (const auto& path : paths_) lock(path.parent_path().empty() ? fs::path(".") : path.parent_path());
  } catch (const Error&) {
    // The destructor does not run for a constructor that throws. Folders are left: the run that
    // holds the lock may have made them at the same moment, and uses them.
    for (const auto& [folder, fd] : locks_) ::close(fd);
    throw;
  }
}

// One run at a time per output folder: two runs into one folder could leave models of one beside
// the binary of the other. Holding the lock, any temporary in the folder is a leftover of a run
// that was killed, and is removed.
void OutputSet::lock(const fs::path& folder) {
  std::error_code ec;
  for (const auto& [held, fd] : locks_)
    if (fs::equivalent(held, folder, ec)) return;
  int fd = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw io_error(folder, std::string("cannot open output folder: ") + std::strerror(errno));
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    int err = errno;
    ::close(fd);
    throw io_error(folder, err == EWOULDBLOCK ? "another ctxgen run is writing into this folder; run again when it is done"
                                              : std::string("cannot lock output folder: ") + std::strerror(err));
  }
  locks_.emplace_back(folder, fd);
  for (const auto& e : fs::directory_iterator(folder, ec))
    if (is_temporary(e.path().filename().string())) {
      // A StagingFolder goes whole; anything else only if a file.
      const std::string name = e.path().filename().string();
      const bool staging = std::any_of(std::begin(kStagingKinds), std::end(kStagingKinds), [&](const char* kind) {
        return name.rfind(std::string(".") + kind + ".ctxgen-", 0) == 0;
      });
      if (staging) fs::remove_all(e.path(), ec);
      else fs::remove(e.path(), ec);
    }
}

TemporaryFolder::TemporaryFolder(const std::string& purpose) {
  std::string folder = (fs::temp_directory_path() / "ctxgen-XXXXXX").string();
  if (::mkdtemp(folder.data()) == nullptr)
    throw Error(ErrorCode::kIo, "cannot make a temporary folder for " + purpose + ": " + std::strerror(errno));
  path_ = folder;
}

TemporaryFolder::~TemporaryFolder() {
  std::error_code ignored;
  fs::remove_all(path_, ignored);
}

OutputSet::~OutputSet() {
  if (!committed_) {
    std::error_code ec;
    files_.clear();  // closes the temporaries before they are removed
    for (const auto& path : paths_) fs::remove(temp_for(path), ec);
    for (const auto& folder : created_) fs::remove(folder, ec);  // innermost first; only if empty
  }
  for (const auto& [folder, fd] : locks_) ::close(fd);  // releases the lock
}

fs::path OutputSet::temp_for(const fs::path& path) const {
  return path.parent_path() / ("." + path.filename().string() + ".ctxgen-" + std::to_string(::getpid()) + ".tmp");
}

OutputFile& OutputSet::open(const fs::path& path) {
  files_.push_back(std::make_unique<OutputFile>(temp_for(path)));
  return *files_.back();
}

void OutputSet::adopt(const fs::path& written, const fs::path& path) {
  std::error_code ec;
  const fs::path resolved = resolved_path(path, ErrorCode::kUsage);
  const auto same = [&](const fs::path& other) { return resolved_path(other, ErrorCode::kUsage) == resolved; };
  for (const auto& [source, target] : adopted_)
    if (same(target)) throw Error(ErrorCode::kUsage, "two outputs would both be written to " + path.string());
  // A planned path passed its checks when the set was made.
  if (std::none_of(paths_.begin(), paths_.end(), same) && fs::exists(path, ec) && !force_)
    throw Error(ErrorCode::kOutputExists, path.string() + ": output exists already; remove it or pass --force");
  const auto file = MappedFile::open(written);
  written_.push_back({path, file->size(), xxh3_128(file->data(), file->size())});
  adopted_.emplace_back(written, path);
}

void OutputSet::commit() {
  for (const auto& out : written_) {
    std::error_code ec;
    fs::path from = temp_for(out.path);
    for (const auto& [source, target] : adopted_)
      if (target == out.path) from = source;
    fs::rename(from, out.path, ec);
    if (ec) {
      std::string why = ec.message();
      // Take back what was already published so no half set of outputs is left behind.
      for (const auto& done : written_) {
        if (done.path == out.path) break;
        fs::remove(done.path, ec);
      }
      throw io_error(out.path, "cannot move output into place: " + why);
    }
  }
  for (const auto& path : unwritten_) {
    std::error_code ec;
    fs::remove(path, ec);
  }
  committed_ = true;
  // The renames are only durable once each folder's entries are on disk, and a folder this run
  // made only once its parent's are. A failure here is reported; the outputs are in place.
  std::vector<fs::path> folders;
  for (const auto& [folder, fd] : locks_) folders.push_back(folder);
  for (const auto& made : created_) folders.push_back(made.parent_path());
  for (const auto& folder : folders) {
    int fd = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    const bool synced = fd >= 0 && ::fsync(fd) == 0;
    const int err = errno;
    if (fd >= 0) ::close(fd);
    if (!synced)
      throw io_error(folder, std::string("the outputs are in place, but flushing the folder to disk failed: ") +
                                 std::strerror(err));
  }
}

void write_report(OutputSet& outputs, const fs::path& path, const nlohmann::json& report) {
  const std::string json = json_text(report, 2) + "\n";
  OutputFile& file = outputs.open(path);
  file.write(reinterpret_cast<const uint8_t*>(json.data()), json.size());
  outputs.finished(file.finish(path));
}

}  // namespace ctxgen
