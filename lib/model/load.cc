// load_model: parse, validate, normalise (IR < 4 weight inputs, Constant nodes), fix dims, infer
// shapes, then take every weight's bytes out of the protobuf as views.

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <queue>
#include <set>
#include <stdexcept>
#include <unordered_map>

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <onnx/checker.h>
#include <onnx/shape_inference/implementation.h>

#include "ctxgen/embedded.h"
#include "ctxgen/error.h"
#include "ctxgen/limits.h"
#include "ctxgen/log.h"
#include "ctxgen/model.h"
#include "internal.h"

namespace fs = std::filesystem;

namespace ctxgen {
namespace {

using model_detail::beyond_onnx;
using model_detail::expected_bytes;
using model_detail::known_to_onnx;

Error invalid(const fs::path& path, const std::string& what) {
  return Error(ErrorCode::kInvalidModel, path.string() + ": " + what);
}

// What ONNX Runtime 1.29, the runtime ctxgen writes for, loads: newer models are refused at load
// instead of compiling into something ORT cannot open.
constexpr int64_t kMaxIrVersion = 13;
constexpr int64_t kMaxOpset = 26;
// What the bundled onnx (Debian's 1.12) knows (and kOnnxOpset, internal.h). Beyond it, ctxgen's
// own rules take over.
constexpr int64_t kOnnxIrVersion = onnx::IR_VERSION;
using model_detail::kOnnxOpset;
// Domain onnx's checker and shape inference skip: nodes they would misread are moved there.
constexpr const char* kUncheckedDomain = "ctxgen.unchecked";

void check_versions(const fs::path& path, const onnx::ModelProto& model) {
  if (model.ir_version() > kMaxIrVersion)
    throw invalid(path, "IR version " + std::to_string(model.ir_version()) + " is newer than ONNX Runtime 1.29 reads (up to " +
                            std::to_string(kMaxIrVersion) + ")");
  int64_t opset = default_opset(model);
  if (opset > kMaxOpset)
    throw invalid(path, "imports opset " + std::to_string(opset) + " of the default domain; ONNX Runtime 1.29 implements up to " +
                            std::to_string(kMaxOpset));
}

// An If's two branches give the node's outputs, one for one: the same number, of the same element
// types where both declare one. ONNX Runtime refuses an If whose branches disagree; a branch
// inlined by --fix-value would otherwise hide that until the written model fails to load.
void check_if_branches(const fs::path& path, const onnx::NodeProto& node, size_t index) {
  const onnx::GraphProto *then_branch = nullptr, *else_branch = nullptr;
  for (const auto& a : node.attribute()) {
    if (a.name() == "then_branch" && a.has_g()) then_branch = &a.g();
    if (a.name() == "else_branch" && a.has_g()) else_branch = &a.g();
  }
  if (then_branch == nullptr || else_branch == nullptr) return;  // the checker names a missing branch
  const std::string where = "node " + describe_node(node, index) + ": ";
  const int count = then_branch->output_size();
  if (else_branch->output_size() != count || node.output_size() != count)
    throw invalid(path, where + "then_branch has " + std::to_string(count) + " output(s), else_branch " +
                            std::to_string(else_branch->output_size()) + ", the node " + std::to_string(node.output_size()) +
                            " (ONNX Runtime refuses an If whose branches disagree)");
  for (int o = 0; o < count; ++o) {
    const int32_t a = then_branch->output(o).type().tensor_type().elem_type(),
                  b = else_branch->output(o).type().tensor_type().elem_type();
    if (a != 0 && b != 0 && a != b)
      throw invalid(path, where + "output " + std::to_string(o) + " is " + dtype_name(a) + " in then_branch and " +
                              dtype_name(b) + " in else_branch (ONNX Runtime refuses an If whose branches disagree)");
  }
}

// What ctxgen checks itself before onnx 1.12 sees the model: attributes that later opsets turned
// into inputs (onnx cannot tell for opsets it does not know, and otherwise does not say so; ONNX
// Runtime refuses such models), and window attributes its shape inference would divide by.
void check_attributes(const fs::path& path, const onnx::GraphProto& graph, int64_t opset) {
  std::set<std::string> names;  // ONNX Runtime refuses a graph two of whose nodes share a name
  for (int i = 0; i < graph.node_size(); ++i) {
    const auto& node = graph.node(i);
    if (!node.name().empty() && !names.insert(node.name()).second)
      throw invalid(path, "two nodes of graph '" + graph.name() + "' are named '" + node.name() +
                              "' (ONNX Runtime refuses such a model)");
    for (const auto& a : node.attribute()) {
      if (a.has_g()) check_attributes(path, a.g(), opset);
      for (const auto& g : a.graphs()) check_attributes(path, g, opset);
    }
    if (!is_onnx_domain(node.domain())) continue;
    const std::string& op = node.op_type();
    if (op == "If") check_if_branches(path, node, static_cast<size_t>(i));
    bool reduce = op.rfind("Reduce", 0) == 0;
    const char* moved = nullptr;
    if (opset >= 13 && (op == "Squeeze" || op == "Unsqueeze" || op == "ReduceSum")) moved = "axes";
    else if (opset >= 13 && op == "Split") moved = "split";
    else if (opset >= 18 && reduce) moved = "axes";
    for (const auto& a : node.attribute())
      if (moved && a.name() == moved)
        throw invalid(path, "node " + describe_node(node, static_cast<size_t>(i)) + ": at opset " + std::to_string(opset) +
                                " '" + moved + "' is an input, not an attribute");
    // onnx 1.12's shape inference divides by these without checking (a stride of 0 is a SIGFPE).
    static const std::set<std::string> kWindowed = {"Conv", "ConvTranspose", "MaxPool", "AveragePool", "LpPool",
                                                    "ConvInteger", "QLinearConv", "MaxUnpool"};
    if (!kWindowed.count(op)) continue;
    std::vector<int64_t> kernel, pads;
    for (const auto& a : node.attribute()) {
      if (a.name() == "strides" || a.name() == "dilations" || a.name() == "kernel_shape")
        for (int64_t v : a.ints())
          if (v < 1)
            throw invalid(path, "node " + describe_node(node, static_cast<size_t>(i)) + ": attribute '" + a.name() +
                                    "' holds " + std::to_string(v) + "; every value must be at least 1");
      if (a.name() == "kernel_shape") kernel.assign(a.ints().begin(), a.ints().end());
      if (a.name() == "pads") pads.assign(a.ints().begin(), a.ints().end());
    }
    // A pooling window wholly in the padding has nothing to pool: ONNX Runtime refuses it.
    const bool pooling = op == "MaxPool" || op == "AveragePool" || op == "LpPool";
    for (size_t d = 0; pooling && pads.size() == 2 * kernel.size() && d < kernel.size(); ++d)
      if (pads[d] >= kernel[d] || pads[d + kernel.size()] >= kernel[d])
        throw invalid(path, "node " + describe_node(node, static_cast<size_t>(i)) + ": pads of axis " + std::to_string(d) +
                                " (" + std::to_string(pads[d]) + ", " + std::to_string(pads[d + kernel.size()]) +
                                ") are not smaller than its kernel " + std::to_string(kernel[d]) +
                                " (ONNX Runtime refuses such a pooling)");
  }
}


// Default-domain ops whose semantics changed after opset 17 (axes as an input, new attributes):
// onnx 1.12 would read them with its older schema.
bool changed_after_onnx(const std::string& op) {
  static const std::set<std::string> kChanged = {
      "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceMax", "ReduceMean", "ReduceMin",
      "ReduceProd", "ReduceSumSquare", "Split", "Pad", "Resize", "ScatterElements", "ScatterND", "LpPool",
      "AveragePool", "GridSample", "DFT", "Col2Im",
      // Opsets 19 and 21: saturate, block_size, output_dtype, the 16-bit, 4-bit and float8 types.
      "QuantizeLinear", "DequantizeLinear", "QLinearMatMul",
      // Opset 19: saturate, which ONNX Runtime's graph hands a plugin EP with every Cast.
      "Cast", "CastLike"};
  return kChanged.count(op) > 0;
}


// Default-domain ops ONNX added after opset 17, which onnx 1.12 has no schema for, by the opset
// that introduced them (onnx.ai's operator pages).
const std::map<std::string, int64_t>& ops_after_onnx() {
  static const std::map<std::string, int64_t> kOps = {
      {"BitwiseAnd", 18}, {"BitwiseNot", 18}, {"BitwiseOr", 18}, {"BitwiseXor", 18}, {"CenterCropPad", 18},
      {"Col2Im", 18}, {"GroupNormalization", 18}, {"Mish", 18},
      {"DeformConv", 19}, {"AffineGrid", 20}, {"Gelu", 20}, {"ImageDecoder", 20}, {"RegexFullMatch", 20},
      {"StringConcat", 20}, {"StringSplit", 20}, {"Attention", 23}, {"RMSNormalization", 23},
      {"RotaryEmbedding", 23}, {"Swish", 24}, {"TensorScatter", 24}, {"BitCast", 26}, {"CumProd", 26}};
  return kOps;
}

// Convolutions whose kernel shape onnx 1.12 takes from the weight's dims when the kernel_shape
// attribute is absent, and the weight's input index.
int conv_weight_input(const onnx::NodeProto& node) {
  if (!is_onnx_domain(node.domain())) return -1;
  if (node.op_type() == "Conv" || node.op_type() == "ConvInteger" || node.op_type() == "ConvTranspose") return 1;
  if (node.op_type() == "QLinearConv") return 3;
  return -1;
}

// Dims of values known before inference: initializers and fully declared inputs and value_infos.
using StaticDims = std::map<std::string, std::vector<int64_t>>;

void add_static_dims(const onnx::GraphProto& graph, StaticDims& dims) {
  for (const auto& t : graph.initializer()) dims[t.name()] = {t.dims().begin(), t.dims().end()};
  for (const auto* list : {&graph.input(), &graph.value_info()})
    for (const auto& v : *list) {
      if (!v.type().tensor_type().has_shape()) continue;
      std::vector<int64_t> d;
      for (const auto& dim : v.type().tensor_type().shape().dim())
        if (dim.has_dim_value()) d.push_back(dim.dim_value());
      if (static_cast<int>(d.size()) == v.type().tensor_type().shape().dim_size()) dims.emplace(v.name(), d);
    }
}

// A value's dims before inference, also through the shape-keeping nodes between a stored weight
// and a convolution (DequantizeLinear in QDQ models, Cast, Identity). `producers` maps each value
// of the graph to the node writing it.
std::optional<std::vector<int64_t>> dims_before_inference(
    const std::string& name, const StaticDims& dims,
    const std::unordered_map<std::string, const onnx::NodeProto*>& producers, int depth = 0) {
  if (auto it = dims.find(name); it != dims.end()) return it->second;
  const auto producer = producers.find(name);
  if (depth > 8 || producer == producers.end()) return std::nullopt;
  static const std::set<std::string> kKeepShape = {"DequantizeLinear", "QuantizeLinear", "Cast", "Identity"};
  const onnx::NodeProto& node = *producer->second;
  if (!is_onnx_domain(node.domain()) || !kKeepShape.count(node.op_type()) || node.input_size() == 0)
    return std::nullopt;
  return dims_before_inference(node.input(0), dims, producers, depth + 1);
}

// The model as onnx 1.12 can check and infer it, in place for as long as this object lives: IR
// and opset lowered to what it knows, and every node it does not know (or would misread), and
// every node reading what such a node writes, moved to a domain it skips. Its shape inference
// misbehaves on untyped inputs (Shape of an untyped value crashes it); ctxgen's specialise stage
// types those values with its own rules. In place, so a model of several GB is never copied.
//
// It also dereferences null when a convolution without kernel_shape has a weight of higher rank
// than its input allows (found by fuzzing), but checks the sizes when kernel_shape is given: so
// such a node gets kernel_shape from its weight's dims for the time of the view, or is skipped
// when those are not known before inference.
class OnnxView {
 public:
  explicit OnnxView(onnx::ModelProto& model) : model_(model), ir_(model.ir_version()) {
    bool beyond = beyond_onnx(model);
    for (auto& op : *model.mutable_opset_import()) {
      opsets_.push_back(op.version());
      if (beyond && is_onnx_domain(op.domain()) && op.version() > kOnnxOpset)
        op.set_version(kOnnxOpset);
    }
    if (beyond) model.set_ir_version(std::min<int64_t>(model.ir_version(), kOnnxIrVersion));
    std::set<std::string> untyped;
    mask(*model.mutable_graph(), beyond, untyped, {});
    if (!domains_.empty()) {
      auto* unchecked = model.add_opset_import();
      unchecked->set_domain(kUncheckedDomain);
      unchecked->set_version(1);
    }
  }
  ~OnnxView() {
    if (!domains_.empty()) model_.mutable_opset_import()->RemoveLast();
    for (size_t i = 0; i < opsets_.size(); ++i) model_.mutable_opset_import(static_cast<int>(i))->set_version(opsets_[i]);
    model_.set_ir_version(ir_);
    for (auto& [node, domain] : domains_) node->set_domain(domain);
    for (auto* node : kernel_shapes_) {
      auto* attrs = node->mutable_attribute();
      attrs->erase(std::find_if(attrs->begin(), attrs->end(), [](const auto& a) { return a.name() == "kernel_shape"; }));
    }
  }
  OnnxView(const OnnxView&) = delete;
  OnnxView& operator=(const OnnxView&) = delete;

 private:
  void mask(onnx::GraphProto& graph, bool beyond, std::set<std::string>& untyped, StaticDims dims) {
    add_static_dims(graph, dims);
    std::unordered_map<std::string, const onnx::NodeProto*> producers;  // filled when a convolution needs it
    for (auto& node : *graph.mutable_node()) {
      bool reads_untyped = false;
      for (const auto& in : node_reads(node)) reads_untyped = reads_untyped || untyped.count(in) > 0;
      if (reads_untyped || !known_to_onnx(node, beyond) || !give_kernel_shape(node, graph, dims, producers)) {
        domains_.emplace_back(&node, node.domain());
        node.set_domain(kUncheckedDomain);
        for (const auto& out : node.output()) untyped.insert(out);
      }
      for (auto& a : *node.mutable_attribute()) {
        if (a.has_g()) mask(*a.mutable_g(), beyond, untyped, dims);
        for (auto& g : *a.mutable_graphs()) mask(g, beyond, untyped, dims);
      }
    }
  }

  // False when onnx could not infer the node safely (a convolution whose kernel shape is unknown).
  bool give_kernel_shape(onnx::NodeProto& node, const onnx::GraphProto& graph, const StaticDims& dims,
                         std::unordered_map<std::string, const onnx::NodeProto*>& producers) {
    const int w = conv_weight_input(node);
    if (w < 0 || node.input_size() <= w) return true;
    for (const auto& a : node.attribute())
      if (a.name() == "kernel_shape") return true;
    if (producers.empty())
      for (const auto& n : graph.node())
        for (const auto& out : n.output()) producers.emplace(out, &n);
    const auto weight = dims_before_inference(node.input(w), dims, producers);
    if (!weight) return false;
    if (weight->size() <= 2) return true;  // no spatial dims: nothing to take
    auto* kernel = node.add_attribute();
    kernel->set_name("kernel_shape");
    kernel->set_type(onnx::AttributeProto::INTS);
    for (size_t i = 2; i < weight->size(); ++i) kernel->add_ints((*weight)[i]);
    kernel_shapes_.push_back(&node);
    return true;
  }

  onnx::ModelProto& model_;
  int64_t ir_;
  std::vector<int64_t> opsets_;
  std::vector<std::pair<onnx::NodeProto*, std::string>> domains_;
  std::vector<onnx::NodeProto*> kernel_shapes_;  // nodes given kernel_shape for the view
};

}  // namespace

namespace model_detail {

bool beyond_onnx(const onnx::ModelProto& model) {
  return model.ir_version() > kOnnxIrVersion || default_opset(model) > kOnnxOpset;
}

bool known_to_onnx(const onnx::NodeProto& node, bool beyond) {
  if (!is_onnx_domain(node.domain())) return onnx::OpSchemaRegistry::Schema(node.op_type(), 1 << 20, node.domain()) != nullptr;
  if (beyond && changed_after_onnx(node.op_type())) return false;
  return onnx::OpSchemaRegistry::Schema(node.op_type(), static_cast<int>(kOnnxOpset), "") != nullptr;
}

}  // namespace model_detail

void check_model_file(const fs::path& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) throw invalid(path, ec ? "cannot be resolved: " + ec.message() : "no such file");
  if (fs::is_directory(path, ec)) throw invalid(path, "is a directory, not an ONNX model file");
}

ParsedModel parse_model(const fs::path& path, bool views) {
  check_model_file(path);
  auto file = MappedFile::open(path);
  if (file->size() == 0) throw invalid(path, "file is empty");
  if (file->size() > INT32_MAX)
    throw invalid(path, "file is larger than 2 GiB; protobuf cannot hold it, store weights as external data");
  const std::string parse_failed = "not a valid ONNX model (protobuf parse failed: ";
  SlimModel slim;
  if (views) {
    try {
      slim = slim_model(file->data(), file->size(), [&file](size_t offset, size_t size) { file->release(offset, size); });
    } catch (const Error& e) {
      throw invalid(path, parse_failed + e.what() + ")");
    }
  }
  // Nothing cut: protobuf reads the mapping itself rather than a copy of it.
  const bool slimmed = views && !slim.spans.empty();
  if (!slimmed) std::string().swap(slim.bytes);
  const auto* bytes = slimmed ? reinterpret_cast<const uint8_t*>(slim.bytes.data()) : file->data();
  const size_t size = slimmed ? slim.bytes.size() : file->size();
  google::protobuf::io::CodedInputStream input(bytes, static_cast<int>(size));
  input.SetTotalBytesLimit(INT32_MAX);
  ParsedModel parsed;
  parsed.proto = std::make_unique<onnx::ModelProto>();
  if (!parsed.proto->ParseFromCodedStream(&input) || !input.ConsumedEntireMessage())
    throw invalid(path, parse_failed + "truncated or not an ONNX file)");
  if (!parsed.proto->has_graph() || parsed.proto->ir_version() <= 0)
    throw invalid(path, "not an ONNX model (no graph or IR version)");
  file->release(0, file->size());
  parsed.spans = std::move(slim.spans);
  if (!parsed.spans.empty()) parsed.file = std::move(file);
  return parsed;
}

void mark_held(onnx::TensorProto& tensor, size_t index) {
  tensor.clear_raw_data();
  tensor.clear_external_data();
  tensor.set_data_location(onnx::TensorProto::EXTERNAL);
  auto* entry = tensor.add_external_data();
  entry->set_key(kHeldKey);
  entry->set_value(std::to_string(index));
}

uint64_t ParsedModel::held_bytes(const onnx::TensorProto& tensor) const {
  const EmbeddedSpan* span = embedded_span(tensor, spans);
  return span ? span->size : tensor.raw_data().size();
}

namespace {

// Subgraphs of a node: (attribute name, graph) pairs.
template <typename Node, typename F>
void for_each_subgraph(Node& node, F&& f) {
  for (auto& attr : *const_cast<std::remove_const_t<Node>&>(node).mutable_attribute()) {
    if (attr.has_g()) f(attr.name(), *attr.mutable_g());
    for (auto& g : *attr.mutable_graphs()) f(attr.name(), g);
  }
}

// onnx 1.12's checker never sees a default-domain op it has no schema for (OnnxView hides it), so
// ctxgen checks such ops are ONNX ops of the opset the model imports: otherwise the compiled model
// would be one ONNX Runtime refuses to load.
void check_ops_exist(const fs::path& path, const onnx::GraphProto& graph, int64_t opset) {
  for (int i = 0; i < graph.node_size(); ++i) {
    const auto& node = graph.node(i);
    for_each_subgraph(node, [&](const std::string&, const onnx::GraphProto& g) { check_ops_exist(path, g, opset); });
    if (!is_onnx_domain(node.domain()) || onnx::OpSchemaRegistry::Schema(node.op_type(), 1 << 20, "") != nullptr) continue;
    auto newer = ops_after_onnx().find(node.op_type());
    if (newer == ops_after_onnx().end())
      throw invalid(path, "node " + describe_node(node, static_cast<size_t>(i)) + ": no ONNX opset defines an op '" +
                              node.op_type() + "' (a custom op needs a domain of its own)");
    if (newer->second > opset)
      throw invalid(path, "node " + describe_node(node, static_cast<size_t>(i)) + ": " + node.op_type() +
                              " is an ONNX op from opset " + std::to_string(newer->second) + ", but the model imports opset " +
                              std::to_string(opset));
  }
}

void reject_compiled(const fs::path& path, const onnx::GraphProto& graph) {
  for (int i = 0; i < graph.node_size(); ++i) {
    const auto& node = graph.node(i);
    if (node.op_type() == "EPContext")
      throw invalid(path, "already compiled: node " + describe_node(node, i) +
                              " is an EPContext node; compile the original model instead");
  }
}

// Every value a node reads is defined before it: a graph input, an initializer, an earlier node's
// output or, in a subgraph, a value of an enclosing graph. onnx's shape inference assumes this
// (1.12 dereferences a null type for a name nothing defines), and its checker runs only after it.
void check_defined(const fs::path& path, const onnx::GraphProto& graph, std::set<std::string> defined,
                   const std::string& where) {
  for (const auto& v : graph.input()) defined.insert(v.name());
  for (const auto& t : graph.initializer()) defined.insert(t.name());
  for (int i = 0; i < graph.node_size(); ++i) {
    const auto& node = graph.node(i);
    for (const auto& name : node.input())
      if (!name.empty() && !defined.count(name))
        throw invalid(path, where + "node " + describe_node(node, static_cast<size_t>(i)) + " reads '" + name +
                                "', which no graph input, initializer or earlier node defines");
    for_each_subgraph(node, [&](const std::string& attr, const onnx::GraphProto& g) {
      check_defined(path, g, defined, where + "subgraph '" + attr + "' of node " + describe_node(node, static_cast<size_t>(i)) + ": ");
    });
    for (const auto& name : node.output())
      if (!name.empty()) defined.insert(name);
  }
}

// ONNX requires a graph's nodes in topological order, but ONNX Runtime sorts a graph that is not
// (some converters write their nodes in another order) and runs it, so ctxgen sorts it too. Nodes
// keep their order wherever the dependencies allow (the earliest stored ready node goes first), so
// a sorted graph is left as it is; a cycle is left for check_defined to report.
void sort_nodes(onnx::GraphProto& graph) {
  for (auto& node : *graph.mutable_node())
    for_each_subgraph(node, [](const std::string&, onnx::GraphProto& g) { sort_nodes(g); });
  const int count = graph.node_size();
  std::unordered_map<std::string, int> producer;
  for (int i = 0; i < count; ++i)
    for (const auto& out : graph.node(i).output())
      if (!out.empty()) producer.emplace(out, i);
  std::vector<int> waiting(static_cast<size_t>(count), 0);
  std::vector<std::vector<int>> readers(static_cast<size_t>(count));
  bool sorted = true;
  for (int i = 0; i < count; ++i)
    for (const auto& name : node_reads(graph.node(i)))
      if (auto it = producer.find(name); it != producer.end() && it->second != i) {
        ++waiting[static_cast<size_t>(i)];
        readers[static_cast<size_t>(it->second)].push_back(i);
        sorted = sorted && it->second < i;
      }
  if (sorted) return;
  std::priority_queue<int, std::vector<int>, std::greater<>> ready;
  for (int i = 0; i < count; ++i)
    if (waiting[static_cast<size_t>(i)] == 0) ready.push(i);
  std::vector<int> order;
  while (!ready.empty()) {
    const int i = ready.top();
    ready.pop();
    order.push_back(i);
    for (int r : readers[static_cast<size_t>(i)])
      if (--waiting[static_cast<size_t>(r)] == 0) ready.push(r);
  }
  if (static_cast<int>(order.size()) != count) return;
  google::protobuf::RepeatedPtrField<onnx::NodeProto> nodes;
  for (int i : order) *nodes.Add() = std::move(*graph.mutable_node(i));
  graph.mutable_node()->Swap(&nodes);
}

// IR < 4 lists every initializer as a graph input too; those inputs are not real inputs.
void drop_initializer_inputs(onnx::ModelProto& model) {
  if (model.ir_version() >= 4) return;
  auto* graph = model.mutable_graph();
  std::set<std::string> init;
  for (const auto& t : graph->initializer()) init.insert(t.name());
  auto* inputs = graph->mutable_input();
  inputs->erase(std::remove_if(inputs->begin(), inputs->end(),
                               [&](const onnx::ValueInfoProto& v) { return init.count(v.name()) > 0; }),
                inputs->end());
  model.set_ir_version(4);
}

// A Constant node with a numeric tensor value becomes an initializer of its graph, so every weight
// has one representation the later stages handle.
bool constant_tensor(const onnx::NodeProto& node, onnx::TensorProto& out) {
  if (node.op_type() != "Constant" || !is_onnx_domain(node.domain()) ||
      node.output_size() != 1)
    return false;
  for (const auto& a : node.attribute()) {
    if (a.name() == "value" && a.has_t()) {
      out = a.t();
    } else if (a.name() == "value_float") {
      out.set_data_type(onnx::TensorProto::FLOAT);
      out.add_float_data(a.f());
    } else if (a.name() == "value_floats") {
      out.set_data_type(onnx::TensorProto::FLOAT);
      out.add_dims(a.floats_size());
      for (float f : a.floats()) out.add_float_data(f);
    } else if (a.name() == "value_int") {
      out.set_data_type(onnx::TensorProto::INT64);
      out.add_int64_data(a.i());
    } else if (a.name() == "value_ints") {
      out.set_data_type(onnx::TensorProto::INT64);
      out.add_dims(a.ints_size());
      for (int64_t v : a.ints()) out.add_int64_data(v);
    } else {
      return false;
    }
  }
  if (out.data_type() == onnx::TensorProto::STRING || out.data_type() == 0) return false;
  out.set_name(node.output(0));
  return true;
}

void hoist_constants(onnx::GraphProto& graph) {
  auto* nodes = graph.mutable_node();
  int kept = 0;
  for (int i = 0; i < nodes->size(); ++i) {
    onnx::TensorProto tensor;
    if (constant_tensor(nodes->Get(i), tensor)) {
      *graph.add_initializer() = std::move(tensor);
      continue;
    }
    for_each_subgraph(*nodes->Mutable(i), [](const std::string&, onnx::GraphProto& g) { hoist_constants(g); });
    if (kept != i) nodes->SwapElements(kept, i);
    ++kept;
  }
  while (nodes->size() > kept) nodes->RemoveLast();
}

// A tensor attribute that did not become an initializer (a Constant node hoisting refused, another
// op's attribute) gets its bytes back: only weights are views.
void restore_attribute_tensors(onnx::GraphProto& graph, const ParsedModel& embedded) {
  for (auto& node : *graph.mutable_node())
    for (auto& attr : *node.mutable_attribute()) {
      if (attr.has_t() && embedded_span(attr.t(), embedded.spans))
        restore_embedded(*attr.mutable_t(), embedded.spans, embedded.file->data());
      if (attr.has_g()) restore_attribute_tensors(*attr.mutable_g(), embedded);
      for (auto& g : *attr.mutable_graphs()) restore_attribute_tensors(g, embedded);
    }
}

// Names given with a "MODEL:" prefix that is no model's file stem reach load whole; say so.
std::string scope_hint(const std::string& name) {
  auto colon = name.find(':');
  if (colon == std::string::npos) return "";
  return " (no model given has the file stem '" + name.substr(0, colon) + "', so it was read as part of the name)";
}

void fix_shape(onnx::TypeProto& type, const LoadOptions& options, std::set<std::string>& used) {
  if (!type.has_tensor_type() || !type.tensor_type().has_shape()) return;
  for (auto& dim : *type.mutable_tensor_type()->mutable_shape()->mutable_dim()) {
    if (!dim.has_dim_param()) continue;
    auto it = options.fix_dims.find(dim.dim_param());
    if (it == options.fix_dims.end()) continue;
    used.insert(it->first);
    dim.set_dim_value(it->second);
  }
}

void apply_shapes(const fs::path& path, onnx::GraphProto& graph, const LoadOptions& options) {
  std::set<std::string> used_dims;
  for (auto& v : *graph.mutable_input()) fix_shape(*v.mutable_type(), options, used_dims);
  for (auto& v : *graph.mutable_output()) fix_shape(*v.mutable_type(), options, used_dims);
  for (auto& v : *graph.mutable_value_info()) fix_shape(*v.mutable_type(), options, used_dims);
  for (const auto& [name, value] : options.fix_dims) {
    if (used_dims.count(name)) continue;
    std::set<std::string> named = used_dims;  // what the user can fix: the inputs' named dims
    for (const auto& v : graph.input())
      for (const auto& dim : v.type().tensor_type().shape().dim())
        if (dim.has_dim_param()) named.insert(dim.dim_param());
    std::string list;
    for (const auto& n : named) list += (list.empty() ? "" : ", ") + n;
    const std::string hint = !scope_hint(name).empty() ? scope_hint(name)
                             : named.empty()            ? " (its inputs have no named dims)"
                                                        : " (its inputs' named dims: " + list + ")";
    throw Error(ErrorCode::kUsage, path.string() + ": --fix-dim " + name + ": no dimension of that name in the model" + hint);
  }

  for (const auto& [name, dims] : options.input_shapes) {
    auto it = std::find_if(graph.mutable_input()->begin(), graph.mutable_input()->end(),
                           [&name = name](const onnx::ValueInfoProto& v) { return v.name() == name; });
    if (it == graph.mutable_input()->end())
      throw Error(ErrorCode::kUsage, path.string() + ": --input-shape " + name + ": the model has no input of that name" +
                                         scope_hint(name));
    auto* tensor = it->mutable_type()->mutable_tensor_type();
    if (tensor->has_shape() && tensor->shape().dim_size() != static_cast<int>(dims.size()))
      throw Error(ErrorCode::kUsage, path.string() + ": --input-shape " + name + ": the input has rank " +
                                         std::to_string(tensor->shape().dim_size()) + ", the shape given has rank " +
                                         std::to_string(dims.size()));
    for (size_t i = 0; tensor->has_shape() && i < dims.size(); ++i) {
      const auto& d = tensor->shape().dim(static_cast<int>(i));
      if (d.has_dim_value() && d.dim_value() != dims[i])
        throw Error(ErrorCode::kUsage, path.string() + ": --input-shape " + name + ": dimension " + std::to_string(i) +
                                           " is fixed to " + std::to_string(d.dim_value()) + " in the model");
    }
    tensor->clear_shape();
    for (int64_t d : dims) tensor->mutable_shape()->add_dim()->set_dim_value(d);
  }
}

}  // namespace

onnx::TensorProto tensor_of_values(int32_t elem_type, const std::vector<int64_t>& dims, const std::vector<std::string>& texts,
                                   const std::string& what) {
  onnx::TensorProto t;
  t.set_data_type(elem_type);
  for (int64_t d : dims) t.add_dims(d);
  for (const auto& text : texts) {
    size_t used = 0;
    try {
      switch (elem_type) {
        case onnx::TensorProto::FLOAT: t.add_float_data(std::stof(text, &used)); break;
        case onnx::TensorProto::DOUBLE: t.add_double_data(std::stod(text, &used)); break;
        case onnx::TensorProto::INT64: t.add_int64_data(std::stoll(text, &used)); break;
        case onnx::TensorProto::INT32: t.add_int32_data(std::stoi(text, &used)); break;
        case onnx::TensorProto::BOOL: {
          bool known = text == "0" || text == "1" || text == "true" || text == "false";
          if (known) t.add_int32_data(text == "1" || text == "true" ? 1 : 0);
          used = known ? text.size() : std::string::npos;
          break;
        }
        default:
          throw Error(ErrorCode::kUsage, what + ": inputs of element type " + dtype_name(elem_type) +
                                             " cannot be fixed (float, double, int32, int64, bool can)");
      }
    } catch (const std::logic_error&) {
      used = std::string::npos;
    }
    if (used != text.size()) throw Error(ErrorCode::kUsage, what + ": '" + text + "' is not a " + dtype_name(elem_type) + " value");
  }
  return t;
}

namespace {

// --fix-value: the input leaves the graph's inputs and becomes an initializer holding the values,
// typed as the input is; a static input shape must hold exactly that many values.
void apply_values(const fs::path& path, onnx::GraphProto& graph, const LoadOptions& options, Model& model) {
  std::map<std::string, size_t> positions;
  for (int i = 0; i < graph.input_size(); ++i) positions.emplace(graph.input(i).name(), static_cast<size_t>(i));
  for (const auto& [name, texts] : options.fix_values) {
    std::string what = path.string() + ": --fix-value " + name;
    auto* inputs = graph.mutable_input();
    auto it = std::find_if(inputs->begin(), inputs->end(), [&name = name](const onnx::ValueInfoProto& v) { return v.name() == name; });
    if (it == inputs->end()) throw Error(ErrorCode::kUsage, what + ": the model has no input of that name" + scope_hint(name));
    if (!it->type().has_tensor_type()) throw Error(ErrorCode::kUsage, what + ": the input is not a tensor");
    const auto& type = it->type().tensor_type();
    auto count = static_cast<int64_t>(texts.size());
    bool declared = type.has_shape() && std::all_of(type.shape().dim().begin(), type.shape().dim().end(),
                                                    [](const auto& d) { return d.has_dim_value(); });
    std::vector<int64_t> dims;
    if (declared) {
      for (const auto& d : type.shape().dim()) dims.push_back(d.dim_value());
      const std::optional<int64_t> want = bounded_element_count(dims);
      if (!want) throw Error(ErrorCode::kUsage, what + ": the input's dims hold more than 2^48 values");
      if (*want != count)
        throw Error(ErrorCode::kUsage, what + ": the input holds " + std::to_string(*want) + " values, " +
                                           std::to_string(count) + " given");
    } else if (type.has_shape() && type.shape().dim_size() > 1) {
      throw Error(ErrorCode::kUsage, what + ": the input has dynamic dims of rank " + std::to_string(type.shape().dim_size()) +
                                         "; give its shape with --input-shape " + name + "=... first");
    } else if (count != 1 || (type.has_shape() && type.shape().dim_size() == 1)) {
      dims.push_back(count);
    }
    onnx::TensorProto t = tensor_of_values(type.elem_type(), dims, texts, what);
    t.set_name(name);
    // An initializer of the same name was the input's default value: the fixed value replaces it.
    auto* inits = graph.mutable_initializer();
    const auto defaults = std::remove_if(inits->begin(), inits->end(), [&name = name](const onnx::TensorProto& i) { return i.name() == name; });
    model.fixed_values[name] = {std::vector<int64_t>(t.dims().begin(), t.dims().end()), texts, tensor_bytes(t), *it,
                                positions.at(name), defaults != inits->end()};
    inits->erase(defaults, inits->end());
    inputs->erase(it);
    *graph.add_initializer() = std::move(t);
  }
}

// Whether every Shape and Size node (in any graph) reads a value inference typed.
bool shapes_read_typed_values(const onnx::GraphProto& graph, std::set<std::string>& typed) {
  for (const auto* list : {&graph.input(), &graph.value_info(), &graph.output()})
    for (const auto& v : *list)
      if (v.type().has_tensor_type() && v.type().tensor_type().elem_type() != 0) typed.insert(v.name());
  for (const auto& t : graph.initializer()) typed.insert(t.name());
  bool ok = true;
  for (const auto& node : graph.node()) {
    if ((node.op_type() == "Shape" || node.op_type() == "Size") && is_onnx_domain(node.domain()) &&
        node.input_size() > 0 && !typed.count(node.input(0)))
      ok = false;
    for_each_subgraph(node, [&](const std::string&, const onnx::GraphProto& g) { ok = shapes_read_typed_values(g, typed) && ok; });
  }
  return ok;
}

// Two passes: onnx 1.12's data propagation (which computes Shape -> Gather -> Reshape chains)
// dereferences a null type when a Shape node reads a value inference could not type (found by
// fuzzing: a Concat whose inputs disagree leaves everything after it untyped). So it runs only
// when the first pass, without it, typed what every Shape reads; otherwise the specialise stage
// types the rest with ctxgen's rules.
void infer_shapes(const fs::path& path, onnx::ModelProto& model) {
  OnnxView view(model);
  try {
    onnx::shape_inference::InferShapes(model, onnx::OpSchemaRegistry::Instance(), onnx::ShapeInferenceOptions(false, 0, false));
    std::set<std::string> typed;
    if (shapes_read_typed_values(model.graph(), typed))
      onnx::shape_inference::InferShapes(model, onnx::OpSchemaRegistry::Instance(), onnx::ShapeInferenceOptions(false, 0, true));
  } catch (const std::exception& e) {
    throw invalid(path, std::string("shape inference failed: ") + e.what());
  }
}

// The onnx checker would look for external data relative to the working directory, and weight
// bytes are no longer in the protobuf; so it checks a copy whose weights are scalars of their
// type (the real bytes were validated against dims and type when they were taken out).
void strip_weight_refs(onnx::GraphProto& graph) {
  for (auto& t : *graph.mutable_initializer()) {
    if (weight_ref(t) < 0) continue;
    t.clear_external_data();
    t.clear_data_location();
    t.clear_dims();
    t.set_raw_data(std::string(is_4bit(t.data_type()) ? 1 : element_size(t.data_type()), '\0'));
  }
  for (auto& node : *graph.mutable_node())
    for_each_subgraph(node, [](const std::string&, onnx::GraphProto& g) { strip_weight_refs(g); });
}

// onnx 1.12's checker demands a shape on every tensor type; ONNX allows (and ORT reads) values of
// unknown rank, so the checked copy gives those an empty shape the checker accepts.
void allow_unknown_rank(onnx::GraphProto& graph) {
  for (auto* list : {graph.mutable_input(), graph.mutable_output(), graph.mutable_value_info()})
    for (auto& v : *list)
      if (v.type().has_tensor_type() && !v.type().tensor_type().has_shape())
        v.mutable_type()->mutable_tensor_type()->mutable_shape();
}

void check(const fs::path& path, const onnx::ModelProto& proto) {
  onnx::ModelProto copy = proto;
  strip_weight_refs(*copy.mutable_graph());
  allow_unknown_rank(*copy.mutable_graph());
  OnnxView view(copy);
  try {
    onnx::checker::check_model(copy);
  } catch (const std::exception& e) {
    std::string msg = e.what();
    while (!msg.empty() && (msg.back() == '\n' || msg.back() == ' ')) msg.pop_back();
    throw invalid(path, "invalid ONNX model: " + msg);
  }
}

}  // namespace

fs::path external_data_folder(const fs::path& model_path) { return fs::weakly_canonical(fs::absolute(model_path).parent_path()); }

namespace {

// Resolves external-data locations inside the model's folder and maps each file once.
class ExternalFiles {
 public:
  explicit ExternalFiles(const fs::path& model_path)
      : model_path_(model_path), folder_(external_data_folder(model_path)) {}

  TensorData resolve(const onnx::TensorProto& t, const std::string& what) {
    std::string location;
    uint64_t offset = 0;
    std::optional<uint64_t> length;
    for (const auto& kv : t.external_data()) {
      if (kv.key() == "location") location = kv.value();
      else if (kv.key() == "offset") offset = parse_number(kv.value(), what + ": external data offset");
      else if (kv.key() == "length") length = parse_number(kv.value(), what + ": external data length");
    }
    fs::path file = checked_path(location, what);
    auto mapped = map(file, what);
    uint64_t need = expected_bytes(t, what);
    if (length && *length != need)
      throw invalid(model_path_, what + ": external data length " + std::to_string(*length) + " but dims and type need " +
                                     std::to_string(need) + " bytes");
    if (offset > mapped->size() || mapped->size() - offset < need)
      throw invalid(model_path_, what + ": external data '" + location + "' is " + std::to_string(mapped->size()) +
                                     " bytes, the tensor needs bytes [" + std::to_string(offset) + ", " +
                                     std::to_string(offset + need) + ")");
    TensorData data;
    data.data = mapped->data() + offset;
    data.size = need;
    data.owner = mapped;
    data.file = mapped;
    data.file_offset = offset;
    return data;
  }

 private:
  uint64_t parse_number(const std::string& text, const std::string& what) {
    if (text.empty() || text.find_first_not_of("0123456789") != std::string::npos || text.size() > 19)
      throw invalid(model_path_, what + " '" + text + "' is not a non-negative integer");
    return std::stoull(text);
  }

  fs::path checked_path(const std::string& location, const std::string& what) {
    auto bad = [&](const std::string& why) {
      return invalid(model_path_, what + ": external data location '" + location + "' " + why);
    };
    if (location.empty()) throw bad("is empty");
    fs::path rel(location);
    if (rel.is_absolute()) throw bad("is absolute; it must be relative to the model's folder");
    for (const auto& part : rel)
      if (part == "..") throw bad("contains '..'; it must stay inside the model's folder");
    fs::path full = folder_ / rel;
    std::error_code ec;
    fs::path real = fs::weakly_canonical(full, ec);
    if (ec) throw bad("cannot be resolved: " + ec.message());
    auto [f, r] = std::mismatch(folder_.begin(), folder_.end(), real.begin(), real.end());
    if (f != folder_.end()) throw bad("resolves to " + real.string() + ", outside the model's folder " + folder_.string());
    if (!fs::exists(real, ec)) throw bad("does not exist (looked for " + full.string() + ")");
    if (!fs::is_regular_file(real, ec)) throw bad("is not a regular file");
    return real;
  }

  std::shared_ptr<const MappedFile> map(const fs::path& file, const std::string& what) {
    auto it = files_.find(file);
    if (it != files_.end()) return it->second;
    try {
      return files_[file] = MappedFile::open(file);
    } catch (const Error& e) {
      throw invalid(model_path_, what + ": " + e.what());
    }
  }

  fs::path model_path_;
  fs::path folder_;
  std::map<fs::path, std::shared_ptr<const MappedFile>> files_;
};

// The host's bytes a tensor marked by mark_held stands for, or nullptr.
const TensorData* held_view(const onnx::TensorProto& t, const std::vector<TensorData>& held) {
  if (t.data_location() != onnx::TensorProto::EXTERNAL || t.external_data_size() != 1 ||
      t.external_data(0).key() != kHeldKey)
    return nullptr;
  const std::string& text = t.external_data(0).value();
  size_t index = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), index);
  return error == std::errc() && end == text.data() + text.size() && index < held.size() ? &held[index] : nullptr;
}

// Takes the bytes of a tensor out of the protobuf: external data and large embedded tensors stay
// mapped, small raw_data moves into a shared string, typed fields are packed once.
TensorData take_bytes(onnx::TensorProto& t, const std::string& what, ExternalFiles& external, const ParsedModel& embedded,
                      const fs::path& path) {
  TensorData data;
  if (const TensorData* held = held_view(t, embedded.held)) {
    data = *held;
  } else if (const EmbeddedSpan* span = embedded_span(t, embedded.spans)) {
    if (span->field != EmbeddedField::kRawData) model_detail::clear_typed_fields(t);
    data.data = embedded.file->data() + span->offset;
    data.size = span->size;
    data.owner = embedded.file;
    data.file = embedded.file;
    data.file_offset = span->offset;
  } else if (t.data_location() == onnx::TensorProto::EXTERNAL) {
    data = external.resolve(t, what);
  } else if (t.has_raw_data()) {
    auto raw = std::make_shared<std::string>(std::move(*t.mutable_raw_data()));
    t.clear_raw_data();
    data.data = reinterpret_cast<const uint8_t*>(raw->data());
    data.size = raw->size();
    data.owner = std::move(raw);
  } else {
    auto packed = std::make_shared<std::vector<uint8_t>>(model_detail::typed_field_bytes(t));
    model_detail::clear_typed_fields(t);
    data.data = packed->data();
    data.size = packed->size();
    data.owner = std::move(packed);
  }
  if (!data.file || data.file == embedded.file) {  // external.resolve checked its own
    const uint64_t need = expected_bytes(t, what);
    if (data.size != need)
      throw invalid(path, what + ": holds " + std::to_string(data.size) + " bytes, dims and type need " + std::to_string(need));
  }
  data.dtype = t.data_type();
  data.dims.assign(t.dims().begin(), t.dims().end());
  return data;
}

void collect_weights(Model& model, onnx::GraphProto& graph, const std::string& graph_label, bool main,
                     ExternalFiles& external, const ParsedModel& embedded) {
  for (auto& t : *graph.mutable_initializer()) {
    if (t.data_type() == onnx::TensorProto::STRING) continue;
    std::string what = "initializer '" + t.name() + "'" +
                       (main ? "" : " in subgraph " + graph_label);
    Weight w;
    w.name = t.name();
    w.origin = main ? WeightOrigin::kInitializer : WeightOrigin::kSubgraphInitializer;
    w.graph = graph_label;
    w.tensor = &t;
    const TensorData* held = held_view(t, embedded.held);
    // A host's view of a file (ORT's external initializer, mapped) is external data too.
    w.external = held ? held->file != nullptr
                      : t.data_location() == onnx::TensorProto::EXTERNAL && !embedded_span(t, embedded.spans);
    w.data = take_bytes(t, what, external, embedded, model.path);
    t.clear_external_data();
    t.set_data_location(onnx::TensorProto::EXTERNAL);
    auto* ref = t.add_external_data();
    ref->set_key(kWeightRefKey);
    ref->set_value(std::to_string(model.weights.size()));
    model.weights.push_back(std::move(w));
  }
  for (int i = 0; i < graph.node_size(); ++i) {
    auto& node = *graph.mutable_node(i);
    std::string label = node_label(node, static_cast<size_t>(i));
    for_each_subgraph(node, [&](const std::string& attr, onnx::GraphProto& g) {
      collect_weights(model, g, (main ? "" : graph_label + "/") + label + "/" + attr, false, external, embedded);
    });
  }
}

}  // namespace

Model load_model(const fs::path& path, const LoadOptions& options) {
  return load_model(parse_model(path, options.embedded_views), path, options);
}

Model load_model(ParsedModel embedded, const fs::path& path, const LoadOptions& options) {
  Model model;
  model.path = path;
  model.proto = std::move(embedded.proto);
  auto& proto = *model.proto;
  check_versions(path, proto);
  check_attributes(path, proto.graph(), default_opset(proto));
  check_ops_exist(path, proto.graph(), default_opset(proto));
  reject_compiled(path, proto.graph());
  drop_initializer_inputs(proto);
  hoist_constants(*proto.mutable_graph());
  sort_nodes(*proto.mutable_graph());
  if (embedded.file) restore_attribute_tensors(*proto.mutable_graph(), embedded);
  apply_shapes(path, *proto.mutable_graph(), options);
  apply_values(path, *proto.mutable_graph(), options, model);
  check_defined(path, proto.graph(), {}, "");
  // Shape inference still sees small constant tensors (Reshape shapes) with their data.
  infer_shapes(path, proto);
  model_detail::check_input_types(path, proto);
  ExternalFiles external(path);
  collect_weights(model, *proto.mutable_graph(), "main", true, external, embedded);
  check(path, proto);

  const auto& graph = proto.graph();
  std::set<std::string> overridable;
  for (const auto& v : graph.input()) overridable.insert(v.name());
  for (const auto& t : graph.initializer()) {
    int64_t ref = weight_ref(t);
    if (ref >= 0 && !overridable.count(t.name())) model.constants[t.name()] = static_cast<size_t>(ref);
    ValueType vt;
    vt.elem_type = t.data_type();
    vt.dims = std::vector<int64_t>(t.dims().begin(), t.dims().end());
    model.value_types[t.name()] = vt;
  }
  for (const auto* list : {&graph.input(), &graph.value_info(), &graph.output()})
    for (const auto& v : *list) model.value_types[v.name()] = value_type_of(v.type());
  log().debug("{}: {} nodes, {} weights, {} constants", path.string(), graph.node_size(), model.weights.size(),
              model.constants.size());
  return model;
}

std::string deterministic_bytes(const google::protobuf::MessageLite& message) {
  std::string bytes;
  google::protobuf::io::StringOutputStream stream(&bytes);
  google::protobuf::io::CodedOutputStream coded(&stream);
  coded.SetSerializationDeterministic(true);
  message.SerializeToCodedStream(&coded);
  return bytes;
}

const Weight* Model::constant(const std::string& name) const {
  auto it = constants.find(name);
  return it == constants.end() ? nullptr : &weights[it->second];
}

const ValueType* Model::type_of(const std::string& name) const {
  auto it = value_types.find(name);
  return it == value_types.end() ? nullptr : &it->second;
}

std::string ValueType::dims_text() const {
  if (!dims) return "unknown";
  std::string text = "[";
  for (size_t i = 0; i < dims->size(); ++i) {
    const int64_t d = (*dims)[i];
    const std::string name = i < dim_names.size() ? dim_names[i] : "";
    text += (i ? "," : "") + (d >= 0 ? std::to_string(d) : name.empty() ? "?" : name);
  }
  return text + "]";
}

bool ValueType::is_static() const {
  return elem_type != 0 && dims && std::all_of(dims->begin(), dims->end(), [](int64_t d) { return d >= 0; });
}

int64_t weight_ref(const onnx::TensorProto& tensor) {
  if (tensor.data_location() != onnx::TensorProto::EXTERNAL || tensor.external_data_size() != 1 ||
      tensor.external_data(0).key() != kWeightRefKey)
    return -1;
  return std::stoll(tensor.external_data(0).value());
}

ValueType value_type_of(const onnx::TypeProto& type) {
  ValueType vt;
  if (!type.has_tensor_type()) return vt;
  vt.elem_type = type.tensor_type().elem_type();
  if (type.tensor_type().has_shape()) {
    std::vector<int64_t> dims;
    for (const auto& d : type.tensor_type().shape().dim()) {
      dims.push_back(d.has_dim_value() ? d.dim_value() : -1);
      vt.dim_names.push_back(d.has_dim_param() ? d.dim_param() : "");
    }
    vt.dims = std::move(dims);
  }
  return vt;
}

int64_t default_opset(const onnx::ModelProto& model) {
  for (const auto& op : model.opset_import())
    if (is_onnx_domain(op.domain())) return op.version();
  return 0;
}

std::optional<std::string> metadata_value(const onnx::ModelProto& model, const std::string& key) {
  for (const auto& kv : model.metadata_props())
    if (kv.key() == key) return kv.value();
  return std::nullopt;
}

std::optional<std::string> external_location(const onnx::GraphProto& graph) {
  for (const auto& t : graph.initializer())
    for (const auto& kv : t.external_data())
      if (kv.key() == "location") return kv.value();
  for (const auto& node : graph.node()) {
    std::optional<std::string> found;
    for_each_subgraph(node, [&](const std::string&, const onnx::GraphProto& g) {
      if (!found) found = external_location(g);
    });
    if (found) return found;
  }
  return std::nullopt;
}

void set_metadata(onnx::ModelProto& model, const std::string& key, const std::string& value) {
  auto* props = model.mutable_metadata_props();
  for (int i = props->size() - 1; i >= 0; --i)
    if (props->Get(i).key() == key) props->DeleteSubrange(i, 1);
  if (value.empty()) return;
  auto* kv = props->Add();
  kv->set_key(key);
  kv->set_value(value);
}

std::string node_label(const onnx::NodeProto& node, size_t index) {
  return node.name().empty() ? "#" + std::to_string(index) : node.name();
}

std::string describe_node(const onnx::NodeProto& node, size_t index) {
  return (node.name().empty() ? node_label(node, index) : "'" + node.name() + "'") + " (" + node.op_type() + ")";
}

namespace {
void collect_outer_reads(const onnx::GraphProto& g, std::set<std::string>& defined, std::vector<std::string>& out,
                         std::set<std::string>& seen) {
  for (const auto& v : g.input()) defined.insert(v.name());
  for (const auto& t : g.initializer()) defined.insert(t.name());
  for (const auto& n : g.node()) {
    for (const auto& in : n.input())
      if (!in.empty() && !defined.count(in) && seen.insert(in).second) out.push_back(in);
    for (const auto& a : n.attribute()) {
      auto sub = [&](const onnx::GraphProto& sg) {
        std::set<std::string> inner = defined;
        collect_outer_reads(sg, inner, out, seen);
      };
      if (a.has_g()) sub(a.g());
      for (const auto& sg : a.graphs()) sub(sg);
    }
    for (const auto& o : n.output()) defined.insert(o);
  }
}
}  // namespace

std::unordered_set<std::string> names_in_use(const onnx::GraphProto& graph) {
  std::unordered_set<std::string> used;
  for (const auto& node : graph.node())
    for (const auto& value : node_reads(node)) used.insert(value);
  for (const auto& v : graph.output()) used.insert(v.name());
  for (const auto& v : graph.input()) used.insert(v.name());
  return used;
}

std::vector<std::string> node_reads(const onnx::NodeProto& node) {
  std::vector<std::string> reads;
  std::set<std::string> seen;
  for (const auto& in : node.input())
    if (!in.empty() && seen.insert(in).second) reads.push_back(in);
  for (const auto& a : node.attribute()) {
    auto sub = [&](const onnx::GraphProto& g) {
      std::set<std::string> defined;
      collect_outer_reads(g, defined, reads, seen);
    };
    if (a.has_g()) sub(a.g());
    for (const auto& g : a.graphs()) sub(g);
  }
  return reads;
}

}  // namespace ctxgen
