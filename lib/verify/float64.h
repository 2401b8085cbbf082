#pragma once
// The original model with its float tensors widened to float64, for a reference that float32
// rounding does not blur: a compiled model whose error against it is that of ONNX Runtime's own
// float32 run is rounding differently; one with a far larger error computes something else.

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <onnxruntime_cxx_api.h>

namespace ctxgen::verify {

class OrtHost;
struct Tensor;

// A float tensor as float64; other tensors as they are.
Tensor widened(const Tensor& tensor);

struct Float64Reference {
  Ort::Session session{nullptr};
  // Op types kept in float32, with casts around them, because ONNX Runtime's CPU EP has no
  // float64 kernel for them (or their schema allows no double).
  std::vector<std::string> float32_ops;
};

// The original widened, loaded on the CPU EP. Nodes ONNX Runtime refuses in float64 keep float32,
// op type by op type. Returns nullopt, with `why`, when it still cannot load the model (a node in
// a subgraph refuses, say): the caller falls back to the float32 reference and says so.
std::optional<Float64Reference> float64_reference(const std::filesystem::path& original, OrtHost& host, std::string& why);

}  // namespace ctxgen::verify
