#pragma once
// Output files that appear together or not at all: each is written to a temporary file in its
// final folder and renamed into place only when every output has been written.

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ctxgen/error.h"
#include "ctxgen/format.h"
#include "ctxgen/pipeline.h"

namespace ctxgen {

// `path` made absolute with its symlinks followed (it need not exist), so two names of one file
// compare equal. Throws Error(`code`) naming the path when it cannot be resolved (a symlink loop,
// a folder on the way that cannot be searched).
std::filesystem::path resolved_path(const std::filesystem::path& path, ErrorCode code);

// Writes through a file descriptor, hashing the bytes as they go.
class OutputFile {
 public:
  explicit OutputFile(const std::filesystem::path& temp_path);
  ~OutputFile();
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;

  void write(const uint8_t* data, size_t size);
  ByteSink sink() {
    return [this](const uint8_t* data, size_t size) { write(data, size); };
  }
  // Overwrites bytes written before; the file's hash is then made again from the file at finish.
  void patch(uint64_t offset, const uint8_t* data, size_t size);
  BytePatcher patcher() {
    return [this](uint64_t offset, const uint8_t* data, size_t size) { patch(offset, data, size); };
  }
  // Flushes to disk and closes; returns size and hash.
  OutputSummary finish(const std::filesystem::path& final_path);

 private:
  void rehash();
  std::filesystem::path temp_;
  int fd_ = -1;
  uint64_t size_ = 0;
  uint64_t flushed_ = 0;  // bytes whose writeback has been started
  bool patched_ = false;
  void* state_ = nullptr;  // xxHash's streaming state, known only to outputs.cc
};

class OutputSet {
 public:
  // Refuses (Error kUsage) a planned path that is one of the files the run reads (`inputs`: its
  // models, a manifest), after links and `..`, or that two outputs share; refuses (Error
  // kOutputExists) any planned path that exists unless `force`; creates folders; locks each output
  // folder for this run (Error kIo when another run holds it) and removes the temporaries killed
  // runs left there.
  OutputSet(std::vector<std::filesystem::path> paths, bool force, const std::vector<std::filesystem::path>& inputs = {});
  ~OutputSet();  // removes temporaries that were not committed

  // Opens the temporary for planned output `path`.
  OutputFile& open(const std::filesystem::path& path);
  // A file another program wrote (`written`, in a staging folder on the same file system) that
  // becomes `path` at commit: a planned output, or one refused (Error kOutputExists) like a planned
  // output when `path` exists without force. Its size and hash are taken now.
  void adopt(const std::filesystem::path& written, const std::filesystem::path& path);
  // Renames every finished temporary and adopted file into place.
  void commit();
  // A planned output this run does not write after all: an existing file of that name (allowed by
  // --force) is removed at commit, so nothing of an earlier run stays beside the new outputs.
  void remove_on_commit(const std::filesystem::path& path) { unwritten_.push_back(path); }
  const std::vector<OutputSummary>& written() const { return written_; }
  void finished(OutputSummary summary) { written_.push_back(std::move(summary)); }

 private:
  std::filesystem::path temp_for(const std::filesystem::path& path) const;
  void lock(const std::filesystem::path& folder);
  std::vector<std::filesystem::path> paths_;
  bool force_;
  std::vector<std::pair<std::filesystem::path, std::filesystem::path>> adopted_;  // (written, path)
  std::vector<std::unique_ptr<OutputFile>> files_;
  std::vector<OutputSummary> written_;
  std::vector<std::filesystem::path> unwritten_;
  std::vector<std::filesystem::path> created_;  // folders this run created, innermost first
  std::vector<std::pair<std::filesystem::path, int>> locks_;  // output folders this run holds (flock)
  bool committed_ = false;
};

// A folder that another writer fills beside outputs (ONNX Runtime for --ep-lib, a child process
// for one --target-cpu level of several), made now and removed with whatever is left in it. Its
// name, ".<kind>.ctxgen-<pid>.tmp", is one OutputSet takes for a killed run's leftover and removes
// whole under the folder's lock; `kind` is "ep-compile", "targets" or "package". A folder staged
// for one output of the folder (a package) is named after it, ".<owner>.<kind>.ctxgen-<pid>.tmp",
// so that runs into different outputs of one folder do not take each other's for leftovers.
class StagingFolder {
 public:
  StagingFolder(const std::filesystem::path& folder, const std::string& kind, const std::string& owner = "");
  ~StagingFolder();
  StagingFolder(const StagingFolder&) = delete;
  StagingFolder& operator=(const StagingFolder&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

// A folder of this process alone under the system's temporary folder, removed with its contents
// when this goes: the local side of a remote cache given alone, the objects link unpacks.
class TemporaryFolder {
 public:
  explicit TemporaryFolder(const std::string& purpose);  // throws Error(kIo) naming `purpose`
  ~TemporaryFolder();
  TemporaryFolder(const TemporaryFolder&) = delete;
  TemporaryFolder& operator=(const TemporaryFolder&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

// The JSON report as one of `outputs`, written to its temporary now.
void write_report(OutputSet& outputs, const std::filesystem::path& path, const nlohmann::json& report);

}  // namespace ctxgen
