#pragma once
// Machine- and human-readable accounts of a run and of ctxgen's output files.

#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ctxgen/error.h"
#include "ctxgen/pipeline.h"

namespace ctxgen {

// Metadata key under which an EPContext model records why each node stayed on CPU (JSON list).
inline constexpr const char* kFallbackMetadataKey = "ctxgen.cpu_nodes";

// JSON text of `j`; bytes that are not UTF-8 (a file or tensor name in another encoding) become
// U+FFFD instead of failing the run.
inline std::string json_text(const nlohmann::json& j, int indent = -1) {
  return j.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace);
}
// What the specialise stage did to the model: node counts and folded nodes by op (inspect shows it).
inline constexpr const char* kSpecialisedMetadataKey = "ctxgen.specialised";

// The --report JSON (docs/report-schema.json). Its schema_version changes only when a field
// changes meaning or goes away; new fields may appear without it.
inline constexpr int kReportSchemaVersion = 1;
// An error as reports and verify --json give it: code name, exit code, message.
nlohmann::json error_json(const Error& error);
// With `error`, the report of a failed run: the error and what had been done, no outputs.
nlohmann::json report_json(const std::vector<std::filesystem::path>& inputs, const CompileOptions& options,
                           const RunSummary& summary, const Error* error = nullptr);
// A few lines for the terminal: per model what went where, then the files written.
std::string report_text(const RunSummary& summary);

// Describes a _ctx.onnx (EPContext nodes and attributes, CPU nodes and why) or a context binary
// (identity, graphs, weights). Throws Error(kInvalidModel / kInvalidBinary).
nlohmann::json inspect_json(const std::filesystem::path& path);
std::string inspect_text(const nlohmann::json& inspected);

// inspect --dot: the graph in Graphviz's DOT language, each backend partition one coloured cluster,
// each CPU node labelled with why it stays there. A compiled model is drawn as it is (each EPContext
// node a cluster, the reasons it recorded); any other model is first cut for `backend` as compile
// would cut it with `load`.
std::string inspect_dot(const std::filesystem::path& path, const Backend& backend, const LoadOptions& load);
// DOT to SVG through Graphviz's `dot`: Error(kUsage) when it is not installed.
std::string dot_to_svg(const std::string& dot);

std::string human_bytes(uint64_t bytes);

}  // namespace ctxgen
