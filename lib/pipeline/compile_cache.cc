#include "ctxgen/compile_cache.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <csignal>
#include <charconv>
#include <cstring>
#include <ctime>
#include <fstream>
#include <map>
#include <optional>
#include <random>
#include <string_view>
#include <tuple>
#include <unordered_set>

#include <nettle/hmac.h>
#include <nlohmann/json.hpp>

#include "ctxgen/error.h"
#include "ctxgen/log.h"

namespace fs = std::filesystem;

namespace ctxgen {
namespace {

constexpr char kEntryMagic[8] = {'C', 'T', 'X', 'G', 'C', 'C', '0', '1'};
// An entry holds one partition's program and weights, which a context binary holds too: no
// larger than the largest binary a run writes in practice.
constexpr uint64_t kMaxEntryBytes = uint64_t{1} << 36;
constexpr char kHashesMagic[8] = {'C', 'T', 'X', 'G', 'C', 'H', '0', '1'};
// A file changed this recently may still be changing within the same timestamp: its hashes are
// used but not remembered (ccache's rule for the same race).
constexpr int64_t kSettledNanoseconds = 2'000'000'000;

// Bytes a key is made of; lengths before text and lists, so that different inputs never run together.
class KeyBytes {
 public:
  void put(const void* data, size_t size) { bytes_.append(static_cast<const char*>(data), size); }
  void put(uint64_t v) { put(&v, sizeof v); }
  void put(const std::string& s) {
    put(static_cast<uint64_t>(s.size()));
    put(s.data(), s.size());
  }
  void put(const Hash128& h) {
    put(h.low);
    put(h.high);
  }
  void put(const std::vector<int64_t>& v) {
    put(static_cast<uint64_t>(v.size()));
    put(v.data(), v.size() * sizeof(int64_t));
  }
  Hash128 hash() const { return xxh3_128(reinterpret_cast<const uint8_t*>(bytes_.data()), bytes_.size()); }

 private:
  std::string bytes_;
};

int64_t nanoseconds(const struct timespec& t) { return static_cast<int64_t>(t.tv_sec) * 1'000'000'000 + t.tv_nsec; }

// Writes `pieces`, one after another, to `path` whole or not at all: a temporary beside it,
// renamed over it. Concurrent runs writing one entry write the same bytes, so whichever rename
// lands last is as good.
bool publish(const fs::path& path, std::initializer_list<std::string_view> pieces) {
  std::error_code ec;
  fs::create_directories(path.parent_path(), ec);
  static std::mt19937_64 random(std::random_device{}());
  const fs::path temporary = path.parent_path() / (".tmp-" + std::to_string(::getpid()) + "-" + std::to_string(random()));
  {
    std::ofstream out(temporary, std::ios::binary);
    for (const std::string_view piece : pieces) out.write(piece.data(), static_cast<std::streamsize>(piece.size()));
    if (!out.flush()) {
      fs::remove(temporary, ec);
      return false;
    }
  }
  fs::rename(temporary, path, ec);
  if (ec) fs::remove(temporary, ec);
  return !ec;
}

struct Damaged {
  std::string why;
};

// Signing (docs/ci.md, "Who can change what a cache makes"): with a key in CTXGEN_CACHE_KEY,
// every entry ends with kSignatureMagic and the HMAC-SHA256 of all bytes before it under the key,
// and remembered hashes end with its first 16 bytes instead of their XXH3-128; what is not so
// signed is damaged. The key comes from the environment alone and is never shown.
constexpr const char* kKeyVariable = "CTXGEN_CACHE_KEY";
constexpr char kSignatureMagic[8] = {'C', 'T', 'X', 'G', 'S', 'I', 'G', '1'};
constexpr size_t kSignature = 8 + SHA256_DIGEST_SIZE;

std::optional<std::string> signing_key() {
  const char* key = std::getenv(kKeyVariable);
  if (key == nullptr || *key == '\0') return std::nullopt;
  if (std::strlen(key) < 16)
    throw Error(ErrorCode::kUsage, std::string(kKeyVariable) + " holds " + std::to_string(std::strlen(key)) +
                                       " bytes: a key to sign compile cache entries with has at least 16");
  return std::string(key);
}

std::array<uint8_t, SHA256_DIGEST_SIZE> hmac(const std::string& key, std::initializer_list<std::string_view> pieces) {
  hmac_sha256_ctx ctx;
  hmac_sha256_set_key(&ctx, key.size(), reinterpret_cast<const uint8_t*>(key.data()));
  for (const std::string_view piece : pieces) hmac_sha256_update(&ctx, piece.size(), reinterpret_cast<const uint8_t*>(piece.data()));
  std::array<uint8_t, SHA256_DIGEST_SIZE> digest{};
  hmac_sha256_digest(&ctx, digest.size(), digest.data());
  return digest;
}

// Compares in time independent of where they differ, as signatures are compared.
bool same_bytes(const uint8_t* a, const uint8_t* b, size_t size) {
  uint8_t differ = 0;
  for (size_t i = 0; i < size; ++i) differ |= static_cast<uint8_t>(a[i] ^ b[i]);
  return differ == 0;
}

// The bytes of the file at `path` when it is a regular file (not a link, a FIFO or a device) of at
// most `max_bytes`; else nothing. Opened without waiting or following.
constexpr uint64_t kMaxMemo = uint64_t{1} << 28;
std::string read_memo(const fs::path& path, uint64_t max_bytes) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return {};
  std::string bytes;
  struct stat st {};
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && static_cast<uint64_t>(st.st_size) <= max_bytes) {
    bytes.resize(static_cast<size_t>(st.st_size));
    size_t done = 0;
    while (done < bytes.size()) {
      const ssize_t n = ::read(fd, bytes.data() + done, bytes.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      done += static_cast<size_t>(n);
    }
    bytes.resize(done);
  }
  ::close(fd);
  return bytes;
}

struct HashOrder {
  bool operator()(const std::pair<Hash128, uint64_t>& a, const std::pair<Hash128, uint64_t>& b) const {
    return std::tie(a.first.high, a.first.low, a.second) < std::tie(b.first.high, b.first.low, b.second);
  }
};

// A source file of weights: its identity, and the hashes of its byte ranges known so far.
struct KnownFile {
  std::string identity;  // empty: not remembered (changed too recently)
  const uint8_t* begin = nullptr;
  size_t size = 0;
  std::map<std::pair<uint64_t, uint64_t>, Hash128> hashes;  // (offset, size) -> hash
  bool changed = false;
};

// How a cached weight is made again: one of the partition's constants (by content), bytes the
// entry holds, or a transform of another such weight whose result the entry holds.
struct BlobRecipe {
  enum class Kind { kConstant, kBytes, kMade } kind = Kind::kBytes;
  uint64_t size = 0;
  Hash128 hash;            // of the bytes (kConstant, kBytes, kMade: of the made bytes)
  uint64_t offset = 0;     // kBytes, kMade: where the entry holds them
  std::string transform;   // kMade
  std::unique_ptr<BlobRecipe> source;  // kMade
};

nlohmann::json recipe_json(const BlobRecipe& r) {
  static const char* const kKinds[] = {"constant", "bytes", "made"};
  nlohmann::json j = {{"kind", kKinds[static_cast<int>(r.kind)]}, {"size", r.size}, {"hash", r.hash.hex()}, {"offset", r.offset}};
  if (r.kind == BlobRecipe::Kind::kMade) {
    j["transform"] = r.transform;
    j["source"] = recipe_json(*r.source);
  }
  return j;
}

Hash128 parse_hash(const std::string& hex) {
  if (hex.size() != 32 || hex.find_first_not_of("0123456789abcdef") != std::string::npos) throw Damaged{"a hash is not 32 hex digits"};
  return {std::stoull(hex.substr(16), nullptr, 16), std::stoull(hex.substr(0, 16), nullptr, 16)};
}

BlobRecipe recipe_from(const nlohmann::json& j, uint64_t held, int depth = 0) {
  if (depth > 8) throw Damaged{"weights nest too deep"};
  BlobRecipe r;
  const std::string kind = j.at("kind");
  r.kind = kind == "constant" ? BlobRecipe::Kind::kConstant : kind == "bytes" ? BlobRecipe::Kind::kBytes : BlobRecipe::Kind::kMade;
  if (kind != "constant" && kind != "bytes" && kind != "made") throw Damaged{"a weight of kind '" + kind + "'"};
  r.size = j.at("size");
  r.hash = parse_hash(j.at("hash"));
  r.offset = j.at("offset");
  if (r.kind != BlobRecipe::Kind::kConstant && (r.offset > held || r.size > held - r.offset))
    throw Damaged{"a weight reaches past the entry's end"};
  if (r.kind == BlobRecipe::Kind::kMade) {
    r.transform = j.at("transform");
    r.source = std::make_unique<BlobRecipe>(recipe_from(j.at("source"), held, depth + 1));
  }
  return r;
}

}  // namespace

struct CompileCache::Impl {
  fs::path folder;
  const Backend& backend;
  bool weightless;
  std::shared_ptr<RemoteCache> remote;  // null once it failed
  const std::optional<std::string> signing = signing_key();  // CTXGEN_CACHE_KEY
  bool cache_only = false;
  int64_t started = 0;
  CacheStats stats;
  std::vector<KnownFile> files;
  std::unordered_set<const MappedFile*> added;  // the mappings add_file took

  Impl(const fs::path& f, const Backend& b, bool w, std::shared_ptr<RemoteCache> r)
      : folder(f), backend(b), weightless(w), remote(std::move(r)) {
    struct timespec now {};
    clock_gettime(CLOCK_REALTIME, &now);
    started = nanoseconds(now);
  }

  fs::path hashes_path(const std::string& identity) const {
    const Hash128 h = xxh3_128(reinterpret_cast<const uint8_t*>(identity.data()), identity.size());
    return folder / "hashes" / h.hex();
  }
  fs::path entry_path(const Hash128& key) const { return cache_entry_path(folder, key.hex()); }

  // An exchange with the remote cache; on failure, a warning, and the remote is not asked again
  // in this run (a server that is down would otherwise cost its timeout on every partition).
  template <class Exchange>
  bool with_remote(const Exchange& exchange) {
    if (!remote) return false;
    try {
      return exchange(*remote);
    } catch (const Error& e) {
      ++stats.remote_errors;
      log().warn("--remote-cache {}: {}; compiling locally, and not asking it again in this run", remote->where(), e.what());
      remote.reset();
      return false;
    }
  }
  // The entry at `path` from the remote cache, when the folder lacks it; whether it came from there.
  bool fetch(const fs::path& path) {
    std::error_code ec;
    if (!remote || fs::exists(fs::symlink_status(path, ec))) return false;
    fs::create_directories(path.parent_path(), ec);
    const fs::path temporary = path.parent_path() / (".fetch-" + std::to_string(::getpid()) + "-" + path.filename().string());
    bool fetched = with_remote([&](RemoteCache& r) {
      return r.get("entries/" + path.filename().string(), temporary, std::string(kEntryMagic, 8), kMaxEntryBytes);
    });
    if (fetched) fs::rename(temporary, path, ec);
    fs::remove(temporary, ec);
    return fetched && !ec;
  }

  // What closes a memo of remembered hashes: its XXH3-128, or signed, the HMAC's first 16 bytes.
  std::array<uint8_t, 16> memo_sum(std::string_view bytes) const {
    std::array<uint8_t, 16> sum{};
    if (signing) {
      const auto digest = hmac(*signing, {bytes});
      std::memcpy(sum.data(), digest.data(), sum.size());
    } else {
      const Hash128 h = xxh3_128(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
      std::memcpy(sum.data(), &h.low, 8);
      std::memcpy(sum.data() + 8, &h.high, 8);
    }
    return sum;
  }

  void load_hashes(KnownFile& file) const {
    // magic, the identity's length and text, records of (offset, size, low, high), a hash of all before it.
    const size_t record = 4 * sizeof(uint64_t);
    const std::string bytes = read_memo(hashes_path(file.identity), kMaxMemo);
    if (bytes.size() < sizeof kHashesMagic + sizeof(uint64_t) + 16 || std::memcmp(bytes.data(), kHashesMagic, 8) != 0) return;
    const auto* data = reinterpret_cast<const uint8_t*>(bytes.data());
    uint64_t identity_size = 0;
    std::memcpy(&identity_size, data + 8, 8);
    if (!same_bytes(memo_sum(std::string_view(bytes).substr(0, bytes.size() - 16)).data(), data + bytes.size() - 16, 16) ||
        identity_size != file.identity.size() || 16 + identity_size + 16 > bytes.size() ||
        bytes.compare(16, identity_size, file.identity) != 0 || (bytes.size() - 32 - identity_size) % record != 0)
      return;  // another file's, or damaged: hashed again
    for (size_t at = 16 + identity_size; at + 16 < bytes.size(); at += record) {
      uint64_t v[4];
      std::memcpy(v, data + at, record);
      file.hashes[{v[0], v[1]}] = Hash128{v[2], v[3]};
    }
  }

  void save_hashes(const KnownFile& file) const {
    std::string bytes(kHashesMagic, 8);
    const uint64_t identity_size = file.identity.size();
    bytes.append(reinterpret_cast<const char*>(&identity_size), 8);
    bytes += file.identity;
    for (const auto& [range, hash] : file.hashes) {
      const uint64_t v[4] = {range.first, range.second, hash.low, hash.high};
      bytes.append(reinterpret_cast<const char*>(v), sizeof v);
    }
    const std::array<uint8_t, 16> sum = memo_sum(bytes);
    bytes.append(reinterpret_cast<const char*>(sum.data()), sum.size());
    if (!publish(hashes_path(file.identity), {bytes}))
      log().warn("--cache: cannot write {}: the weights' hashes are not remembered", hashes_path(file.identity).string());
  }

  void add_file(const std::shared_ptr<const MappedFile>& mapped) {
    if (!mapped || !added.insert(mapped.get()).second) return;
    KnownFile file;
    file.begin = mapped->data();
    file.size = mapped->size();
    struct stat st {};
    if (::stat(mapped->path().c_str(), &st) == 0 && static_cast<uint64_t>(st.st_size) == mapped->size() &&
        started - nanoseconds(st.st_mtim) > kSettledNanoseconds && started - nanoseconds(st.st_ctim) > kSettledNanoseconds) {
      file.identity = std::to_string(st.st_dev) + ":" + std::to_string(st.st_ino) + ":" + std::to_string(st.st_size) + ":" +
                      std::to_string(nanoseconds(st.st_mtim)) + ":" + std::to_string(nanoseconds(st.st_ctim));
      load_hashes(file);
    }
    files.push_back(std::move(file));
  }

  Hash128 hash(const uint8_t* data, size_t size) {
    for (KnownFile& file : files) {
      if (data < file.begin || data + size > file.begin + file.size || file.identity.empty()) continue;
      const std::pair<uint64_t, uint64_t> range{static_cast<uint64_t>(data - file.begin), size};
      if (auto it = file.hashes.find(range); it != file.hashes.end()) return it->second;
      const Hash128 h = xxh3_128(data, size);
      file.hashes[range] = h;
      file.changed = true;
      return h;
    }
    return xxh3_128(data, size);
  }

  Hash128 content_hash(const Blob& blob) {
    const PinnedBytes bytes = blob.pin();
    const Hash128 h = hash(bytes.data, bytes.size);
    blob.release();
    return h;
  }

  // The partition's constants by (content hash, size): a cached entry takes its weights from them.
  using ByContent = std::map<std::pair<Hash128, uint64_t>, Blob, HashOrder>;
  // Everything backend.compile() reads of the model for this partition, hashed.
  Hash128 key(const Model& model, const Partition& partition, ByContent& by_content);

  // A weight an entry holds as a transform made it, and what makes it again when it is damaged.
  struct MadeWeight {
    fs::path entry;
    const Model* model;
    const Partition* partition;
    const uint8_t* at;
    uint64_t size;
    Hash128 hash;
    std::string transform;
    Hash128 source_hash;
    bool damaged = false;  // found so once: its bytes are made by compiling anew from then on
  };
  MadeBytes made_bytes(MadeWeight& w);
  std::optional<CompiledGraph> replay(const fs::path& path, const Hash128& key, const Model& model, const Partition& partition,
                                      const std::string& graph_name, WeightStore& store, const ByContent& by_content);
  BlobRecipe recipe(const Blob& blob, const std::optional<Hash128>& known, const ByContent& by_content, std::string& held);
  // Writes the entry; false when it was not written.
  bool store_entry(const fs::path& path, const Hash128& key, const CompiledGraph& graph, const WeightStore& store,
                   const ByContent& by_content);
};

Hash128 CompileCache::Impl::key(const Model& model, const Partition& partition, ByContent& by_content) {
  KeyBytes k;
  k.put(std::string("ctxgen compile cache 2, ctxgen ") + CTXGEN_VERSION);
  const BinaryIdentity id = backend.identity();
  for (const std::string& s : {id.backend, id.sdk_version, id.hardware_architecture}) k.put(s);
  k.put(uint64_t{id.format_version});
  k.put(uint64_t{weightless});
  std::vector<std::pair<std::string, int64_t>> opsets;
  for (const auto& o : model.proto->opset_import()) opsets.emplace_back(o.domain(), o.version());
  std::sort(opsets.begin(), opsets.end());
  k.put(static_cast<uint64_t>(opsets.size()));
  for (const auto& [domain, version] : opsets) {
    k.put(domain);
    k.put(static_cast<uint64_t>(version));
  }
  k.put(static_cast<uint64_t>(model.proto->ir_version()));
  std::vector<std::string> names;
  const auto put_names = [&](const std::vector<std::string>& list) {
    k.put(static_cast<uint64_t>(list.size()));
    for (const auto& n : list) {
      k.put(n);
      names.push_back(n);
    }
  };
  put_names(partition.inputs);
  put_names(partition.outputs);
  k.put(static_cast<uint64_t>(partition.nodes.size()));
  for (size_t index : partition.nodes) {
    onnx::NodeProto node = model.graph().node(static_cast<int>(index));
    node.clear_doc_string();
    k.put(deterministic_bytes(node));
    names.insert(names.end(), node.input().begin(), node.input().end());
    names.insert(names.end(), node.output().begin(), node.output().end());
  }
  std::sort(names.begin(), names.end());
  names.erase(std::unique(names.begin(), names.end()), names.end());
  for (const std::string& name : names) {
    k.put(name);
    const ValueType* type = model.type_of(name);
    k.put(uint64_t{type != nullptr});
    if (type != nullptr) {
      k.put(static_cast<uint64_t>(type->elem_type));
      k.put(uint64_t{type->dims.has_value()});
      if (type->dims) k.put(*type->dims);
      k.put(static_cast<uint64_t>(type->dim_names.size()));
      for (const auto& d : type->dim_names) k.put(d);
    }
    const Weight* w = model.constant(name);
    k.put(uint64_t{w != nullptr});
    if (w == nullptr) continue;
    const Blob blob = w->data.blob();
    const Hash128 h = content_hash(blob);
    k.put(static_cast<uint64_t>(w->data.dtype));
    k.put(w->data.dims);
    k.put(uint64_t{w->external});
    k.put(h);
    by_content.emplace(std::make_pair(h, static_cast<uint64_t>(blob.size)), blob);
  }
  return k.hash();
}

namespace {

// An entry file: magic, the size of its description, the description's hash, the description
// (JSON: the graph's signature, its program's size and hash, its weights' recipes), then the bytes
// it holds (the program, then weights). Weights the transforms made are checked as they are read.
struct EntryFile {
  nlohmann::json description;
  const uint8_t* held = nullptr;
  uint64_t held_size = 0;
  std::shared_ptr<const MappedFile> mapping;
};

constexpr size_t kEntryHeader = 8 + 8 + 16;

EntryFile read_entry(const fs::path& path, const std::optional<std::string>& key) {
  EntryFile e;
  e.mapping = MappedFile::open(path);
  const uint8_t* data = e.mapping->data();
  size_t size = e.mapping->size();
  if (size < kEntryHeader || std::memcmp(data, kEntryMagic, 8) != 0) throw Damaged{"not a ctxgen cache entry"};
  if (key) {
    if (size < kEntryHeader + kSignature || std::memcmp(data + size - kSignature, kSignatureMagic, 8) != 0)
      throw Damaged{std::string("it is not signed, and ") + kKeyVariable + " asks for signed entries"};
    size -= kSignature;
    const auto want = hmac(*key, {std::string_view(reinterpret_cast<const char*>(data), size)});
    if (!same_bytes(want.data(), data + size + 8, want.size())) throw Damaged{std::string("it is not signed with ") + kKeyVariable};
  }
  uint64_t described = 0;
  Hash128 want;
  std::memcpy(&described, data + 8, 8);
  std::memcpy(&want.low, data + 16, 8);
  std::memcpy(&want.high, data + 24, 8);
  if (described > size - kEntryHeader) throw Damaged{"its description reaches past its end"};
  if (!(xxh3_128(data + kEntryHeader, described) == want)) throw Damaged{"its description does not hash to what it records"};
  e.description = nlohmann::json::parse(data + kEntryHeader, data + kEntryHeader + described, nullptr, false);
  if (e.description.is_discarded() || !e.description.is_object()) throw Damaged{"its description is not JSON"};
  e.held = data + kEntryHeader + described;
  e.held_size = size - kEntryHeader - described;
  return e;
}

void check_hash(const uint8_t* data, uint64_t size, const Hash128& want, const std::string& what) {
  if (!(xxh3_128(data, size) == want)) throw Damaged{what + " does not hash to what the entry records"};
}

}  // namespace

// The bytes of a made weight, which the cache reads when the store or the binary's writer needs
// them: checked then, and when damaged made again by compiling the partition anew.
MadeBytes CompileCache::Impl::made_bytes(MadeWeight& w) {
  if (!w.damaged && xxh3_128(w.at, w.size) == w.hash) {
    MadeBytes bytes(w.size);
    std::memcpy(bytes.data(), w.at, w.size);
    return bytes;
  }
  if (!w.damaged) {
    w.damaged = true;
    std::error_code ignored;
    fs::remove(w.entry, ignored);
    log().warn("--cache: {} is damaged (a weight does not hash to what it records): removed, and its partition compiled "
               "anew to make the weight", w.entry.string());
    ++stats.damaged;
  }
  WeightStore scratch;
  backend.compile(*w.model, *w.partition, "recompiled", scratch);
  for (size_t id = 0; id < scratch.size(); ++id) {
    const Blob& blob = scratch.entry(static_cast<uint32_t>(id)).blob;
    if (!blob.source || blob.transform != w.transform || blob.size != w.size) continue;
    const PinnedBytes source = blob.source->pin();
    if (!(xxh3_128(source.data, source.size) == w.source_hash)) continue;
    PinnedBytes made = blob.pin();
    if (!made.made.empty()) return std::move(made.made);
    return MadeBytes(made.data, made.data + made.size);
  }
  throw Error(ErrorCode::kInternal, "--cache: compiling " + w.entry.string() + "'s partition anew did not make the weight '" +
                                        w.transform + "' it records");
}

std::optional<CompiledGraph> CompileCache::Impl::replay(const fs::path& path, const Hash128& key, const Model& model,
                                                        const Partition& partition, const std::string& graph_name,
                                                        WeightStore& store, const ByContent& by_content) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return std::nullopt;
  try {
    const EntryFile e = read_entry(path, signing);
    const nlohmann::json& d = e.description;
    // Its hashes only say the entry is whole; what binds it to this partition is the key it
    // records and a signature that is the partition's.
    if (d.at("key") != key.hex()) throw Damaged{"it is the entry of key " + d.at("key").get<std::string>() + ", not of its own name"};
    CompiledGraph graph;
    graph.name = graph_name;
    for (const auto& [list, out, names] : {std::tuple{"inputs", &graph.inputs, &partition.inputs},
                                           std::tuple{"outputs", &graph.outputs, &partition.outputs}}) {
      for (const auto& io : d.at(list)) out->push_back({io.at("name"), io.at("elem_type"), io.at("dims").get<std::vector<int64_t>>()});
      if (out->size() != names->size()) throw Damaged{std::string("its ") + list + " are not the partition's"};
      for (size_t i = 0; i < out->size(); ++i) {
        const IoSignature& io = (*out)[i];
        const ValueType* type = model.type_of(io.name);
        if (io.name != (*names)[i] || (type != nullptr && type->is_static() && (io.elem_type != type->elem_type || io.dims != *type->dims)))
          throw Damaged{std::string("its ") + list + " are not the partition's ('" + io.name + "')"};
      }
    }
    graph.node_count = d.at("node_count");
    if (graph.node_count != partition.nodes.size()) throw Damaged{"it records another number of nodes than the partition's"};
    const uint64_t program_size = d.at("program_size");
    if (program_size > e.held_size) throw Damaged{"its program reaches past its end"};
    check_hash(e.held, program_size, parse_hash(d.at("program_hash")), "its program");
    const std::vector<uint8_t> program(e.held, e.held + program_size);
    std::optional<std::vector<uint64_t>> reads;
    try {
      reads = backend.weight_reads(program, d.at("weights").size());
    } catch (const Error& rejected) {
      throw Damaged{std::string("its program is not one the backend runs: ") + rejected.what()};
    }
    if (!reads) throw Error(ErrorCode::kInternal, "--cache: backend '" + backend.name() + "' cannot renumber a cached program");
    // Every weight made ready (and what can be checked now, checked) before the store takes any:
    // an entry found damaged halfway must leave the store as it was.
    std::function<Blob(const BlobRecipe&)> blob_of = [&](const BlobRecipe& r) -> Blob {
      switch (r.kind) {
        case BlobRecipe::Kind::kConstant: {
          auto it = by_content.find(std::make_pair(r.hash, r.size));
          if (it == by_content.end()) throw Damaged{"a weight is none of the partition's constants"};
          return it->second;
        }
        case BlobRecipe::Kind::kBytes:
          check_hash(e.held + r.offset, r.size, r.hash, "a weight");
          return Blob{e.held + r.offset, r.size, e.mapping, nullptr, 0, {}, {}, {}};
        case BlobRecipe::Kind::kMade: {
          auto w = std::make_shared<MadeWeight>(MadeWeight{path, &model, &partition, e.held + r.offset, r.size, r.hash,
                                                           r.transform, r.source->hash, false});
          return Blob::made(r.size, blob_of(*r.source), r.transform, [this, w, mapping = e.mapping] { return made_bytes(*w); });
        }
      }
      throw Damaged{"a weight of no kind"};
    };
    std::vector<std::pair<Blob, uint64_t>> weights;
    for (const auto& w : d.at("weights")) weights.emplace_back(blob_of(recipe_from(w.at("blob"), e.held_size)), w.at("interned"));
    // The cold run interned each weight once for each of the program's values that reads it.
    for (size_t i = 0; i < weights.size(); ++i)
      if (weights[i].second != (*reads)[i])
        throw Damaged{"weight " + std::to_string(i) + " is recorded as interned " + std::to_string(weights[i].second) +
                      " times, where its program reads it " + std::to_string((*reads)[i]) + " times"};
    std::vector<uint32_t> ids;
    for (const auto& [blob, interned] : weights) {
      uint32_t id = 0;
      // As often as the cold run interned it, so the store counts what it counted.
      for (uint64_t i = 0; i < std::max<uint64_t>(interned, 1); ++i) id = store.intern(blob);
      ids.push_back(id);
    }
    auto renumbered = backend.renumber_weights(program, [&](uint32_t local) { return ids[local]; });
    graph.program = std::move(*renumbered);
    graph.weight_ids = ids;
    std::sort(graph.weight_ids.begin(), graph.weight_ids.end());
    graph.weight_ids.erase(std::unique(graph.weight_ids.begin(), graph.weight_ids.end()), graph.weight_ids.end());
    stats.bytes_read += e.mapping->size();
    return graph;
  } catch (const Damaged& damaged) {
    log().warn("--cache: {} is damaged ({}): removed, and its partition compiled anew", path.string(), damaged.why);
  } catch (const nlohmann::json::exception& error) {
    log().warn("--cache: {} is damaged ({}): removed, and its partition compiled anew", path.string(), error.what());
  } catch (const Error& error) {
    if (error.code() != ErrorCode::kInvalidModel) throw;  // MappedFile::open: unreadable
    log().warn("--cache: {} cannot be read ({}): its partition is compiled anew", path.string(), error.what());
  }
  ++stats.damaged;
  fs::remove(path, ec);
  return std::nullopt;
}

namespace {

// Appends `bytes` to the entry's held bytes; returns where they start.
uint64_t hold(std::string& held, const uint8_t* data, size_t size) {
  const uint64_t at = held.size();
  held.append(reinterpret_cast<const char*>(data), size);
  return at;
}

}  // namespace

BlobRecipe CompileCache::Impl::recipe(const Blob& blob, const std::optional<Hash128>& known, const ByContent& by_content,
                                      std::string& held) {
  BlobRecipe r;
  r.size = blob.size;
  if (blob.source) {
    r.kind = BlobRecipe::Kind::kMade;
    r.transform = blob.transform;
    r.source = std::make_unique<BlobRecipe>(recipe(*blob.source, std::nullopt, by_content, held));
    const PinnedBytes made = blob.pin();
    r.hash = xxh3_128(made.data, made.size);
    r.offset = hold(held, made.data, made.size);
    return r;
  }
  r.hash = known ? *known : content_hash(blob);
  if (by_content.count(std::make_pair(r.hash, r.size))) {
    r.kind = BlobRecipe::Kind::kConstant;
    return r;
  }
  r.kind = BlobRecipe::Kind::kBytes;
  const PinnedBytes bytes = blob.pin();
  r.offset = hold(held, bytes.data, bytes.size);
  blob.release();
  return r;
}

bool CompileCache::Impl::store_entry(const fs::path& path, const Hash128& key, const CompiledGraph& graph,
                                     const WeightStore& store, const ByContent& by_content) {
  // The program numbered by its own weights: the i-th of graph.weight_ids is weight i.
  std::map<uint32_t, uint32_t> local;
  for (uint32_t id : graph.weight_ids) local.emplace(id, static_cast<uint32_t>(local.size()));
  std::map<uint32_t, uint64_t> interned;
  auto program = backend.renumber_weights(graph.program, [&](uint32_t id) {
    ++interned[id];
    return local.at(id);
  });
  if (!program) return false;  // a backend whose programs cannot be renumbered is never cached
  std::string held(reinterpret_cast<const char*>(program->data()), program->size());
  nlohmann::json weights = nlohmann::json::array();
  for (uint32_t id : graph.weight_ids) {
    const WeightStore::Entry& entry = store.entry(id);
    weights.push_back({{"blob", recipe_json(recipe(entry.blob, entry.hash, by_content, held))}, {"interned", interned[id]}});
  }
  nlohmann::json ios[2];
  for (int side = 0; side < 2; ++side)
    for (const IoSignature& io : side == 0 ? graph.inputs : graph.outputs)
      ios[side].push_back({{"name", io.name}, {"elem_type", io.elem_type}, {"dims", io.dims}});
  const nlohmann::json description = {
      {"key", key.hex()},
      {"inputs", ios[0].is_null() ? nlohmann::json::array() : ios[0]},
      {"outputs", ios[1].is_null() ? nlohmann::json::array() : ios[1]},
      {"node_count", graph.node_count},
      {"program_size", program->size()},
      {"program_hash", xxh3_128(program->data(), program->size()).hex()},
      {"weights", weights}};
  const std::string text = description.dump();
  const Hash128 text_hash = xxh3_128(reinterpret_cast<const uint8_t*>(text.data()), text.size());
  std::string header(kEntryMagic, 8);
  const uint64_t described = text.size();
  header.append(reinterpret_cast<const char*>(&described), 8);
  header.append(reinterpret_cast<const char*>(&text_hash.low), 8);
  header.append(reinterpret_cast<const char*>(&text_hash.high), 8);
  std::string signature;
  if (signing) {
    const auto digest = hmac(*signing, {header, text, held});
    signature.assign(kSignatureMagic, 8);
    signature.append(reinterpret_cast<const char*>(digest.data()), digest.size());
  }
  if (!publish(path, {header, text, held, signature})) {
    log().warn("--cache: cannot write {}: this partition is not cached", path.string());
    return false;
  }
  stats.bytes_written += header.size() + text.size() + held.size() + signature.size();
  return true;
}

Hash128 CompileCache::hash(const uint8_t* data, size_t size) { return impl_->hash(data, size); }

void CompileCache::add_files(const Model& model) {
  for (const Weight& w : model.weights) impl_->add_file(w.data.file);
}

CompiledGraph CompileCache::compile(const Model& model, const Partition& partition, const std::string& graph_name,
                                    WeightStore& store) {
  Impl& c = *impl_;
  Impl::ByContent by_content;
  const Hash128 key = c.key(model, partition, by_content);
  const fs::path path = c.entry_path(key);
  const bool fetched = c.fetch(path);
  c.stats.keys.push_back(key.hex());
  if (auto graph = c.replay(path, key, model, partition, graph_name, store, by_content)) {
    ++c.stats.hits;
    c.stats.remote_hits += fetched;
    std::error_code ignored;
    fs::last_write_time(path, fs::file_time_type::clock::now(), ignored);  // used: the last to go when pruned
    return std::move(*graph);
  }
  if (c.cache_only)
    throw Error(ErrorCode::kInvalidBinary, "link: no compile result for partition '" + graph_name + "' of " +
                                               model.path.filename().string() + " in its object (key " + key.hex() +
                                               "): compile the object again with this ctxgen");
  ++c.stats.misses;
  CompiledGraph graph = c.backend.compile(model, partition, graph_name, store);
  if (c.store_entry(path, key, graph, store, by_content) && c.remote && c.remote->writable() &&
      c.with_remote([&](RemoteCache& r) {
        r.put("entries/" + path.filename().string(), path);
        return true;
      }))
    ++c.stats.remote_stores;
  return graph;
}

void CompileCache::cache_only() { impl_->cache_only = true; }

void CompileCache::save() {
  // One file may be mapped twice (two models sharing an external data file): what each learnt, together.
  std::map<std::string, KnownFile> by_identity;
  for (const KnownFile& file : impl_->files) {
    if (file.identity.empty()) continue;
    KnownFile& merged = by_identity[file.identity];
    merged.identity = file.identity;
    merged.hashes.insert(file.hashes.begin(), file.hashes.end());
    merged.changed = merged.changed || file.changed;
  }
  for (const auto& [identity, file] : by_identity)
    if (file.changed) impl_->save_hashes(file);
}

const CacheStats& CompileCache::stats() const { return impl_->stats; }

namespace {

constexpr const char* kMarkName = "CACHEDIR.TAG";
// The Cache Directory Tagging convention's signature (backup tools skip such folders), then ctxgen's line.
constexpr const char* kMark =
    "Signature: 8a477f597d28d172789f06886806bc55\n"
    "# This folder is a ctxgen compile cache: ctxgen made it and prunes and clears only what it wrote here.\n";

bool is_marked(const fs::path& folder) {
  return read_memo(folder / kMarkName, std::strlen(kMark)) == kMark;
}

bool real_directory(const fs::path& path) {
  std::error_code ec;
  return fs::symlink_status(path, ec).type() == fs::file_type::directory;
}

bool hex_name(const std::string& name, size_t digits) {
  return name.size() == digits && name.find_first_not_of("0123456789abcdef") == std::string::npos;
}

// A temporary of a run (".tmp-PID-N", ".fetch-PID-KEY") whose process is gone: a killed run's.
bool abandoned(const std::string& name) {
  for (const std::string prefix : {".tmp-", ".fetch-"}) {
    if (name.rfind(prefix, 0) != 0) continue;
    const size_t dash = name.find('-', prefix.size());
    if (dash == std::string::npos) return false;
    pid_t pid = 0;
    const auto [end, parsed] = std::from_chars(name.data() + prefix.size(), name.data() + dash, pid);
    return parsed == std::errc() && end == name.data() + dash && pid > 0 && ::kill(pid, 0) != 0 && errno == ESRCH;
  }
  return false;
}

// The files of a marked cache that ctxgen wrote: entries (entries/XX/KEY), hash memos
// (hashes/ID) and the temporaries killed runs left, each a regular file, never through a link.
struct CacheFile {
  fs::path path;
  uint64_t size;
  fs::file_time_type used;
  enum class Kind { kEntry, kHashes, kLeftover } kind;
};

std::vector<CacheFile> cache_files(const fs::path& folder) {
  if (!is_marked(folder))
    throw Error(ErrorCode::kUsage, folder.string() + " is not a ctxgen compile cache (it has no " + kMarkName +
                                       " of ctxgen's), so ctxgen leaves it alone");
  std::vector<CacheFile> found;
  std::error_code ec;
  const auto add = [&](const fs::directory_entry& e, CacheFile::Kind kind) {
    if (e.symlink_status(ec).type() == fs::file_type::regular) found.push_back({e.path(), e.file_size(ec), e.last_write_time(ec), kind});
  };
  const auto each = [&](const fs::path& dir, const auto& visit) {
    if (!real_directory(dir)) return;
    for (const auto& e : fs::directory_iterator(dir, ec)) visit(e, e.path().filename().string());
  };
  each(folder / "entries", [&](const fs::directory_entry& sub, const std::string& prefix) {
    if (!hex_name(prefix, 2)) return;
    each(sub.path(), [&](const fs::directory_entry& e, const std::string& name) {
      if (hex_name(name, 32) && name.compare(0, 2, prefix) == 0) add(e, CacheFile::Kind::kEntry);
      else if (abandoned(name)) add(e, CacheFile::Kind::kLeftover);
    });
  });
  each(folder / "hashes", [&](const fs::directory_entry& e, const std::string& name) {
    if (hex_name(name, 32)) add(e, CacheFile::Kind::kHashes);
    else if (abandoned(name)) add(e, CacheFile::Kind::kLeftover);
  });
  return found;
}

}  // namespace

fs::path cache_entry_path(const fs::path& folder, const std::string& key) { return folder / "entries" / key.substr(0, 2) / key; }

namespace {

// Makes `folder` a cache, or checks that it is one: marked, or new, empty or an earlier ctxgen's
// cache, which it then marks.
void open_cache_folder(const fs::path& folder) {
  std::error_code ec;
  const auto refuse = [&](const std::string& why) { throw Error(ErrorCode::kUsage, "--cache " + folder.string() + ": " + why); };
  if (!fs::exists(fs::symlink_status(folder, ec))) {
    fs::create_directories(folder, ec);
    if (ec) refuse("cannot make the cache folder there (" + ec.message() + ")");
  }
  if (!fs::is_directory(folder, ec)) refuse("not a folder");
  if (!is_marked(folder)) {
    // A folder ctxgen may call its own: an empty one, or a cache of an earlier ctxgen (nothing but
    // its entries/ and hashes/ folders); or one another run is marking at this moment (its mark,
    // or the temporary that becomes it).
    bool ours = true;
    for (const auto& e : fs::directory_iterator(folder, ec)) {
      const std::string name = e.path().filename().string();
      ours = ours && (((name == "entries" || name == "hashes") && real_directory(e.path())) || name == kMarkName ||
                      name.rfind(".tmp-", 0) == 0);
    }
    if (ec) refuse("cannot read the folder (" + ec.message() + ")");
    if (!ours && !is_marked(folder))
      refuse("holds files that are not a ctxgen compile cache's (it has no " + std::string(kMarkName) +
             " of ctxgen's): give a new or empty folder, which ctxgen marks as its cache");
    if (!publish(folder / kMarkName, {kMark})) refuse("cannot write its mark " + std::string(kMarkName));
  }
  fs::create_directories(folder / "entries", ec);
  if (ec || !real_directory(folder / "entries"))
    refuse("cannot make the entries folder there" + (ec ? " (" + ec.message() + ")" : std::string()));
}

}  // namespace

CompileCache::CompileCache(const fs::path& folder, const Backend& backend, bool weightless, std::shared_ptr<RemoteCache> remote)
    : impl_(std::make_unique<Impl>(folder, backend, weightless, std::move(remote))) {
  open_cache_folder(folder);
  impl_->stats.used = true;
}

CompileCache::~CompileCache() = default;

CacheUsage cache_usage(const fs::path& folder) {
  CacheUsage usage;
  for (const CacheFile& f : cache_files(folder)) {
    if (f.kind == CacheFile::Kind::kEntry) {
      ++usage.entries;
      usage.entry_bytes += f.size;
    } else if (f.kind == CacheFile::Kind::kHashes) {
      ++usage.hash_files;
      usage.hash_bytes += f.size;
    }
  }
  return usage;
}

uint64_t prune_cache(const fs::path& folder, uint64_t max_bytes) {
  std::vector<CacheFile> files = cache_files(folder);
  std::error_code ec;
  uint64_t total = 0;
  for (const CacheFile& f : files)
    if (f.kind == CacheFile::Kind::kLeftover) fs::remove(f.path, ec);
    else total += f.size;
  std::sort(files.begin(), files.end(), [](const CacheFile& a, const CacheFile& b) { return a.used < b.used; });
  uint64_t removed = 0;
  for (const CacheFile& f : files) {
    if (total <= max_bytes) break;
    if (f.kind == CacheFile::Kind::kLeftover || !fs::remove(f.path, ec)) continue;
    total -= f.size;
    removed += f.kind == CacheFile::Kind::kEntry;
  }
  return removed;
}

void clear_cache(const fs::path& folder) {
  for (const CacheFile& f : cache_files(folder)) {
    std::error_code ec;
    fs::remove(f.path, ec);
    if (ec) throw Error(ErrorCode::kIo, "cannot remove " + f.path.string() + ": " + ec.message());
  }
}

}  // namespace ctxgen
