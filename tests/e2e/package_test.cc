// --package DIR: an ONNX Runtime model package of the outputs for each --target-cpu level. What is
// in it, what is stored once, and what it refuses (that ONNX Runtime selects and runs its variants
// is tests/ort/ort_package_test.cc).

#include <nlohmann/json.hpp>

#include "ctxgen/error.h"
#include "ctxgen/format.h"
#include "e2e.h"

namespace ctxgen::testing {
namespace {

nlohmann::ordered_json manifest_of(const fs::path& package) {
  return nlohmann::ordered_json::parse(read_file(package / "manifest.json"));
}

std::string metadata(const onnx::ModelProto& model, const std::string& key) {
  for (const auto& p : model.metadata_props())
    if (p.key() == key) return p.value();
  return {};
}

// The package's shared assets named as ONNX Runtime names them: sha256 of the lines
// "<file sha256>  <path>\n", computed here with Python's hashlib.
void expect_content_addressed(const fs::path& package) {
  const fs::path script = package.parent_path() / "addresses.py";
  write_file(script, R"(import hashlib, os, sys
assets = os.path.join(sys.argv[1], "shared_assets")
for name in sorted(os.listdir(assets)):
    folder = os.path.join(assets, name)
    lines = []
    for root, _, files in os.walk(folder):
        for f in files:
            path = os.path.join(root, f)
            digest = hashlib.sha256(open(path, "rb").read()).hexdigest()
            lines.append((os.path.relpath(path, folder).replace(os.sep, "/"), digest))
    text = "".join(f"{d}  {p}\n" for p, d in sorted(lines))
    want = "sha256-" + hashlib.sha256(text.encode()).hexdigest()
    print("ok" if want == name else f"{name} should be {want}")
)");
  const auto r = run_command(std::string(CTXGEN_PYTHON) + " " + quote(script) + " " + quote(package));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.find("should be"), std::string::npos) << r.output;
}

TEST(Package, OneVariantPerLevelHighestFirstStoringWhatVariantsShareOnce) {
  TempDir dir;
  const fs::path a = copy_model("share/fallback/cpu1.onnx", dir.path());
  const fs::path b = copy_model("share/fallback/cpu2.onnx", dir.path());
  const fs::path package = dir / "pkg";
  auto r = ctxgen("share " + quote(a) + "," + quote(b) + " --target-cpu sse41,avx2 --package " + quote(package));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("package " + package.string() + ": 2 component(s) x 2 level(s) (avx2, sse41), 4 variants"),
            std::string::npos)
      << r.output;
  const auto manifest = manifest_of(package);
  EXPECT_EQ(manifest["schema_version"], "1.0");
  std::vector<std::string> components;
  for (const auto& [name, component] : manifest["components"].items()) {
    components.push_back(name);
    std::vector<std::string> levels;
    for (const auto& [level, variant] : component["variants"].items()) {
      SCOPED_TRACE(name + " " + level);
      levels.push_back(level);
      EXPECT_EQ(variant["variant_directory"], name + "/" + level);
      EXPECT_EQ(variant["ep"], "CtxgenRef");
      EXPECT_EQ(variant["device"], "cpu");
      const auto& ort = variant["executor_info"]["ort"];
      EXPECT_EQ(ort["model_file"], name + "_ctx.onnx");
      const fs::path model = package / name / level / (name + "_ctx.onnx");
      const onnx::ModelProto proto = load_proto(model);
      // What CtxgenRef judges: the level the variant's binary is packed for.
      EXPECT_EQ(variant["compatibility_string"], metadata(proto, "ep_compatibility_info.CtxgenRef"));
      EXPECT_NE(variant["compatibility_string"].get<std::string>().find(" " + level + ", oneDNN"), std::string::npos);
      // The weights CPU nodes need: one file every variant reads, in a shared asset ORT resolves.
      const std::string folder = ort["session_options"]["session.model_external_initializers_file_folder_path"];
      ASSERT_EQ(folder.rfind("sha256:", 0), 0u) << folder;
      EXPECT_TRUE(fs::exists(package / "shared_assets" / ("sha256-" + folder.substr(7)) / "cpu1_initializers.data"));
      // The level's binary, shared by the share's two models, opens with its weights file.
      const auto binary = ContextBinary::open(
          model.parent_path() / attribute(*epcontext_nodes(proto)[0], "ep_cache_context")->s());
      EXPECT_EQ(binary->identity().hardware_architecture.find("x86_64 " + level + ","), 0u);
      EXPECT_EQ(metadata(proto, kContentIdMetadataKey), binary->content_id().hex());
      ASSERT_EQ(binary->weight_files().size(), 1u);
      EXPECT_NO_THROW(binary->verify_payloads());
    }
    EXPECT_EQ(levels, (std::vector<std::string>{"avx2", "sse41"})) << "declared highest first";
  }
  EXPECT_EQ(components, (std::vector<std::string>{"cpu1", "cpu2"}));
  // Every file is in a variant's folder or a shared asset, and the assets are content-addressed:
  // the two levels' binaries, the weights they share and the CPU nodes' weights.
  size_t assets = 0;
  for (const auto& e : fs::directory_iterator(package / "shared_assets")) assets += e.is_directory();
  EXPECT_EQ(assets, 4u);
  expect_content_addressed(package);
  // MatMul weights are not packed for a level: both levels' binaries take all their weights from
  // the weights file, which holds each once, as one level's binary does.
  r = ctxgen("share " + quote(a) + "," + quote(b) + " --target-cpu avx2 --output-dir " + quote(dir / "one"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  uint64_t one_level = 0;
  const auto one = ContextBinary::open(dir / "one" / "cpu1_ref.bin");
  for (const auto& w : one->weights()) one_level += w.size;
  for (const std::string level : {"avx2", "sse41"}) {
    const auto binary = ContextBinary::open(package / "cpu1" / level /
                                            attribute(*epcontext_nodes(load_proto(package / "cpu1" / level / "cpu1_ctx.onnx"))[0],
                                                      "ep_cache_context")->s());
    uint64_t elsewhere = 0;
    for (const auto& w : binary->weights()) elsewhere += w.file == 1 ? w.size : 0;
    EXPECT_EQ(elsewhere, one_level) << level;
    uint64_t shared = 0;
    for (const auto& w : binary->weight_file(1).weights()) shared += w.size;
    EXPECT_EQ(shared, one_level) << level;
  }
  r = ctxgen("inspect " + quote(package));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("model package 'cpu1' (schema 1.0): 2 component(s), 4 variant(s), 4 shared asset(s)"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("    variant sse41: CtxgenRef on cpu, cpu2/sse41/cpu2_ctx.onnx"), std::string::npos) << r.output;
}

TEST(Package, WithoutTargetCpuItsOneVariantIsThisMachinesLevel) {
  TempDir dir;
  const fs::path cnn = copy_model("cnn.onnx", dir.path());
  const auto r = ctxgen("compile " + quote(cnn) + " --package " + quote(dir / "pkg"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto variants = manifest_of(dir / "pkg")["components"]["cnn"]["variants"];
  ASSERT_EQ(variants.size(), 1u);
  const std::string level = variants.begin().key();
  // One model, one level: nothing is shared, everything is in the variant's folder.
  EXPECT_EQ(files_in(dir / "pkg"), (std::set<std::string>{"manifest.json", "cnn", "cnn/" + level, "cnn/" + level + "/cnn_ctx.onnx",
                                                           "cnn/" + level + "/cnn_ref.bin"}));
  const auto binary = ContextBinary::open(dir / "pkg" / "cnn" / level / "cnn_ref.bin");
  EXPECT_NE(binary->identity().hardware_architecture.find(" " + level + ", "), std::string::npos);
}

TEST(Package, ReplacesOnlyAPackageAndOnlyWithForce) {
  TempDir dir;
  const fs::path cnn = copy_model("cnn.onnx", dir.path());
  const std::string compile = "compile " + quote(cnn) + " --target-cpu avx2 --package ";
  ASSERT_EQ(ctxgen(compile + quote(dir / "pkg")).exit_code, 0);
  auto r = ctxgen(compile + quote(dir / "pkg"));
  EXPECT_EQ(r.exit_code, exit_code(ErrorCode::kOutputExists)) << r.output;
  EXPECT_NE(r.output.find("manifest.json: output exists already; remove it or pass --force"), std::string::npos) << r.output;
  // --force replaces only what ctxgen wrote, which the manifest lists: a file added since stops it.
  write_file(dir / "pkg" / "cnn" / "avx2" / "notes.txt", "mine");
  r = ctxgen("compile " + quote(cnn) + " --target-cpu sse41 --force --package " + quote(dir / "pkg"));
  EXPECT_EQ(r.exit_code, exit_code(ErrorCode::kUsage)) << r.output;
  EXPECT_NE(r.output.find("holds 1 file(s) the package ctxgen wrote there does not (cnn/avx2/notes.txt)"),
            std::string::npos)
      << r.output;
  EXPECT_TRUE(fs::exists(dir / "pkg" / "cnn" / "avx2" / "notes.txt"));
  fs::remove(dir / "pkg" / "cnn" / "avx2" / "notes.txt");
  r = ctxgen("compile " + quote(cnn) + " --target-cpu sse41 --force --package " + quote(dir / "pkg"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(files_in(dir / "pkg"), (std::set<std::string>{"manifest.json", "cnn", "cnn/sse41", "cnn/sse41/cnn_ctx.onnx",
                                                           "cnn/sse41/cnn_ref.bin"}));
  // A folder of other files is never replaced, --force or not, even with a manifest.json of
  // another tool in it.
  fs::create_directories(dir / "mine");
  write_file(dir / "mine" / "notes.txt", "keep me");
  write_file(dir / "mine" / "manifest.json", R"({"manifest_version": 3, "name": "an extension"})");
  r = ctxgen(compile + quote(dir / "mine") + " --force");
  EXPECT_EQ(r.exit_code, exit_code(ErrorCode::kUsage)) << r.output;
  EXPECT_NE(r.output.find("a folder that is not empty and is not a model package ctxgen wrote"), std::string::npos)
      << r.output;
  EXPECT_EQ(files_in(dir / "mine"), (std::set<std::string>{"manifest.json", "notes.txt"}));
  // A link to a folder: the package goes where it points, and the link stays.
  fs::create_directories(dir / "real");
  fs::create_directory_symlink(dir / "real", dir / "link");
  r = ctxgen(compile + quote(dir / "link"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(fs::is_symlink(dir / "link"));
  EXPECT_TRUE(fs::exists(dir / "real" / "manifest.json"));
  write_file(dir / "file", "x");
  r = ctxgen(compile + quote(dir / "file"));
  EXPECT_EQ(r.exit_code, exit_code(ErrorCode::kUsage)) << r.output;
  EXPECT_NE(r.output.find("--package names a folder, and this is a file"), std::string::npos) << r.output;
  // Nor a package holding a file the run reads (it is no file ctxgen wrote there): replacing it
  // would delete the input.
  fs::copy_file(cnn, dir / "pkg" / "mine.onnx");
  r = ctxgen("compile " + quote(dir / "pkg" / "mine.onnx") + " --force --package " + quote(dir / "pkg"));
  EXPECT_EQ(r.exit_code, exit_code(ErrorCode::kUsage)) << r.output;
  EXPECT_NE(r.output.find("holds 1 file(s) the package ctxgen wrote there does not (mine.onnx)"), std::string::npos)
      << r.output;
  EXPECT_TRUE(fs::exists(dir / "pkg" / "mine.onnx"));
  fs::remove(dir / "pkg" / "mine.onnx");
  r = ctxgen(compile + "'" + dir.path().string() + "/.'");
  EXPECT_EQ(r.exit_code, exit_code(ErrorCode::kUsage)) << r.output;
  EXPECT_NE(r.output.find("--package names the package's own folder, not '.' or '..'"), std::string::npos) << r.output;
  // A killed run's staging folder for this package goes with the next run into it; files that
  // only look like one stay.
  fs::create_directories(dir / ".pkg.package.ctxgen-999999.tmp" / "levels");
  write_file(dir / ".pkg.package.ctxgen-4000000.bak", "mine");
  write_file(dir / ".pkg.package.ctxgen-99999999999999.tmp", "mine too");
  r = ctxgen("compile " + quote(cnn) + " --target-cpu sse41 --force --package " + quote(dir / "pkg/"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_FALSE(fs::exists(dir / ".pkg.package.ctxgen-999999.tmp"));
  EXPECT_TRUE(fs::exists(dir / ".pkg.package.ctxgen-4000000.bak"));
  EXPECT_TRUE(fs::exists(dir / ".pkg.package.ctxgen-99999999999999.tmp"));
  fs::remove(dir / ".pkg.package.ctxgen-4000000.bak");
  fs::remove(dir / ".pkg.package.ctxgen-99999999999999.tmp");
  // inspect refuses a manifest of another layout, saying so.
  fs::create_directories(dir / "odd");
  write_file(dir / "odd" / "manifest.json", R"({"components": {"x": {"variants": {"v": 5}}}})");
  r = ctxgen("inspect " + quote(dir / "odd"));
  EXPECT_EQ(r.exit_code, exit_code(ErrorCode::kInvalidModel)) << r.output;
  EXPECT_NE(r.output.find("not a model package manifest ORT reads"), std::string::npos) << r.output;
  fs::remove_all(dir / "odd");
  // A variant folder that is a link out of the package is outside it.
  fs::rename(dir / "pkg" / "cnn" / "sse41", dir / "elsewhere");
  fs::create_directory_symlink(dir / "elsewhere", dir / "pkg" / "cnn" / "sse41");
  r = ctxgen("inspect " + quote(dir / "pkg"));
  EXPECT_EQ(r.exit_code, exit_code(ErrorCode::kInvalidModel)) << r.output;
  EXPECT_NE(r.output.find("variant_directory 'cnn/sse41' is outside the package"), std::string::npos) << r.output;
  fs::remove(dir / "pkg" / "cnn" / "sse41");
  fs::rename(dir / "elsewhere", dir / "pkg" / "cnn" / "sse41");
  // A model_file that leads out of its variant's folder (absolute, or up and out) is outside too.
  const std::string kept = read_file(dir / "pkg" / "manifest.json");
  for (const std::string& file : {(dir / "pkg" / "cnn" / "sse41" / "cnn_ctx.onnx").string(), std::string("../../../pkg/cnn/sse41/cnn_ctx.onnx")}) {
    nlohmann::json m = nlohmann::json::parse(kept);
    for (auto& [name, component] : m["components"].items())
      for (auto& [variant, v] : component["variants"].items()) v["executor_info"]["ort"]["model_file"] = file;
    write_file(dir / "pkg" / "manifest.json", m.dump());
    r = ctxgen("inspect " + quote(dir / "pkg"));
    EXPECT_EQ(r.exit_code, exit_code(ErrorCode::kInvalidModel)) << r.output;
    EXPECT_NE(r.output.find("model_file '" + file + "' is outside the package"), std::string::npos) << r.output;
  }
  write_file(dir / "pkg" / "manifest.json", kept);
  // No staging folder is left beside the packages.
  for (const auto& e : fs::directory_iterator(dir.path()))
    EXPECT_EQ(e.path().filename().string().find(".package.ctxgen-"), std::string::npos) << e.path();
}

TEST(Package, AFailedLevelLeavesNothing) {
  TempDir dir;
  const fs::path cnn = copy_model("cnn.onnx", dir.path());
  const auto r = ctxgen("compile " + quote(cnn) + " --target-cpu avx2,no_such_level --package " + quote(dir / "pkg"));
  EXPECT_EQ(r.exit_code, exit_code(ErrorCode::kUsage)) << r.output;
  EXPECT_NE(r.output.find("--target-cpu no_such_level: no such CPU level"), std::string::npos) << r.output;
  EXPECT_EQ(files_in(dir.path()), (std::set<std::string>{"cnn.onnx"}));
}

TEST(Package, RefusesNamesAPackageCannotHold) {
  TempDir dir;
  const fs::path cnn = copy_model("cnn.onnx", dir.path());
  for (const std::string stem : {"shared_assets", "manifest.json", ".hidden"}) {
    SCOPED_TRACE(stem);
    fs::copy_file(cnn, dir / (stem + ".onnx"));
    const auto r = ctxgen("compile " + quote(dir / (stem + ".onnx")) + " --package " + quote(dir / "pkg"));
    EXPECT_EQ(r.exit_code, exit_code(ErrorCode::kUsage)) << r.output;
    EXPECT_NE(r.output.find("'" + stem + "' cannot name one"), std::string::npos) << r.output;
  }
  fs::create_directories(dir / "other");
  fs::copy_file(cnn, dir / "other" / "cnn.onnx");
  auto r = ctxgen("share " + quote(cnn) + "," + quote(dir / "other" / "cnn.onnx") + " --package " + quote(dir / "pkg"));
  EXPECT_EQ(r.exit_code, exit_code(ErrorCode::kUsage)) << r.output;
  EXPECT_NE(r.output.find("another model has the stem 'cnn'"), std::string::npos) << r.output;
  for (const std::string file : {"sub/w.data", "manifest.json"}) {
    r = ctxgen("compile " + quote(cnn) + " --external-initializers-file " + file + " --package " + quote(dir / "pkg"));
    EXPECT_EQ(r.exit_code, exit_code(ErrorCode::kUsage)) << r.output;
    EXPECT_NE(r.output.find("--external-initializers-file " + file + ": in a package"), std::string::npos) << r.output;
  }
  r = ctxgen("compile " + quote(cnn) + " --package ''");
  EXPECT_EQ(r.exit_code, exit_code(ErrorCode::kUsage)) << r.output;
  EXPECT_NE(r.output.find("names no folder"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(dir / "pkg"));
  EXPECT_FALSE(fs::exists(dir / "cnn_ctx.onnx"));
}

TEST(Package, RefusesWhatItCannotHonour) {
  TempDir dir;
  const fs::path cnn = copy_model("cnn.onnx", dir.path());
  const std::string compile = "compile " + quote(cnn) + " --package " + quote(dir / "pkg") + " ";
  for (const auto& [option, message] : std::vector<std::pair<std::string, std::string>>{
           {"-o " + quote(dir / "x_ctx.onnx"), "it takes no -o or --output-dir"},
           {"--output-dir " + quote(dir / "out"), "it takes no -o or --output-dir"},
           {"--report r.json", "it takes no --report"},
           {"--embed", "it takes no --embed"},
           {"--stop-after partition", "--stop-after writes no package"},
           {"--allow-empty", "it takes no --allow-empty"},
           {"--ep-lib x.so --ep X", "--package cannot be used with --ep-lib"}}) {
    SCOPED_TRACE(option);
    const auto r = ctxgen(compile + option);
    EXPECT_EQ(r.exit_code, exit_code(ErrorCode::kUsage)) << r.output;
    EXPECT_NE(r.output.find(message), std::string::npos) << r.output;
  }
  EXPECT_EQ(files_in(dir.path()), (std::set<std::string>{"cnn.onnx"}));
}

}  // namespace
}  // namespace ctxgen::testing
