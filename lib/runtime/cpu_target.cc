// A CPU level as one compile's setting. oneDNN chooses weight layouts by the level its process
// runs at, which it fixes once per process at the first question about the CPU; so a compile for
// another level asks a helper process (ctxgen-cpu-level) that runs at that level, and the process
// itself never changes level. The helper is spoken to over a socket in frames:
//   request:  u8 kind ('L' layout, 'C' channels last), u64 size, a ref program of one op whose
//             values 0, 1, 2 are x, w, y (and 3 the bias, when the op reads one);
//   answer:   u8 status (0, or the ErrorCode), u64 size, the payload: int64 layout, u8 boolean,
//             or the error's message.
// The helper first answers an empty request of its own: its version, its architecture, u8 exact int8.

#include <dlfcn.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/time.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <mutex>

#include "ctxgen/error.h"
#include "ctxgen/runtime.h"
#include "onednn.h"

extern char** environ;

namespace fs = std::filesystem;

namespace ctxgen::runtime {
namespace {

constexpr const char* kHelperName = "ctxgen-cpu-level";
constexpr const char* kHelperVariable = "CTXGEN_CPU_LEVEL_HELPER";

class HostTarget final : public CpuTarget {
 public:
  std::string level() const override { return onednn::level(); }
  std::string architecture() const override { return onednn::architecture(); }
  bool exact_int8() const override { return onednn::exact_int8_convolution(); }
  std::vector<int64_t> conv_weight_layout(const ref::Op& op, const std::vector<int64_t>& x, const std::vector<int64_t>& w,
                                          const std::vector<int64_t>& y, bool bias) const override {
    return runtime::conv_weight_layout(op, x, w, y, bias);
  }
  bool conv_runs_channels_last(const ref::Op& op, const std::vector<int64_t>& x, const std::vector<int64_t>& w,
                               const std::vector<int64_t>& y, bool bias) const override {
    return runtime::conv_runs_channels_last(op, x, w, y, bias);
  }
};

// Whole frames over a stream socket; a peer gone is an end of stream, never a SIGPIPE.
bool send_all(int fd, const void* data, size_t size) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (size > 0) {
    const ssize_t n = ::send(fd, p, size, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

bool receive_all(int fd, void* data, size_t size) {
  auto* p = static_cast<uint8_t*>(data);
  while (size > 0) {
    const ssize_t n = ::recv(fd, p, size, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

bool send_frame(int fd, uint8_t tag, const void* data, uint64_t size) {
  return send_all(fd, &tag, 1) && send_all(fd, &size, sizeof size) && send_all(fd, data, size);
}

// A frame's tag and payload; false at the end of the stream. A payload over `limit` is refused:
// the frames are small (one op, one layout), so a larger size is a broken peer.
bool receive_frame(int fd, uint8_t& tag, std::vector<uint8_t>& payload) {
  constexpr uint64_t kLimit = uint64_t{1} << 24;
  uint64_t size = 0;
  if (!receive_all(fd, &tag, 1) || !receive_all(fd, &size, sizeof size) || size > kLimit) return false;
  payload.resize(size);
  return receive_all(fd, payload.data(), size);
}

std::vector<uint8_t> question(const ref::Op& op, const std::vector<int64_t>& x, const std::vector<int64_t>& w,
                              const std::vector<int64_t>& y, bool bias) {
  ref::Program p;
  for (const auto* dims : {&x, &w, &y}) {
    ref::Value v;
    v.dims = *dims;
    p.values.push_back(v);
  }
  p.ops.push_back(op);
  p.ops[0].inputs = {0, 1};
  p.ops[0].outputs = {2};
  if (bias) {
    p.values.push_back(ref::Value{});
    p.ops[0].inputs.push_back(3);
  }
  return ref::serialize(p);
}

// Where the helper lies: named by CTXGEN_CPU_LEVEL_HELPER, or in libexec/ctxgen beside the folder
// of the program or library holding this code (bin/ and lib/ of a build or an installation), or
// where this build's installation, then this build, puts it. Its greeting names its version.
fs::path helper_path() {
  if (const char* named = std::getenv(kHelperVariable); named != nullptr && *named != '\0') return named;
  std::vector<fs::path> candidates;
  const auto beside = [&](const fs::path& module) {
    std::error_code ec;
    const fs::path found = fs::canonical(module, ec);
    if (!ec) candidates.push_back(found.parent_path().parent_path() / "libexec" / "ctxgen" / kHelperName);
  };
  // The library this code is in (a plugin EP), then the program (whose own name dladdr may not know).
  Dl_info info{};
  if (::dladdr(reinterpret_cast<const void*>(&helper_path), &info) != 0 && info.dli_fname != nullptr && *info.dli_fname != '\0')
    beside(info.dli_fname);
  beside("/proc/self/exe");
  candidates.push_back(fs::path(CTXGEN_HELPER_INSTALL_DIR) / kHelperName);
  candidates.push_back(fs::path(CTXGEN_HELPER_BUILD_DIR) / kHelperName);
  std::string looked;
  for (const fs::path& c : candidates) {
    if (::access(c.c_str(), X_OK) == 0) return c;
    looked += (looked.empty() ? "" : ", ") + c.string();
  }
  throw CpuTargetFailure(ErrorCode::kInternal, std::string("cannot find ") + kHelperName + ", which compiles for a CPU level other than this process's (looked in " +
                                        looked + "; " + kHelperVariable + " names it)");
}

// The process's environment without oneDNN's own level limit: the helper sets its level itself.
std::vector<char*> helper_environment() {
  std::vector<char*> env;
  for (char** e = environ; *e != nullptr; ++e)
    if (std::strncmp(*e, "ONEDNN_MAX_CPU_ISA=", 19) != 0 && std::strncmp(*e, "DNNL_MAX_CPU_ISA=", 17) != 0) env.push_back(*e);
  env.push_back(nullptr);
  return env;
}

// The error a helper reports, by its code: one of ctxgen's, else a broken helper's.
ErrorCode code_of(uint8_t tag) {
  return tag >= static_cast<uint8_t>(ErrorCode::kInternal) && tag <= static_cast<uint8_t>(ErrorCode::kRuntime)
             ? static_cast<ErrorCode>(tag)
             : ErrorCode::kInternal;
}

class HelperTarget final : public CpuTarget {
 public:
  explicit HelperTarget(const std::string& level) : level_(level) {
    const fs::path helper = helper_path();
    int fds[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0)
      throw CpuTargetFailure(ErrorCode::kInternal, "cannot start " + helper.string() + ": " + std::strerror(errno));
    // A helper that stops answering is given up, not waited for.
    const timeval limit{kAnswerSeconds, 0};
    ::setsockopt(fds[0], SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
    ::setsockopt(fds[0], SOL_SOCKET, SO_SNDTIMEO, &limit, sizeof limit);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, fds[1], 0);
    // Nothing else of the process it serves (an ONNX Runtime session's files, say) reaches it.
    posix_spawn_file_actions_addclosefrom_np(&actions, 3);
    std::string program = helper.string(), argument = level;
    char* argv[] = {program.data(), argument.data(), nullptr};
    std::vector<char*> env = helper_environment();
    const int spawned = ::posix_spawn(&pid_, program.c_str(), &actions, nullptr, argv, env.data());
    posix_spawn_file_actions_destroy(&actions);
    ::close(fds[1]);
    fd_ = fds[0];
    if (spawned != 0) {
      pid_ = -1;
      stop();
      throw CpuTargetFailure(ErrorCode::kInternal, "cannot start " + helper.string() + ": " + std::strerror(spawned));
    }
    try {
      greet(helper);
    } catch (...) {
      stop();
      throw;
    }
  }
  ~HelperTarget() override { stop(); }

  std::string level() const override { return level_; }
  std::string architecture() const override { return architecture_; }
  bool exact_int8() const override { return exact_int8_; }
  std::vector<int64_t> conv_weight_layout(const ref::Op& op, const std::vector<int64_t>& x, const std::vector<int64_t>& w,
                                          const std::vector<int64_t>& y, bool bias) const override {
    const std::vector<uint8_t> answer = answered('L', question(op, x, w, y, bias));
    if (answer.size() % sizeof(int64_t) != 0) fail("a layout of " + std::to_string(answer.size()) + " bytes");
    std::vector<int64_t> layout(answer.size() / sizeof(int64_t));
    std::memcpy(layout.data(), answer.data(), answer.size());
    return layout;
  }
  bool conv_runs_channels_last(const ref::Op& op, const std::vector<int64_t>& x, const std::vector<int64_t>& w,
                               const std::vector<int64_t>& y, bool bias) const override {
    const std::vector<uint8_t> answer = answered('C', question(op, x, w, y, bias));
    if (answer.size() != 1) fail("an answer of " + std::to_string(answer.size()) + " bytes to a yes-or-no question");
    return answer[0] != 0;
  }

 private:
  // The greeting: the helper's ctxgen version, a newline, its architecture, then whether its
  // int8 convolutions are exact; or the error that kept it from taking the level.
  void greet(const fs::path& helper) {
    std::vector<uint8_t> hello;
    const uint8_t tag = ask(0, {}, hello);
    if (tag != 0) throw Error(code_of(tag), std::string(hello.begin(), hello.end()));
    const std::string text(hello.begin(), hello.end());
    const size_t line = text.find('\n');
    if (line == std::string::npos || text.size() < line + 2) fail("a greeting that is not one");
    if (text.compare(0, line, CTXGEN_VERSION) != 0)
      throw CpuTargetFailure(ErrorCode::kInternal, helper.string() + " is the helper of ctxgen " + text.substr(0, line) +
                                                       ", not of this ctxgen " + CTXGEN_VERSION);
    architecture_ = text.substr(line + 1, text.size() - line - 2);
    exact_int8_ = text.back() != 0;
  }
  [[noreturn]] void fail(const std::string& what) const {
    throw CpuTargetFailure(ErrorCode::kInternal, std::string(kHelperName) + " " + level_ + " sent " + what);
  }
  uint8_t ask(uint8_t kind, const std::vector<uint8_t>& request, std::vector<uint8_t>& answer) const {
    std::lock_guard<std::mutex> lock(mutex_);
    uint8_t tag = 0;
    if ((kind != 0 && !send_frame(fd_, kind, request.data(), request.size())) || !receive_frame(fd_, tag, answer))
      throw CpuTargetFailure(ErrorCode::kInternal, std::string(kHelperName) + " " + level_ + " ended, or did not answer within " +
                                                       std::to_string(kAnswerSeconds) + " s");
    return tag;
  }
  std::vector<uint8_t> answered(uint8_t kind, const std::vector<uint8_t>& request) const {
    std::vector<uint8_t> answer;
    const uint8_t tag = ask(kind, request, answer);
    if (tag != 0) throw Error(code_of(tag), std::string(answer.begin(), answer.end()));
    return answer;
  }
  // Its questions over (or it failed), the helper is ended, whatever it is doing, and reaped.
  void stop() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      while (::waitpid(pid_, nullptr, 0) < 0 && errno == EINTR) {
      }
    }
    pid_ = -1;
  }

  static constexpr long kAnswerSeconds = 120;

  std::string level_, architecture_;
  bool exact_int8_ = false;
  int fd_ = -1;
  pid_t pid_ = -1;
  mutable std::mutex mutex_;
};

}  // namespace

std::shared_ptr<const CpuTarget> CpuTarget::of(const std::string& level) {
  static const auto host = std::make_shared<const HostTarget>();
  if (level.empty()) return host;
  onednn::check_level(level);
  if (level == onednn::level()) return host;
  return std::make_shared<const HelperTarget>(level);
}

int serve_cpu_level(const std::string& level, int fd) {
  // The helper lives as long as the process that asks.
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  const auto answer = [fd](uint8_t tag, const void* data, uint64_t size) { return send_frame(fd, tag, data, size); };
  const auto error = [&](const Error& e) {
    const std::string message = e.what();
    return answer(static_cast<uint8_t>(e.code()), message.data(), message.size());
  };
  try {
    onednn::target_level(level);
  } catch (const Error& e) {
    error(e);
    return 0;
  }
  std::string hello = std::string(CTXGEN_VERSION) + "\n" + onednn::architecture();
  hello.push_back(onednn::exact_int8_convolution() ? 1 : 0);
  if (!answer(0, hello.data(), hello.size())) return 0;
  uint8_t kind = 0;
  std::vector<uint8_t> request;
  while (receive_frame(fd, kind, request)) {
    try {
      const ref::Program p = ref::deserialize(request.data(), request.size());
      if (p.ops.size() != 1 || p.values.size() < 3 || p.ops[0].inputs.size() < 2)
        throw Error(ErrorCode::kInternal, "a question that is not one convolution");
      const ref::Op& op = p.ops[0];
      const bool bias = op.inputs.size() > 2;
      const auto& x = p.values[0].dims;
      const auto& w = p.values[1].dims;
      const auto& y = p.values[2].dims;
      bool sent = false;
      if (kind == 'L') {
        const std::vector<int64_t> layout = conv_weight_layout(op, x, w, y, bias);
        sent = answer(0, layout.data(), layout.size() * sizeof(int64_t));
      } else if (kind == 'C') {
        const uint8_t yes = conv_runs_channels_last(op, x, w, y, bias) ? 1 : 0;
        sent = answer(0, &yes, 1);
      } else {
        throw Error(ErrorCode::kInternal, "a question of unknown kind " + std::to_string(kind));
      }
      if (!sent) return 0;
    } catch (const Error& e) {
      if (!error(e)) return 0;
    }
  }
  return 0;
}

}  // namespace ctxgen::runtime
