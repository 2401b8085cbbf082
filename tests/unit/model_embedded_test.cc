// The wire-level reader of embedded weights (ctxgen/embedded.h) against protobuf's own parse: on
// every model the tests and the conformance suite have, on hand-made edge cases, and on damage.
#include <gtest/gtest.h>

#include <google/protobuf/util/message_differencer.h>

#include <cstring>
#include <functional>
#include <map>
#include <random>

#include "ctxgen/embedded.h"
#include "ctxgen/error.h"
#include "ctxgen/model.h"
#include "slim_oracle.h"
#include "test_util.h"

namespace ctxgen {
namespace {

using testing::Agreement;
using testing::agree;
using testing::generated_models;
using testing::read_file;
using testing::TempDir;
using testing::write_file;
namespace fs = std::filesystem;

const uint8_t* bytes_of(const std::string& s) { return reinterpret_cast<const uint8_t*>(s.data()); }

void expect_agreement(const std::string& bytes, const std::string& what, size_t* cuts = nullptr) {
  Agreement a = agree(bytes);
  EXPECT_TRUE(a.agrees()) << what << ": protobuf " << a.protobuf_parsed << ", slim " << a.slim_parsed << ": " << a.why;
  if (cuts) *cuts += a.cuts;
}

onnx::TensorProto float_tensor(const std::string& name, int64_t n, float scale = 1.0f) {
  onnx::TensorProto t;
  t.set_name(name);
  t.set_data_type(onnx::TensorProto::FLOAT);
  t.add_dims(n);
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = scale * static_cast<float>(i);
  t.set_raw_data(v.data(), v.size() * sizeof(float));
  return t;
}

onnx::NodeProto node(const std::string& op, std::vector<std::string> in, std::vector<std::string> out) {
  onnx::NodeProto n;
  n.set_op_type(op);
  n.set_name(out.at(0) + "_node");
  for (auto& i : in) n.add_input(i);
  for (auto& o : out) n.add_output(o);
  return n;
}

void value(onnx::ValueInfoProto* v, const std::string& name, int64_t n) {
  v->set_name(name);
  auto* t = v->mutable_type()->mutable_tensor_type();
  t->set_elem_type(onnx::TensorProto::FLOAT);
  t->mutable_shape()->add_dim()->set_dim_value(n);
}

// A model with weights in every form the reader meets: raw_data large and small, float_data,
// double_data, int64, a Constant node, a tensor attribute of another op, and a subgraph.
onnx::ModelProto every_form() {
  constexpr int64_t n = 1024;  // 4 KiB of float: cut
  onnx::ModelProto m;
  m.set_ir_version(8);
  auto* op = m.add_opset_import();
  op->set_version(17);
  auto* g = m.mutable_graph();
  g->set_name("forms");
  value(g->add_input(), "x", n);
  *g->add_initializer() = float_tensor("raw", n);
  *g->add_initializer() = float_tensor("small", 8);
  onnx::TensorProto typed;
  typed.set_name("typed");
  typed.set_data_type(onnx::TensorProto::FLOAT);
  typed.add_dims(n);
  for (int64_t i = 0; i < n; ++i) typed.add_float_data(0.5f * static_cast<float>(i));
  *g->add_initializer() = typed;
  onnx::TensorProto wide;
  wide.set_name("wide");
  wide.set_data_type(onnx::TensorProto::DOUBLE);
  wide.add_dims(n);
  for (int64_t i = 0; i < n; ++i) wide.add_double_data(0.25 * static_cast<double>(i));
  wide.set_data_location(onnx::TensorProto::DEFAULT);
  *g->add_initializer() = wide;
  onnx::TensorProto ids;
  ids.set_name("ids");
  ids.set_data_type(onnx::TensorProto::INT64);
  ids.add_dims(n);
  std::vector<int64_t> idv(n, 3);
  ids.set_raw_data(idv.data(), idv.size() * sizeof(int64_t));
  *g->add_initializer() = ids;

  auto* c = g->add_node();
  *c = node("Constant", {}, {"k"});
  auto* a = c->add_attribute();
  a->set_name("value");
  a->set_type(onnx::AttributeProto::TENSOR);
  *a->mutable_t() = float_tensor("", n, 2.0f);

  *g->add_node() = node("Add", {"x", "raw"}, {"s1"});
  *g->add_node() = node("Add", {"s1", "typed"}, {"s2"});
  *g->add_node() = node("Add", {"s2", "k"}, {"s3"});
  auto* cast = g->add_node();
  *cast = node("Cast", {"wide"}, {"wide_f"});
  auto* to = cast->add_attribute();
  to->set_name("to");
  to->set_type(onnx::AttributeProto::INT);
  to->set_i(onnx::TensorProto::FLOAT);
  *g->add_node() = node("Add", {"s3", "wide_f"}, {"s4"});

  // A tensor attribute of an op that keeps it: it must come back whole.
  auto* custom = g->add_node();
  *custom = node("Opaque", {"s4"}, {"y"});
  custom->set_domain("test.custom");
  auto* ta = custom->add_attribute();
  ta->set_name("table");
  ta->set_type(onnx::AttributeProto::TENSOR);
  *ta->mutable_t() = float_tensor("table", n, 3.0f);
  auto* dom = m.add_opset_import();
  dom->set_domain("test.custom");
  dom->set_version(1);

  // A subgraph with its own initializer.
  auto* cond = g->add_initializer();
  cond->set_name("cond");
  cond->set_data_type(onnx::TensorProto::BOOL);
  cond->set_raw_data(std::string(1, '\1'));
  auto* iff = g->add_node();
  *iff = node("If", {"cond"}, {"z"});
  for (const char* branch : {"then_branch", "else_branch"}) {
    auto* b = iff->add_attribute();
    b->set_name(branch);
    b->set_type(onnx::AttributeProto::GRAPH);
    auto* sg = b->mutable_g();
    sg->set_name(branch);
    *sg->add_initializer() = float_tensor(std::string(branch) + "_w", n, 4.0f);
    *sg->add_node() = node("Add", {"x", std::string(branch) + "_w"}, {std::string(branch) + "_out"});
    value(sg->add_output(), std::string(branch) + "_out", n);
  }
  value(g->add_output(), "y", n);
  value(g->add_output(), "z", n);
  return m;
}

TEST(Embedded, AgreesWithProtobufOnEveryForm) {
  const std::string bytes = every_form().SerializeAsString();
  Agreement a = agree(bytes);
  ASSERT_TRUE(a.protobuf_parsed);
  EXPECT_TRUE(a.slim_parsed) << a.why;
  // raw, typed, wide, the Constant, the custom attribute, two subgraph initializers; not small, ids, cond
  EXPECT_EQ(a.cuts, 7u);
}

TEST(Embedded, AgreesWithProtobufOnEveryTestModel) {
  size_t models = 0, cuts = 0;
  auto visit = [&](const fs::path& root) {
    for (const auto& e : fs::recursive_directory_iterator(root))
      if (e.path().extension() == ".onnx") {
        expect_agreement(read_file(e.path()), e.path().string(), &cuts);
        ++models;
      }
  };
  visit(generated_models());
  visit(fs::path(CTXGEN_SOURCE_DIR) / "testdata");
  if (fs::exists("/usr/share/libonnx-testdata/data")) visit("/usr/share/libonnx-testdata/data");
  EXPECT_GT(models, 1000u);  // the conformance suite is installed by scripts/setup.sh
  EXPECT_GT(cuts, 50u);
}

TEST(Embedded, LeavesMergedAndExternalTensorsWhole) {
  onnx::ModelProto m = every_form();
  // The Constant's attribute written with two tensor fields, which protobuf merges (the last
  // raw_data wins, the dims add up): cutting either would change what protobuf parses.
  onnx::AttributeProto first, second;
  first.set_name("value");
  first.set_type(onnx::AttributeProto::TENSOR);
  *first.mutable_t() = float_tensor("", 1024, 2.0f);
  *second.mutable_t() = float_tensor("", 300);
  auto& constant = *m.mutable_graph()->mutable_node(0);
  constant.clear_attribute();
  constant.GetReflection()->MutableUnknownFields(&constant)->AddLengthDelimited(
      5, first.SerializeAsString() + second.SerializeAsString());
  m.mutable_graph()->mutable_initializer(0)->set_data_location(onnx::TensorProto::EXTERNAL);
  const std::string bytes = m.SerializeAsString();

  onnx::ModelProto direct;
  ASSERT_TRUE(direct.ParseFromString(bytes));
  ASSERT_EQ(direct.graph().node(0).attribute_size(), 1);
  EXPECT_EQ(direct.graph().node(0).attribute(0).t().raw_data().size(), 1200u);
  Agreement a = agree(bytes);
  EXPECT_TRUE(a.slim_parsed) << a.why;
  EXPECT_EQ(a.cuts, 5u);  // every_form's 7 less the merged Constant and the external one
}

TEST(Embedded, AgreesWithProtobufOnDamagedModels) {
  const std::string bytes = every_form().SerializeAsString();
  for (size_t cut = 0; cut < bytes.size(); ++cut) expect_agreement(bytes.substr(0, cut), "cut at " + std::to_string(cut));
  std::mt19937 rng(7);
  for (int i = 0; i < 3000; ++i) {
    std::string damaged = bytes;
    const size_t at = rng() % damaged.size();
    damaged[at] = static_cast<char>(rng());
    expect_agreement(damaged, "byte " + std::to_string(at) + " changed");
  }
}

// slim_model's error for hand-made bytes ("" when it reads them), which protobuf must agree with.
std::string slim_error(const std::string& bytes) {
  expect_agreement(bytes, "hand-made bytes");
  try {
    slim_model(bytes_of(bytes), bytes.size());
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidModel);
    return e.what();
  }
  return "";
}

// A ModelProto whose graph (field 7) holds `graph_bytes`.
std::string model_with_graph(const std::string& graph_bytes) {
  std::string out = "\x08\x08";  // ir_version 8
  out += '\x3a';
  out += static_cast<char>(graph_bytes.size());  // callers keep it under 128 bytes
  return out + graph_bytes;
}

TEST(Embedded, SaysWhereTheWireFormatIsBroken) {
  EXPECT_EQ(slim_error("\x08\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01"), "at byte 1, a varint is longer than 10 bytes");
  EXPECT_EQ(slim_error("\x08"), "at byte 1, a varint runs past the end of its message");
  // protobuf reads a tag in 5 bytes and keeps its low 32 bits (found by fuzzing): field 1, varint
  EXPECT_EQ(slim_error("\x88\x80\x80\x80\x70\x08"), "");
  EXPECT_EQ(slim_error("\x88\x80\x80\x80\x80\x00"), "at byte 0, a varint is longer than 5 bytes");
  EXPECT_EQ(slim_error("\x3a\x80\x80\x80\x80\x08"), "at byte 1, a length of 2147483648 bytes is beyond protobuf's 2 GiB");
  EXPECT_EQ(slim_error("\x0e"), "at byte 0, field 1 has wire type 6, which protobuf does not define");
  EXPECT_EQ(slim_error(std::string("\x00", 1)), "at byte 0, a field tag has no valid field number");
  EXPECT_EQ(slim_error("\x3a\x05\x01"), "at byte 0, field 7 claims 5 bytes, more than its message has left");
  EXPECT_EQ(slim_error("\x0c"), "at byte 0, an end-group tag without its start");
  EXPECT_EQ(slim_error("\x0b\x08\x01"), "at byte 0, group 1 does not end");
  EXPECT_EQ(slim_error("\x0b\x14"), "at byte 1, group 1 ends with another group's tag");
  std::string deep;
  for (int i = 0; i < 130; ++i) deep += "\x0b";
  EXPECT_EQ(slim_error(deep), "at byte 128, messages are nested deeper than 128");
  // an initializer (graph field 5): FLOAT with 1026 bytes of packed float_data
  std::string tensor = "\x10\x01\x22\x82\x08" + std::string(1026, '\0');
  std::string graph = "\x2a\x87\x08" + tensor;
  std::string model = "\x08\x08\x3a\x8a\x08" + graph;
  EXPECT_EQ(slim_error(model), "at byte 10, packed float_data of 1026 bytes is not whole values");
  // an initializer that carries the marker key itself
  std::string entry = std::string("\x0a\x0f") + kEmbeddedKey + "\x12\x01" "0";
  std::string forged = "\x6a" + std::string(1, static_cast<char>(entry.size())) + entry;
  EXPECT_EQ(slim_error(model_with_graph("\x2a" + std::string(1, static_cast<char>(forged.size())) + forged)),
            "at byte 6, a tensor carries the external_data key 'ctxgen_embedded', which ctxgen reserves");
}

// load_model with views and with protobuf's copies: the same Model.
void expect_same_load(const fs::path& path, const LoadOptions& options = {}) {
  LoadOptions copying = options;
  copying.embedded_views = false;
  Model views = load_model(path, options), copies = load_model(path, copying);
  google::protobuf::util::MessageDifferencer differ;
  std::string why;
  differ.ReportDifferencesToString(&why);
  EXPECT_TRUE(differ.Compare(*copies.proto, *views.proto)) << path << ": " << why;
  ASSERT_EQ(views.weights.size(), copies.weights.size()) << path;
  for (size_t i = 0; i < views.weights.size(); ++i) {
    const Weight &v = views.weights[i], &c = copies.weights[i];
    EXPECT_EQ(v.name, c.name);
    EXPECT_EQ(v.origin, c.origin) << v.name;
    EXPECT_EQ(v.graph, c.graph) << v.name;
    EXPECT_EQ(v.external, c.external) << v.name;
    EXPECT_EQ(v.data.dtype, c.data.dtype) << v.name;
    EXPECT_EQ(v.data.dims, c.data.dims) << v.name;
    ASSERT_EQ(v.data.size, c.data.size) << v.name;
    EXPECT_EQ(std::memcmp(v.data.data, c.data.data, v.data.size), 0) << v.name;
  }
  EXPECT_EQ(views.constants, copies.constants) << path;
  EXPECT_EQ(views.value_types.size(), copies.value_types.size()) << path;
}

TEST(Embedded, LoadsLikeProtobufsCopies) {
  TempDir dir;
  write_file(dir.path() / "forms.onnx", every_form().SerializeAsString());
  expect_same_load(dir.path() / "forms.onnx");
  size_t models = 0;
  for (const auto& root : {generated_models(), fs::path(CTXGEN_SOURCE_DIR) / "testdata"})
    for (const auto& e : fs::recursive_directory_iterator(root))
      if (e.path().extension() == ".onnx") {
        LoadOptions copying;
        copying.embedded_views = false;
        std::string refused;
        try {
          load_model(e.path(), copying);
        } catch (const Error& error) {
          refused = error.what();
        }
        if (!refused.empty()) {  // a model made to be refused: views refuse it too, for the same reason
          try {
            load_model(e.path());
            ADD_FAILURE() << e.path() << ": protobuf's copies refuse it (" << refused << "), views do not";
          } catch (const Error& error) {
            EXPECT_EQ(error.what(), refused);
          }
          continue;
        }
        expect_same_load(e.path());
        ++models;
      }
  EXPECT_GT(models, 10u);
}

TEST(Embedded, LargeWeightsAreViewsOfTheModelFile) {
  TempDir dir;
  const fs::path path = dir.path() / "forms.onnx";
  write_file(path, every_form().SerializeAsString());
  Model m = load_model(path);
  std::map<std::string, bool> viewed;
  for (const auto& w : m.weights) {
    const bool in_file = w.data.file && w.data.file->path() == path && w.data.data >= w.data.file->data() &&
                         w.data.data + w.data.size <= w.data.file->data() + w.data.file->size();
    viewed[w.name] = in_file;
    EXPECT_FALSE(w.external) << w.name;
  }
  EXPECT_TRUE(viewed.at("raw"));
  EXPECT_TRUE(viewed.at("typed"));
  EXPECT_TRUE(viewed.at("wide"));
  EXPECT_TRUE(viewed.at("k"));  // the Constant node, hoisted
  EXPECT_TRUE(viewed.at("then_branch_w"));
  EXPECT_FALSE(viewed.at("small"));
  EXPECT_FALSE(viewed.at("ids"));
  // The custom op keeps its attribute, with its bytes back in it.
  const auto& custom = m.graph().node(m.graph().node_size() - 2);
  ASSERT_EQ(custom.op_type(), "Opaque");
  EXPECT_EQ(custom.attribute(0).t().raw_data(), float_tensor("table", 1024, 3.0f).raw_data());
  EXPECT_EQ(custom.attribute(0).t().external_data_size(), 0);
  EXPECT_FALSE(custom.attribute(0).t().has_data_location());
}

}  // namespace
}  // namespace ctxgen
