// Encoding of `ref` programs (docs/ref-program-format.md). Little-endian; every count is checked
// against the bytes that remain before anything is allocated, so a damaged program is rejected
// with a message instead of read out of bounds.

#include "ctxgen/ref_program.h"

#include <cstring>
#include <limits>

#include "ctxgen/error.h"

namespace ctxgen::ref {
namespace {

constexpr char kMagic[4] = {'R', 'P', 'G', 'M'};
constexpr uint32_t kVersion = 2;

class Writer {
 public:
  template <typename T>
  void put(T value) {
    uint8_t bytes[sizeof(T)];
    std::memcpy(bytes, &value, sizeof(T));  // the format is little-endian, as is every target
    out_.insert(out_.end(), bytes, bytes + sizeof(T));
  }
  void put_string(const std::string& s) {
    put<uint32_t>(static_cast<uint32_t>(s.size()));
    out_.insert(out_.end(), s.begin(), s.end());
  }
  template <typename T>
  void put_list(const std::vector<T>& list) {
    put<uint32_t>(static_cast<uint32_t>(list.size()));
    for (const T& v : list) put<T>(v);
  }
  std::vector<uint8_t> take() { return std::move(out_); }

 private:
  std::vector<uint8_t> out_;
};

class Reader {
 public:
  Reader(const uint8_t* data, size_t size) : data_(data), size_(size) {}

  template <typename T>
  T get(const char* what) {
    need(sizeof(T), what);
    T value;
    std::memcpy(&value, data_ + at_, sizeof(T));
    at_ += sizeof(T);
    return value;
  }
  // A count of items of at least `item_size` bytes each: never more than the bytes left allow.
  uint32_t count(size_t item_size, const char* what) {
    uint32_t n = get<uint32_t>(what);
    if (item_size > 0 && n > (size_ - at_) / item_size)
      fail(std::string(what) + " count " + std::to_string(n) + " does not fit in the " + std::to_string(size_ - at_) +
           " bytes left");
    return n;
  }
  std::string get_string(const char* what) {
    uint32_t n = count(1, what);
    std::string s(reinterpret_cast<const char*>(data_ + at_), n);
    at_ += n;
    return s;
  }
  template <typename T>
  std::vector<T> get_list(const char* what) {
    uint32_t n = count(sizeof(T), what);
    std::vector<T> list(n);
    for (auto& v : list) v = get<T>(what);
    return list;
  }
  bool done() const { return at_ == size_; }
  size_t offset() const { return at_; }
  [[noreturn]] void fail(const std::string& message) const {
    throw Error(ErrorCode::kInvalidBinary, "ref program: " + message + " (at byte " + std::to_string(at_) + ")");
  }

 private:
  void need(size_t n, const char* what) const {
    if (size_ - at_ < n)
      fail(std::string("truncated while reading ") + what + ": " + std::to_string(n) + " bytes needed, " +
           std::to_string(size_ - at_) + " left");
  }
  const uint8_t* data_;
  size_t size_;
  size_t at_ = 0;
};

void check_id(Reader& in, int32_t id, size_t values, bool optional, const std::string& what) {
  if ((optional && id == -1) || (id >= 0 && static_cast<size_t>(id) < values)) return;
  in.fail(what + " refers to value " + std::to_string(id) + ", the program has " + std::to_string(values));
}

}  // namespace

int64_t Value::element_count() const {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

uint64_t Value::byte_size() const { return static_cast<uint64_t>(element_count()) * dtype_size(dtype); }

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: case DType::kInt32: return 4;
    case DType::kInt64: return 8;
    case DType::kUInt16: case DType::kInt16: case DType::kFloat16: case DType::kBFloat16: return 2;
    case DType::kUInt8: case DType::kInt8: case DType::kBool: return 1;
  }
  return 0;
}

std::string dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return "float32";
    case DType::kInt32: return "int32";
    case DType::kInt64: return "int64";
    case DType::kBool: return "bool";
    case DType::kUInt8: return "uint8";
    case DType::kInt8: return "int8";
    case DType::kUInt16: return "uint16";
    case DType::kInt16: return "int16";
    case DType::kFloat16: return "float16";
    case DType::kBFloat16: return "bfloat16";
  }
  return "dtype " + std::to_string(static_cast<int>(dtype));
}

bool is_float(DType dtype) { return dtype == DType::kFloat32 || dtype == DType::kFloat16 || dtype == DType::kBFloat16; }

Attr int_attr(const std::string& name, int64_t value) {
  Attr a;
  a.name = name;
  a.kind = Attr::Kind::kInt;
  a.i = value;
  return a;
}

Attr float_attr(const std::string& name, float value) {
  Attr a;
  a.name = name;
  a.kind = Attr::Kind::kFloat;
  a.f = value;
  return a;
}

Attr ints_attr(const std::string& name, std::vector<int64_t> values) {
  Attr a;
  a.name = name;
  a.kind = Attr::Kind::kInts;
  a.ints = std::move(values);
  return a;
}

Attr floats_attr(const std::string& name, std::vector<float> values) {
  Attr a;
  a.name = name;
  a.kind = Attr::Kind::kFloats;
  a.floats = std::move(values);
  return a;
}

const Attr* Op::attr(const std::string& name) const {
  for (const auto& a : attrs)
    if (a.name == name) return &a;
  return nullptr;
}

int64_t Op::get_int(const std::string& name, int64_t fallback) const {
  const Attr* a = attr(name);
  return a && a->kind == Attr::Kind::kInt ? a->i : fallback;
}

float Op::get_float(const std::string& name, float fallback) const {
  const Attr* a = attr(name);
  return a && a->kind == Attr::Kind::kFloat ? a->f : fallback;
}

std::vector<int64_t> Op::get_ints(const std::string& name) const {
  const Attr* a = attr(name);
  return a && a->kind == Attr::Kind::kInts ? a->ints : std::vector<int64_t>{};
}

std::vector<uint8_t> serialize(const Program& program) {
  Writer out;
  for (char c : kMagic) out.put<char>(c);
  out.put<uint32_t>(kVersion);
  out.put<uint32_t>(static_cast<uint32_t>(program.values.size()));
  for (const auto& v : program.values) {
    out.put<uint8_t>(static_cast<uint8_t>(v.dtype));
    out.put<uint8_t>(static_cast<uint8_t>(v.kind));
    out.put<uint64_t>(v.index);
    out.put_list<int64_t>(v.dims);
  }
  out.put<uint32_t>(static_cast<uint32_t>(program.ops.size()));
  for (const auto& op : program.ops) {
    out.put_string(op.type);
    out.put<uint32_t>(static_cast<uint32_t>(op.attrs.size()));
    for (const auto& a : op.attrs) {
      out.put_string(a.name);
      out.put<uint8_t>(static_cast<uint8_t>(a.kind));
      switch (a.kind) {
        case Attr::Kind::kInt: out.put<int64_t>(a.i); break;
        case Attr::Kind::kFloat: out.put<float>(a.f); break;
        case Attr::Kind::kInts: out.put_list<int64_t>(a.ints); break;
        case Attr::Kind::kFloats: out.put_list<float>(a.floats); break;
      }
    }
    out.put_list<int32_t>(op.inputs);
    out.put_list<int32_t>(op.outputs);
  }
  out.put<uint64_t>(program.arena_bytes);
  out.put_list<int32_t>(program.inputs);
  out.put_list<int32_t>(program.outputs);
  return out.take();
}

Program deserialize(const uint8_t* data, size_t size) {
  Reader in(data, size);
  char magic[4];
  for (char& c : magic) c = in.get<char>("magic");
  if (std::memcmp(magic, kMagic, 4) != 0) in.fail("bad magic: not a ref program");
  uint32_t version = in.get<uint32_t>("version");
  if (version != kVersion)
    in.fail("encoding version " + std::to_string(version) + ", this build reads version " + std::to_string(kVersion));

  Program p;
  constexpr size_t kMinValueBytes = 1 + 1 + 8 + 4;
  p.values.resize(in.count(kMinValueBytes, "value"));
  for (size_t i = 0; i < p.values.size(); ++i) {
    Value& v = p.values[i];
    auto dtype = in.get<uint8_t>("value dtype");
    if (dtype_size(static_cast<DType>(dtype)) == 0)
      in.fail("value " + std::to_string(i) + " has unknown dtype " + std::to_string(dtype));
    v.dtype = static_cast<DType>(dtype);
    auto kind = in.get<uint8_t>("value kind");
    if (kind > static_cast<uint8_t>(ValueKind::kArena))
      in.fail("value " + std::to_string(i) + " has unknown kind " + std::to_string(kind));
    v.kind = static_cast<ValueKind>(kind);
    v.index = in.get<uint64_t>("value index");
    v.dims = in.get_list<int64_t>("value dims");
    for (int64_t d : v.dims)
      if (d < 0 || d > kMaxElements) in.fail("value " + std::to_string(i) + " has dimension " + std::to_string(d));
  }
  constexpr size_t kMinOpBytes = 4 + 4 + 4 + 4;
  p.ops.resize(in.count(kMinOpBytes, "op"));
  for (size_t k = 0; k < p.ops.size(); ++k) {
    Op& op = p.ops[k];
    op.type = in.get_string("op type");
    op.attrs.resize(in.count(4 + 1, "attribute"));
    for (auto& a : op.attrs) {
      a.name = in.get_string("attribute name");
      auto kind = in.get<uint8_t>("attribute kind");
      switch (kind) {
        case 0: a.i = in.get<int64_t>("int attribute"); break;
        case 1: a.f = in.get<float>("float attribute"); break;
        case 2: a.ints = in.get_list<int64_t>("ints attribute"); break;
        case 3: a.floats = in.get_list<float>("floats attribute"); break;
        default: in.fail("op " + std::to_string(k) + " (" + op.type + ") attribute '" + a.name + "' has unknown kind " + std::to_string(kind));
      }
      a.kind = static_cast<Attr::Kind>(kind);
    }
    op.inputs = in.get_list<int32_t>("op inputs");
    op.outputs = in.get_list<int32_t>("op outputs");
    std::string what = "op " + std::to_string(k) + " (" + op.type + ")";
    for (int32_t id : op.inputs) check_id(in, id, p.values.size(), true, what + " input");
    for (int32_t id : op.outputs) check_id(in, id, p.values.size(), false, what + " output");
  }
  p.arena_bytes = in.get<uint64_t>("arena size");
  p.inputs = in.get_list<int32_t>("graph inputs");
  p.outputs = in.get_list<int32_t>("graph outputs");
  for (int32_t id : p.inputs) check_id(in, id, p.values.size(), false, "graph input");
  for (int32_t id : p.outputs) check_id(in, id, p.values.size(), false, "graph output");
  if (!in.done()) in.fail(std::to_string(size - in.offset()) + " unexpected bytes after the program");
  return p;
}

}  // namespace ctxgen::ref
