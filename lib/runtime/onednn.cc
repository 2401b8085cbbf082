#include "onednn.h"

#include <omp.h>

#include <string>

#include "ctxgen/error.h"

namespace ctxgen::runtime::onednn {

const dnnl::engine& engine() {
  static const dnnl::engine cpu(dnnl::engine::kind::cpu, 0);
  return cpu;
}

dnnl::stream& stream() {
  thread_local dnnl::stream own(engine());
  return own;
}

void execute(const dnnl::primitive& primitive, const dnnl_exec_arg_t* args, int count) {
  const dnnl_status_t status = dnnl_primitive_execute(primitive.get(), stream().get(), count, args);
  if (status != dnnl_success)
    throw Error(ErrorCode::kRuntime, "oneDNN failed to run a primitive (status " + std::to_string(static_cast<int>(status)) + ")");
  stream().wait();
}

void reorder(const dnnl::reorder& primitive, const dnnl::memory& from, const dnnl::memory& to) {
  const dnnl_exec_arg_t args[] = {{DNNL_ARG_FROM, from.get()}, {DNNL_ARG_TO, to.get()}};
  execute(primitive, args, 2);
}

OneThread::OneThread() : before_(omp_get_max_threads()) { omp_set_num_threads(1); }
OneThread::~OneThread() { omp_set_num_threads(before_); }

namespace {

const char* isa_name(dnnl::cpu_isa isa) {
  switch (isa) {
    case dnnl::cpu_isa::sse41: return "sse41";
    case dnnl::cpu_isa::avx: return "avx";
    case dnnl::cpu_isa::avx2: return "avx2";
    case dnnl::cpu_isa::avx2_vnni: return "avx2_vnni";
    case dnnl::cpu_isa::avx512_mic: return "avx512_mic";
    case dnnl::cpu_isa::avx512_mic_4ops: return "avx512_mic_4ops";
    case dnnl::cpu_isa::avx512_core: return "avx512_core";
    case dnnl::cpu_isa::avx512_core_vnni: return "avx512_core_vnni";
    case dnnl::cpu_isa::avx512_core_bf16: return "avx512_core_bf16";
    case dnnl::cpu_isa::avx512_core_amx: return "avx512_core_amx";
    default: return "generic";
  }
}

}  // namespace

bool exact_int8_convolution() {
  const dnnl::cpu_isa isa = dnnl::get_effective_cpu_isa();
  return isa == dnnl::cpu_isa::avx2_vnni || isa == dnnl::cpu_isa::avx512_core_vnni ||
         isa == dnnl::cpu_isa::avx512_core_bf16 || isa == dnnl::cpu_isa::avx512_core_amx;
}

std::string architecture() {
  const dnnl_version_t* v = dnnl_version();
#if defined(__x86_64__)
  const char* machine = "x86_64";
#elif defined(__aarch64__)
  const char* machine = "aarch64";
#else
  const char* machine = "cpu";
#endif
  return std::string(machine) + " " + isa_name(dnnl::get_effective_cpu_isa()) + ", oneDNN " + std::to_string(v->major) +
         "." + std::to_string(v->minor) + "." + std::to_string(v->patch);
}

}  // namespace ctxgen::runtime::onednn
