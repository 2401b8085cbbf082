#pragma once
// One compiled node (an EPContext node, or a partition compiled in the session) as ORT sees it: an OrtNodeComputeInfo whose Compute feeds the
// kernel context's tensors to a graph of the backend's runtime.

#include <onnxruntime_c_api.h>

#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "ctxgen/backend_runtime.h"

namespace ctxgen::ort_ep {

class CompiledNode : public OrtNodeComputeInfo {
 public:
  // The fused node ORT made for the EPContext node may order or drop values differently (it
  // dedups repeated inputs and omits outputs nobody reads), so values are matched by name:
  // `input_slots[i]` is the kernel input feeding graph input i (then one per fixed input, whose
  // value a run must feed exactly as compiled), `output_slots[i]` the kernel
  // output for graph output i, or nullopt when ORT does not want it.
  // cannot_run: why a run must fail instead (a virtual device, a compile-only session); the
  // executable may then be null. Empty for a node that runs.
  CompiledNode(std::string node_name, std::shared_ptr<const GraphRunner> executable,
               std::vector<size_t> input_slots, std::vector<std::optional<size_t>> output_slots,
               std::string cannot_run);
  ~CompiledNode();

 private:
  struct RunBuffers;
  void compute(OrtKernelContext* context) const;
  void run(OrtKernelContext* context, RunBuffers& buffers) const;
  void check_fixed_inputs(OrtKernelContext* context, std::vector<int64_t>& dims) const;

  static OrtStatus* ORT_API_CALL CreateStateImpl(OrtNodeComputeInfo* self, OrtNodeComputeContext* context,
                                                 void** state) noexcept;
  static OrtStatus* ORT_API_CALL ComputeImpl(OrtNodeComputeInfo* self, void* state,
                                             OrtKernelContext* context) noexcept;
  static void ORT_API_CALL ReleaseStateImpl(OrtNodeComputeInfo* self, void* state) noexcept;

  std::string node_name_;
  std::shared_ptr<const GraphRunner> executable_;
  std::vector<size_t> input_slots_;
  std::vector<std::optional<size_t>> output_slots_;
  std::string cannot_run_;
  mutable std::mutex buffers_mutex_;
  mutable std::vector<std::unique_ptr<RunBuffers>> free_buffers_;
};

// Slot of each of `wanted` among `available` by value name, for the mapping above. Throws
// Error(kInternal) naming `node` when a wanted value is not available and `required`.
std::vector<std::optional<size_t>> match_by_name(const std::string& node, const char* direction,
                                                 const std::vector<std::string>& wanted,
                                                 const std::vector<std::string>& available, bool required);
// The same for inputs, which must all come from somewhere: every slot is required.
std::vector<size_t> required_slots(const std::string& node, const std::vector<std::string>& wanted,
                                   const std::vector<std::string>& available);
// The names of ORT's values, empty for a missing optional one.
std::vector<std::string> value_names(const std::vector<const OrtValueInfo*>& values);

}  // namespace ctxgen::ort_ep
