#!/usr/bin/python3
"""ctest -L docs: every code block in docs/*.md is exercised, or says which test covers it.

    docs_test.py BUILD_DIR SOURCE_DIR

Each block (4-space indented or fenced) must match exactly one rule below, found by its file and
first line; a block no rule knows fails the test, so a new example cannot go untested. Rules:
  run       the shell lines run as written (bash, one session per block) in a scratch copy of the
            repository's layout (build/ -> the build tree; testdata/ and scripts/ copied), after
            the rule's setup lines made the files the text talks about;
  sample    lines of output a command prints: it runs, and every sample line must match a line of
            its output with numbers, paths and quoted names masked (so the format cannot drift);
  synopsis  every --option it names is in `ctxgen help COMMAND` for the command on its line;
  cpp       the C++ compiles (-fsyntax-only) against ONNX Runtime's headers;
  messages  the words of quoted error messages (outside run-time values) are in the sources' strings;
  hexdump   a byte dump is the bytes a test checks the writer writes;
  covered   another test runs it: that test's file must contain the block's key parts;
  text      not something to run (a diagram, a byte layout); the reason is given.
"""
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile

build, source = (os.path.realpath(p) for p in sys.argv[1:3])
failures = []


def fail(block, why):
    failures.append("%s (block '%s'): %s" % (block["file"], block["lines"][0][:60], why))


def blocks_of(path):
    """(language, lines) of each code block: fenced, or indented by 4 outside fences and lists."""
    out, fence, current, prev_blank = [], None, None, True
    for line in open(path, encoding="utf-8").read().split("\n"):
        if fence is not None:
            if line.startswith("```"):
                out.append({"lang": fence, "lines": current})
                fence, current = None, None
            else:
                current.append(line)
            continue
        if line.startswith("```"):
            fence, current = line[3:].strip() or "text", []
            continue
        if line.startswith("    ") and line.strip() and (current is not None or prev_blank):
            if current is None:
                current = []
            current.append(line[4:])
        elif current is not None and not fence:
            out.append({"lang": "indented", "lines": current})
            current = None
        prev_blank = not line.strip()
    if current is not None:
        out.append({"lang": "indented", "lines": current})
    return out


def shell_lines(lines):
    """Commands, continuation lines joined, comments kept (bash ignores them)."""
    joined, text = [], ""
    for line in lines:
        text = text + " " + line.strip() if text else line.strip()
        if text.endswith("\\"):
            text = text[:-1].rstrip()
            continue
        joined.append(text)
        text = ""
    return [j for j in joined if j]


class Scratch:
    """A copy of the repository's layout where the docs' commands run as written."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(dir=build, prefix="docs-test.")
        os.symlink(build, os.path.join(self.dir, "build"))
        for part in ("testdata", "scripts"):
            shutil.copytree(os.path.join(source, part), os.path.join(self.dir, part))
        # ctxgen as the docs call it.
        os.makedirs(os.path.join(self.dir, "bin"))
        os.symlink(os.path.join(build, "bin", "ctxgen"), os.path.join(self.dir, "bin", "ctxgen"))
        self.env = dict(os.environ, PATH=os.path.join(self.dir, "bin") + ":" + os.environ["PATH"], BUILD_DIR=build)

    def sh(self, script, cwd=None):
        r = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=cwd or self.dir, env=self.env,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        return r.returncode, r.stdout


def masked(line):
    """A sample line as a pattern: numbers, quoted names, paths and '...' match anything like them."""
    pattern, at = "", 0
    for m in re.finditer(r"\.\.\.|'[^']*'|\"[^\"]*\"|[\w./-]*/[\w./-]+|-?\d+(?:\.\d+)?(?:e[-+]?\d+)?", line):
        pattern += re.escape(line[at:m.start()])
        token = m.group(0)
        pattern += (".*" if token == "..." else "'[^']*'" if token[0] == "'" else "\"[^\"]*\"" if token[0] == '"'
                    else r"\S+" if "/" in token else r"[-+]?(?:[\d.]+(?:e[-+]?\d+)?|inf|nan)")
        at = m.end()
    return re.compile(pattern + re.escape(line[at:]))


def check_sample(block, output):
    got = [re.sub(r"\s+", " ", l.strip()) for l in output.split("\n")]
    for line in block["lines"]:
        want = masked(re.sub(r"\s+", " ", line.strip()))
        if line.strip() and not any(want.fullmatch(g) for g in got):
            fail(block, "no line of the real output looks like the sample line\n  %s\noutput:\n%s" % (line, output[-3000:]))


def rule_run(setup=""):
    def run(block, scratch):
        script = setup + "\n" + "\n".join(shell_lines(block["lines"]))
        code, out = scratch.sh(script)
        if code != 0:
            fail(block, "exit %d:\n%s" % (code, out[-3000:]))
    return run


def rule_sample(command, in_source=False):
    """in_source: a script of the repository, run where it is (it builds in build/ as it would)."""
    def sample(block, scratch):
        code, out = scratch.sh(command, cwd=source if in_source else None)
        if code != 0:
            fail(block, "the command behind the sample failed (exit %d): %s\n%s" % (code, command, out[-3000:]))
        check_sample(block, out)
    return sample


def rule_synopsis(block, scratch):
    for line in shell_lines(block["lines"]):
        m = re.match(r"ctxgen\s+(\w+)?", line)
        if not m:
            fail(block, "not a ctxgen command line: " + line)
            continue
        command = m.group(1) if m.group(1) in ("compile", "share", "inspect", "verify", "cache", "link", "help") else ""
        _, helptext = scratch.sh("ctxgen help %s" % command if command else "ctxgen --help")
        for option in re.findall(r"(?<![\w-])(--?[A-Za-z][\w-]*)", line):
            if not re.search(r"(^|[\s,])" + re.escape(option) + r"\b", helptext):
                fail(block, "'%s' is not an option of 'ctxgen %s'" % (option, command))


def rule_cpp(preamble="", epilogue=""):
    def cpp(block, scratch):
        includes = [l for l in block["lines"] if l.startswith("#include")]
        body = [l for l in block["lines"] if not l.startswith("#include")]
        program = "\n".join(["#include <onnxruntime_cxx_api.h>", "#include <string>", "#include <unordered_map>",
                             "#include <vector>"] + includes + ["int main() {", preamble] + body + [epilogue, "}"])
        path = os.path.join(scratch.dir, "snippet.cc")
        open(path, "w").write(program)
        r = subprocess.run(["c++", "-std=c++17", "-fsyntax-only", "-Wall", "-Wno-unused-variable",
                            "-I", os.path.join(source, "third_party/onnxruntime/include"), path],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if r.returncode != 0:
            fail(block, "does not compile:\n" + r.stdout[-3000:])
    return cpp


def rule_messages(sources):
    """A message is put together at run time, so its words are checked, not its sentences: every word
    outside the quoted (run-time) values must be in the string literals of the sources."""
    def messages(block, scratch):
        literals = set()
        for pattern in sources:
            for path in glob.glob(os.path.join(source, pattern)):
                for literal in re.findall(r'"((?:[^"\\]|\\.)*)"', open(path, encoding="utf-8").read()):
                    literals.update(re.findall(r"[A-Za-z][\w.=]*", literal))
        for line in block["lines"]:
            for part in re.split(r"'[^']*'|\S*/\S*", line):
                for word in re.findall(r"[A-Za-z][\w.=]*", part):
                    if len(word) >= 4 and word.rstrip(".") not in literals and word not in literals:
                        fail(block, "the word '%s' is in no string of %s" % (word, " ".join(sources)))
    return messages


def rule_hexdump(test, name):
    """The dump's bytes (zero padding written as a range) are the bytes the named test writes."""
    def hexdump(block, scratch):
        dump = bytearray()
        for line in block["lines"]:
            m = re.match(r"([0-9a-f]{8})(?:\.\.([0-9a-f]{8}))?: ((?:[0-9a-f]{2} ?)*)", line)
            if m.group(2):
                dump += bytes(int(m.group(2), 16) + 1 - int(m.group(1), 16))
            else:
                if int(m.group(1), 16) != len(dump):
                    fail(block, "offset %s after %d bytes" % (m.group(1), len(dump)))
                dump += bytes.fromhex(m.group(3))
        text = open(os.path.join(source, test), encoding="utf-8").read()
        body = text[text.index(name):]
        written = bytes.fromhex("".join(re.findall(r'^\s*"([0-9a-f]+)"', body[:body.index(";")], re.M)))
        if bytes(dump) != written:
            fail(block, "the dump is not the %d bytes %s checks the writer writes" % (len(written), name))
    return hexdump


def rule_covered(test, *parts):
    def covered(block, scratch):
        text = open(os.path.join(source, test), encoding="utf-8").read()
        for part in parts:
            if part not in text:
                fail(block, "said to be covered by %s, which does not contain '%s'" % (test, part))
    return covered


def rule_text(reason):
    return lambda block, scratch: None


LLM = ("/usr/bin/python3 scripts/gen_llm_pair.py dist --size-mb 4 --hidden 128 >/dev/null && "
       "ctxgen share dist/prefill.onnx,dist/decode.onnx -q --force && ")
DECODER = "cp testdata/exports/decoder_prefill.onnx prefill.onnx && cp testdata/exports/decoder_decode.onnx decode.onnx"

# (file, first line, rule)
RULES = [
    ("adding-a-backend.md", r"class MyBackend", rule_covered("tests/ort/test_backend.cc",
     "BinaryIdentity identity() const override", "NodeSupport supports(", "CompiledGraph compile(")),
    ("adding-a-backend.md", r"class MyRuntime", rule_covered("tests/ort/test_runtime.cc",
     "BinaryIdentity identity() const override", "std::unique_ptr<GraphRunner> load(")),
    ("adding-a-backend.md", r'#include "compile_in_session.h"', rule_covered("tests/ort/test_plugin.cc",
     '#include "plugin_backend.h"', "ctxgen::ort_ep::make_backend_runtime()", "ctxgen::ort_ep::make_session_compiler(",
     "compile_in_session(")),
    ("adding-a-backend.md", r"ctxgen_add_plugin_ep", rule_covered("tests/ort/CMakeLists.txt", "ctxgen_add_plugin_ep(")),
    ("architecture.md", r"model files", rule_text("a diagram of the stages")),
    ("architecture.md", r"common <- model", rule_text("the layering; the CMake targets enforce it (a stage that "
                                                      "includes a header of one it does not link fails to build)")),
    ("benchmarks.md", r"scripts/bench.sh \[", rule_text("its synopsis; the sample below runs scripts/bench.sh 8")),
    ("benchmarks.md", r"external data -- input: ", rule_sample("scripts/bench.sh 8", in_source=True)),
    ("benchmarks.md", r"inference, prefill.onnx", rule_sample("RUNS=1 scripts/bench.sh 8", in_source=True)),
    ("benchmarks.md", r"sudo apt-get install libopenblas-dev", rule_covered(
        "apps/gemm-bench/CMakeLists.txt", "CTXGEN_OPENBLAS_LIBRARY", "CTXGEN_BLIS_LIBRARY", "Eigen3", "gemm_bench_smoke")),
    ("ci.md", r"env:", rule_covered("scripts/ci_example.sh", "--object", "link", "--cache", "verify",
     "--reference")),
    ("cli.md", r"ctxgen compile MODEL", rule_synopsis),
    ("cli.md", r"ctxgen share prefill.onnx", rule_run(setup=DECODER)),
    ("cli.md", r"# one build for the AVX2", rule_covered("tests/e2e/package_test.cc", "--target-cpu sse41,avx2 --package",
     "--package")),
    ("cli.md", r"dist/llm/manifest.json", rule_covered("tests/e2e/package_test.cc", "shared_assets",
     "variant_directory", "session.model_external_initializers_file_folder_path")),
    ("cli.md", r"auto create_options", rule_covered("tests/ort/ort_package_test.cc",
     "CreateModelPackageOptionsFromSessionOptions", "CreateSession", "SelectComponent")),
    ("cli.md", r"ctxgen compile model.onnx --weightless", rule_covered("tests/e2e/weightless_verify_test.cc",
     "--weightless", "weightless_ref.bin", "source.kind, WeightFileKind::kSourceData")),
    ("cli.md", r'\{"models"', None),  # a manifest: written to group.json and shared (below)
    ("cli.md", r"ctxgen inspect testdata/exports", rule_run(setup="ctxgen compile testdata/cnn.onnx -q --force")),
    ("conformance.md", r"scripts/conformance.sh +# all four", None),  # line by line (below)
    ("conformance.md", r"models: ", rule_sample("scripts/conformance.sh --suite node --filter conv", in_source=True)),
    ("context-binary-format.md", r"offset 0 ", rule_text("the byte layout; format_test checks every rule of it")),
    ("context-binary-format.md", r"M +=", rule_text("the layout's arithmetic; format_test checks every rule of it")),
    ("context-binary-format.md", r"00000000:", rule_hexdump("tests/unit/format_test.cc", "WorkedExampleFromTheSpec")),
    ("fuzzing.md", r"scripts/fuzz.sh model_load", rule_covered("fuzz/CMakeLists.txt", "scripts/fuzz.sh --binary")),
    ("install.md", r"cmake --install build --prefix", rule_covered("tests/install/install_test.sh", "cmake --install")),
    ("install.md", r"libdnnl.so.2 libgomp.so.1", rule_covered("tests/install/install_test.sh",
     "for plugin in libctxgen_ort_ep_runtime.so", "readelf -d", "ldd")),
    ("install.md", r"find_package\(ctxgen", rule_covered("tests/install/consumer/CMakeLists.txt",
                                                         "find_package(ctxgen", "ctxgen::pipeline", "ctxgen::verify")),
    ("install.md", r"export PKG_CONFIG_PATH=", rule_covered("tests/install/install_test.sh", "export PKG_CONFIG_PATH=",
                                                             "$(pkg-config --cflags --libs ctxgen)")),
    ("ort-plugin-ep.md", r"scripts/install_ort.sh", rule_covered("scripts/setup.sh", "install_ort.sh", "CTXGEN_ORT_ROOT")),
    ("ort-plugin-ep.md", r"#include <onnxruntime_cxx_api.h>", rule_cpp()),
    ("ort-plugin-ep.md", r'options.AddConfigEntry\("ep.context_file_path"',
     rule_cpp(preamble="Ort::Env env; Ort::SessionOptions options; std::vector<char> bytes;")),
    ("ort-plugin-ep.md", r"import onnxruntime", rule_text("Python: neither Debian nor npm offers the onnxruntime "
                                                          "module; the C++ block above is the same calls")),
    ("ort-plugin-ep.md", r"EPContext node 'add_node': ep_cache_context '\.\./", rule_messages(["lib/ort_ep/*.cc", "lib/format/context_path.cc", "lib/format/backend_runtime.cc"])),
    ("ort-plugin-ep.md", r"ctxgen compile testdata/cnn.onnx --output-dir out -q --force$", rule_run()),
    ("ort-plugin-ep.md", r"EPContext node generated by 'CtxgenRef' is not compatible",
     rule_covered("tests/ort/ort_plugin_test.cc", "is not compatible with any execution provider added to the")),
    ("verify.md", r"ctxgen verify dist/prefill_ctx.onnx", rule_synopsis),
    ("verify.md", r"ok    dist/prefill_ctx.onnx: output 'hidden_out' \[128x1024\] against the float32",
     rule_sample(LLM + "ctxgen verify dist/prefill_ctx.onnx --reference dist/prefill.onnx")),
    ("verify.md", r"ok    out/cnn_upsample_qdq_u8s8_ctx.onnx: output 'logits'", rule_sample(
        "ctxgen compile testdata/quantized/cnn_upsample_qdq_u8s8.onnx --fix-dim batch=1 --output-dir out -q --force && "
        "ctxgen verify out/cnn_upsample_qdq_u8s8_ctx.onnx --reference testdata/quantized/cnn_upsample_qdq_u8s8.onnx")),
    ("verify.md", r"ok    dist/prefill_ctx.onnx: output 'hidden_out' \[128x1024\] against the float64",
     rule_sample(LLM + "ctxgen verify dist/prefill_ctx.onnx --reference dist/prefill.onnx --reference-precision float64")),
]


def manifest(block, scratch):
    open(os.path.join(scratch.dir, "group.json"), "w").write("\n".join(block["lines"]) + "\n")
    code, out = scratch.sh(DECODER + " && ctxgen share --manifest group.json --force")
    if code != 0:
        fail(block, "ctxgen share --manifest group.json failed (exit %d):\n%s" % (code, out[-3000:]))


def conformance_lines(block, scratch):
    for line in shell_lines(block["lines"]):
        if line.startswith("scripts/conformance.sh --suite"):
            code, out = scratch.sh(line.replace("--json out.json", "--json " + os.path.join(scratch.dir, "out.json")),
                                   cwd=source)
            if code != 0 or not os.path.exists(os.path.join(scratch.dir, "out.json")):
                fail(block, "exit %d: %s\n%s" % (code, line, out[-3000:]))
        elif not re.match(r"(scripts/conformance.sh|ctest --test-dir build -L conformance) +#", line):
            fail(block, "a line nothing runs: " + line)
        # the whole run and its ctest label are `ctest -L conformance` itself


SPECIAL = {r'\{"models"': manifest, r"scripts/conformance.sh +# all four": conformance_lines}


def main():
    scratch = Scratch()
    seen, used = 0, set()
    try:
        for path in sorted(glob.glob(os.path.join(source, "docs", "*.md"))):
            name = os.path.basename(path)
            for block in blocks_of(path):
                block["file"] = "docs/" + name
                first = block["lines"][0].strip()
                matches = [(pattern, rule) for f, pattern, rule in RULES if f == name and re.match(pattern, first)]
                if len(matches) != 1:
                    fail(block, "%d rules match it; give it exactly one in tests/docs/docs_test.py" % len(matches))
                    continue
                pattern, rule = matches[0]
                (rule or SPECIAL[pattern])(block, scratch)
                seen += 1
                used.add((name, pattern))
        for f, pattern, _ in RULES:
            if (f, pattern) not in used:
                failures.append("the rule for docs/%s '%s' matches no block (it changed or went away)" % (f, pattern))
    finally:
        shutil.rmtree(scratch.dir, ignore_errors=True)
    for f in failures:
        print("docs_test: " + f, file=sys.stderr)
    print("docs_test: %d blocks of docs/*.md checked, %d problem(s)" % (seen, len(failures)))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
