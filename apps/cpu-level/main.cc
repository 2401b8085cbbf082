// ctxgen-cpu-level LEVEL: started by a compile for a CPU level other than its own process's, with
// a socket as standard input (runtime::CpuTarget); not a command for people.
#include <cstdio>

#include "ctxgen/runtime.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "ctxgen-cpu-level LEVEL: started by ctxgen to compile for a CPU level, not by hand\n");
    return 2;
  }
  return ctxgen::runtime::serve_cpu_level(argv[1], 0);
}
