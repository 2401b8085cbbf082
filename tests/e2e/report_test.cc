// --report as a pipeline relies on it: docs/report-schema.json holds for every report, a failed run
// reports its error, `-` is standard output, and a report never costs the user a file.
#include <nlohmann/json.hpp>

#include "e2e.h"

namespace ctxgen::testing {
namespace {

const fs::path kSchema = fs::path(CTXGEN_SOURCE_DIR) / "docs/report-schema.json";

void expect_valid(const fs::path& report, const std::string& stdin_text = "") {
  expect_valid_json(kSchema, report, stdin_text);
}

nlohmann::json read_json(const fs::path& path) {
  auto json = nlohmann::json::parse(read_file(path), nullptr, false);
  EXPECT_FALSE(json.is_discarded()) << path;
  return json;
}

std::vector<std::string> stages(const nlohmann::json& report) {
  std::vector<std::string> names;
  for (const auto& t : report["timings"]) names.push_back(t["stage"]);
  return names;
}

TEST(Report, SuccessCarriesVersionOptionsAndStructuredTimings) {
  TempDir dir;
  fs::path model = copy_model("dynamic.onnx", dir / "m");
  auto r = ctxgen("compile " + quote(model) + " --output-dir " + quote(dir / "out") + " --fix-dim batch=1 --report " +
                  quote(dir / "r.json"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  expect_valid(dir / "r.json");
  auto report = read_json(dir / "r.json");
  EXPECT_EQ(report["schema_version"], 1);
  EXPECT_EQ(report["ctxgen_version"], CTXGEN_VERSION);
  EXPECT_EQ(report["status"], "ok");
  EXPECT_FALSE(report.contains("error"));
  EXPECT_EQ(report["options"]["inputs"], nlohmann::json::array({model.string()}));
  EXPECT_EQ(report["options"]["output_dir"], (dir / "out").string());
  EXPECT_EQ(report["options"]["per_model"][0]["fix_dims"]["batch"], 1);
  EXPECT_EQ(report["options"]["force"], false);
  EXPECT_EQ(stages(report), (std::vector<std::string>{"load", "specialise", "partition", "compile",
                                                      "write_context_binary", "build_models", "write_models"}));
  EXPECT_EQ(report["timings"][0]["model"], model.string());
  EXPECT_TRUE(report["timings"][4]["model"].is_null());
  double sum = 0;
  for (const auto& t : report["timings"]) sum += t["milliseconds"].get<double>();
  EXPECT_DOUBLE_EQ(report["total_milliseconds"].get<double>(), sum);
}

TEST(Report, FailedRunReportsTheErrorAndWritesNothingElse) {
  TempDir dir;
  fs::path model = copy_model("unsupported.onnx", dir / "m");
  auto r = ctxgen("compile " + quote(model) + " --output-dir " + quote(dir / "out") + " --report " +
                  quote(dir / "out" / "r.json"));
  ASSERT_EQ(r.exit_code, 4) << r.output;
  EXPECT_EQ(files_in(dir / "out"), std::set<std::string>{"r.json"});
  expect_valid(dir / "out" / "r.json");
  auto report = read_json(dir / "out" / "r.json");
  EXPECT_EQ(report["status"], "failed");
  EXPECT_EQ(report["error"]["code"], "nothing_compiled");
  EXPECT_EQ(report["error"]["exit_code"], 4);
  const std::string message = report["error"]["message"];
  EXPECT_NE(r.output.find("error: " + message), std::string::npos) << "the message is the one printed\n" << r.output;
  EXPECT_EQ(stages(report), (std::vector<std::string>{"load", "specialise", "partition"})) << "what was done";
  EXPECT_FALSE(report.contains("outputs"));
}

TEST(Report, DashIsStandardOutputOnSuccessAndFailure) {
  TempDir dir;
  fs::path model = copy_model("cnn.onnx", dir / "m");
  // Standard output alone (2>/dev/null): the JSON, nothing else; the summary went to stderr.
  auto ok = run_command("(cd " + quote(dir.path()) + " && " + CTXGEN_BINARY + " compile " + quote(model) +
                        " --output-dir out --report - 2>/dev/null)");
  ASSERT_EQ(ok.exit_code, 0) << ok.output;
  auto report = nlohmann::json::parse(ok.output, nullptr, false);
  ASSERT_FALSE(report.is_discarded()) << ok.output;
  expect_valid("-", ok.output);
  EXPECT_EQ(report["status"], "ok");
  EXPECT_FALSE(fs::exists(dir / "-"));
  EXPECT_FALSE(fs::exists(dir / "out" / "-"));
  EXPECT_EQ(files_in(dir / "out"), (std::set<std::string>{"cnn_ctx.onnx", "cnn_ref.bin"}));
  auto text = run_command("(" + std::string(CTXGEN_BINARY) + " compile " + quote(model) + " --output-dir " +
                          quote(dir / "out2") + " --report - >/dev/null)");
  EXPECT_NE(text.output.find("wrote "), std::string::npos) << "the summary goes to stderr\n" << text.output;

  auto failed = run_command("(" + std::string(CTXGEN_BINARY) + " compile " + quote(model) + " --output-dir " +
                            quote(dir / "out") + " --report - 2>/dev/null)");
  ASSERT_EQ(failed.exit_code, 5) << failed.output;
  expect_valid("-", failed.output);
  EXPECT_EQ(nlohmann::json::parse(failed.output)["error"]["code"], "output_exists");
}

// A run refused over its outputs writes no report (its path is one of them) and says only why it
// was refused; a failure report replaces an earlier report only with --force, and never another
// file.
TEST(Report, FailureReportNeverCostsAFile) {
  TempDir dir;
  fs::path model = copy_model("cnn.onnx", dir / "m");
  std::string before = read_file(model);
  auto r = ctxgen("compile " + quote(model) + " --force --report " + quote(model));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_EQ(read_file(model), before);
  const std::string said = without_progress(r.output);
  EXPECT_EQ(std::count(said.begin(), said.end(), '\n'), 1) << r.output;

  fs::path unsupported = copy_model("unsupported.onnx", dir / "m");
  write_file(dir / "notes.txt", "keep me");
  r = ctxgen("compile " + quote(unsupported) + " --force --output-dir " + quote(dir / "out") + " --report " +
             quote(dir / "notes.txt"));
  EXPECT_EQ(r.exit_code, 4) << r.output;
  EXPECT_EQ(read_file(dir / "notes.txt"), "keep me");
  EXPECT_NE(r.output.find("notes.txt exists and is not a ctxgen report"), std::string::npos) << r.output;

  // An earlier report stays without --force, and is replaced with it.
  ASSERT_EQ(ctxgen("compile " + quote(model) + " --output-dir " + quote(dir / "o2") + " --report " +
                   quote(dir / "r.json")).exit_code, 0);
  r = ctxgen("compile " + quote(unsupported) + " --output-dir " + quote(dir / "o3") + " --report " + quote(dir / "r.json"));
  EXPECT_EQ(r.exit_code, 5) << r.output;  // the report exists: refused with the other outputs
  EXPECT_EQ(read_json(dir / "r.json")["status"], "ok");
  r = ctxgen("compile " + quote(unsupported) + " --force --output-dir " + quote(dir / "o3") + " --report " +
             quote(dir / "r.json"));
  EXPECT_EQ(r.exit_code, 4) << r.output;
  EXPECT_EQ(read_json(dir / "r.json")["status"], "failed");
  EXPECT_FALSE(fs::exists(dir / "o3" / "unsupported_ctx.onnx"));
}

}  // namespace
}  // namespace ctxgen::testing
