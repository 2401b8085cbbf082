#pragma once
// Test artifacts for the ORT interop tests: context binaries written with ctxgen's own writer
// from hand-built ref programs, and the ONNX models tests/ort/make_models.py writes over them.

#include <filesystem>
#include <vector>

namespace ctxgen::ort_test {

// A fresh folder holding (see make_models.py for the models):
//   model_ref.bin       graphs g_add (y = x + W) and g_mm (y = Relu(x @ W2)), x: float[2,3]
//   other_sdk.bin       the same, but claiming another SDK version
//   future_version.bin  the same, with the header's format version raised to 2
//   empty.bin           0 bytes
//   sub/, sub_link/link.bin -> ../model_ref.bin   for the path-escape cases
//   W.raw, W2.raw       the weights, for the plain ONNX twins
// Throws on failure. The caller removes the folder.
std::filesystem::path make_artifacts();

// The x every test feeds: float[2,3].
std::vector<float> test_input();

}  // namespace ctxgen::ort_test
