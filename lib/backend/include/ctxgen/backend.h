#pragma once
// Stage 3, compile: the interface a target backend implements, and the registry that lists them.
// Adding a backend (a vendor SDK) means implementing Backend and registering it; the pipeline does
// not change.

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ctxgen/compiled.h"
#include "ctxgen/format.h"
#include "ctxgen/model.h"
#include "ctxgen/partition.h"
#include "ctxgen/weights.h"

namespace ctxgen {

class Backend {
 public:
  virtual ~Backend() = default;
  // Short name used on the command line (-e) and in file names (<stem>_<name>.bin).
  virtual std::string name() const = 0;
  // Who makes this backend's binaries, in one value: its EP name (the EPContext `source`
  // attribute and the name ONNX Runtime knows its plugin EP by), SDK version, hardware
  // architecture and context-binary format version. Written into every binary and EPContext node;
  // the backend's runtime (ctxgen/backend_runtime.h) runs only binaries carrying the same.
  virtual BinaryIdentity identity() const = 0;
  virtual std::string description() const = 0;
  // Compiles for `target` instead of this machine (for `ref`, a oneDNN CPU level such as "avx2"),
  // writing what a compile on such a machine writes; from then on identity() names it. Called
  // before anything else of the backend. Throws Error(kUsage) for a target it cannot compile for.
  virtual void target(const std::string& target) const;

  // With `on`, compiles binaries that refer to the weights a model stores in external data instead
  // of holding them (--weightless): such a weight is used as stored, never laid out anew in the
  // binary. Said before the compile() calls of each run. Throws Error(kUsage) when the backend cannot.
  virtual void weightless(bool on) const;
  // May this node run on the backend? Called for main-graph nodes only, after shape inference.
  virtual NodeSupport supports(const Model& model, const onnx::NodeProto& node) const = 0;
  // Lowers a partition. Weight bytes (after transforms) are interned in `store`.
  virtual CompiledGraph compile(const Model& model, const Partition& partition,
                                const std::string& graph_name, WeightStore& store) const = 0;
  // `program` (one compile() returned) with each weight id w replaced by id_of(w): the compile
  // cache keeps a program numbered by its own weights and renumbers it into each run's store.
  // nullopt from a backend that cannot: its partitions are never cached.
  virtual std::optional<std::vector<uint8_t>> renumber_weights(const std::vector<uint8_t>& program,
                                                               const std::function<uint32_t(uint32_t)>& id_of) const;
};

class BackendRegistry {
 public:
  void add(std::unique_ptr<Backend> backend);
  const Backend* find(const std::string& name) const;  // nullptr when unknown
  std::vector<const Backend*> list() const;

 private:
  std::vector<std::unique_ptr<Backend>> backends_;
};

// A registry holding every backend built into ctxgen.
BackendRegistry builtin_backends();

std::unique_ptr<Backend> make_ref_backend();

}  // namespace ctxgen
