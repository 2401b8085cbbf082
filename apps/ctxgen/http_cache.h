#pragma once
// The remote compile cache over HTTP (--remote-cache URL): entries fetched with GET and stored
// with PUT under URL/<name>, the protocol bazel-remote, nginx's WebDAV module, Artifactory and
// S3-compatible gateways serve. Bounded: a server that does not connect within seconds, or sends
// or takes under 1 KiB/s for 10 s, is an error, which the compile cache turns into a warning.

#include <filesystem>
#include <string>

#include "ctxgen/pipeline.h"

namespace ctxgen::cli {

class HttpCache final : public RemoteCache {
 public:
  // `url`: http:// or https://, a trailing slash or not. Throws Error(kUsage) for another scheme.
  explicit HttpCache(std::string url);
  std::string where() const override { return url_; }
  bool get(const std::string& name, const std::filesystem::path& to) override;
  void put(const std::string& name, const std::filesystem::path& from) override;

 private:
  std::string url_;
};

// Does `text` name an HTTP(S) location rather than a folder?
bool is_http_url(const std::string& text);

}  // namespace ctxgen::cli
