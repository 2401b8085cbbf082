// The command line behaves like the tools people know: `help CMD`, -V, one-line parser errors,
// hints that name the fix, inspect on an uncompiled model, no empty side files, bash completion.

#include <algorithm>
#include <utility>
#include <vector>

#include <onnx/common/version.h>

#include <nlohmann/json.hpp>

#include "e2e.h"

namespace ctxgen::testing {
namespace {

size_t lines(const std::string& text) { return static_cast<size_t>(std::count(text.begin(), text.end(), '\n')); }

TEST(Cli, HelpOfACommand) {
  auto r = ctxgen("help compile");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("--external-initializers-file"), std::string::npos) << r.output;
  // compile takes a manifest only for an object (share's manifest option is share's).
  EXPECT_NE(r.output.find("With --object: the share manifest"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("A JSON file describing the models"), std::string::npos) << "share's option in compile's help:\n" << r.output;
  r = ctxgen("help");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("Subcommands:"), std::string::npos) << r.output;
  r = ctxgen("help nope");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_EQ(r.output, "error: help: no command 'nope' (see 'ctxgen help')\n");
}

TEST(Cli, VersionNamesWhatCtxgenWasBuiltWith) {
  for (const char* flag : {"-V", "--version"}) {
    auto r = ctxgen(flag);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(r.output.rfind(std::string("ctxgen ") + CTXGEN_VERSION + " (", 0), 0u) << r.output;
    EXPECT_NE(r.output.find(std::string("onnx ") + onnx::LAST_RELEASE_VERSION), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("ref ctxgen-ref 3.7"), std::string::npos) << r.output;
  }
}

TEST(Cli, ParserErrorsAreOneErrorLineNamingTheHelp) {
  auto r = ctxgen("compile");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_EQ(r.output, "error: model is required (see 'ctxgen help compile')\n");
  r = ctxgen("share a.onnx --frobnicate");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_EQ(r.output.rfind("error: ", 0), 0u) << r.output;
  EXPECT_NE(r.output.find("--frobnicate' for share (see 'ctxgen help share')"), std::string::npos) << r.output;
  EXPECT_EQ(lines(r.output), 1u) << r.output;
  // A newcomer's first typos name the word meant.
  for (const auto& [args, said] : std::vector<std::pair<std::string, std::string>>{
           {"complie m.onnx", "error: no command 'complie' (did you mean 'compile'?) (see 'ctxgen help')\n"},
           {"compile m.onnx --fix-dims batch=1", "error: no option '--fix-dims' for compile (did you mean '--fix-dim'?) (see 'ctxgen help compile')\n"},
           {"share a.onnx,b.onnx --reprot=r.json", "error: no option '--reprot' for share (did you mean '--report'?) (see 'ctxgen help share')\n"}}) {
    r = ctxgen(args);
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_EQ(r.output, said);
  }
}

TEST(Cli, VerifysNumbersAndChoicesAreChecked) {
  for (const char* args : {"--error-stat p95", "--reference-precision float16", "--rtol -1", "--atol x",
                           "--max-error-ratio 0", "--max-error-ratio nan", "--max-error-ratio 2",
                           "--min-cosine 1.5", "--min-snr x"}) {
    auto r = ctxgen(std::string("verify m_ctx.onnx ") + args);
    EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.output;
    EXPECT_EQ(r.output.rfind("error: --", 0), 0u) << r.output;
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
  }
}

TEST(Cli, NothingCompiledNamesTheDimsToFreeze) {
  TempDir dir;
  auto r = ctxgen("compile " + quote(copy_model("dynamic.onnx", dir.path())) + " --output-dir " + quote(dir / "out"));
  EXPECT_EQ(r.exit_code, 4) << r.output;
  EXPECT_NE(r.output.find("its inputs have open dims: freeze them with --fix-dim batch=N, or pass --allow-empty"),
            std::string::npos)
      << r.output;
  r = ctxgen("compile " + quote(copy_model("dynamic.onnx", dir.path())) + " --output-dir " + quote(dir / "out") +
             " --fix-dim batch=2");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  // Where some nodes compile and the dynamic ones stay on CPU, the fix is said too, once.
  const fs::path cnn = fs::path(CTXGEN_SOURCE_DIR) / "testdata" / "exports" / "cnn_upsample.onnx";
  r = ctxgen("compile " + quote(cnn) + " --output-dir " + quote(dir / "partial"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("nodes stay on CPU for dynamic shapes; its inputs have open dims: freeze them with --fix-dim batch=N\n"),
            std::string::npos)
      << r.output;
  r = ctxgen("compile " + quote(cnn) + " --output-dir " + quote(dir / "whole") + " --fix-dim batch=1");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.find("dynamic shapes"), std::string::npos) << r.output;
}

TEST(Cli, InspectSaysWhenAModelIsNotCompiled) {
  auto r = ctxgen("inspect " + quote(generated_models() / "cnn.onnx"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("no EPContext node: this model is not compiled"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("  nodes: 10"), std::string::npos) << r.output;
  // Its inputs and outputs, an open dim by the name --fix-dim takes.
  r = ctxgen("inspect " + quote(generated_models() / "dynamic.onnx"));
  EXPECT_NE(r.output.find("  input x: float32 [batch,8]\n  output y: float32 [batch,4]\n"), std::string::npos) << r.output;
  r = ctxgen("inspect --json " + quote(generated_models() / "dynamic.onnx"));
  EXPECT_EQ(nlohmann::json::parse(r.output)["inputs"][0]["dims"], nlohmann::json::parse(R"(["batch", 8])")) << r.output;
}

TEST(Cli, NoEmptyExternalWeightsFile) {
  TempDir dir;
  auto r = ctxgen("compile " + quote(copy_model("cnn.onnx", dir.path())) + " --output-dir " + quote(dir / "out") +
                  " --external-initializers-file w.data");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(files_in(dir / "out"), (std::set<std::string>{"cnn_ctx.onnx", "cnn_ref.bin"}));
  EXPECT_NE(r.output.find("w.data is not written"), std::string::npos) << r.output;
  // One an earlier run left would sit beside models that do not use it: --force removes it.
  write_file(dir / "out" / "w.data", "an earlier run's weights");
  r = ctxgen("compile " + quote(dir / "cnn.onnx") + " --output-dir " + quote(dir / "out") +
             " --external-initializers-file w.data --force");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(files_in(dir / "out"), (std::set<std::string>{"cnn_ctx.onnx", "cnn_ref.bin"}));
}

// In a group, the suggested --fix-dim is scoped to the model that needs it.
TEST(Cli, TheDimsHintIsScopedInAGroup) {
  TempDir dir;
  auto r = ctxgen("share " + quote(copy_model("dynamic.onnx", dir.path())) + "," +
                  quote(copy_model("unsupported.onnx", dir.path())) + " --output-dir " + quote(dir / "out"));
  EXPECT_EQ(r.exit_code, 4) << r.output;
  EXPECT_NE(r.output.find("freeze them with --fix-dim dynamic:batch=N, or pass --allow-empty"), std::string::npos)
      << r.output;
}

// The completion asks the ctxgen it completes for its commands and options.
TEST(Cli, BashCompletionOffersCommandsAndTheirOptions) {
  auto complete = [](const std::string& words) {
    // The script and the binary as arguments, so their paths need no quoting inside the script.
    return run_command("bash -c 'source \"$0\"; COMP_WORDS=(\"$1\" " + words +
                       "); COMP_CWORD=$((${#COMP_WORDS[@]}-1)); _ctxgen; echo \"${COMPREPLY[*]}\"' " +
                       quote(fs::path(CTXGEN_SOURCE_DIR) / "apps/ctxgen/completion.bash") + " " + quote(CTXGEN_BINARY))
        .output;
  };
  EXPECT_EQ(complete("sh"), "share\n");
  EXPECT_EQ(complete("compile --fo"), "--force\n");
  EXPECT_EQ(complete("share --fix"), "--fix-dim --fix-value\n");
  EXPECT_EQ(complete("--li"), "--list-backends\n");
  EXPECT_EQ(complete("help in"), "inspect\n");
}

}  // namespace
}  // namespace ctxgen::testing
