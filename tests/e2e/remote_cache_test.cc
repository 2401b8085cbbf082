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

#include <atomic>
#include <chrono>
#include <functional>
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

// A developer machine reading what CI writes: --remote-cache-read-only (or its variable) fetches
// and never stores.
TEST(RemoteCache, AReadOnlyMachineFetchesAndNeverStores) {
  TempDir dir;
  Nginx server(dir.path() / "nginx");
  const std::string remote = server.url("/ci/cache");
  const Shared first = share(dir.path() / "first", "--cache " + quote(dir.path() / "a") + " --remote-cache " + remote +
                                                        " --remote-cache-read-only");
  EXPECT_EQ(n(first, "remote_stores"), 0u);
  EXPECT_FALSE(fs::exists(server.root() / "ci" / "cache"));
  const Shared ci = share(dir.path() / "ci", "--cache " + quote(dir.path() / "b") + " --remote-cache " + remote);
  const uint64_t partitions = n(ci, "remote_stores");
  EXPECT_GT(partitions, 5u);
  setenv("CTXGEN_REMOTE_CACHE_READ_ONLY", "1", 1);
  const Shared developer = share(dir.path() / "developer", "--cache " + quote(dir.path() / "c") + " --remote-cache " + remote);
  unsetenv("CTXGEN_REMOTE_CACHE_READ_ONLY");
  EXPECT_EQ(n(developer, "remote_hits"), partitions);
  EXPECT_EQ(n(developer, "remote_stores"), 0u);
  expect_same_files(first.files, developer.files);
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

// A server of its own on 127.0.0.1, each connection on a thread: GET answers 200 and `body`
// writes the rest (until the client hangs up); anything else is refused with 403.
class RawServer {
 public:
  using Body = std::function<bool(int socket)>;  // false: the client hung up
  explicit RawServer(Body body) : body_(std::move(body)) {
    listener_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t size = sizeof a;
    if (::bind(listener_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(listener_, 16) != 0 ||
        ::getsockname(listener_, reinterpret_cast<sockaddr*>(&a), &size) != 0)
      throw std::runtime_error("cannot listen");
    port_ = ntohs(a.sin_port);
    accepting_ = std::thread([this] {
      for (int c; (c = ::accept(listener_, nullptr, nullptr)) >= 0;)
        std::thread([this, c] {
          std::string request;
          char buffer[4096];
          for (ssize_t n; request.find("\r\n\r\n") == std::string::npos && (n = ::recv(c, buffer, sizeof buffer, 0)) > 0;)
            request.append(buffer, static_cast<size_t>(n));
          const bool get = request.rfind("GET ", 0) == 0;
          const std::string head = get ? "HTTP/1.1 200 OK\r\nContent-Length: 200000000\r\n\r\n"
                                       : "HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
          ::send(c, head.data(), head.size(), MSG_NOSIGNAL);
          if (get) {
            ++gets;
            while (!stopping_ && body_(c)) {
            }
          }
          ::close(c);
        }).detach();
    });
  }
  ~RawServer() {
    stopping_ = true;
    ::shutdown(listener_, SHUT_RDWR);
    ::close(listener_);
    accepting_.join();
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the connections' threads see `stopping_`
  }
  std::string url(const std::string& path) const { return "http://127.0.0.1:" + std::to_string(port_) + path; }
  std::atomic<int> gets{0};

 private:
  Body body_;
  int listener_ = -1, port_ = 0;
  std::atomic<bool> stopping_{false};
  std::thread accepting_;
};

bool send_text(int socket, const std::string& text) { return ::send(socket, text.data(), text.size(), MSG_NOSIGNAL) > 0; }

// A server that trickles an entry at 2 KiB/s (never stalling), and one that answers with 200 MB
// that are not an entry: the first is given up after 10 s, the second stopped at its first bytes
// (the entry found damaged, compiled anew); neither leaves more than those bytes behind.
TEST(RemoteCache, AServerSendingWhatIsNoEntryCostsBoundedTimeAndBytes) {
  TempDir dir;
  const auto compile = [&](const std::string& url, const std::string& name) {
    const fs::path report = dir.path() / (name + ".json");
    const auto start = std::chrono::steady_clock::now();
    const auto r = ctxgen("compile " + quote(mixed_group()[2]) + " --fix-dim batch=1 --output-dir " + quote(dir.path() / name) +
                          " --cache " + quote(dir.path() / (name + "_cache")) + " --remote-cache " + url + " --report " + quote(report));
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_LT(seconds, 40) << r.output;
    EXPECT_TRUE(fs::exists(dir.path() / name / "cnn_upsample_ctx.onnx"));
    uint64_t largest = 0;
    for (const auto& e : fs::recursive_directory_iterator(dir.path() / (name + "_cache")))
      if (e.is_regular_file() && e.path().filename() != "CACHEDIR.TAG" && e.path().parent_path().filename() != "hashes")
        largest = std::max<uint64_t>(largest, e.file_size());
    EXPECT_LT(largest, 1u << 20);
    return std::make_pair(r.output, nlohmann::json::parse(read_file(report)).at("cache"));
  };
  {
    RawServer trickle([](int c) {
      static thread_local bool begun = false;
      if (!begun && !send_text(c, "CTXGCC01")) return false;
      begun = true;
      std::this_thread::sleep_for(std::chrono::milliseconds(125));
      return send_text(c, std::string(256, 'x'));
    });
    const auto [output, cache] = compile(trickle.url("/cache"), "trickle");
    EXPECT_NE(output.find("KiB/s on average"), std::string::npos) << output;
    EXPECT_EQ(cache.at("remote_errors"), 1u);
    EXPECT_EQ(cache.at("remote_hits"), 0u);
  }
  {
    RawServer junk([](int c) { return send_text(c, std::string(65536, '<')); });
    const auto [output, cache] = compile(junk.url("/cache"), "junk");
    EXPECT_EQ(junk.gets, 1);
    EXPECT_EQ(cache.at("damaged"), 1u) << output;
    EXPECT_EQ(cache.at("remote_hits"), 0u);
    EXPECT_NE(output.find("compiled anew"), std::string::npos) << output;
  }
}

// One rule for every cache URL: http:// or https:// only, no query or fragment (which would give
// every entry one address); the credentials a URL carries never shown.
TEST(RemoteCache, CacheUrlsFollowOneRuleAndNeverShowCredentials) {
  TempDir dir;
  const auto compile = [&](const std::string& options) {
    return run_command("cd " + quote(dir.path()) + " && " + std::string(CTXGEN_BINARY) + " compile " + quote(mixed_group()[2]) +
                       " --fix-dim batch=1 --force --output-dir out " + options);
  };
  const std::string down = "http://ci:s3cret@127.0.0.1:" + std::to_string(free_port()) + "/cache";
  for (const std::string& options : {"--cache c --remote-cache " + down, "--cache " + down}) {
    const auto r = compile(options);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("http://***@127.0.0.1:"), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("s3cret"), std::string::npos) << r.output;
  }
  setenv("CTXGEN_REMOTE_CACHE", down.c_str(), 1);
  auto r = compile("--cache c");
  unsetenv("CTXGEN_REMOTE_CACHE");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.find("s3cret"), std::string::npos) << r.output;
  for (const std::string url : {"http://127.0.0.1:1/cache?model=a", "http://127.0.0.1:1/cache#a", "http://u:s3cret@127.0.0.1:1/c?x=1",
                                 "http://127.0.0.1:1/c?X-Amz-Signature=s3cret"}) {
    for (const std::string& options : {"--cache " + quote(url), "--cache c --remote-cache " + quote(url)}) {
      r = compile(options);
      EXPECT_EQ(r.exit_code, 2) << r.output;
      EXPECT_NE(r.output.find("a query or a fragment"), std::string::npos) << r.output;
      EXPECT_EQ(r.output.find("s3cret"), std::string::npos) << r.output;
    }
  }
  // The cache command manages a local folder: a URL is refused, shown without its credentials.
  r = run_command("CTXGEN_CACHE=" + down + " " + std::string(CTXGEN_BINARY) + " cache stats");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("manages a local cache folder, not a remote cache"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("s3cret"), std::string::npos) << r.output;
  fs::remove_all(dir.path() / "out");
  r = compile("--cache file:///etc/");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("give a folder or an http:// or https:// URL"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(dir.path() / "file:"));
  EXPECT_FALSE(fs::exists(dir.path() / "out"));
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
