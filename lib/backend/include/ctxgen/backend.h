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

// What a compile asks of a backend beyond the model.
struct BackendSettings {
  // --target-cpu: compile for this target instead of this machine (for `ref`, a oneDNN CPU level
  // such as "avx2"), writing what a compile on such a machine writes; identity() then names it.
  std::string target;
  // --weightless: binaries refer to the weights a model stores in external data instead of holding
  // them; such a weight is used as stored, never laid out anew in the binary.
  bool weightless = false;
};

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
  // This backend set up for one compile (or one compiling session): the settings travel with the
  // returned backend, never with this one or the process, so compiles with other settings run one
  // after another or at once. Throws Error(kUsage) for settings the backend cannot honour (the
  // base's answer to any but the defaults: refuse_settings).
  virtual std::unique_ptr<Backend> with(const BackendSettings& settings) const = 0;
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
  // How often `program` (numbered by its own weights 0 to weight_count - 1, as the compile cache
  // keeps it) reads each weight: the cache checks an entry with it before using it. Throws Error
  // unless the program is one the backend's runtime accepts. nullopt from a backend that cannot
  // tell, as from one that cannot renumber.
  virtual std::optional<std::vector<uint64_t>> weight_reads(const std::vector<uint8_t>& program, size_t weight_count) const;

 protected:
  // Throws what with() throws for a backend with one target that always holds the weights.
  void refuse_settings(const BackendSettings& settings) const;
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

std::unique_ptr<Backend> make_ref_backend(const BackendSettings& settings = {});

}  // namespace ctxgen
