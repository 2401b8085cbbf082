#pragma once
// Files that begin with 8 magic bytes, the size of a JSON header and (cache entries) its
// XXH3-128, then the header and the bytes it describes: objects (.ctxo) and compile cache entries.
// Tests take them apart and make them again, as someone editing such a file would.

#include <cstring>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "ctxgen/bytes.h"
#include "e2e.h"

namespace ctxgen::testing {

struct Framed {
  nlohmann::json header;
  std::string rest;
};

// `hashed`: a cache entry, whose header's hash follows its size.
inline Framed read_framed(const fs::path& path, bool hashed) {
  const std::string bytes = read_file(path);
  uint64_t size = 0;
  std::memcpy(&size, bytes.data() + 8, 8);
  const size_t start = hashed ? 32 : 16;
  return {nlohmann::json::parse(bytes.substr(start, size)), bytes.substr(start + size)};
}

inline void write_framed(const fs::path& path, const char (&magic)[9], const Framed& f, bool hashed) {
  const std::string text = f.header.dump();
  const uint64_t size = text.size();
  std::string bytes(magic, 8);
  bytes.append(reinterpret_cast<const char*>(&size), 8);
  if (hashed) {
    const Hash128 h = xxh3_128(reinterpret_cast<const uint8_t*>(text.data()), text.size());
    bytes.append(reinterpret_cast<const char*>(&h.low), 8);
    bytes.append(reinterpret_cast<const char*>(&h.high), 8);
  }
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes << text << f.rest;
}

}  // namespace ctxgen::testing
