#pragma once
// The check both the unit test and the fuzz target make of ctxgen/embedded.h: protobuf's own parse
// of some bytes, against slim_model + protobuf + restore_embedded of the same bytes.

#include <google/protobuf/util/field_comparator.h>
#include <google/protobuf/util/message_differencer.h>

#include <functional>
#include <string>

#include "ctxgen/embedded.h"
#include "ctxgen/error.h"

namespace ctxgen::testing {

// Every tensor slim_model may cut: graph initializers and attribute tensors, in subgraphs too.
inline void for_each_cut_site(onnx::GraphProto& graph, const std::function<void(onnx::TensorProto&)>& f) {
  for (auto& t : *graph.mutable_initializer()) f(t);
  for (auto& node : *graph.mutable_node())
    for (auto& a : *node.mutable_attribute()) {
      if (a.has_t()) f(*a.mutable_t());
      if (a.has_g()) for_each_cut_site(*a.mutable_g(), f);
      for (auto& g : *a.mutable_graphs()) for_each_cut_site(g, f);
    }
}

struct Agreement {
  bool protobuf_parsed = false;
  bool slim_parsed = false;  // and, when protobuf parsed too, equal to its message
  bool reserved = false;     // slim_model refused a tensor carrying kEmbeddedKey, as it must
  size_t cuts = 0;
  std::string why;  // slim_model's error, or the difference
  bool agrees() const { return protobuf_parsed == slim_parsed || reserved; }
};

inline Agreement agree(const std::string& bytes) {
  const auto* data = reinterpret_cast<const uint8_t*>(bytes.data());
  Agreement a;
  onnx::ModelProto direct;
  a.protobuf_parsed = direct.ParseFromString(bytes);
  SlimModel slim;
  try {
    slim = slim_model(data, bytes.size());
  } catch (const Error& e) {
    a.why = e.what();
    if (a.protobuf_parsed && direct.has_graph() && a.why.find(kEmbeddedKey) != std::string::npos)
      for_each_cut_site(*direct.mutable_graph(), [&](onnx::TensorProto& t) {
        for (const auto& kv : t.external_data()) a.reserved = a.reserved || kv.key() == kEmbeddedKey;
      });
    return a;
  }
  onnx::ModelProto cut;
  a.slim_parsed = cut.ParseFromString(slim.bytes);
  if (!a.slim_parsed) return a;
  a.cuts = slim.spans.size();
  size_t restored = 0;
  if (cut.has_graph())
    for_each_cut_site(*cut.mutable_graph(), [&](onnx::TensorProto& t) {
      if (embedded_span(t, slim.spans)) {
        restore_embedded(t, slim.spans, data);
        ++restored;
      }
    });
  if (restored != slim.spans.size()) {
    a.why = std::to_string(restored) + " of " + std::to_string(slim.spans.size()) + " cut tensors found";
    a.slim_parsed = false;
    return a;
  }
  google::protobuf::util::DefaultFieldComparator exact;  // NaN in an attribute equals NaN (found by fuzzing)
  exact.set_treat_nan_as_equal(true);
  google::protobuf::util::MessageDifferencer differ;
  differ.set_field_comparator(&exact);
  differ.ReportDifferencesToString(&a.why);
  if (a.protobuf_parsed && !differ.Compare(direct, cut)) a.slim_parsed = false;
  return a;
}

}  // namespace ctxgen::testing
