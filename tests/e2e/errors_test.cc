// Bad input: a one-line error naming the file and the problem, a documented exit code, and no
// output file left behind.

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>

#include "e2e.h"

namespace ctxgen::testing {
namespace {

struct Outcome {
  int exit_code;
  std::string output;
};

class BadInput : public ::testing::Test {
 protected:
  // Runs ctxgen with `args` (after "compile"), writing into `out_`, and checks nothing was written.
  Outcome fails(const std::string& args, int expected_code, const std::string& expected_text) {
    fs::create_directories(out_);
    auto r = ctxgen("compile " + args + " --output-dir " + quote(out_));
    EXPECT_EQ(r.exit_code, expected_code) << r.output;
    EXPECT_NE(r.output.find(expected_text), std::string::npos) << r.output;
    const std::string said = without_progress(r.output);
    EXPECT_EQ(std::count(said.begin(), said.end(), '\n'), 1) << "one line expected:\n" << r.output;
    EXPECT_TRUE(files_in(out_).empty()) << "outputs left behind";
    return {r.exit_code, r.output};
  }
  TempDir dir_;
  fs::path out_ = dir_ / "out";
};

TEST_F(BadInput, MissingFile) { fails(quote(dir_ / "nope.onnx"), 3, "nope.onnx: no such file"); }

// A mistyped model path is named as such even where its outputs exist already (a newcomer's first
// mistake: `compile testdata/cnn.onx` after an earlier run wrote cnn_ctx.onnx), and they stay.
TEST_F(BadInput, AMissingModelIsNamedBeforeOutputsThatExist) {
  fs::create_directories(out_);
  write_file(out_ / "cnn_ctx.onnx", "earlier");
  auto r = ctxgen("compile " + quote(dir_ / "cnn.onx") + " --output-dir " + quote(out_));
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_NE(r.output.find("cnn.onx: no such file"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("exists already"), std::string::npos) << r.output;
  EXPECT_EQ(read_file(out_ / "cnn_ctx.onnx"), "earlier");
}

// Quantized models whose types ONNX Runtime refuses when it loads them: refused here too (exit 3),
// naming the node and input, instead of compiling them into a model ORT refuses in turn.
TEST_F(BadInput, QuantizedTypesOnnxRuntimeRefuses) {
  write_file(dir_ / "make.py", R"(import sys, numpy as np, onnx
from onnx import helper as h, TensorProto as T, numpy_helper as nh
def save(name, nodes, inits, x, y):
    m = h.make_model(h.make_graph(nodes, name, [x], [y], inits), opset_imports=[h.make_opsetid("", 13)])
    m.ir_version = 8
    onnx.save(m, sys.argv[1] + "/" + name + ".onnx")
f = lambda name, dims: h.make_tensor_value_info(name, T.FLOAT, dims)
s = nh.from_array(np.array(0.1, np.float32), "s")
save("zp_int32", [h.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]), h.make_node("DequantizeLinear", ["q", "s", "z"], ["y"])],
     [s, nh.from_array(np.array(3, np.int32), "z")], f("x", [1, 4]), f("y", [1, 4]))
save("zp_uint16", [h.make_node("QuantizeLinear", ["x", "s", "z8"], ["q"]), h.make_node("DequantizeLinear", ["q", "s", "z16"], ["y"])],
     [s, nh.from_array(np.array(3, np.int8), "z8"), nh.from_array(np.array(3, np.uint16), "z16")], f("x", [1, 4]), f("y", [1, 4]))
u8 = lambda name, dims: h.make_tensor_value_info(name, T.UINT8, dims)
save("float_bias", [h.make_node("QLinearConv", ["x", "s", "xz", "w", "s", "wz", "s", "xz", "b"], ["y"])],
     [s, nh.from_array(np.array(128, np.uint8), "xz"), nh.from_array(np.ones((3, 2, 1, 1), np.int8), "w"),
      nh.from_array(np.array(0, np.int8), "wz"), nh.from_array(np.ones(3, np.float32), "b")], u8("x", [1, 2, 4, 4]), u8("y", [1, 3, 4, 4]))
)");
  ASSERT_EQ(run_command(std::string(CTXGEN_PYTHON) + " " + quote(dir_ / "make.py") + " " + quote(dir_.path())).exit_code, 0);
  fails(quote(dir_ / "zp_int32.onnx"), 3, "node #0 (QuantizeLinear): input 2 'z' (the zero point) is tensor(int32), which no QuantizeLinear takes");
  fails(quote(dir_ / "zp_uint16.onnx"), 3,
        "node #1 (DequantizeLinear): input 2 'z16' (the zero point) is tensor(uint16) where input 0 is tensor(int8)");
  fails(quote(dir_ / "float_bias.onnx"), 3, "node #0 (QLinearConv): input 8 'b' is tensor(float), which QLinearConv (opset 10) does not take as T4");
  // Beyond opset 17 an op may take types onnx 1.12 does not list for it (Equal on strings since
  // opset 19): such a model loads.
  write_file(dir_ / "equal.py", R"(import sys, onnx
from onnx import helper as h, TensorProto as T
s = lambda name: h.make_tensor_value_info(name, T.STRING, [2])
m = h.make_model(h.make_graph([h.make_node("Equal", ["a", "b"], ["y"])], "g", [s("a"), s("b")], [h.make_tensor_value_info("y", T.BOOL, [2])]),
                 opset_imports=[h.make_opsetid("", 19)])
m.ir_version = 9
onnx.save(m, sys.argv[1])
)");
  ASSERT_EQ(run_command(std::string(CTXGEN_PYTHON) + " " + quote(dir_ / "equal.py") + " " + quote(dir_ / "equal.onnx")).exit_code, 0);
  const auto r = ctxgen("compile " + quote(dir_ / "equal.onnx") + " --allow-empty --output-dir " + quote(dir_ / "equal_out"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

TEST_F(BadInput, Directory) { fails(quote(dir_.path()), 3, "is a directory"); }

TEST_F(BadInput, NotProtobuf) {
  write_file(dir_ / "text.onnx", "name,value\n1,2\n");
  fails(quote(dir_ / "text.onnx"), 3, "text.onnx: not a valid ONNX model");
}

TEST_F(BadInput, TruncatedProtobuf) {
  std::string bytes = read_file(generated_models() / "cnn.onnx");
  write_file(dir_ / "cut.onnx", bytes.substr(0, bytes.size() / 2));
  fails(quote(dir_ / "cut.onnx"), 3, "cut.onnx: not a valid ONNX model");
}

TEST_F(BadInput, MissingExternalData) {
  fs::path model = copy_model("external.onnx", dir_ / "m");
  fs::remove(dir_ / "m" / "external.weights");
  fails(quote(model), 3, "external data location 'external.weights' does not exist");
}

TEST_F(BadInput, ShortExternalData) {
  fs::path model = copy_model("external.onnx", dir_ / "m");
  fs::resize_file(dir_ / "m" / "external.weights", 100);
  fails(quote(model), 3, "external data 'external.weights' is 100 bytes");
}

TEST_F(BadInput, ExternalDataOutsideTheModelFolder) {
  fs::path model = copy_model("external.onnx", dir_ / "m");
  onnx::ModelProto proto = load_proto(model);
  for (auto& t : *proto.mutable_graph()->mutable_initializer())
    for (auto& kv : *t.mutable_external_data())
      if (kv.key() == "location") kv.set_value("../secret.weights");
  write_file(model, proto.SerializeAsString());
  fails(quote(model), 3, "contains '..'");
}

TEST_F(BadInput, UnknownBackend) {
  fails(quote(copy_model("cnn.onnx", dir_ / "m")) + " -e npu9000", 2, "unknown backend 'npu9000' (available: ref)");
}

// What ONNX Runtime 1.29 cannot load is refused before any work; what it loads but ref has no
// rules for yet stays on CPU with the reason.
TEST_F(BadInput, VersionsBeyondOnnxRuntime) {
  fs::path modern = generated_models() / "modern";
  fails(quote(modern / "opset99.onnx"), 3, "imports opset 99 of the default domain; ONNX Runtime 1.29 implements up to 26");
  fails(quote(modern / "ir99.onnx"), 3, "IR version 99 is newer than ONNX Runtime 1.29 reads (up to 13)");
  fails(quote(modern / "opset23.onnx"), 4, "Relu: opset 23: ref knows the semantics of ops up to opset 21");
  fails(quote(modern / "axes_attribute.onnx"), 3, "(ReduceMean): at opset 21 'axes' is an input, not an attribute");
  fails(quote(modern / "unsqueeze_axes_attribute.onnx"), 3, "(Unsqueeze): at opset 13 'axes' is an input, not an attribute");
}

TEST_F(BadInput, InputsAndOptionsOfNewFeatures) {
  fs::path vad = generated_models() / "vad.onnx";
  fails(quote(vad) + " --fix-value sr=16000 --stop-after load --embed", 2, "there is no context to --embed");
  fails(quote(vad) + " --fix-value sr=1 --fix-value sr=2", 2, "--fix-value sr: given twice with different values");
}

// A FIFO is refused at once, never opened blocking (which would wait for a writer forever).
TEST_F(BadInput, FifoIsNotAModel) {
  fs::path fifo = dir_ / "pipe.onnx";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  auto r = run_command("timeout 20 " + std::string(CTXGEN_BINARY) + " compile " + quote(fifo) + " --output-dir " + quote(out_));
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_NE(r.output.find("pipe.onnx: is not a regular file"), std::string::npos) << r.output;
  r = run_command("timeout 20 " + std::string(CTXGEN_BINARY) + " inspect " + quote(fifo));
  EXPECT_EQ(r.exit_code, 3) << r.output;
}

// A path that cannot be resolved is bad input named as such, not an internal error.
TEST_F(BadInput, SymlinkLoopIsNamed) {
  fs::create_symlink("b.onnx", dir_ / "a.onnx");
  fs::create_symlink("a.onnx", dir_ / "b.onnx");
  fails(quote(dir_ / "a.onnx"), 3, "a.onnx: cannot be resolved: Too many levels of symbolic links");
  auto r = run_command(std::string(CTXGEN_BINARY) + " verify " + quote(dir_ / "a.onnx"));
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_NE(r.output.find("a.onnx: Too many levels of symbolic links"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("internal error"), std::string::npos) << r.output;
}

// The report is one of the outputs: planned and checked with them, written with them (or alone,
// for a run that fails after the checks: report_test.cc).
TEST_F(BadInput, ReportNeverReplacesAFile) {
  fs::path model = copy_model("cnn.onnx", dir_ / "m");
  std::string before = read_file(model);
  fails(quote(model) + " --report " + quote(model), 2, "an output would overwrite " + model.string() + ", which this run reads");
  EXPECT_EQ(read_file(model), before) << "the input model is intact";
  fails(quote(model) + " --report " + quote(out_ / "cnn_ctx.onnx"), 2, "two outputs would both be written to");
  write_file(dir_ / "old.json", "keep me");
  fails(quote(model) + " --report " + quote(dir_ / "old.json"), 5, "old.json: output exists already");
  EXPECT_EQ(read_file(dir_ / "old.json"), "keep me");
  // A failure after the checks (nothing to compile) leaves the report of the failure alone.
  auto r = ctxgen("compile " + quote(copy_model("unsupported.onnx", dir_ / "m")) + " --output-dir " + quote(out_) +
                  " --report " + quote(out_ / "new" / "r.json"));
  EXPECT_EQ(r.exit_code, 4) << r.output;
  EXPECT_EQ(files_in(out_), std::set<std::string>({"new", "new/r.json"}));
}

// A share's manifest is an input like its models: no output, the report or a weights file among
// them, replaces it, with --force too, whatever the failure; nor does a manifest path with a NUL
// in it name an output after the part the system does not read.
TEST_F(BadInput, TheManifestIsAnInputNoOutputReplaces) {
  copy_model("cnn.onnx", dir_ / "g");
  const fs::path manifest = dir_ / "g" / "group.json";
  const std::string text = R"({"models": [{"path": "cnn.onnx"}], "external_initializers_file": "group.json"})";
  write_file(manifest, text);
  auto r = ctxgen("share --manifest " + quote(manifest) + " --force");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("group.json: an output would overwrite " + manifest.string() + ", which this run reads"), std::string::npos)
      << r.output;
  write_file(manifest, R"({"models": [{"path": "cnn.onnx"}]})");
  for (const std::string extra : {"", " --force"}) {
    r = ctxgen("share --manifest " + quote(manifest) + " --report " + quote(manifest) + extra);
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find("which this run reads"), std::string::npos) << r.output;
  }
  EXPECT_EQ(read_file(manifest), R"({"models": [{"path": "cnn.onnx"}]})");
  write_file(manifest, std::string(R"({"models": [{"path": "cnn.onnx)") + '\\' + "u0000/tp.onnx\"}]}");
  r = ctxgen("share --manifest " + quote(manifest));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("models[0].path: holds a NUL character"), std::string::npos) << r.output;
  EXPECT_EQ(files_in(dir_ / "g"), std::set<std::string>({"cnn.onnx", "group.json"}));
}

// Outputs are checked against the files the input models read, by identity: the weights file of
// a model with external data is never replaced, however it is named.
TEST_F(BadInput, OutputsNeverReplaceAnInputsWeights) {
  fs::path model = copy_model("external.onnx", dir_ / "m");
  fs::path weights = dir_ / "m" / "external.weights";
  std::string before = read_file(weights);
  fails(quote(model) + " --force --external-initializers-file ../m/external.weights", 2, "--external-initializers-file");
  fs::create_symlink(weights, out_ / "alias.weights");
  auto r = ctxgen("compile " + quote(model) + " --force --external-initializers-file alias.weights --output-dir " + quote(out_));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("which " + model.string() + " reads its weights from"), std::string::npos) << r.output;
  EXPECT_EQ(read_file(weights), before);
  EXPECT_TRUE(fs::is_symlink(out_ / "alias.weights"));
  EXPECT_EQ(std::distance(fs::directory_iterator(out_), fs::directory_iterator()), 1) << "nothing but the link";
}

TEST_F(BadInput, ZeroStrideIsRefusedNotASignal) {
  fails(quote(generated_models() / "bad" / "zero_stride.onnx"), 3,
        "(MaxPool): attribute 'strides' holds 0; every value must be at least 1");
}

// One run per output folder: a second one is refused while the first holds the folder.
TEST_F(BadInput, AFolderAnotherRunWritesIntoIsRefused) {
  fs::create_directories(out_);
  int fd = ::open(out_.c_str(), O_RDONLY | O_DIRECTORY);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::flock(fd, LOCK_EX), 0);  // as a running ctxgen holds it
  fails(quote(copy_model("cnn.onnx", dir_ / "m")), 6, "another ctxgen run is writing into this folder");
  ::close(fd);
}

TEST_F(BadInput, InvalidOptionValues) {
  fs::path model = copy_model("dynamic.onnx", dir_ / "m");
  fails(quote(model) + " --fix-dim batch", 2, "--fix-dim 'batch': expected [MODEL:]NAME=VALUE");
  fails(quote(model) + " --fix-dim batch=-1", 2, "--fix-dim batch: '-1' is not a non-negative integer");
  fails(quote(model) + " --input-shape x=2xbig", 2, "'big' is not a non-negative integer");
  fails(quote(model) + " --fix-dim typo=1", 2, "--fix-dim typo: no dimension of that name");
  fails(quote(model) + " --fix-dim batch=1 --external-initializers-file ../w.bin", 2, "--external-initializers-file");
}

TEST_F(BadInput, OutputFileAndOutputDirTogether) {
  fails(quote(copy_model("cnn.onnx", dir_ / "m")) + " -o " + quote(dir_ / "x.onnx"), 2, "give -o or --output-dir, not both");
}

TEST_F(BadInput, UnknownFlag) {
  auto r = ctxgen("compile x.onnx --frobnicate");
  EXPECT_EQ(r.exit_code, 2) << r.output;
}

TEST_F(BadInput, OutputFolderNotWritable) {
  fs::path model = copy_model("cnn.onnx", dir_ / "m");
  write_file(dir_ / "file", "x");
  auto r = ctxgen("compile " + quote(model) + " --output-dir " + quote(dir_ / "file" / "sub"));
  EXPECT_EQ(r.exit_code, 6) << r.output;
  EXPECT_NE(r.output.find("cannot create output folder"), std::string::npos) << r.output;
  r = ctxgen("compile " + quote(model) + " --output-dir /proc/ctxgen-out");
  EXPECT_EQ(r.exit_code, 6) << r.output;
  // The reason is mkdir's, not the "Success" libstdc++ reports for such folders.
  EXPECT_NE(r.output.find("/proc/ctxgen-out: cannot create output folder: "), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("Success"), std::string::npos) << r.output;
  // A report that cannot be written stops the run before anything else is written.
  r = ctxgen("compile " + quote(model) + " --output-dir " + quote(out_) + " --report /proc/ctxgen-out/r.json");
  EXPECT_EQ(r.exit_code, 6) << r.output;
  EXPECT_FALSE(fs::exists(out_)) << "no output folder, no outputs";
  EXPECT_EQ(files_in(dir_ / "m"), (std::set<std::string>{"cnn.onnx"}));
}

TEST_F(BadInput, FailureLeavesNoOutputEvenWithForce) {
  // The first model is fine and the second is damaged: nothing may appear for either.
  fs::path good = copy_model("cnn.onnx", dir_ / "m");
  write_file(dir_ / "m" / "bad.onnx", "junk");
  fs::create_directories(out_);
  auto r = ctxgen("share " + quote(good) + "," + quote(dir_ / "m" / "bad.onnx") + " --force --output-dir " + quote(out_));
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_TRUE(files_in(out_).empty());
}

TEST_F(BadInput, AlreadyCompiledModel) {
  fs::path model = copy_model("cnn.onnx", dir_ / "m");
  ASSERT_EQ(ctxgen("compile " + quote(model)).exit_code, 0);
  fails(quote(dir_ / "m" / "cnn_ctx.onnx"), 3, "already compiled");
}

// The damaged-input catalogue: models that each broke ctxgen once (testdata/generate.py bad/),
// with the exit code and message they get now.
TEST_F(BadInput, Catalogue) {
  const fs::path bad = generated_models() / "bad";
  // onnx 1.12's shape inference crashed (SIGSEGV) on a read of a name nothing defines; found by fuzzing.
  fails(quote(bad / "undefined_input.onnx"), 3, "node #0 (Relu) reads 'ghost', which no graph input, initializer or earlier node defines");
  // onnx 1.12's shape inference divided by the stride (SIGFPE).
  fails(quote(bad / "conv_zero_stride.onnx"), 3, "(Conv): attribute 'strides' holds 0; every value must be at least 1");
  // 2^40 elements compiled, then failed to allocate at run time.
  fails(quote(bad / "huge_input.onnx"), 4, "input 'x' would hold 4398046511104 bytes; ref holds at most 2^36 bytes (64 GiB) per tensor");
  // onnx 1.12 and ONNX Runtime disagree on this ceil_mode window; ref keeps ORT's size, so it stays on CPU.
  fails(quote(bad / "ceil_pool.onnx"), 4, "inferred dims [1,1,4,4] of output 'y' differ from [1,1,3,3] computed by ref");
  // onnx 1.12's shape inference took a Conv's kernel from a weight of more spatial dims than the
  // input has (SIGSEGV; through DequantizeLinear SIGFPE); found by fuzzing.
  for (const char* m : {"conv_rank.onnx", "conv_rank_computed.onnx"})
    fails(quote(bad / m), 4, "Conv: weight dims [8,8,3,3] do not match input rank 3");
  // The weight's DequantizeLinear runs on ref, the Conv stays on CPU naming the same cause.
  const auto qdq = ctxgen("compile " + quote(bad / "conv_rank_qdq.onnx") + " --output-dir " + quote(dir_ / "qdq"));
  EXPECT_EQ(qdq.exit_code, 0) << qdq.output;
  EXPECT_NE(qdq.output.find("CPU: 1 x Conv: weight dims [8,8,3,3] do not match input rank 3"), std::string::npos) << qdq.output;
  // An op no opset defines compiled into a model ONNX Runtime would not load.
  fails(quote(bad / "unknown_op.onnx"), 3, "node #0 (FrobnicateV2): no ONNX opset defines an op 'FrobnicateV2'");
  // A list of models longer than a file name can be was an internal error ("File name too long").
  std::string list;
  for (int i = 0; i < 40; ++i) list += (list.empty() ? "" : ",") + (dir_ / ("model_" + std::to_string(i) + ".onnx")).string();
  ASSERT_GT(list.size(), 255u);
  auto r = ctxgen("share " + quote(list) + " --output-dir " + quote(out_));
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_NE(r.output.find("model_0.onnx: no such file"), std::string::npos) << r.output;
}

// A FIFO where a compiled model's context binary should be: inspect shows it as unreadable at
// once instead of waiting for a writer (verify_test.cc checks verify, ort_compiled_test.cc the EP).
TEST_F(BadInput, FifoAsTheContextBinaryIsRefused) {
  fs::path model = copy_model("cnn.onnx", dir_ / "m");
  ASSERT_EQ(ctxgen("compile " + quote(model)).exit_code, 0);
  fs::remove(dir_ / "m" / "cnn_ref.bin");
  ASSERT_EQ(::mkfifo((dir_ / "m" / "cnn_ref.bin").c_str(), 0600), 0);
  auto r = run_command("timeout 20 " + std::string(CTXGEN_BINARY) + " inspect " + quote(dir_ / "m" / "cnn_ctx.onnx"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("cnn_ref.bin: unreadable: "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("not a regular file"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace ctxgen::testing
