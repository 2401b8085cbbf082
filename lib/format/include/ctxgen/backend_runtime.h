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

// How a runtime runs a binary: as well as one compiled on this machine; correctly but slower than
// one compiled for it would (packed for an older CPU level, say); or not at all.
enum class Fit { kOptimal, kRuns, kUnsupported };
struct Judgement {
  Fit fit = Fit::kUnsupported;
  std::string why;  // for kRuns and kUnsupported: which field, its value and this runtime's
};

// The identity fields of `binary` against `ours`, the first that differs named with both values
// (hardware_architecture only when `hardware`: a runtime that judges CPU levels does that itself).
Judgement judge_fields(const BinaryIdentity& binary, const BinaryIdentity& ours, bool hardware);

class BackendRuntime {
 public:
  virtual ~BackendRuntime() = default;
  // The identity of the binaries this runtime runs best; the same value the backend's compiler
  // writes on this machine (Backend::identity).
  virtual BinaryIdentity identity() const = 0;
  // Whether this runtime runs binaries of `binary`'s identity. By default only identity()'s run.
  virtual Judgement judge(const BinaryIdentity& binary) const;
  // Throws Error(kInvalidBinary) when the graph is missing or cannot run here.
  virtual std::unique_ptr<GraphRunner> load(std::shared_ptr<const ContextBinary> binary,
                                            const std::string& graph_name) const = 0;
};

}  // namespace ctxgen
