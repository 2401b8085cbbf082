#include "http_cache.h"

#include <curl/curl.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>

#include "ctxgen/error.h"

namespace fs = std::filesystem;

namespace ctxgen::cli {
namespace {

struct CurlDeleter {
  void operator()(CURL* curl) const { curl_easy_cleanup(curl); }
};
struct FileCloser {
  void operator()(std::FILE* file) const { std::fclose(file); }
};

// A transfer's bounds: three seconds to connect, no stretch of 10 s under 1 KiB/s (a stalled
// server), after its first 10 s an average of at least 64 KiB/s (a server trickling bytes), and
// an hour at most, whatever the entry's size.
constexpr long kStallSeconds = 10;
constexpr double kMinimumAverage = 64 * 1024;
constexpr long kMaxSeconds = 3600;

struct Clock {
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
};

int too_slow(void* clock, curl_off_t, curl_off_t down, curl_off_t, curl_off_t up) {
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - static_cast<Clock*>(clock)->start).count();
  return seconds > kStallSeconds && static_cast<double>(down + up) / seconds < kMinimumAverage ? 1 : 0;
}

struct Transfer {
  std::unique_ptr<CURL, CurlDeleter> curl;
  Clock clock;
};

std::unique_ptr<Transfer> transfer(const std::string& url) {
  static const bool initialised = curl_global_init(CURL_GLOBAL_DEFAULT) == CURLE_OK;
  auto t = std::make_unique<Transfer>();
  t->curl.reset(initialised ? curl_easy_init() : nullptr);
  CURL* curl = t->curl.get();
  if (curl == nullptr) throw Error(ErrorCode::kIo, "libcurl cannot start a transfer");
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS, 3000L);
  curl_easy_setopt(curl, CURLOPT_LOW_SPEED_LIMIT, 1024L);
  curl_easy_setopt(curl, CURLOPT_LOW_SPEED_TIME, kStallSeconds);
  curl_easy_setopt(curl, CURLOPT_TIMEOUT, kMaxSeconds);
  curl_easy_setopt(curl, CURLOPT_NOPROGRESS, 0L);
  curl_easy_setopt(curl, CURLOPT_XFERINFOFUNCTION, too_slow);
  curl_easy_setopt(curl, CURLOPT_XFERINFODATA, &t->clock);
  return t;
}

// The transfer's HTTP status; `stopped`, when given, is true once a fetch was stopped on purpose.
long perform(CURL* curl, const std::string& method, const std::string& url, const bool* stopped = nullptr) {
  const CURLcode result = curl_easy_perform(curl);
  if (result == CURLE_WRITE_ERROR && stopped != nullptr && *stopped) return 200;
  if (result == CURLE_ABORTED_BY_CALLBACK)
    throw Error(ErrorCode::kIo, method + " " + url + ": slower than " + std::to_string(static_cast<int>(kMinimumAverage / 1024)) +
                                    " KiB/s on average");
  if (result != CURLE_OK) throw Error(ErrorCode::kIo, method + " " + url + ": " + curl_easy_strerror(result));
  long status = 0;
  curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
  return status;
}

// Where a fetched entry goes, judged as its bytes arrive: an answer other than 200 is not kept,
// and one that begins otherwise than an entry or grows larger than one is stopped at once, the
// bytes so far kept: the compile cache then finds the entry damaged and compiles its partition anew.
struct Sink {
  CURL* curl;
  std::FILE* file;
  const std::string& start;
  uint64_t max_bytes;
  uint64_t got = 0;
  bool stopped = false;
};

size_t receive(char* data, size_t, size_t size, void* to) {
  Sink& sink = *static_cast<Sink*>(to);
  long status = 0;
  curl_easy_getinfo(sink.curl, CURLINFO_RESPONSE_CODE, &status);
  if (status != 200) return size;
  size_t fits = 0;
  while (fits < size && (sink.got + fits >= sink.start.size() || data[fits] == sink.start[sink.got + fits])) ++fits;
  fits = std::min<uint64_t>(fits, sink.max_bytes - sink.got);
  if (fits < size) {
    sink.stopped = true;
    std::fwrite(data, 1, fits, sink.file);
    return 0;
  }
  sink.got += size;
  return std::fwrite(data, 1, size, sink.file);
}

}  // namespace

bool is_http_url(const std::string& text) { return text.rfind("http://", 0) == 0 || text.rfind("https://", 0) == 0; }

bool looks_like_url(const std::string& text) {
  const size_t scheme = text.find("://");
  return scheme != std::string::npos && scheme > 0 &&
         text.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789+.-") == scheme;
}

std::string without_credentials(const std::string& url) {
  const size_t scheme = url.find("://");
  if (scheme == std::string::npos) return url;
  // A query or fragment may carry a token (a presigned URL's signature): shown as *** too.
  const size_t query = url.find_first_of("?#", scheme);
  std::string shown = query == std::string::npos ? url : url.substr(0, query + 1) + "***";
  const size_t host = scheme + 3, end = shown.find_first_of("/?#", host);
  const size_t at = shown.rfind('@', end == std::string::npos ? std::string::npos : end);
  if (at != std::string::npos && at >= host) shown = shown.substr(0, host) + "***@" + shown.substr(at + 1);
  return shown;
}

HttpCache::HttpCache(std::string url, const std::string& option, bool read_only) : url_(std::move(url)), read_only_(read_only) {
  const std::string shown = option + " " + without_credentials(url_);
  if (!is_http_url(url_)) throw Error(ErrorCode::kUsage, shown + ": give an http:// or https:// URL");
  if (url_.find_first_of("?#") != std::string::npos)
    throw Error(ErrorCode::kUsage, shown + ": a URL with a query or a fragment (? or #) would give every entry one address");
  while (!url_.empty() && url_.back() == '/') url_.pop_back();
}

std::string HttpCache::where() const { return without_credentials(url_); }

bool HttpCache::get(const std::string& name, const fs::path& to, const std::string& start, uint64_t max_bytes) {
  const std::string url = url_ + "/" + name;
  std::unique_ptr<std::FILE, FileCloser> file(std::fopen(to.c_str(), "wb"));
  if (!file) throw Error(ErrorCode::kIo, "cannot write " + to.string());
  auto t = transfer(url);
  Sink sink{t->curl.get(), file.get(), start, max_bytes};
  curl_easy_setopt(t->curl.get(), CURLOPT_WRITEFUNCTION, receive);
  curl_easy_setopt(t->curl.get(), CURLOPT_WRITEDATA, &sink);
  const long status = perform(t->curl.get(), "GET", where() + "/" + name, &sink.stopped);
  if (std::fflush(file.get()) != 0) throw Error(ErrorCode::kIo, "cannot write " + to.string());
  if (status == 200) return true;
  if (status == 404) return false;
  throw Error(ErrorCode::kIo, "GET " + where() + "/" + name + ": HTTP " + std::to_string(status));
}

void HttpCache::put(const std::string& name, const fs::path& from) {
  const std::string url = url_ + "/" + name;
  std::unique_ptr<std::FILE, FileCloser> file(std::fopen(from.c_str(), "rb"));
  std::error_code ec;
  const auto size = fs::file_size(from, ec);
  if (!file || ec) throw Error(ErrorCode::kIo, "cannot read " + from.string());
  auto t = transfer(url);
  curl_easy_setopt(t->curl.get(), CURLOPT_UPLOAD, 1L);
  curl_easy_setopt(t->curl.get(), CURLOPT_READDATA, file.get());
  curl_easy_setopt(t->curl.get(), CURLOPT_INFILESIZE_LARGE, static_cast<curl_off_t>(size));
  // What the server answers a PUT with is not ctxgen's output (standard output may be a report).
  curl_easy_setopt(t->curl.get(), CURLOPT_WRITEFUNCTION, +[](char*, size_t, size_t size, void*) { return size; });
  // A server that has the entry already may answer 204 or 200; a new one, 201.
  const long status = perform(t->curl.get(), "PUT", where() + "/" + name);
  if (status != 200 && status != 201 && status != 204)
    throw Error(ErrorCode::kIo, "PUT " + where() + "/" + name + ": HTTP " + std::to_string(status));
}

}  // namespace ctxgen::cli
