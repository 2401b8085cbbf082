// The symbols ORT looks up in a plugin EP library, plus one for tests. Everything else in the
// library is hidden (exports.map).

#include <onnxruntime_c_api.h>

#include <cstdint>
#include <string>

#include "binary_registry.h"
#include "factory.h"
#include "ort_api.h"
#include "plugin_backend.h"

namespace ctxgen::ort_ep {
namespace {

struct Served {
  std::unique_ptr<BackendRuntime> runtime;
  BinaryIdentity identity;
  std::string compatibility_info;
};

// Made by the first CreateEpFactories (thread-safe, and again by the next call if making it
// threw), and never destroyed: ORT may release sessions, EPs and factories after the library's
// static destructors have run at process exit, and they still use the runtime and its identity.
const Served& served() {
  static const Served* made = [] {
    auto runtime = make_backend_runtime();
    BinaryIdentity identity = runtime->identity();
    std::string info = ctxgen::compatibility_info(identity);
    return new Served{std::move(runtime), std::move(identity), std::move(info)};
  }();
  return *made;
}

}  // namespace

const BackendRuntime& backend_runtime() { return *served().runtime; }
const BinaryIdentity& backend_identity() { return served().identity; }
const std::string& compatibility_info() { return served().compatibility_info; }

}  // namespace ctxgen::ort_ep

#define CTXGEN_EXPORT __attribute__((visibility("default")))

extern "C" {

CTXGEN_EXPORT OrtStatus* CreateEpFactories(const char* /*registration_name*/, const OrtApiBase* ort_api_base,
                                           const OrtLogger* /*default_logger*/, OrtEpFactory** factories,
                                           size_t max_factories, size_t* num_factories) {
  *num_factories = 0;
  const OrtApi* ort = ort_api_base->GetApi(ORT_API_VERSION);
  if (ort == nullptr) {
    // Too old to hand out our API version; report through the oldest table every runtime has.
    const std::string message = "ctxgen plugin EP needs ONNX Runtime API version " +
                                std::to_string(ORT_API_VERSION) + " (1.29 or newer); this runtime is " +
                                ort_api_base->GetVersionString();
    return ort_api_base->GetApi(1)->CreateStatus(ORT_FAIL, message.c_str());
  }
  ctxgen::ort_ep::init_api(ort);
  if (max_factories < 1) {
    return ctxgen::ort_ep::make_status(ORT_INVALID_ARGUMENT, "ctxgen plugin EP: no room for its EP factory");
  }
  return ctxgen::ort_ep::guarded(ORT_EP_FAIL, [&] {
    ctxgen::ort_ep::backend_runtime();  // made now, so later callbacks cannot fail making it
    factories[0] = new ctxgen::ort_ep::CtxgenEpFactory(ctxgen::ort_ep::virtual_devices_allowed());
    *num_factories = 1;
  });
}

CTXGEN_EXPORT OrtStatus* ReleaseEpFactory(OrtEpFactory* factory) {
  delete static_cast<ctxgen::ort_ep::CtxgenEpFactory*>(factory);
  return nullptr;
}

// Test hook, looked up with dlsym: how many context binary files were mapped since the library was
// loaded, and how many of those are still mapped.
CTXGEN_EXPORT void CtxgenOrtEp_GetStats(uint64_t* binaries_opened, uint64_t* binaries_live) {
  const auto stats = ctxgen::ort_ep::BinaryRegistry::instance().stats();
  if (binaries_opened != nullptr) *binaries_opened = stats.opened;
  if (binaries_live != nullptr) *binaries_live = stats.live;
}

}  // extern "C"
