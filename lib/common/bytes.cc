#include "ctxgen/bytes.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include <xxhash.h>

#include "ctxgen/error.h"

namespace ctxgen {

FileDescriptor::~FileDescriptor() {
  if (fd_ >= 0) ::close(fd_);
}

std::shared_ptr<const MappedFile> MappedFile::open(const std::filesystem::path& path) {
  // O_NONBLOCK: opening a FIFO must not wait for a writer; it is refused as not a regular file below.
  const FileDescriptor fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY));
  if (fd.get() < 0) throw Error(ErrorCode::kInvalidModel, path.string() + ": " + std::strerror(errno));
  return map(fd.get(), path);
}

std::shared_ptr<const MappedFile> MappedFile::map(int fd, const std::filesystem::path& path) {
  auto fail = [&](const std::string& what) -> Error {
    return Error(ErrorCode::kInvalidModel, path.string() + ": " + what);
  };
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    throw fail(std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) throw fail(S_ISDIR(st.st_mode) ? "is a directory, not a file" : "is not a regular file");
  std::shared_ptr<MappedFile> file(new MappedFile());
  file->path_ = path;
  file->size_ = static_cast<size_t>(st.st_size);
  if (file->size_ > 0) {
    void* p = ::mmap(nullptr, file->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      throw fail(std::string("cannot map: ") + std::strerror(err));
    }
    file->data_ = static_cast<const uint8_t*>(p);
  }
  return file;
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
}

void MappedFile::release(size_t offset, size_t size) const {
  static const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  if (data_ == nullptr || offset >= size_) return;
  size = std::min(size, size_ - offset);
  // Only whole pages inside the range: a neighbour's bytes may still be in use.
  size_t begin = (offset + page - 1) / page * page;
  size_t end = (offset + size) / page * page;
  if (offset + size == size_) end = (size_ + page - 1) / page * page;
  if (end > begin) ::madvise(const_cast<uint8_t*>(data_) + begin, end - begin, MADV_DONTNEED);
}

std::string Hash128::hex() const {
  char buf[33];
  std::snprintf(buf, sizeof buf, "%016llx%016llx", static_cast<unsigned long long>(high),
                static_cast<unsigned long long>(low));
  return buf;
}

Hash128 xxh3_128(const uint8_t* data, size_t size) {
  XXH128_hash_t h = XXH3_128bits(data, size);
  return Hash128{h.low64, h.high64};
}

Blob Blob::owned(std::vector<uint8_t> bytes) {
  auto buffer = std::make_shared<std::vector<uint8_t>>(std::move(bytes));
  return Blob{buffer->data(), buffer->size(), buffer, nullptr, 0, {}, {}, {}};
}

Blob Blob::made(size_t size, Blob source, std::string transform, std::function<MadeBytes()> make) {
  Blob blob;
  blob.size = size;
  blob.make = std::move(make);
  blob.source = std::make_shared<const Blob>(std::move(source));
  blob.transform = std::move(transform);
  return blob;
}

PinnedBytes Blob::pin() const {
  if (!make) return {data, size, {}};
  PinnedBytes pinned;
  pinned.made = make();
  if (pinned.made.size() != size)
    throw Error(ErrorCode::kInternal, "a transform made " + std::to_string(pinned.made.size()) + " bytes of a " +
                                          std::to_string(size) + "-byte weight");
  pinned.data = pinned.made.data();
  pinned.size = size;
  return pinned;
}

void Blob::release() const {
  if (file) file->release(file_offset, size);
}

}  // namespace ctxgen
