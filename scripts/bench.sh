#!/usr/bin/env bash
# Measures `ctxgen share` on a transformer-shaped pair of models that share every weight under
# different names (prefill: seq 128, decode: seq 1), and prints ratios measured side by side in
# this one run, so machine speed and load cancel out:
#   time ratio  = ctxgen wall time / I/O floor (read every input once + write the unique bytes once
#                 with plain tools, fsynced like ctxgen's outputs)
#   RSS ratio   = ctxgen peak resident memory / total input size
#   size ratio  = .bin size / unique weight bytes
# then how the outputs run in ONNX Runtime (ctxgen-runtime-bench), on the pair and on an exported
# CNN: inference time with CtxgenRef / with the CPU EP on the original, session creation of the
# _ctx.onnx / of the original, and the memory a second session of the shared pair adds.
#
#   scripts/bench.sh [SIZE_MB_PER_MODEL]     (default 500: about 2 x 500 MB of input)
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
size_mb="${1:-500}"
build_dir="${BUILD_DIR:-$repo/build}"
work="$build_dir/bench/$size_mb"
ctxgen="$build_dir/bin/ctxgen"

"$repo/scripts/setup.sh" --build-only >/dev/null
if [ ! -f "$work/decode.onnx" ]; then
  mkdir -p "$work"
  /usr/bin/python3 "$repo/scripts/gen_llm_pair.py" "$work" --size-mb "$size_mb"
fi
inputs=("$work/prefill.onnx" "$work/prefill.weights" "$work/decode.onnx" "$work/decode.weights")
input_bytes=$(stat -c %s "${inputs[@]}" | awk '{s += $1} END {print s}')
unique_bytes=$(stat -c %s "$work/prefill.weights")  # every weight once, by construction
out="$work/out"
floor_file="$work/floor.bin"

now() { date +%s.%N; }
cat "${inputs[@]}" >/dev/null  # same page-cache state for both measurements

t0=$(now)
cat "${inputs[@]}" >/dev/null
dd if="$work/prefill.weights" of="$floor_file" bs=64M conv=fsync status=none
t1=$(now)
rm -f "$floor_file"

rm -rf "$out" "$work/report.json"
/usr/bin/time -f "%e %M" -o "$work/time.txt" \
  "$ctxgen" share "$work/prefill.onnx,$work/decode.onnx" --output-dir "$out" --report "$work/report.json" -q
read -r ctx_seconds rss_kb <"$work/time.txt"
bin_bytes=$(stat -c %s "$out/prefill_ref.bin")

awk -v t0="$t0" -v t1="$t1" -v t="$ctx_seconds" -v rss="$rss_kb" -v in_bytes="$input_bytes" \
    -v bin="$bin_bytes" -v uniq="$unique_bytes" 'BEGIN {
  floor = t1 - t0
  printf "input: %.1f MB in 2 models; unique weights %.1f MB; .bin %.1f MB\n", in_bytes / 1e6, uniq / 1e6, bin / 1e6
  printf "ctxgen share: %.2f s, peak RSS %.1f MB; I/O floor: %.2f s\n", t, rss * 1024 / 1e6, floor
  printf "time / I/O floor        %.2f   (target <= 2)\n", t / floor
  printf "peak RSS / input size   %.3f  (target <= 0.25)\n", rss * 1024 / in_bytes
  printf ".bin / unique weights   %.4f (target <= 1.01)\n", bin / uniq
}'

# Run time. The exported CNN, compiled for one image size, is the conv model.
cnn="$work/cnn"
"$ctxgen" compile "$repo/testdata/exports/cnn_upsample.onnx" --input-shape image=1x3x32x32 --output-dir "$cnn" --force -q
"$build_dir/bin/ctxgen-runtime-bench" --runs "${RUNS:-3}" "$work/prefill.onnx=$out/prefill_ctx.onnx" \
  "$work/decode.onnx=$out/decode_ctx.onnx" "$repo/testdata/exports/cnn_upsample.onnx=$cnn/cnn_upsample_ctx.onnx"
