#!/usr/bin/env bash
# Builds ctxgen with clang, AddressSanitizer, UndefinedBehaviorSanitizer and the libFuzzer targets
# in its own folder, and runs the suite there: unit, e2e, ort and a fuzz smoke (conformance is left
# to the normal build: it runs the same kernels on 952 models and would take most of an hour).
#   scripts/sanitize.sh                      build + run
#   scripts/sanitize.sh --build-only         build only (scripts/fuzz.sh uses it)
#   scripts/sanitize.sh -R model_load        any ctest option after the first argument
#   SANITIZE_BUILD_DIR=...                   the folder (default build-sanitize)
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${SANITIZE_BUILD_DIR:-$repo/build-sanitize}"
"$repo/scripts/setup.sh" --deps-only
cmake -S "$repo" -B "$build_dir" -G Ninja -DCMAKE_CXX_COMPILER=clang++ \
  -DCTXGEN_SANITIZE=ON -DCTXGEN_FUZZ=ON -DCTXGEN_ORT_ROOT="$repo/third_party/onnxruntime" >/dev/null
cmake --build "$build_dir" -j2
[ "${1:-}" = "--build-only" ] && exit 0
# ONNX Runtime itself leaks a few allocations per process; only those are suppressed.
# intercept_tls_get_addr=0: see tests/ort/CMakeLists.txt.
export LSAN_OPTIONS="suppressions=$repo/tests/ort/lsan.supp:print_suppressions=0:intercept_tls_get_addr=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
ctest --test-dir "$build_dir" --output-on-failure -j2 -L 'unit|e2e|ort|fuzz' "$@"
