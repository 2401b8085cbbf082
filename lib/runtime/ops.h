#pragma once
// The ref op set: for each op type, the rule that gives its output type (and checks its inputs
// and attributes) and the kernel execute() runs. One table, used by validate(), by the compiler
// (through runtime::infer_output) and by the constant folder, so they can never disagree about
// which ops exist or what shape an op produces.

#include <cstdint>
#include <string>
#include <vector>

#include "ctxgen/ref_program.h"
#include "kernels.h"

namespace ctxgen::runtime {

// The output type a rule computes.
struct OutType {
  ref::DType dtype = ref::DType::kFloat32;
  Dims dims;
};

// What one op's rule sees: its inputs as values (nullptr = absent optional input), its
// attributes, and how to fail with a message naming the op ("op 3 (Conv): ...").
class OpCheck {
 public:
  OpCheck(const ref::Op& op, std::vector<const ref::Value*> inputs, std::string label);

  const ref::Op& op() const { return op_; }
  [[noreturn]] void fail(const std::string& what) const;
  // `what` is a message, or a callable that makes it: validation runs whenever a session loads a
  // binary, and building every message (most format dims) cost more than the checks themselves.
  void expect(bool ok, const char* what) const {
    if (!ok) fail(what);
  }
  template <typename Message>
  void expect(bool ok, Message&& what) const {
    if (!ok) fail(what());
  }

  // Requires between `required` and `max` inputs, the first `required` present.
  void arity(size_t required, size_t max) const;
  size_t input_count() const { return inputs_.size(); }
  const ref::Value& in(size_t i) const;            // present
  const ref::Value* optional_in(size_t i) const;   // nullptr when absent or beyond the list

  // Required attributes of the right kind, within [lo, hi].
  int64_t int_attr(const std::string& name, int64_t lo, int64_t hi) const;
  // Optional int attribute: `fallback` when absent.
  int64_t int_attr_or(const std::string& name, int64_t fallback, int64_t lo, int64_t hi) const;
  float float_attr(const std::string& name) const;
  std::vector<int64_t> ints_attr(const std::string& name, size_t count, int64_t lo, int64_t hi) const;
  std::vector<int64_t> ints_attr(const std::string& name) const;  // any length, any values
  ref::DType dtype_attr(const std::string& name) const;           // an int attribute naming a DType

  // Every input present has element type `dtype` (except those listed in `other`).
  void expect_inputs(ref::DType dtype, const std::vector<size_t>& other = {}) const;
  // Every input present has the element type of input 0, which is one of `allowed`.
  ref::DType expect_same_inputs(const std::vector<ref::DType>& allowed) const;
  void expect_dtype(const ref::Value& v, ref::DType dtype, const std::string& what) const;
  void expect_dims(const ref::Value& v, const Dims& want, const std::string& what) const;
  // Bounds a shape the rule computed: no negative dim, at most 2^48 elements.
  Dims bounded(Dims dims, const std::string& what) const;

 private:
  const ref::Op& op_;
  std::vector<const ref::Value*> inputs_;
  std::string label_;
};

std::string dims_text(const Dims& dims);

using Rule = OutType (*)(const OpCheck& check);

struct OpDef {
  const char* type;
  Rule rule;
  Kernel kernel;
  bool reads_input_data = true;  // false: the output depends on the input dims only
  Planner plan = nullptr;        // for kernels that resolve something before their first run
};

// nullptr when `type` is not a ref op.
const OpDef* find_op(const std::string& type);
const std::vector<OpDef>& op_defs();

}  // namespace ctxgen::runtime
