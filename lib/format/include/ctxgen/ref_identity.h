#pragma once
// The identity of the `ref` backend, fixed in one place: the compiler writes it into EPContext
// nodes and context binaries, the plugin EP checks it when loading them.

namespace ctxgen::ref {

inline constexpr const char* kBackendName = "ref";        // -e ref, <stem>_ref.bin
inline constexpr const char* kEpName = "CtxgenRef";       // EPContext `source`, ORT EP name
inline constexpr const char* kSdkVersion = "ctxgen-ref 2.0";
inline constexpr const char* kHardwareArchitecture = "cpu-reference";

}  // namespace ctxgen::ref
