// Program-level validation: values, ids, the arena and the order of writes; each op's own rule
// lives in ops.cc. After validate() passes, execute() indexes nothing out of bounds.

#include <algorithm>
#include <string>

#include "ctxgen/error.h"
#include "ctxgen/runtime.h"
#include "ops.h"

namespace ctxgen::runtime {
namespace {

using ref::Value;
using ref::ValueKind;

using ref::kMaxElements;
constexpr uint64_t kArenaAlignment = 64;

[[noreturn]] void fail(const std::string& what) { throw Error(ErrorCode::kInvalidBinary, "ref program: " + what); }

const char* kind_name(ValueKind kind) {
  switch (kind) {
    case ValueKind::kInput: return "input";
    case ValueKind::kOutput: return "output";
    case ValueKind::kWeight: return "weight";
    case ValueKind::kArena: return "arena";
  }
  return "unknown";
}

std::string value_name(size_t id) { return "value " + std::to_string(id); }

std::string op_label(size_t k, const ref::Op& op) { return "ref program: op " + std::to_string(k) + " (" + op.type + ")"; }

[[noreturn]] void fail_op(const std::string& label, const std::string& what) {
  throw Error(ErrorCode::kInvalidBinary, label + ": " + what);
}

void check_value(const ref::Program& p, size_t id, size_t weight_count) {
  const Value& v = p.values[id];
  std::string what = value_name(id) + " (" + kind_name(v.kind) + ")";
  if (ref::dtype_size(v.dtype) == 0)
    fail(what + " has unknown dtype " + std::to_string(static_cast<int>(v.dtype)));
  int64_t n = 1;
  for (int64_t d : v.dims)
    if (d < 0 || __builtin_mul_overflow(n, d, &n) || n > kMaxElements)
      fail(what + " dims " + dims_text(v.dims) + " are negative or hold more than 2^48 elements");
  if (v.byte_size() > ref::kMaxValueBytes)
    fail(what + " holds " + std::to_string(v.byte_size()) + " bytes, more than 2^36 (64 GiB)");
  auto index_text = std::to_string(v.index);
  switch (v.kind) {
    case ValueKind::kInput:
      if (v.index >= p.inputs.size() || p.inputs[v.index] != static_cast<int32_t>(id))
        fail(what + " has input index " + index_text + ", but graph input " + index_text +
             (v.index < p.inputs.size() ? " is value " + std::to_string(p.inputs[v.index])
                                        : " does not exist (" + std::to_string(p.inputs.size()) + " inputs)"));
      break;
    case ValueKind::kOutput:
      if (v.index >= p.outputs.size() || p.outputs[v.index] != static_cast<int32_t>(id))
        fail(what + " has output index " + index_text + ", but graph output " + index_text +
             (v.index < p.outputs.size() ? " is value " + std::to_string(p.outputs[v.index])
                                         : " does not exist (" + std::to_string(p.outputs.size()) + " outputs)"));
      break;
    case ValueKind::kWeight:
      if (v.index >= weight_count)
        fail(what + " refers to weight " + index_text + ", the binary has " + std::to_string(weight_count));
      break;
    case ValueKind::kArena:
      if (v.index % kArenaAlignment != 0)
        fail(what + " offset " + index_text + " is not a multiple of " + std::to_string(kArenaAlignment));
      if (v.index > p.arena_bytes || v.byte_size() > p.arena_bytes - v.index)
        fail(what + " at offset " + index_text + " with " + std::to_string(v.byte_size()) +
             " bytes ends past the arena of " + std::to_string(p.arena_bytes) + " bytes");
      break;
    default: fail(what + " has unknown kind " + std::to_string(static_cast<int>(v.kind)));
  }
}

void check_graph_io(const ref::Program& p, const std::vector<int32_t>& ids, ValueKind kind, const char* what) {
  for (size_t i = 0; i < ids.size(); ++i) {
    int32_t id = ids[i];
    if (id < 0 || static_cast<size_t>(id) >= p.values.size())
      fail(std::string("graph ") + what + " " + std::to_string(i) + " refers to value " + std::to_string(id) +
           ", the program has " + std::to_string(p.values.size()));
    const Value& v = p.values[static_cast<size_t>(id)];
    if (v.kind != kind || v.index != i)
      fail(std::string("graph ") + what + " " + std::to_string(i) + " is " + value_name(static_cast<size_t>(id)) +
           " of kind " + kind_name(v.kind) + " index " + std::to_string(v.index) + ", expected kind " +
           kind_name(kind) + " index " + std::to_string(i));
  }
}

bool overlap(const Value& a, const Value& b) {
  if (a.kind != ValueKind::kArena || b.kind != ValueKind::kArena || a.byte_size() == 0 || b.byte_size() == 0)
    return false;
  return a.index < b.index + b.byte_size() && b.index < a.index + a.byte_size();
}

// Ids in range; values read only after some op wrote them (inputs and weights are given); the
// output a fresh buffer: writable, and sharing no byte with the op's inputs, since kernels read
// inputs while writing the output; but a Reshape's output may be exactly its input's bytes (it
// then copies nothing).
void check_dataflow(const ref::Program& p, size_t k, std::vector<bool>& written) {
  const ref::Op& op = p.ops[k];
  OpCheck c(op, {}, op_label(k, op));
  auto in_range = [&](int32_t id) { return id >= 0 && static_cast<size_t>(id) < p.values.size(); };
  c.expect(op.outputs.size() == 1, [&] { return "has " + std::to_string(op.outputs.size()) + " outputs, expected 1"; });
  int32_t out = op.outputs[0];
  c.expect(in_range(out), [&] { return "output refers to value " + std::to_string(out) + ", the program has " +
                              std::to_string(p.values.size()); });
  const Value& y = p.values[static_cast<size_t>(out)];
  c.expect(y.kind == ValueKind::kArena || y.kind == ValueKind::kOutput,
           [&] { return "writes " + value_name(static_cast<size_t>(out)) + " of kind " + kind_name(y.kind) +
               ", expected an arena or output value"; });
  for (size_t i = 0; i < op.inputs.size(); ++i) {
    int32_t id = op.inputs[i];
    if (id == -1) continue;
    std::string what = "input " + std::to_string(i);
    c.expect(in_range(id), [&] { return what + " refers to value " + std::to_string(id) + ", the program has " +
                               std::to_string(p.values.size()); });
    c.expect(id != out, [&] { return what + " is also its output, " + value_name(static_cast<size_t>(id)); });
    c.expect(written[static_cast<size_t>(id)], [&] { return what + " reads " + value_name(static_cast<size_t>(id)) +
                                                   " before any op writes it"; });
    const Value& x = p.values[static_cast<size_t>(id)];
    const bool same_bytes = op.type == "Reshape" && x.kind == ValueKind::kArena && y.kind == ValueKind::kArena &&
                            x.index == y.index && x.byte_size() == y.byte_size();
    c.expect(same_bytes || !overlap(x, y),
             [&] { return what + " (" + value_name(static_cast<size_t>(id)) + ") overlaps the output (" +
                 value_name(static_cast<size_t>(out)) + ") in the arena"; });
  }
  written[static_cast<size_t>(out)] = true;
}

uint64_t saturating_mul(uint64_t a, uint64_t b) {
  uint64_t r;
  return __builtin_mul_overflow(a, b, &r) ? UINT64_MAX : r;
}

uint64_t saturating_add(uint64_t a, uint64_t b) {
  uint64_t r;
  return __builtin_add_overflow(a, b, &r) ? UINT64_MAX : r;
}

uint64_t elements(const Value& v) { return static_cast<uint64_t>(v.element_count()); }

// The positions an input's non-empty axes span: its elements, or for an empty input what a kernel
// stepping through its other axes before it meets the empty one would walk.
uint64_t span(const Value& v) {
  uint64_t positions = 1;
  for (int64_t d : v.dims)
    if (d > 0) positions = saturating_mul(positions, static_cast<uint64_t>(d));
  return positions;
}

// An upper bound on the element operations of an op's kernel. Every kernel touches each input
// position and output element a bounded number of times, except those doing a product or a window
// per output element. An empty output costs nothing: execute() does not run the kernel.
uint64_t op_work(const ref::Op& op, const std::vector<const Value*>& in, const Value& out) {
  if (out.element_count() == 0) return 0;
  uint64_t per_output = 1;
  if ((op.type == "MatMul" || op.type == "Gemm" || op.type == "MatMulNBits" || op.type == "MatMulInteger") &&
      !in[0]->dims.empty()) {
    const bool trans_a = op.type == "Gemm" && op.get_int("transA", 0) != 0;
    per_output = static_cast<uint64_t>(trans_a ? in[0]->dims.front() : in[0]->dims.back());
  } else if ((op.type == "Conv" || op.type == "ConvInteger" || op.type == "QLinearConv" || op.type == "ConvTranspose") &&
             !in[1]->dims.empty() &&
             in[1]->dims[0] > 0) {
    // Conv: C/group x kernel taps per output; ConvTranspose scatters each input element the same way.
    per_output = elements(*in[1]) / static_cast<uint64_t>(in[1]->dims[0]);
    if (op.type == "ConvTranspose") return saturating_add(elements(out), saturating_mul(elements(*in[0]), per_output));
  } else if (op.type == "MaxPool" || op.type == "AveragePool") {
    for (int64_t k : op.get_ints("kernel_shape")) per_output = saturating_mul(per_output, static_cast<uint64_t>(k));
  }
  uint64_t work = saturating_mul(elements(out), per_output);
  for (const Value* v : in)
    if (v) work = saturating_add(work, span(*v));
  return work;
}

}  // namespace

std::string dims_text(const Dims& dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? "," : "") + std::to_string(dims[i]);
  return s + "]";
}

OpCheck::OpCheck(const ref::Op& op, std::vector<const ref::Value*> inputs, std::string label)
    : op_(op), inputs_(std::move(inputs)), label_(std::move(label)) {}

void OpCheck::fail(const std::string& what) const { throw Error(ErrorCode::kInvalidBinary, label_ + ": " + what); }

void OpCheck::arity(size_t required, size_t max) const {
  size_t n = inputs_.size();
  if (n < required || n > max)
    fail("has " + std::to_string(n) + " inputs, expected " +
         (required == max ? std::to_string(required) : std::to_string(required) + " to " + std::to_string(max)));
  for (size_t i = 0; i < required; ++i) expect(inputs_[i] != nullptr,
      [&] { return "required input " + std::to_string(i) + " is absent"; });
}

const ref::Value& OpCheck::in(size_t i) const {
  const ref::Value* v = optional_in(i);
  if (!v) fail("required input " + std::to_string(i) + " is absent");
  return *v;
}

const ref::Value* OpCheck::optional_in(size_t i) const { return i < inputs_.size() ? inputs_[i] : nullptr; }

int64_t OpCheck::int_attr(const std::string& name, int64_t lo, int64_t hi) const {
  const ref::Attr* a = op_.attr(name);
  expect(a && a->kind == ref::Attr::Kind::kInt, [&] { return "attribute '" + name + "' (int) is missing"; });
  expect(a->i >= lo && a->i <= hi,
      [&] { return "attribute '" + name + "' is " + std::to_string(a->i) + ", expected a value in [" +
                                       std::to_string(lo) + ", " + std::to_string(hi) + "]"; });
  return a->i;
}

int64_t OpCheck::int_attr_or(const std::string& name, int64_t fallback, int64_t lo, int64_t hi) const {
  return op_.attr(name) ? int_attr(name, lo, hi) : fallback;
}

float OpCheck::float_attr(const std::string& name) const {
  const ref::Attr* a = op_.attr(name);
  expect(a && a->kind == ref::Attr::Kind::kFloat, [&] { return "attribute '" + name + "' (float) is missing"; });
  return a->f;
}

std::vector<int64_t> OpCheck::ints_attr(const std::string& name) const {
  const ref::Attr* a = op_.attr(name);
  expect(a && a->kind == ref::Attr::Kind::kInts, [&] { return "attribute '" + name + "' (ints) is missing"; });
  return a->ints;
}

std::vector<int64_t> OpCheck::ints_attr(const std::string& name, size_t count, int64_t lo, int64_t hi) const {
  auto values = ints_attr(name);
  expect(values.size() == count, [&] { return "attribute '" + name + "' has " + std::to_string(values.size()) +
                                     " values, expected " + std::to_string(count); });
  for (int64_t v : values)
    expect(v >= lo && v <= hi, [&] { return "attribute '" + name + "' " + dims_text(values) + " has a value outside [" +
                                   std::to_string(lo) + ", " + std::to_string(hi) + "]"; });
  return values;
}

ref::DType OpCheck::dtype_attr(const std::string& name) const {
  auto code = int_attr(name, 0, 255);
  auto dtype = static_cast<ref::DType>(code);
  expect(ref::dtype_size(dtype) != 0,
      [&] { return "attribute '" + name + "' is " + std::to_string(code) + ", not a ref element type"; });
  return dtype;
}

void OpCheck::expect_dtype(const ref::Value& v, ref::DType dtype, const std::string& what) const {
  expect(v.dtype == dtype,
      [&] { return what + " has element type " + ref::dtype_name(v.dtype) + ", expected " + ref::dtype_name(dtype); });
}

void OpCheck::expect_inputs(ref::DType dtype, const std::vector<size_t>& other) const {
  for (size_t i = 0; i < inputs_.size(); ++i) {
    bool excluded = std::find(other.begin(), other.end(), i) != other.end();
    if (const ref::Value* v = optional_in(i); v && !excluded) expect_dtype(*v, dtype, "input " + std::to_string(i));
  }
}

ref::DType OpCheck::expect_same_inputs(const std::vector<ref::DType>& allowed) const {
  ref::DType t = in(0).dtype;
  expect(std::find(allowed.begin(), allowed.end(), t) != allowed.end(),
         [&] { return "input 0 has element type " + ref::dtype_name(t) + ", which this op does not take"; });
  expect_inputs(t);
  return t;
}

void OpCheck::expect_dims(const ref::Value& v, const Dims& want, const std::string& what) const {
  expect(v.dims == want, [&] { return what + " has dims " + dims_text(v.dims) + ", expected " + dims_text(want); });
}

Dims OpCheck::bounded(Dims dims, const std::string& what) const {
  int64_t n = 1;
  for (int64_t d : dims)
    expect(d >= 0 && !__builtin_mul_overflow(n, d, &n) && n <= kMaxElements,
           [&] { return what + " dims " + dims_text(dims) + " are negative or hold more than 2^48 elements"; });
  return dims;
}

ref::Value infer_output(const ref::Op& op, const std::vector<const ref::Value*>& inputs, const std::string& label) {
  const OpDef* def = find_op(op.type);
  if (!def) throw Error(ErrorCode::kInvalidBinary, label + ": unknown op type '" + op.type + "'");
  OutType out = def->rule(OpCheck(op, inputs, label));
  ref::Value v;
  v.dtype = out.dtype;
  v.dims = std::move(out.dims);
  return v;
}

void validate(const ref::Program& program, size_t weight_count) {
  // Graph inputs and outputs first: values are checked against these lists.
  check_graph_io(program, program.inputs, ValueKind::kInput, "input");
  check_graph_io(program, program.outputs, ValueKind::kOutput, "output");
  for (size_t id = 0; id < program.values.size(); ++id) check_value(program, id, weight_count);

  std::vector<bool> written(program.values.size(), false);
  for (size_t id = 0; id < program.values.size(); ++id) {
    ValueKind kind = program.values[id].kind;
    written[id] = kind == ValueKind::kInput || kind == ValueKind::kWeight;
  }
  uint64_t work = 0;
  for (size_t k = 0; k < program.ops.size(); ++k) {
    const ref::Op& op = program.ops[k];
    if (!find_op(op.type))
      throw Error(ErrorCode::kInvalidBinary, "ref program: op " + std::to_string(k) + " has unknown type '" + op.type + "'");
    check_dataflow(program, k, written);
    std::vector<const Value*> inputs;
    for (int32_t id : op.inputs) inputs.push_back(id < 0 ? nullptr : &program.values[static_cast<size_t>(id)]);
    std::string label = op_label(k, op);
    Value want = infer_output(op, inputs, label);
    const Value& y = program.values[static_cast<size_t>(op.outputs[0])];
    if (y.dtype != want.dtype)
      fail_op(label, "output has element type " + ref::dtype_name(y.dtype) + ", expected " + ref::dtype_name(want.dtype));
    if (y.dims != want.dims) fail_op(label, "output has dims " + dims_text(y.dims) + ", expected " + dims_text(want.dims));
    const uint64_t op_cost = op_work(op, inputs, y);
    work = saturating_add(work, op_cost);
    if (work > ref::kMaxWork)
      fail_op(label, "the program needs more than 2^48 element operations per run (this op about " +
                         std::to_string(op_cost) + ")");
  }
  // Any plan that places each value at or below the top of those placed before it fits in the sum.
  // Only values some op writes count: an unused value must not buy a crafted binary a large arena.
  uint64_t arena_needed = 0;
  for (size_t id = 0; id < program.values.size(); ++id) {
    const Value& v = program.values[id];
    if (v.kind == ValueKind::kArena && written[id])
      arena_needed = saturating_add(arena_needed, (v.byte_size() + kArenaAlignment - 1) / kArenaAlignment * kArenaAlignment);
  }
  if (program.arena_bytes > arena_needed)
    fail("the arena of " + std::to_string(program.arena_bytes) + " bytes is larger than all its values together (" +
         std::to_string(arena_needed) + " bytes)");
  for (size_t i = 0; i < program.outputs.size(); ++i)
    if (!written[static_cast<size_t>(program.outputs[i])])
      fail("graph output " + std::to_string(i) + " (" + value_name(static_cast<size_t>(program.outputs[i])) +
           ") is never written");
}

}  // namespace ctxgen::runtime
