#pragma once
// The compile cache (--cache DIR, docs/cli.md "Compile cache"): each partition's compile result is
// kept under a key made of everything that determines it (the partition's nodes and value types,
// its weights' content, the backend's identity and options, ctxgen's version) and reused by any
// later run, whatever the model files are called or where they are. A warm run writes the bytes a
// cold run writes: the cached program is renumbered into the run's weight store, which takes the
// same weights in the same order.

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

#include "ctxgen/backend.h"
#include "ctxgen/bytes.h"
#include "ctxgen/model.h"
#include "ctxgen/partition.h"
#include "ctxgen/pipeline.h"
#include "ctxgen/weights.h"

namespace ctxgen {

class CompileCache {
 public:
  // Opens `folder`, making it when absent; throws Error(kUsage) naming it when that fails.
  // `backend` is set up for the run (target, weightless) and outlives the cache. With `remote`,
  // an entry the folder lacks is fetched from it and a new one stored there; a remote that fails
  // (down, slow, answering errors) is a warning and no longer asked in this run.
  CompileCache(const std::filesystem::path& folder, const Backend& backend, bool weightless,
               std::shared_ptr<RemoteCache> remote = nullptr);
  ~CompileCache();
  CompileCache(const CompileCache&) = delete;
  CompileCache& operator=(const CompileCache&) = delete;

  // The content hash of bytes a model holds: remembered across runs by the identity of the file
  // they are in (device, inode, size, modification and change times) and their place in it, as
  // ccache's direct mode remembers, so a warm run reads no weight to find its keys. The weight
  // store's hasher, so the cold run's hashing fills the memory.
  Hash128 hash(const uint8_t* data, size_t size);
  // Lets hash() remember the bytes of `model`'s files. The model outlives the cache's use of it.
  void add_files(const Model& model);

  // The partition compiled as backend.compile() compiles it into `store`, from the cache when an
  // entry matches, else compiled and stored. A damaged entry is dropped with a warning and the
  // partition compiled again; a cache that cannot be written is a warning, never an error.
  CompiledGraph compile(const Model& model, const Partition& partition, const std::string& graph_name, WeightStore& store);

  // From now on a partition the cache lacks is an error (Error kInvalidBinary), never compiled: link.
  void cache_only();

  // Writes what hash() learnt; at the end of a run.
  void save();
  const CacheStats& stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ctxgen
