#pragma once
// Content-addressed weight store: one entry per distinct byte string, whatever its name or origin.
// A match needs the same hash, the same size and equal bytes, so a hash collision can never merge
// two different tensors.

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "ctxgen/bytes.h"

namespace ctxgen {

struct WeightStoreStats {
  uint64_t tensors_seen = 0;
  uint64_t tensors_unique = 0;
  uint64_t bytes_seen = 0;
  uint64_t bytes_unique = 0;
};

class WeightStore {
 public:
  struct Entry {
    Hash128 hash;
    Blob blob;
  };

  explicit WeightStore(Hasher hasher = xxh3_128);

  // Returns the id of the entry holding these bytes, adding one if none matches. Bytes made by a
  // transform (Blob::made) that this store has already seen applied to equal source bytes are
  // matched without making them again.
  uint32_t intern(Blob blob);
  const Entry& entry(uint32_t id) const { return entries_.at(id); }
  size_t size() const { return entries_.size(); }
  const WeightStoreStats& stats() const { return stats_; }

 private:
  uint32_t intern_bytes(Blob blob);  // by content alone
  struct HashKey {
    size_t operator()(const Hash128& h) const { return static_cast<size_t>(h.low); }
  };
  Hasher hasher_;
  std::vector<Entry> entries_;
  std::unordered_multimap<Hash128, uint32_t, HashKey> by_hash_;
  // Made entries by the hash of their source, and the source blob each was made from.
  std::unordered_multimap<Hash128, std::pair<uint32_t, std::shared_ptr<const Blob>>, HashKey> by_source_;
  WeightStoreStats stats_;
};

}  // namespace ctxgen
