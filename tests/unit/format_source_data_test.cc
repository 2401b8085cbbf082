// Source data (docs/context-binary-format.md §6): a weightless binary using the bytes of tensors in
// its source model's external-data file, found in the folder it is told, checked tensor by tensor.

#include "format_test_util.h"

namespace ctxgen {
namespace {

using namespace testing;
namespace fs = std::filesystem;

const BinaryIdentity kIdentity{"ref", "sdk-1", "cpu-avx2"};

std::vector<uint32_t> ids(size_t count) {
  std::vector<uint32_t> all(count);
  for (uint32_t id = 0; id < count; ++id) all[id] = id;
  return all;
}

std::vector<uint8_t> write_bytes(const std::vector<WeightPayload>& weights, const std::vector<WeightFile>& files) {
  std::vector<uint8_t> out;
  write_context_binary(
      kIdentity, {make_graph("g", {io("x", 1, {2})}, {io("y", 1, {2})}, {1, 2, 3}, ids(weights.size()))}, weights,
      [&](const uint8_t* data, size_t size) { out.insert(out.end(), data, data + size); }, {}, files);
  return out;
}

WeightPayload in_source(const std::vector<uint8_t>& data, uint64_t offset, uint64_t size) {
  WeightPayload w{xxh3_128(data.data() + offset, size), Blob::owned(std::vector<uint8_t>(size)), 1, offset};
  return w;
}

// model.onnx.data holds 1000 bytes; the binary holds weight 0 and refers to two tensors of the
// data file: 'a' at offset 5 (not aligned) and 'b' at offset 512.
struct Weightless {
  TempDir dir;
  std::vector<uint8_t> data = pattern(1000, 9);
  fs::path binary;
  Weightless(const std::string& location = "model.onnx.data") {
    fs::create_directories(dir.path() / "models");
    dir.write("models/model.onnx.data", data);
    binary = dir.write("m.bin", write_bytes({make_weight(pattern(64, 1)), in_source(data, 5, 100), in_source(data, 512, 256)},
                                            {{location, WeightFileKind::kSourceData, {}, {"a", "b"}}}));
  }
  fs::path source() const { return dir.path() / "models"; }
};

TEST(SourceData, WeightsAreTheSourceFilesBytesAlignedAsPayloads) {
  Weightless w;
  const auto binary = ContextBinary::open(w.binary, [&] { return std::optional(w.source()); });
  ASSERT_EQ(binary->weight_files().size(), 1u);
  EXPECT_EQ(binary->weight_files()[0], (WeightFile{"model.onnx.data", WeightFileKind::kSourceData, {}, {"a", "b"}}));
  EXPECT_EQ(binary->weights()[1].offset, 5u);
  for (uint32_t id : {1u, 2u}) {
    const WeightRecord& r = binary->weights()[id];
    EXPECT_TRUE(std::equal(w.data.begin() + static_cast<long>(r.offset), w.data.begin() + static_cast<long>(r.offset + r.size),
                           binary->weight_data(id)));
    EXPECT_EQ(reinterpret_cast<uintptr_t>(binary->weight_data(id)) % kPayloadAlignment, 0u) << "weight " << id;
  }
  const std::vector<uint8_t> own = pattern(64, 1);
  EXPECT_TRUE(std::equal(own.begin(), own.end(), binary->weight_data(0)));
  EXPECT_NO_THROW(binary->verify_payloads());
}

TEST(SourceData, WeightsAlignedForTheirElementsAreReadInPlace) {
  TempDir dir;
  const std::vector<uint8_t> data = pattern(1000, 3);
  dir.write("m.data", data);
  const fs::path bin = dir.write("m.bin", write_bytes({make_weight(pattern(8, 1)), in_source(data, 8, 16), in_source(data, 40, 16), in_source(data, 60, 8)},
                                                      {{"m.data", WeightFileKind::kSourceData, {}, {"eight", "forty", "sixty"}}}));
  const auto binary = ContextBinary::open(bin);
  EXPECT_EQ(binary->weight_data(2) - binary->weight_data(1), 32) << "both are read from the mapped file";
  EXPECT_EQ(reinterpret_cast<uintptr_t>(binary->weight_data(1)) % 8, 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(binary->weight_data(3)) % kPayloadAlignment, 0u) << "at 60: copied";
  EXPECT_TRUE(std::equal(data.begin() + 60, data.begin() + 68, binary->weight_data(3)));
}

TEST(SourceData, TheSourceFolderIsAskedForOnlyWhenThereIsSourceData) {
  TempDir dir;
  const fs::path plain = dir.write("plain.bin", write_to_memory(kIdentity, {}, {make_weight(pattern(8, 1))}));
  bool asked = false;
  EXPECT_NO_THROW(ContextBinary::open(plain, [&] {
    asked = true;
    return std::optional(dir.path());
  }));
  EXPECT_FALSE(asked);
  // Not opened at all: the tables are read, a weight of the source data cannot be.
  Weightless w;
  const auto tables = ContextBinary::open(w.binary, [] { return std::nullopt; });
  EXPECT_EQ(tables->weight_file_label(1), "");
  EXPECT_NO_THROW(tables->weight_data(0));
  expect_error([&] { tables->weight_data(1); }, ErrorCode::kInvalidBinary, {"source data 'model.onnx.data', which was not opened"});
}

TEST(SourceData, ByDefaultTheDataIsLookedForBesideTheBinary) {
  Weightless w;
  expect_error([&] { ContextBinary::open(w.binary); }, ErrorCode::kInvalidBinary, {"model.onnx.data"});
  fs::copy_file(w.source() / "model.onnx.data", w.dir.path() / "model.onnx.data");
  EXPECT_NO_THROW(ContextBinary::open(w.binary));
}

TEST(SourceData, AChangedTensorIsNamed) {
  Weightless w;
  std::vector<uint8_t> changed = w.data;
  changed[600] ^= 1;  // inside 'b'
  w.dir.write("models/model.onnx.data", changed);
  expect_error([&] { ContextBinary::open(w.binary, [&] { return std::optional(w.source()); }); }, ErrorCode::kMismatch,
               {"source data 'model.onnx.data'", "tensor 'b' (offset 512, size 256)", "changed since it was compiled"});
  changed = w.data;
  changed.resize(700);  // 'b' ends at 768
  w.dir.write("models/model.onnx.data", changed);
  expect_error([&] { ContextBinary::open(w.binary, [&] { return std::optional(w.source()); }); }, ErrorCode::kMismatch,
               {"is 700 bytes, but tensor 'b' was compiled from its bytes (offset 512, size 256)"});
}

TEST(SourceData, PathsStayInsideTheSourceFolder) {
  for (const std::string location : {"../models/model.onnx.data", "/etc/passwd"}) {
    Weightless w(location);
    expect_error([&] { ContextBinary::open(w.binary, [&] { return std::optional(w.source()); }); }, ErrorCode::kInvalidBinary, {location});
  }
  Weightless w;
  fs::remove(w.source() / "model.onnx.data");
  fs::create_symlink(w.dir.path() / "elsewhere.data", w.source() / "model.onnx.data");
  w.dir.write("elsewhere.data", w.data);
  expect_error([&] { ContextBinary::open(w.binary, [&] { return std::optional(w.source()); }); }, ErrorCode::kInvalidBinary, {"model.onnx.data"});
}

TEST(SourceData, AnInMemoryBinaryCannotNameIt) {
  Weightless w;
  expect_error([&] { read_from_memory(read_file(w.binary)); }, ErrorCode::kInvalidBinary,
               {"holds its weights in weight files ('model.onnx.data'"});
}

// The weight file record after the path: kind (+0), content id (+4, +12), tensor count (+20).
size_t record_field(const std::vector<uint8_t>& bytes, size_t field) {
  const size_t path_length = get_le(bytes, get_le(bytes, spec::kWeightFileTableOffset, 8), 4);
  return get_le(bytes, spec::kWeightFileTableOffset, 8) + 4 + path_length + field;
}

TEST(SourceData, DamagedRecordsAreRefusedNamingTheField) {
  Weightless w;
  const std::vector<uint8_t> good = read_file(w.binary);
  std::vector<uint8_t> bytes = good;
  put_le(bytes, record_field(bytes, 0), 2, 4);
  reseal(bytes);
  expect_error([&] { read_from_memory(bytes); }, ErrorCode::kInvalidBinary,
               {"weight file 1: kind is 2, expected 0 (weights file) or 1 (source data)"});
  bytes = good;
  put_le(bytes, record_field(bytes, 4), 7, 8);
  reseal(bytes);
  expect_error([&] { read_from_memory(bytes); }, ErrorCode::kInvalidBinary, {"expected zero for source data"});
  bytes = good;
  put_le(bytes, record_field(bytes, 0), 0, 4);  // a weights file naming tensors
  reseal(bytes);
  expect_error([&] { read_from_memory(bytes); }, ErrorCode::kInvalidBinary,
               {"names 2 tensors, expected 0 (a weights file names none)"});
  bytes = good;
  put_le(bytes, weight_field(bytes, 2, 32), 0, 4);  // weight 2 moved into this binary: one tensor too many
  reseal(bytes);
  expect_error([&] { read_from_memory(bytes); }, ErrorCode::kInvalidBinary,
               {"names 2 tensors, expected 1 (one for each weight held there)"});
  bytes = good;
  put_le(bytes, record_field(bytes, 24), 0, 4);  // tensor 'a' has an empty name; 1 byte is left over
  reseal(bytes);
  expect_error([&] { read_from_memory(bytes); }, ErrorCode::kInvalidBinary, {"a tensor name is empty"});
}

TEST(SourceData, TheWriterRefusesWhatTheReaderWould) {
  const std::vector<uint8_t> data = pattern(100, 1);
  const std::vector<WeightPayload> weights = {make_weight(pattern(8, 1)), in_source(data, 3, 10), in_source(data, 20, 10)};
  expect_error([&] { write_bytes(weights, {{"d", WeightFileKind::kSourceData, {}, {"a"}}}); }, ErrorCode::kInternal,
               {"names 1 tensors for the 2 weights held there"});
  expect_error([&] { write_bytes(weights, {{"d", WeightFileKind::kSourceData, {1, 2}, {"a", "b"}}}); },
               ErrorCode::kInternal, {"source data file 'd' has a content id"});
  expect_error([&] { write_bytes(weights, {{"d", WeightFileKind::kSourceData, {}, {"a", ""}}}); }, ErrorCode::kInternal,
               {"empty name"});
  expect_error([&] { write_bytes(weights, {{"d", WeightFileKind::kWeights, {}, {}}}); }, ErrorCode::kInternal,
               {"not a multiple of 64"});
}

}  // namespace
}  // namespace ctxgen
