#!/usr/bin/env bash
# ctest -L install: installs a build into a scratch prefix and uses it as a user would.
#   install_test.sh BUILD_DIR SOURCE_DIR
# - the installed CLI compiles and verifies, finding the plugin EP and ONNX Runtime in the prefix;
# - the plugin EP needs no shared library beyond libc, libstdc++ and the compiler runtime;
# - an external CMake project builds with find_package(ctxgen) and runs the compiled model in ORT;
# - a program builds with only `pkg-config --cflags --libs ctxgen`;
# - README.md's C++ program builds and runs with the command line shown under it;
# - CTXGEN_BUILD_TESTS=OFF configures without looking for googletest.
set -euo pipefail
build="$(realpath "$1")" source="$(realpath "$2")"
work="$(mktemp -d "$build/install-test.XXXXXX")"
trap 'rm -rf "$work"' EXIT
prefix="$work/prefix"
fail() { echo "install_test: $*" >&2; exit 1; }
step() { echo "--- $*"; }

step "cmake --install into $prefix"
cmake --install "$build" --prefix "$prefix" >/dev/null
for f in bin/ctxgen libexec/ctxgen/ctxgen-cpu-level lib/libctxgen_ort_ep.so lib/libctxgen_ort_ep_runtime.so lib/libonnxruntime.so.1 lib/libctxgen_pipeline.a include/ctxgen/pipeline.h \
         lib/cmake/ctxgen/ctxgenConfig.cmake lib/cmake/ctxgen/ctxgenConfigVersion.cmake lib/pkgconfig/ctxgen.pc \
         share/bash-completion/completions/ctxgen; do
  [ -e "$prefix/$f" ] || fail "the install has no $f"
done

step "the plugin EPs' run-time dependencies"
# The runtime-only library links no onnx and no protobuf; the full one also has them for its compiler.
for plugin in libctxgen_ort_ep_runtime.so libctxgen_ort_ep.so; do
  needed="$(readelf -d "$prefix/lib/$plugin" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | sort | tr '\n' ' ')"
  echo "$plugin NEEDED: $needed"
  for lib in $needed; do
    case "$lib" in
      libc.so.*|libm.so.*|libstdc++.so.*|libgcc_s.so.*|ld-linux*) ;;
      libmvec.so.1) ;;  # glibc's vector math (Erf, Tanh), part of libc6 on x86-64
      libdnnl.so.2|libgomp.so.1) ;;  # oneDNN runs the GEMMs (Debian's libdnnl2, which brings libgomp1)
      libonnx.so.1|libonnx_proto.so.1|libprotobuf.so.*|libnettle.so.*)  # the compiler, for ordinary models (libonnx1, libprotobuf32; libnettle8 signs cache entries)
        [ "$plugin" = libctxgen_ort_ep.so ] || fail "$plugin needs $lib" ;;
      *) fail "$plugin needs $lib" ;;
    esac
  done
done
! ldd "$prefix/lib/libctxgen_ort_ep_runtime.so" | grep -E 'libonnx|libprotobuf' ||
  fail "libctxgen_ort_ep_runtime.so loads onnx or protobuf through a dependency"
readelf -d "$prefix/bin/ctxgen" | grep -q 'RUNPATH.*\[\$ORIGIN/../lib\]' || fail "bin/ctxgen's RUNPATH is not \$ORIGIN/../lib"

step "the installed CLI, from another folder"
cd "$work"
env -u CTXGEN_ORT_EP -u LD_LIBRARY_PATH "$prefix/bin/ctxgen" -V
env -u CTXGEN_ORT_EP "$prefix/bin/ctxgen" compile "$source/testdata/cnn.onnx" --output-dir cli -q
# Another CPU level's layouts come from the installed helper, beside the installed CLI.
env -u CTXGEN_ORT_EP "$prefix/bin/ctxgen" compile "$source/testdata/cnn.onnx" --target-cpu sse41 --output-dir cli_sse41 -q
"$prefix/bin/ctxgen" inspect cli_sse41/cnn_ref.bin | grep -q ' sse41, oneDNN' || fail "the installed CLI did not compile for sse41"
env -u CTXGEN_ORT_EP -u LD_LIBRARY_PATH "$prefix/bin/ctxgen" verify cli/cnn_ctx.onnx --reference "$source/testdata/cnn.onnx"
# It looks in the prefix, not in the build tree: without the installed plugin it says where it looked.
mv "$prefix/lib/libctxgen_ort_ep.so" "$work/moved.so"
if message="$(env -u CTXGEN_ORT_EP "$prefix/bin/ctxgen" verify cli/cnn_ctx.onnx 2>&1)"; then
  fail "verify passed without the installed plugin EP"
fi
grep -qF "$prefix/lib/libctxgen_ort_ep.so: no plugin EP library there" <<<"$message" || fail "unexpected error: $message"
mv "$work/moved.so" "$prefix/lib/libctxgen_ort_ep.so"

step "an external CMake project: find_package(ctxgen)"
cmake -S "$source/tests/install/consumer" -B "$work/consumer" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$work/consumer" >/dev/null
cli="$(cmake --build "$work/consumer" --target print_cli)"
grep -qF "cli=$prefix/bin/ctxgen" <<<"$cli" || fail "ctxgen::ctxgen is not the installed CLI"
"$work/consumer/consumer" "$source/testdata/cnn.onnx" "$work/lib-out" | tee "$work/consumer.txt"
grep -q "^compiled [1-9][0-9]* of " "$work/consumer.txt" || fail "the consumer compiled nothing"
[ -f "$work/lib-out/cnn_ctx.onnx" ] && [ -f "$work/lib-out/cnn_ref.bin" ] || fail "the consumer wrote no outputs"

step "pkg-config ctxgen"
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
[ "$(pkg-config --modversion ctxgen)" = "$(sed -n 's/^Version: //p' "$prefix/lib/pkgconfig/ctxgen.pc")" ] || fail "pkg-config --modversion"
# shellcheck disable=SC2046
c++ -std=c++20 "$source/tests/install/pkgconfig_consumer.cc" -o "$work/pc_consumer" $(pkg-config --cflags --libs ctxgen)
"$work/pc_consumer" "$source/testdata/cnn.onnx" | grep -q "nodes, first " || fail "the pkg-config consumer could not load a model"

step "README.md's C++ program, built as the README says, against this prefix"
mkdir -p "$work/readme" && cd "$work/readme"
"$prefix/bin/ctxgen" compile "$source/testdata/cnn.onnx" --output-dir out -q  # where README.md writes it
awk '/^```cpp/ {inside = 1; next} /^```/ {if (inside) exit} inside' "$source/README.md" >app.cc
readme_prefix=/tmp/ctxgen  # the prefix README.md installs to
grep -qF "$readme_prefix/lib/libctxgen_ort_ep.so" app.cc || fail "README.md's program does not load the plugin from $readme_prefix"
# This prefix stands for README's in the program as in its command line: nothing else may have
# installed to /tmp/ctxgen (the docs test does, in whatever order ctest runs them).
sed -i "s|$readme_prefix/|$prefix/|g" app.cc
command_line="$(sed -n 's/^    \(c++ .* app.cc .*\)$/\1/p' "$source/README.md")"
[ -n "$command_line" ] || fail "README.md shows no command line for app.cc"
eval "${command_line//$readme_prefix/$prefix}" | tee app.txt
grep -q "^y\[0\] = " app.txt || fail "README.md's program printed no output"
cd "$work"

step "cmake --install --component runtime"
cmake --install "$build" --prefix "$work/runtime" --component runtime >/dev/null
[ -x "$work/runtime/bin/ctxgen" ] && [ -f "$work/runtime/lib/libctxgen_ort_ep.so" ] &&
  [ -f "$work/runtime/lib/libctxgen_ort_ep_runtime.so" ] || fail "the runtime component lacks the CLI or a plugin"
[ ! -e "$work/runtime/include" ] || fail "the runtime component installs headers"

step "CTXGEN_BUILD_TESTS=OFF"
cmake -S "$source" -B "$work/no-tests" -G Ninja -DCTXGEN_BUILD_TESTS=OFF \
      -DCTXGEN_ORT_ROOT="$(sed -n 's/^CTXGEN_ORT_ROOT:PATH=//p' "$build/CMakeCache.txt")" >/dev/null
! grep -q "^GTest_DIR" "$work/no-tests/CMakeCache.txt" || fail "CTXGEN_BUILD_TESTS=OFF still looks for googletest"
! grep -q "_test:" <(cmake --build "$work/no-tests" --target help) || fail "CTXGEN_BUILD_TESTS=OFF still defines tests"
echo "install_test: ok"
