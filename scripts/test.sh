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
if [ $# -gt 0 ]; then
  exec ctest --test-dir "$build_dir" --output-on-failure -j2 "$@"
fi
# The whole suite: the sanitize label's one test would print nothing for most of the run, so the
# sanitizer build and its suite run here instead, in view (scripts/sanitize.sh is that test).
status=0
ctest --test-dir "$build_dir" --output-on-failure -j2 -LE sanitize || status=$?
# (Not grep -q: it would stop reading, and under pipefail ctest's broken pipe would fail the test.)
if [[ "$(ctest --test-dir "$build_dir" -N -L sanitize)" == *sanitizer_suite* ]]; then
  echo "test.sh: the suite again under ASan + UBSan (scripts/sanitize.sh; about 10 minutes on two cores)"
  "$repo/scripts/sanitize.sh" || status=$?
fi
exit "$status"
