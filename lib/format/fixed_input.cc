// The values a graph was compiled for (FixedInput): their sizes, and their text in messages.

#include <cstdio>
#include <cstring>

#include "ctxgen/compiled.h"

namespace ctxgen {

size_t fixed_element_size(int32_t elem_type) {
  switch (elem_type) {
    case 1: case 6: return 4;   // float, int32
    case 7: case 11: return 8;  // int64, double
    case 9: return 1;           // bool
    default: return 0;
  }
}

std::string fixed_values_text(int32_t elem_type, const uint8_t* data, size_t count) {
  std::string text;
  for (size_t i = 0; i < count && i < 8; ++i) {
    char buf[32] = "?";
    const uint8_t* at = data + i * fixed_element_size(elem_type);
    auto read = [at](auto value) {
      std::memcpy(&value, at, sizeof value);
      return value;
    };
    switch (elem_type) {
      case 1: std::snprintf(buf, sizeof buf, "%.9g", read(0.0f)); break;
      case 11: std::snprintf(buf, sizeof buf, "%.17g", read(0.0)); break;
      case 6: std::snprintf(buf, sizeof buf, "%d", read(int32_t{0})); break;
      case 7: std::snprintf(buf, sizeof buf, "%lld", static_cast<long long>(read(int64_t{0}))); break;
      case 9: std::snprintf(buf, sizeof buf, "%s", *at ? "true" : "false"); break;
      default: break;
    }
    text += (i > 0 ? ", " : "") + std::string(buf);
  }
  if (count > 8) text += ", ...";
  return count == 1 ? text : "[" + text + "]";
}

}  // namespace ctxgen
