#!/usr/bin/env bash
# Runs one libFuzzer target for SECONDS, from its seed corpus, with ASan + UBSan.
#   scripts/fuzz.sh TARGET SECONDS       TARGET: model_load, embedded_weights, context_binary, ref_program, command_line, manifest,
#                                        cache_entry, object_header
#   scripts/fuzz.sh --binary B --corpus C TARGET SECONDS   (ctest's smoke: a built target, its seeds)
# Builds the sanitizer tree (scripts/sanitize.sh --build-only) unless --binary is given. Findings
# (crash-*, timeout-*, oom-*) go to build-sanitize/fuzz/findings/TARGET; the grown corpus to
# build-sanitize/fuzz/work/TARGET, so a long run continues where the last one stopped. Exits
# non-zero when the fuzzer found something, and prints the reproducer's path.
# FUZZ_ARGS adds libFuzzer options, e.g. FUZZ_ARGS="-fork=1 -ignore_crashes=1" keeps a long run
# going past findings.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${SANITIZE_BUILD_DIR:-$repo/build-sanitize}"
binary="" seeds=""
while [ $# -gt 2 ]; do
  case "$1" in
    --binary) binary="$2"; shift 2 ;;
    --corpus) seeds="$2"; shift 2 ;;
    *) break ;;
  esac
done
if [ $# -ne 2 ]; then
  sed -n '2,10p' "$0" >&2
  exit 2
fi
target="$1" seconds="$2"
if [ -z "$binary" ]; then
  "$repo/scripts/sanitize.sh" --build-only >/dev/null
  binary="$build_dir/fuzz/fuzz_$target"
  seeds="$build_dir/fuzz/corpus/$target"
fi
[ -x "$binary" ] || { echo "fuzz.sh: no fuzz target '$target' ($binary)" >&2; exit 2; }
binary="$(realpath "$binary")" seeds="$(realpath "$seeds")"
fuzz_dir="$(dirname "$binary")"
work="$fuzz_dir/work/$target" findings="$fuzz_dir/findings/$target"
mkdir -p "$work" "$findings"
# Inputs that once crashed a target (fuzz/regressions/TARGET) run first, every time.
regressions=() && [ -d "$repo/fuzz/regressions/$target" ] && regressions=("$repo/fuzz/regressions/$target")
export ASAN_OPTIONS="detect_leaks=1:allocator_may_return_null=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
# -timeout: an input that takes 10 s is a hang; -rss_limit_mb: one that needs 2 GB is unbounded memory.
# -max_len: large enough for the seed models.
stamp="$(mktemp)"  # artifacts newer than this are this run's (fork mode with -ignore_crashes exits 0)
trap 'rm -f "$stamp"' EXIT
set +e
(cd "$findings" && "$binary" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=300000 \
  -print_final_stats=1 -artifact_prefix="$findings/" ${FUZZ_ARGS:-} "$work" "$seeds" "${regressions[@]}" 2>"$findings/log.txt")
status=$?
set -e
# The final statistics (a fork-mode run prints progress lines only: the last one then).
{ grep -E "^(stat::number_of_executed_units|stat::average_exec_per_sec|stat::peak_rss_mb)" "$findings/log.txt" ||
  grep -aE "^#[0-9]+: cov:" "$findings/log.txt" | tail -n 1; } | sed "s/^/$target: /" || true
found="$(find "$findings" -maxdepth 1 -newer "$stamp" -regex '.*/\(crash\|timeout\|oom\|leak\|slow-unit\)-.*' | sort)"
if [ -n "$found" ]; then
  tail -n 40 "$findings/log.txt" >&2
  echo "fuzz.sh: $target found $(wc -w <<<"$found") problem(s): $(tr '\n' ' ' <<<"$found")" >&2
  echo "fuzz.sh: reproduce with: $binary ${found%%$'\n'*}" >&2
  exit 1
fi
if [ $status -ne 0 ]; then
  tail -n 40 "$findings/log.txt" >&2
  echo "fuzz.sh: $target: libFuzzer exited with status $status and wrote no reproducer (interrupted, or it failed to start; $findings/log.txt)" >&2
  exit 1
fi
echo "$target: no findings in ${seconds}s ($(ls "$work" | wc -l) inputs in the corpus)"
