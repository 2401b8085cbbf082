// Compiles a model with the ctxgen libraries, then runs the result in ONNX Runtime through the
// installed plugin EP:   consumer MODEL OUTPUT_DIR
#include <cstdio>
#include <exception>

#include "ctxgen/error.h"
#include "ctxgen/pipeline.h"
#include "ctxgen/runtime.h"
#include "ctxgen/verify.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: consumer MODEL OUTPUT_DIR\n");
    return 2;
  }
  try {
    ctxgen::CompileOptions options;
    options.output_dir = argv[2];
    options.force = true;
    const auto run = ctxgen::compile_models({argv[1]}, options, ctxgen::builtin_backends());
    std::printf("compiled %zu of %zu nodes\n", run.models.at(0).compiled_nodes, run.models.at(0).node_count);

    ctxgen::verify::Options check;
    check.models = {run.models.at(0).output};
    check.references = {argv[1]};
    check.plugin = PLUGIN_EP;
    check.runtime = ctxgen::runtime::make_ref_runtime();
    const auto result = ctxgen::verify::run(check);
    for (const auto& output : result.outputs)
      std::printf("%s: max abs diff %g\n", output.output.c_str(), output.difference.abs.max);
    return result.ok() ? 0 : 1;
  } catch (const ctxgen::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
