#pragma once
// ONNX Runtime's Linux release (the npm build ctxgen uses) records every session it creates in an
// SQLite database under ~/.cache/Microsoft/DeveloperTools/.onnxruntime -- some 40 locked writes,
// now and then an fsync, 0.2-0.4 ms a session on the project's machine -- and leaves a
// $TMPDIR/mat-debug-PID.log behind each process. ctxgen's own hosts (verify, --ep-lib compiles, the
// benches, the tests) opt out before they create ONNX Runtime's environment, which is when it reads
// ORT_DISABLE_TELEMETRY. A value the user set is kept. The plugin EP never calls this: the process
// that loads it decides.

#include <cstdlib>

namespace ctxgen {

inline void opt_out_of_ort_telemetry() { setenv("ORT_DISABLE_TELEMETRY", "1", /*overwrite=*/0); }

}  // namespace ctxgen
