// ctxgen/embedded.h's wire reader on arbitrary bytes, against protobuf's own parse: both refuse
// the bytes, or both accept them and, the cut bytes restored, give the same message. Anything
// else aborts, as a crash would.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "slim_oracle.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const ctxgen::testing::Agreement a = ctxgen::testing::agree(std::string(reinterpret_cast<const char*>(data), size));
  if (!a.agrees()) {
    std::fprintf(stderr, "slim_model disagrees with protobuf (protobuf %s, slim %s): %s\n",
                 a.protobuf_parsed ? "parsed" : "refused", a.slim_parsed ? "parsed" : "refused", a.why.c_str());
    std::abort();
  }
  return 0;
}
