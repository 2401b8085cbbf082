#pragma once
// The full plugin library's SessionCompiler: on an ordinary model, GetCapability runs ctxgen's
// load, specialise and partition stages with the backend (ordinary_graph.h) and Compile lowers the
// partitions ORT fused into a context binary, kept in memory, or, when the session generates an
// EPContext model, written as the CLI writes it (shared across the sessions of a group).

#include <memory>

#include "ctxgen/backend.h"
#include "session_compiler.h"

namespace ctxgen::ort_ep {

std::unique_ptr<SessionCompiler> compile_in_session(std::unique_ptr<Backend> backend, SessionConfig config,
                                                    const OrtLogger* logger);

}  // namespace ctxgen::ort_ep
