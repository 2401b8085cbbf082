#pragma once
// Helpers shared by ctxgen's tests: temporary folders, the generated test models, running a
// command and capturing what it prints.

#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>

namespace ctxgen::testing {

namespace fs = std::filesystem;

// A fresh folder removed with everything in it when the object goes away.
class TempDir {
 public:
  TempDir() {
    static int counter = 0;
    path_ = fs::temp_directory_path() /
            ("ctxgen-test-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const fs::path& path() const { return path_; }
  fs::path operator/(const std::string& name) const { return path_ / name; }

 private:
  fs::path path_;
};

struct CommandResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};

inline CommandResult run_command(const std::string& command) {
  CommandResult result;
  FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) throw std::runtime_error("cannot run: " + command);
  std::array<char, 4096> buf{};
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), pipe)) > 0) result.output.append(buf.data(), n);
  int status = ::pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

inline std::string quote(const fs::path& path) { return "'" + path.string() + "'"; }

// The models testdata/generate.py writes, generated once per test process.
inline const fs::path& generated_models() {
  static TempDir dir;
  static bool done = [] {
    auto r = run_command(std::string(CTXGEN_PYTHON) + " " + CTXGEN_SOURCE_DIR "/testdata/generate.py " +
                         quote(dir.path()));
    if (r.exit_code != 0) throw std::runtime_error("testdata/generate.py failed: " + r.output);
    return true;
  }();
  (void)done;
  return dir.path();
}

inline std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

inline void write_file(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out << bytes;
}

}  // namespace ctxgen::testing
