#pragma once
// ONNX Runtime's view of a graph (OrtGraph) as a model ctxgen's stages read, so a session on an
// ordinary model is loaded, specialised, partitioned and compiled by the same code as a model file
// given to the CLI.

#include <set>
#include <onnxruntime_c_api.h>

#include <string>
#include <vector>

#include "ctxgen/model.h"

namespace ctxgen::ort_ep {

// A node whose subgraphs (If, Loop, Scan) are not converted stands in as an op of this domain with
// its inputs, outputs and their types: no backend supports it, so it stays with ORT.
inline constexpr const char* kOpaqueDomain = "ctxgen.ort_opaque";

// The nodes of `graph` in the order the model file had them (ORT numbers nodes as it adds them),
// when that order is topological; otherwise in ORT's topological order. Partitions then list
// their values in the order the CLI lists them for the same file.
std::vector<const OrtNode*> model_order(const OrtGraph* graph);

// `graph` as a parsed ONNX model (load_model takes it from there): node i of the proto is node i of
// model_order(graph); every value typed as ORT inferred it
// (symbolic dims by name); small and integer initializers copied, as shape inference reads them,
// larger ones views of ORT's memory, valid while ORT holds them (GetCapability, Compile).
// With `external_views`, an initializer ORT keeps in external data (inside the model's folder) is a
// view of that file, mapped here, as the CLI's loader makes it: a weightless binary refers to it.
ParsedModel parse_ort_graph(const OrtGraph* graph, bool external_views = false);

// The files ORT reads the graph's initializers from (external data), canonical.
std::set<std::filesystem::path> external_data_files(const OrtGraph* graph);

// Names the graph in messages and reports: its model file, or "<model in memory>".
std::string graph_label(const OrtGraph* graph);

}  // namespace ctxgen::ort_ep
