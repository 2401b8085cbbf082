#!/usr/bin/env bash
# Measures `ctxgen share` on transformer-shaped models that share every weight under different
# names (prefill: seq 128, decode: seq 1, ...): a pair with external data, the same pair with
# embedded weights, and a group of 8 embedded models; and prints ratios measured side by side in
# this one run, so machine speed and load cancel out:
#   time ratio  = ctxgen wall time / I/O floor (read every input once + write the unique bytes once
#                 with plain tools, fsynced like ctxgen's outputs)
#   RSS ratio   = ctxgen peak resident memory / total input size
#   size ratio  = .bin size / unique weight bytes
#   peak RSS of the 8 embedded models / of the embedded pair (memory must not grow with N)
# then how the outputs run in ONNX Runtime (ctxgen-runtime-bench), on the pair and on an exported
# CNN: inference time with CtxgenRef / with the CPU EP on the original, session creation of the
# _ctx.onnx / of the original, and the memory a second session of the shared pair adds; and the
# same for the quantized and half-precision variants of the exports (testdata/quantized), with the
# geometric mean and the largest of their inference ratios.
#
#   scripts/bench.sh [SIZE_MB_PER_MODEL]     (default 500: 2 x 500 MB twice, then 8 x 500 MB)
#   SHARE_RUNS=N: runs of each share and its floor (default 3); RUNS=N: of each inference (10:
#   a best of 3 runs of the QDQ CNN was once 0.33 ms, its best of 10 0.18-0.19: the machine's noise)
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
size_mb="${1:-500}"
build_dir="${BUILD_DIR:-$repo/build}"
work="$build_dir/bench/$size_mb"
ctxgen="$build_dir/bin/ctxgen"

"$repo/scripts/setup.sh" --build-only >/dev/null
now() { date +%s.%N; }

# measure LABEL TIME_TARGET RSS_TARGET DIR MODEL...: `ctxgen share` of the models against the I/O
# floor. Every weight is byte-identical across the models: the unique bytes are one model's. The
# two alternate SHARE_RUNS times (default 3) and each side's fastest run counts: the disk's speed
# varies by a third from one run to the next here, and the fastest run is the one least disturbed.
measure() {
  local label="$1" time_target="$2" rss_target="$3" dir="$4"
  shift 4
  local models=("$@") inputs=() unique_bytes
  for m in "${models[@]}"; do
    inputs+=("$dir/$m.onnx")
    if [ -f "$dir/$m.weights" ]; then inputs+=("$dir/$m.weights"); fi
  done
  local source="$dir/${models[0]}.onnx"  # where the floor reads the bytes it writes
  if [ -f "$dir/${models[0]}.weights" ]; then
    source="$dir/${models[0]}.weights"
    unique_bytes=$(stat -c %s "$source")
  else  # embedded: the report counts the unique bytes
    unique_bytes=""
  fi
  local input_bytes out="$dir/out" floor_file="$dir/floor.bin" t0 t1 seconds kb bin_bytes list
  local ctx_seconds="" rss_kb=0 floor="" runs="${SHARE_RUNS:-3}"
  input_bytes=$(stat -c %s "${inputs[@]}" | awk '{s += $1} END {print s}')
  list=$(printf "$dir/%s.onnx," "${models[@]}")
  for ((run = 0; run < runs; run++)); do
    rm -rf "$out" "$dir/report.json"
    cat "${inputs[@]}" >/dev/null  # same page-cache state for both measurements
    /usr/bin/time -f "%e %M" -o "$dir/time.txt" \
      "$ctxgen" share "${list%,}" --output-dir "$out" --report "$dir/report.json" -q
    read -r seconds kb <"$dir/time.txt"
    ctx_seconds=$(awk -v a="$ctx_seconds" -v b="$seconds" 'BEGIN { print (a == "" || b < a) ? b : a }')
    rss_kb=$((kb > rss_kb ? kb : rss_kb))  # memory: the largest of the runs
    if [ -z "$unique_bytes" ]; then
      unique_bytes=$(/usr/bin/python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["context_binary_weights"]["unique_bytes"])' \
        "$dir/report.json")
    fi
    t0=$(now)
    cat "${inputs[@]}" >/dev/null
    dd if="$source" of="$floor_file" bs=64M count="$unique_bytes" iflag=count_bytes conv=fsync status=none
    t1=$(now)
    rm -f "$floor_file"
    floor=$(awk -v a="$floor" -v t0="$t0" -v t1="$t1" 'BEGIN { b = t1 - t0; print (a == "" || b < a) ? b : a }')
  done
  bin_bytes=$(stat -c %s "$out/${models[0]}_ref.bin")
  awk -v label="$label" -v tt="$time_target" -v rt="$rss_target" -v n="${#models[@]}" -v floor="$floor" -v t="$ctx_seconds" -v rss="$rss_kb" \
      -v in_bytes="$input_bytes" -v bin="$bin_bytes" -v uniq="$unique_bytes" -v runs="$runs" 'BEGIN {
    printf "%s -- input: %.1f MB in %d models; unique weights %.1f MB; .bin %.1f MB\n", label, in_bytes / 1e6, n, uniq / 1e6, bin / 1e6
    printf "ctxgen share: %.2f s, peak RSS %.1f MB; I/O floor: %.2f s (best of %d)\n", t, rss * 1024 / 1e6, floor, runs
    printf "time / I/O floor        %.2f   (target <= %s)\n", t / floor, tt
    printf "peak RSS / input size   %.3f  (target <= %s)\n", rss * 1024 / in_bytes, rt
    printf ".bin / unique weights   %.4f (target <= 1.01)\n", bin / uniq
  }'
  last_rss_kb=$rss_kb
}

generate() {  # generate DIR ARGS...: the models, once per size
  local dir="$1"
  shift
  if [ ! -f "$dir/.done" ]; then
    mkdir -p "$dir"
    /usr/bin/python3 "$repo/scripts/gen_llm_pair.py" "$dir" --size-mb "$size_mb" "$@" >/dev/null
    touch "$dir/.done"
  fi
}

generate "$work"
generate "$work/embedded" --embedded
generate "$work/embedded8" --embedded --models 8
measure "external data" 2 0.25 "$work" prefill decode
out="$work/out"
echo
measure "embedded" 1.0 0.05 "$work/embedded" prefill decode
pair_rss_kb=$last_rss_kb
echo
measure "embedded" 2 0.05 "$work/embedded8" prefill decode seq64 seq32 seq16 seq8 seq4 seq2
awk -v two="$pair_rss_kb" -v eight="$last_rss_kb" \
  'BEGIN { printf "peak RSS, 8 models / 2 models   %.2f (target <= 1.2)\n", eight / two }'
echo

# One build for two CPU levels: the pair as a model package (--package) against one level's
# outputs, every byte counted. Levels: avx2 and this machine's own when it is above avx2.
rm -rf "$work/host" "$work/package"
host_level=$("$ctxgen" compile "$repo/testdata/cnn.onnx" --package "$work/host" -q &&
  /usr/bin/python3 -c 'import json, sys; print(next(iter(json.load(open(sys.argv[1]))["components"]["cnn"]["variants"])))' \
    "$work/host/manifest.json")
levels="avx2,$host_level"
[ "$host_level" = avx2 ] && levels="avx,avx2"
"$ctxgen" share "$work/prefill.onnx,$work/decode.onnx" --target-cpu "$levels" --package "$work/package" -q
"$ctxgen" share "$work/prefill.onnx,$work/decode.onnx" --target-cpu avx2 --output-dir "$work/one_level" --force -q
awk -v pkg="$(du -bl "$work/package" | tail -1 | cut -f1)" -v one="$(du -bl "$work/one_level" | tail -1 | cut -f1)" \
    -v levels="$levels" 'BEGIN {
  printf "package of the pair for %s: %.1f MB; one level: %.1f MB; ratio %.3f (target <= 1.25)\n", levels, pkg / 1e6, one / 1e6, pkg / one
}'
echo

# Run time. The exported CNN, compiled for one image size, is the conv model.
cnn="$work/cnn"
"$ctxgen" compile "$repo/testdata/exports/cnn_upsample.onnx" --input-shape image=1x3x32x32 --output-dir "$cnn" --force -q
"$build_dir/bin/ctxgen-runtime-bench" --runs "${RUNS:-10}" "$work/prefill.onnx=$out/prefill_ctx.onnx" \
  "$work/decode.onnx=$out/decode_ctx.onnx" "$repo/testdata/exports/cnn_upsample.onnx=$cnn/cnn_upsample_ctx.onnx"
echo

# The quantized and half-precision variants, as ONNX Runtime's tools write them; ONNX Runtime runs
# their originals with its own int8/int4 kernels.
quantized="$work/quantized" q="$repo/testdata/quantized" pairs=()
shopt -s nullglob
for variant in qdq_u8s8 qdq_a16w8 qop fp16 matmulnbits qdq_int4; do
  for model in "$q"/*_"$variant".onnx; do
    stem="$(basename "$model" .onnx)"
    case "$stem" in
      cnn*) shapes=(--fix-dim batch=1) ;;
      decoder_prefill*) shapes=(--fix-dim batch=1 --fix-dim seq=16) ;;
      decoder_decode*) shapes=(--fix-dim batch=1 --fix-dim seq=1 --fix-dim past=15) ;;
    esac
    "$ctxgen" compile "$model" "${shapes[@]}" --output-dir "$quantized" --force -q
    pairs+=("$model=$quantized/${stem}_ctx.onnx")
  done
done
"$build_dir/bin/ctxgen-runtime-bench" --runs "${RUNS:-10}" "${pairs[@]}" | tee "$quantized/runtime.txt"
awk '/^inference, / { for (i = 1; i <= NF; ++i) if ($i == "ratio") { r = $(i + 1); sum += log(r); n++; if (r > max) max = r } }
     END { if (n) printf "quantized and half models: inference ratio geometric mean %.2f (target <= 1.0), largest %.2f (target <= 1.5), %d models\n", exp(sum / n), max, n }' \
  "$quantized/runtime.txt"
