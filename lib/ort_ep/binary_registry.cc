#include "binary_registry.h"

#include <atomic>

namespace ctxgen::ort_ep {
namespace {

std::atomic<uint64_t> g_opened{0};
std::atomic<uint64_t> g_live{0};

// Rides along with a binary so the live count drops exactly when its last user lets go.
struct CountedBinary {
  explicit CountedBinary(std::shared_ptr<const ContextBinary> b) : binary(std::move(b)) { ++g_live; }
  ~CountedBinary() { --g_live; }
  CountedBinary(const CountedBinary&) = delete;
  CountedBinary& operator=(const CountedBinary&) = delete;
  std::shared_ptr<const ContextBinary> binary;
};

std::shared_ptr<const ContextBinary> counted(std::shared_ptr<const ContextBinary> binary) {
  auto counted = std::make_shared<CountedBinary>(std::move(binary));
  ++g_opened;
  const ContextBinary* raw = counted->binary.get();
  return std::shared_ptr<const ContextBinary>(std::move(counted), raw);
}

}  // namespace

BinaryRegistry& BinaryRegistry::instance() {
  static BinaryRegistry registry;
  return registry;
}

std::shared_ptr<const ContextBinary> BinaryRegistry::open(const std::filesystem::path& path,
                                                          const ContextBinary::SourceFolder& source_folder) {
  return counted(ContextBinary::open(path, source_folder));
}

std::shared_ptr<const ContextBinary> BinaryRegistry::open(const ContextFile& file, bool shared,
                                                          const ContextBinary::SourceFolder& source_folder) {
  // Known by its path alone: a weightless binary's source data, wherever a session found it, holds
  // the bytes it was compiled with, so any session may share it once its own source data is checked.
  bool made = false;
  auto binary = open(file.path, shared, [&] {
    made = true;
    return ContextBinary::map(file.fd.get(), file.path, source_folder);
  });
  if (!made) binary->check_source_data(source_folder);
  return binary;
}

std::shared_ptr<const ContextBinary> BinaryRegistry::open(const std::filesystem::path& key, bool shared,
                                                          const std::function<std::shared_ptr<const ContextBinary>()>& make) {
  if (!shared) return counted(make());
  // Opening under the lock keeps two sessions created at once from reading the binary twice.
  std::lock_guard lock(mutex_);
  std::erase_if(shared_, [](const auto& entry) { return entry.second.expired(); });
  if (auto it = shared_.find(key); it != shared_.end()) {
    if (auto binary = it->second.lock()) return binary;
  }
  auto binary = counted(make());
  shared_[key] = binary;
  return binary;
}

std::vector<SharedGraph> BinaryRegistry::find_shared_graph(const std::string& name) {
  std::lock_guard lock(mutex_);
  std::vector<SharedGraph> found;
  for (const auto& [path, weak] : shared_) {
    auto binary = weak.lock();
    if (binary && binary->find_graph(name) != nullptr) found.push_back({path, std::move(binary)});
  }
  return found;
}

BinaryStats BinaryRegistry::stats() const { return {g_opened.load(), g_live.load()}; }

}  // namespace ctxgen::ort_ep
