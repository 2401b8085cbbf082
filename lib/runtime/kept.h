#pragma once
// What the runtime keeps for the whole process, looked up by the bytes it is made from, so that a
// session loading what an earlier session of the process loaded does not make it again.

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "ctxgen/bytes.h"
#include "ctxgen/ref_program.h"

namespace ctxgen::runtime {

// Keys are the bytes of what a value is made of, lengths before lists and text so that no two
// different inputs run together into one key.
inline void put(std::string& key, const void* data, size_t bytes) { key.append(static_cast<const char*>(data), bytes); }
template <class T>
  requires std::is_trivially_copyable_v<T>
void put(std::string& key, const T& value) {
  put(key, &value, sizeof value);
}
template <class T>
void put(std::string& key, const std::vector<T>& values) {
  put(key, values.size());
  put(key, values.data(), values.size() * sizeof(T));
}
inline void put(std::string& key, const std::string& text) {
  put(key, text.size());
  put(key, text.data(), text.size());
}
// An op's type and attributes: with its operands' types and dims, all a plan is made of.
inline void put(std::string& key, const ref::Op& op) {
  put(key, op.type);
  put(key, op.attrs.size());
  for (const ref::Attr& a : op.attrs) {
    put(key, a.name);
    put(key, a.kind);
    put(key, a.i);
    put(key, a.f);
    put(key, a.ints);
    put(key, a.floats);
  }
}

// The `capacity` most recently used values (none when 0), each made once from its key (every byte
// the value depends on). Values are immutable and shared: a session holds its own reference, so
// eviction never pulls one from under a session.
template <class T>
class Kept {
 public:
  explicit Kept(size_t capacity) : capacity_(capacity) {}

  template <class Make>
  std::shared_ptr<const T> find(const std::string& key, Make make) {
    {
      std::lock_guard lock(mutex_);
      if (auto it = index_.find(key); it != index_.end()) {
        order_.splice(order_.begin(), order_, it->second.used);
        return it->second.value;
      }
    }
    std::shared_ptr<const T> made = make();  // outside the lock: sessions created at once do not wait
    std::lock_guard lock(mutex_);
    auto [it, added] = index_.try_emplace(key, Entry{made, {}});
    if (!added) return it->second.value;  // another session made it meanwhile
    try {
      order_.push_front(&it->first);
    } catch (...) {
      index_.erase(it);
      throw;
    }
    it->second.used = order_.begin();
    if (order_.size() > capacity_) {
      index_.erase(*order_.back());
      order_.pop_back();
    }
    return made;
  }

 private:
  // Keys run to kilobytes: xxHash reads one in well under a microsecond.
  struct Hash {
    size_t operator()(const std::string& key) const {
      return xxh3_128(reinterpret_cast<const uint8_t*>(key.data()), key.size()).low;
    }
  };
  struct Entry {
    std::shared_ptr<const T> value;
    std::list<const std::string*>::iterator used;  // in order_
  };

  const size_t capacity_;
  std::mutex mutex_;
  std::unordered_map<std::string, Entry, Hash> index_;  // each key held once, here
  std::list<const std::string*> order_;                 // index_'s keys, most recently used first
};

// Values shared while some session holds them, each made once from its key: those too large to
// keep past the last session using them (weights laid out at load). Entries of released values are
// dropped as new ones come.
template <class T>
class KeptWhileUsed {
 public:
  template <class Make>
  std::shared_ptr<const T> find(const std::string& key, Make make) {
    {
      std::lock_guard lock(mutex_);
      if (auto it = index_.find(key); it != index_.end())
        if (auto value = it->second.lock()) return value;
    }
    std::shared_ptr<const T> made = make();  // outside the lock, as Kept does
    std::lock_guard lock(mutex_);
    std::erase_if(index_, [](const auto& entry) { return entry.second.expired(); });
    auto [it, added] = index_.try_emplace(key, made);
    if (!added) {
      if (auto value = it->second.lock()) return value;  // another session made it meanwhile
      it->second = made;
    }
    return made;
  }

 private:
  std::mutex mutex_;
  std::unordered_map<std::string, std::weak_ptr<const T>> index_;
};

}  // namespace ctxgen::runtime
