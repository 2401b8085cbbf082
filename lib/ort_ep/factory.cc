#include "factory.h"

#include <cstdint>
#include <cstdlib>
#include <string>

#include <onnxruntime_env_config_keys.h>
#include <onnxruntime_ep_device_ep_metadata_keys.h>

#include "ep.h"
#include "ep_context.h"
#include "ort_api.h"
#include "plugin_backend.h"

namespace ctxgen::ort_ep {
namespace {

constexpr const char* kVendor = "ctxgen";
// No PCI vendor stands behind a software EP.
constexpr uint32_t kVendorId = 0;
constexpr const char* kVersion = "0.1.0";

// How a candidate (a set of compiled models) runs here: as its least fitting model does.
OrtCompiledModelCompatibility candidate_fit(const OrtKeyValuePairs* candidate) {
  const char* count_text = api().ort->GetKeyValue(candidate, "num_models");
  const long count = count_text == nullptr ? 0 : std::strtol(count_text, nullptr, 10);
  if (count < 1) return OrtCompiledModelCompatibility_EP_UNSUPPORTED;
  OrtCompiledModelCompatibility fit = OrtCompiledModelCompatibility_EP_SUPPORTED_OPTIMAL;
  for (long i = 0; i < count; ++i) {
    const std::string key = std::to_string(i) + ".ep_compatibility_info";
    const OrtCompiledModelCompatibility model = judge_compatibility(api().ort->GetKeyValue(candidate, key.c_str()));
    if (model == OrtCompiledModelCompatibility_EP_SUPPORTED_PREFER_RECOMPILATION) fit = model;
    else if (model != OrtCompiledModelCompatibility_EP_SUPPORTED_OPTIMAL) return OrtCompiledModelCompatibility_EP_UNSUPPORTED;
  }
  return fit;
}

}  // namespace

OrtCompiledModelCompatibility judge_compatibility(const char* info) {
  if (info == nullptr || *info == '\0') return OrtCompiledModelCompatibility_EP_NOT_APPLICABLE;
  // Another format version, backend or SDK is refused on load: unsupported. Weights packed for a
  // lower CPU level run, slower than they would packed for this one: worth recompiling.
  const std::optional<BinaryIdentity> recorded = parse_compatibility_info(info);
  switch (recorded ? backend_runtime().judge(*recorded).fit : Fit::kUnsupported) {
    case Fit::kOptimal: return OrtCompiledModelCompatibility_EP_SUPPORTED_OPTIMAL;
    case Fit::kRuns: return OrtCompiledModelCompatibility_EP_SUPPORTED_PREFER_RECOMPILATION;
    case Fit::kUnsupported: break;
  }
  return OrtCompiledModelCompatibility_EP_UNSUPPORTED;
}

bool virtual_devices_allowed() {
  OrtKeyValuePairs* entries = nullptr;
  // Without the entries, no virtual device: the real one still serves.
  if (OrtStatus* status = api().ep->GetEnvConfigEntries(&entries)) {
    api().ort->ReleaseStatus(status);
    return false;
  }
  const char* value = api().ort->GetKeyValue(entries, kOrtEnvAllowVirtualDevices);
  const bool allowed = value != nullptr && std::string(value) == "1";
  api().ort->ReleaseKeyValuePairs(entries);
  return allowed;
}

bool is_virtual(const OrtHardwareDevice* device) {
  const OrtKeyValuePairs* metadata = api().ort->HardwareDevice_Metadata(device);
  const char* value = metadata == nullptr ? nullptr : api().ort->GetKeyValue(metadata, kOrtHardwareDevice_MetadataKey_IsVirtual);
  return value != nullptr && std::string(value) == "1";
}

CtxgenEpFactory::CtxgenEpFactory(bool allow_virtual) : OrtEpFactory{}, allow_virtual_(allow_virtual) {
  ort_version_supported = ORT_API_VERSION;
  GetName = GetNameImpl;
  GetVendor = GetVendorImpl;
  GetSupportedDevices = GetSupportedDevicesImpl;
  CreateEp = CreateEpImpl;
  ReleaseEp = ReleaseEpImpl;
  GetVendorId = GetVendorIdImpl;
  GetVersion = GetVersionImpl;
  ValidateCompiledModelCompatibilityInfo = ValidateCompiledModelCompatibilityInfoImpl;
  CreateAllocator = CreateAllocatorImpl;
  ReleaseAllocator = ReleaseAllocatorImpl;
  CreateDataTransfer = CreateDataTransferImpl;
  IsStreamAware = IsStreamAwareImpl;
  CreateSyncStreamForDevice = CreateSyncStreamForDeviceImpl;
  GetNumCustomOpDomains = GetNumCustomOpDomainsImpl;
  GetCustomOpDomains = GetCustomOpDomainsImpl;
  SelectBestModelCandidate = SelectBestModelCandidateImpl;
  // Optional members this EP has no use for stay null, as the header allows:
  // GetHardwareDeviceIncompatibilityDetails, CreateExternalResourceImporterForDevice,
  // InitGraphicsInterop, DeinitGraphicsInterop.
}

CtxgenEpFactory::~CtxgenEpFactory() {
  if (virtual_device_ != nullptr) api().ep->ReleaseHardwareDevice(virtual_device_);
}

const char* ORT_API_CALL CtxgenEpFactory::GetNameImpl(const OrtEpFactory*) noexcept {
  return backend_identity().backend.c_str();
}

const char* ORT_API_CALL CtxgenEpFactory::GetVendorImpl(const OrtEpFactory*) noexcept { return kVendor; }

uint32_t ORT_API_CALL CtxgenEpFactory::GetVendorIdImpl(const OrtEpFactory*) noexcept { return kVendorId; }

const char* ORT_API_CALL CtxgenEpFactory::GetVersionImpl(const OrtEpFactory*) noexcept { return kVersion; }

OrtStatus* ORT_API_CALL CtxgenEpFactory::GetSupportedDevicesImpl(OrtEpFactory* self,
                                                                 const OrtHardwareDevice* const* devices,
                                                                 size_t num_devices, OrtEpDevice** ep_devices,
                                                                 size_t max_ep_devices,
                                                                 size_t* num_ep_devices) noexcept {
  *num_ep_devices = 0;
  // ctxgen's runtimes run their programs on the host CPU.
  for (size_t i = 0; i < num_devices && *num_ep_devices < max_ep_devices; ++i) {
    if (api().ort->HardwareDevice_Type(devices[i]) != OrtHardwareDeviceType_CPU) continue;
    OrtEpDevice* device = nullptr;
    // What GetWeightlessSupport answers, told before a session exists.
    static const bool compiles = make_session_compiler(SessionConfig{}, nullptr) != nullptr;
    OrtKeyValuePairs* metadata = nullptr;
    api().ort->CreateKeyValuePairs(&metadata);
    api().ort->AddKeyValuePair(metadata, kOrtEpDevice_EpMetadataKey_WeightlessSupport, compiles ? "external_only" : "none");
    OrtStatus* status = api().ep->CreateEpDevice(self, devices[i], metadata, nullptr, &device);
    api().ort->ReleaseKeyValuePairs(metadata);  // ORT keeps a copy
    if (status != nullptr) return status;
    ep_devices[(*num_ep_devices)++] = device;
  }
  // A device standing for a target this machine does not have, to compile for it (cross-compiling);
  // a session on it loads models but does not run them.
  auto* factory = static_cast<CtxgenEpFactory*>(self);
  if (factory->allow_virtual_ && *num_ep_devices < max_ep_devices) {
    if (factory->virtual_device_ == nullptr) {
      OrtKeyValuePairs* metadata = nullptr;
      api().ort->CreateKeyValuePairs(&metadata);
      api().ort->AddKeyValuePair(metadata, kOrtHardwareDevice_MetadataKey_IsVirtual, "1");
      OrtStatus* status = api().ep->CreateHardwareDevice(OrtHardwareDeviceType_CPU, kVendorId, 0, kVendor, metadata,
                                                         &factory->virtual_device_);
      api().ort->ReleaseKeyValuePairs(metadata);  // ORT keeps a copy
      if (status != nullptr) return status;
    }
    OrtEpDevice* device = nullptr;
    if (OrtStatus* status = api().ep->CreateEpDevice(self, factory->virtual_device_, nullptr, nullptr, &device))
      return status;
    ep_devices[(*num_ep_devices)++] = device;
  }
  return nullptr;
}

OrtStatus* ORT_API_CALL CtxgenEpFactory::CreateEpImpl(OrtEpFactory*, const OrtHardwareDevice* const* devices,
                                                      const OrtKeyValuePairs* const*, size_t num_devices,
                                                      const OrtSessionOptions* options, const OrtLogger* logger,
                                                      OrtEp** ep) noexcept {
  *ep = nullptr;
  return guarded(ORT_EP_FAIL, [&] {
    SessionConfig config = SessionConfig::read(options);
    // Virtual only when no real device serves the session too.
    config.virtual_device = num_devices > 0;
    for (size_t i = 0; i < num_devices; ++i) config.virtual_device = config.virtual_device && is_virtual(devices[i]);
    *ep = new CtxgenEp(std::move(config), logger);
  });
}

void ORT_API_CALL CtxgenEpFactory::ReleaseEpImpl(OrtEpFactory*, OrtEp* ep) noexcept {
  delete static_cast<CtxgenEp*>(ep);
}

OrtStatus* ORT_API_CALL CtxgenEpFactory::ValidateCompiledModelCompatibilityInfoImpl(
    OrtEpFactory*, const OrtHardwareDevice* const*, size_t, const char* info,
    OrtCompiledModelCompatibility* compatibility) noexcept {
  *compatibility = judge_compatibility(info);
  return nullptr;
}

OrtStatus* ORT_API_CALL CtxgenEpFactory::CreateAllocatorImpl(OrtEpFactory*, const OrtMemoryInfo*,
                                                             const OrtKeyValuePairs*,
                                                             OrtAllocator** allocator) noexcept {
  *allocator = nullptr;  // ORT's default CPU allocator serves this EP
  return nullptr;
}

void ORT_API_CALL CtxgenEpFactory::ReleaseAllocatorImpl(OrtEpFactory*, OrtAllocator*) noexcept {}

OrtStatus* ORT_API_CALL CtxgenEpFactory::CreateDataTransferImpl(OrtEpFactory*,
                                                                OrtDataTransferImpl** data_transfer) noexcept {
  *data_transfer = nullptr;  // all data stays in CPU memory
  return nullptr;
}

bool ORT_API_CALL CtxgenEpFactory::IsStreamAwareImpl(const OrtEpFactory*) noexcept { return false; }

OrtStatus* ORT_API_CALL CtxgenEpFactory::CreateSyncStreamForDeviceImpl(OrtEpFactory*, const OrtMemoryDevice*,
                                                                       const OrtKeyValuePairs*,
                                                                       OrtSyncStreamImpl** stream) noexcept {
  *stream = nullptr;
  return nullptr;
}

OrtStatus* ORT_API_CALL CtxgenEpFactory::GetNumCustomOpDomainsImpl(OrtEpFactory*, size_t* num_domains) noexcept {
  // EPContext is an ORT contrib op; no schema of ours is needed.
  *num_domains = 0;
  return nullptr;
}

OrtStatus* ORT_API_CALL CtxgenEpFactory::GetCustomOpDomainsImpl(OrtEpFactory*, OrtCustomOpDomain**,
                                                                size_t) noexcept {
  return nullptr;
}

OrtStatus* ORT_API_CALL CtxgenEpFactory::SelectBestModelCandidateImpl(OrtEpFactory*, const OrtHardwareDevice*,
                                                                      const OrtKeyValuePairs* const* candidates,
                                                                      size_t num_candidates,
                                                                      const OrtSessionOptions*,
                                                                      size_t* selected_index) noexcept {
  // The first that runs as well as it can here, else the first that runs at all.
  *selected_index = SIZE_MAX;
  for (size_t i = 0; i < num_candidates; ++i) {
    const OrtCompiledModelCompatibility fit = candidate_fit(candidates[i]);
    if (fit == OrtCompiledModelCompatibility_EP_SUPPORTED_OPTIMAL) {
      *selected_index = i;
      break;
    }
    if (fit == OrtCompiledModelCompatibility_EP_SUPPORTED_PREFER_RECOMPILATION && *selected_index == SIZE_MAX)
      *selected_index = i;
  }
  return nullptr;
}

}  // namespace ctxgen::ort_ep
