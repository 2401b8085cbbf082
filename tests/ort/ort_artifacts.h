#pragma once
// Test artifacts for the ORT interop tests: context binaries written with ctxgen's own writer
// from hand-built ref programs, and the ONNX models tests/ort/make_models.py writes over them.

#include <filesystem>
#include <string>
#include <vector>

namespace ctxgen::ort_test {

// Fills `folder` (existing, empty) with (see make_models.py for the models):
//   model_ref.bin       graphs g_add (y = x + W), g_mm (y = Relu(x @ W2)), x: float[2,3], and
//                       g_pair (s = a + b, r = Relu(a))
//   other_sdk.bin       the same, but claiming another SDK version
//   other_cpu.bin       the same, but packed for another CPU level (kOtherCpu)
//   future_version.bin  the same, with the header's format version one above this build's
//   empty.bin           0 bytes
//   sub/, sub_link/link.bin -> ../model_ref.bin   for the path-escape cases
//   W.raw, W2.raw       the weights, for the plain ONNX twins
// Throws on failure.
void make_artifacts(const std::filesystem::path& folder);

// A CPU level other than any this machine runs: weights packed for it are refused here.
inline constexpr const char* kOtherCpu = "x86_64 avx512_core_amx, oneDNN 9.9.9";

// The ep_compatibility_info this build's EP writes and accepts: format version and identity.
std::string compatibility_info();

// The x every test feeds: float[2,3].
std::vector<float> test_input();

}  // namespace ctxgen::ort_test
