// `ctxgen inspect --dot/--svg`: where the partition borders are and why, as a picture.

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <sstream>

#include "ctxgen/error.h"
#include "ctxgen/model.h"
#include "ctxgen/report.h"

namespace fs = std::filesystem;

namespace ctxgen {
namespace {

// Fill and border of partition clusters, in turn: neighbouring partitions differ.
constexpr const char* kClusterColours[][2] = {{"#dbeafe", "#2563eb"}, {"#dcfce7", "#16a34a"}, {"#fef9c3", "#ca8a04"},
                                              {"#f3e8ff", "#9333ea"}, {"#cffafe", "#0891b2"}, {"#ffedd5", "#ea580c"}};
constexpr size_t kLabelWidth = 40;

// The length of the well-formed UTF-8 sequence at text[i], or 0.
size_t utf8_length(const std::string& text, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char lead = byte(i);
  const size_t n = lead < 0x80 ? 1 : (lead >> 5) == 0x6 ? 2 : (lead >> 4) == 0xE ? 3 : (lead >> 3) == 0x1E ? 4 : 0;
  if (n == 0 || i + n > text.size()) return 0;
  for (size_t k = 1; k < n; ++k)
    if ((byte(i + k) >> 6) != 0x2) return 0;
  return n;
}

// Every name and reason goes into the DOT text through here: a string Graphviz reads back as it
// is, whatever the model holds. Quotes and backslashes are escaped, a line break is DOT's; a control
// character (a NUL ends Graphviz's string) or a byte that is not UTF-8 (Graphviz stops at it) is
// shown as \xHH.
std::string quoted(const std::string& text) {
  std::string out = "\"";
  for (size_t i = 0; i < text.size();) {
    const char c = text[i];
    const size_t n = utf8_length(text, i);
    if (c == '\n') {
      out += "\\n";
    } else if (n == 0 || (n == 1 && static_cast<unsigned char>(c) < 0x20) || c == 0x7F) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\\\x%02X", static_cast<unsigned char>(c));
      out += hex;
    } else {
      if (c == '"' || c == '\\') out += '\\';
      out.append(text, i, n);
      i += n;
      continue;
    }
    ++i;
  }
  return out + "\"";
}

// Long names and reasons broken into lines of about kLabelWidth at spaces (or anywhere, for a
// name without any).
std::string wrapped(const std::string& text) {
  std::string out, line;
  std::istringstream words(text);
  for (std::string word; words >> word;) {
    while (word.size() > kLabelWidth) {
      if (!line.empty()) out += line + "\n";
      out += word.substr(0, kLabelWidth) + "\n";
      word.erase(0, kLabelWidth);
      line.clear();
    }
    if (!line.empty() && line.size() + 1 + word.size() > kLabelWidth) {
      out += line + "\n";
      line.clear();
    }
    line += (line.empty() ? "" : " ") + word;
  }
  return out + line;
}

struct Picture {
  const onnx::GraphProto& graph;
  const PartitionPlan& plan;
  std::vector<std::string> cluster_labels;  // one per partition
  std::string title;
};

std::string dot(const Picture& p) {
  std::ostringstream out;
  out << "digraph " << quoted(p.title) << " {\n"
      << "  graph [label=" << quoted(p.title) << ", labelloc=t, fontname=\"Helvetica\", rankdir=TB];\n"
      << "  node [shape=box, style=\"rounded,filled\", fillcolor=white, fontname=\"Helvetica\", fontsize=10];\n"
      << "  edge [color=\"#64748b\", arrowsize=0.6];\n";
  auto node_id = [](size_t i) { return "n" + std::to_string(i); };
  auto node_label = [&](size_t i) {
    const auto& node = p.graph.node(static_cast<int>(i));
    return node.op_type() + (node.name().empty() ? "" : "\n" + wrapped(node.name()));
  };
  for (int i = 0; i < p.graph.input_size(); ++i)
    out << "  in" << i << " [label=" << quoted(wrapped(p.graph.input(i).name())) << ", shape=ellipse, fillcolor=\"#f1f5f9\"];\n";
  for (int i = 0; i < p.graph.output_size(); ++i)
    out << "  out" << i << " [label=" << quoted(wrapped(p.graph.output(i).name())) << ", shape=ellipse, fillcolor=\"#f1f5f9\"];\n";
  for (size_t k = 0; k < p.plan.partitions.size(); ++k) {
    const auto& colour = kClusterColours[k % std::size(kClusterColours)];
    out << "  subgraph cluster_" << k << " {\n    label=" << quoted(p.cluster_labels[k])
        << "; style=\"filled,rounded\"; fillcolor=\"" << colour[0] << "\"; color=\"" << colour[1] << "\"; penwidth=2;\n";
    for (size_t i : p.plan.partitions[k].nodes) out << "    " << node_id(i) << " [label=" << quoted(node_label(i)) << "];\n";
    out << "  }\n";
  }
  for (const auto& cpu : p.plan.cpu_nodes)
    out << "  " << node_id(cpu.node) << " [label=" << quoted(node_label(cpu.node) + "\nCPU: " + wrapped(cpu.reason))
        << ", fillcolor=\"#fee2e2\", color=\"#dc2626\"];\n";
  // Edges follow values from the node (or graph input) that makes them to each node (or graph
  // output) that reads them; weights are not drawn.
  std::map<std::string, std::string> producer;
  for (int i = 0; i < p.graph.input_size(); ++i) producer[p.graph.input(i).name()] = "in" + std::to_string(i);
  for (int i = 0; i < p.graph.node_size(); ++i)
    for (const auto& o : p.graph.node(i).output())
      if (!o.empty()) producer[o] = node_id(static_cast<size_t>(i));
  std::set<std::pair<std::string, std::string>> edges;
  for (int i = 0; i < p.graph.node_size(); ++i)
    for (const auto& value : node_reads(p.graph.node(i)))
      if (auto it = producer.find(value); it != producer.end()) edges.insert({it->second, node_id(static_cast<size_t>(i))});
  for (int i = 0; i < p.graph.output_size(); ++i)
    if (auto it = producer.find(p.graph.output(i).name()); it != producer.end()) edges.insert({it->second, "out" + std::to_string(i)});
  for (const auto& [from, to] : edges) out << "  " << from << " -> " << to << ";\n";
  out << "}\n";
  return out.str();
}

// A compiled model drawn as it is: each EPContext node is a partition, every other node is on CPU
// for the reason the model recorded when it was compiled. The record names a node by its name, or
// by "#index" in the graph before compiling when it has none: an unnamed node takes the first
// unused unnamed record of its op, in node order as both are.
std::string compiled_dot(const fs::path& path, const onnx::ModelProto& proto) {
  struct Recorded {
    std::string node, op, reason;
    bool used = false;
  };
  std::vector<Recorded> recorded;
  if (auto text = metadata_value(proto, kFallbackMetadataKey)) {
    auto list = nlohmann::json::parse(*text, nullptr, false);
    for (const auto& e : list.is_array() ? list : nlohmann::json::array())
      if (e.is_object() && e.value("node", nlohmann::json()).is_string() && e.value("op_type", nlohmann::json()).is_string() &&
          e.value("reason", nlohmann::json()).is_string())
        recorded.push_back({e["node"], e["op_type"], e["reason"]});
  }
  auto reason_of = [&](const onnx::NodeProto& node) -> std::string {
    for (auto& r : recorded) {
      const bool same = node.name().empty() ? r.node.rfind('#', 0) == 0 : r.node == node.name();
      if (!r.used && same && r.op == node.op_type()) {
        r.used = true;
        return r.reason;
      }
    }
    return "no reason recorded";
  };
  PartitionPlan plan;
  std::vector<std::string> labels;
  for (int i = 0; i < proto.graph().node_size(); ++i) {
    const auto& node = proto.graph().node(i);
    if (node.op_type() == "EPContext") {
      std::string source, partition = node.name();
      for (const auto& a : node.attribute()) {
        if (a.name() == "source") source = a.s();
        if (a.name() == "partition_name") partition = a.s();
      }
      plan.partitions.push_back(Partition{{static_cast<size_t>(i)}, {}, {}, {}});
      labels.push_back(source + " partition " + partition);
      continue;
    }
    plan.cpu_nodes.push_back({static_cast<size_t>(i), reason_of(node)});
  }
  return dot({proto.graph(), plan, labels,
              path.filename().string() + ": " + std::to_string(plan.partitions.size()) + " EPContext node(s), " +
                  std::to_string(plan.cpu_nodes.size()) + " CPU node(s)"});
}

}  // namespace

std::string inspect_dot(const fs::path& path, const Backend& backend, const LoadOptions& load) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) throw Error(ErrorCode::kInvalidModel, path.string() + ": no such file");
  {
    // Embedded weights are not copied: looking costs the graph only.
    const ParsedModel parsed = parse_model(path);
    for (const auto& node : parsed.proto->graph().node())
      if (node.op_type() == "EPContext") {
        if (!load.fix_dims.empty() || !load.input_shapes.empty() || !load.fix_values.empty())
          throw Error(ErrorCode::kUsage, path.string() + " is compiled: it is drawn as it is, so --fix-dim, --input-shape "
                                                         "and --fix-value have nothing to cut (give the original model)");
        return compiled_dot(path, *parsed.proto);
      }
  }
  PartitionedModel cut = partition_model(path, load, backend);
  std::vector<std::string> labels;
  size_t on_backend = 0;
  for (size_t k = 0; k < cut.plan.partitions.size(); ++k) {
    const size_t n = cut.plan.partitions[k].nodes.size();
    on_backend += n;
    labels.push_back(backend.name() + " partition " + std::to_string(k) + ": " + std::to_string(n) + " node(s)");
  }
  return dot({cut.model.graph(), cut.plan, labels,
              path.filename().string() + ": " + std::to_string(on_backend) + " of " +
                  std::to_string(cut.model.graph().node_size()) + " nodes on " + backend.name() + " in " +
                  std::to_string(cut.plan.partitions.size()) + " partition(s), " +
                  std::to_string(cut.plan.cpu_nodes.size()) + " on CPU"});
}

std::string dot_to_svg(const std::string& dot_text) {
  // Graphviz reads the graph from a file, so its output is the only pipe to drain.
  std::error_code ec;
  const fs::path folder = fs::temp_directory_path(ec);
  if (ec) throw Error(ErrorCode::kIo, "no folder for a temporary file for Graphviz (TMPDIR): " + ec.message());
  std::string name = (folder / "ctxgen-dot-XXXXXX").string();
  const int fd = ::mkstemp(name.data());
  if (fd < 0) throw Error(ErrorCode::kIo, "cannot create a temporary file for Graphviz: " + std::string(std::strerror(errno)));
  int write_error = 0;
  for (size_t at = 0; at < dot_text.size() && write_error == 0;) {
    const ssize_t n = ::write(fd, dot_text.data() + at, dot_text.size() - at);
    if (n > 0) at += static_cast<size_t>(n);
    else if (errno != EINTR) write_error = n < 0 ? errno : EIO;
  }
  ::close(fd);
  struct Unlink {
    std::string path;
    ~Unlink() { ::unlink(path.c_str()); }
  } unlink_later{name};
  if (write_error != 0)
    throw Error(ErrorCode::kIo, "cannot write the graph for Graphviz to " + name + ": " + std::strerror(write_error));
  int out[2];
  if (::pipe2(out, O_CLOEXEC) != 0) throw Error(ErrorCode::kIo, "pipe failed: " + std::string(std::strerror(errno)));
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);  // its warnings go to our stderr
  const char* argv[] = {"dot", "-Tsvg", name.c_str(), nullptr};
  pid_t pid = 0;
  const int spawned = ::posix_spawnp(&pid, "dot", &actions, nullptr, const_cast<char* const*>(argv), environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(out[1]);
  if (spawned != 0) {
    ::close(out[0]);
    if (spawned == ENOENT)
      throw Error(ErrorCode::kUsage, "--svg needs Graphviz's dot, which is not installed (apt-get install graphviz); "
                                     "--dot prints the graph for any Graphviz");
    throw Error(ErrorCode::kRuntime, "cannot run Graphviz's dot: " + std::string(std::strerror(spawned)));
  }
  std::string svg;
  char buffer[65536];
  int read_error = 0;
  for (ssize_t n; (n = ::read(out[0], buffer, sizeof buffer)) != 0;) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      read_error = errno;
      break;
    }
    svg.append(buffer, static_cast<size_t>(n));
  }
  ::close(out[0]);  // a dot still writing gets SIGPIPE and ends
  int status = 0;
  pid_t waited;
  while ((waited = ::waitpid(pid, &status, 0)) < 0 && errno == EINTR) {
  }
  if (read_error != 0 || waited != pid)
    throw Error(ErrorCode::kRuntime, "cannot read Graphviz's output: " + std::string(std::strerror(read_error ? read_error : errno)));
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    throw Error(ErrorCode::kRuntime, "Graphviz's dot failed (" +
                                         (WIFEXITED(status) ? "exit " + std::to_string(WEXITSTATUS(status))
                                                            : "signal " + std::to_string(WTERMSIG(status))) +
                                         "); it said why above");
  return svg;
}

}  // namespace ctxgen
