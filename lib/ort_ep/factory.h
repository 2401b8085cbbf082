#pragma once
// The OrtEpFactory ORT gets from CreateEpFactories: offers the CPU as this EP's device, creates
// one CtxgenEp per session, and judges compiled models' compatibility info.

#include <onnxruntime_c_api.h>

namespace ctxgen::ort_ep {

class CtxgenEpFactory : public OrtEpFactory {
 public:
  // allow_virtual: the environment allows virtual devices (the library was registered under a
  // name ending in ".virtual"): the factory then also offers one, for compiling without the target.
  explicit CtxgenEpFactory(bool allow_virtual);
  ~CtxgenEpFactory();
  CtxgenEpFactory(const CtxgenEpFactory&) = delete;
  CtxgenEpFactory& operator=(const CtxgenEpFactory&) = delete;

 private:
  bool allow_virtual_;
  OrtHardwareDevice* virtual_device_ = nullptr;  // made on the first GetSupportedDevices that may

  static const char* ORT_API_CALL GetNameImpl(const OrtEpFactory* self) noexcept;
  static const char* ORT_API_CALL GetVendorImpl(const OrtEpFactory* self) noexcept;
  static uint32_t ORT_API_CALL GetVendorIdImpl(const OrtEpFactory* self) noexcept;
  static const char* ORT_API_CALL GetVersionImpl(const OrtEpFactory* self) noexcept;
  static OrtStatus* ORT_API_CALL GetSupportedDevicesImpl(OrtEpFactory* self, const OrtHardwareDevice* const* devices,
                                                         size_t num_devices, OrtEpDevice** ep_devices,
                                                         size_t max_ep_devices, size_t* num_ep_devices) noexcept;
  static OrtStatus* ORT_API_CALL CreateEpImpl(OrtEpFactory* self, const OrtHardwareDevice* const* devices,
                                              const OrtKeyValuePairs* const* ep_metadata, size_t num_devices,
                                              const OrtSessionOptions* options, const OrtLogger* logger,
                                              OrtEp** ep) noexcept;
  static void ORT_API_CALL ReleaseEpImpl(OrtEpFactory* self, OrtEp* ep) noexcept;
  static OrtStatus* ORT_API_CALL ValidateCompiledModelCompatibilityInfoImpl(
      OrtEpFactory* self, const OrtHardwareDevice* const* devices, size_t num_devices, const char* info,
      OrtCompiledModelCompatibility* compatibility) noexcept;
  static OrtStatus* ORT_API_CALL CreateAllocatorImpl(OrtEpFactory* self, const OrtMemoryInfo* memory_info,
                                                     const OrtKeyValuePairs* options,
                                                     OrtAllocator** allocator) noexcept;
  static void ORT_API_CALL ReleaseAllocatorImpl(OrtEpFactory* self, OrtAllocator* allocator) noexcept;
  static OrtStatus* ORT_API_CALL CreateDataTransferImpl(OrtEpFactory* self,
                                                        OrtDataTransferImpl** data_transfer) noexcept;
  static bool ORT_API_CALL IsStreamAwareImpl(const OrtEpFactory* self) noexcept;
  static OrtStatus* ORT_API_CALL CreateSyncStreamForDeviceImpl(OrtEpFactory* self, const OrtMemoryDevice* device,
                                                               const OrtKeyValuePairs* options,
                                                               OrtSyncStreamImpl** stream) noexcept;
  static OrtStatus* ORT_API_CALL GetNumCustomOpDomainsImpl(OrtEpFactory* self, size_t* num_domains) noexcept;
  static OrtStatus* ORT_API_CALL GetCustomOpDomainsImpl(OrtEpFactory* self, OrtCustomOpDomain** domains,
                                                        size_t num_domains) noexcept;
  static OrtStatus* ORT_API_CALL SelectBestModelCandidateImpl(OrtEpFactory* self, const OrtHardwareDevice* device,
                                                              const OrtKeyValuePairs* const* candidates,
                                                              size_t num_candidates, const OrtSessionOptions* options,
                                                              size_t* selected_index) noexcept;
};

// How a compiled model's ep_compatibility_info string fits this EP build.
OrtCompiledModelCompatibility judge_compatibility(const char* info);

// Whether the environment lets EP factories create virtual devices (ORT sets allow_virtual_devices
// when a library is registered under a name ending in ".virtual").
bool virtual_devices_allowed();

// Whether `device` is a virtual one (hardware metadata is_virtual = 1).
bool is_virtual(const OrtHardwareDevice* device);

}  // namespace ctxgen::ort_ep
