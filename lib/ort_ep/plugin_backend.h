#pragma once
// The backend a plugin EP library serves: one per library. The EP code here is the same for every
// backend; a backend's plugin library adds one file defining make_backend_runtime() and
// make_session_compiler() (session_compiler.h; the `ref` backend's are ref_plugin.cc and, for the
// runtime-only library, ref_runtime_plugin.cc). The first CreateEpFactories makes the runtime,
// before ORT can ask the library anything else; it lives as long as the process
// (docs/adding-a-backend.md).

#include <memory>
#include <string>

#include "ctxgen/backend_runtime.h"

namespace ctxgen::ort_ep {

// Defined by each plugin library, once: the runtime that runs context binaries.
std::unique_ptr<BackendRuntime> make_backend_runtime();

// The runtime made in CreateEpFactories, and its identity: the EP's name (`source` of the
// EPContext nodes it claims), and what it requires of nodes and binaries.
const BackendRuntime& backend_runtime();
const BinaryIdentity& backend_identity();
// The string ORT stores as ep_compatibility_info.<EP> in compiled models and later hands to
// ValidateCompiledModelCompatibilityInfo: context-binary format version plus identity.
const std::string& compatibility_info();

}  // namespace ctxgen::ort_ep
