#include <algorithm>
#include <cstring>

#include "ctxgen/weights.h"

namespace ctxgen {

WeightStore::WeightStore(Hasher hasher) : hasher_(std::move(hasher)) {}

uint32_t WeightStore::intern(Blob blob) {
  Hash128 source_hash;
  if (blob.source) {
    {
      const PinnedBytes source = blob.source->pin();
      source_hash = hasher_(source.data, source.size);
      auto [begin, end] = by_source_.equal_range(source_hash);
      for (auto it = begin; it != end; ++it) {
        const auto& [id, known] = it->second;
        if (entries_[id].blob.transform != blob.transform || known->size != source.size ||
            (source.size > 0 && std::memcmp(known->pin().data, source.data, source.size) != 0))
          continue;
        known->release();
        blob.source->release();
        ++stats_.tensors_seen;
        stats_.bytes_seen += blob.size;
        return id;
      }
    }
    blob.source->release();
    if (!plain_sizes_.contains(blob.size)) {
      const auto id = static_cast<uint32_t>(entries_.size());
      count_new(blob.size);
      entries_.push_back(Entry{std::nullopt, std::move(blob), {}});
      unhashed_by_size_.emplace(entries_[id].blob.size, id);
      by_source_.emplace(source_hash, std::make_pair(id, entries_[id].blob.source));
      return id;
    }
  } else {
    hash_unhashed(blob.size);
    plain_sizes_.insert(blob.size);
  }
  const uint32_t id = intern_bytes(std::move(blob));
  if (entries_[id].blob.source) by_source_.emplace(source_hash, std::make_pair(id, entries_[id].blob.source));
  return id;
}

void WeightStore::count_new(size_t size) {
  ++stats_.tensors_seen;
  stats_.bytes_seen += size;
  ++stats_.tensors_unique;
  stats_.bytes_unique += size;
}

void WeightStore::hash_unhashed(size_t size) {
  auto [begin, end] = unhashed_by_size_.equal_range(size);
  for (auto it = begin; it != end; ++it) {
    Entry& entry = entries_[it->second];
    const PinnedBytes bytes = entry.blob.pin();
    entry.hash = hasher_(bytes.data, bytes.size);
    by_hash_.emplace(*entry.hash, it->second);
  }
  unhashed_by_size_.erase(size);
}

uint32_t WeightStore::intern_bytes(Blob blob) {
  const PinnedBytes bytes = blob.pin();
  Hash128 hash = hasher_(bytes.data, bytes.size);
  auto [begin, end] = by_hash_.equal_range(hash);
  for (auto it = begin; it != end; ++it) {
    const Blob& known = entries_[it->second].blob;
    // The hash only narrows the search: equal size and equal bytes decide.
    bool same = known.size == blob.size && (blob.size == 0 || std::memcmp(known.pin().data, bytes.data, blob.size) == 0);
    known.release();  // the compare paged it in; the writer will read it again when its turn comes
    if (same) {
      ++stats_.tensors_seen;
      stats_.bytes_seen += blob.size;
      blob.release();
      Entry& entry = entries_[it->second];
      const auto at = [&blob](const Blob& b) { return b.file->path() == blob.file->path() && b.file_offset == blob.file_offset; };
      if (blob.file && !blob.make && !(known.file && at(known)) &&
          std::none_of(entry.also_in_files.begin(), entry.also_in_files.end(), at))
        entry.also_in_files.push_back(std::move(blob));
      return it->second;
    }
  }
  auto id = static_cast<uint32_t>(entries_.size());
  count_new(blob.size);
  blob.release();
  entries_.push_back(Entry{hash, std::move(blob), {}});
  by_hash_.emplace(hash, id);
  return id;
}

}  // namespace ctxgen
