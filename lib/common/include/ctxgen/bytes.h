#pragma once
// Byte-level building blocks shared by every stage: mapped files, 128-bit content hashes, and
// blobs (bytes that are either a view of an input or owned).

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace ctxgen {

// Owns an open file descriptor and closes it.
class FileDescriptor {
 public:
  explicit FileDescriptor(int fd) : fd_(fd) {}
  ~FileDescriptor();
  FileDescriptor(FileDescriptor&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  FileDescriptor& operator=(FileDescriptor&& other) noexcept {
    std::swap(fd_, other.fd_);  // ours closes with `other`
    return *this;
  }
  int get() const { return fd_; }

 private:
  int fd_;
};

// A read-only mapping of a whole file. Views into it keep it alive through shared pointers.
class MappedFile {
 public:
  // Throws Error(kInvalidModel) naming the file when it cannot be opened or mapped.
  static std::shared_ptr<const MappedFile> open(const std::filesystem::path& path);
  // Maps the file open on `fd`, which the caller keeps; `path` names it. Throws as open() does.
  static std::shared_ptr<const MappedFile> map(int fd, const std::filesystem::path& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::filesystem::path& path() const { return path_; }
  // Drops [offset, offset + size) from this process's resident set (the page cache keeps it), so
  // reading a large model once does not keep it all resident.
  void release(size_t offset, size_t size) const;

 private:
  MappedFile() = default;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  std::filesystem::path path_;
};

struct Hash128 {
  uint64_t low = 0, high = 0;
  bool operator==(const Hash128&) const = default;
  std::string hex() const;  // 32 lowercase hex digits, high word first
};

using Hasher = std::function<Hash128(const uint8_t* data, size_t size)>;
Hash128 xxh3_128(const uint8_t* data, size_t size);

// Allocates without zeroing: a transform writes every byte it makes, and zeroing a weight of
// many megabytes first costs a third of transposing it.
template <class T>
struct UninitializedAllocator : std::allocator<T> {
  template <class U>
  struct rebind {
    using other = UninitializedAllocator<U>;
  };
  template <class U, class... Args>
  void construct(U* at, Args&&... args) {
    if constexpr (sizeof...(Args) == 0)
      ::new (static_cast<void*>(at)) U;
    else
      ::new (static_cast<void*>(at)) U(std::forward<Args>(args)...);
  }
};
using MadeBytes = std::vector<uint8_t, UninitializedAllocator<uint8_t>>;

// A blob's bytes, readable while this lives: its own, or what its `make` made.
struct PinnedBytes {
  const uint8_t* data = nullptr;
  size_t size = 0;
  MadeBytes made;
};

// Bytes that are either a view into something kept alive by `owner` (a mapped input, a parsed
// protobuf string), an owned buffer produced by a transform, or made on demand.
struct Blob {
  const uint8_t* data = nullptr;
  size_t size = 0;
  std::shared_ptr<const void> owner;
  std::shared_ptr<const MappedFile> file;  // set when `data` points into a mapped file
  size_t file_offset = 0;
  // Set instead of `data` for bytes a transform makes from other bytes (a weight packed for a
  // backend): made each time they are hashed, compared or written and dropped right after, so a
  // model's transformed weights are never all in memory at once, however large the model.
  std::function<MadeBytes()> make;
  // What `make` makes its bytes from, and how (a name for the transform): the same transform of
  // the same bytes makes the same bytes, so a store need not make them again to know them.
  std::shared_ptr<const Blob> source;
  std::string transform;

  static Blob owned(std::vector<uint8_t> bytes);
  // `make` reads `source` and returns `size` bytes.
  static Blob made(size_t size, Blob source, std::string transform, std::function<MadeBytes()> make);
  // The bytes, to read now. Throws Error(kInternal) when `make` makes another size than `size`.
  PinnedBytes pin() const;
  // Releases the pages behind a file-backed view after use (no-op otherwise).
  void release() const;
};

}  // namespace ctxgen
