#!/usr/bin/env bash
# Builds ctxgen (installing what it needs) and runs the whole test suite: unit, end-to-end,
# ONNX Runtime interop, the conformance run over the ONNX backend test data, and the sanitize
# label (the suite again in a clang ASan + UBSan build, build-sanitize/, with a fuzz smoke).
#   scripts/test.sh                  everything
#   scripts/test.sh -L unit          only one label (unit, e2e, ort, conformance, install, docs, sanitize); any ctest option works
#   scripts/test.sh -LE sanitize     everything but the sanitizer build
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${BUILD_DIR:-$repo/build}"
"$repo/scripts/setup.sh" --build-only
ctest --test-dir "$build_dir" --output-on-failure -j2 "$@"
