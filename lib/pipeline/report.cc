#include "ctxgen/report.h"

#include <cstdio>
#include <map>
#include <sstream>

namespace ctxgen {

std::string human_bytes(uint64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024 && unit < 4) {
    value /= 1024;
    ++unit;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, unit == 0 ? "%.0f %s" : "%.1f %s", value, units[unit]);
  return buf;
}

namespace {

nlohmann::json stats_json(const WeightStoreStats& s) {
  return {{"tensors", s.tensors_seen}, {"unique_tensors", s.tensors_unique}, {"bytes", s.bytes_seen},
          {"unique_bytes", s.bytes_unique}, {"bytes_saved", s.bytes_seen - s.bytes_unique}};
}

std::map<std::string, size_t> fallback_counts(const ModelSummary& m) {
  std::map<std::string, size_t> counts;
  for (const auto& cpu : m.cpu_nodes) ++counts[cpu.op_type + ": " + cpu.reason];
  return counts;
}

nlohmann::json options_json(const std::vector<std::filesystem::path>& inputs, const CompileOptions& o) {
  nlohmann::json per_model = nlohmann::json::array();
  for (size_t m = 0; m < o.per_model.size() && m < inputs.size(); ++m)
    per_model.push_back({{"model", inputs[m].string()},
                         {"fix_dims", o.per_model[m].fix_dims},
                         {"input_shapes", o.per_model[m].input_shapes},
                         {"fix_values", o.per_model[m].fix_values}});
  nlohmann::json inputs_json = nlohmann::json::array();
  for (const auto& in : inputs) inputs_json.push_back(in.string());
  auto path_or_null = [](const std::filesystem::path& p) { return p.empty() ? nlohmann::json() : nlohmann::json(p.string()); };
  return {{"inputs", inputs_json},
          {"backend", o.backend},
          {"output_file", path_or_null(o.output_file)},
          {"output_dir", path_or_null(o.output_dir)},
          {"node_name_prefix", o.node_name_prefix},
          {"embed", o.embed},
          {"external_initializers_file", o.external_initializers_file.empty() ? nlohmann::json() : nlohmann::json(o.external_initializers_file)},
          {"force", o.force},
          {"allow_empty", o.allow_empty},
          {"stop_after", o.stop_after ? nlohmann::json(phase_name(*o.stop_after)) : nlohmann::json()},
          {"cache", path_or_null(o.cache_dir)},
          {"report", path_or_null(o.report_file)},
          {"per_model", per_model}};
}

nlohmann::json model_json(const ModelSummary& m) {
  nlohmann::json parts = nlohmann::json::array();
  for (const auto& p : m.partitions)
    parts.push_back({{"name", p.name}, {"nodes", p.nodes}, {"inputs", p.inputs}, {"outputs", p.outputs},
                     {"weights", p.weights}, {"program_bytes", p.program_bytes}});
  nlohmann::json cpu = nlohmann::json::array();
  for (const auto& c : m.cpu_nodes) cpu.push_back({{"node", c.node}, {"op_type", c.op_type}, {"reason", c.reason}});
  nlohmann::json by_op = nlohmann::json::object();
  for (const auto& c : m.cpu_nodes) by_op[c.op_type] = by_op.value(c.op_type, 0) + 1;
  return {{"input", m.input.string()},
          {"output", m.output.string()},
          {"nodes_in_input", m.input_nodes},
          {"nodes_folded", m.folded_nodes},
          {"nodes_removed", m.removed_nodes},
          {"nodes", m.node_count},
          {"nodes_compiled", m.compiled_nodes},
          {"nodes_on_cpu", m.cpu_nodes.size()},
          {"partitions", parts},
          {"cpu_nodes", cpu},
          {"cpu_nodes_by_op", by_op},
          {"weights",
           {{"tensors", m.weights.tensors},
            {"bytes", m.weights.bytes},
            {"new_tensors", m.weights.new_tensors},
            {"new_bytes", m.weights.new_bytes},
            {"bytes_shared_with_earlier_models", m.weights.bytes - m.weights.new_bytes}}}};
}

}  // namespace

nlohmann::json error_json(const Error& error) {
  return {{"code", error_code_name(error.code())}, {"exit_code", exit_code(error.code())}, {"message", error.what()}};
}

nlohmann::json report_json(const std::vector<std::filesystem::path>& inputs, const CompileOptions& options,
                           const RunSummary& summary, const Error* error) {
  nlohmann::json timings = nlohmann::json::array();
  double total = 0;
  for (const auto& t : summary.timings) {
    timings.push_back({{"stage", t.stage},
                       {"model", t.model.empty() ? nlohmann::json() : nlohmann::json(t.model.string())},
                       {"milliseconds", t.milliseconds}});
    total += t.milliseconds;
  }
  nlohmann::json report = {{"schema_version", kReportSchemaVersion},
                           {"ctxgen_version", CTXGEN_VERSION},
                           {"status", error ? "failed" : "ok"},
                           {"options", options_json(inputs, options)},
                           {"timings", timings},
                           {"total_milliseconds", total}};
  if (error) {
    report["error"] = error_json(*error);
    return report;
  }
  nlohmann::json models = nlohmann::json::array();
  for (const auto& m : summary.models) models.push_back(model_json(m));
  nlohmann::json files = nlohmann::json::array();
  for (const auto& f : summary.outputs)
    files.push_back({{"path", f.path.string()}, {"size", f.size}, {"xxh3_128", f.hash.hex()}});
  report["backend"] = summary.backend;
  report["models"] = models;
  report["outputs"] = files;
  report["context_binary_weights"] = stats_json(summary.weights);
  report["external_initializer_weights"] = stats_json(summary.external_weights);
  const CacheStats& c = summary.cache;
  report["cache"] = c.used ? nlohmann::json{{"hits", c.hits}, {"misses", c.misses}, {"damaged", c.damaged},
                                            {"bytes_read", c.bytes_read}, {"bytes_written", c.bytes_written},
                                            {"remote_hits", c.remote_hits}, {"remote_stores", c.remote_stores},
                                            {"remote_errors", c.remote_errors}}
                           : nlohmann::json();
  return report;
}

std::string report_text(const RunSummary& summary) {
  std::ostringstream out;
  for (const auto& m : summary.models) {
    out << m.input.string() << ": " << m.compiled_nodes << " of " << m.node_count << " nodes on " << summary.backend
        << " in " << m.partitions.size() << " partition(s), " << m.cpu_nodes.size() << " on CPU";
    if (m.folded_nodes + m.removed_nodes > 0)
      out << " (of " << m.input_nodes << " input nodes, " << m.folded_nodes << " folded into constants, "
          << m.removed_nodes << " removed as dead)";
    out << "\n";
    for (const auto& [reason, count] : fallback_counts(m)) out << "  CPU: " << count << " x " << reason << "\n";
  }
  const auto& w = summary.weights;
  if (summary.weights_known)
    out << "weights: " << w.tensors_seen << " tensors, " << human_bytes(w.bytes_seen) << " -> " << w.tensors_unique
        << " unique, " << human_bytes(w.bytes_unique) << "\n";
  else
    out << "weights: in " << summary.backend << "'s own context binaries, which ctxgen does not read\n";
  if (summary.cache.used)
    out << "cache: " << summary.cache.hits << " of " << summary.cache.hits + summary.cache.misses << " partitions from cache"
        << (summary.cache.remote_hits ? " (" + std::to_string(summary.cache.remote_hits) + " fetched from the remote cache)" : "")
        << (summary.cache.damaged ? ", " + std::to_string(summary.cache.damaged) + " damaged entries removed" : "") << "\n";
  for (const auto& f : summary.outputs) out << "wrote " << f.path.string() << " (" << human_bytes(f.size) << ")\n";
  return out.str();
}

}  // namespace ctxgen
