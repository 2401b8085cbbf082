#pragma once
// One error type for the whole library: a code that maps to a documented exit code
// (docs/cli.md) and a message that says what is wrong and where.

#include <stdexcept>
#include <string>

namespace ctxgen {

enum class ErrorCode : int {
  kInternal = 1,         // a bug in ctxgen
  kUsage = 2,            // bad command line or option value
  kInvalidModel = 3,     // input model missing, unreadable, malformed or with bad external data
  kNothingCompiled = 4,  // no node could be assigned to the backend (see --allow-empty)
  kOutputExists = 5,     // an output file exists and --force was not given
  kIo = 6,               // writing outputs failed
  kInvalidBinary = 7,    // a context binary is damaged, truncated or of another version
  kMismatch = 8,         // verify: outputs differ beyond tolerance, or integrity check failed
  kRuntime = 9,          // ONNX Runtime or the plugin EP failed to load or run a model
};

class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message) : std::runtime_error(message), code_(code) {}
  ErrorCode code() const { return code_; }
  // The same error with `where` prepended, so callers add context as the error travels up:
  // "model.onnx: node 'conv_3' (Conv): weight 'w' ...".
  Error within(const std::string& where) const { return Error(code_, where + ": " + what()); }

 private:
  ErrorCode code_;
};

// Exit code for an error code; 0 is success.
inline int exit_code(ErrorCode code) { return static_cast<int>(code); }

// The code's name in reports ("invalid_model"), stable across versions like the exit code.
inline const char* error_code_name(ErrorCode code) {
  switch (code) {
    case ErrorCode::kInternal: return "internal";
    case ErrorCode::kUsage: return "usage";
    case ErrorCode::kInvalidModel: return "invalid_model";
    case ErrorCode::kNothingCompiled: return "nothing_compiled";
    case ErrorCode::kOutputExists: return "output_exists";
    case ErrorCode::kIo: return "io";
    case ErrorCode::kInvalidBinary: return "invalid_binary";
    case ErrorCode::kMismatch: return "mismatch";
    case ErrorCode::kRuntime: return "runtime";
  }
  return "internal";
}

}  // namespace ctxgen
