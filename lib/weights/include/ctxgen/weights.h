#pragma once
// Content-addressed weight store: one entry per distinct byte string, whatever its name or origin.
// A match needs the same hash, the same size and equal bytes, so a hash collision can never merge
// two different tensors.

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
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
    // Absent for made bytes no one has needed to hash yet: the context binary's writer hashes
    // them as it writes them.
    std::optional<Hash128> hash;
    Blob blob;
    // Other views of files holding the same bytes (a tensor stored twice, in one model or in two):
    // a binary that refers to the files instead of holding the bytes checks each of them.
    std::vector<Blob> also_in_files;
  };

  explicit WeightStore(Hasher hasher = xxh3_128);

  // Returns the id of the entry holding these bytes, adding one if none matches.
  // Bytes made by a transform (Blob::made) match:
  //   - made bytes of the same transform of equal source bytes, without making either;
  //   - plain bytes that equal them, whichever came first: they are made and hashed when a plain
  //     entry of their size exists. Otherwise they are stored unhashed and not made here at all,
  //     so a packed weight is made once, when written. Made bytes of other sources are not
  //     compared by content: ctxgen's transforms are one-to-one layout changes.
  uint32_t intern(Blob blob);
  const Entry& entry(uint32_t id) const { return entries_.at(id); }
  size_t size() const { return entries_.size(); }
  const WeightStoreStats& stats() const { return stats_; }

 private:
  uint32_t intern_bytes(Blob blob);  // by content alone
  void hash_unhashed(size_t size);
  void count_new(size_t size);  // made entries of that size, before a plain one is compared
  struct HashKey {
    size_t operator()(const Hash128& h) const { return static_cast<size_t>(h.low); }
  };
  Hasher hasher_;
  std::vector<Entry> entries_;
  std::unordered_multimap<Hash128, uint32_t, HashKey> by_hash_;
  // Made entries by the hash of their source, and the source blob each was made from.
  std::unordered_multimap<Hash128, std::pair<uint32_t, std::shared_ptr<const Blob>>, HashKey> by_source_;
  std::unordered_multimap<size_t, uint32_t> unhashed_by_size_;
  std::unordered_set<size_t> plain_sizes_;
  WeightStoreStats stats_;
};

}  // namespace ctxgen
