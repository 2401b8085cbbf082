#pragma once
// The backend a plugin EP library serves: one per library. The EP code here is the same for every
// backend; a backend's plugin library adds one file defining make_backend_runtime() (the `ref`
// backend's is ref_plugin.cc), and CreateEpFactories makes that runtime once, before ORT can ask
// the library anything else (docs/adding-a-backend.md).

#include <memory>

#include "ctxgen/backend_runtime.h"

namespace ctxgen::ort_ep {

// Defined by each plugin library, once.
std::unique_ptr<BackendRuntime> make_backend_runtime();

// The runtime made in CreateEpFactories, and its identity: the EP's name (`source` of the
// EPContext nodes it claims), and what it requires of nodes and binaries.
const BackendRuntime& backend_runtime();
const BinaryIdentity& backend_identity();

}  // namespace ctxgen::ort_ep
