// A model package ctxgen writes (--package), loaded as applications load one: through ONNX
// Runtime 1.29's experimental OrtModelPackageApi, which asks CtxgenRef to judge each variant. On
// this machine the best level that runs is selected, under ONEDNN_MAX_CPU_ISA=AVX2 (the same tests
// run again with it: .avx2) the avx2 variant, and the session it makes matches the CPU EP on the
// original.

#include <gtest/gtest.h>

#include <cstdlib>

#include <nlohmann/json.hpp>

#include "ort_harness.h"
#include "test_util.h"

namespace fs = std::filesystem;

// The npm build of ORT lacks the generated .inc that onnxruntime_experimental_c_api.h includes, so
// the handles and the functions are declared here, as of API 28.
ORT_RUNTIME_CLASS(ModelPackageOptions);
ORT_RUNTIME_CLASS(ModelPackageContext);
ORT_RUNTIME_CLASS(ModelPackageComponentContext);

namespace ctxgen::ort_test {
namespace {

struct ModelPackageApi {
  using CreateOptions = OrtStatus*(ORT_API_CALL*)(const OrtEnv*, const OrtSessionOptions*, OrtModelPackageOptions**);
  using ReleaseOptions = void(ORT_API_CALL*)(OrtModelPackageOptions*);
  using CreateContext = OrtStatus*(ORT_API_CALL*)(const ORTCHAR_T*, OrtModelPackageContext**);
  using ReleaseContext = void(ORT_API_CALL*)(OrtModelPackageContext*);
  using SelectComponent = OrtStatus*(ORT_API_CALL*)(const OrtModelPackageContext*, const char*,
                                                    const OrtModelPackageOptions*, OrtModelPackageComponentContext**);
  using ReleaseComponent = void(ORT_API_CALL*)(OrtModelPackageComponentContext*);
  using SelectedName = OrtStatus*(ORT_API_CALL*)(const OrtModelPackageComponentContext*, const char**);
  using SelectedFolder = OrtStatus*(ORT_API_CALL*)(const OrtModelPackageComponentContext*, const ORTCHAR_T**);
  using CreateSession = OrtStatus*(ORT_API_CALL*)(const OrtEnv*, OrtModelPackageComponentContext*,
                                                  const OrtSessionOptions*, OrtSession**);

  template <class Fn>
  static Fn get(const char* name) {
    const std::string full = std::string("OrtModelPackageApi_") + name + "_SinceV28";
    auto* fn = reinterpret_cast<Fn>(Ort::GetApi().GetExperimentalFunction(full.c_str()));
    if (fn == nullptr) throw std::runtime_error("this ONNX Runtime has no " + full);
    return fn;
  }

  CreateOptions create_options = get<CreateOptions>("CreateModelPackageOptionsFromSessionOptions");
  ReleaseOptions release_options = get<ReleaseOptions>("ReleaseModelPackageOptions");
  CreateContext create_context = get<CreateContext>("CreateModelPackageContext");
  ReleaseContext release_context = get<ReleaseContext>("ReleaseModelPackageContext");
  SelectComponent select = get<SelectComponent>("SelectComponent");
  ReleaseComponent release_component = get<ReleaseComponent>("ReleaseModelPackageComponentContext");
  SelectedName selected_name = get<SelectedName>("ModelPackageComponent_GetSelectedVariantName");
  SelectedFolder selected_folder = get<SelectedFolder>("ModelPackageComponent_GetSelectedVariantFolderPath");
  CreateSession create_session = get<CreateSession>("CreateSession");
};

struct Selected {
  std::string variant;
  fs::path folder;
  Ort::Session session{nullptr};
};

// Selects `component` of `package` for CtxgenRef, as an application would, and makes its session
// from the variant's own settings (no session options of the caller's).
Selected select(const fs::path& package, const std::string& component) {
  const ModelPackageApi api;
  const Ort::SessionOptions options = plugin_options();
  OrtModelPackageOptions* package_options = nullptr;
  Ort::ThrowOnError(api.create_options(Plugin::env(), options, &package_options));
  OrtModelPackageContext* context = nullptr;
  OrtModelPackageComponentContext* chosen = nullptr;
  Selected selected;
  try {
    Ort::ThrowOnError(api.create_context(package.c_str(), &context));
    Ort::ThrowOnError(api.select(context, component.c_str(), package_options, &chosen));
    const char* name = nullptr;
    const ORTCHAR_T* folder = nullptr;
    Ort::ThrowOnError(api.selected_name(chosen, &name));
    Ort::ThrowOnError(api.selected_folder(chosen, &folder));
    selected.variant = name;
    selected.folder = folder;
    OrtSession* session = nullptr;
    Ort::ThrowOnError(api.create_session(Plugin::env(), chosen, nullptr, &session));
    selected.session = Ort::Session(session);
  } catch (...) {
    if (chosen != nullptr) api.release_component(chosen);
    if (context != nullptr) api.release_context(context);
    api.release_options(package_options);
    throw;
  }
  api.release_component(chosen);
  api.release_context(context);
  api.release_options(package_options);
  return selected;
}

testing::CommandResult ctxgen(const std::string& args) {
  // The packages are built as on this machine, whatever level these tests judge them at.
  return testing::run_command("env -u ONEDNN_MAX_CPU_ISA " + std::string(CTXGEN_BINARY) + " " + args);
}

class ModelPackageTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Plugin::register_library();
    // This machine's level: the one variant of a package made without --target-cpu.
    const fs::path cnn = copy_model("cnn.onnx", dir_ / "in");
    const auto r = ctxgen("compile " + testing::quote(cnn) + " --package " + testing::quote(dir_ / "host"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    host_ = nlohmann::ordered_json::parse(testing::read_file(dir_ / "host" / "manifest.json"))["components"]["cnn"]["variants"]
                .begin()
                .key();
    // Two levels, the host's and one below it; ORT ties go to the first declared, the higher.
    levels_ = host_ == "avx2" ? "avx,avx2" : "avx2," + host_;
    const char* limit = std::getenv("ONEDNN_MAX_CPU_ISA");
    expected_ = limit != nullptr && std::string(limit) == "AVX2" ? "avx2" : host_;
  }
  testing::TempDir dir_;
  std::string host_, levels_, expected_;
};

TEST_F(ModelPackageTest, SelectsTheBestLevelThatRunsAndRunsLikeTheCpuEp) {
  const fs::path cnn = dir_ / "in" / "cnn.onnx";
  const auto r = ctxgen("compile " + testing::quote(cnn) + " --target-cpu " + levels_ + " --package " +
                        testing::quote(dir_ / "pkg"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  Selected selected = select(dir_ / "pkg", "cnn");
  EXPECT_EQ(selected.variant, expected_) << "levels " << levels_;
  EXPECT_EQ(selected.folder, dir_ / "pkg" / "cnn" / expected_);
  expect_matches_original(selected.session, cnn);
}

// A share's models in one package: each level's binary and the weights file, the CPU nodes'
// weights too, in shared assets that the variants of both components read.
TEST_F(ModelPackageTest, TheComponentsOfAShareReadTheirSharedAssets) {
  const fs::path a = copy_model("share/fallback/cpu1.onnx", dir_ / "in");
  const fs::path b = copy_model("share/fallback/cpu2.onnx", dir_ / "in");
  const auto r = ctxgen("share " + testing::quote(a) + "," + testing::quote(b) + " --target-cpu " + levels_ +
                        " --package " + testing::quote(dir_ / "pkg"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const auto& [component, original] : {std::pair{"cpu1", a}, std::pair{"cpu2", b}}) {
    SCOPED_TRACE(component);
    Selected selected = select(dir_ / "pkg", component);
    EXPECT_EQ(selected.variant, expected_);
    expect_matches_original(selected.session, original);
    // verify takes the variant's session options from the manifest, as the package API does.
    const auto r = ctxgen("verify " + testing::quote(selected.folder / (std::string(component) + "_ctx.onnx")) +
                          " --reference " + testing::quote(original));
    EXPECT_EQ(r.exit_code, 0) << r.output;
  }
}

}  // namespace
}  // namespace ctxgen::ort_test
