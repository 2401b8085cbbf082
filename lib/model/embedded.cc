// The protobuf wire format, read just far enough to cut embedded weights out of a ModelProto:
// the messages on the way to a tensor (model -> graph -> node -> attribute -> graph ...) are
// rewritten with new lengths, every other field is copied byte for byte.

#include "ctxgen/embedded.h"

#include <charconv>
#include <cstring>
#include <optional>

#include "ctxgen/error.h"

namespace ctxgen {
namespace {

// Deeper than protobuf's own limit (100), so ctxgen never refuses what protobuf would parse.
constexpr int kMaxDepth = 128;

enum Wire : uint8_t { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kStartGroup = 3, kEndGroup = 4, kFixed32 = 5 };

// The messages on the way to a tensor, and the field numbers that lead on (onnx.proto).
enum class Kind { kModel, kGraph, kNode, kAttribute, kTensor, kOther };
namespace number {
constexpr uint32_t kModelGraph = 7;
constexpr uint32_t kGraphNode = 1, kGraphInitializer = 5;
constexpr uint32_t kNodeAttribute = 5;
constexpr uint32_t kAttributeTensor = 5, kAttributeGraph = 6, kAttributeGraphs = 11;
constexpr uint32_t kTensorDataType = 2, kTensorFloatData = 4, kTensorRawData = 9, kTensorDoubleData = 10,
                   kTensorExternalData = 13, kTensorDataLocation = 14;
constexpr uint32_t kEntryKey = 1, kEntryValue = 2;
}  // namespace number

Kind child_kind(Kind parent, uint32_t field) {
  switch (parent) {
    case Kind::kModel: return field == number::kModelGraph ? Kind::kGraph : Kind::kOther;
    case Kind::kGraph:
      return field == number::kGraphNode ? Kind::kNode : field == number::kGraphInitializer ? Kind::kTensor : Kind::kOther;
    case Kind::kNode: return field == number::kNodeAttribute ? Kind::kAttribute : Kind::kOther;
    case Kind::kAttribute:
      return field == number::kAttributeTensor ? Kind::kTensor
             : field == number::kAttributeGraph || field == number::kAttributeGraphs ? Kind::kGraph
                                                                                     : Kind::kOther;
    default: return Kind::kOther;
  }
}

struct Field {
  uint32_t number = 0;
  uint8_t wire = 0;
  size_t start = 0;    // the tag
  size_t value = 0;    // the value (after a length prefix, for length-delimited fields)
  size_t end = 0;      // one past the field
  uint64_t varint = 0;  // the value of a varint field
  size_t length() const { return end - value; }
};

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

void put_length_delimited(std::string& out, uint32_t number, const std::string& bytes) {
  put_varint(out, (uint64_t{number} << 3) | kLengthDelimited);
  put_varint(out, bytes.size());
  out += bytes;
}

class Slimmer {
 public:
  Slimmer(const uint8_t* data, size_t size, const PassedBytes& passed) : data_(data), size_(size), passed_(passed) {}

  SlimModel run() {
    SlimModel slim;
    message(Kind::kModel, 0, size_, 0, true, slim.bytes);
    slim.spans = std::move(spans_);
    return slim;
  }

 private:
  [[noreturn]] void fail(size_t at, const std::string& what) const {
    throw Error(ErrorCode::kInvalidModel, "at byte " + std::to_string(at) + ", " + what);
  }

  // A varint of at most `max_bytes` bytes; protobuf keeps the low 64 bits.
  uint64_t varint(size_t& pos, size_t end, int max_bytes = 10) const {
    const size_t start = pos;
    uint64_t v = 0;
    for (int i = 0; i < max_bytes; ++i) {
      if (pos >= end) fail(start, "a varint runs past the end of its message");
      const uint8_t b = data_[pos++];
      if (i < 10) v |= uint64_t{b & 0x7fu} << (7 * i < 64 ? 7 * i : 63);
      if (!(b & 0x80)) return v;
    }
    fail(start, "a varint is longer than " + std::to_string(max_bytes) + " bytes");
  }

  // As protobuf reads them: a tag in at most 5 bytes, its value cut to 32 bits; a length in at
  // most 5 bytes, below 2 GiB less the 16 bytes protobuf keeps in hand.
  uint32_t tag(size_t& pos, size_t end) const { return static_cast<uint32_t>(varint(pos, end, 5)); }
  uint64_t length(size_t& pos, size_t end) const {
    const size_t start = pos;
    const uint64_t n = varint(pos, end, 5);
    if (n > INT32_MAX - 16) fail(start, "a length of " + std::to_string(n) + " bytes is beyond protobuf's 2 GiB");
    return n;
  }

  // Reads the field at `pos` within [pos, end); a group is skipped whole.
  Field field(size_t pos, size_t end, int depth) const {
    Field f;
    f.start = pos;
    const uint32_t t = tag(pos, end);
    if ((t >> 3) == 0) fail(f.start, "a field tag has no valid field number");
    f.number = t >> 3;
    f.wire = static_cast<uint8_t>(t & 7);
    f.value = pos;
    auto fixed = [&](size_t width) {
      if (end - pos < width) fail(f.start, "field " + std::to_string(f.number) + " runs past the end of its message");
      pos += width;
    };
    switch (f.wire) {
      case kVarint: f.varint = varint(pos, end); break;
      case kFixed64: fixed(8); break;
      case kFixed32: fixed(4); break;
      case kLengthDelimited: {
        const uint64_t n = length(pos, end);
        if (n > end - pos)
          fail(f.start, "field " + std::to_string(f.number) + " claims " + std::to_string(n) +
                            " bytes, more than its message has left");
        f.value = pos;
        pos += static_cast<size_t>(n);
        break;
      }
      case kStartGroup: pos = group_end(f, end, depth + 1); break;
      case kEndGroup: fail(f.start, "an end-group tag without its start");
      default: fail(f.start, "field " + std::to_string(f.number) + " has wire type " + std::to_string(f.wire) + ", which protobuf does not define");
    }
    f.end = pos;
    return f;
  }

  size_t group_end(const Field& group, size_t end, int depth) const {
    if (depth > kMaxDepth) fail(group.start, "messages are nested deeper than " + std::to_string(kMaxDepth));
    size_t pos = group.value;
    while (pos < end) {
      Field probe;
      probe.start = pos;
      const uint32_t t = tag(pos, end);
      if ((t & 7) == kEndGroup) {
        if ((t >> 3) != group.number) fail(probe.start, "group " + std::to_string(group.number) + " ends with another group's tag");
        return pos;
      }
      pos = field(probe.start, end, depth).end;
    }
    fail(group.start, "group " + std::to_string(group.number) + " does not end");
  }

  // Appends message [begin, end) of `kind` to `out`, its tensors cut; returns whether it changed.
  bool message(Kind kind, size_t begin, size_t end, int depth, bool may_cut, std::string& out) {
    if (depth > kMaxDepth) fail(begin, "messages are nested deeper than " + std::to_string(kMaxDepth));
    if (kind == Kind::kTensor) return tensor(begin, end, depth, may_cut, out);
    // A singular tensor field given twice is merged by protobuf: leave such tensors whole.
    int tensors = 0;
    if (kind == Kind::kAttribute)
      for (size_t pos = begin; pos < end;) {
        const Field f = field(pos, end, depth);
        tensors += f.number == number::kAttributeTensor && f.wire == kLengthDelimited;
        pos = f.end;
      }
    bool changed = false;
    std::string child;
    for (size_t pos = begin; pos < end;) {
      const Field f = field(pos, end, depth);
      pos = f.end;
      const Kind next = f.wire == kLengthDelimited ? child_kind(kind, f.number) : Kind::kOther;
      if (next != Kind::kOther) {
        child.clear();
        if (message(next, f.value, f.end, depth + 1, kind != Kind::kAttribute || tensors == 1, child)) {
          put_length_delimited(out, f.number, child);
          changed = true;
          continue;
        }
      }
      out.append(reinterpret_cast<const char*>(data_ + f.start), f.end - f.start);
    }
    return changed;
  }

  std::string entry_key(const Field& entry, int depth) const {
    std::string key;
    for (size_t pos = entry.value; pos < entry.end;) {
      const Field f = field(pos, entry.end, depth);
      if (f.number == number::kEntryKey && f.wire == kLengthDelimited)
        key.assign(reinterpret_cast<const char*>(data_ + f.value), f.length());
      pos = f.end;
    }
    return key;
  }

  bool tensor(size_t begin, size_t end, int depth, bool may_cut, std::string& out) {
    int32_t dtype = 0;
    std::optional<int32_t> location;
    std::optional<Field> raw;
    std::optional<Field> packed[2];  // float_data, double_data: the last occurrence
    int occurrences[2] = {0, 0};
    for (size_t pos = begin; pos < end;) {
      const Field f = field(pos, end, depth);
      pos = f.end;
      const bool ld = f.wire == kLengthDelimited;
      if (f.number == number::kTensorDataType && f.wire == kVarint) {
        dtype = static_cast<int32_t>(f.varint);
      } else if (f.number == number::kTensorDataLocation && f.wire == kVarint) {
        // protobuf keeps an unknown enum value aside and the field as it was
        const auto v = static_cast<int32_t>(f.varint);
        if (v == onnx::TensorProto::DEFAULT || v == onnx::TensorProto::EXTERNAL) location = v;
      } else if (f.number == number::kTensorRawData && ld) {
        raw = f;
      } else if (f.number == number::kTensorExternalData && ld) {
        if (entry_key(f, depth + 1) == kEmbeddedKey)
          fail(f.start, "a tensor carries the external_data key '" + std::string(kEmbeddedKey) + "', which ctxgen reserves");
      } else if (f.number == number::kTensorFloatData || f.number == number::kTensorDoubleData) {
        const int i = f.number == number::kTensorDoubleData;
        const uint8_t element = i ? kFixed64 : kFixed32;
        if (f.wire != element && !ld) continue;
        ++occurrences[i];
        if (ld && f.length() % (i ? 8 : 4) != 0)
          fail(f.start, std::string(i ? "packed double_data" : "packed float_data") + " of " + std::to_string(f.length()) +
                            " bytes is not whole values");
        packed[i] = ld ? std::optional<Field>(f) : std::nullopt;
      }
    }
    using T = onnx::TensorProto;
    std::optional<Field> cut;
    EmbeddedField kind = EmbeddedField::kRawData;
    if (!may_cut || location == T::EXTERNAL) {
    } else if (raw) {
      if (dtype != T::UNDEFINED && dtype != T::INT32 && dtype != T::INT64 && dtype != T::STRING) cut = raw;
    } else if ((dtype == T::FLOAT || dtype == T::COMPLEX64) && occurrences[0] == 1) {
      cut = packed[0];
      kind = EmbeddedField::kFloatData;
    } else if ((dtype == T::DOUBLE || dtype == T::COMPLEX128) && occurrences[1] == 1) {
      cut = packed[1];
      kind = EmbeddedField::kDoubleData;
    }
    if (!cut || cut->length() < kMinEmbeddedView) {
      out.append(reinterpret_cast<const char*>(data_ + begin), end - begin);
      return false;
    }
    for (size_t pos = begin; pos < end;) {
      const Field f = field(pos, end, depth);
      pos = f.end;
      // Every raw_data goes: protobuf would have kept the last, which is the one cut.
      if (f.start == cut->start || (kind == EmbeddedField::kRawData && f.number == number::kTensorRawData && f.wire == kLengthDelimited))
        continue;
      out.append(reinterpret_cast<const char*>(data_ + f.start), f.end - f.start);
    }
    std::string entry;
    put_length_delimited(entry, number::kEntryKey, kEmbeddedKey);
    put_length_delimited(entry, number::kEntryValue, std::to_string(spans_.size()));
    put_length_delimited(out, number::kTensorExternalData, entry);
    put_varint(out, (uint64_t{number::kTensorDataLocation} << 3) | kVarint);
    put_varint(out, T::EXTERNAL);
    spans_.push_back({cut->value, cut->length(), kind, location.has_value()});
    if (passed_) passed_(begin, end - begin);
    return true;
  }

  const uint8_t* data_;
  size_t size_;
  const PassedBytes& passed_;
  std::vector<EmbeddedSpan> spans_;
};

}  // namespace

SlimModel slim_model(const uint8_t* data, size_t size, const PassedBytes& passed) {
  return Slimmer(data, size, passed).run();
}

const EmbeddedSpan* embedded_span(const onnx::TensorProto& tensor, const std::vector<EmbeddedSpan>& spans) {
  if (tensor.data_location() != onnx::TensorProto::EXTERNAL || tensor.external_data_size() == 0) return nullptr;
  const auto& last = tensor.external_data(tensor.external_data_size() - 1);
  if (last.key() != kEmbeddedKey) return nullptr;
  size_t index = 0;
  const auto& text = last.value();
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), index);
  // slim_model refuses the key in its input, so a marker is always one it wrote
  if (ec != std::errc() || end != text.data() + text.size() || index >= spans.size())
    throw Error(ErrorCode::kInternal, "tensor '" + tensor.name() + "' carries a marker '" + text + "' of no cut tensor");
  return &spans[index];
}

void restore_embedded(onnx::TensorProto& tensor, const std::vector<EmbeddedSpan>& spans, const uint8_t* data) {
  const EmbeddedSpan& span = *embedded_span(tensor, spans);
  const uint8_t* bytes = data + span.offset;
  switch (span.field) {
    case EmbeddedField::kRawData: tensor.set_raw_data(bytes, span.size); break;
    case EmbeddedField::kFloatData:
      tensor.mutable_float_data()->Resize(static_cast<int>(span.size / sizeof(float)), 0.0f);
      std::memcpy(tensor.mutable_float_data()->mutable_data(), bytes, span.size);
      break;
    case EmbeddedField::kDoubleData:
      tensor.mutable_double_data()->Resize(static_cast<int>(span.size / sizeof(double)), 0.0);
      std::memcpy(tensor.mutable_double_data()->mutable_data(), bytes, span.size);
      break;
  }
  tensor.mutable_external_data()->RemoveLast();
  if (span.had_location)
    tensor.set_data_location(onnx::TensorProto::DEFAULT);
  else
    tensor.clear_data_location();
}

}  // namespace ctxgen
