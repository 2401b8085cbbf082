#pragma once
// The context binary's wire layout (docs/context-binary-format.md), shared by the writer and the
// reader so the two cannot disagree on an offset or a size.

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "ctxgen/compiled.h"

namespace ctxgen::format {

inline constexpr std::array<uint8_t, 8> kMagic = {'C', 'T', 'X', 'G', 'E', 'N', 'C', 'B'};
inline constexpr uint32_t kHeaderSize = 108;

// Byte offsets of the header fields (spec §3).
namespace field {
inline constexpr size_t kMagic = 0;
inline constexpr size_t kVersion = 8;
inline constexpr size_t kHeaderSize = 12;
inline constexpr size_t kFileSize = 16;
inline constexpr size_t kMetadataChecksum = 24;
inline constexpr size_t kIdentityOffset = 32;
inline constexpr size_t kIdentitySize = 40;
inline constexpr size_t kGraphTableOffset = 48;
inline constexpr size_t kGraphTableSize = 56;
inline constexpr size_t kWeightTableOffset = 64;
inline constexpr size_t kWeightTableSize = 72;
inline constexpr size_t kGraphCount = 80;
inline constexpr size_t kWeightCount = 84;
inline constexpr size_t kWeightFileTableOffset = 88;
inline constexpr size_t kWeightFileTableSize = 96;
inline constexpr size_t kWeightFileCount = 104;
}  // namespace field

// Fixed parts of the variable-length records; a reader bounds every count by these minimums
// before it allocates anything.
inline constexpr uint64_t kStringPrefixSize = 4;  // u32 length
inline constexpr uint64_t kIdentityFixedSize = 3 * kStringPrefixSize;
inline constexpr uint64_t kGraphRecordFixedSize = 4 + 4 + 4 + 4 + 8 + 8 + 8 + 4;  // = 44
inline constexpr uint64_t kIoRecordFixedSize = 4 + 4 + 4;                         // = 12
inline constexpr uint64_t kWeightEntrySize = 16 + 8 + 8 + 4;                      // = 36
inline constexpr uint64_t kWeightFileRecordFixedSize = 4 + 4 + 16 + 4;            // = 28
inline constexpr uint64_t kDimSize = 8;
inline constexpr uint64_t kWeightIdSize = 4;
// A fixed input's value holds at most this many bytes (values given on a command line).
inline constexpr uint64_t kMaxFixedValueBytes = uint64_t{1} << 20;

// The writer never hands the sink more than this in one call, so a sink may stage each write.
inline constexpr uint64_t kMaxWriteChunk = uint64_t{64} << 20;

inline void put_le(uint8_t* out, uint64_t value, size_t width) {
  for (size_t i = 0; i < width; ++i) out[i] = static_cast<uint8_t>(value >> (8 * i));
}

inline uint64_t get_le(const uint8_t* in, size_t width) {
  uint64_t value = 0;
  for (size_t i = 0; i < width; ++i) value |= uint64_t{in[i]} << (8 * i);
  return value;
}

// Callers guarantee value <= UINT64_MAX - 63 (every planned offset is bounded by real sizes).
inline uint64_t align_payload(uint64_t value, uint64_t alignment) {
  return (value + alignment - 1) / alignment * alignment;
}

uint64_t io_record_size(const IoSignature& io);
uint64_t graph_record_size(const CompiledGraph& graph);
// Whether a fixed input's value is exactly the elements of its type and dims, within kMaxFixedValueBytes.
bool holds_its_elements(const FixedInput& fixed);

// XXH3-64 of bytes [0, metadata_size) with the checksum field itself read as zero.
uint64_t metadata_checksum(const uint8_t* data, uint64_t metadata_size);
uint64_t program_checksum(const uint8_t* data, uint64_t size);

std::string hex64(uint64_t value);  // "0x" + 16 lowercase hex digits

}  // namespace ctxgen::format
