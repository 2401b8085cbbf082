#include "ctxgen/backend_runtime.h"

namespace ctxgen {

Judgement judge_fields(const BinaryIdentity& binary, const BinaryIdentity& ours, bool hardware) {
  const std::pair<const char*, std::pair<std::string, std::string>> fields[] = {
      {"backend", {binary.backend, ours.backend}},
      {"sdk_version", {binary.sdk_version, ours.sdk_version}},
      {"format version", {std::to_string(binary.format_version), std::to_string(ours.format_version)}},
      {"hardware_architecture", {binary.hardware_architecture, ours.hardware_architecture}}};
  for (const auto& [field, values] : fields) {
    if (!hardware && std::string(field) == "hardware_architecture") continue;
    if (values.first != values.second)
      return {Fit::kUnsupported, std::string(field) + " is '" + values.first + "' but this EP expects '" + values.second + "'"};
  }
  return {Fit::kOptimal, ""};
}

Judgement BackendRuntime::judge(const BinaryIdentity& binary) const { return judge_fields(binary, identity(), true); }

}  // namespace ctxgen
