#include "ctxgen/backend.h"
#include "ctxgen/error.h"

namespace ctxgen {

void Backend::refuse_settings(const BackendSettings& settings) const {
  if (!settings.target.empty())
    throw Error(ErrorCode::kUsage, "--target-cpu " + settings.target + ": backend '" + name() + "' compiles for one target only");
  if (settings.weightless)
    throw Error(ErrorCode::kUsage, "--weightless: backend '" + name() + "' cannot leave weights in the model's files");
}

std::optional<std::vector<uint8_t>> Backend::renumber_weights(const std::vector<uint8_t>&,
                                                             const std::function<uint32_t(uint32_t)>&) const {
  return std::nullopt;
}

std::optional<std::vector<uint64_t>> Backend::weight_reads(const std::vector<uint8_t>&, size_t) const { return std::nullopt; }

void BackendRegistry::add(std::unique_ptr<Backend> backend) {
  if (!backend) throw Error(ErrorCode::kInternal, "backend registry: null backend");
  if (find(backend->name()))
    throw Error(ErrorCode::kInternal, "backend registry: a backend named '" + backend->name() + "' is already registered");
  backends_.push_back(std::move(backend));
}

const Backend* BackendRegistry::find(const std::string& name) const {
  for (const auto& b : backends_)
    if (b->name() == name) return b.get();
  return nullptr;
}

std::vector<const Backend*> BackendRegistry::list() const {
  std::vector<const Backend*> all;
  for (const auto& b : backends_) all.push_back(b.get());
  return all;
}

BackendRegistry builtin_backends() {
  BackendRegistry registry;
  registry.add(make_ref_backend());
  return registry;
}

}  // namespace ctxgen
