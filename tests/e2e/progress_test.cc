// Progress on long work: per stage and model on stderr, redrawn in place on a terminal, plain
// lines otherwise, nothing with -q; verify shows each model's results as they are known.
#include "e2e.h"

namespace ctxgen::testing {
namespace {

std::string pair_args(const fs::path& out) {
  return quote(generated_models() / "share/full/prefill.onnx") + "," + quote(generated_models() / "share/full/decode.onnx") +
         " --output-dir " + quote(out);
}

TEST(Progress, PlainLinesPerStageAndModelWhenNotATerminal) {
  TempDir dir;
  auto r = ctxgen("share " + pair_args(dir / "out"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const size_t first = r.output.find("[1/2] load "), second = r.output.find("[2/2] load ");
  ASSERT_NE(first, std::string::npos) << r.output;
  ASSERT_NE(second, std::string::npos) << r.output;
  EXPECT_LT(first, second);
  EXPECT_NE(r.output.find("[2/2] compile "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("write context binary " + (dir / "out" / "prefill_ref.bin").string() + ": "),
            std::string::npos) << r.output;
  EXPECT_NE(r.output.find("[2/2] write models " + (dir / "out" / "decode_ctx.onnx").string()), std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find('\r'), std::string::npos) << "no redrawing when not a terminal";

  auto quiet = ctxgen("share " + pair_args(dir / "quiet") + " -q");
  ASSERT_EQ(quiet.exit_code, 0) << quiet.output;
  EXPECT_EQ(quiet.output, "") << "-q silences progress and the summary";
}

TEST(Progress, RedrawnInPlaceOnATerminalAndClearedBeforeResults) {
  TempDir dir;
  // script(1) gives the run a terminal.
  auto r = run_command("script -qec " +
                       quote(std::string(CTXGEN_BINARY) + " compile " + quote(generated_models() / "cnn.onnx") +
                             " --output-dir " + quote(dir / "out")) +
                       " /dev/null");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("\r\033[K[1/1] load "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("\r\033[K[1/1] compile "), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("\n[1/1]"), std::string::npos) << "stages share one line";
  EXPECT_NE(r.output.find("\r\033[K" + (generated_models() / "cnn.onnx").string() + ": 10 of 10 nodes"),
            std::string::npos)
      << "the line is cleared before the summary\n" << r.output;
}

TEST(Progress, BytesOfALargeWeightAsItIsHashedAndWritten) {
  TempDir dir;
  // One 80 MiB weight: the context binary passes the 64 MiB reporting step once.
  write_file(dir / "big.py",
             "import numpy as np, onnx\n"
             "from onnx import helper, numpy_helper, TensorProto\n"
             "n = 20 * 1024 * 1024\n"
             "w = numpy_helper.from_array(np.arange(n, dtype=np.float32).reshape(1, n), 'w')\n"
             "x = helper.make_tensor_value_info('x', TensorProto.FLOAT, [1, n])\n"
             "y = helper.make_tensor_value_info('y', TensorProto.FLOAT, [1, n])\n"
             "g = helper.make_graph([helper.make_node('Add', ['x', 'w'], ['y'])], 'big', [x], [y], [w])\n"
             "onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid('', 17)]), 'big.onnx')\n");
  auto gen = run_command("cd " + quote(dir.path()) + " && " + CTXGEN_PYTHON + " big.py");
  ASSERT_EQ(gen.exit_code, 0) << gen.output;
  auto r = ctxgen("compile " + quote(dir / "big.onnx"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // Compiling hashes the weight first: bytes hashed of the model's total, model 1 of 1.
  EXPECT_NE(r.output.find("[1/1] compile " + (dir / "big.onnx").string() + ": 80.0 MiB of 80.0 MiB (100%)"),
            std::string::npos)
      << r.output;
  const std::string bin = (dir / "big_ref.bin").string();
  EXPECT_NE(r.output.find("write context binary " + bin + ": 64.0 MiB of 80."), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("write context binary " + bin + ": 80."), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("(100%)"), std::string::npos) << r.output;
}

TEST(Progress, VerifyShowsEachModelsResultsAsTheyAreKnown) {
  TempDir dir;
  ASSERT_EQ(ctxgen("share " + pair_args(dir.path())).exit_code, 0);
  auto r = ctxgen("verify " + quote(dir / "prefill_ctx.onnx") + " " + quote(dir / "decode_ctx.onnx") + " --reference " +
                  quote(generated_models() / "share/full/prefill.onnx") + " " +
                  quote(generated_models() / "share/full/decode.onnx"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const size_t prefill_result = r.output.find("ok    " + (dir / "prefill_ctx.onnx").string() + ": output");
  const size_t decode_step = r.output.find("checking " + (dir / "decode_ctx.onnx").string());
  ASSERT_NE(prefill_result, std::string::npos) << r.output;
  ASSERT_NE(decode_step, std::string::npos) << r.output;
  EXPECT_LT(prefill_result, decode_step) << "the first model's results come before the second is checked";
}

}  // namespace
}  // namespace ctxgen::testing
