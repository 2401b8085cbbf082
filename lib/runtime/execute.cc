// Runs validated programs: binds every value to a buffer (caller inputs/outputs, weights, arena
// slices) and calls each op's kernel in order.

#include <algorithm>
#include <atomic>
#include <string>

#include "ctxgen/error.h"
#include "ctxgen/ref_identity.h"
#include "ctxgen/runtime.h"
#include "kept.h"
#include "onednn.h"
#include "ops.h"
#include "profile.h"

namespace ctxgen::runtime {
namespace {

void expect_count(size_t given, size_t wanted, const char* what) {
  if (given != wanted)
    throw Error(ErrorCode::kRuntime, "ref program: " + std::to_string(given) + " " + what + " buffers given, the graph has " +
                                         std::to_string(wanted));
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

constexpr uint64_t kScratchAlignment = 64;

// Reading and validating a program depends on its bytes and the binary's weight count alone, so a
// program the process has read before, byte for byte, is not read and checked again: a CNN's
// session spent ~50 µs of its ~550 doing so. Kept: the 16 most recently used of at most 1 MiB
// (a program is ~100 bytes an op), so that what stays after the sessions end stays small.
constexpr uint64_t kKeptProgramBytes = uint64_t{1} << 20;

std::atomic<uint64_t> g_programs_read{0};

std::shared_ptr<const ref::Program> validated(const uint8_t* bytes, uint64_t size, size_t weight_count) {
  // From the bytes it is kept by, which the mapped file cannot change after they are copied.
  const auto read = [weight_count](const uint8_t* program, uint64_t program_size) {
    auto p = std::make_shared<ref::Program>(ref::deserialize(program, program_size));
    validate(*p, weight_count);
    ++g_programs_read;
    return p;
  };
  if (size > kKeptProgramBytes) return read(bytes, size);
  static Kept<ref::Program> kept(16);
  std::string key(reinterpret_cast<const char*>(bytes), size);
  key.append(reinterpret_cast<const char*>(&weight_count), sizeof weight_count);
  return kept.find(key, [&] { return read(reinterpret_cast<const uint8_t*>(key.data()), size); });
}

}  // namespace

// A session constant's bytes, 64-byte aligned inside their buffer.
struct Constant {
  std::unique_ptr<uint8_t[]> buffer;
  uint8_t* data = nullptr;
};

// What a program resolves before its first run: each op's definition and plan, and where its
// inputs are in a run's tensor list. Ops run one after another, so they share one scratch region,
// after the program's arena.
struct Plans {
  struct Step {
    const OpDef* def = nullptr;
    std::unique_ptr<OpPlan> plan;  // nullptr for an op whose type has no planner
    size_t first_input = 0;        // in RunState::tensors
    size_t out = 0;                // value id
    bool skip = false;             // nothing to write; a kernel's outer loops could still run over the other dims
  };
  std::vector<Step> steps;
  std::vector<int32_t> input_ids;   // every op's input value ids, op after op (-1: absent)
  std::vector<void*> weights;       // by value id: weights and session constants, else nullptr
  std::vector<std::shared_ptr<const Constant>> constants;  // the session constants' buffers
  std::vector<size_t> caller_values;  // ids of the values whose buffers the caller gives
  uint64_t scratch_at = 0;          // in the arena
  uint64_t arena_bytes = 0;         // with the scratch
};

// A run's own memory, made by its first run and kept for the next: the arena, the buffer behind
// every value, and every op's inputs as tensors. Only the caller's input and output addresses
// change from one run to the next, so a run allocates nothing.
struct RunState {
  std::vector<uint8_t> arena;
  std::vector<void*> buffers;   // by value id
  std::vector<Tensor> tensors;  // Plans::input_ids, bound
  uint8_t* scratch = nullptr;   // 64-byte aligned
  std::vector<std::unique_ptr<OpState>> ops;  // by op, from its plan
};

namespace {

// An empty tensor may come without a buffer; kernels still pass its address to memcpy.
const float kNoElements = 0;

// Calls op k's kernel on buffers bound to its input values.
void call(const ref::Program& program, const Plans& plans, size_t k, const Tensor* inputs, void* out,
          const ParallelFor& parallel, uint8_t* scratch, OpState* state) {
  const Plans::Step& step = plans.steps[k];
  const ref::Op& op = program.ops[k];
  try {
    step.def->kernel(Ins(inputs, op.inputs.size()),
                     Output{&program.values[step.out], out, &parallel, step.plan.get(), scratch, state});
  } catch (const Error& e) {
    throw e.within("ref program: op " + std::to_string(k) + " (" + op.type + ")");
  }
}

// What a session constant is made from, every field sized or counted so that no two differ only in
// where one field ends: the op and its attributes, the output's type, and each input's type and
// content (a weight's XXH3-128, an earlier constant's key's).
std::string constant_key(const ref::Program& program, const ref::Op& op, const std::vector<Hash128>& contents) {
  std::string key;
  const auto put = [&key](const void* data, size_t size) { key.append(static_cast<const char*>(data), size); };
  const auto put_count = [&put](uint64_t count) { put(&count, sizeof count); };
  const auto put_text = [&](const std::string& text) {
    put_count(text.size());
    key += text;
  };
  const auto put_value = [&](const ref::Value& v) {
    put(&v.dtype, sizeof v.dtype);
    put_count(v.dims.size());
    put(v.dims.data(), v.dims.size() * sizeof(int64_t));
  };
  put_text(op.type);
  put_count(op.attrs.size());
  for (const ref::Attr& a : op.attrs) {
    put_text(a.name);
    put(&a.kind, sizeof a.kind);
    put(&a.i, sizeof a.i);
    put(&a.f, sizeof a.f);
    put_count(a.ints.size());
    put(a.ints.data(), a.ints.size() * sizeof(int64_t));
    put_count(a.floats.size());
    put(a.floats.data(), a.floats.size() * sizeof(float));
  }
  put_value(program.values[static_cast<size_t>(op.outputs[0])]);
  put_count(op.inputs.size());
  for (size_t i = 0; i < op.inputs.size(); ++i) {
    const bool present = op.inputs[i] >= 0;
    put(&present, sizeof present);
    if (!present) continue;
    put_value(program.values[static_cast<size_t>(op.inputs[i])]);
    put(&contents[i], sizeof contents[i]);
  }
  return key;
}

// Values the ops compute from weights alone (a weight dequantized or widened from its stored
// precision, a weight laid out for a Conv at this CPU level: the compiler keeps weights in the .bin
// as the model stores them) are the same on every run, so they are computed once, here, and read
// like weights by every run of the program. They hold at most the arena and 16 times the weights
// (a dequantized int8 weight is 4 times its bytes, a packed Conv weight a little more): a damaged
// program cannot make a session hold more than it would run with; past that, ops run every time.
// The sessions of a process share each one they make from the same bytes the same way: a
// weightless binary's weights, laid out at load, are then in memory once however many sessions use them.
void compute_constants(const ref::Program& program, Plans& plans) {
  static KeptWhileUsed<Constant> shared;
  const ParallelFor serial;
  // A value's content, by value id: a weight's bytes hashed when first needed, a constant's key.
  std::vector<std::optional<Hash128>> contents(program.values.size());
  const auto content = [&](int32_t id) {
    std::optional<Hash128>& c = contents[static_cast<size_t>(id)];
    if (!c) c = xxh3_128(static_cast<const uint8_t*>(plans.weights[static_cast<size_t>(id)]), program.values[static_cast<size_t>(id)].byte_size());
    return *c;
  };
  uint64_t budget = program.arena_bytes;
  for (const ref::Value& v : program.values)
    if (v.kind == ref::ValueKind::kWeight && __builtin_add_overflow(budget, 16 * v.byte_size(), &budget)) budget = UINT64_MAX;
  std::vector<Tensor> ins;
  for (size_t k = 0; k < plans.steps.size(); ++k) {
    Plans::Step& step = plans.steps[k];
    const ref::Op& op = program.ops[k];
    const ref::Value& out = program.values[step.out];
    const bool from_weights = !op.inputs.empty() && std::all_of(op.inputs.begin(), op.inputs.end(), [&](int32_t id) {
      return id < 0 || plans.weights[static_cast<size_t>(id)] != nullptr;
    });
    if (step.skip || !from_weights || out.kind != ref::ValueKind::kArena) continue;
    const uint64_t scratch_bytes = step.plan ? step.plan->scratch_bytes : 0;
    if (out.byte_size() > budget) continue;
    budget -= out.byte_size();
    ins.clear();
    std::vector<Hash128> input_contents;
    for (int32_t id : op.inputs) {
      ins.push_back(id < 0 ? Tensor{} : Tensor{&program.values[static_cast<size_t>(id)], plans.weights[static_cast<size_t>(id)]});
      input_contents.push_back(id < 0 ? Hash128{} : content(id));
    }
    const std::string key = constant_key(program, op, input_contents);
    auto made = shared.find(key, [&] {
      // 64-byte aligned wherever the allocator puts them; the scratch is given back at once.
      const auto aligned = [](uint8_t* at) { return at + (kScratchAlignment - reinterpret_cast<uintptr_t>(at) % kScratchAlignment); };
      auto constant = std::make_shared<Constant>();
      constant->buffer = std::make_unique_for_overwrite<uint8_t[]>(out.byte_size() + kScratchAlignment);
      constant->data = aligned(constant->buffer.get());
      const auto scratch = std::make_unique_for_overwrite<uint8_t[]>(scratch_bytes + kScratchAlignment);
      const std::unique_ptr<OpState> state = step.plan ? step.plan->make_state() : nullptr;
      call(program, plans, k, ins.data(), constant->data, serial, aligned(scratch.get()), state.get());
      return std::shared_ptr<const Constant>(std::move(constant));
    });
    contents[step.out] = xxh3_128(reinterpret_cast<const uint8_t*>(key.data()), key.size());
    // Kernels only read weights and constants (validate() guarantees it).
    plans.weights[step.out] = made->data;
    plans.constants.push_back(std::move(made));
    step.skip = true;
  }
}

std::unique_ptr<const Plans> plan_ops(const ref::Program& program, const WeightLookup& weights) {
  auto plans = std::make_unique<Plans>();
  plans->scratch_at = (program.arena_bytes + kScratchAlignment - 1) / kScratchAlignment * kScratchAlignment;
  uint64_t scratch = 0;
  std::vector<const ref::Value*> ins;
  for (size_t k = 0; k < program.ops.size(); ++k) {
    const ref::Op& op = program.ops[k];
    Plans::Step step;
    step.def = find_op(op.type);
    step.first_input = plans->input_ids.size();
    step.out = static_cast<size_t>(op.outputs[0]);
    step.skip = program.values[step.out].element_count() == 0;
    plans->input_ids.insert(plans->input_ids.end(), op.inputs.begin(), op.inputs.end());
    // An op with an empty output never runs: no plan, and no scratch for it.
    if (step.def->plan && !step.skip) {
      ins.clear();
      for (int32_t id : op.inputs) ins.push_back(id < 0 ? nullptr : &program.values[static_cast<size_t>(id)]);
      try {
        step.plan = step.def->plan(op, ins, program.values[step.out]);
      } catch (const Error& e) {
        throw e.within("ref program: op " + std::to_string(k) + " (" + op.type + ")");
      }
      scratch = std::max(scratch, step.plan->scratch_bytes);
    }
    plans->steps.push_back(std::move(step));
  }
  plans->arena_bytes = plans->scratch_at + scratch;
  plans->weights.assign(program.values.size(), nullptr);
  for (size_t id = 0; id < program.values.size(); ++id) {
    const ref::Value& v = program.values[id];
    if (v.kind == ref::ValueKind::kInput || v.kind == ref::ValueKind::kOutput) plans->caller_values.push_back(id);
    if (v.kind != ref::ValueKind::kWeight) continue;
    const uint8_t* at = weights(static_cast<uint32_t>(v.index));
    if (!at && v.byte_size() > 0)
      throw Error(ErrorCode::kRuntime, "ref program: no buffer for weight " + std::to_string(v.index) + " (value " +
                                           std::to_string(id) + ")");
    // Kernels only write outputs and arena values (validate() guarantees it), never inputs or weights.
    plans->weights[id] = const_cast<void*>(at ? static_cast<const void*>(at) : &kNoElements);
  }
  compute_constants(program, *plans);
  return plans;
}

// Binds what stays put from run to run: weights and arena values.
std::unique_ptr<RunState> make_state(const ref::Program& program, const Plans& plans) {
  auto state = std::make_unique<RunState>();
  // Over-allocated by the alignment so the scratch starts 64-byte aligned wherever the vector's
  // storage does.
  state->arena.resize(plans.arena_bytes + kScratchAlignment);
  const auto base = reinterpret_cast<uintptr_t>(state->arena.data()) + plans.scratch_at;
  state->scratch = state->arena.data() + plans.scratch_at + ((kScratchAlignment - base % kScratchAlignment) % kScratchAlignment);
  state->buffers = plans.weights;
  for (size_t id = 0; id < program.values.size(); ++id)
    if (program.values[id].kind == ref::ValueKind::kArena && !plans.weights[id])
      state->buffers[id] = state->arena.data() + program.values[id].index;
  state->tensors.resize(plans.input_ids.size());
  for (const Plans::Step& step : plans.steps) state->ops.push_back(step.plan ? step.plan->make_state() : nullptr);
  return state;
}

void run_ops(const ref::Program& program, const Plans& plans, RunState& state, const std::vector<const void*>& inputs,
             const std::vector<void*>& outputs, const ParallelFor& parallel, const std::string& name) {
  expect_count(inputs.size(), program.inputs.size(), "input");
  expect_count(outputs.size(), program.outputs.size(), "output");
  for (size_t id : plans.caller_values) {
    const ref::Value& v = program.values[id];
    const bool is_input = v.kind == ref::ValueKind::kInput;
    const void* at = is_input ? inputs[v.index] : outputs[v.index];
    if (!at && v.byte_size() > 0)
      throw Error(ErrorCode::kRuntime, "ref program: no buffer for " + std::string(is_input ? "input " : "output ") +
                                           std::to_string(v.index) + " (value " + std::to_string(id) + ")");
    state.buffers[id] = const_cast<void*>(at ? at : &kNoElements);
  }
  for (size_t i = 0; i < plans.input_ids.size(); ++i) {
    const int32_t id = plans.input_ids[i];
    state.tensors[i] = id < 0 ? Tensor{} : Tensor{&program.values[static_cast<size_t>(id)], state.buffers[static_cast<size_t>(id)]};
  }
  const bool timed = profile::enabled();
  for (size_t k = 0; k < plans.steps.size(); ++k) {
    const Plans::Step& step = plans.steps[k];
    if (step.skip) continue;
    const auto start = timed ? profile::Clock::now() : profile::Clock::time_point{};
    call(program, plans, k, state.tensors.data() + step.first_input, state.buffers[step.out], parallel, state.scratch,
         state.ops[k].get());
    if (timed) profile::record(name, k, program.ops[k], program.values[step.out], start, profile::Clock::now());
  }
}

}  // namespace

PreparedProgram::PreparedProgram(ref::Program program, const WeightLookup& weights)
    : PreparedProgram(std::make_shared<const ref::Program>(std::move(program)), weights) {}

PreparedProgram::PreparedProgram(std::shared_ptr<const ref::Program> program, const WeightLookup& weights, std::string name)
    : program_(std::move(program)), name_(std::move(name)), plans_(plan_ops(*program_, weights)) {}

PreparedProgram::~PreparedProgram() { profile::save(); }

void PreparedProgram::run(const std::vector<const void*>& inputs, const std::vector<void*>& outputs,
                          const ParallelFor& parallel) const {
  std::unique_ptr<RunState> state;
  {
    std::lock_guard<std::mutex> lock(states_mutex_);
    if (!states_.empty()) {
      state = std::move(states_.back());
      states_.pop_back();
    }
  }
  if (!state) state = make_state(*program_, *plans_);
  run_ops(*program_, *plans_, *state, inputs, outputs, parallel, name_);
  std::lock_guard<std::mutex> lock(states_mutex_);
  states_.push_back(std::move(state));
}

void execute(const ref::Program& program, const WeightLookup& weights, const std::vector<const void*>& inputs,
             const std::vector<void*>& outputs, const ParallelFor& parallel) {
  PreparedProgram(program, weights).run(inputs, outputs, parallel);
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
std::vector<std::string> cpu_levels() { return onednn::known_levels(); }
std::string cpu_level() { return onednn::level(); }

BinaryIdentity ref_identity() { return {ref::kEpName, ref::kSdkVersion, hardware_architecture(), kContextBinaryVersion}; }

namespace {
class RefRuntime final : public BackendRuntime {
 public:
  BinaryIdentity identity() const override { return ref_identity(); }
  // Weights packed for a lower CPU level run here through the kernels of that level (oneDNN keeps
  // them all), so such a binary runs, slower than one packed for this CPU.
  Judgement judge(const BinaryIdentity& binary) const override {
    Judgement fields = judge_fields(binary, identity(), false);
    return fields.fit == Fit::kUnsupported ? fields : onednn::judge_architecture(binary.hardware_architecture);
  }
  std::unique_ptr<GraphRunner> load(std::shared_ptr<const ContextBinary> binary, const std::string& graph_name) const override {
    return std::make_unique<Executable>(std::move(binary), graph_name);
  }
};
}  // namespace

std::unique_ptr<BackendRuntime> make_ref_runtime() { return std::make_unique<RefRuntime>(); }

uint64_t programs_validated() { return g_programs_read; }

Executable::Executable(std::shared_ptr<const ContextBinary> binary, const std::string& graph_name)
    : binary_(std::move(binary)) {
  graph_ = binary_->find_graph(graph_name);
  if (!graph_)
    throw Error(ErrorCode::kInvalidBinary, binary_->label() + ": no graph named '" + graph_name + "'");
  std::string where = binary_->label() + ": graph '" + graph_name + "'";
  try {
    const std::shared_ptr<const ref::Program> read = validated(graph_->program, graph_->program_size, binary_->weights().size());
    const ref::Program& program = *read;
    std::vector<uint32_t> listed = graph_->weight_ids;
    std::sort(listed.begin(), listed.end());
    // Weights are used in place, so each payload must hold the bytes its value reads.
    for (size_t id = 0; id < program.values.size(); ++id) {
      const ref::Value& v = program.values[id];
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
    check_signature(graph_->inputs, program, program.inputs, "input");
    check_signature(graph_->outputs, program, program.outputs, "output");
    prepared_ = std::make_unique<PreparedProgram>(read, [this](uint32_t id) { return binary_->weight_data(id); }, graph_name);
  } catch (const Error& e) {
    throw e.within(where);
  }
}

void Executable::run(const std::vector<const void*>& inputs, const std::vector<void*>& outputs,
                     const ParallelFor& parallel) const {
  prepared_->run(inputs, outputs, parallel);
}

}  // namespace ctxgen::runtime
