#pragma once
// The remote compile cache over HTTP (--remote-cache URL): entries fetched with GET and stored
// with PUT under URL/<name>, the protocol bazel-remote, nginx's WebDAV module, Artifactory and
// S3-compatible gateways serve. Bounded (http_cache.cc): a server that does not connect within
// seconds, stalls, trickles, or sends what cannot be an entry is an error, which the compile cache
// turns into a warning. Messages never show the URL's credentials.

#include <filesystem>
#include <string>

#include "ctxgen/compile_cache.h"

namespace ctxgen::cli {

class HttpCache final : public RemoteCache {
 public:
  // `url`: http:// or https://, a trailing slash or not, no query or fragment. Throws
  // Error(kUsage) naming `option` otherwise. `read_only`: never stores.
  HttpCache(std::string url, const std::string& option, bool read_only);
  std::string where() const override;
  bool writable() const override { return !read_only_; }
  bool get(const std::string& name, const std::filesystem::path& to, const std::string& start, uint64_t max_bytes) override;
  void put(const std::string& name, const std::filesystem::path& from) override;

 private:
  std::string url_;
  bool read_only_;
};

// Does `text` name an HTTP(S) location rather than a folder?
bool is_http_url(const std::string& text);
// Does `text` look like a URL of any scheme ("file:///etc/")? --cache refuses one that is not HTTP(S).
bool looks_like_url(const std::string& text);
// `url` with the user and password it carries, if any, shown as ***.
std::string without_credentials(const std::string& url);

}  // namespace ctxgen::cli
