// Compile and link: per-model objects linked together write what `share` writes for the same
// models and options, byte for byte, wherever the objects were made; link compiles nothing, and
// refuses an object of another ctxgen, backend, SDK or CPU level, or a damaged one, by name.
#include <gtest/gtest.h>

#include <cstring>

#include <nlohmann/json.hpp>

#include "e2e.h"
#include "framed.h"

namespace ctxgen::testing {
namespace {

// The model's own dims among mixed_group_shapes(), unscoped, for compiling it alone.
std::string dims_of(const fs::path& model) {
  const std::string stem = model.stem().string();
  std::string dims = "--fix-dim batch=1";
  if (stem == "decoder_prefill" || stem == "decoder_prefill_matmulnbits") dims += " --fix-dim seq=16";
  if (stem == "decoder_decode") dims += " --fix-dim seq=1 --fix-dim past=15";
  return dims;
}

// An object's header and the bytes after it.
using Parts = Framed;
Parts split(const fs::path& object) { return read_framed(object, false); }
void join(const fs::path& object, const Parts& parts) { write_framed(object, "CTXGOBJ1", parts, false); }

class ObjectTest : public ::testing::Test {
 protected:
  // One object per model of the group, made in a folder of its own (a machine of its own).
  std::vector<fs::path> objects(const std::string& options = "") {
    std::vector<fs::path> made;
    for (const fs::path& model : mixed_group()) {
      const fs::path machine = dir_.path() / ("machine_" + model.stem().string());
      fs::create_directories(machine);
      fs::copy_file(model, machine / model.filename(), fs::copy_options::overwrite_existing);
      const fs::path object = dir_.path() / "objects" / (model.stem().string() + ".ctxo");
      fs::create_directories(object.parent_path());
      const auto r = ctxgen("compile " + quote(machine / model.filename()) + " " + dims_of(model) + " " + options +
                            " --force --object " + quote(object));
      EXPECT_EQ(r.exit_code, 0) << r.output;
      made.push_back(object);
    }
    return made;
  }
  CommandResult link(const std::vector<fs::path>& objects, const fs::path& out, const std::string& options = "") {
    std::string list;
    for (const auto& o : objects) list += " " + quote(o);
    return ctxgen("link" + list + " --output-dir " + quote(out) + " " + options);
  }
  TempDir dir_;
};

TEST_F(ObjectTest, LinkWritesWhatShareWritesByteForByte) {
  const auto made = objects();
  for (const std::string options : {"", "--node-name-prefix ci_"}) {
    SCOPED_TRACE("options '" + options + "'");
    const fs::path linked = dir_.path() / ("linked" + options.substr(0, 4)), shared = dir_.path() / ("shared" + options.substr(0, 4));
    auto r = link(made, linked, options);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("cache: 6 of 6 partitions from cache"), std::string::npos) << r.output;
    std::string inputs;
    for (const auto& model : mixed_group()) inputs += (inputs.empty() ? "" : ",") + model.string();
    r = ctxgen("share " + inputs + " " + mixed_group_shapes() + " " + options + " --output-dir " + quote(shared) + " -q");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    expect_same_files(file_contents(shared), file_contents(linked));
  }
}

// The CPU level travels with each compile: objects compiled for a level (one process each) link,
// in another process, to what `share` writes for that level.
TEST_F(ObjectTest, ObjectsForACpuLevelLinkToWhatShareWritesForIt) {
  const auto made = objects("--target-cpu avx2");
  const fs::path linked = dir_.path() / "linked", shared = dir_.path() / "shared";
  auto r = link(made, linked);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::string inputs;
  for (const auto& model : mixed_group()) inputs += (inputs.empty() ? "" : ",") + model.string();
  r = ctxgen("share " + inputs + " " + mixed_group_shapes() + " --target-cpu avx2 --output-dir " + quote(shared) + " -q");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  expect_same_files(file_contents(shared), file_contents(linked));
  int binaries = 0;
  for (const auto& entry : fs::directory_iterator(linked))
    if (entry.path().extension() == ".bin") {
      ++binaries;
      r = ctxgen("inspect " + quote(entry.path()));
      EXPECT_NE(r.output.find(" avx2, oneDNN"), std::string::npos) << r.output;
    }
  EXPECT_EQ(binaries, 1);
}

// Models in folders of their own whose external data files have one name (as exporters name
// them): share takes them, and so does link, each object unpacked in a folder of its own.
TEST_F(ObjectTest, ModelsWhoseDataFilesShareANameLink) {
  const fs::path made_by = dir_.path() / "make.py";
  std::ofstream(made_by) << "import onnx, sys\n"
                            "m = onnx.load(sys.argv[1])\n"
                            "onnx.save_model(m, sys.argv[2], save_as_external_data=True, location='weights.bin', size_threshold=0)\n";
  std::vector<fs::path> models, made;
  for (const fs::path& source : {mixed_group()[2], mixed_group()[0]}) {
    const fs::path folder = dir_.path() / ("machine_" + source.stem().string());
    fs::create_directories(folder);
    models.push_back(folder / source.filename());
    ASSERT_EQ(run_command(std::string(CTXGEN_PYTHON) + " " + quote(made_by) + " " + quote(source) + " " + quote(models.back())).exit_code, 0);
    ASSERT_TRUE(fs::exists(folder / "weights.bin"));
    made.push_back(dir_.path() / (source.stem().string() + ".ctxo"));
    const auto r = ctxgen("compile " + quote(models.back()) + " " + dims_of(source) + " --object " + quote(made.back()));
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  auto r = link(made, dir_.path() / "linked");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = ctxgen("share " + quote(models[0]) + "," + quote(models[1]) + " " + dims_of(models[0]) + " --fix-dim " +
             models[1].stem().string() + ":seq=16 --output-dir " + quote(dir_.path() / "shared") + " -q");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  expect_same_files(file_contents(dir_.path() / "shared"), file_contents(dir_.path() / "linked"));
  // An empty path is not "no path": refused, nothing written beside the model.
  r = ctxgen("compile " + quote(models[0]) + " --fix-dim batch=1 --object ''");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("must be a path, not an empty string"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(models[0].parent_path() / (models[0].stem().string() + "_ctx.onnx")));
}

// An object holds the model as compiling left it, not the source: link reads it and runs only
// the write stage, with the source gone.
TEST_F(ObjectTest, LinkStartsFromTheCompiledModelAndOnlyWrites) {
  const auto made = objects();
  fs::remove_all(dir_.path() / "machine_cnn_upsample");
  const fs::path report = dir_.path() / "link.json";
  const auto r = link(made, dir_.path() / "linked", "--report " + quote(report));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::set<std::string> stages;
  const auto timings = nlohmann::json::parse(read_file(report))["timings"];
  for (const auto& t : timings) stages.insert(t["stage"]);
  EXPECT_EQ(stages, (std::set<std::string>{"read_object", "compile", "write_context_binary", "build_models", "write_models"}));
  // The CNN stores its weights in the model file: the object's graph holds none of them, its
  // weights member each once, the entries its packed Conv weights.
  const Parts parts = split(dir_.path() / "objects" / "cnn_upsample.ctxo");
  std::map<std::string, uint64_t> sizes;
  for (const auto& m : parts.header["members"]) sizes[m["kind"].get<std::string>()] += m["size"].get<uint64_t>();
  const uint64_t source = fs::file_size(mixed_group()[2]);
  EXPECT_LT(sizes["model"], source / 10);
  EXPECT_LT(sizes["weights"], source);
  EXPECT_EQ(sizes.count("data"), 0u);
  // The decode step's layer norms repeat their scales and biases: held once each.
  std::vector<uint64_t> held;
  const Parts decode = split(dir_.path() / "objects" / "decoder_decode.ctxo");
  for (const auto& w : decode.header["job"]["weights"])
    if (w.contains("held")) held.push_back(w["held"]);
  EXPECT_GT(held.size(), std::set<uint64_t>(held.begin(), held.end()).size());
}

// --weightless objects: the binary refers to the tensors of the model's external data, as the
// one `compile --weightless` writes does.
TEST_F(ObjectTest, WeightlessObjectsLinkToWhatCompileWrites) {
  const fs::path model = copy_model("weightless.onnx", dir_.path() / "machine");
  const fs::path object = dir_.path() / "weightless.ctxo";
  auto r = ctxgen("compile " + quote(model) + " --weightless --object " + quote(object) + " -q");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = link({object}, dir_.path() / "linked");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("--weightless: 4 tensor(s) stay in"), std::string::npos) << r.output;
  r = ctxgen("compile " + quote(model) + " --weightless --output-dir " + quote(dir_.path() / "compiled") + " -q");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  expect_same_files(file_contents(dir_.path() / "compiled"), file_contents(dir_.path() / "linked"));
}

TEST_F(ObjectTest, ModelsWithCpuNodesLinkTheirWeightsIntoAnExternalFile) {
  // The decode step's open dims keep nodes on CPU: their weights go into weights.data.
  const fs::path model = mixed_group()[1];
  const fs::path object = dir_.path() / "decode.ctxo";
  auto r = ctxgen("compile " + quote(model) + " --fix-dim batch=1 --object " + quote(object));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = link({object}, dir_.path() / "linked", "--external-initializers-file weights.data");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = ctxgen("share " + quote(model) + " --fix-dim batch=1 --external-initializers-file weights.data --output-dir " +
             quote(dir_.path() / "shared") + " -q");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  expect_same_files(file_contents(dir_.path() / "shared"), file_contents(dir_.path() / "linked"));
  EXPECT_TRUE(fs::exists(dir_.path() / "linked" / "weights.data"));
}

TEST_F(ObjectTest, LinkRefusesObjectsItCannotUseByName) {
  auto made = objects();
  made.resize(2);
  const auto refused = [&](const fs::path& object, const std::string& why, int code) {
    SCOPED_TRACE(why);
    const auto r = link({made[0], object}, dir_.path() / "out");
    EXPECT_EQ(r.exit_code, code) << r.output;
    EXPECT_NE(r.output.find(why), std::string::npos) << r.output;
    EXPECT_FALSE(fs::exists(dir_.path() / "out" / "decoder_prefill_ctx.onnx"));
  };
  const fs::path other = dir_.path() / "other.ctxo";
  Parts parts = split(made[1]);
  parts.header["ctxgen_version"] = "0.0.9";
  join(other, parts);
  refused(other, "was compiled by ctxgen 0.0.9", 7);
  parts = split(made[1]);
  parts.header["identity"]["hardware_architecture"] = "x86_64 avx2_vnni_2, oneDNN 9.9";
  join(other, parts);
  refused(other, "the objects of one link are compiled alike", 2);
  // A member damaged in transit.
  parts = split(made[1]);
  parts.rest[parts.rest.size() / 2] = static_cast<char>(parts.rest[parts.rest.size() / 2] ^ 1);
  join(other, parts);
  refused(other, "does not hash to what its header records", 7);
  // Without its compile results link would have to compile: it refuses instead.
  parts = split(made[1]);
  nlohmann::json kept = nlohmann::json::array();
  uint64_t at = 0, cut = 0;
  for (const auto& m : parts.header["members"]) {
    if (m["kind"] == "entry") {
      cut = at;
      break;
    }
    kept.push_back(m);
    at += m["size"].get<uint64_t>();
  }
  parts.header["members"] = kept;
  parts.rest.resize(cut);
  join(other, parts);
  refused(other, "no compile result for partition", 7);
  // A header that points a weight or a partition past what the object holds.
  parts = split(made[1]);
  for (auto& w : parts.header["job"]["weights"])
    if (w.contains("held")) w["held"] = uint64_t{1} << 40;
  join(other, parts);
  refused(other, "reaches past its weights member", 7);
  parts = split(made[1]);
  parts.header["job"]["partitions"][0]["nodes"][0] = 1u << 30;
  join(other, parts);
  refused(other, "its partitions name a node its model lacks", 7);
  parts = split(made[1]);
  parts.header["job"].erase("value_types");
  join(other, parts);
  refused(other, "its header is not an object's", 7);
  // Fields link compares before it reads the model, missing or of another type (found by fuzzing:
  // a header without "identity" ended the process).
  for (const auto& [field, value] : std::vector<std::pair<std::string, nlohmann::json>>{
           {"identity", nullptr}, {"weightless", "no"}, {"target", 3}, {"load", nullptr}}) {
    parts = split(made[1]);
    if (value.is_null()) parts.header.erase(field);
    else parts.header[field] = value;
    join(other, parts);
    refused(other, "its header is not an object's", 7);
  }
  // A weight in a file the object does not hold (a path of the header's choosing), one whose bytes
  // are not what its dims need, a node placed twice, a size that is not a whole number.
  const auto first_weight = [&](const char* key, const auto& change) {
    parts = split(made[1]);
    for (auto& w : parts.header["job"]["weights"])
      if (w.contains(key)) {
        change(w);
        break;
      }
    join(other, parts);
  };
  first_weight("held", [](nlohmann::json& w) { w["data"] = "/etc/passwd"; w["offset"] = 0; w.erase("held"); });
  refused(other, "which the object does not hold", 7);
  first_weight("held", [](nlohmann::json& w) { w["size"] = w["size"].get<uint64_t>() + 4; });
  refused(other, "not what its type and dims need", 7);
  first_weight("held", [](nlohmann::json& w) { w["size"] = 4.5; });
  refused(other, "where a count or an index belongs", 7);
  parts = split(made[1]);
  parts.header["job"]["cpu_nodes"].push_back({{"node", parts.header["job"]["partitions"][0]["nodes"][0]}, {"reason", "x"}});
  join(other, parts);
  refused(other, "twice", 7);
  // Member names compile --object does not write, which would unpack outside their place or
  // over one another: refused by name, never an error about link's own folders.
  const auto renamed = [&](const char* kind, const std::string& name) {
    parts = split(made[1]);
    for (auto& m : parts.header["members"])
      if (m["kind"] == kind) {
        m["name"] = name;
        break;
      }
    join(other, parts);
  };
  for (const auto& [kind, name] : std::vector<std::pair<const char*, std::string>>{
           {"model", "sub/decoder_decode.onnx"}, {"model", "../decoder_decode.onnx"}, {"entry", "abc"},
           {"entry", std::string(32, 'g')}, {"model", "a//b.onnx"}}) {
    renamed(kind, name);
    refused(other, "member name '" + name + "' is not a name compile --object writes", 7);
  }
  std::ofstream(other, std::ios::trunc) << "{}";
  refused(other, "not a ctxgen object", 7);
  // Every object alike, but for another machine's CPU level than this one compiles for.
  for (const fs::path& object : made) {
    parts = split(object);
    parts.header["identity"]["hardware_architecture"] = "x86_64 avx2_vnni_2, oneDNN 9.9";
    join(object, parts);
  }
  const auto r = link(made, dir_.path() / "out");
  EXPECT_EQ(r.exit_code, 7) << r.output;
  EXPECT_NE(r.output.find("link it where it was compiled, or compile it again here"), std::string::npos) << r.output;
}

// With the group's manifest, each object takes its model's options from it, and link takes the
// objects in any order and writes what `share --manifest` writes.
TEST_F(ObjectTest, AManifestGivesObjectsTheirOptionsAndLinkItsOrder) {
  const fs::path exports = fs::path(CTXGEN_SOURCE_DIR) / "testdata" / "exports";
  const fs::path manifest = dir_.path() / "group.json";
  std::ofstream(manifest) << nlohmann::json{
      {"models", {{{"path", (exports / "decoder_prefill.onnx").string()}, {"fix_dim", {{"seq", 16}}}},
                  {{"path", (exports / "decoder_decode.onnx").string()}, {"fix_dim", {{"seq", 1}, {"past", 15}}}},
                  {{"path", (exports / "cnn_upsample.onnx").string()}}}},
      {"fix_dim", {{"batch", 1}}},
      {"output_dir", (dir_.path() / "shared").string()},
      {"node_name_prefix", "g_"}}.dump();
  std::vector<fs::path> made;
  for (const char* stem : {"cnn_upsample", "decoder_decode", "decoder_prefill"}) {  // not the manifest's order
    made.push_back(dir_.path() / (std::string(stem) + ".ctxo"));
    const auto r = ctxgen("compile " + quote(exports / (std::string(stem) + ".onnx")) + " --manifest " + quote(manifest) +
                          " --object " + quote(made.back()) + " -q");
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  auto r = link(made, dir_.path() / "linked", "--manifest " + quote(manifest));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = ctxgen("share --manifest " + quote(manifest) + " -q");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  expect_same_files(file_contents(dir_.path() / "shared"), file_contents(dir_.path() / "linked"));
  // An object compiled with other dims than the manifest gives its model is refused.
  r = ctxgen("compile " + quote(exports / "decoder_decode.onnx") + " --manifest " + quote(manifest) +
             " --fix-dim past=3 --force --object " + quote(made[1]) + " -q");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = link(made, dir_.path() / "again", "--manifest " + quote(manifest));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("was compiled with other shape options than the manifest gives decoder_decode.onnx"),
            std::string::npos) << r.output;
}

TEST_F(ObjectTest, AnObjectIsAnOutputLikeAnyOther) {
  const fs::path model = mixed_group()[2];
  const fs::path object = dir_.path() / "cnn.ctxo";
  auto r = ctxgen("compile " + quote(model) + " --fix-dim batch=1 --object " + quote(object) + " -q");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = ctxgen("compile " + quote(model) + " --fix-dim batch=1 --object " + quote(object));
  EXPECT_EQ(r.exit_code, 5) << r.output;  // exists, without --force
  r = ctxgen("compile " + quote(model) + " --fix-dim batch=1 --object " + quote(object) + " --output-dir " + quote(dir_.path()));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--object writes the object alone"), std::string::npos) << r.output;
  EXPECT_EQ(files_in(dir_.path()), (std::set<std::string>{"cnn.ctxo"}));  // no staging left behind
}

}  // namespace
}  // namespace ctxgen::testing
