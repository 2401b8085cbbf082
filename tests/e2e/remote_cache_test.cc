// The compile cache shared over HTTP (--remote-cache, --cache URL), against a real server: nginx
// with its WebDAV PUT, started on 127.0.0.1 by the test. A second machine (an empty local cache)
// fills from it; a server that is down, answers errors or holds a damaged entry costs only time.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "e2e.h"

namespace ctxgen::testing {
namespace {

// A port nothing listens on now (the kernel's choice for port 0).
int free_port() {
  const int s = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t size = sizeof a;
  if (::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::getsockname(s, reinterpret_cast<sockaddr*>(&a), &size) != 0)
    throw std::runtime_error("no free port");
  ::close(s);
  return ntohs(a.sin_port);
}

bool accepts(int port) {
  const int s = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const bool ok = ::connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  ::close(s);
  return ok;
}

// nginx in the foreground, one process, serving `root` with PUT; /forbidden/ answers 403.
class Nginx {
 public:
  explicit Nginx(const fs::path& dir) : dir_(dir), port_(free_port()) {
    fs::create_directories(dir / "root");
    std::ofstream(dir / "nginx.conf")
        << "daemon off;\nmaster_process off;\nerror_log " << (dir / "error.log").string() << ";\npid "
        << (dir / "nginx.pid").string() << ";\nevents { worker_connections 64; }\nhttp {\n  access_log off;\n"
        << "  client_body_temp_path " << (dir / "body").string() << ";\n  proxy_temp_path " << (dir / "proxy").string()
        << ";\n  fastcgi_temp_path " << (dir / "fcgi").string() << ";\n  uwsgi_temp_path " << (dir / "uwsgi").string()
        << ";\n  scgi_temp_path " << (dir / "scgi").string() << ";\n  server {\n    listen 127.0.0.1:" << port_
        << ";\n    root " << (dir / "root").string() << ";\n    client_max_body_size 0;\n"
        << "    location / { dav_methods PUT; create_full_put_path on; }\n"
        << "    location /forbidden/ { return 403; }\n  }\n}\n";
    start();
  }
  ~Nginx() { stop(); }
  void start() {
    pid_ = ::fork();
    if (pid_ == 0) {
      ::execl("/usr/sbin/nginx", "nginx", "-p", dir_.c_str(), "-c", (dir_ / "nginx.conf").c_str(), nullptr);
      ::_exit(127);
    }
    for (int i = 0; i < 100 && !accepts(port_); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    ASSERT_TRUE(accepts(port_)) << "nginx did not start: " << read_file(dir_ / "error.log");
  }
  void stop() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGTERM);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  std::string url(const std::string& path) const { return "http://127.0.0.1:" + std::to_string(port_) + path; }
  fs::path root() const { return dir_ / "root"; }

 private:
  fs::path dir_;
  int port_;
  pid_t pid_ = -1;
};

struct Shared {
  nlohmann::json cache;
  std::map<std::string, std::string> files;
  std::string output;
};

Shared share(const fs::path& out, const std::string& options) {
  std::string inputs;
  for (const auto& model : mixed_group()) inputs += (inputs.empty() ? "" : ",") + model.string();
  const fs::path report = out.parent_path() / (out.filename().string() + ".json");
  const auto r = run_command(std::string(CTXGEN_BINARY) + " share " + inputs + " " + mixed_group_shapes() + " " + options +
                             " --output-dir " + quote(out) + " --report " + quote(report));
  Shared s;
  s.output = r.output;
  EXPECT_EQ(r.exit_code, 0) << r.output;
  if (r.exit_code != 0) return s;
  s.cache = nlohmann::json::parse(read_file(report)).at("cache");
  s.files = file_contents(out);
  return s;
}

uint64_t n(const Shared& s, const char* what) { return s.cache.at(what).get<uint64_t>(); }

TEST(RemoteCache, ASecondMachineFillsFromTheServerAndAFailingServerCostsOnlyTime) {
  TempDir dir;
  Nginx server(dir.path() / "nginx");
  const Shared plain = share(dir.path() / "plain", "");
  const std::string remote = server.url("/ci/cache");

  // The first machine compiles and stores every entry, locally and on the server (named by
  // CTXGEN_REMOTE_CACHE, as a CI machine sets it once).
  setenv("CTXGEN_REMOTE_CACHE", remote.c_str(), 1);
  const Shared first = share(dir.path() / "first", "--cache " + quote(dir.path() / "a"));
  unsetenv("CTXGEN_REMOTE_CACHE");
  const uint64_t partitions = n(first, "misses");
  EXPECT_GT(partitions, 5u);
  EXPECT_EQ(n(first, "remote_stores"), partitions);
  EXPECT_EQ(n(first, "remote_errors"), 0u);
  expect_same_files(plain.files, first.files);

  // A second machine with an empty cache, the server alone (--cache URL): every partition from it.
  const Shared second = share(dir.path() / "second", "--cache " + remote);
  EXPECT_EQ(n(second, "hits"), partitions);
  EXPECT_EQ(n(second, "remote_hits"), partitions);
  EXPECT_NE(second.output.find("fetched from the remote cache"), std::string::npos) << second.output;
  expect_same_files(plain.files, second.files);

  // An entry damaged on the server: fetched, found damaged, compiled anew (and stored again).
  std::vector<fs::path> entries;
  for (const auto& e : fs::recursive_directory_iterator(server.root() / "ci" / "cache" / "entries")) entries.push_back(e.path());
  ASSERT_EQ(entries.size(), partitions);
  std::ofstream(entries.front(), std::ios::binary | std::ios::trunc) << "not an entry";
  const Shared third = share(dir.path() / "third", "--cache " + quote(dir.path() / "c") + " --remote-cache " + remote);
  EXPECT_EQ(n(third, "damaged"), 1u);
  EXPECT_EQ(n(third, "hits"), partitions - 1);
  expect_same_files(plain.files, third.files);

  // A server answering errors, and a server that is down: one warning, a local compile.
  const Shared refused = share(dir.path() / "refused", "--cache " + quote(dir.path() / "d") + " --remote-cache " +
                                                           server.url("/forbidden/cache"));
  EXPECT_EQ(n(refused, "remote_errors"), 1u);
  EXPECT_EQ(n(refused, "misses"), partitions);
  EXPECT_NE(refused.output.find("HTTP 403"), std::string::npos) << refused.output;
  expect_same_files(plain.files, refused.files);
  server.stop();
  const Shared down = share(dir.path() / "down", "--cache " + quote(dir.path() / "e") + " --remote-cache " + remote);
  EXPECT_EQ(n(down, "remote_errors"), 1u);
  EXPECT_EQ(n(down, "misses"), partitions);
  EXPECT_NE(down.output.find("compiling locally"), std::string::npos) << down.output;
  expect_same_files(plain.files, down.files);
}

// A server that takes the connection and never answers: the transfer gives up after 10 s under
// 1 KiB/s, one warning, and the model compiles locally.
TEST(RemoteCache, AServerThatNeverAnswersCostsBoundedTime) {
  TempDir dir;
  const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t size = sizeof a;
  ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::listen(listener, 16), 0);  // connections complete in the backlog; none is ever read
  ASSERT_EQ(::getsockname(listener, reinterpret_cast<sockaddr*>(&a), &size), 0);
  const std::string url = "http://127.0.0.1:" + std::to_string(ntohs(a.sin_port)) + "/cache";
  const auto start = std::chrono::steady_clock::now();
  const auto r = ctxgen("compile " + quote(mixed_group()[2]) + " --fix-dim batch=1 --output-dir " + quote(dir.path()) +
                        " --cache " + url);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ::close(listener);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("compiling locally"), std::string::npos) << r.output;
  EXPECT_TRUE(fs::exists(dir.path() / "cnn_upsample_ctx.onnx"));
  EXPECT_LT(seconds, 60) << "the stalled server held the run " << seconds << " s";
}

TEST(RemoteCache, ABadUrlIsAUsageError) {
  TempDir dir;
  const auto r = ctxgen("compile " + quote(mixed_group()[2]) + " --fix-dim batch=1 --output-dir " + quote(dir.path()) +
                        " --cache " + quote(dir.path() / "c") + " --remote-cache ftp://example.org/cache");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("give an http:// or https:// URL"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace ctxgen::testing
