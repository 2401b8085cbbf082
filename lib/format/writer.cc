// Writes a context binary: validate the inputs, plan every offset, encode the metadata, then
// stream header, tables and payloads strictly in file order.

#include <algorithm>
#include <limits>
#include <optional>
#include <set>

#include "ctxgen/error.h"
#include "ctxgen/format.h"
#include "ctxgen/log.h"
#include "wire.h"

namespace ctxgen {
namespace {

using format::put_le;

[[noreturn]] void internal(const std::string& message) {
  throw Error(ErrorCode::kInternal, "context binary writer: " + message);
}

void check_u32(uint64_t value, const std::string& what) {
  if (value > std::numeric_limits<uint32_t>::max())
    internal(what + " is " + std::to_string(value) + ", more than the format's u32 field holds");
}

// Everything the reader would reject is a caller bug here, caught before a byte is written.
void validate_inputs(const BinaryIdentity& identity, const std::vector<CompiledGraph>& graphs,
                     const std::vector<WeightPayload>& weights, const std::vector<WeightFile>& files, bool can_patch) {
  check_u32(graphs.size(), "graph count");
  check_u32(weights.size(), "weight count");
  check_u32(files.size(), "weight file count");
  std::set<std::string_view> paths;
  std::vector<size_t> held(files.size());
  for (const WeightPayload& weight : weights)
    if (weight.file > 0 && weight.file <= files.size()) ++held[weight.file - 1];
  for (size_t k = 0; k < files.size(); ++k) {
    const WeightFile& file = files[k];
    if (file.path.empty()) internal("a weight file has an empty path");
    if (!paths.insert(file.path).second) internal("weight file '" + file.path + "' appears twice");
    check_u32(file.path.size(), "weight file path length");
    const bool source = file.kind == WeightFileKind::kSourceData;
    if (!source && file.kind != WeightFileKind::kWeights) internal("weight file '" + file.path + "' has an unknown kind");
    if (file.tensors.size() != (source ? held[k] : 0))
      internal("weight file '" + file.path + "' names " + std::to_string(file.tensors.size()) + " tensors for the " +
               std::to_string(held[k]) + " weights held there");
    if (source && file.content_id != Hash128{}) internal("source data file '" + file.path + "' has a content id");
    for (const std::string& tensor : file.tensors) {
      if (tensor.empty()) internal("source data file '" + file.path + "' names a tensor with an empty name");
      check_u32(tensor.size(), "tensor name length");
    }
  }
  if (identity.format_version != kContextBinaryVersion)
    internal("the identity asks for format version " + std::to_string(identity.format_version) +
             ", this writer writes version " + std::to_string(kContextBinaryVersion));
  check_u32(identity.backend.size(), "backend name length");
  check_u32(identity.sdk_version.size(), "SDK version length");
  check_u32(identity.hardware_architecture.size(), "hardware architecture length");
  std::set<std::string_view> names;
  for (const auto& graph : graphs) {
    const std::string where = "graph '" + graph.name + "'";
    if (graph.name.empty()) internal("a graph has an empty name");
    if (!names.insert(graph.name).second) internal(where + " appears twice");
    check_u32(graph.name.size(), where + " name length");
    check_u32(graph.inputs.size(), where + " input count");
    check_u32(graph.outputs.size(), where + " output count");
    check_u32(graph.weight_ids.size(), where + " weight id count");
    for (const auto* ios : {&graph.inputs, &graph.outputs}) {
      for (const auto& io : *ios) {
        check_u32(io.name.size(), where + " value '" + io.name + "' name length");
        check_u32(io.dims.size(), where + " value '" + io.name + "' rank");
      }
    }
    check_u32(graph.fixed_inputs.size(), where + " fixed input count");
    for (const auto& fixed : graph.fixed_inputs) {
      const std::string value = where + " fixed input '" + fixed.io.name + "'";
      check_u32(fixed.io.name.size(), value + " name length");
      check_u32(fixed.io.dims.size(), value + " rank");
      if (!format::holds_its_elements(fixed))
        internal(value + " holds " + std::to_string(fixed.value.size()) + " bytes, not the elements its type and dims hold");
    }
    for (uint32_t id : graph.weight_ids) {
      if (id >= weights.size())
        internal(where + " uses weight id " + std::to_string(id) + ", but there are only " +
                 std::to_string(weights.size()) + " weights");
    }
  }
  for (size_t id = 0; id < weights.size(); ++id) {
    if (weights[id].file > files.size())
      internal("weight " + std::to_string(id) + " is in weight file " + std::to_string(weights[id].file) +
               ", but there are only " + std::to_string(files.size()));
    if (weights[id].file > 0) {
      if (!weights[id].hash) internal("weight " + std::to_string(id) + " is in a weight file but has no hash");
      if (files[weights[id].file - 1].kind == WeightFileKind::kWeights && weights[id].file_offset % kPayloadAlignment != 0)
        internal("weight " + std::to_string(id) + " is at offset " + std::to_string(weights[id].file_offset) +
                 " of its weight file, not a multiple of " + std::to_string(kPayloadAlignment));
      continue;
    }
    if (weights[id].blob.data == nullptr && !weights[id].blob.make && weights[id].blob.size > 0)
      internal("weight " + std::to_string(id) + " has " + std::to_string(weights[id].blob.size) + " bytes but no data");
    if (!weights[id].hash && !can_patch)
      internal("weight " + std::to_string(id) + " has no hash and the sink cannot be patched to add it");
  }
}

struct Layout {
  uint64_t identity_size = 0;
  uint64_t graph_table_size = 0;
  uint64_t weight_table_size = 0;
  uint64_t weight_file_table_size = 0;
  uint64_t metadata_size = 0;
  std::vector<uint64_t> program_offsets;
  std::vector<uint64_t> weight_offsets;
  uint64_t file_size = 0;
};

// Payloads follow the metadata in table order (programs by graph, then the weights this binary
// holds, by id), each at the next multiple of kPayloadAlignment; the file ends with the last
// payload's last byte.
Layout plan_layout(const BinaryIdentity& identity, const std::vector<CompiledGraph>& graphs,
                   const std::vector<WeightPayload>& weights, const std::vector<WeightFile>& files) {
  Layout layout;
  layout.identity_size = format::kIdentityFixedSize + identity.backend.size() + identity.sdk_version.size() +
                         identity.hardware_architecture.size();
  for (const auto& graph : graphs) layout.graph_table_size += format::graph_record_size(graph);
  layout.weight_table_size = format::kWeightEntrySize * weights.size();
  for (const WeightFile& file : files) {
    layout.weight_file_table_size += format::kWeightFileRecordFixedSize + file.path.size();
    for (const std::string& tensor : file.tensors) layout.weight_file_table_size += format::kStringPrefixSize + tensor.size();
  }
  layout.metadata_size = format::kHeaderSize + layout.identity_size + layout.graph_table_size +
                         layout.weight_table_size + layout.weight_file_table_size;
  uint64_t cursor = layout.metadata_size;
  auto place = [&](uint64_t size) {
    uint64_t offset = format::align_payload(cursor, kPayloadAlignment);
    cursor = offset + size;
    return offset;
  };
  for (const auto& graph : graphs) layout.program_offsets.push_back(place(graph.program.size()));
  for (const auto& weight : weights)
    layout.weight_offsets.push_back(weight.file > 0 ? weight.file_offset : place(weight.blob.size));
  layout.file_size = cursor;
  return layout;
}

// Appends little-endian fields to the metadata buffer.
class Encoder {
 public:
  explicit Encoder(std::vector<uint8_t>& out) : out_(out) {}
  void u32(uint64_t value) { put(value, 4); }
  void u64(uint64_t value) { put(value, 8); }
  void str(const std::string& value) {
    u32(value.size());
    out_.insert(out_.end(), value.begin(), value.end());
  }
  void io(const IoSignature& sig) {
    str(sig.name);
    u32(static_cast<uint32_t>(sig.elem_type));
    u32(sig.dims.size());
    for (int64_t dim : sig.dims) u64(static_cast<uint64_t>(dim));
  }
  size_t size() const { return out_.size(); }

 private:
  void put(uint64_t value, size_t width) {
    size_t at = out_.size();
    out_.resize(at + width);
    put_le(out_.data() + at, value, width);
  }
  std::vector<uint8_t>& out_;
};

void expect_size(uint64_t actual, uint64_t planned, const char* what) {
  if (actual != planned)
    internal(std::string(what) + " encoded to " + std::to_string(actual) + " bytes, the plan said " +
             std::to_string(planned));
}

// `hashes` are the weights' own, or those the writer made; a missing one is written as zeros, to be
// patched.
std::vector<uint8_t> encode_metadata(const BinaryIdentity& identity, const std::vector<CompiledGraph>& graphs,
                                     const std::vector<WeightPayload>& weights, const std::vector<WeightFile>& files,
                                     const std::vector<std::optional<Hash128>>& hashes, const Layout& layout) {
  std::vector<uint8_t> out;
  out.reserve(layout.metadata_size);
  out.resize(format::kHeaderSize);
  uint8_t* header = out.data();
  std::copy(format::kMagic.begin(), format::kMagic.end(), header + format::field::kMagic);
  const uint64_t identity_offset = format::kHeaderSize;
  const uint64_t graph_table_offset = identity_offset + layout.identity_size;
  const uint64_t weight_table_offset = graph_table_offset + layout.graph_table_size;
  const uint64_t weight_file_table_offset = weight_table_offset + layout.weight_table_size;
  put_le(header + format::field::kVersion, kContextBinaryVersion, 4);
  put_le(header + format::field::kHeaderSize, format::kHeaderSize, 4);
  put_le(header + format::field::kFileSize, layout.file_size, 8);
  put_le(header + format::field::kIdentityOffset, identity_offset, 8);
  put_le(header + format::field::kIdentitySize, layout.identity_size, 8);
  put_le(header + format::field::kGraphTableOffset, graph_table_offset, 8);
  put_le(header + format::field::kGraphTableSize, layout.graph_table_size, 8);
  put_le(header + format::field::kWeightTableOffset, weight_table_offset, 8);
  put_le(header + format::field::kWeightTableSize, layout.weight_table_size, 8);
  put_le(header + format::field::kGraphCount, graphs.size(), 4);
  put_le(header + format::field::kWeightCount, weights.size(), 4);
  put_le(header + format::field::kWeightFileTableOffset, weight_file_table_offset, 8);
  put_le(header + format::field::kWeightFileTableSize, layout.weight_file_table_size, 8);
  put_le(header + format::field::kWeightFileCount, files.size(), 4);

  Encoder enc(out);
  enc.str(identity.backend);
  enc.str(identity.sdk_version);
  enc.str(identity.hardware_architecture);
  expect_size(enc.size() - identity_offset, layout.identity_size, "identity section");
  for (size_t i = 0; i < graphs.size(); ++i) {
    const CompiledGraph& graph = graphs[i];
    enc.str(graph.name);
    enc.u32(graph.inputs.size());
    for (const auto& io : graph.inputs) enc.io(io);
    enc.u32(graph.outputs.size());
    for (const auto& io : graph.outputs) enc.io(io);
    enc.u32(graph.fixed_inputs.size());
    for (const auto& fixed : graph.fixed_inputs) {
      enc.io(fixed.io);
      enc.str(std::string(fixed.value.begin(), fixed.value.end()));
    }
    enc.u64(layout.program_offsets[i]);
    enc.u64(graph.program.size());
    enc.u64(format::program_checksum(graph.program.data(), graph.program.size()));
    enc.u32(graph.weight_ids.size());
    for (uint32_t id : graph.weight_ids) enc.u32(id);
  }
  expect_size(enc.size() - graph_table_offset, layout.graph_table_size, "graph table");
  for (size_t id = 0; id < weights.size(); ++id) {
    const Hash128 hash = hashes[id].value_or(Hash128{});
    enc.u64(hash.low);
    enc.u64(hash.high);
    enc.u64(layout.weight_offsets[id]);
    enc.u64(weights[id].blob.size);
    enc.u32(weights[id].file);
  }
  for (const WeightFile& file : files) {
    enc.str(file.path);
    enc.u32(static_cast<uint32_t>(file.kind));
    enc.u64(file.content_id.low);
    enc.u64(file.content_id.high);
    enc.u32(file.tensors.size());
    for (const std::string& tensor : file.tensors) enc.str(tensor);
  }
  expect_size(enc.size(), layout.metadata_size, "metadata");
  put_le(out.data() + format::field::kMetadataChecksum, format::metadata_checksum(out.data(), out.size()), 8);
  return out;
}

// Forwards to the sink in chunks of at most kMaxWriteChunk and checks every payload lands at its
// planned offset, so a planning bug cannot produce a file the reader would misinterpret.
class SequentialWriter {
 public:
  explicit SequentialWriter(const ByteSink& sink) : sink_(sink) {}

  void write(const uint8_t* data, uint64_t size) {
    while (size > 0) {
      size_t chunk = static_cast<size_t>(std::min(size, format::kMaxWriteChunk));
      sink_(data, chunk);
      data += chunk;
      size -= chunk;
      written_ += chunk;
    }
  }

  // Pads to the next payload boundary, found independently of the plan, then checks the two agree.
  void align_to(uint64_t planned, const std::string& what) {
    static constexpr uint8_t kZeros[kPayloadAlignment] = {};
    write(kZeros, format::align_payload(written_, kPayloadAlignment) - written_);
    expect_at(planned, what);
  }

  void expect_at(uint64_t offset, const std::string& what) const {
    if (written_ != offset)
      internal(what + ": wrote " + std::to_string(written_) + " bytes, planned " + std::to_string(offset));
  }

  uint64_t written() const { return written_; }

 private:
  const ByteSink& sink_;
  uint64_t written_ = 0;
};

}  // namespace

WrittenBinary write_context_binary(const BinaryIdentity& identity, const std::vector<CompiledGraph>& graphs,
                                   const std::vector<WeightPayload>& weights, const ByteSink& sink,
                                   const BytePatcher& patch, const std::vector<WeightFile>& weight_files) {
  validate_inputs(identity, graphs, weights, weight_files, static_cast<bool>(patch));
  const Layout layout = plan_layout(identity, graphs, weights, weight_files);
  std::vector<std::optional<Hash128>> hashes;
  for (const auto& weight : weights) hashes.push_back(weight.hash);
  std::vector<uint8_t> metadata = encode_metadata(identity, graphs, weights, weight_files, hashes, layout);

  SequentialWriter out(sink);
  out.write(metadata.data(), metadata.size());
  for (size_t i = 0; i < graphs.size(); ++i) {
    out.align_to(layout.program_offsets[i], "graph '" + graphs[i].name + "' program");
    out.write(graphs[i].program.data(), graphs[i].program.size());
  }
  for (size_t id = 0; id < weights.size(); ++id) {
    if (weights[id].file > 0) continue;  // its bytes are in its weight file
    const Blob& blob = weights[id].blob;
    out.align_to(layout.weight_offsets[id], "weight " + std::to_string(id));
    const PinnedBytes bytes = blob.pin();
    out.write(bytes.data, blob.size);
    if (!hashes[id]) hashes[id] = xxh3_128(bytes.data, blob.size);
    // A multi-GB model must not stay resident just because it was written once.
    blob.release();
  }
  out.expect_at(layout.file_size, "end of file");
  if (std::any_of(weights.begin(), weights.end(), [](const WeightPayload& w) { return !w.hash; })) {
    metadata = encode_metadata(identity, graphs, weights, weight_files, hashes, layout);
    patch(0, metadata.data(), metadata.size());
  }
  log().debug("wrote context binary: {} graphs, {} weights, {} bytes ({} of metadata)", graphs.size(), weights.size(),
              layout.file_size, layout.metadata_size);
  return {out.written(), xxh3_128(metadata.data(), metadata.size())};
}

}  // namespace ctxgen
