// Runs validated programs: binds every value to a buffer (caller inputs/outputs, weights, arena
// slices) and calls each op's kernel in order.

#include <algorithm>
#include <string>

#include "ctxgen/error.h"
#include "ctxgen/runtime.h"
#include "onednn.h"
#include "ops.h"

namespace ctxgen::runtime {
namespace {

void expect_count(size_t given, size_t wanted, const char* what) {
  if (given != wanted)
    throw Error(ErrorCode::kRuntime, "ref program: " + std::to_string(given) + " " + what + " buffers given, the graph has " +
                                         std::to_string(wanted));
}

// The buffer behind every value, or throws when the caller left one out.
std::vector<void*> bind(const ref::Program& program, const WeightLookup& weights,
                        const std::vector<const void*>& inputs, const std::vector<void*>& outputs,
                        std::vector<uint8_t>& arena) {
  std::vector<void*> buffers(program.values.size(), nullptr);
  for (size_t id = 0; id < program.values.size(); ++id) {
    const ref::Value& v = program.values[id];
    const void* at = nullptr;
    switch (v.kind) {
      case ref::ValueKind::kInput: at = inputs[v.index]; break;
      case ref::ValueKind::kOutput: at = outputs[v.index]; break;
      case ref::ValueKind::kWeight: at = weights(static_cast<uint32_t>(v.index)); break;
      case ref::ValueKind::kArena: at = arena.data() + v.index; break;
    }
    if (!at && v.byte_size() > 0) {
      const char* kinds[] = {"input ", "output ", "weight ", "arena value "};
      throw Error(ErrorCode::kRuntime, "ref program: no buffer for " + std::string(kinds[static_cast<int>(v.kind)]) +
                                           (v.kind == ref::ValueKind::kArena ? "" : std::to_string(v.index)) +
                                           " (value " + std::to_string(id) + ")");
    }
    // An empty tensor may come without a buffer; kernels still pass its address to memcpy.
    static const float kNoElements = 0;
    if (!at) at = &kNoElements;
    // Kernels only write outputs and arena values (validate() guarantees it), never inputs or weights.
    buffers[id] = const_cast<void*>(at);
  }
  return buffers;
}

// The graph record's signature is what callers size their buffers by; it must be the program's.
void check_signature(const std::vector<IoSignature>& sigs, const ref::Program& program, const std::vector<int32_t>& ids,
                     const std::string& what) {
  if (sigs.size() != ids.size())
    throw Error(ErrorCode::kInvalidBinary, "the graph record lists " + std::to_string(sigs.size()) + " " + what +
                                               "s, its program has " + std::to_string(ids.size()));
  for (size_t i = 0; i < sigs.size(); ++i) {
    const ref::Value& v = program.values[static_cast<size_t>(ids[i])];
    if (sigs[i].elem_type != static_cast<int32_t>(v.dtype) || sigs[i].dims != v.dims)
      throw Error(ErrorCode::kInvalidBinary, what + " " + std::to_string(i) + " '" + sigs[i].name + "' has type " +
                                                 std::to_string(sigs[i].elem_type) + " dims " + dims_text(sigs[i].dims) +
                                                 " in the graph record, type " + std::to_string(static_cast<int>(v.dtype)) +
                                                 " dims " + dims_text(v.dims) + " in its program");
  }
}

// Each op's definition, found by name once per program instead of on every run.
std::vector<const OpDef*> defs_of(const ref::Program& program) {
  std::vector<const OpDef*> defs;
  defs.reserve(program.ops.size());
  for (const ref::Op& op : program.ops) defs.push_back(find_op(op.type));
  return defs;
}

constexpr uint64_t kScratchAlignment = 64;

}  // namespace

// Ops run one after another, so they share one scratch region, after the program's arena.
struct Plans {
  std::vector<std::unique_ptr<OpPlan>> ops;  // nullptr for an op whose type has no planner
  uint64_t scratch_at = 0;                   // in the arena
  uint64_t arena_bytes = 0;                  // with the scratch
};

namespace {

std::shared_ptr<const Plans> plan_ops(const ref::Program& program, const std::vector<const OpDef*>& defs) {
  auto plans = std::make_shared<Plans>();
  plans->scratch_at = (program.arena_bytes + kScratchAlignment - 1) / kScratchAlignment * kScratchAlignment;
  uint64_t scratch = 0;
  std::vector<const ref::Value*> ins;
  for (size_t k = 0; k < program.ops.size(); ++k) {
    const ref::Op& op = program.ops[k];
    if (!defs[k]->plan) {
      plans->ops.emplace_back();
      continue;
    }
    ins.clear();
    for (int32_t id : op.inputs) ins.push_back(id < 0 ? nullptr : &program.values[static_cast<size_t>(id)]);
    try {
      plans->ops.push_back(defs[k]->plan(op, ins, program.values[static_cast<size_t>(op.outputs[0])]));
    } catch (const Error& e) {
      throw e.within("ref program: op " + std::to_string(k) + " (" + op.type + ")");
    }
    scratch = std::max(scratch, plans->ops.back()->scratch_bytes);
  }
  plans->arena_bytes = plans->scratch_at + scratch;
  return plans;
}

void run_ops(const ref::Program& program, const std::vector<const OpDef*>& defs, const Plans& plans,
             const WeightLookup& weights, const std::vector<const void*>& inputs, const std::vector<void*>& outputs,
             std::vector<uint8_t>& arena, const ParallelFor& parallel) {
  expect_count(inputs.size(), program.inputs.size(), "input");
  expect_count(outputs.size(), program.outputs.size(), "output");
  // Over-allocated by the alignment so the scratch starts 64-byte aligned wherever the vector's
  // storage does.
  if (arena.size() < plans.arena_bytes + kScratchAlignment) arena.resize(plans.arena_bytes + kScratchAlignment);
  std::vector<void*> buffers = bind(program, weights, inputs, outputs, arena);
  const auto base = reinterpret_cast<uintptr_t>(arena.data()) + plans.scratch_at;
  auto* scratch = arena.data() + plans.scratch_at + ((kScratchAlignment - base % kScratchAlignment) % kScratchAlignment);
  std::vector<Tensor> ins;
  for (size_t k = 0; k < program.ops.size(); ++k) {
    const ref::Op& op = program.ops[k];
    ins.clear();
    for (int32_t id : op.inputs)
      ins.push_back(id < 0 ? Tensor{} : Tensor{&program.values[static_cast<size_t>(id)], buffers[static_cast<size_t>(id)]});
    auto out_id = static_cast<size_t>(op.outputs[0]);
    // Nothing to write; a kernel's outer loops could still run over the other dims.
    if (program.values[out_id].element_count() == 0) continue;
    try {
      defs[k]->kernel(op, ins, Output{&program.values[out_id], buffers[out_id], &parallel, plans.ops[k].get(), scratch});
    } catch (const Error& e) {
      throw e.within("ref program: op " + std::to_string(k) + " (" + op.type + ")");
    }
  }
}

}  // namespace

void execute(const ref::Program& program, const WeightLookup& weights, const std::vector<const void*>& inputs,
             const std::vector<void*>& outputs, std::vector<uint8_t>& arena, const ParallelFor& parallel) {
  const auto defs = defs_of(program);
  run_ops(program, defs, *plan_ops(program, defs), weights, inputs, outputs, arena, parallel);
}

bool reads_input_data(const std::string& op_type) {
  const OpDef* def = find_op(op_type);
  return def == nullptr || def->reads_input_data;
}

std::vector<std::string> supported_ops() {
  std::vector<std::string> names;
  for (const OpDef& def : op_defs()) names.emplace_back(def.type);
  return names;
}

std::string hardware_architecture() { return onednn::architecture(); }

Executable::Executable(std::shared_ptr<const ContextBinary> binary, const std::string& graph_name)
    : binary_(std::move(binary)) {
  graph_ = binary_->find_graph(graph_name);
  if (!graph_)
    throw Error(ErrorCode::kInvalidBinary, binary_->label() + ": no graph named '" + graph_name + "'");
  std::string where = binary_->label() + ": graph '" + graph_name + "'";
  try {
    program_ = ref::deserialize(graph_->program, graph_->program_size);
    validate(program_, binary_->weights().size());
    std::vector<uint32_t> listed = graph_->weight_ids;
    std::sort(listed.begin(), listed.end());
    // Weights are used in place, so each payload must hold the bytes its value reads.
    for (size_t id = 0; id < program_.values.size(); ++id) {
      const ref::Value& v = program_.values[id];
      if (v.kind != ref::ValueKind::kWeight) continue;
      // The graph record lists the weights its program uses; a program reading another graph's
      // weight is from another binary.
      if (!std::binary_search(listed.begin(), listed.end(), static_cast<uint32_t>(v.index)))
        throw Error(ErrorCode::kInvalidBinary, "ref program: value " + std::to_string(id) + " reads weight " +
                                                   std::to_string(v.index) + ", which the graph record does not list");
      uint64_t size = binary_->weights()[v.index].size;
      if (size < v.byte_size())
        throw Error(ErrorCode::kInvalidBinary, "ref program: value " + std::to_string(id) + " reads " +
                                                   std::to_string(v.byte_size()) + " bytes of weight " +
                                                   std::to_string(v.index) + ", which has " + std::to_string(size));
    }
    check_signature(graph_->inputs, program_, program_.inputs, "input");
    check_signature(graph_->outputs, program_, program_.outputs, "output");
    defs_ = defs_of(program_);
    plans_ = plan_ops(program_, defs_);
  } catch (const Error& e) {
    throw e.within(where);
  }
}

void Executable::run(const std::vector<const void*>& inputs, const std::vector<void*>& outputs,
                     const ParallelFor& parallel) const {
  std::vector<uint8_t> arena;
  {
    std::lock_guard<std::mutex> lock(arenas_mutex_);
    if (!arenas_.empty()) {
      arena = std::move(arenas_.back());
      arenas_.pop_back();
    }
  }
  run_ops(program_, defs_, *plans_, [this](uint32_t id) { return binary_->weight_data(id); }, inputs, outputs, arena, parallel);
  std::lock_guard<std::mutex> lock(arenas_mutex_);
  arenas_.push_back(std::move(arena));
}

}  // namespace ctxgen::runtime
