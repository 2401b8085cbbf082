#include "ctxgen/library.h"

#include <elf.h>

#include <cstring>
#include <fstream>
#include <vector>

namespace ctxgen {
namespace {

#if defined(__x86_64__)
constexpr uint16_t kMachine = EM_X86_64;
#elif defined(__aarch64__)
constexpr uint16_t kMachine = EM_AARCH64;
#else
#error "ctxgen knows no ELF machine for this architecture"
#endif

// [offset, offset + size) within a file of `file_size` bytes, without overflowing.
bool within(uint64_t offset, uint64_t size, uint64_t file_size) { return offset <= file_size && size <= file_size - offset; }

}  // namespace

std::filesystem::path checked_library(const std::filesystem::path& path, const std::string& what, ErrorCode code) {
  namespace fs = std::filesystem;
  const auto fail = [&](const std::string& why) { throw Error(code, what + " " + path.string() + ": " + why); };
  std::error_code ec;
  const fs::path absolute = fs::absolute(path, ec);
  if (ec || !fs::exists(absolute, ec)) fail("no such file");
  if (!fs::is_regular_file(absolute, ec)) fail("not a regular file (a shared library is one)");
  const uint64_t size = fs::file_size(absolute, ec);
  if (ec) fail("cannot read its size: " + ec.message());
  std::ifstream in(absolute, std::ios::binary);
  Elf64_Ehdr header{};
  if (!in.read(reinterpret_cast<char*>(&header), sizeof header) || std::memcmp(header.e_ident, ELFMAG, SELFMAG) != 0)
    fail("not a shared library (no ELF header)");
  if (header.e_ident[EI_CLASS] != ELFCLASS64 || header.e_ident[EI_DATA] != ELFDATA2LSB || header.e_machine != kMachine)
    fail("a library for another machine");
  if (header.e_type != ET_DYN) fail("not a shared library (ELF type " + std::to_string(header.e_type) + ")");
  // The section headers close a linked library: a file cut short has lost them.
  if (header.e_phentsize != sizeof(Elf64_Phdr) || !within(header.e_phoff, uint64_t{header.e_phnum} * sizeof(Elf64_Phdr), size) ||
      (header.e_shnum > 0 && (header.e_shentsize != sizeof(Elf64_Shdr) ||
                              !within(header.e_shoff, uint64_t{header.e_shnum} * sizeof(Elf64_Shdr), size))))
    fail("truncated (" + std::to_string(size) + " bytes, its headers lie past them)");
  std::vector<Elf64_Phdr> segments(header.e_phnum);
  in.seekg(static_cast<std::streamoff>(header.e_phoff));
  if (!in.read(reinterpret_cast<char*>(segments.data()), static_cast<std::streamsize>(segments.size() * sizeof(Elf64_Phdr))))
    fail("cannot read its program headers");
  for (const auto& segment : segments)
    if (segment.p_type == PT_LOAD && !within(segment.p_offset, segment.p_filesz, size))
      fail("truncated (" + std::to_string(size) + " bytes, a segment it loads ends past them)");
  return absolute;
}

}  // namespace ctxgen
