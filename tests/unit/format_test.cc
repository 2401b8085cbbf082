// Context binary: round trips, layout (alignment, exact size formula from the spec), the exact
// bytes (a golden file), sinks, writer-side validation, and payload verification.

#include <algorithm>
#include <cstdio>

#include "format_test_util.h"

namespace ctxgen {
namespace {

using namespace testing;

const BinaryIdentity kIdentity{"ref", "sdk-1.2.3", "cpu-generic"};

uint64_t align64(uint64_t v) { return (v + 63) / 64 * 64; }

// The size formula of docs/context-binary-format.md §8, written out independently of the writer.
uint64_t expected_file_size(const BinaryIdentity& id, const std::vector<CompiledGraph>& graphs,
                            const std::vector<WeightPayload>& weights, const std::vector<WeightFile>& files = {}) {
  uint64_t metadata = 108 + 12 + id.backend.size() + id.sdk_version.size() + id.hardware_architecture.size();
  for (const auto& g : graphs) {
    metadata += 44 + g.name.size() + 4 * g.weight_ids.size();
    for (const auto* ios : {&g.inputs, &g.outputs})
      for (const auto& v : *ios) metadata += 12 + v.name.size() + 8 * v.dims.size();
    for (const auto& f : g.fixed_inputs) metadata += 12 + f.io.name.size() + 8 * f.io.dims.size() + 4 + f.value.size();
  }
  metadata += 36 * weights.size();
  for (const auto& f : files) {
    metadata += 28 + f.path.size();
    for (const auto& t : f.tensors) metadata += 4 + t.size();
  }
  uint64_t cursor = metadata;
  for (const auto& g : graphs) cursor = align64(cursor) + g.program.size();
  for (const auto& w : weights)
    if (w.file == 0) cursor = align64(cursor) + w.blob.size;
  return cursor;
}

struct Sample {
  std::vector<CompiledGraph> graphs;
  std::vector<WeightPayload> weights;
};

// Several inputs/outputs, a scalar, a zero dim, an empty program, fixed inputs, and shared weights.
Sample sample() {
  Sample s;
  s.weights = {make_weight(pattern(1, 1)), make_weight(pattern(100, 2)), make_weight(pattern(4096, 3)),
               make_weight({})};
  s.graphs.push_back(
      make_graph("prefill", {io("input_ids", 7, {1, 128}), io("mask", 9, {1, 128}), io("scale", 1, {})},
                 {io("logits", 1, {1, 128, 32000}), io("k", 10, {1, 8, 0, 64}), io("v", 10, {1, 8, 0, 64})},
                 pattern(777, 9), {0, 2, 3}));
  s.graphs.back().fixed_inputs = {{io("sr", 7, {}), {0x80, 0x3e, 0, 0, 0, 0, 0, 0}}, {io("flags", 9, {2}), {1, 0}}};
  s.graphs.push_back(make_graph("empty_program", {io("x", 1, {4})}, {io("y", 1, {4})}, {}, {}));
  s.graphs.push_back(
      make_graph("decode", {io("token", 7, {1, 1})}, {io("next", 1, {1, 32000})}, pattern(65, 4), {1, 2}));
  return s;
}

void expect_same_content(const ContextBinary& bin, const BinaryIdentity& identity, const Sample& s) {
  EXPECT_EQ(bin.format_version(), kContextBinaryVersion);
  EXPECT_EQ(bin.identity(), identity);
  ASSERT_EQ(bin.graphs().size(), s.graphs.size());
  for (size_t i = 0; i < s.graphs.size(); ++i) {
    const GraphRecord& got = bin.graphs()[i];
    const CompiledGraph& want = s.graphs[i];
    EXPECT_EQ(got.name, want.name);
    EXPECT_EQ(got.inputs, want.inputs);
    EXPECT_EQ(got.outputs, want.outputs);
    EXPECT_EQ(got.fixed_inputs, want.fixed_inputs);
    EXPECT_EQ(got.weight_ids, want.weight_ids);
    ASSERT_EQ(got.program_size, want.program.size());
    EXPECT_TRUE(std::equal(want.program.begin(), want.program.end(), got.program)) << got.name;
  }
  ASSERT_EQ(bin.weights().size(), s.weights.size());
  for (uint32_t id = 0; id < s.weights.size(); ++id) {
    const WeightRecord& got = bin.weights()[id];
    const Blob& want = s.weights[id].blob;
    EXPECT_EQ(got.hash, s.weights[id].hash);
    ASSERT_EQ(got.size, want.size);
    if (want.size > 0) {  // an empty blob's data may be null, which memcmp must not see
      EXPECT_EQ(std::memcmp(bin.weight_data(id), want.data, want.size), 0) << "weight " << id;
    }
  }
}

TEST(FormatRoundTrip, SeveralGraphsAndWeights) {
  Sample s = sample();
  auto bytes = write_to_memory(kIdentity, s.graphs, s.weights);
  auto bin = read_from_memory(bytes, "sample.bin");
  expect_same_content(*bin, kIdentity, s);
  EXPECT_EQ(bin->file_size(), bytes.size());
  EXPECT_EQ(bin->label(), "sample.bin");
  EXPECT_NO_THROW(bin->verify_payloads());
}

TEST(FormatRoundTrip, NoGraphsNoWeights) {
  BinaryIdentity empty_identity{"", "", ""};
  auto bytes = write_to_memory(empty_identity, {}, {});
  EXPECT_EQ(bytes.size(), 108u + 12u);
  auto bin = read_from_memory(bytes);
  EXPECT_EQ(bin->identity(), empty_identity);
  EXPECT_TRUE(bin->graphs().empty());
  EXPECT_TRUE(bin->weights().empty());
}

TEST(FormatRoundTrip, GraphsWithoutWeights) {
  Sample s;
  s.graphs.push_back(
      make_graph("only", {io("a", 1, {2, 2}), io("b", 1, {2, 2})}, {io("c", 1, {2, 2})}, pattern(10, 5), {}));
  auto bin = read_from_memory(write_to_memory(kIdentity, s.graphs, s.weights));
  expect_same_content(*bin, kIdentity, s);
}

TEST(FormatRoundTrip, ManyWeights) {
  Sample s;
  std::vector<uint32_t> all;
  for (uint32_t i = 0; i < 1000; ++i) {
    s.weights.push_back(make_weight(pattern(i % 200, static_cast<uint8_t>(i))));
    all.push_back(i);
  }
  s.graphs.push_back(make_graph("g", {io("x", 1, {1})}, {io("y", 1, {1})}, pattern(3, 0), all));
  auto bytes = write_to_memory(kIdentity, s.graphs, s.weights);
  auto bin = read_from_memory(bytes);
  expect_same_content(*bin, kIdentity, s);
  EXPECT_EQ(bytes.size(), expected_file_size(kIdentity, s.graphs, s.weights));
}

TEST(FormatRoundTrip, LargePayloadsThroughAFile) {
  Sample s;
  s.weights = {make_weight(pattern((3u << 20) + 5, 7)), make_weight(pattern(1, 8))};
  s.graphs.push_back(
      make_graph("big", {io("x", 1, {1024, 1024})}, {io("y", 1, {1024})}, pattern(100 * 1024, 1), {0, 1}));
  TempDir dir;
  auto path = dir.write("big_ref.bin", write_to_memory(kIdentity, s.graphs, s.weights));
  auto bin = ContextBinary::open(path);
  expect_same_content(*bin, kIdentity, s);
  EXPECT_EQ(bin->label(), path.string());
  EXPECT_NO_THROW(bin->verify_payloads());
}

TEST(FormatLayout, PayloadsAreAlignedAndPaddingIsZero) {
  Sample s = sample();
  auto owner = std::make_shared<std::vector<uint8_t>>(write_to_memory(kIdentity, s.graphs, s.weights));
  const std::vector<uint8_t>& bytes = *owner;
  auto bin = ContextBinary::from_memory(owner->data(), owner->size(), owner, "mem");
  std::vector<std::pair<uint64_t, uint64_t>> payloads;  // offset, size in file order
  for (const auto& g : bin->graphs()) payloads.emplace_back(g.program - bytes.data(), g.program_size);
  for (const auto& w : bin->weights()) payloads.emplace_back(w.offset, w.size);
  uint64_t cursor = metadata_end(bytes);
  for (const auto& [offset, size] : payloads) {
    EXPECT_EQ(offset % kPayloadAlignment, 0u) << offset;
    EXPECT_EQ(offset, align64(cursor)) << "payloads are packed in table order";
    for (uint64_t i = cursor; i < offset; ++i) EXPECT_EQ(bytes[i], 0) << "padding byte " << i;
    cursor = offset + size;
  }
  EXPECT_EQ(cursor, bytes.size()) << "the file ends with the last payload";
}

TEST(FormatLayout, ZeroCopyWeightsPointIntoTheBytes) {
  Sample s = sample();
  auto owner = std::make_shared<std::vector<uint8_t>>(write_to_memory(kIdentity, s.graphs, s.weights));
  auto bin = ContextBinary::from_memory(owner->data(), owner->size(), owner, "mem");
  for (uint32_t id = 0; id < bin->weights().size(); ++id)
    EXPECT_EQ(bin->weight_data(id), owner->data() + bin->weights()[id].offset);
  owner.reset();  // the binary keeps the bytes alive (ASan would flag a dangling read)
  EXPECT_EQ(bin->weight_data(1)[0], pattern(100, 2)[0]);
}

TEST(FormatLayout, FileSizeMatchesTheSpecFormula) {
  Sample s = sample();
  auto bytes = write_to_memory(kIdentity, s.graphs, s.weights);
  EXPECT_EQ(bytes.size(), expected_file_size(kIdentity, s.graphs, s.weights));
  EXPECT_EQ(get_le(bytes, spec::kFileSize, 8), bytes.size());
  EXPECT_EQ(get_le(bytes, spec::kHeaderSizeField, 4), spec::kHeaderSize);
  EXPECT_EQ(get_le(bytes, spec::kIdentityOffset, 8), spec::kHeaderSize);
  EXPECT_EQ(get_le(bytes, spec::kGraphCount, 4), s.graphs.size());
  EXPECT_EQ(get_le(bytes, spec::kWeightCount, 4), s.weights.size());
  EXPECT_EQ(std::string(bytes.begin(), bytes.begin() + 8), "CTXGENCB");
  // Walking the records as the spec describes them lands exactly on the weight table.
  auto graphs = locate_graphs(bytes);
  ASSERT_EQ(graphs.size(), s.graphs.size());
  EXPECT_EQ(graphs.back().end, get_le(bytes, spec::kWeightTableOffset, 8));
  EXPECT_EQ(get_le(bytes, graphs[0].program_size, 8), s.graphs[0].program.size());
  EXPECT_EQ(get_le(bytes, graphs[0].program_checksum, 8),
            XXH3_64bits(s.graphs[0].program.data(), s.graphs[0].program.size()));
  EXPECT_EQ(get_le(bytes, weight_field(bytes, 2, 0), 8), s.weights[2].hash->low);
  EXPECT_EQ(get_le(bytes, weight_field(bytes, 2, 8), 8), s.weights[2].hash->high);
}

// docs/context-binary-format.md §12, byte for byte. If this fails, the format changed: bump
// kContextBinaryVersion and update the spec.
TEST(FormatLayout, WorkedExampleFromTheSpec) {
  const std::string hex =
      "43545847454e4342040000006c000000c8010000000000009c7caf526e444807"
      "6c00000000000000150000000000000081000000000000007800000000000000"
      "f900000000000000480000000000000001000000020000004101000000000000"
      "2100000000000000010000000300000072656603000000312e30030000006370"
      "7501000000670100000001000000780100000001000000020000000000000001"
      "0000000100000079010000000100000002000000000000000100000001000000"
      "73070000000000000008000000803e0000000000008001000000000000040000"
      "00000000003fda4c5a612d925a02000000000000000100000002fb6872c57586"
      "3eb8a009dbfd63b42ac0010000000000000800000000000000000000001ce64d"
      "44835004de9004e29d8513b92b80000000000000000400000000000000010000"
      "0005000000772e62696e00000000000102030405060708090a0b0c0d0e0f0000"
      "0000000000000000000000000000000000000000000000000000000000000000"
      "50524f4700000000000000000000000000000000000000000000000000000000"
      "0000000000000000000000000000000000000000000000000000000000000000"
      "0102030405060708";
  std::vector<uint8_t> expected;
  for (size_t i = 0; i < hex.size(); i += 2)
    expected.push_back(static_cast<uint8_t>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  std::vector<WeightPayload> weights = {make_weight({1, 2, 3, 4, 5, 6, 7, 8}), make_weight({9, 9, 9, 9})};
  weights[1].file = 1;  // held in weights file "w.bin", at offset 128 there
  weights[1].file_offset = 128;
  const std::vector<WeightFile> files = {
      {"w.bin", WeightFileKind::kWeights, Hash128{0x0706050403020100, 0x0f0e0d0c0b0a0908}, {}}};
  std::vector<CompiledGraph> graphs = {
      make_graph("g", {io("x", 1, {2})}, {io("y", 1, {2})}, {'P', 'R', 'O', 'G'}, {0, 1})};
  graphs[0].fixed_inputs = {{io("s", 7, {}), {0x80, 0x3e, 0, 0, 0, 0, 0, 0}}};
  std::vector<uint8_t> written;
  write_context_binary(
      {"ref", "1.0", "cpu"}, graphs, weights,
      [&](const uint8_t* data, size_t size) { written.insert(written.end(), data, data + size); }, {}, files);
  EXPECT_EQ(written.size(), expected_file_size({"ref", "1.0", "cpu"}, graphs, weights, files));
  std::string written_hex;
  for (uint8_t b : written) {
    char two[3];
    std::snprintf(two, sizeof two, "%02x", b);
    written_hex += two;
  }
  EXPECT_EQ(written_hex, hex) << "the spec's bytes, as the writer writes them now";
}

TEST(FormatWriter, FileSinkMatchesMemorySink) {
  Sample s = sample();
  auto memory = write_to_memory(kIdentity, s.graphs, s.weights);
  TempDir dir;
  auto path = dir.path() / "model_ref.bin";
  {
    std::unique_ptr<FILE, int (*)(FILE*)> file(std::fopen(path.c_str(), "wb"), &std::fclose);
    ASSERT_TRUE(file);
    write_context_binary(kIdentity, s.graphs, s.weights, [&](const uint8_t* data, size_t size) {
      if (std::fwrite(data, 1, size, file.get()) != size) throw Error(ErrorCode::kIo, "short write");
    });
  }
  EXPECT_EQ(read_file(path), memory);
  expect_same_content(*ContextBinary::open(path), kIdentity, s);
}

TEST(FormatWriter, WritesHugePayloadsInChunksOfAtMost64MiB) {
  Sample s;
  const size_t big = (size_t{64} << 20) + 1000;
  s.weights = {make_weight(pattern(big, 1))};
  size_t largest = 0, total = 0, calls = 0;
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset(state);
  uint64_t n = write_context_binary(kIdentity, s.graphs, s.weights, [&](const uint8_t* data, size_t size) {
    largest = std::max(largest, size);
    total += size;
    ++calls;
    XXH3_64bits_update(state, data, size);
  }).bytes;
  uint64_t streamed = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  EXPECT_EQ(n, total);
  EXPECT_EQ(total, expected_file_size(kIdentity, s.graphs, s.weights));
  EXPECT_EQ(largest, size_t{64} << 20);
  EXPECT_EQ(calls, 4u) << "metadata, padding, two chunks";
  EXPECT_EQ(streamed, [&] {
    auto bytes = write_to_memory(kIdentity, s.graphs, s.weights);
    return XXH3_64bits(bytes.data(), bytes.size());
  }());
}

TEST(FormatWriter, WritesFileBackedBlobs) {
  TempDir dir;
  auto source = dir.write("weights.raw", pattern(10000, 3));
  auto mapped = MappedFile::open(source);
  Blob view{mapped->data() + 100, 5000, nullptr, mapped, 100, {}, {}, {}};
  Sample s;
  s.weights = {WeightPayload{xxh3_128(view.data, view.size), view}};
  auto bin = read_from_memory(write_to_memory(kIdentity, s.graphs, s.weights));
  EXPECT_EQ(std::memcmp(bin->weight_data(0), pattern(10000, 3).data() + 100, 5000), 0);
  EXPECT_NO_THROW(bin->verify_payloads());
}

TEST(FormatWriter, RejectsInconsistentInputsBeforeWriting) {
  auto no_write = [](const uint8_t*, size_t) { ADD_FAILURE() << "the sink must not be called"; };
  Sample s = sample();
  s.graphs[2].weight_ids.push_back(4);
  expect_error([&] { write_context_binary(kIdentity, s.graphs, s.weights, no_write); }, ErrorCode::kInternal,
               {"graph 'decode'", "weight id 4", "only 4 weights"});
  s = sample();
  s.graphs[1].name = "prefill";
  expect_error([&] { write_context_binary(kIdentity, s.graphs, s.weights, no_write); }, ErrorCode::kInternal,
               {"graph 'prefill' appears twice"});
  s = sample();
  s.graphs[0].name.clear();
  expect_error([&] { write_context_binary(kIdentity, s.graphs, s.weights, no_write); }, ErrorCode::kInternal,
               {"empty name"});
  s = sample();
  s.weights[1].blob.data = nullptr;
  expect_error([&] { write_context_binary(kIdentity, s.graphs, s.weights, no_write); }, ErrorCode::kInternal,
               {"weight 1 has 100 bytes but no data"});
}

// Weights without a hash (packed weights no one hashed) are hashed as they are written and the
// weight table is patched: the same file, byte for byte, as with the hashes given, and its
// content id is that file's. Without a patcher the writer refuses before writing.
TEST(FormatWriter, HashesWeightsItIsGivenNoHashForAndPatchesTheTable) {
  Sample s = sample();
  const auto want = write_to_memory(kIdentity, s.graphs, s.weights);
  Sample unhashed = s;
  for (size_t id : {0, 2, 3}) unhashed.weights[id].hash.reset();
  std::vector<uint8_t> got;
  size_t patches = 0;
  const WrittenBinary written = write_context_binary(
      kIdentity, unhashed.graphs, unhashed.weights,
      [&](const uint8_t* data, size_t size) { got.insert(got.end(), data, data + size); },
      [&](uint64_t offset, const uint8_t* data, size_t size) {
        ++patches;
        ASSERT_LE(offset + size, got.size());
        std::copy(data, data + size, got.begin() + static_cast<ptrdiff_t>(offset));
      });
  EXPECT_EQ(patches, 1u);
  EXPECT_EQ(got, want);
  auto bin = read_from_memory(got);
  EXPECT_EQ(written.content_id, bin->content_id());
  EXPECT_NO_THROW(bin->verify_payloads());

  auto no_write = [](const uint8_t*, size_t) { ADD_FAILURE() << "the sink must not be called"; };
  expect_error([&] { write_context_binary(kIdentity, unhashed.graphs, unhashed.weights, no_write); },
               ErrorCode::kInternal, {"weight 0 has no hash", "cannot be patched"});
}

TEST(FormatWriter, PropagatesSinkErrors) {
  Sample s = sample();
  expect_error(
      [&] {
        write_context_binary(kIdentity, s.graphs, s.weights,
                             [](const uint8_t*, size_t) { throw Error(ErrorCode::kIo, "disk full"); });
      },
      ErrorCode::kIo, {"disk full"});
}

TEST(FormatReader, FindGraphByExactName) {
  Sample s = sample();
  auto bin = read_from_memory(write_to_memory(kIdentity, s.graphs, s.weights));
  ASSERT_NE(bin->find_graph("decode"), nullptr);
  EXPECT_EQ(bin->find_graph("decode")->name, "decode");
  EXPECT_EQ(bin->find_graph("decode")->weight_ids, (std::vector<uint32_t>{1, 2}));
  EXPECT_EQ(bin->find_graph("Decode"), nullptr);
  EXPECT_EQ(bin->find_graph("decod"), nullptr);
  EXPECT_EQ(bin->find_graph(""), nullptr);
}

TEST(FormatReader, WeightIdOutOfRange) {
  Sample s = sample();
  auto bin = read_from_memory(write_to_memory(kIdentity, s.graphs, s.weights), "x.bin");
  expect_error([&] { bin->weight_data(4); }, ErrorCode::kInvalidBinary, {"x.bin", "weight id 4", "4 weights"});
}

TEST(FormatReader, VerifyPayloadsDetectsAFlippedWeightByte) {
  Sample s = sample();
  auto bytes = write_to_memory(kIdentity, s.graphs, s.weights);
  const uint64_t offset = get_le(bytes, weight_field(bytes, 2, 16), 8);
  bytes[offset + 4000] ^= 0x01;
  TempDir dir;
  auto path = dir.write("flipped_ref.bin", bytes);
  auto bin = ContextBinary::open(path);  // weights are not hashed on open, by design
  std::string message = expect_error([&] { bin->verify_payloads(); }, ErrorCode::kInvalidBinary,
                                     {path.string(), "weight 2", "damaged", s.weights[2].hash->hex()});
  EXPECT_EQ(message.find("weight 0"), std::string::npos);
}

}  // namespace
}  // namespace ctxgen
