#include "http_cache.h"

#include <curl/curl.h>

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

// A transfer with the cache's bounds: three seconds to connect, and no stretch of 10 s under
// 1 KiB/s (a stalled server), whatever the entry's size.
std::unique_ptr<CURL, CurlDeleter> transfer(const std::string& url) {
  static const bool initialised = curl_global_init(CURL_GLOBAL_DEFAULT) == CURLE_OK;
  std::unique_ptr<CURL, CurlDeleter> curl(initialised ? curl_easy_init() : nullptr);
  if (!curl) throw Error(ErrorCode::kIo, "libcurl cannot start a transfer");
  curl_easy_setopt(curl.get(), CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl.get(), CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(curl.get(), CURLOPT_CONNECTTIMEOUT_MS, 3000L);
  curl_easy_setopt(curl.get(), CURLOPT_LOW_SPEED_LIMIT, 1024L);
  curl_easy_setopt(curl.get(), CURLOPT_LOW_SPEED_TIME, 10L);
  return curl;
}

long perform(CURL* curl, const std::string& method, const std::string& url) {
  const CURLcode result = curl_easy_perform(curl);
  if (result != CURLE_OK) throw Error(ErrorCode::kIo, method + " " + url + ": " + curl_easy_strerror(result));
  long status = 0;
  curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
  return status;
}

}  // namespace

bool is_http_url(const std::string& text) { return text.rfind("http://", 0) == 0 || text.rfind("https://", 0) == 0; }

HttpCache::HttpCache(std::string url) : url_(std::move(url)) {
  if (!is_http_url(url_)) throw Error(ErrorCode::kUsage, "--remote-cache " + url_ + ": give an http:// or https:// URL");
  while (!url_.empty() && url_.back() == '/') url_.pop_back();
}

bool HttpCache::get(const std::string& name, const fs::path& to) {
  const std::string url = url_ + "/" + name;
  std::unique_ptr<std::FILE, FileCloser> file(std::fopen(to.c_str(), "wb"));
  if (!file) throw Error(ErrorCode::kIo, "cannot write " + to.string());
  auto curl = transfer(url);
  curl_easy_setopt(curl.get(), CURLOPT_WRITEDATA, file.get());
  const long status = perform(curl.get(), "GET", url);
  if (std::fflush(file.get()) != 0) throw Error(ErrorCode::kIo, "cannot write " + to.string());
  if (status == 200) return true;
  if (status == 404) return false;
  throw Error(ErrorCode::kIo, "GET " + url + ": HTTP " + std::to_string(status));
}

void HttpCache::put(const std::string& name, const fs::path& from) {
  const std::string url = url_ + "/" + name;
  std::unique_ptr<std::FILE, FileCloser> file(std::fopen(from.c_str(), "rb"));
  std::error_code ec;
  const auto size = fs::file_size(from, ec);
  if (!file || ec) throw Error(ErrorCode::kIo, "cannot read " + from.string());
  auto curl = transfer(url);
  curl_easy_setopt(curl.get(), CURLOPT_UPLOAD, 1L);
  curl_easy_setopt(curl.get(), CURLOPT_READDATA, file.get());
  curl_easy_setopt(curl.get(), CURLOPT_INFILESIZE_LARGE, static_cast<curl_off_t>(size));
  // A server that has the entry already may answer 204 or 200; a new one, 201.
  const long status = perform(curl.get(), "PUT", url);
  if (status != 200 && status != 201 && status != 204)
    throw Error(ErrorCode::kIo, "PUT " + url + ": HTTP " + std::to_string(status));
}

}  // namespace ctxgen::cli
