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
#include <vector>

#include "ctxgen/backend.h"
#include "ctxgen/bytes.h"
#include "ctxgen/model.h"
#include "ctxgen/partition.h"
#include "ctxgen/weights.h"

namespace ctxgen {

// A store of compile cache entries that a fleet of machines shares (--remote-cache URL): whole
// files under their names. The CLI's is HTTP GET and PUT (apps/ctxgen/http_cache.cc).
class RemoteCache {
 public:
  virtual ~RemoteCache() = default;
  virtual std::string where() const = 0;  // for messages: the URL, without credentials
  // Fetches `name` into the file `to`: false when the store has none. What cannot be an entry
  // (bytes that do not begin with `start`, or more than `max_bytes`) is stopped as it arrives,
  // the file keeping the bytes before, which the cache then finds damaged. Throws Error(kIo) when
  // the store cannot be reached in time or answers an error.
  virtual bool get(const std::string& name, const std::filesystem::path& to, const std::string& start, uint64_t max_bytes) = 0;
  // Stores the file `from` as `name`; throws Error(kIo) as get() does.
  virtual void put(const std::string& name, const std::filesystem::path& from) = 0;
  // False for a store this machine only reads (a developer's, of a cache only CI writes): put() is
  // never called.
  virtual bool writable() const { return true; }
};

// What the compile cache did in a run.
struct CacheStats {
  bool used = false;
  uint64_t hits = 0, misses = 0;     // partitions taken from the cache, compiled (and stored)
  uint64_t damaged = 0;              // entries found damaged: removed, their partitions compiled anew
  uint64_t bytes_read = 0, bytes_written = 0;  // of entries
  uint64_t remote_hits = 0, remote_stores = 0;  // entries fetched from / stored to the remote cache
  uint64_t remote_errors = 0;  // failed exchanges with it (the first ends its use in the run)
  std::vector<std::string> keys;  // the entries this run took or stored
};

// A compile cache folder's contents (ctxgen cache stats): its entries, and the files of
// remembered weight hashes.
struct CacheUsage {
  uint64_t entries = 0, entry_bytes = 0;
  uint64_t hash_files = 0, hash_bytes = 0;
};
// Throws Error(kUsage) when `folder` is not a compile cache (it has no entries/ folder).
CacheUsage cache_usage(const std::filesystem::path& folder);
// Removes the least recently used entries (a run that takes one marks it used) until the entries
// hold at most `max_bytes`; returns how many it removed.
uint64_t prune_cache(const std::filesystem::path& folder, uint64_t max_bytes);
// Removes every entry and remembered hash.
void clear_cache(const std::filesystem::path& folder);

// Where the cache in `folder` keeps the entry of `key` (32 hex digits): entries/<first two>/<key>.
std::filesystem::path cache_entry_path(const std::filesystem::path& folder, const std::string& key);

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
