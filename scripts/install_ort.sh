#!/usr/bin/env bash
# Installs ONNX Runtime 1.29.0 (C API 29) for the ctxgen plugin EP and its interop tests into
# <repo>/third_party/onnxruntime as include/ + lib/, the layout -DCTXGEN_ORT_ROOT expects.
# Only Debian and npm are reachable here, so ORT comes from the npm package that bundles it:
# headers from its onnxruntime.framework/Headers folder, the Linux x64 library from Plugins/.
# Idempotent: exits at once when that version is already installed. Never commit the result.
set -euo pipefail

readonly package="com.github.asus4.onnxruntime@0.4.9"  # ships ORT 1.29.0
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
readonly dest="$repo/third_party/onnxruntime"
readonly stamp="$dest/.installed-from"

if [[ -f "$stamp" && "$(cat "$stamp")" == "$package" && -f "$dest/include/onnxruntime_c_api.h" &&
      -f "$dest/lib/libonnxruntime.so.1" ]]; then
  echo "install_ort: $package already installed in $dest"
  exit 0
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

(cd "$work" && npm pack --silent "$package" >/dev/null)
tarball="$(find "$work" -maxdepth 1 -name '*.tgz' -print -quit)"
[[ -n "$tarball" ]] || { echo "install_ort: npm pack $package produced no tarball" >&2; exit 1; }
tar -xzf "$tarball" -C "$work"

library="$work/package/Plugins/Linux/x64/libonnxruntime.so"
[[ -f "$library" ]] || { echo "install_ort: $package has no Plugins/Linux/x64/libonnxruntime.so" >&2; exit 1; }
headers="$(find "$work/package" -type d -path '*onnxruntime.framework/Headers' -print -quit)"
[[ -n "$headers" && -f "$headers/onnxruntime_c_api.h" ]] ||
  { echo "install_ort: $package has no onnxruntime.framework/Headers with onnxruntime_c_api.h" >&2; exit 1; }

# Build the tree beside the destination and swap it in, so an interrupted run never leaves a
# half-installed tree that the check above would accept.
staging="$dest.staging.$$"
rm -rf "$staging"
mkdir -p "$staging/include" "$staging/lib"
cp "$headers"/*.h "$staging/include/"
cp "$library" "$staging/lib/libonnxruntime.so.1"
ln -s libonnxruntime.so.1 "$staging/lib/libonnxruntime.so"
echo "$package" >"$staging/.installed-from"
rm -rf "$dest"
mv "$staging" "$dest"

echo "install_ort: installed $package (ONNX Runtime 1.29.0) headers and libonnxruntime.so.1 into $dest"
