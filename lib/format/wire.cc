#include "wire.h"

#include <xxhash.h>

#include <cstdio>
#include <memory>

#include "ctxgen/error.h"
#include "ctxgen/limits.h"

namespace ctxgen::format {

uint64_t io_record_size(const IoSignature& io) {
  return kIoRecordFixedSize + io.name.size() + kDimSize * io.dims.size();
}

uint64_t graph_record_size(const CompiledGraph& graph) {
  uint64_t size = kGraphRecordFixedSize + graph.name.size() + kWeightIdSize * graph.weight_ids.size();
  for (const auto& io : graph.inputs) size += io_record_size(io);
  for (const auto& io : graph.outputs) size += io_record_size(io);
  for (const auto& fixed : graph.fixed_inputs) size += io_record_size(fixed.io) + kStringPrefixSize + fixed.value.size();
  return size;
}

bool holds_its_elements(const FixedInput& fixed) {
  const size_t size = fixed_element_size(fixed.io.elem_type);
  const std::optional<int64_t> count = bounded_element_count(fixed.io.dims);
  return size > 0 && count && static_cast<uint64_t>(*count) <= kMaxFixedValueBytes / size &&
         fixed.value.size() == static_cast<uint64_t>(*count) * size;
}

uint64_t metadata_checksum(const uint8_t* data, uint64_t metadata_size) {
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> state(XXH3_createState(), &XXH3_freeState);
  if (!state) throw Error(ErrorCode::kInternal, "cannot allocate an XXH3 hashing state");
  static constexpr uint8_t kZeroField[8] = {};
  constexpr size_t after = field::kMetadataChecksum + sizeof kZeroField;
  XXH3_64bits_reset(state.get());
  XXH3_64bits_update(state.get(), data, field::kMetadataChecksum);
  XXH3_64bits_update(state.get(), kZeroField, sizeof kZeroField);
  XXH3_64bits_update(state.get(), data + after, metadata_size - after);
  return XXH3_64bits_digest(state.get());
}

uint64_t program_checksum(const uint8_t* data, uint64_t size) { return XXH3_64bits(data, size); }

std::string hex64(uint64_t value) {
  char buf[19];
  std::snprintf(buf, sizeof buf, "0x%016llx", static_cast<unsigned long long>(value));
  return buf;
}

}  // namespace ctxgen::format
