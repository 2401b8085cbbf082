// Built with only `pkg-config --cflags --libs ctxgen`: loads a model and names its first node.
#include <cstdio>

#include "ctxgen/error.h"
#include "ctxgen/model.h"

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  try {
    const auto model = ctxgen::load_model(argv[1]);
    std::printf("%d nodes, first %s\n", model.graph().node_size(), model.graph().node(0).op_type().c_str());
    return 0;
  } catch (const ctxgen::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
