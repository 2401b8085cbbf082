#!/usr/bin/env bash
# Sets up a fresh Debian machine for ctxgen and builds it; idempotent.
#   scripts/setup.sh               install, build, then compile the bundled example
#   scripts/setup.sh --build-only  install and build only (used by scripts/test.sh)
#   scripts/setup.sh --deps-only   install only (used by scripts/sanitize.sh)
#   BUILD_DIR=... CMAKE_ARGS=...   choose the build folder / add CMake options
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${BUILD_DIR:-$repo/build}"

packages=(g++ cmake ninja-build pkg-config
          libonnx-dev libprotobuf-dev protobuf-compiler libcli11-dev libspdlog-dev libxxhash-dev
          nlohmann-json3-dev libgtest-dev libgmock-dev libbenchmark-dev
          libdnnl-dev  # oneDNN: the ref runtime's GEMMs
          nettle-dev  # SHA-256 for model packages' shared assets, HMAC-SHA256 for signed cache entries
          libonnx-testdata python3-onnx python3-numpy python3-jsonschema
          graphviz  # inspect --svg
          libcurl4-openssl-dev  # the remote compile cache's HTTP client (--remote-cache)
          nginx-core  # the HTTP server the remote cache's tests run against
          clang libclang-rt-dev)  # clang: the sanitizer build and the libFuzzer targets
# npm fetches ONNX Runtime; machines that already have node and npm (often not from Debian) keep them.
command -v npm >/dev/null || packages+=(npm)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=(); [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

"$repo/scripts/install_ort.sh"
[ "${1:-}" = "--deps-only" ] && exit 0

# A full disk stops the compiler halfway with "No space left on device"; a first build says up
# front what it needs.
if [ ! -d "$build_dir/lib" ]; then
  at="$build_dir"
  until [ -d "$at" ]; do at="$(dirname "$at")"; done
  free_kb=$(df -Pk "$at" | awk 'NR == 2 { print $4 }')
  if ((free_kb < 7 * 1024 * 1024)); then
    echo "setup: warning: $((free_kb / 1024)) MB free where $build_dir goes; the build and its tests' outputs take about" \
      "3.9 GB, and scripts/test.sh's sanitizer build (build-sanitize/) about 2.8 GB more" >&2
  fi
fi

# shellcheck disable=SC2086
cmake -S "$repo" -B "$build_dir" -G Ninja -DCTXGEN_ORT_ROOT="$repo/third_party/onnxruntime" ${CMAKE_ARGS:-} >/dev/null
cmake --build "$build_dir" -j2

if [ "${1:-}" != "--build-only" ]; then
  out="$build_dir/example"
  "$build_dir/bin/ctxgen" compile "$repo/testdata/cnn.onnx" -e ref --output-dir "$out" --force
  "$build_dir/bin/ctxgen" inspect "$out/cnn_ctx.onnx"
  "$build_dir/bin/ctxgen" verify "$out/cnn_ctx.onnx" --reference "$repo/testdata/cnn.onnx"
fi
