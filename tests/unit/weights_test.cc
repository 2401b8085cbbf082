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
  uint32_t second = store.intern(Blob{other->data(), other->size(), other, nullptr, 0, {}, {}, {}});
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

// Bytes a transform makes (a packed weight) are not made by the store at all while no plain
// weight of their size is stored: the same transform of equal source bytes is matched by its
// source, so a group of N models packs each shared weight once, when the writer writes it. A
// plain weight of their size has them made and hashed, so made and plain bytes that are equal
// (a tied embedding stored once transposed) are one entry, whichever came first.
TEST(WeightStore, MadeBytesAreMadeOnlyToBeComparedWithPlainOnes) {
  WeightStore store([](const uint8_t* data, size_t size) { return Hash128{size > 0 ? data[0] : 0u, 7}; });
  int made = 0;
  auto reversed = [&made](const std::vector<uint8_t>& source, const std::string& transform) {
    Blob from = bytes(source);
    return Blob::made(source.size(), from, transform, [from, &made] {
      ++made;
      const PinnedBytes in = from.pin();
      return MadeBytes(std::make_reverse_iterator(in.data + in.size), std::make_reverse_iterator(in.data));
    });
  };
  uint32_t a = store.intern(reversed({1, 2, 3, 4}, "reverse"));
  uint32_t a2 = store.intern(reversed({1, 2, 3, 4}, "reverse"));  // another model's copy
  EXPECT_EQ(a, a2);
  EXPECT_FALSE(store.entry(a).hash.has_value());
  uint32_t colliding = store.intern(reversed({1, 9, 9, 9}, "reverse"));  // a source of the same hash
  EXPECT_NE(colliding, a);
  uint32_t other_size = store.intern(reversed({1, 2, 3, 4, 5}, "reverse"));
  EXPECT_EQ(made, 0);

  // A plain weight of size 4 has both made entries of that size made and hashed, and is the one
  // holding its bytes (made once more to compare them).
  uint32_t plain = store.intern(bytes({4, 3, 2, 1}));
  EXPECT_EQ(made, 3);
  EXPECT_EQ(plain, a);
  EXPECT_EQ(store.entry(a).hash, (Hash128{4, 7}));
  EXPECT_EQ(store.entry(colliding).hash, (Hash128{9, 7}));
  EXPECT_FALSE(store.entry(other_size).hash.has_value());

  // From now on a made weight of size 4 is made at once and compared: equal to the plain one.
  uint32_t plain_first = store.intern(bytes({8, 7, 6, 5}));
  uint32_t tied = store.intern(reversed({5, 6, 7, 8}, "reverse"));
  EXPECT_EQ(made, 4);
  EXPECT_EQ(tied, plain_first);
  EXPECT_NE(tied, a);

  EXPECT_EQ(store.stats().tensors_seen, 7u);
  EXPECT_EQ(store.stats().tensors_unique, 4u);
  EXPECT_EQ(store.stats().bytes_unique, 4u + 4 + 5 + 4);
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
  EXPECT_EQ(store.entry(id).hash->hex().size(), 32u);
  EXPECT_NE(xxh3_128(data.data(), 999), store.entry(id).hash);
}

}  // namespace
}  // namespace ctxgen
