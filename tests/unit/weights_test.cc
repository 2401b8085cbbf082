#include <gtest/gtest.h>

#include <cstring>

#include "ctxgen/weights.h"

namespace ctxgen {
namespace {

Blob bytes(std::vector<uint8_t> v) { return Blob::owned(std::move(v)); }

TEST(WeightStore, IdenticalBytesAreStoredOnceWhateverTheirSource) {
  WeightStore store;
  std::vector<uint8_t> a = {1, 2, 3, 4};
  uint32_t first = store.intern(bytes(a));
  // A view of other memory with equal bytes (another model, another name) is the same weight.
  auto other = std::make_shared<std::vector<uint8_t>>(a);
  uint32_t second = store.intern(Blob{other->data(), other->size(), other, nullptr, 0});
  uint32_t different = store.intern(bytes({1, 2, 3, 5}));
  EXPECT_EQ(first, second);
  EXPECT_NE(first, different);
  EXPECT_EQ(store.size(), 2u);
  const auto& s = store.stats();
  EXPECT_EQ(s.tensors_seen, 3u);
  EXPECT_EQ(s.tensors_unique, 2u);
  EXPECT_EQ(s.bytes_seen, 12u);
  EXPECT_EQ(s.bytes_unique, 8u);
}

TEST(WeightStore, AHashCollisionNeverMergesDifferentBytes) {
  WeightStore store([](const uint8_t*, size_t) { return Hash128{42, 42}; });
  uint32_t a = store.intern(bytes({1, 2, 3, 4}));
  uint32_t b = store.intern(bytes({4, 3, 2, 1}));
  uint32_t c = store.intern(bytes({1, 2, 3}));  // same hash, other size
  uint32_t a2 = store.intern(bytes({1, 2, 3, 4}));
  EXPECT_NE(a, b);
  EXPECT_NE(a, c);
  EXPECT_NE(b, c);
  EXPECT_EQ(a, a2);
  EXPECT_EQ(store.size(), 3u);
  EXPECT_EQ(std::memcmp(store.entry(b).blob.data, "\x04\x03\x02\x01", 4), 0);
}

TEST(WeightStore, EmptyTensorsDeduplicate) {
  WeightStore store;
  EXPECT_EQ(store.intern(bytes({})), store.intern(bytes({})));
  EXPECT_EQ(store.stats().bytes_unique, 0u);
}

TEST(WeightStore, HashesAreXxh3Of128Bits) {
  WeightStore store;
  std::vector<uint8_t> data(1000, 7);
  uint32_t id = store.intern(bytes(data));
  EXPECT_EQ(store.entry(id).hash, xxh3_128(data.data(), data.size()));
  EXPECT_EQ(store.entry(id).hash.hex().size(), 32u);
  EXPECT_NE(xxh3_128(data.data(), 999), store.entry(id).hash);
}

}  // namespace
}  // namespace ctxgen
