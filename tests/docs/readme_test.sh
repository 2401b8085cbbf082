#!/usr/bin/env bash
# ctest -L docs: every shell line README.md shows, run as written on the bundled example.
#   readme_test.sh BUILD_DIR SOURCE_DIR
# The commands run in a scratch copy of the repository's layout (build/ -> the build tree,
# testdata/ and the completion copied), one bash session in README order, so `E=` carries over and
# the outputs the README promises can be checked. A README command this script neither runs nor
# names below with the test that covers it fails the test: a new example cannot go untested.
set -euo pipefail
build="$(realpath "$1")" source="$(realpath "$2")"
work="$(mktemp -d "$build/readme-test.XXXXXX")"
trap 'rm -rf "$work"' EXIT
fail() { echo "readme_test: $*" >&2; exit 1; }

# Indented (4-space) blocks outside ``` fences, continuation lines joined.
mapfile -t commands < <(awk '
  /^```/ { fenced = !fenced; next }
  fenced { next }
  /^    [^ ]/ || (joining && /^        /) {
    line = $0; sub(/^ +/, "", line)
    text = joining ? text " " line : line
    joining = (text ~ /\\$/)
    if (joining) { sub(/\\$/, "", text); next }
    print text
  }' "$source/README.md")

covered_elsewhere() {  # prints why a command is not run here, or nothing
  case "$1" in
    "ctxgen compile model.onnx"*|"ctxgen share   m1.onnx"*) echo "the synopsis, not a command" ;;
    scripts/setup.sh|scripts/test.sh) echo "the two commands: CI runs them on a fresh clone" ;;
    scripts/conformance.sh*) echo "ctest -L conformance runs it" ;;
    "cmake --install build"*|"c++ -std=c++17 app.cc"*) echo "ctest -L install runs it" ;;
  esac
}

mkdir -p "$work/apps/ctxgen"
ln -s "$build" "$work/build"
cp -r "$source/testdata" "$work/testdata"
cp "$source/apps/ctxgen/completion.bash" "$work/apps/ctxgen/"
script="$work/readme.sh"
echo "set -euo pipefail; cd '$work'" >"$script"
ran=0
for c in "${commands[@]}"; do
  why="$(covered_elsewhere "$c")"
  if [ -n "$why" ]; then
    echo "skip: $c  ($why)"
    continue
  fi
  printf 'echo %q\n%s\n' "+ $c" "$c" >>"$script"
  ran=$((ran + 1))
done
[ "$ran" -ge 8 ] || fail "only $ran README commands found to run; did the README's layout change?"
bash "$script" || fail "a README command failed (above)"

# What the comments and the text promise.
for f in out/cnn_ctx.onnx out/cnn_ref.bin dist/decoder_prefill_ctx.onnx dist/decoder_decode_ctx.onnx \
         dist/decoder_prefill_ref.bin dist/report.json; do
  [ -f "$work/$f" ] || fail "README promises $f; it was not written"
done
[ ! -e "$work/dist/decoder_decode_ref.bin" ] || fail "share wrote a second .bin"
echo "readme_test: ran $ran README commands"
