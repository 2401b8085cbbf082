// Weight files (docs/context-binary-format.md §6): a binary using the weights another binary holds,
// how it finds that file, and every way the pair can be wrong.

#include "format_test_util.h"

namespace ctxgen {
namespace {

using namespace testing;
namespace fs = std::filesystem;

const BinaryIdentity kIdentity{"ref", "sdk-1", "cpu-avx2"};

std::vector<uint8_t> write_bytes(const BinaryIdentity& identity, const std::vector<CompiledGraph>& graphs,
                                 const std::vector<WeightPayload>& weights, const std::vector<WeightFile>& files) {
  std::vector<uint8_t> out;
  write_context_binary(
      identity, graphs, weights, [&](const uint8_t* data, size_t size) { out.insert(out.end(), data, data + size); },
      {}, files);
  return out;
}

WeightFile weights_file(const std::string& path, Hash128 id) { return {path, WeightFileKind::kWeights, id, {}}; }

// A weights file holding two weights, and a binary using the second of them and one of its own.
struct Pair {
  std::vector<uint8_t> shared_bytes;
  Hash128 shared_id;
  uint64_t second_offset = 0;  // of the second shared weight, in the weights file

  Pair() {
    shared_bytes = write_bytes({"ref", "sdk-1", ""}, {}, {make_weight(pattern(100, 1)), make_weight(pattern(300, 2))}, {});
    auto opened = read_from_memory(shared_bytes);
    shared_id = opened->content_id();
    second_offset = opened->weights()[1].offset;
  }

  std::vector<uint8_t> binary(const std::string& path, Hash128 id) const { return binary(path, id, second_offset); }
  std::vector<uint8_t> binary(const std::string& path, Hash128 id, uint64_t offset) const {
    std::vector<WeightPayload> weights = {make_weight(pattern(64, 7)), make_weight(pattern(300, 2))};
    weights[1].file = 1;
    weights[1].file_offset = offset;
    weights[1].blob = Blob::owned(std::vector<uint8_t>(300));  // its size; the bytes are the weights file's
    return write_bytes(kIdentity, {make_graph("g", {io("x", 1, {2})}, {io("y", 1, {2})}, {1, 2, 3}, {0, 1})},
                       weights, {weights_file(path, id)});
  }
};

fs::path write_at(const fs::path& file, const std::vector<uint8_t>& bytes) {
  fs::create_directories(file.parent_path());
  std::ofstream out(file, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  return file;
}

TEST(WeightFiles, AWeightInAWeightsFileIsReadFromThere) {
  TempDir dir;
  const Pair pair;
  write_at(dir.path() / "w.bin", pair.shared_bytes);
  const fs::path main = write_at(dir.path() / "m.bin", pair.binary("w.bin", pair.shared_id));
  const auto binary = ContextBinary::open(main);
  ASSERT_EQ(binary->weight_files().size(), 1u);
  EXPECT_EQ(binary->weight_files()[0], (WeightFile{"w.bin", WeightFileKind::kWeights, pair.shared_id, {}}));
  EXPECT_EQ(binary->weights()[1].file, 1u);
  const std::vector<uint8_t> expected = pattern(300, 2);
  EXPECT_TRUE(std::equal(expected.begin(), expected.end(), binary->weight_data(1)));
  EXPECT_EQ(binary->weight_data(1), binary->weight_file(1).weight_data(1));
  const std::vector<uint8_t> own = pattern(64, 7);
  EXPECT_TRUE(std::equal(own.begin(), own.end(), binary->weight_data(0)));
  EXPECT_NO_THROW(binary->verify_payloads());
  // Only the binary's own weight takes bytes in it.
  EXPECT_LT(fs::file_size(main), 600u);
}

TEST(WeightFiles, AWeightsFileOfAnotherCompilationIsRefusedNamingBothIds) {
  TempDir dir;
  const Pair pair;
  write_at(dir.path() / "w.bin", pair.shared_bytes);
  const Hash128 other{1, 2};
  const fs::path main = write_at(dir.path() / "m.bin", pair.binary("w.bin", other));
  expect_error([&] { ContextBinary::open(main); }, ErrorCode::kInvalidBinary,
               {main.string() + ": weight file 'w.bin'", "has content id " + pair.shared_id.hex(),
                "written with the one whose id is " + other.hex()});
}

TEST(WeightFiles, AWeightTheWeightsFileDoesNotHoldIsRefused) {
  TempDir dir;
  const Pair pair;
  write_at(dir.path() / "w.bin", pair.shared_bytes);
  const fs::path main = write_at(dir.path() / "m.bin", pair.binary("w.bin", pair.shared_id, pair.second_offset + 64));
  expect_error([&] { ContextBinary::open(main); }, ErrorCode::kInvalidBinary,
               {"holds no weight at offset " + std::to_string(pair.second_offset + 64), "the binary's weight 1"});
}

TEST(WeightFiles, AWeightsFileMustHoldOnlyWeights) {
  TempDir dir;
  const Pair pair;
  // A binary with a graph has a content id like any other; it is still not a weights file.
  const std::vector<uint8_t> with_graph = pair.binary("x.bin", pair.shared_id);
  write_at(dir.path() / "w.bin", with_graph);
  const Hash128 id = xxh3_128(with_graph.data(), metadata_end(with_graph));  // §7: the content id
  const fs::path main = write_at(dir.path() / "m.bin", pair.binary("w.bin", id));
  // It names x.bin, which is missing: not followed, so what is wrong is that it is no weights file.
  expect_error([&] { ContextBinary::open(main); }, ErrorCode::kInvalidBinary,
               {"is not a weights file: it has 1 graphs and names 1 weight files, expected none"});
}

TEST(WeightFiles, AWeightsFileNamingWeightFilesIsRefusedNotFollowed) {
  TempDir dir;
  const Pair pair;
  // A binary naming itself as its weights file: refused, not opened again and again.
  const fs::path path = write_at(dir.path() / "self.bin", pair.binary("self.bin", {}));
  expect_error([&] { ContextBinary::open(path); }, ErrorCode::kInvalidBinary,
               {"weight file 'self.bin'", "is not a weights file: it has 1 graphs and names 1 weight files"});
}

TEST(WeightFiles, AnEmptyWeightSharingAnOffsetDoesNotHideTheOneThere) {
  TempDir dir;
  // An empty payload gets the offset the next payload starts at.
  const std::vector<uint8_t> shared = write_bytes({"ref", "sdk-1", ""}, {}, {make_weight({}), make_weight(pattern(8, 3))}, {});
  write_at(dir.path() / "w.bin", shared);
  const auto held = read_from_memory(shared);
  ASSERT_EQ(held->weights()[0].offset, held->weights()[1].offset);
  std::vector<WeightPayload> weights = {make_weight(pattern(8, 3))};
  weights[0].file = 1;
  weights[0].file_offset = held->weights()[1].offset;
  const fs::path main = write_at(dir.path() / "m.bin", write_bytes(kIdentity, {}, weights, {weights_file("w.bin", held->content_id())}));
  const auto binary = ContextBinary::open(main);
  const std::vector<uint8_t> expected = pattern(8, 3);
  EXPECT_TRUE(std::equal(expected.begin(), expected.end(), binary->weight_data(0)));
}

TEST(WeightFiles, AWeightsFileOfAnotherBackendOrSdkIsRefused) {
  TempDir dir;
  const Pair pair;
  const std::vector<uint8_t> other = write_bytes({"ref", "sdk-2", ""}, {}, {make_weight(pattern(300, 2))}, {});
  write_at(dir.path() / "w.bin", other);
  const auto opened = read_from_memory(other);
  const fs::path main =
      write_at(dir.path() / "m.bin", pair.binary("w.bin", opened->content_id(), opened->weights()[0].offset));
  expect_error([&] { ContextBinary::open(main); }, ErrorCode::kInvalidBinary,
               {"was written by backend 'ref' sdk-2, the binary by 'ref' sdk-1"});
}

TEST(WeightFiles, PathsFollowTheContextPathRules) {
  TempDir dir;
  const Pair pair;
  write_at(dir.path() / "w.bin", pair.shared_bytes);
  const auto refused = [&](const std::string& path, const std::string& why) {
    SCOPED_TRACE(path);
    const fs::path main = write_at(dir.path() / "sub" / "m.bin", pair.binary(path, pair.shared_id));
    expect_error([&] { ContextBinary::open(main); }, ErrorCode::kInvalidBinary, {"weight file '" + path + "'", why});
  };
  refused("../w.bin", "contains '..'; it must not point outside the binary's folder");
  refused((dir.path() / "w.bin").string(), "is an absolute path");
  refused("missing.bin", "does not exist or is not a regular file");
  fs::create_symlink(dir.path() / "w.bin", dir.path() / "sub" / "link.bin");
  refused("link.bin", "outside the binary's folder");
}

TEST(WeightFiles, AnInMemoryBinaryCannotNameWeightFiles) {
  const Pair pair;
  const std::vector<uint8_t> bytes = pair.binary("w.bin", pair.shared_id);
  expect_error([&] { read_from_memory(bytes, "embedded"); }, ErrorCode::kInvalidBinary,
               {"embedded: holds its weights in weight files ('w.bin', ...)"});
}

TEST(WeightFiles, InsideAModelPackageAPathMayLeadIntoItsSharedAssetsOnly) {
  TempDir dir;
  const Pair pair;
  const fs::path package = dir.path() / "pkg";
  write_at(package / "shared_assets" / "sha256-ab" / "w.bin", pair.shared_bytes);
  write_at(package / "elsewhere" / "w.bin", pair.shared_bytes);
  const fs::path main = package / "model" / "avx2" / "m.bin";
  write_at(main, pair.binary("../../shared_assets/sha256-ab/w.bin", pair.shared_id));
  // Without a manifest.json above it, the folder is no package.
  expect_error([&] { ContextBinary::open(main); }, ErrorCode::kInvalidBinary, {"contains '..'"});
  // Another tool's manifest.json makes no package either.
  write_at(package / "manifest.json", {'{', '}'});
  expect_error([&] { ContextBinary::open(main); }, ErrorCode::kInvalidBinary, {"contains '..'"});
  const std::string manifest = R"({"schema_version": "1.0", "components": {}})";
  write_at(package / "manifest.json", std::vector<uint8_t>(manifest.begin(), manifest.end()));
  const auto binary = ContextBinary::open(main);
  EXPECT_EQ(binary->weight_file(1).label(),
            fs::canonical(package / "shared_assets" / "sha256-ab" / "w.bin").string());
  write_at(main, pair.binary("../../elsewhere/w.bin", pair.shared_id));
  expect_error([&] { ContextBinary::open(main); }, ErrorCode::kInvalidBinary,
               {"leads out of the binary's folder", "which is not in the shared assets '" + (package / "shared_assets").string()});
  write_at(main, pair.binary("../../../w.bin", pair.shared_id));
  write_at(dir.path() / "w.bin", pair.shared_bytes);
  expect_error([&] { ContextBinary::open(main); }, ErrorCode::kInvalidBinary, {"outside the model package"});
  // A '..' through a folder that does not exist is resolved by the kernel, not on paper.
  write_at(main, pair.binary("../nowhere/../../shared_assets/sha256-ab/w.bin", pair.shared_id));
  expect_error([&] { ContextBinary::open(main); }, ErrorCode::kInvalidBinary, {"does not exist or is not a regular file"});
  write_at(main, pair.binary("../../shared_assets/sha256-ab/w.bin/", pair.shared_id));
  expect_error([&] { ContextBinary::open(main); }, ErrorCode::kInvalidBinary, {"weight file '../../shared_assets/sha256-ab/w.bin/'"});
  // A link inside the shared assets that leads out of them is refused too, and so are shared
  // assets that are themselves a link out of the package.
  fs::create_symlink(package / "elsewhere" / "w.bin", package / "shared_assets" / "sha256-ab" / "link.bin");
  write_at(main, pair.binary("../../shared_assets/sha256-ab/link.bin", pair.shared_id));
  expect_error([&] { ContextBinary::open(main); }, ErrorCode::kInvalidBinary, {"which is not in the shared assets"});
  fs::rename(package / "shared_assets", dir.path() / "outside");
  fs::create_symlink(dir.path() / "outside", package / "shared_assets");
  write_at(main, pair.binary("../../shared_assets/sha256-ab/w.bin", pair.shared_id));
  expect_error([&] { ContextBinary::open(main); }, ErrorCode::kInvalidBinary, {"outside the model package"});
}

TEST(WeightFiles, TheWriterRefusesWhatTheReaderWould) {
  const Pair pair;
  std::vector<WeightPayload> weights = {make_weight(pattern(8, 1))};
  weights[0].file = 2;
  expect_error([&] { write_bytes(kIdentity, {}, weights, {weights_file("w.bin", {})}); }, ErrorCode::kInternal,
               {"weight 0 is in weight file 2, but there are only 1"});
  weights[0].file = 1;
  weights[0].file_offset = 3;
  expect_error([&] { write_bytes(kIdentity, {}, weights, {weights_file("w.bin", {})}); }, ErrorCode::kInternal,
               {"not a multiple of 64"});
  expect_error([&] { write_bytes(kIdentity, {}, {}, {weights_file("", {})}); }, ErrorCode::kInternal, {"empty path"});
  expect_error([&] { write_bytes(kIdentity, {}, {}, {weights_file("w.bin", {}), weights_file("w.bin", {})}); }, ErrorCode::kInternal,
               {"weight file 'w.bin' appears twice"});
}

TEST(WeightFiles, DamagedTablesAreRefusedNamingTheField) {
  const Pair pair;
  std::vector<uint8_t> bytes = pair.binary("w.bin", pair.shared_id);
  put_le(bytes, weight_field(bytes, 1, 32), 2, 4);
  reseal(bytes);
  expect_error([&] { read_from_memory(bytes); }, ErrorCode::kInvalidBinary,
               {"weight table: weight 1 is in weight file 2, but the binary names 1 weight files"});
  bytes = pair.binary("w.bin", pair.shared_id);
  put_le(bytes, spec::kWeightFileCount, 0xffffffff, 4);
  reseal(bytes);
  expect_error([&] { read_from_memory(bytes); }, ErrorCode::kInvalidBinary,
               {"weight file count is 4294967295, but the weight file table is only 33 bytes"});
  bytes = pair.binary("w.bin", pair.shared_id);
  put_le(bytes, get_le(bytes, spec::kWeightFileTableOffset, 8), 0, 4);  // path length 0, 5 bytes left over
  reseal(bytes);
  expect_error([&] { read_from_memory(bytes); }, ErrorCode::kInvalidBinary, {"weight file 1: path is empty"});
}

}  // namespace
}  // namespace ctxgen
