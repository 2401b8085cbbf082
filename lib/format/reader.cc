// Reads a context binary: every field is checked against the bytes actually present before it
// is used, so a damaged file is rejected with the field, the value found and the value expected.

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <new>
#include <map>
#include <string_view>

#include "ctxgen/context_path.h"
#include "ctxgen/error.h"
#include "ctxgen/format.h"
#include "ctxgen/log.h"
#include "wire.h"

namespace ctxgen {
namespace {

using format::get_le;
using format::hex64;

std::string num(uint64_t value) { return std::to_string(value); }

std::string range(uint64_t offset, uint64_t size) { return "(offset " + num(offset) + ", size " + num(size) + ")"; }

std::string hex_bytes(const uint8_t* data, size_t size) {
  std::string out;
  for (size_t i = 0; i < size; ++i) {
    char buf[4];
    std::snprintf(buf, sizeof buf, i == 0 ? "%02x" : " %02x", data[i]);
    out += buf;
  }
  return out;
}

class Failer {
 public:
  explicit Failer(const std::string& label) : label_(label) {}
  [[noreturn]] void operator()(const std::string& message) const {
    throw Error(ErrorCode::kInvalidBinary, label_ + ": " + message);
  }

 private:
  const std::string& label_;
};

// Reads consecutive fields of one section; never reads past the section's end.
class Cursor {
 public:
  Cursor(const uint8_t* file, uint64_t offset, uint64_t size, std::string section, const Failer& fail)
      : file_(file), pos_(offset), end_(offset + size), section_(std::move(section)), fail_(fail) {}

  // Prefixes later messages, e.g. "graph 2 ('decode')".
  void set_where(std::string where) { where_ = std::move(where); }

  uint64_t fixed(size_t width, std::string_view field) {
    need(width, field);
    uint64_t value = get_le(file_ + pos_, width);
    pos_ += width;
    return value;
  }
  uint32_t u32(std::string_view field) { return static_cast<uint32_t>(fixed(4, field)); }
  uint64_t u64(std::string_view field) { return fixed(8, field); }

  std::string str(std::string_view field) {
    uint64_t length = fixed(format::kStringPrefixSize, std::string(field) + " length");
    if (length > remaining())
      fail_(prefix() + std::string(field) + " length is " + num(length) + ", but only " + num(remaining()) +
            " bytes remain in the " + section_ + " (at offset " + num(pos_) + ")");
    std::string value(reinterpret_cast<const char*>(file_ + pos_), length);
    pos_ += length;
    return value;
  }

  // A count of records that each take at least `min_each` bytes: a corrupt count is rejected
  // here, before anything is allocated for it.
  uint32_t count(std::string_view field, uint64_t min_each) {
    uint32_t value = u32(field);
    if (value > remaining() / min_each)
      fail_(prefix() + std::string(field) + " is " + num(value) + ", but only " + num(remaining()) +
            " bytes remain in the " + section_ + " and each entry takes at least " + num(min_each));
    return value;
  }

  void expect_end() const {
    if (pos_ != end_)
      fail_(section_ + " has " + num(end_ - pos_) + " bytes left after its last entry (at offset " + num(pos_) +
            "), expected none");
  }

  uint64_t remaining() const { return end_ - pos_; }
  std::string prefix() const { return section_ + ": " + (where_.empty() ? "" : where_ + ": "); }

 private:
  void need(uint64_t width, std::string_view field) const {
    if (width > remaining())
      fail_(prefix() + std::string(field) + " needs " + num(width) + " bytes at offset " + num(pos_) + ", but only " +
            num(remaining()) + " remain in the " + section_);
  }

  const uint8_t* file_;
  uint64_t pos_, end_;
  std::string section_;
  std::string where_;
  const Failer& fail_;
};

struct Section {
  uint64_t offset = 0, size = 0;
};

// A payload (program or weight) as found in the tables, for the bounds and overlap checks.
struct PayloadRef {
  uint64_t offset, size;
  std::string what;
};

class Parser {
 public:
  Parser(const uint8_t* data, uint64_t size, const std::string& label) : data_(data), size_(size), fail_(label) {}

  BinaryIdentity identity;
  std::vector<GraphRecord> graphs;
  std::vector<WeightRecord> weights;
  std::vector<WeightFile> weight_files;

  uint64_t metadata_size() const { return metadata_size_; }

  void parse() {
    check_header();
    const uint32_t graph_count = static_cast<uint32_t>(header(format::field::kGraphCount, 4));
    weight_count_ = static_cast<uint32_t>(header(format::field::kWeightCount, 4));
    weight_file_count_ = static_cast<uint32_t>(header(format::field::kWeightFileCount, 4));
    const Section identity_section =
        section("identity section", format::field::kIdentityOffset, format::kHeaderSize, "header");
    const Section graph_table = section("graph table", format::field::kGraphTableOffset,
                                        identity_section.offset + identity_section.size, "identity section");
    const Section weight_table = section("weight table", format::field::kWeightTableOffset,
                                         graph_table.offset + graph_table.size, "graph table");
    check_table_sizes(graph_count, graph_table, weight_table);
    const Section weight_file_table = section("weight file table", format::field::kWeightFileTableOffset,
                                              weight_table.offset + weight_table.size, "weight table");
    metadata_size_ = weight_file_table.offset + weight_file_table.size;
    if (weight_file_count_ > weight_file_table.size / format::kWeightFileRecordFixedSize)
      fail_("weight file count is " + num(weight_file_count_) + ", but the weight file table is only " +
            num(weight_file_table.size) + " bytes and each weight file takes at least " +
            num(format::kWeightFileRecordFixedSize));
    check_metadata_checksum();
    parse_identity(identity_section);
    identity.format_version = static_cast<uint32_t>(header(format::field::kVersion, 4));
    parse_graphs(graph_count, graph_table);
    parse_weights(weight_table);
    parse_weight_files(weight_file_table);
    check_payloads();
  }

 private:
  uint64_t header(size_t offset, size_t width) const { return get_le(data_ + offset, width); }

  [[noreturn]] void fail_header_truncated() const {
    fail_("truncated: file is " + num(size_) + " bytes, the header alone is " + num(format::kHeaderSize) + " bytes");
  }

  void check_header() const {
    if (size_ == 0) fail_("file is empty (0 bytes), expected a ctxgen context binary");
    const size_t magic_size = format::kMagic.size();
    if (size_ < magic_size)
      fail_("file is " + num(size_) + " bytes, too small for a ctxgen context binary (the header alone is " +
            num(format::kHeaderSize) + " bytes)");
    if (!std::equal(format::kMagic.begin(), format::kMagic.end(), data_ + format::field::kMagic))
      fail_("not a ctxgen context binary: magic is '" + hex_bytes(data_, magic_size) + "' (hex), expected '" +
            hex_bytes(format::kMagic.data(), magic_size) + "' (\"CTXGENCB\")");
    if (size_ < format::field::kVersion + 4) fail_header_truncated();
    const uint64_t version_found = header(format::field::kVersion, 4);
    if (version_found != kContextBinaryVersion)
      fail_("format version " + num(version_found) + ", this build reads version " + num(kContextBinaryVersion) +
            (version_found > kContextBinaryVersion ? " (written by a newer ctxgen: upgrade, or recompile the model)"
                                                   : ""));
    if (size_ < format::kHeaderSize) fail_header_truncated();
    const uint64_t header_size = header(format::field::kHeaderSize, 4);
    if (header_size != format::kHeaderSize)
      fail_("header size is " + num(header_size) + " bytes, expected " + num(format::kHeaderSize) +
            " for format version " + num(kContextBinaryVersion));
    const uint64_t declared = header(format::field::kFileSize, 8);
    if (declared > size_) fail_("truncated: file is " + num(size_) + " bytes, the header says " + num(declared));
    if (declared < size_)
      fail_("file is " + num(size_) + " bytes, the header says " + num(declared) +
            " (unexpected bytes after the end of the binary)");
  }

  // The sections are contiguous and in a fixed order, so each offset has exactly one valid value.
  Section section(const std::string& name, size_t offset_field, uint64_t expected_offset,
                  const std::string& previous) const {
    Section s{header(offset_field, 8), header(offset_field + 8, 8)};
    if (s.offset != expected_offset)
      fail_(name + " offset is " + num(s.offset) + ", expected " + num(expected_offset) + " (right after the " +
            previous + ")");
    if (s.size > size_ || s.offset > size_ - s.size)
      fail_(name + " " + range(s.offset, s.size) + " extends past the end of the file (" + num(size_) + " bytes)");
    return s;
  }

  void check_table_sizes(uint32_t graph_count, const Section& graph_table, const Section& weight_table) const {
    if (weight_table.size != uint64_t{weight_count_} * format::kWeightEntrySize)
      fail_("weight table size is " + num(weight_table.size) + " bytes, expected " +
            num(uint64_t{weight_count_} * format::kWeightEntrySize) + " (" + num(weight_count_) + " weights x " +
            num(format::kWeightEntrySize) + " bytes)");
    if (graph_count > graph_table.size / format::kGraphRecordFixedSize)
      fail_("graph count is " + num(graph_count) + ", but the graph table is only " + num(graph_table.size) +
            " bytes and each graph takes at least " + num(format::kGraphRecordFixedSize));
  }

  void check_metadata_checksum() const {
    const uint64_t stored = header(format::field::kMetadataChecksum, 8);
    const uint64_t computed = format::metadata_checksum(data_, metadata_size_);
    if (stored != computed)
      fail_("metadata checksum mismatch (header or tables damaged): computed " + hex64(computed) + " over bytes [0, " +
            num(metadata_size_) + "), the header says " + hex64(stored));
  }

  void parse_identity(const Section& s) {
    Cursor in(data_, s.offset, s.size, "identity section", fail_);
    identity.backend = in.str("backend name");
    identity.sdk_version = in.str("SDK version");
    identity.hardware_architecture = in.str("hardware architecture");
    in.expect_end();
  }

  static IoSignature parse_io(Cursor& in, const std::string& field) {
    IoSignature io;
    io.name = in.str(field + " name");
    io.elem_type = static_cast<int32_t>(in.u32(field + " element type"));
    io.dims.resize(in.count(field + " rank", format::kDimSize));
    for (int64_t& dim : io.dims) dim = static_cast<int64_t>(in.u64(field + " dim"));
    return io;
  }

  static std::vector<IoSignature> parse_ios(Cursor& in, const char* kind) {
    std::vector<IoSignature> ios(in.count(std::string(kind) + " count", format::kIoRecordFixedSize));
    for (size_t i = 0; i < ios.size(); ++i) ios[i] = parse_io(in, std::string(kind) + " " + num(i));
    return ios;
  }

  std::vector<FixedInput> parse_fixed_inputs(Cursor& in) const {
    std::vector<FixedInput> fixed(in.count("fixed input count", format::kIoRecordFixedSize + format::kStringPrefixSize));
    for (size_t i = 0; i < fixed.size(); ++i) {
      const std::string field = "fixed input " + num(i);
      fixed[i].io = parse_io(in, field);
      const std::string value = in.str(field + " value");
      fixed[i].value.assign(value.begin(), value.end());
      if (!format::holds_its_elements(fixed[i]))
        fail_(in.prefix() + field + " '" + fixed[i].io.name + "' value is " + num(value.size()) +
              " bytes, not the elements of element type " + std::to_string(fixed[i].io.elem_type) +
              " and its dims (float, double, int32, int64 or bool; at most " + num(format::kMaxFixedValueBytes) +
              " bytes)");
    }
    return fixed;
  }

  void parse_graphs(uint32_t count, const Section& s) {
    Cursor in(data_, s.offset, s.size, "graph table", fail_);
    graphs.resize(count);
    program_checksums_.resize(count);
    std::map<std::string_view, uint32_t> first_with_name;  // views into `graphs`, which is not resized
    for (uint32_t i = 0; i < count; ++i) {
      GraphRecord& graph = graphs[i];
      in.set_where("graph " + num(i));
      graph.name = in.str("name");
      if (graph.name.empty()) fail_(in.prefix() + "name is empty");
      if (auto [it, inserted] = first_with_name.emplace(graph.name, i); !inserted)
        fail_(in.prefix() + "name '" + graph.name + "' is also the name of graph " + num(it->second) +
              " (graph names must be unique)");
      in.set_where("graph " + num(i) + " ('" + graph.name + "')");
      graph.inputs = parse_ios(in, "input");
      graph.outputs = parse_ios(in, "output");
      graph.fixed_inputs = parse_fixed_inputs(in);
      const uint64_t offset = in.u64("program offset");
      graph.program_size = in.u64("program size");
      program_checksums_[i] = in.u64("program checksum");
      graph.weight_ids.resize(in.count("weight id count", format::kWeightIdSize));
      for (uint32_t& id : graph.weight_ids) id = in.u32("weight id");
      check_weight_ids(in, graph);
      payloads_.push_back({offset, graph.program_size, "graph '" + graph.name + "' program"});
      // Bounds are checked with every other payload below; the pointer is not used before that.
      program_offsets_.push_back(offset);
    }
    in.expect_end();
  }

  void check_weight_ids(const Cursor& in, const GraphRecord& graph) const {
    for (uint32_t id : graph.weight_ids) {
      if (id >= weight_count_)
        fail_(in.prefix() + "weight id " + num(id) + " is out of range, the weight table has " + num(weight_count_) +
              " weights");
    }
  }

  void parse_weights(const Section& s) {
    Cursor in(data_, s.offset, s.size, "weight table", fail_);
    weights.resize(weight_count_);
    held_.assign(weight_file_count_, 0);
    for (uint32_t id = 0; id < weight_count_; ++id) {
      WeightRecord& weight = weights[id];
      weight.hash.low = in.u64("hash low");
      weight.hash.high = in.u64("hash high");
      weight.offset = in.u64("offset");
      weight.size = in.u64("size");
      weight.file = in.u32("weight file");
      if (weight.file > weight_file_count_)
        fail_("weight table: weight " + num(id) + " is in weight file " + num(weight.file) + ", but the binary names " +
              num(weight_file_count_) + " weight files");
      if (weight.file > 0) ++held_[weight.file - 1];
      // A weight in a weight file is checked against that file when it is opened.
      if (weight.file == 0) payloads_.push_back({weight.offset, weight.size, "weight " + num(id)});
    }
    in.expect_end();
  }

  void parse_weight_files(const Section& s) {
    Cursor in(data_, s.offset, s.size, "weight file table", fail_);
    weight_files.resize(weight_file_count_);
    std::map<std::string, uint32_t> paths;  // to the first weight file with it
    for (uint32_t i = 0; i < weight_file_count_; ++i) {
      in.set_where("weight file " + num(i + 1));
      WeightFile& file = weight_files[i];
      file.path = in.str("path");
      if (file.path.empty()) fail_(in.prefix() + "path is empty");
      if (const auto [it, added] = paths.emplace(file.path, i + 1); !added)
        fail_(in.prefix() + "path '" + file.path + "' is also the path of weight file " + num(it->second));
      const uint32_t kind = in.u32("kind");
      if (kind > static_cast<uint32_t>(WeightFileKind::kSourceData))
        fail_(in.prefix() + "kind is " + num(kind) + ", expected 0 (weights file) or 1 (source data)");
      file.kind = static_cast<WeightFileKind>(kind);
      file.content_id.low = in.u64("content id low");
      file.content_id.high = in.u64("content id high");
      const bool source = file.kind == WeightFileKind::kSourceData;
      if (source && file.content_id != Hash128{})
        fail_(in.prefix() + "content id is " + file.content_id.hex() + ", expected zero for source data");
      const uint64_t held = held_[i];
      file.tensors.resize(in.count("tensor count", format::kStringPrefixSize));
      if (file.tensors.size() != (source ? held : 0))
        fail_(in.prefix() + "names " + num(file.tensors.size()) + " tensors, expected " + num(source ? held : 0) +
              (source ? " (one for each weight held there)" : " (a weights file names none)"));
      for (std::string& tensor : file.tensors) {
        tensor = in.str("tensor name");
        if (tensor.empty()) fail_(in.prefix() + "a tensor name is empty");
      }
    }
    in.expect_end();
  }

  void check_payloads() {
    for (const PayloadRef& p : payloads_) {
      if (p.offset % kPayloadAlignment != 0)
        fail_(p.what + " offset " + num(p.offset) + " is not a multiple of " + num(kPayloadAlignment));
      if (p.offset < metadata_size_)
        fail_(p.what + " offset " + num(p.offset) + " is inside the header and tables, which end at " +
              num(metadata_size_));
      if (p.size > size_ || p.offset > size_ - p.size)
        fail_(p.what + " " + range(p.offset, p.size) + " extends past the end of the file (" + num(size_) + " bytes)");
    }
    check_overlaps();
    for (size_t i = 0; i < graphs.size(); ++i) {
      graphs[i].program = data_ + program_offsets_[i];
      const uint64_t computed = format::program_checksum(graphs[i].program, graphs[i].program_size);
      if (computed != program_checksums_[i])
        fail_("graph '" + graphs[i].name + "' program checksum mismatch (program damaged): computed " +
              hex64(computed) + ", the graph table says " + hex64(program_checksums_[i]));
    }
  }

  void check_overlaps() const {
    std::vector<const PayloadRef*> sorted;
    for (const PayloadRef& p : payloads_) {
      if (p.size > 0) sorted.push_back(&p);  // an empty payload occupies no bytes
    }
    std::sort(sorted.begin(), sorted.end(), [](const PayloadRef* a, const PayloadRef* b) {
      return a->offset != b->offset ? a->offset < b->offset : a->size < b->size;
    });
    // In offset order every payload must start after the previous one ends: that suffices, since
    // any payload overlapping a later one also overlaps its immediate successor.
    for (size_t i = 1; i < sorted.size(); ++i) {
      const PayloadRef& prev = *sorted[i - 1];
      const PayloadRef& next = *sorted[i];
      if (next.offset < prev.offset + prev.size)
        fail_(next.what + " " + range(next.offset, next.size) + " overlaps " + prev.what + " " +
              range(prev.offset, prev.size));
    }
  }

  const uint8_t* data_;
  uint64_t size_;
  Failer fail_;
  uint64_t metadata_size_ = 0;
  uint32_t weight_count_ = 0;
  uint32_t weight_file_count_ = 0;
  std::vector<uint64_t> program_checksums_;
  std::vector<uint64_t> program_offsets_;
  std::vector<PayloadRef> payloads_;
  std::vector<uint64_t> held_;  // by weight file: how many weights it holds
};

}  // namespace

namespace {

template <class Map>
std::shared_ptr<const MappedFile> mapped(Map map) {
  try {
    return map();
  } catch (const Error& e) {
    // MappedFile names the path already; only the code changes, to the one for binaries.
    throw Error(ErrorCode::kInvalidBinary, std::string("cannot open context binary: ") + e.what());
  }
}

}  // namespace

std::shared_ptr<const ContextBinary> ContextBinary::open(const std::filesystem::path& path, const SourceFolder& source_folder) {
  return from_file(mapped([&] { return MappedFile::open(path); }), path, source_folder);
}

std::shared_ptr<const ContextBinary> ContextBinary::map(int fd, const std::filesystem::path& path,
                                                        const SourceFolder& source_folder) {
  return from_file(mapped([&] { return MappedFile::map(fd, path); }), path, source_folder);
}

std::shared_ptr<const ContextBinary> ContextBinary::from_file(std::shared_ptr<const MappedFile> file,
                                                              const std::filesystem::path& path,
                                                              const SourceFolder& source_folder) {
  std::shared_ptr<ContextBinary> binary = parse(file->data(), file->size(), file, path.string());
  binary->link(path.parent_path().empty() ? std::filesystem::path(".") : path.parent_path(), source_folder);
  return binary;
}

std::shared_ptr<const ContextBinary> ContextBinary::from_memory(const uint8_t* data, size_t size,
                                                                std::shared_ptr<const void> owner,
                                                                const std::string& label) {
  std::shared_ptr<ContextBinary> binary = parse(data, size, std::move(owner), label);
  if (!binary->weight_files_.empty())
    throw Error(ErrorCode::kInvalidBinary, label + ": holds its weights in weight files ('" +
                                               binary->weight_files_.front().path +
                                               "', ...), which only a binary opened from a file can name");
  return binary;
}

std::shared_ptr<ContextBinary> ContextBinary::parse(const uint8_t* data, size_t size, std::shared_ptr<const void> owner,
                                                    const std::string& label) {
  std::shared_ptr<ContextBinary> binary(new ContextBinary());
  binary->owner_ = std::move(owner);
  binary->data_ = data;
  binary->size_ = size;
  binary->label_ = label;
  Parser parser(data, size, label);
  parser.parse();
  binary->version_ = kContextBinaryVersion;
  binary->identity_ = std::move(parser.identity);
  binary->graphs_ = std::move(parser.graphs);
  binary->weights_ = std::move(parser.weights);
  binary->weight_files_ = std::move(parser.weight_files);
  binary->metadata_size_ = parser.metadata_size();
  binary->content_id_ = xxh3_128(data, binary->metadata_size_);
  log().debug("{}: context binary version {} from '{}': {} graphs, {} weights, {} weight files, {} bytes", label,
              binary->version_, binary->identity_.backend, binary->graphs_.size(), binary->weights_.size(),
              binary->weight_files_.size(), binary->size_);
  return binary;
}

void ContextBinary::link(const std::filesystem::path& folder, const SourceFolder& source_folder) {
  linked_.resize(weight_files_.size());
  sources_.resize(weight_files_.size());
  std::optional<std::optional<std::filesystem::path>> source;  // asked once, when there is source data
  for (uint32_t k = 1; k <= weight_files_.size(); ++k) {
    if (weight_files_[k - 1].kind == WeightFileKind::kWeights) {
      link_weights_file(k, folder);
      continue;
    }
    if (!source) source = source_folder ? source_folder() : folder;
    if (*source) link_source_data(k, **source);
  }
}

namespace {

// The runtime reads a weight in place when it is aligned for its elements (at most 8 bytes).
constexpr uintptr_t kSourceDataAlignment = 8;

// A path the binary may not name, or a missing file, is what is wrong with the binary.
ContextFile open_named(const std::filesystem::path& folder, const std::string& path, const std::string& label) {
  try {
    return open_weight_file(folder, path, label);
  } catch (const Error& e) {
    throw Error(ErrorCode::kInvalidBinary, e.what());
  }
}

}  // namespace

void ContextBinary::link_weights_file(uint32_t k, const std::filesystem::path& folder) {
  const WeightFile& named = weight_files_[k - 1];
  const std::string what = label_ + ": weight file '" + named.path + "'";
  const ContextFile file = open_named(folder, named.path, label_);
  // Parsed, not linked: a weights file naming weight files (itself, say) is refused below, not followed.
  std::shared_ptr<const ContextBinary> opened;
  try {
    const auto bytes = mapped([&] { return MappedFile::map(file.fd.get(), file.path); });
    opened = parse(bytes->data(), bytes->size(), bytes, file.path.string());
  } catch (const Error& e) {
    throw e.within(what);
  }
  const auto fail = [&](const std::string& why) { throw Error(ErrorCode::kInvalidBinary, what + " " + why); };
  // A weights file holds weights only, so a binary's weights are never more than one file away.
  if (!opened->graphs_.empty() || !opened->weight_files_.empty())
    fail("(" + file.path.string() + ") is not a weights file: it has " + std::to_string(opened->graphs_.size()) +
         " graphs and names " + std::to_string(opened->weight_files_.size()) + " weight files, expected none");
  if (opened->content_id_ != named.content_id)
    fail("(" + file.path.string() + ") has content id " + opened->content_id_.hex() + ", but the binary was written "
         "with the one whose id is " + named.content_id.hex() + ": they come from different compilations");
  if (opened->identity_.backend != identity_.backend || opened->identity_.sdk_version != identity_.sdk_version)
    fail("was written by backend '" + opened->identity_.backend + "' " + opened->identity_.sdk_version +
         ", the binary by '" + identity_.backend + "' " + identity_.sdk_version);
  // An empty payload may share its offset with the next one (§6): offsets alone do not say which.
  std::multimap<uint64_t, const WeightRecord*> by_offset;
  for (const WeightRecord& held : opened->weights_) by_offset.emplace(held.offset, &held);
  for (size_t id = 0; id < weights_.size(); ++id) {
    const WeightRecord& w = weights_[id];
    if (w.file != k) continue;
    const auto [first, last] = by_offset.equal_range(w.offset);
    if (std::none_of(first, last, [&](const auto& held) { return held.second->size == w.size && held.second->hash == w.hash; }))
      fail("holds no weight at offset " + std::to_string(w.offset) + " of size " + std::to_string(w.size) +
           " and hash " + w.hash.hex() + ", which the binary's weight " + std::to_string(id) + " is");
  }
  linked_[k - 1] = std::move(opened);
}

// Every weight is hashed when a binary is opened: the source model's data file is not ours, and a
// tensor changed in it (a model re-exported under the same name) must not run.
std::shared_ptr<const MappedFile> ContextBinary::checked_source_data(uint32_t k, const std::filesystem::path& source_folder) const {
  const WeightFile& named = weight_files_[k - 1];
  const std::string what = label_ + ": source data '" + named.path + "'";
  const std::string hint = " (source data: the external data of the model the binary was compiled from, looked for "
                           "in " + std::filesystem::absolute(source_folder).lexically_normal().string() + "; name that model where it is: ONNX Runtime's "
                           "ep.context_source_model_path, ctxgen verify --reference)";
  const std::shared_ptr<const MappedFile> bytes = [&] {
    try {
      const ContextFile file = open_source_data(source_folder, named.path, label_);
      return MappedFile::map(file.fd.get(), file.path);
    } catch (const Error& e) {
      throw Error(ErrorCode::kInvalidBinary, std::string(e.what()) + hint);
    }
  }();
  size_t index = 0;
  for (uint32_t id = 0; id < weights_.size(); ++id) {
    const WeightRecord& w = weights_[id];
    if (w.file != k) continue;
    const std::string tensor = "tensor '" + named.tensors[index++] + "'";
    if (w.size > bytes->size() || w.offset > bytes->size() - w.size)
      throw Error(ErrorCode::kMismatch, what + " (" + bytes->path().string() + ") is " + std::to_string(bytes->size()) +
                                            " bytes, but " + tensor + " was compiled from its bytes " +
                                            range(w.offset, w.size) + ": the file changed since the model was compiled");
    const Hash128 found = xxh3_128(bytes->data() + w.offset, w.size);
    if (found != w.hash)
      throw Error(ErrorCode::kMismatch, what + " (" + bytes->path().string() + "): " + tensor + " " + range(w.offset, w.size) +
                                            " has XXH3-128 " + found.hex() + ", but the binary was compiled from bytes "
                                            "with " + w.hash.hex() + ": the model's weights changed since it was "
                                            "compiled; compile it again");
  }
  return bytes;
}

void ContextBinary::link_source_data(uint32_t k, const std::filesystem::path& source_folder) {
  const std::shared_ptr<const MappedFile> bytes = checked_source_data(k, source_folder);
  // A weight no graph reads (a tensor recorded to be checked) is never copied.
  copies_.resize(weights_.size());
  for (const GraphRecord& g : graphs_)
    for (uint32_t id : g.weight_ids) {
      const uint8_t* data = bytes->data() + weights_[id].offset;
      if (weights_[id].file == k && !copies_[id] && reinterpret_cast<uintptr_t>(data) % kSourceDataAlignment != 0)
        copies_[id] = aligned_copy(data, weights_[id].size);
    }
  sources_[k - 1] = bytes;
}

void ContextBinary::check_source_data(const SourceFolder& source_folder) const {
  std::optional<std::optional<std::filesystem::path>> folder;
  for (uint32_t k = 1; k <= weight_files_.size(); ++k) {
    if (weight_files_[k - 1].kind != WeightFileKind::kSourceData) continue;
    if (!folder) folder = source_folder ? source_folder() : std::nullopt;
    if (!*folder) return;
    checked_source_data(k, **folder);
  }
}

const ContextBinary& ContextBinary::weight_file(uint32_t k) const {
  if (k == 0 || k > linked_.size() || !linked_[k - 1])
    throw Error(ErrorCode::kInternal, label_ + ": weight file " + std::to_string(k) + " is not a weights file");
  return *linked_[k - 1];
}

const GraphRecord* ContextBinary::find_graph(const std::string& name) const {
  auto it = std::find_if(graphs_.begin(), graphs_.end(), [&](const GraphRecord& g) { return g.name == name; });
  return it == graphs_.end() ? nullptr : &*it;
}

const uint8_t* ContextBinary::weight_data(uint32_t id) const {
  if (id >= weights_.size())
    throw Error(ErrorCode::kInvalidBinary, label_ + ": weight id " + std::to_string(id) +
                                               " is out of range, the binary has " + std::to_string(weights_.size()) +
                                               " weights");
  const WeightRecord& w = weights_[id];
  if (w.file == 0) return data_ + w.offset;
  if (id < copies_.size() && copies_[id]) return copies_[id].get();
  if (sources_[w.file - 1]) return sources_[w.file - 1]->data() + w.offset;
  if (!linked_[w.file - 1])
    throw Error(ErrorCode::kInvalidBinary, label_ + ": weight " + std::to_string(id) + " is in source data '" +
                                               weight_files_[w.file - 1].path + "', which was not opened");
  return linked_[w.file - 1]->data_ + w.offset;
}

std::shared_ptr<const uint8_t> aligned_copy(const uint8_t* bytes, size_t size) {
  constexpr std::align_val_t alignment{kPayloadAlignment};
  auto* data = static_cast<uint8_t*>(::operator new(std::max<size_t>(size, 1), alignment));
  if (size > 0) std::memcpy(data, bytes, size);
  return std::shared_ptr<const uint8_t>(data, [](const uint8_t* p) {
    ::operator delete(const_cast<uint8_t*>(p), std::align_val_t{kPayloadAlignment});
  });
}

void ContextBinary::verify_payloads() const {
  // The weights file checks its payloads, which are the ones used from it (checked when opened);
  // source data was hashed when opened.
  for (const auto& file : linked_)
    if (file) file->verify_payloads();
  for (size_t id = 0; id < weights_.size(); ++id) {
    const WeightRecord& w = weights_[id];
    if (w.file != 0) continue;
    const Hash128 computed = xxh3_128(data_ + w.offset, w.size);
    if (computed != w.hash)
      throw Error(ErrorCode::kInvalidBinary, label_ + ": weight " + std::to_string(id) + " " + range(w.offset, w.size) +
                                                 " is damaged: its XXH3-128 is " + computed.hex() +
                                                 ", the weight table says " + w.hash.hex());
  }
  // The bytes no checksum covers, the padding before each payload, are zero as written (§5): a
  // byte changed there is damage too. Checked here, where every byte is read anyway, not on open.
  std::vector<std::pair<uint64_t, uint64_t>> payloads;  // [begin, end), the programs' and the weights'
  for (const auto& g : graphs_) payloads.emplace_back(static_cast<uint64_t>(g.program - data_), g.program - data_ + g.program_size);
  for (const auto& w : weights_)
    if (w.file == 0) payloads.emplace_back(w.offset, w.offset + w.size);
  std::sort(payloads.begin(), payloads.end());
  uint64_t at = metadata_size_;
  for (const auto& [begin, end] : payloads) {
    for (uint64_t i = at; i < begin; ++i)
      if (data_[i] != 0)
        throw Error(ErrorCode::kInvalidBinary, label_ + ": byte " + std::to_string(i) + ", padding before a payload, is " +
                                                   std::to_string(data_[i]) + " where the format writes 0 (the file is damaged)");
    at = std::max(at, end);
  }
}

std::string compatibility_info(const BinaryIdentity& identity) {
  return "ctxgen-context-binary=" + std::to_string(identity.format_version) + ";backend=" + identity.backend +
         ";sdk=" + identity.sdk_version + ";hardware=" + identity.hardware_architecture;
}

std::optional<BinaryIdentity> parse_compatibility_info(const std::string& info) {
  // The hardware field comes last and may hold anything but its prefix, ';' included.
  static constexpr std::string_view kKeys[] = {"ctxgen-context-binary=", ";backend=", ";sdk=", ";hardware="};
  std::string values[4];
  size_t at = 0;
  for (size_t k = 0; k < 4; ++k) {
    if (info.compare(at, kKeys[k].size(), kKeys[k]) != 0) return std::nullopt;
    at += kKeys[k].size();
    const size_t end = k == 3 ? info.size() : info.find(kKeys[k + 1], at);
    if (end == std::string::npos) return std::nullopt;
    values[k] = info.substr(at, end - at);
    at = end;
  }
  const std::string& version = values[0];
  if (version.empty() || version.size() > 9 || version.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
  return BinaryIdentity{values[1], values[2], values[3], static_cast<uint32_t>(std::stoul(version))};
}

void check_content_id(const ContextBinary& binary, const std::string& recorded, const std::string& model) {
  const std::string found = binary.content_id().hex();
  if (recorded != found) {
    throw Error(ErrorCode::kMismatch, model + " was compiled with the context binary whose id is " + recorded + ", but " +
                                          binary.label() + " has id " + found +
                                          ": they come from different compilations; use the .bin written with the "
                                          "model, or compile again");
  }
}

std::vector<IoSignature> node_inputs(const GraphRecord& graph) {
  std::vector<IoSignature> inputs = graph.inputs;
  for (const auto& fixed : graph.fixed_inputs) inputs.push_back(fixed.io);
  return inputs;
}

}  // namespace ctxgen
