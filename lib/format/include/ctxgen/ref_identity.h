#pragma once
// The identity of the `ref` backend, fixed in one place: the compiler writes it into EPContext
// nodes and context binaries, the plugin EP checks it when loading them.

namespace ctxgen::ref {

inline constexpr const char* kBackendName = "ref";        // -e ref, <stem>_ref.bin
inline constexpr const char* kEpName = "CtxgenRef";       // EPContext `source`, ORT EP name
// 3.0: a Conv's weight may be packed for oneDNN (attribute `packed`), which 2.0 cannot run.
// 3.1: a packed Conv may compute on channels-last images (`channels_last`, `src_channels_last`,
// `dst_channels_last`), which 3.0 cannot run.
// 3.2: a packed Conv records its weight's layout (`weight_layout`), which 3.2 requires.
// 3.3: a ConvTranspose's weight may be packed for oneDNN's deconvolution (`packed`), ConvWeight
// may lay one out (`transposed`), and Conv, Gemm and MatMul may scale and shift their results
// (`out_scale`, `out_shift`), which 3.2 would misread or ignore.
// 3.4: Requantize, an op 3.3 does not know.
// 3.5: BatchNormalization may read a channels-last image (`channels_last`) and fuse an activation
// (`act`), epilogues may bound their results (`out_lo`, `out_hi`), and a Reshape's output may lie
// on its input's arena bytes, which 3.4 would misread or refuse.
// 3.6: a float32 Add may run an epilogue (`act`, `out_scale` ...), which 3.5 would ignore.
// 3.7: MatMul and Gemm may read B laid out in panels (`panels`), and PanelWeight lays one out,
// which 3.6 would misread or refuse.
inline constexpr const char* kSdkVersion = "ctxgen-ref 3.7";
// The hardware architecture is the CPU level packed weights are laid out for, read from the
// machine: runtime::hardware_architecture().

}  // namespace ctxgen::ref
