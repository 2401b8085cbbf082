#pragma once
// The runtime half of a backend, as the hosts that run context binaries see it: the ONNX Runtime
// plugin EP (lib/ort_ep) and `ctxgen verify` ask a BackendRuntime which binaries it runs and for
// a graph of one made ready to run, and never name a backend themselves. The `ref` backend's is
// runtime::make_ref_runtime(); docs/adding-a-backend.md says what another backend implements.

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ctxgen/format.h"

namespace ctxgen {

// Runs body(0) ... body(tasks - 1), on the caller's threads, and returns when all have: how a
// host (ONNX Runtime's intra-op pool) lends a runtime its threads. Empty: one thread.
using ParallelFor = std::function<void(size_t tasks, const std::function<void(size_t task)>& body)>;

// One graph of a context binary, ready to run; it keeps the binary alive. May run from several
// threads at once.
class GraphRunner {
 public:
  virtual ~GraphRunner() = default;
  virtual const GraphRecord& graph() const = 0;
  // inputs[i] / outputs[i] point at dense buffers of the sizes in the graph signature. Throws
  // Error(kRuntime) when a run fails (a bad index in the data ...).
  virtual void run(const std::vector<const void*>& inputs, const std::vector<void*>& outputs,
                   const ParallelFor& parallel) const = 0;
};

class BackendRuntime {
 public:
  virtual ~BackendRuntime() = default;
  // The identity a binary must carry for this runtime to run it; the same value the backend's
  // compiler writes (Backend::identity).
  virtual BinaryIdentity identity() const = 0;
  // Throws Error(kInvalidBinary) when the graph is missing or cannot run here.
  virtual std::unique_ptr<GraphRunner> load(std::shared_ptr<const ContextBinary> binary,
                                            const std::string& graph_name) const = 0;
};

}  // namespace ctxgen
