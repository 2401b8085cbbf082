#pragma once
// Helpers shared by the context-binary tests. Field offsets and the checksum rule are taken
// from docs/context-binary-format.md, not from lib/format, so the tests also check the spec.

#include <gtest/gtest.h>
#include <unistd.h>
#include <xxhash.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "ctxgen/error.h"
#include "ctxgen/format.h"

namespace ctxgen::testing {

// docs/context-binary-format.md §3.
namespace spec {
inline constexpr size_t kHeaderSize = 108;
inline constexpr size_t kVersion = 8, kHeaderSizeField = 12, kFileSize = 16, kChecksum = 24;
inline constexpr size_t kIdentityOffset = 32, kIdentitySize = 40, kGraphTableOffset = 48, kGraphTableSize = 56;
inline constexpr size_t kWeightTableOffset = 64, kWeightTableSize = 72, kGraphCount = 80, kWeightCount = 84;
inline constexpr size_t kWeightFileTableOffset = 88, kWeightFileTableSize = 96, kWeightFileCount = 104;
inline constexpr size_t kWeightEntrySize = 36;
}  // namespace spec

inline uint64_t get_le(const std::vector<uint8_t>& bytes, size_t at, size_t width) {
  uint64_t value = 0;
  for (size_t i = 0; i < width; ++i) value |= uint64_t{bytes.at(at + i)} << (8 * i);
  return value;
}

inline void put_le(std::vector<uint8_t>& bytes, size_t at, uint64_t value, size_t width) {
  for (size_t i = 0; i < width; ++i) bytes.at(at + i) = static_cast<uint8_t>(value >> (8 * i));
}

inline uint64_t metadata_end(const std::vector<uint8_t>& bytes) {
  return get_le(bytes, spec::kWeightFileTableOffset, 8) + get_le(bytes, spec::kWeightFileTableSize, 8);
}

// Recomputes the metadata checksum after a deliberate edit, so the reader's field checks (not
// the checksum) are what rejects the file.
inline void reseal(std::vector<uint8_t>& bytes) {
  put_le(bytes, spec::kChecksum, 0, 8);
  put_le(bytes, spec::kChecksum, XXH3_64bits(bytes.data(), metadata_end(bytes)), 8);
}

// Offsets of the fields of one graph record, found by walking the record as the spec lays it out.
struct GraphFields {
  size_t name_length = 0, name = 0, input_count = 0, input0_name_length = 0, input0_elem_type = 0, input0_rank = 0,
         output_count = 0, fixed_count = 0, fixed0_value_length = 0, program_offset = 0, program_size = 0, program_checksum = 0, weight_id_count = 0,
         weight_id0 = 0, end = 0;
};

inline std::vector<GraphFields> locate_graphs(const std::vector<uint8_t>& bytes) {
  std::vector<GraphFields> graphs;
  size_t at = get_le(bytes, spec::kGraphTableOffset, 8);
  auto skip_ios = [&](GraphFields* first) {
    uint64_t count = get_le(bytes, at, 4);
    at += 4;
    for (uint64_t i = 0; i < count; ++i) {
      if (i == 0 && first != nullptr) first->input0_name_length = at;
      at += 4 + get_le(bytes, at, 4);
      if (i == 0 && first != nullptr) first->input0_elem_type = at;
      at += 4;
      if (i == 0 && first != nullptr) first->input0_rank = at;
      at += 4 + 8 * get_le(bytes, at, 4);
    }
  };
  for (uint64_t g = 0; g < get_le(bytes, spec::kGraphCount, 4); ++g) {
    GraphFields f;
    f.name_length = at;
    f.name = at + 4;
    at += 4 + get_le(bytes, at, 4);
    f.input_count = at;
    skip_ios(&f);
    f.output_count = at;
    skip_ios(nullptr);
    f.fixed_count = at;
    at += 4;
    for (uint64_t i = 0; i < get_le(bytes, f.fixed_count, 4); ++i) {
      at += 4 + get_le(bytes, at, 4) + 4;  // name, element type
      at += 4 + 8 * get_le(bytes, at, 4);  // rank, dims
      if (i == 0) f.fixed0_value_length = at;
      at += 4 + get_le(bytes, at, 4);  // value
    }
    f.program_offset = at;
    f.program_size = at + 8;
    f.program_checksum = at + 16;
    f.weight_id_count = at + 24;
    f.weight_id0 = at + 28;
    at += 28 + 4 * get_le(bytes, f.weight_id_count, 4);
    f.end = at;
    graphs.push_back(f);
  }
  return graphs;
}

// Offset of a field of weight entry `id`: hash low +0, hash high +8, offset +16, size +24.
inline size_t weight_field(const std::vector<uint8_t>& bytes, size_t id, size_t field_offset) {
  return get_le(bytes, spec::kWeightTableOffset, 8) + spec::kWeightEntrySize * id + field_offset;
}

inline WeightPayload make_weight(std::vector<uint8_t> bytes) {
  Blob blob = Blob::owned(std::move(bytes));
  return WeightPayload{xxh3_128(blob.data, blob.size), blob};
}

inline std::vector<uint8_t> pattern(size_t size, uint8_t seed) {
  std::vector<uint8_t> bytes(size);
  for (size_t i = 0; i < size; ++i) bytes[i] = static_cast<uint8_t>(seed + i * 31 + (i >> 8));
  return bytes;
}

inline IoSignature io(std::string name, int32_t elem_type, std::vector<int64_t> dims) {
  return IoSignature{std::move(name), elem_type, std::move(dims)};
}

inline CompiledGraph make_graph(std::string name, std::vector<IoSignature> inputs, std::vector<IoSignature> outputs,
                                std::vector<uint8_t> program, std::vector<uint32_t> weight_ids) {
  CompiledGraph graph;
  graph.name = std::move(name);
  graph.inputs = std::move(inputs);
  graph.outputs = std::move(outputs);
  graph.program = std::move(program);
  graph.weight_ids = std::move(weight_ids);
  return graph;
}

inline std::vector<uint8_t> write_to_memory(const BinaryIdentity& identity, const std::vector<CompiledGraph>& graphs,
                                            const std::vector<WeightPayload>& weights) {
  std::vector<uint8_t> out;
  const WrittenBinary written = write_context_binary(
      identity, graphs, weights, [&](const uint8_t* data, size_t size) { out.insert(out.end(), data, data + size); });
  EXPECT_EQ(written.bytes, out.size());
  return out;
}

inline std::shared_ptr<const ContextBinary> read_from_memory(const std::vector<uint8_t>& bytes,
                                                             const std::string& label = "mem.bin") {
  auto owner = std::make_shared<std::vector<uint8_t>>(bytes);
  return ContextBinary::from_memory(owner->data(), owner->size(), owner, label);
}

// A fresh directory under the system temp dir, removed with everything in it at scope exit.
class TempDir {
 public:
  TempDir() {
    static std::atomic<int> counter{0};
    path_ = std::filesystem::temp_directory_path() /
            ("ctxgen-format-test-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::filesystem::path& path() const { return path_; }

  std::filesystem::path write(const std::string& name, const std::vector<uint8_t>& bytes) const {
    std::filesystem::path file = path_ / name;
    std::ofstream out(file, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    EXPECT_TRUE(out.good()) << file;
    return file;
  }

 private:
  std::filesystem::path path_;
};

inline std::vector<uint8_t> read_file(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Runs `action`, expecting Error(code) whose message contains every one of `needles`; returns it.
inline std::string expect_error(const std::function<void()>& action, ErrorCode code,
                                const std::vector<std::string>& needles) {
  try {
    action();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    for (const auto& needle : needles)
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
          << "message: " << e.what() << "\nexpected to contain: " << needle;
    return e.what();
  }
  ADD_FAILURE() << "no error thrown; expected one containing '" << (needles.empty() ? "" : needles[0]) << "'";
  return {};
}

}  // namespace ctxgen::testing
