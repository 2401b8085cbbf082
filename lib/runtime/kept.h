#pragma once
// What the runtime keeps for the whole process, looked up by the bytes it is made from, so that a
// session loading what an earlier session of the process loaded does not make it again.

#include <atomic>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>

#include "ctxgen/bytes.h"

namespace ctxgen::runtime {

// The `capacity` most recently used values, each made once from its key (every byte the value
// depends on). Values are immutable and shared: a session holds its own reference, so eviction
// never pulls one from under a session.
template <class T>
class Kept {
 public:
  explicit Kept(size_t capacity) : capacity_(capacity) {}

  template <class Make>
  std::shared_ptr<const T> find(const std::string& key, Make make) {
    {
      std::lock_guard lock(mutex_);
      if (auto it = index_.find(key); it != index_.end()) {
        order_.splice(order_.begin(), order_, it->second);
        return it->second->second;
      }
    }
    std::shared_ptr<const T> made = make();  // outside the lock: sessions created at once do not wait
    ++made_;
    std::lock_guard lock(mutex_);
    if (auto it = index_.find(key); it != index_.end()) return it->second->second;
    order_.emplace_front(key, made);
    index_.emplace(key, order_.begin());
    if (order_.size() > capacity_) {
      index_.erase(order_.back().first);
      order_.pop_back();
    }
    return made;
  }

  // How many values were made (not found).
  uint64_t made() const { return made_; }

 private:
  // Keys run to kilobytes: xxHash reads one in well under a microsecond.
  struct Hash {
    size_t operator()(const std::string& key) const {
      return xxh3_128(reinterpret_cast<const uint8_t*>(key.data()), key.size()).low;
    }
  };

  const size_t capacity_;
  std::atomic<uint64_t> made_{0};
  std::mutex mutex_;
  std::list<std::pair<std::string, std::shared_ptr<const T>>> order_;  // most recent first
  std::unordered_map<std::string, typename decltype(order_)::iterator, Hash> index_;
};

}  // namespace ctxgen::runtime
