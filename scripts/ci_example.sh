#!/usr/bin/env bash
# The CI pipeline of docs/ci.md, run locally: one compile job per model in parallel (each a
# "machine" with an empty local cache, sharing one HTTP cache: nginx on 127.0.0.1), one link job,
# verify as the gate; then the same models in one `share`, and both wall times.
#   scripts/ci_example.sh [WORK_DIR]        (default build/ci-example; needs nginx, scripts/setup.sh installs it)
# Run it twice: the second time every job takes its partitions from the HTTP cache. The server
# keeps running between runs; STOP_SERVER=1 stops it at the end. Exits non-zero when a job or a
# verify fails, or when link and share wrote different files.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ctxgen="${CTXGEN:-$repo/build/bin/ctxgen}"
work="$(realpath -m "${1:-$repo/build/ci-example}")"
mkdir -p "$work"
cd "$work"

# The shared cache: nginx's WebDAV PUT, started here (kept between runs of this script).
port_file="$work/nginx/port"
if [ ! -f "$work/nginx/nginx.pid" ] || ! kill -0 "$(cat "$work/nginx/nginx.pid")" 2>/dev/null; then
  mkdir -p "$work/nginx/root"
  port="$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
  echo "$port" >"$port_file"
  cat >"$work/nginx/nginx.conf" <<EOF
master_process off;
pid $work/nginx/nginx.pid;
error_log $work/nginx/error.log;
events { worker_connections 64; }
http {
  access_log off;
  client_body_temp_path $work/nginx/body; proxy_temp_path $work/nginx/proxy; fastcgi_temp_path $work/nginx/fcgi;
  uwsgi_temp_path $work/nginx/uwsgi; scgi_temp_path $work/nginx/scgi;
  server {
    listen 127.0.0.1:$port;
    root $work/nginx/root;
    client_max_body_size 0;
    location / { dav_methods PUT; create_full_put_path on; }
  }
}
EOF
  /usr/sbin/nginx -p "$work/nginx" -c "$work/nginx/nginx.conf"
fi
if [ "${STOP_SERVER:-}" = 1 ]; then trap 'kill "$(cat "$work/nginx/nginx.pid")" 2>/dev/null || true' EXIT; fi
cache="http://127.0.0.1:$(cat "$port_file")/ctxgen"
echo "shared cache: $cache (stop it with: kill \$(cat $work/nginx/nginx.pid))"

# The models and each one's dims (a matrix row each).
exports="$repo/testdata/exports" quantized="$repo/testdata/quantized"
jobs=("$exports/decoder_prefill.onnx --fix-dim batch=1 --fix-dim seq=16"
      "$exports/decoder_decode.onnx --fix-dim batch=1 --fix-dim seq=1 --fix-dim past=15"
      "$exports/cnn_upsample.onnx --fix-dim batch=1"
      "$quantized/cnn_upsample_fp16.onnx --fix-dim batch=1"
      "$quantized/cnn_upsample_qdq_u8s8.onnx --fix-dim batch=1"
      "$quantized/decoder_prefill_matmulnbits.onnx --fix-dim batch=1 --fix-dim seq=16")

now() { date +%s.%N; }
rm -rf dist single machines && mkdir -p machines
start="$(now)"
pids=()
for job in "${jobs[@]}"; do
  read -r model dims <<<"$job"
  stem="$(basename "$model" .onnx)"
  # Each job a machine of its own: its own folder, its object the artifact it uploads.
  mkdir -p "machines/$stem"
  # shellcheck disable=SC2086
  "$ctxgen" compile "$model" $dims --cache "$cache" --object "machines/$stem/$stem.ctxo" >"machines/$stem/log" 2>&1 &
  pids+=("$!")
done
for pid in "${pids[@]}"; do wait "$pid" || { tail -n 3 machines/*/log >&2; exit 1; }; done
grep -h "^cache:" machines/*/log | sort | uniq -c
compiled="$(now)"
# In the group's order, as share takes the models: the first names the .bin, and the order the
# weights are stored in.
objects=()
for job in "${jobs[@]}"; do
  read -r model _ <<<"$job"
  stem="$(basename "$model" .onnx)"
  objects+=("machines/$stem/$stem.ctxo")
done
"$ctxgen" link "${objects[@]}" --output-dir dist -q
linked="$(now)"
for job in "${jobs[@]}"; do
  read -r model _ <<<"$job"
  "$ctxgen" verify "dist/$(basename "$model" .onnx)_ctx.onnx" --reference "$model" 2>/dev/null | tail -n 1
done

# The same models in one share, without a cache.
models="" shapes=()
for job in "${jobs[@]}"; do
  read -r model dims <<<"$job"
  models="${models:+$models,}$model"
  for d in $dims; do [ "$d" = "--fix-dim" ] || shapes+=(--fix-dim "$(basename "$model" .onnx):$d"); done
done
single_start="$(now)"
"$ctxgen" share "$models" "${shapes[@]}" --output-dir single -q
single_end="$(now)"
same="the same files, byte for byte" status=0
for f in single/*; do cmp -s "$f" "dist/$(basename "$f")" || { same="DIFFERENT files ($f)"; status=1; }; done
awk -v a="$start" -v b="$compiled" -v c="$linked" -v d="$single_start" -v e="$single_end" -v same="$same" -v n="${#jobs[@]}" \
  'BEGIN { printf "%d compile jobs in parallel %.2f s + link %.2f s = %.2f s; one share %.2f s; link and share wrote %s\n", n, b - a, c - b, c - a, e - d, same }'
exit "$status"
