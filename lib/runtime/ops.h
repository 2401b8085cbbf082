#pragma once
// The ref op set: for each op type, the rule validate() applies and the kernel execute() runs.
// One table, so the two can never disagree about which ops exist.

#include <cstdint>
#include <string>
#include <vector>

#include "ctxgen/ref_program.h"
#include "kernels.h"

namespace ctxgen::runtime {

// What one op's rule sees: its inputs and output as values, its attributes, and how to fail with
// a message naming the op ("op 3 (Conv): ...").
class OpCheck {
 public:
  OpCheck(const ref::Program& program, size_t index);

  const ref::Op& op() const { return op_; }
  [[noreturn]] void fail(const std::string& what) const;
  void expect(bool ok, const std::string& what) const {
    if (!ok) fail(what);
  }

  // Requires between `required` and `max` inputs, the first `required` present (not -1).
  void arity(size_t required, size_t max) const;
  size_t input_count() const { return op_.inputs.size(); }
  const ref::Value& in(size_t i) const;            // present
  const ref::Value* optional_in(size_t i) const;   // nullptr when absent or beyond the list
  const ref::Value& out() const;

  // Required attributes of the right kind, within [lo, hi].
  int64_t int_attr(const std::string& name, int64_t lo, int64_t hi) const;
  float float_attr(const std::string& name) const;
  std::vector<int64_t> ints_attr(const std::string& name, size_t count, int64_t lo, int64_t hi) const;
  std::vector<int64_t> ints_attr(const std::string& name) const;  // any length, any values

  // Every input present is float32 (except those listed in `other`), as is the output.
  void expect_float32(const std::vector<size_t>& other = {}) const;
  void expect_dtype(const ref::Value& v, ref::DType dtype, const std::string& what) const;
  void expect_dims(const ref::Value& v, const Dims& want, const std::string& what) const;
  void expect_out_dims(const Dims& want) const { expect_dims(out(), want, "output"); }

 private:
  const ref::Program& program_;
  const ref::Op& op_;
  size_t index_;
};

std::string dims_text(const Dims& dims);

using Check = void (*)(const OpCheck& check);

struct OpDef {
  const char* type;
  Check check;
  Kernel kernel;
};

// nullptr when `type` is not a ref op.
const OpDef* find_op(const std::string& type);
const std::vector<OpDef>& op_defs();

}  // namespace ctxgen::runtime
