#include "onednn.h"

#include <algorithm>
#include <atomic>
#include <omp.h>

#include <optional>
#include <string>
#include <string_view>

#include "ctxgen/error.h"

namespace ctxgen::runtime::onednn {

const dnnl::engine& engine() {
  static const dnnl::engine cpu(dnnl::engine::kind::cpu, 0);
  return cpu;
}

dnnl::stream& stream() {
  thread_local dnnl::stream own(engine());
  return own;
}

void execute(const dnnl::primitive& primitive, const dnnl_exec_arg_t* args, int count) {
  const dnnl_status_t status = dnnl_primitive_execute(primitive.get(), stream().get(), count, args);
  if (status != dnnl_success)
    throw Error(ErrorCode::kRuntime, "oneDNN failed to run a primitive (status " + std::to_string(static_cast<int>(status)) + ")");
  stream().wait();
}

void reorder(const dnnl::reorder& primitive, const dnnl::memory& from, const dnnl::memory& to) {
  const dnnl_exec_arg_t args[] = {{DNNL_ARG_FROM, from.get()}, {DNNL_ARG_TO, to.get()}};
  execute(primitive, args, 2);
}

const dnnl::memory& MemorySlots::at(size_t slot, const dnnl::memory::desc& desc, const void* data) {
  auto& [where, memory] = slots_[slot];
  if (!memory || where != data) {
    memory = dnnl::memory(desc, engine(), const_cast<void*>(data));
    where = data;
  }
  return memory;
}

OneThread::OneThread() : before_(omp_get_max_threads()) { omp_set_num_threads(1); }
OneThread::~OneThread() { omp_set_num_threads(before_); }

namespace {

// oneDNN's CPU levels by name; each one's dnnl_cpu_isa_t value is the set of instruction-set bits
// it needs, so one level runs where another's bits include its own (avx2_vnni is a branch of
// its own beside the avx512 ones).
struct Level {
  const char* name;
  dnnl::cpu_isa isa;
};
constexpr Level kLevels[] = {
    {"sse41", dnnl::cpu_isa::sse41},
    {"avx", dnnl::cpu_isa::avx},
    {"avx2", dnnl::cpu_isa::avx2},
    {"avx2_vnni", dnnl::cpu_isa::avx2_vnni},
    {"avx512_core", dnnl::cpu_isa::avx512_core},
    {"avx512_core_vnni", dnnl::cpu_isa::avx512_core_vnni},
    {"avx512_core_bf16", dnnl::cpu_isa::avx512_core_bf16},
    {"avx512_core_amx", dnnl::cpu_isa::avx512_core_amx},
};

const char* isa_name(dnnl::cpu_isa isa) {
  for (const Level& level : kLevels)
    if (level.isa == isa) return level.name;
  return "generic";
}

std::optional<dnnl::cpu_isa> isa_named(std::string_view name) {
  for (const Level& level : kLevels)
    if (name == level.name) return level.isa;
  return std::nullopt;
}

bool includes(dnnl::cpu_isa outer, dnnl::cpu_isa inner) {
  const auto o = static_cast<unsigned>(outer), i = static_cast<unsigned>(inner);
  return (o & i) == i;
}

const char* machine() {
#if defined(__x86_64__)
  return "x86_64";
#elif defined(__aarch64__)
  return "aarch64";
#else
  return "cpu";
#endif
}

std::string library_version() {
  const dnnl_version_t* v = dnnl_version();
  return "oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch);
}

std::string level_names() {
  std::string names;
  for (const std::string& level : known_levels()) names += (names.empty() ? "" : ", ") + level;
  return names;
}

}  // namespace

std::atomic<uint64_t> g_plans_made{0};
void plan_made() { ++g_plans_made; }
uint64_t plans_made() { return g_plans_made; }

size_t kept_plans() { return std::min<size_t>(256, static_cast<size_t>(dnnl::get_primitive_cache_capacity())); }

bool exact_int8_convolution() {
  const dnnl::cpu_isa isa = dnnl::get_effective_cpu_isa();
  return isa == dnnl::cpu_isa::avx2_vnni || isa == dnnl::cpu_isa::avx512_core_vnni ||
         isa == dnnl::cpu_isa::avx512_core_bf16 || isa == dnnl::cpu_isa::avx512_core_amx;
}

std::string architecture() {
  return std::string(machine()) + " " + isa_name(dnnl::get_effective_cpu_isa()) + ", " + library_version();
}

void check_level(const std::string& level) {
  const std::optional<dnnl::cpu_isa> isa = isa_named(level);
  if (!isa) throw Error(ErrorCode::kUsage, "--target-cpu " + level + ": no such CPU level (oneDNN's: " + level_names() + ")");
  if (!includes(dnnl::get_effective_cpu_isa(), *isa))
    throw Error(ErrorCode::kUsage, "--target-cpu " + level + ": this CPU (" + architecture() + ") cannot compile for " +
                                       level + ", a level its own does not include; give one it does: " + levels_below());
}

void target_level(const std::string& level) {
  const std::optional<dnnl::cpu_isa> isa = isa_named(level);
  if (!isa) throw Error(ErrorCode::kUsage, "--target-cpu " + level + ": no such CPU level (oneDNN's: " + level_names() + ")");
  // oneDNN takes the limit only before it has looked at the CPU, and ignores it silently if asked
  // above what the CPU has: what it then chose tells.
  const bool set = dnnl_set_max_cpu_isa(static_cast<dnnl_cpu_isa_t>(*isa)) == dnnl_success;
  if (!set || dnnl::get_effective_cpu_isa() != *isa)
    throw Error(ErrorCode::kUsage, "--target-cpu " + level + ": this CPU (" + architecture() + ") cannot run oneDNN at " +
                                       level + "; give one of: " + levels_below());
}

std::string level() { return isa_name(dnnl::get_effective_cpu_isa()); }

bool avx512() { return includes(dnnl::get_effective_cpu_isa(), dnnl::cpu_isa::avx512_core); }

bool avx2() { return includes(dnnl::get_effective_cpu_isa(), dnnl::cpu_isa::avx2); }

std::vector<std::string> known_levels() {
  std::vector<std::string> names;
  for (const Level& level : kLevels) names.emplace_back(level.name);
  return names;
}

std::string levels_below() {
  const dnnl::cpu_isa host = dnnl::get_effective_cpu_isa();
  std::string names;
  for (const Level& level : kLevels)
    if (includes(host, level.isa)) names += (names.empty() ? "" : "|") + std::string(level.name);
  return names;
}

Judgement judge_architecture(const std::string& recorded) {
  const std::string here = architecture();
  if (recorded == here) return {Fit::kOptimal, ""};
  const std::string prefix = std::string(machine()) + " ", suffix = ", " + library_version();
  const bool framed = recorded.size() > prefix.size() + suffix.size() && recorded.rfind(prefix, 0) == 0 &&
                      recorded.compare(recorded.size() - suffix.size(), suffix.size(), suffix) == 0;
  const std::string level = framed ? recorded.substr(prefix.size(), recorded.size() - prefix.size() - suffix.size()) : "";
  const std::optional<dnnl::cpu_isa> isa = isa_named(level);
  if (!isa)
    return {Fit::kUnsupported, "hardware_architecture is '" + recorded + "' but this EP runs '" + here + "'"};
  if (!includes(dnnl::get_effective_cpu_isa(), *isa))
    return {Fit::kUnsupported, "hardware_architecture is '" + recorded + "': packed for " + level +
                                   ", a level this CPU's (" + here + ") does not include; compile for one it does " +
                                   "(ctxgen --target-cpu " + levels_below() + ")"};
  return {Fit::kRuns, "hardware_architecture is '" + recorded + "': packed for " + level + ", which this CPU (" + here +
                          ") runs; compiled for this CPU's level it would run faster"};
}

}  // namespace ctxgen::runtime::onednn
