#include <cstring>

#include "ctxgen/weights.h"

namespace ctxgen {

WeightStore::WeightStore(Hasher hasher) : hasher_(std::move(hasher)) {}

uint32_t WeightStore::intern(Blob blob) {
  Hash128 hash = hasher_(blob.data, blob.size);
  ++stats_.tensors_seen;
  stats_.bytes_seen += blob.size;
  auto [begin, end] = by_hash_.equal_range(hash);
  for (auto it = begin; it != end; ++it) {
    const Blob& known = entries_[it->second].blob;
    // The hash only narrows the search: equal size and equal bytes decide.
    bool same = known.size == blob.size && (blob.size == 0 || std::memcmp(known.data, blob.data, blob.size) == 0);
    known.release();  // the compare paged it in; the writer will read it again when its turn comes
    if (same) {
      blob.release();
      return it->second;
    }
  }
  auto id = static_cast<uint32_t>(entries_.size());
  ++stats_.tensors_unique;
  stats_.bytes_unique += blob.size;
  blob.release();
  entries_.push_back(Entry{hash, std::move(blob)});
  by_hash_.emplace(hash, id);
  return id;
}

}  // namespace ctxgen
