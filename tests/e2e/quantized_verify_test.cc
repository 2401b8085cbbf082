// The quantized and half-precision variants of the test models (testdata/quantized, laid out as
// ONNX Runtime's tools lay them out): each compiles whole into one partition, its .bin holds the
// weights at their stored precision, and it matches ONNX Runtime's CPU run of the original.

#include <nlohmann/json.hpp>

#include "e2e.h"

namespace ctxgen::testing {
namespace {

const fs::path kQuantized = fs::path(CTXGEN_SOURCE_DIR) / "testdata" / "quantized";

struct Group {
  std::vector<std::string> models;  // stems in testdata/quantized
  std::string shapes;
  // Said by a float32 verify that failed an output and passed it against float64 (ONNX Runtime's
  // fused 8-bit kernels, or its float16 run, further from exact arithmetic than the compiled
  // model); empty: none.
  std::string rejudged = "";
};

class Quantized : public ::testing::TestWithParam<Group> {};

TEST_P(Quantized, CompilesWholeAtItsSizeAndMatchesOnnxRuntime) {
  const Group& g = GetParam();
  TempDir dir;
  std::string models, references;
  uint64_t largest = 0;
  for (const auto& m : g.models) {
    models += (models.empty() ? "" : ",") + quote(kQuantized / (m + ".onnx"));
    references += " " + quote(kQuantized / (m + ".onnx"));
    largest = std::max<uint64_t>(largest, fs::file_size(kQuantized / (m + ".onnx")));
  }
  auto r = ctxgen("share " + models + " " + g.shapes + " --output-dir " + quote(dir / "out") + " --report " + quote(dir / "r.json"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto report = nlohmann::json::parse(read_file(dir / "r.json"));
  for (const auto& m : report["models"]) {
    EXPECT_EQ(m["nodes_compiled"], m["nodes"]) << m.dump(2);
    EXPECT_EQ(m["partitions"].size(), 1u) << m.dump(2);
  }
  // Every output together, the shared .bin included, is no larger than the largest model: the
  // weights stay integers (or packed 4-bit values) and the pair holds each once.
  uint64_t outputs = 0;
  for (const auto& f : files_in(dir / "out")) outputs += fs::file_size(dir / "out" / f);
  EXPECT_LE(static_cast<double>(outputs), 1.10 * static_cast<double>(largest)) << outputs << " bytes of outputs";
  std::string compiled;
  for (const auto& m : g.models) compiled += " " + quote(dir / "out" / (m + "_ctx.onnx"));
  for (const std::string precision : {"float32", "float64"}) {
    auto v = ctxgen("verify" + compiled + " --reference" + references + " --reference-precision " + precision);
    EXPECT_EQ(v.exit_code, 0) << v.output;
    EXPECT_EQ(v.output.find("FAIL"), std::string::npos) << v.output;
    EXPECT_EQ(v.output.find("no float64 run"), std::string::npos) << v.output;
    const bool rejudged = v.output.find("after the float32 run failed it") != std::string::npos;
    EXPECT_EQ(rejudged, precision == "float32" && !g.rejudged.empty()) << v.output;
    if (rejudged) {
      EXPECT_NE(v.output.find(g.rejudged), std::string::npos) << v.output;
    }
  }
}

Group decoders(const std::string& variant, const std::string& rejudged = "") {
  std::string shapes = "--fix-dim batch=1";
  shapes += " --fix-dim decoder_prefill_" + variant + ":seq=16";
  shapes += " --fix-dim decoder_decode_" + variant + ":seq=1 --fix-dim decoder_decode_" + variant + ":past=15";
  return {{"decoder_prefill_" + variant, "decoder_decode_" + variant}, shapes, rejudged};
}

INSTANTIATE_TEST_SUITE_P(Variants, Quantized,
                         ::testing::Values(Group{{"cnn_upsample_qdq_u8s8"}, "--fix-dim batch=1"},
                                           Group{{"cnn_upsample_qdq_a16w8"}, "--fix-dim batch=1"},
                                           Group{{"cnn_upsample_fp16"}, "--fix-dim batch=1", "output 'logits' [1x10] against the float64"},
                                           Group{{"cnn_upsample_qop"}, "--fix-dim batch=1"},
                                           decoders("qdq_u8s8", "output 'logits' [1x1x256] against the float64"), decoders("qdq_a16w8"), decoders("matmulnbits"), decoders("fp16"), decoders("qop"),
                                           // ONNX Runtime fuses each DequantizeLinear and MatMul into a MatMulNBits
                                           // that computes with 8-bit A (further from exact than the compiled model).
                                           decoders("qdq_int4", "output 'logits' [1x16x256] against the float64")),
                         [](const ::testing::TestParamInfo<Group>& info) { return info.param.models[0]; });

}  // namespace
}  // namespace ctxgen::testing
