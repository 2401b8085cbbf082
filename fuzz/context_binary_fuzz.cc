// The context-binary reader on arbitrary bytes: it must accept or throw Error, never read outside
// the buffer. Each input is tried as given and with its metadata checksum recomputed, because a
// mutation almost always breaks the checksum and the checks after it would never run.
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <vector>

#include <xxhash.h>

#include "ctxgen/error.h"
#include "ctxgen/format.h"

namespace {

// Header fields (docs/context-binary-format.md §3).
constexpr size_t kHeaderSize = 108, kChecksumAt = 24, kMetadataLastSectionAt = 88;  // the weight file table

uint64_t read_u64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

void repair_metadata_checksum(std::vector<uint8_t>& bytes) {
  if (bytes.size() < kHeaderSize) return;
  const uint64_t table = read_u64(bytes.data() + kMetadataLastSectionAt);
  const uint64_t table_size = read_u64(bytes.data() + kMetadataLastSectionAt + 8);
  if (table > bytes.size() || table_size > bytes.size() - table || table + table_size < kHeaderSize) return;
  std::memset(bytes.data() + kChecksumAt, 0, 8);
  const uint64_t checksum = XXH3_64bits(bytes.data(), table + table_size);
  std::memcpy(bytes.data() + kChecksumAt, &checksum, 8);
}

void read_all(const std::vector<uint8_t>& bytes) {
  // Aligned like a mapped file, as the reader expects of embedded binaries.
  constexpr std::align_val_t alignment{ctxgen::kPayloadAlignment};
  std::shared_ptr<uint8_t> data(static_cast<uint8_t*>(::operator new(bytes.size() + 1, alignment)),
                                [](uint8_t* p) { ::operator delete(p, std::align_val_t{ctxgen::kPayloadAlignment}); });
  if (!bytes.empty()) std::memcpy(data.get(), bytes.data(), bytes.size());
  try {
    auto binary = ctxgen::ContextBinary::from_memory(data.get(), bytes.size(), data, "fuzz");
    for (const auto& graph : binary->graphs()) {
      if (binary->find_graph(graph.name) == nullptr) __builtin_trap();
      for (uint32_t id : graph.weight_ids) (void)binary->weight_data(id);
    }
    binary->verify_payloads();
  } catch (const ctxgen::Error&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<uint8_t> bytes(data, data + size);
  read_all(bytes);
  repair_metadata_checksum(bytes);
  read_all(bytes);
  return 0;
}
