#!/usr/bin/env bash
# Runs the ONNX backend test data (Debian's libonnx-testdata) through ONNX Runtime's CPU EP and
# through ctxgen + the CtxgenRef plugin EP, and prints both pass counts (docs/conformance.md).
#   scripts/conformance.sh [--suite node] [--filter conv] [--json out.json] [--require-ceiling]
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${BUILD_DIR:-$repo/build}"
"$repo/scripts/setup.sh" --build-only >/dev/null
"$build_dir/bin/ctxgen-conformance" "$@"
