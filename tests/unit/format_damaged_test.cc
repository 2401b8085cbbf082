// A catalogue of handcrafted damaged context binaries, each of which the reader must reject with
// Error(kInvalidBinary) and a message naming the file, the field, and the values involved.
// Edits of the tables are resealed (metadata checksum recomputed) so that the field checks, not
// the checksum, are what is exercised; separate cases show the checksum catches unsealed edits.

#include <limits>

#include "format_test_util.h"

namespace ctxgen {
namespace {

using namespace testing;
using Bytes = std::vector<uint8_t>;

constexpr uint64_t kU32Max = std::numeric_limits<uint32_t>::max();
constexpr uint64_t kU64Max = std::numeric_limits<uint64_t>::max();

std::string num(uint64_t v) { return std::to_string(v); }

// Two graphs with equal-length names (so one can be renamed in place) and three weights.
struct Base {
  Bytes bytes;
  std::vector<GraphFields> graphs;
  uint64_t size = 0, metadata_end = 0;

  uint64_t weight(size_t id, size_t field) const { return get_le(bytes, weight_field(bytes, id, field), 8); }
  uint64_t graph_table_offset() const { return get_le(bytes, spec::kGraphTableOffset, 8); }
};

const Base& base() {
  static const Base b = [] {
    std::vector<WeightPayload> weights = {make_weight(pattern(300, 1)), make_weight(pattern(64, 2)),
                                          make_weight(pattern(1000, 3))};
    std::vector<CompiledGraph> graphs = {
        make_graph("encode", {io("pixels", 1, {1, 3, 8, 8}), io("mask", 9, {1, 8})}, {io("features", 1, {1, 16})},
                   pattern(200, 4), {0, 1}),
        make_graph("decode", {io("features", 1, {1, 16})}, {io("label", 7, {1})}, pattern(100, 5), {1, 2}),
    };
    graphs[0].fixed_inputs = {{io("sr", 7, {}), {0x80, 0x3e, 0, 0, 0, 0, 0, 0}}};
    Base result;
    result.bytes = write_to_memory({"ref", "1.0", "cpu"}, graphs, weights);
    result.graphs = locate_graphs(result.bytes);
    result.size = result.bytes.size();
    result.metadata_end = metadata_end(result.bytes);
    return result;
  }();
  return b;
}

// Edits `bytes` (a copy of base().bytes) and returns what the rejection message must contain.
using Mutation = std::function<std::vector<std::string>(Bytes& bytes, const Base& base)>;

struct Damage {
  std::string name;
  Mutation mutate;
};

// Sets a field and reseals, so only the field check can catch it.
Mutation sealed(size_t (*where)(const Base&), size_t width, uint64_t value, std::vector<std::string> needles) {
  return [=](Bytes& bytes, const Base& b) {
    put_le(bytes, where(b), value, width);
    reseal(bytes);
    return needles;
  };
}

const std::vector<Damage>& catalogue() {
  static const std::vector<Damage> cases = {
      // --- header ---
      {"BadMagic",
       [](Bytes& bytes, const Base&) -> std::vector<std::string> {
         std::memcpy(bytes.data(), "GGUF", 4);
         return {"not a ctxgen context binary: magic is '47 47 55 46 45 4e 43 42' (hex)",
                 "expected '43 54 58 47 45 4e 43 42' (\"CTXGENCB\")"};
       }},
      {"TextFile",
       [](Bytes& bytes, const Base&) -> std::vector<std::string> {
         const std::string text(200, 'x');
         bytes.assign(text.begin(), text.end());
         return {"not a ctxgen context binary", "magic is '78 78"};
       }},
      {"VersionPlusOne",
       [](Bytes& bytes, const Base&) -> std::vector<std::string> {
         put_le(bytes, spec::kVersion, kContextBinaryVersion + 1, 4);
         return {"format version " + num(kContextBinaryVersion + 1) + ", this build reads version " + num(kContextBinaryVersion),
                 "newer ctxgen"};
       }},
      {"VersionZero",
       [](Bytes& bytes, const Base&) -> std::vector<std::string> {
         put_le(bytes, spec::kVersion, 0, 4);
         return {"format version 0, this build reads version " + num(kContextBinaryVersion)};
       }},
      {"HeaderSize",
       [](Bytes& bytes, const Base&) -> std::vector<std::string> {
         put_le(bytes, spec::kHeaderSizeField, 96, 4);
         return {"header size is 96 bytes, expected 108 for format version " + num(kContextBinaryVersion)};
       }},
      {"FileSizeFieldTooLarge",
       [](Bytes& bytes, const Base& b) -> std::vector<std::string> {
         put_le(bytes, spec::kFileSize, b.size + 64, 8);
         return {"truncated: file is " + num(b.size) + " bytes, the header says " + num(b.size + 64)};
       }},
      {"FileSizeFieldTooSmall",
       [](Bytes& bytes, const Base& b) -> std::vector<std::string> {
         put_le(bytes, spec::kFileSize, b.size - 1, 8);
         return {"file is " + num(b.size) + " bytes, the header says " + num(b.size - 1)};
       }},
      {"TrailingBytes",
       [](Bytes& bytes, const Base& b) -> std::vector<std::string> {
         bytes.resize(bytes.size() + 10, 0);
         return {"file is " + num(b.size + 10) + " bytes, the header says " + num(b.size), "after the end"};
       }},
      {"IdentityOffset",
       [](Bytes& bytes, const Base&) -> std::vector<std::string> {
         put_le(bytes, spec::kIdentityOffset, 0, 8);
         return {"identity section offset is 0, expected 108 (right after the header)"};
       }},
      {"IdentitySizePastEnd",
       [](Bytes& bytes, const Base& b) -> std::vector<std::string> {
         put_le(bytes, spec::kIdentitySize, uint64_t{1} << 40, 8);
         return {"identity section (offset 108, size 1099511627776) extends past the end of the file (" + num(b.size) +
                 " bytes)"};
       }},
      {"GraphTableOffset",
       [](Bytes& bytes, const Base& b) -> std::vector<std::string> {
         put_le(bytes, spec::kGraphTableOffset, b.graph_table_offset() + 8, 8);
         return {"graph table offset is " + num(b.graph_table_offset() + 8) + ", expected " +
                 num(b.graph_table_offset()) + " (right after the identity section)"};
       }},
      {"GraphTableSizeOverflow",
       [](Bytes& bytes, const Base&) -> std::vector<std::string> {
         put_le(bytes, spec::kGraphTableSize, kU64Max, 8);
         return {"graph table (offset", "size " + num(kU64Max) + ") extends past the end of the file"};
       }},
      {"WeightTableOffset",
       [](Bytes& bytes, const Base&) -> std::vector<std::string> {
         const uint64_t offset = get_le(bytes, spec::kWeightTableOffset, 8);
         put_le(bytes, spec::kWeightTableOffset, offset - 1, 8);
         return {"weight table offset is " + num(offset - 1) + ", expected " + num(offset) +
                 " (right after the graph table)"};
       }},
      {"WeightTableSize",
       [](Bytes& bytes, const Base&) -> std::vector<std::string> {
         put_le(bytes, spec::kWeightTableSize, 97, 8);
         return {"weight table size is 97 bytes, expected 108 (3 weights x 36 bytes)"};
       }},
      {"WeightCount",
       [](Bytes& bytes, const Base&) -> std::vector<std::string> {
         put_le(bytes, spec::kWeightCount, 4, 4);
         return {"weight table size is 108 bytes, expected 144 (4 weights x 36 bytes)"};
       }},
      {"GraphCountHuge",
       [](Bytes& bytes, const Base&) -> std::vector<std::string> {
         put_le(bytes, spec::kGraphCount, kU32Max, 4);
         return {"graph count is 4294967295, but the graph table is only", "at least 44"};
       }},
      // --- checksums: unsealed edits ---
      {"MetadataChecksumFlipped",
       [](Bytes& bytes, const Base&) -> std::vector<std::string> {
         bytes[spec::kChecksum] ^= 0x80;
         return {"metadata checksum mismatch (header or tables damaged)"};
       }},
      {"GraphNameByteFlipped",
       [](Bytes& bytes, const Base& b) -> std::vector<std::string> {
         bytes[b.graphs[1].name] ^= 0x01;
         return {"metadata checksum mismatch", "the header says 0x"};
       }},
      {"GraphCountUnsealed",
       [](Bytes& bytes, const Base&) -> std::vector<std::string> {
         put_le(bytes, spec::kGraphCount, 1, 4);
         return {"metadata checksum mismatch"};
       }},
      {"WeightHashByteFlipped",
       [](Bytes& bytes, const Base&) -> std::vector<std::string> {
         bytes[weight_field(bytes, 2, 8)] ^= 0x10;
         return {"metadata checksum mismatch"};
       }},
      {"ProgramByteFlipped",
       [](Bytes& bytes, const Base& b) -> std::vector<std::string> {
         bytes[get_le(bytes, b.graphs[0].program_offset, 8) + 199] ^= 0x04;
         return {"graph 'encode' program checksum mismatch (program damaged)"};
       }},
      {"ProgramChecksumField",
       sealed([](const Base& b) { return b.graphs[1].program_checksum; }, 8, 12345,
              {"graph 'decode' program checksum mismatch", "the graph table says 0x0000000000003039"})},
      // --- identity section and graph table (resealed) ---
      {"BackendNameLength", sealed([](const Base&) { return spec::kHeaderSize; }, 4, kU32Max,
                                   {"identity section: backend name length is 4294967295, but only"})},
      {"GraphCountShort",
       [](Bytes& bytes, const Base& b) -> std::
                                           vector<std::string> {
                                             put_le(bytes, spec::kGraphCount, 1, 4);
                                             reseal(bytes);
                                             return {"graph table has " +
                                                     num(b.graphs[1].end - b.graphs[1].name_length) +
                                                     " bytes left after its last entry (at offset " +
                                                     num(b.graphs[1].name_length) + ")"};
                                           }},
      {"GraphCountLong",
       [](Bytes& bytes, const Base& b) -> std::
                                           vector<std::string> {
                                             EXPECT_GE(b.graphs[1].end - b.graph_table_offset(), 3u * 44)
                                                 << "the count must pass the size bound";
                                             put_le(bytes, spec::kGraphCount, 3, 4);
                                             reseal(bytes);
                                             return {"graph table: graph 2: name length needs 4 bytes at offset " +
                                                     num(b.graphs[1].end) + ", but only 0 remain in the graph table"};
                                           }},
      {"GraphNameLength", sealed([](const Base& b) { return b.graphs[0].name_length; }, 4, kU32Max,
                                 {"graph table: graph 0: name length is 4294967295, but only"})},
      {"InputCount", sealed([](const Base& b) { return b.graphs[0].input_count; }, 4, kU32Max,
                            {"graph 0 ('encode'): input count is 4294967295, but only", "at least 12"})},
      {"InputNameLength", sealed([](const Base& b) { return b.graphs[1].input0_name_length; }, 4, 1u << 20,
                                 {"graph 1 ('decode'): input 0 name length is 1048576, but only"})},
      {"InputRank", sealed([](const Base& b) { return b.graphs[0].input0_rank; }, 4, 100000,
                           {"graph 0 ('encode'): input 0 rank is 100000, but only", "at least 8"})},
      {"OutputCount", sealed([](const Base& b) { return b.graphs[1].output_count; }, 4, 1000,
                             {"graph 1 ('decode'): output count is 1000, but only"})},
      {"FixedInputCount", sealed([](const Base& b) { return b.graphs[0].fixed_count; }, 4, kU32Max,
                                 {"graph 0 ('encode'): fixed input count is 4294967295, but only", "at least 16"})},
      {"FixedInputValueShort", sealed([](const Base& b) { return b.graphs[0].fixed0_value_length; }, 4, 7,
                                      {"graph 0 ('encode'): fixed input 0 'sr' value is 7 bytes, not the elements of "
                                       "element type 7 and its dims"})},
      {"FixedInputValueOfAnotherType",
       sealed([](const Base& b) { return b.graphs[0].fixed0_value_length - 8; }, 4, 1,
              {"fixed input 0 'sr' value is 8 bytes, not the elements of element type 1 and its dims"})},
      {"WeightIdCount", sealed([](const Base& b) { return b.graphs[1].weight_id_count; }, 4, kU32Max,
                               {"graph 1 ('decode'): weight id count is 4294967295, but only"})},
      {"WeightIdOutOfRange",
       sealed([](const Base& b) { return b.graphs[1].weight_id0 + 4; }, 4, 3,
              {"graph 1 ('decode'): weight id 3 is out of range, the weight table has 3 weights"})},
      {"DuplicateGraphNames",
       [](Bytes& bytes, const Base& b) -> std::
                                           vector<std::string> {
                                             std::memcpy(&bytes[b.graphs[1].name], "encode", 6);
                                             reseal(bytes);
                                             return {"graph table: graph 1: name 'encode' is also the name of graph 0"};
                                           }},
      // --- payload bounds (resealed) ---
      {"ProgramOffsetMisaligned",
       [](Bytes& bytes, const Base& b) -> std::
                                           vector<std::string> {
                                             const uint64_t offset = get_le(bytes, b.graphs[0].program_offset, 8) + 1;
                                             put_le(bytes, b.graphs[0].program_offset, offset, 8);
                                             reseal(bytes);
                                             return {"graph 'encode' program offset " + num(offset) +
                                                     " is not a multiple of 64"};
                                           }},
      {"ProgramInsideMetadata",
       [](Bytes& bytes,
          const Base& b) -> std::
                             vector<std::string> {
                               put_le(bytes, b.graphs[0].program_offset, 0, 8);
                               reseal(bytes);
                               return {
                                   "graph 'encode' program offset 0 is inside the header and tables, which end at " +
                                   num(b.metadata_end)};
                             }},
      {"ProgramPastEnd",
       [](Bytes& bytes, const Base& b) -> std::
                                           vector<std::string> {
                                             const uint64_t offset = (b.size + 63) / 64 * 64;
                                             put_le(bytes, b.graphs[1].program_offset, offset, 8);
                                             reseal(bytes);
                                             return {"graph 'decode' program (offset " + num(offset) +
                                                     ", size 100) extends past the end of the file (" + num(b.size) +
                                                     " bytes)"};
                                           }},
      {"ProgramSizeHuge",
       sealed([](const Base& b) { return b.graphs[0].program_size; }, 8, kU64Max,
              {"graph 'encode' program", "size " + num(kU64Max) + ") extends past the end of the file"})},
      {"WeightOffsetMisaligned",
       [](Bytes& bytes, const Base& b) -> std::
                                           vector<std::string> {
                                             put_le(bytes, weight_field(bytes, 1, 16), b.weight(1, 16) + 32, 8);
                                             reseal(bytes);
                                             return {"weight 1 offset " + num(b.weight(1, 16) + 32) +
                                                     " is not a multiple of 64"};
                                           }},
      {"WeightSizePastEnd",
       [](Bytes& bytes, const Base& b) -> std::
                                           vector<std::string> {
                                             put_le(bytes, weight_field(bytes, 2, 24), 1001, 8);
                                             reseal(bytes);
                                             return {"weight 2 (offset " + num(b.weight(2, 16)) +
                                                     ", size 1001) extends past the end of the file (" + num(b.size) +
                                                     " bytes)"};
                                           }},
      {"WeightOffsetWrapsAround",
       [](Bytes& bytes, const Base&) -> std::
                                         vector<std::string> {
                                           put_le(bytes, weight_field(bytes, 0, 16), kU64Max - 63, 8);
                                           put_le(bytes, weight_field(bytes, 0, 24), 128, 8);
                                           reseal(bytes);
                                           return {"weight 0 (offset " + num(kU64Max - 63) +
                                                   ", size 128) extends past the end of the file"};
                                         }},
      {"WeightsAtTheSameOffset",
       [](Bytes& bytes, const Base& b) -> std::
                                           vector<std::string> {
                                             put_le(bytes, weight_field(bytes, 1, 16), b.weight(0, 16), 8);
                                             reseal(bytes);
                                             return {"weight 0 (offset " + num(b.weight(0, 16)) +
                                                     ", size 300) overlaps weight 1 (offset " + num(b.weight(0, 16)) +
                                                     ", size 64)"};
                                           }},
      {"WeightsPartlyOverlap",
       [](Bytes& bytes, const Base& b) -> std::
                                           vector<std::string> {
                                             put_le(bytes, weight_field(bytes, 1, 16), b.weight(0, 16) + 256, 8);
                                             reseal(bytes);
                                             return {"weight 1 (offset " + num(b.weight(0, 16) + 256) +
                                                     ", size 64) overlaps weight 0"};
                                           }},
      {"ProgramOverlapsWeight",
       [](Bytes& bytes, const Base& b) -> std::
                                           vector<std::string> {
                                             put_le(bytes, b.graphs[1].program_offset, b.weight(2, 16), 8);
                                             reseal(bytes);
                                             return {"overlaps",
                                                     "graph 'decode' program (offset " + num(b.weight(2, 16)) +
                                                         ", size 100)",
                                                     "weight 2"};
                                           }},
  };
  return cases;
}

class Damaged : public ::testing::TestWithParam<size_t> {};

TEST_P(Damaged, IsRejected) {
  const Damage& damage = catalogue()[GetParam()];
  Bytes bytes = base().bytes;
  std::vector<std::string> needles = damage.mutate(bytes, base());
  TempDir dir;
  const auto path = dir.write(damage.name + ".bin", bytes);
  needles.push_back(path.string() + ": ");
  expect_error([&] { ContextBinary::open(path); }, ErrorCode::kInvalidBinary, needles);
  needles.back() = "embedded: ";
  expect_error([&] { read_from_memory(bytes, "embedded"); }, ErrorCode::kInvalidBinary, needles);
}

INSTANTIATE_TEST_SUITE_P(Catalogue, Damaged, ::testing::Range<size_t>(0, catalogue().size()),
                         [](const ::testing::TestParamInfo<size_t>& info) { return catalogue()[info.param].name; });

TEST(DamagedTruncated, AtManyPoints) {
  const Base& b = base();
  std::vector<uint64_t> cuts = {0,
                                1,
                                7,
                                8,
                                9,
                                11,
                                12,
                                40,
                                87,
                                88,
                                107,
                                108,
                                109,
                                b.graph_table_offset(),
                                b.metadata_end - 1,
                                b.metadata_end,
                                b.metadata_end + 1,
                                b.size - 1};
  for (const auto& graph : b.graphs) cuts.push_back(get_le(b.bytes, graph.program_offset, 8) + 1);
  for (size_t id = 0; id < 3; ++id) cuts.push_back(b.weight(id, 16) + b.weight(id, 24) / 2);
  TempDir dir;
  for (uint64_t cut : cuts) {
    SCOPED_TRACE("cut at " + num(cut));
    Bytes bytes(b.bytes.begin(), b.bytes.begin() + static_cast<std::ptrdiff_t>(cut));
    std::string expected = cut == 0   ? "file is empty (0 bytes)"
                           : cut < 8  ? "file is " + num(cut) + " bytes, too small for a ctxgen context binary"
                           : cut < 108 ? "truncated: file is " + num(cut) + " bytes, the header alone is 108 bytes"
                                      : "truncated: file is " + num(cut) + " bytes, the header says " + num(b.size);
    auto path = dir.write("cut" + num(cut) + ".bin", bytes);
    expect_error([&] { ContextBinary::open(path); }, ErrorCode::kInvalidBinary, {path.string(), expected});
  }
}

TEST(DamagedFiles, DirectoryMissingFileAndEmptyFile) {
  TempDir dir;
  expect_error([&] { ContextBinary::open(dir.path()); }, ErrorCode::kInvalidBinary,
               {"cannot open context binary", dir.path().string(), "is a directory"});
  const auto missing = dir.path() / "missing_ref.bin";
  expect_error([&] { ContextBinary::open(missing); }, ErrorCode::kInvalidBinary,
               {"cannot open context binary", missing.string(), "No such file"});
  const auto empty = dir.write("empty_ref.bin", {});
  expect_error([&] { ContextBinary::open(empty); }, ErrorCode::kInvalidBinary,
               {empty.string() + ": file is empty (0 bytes)"});
}

TEST(DamagedFiles, TheUndamagedBaseIsAccepted) { EXPECT_NO_THROW(read_from_memory(base().bytes)->verify_payloads()); }

// The padding before each payload is covered by no checksum: opening does not read it (a session
// would touch a page per weight), verifying does, and a byte changed there is damage.
TEST(DamagedFiles, AChangedPaddingByteFailsVerification) {
  const auto binary = read_from_memory(base().bytes);
  std::vector<std::pair<uint64_t, uint64_t>> payloads;
  for (const auto& w : binary->weights()) payloads.emplace_back(w.offset, w.offset + w.size);
  std::sort(payloads.begin(), payloads.end());
  // Weight sizes 300 and 1000 leave padding after them: flip bytes of each gap in turn.
  size_t checked = 0;
  for (size_t k = 0; k + 1 < payloads.size(); ++k) {
    if (payloads[k].second == payloads[k + 1].first) continue;
    for (const uint64_t at : {payloads[k].second, payloads[k + 1].first - 1}) {
      Bytes bytes = base().bytes;
      bytes[at] ^= 0x5A;
      const auto damaged = read_from_memory(bytes);  // opens: the padding is not read then
      expect_error([&] { damaged->verify_payloads(); }, ErrorCode::kInvalidBinary,
                   {"byte " + std::to_string(at) + ", padding before a payload, is 90 where the format writes 0"});
      ++checked;
    }
  }
  EXPECT_GT(checked, 0u);
}

}  // namespace
}  // namespace ctxgen
