#include "generate.h"

#include <memory>

#include "ctxgen/error.h"
#include "ort_api.h"

namespace fs = std::filesystem;

namespace ctxgen::ort_ep {

HeldWorkspace shared_workspace() {
  static std::mutex mutex;
  // Never destroyed: a group left open when the process ends has nothing left to write.
  static CompileWorkspace* workspace = new CompileWorkspace();
  return {std::unique_lock<std::mutex>(mutex), *workspace};
}

GenerationPaths generation_paths(const std::string& input_model, const std::optional<std::string>& context_file_path,
                                 const std::string& backend_name) {
  GenerationPaths paths;
  if (context_file_path && !context_file_path->empty()) {
    paths.model = *context_file_path;
  } else if (!input_model.empty()) {
    const fs::path model(input_model);
    paths.model = model.parent_path() / (model.stem().string() + "_ctx.onnx");
  }
  paths.stem = (input_model.empty() ? paths.model : fs::path(input_model)).stem().string();
  if (paths.stem.empty()) paths.stem = "model";
  // As the CLI names it: after the input model when the compiled model has the default name, else
  // after the compiled model (-o out/app.onnx -> out/app_<backend>.bin).
  std::string binary_stem = paths.model.stem().string();
  if (binary_stem == paths.stem + "_ctx") binary_stem = paths.stem;
  if (!paths.model.empty()) paths.binary = paths.model.parent_path() / (binary_stem + "_" + backend_name + ".bin");
  return paths;
}

const fs::path& GenerationPaths::binary_or_throw() const {
  if (binary.empty())
    throw Error(ErrorCode::kUsage,
                "a model loaded from memory has no path to name its compiled model and context binary after: set "
                "ep.context_file_path to the path the compiled model will have, or embed the context "
                "(ep.context_embed_mode=1)");
  return binary;
}

OrtNode* create_ep_context_node(const CompiledGraph& graph, const std::string& node_name, bool main,
                                const EpContextSettings& settings, const std::string& model_filename) {
  onnx::NodeProto node = epcontext_node(graph, main, settings, model_filename);
  node.set_name(node_name);
  std::vector<const char*> inputs, outputs;
  for (const auto& in : node.input()) inputs.push_back(in.c_str());
  for (const auto& out : node.output()) outputs.push_back(out.c_str());
  using Attr = std::unique_ptr<OrtOpAttr, void (*)(OrtOpAttr*)>;
  std::vector<Attr> owned;
  std::vector<OrtOpAttr*> attributes;
  for (const auto& a : node.attribute()) {
    OrtOpAttr* attr = nullptr;
    if (a.type() == onnx::AttributeProto::INT) {
      const int64_t value = a.i();
      check(api().ort->CreateOpAttr(a.name().c_str(), &value, 1, ORT_OP_ATTR_INT, &attr), "CreateOpAttr");
    } else {
      // The only other kind the node has: strings, an embedded payload among them (at most 2 GiB,
      // the limit of an ONNX file).
      if (a.s().size() > static_cast<size_t>(INT32_MAX))
        throw Error(ErrorCode::kUsage, "EPContext node '" + graph.name + "': attribute '" + a.name() + "' would be " +
                                           std::to_string(a.s().size()) +
                                           " bytes; embedded contexts are limited to 2 GiB (set ep.context_embed_mode=0)");
      check(api().ort->CreateOpAttr(a.name().c_str(), a.s().data(), static_cast<int>(a.s().size()),
                                    ORT_OP_ATTR_STRING, &attr),
            "CreateOpAttr");
    }
    owned.emplace_back(attr, api().ort->ReleaseOpAttr);
    attributes.push_back(attr);
  }
  const OrtModelEditorApi* editor = api().ort->GetModelEditorApi();
  if (editor == nullptr) throw Error(ErrorCode::kInternal, "this ONNX Runtime has no model editor API to make EPContext nodes with");
  OrtNode* made = nullptr;
  OrtStatus* status = editor->CreateNode(node.op_type().c_str(), node.domain().c_str(), node.name().c_str(),
                                         inputs.data(), inputs.size(), outputs.data(), outputs.size(),
                                         attributes.data(), attributes.size(), &made);
  // CreateNode takes each attribute it copied, releasing it and clearing its slot.
  for (size_t i = 0; i < attributes.size(); ++i)
    if (attributes[i] == nullptr) (void)owned[i].release();
  check(status, "CreateNode");
  return made;
}

}  // namespace ctxgen::ort_ep
