#pragma once
// Opens context binaries for sessions. Sessions created with ep.share_ep_contexts=1 share one
// mapping of each file per process: the registry holds only weak references, so a file is
// unmapped when the last session (executable) using it is gone, whatever the order sessions are
// destroyed in. The counters let tests observe both facts.

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "ctxgen/context_path.h"
#include "ctxgen/format.h"

namespace ctxgen::ort_ep {

struct BinaryStats {
  uint64_t opened = 0;  // files mapped since the library was loaded
  uint64_t live = 0;    // of those, still mapped
};

struct SharedGraph {
  std::filesystem::path path;
  std::shared_ptr<const ContextBinary> binary;
};

class BinaryRegistry {
 public:
  static BinaryRegistry& instance();

  // Maps `file`, a weightless one with its source data where `source_folder` says. With `shared`,
  // returns the mapping another sharing session holds of its path, if any, and otherwise publishes
  // the new one for later sharing sessions.
  std::shared_ptr<const ContextBinary> open(const ContextFile& file, bool shared,
                                            const ContextBinary::SourceFolder& source_folder);
  // Maps the file at `path` for one session (a weightless one with its source data where
  // `source_folder` says).
  std::shared_ptr<const ContextBinary> open(const std::filesystem::path& path,
                                            const ContextBinary::SourceFolder& source_folder = {});
  // A binary `make` reads another way (the application's read function), known by `key`: with
  // `shared`, the one a sharing session holds under that key, if any, else `make`'s, published.
  std::shared_ptr<const ContextBinary> open(const std::filesystem::path& key, bool shared,
                                            const std::function<std::shared_ptr<const ContextBinary>()>& make);

  // Binaries published by sharing sessions that are still alive and hold a graph named `name`.
  std::vector<SharedGraph> find_shared_graph(const std::string& name);

  BinaryStats stats() const;

 private:
  mutable std::mutex mutex_;
  std::map<std::filesystem::path, std::weak_ptr<const ContextBinary>> shared_;
};

}  // namespace ctxgen::ort_ep
