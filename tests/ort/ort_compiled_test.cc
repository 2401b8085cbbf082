// What `ctxgen compile` and `ctxgen share` write runs in real ONNX Runtime through the plugin EP
// and gives what ORT's CPU EP gives on the original models (testdata/generate.py).

#include <gtest/gtest.h>

#include <sys/stat.h>

#include <cmath>
#include <functional>
#include <memory>

#include "ctxgen/format.h"
#include "ctxgen/ref_identity.h"
#include "ort_harness.h"
#include "test_util.h"

namespace fs = std::filesystem;

namespace ctxgen::ort_test {
namespace {

using testing::quote;

void ctxgen(const std::string& args) {
  const testing::CommandResult result = testing::run_command(std::string(CTXGEN_BINARY) + " " + args);
  ASSERT_EQ(result.exit_code, 0) << "ctxgen " << args << "\n" << result.output;
}

class CompiledModelTest : public ::testing::Test {
 protected:
  void SetUp() override { Plugin::register_library(); }
  testing::TempDir dir_;
};

struct Compiled {
  std::string test_name;
  std::string model;  // in testdata/generate.py's output
  std::string options;
};
void PrintTo(const Compiled& compiled, std::ostream* out) { *out << compiled.model << " " << compiled.options; }

class CompileTest : public CompiledModelTest, public ::testing::WithParamInterface<Compiled> {};

TEST_P(CompileTest, RunsInOrtLikeTheOriginalOnCpu) {
  const fs::path original = copy_model(GetParam().model, dir_.path());
  const fs::path out = dir_ / "out";
  ASSERT_NO_FATAL_FAILURE(
      ctxgen("compile " + quote(original) + " --output-dir " + quote(out) + " " + GetParam().options));
  const fs::path compiled = out / (original.stem().string() + "_ctx.onnx");
  Ort::Session session = open_session(compiled, plugin_options());
  expect_matches_original(session, original);
}

INSTANTIATE_TEST_SUITE_P(
    Testdata, CompileTest,
    ::testing::Values(Compiled{"Cnn", "cnn.onnx", ""},
                      Compiled{"CnnEmbedded", "cnn.onnx", "--embed"},
                      Compiled{"Islands", "islands.onnx", ""},
                      Compiled{"Constants", "constants.onnx", ""},
                      Compiled{"Subgraph", "subgraph.onnx", ""},
                      Compiled{"ExternalData", "external.onnx", ""},
                      Compiled{"FixedDim", "dynamic.onnx", "--fix-dim batch=3"},
                      Compiled{"DotsInNames", "dir.v1/model.v2.onnx", "--node-name-prefix p_"},
                      Compiled{"TiedEmbedding", "tied.onnx", ""},
                      // Packed for a CPU level below this one's (kernels of that level run it).
                      Compiled{"LowerCpuLevel", "cnn.onnx", "--target-cpu sse41"},
                      Compiled{"LowerCpuLevelAvx2", "cnn.onnx", "--target-cpu avx2"}),
    [](const auto& info) { return info.param.test_name; });

TEST_F(CompiledModelTest, SharedModelsRunOnOneMappingOfTheirBinary) {
  const fs::path prefill = copy_model("share/full/prefill.onnx", dir_.path());
  const fs::path decode = copy_model("share/full/decode.onnx", dir_.path());
  const fs::path out = dir_ / "out";
  ASSERT_NO_FATAL_FAILURE(ctxgen("share " + quote(prefill) + " " + quote(decode) + " --output-dir " + quote(out)));

  const PluginStats before = Plugin::stats();
  const Ort::SessionOptions options = plugin_options({{"ep.share_ep_contexts", "1"}});
  Ort::Session prefill_session = open_session(out / "prefill_ctx.onnx", options);
  Ort::Session decode_session = open_session(out / "decode_ctx.onnx", options);
  EXPECT_EQ(Plugin::stats().opened - before.opened, 1u);
  expect_matches_original(prefill_session, prefill);
  expect_matches_original(decode_session, decode);
}

// Two compilations of models with the same structure and file name: the graphs match by name and
// signature, so only the content id the model records tells the binaries apart.
TEST_F(CompiledModelTest, ABinaryFromAnotherCompilationIsRefusedNamingBothIds) {
  const fs::path base = copy_model("share/partial/base.onnx", dir_.path());
  fs::create_directories(dir_ / "tuned");
  fs::copy_file(testing::generated_models() / "share/partial/tuned.onnx", dir_ / "tuned" / "base.onnx");
  ASSERT_NO_FATAL_FAILURE(ctxgen("compile " + quote(base) + " --output-dir " + quote(dir_ / "out")));
  ASSERT_NO_FATAL_FAILURE(ctxgen("compile " + quote(dir_ / "tuned" / "base.onnx") + " --output-dir " + quote(dir_ / "tuned_out")));
  { Ort::Session fine = open_session(dir_ / "out" / "base_ctx.onnx", plugin_options({})); }
  fs::copy_file(dir_ / "tuned_out" / "base_ref.bin", dir_ / "out" / "base_ref.bin", fs::copy_options::overwrite_existing);
  try {
    Ort::Session session = open_session(dir_ / "out" / "base_ctx.onnx", plugin_options({}));
    FAIL() << "a session on a model beside another compilation's binary was created";
  } catch (const Ort::Exception& e) {
    const std::string message = e.what();
    EXPECT_EQ(e.GetOrtErrorCode(), ORT_INVALID_GRAPH) << message;
    EXPECT_NE(message.find("whose id is "), std::string::npos) << message;
    EXPECT_NE(message.find("base_ref.bin has id "), std::string::npos) << message;
    EXPECT_NE(message.find("different compilations"), std::string::npos) << message;
  }
}

// --weightless: the binary holds none of the weights the model keeps in external data; ORT finds
// them through the source model, as it documents: its bytes (their external data then beside the
// compiled model), else ep.context_source_model_path, else onnx_model_filename beside the compiled model.
TEST_F(CompiledModelTest, AWeightlessModelRunsOnItsSourceModelsWeights) {
  const fs::path original = copy_model("weightless.onnx", dir_.path());
  ASSERT_NO_FATAL_FAILURE(ctxgen("compile " + quote(original) + " --weightless"));
  EXPECT_LT(fs::file_size(dir_ / "weightless_ref.bin"), fs::file_size(dir_ / "weightless.weights") / 10);
  {
    Ort::Session beside = open_session(dir_ / "weightless_ctx.onnx", plugin_options());
    expect_matches_original(beside, original);
  }
  // The bytes come first: a path given besides them is not followed.
  const Config elsewhere = {{"ep.context_source_model_path", (dir_ / "nowhere" / "weightless.onnx").string()}};
  ASSERT_TRUE(session_failure(dir_ / "weightless_ctx.onnx", plugin_options(elsewhere)));
  const std::vector<char> bytes = read_bytes(original);
  Ort::SessionOptions options = plugin_options(elsewhere);
  Ort::ThrowOnError(Ort::GetApi().SessionOptionsSetWeightlessSourceModelBuffer(options, bytes.data(), bytes.size()));
  {
    Ort::Session from_bytes = open_session(dir_ / "weightless_ctx.onnx", options);
    expect_matches_original(from_bytes, original);
  }
  const fs::path out = dir_ / "out";
  fs::create_directories(out);
  for (const char* name : {"weightless_ctx.onnx", "weightless_ref.bin"}) fs::rename(dir_ / name, out / name);
  const auto failure = session_failure(out / "weightless_ctx.onnx", plugin_options());
  ASSERT_TRUE(failure);
  EXPECT_NE(failure->message.find("source data"), std::string::npos) << failure->message;
  EXPECT_NE(failure->message.find("weightless.weights"), std::string::npos) << failure->message;
  EXPECT_NE(failure->message.find("ep.context_source_model_path"), std::string::npos) << failure->message;
  {
    Ort::Session named = open_session(out / "weightless_ctx.onnx",
                                      plugin_options({{"ep.context_source_model_path", original.string()}}));
    expect_matches_original(named, original);
  }
  // A tensor of the source changed: its bytes are no longer what the model was compiled with.
  std::vector<char> data = read_bytes(dir_ / "weightless.weights");
  data[10000] ^= 1;  // inside fc_w, which follows the Conv's weight and bias
  testing::write_file(dir_ / "weightless.weights", std::string(data.begin(), data.end()));
  const auto changed = session_failure(out / "weightless_ctx.onnx",
                                       plugin_options({{"ep.context_source_model_path", original.string()}}));
  ASSERT_TRUE(changed);
  EXPECT_NE(changed->message.find("tensor 'fc_w'"), std::string::npos) << changed->message;
  EXPECT_NE(changed->message.find("changed since it was compiled"), std::string::npos) << changed->message;
}

// What the CLI writes answers ONNX Runtime's compatibility question before any session exists,
// as a model compiled through ORT's compile API does.
TEST_F(CompiledModelTest, CompiledModelsRecordCompatibilityInfoOrtJudgesOptimal) {
  const fs::path cnn = copy_model("cnn.onnx", dir_.path());
  ASSERT_NO_FATAL_FAILURE(ctxgen("compile " + quote(cnn)));
  Ort::AllocatorWithDefaultOptions allocator;
  const auto recorded =
      Ort::GetCompatibilityInfoFromModelAllocated((dir_ / "cnn_ctx.onnx").c_str(), ref::kEpName, allocator);
  ASSERT_NE(recorded.get(), nullptr);
  EXPECT_EQ(std::string(recorded.get()), compatibility_info(ContextBinary::open(dir_ / "cnn_ref.bin")->identity()));
  EXPECT_EQ(Ort::GetModelCompatibilityForEpDevices({Plugin::device()}, recorded.get()),
            OrtCompiledModelCompatibility_EP_SUPPORTED_OPTIMAL);
}

// A FIFO where the context binary should be is refused at once; opening it blocking would wait
// for a writer forever (the test would then time out).
TEST_F(CompiledModelTest, AFifoAsTheContextBinaryIsRefusedWithoutWaiting) {
  const fs::path cnn = copy_model("cnn.onnx", dir_.path());
  ASSERT_NO_FATAL_FAILURE(ctxgen("compile " + quote(cnn)));
  fs::remove(dir_ / "cnn_ref.bin");
  ASSERT_EQ(::mkfifo((dir_ / "cnn_ref.bin").c_str(), 0600), 0);
  try {
    Ort::Session session = open_session(dir_ / "cnn_ctx.onnx", plugin_options({}));
    FAIL() << "a session on a FIFO context binary was created";
  } catch (const Ort::Exception& e) {
    EXPECT_NE(std::string(e.what()).find("not a regular file"), std::string::npos) << e.what();
  }
}

// --fix-value keeps the original's interface: sr stays an input, where and as the original
// declares it. Fed the value it was compiled for, the model gives the original's outputs; fed any
// other value, type or shape, the run fails naming the input, what was fed and what was compiled.
TEST_F(CompiledModelTest, AFixedInputStaysAnInputThatRefusesOtherValues) {
  const fs::path original = copy_model("vad.onnx", dir_.path());
  ASSERT_NO_FATAL_FAILURE(ctxgen("compile " + quote(original) + " --fix-value sr=16000 --output-dir " + quote(dir_ / "out")));
  Ort::Session compiled = open_session(dir_ / "out" / "vad_ctx.onnx", plugin_options());
  Ort::Session reference(Plugin::env(), original.c_str(), Ort::SessionOptions{});
  Ort::AllocatorWithDefaultOptions allocator;
  auto interface = [&](Ort::Session& session) {
    std::vector<std::string> io;
    for (size_t i = 0; i < session.GetInputCount(); ++i)
      io.push_back(std::string("in ") + session.GetInputNameAllocated(i, allocator).get() + " " +
                   std::to_string(session.GetInputTypeInfo(i).GetTensorTypeAndShapeInfo().GetElementType()));
    for (size_t i = 0; i < session.GetOutputCount(); ++i)
      io.push_back(std::string("out ") + session.GetOutputNameAllocated(i, allocator).get() + " " +
                   std::to_string(session.GetOutputTypeInfo(i).GetTensorTypeAndShapeInfo().GetElementType()));
    return io;
  };
  EXPECT_EQ(interface(compiled), interface(reference));
  EXPECT_EQ(interface(compiled), (std::vector<std::string>{"in x 1", "in sr 7", "out prob 1"}));

  const auto memory = Ort::MemoryInfo::CreateCpu(OrtArenaAllocator, OrtMemTypeDefault);
  std::vector<float> x(512);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.1f * static_cast<float>(i));
  const std::vector<int64_t> x_dims = {1, 512};
  auto run = [&](Ort::Session& session, Ort::Value sr) {
    std::vector<Ort::Value> feeds;
    feeds.push_back(Ort::Value::CreateTensor<float>(memory, x.data(), x.size(), x_dims.data(), x_dims.size()));
    feeds.push_back(std::move(sr));
    const char* in[] = {"x", "sr"};
    const char* out[] = {"prob"};
    auto outputs = session.Run(Ort::RunOptions{nullptr}, in, feeds.data(), feeds.size(), out, 1);
    return *outputs[0].GetTensorData<float>();
  };
  int64_t rate = 16000, other = 8000;
  int32_t narrow = 16000;
  const std::vector<int64_t> one = {1};
  auto scalar = [&](int64_t& value) { return Ort::Value::CreateTensor<int64_t>(memory, &value, 1, nullptr, 0); };
  EXPECT_NEAR(run(compiled, scalar(rate)), run(reference, scalar(rate)), 1e-6);
  const std::vector<std::pair<std::string, std::function<Ort::Value()>>> refused = {
      {"input 'sr' is 8000, but the model was compiled for 16000 (ctxgen --fix-value); feed 16000", [&] { return scalar(other); }},
      // The type ORT checks itself against the declared input, which is the original's.
      {"Unexpected input data type. Actual: (tensor(int32)) , expected: (tensor(int64))", [&] {
         return Ort::Value::CreateTensor<int32_t>(memory, &narrow, 1, nullptr, 0);
       }},
      {"input 'sr' is int64 [1], but the model was compiled for int64 [] 16000", [&] {
         return Ort::Value::CreateTensor<int64_t>(memory, &rate, 1, one.data(), one.size());
       }}};
  for (const auto& [message, value] : refused) {
    try {
      run(compiled, value());
      ADD_FAILURE() << "a run fed sr other than as compiled succeeded: " << message;
    } catch (const Ort::Exception& e) {
      EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
    }
  }
  EXPECT_NEAR(run(compiled, scalar(rate)), run(reference, scalar(rate)), 1e-6) << "a refused run leaves the session usable";
}

}  // namespace
}  // namespace ctxgen::ort_test
