#include <gtest/gtest.h>

#include <array>
#include <cstring>
#include <functional>

#include "ctxgen/error.h"
#include "ctxgen/model.h"
#include "test_util.h"

namespace ctxgen {
namespace {

using testing::generated_models;
using testing::read_file;
using testing::TempDir;
using testing::write_file;
namespace fs = std::filesystem;

ErrorCode load_error(const fs::path& path, std::string* message = nullptr, const LoadOptions& options = {}) {
  try {
    load_model(path, options);
  } catch (const Error& e) {
    if (message) *message = e.what();
    return e.code();
  }
  ADD_FAILURE() << "loading " << path << " did not fail";
  return ErrorCode::kInternal;
}

onnx::ModelProto parse(const fs::path& path) {
  onnx::ModelProto proto;
  EXPECT_TRUE(proto.ParseFromString(read_file(path)));
  return proto;
}

TEST(Model, LoadsWeightsAndInfersShapes) {
  Model m = load_model(generated_models() / "cnn.onnx");
  EXPECT_EQ(m.weights.size(), 9u);
  EXPECT_EQ(m.constants.size(), 9u);
  const Weight* w1 = m.constant("w1");
  ASSERT_NE(w1, nullptr);
  EXPECT_EQ(w1->data.dims, (std::vector<int64_t>{8, 3, 3, 3}));
  EXPECT_EQ(w1->data.size, 8u * 3 * 3 * 3 * 4);
  EXPECT_EQ(weight_ref(*w1->tensor), static_cast<int64_t>(m.constants.at("w1")));
  const ValueType* c2 = m.type_of("c2");
  ASSERT_NE(c2, nullptr);
  EXPECT_TRUE(c2->is_static());
  EXPECT_EQ(*c2->dims, (std::vector<int64_t>{1, 16, 8, 8}));
}

// A model of graph "g" at `opset`, filled by `fill`, written into `dir` as `name`.
fs::path write_model(const TempDir& dir, const std::string& name, int64_t opset,
                     const std::function<void(onnx::GraphProto&)>& fill) {
  onnx::ModelProto m;
  m.set_ir_version(opset >= 21 ? 10 : 8);
  m.add_opset_import()->set_version(opset);
  m.mutable_graph()->set_name("g");
  fill(*m.mutable_graph());
  write_file(dir.path() / name, m.SerializeAsString());
  return dir.path() / name;
}

// int4 and uint4 (opset 21, unknown to onnx 1.12) hold two values a byte: (n + 1) / 2 bytes, from
// raw_data or from int32_data, which holds a byte an entry.
TEST(Model, LoadsFourBitWeightsAsTheirPackedBytes) {
  TempDir dir;
  auto save = [&](const std::string& name, const std::function<void(onnx::TensorProto&)>& fill) {
    return write_model(dir, name, 21, [&](onnx::GraphProto& g) {
      auto* t = g.add_initializer();
      t->set_name("w");
      t->set_data_type(kOnnxInt4);
      t->add_dims(5);
      fill(*t);
      auto* s = g.add_initializer();
      s->set_name("s");
      s->set_data_type(onnx::TensorProto::FLOAT);
      s->add_float_data(0.5f);
      auto* n = g.add_node();
      n->set_op_type("DequantizeLinear");
      n->add_input("w");
      n->add_input("s");
      n->add_output("y");
      auto* y = g.add_output();
      y->set_name("y");
      y->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::FLOAT);
      y->mutable_type()->mutable_tensor_type()->mutable_shape()->add_dim()->set_dim_value(5);
    });
  };
  const Model raw = load_model(save("raw.onnx", [](onnx::TensorProto& t) { t.set_raw_data(std::string("\xF1\x87\x03", 3)); }));
  const Model typed = load_model(save("typed.onnx", [](onnx::TensorProto& t) {
    for (int b : {0xF1, 0x87, 0x03}) t.add_int32_data(b);
  }));
  for (const Model* m : {&raw, &typed}) {
    const Weight* w = m->constant("w");
    ASSERT_NE(w, nullptr);
    EXPECT_EQ(w->data.dims, (std::vector<int64_t>{5}));
    ASSERT_EQ(w->data.size, 3u);
    EXPECT_EQ(std::vector<uint8_t>(w->data.data, w->data.data + 3), (std::vector<uint8_t>{0xF1, 0x87, 0x03}));
  }
  std::string message;
  EXPECT_EQ(load_error(save("short.onnx", [](onnx::TensorProto& t) { t.set_raw_data(std::string(2, '\0')); }), &message),
            ErrorCode::kInvalidModel);
  EXPECT_NE(message.find("initializer 'w': holds 2 bytes, dims and type need 3"), std::string::npos) << message;
  EXPECT_EQ(dtype_name(kOnnxInt4), "int4");
  EXPECT_EQ(dtype_name(kOnnxUInt4), "uint4");
}

// What ONNX Runtime refuses to load, ctxgen refuses too, saying why, instead of writing a model
// that does not load: two nodes of one name, a pooling window wholly in its padding.
TEST(Model, RefusesWhatOnnxRuntimeRefuses) {
  TempDir dir;
  auto save = [&](const std::string& name, const std::function<void(onnx::GraphProto&)>& fill) {
    return write_model(dir, name, 17, [&](onnx::GraphProto& g) {
      auto* x = g.add_input();
      x->set_name("x");
      x->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::FLOAT);
      for (int64_t d : {1, 1, 4, 4}) x->mutable_type()->mutable_tensor_type()->mutable_shape()->add_dim()->set_dim_value(d);
      g.add_output()->set_name("y");
      g.mutable_output(0)->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::FLOAT);
      fill(g);
    });
  };
  auto node = [](onnx::GraphProto& g, const std::string& op, const std::string& name, const std::string& in, const std::string& out) {
    auto* n = g.add_node();
    n->set_op_type(op);
    n->set_name(name);
    n->add_input(in);
    n->add_output(out);
    return n;
  };
  auto ints = [](onnx::NodeProto* n, const std::string& name, std::vector<int64_t> values) {
    auto* a = n->add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::INTS);
    for (int64_t v : values) a->add_ints(v);
  };
  std::string msg;
  EXPECT_EQ(load_error(save("twins.onnx", [&](onnx::GraphProto& g) {
              node(g, "Relu", "same", "x", "r");
              node(g, "Relu", "same", "r", "y");
            }), &msg),
            ErrorCode::kInvalidModel);
  EXPECT_NE(msg.find("two nodes of graph 'g' are named 'same' (ONNX Runtime refuses such a model)"), std::string::npos) << msg;
  for (const std::string op : {"MaxPool", "AveragePool"}) {
    EXPECT_EQ(load_error(save("pool.onnx", [&](onnx::GraphProto& g) {
                auto* n = node(g, op, "pool", "x", "y");
                ints(n, "kernel_shape", {2, 2});
                ints(n, "pads", {0, 2, 0, 0});
              }), &msg),
              ErrorCode::kInvalidModel);
    EXPECT_NE(msg.find("pads of axis 1 (2, 0) are not smaller than its kernel 2 (ONNX Runtime refuses such a pooling)"),
              std::string::npos)
        << msg;
  }
  // An If whose branches give different numbers or types of outputs.
  auto branch = [](onnx::NodeProto* n, const std::string& name, std::vector<int32_t> types) {
    auto* a = n->add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::GRAPH);
    auto* g = a->mutable_g();
    g->set_name(name);
    for (size_t o = 0; o < types.size(); ++o) {
      auto* c = g->add_node();
      c->set_op_type("Constant");
      c->add_output(name + std::to_string(o));
      auto* value = c->add_attribute();
      value->set_name("value");
      value->set_type(onnx::AttributeProto::TENSOR);
      value->mutable_t()->set_data_type(types[o]);
      if (types[o] == onnx::TensorProto::FLOAT) value->mutable_t()->add_float_data(1);
      else value->mutable_t()->add_int64_data(1);
      auto* out = g->add_output();
      out->set_name(name + std::to_string(o));
      out->mutable_type()->mutable_tensor_type()->set_elem_type(types[o]);
    }
  };
  const std::vector<std::pair<std::vector<int32_t>, std::string>> disagreeing = {
      {{onnx::TensorProto::FLOAT, onnx::TensorProto::FLOAT}, "then_branch has 1 output(s), else_branch 2, the node 1"},
      {{onnx::TensorProto::INT64}, "output 0 is float32 in then_branch and int64 in else_branch"}};
  for (const auto& [types, message] : disagreeing) {
    const std::vector<int32_t>& else_types = types;  // clang before 16 cannot capture structured bindings
    EXPECT_EQ(load_error(save("if.onnx", [&](onnx::GraphProto& g) {
                auto* cond = g.add_input();
                cond->set_name("c");
                cond->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::BOOL);
                cond->mutable_type()->mutable_tensor_type()->mutable_shape();
                auto* n = node(g, "If", "choose", "c", "y");
                branch(n, "then_branch", {onnx::TensorProto::FLOAT});
                branch(n, "else_branch", else_types);
              }), &msg),
              ErrorCode::kInvalidModel);
    EXPECT_NE(msg.find("node 'choose' (If): " + message + " (ONNX Runtime refuses an If whose branches disagree)"),
              std::string::npos)
        << msg;
  }
  EXPECT_NO_THROW(load_model(save("fine.onnx", [&](onnx::GraphProto& g) {
    auto* n = node(g, "MaxPool", "pool", "x", "y");
    ints(n, "kernel_shape", {2, 2});
    ints(n, "pads", {1, 1, 1, 1});
  })));
}

TEST(Model, WeightBytesAreNotKeptInTheProtobuf) {
  Model m = load_model(generated_models() / "cnn.onnx");
  for (const auto& t : m.graph().initializer()) {
    EXPECT_TRUE(t.raw_data().empty()) << t.name();
    EXPECT_EQ(t.float_data_size(), 0) << t.name();
  }
}

TEST(Model, HoistsConstantNodes) {
  Model m = load_model(generated_models() / "constants.onnx");
  EXPECT_EQ(m.graph().node_size(), 2);
  const Weight* bias = m.constant("bias");
  ASSERT_NE(bias, nullptr);
  EXPECT_EQ(bias->data.dims, (std::vector<int64_t>{4}));
  float values[4];
  std::memcpy(values, bias->data.data, sizeof values);
  EXPECT_EQ(values[0], 0.5f);
  EXPECT_EQ(values[3], 2.0f);
  ASSERT_NE(m.constant("w"), nullptr);
}

// ONNX Runtime sorts a graph stored out of topological order and runs it; so does ctxgen, keeping
// the stored order wherever the dependencies allow.
TEST(Model, SortsNodesStoredOutOfOrder) {
  onnx::ModelProto proto;
  proto.set_ir_version(8);
  proto.add_opset_import()->set_version(17);
  auto& g = *proto.mutable_graph();
  g.set_name("unsorted");
  auto typed = [](onnx::ValueInfoProto* v, const std::string& name) {
    v->set_name(name);
    auto* t = v->mutable_type()->mutable_tensor_type();
    t->set_elem_type(onnx::TensorProto::FLOAT);
    t->mutable_shape()->add_dim()->set_dim_value(2);
  };
  typed(g.add_input(), "x");
  typed(g.add_output(), "y");
  for (const auto& [op, in, out] : std::vector<std::array<std::string, 3>>{
           {"Relu", "b", "c"}, {"Abs", "x", "a"}, {"Neg", "a", "b"}, {"Sigmoid", "x", "s"}, {"Add", "c", "y"}}) {
    auto* n = g.add_node();
    n->set_op_type(op);
    n->add_input(in);
    if (op == "Add") n->add_input("s");
    n->add_output(out);
  }
  TempDir dir;
  write_file(dir.path() / "unsorted.onnx", proto.SerializeAsString());
  Model m = load_model(dir.path() / "unsorted.onnx");
  std::vector<std::string> ops;
  for (const auto& n : m.graph().node()) ops.push_back(n.op_type());
  EXPECT_EQ(ops, (std::vector<std::string>{"Abs", "Neg", "Relu", "Sigmoid", "Add"}));
  ASSERT_TRUE(m.type_of("c") && m.type_of("c")->is_static()) << "shape inference ran on the sorted graph";
}

TEST(Model, FindsWeightsInsideSubgraphs) {
  Model m = load_model(generated_models() / "subgraph.onnx");
  std::vector<std::string> names;
  for (const auto& w : m.weights) names.push_back(w.name + "@" + w.graph);
  // Attribute order as stored (onnx's helper sorts them: else_branch first).
  EXPECT_EQ(names, (std::vector<std::string>{"w_in@main", "else_w@if/else_branch", "else_c@if/else_branch",
                                             "then_w@if/then_branch", "then_c@if/then_branch"}));
  EXPECT_EQ(m.constants.size(), 1u);  // subgraph weights are not main-graph constants
  const auto& if_node = m.graph().node(1);
  EXPECT_EQ(node_reads(if_node), (std::vector<std::string>{"cond", "h"}));
}

TEST(Model, MapsExternalDataWithoutCopying) {
  fs::path path = generated_models() / "external.onnx";
  Model m = load_model(path);
  std::string file = read_file(generated_models() / "external.weights");
  ASSERT_EQ(m.weights.size(), 3u);
  for (const auto& w : m.weights) {
    EXPECT_TRUE(w.external);
    ASSERT_NE(w.data.file, nullptr);
    EXPECT_EQ(w.data.data, w.data.file->data() + w.data.file_offset);
    EXPECT_EQ(std::memcmp(w.data.data, file.data() + w.data.file_offset, w.data.size), 0);
  }
}

TEST(Model, FixDimAndInputShapeMakeShapesStatic) {
  Model dynamic = load_model(generated_models() / "dynamic.onnx");
  EXPECT_FALSE(dynamic.type_of("m")->is_static());

  LoadOptions fixed;
  fixed.fix_dims["batch"] = 3;
  Model m = load_model(generated_models() / "dynamic.onnx", fixed);
  EXPECT_EQ(*m.type_of("x")->dims, (std::vector<int64_t>{3, 8}));
  EXPECT_EQ(*m.type_of("m")->dims, (std::vector<int64_t>{3, 4}));

  LoadOptions shaped;
  shaped.input_shapes["x"] = {5, 8};
  Model s = load_model(generated_models() / "dynamic.onnx", shaped);
  EXPECT_EQ(*s.type_of("y")->dims, (std::vector<int64_t>{5, 4}));
}

TEST(Model, RejectsBadShapeOptions) {
  std::string msg;
  LoadOptions unknown_dim;
  unknown_dim.fix_dims["btach"] = 1;
  EXPECT_EQ(load_error(generated_models() / "dynamic.onnx", &msg, unknown_dim), ErrorCode::kUsage);
  EXPECT_NE(msg.find("--fix-dim btach: no dimension of that name in the model (its inputs' named dims: batch)"), std::string::npos)
      << msg;

  LoadOptions wrong_rank;
  wrong_rank.input_shapes["x"] = {1, 2, 3};
  EXPECT_EQ(load_error(generated_models() / "dynamic.onnx", &msg, wrong_rank), ErrorCode::kUsage);
  EXPECT_NE(msg.find("rank 2"), std::string::npos);

  LoadOptions conflicting;
  conflicting.input_shapes["x"] = {2, 9};
  EXPECT_EQ(load_error(generated_models() / "dynamic.onnx", &msg, conflicting), ErrorCode::kUsage);

  LoadOptions no_input;
  no_input.input_shapes["nope"] = {1};
  EXPECT_EQ(load_error(generated_models() / "dynamic.onnx", &msg, no_input), ErrorCode::kUsage);
  EXPECT_NE(msg.find("nope"), std::string::npos);

  // 2^61 x 8 values wrap to 0 in 64 bits: the count is bounded, never wrapped.
  LoadOptions wrapping;
  wrapping.input_shapes["x"] = {int64_t{1} << 61, 8};
  wrapping.fix_values["x"] = {"1"};
  EXPECT_EQ(load_error(generated_models() / "dynamic.onnx", &msg, wrapping), ErrorCode::kUsage);
  EXPECT_NE(msg.find("--fix-value x: the input's dims hold more than 2^48 values"), std::string::npos) << msg;
}

TEST(Model, RejectsFilesThatAreNotModels) {
  TempDir dir;
  std::string msg;
  EXPECT_EQ(load_error(dir / "missing.onnx", &msg), ErrorCode::kInvalidModel);
  EXPECT_NE(msg.find("missing.onnx: no such file"), std::string::npos) << msg;
  EXPECT_EQ(load_error(dir.path(), &msg), ErrorCode::kInvalidModel);
  EXPECT_NE(msg.find("directory"), std::string::npos) << msg;

  write_file(dir / "empty.onnx", "");
  EXPECT_EQ(load_error(dir / "empty.onnx", &msg), ErrorCode::kInvalidModel);
  EXPECT_NE(msg.find("empty"), std::string::npos) << msg;

  write_file(dir / "text.onnx", "this is not a protobuf at all\n");
  EXPECT_EQ(load_error(dir / "text.onnx", &msg), ErrorCode::kInvalidModel);

  std::string cnn = read_file(generated_models() / "cnn.onnx");
  for (size_t cut : {size_t{1}, cnn.size() / 3, cnn.size() / 2, cnn.size() - 1}) {
    write_file(dir / "truncated.onnx", cnn.substr(0, cut));
    EXPECT_EQ(load_error(dir / "truncated.onnx", &msg), ErrorCode::kInvalidModel) << "cut at " << cut;
    EXPECT_NE(msg.find("truncated.onnx"), std::string::npos) << msg;
  }
}

TEST(Model, RejectsAnAlreadyCompiledModel) {
  TempDir dir;
  onnx::ModelProto proto = parse(generated_models() / "unsupported.onnx");
  proto.mutable_graph()->mutable_node(0)->set_op_type("EPContext");
  proto.mutable_graph()->mutable_node(0)->set_domain("com.microsoft");
  auto* ms = proto.add_opset_import();
  ms->set_domain("com.microsoft");
  ms->set_version(1);
  write_file(dir / "compiled.onnx", proto.SerializeAsString());
  std::string msg;
  EXPECT_EQ(load_error(dir / "compiled.onnx", &msg), ErrorCode::kInvalidModel);
  EXPECT_NE(msg.find("already compiled"), std::string::npos) << msg;
}

// external.onnx with its first tensor's external-data entry `key` set to `value`.
fs::path with_external(const TempDir& dir, const std::string& key, const std::string& value) {
  fs::copy_file(generated_models() / "external.weights", dir / "external.weights", fs::copy_options::overwrite_existing);
  onnx::ModelProto proto = parse(generated_models() / "external.onnx");
  auto* t = proto.mutable_graph()->mutable_initializer(0);
  bool found = false;
  for (auto& kv : *t->mutable_external_data())
    if (kv.key() == key) {
      kv.set_value(value);
      found = true;
    }
  if (!found) {
    auto* kv = t->add_external_data();
    kv->set_key(key);
    kv->set_value(value);
  }
  fs::path path = dir / "model.onnx";
  write_file(path, proto.SerializeAsString());
  return path;
}

TEST(Model, RejectsBadExternalData) {
  struct Case {
    std::string key, value, expect;
  };
  std::vector<Case> cases = {
      {"location", "", "is empty"},
      {"location", "/etc/passwd", "is absolute"},
      {"location", "../external.weights", "contains '..'"},
      {"location", "sub/../../x", "contains '..'"},
      {"location", "missing.weights", "does not exist"},
      {"offset", "1590", "needs bytes"},
      {"offset", "-4", "not a non-negative integer"},
      {"length", "12", "length 12"},
  };
  for (const auto& c : cases) {
    TempDir dir;
    std::string msg;
    EXPECT_EQ(load_error(with_external(dir, c.key, c.value), &msg), ErrorCode::kInvalidModel) << c.key << "=" << c.value;
    EXPECT_NE(msg.find(c.expect), std::string::npos) << msg;
    EXPECT_NE(msg.find("initializer 'w1'"), std::string::npos) << msg;
  }
}

TEST(Model, RejectsExternalDataThroughASymlinkLeavingTheFolder) {
  TempDir outside;
  TempDir dir;
  fs::copy_file(generated_models() / "external.weights", outside / "real.weights");
  fs::create_symlink(outside / "real.weights", dir / "link.weights");
  std::string msg;
  EXPECT_EQ(load_error(with_external(dir, "location", "link.weights"), &msg), ErrorCode::kInvalidModel);
  EXPECT_NE(msg.find("outside the model's folder"), std::string::npos) << msg;
}

TEST(Model, RejectsADirectoryAsExternalData) {
  TempDir dir;
  fs::create_directories(dir / "folder");
  std::string msg;
  EXPECT_EQ(load_error(with_external(dir, "location", "folder"), &msg), ErrorCode::kInvalidModel);
  EXPECT_NE(msg.find("not a regular file"), std::string::npos) << msg;
}

TEST(Model, DescribesNodes) {
  onnx::NodeProto named, anonymous;
  named.set_name("conv_3");
  named.set_op_type("Conv");
  anonymous.set_op_type("Relu");
  EXPECT_EQ(describe_node(named, 3), "'conv_3' (Conv)");
  EXPECT_EQ(describe_node(anonymous, 7), "#7 (Relu)");
}

}  // namespace
}  // namespace ctxgen
