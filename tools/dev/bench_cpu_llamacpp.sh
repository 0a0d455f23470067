#!/usr/bin/env bash
# llama.cpp's CPU figures beside Ember's on this machine (the cpu target's peer, docs/results/cpu_bench_*.json).
# Builds llama-bench and llama-batched-bench once for the CPU from the llama-cpp-python 0.3.36 sdist (its
# vendor/llama.cpp), cached outside the repository, then runs them on each GGUF given:
#   tools/dev/bench_cpu_llamacpp.sh build
#   tools/dev/bench_cpu_llamacpp.sh run OUT_DIR MODEL.gguf...   (OUT_DIR/<model>.bench.json, .batched.jsonl)
#   tools/dev/bench_cpu_llamacpp.sh compare OUT_DIR NAME...      (`ember bench` of each known model NAME, then
#       llama.cpp on its GGUF, back to back: OUT_DIR/<name>.ember.json, .ember1024.json, .bench.json, .batched.jsonl;
#       tools/dev/cpu_bench_table.py turns them into one JSON + table)
# THREADS (default: every core), GEN (decode tokens, default 32), REPS (default 2) tune the run.
set -euo pipefail
CACHE="${EMBER_LLAMACPP_CPU:-$HOME/.cache/ember/llama.cpp-cpu}"
SDIST_DIR="${EMBER_LLAMACPP_SDIST:-$HOME/.cache/ember/llamacpp-sdist}"
VERSION=0.3.36
BIN="$CACHE/build/bin"

build() {
  if [ -x "$BIN/llama-bench" ] && [ -x "$BIN/llama-batched-bench" ]; then return; fi
  mkdir -p "$CACHE" "$SDIST_DIR"
  local archive="$SDIST_DIR/llama_cpp_python-$VERSION.tar.gz"
  if [ ! -f "$archive" ]; then
    python3 -m pip download --no-binary :all: --no-deps "llama-cpp-python==$VERSION" -d "$SDIST_DIR" >&2
  fi
  local src="$CACHE/llama_cpp_python-$VERSION/vendor/llama.cpp"
  [ -f "$src/CMakeLists.txt" ] || tar xzf "$archive" -C "$CACHE" "llama_cpp_python-$VERSION/vendor/llama.cpp"
  cmake -S "$src" -B "$CACHE/build" -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF >&2
  cmake --build "$CACHE/build" --target llama-bench llama-batched-bench -j "$(nproc)" >&2
}

run() {
  local out="$1"; shift
  local threads="${THREADS:-$(nproc)}" gen="${GEN:-32}" reps="${REPS:-2}"
  mkdir -p "$out"
  for model in "$@"; do
    local name; name="$(basename "$model" .gguf)"
    # batch-1 decode (tg) and prefill at 128 and 1,024 tokens (pp)
    "$BIN/llama-bench" -m "$model" -t "$threads" -fa 1 -r "$reps" -p 128,1024 -n "$gen" -o json \
      > "$out/$name.bench.json"
    # aggregate decode of 4 and 16 concurrent sequences (a 128-token prompt each, then $gen tokens)
    "$BIN/llama-batched-bench" -m "$model" -t "$threads" -fa on -c $((16 * (128 + gen))) -b 2048 -ub 512 \
      -npp 128 -ntg "$gen" -npl 1,4,16 --output-format jsonl > "$out/$name.batched.jsonl" 2>/dev/null
  done
}

compare() {
  local out="$1"; shift
  local root; root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
  mkdir -p "$out"
  for name in "$@"; do
    # batch-1 decode, prefill at 128 (c=1's time to first token), aggregate decode at 4 and 16 requests
    "$root/tools/ember" bench --model "$name" --concurrency 1 4 16 --prompt-tokens 128 --output-tokens 32 \
      ${PRECISION:+--precision "$PRECISION"} > "$out/$name.ember.json"
    "$root/tools/ember" bench --model "$name" --concurrency 1 --prompt-tokens 1024 --output-tokens 4 \
      ${PRECISION:+--precision "$PRECISION"} > "$out/$name.ember1024.json"
    run "$out" "$HOME/.cache/ember/models/$name-q4_k_m.gguf"
    mv "$out/$name-q4_k_m.bench.json" "$out/$name.bench.json"
    mv "$out/$name-q4_k_m.batched.jsonl" "$out/$name.batched.jsonl"
  done
}

case "${1:-}" in
  build) build ;;
  run) shift; build; run "$@" ;;
  compare) shift; build; compare "$@" ;;
  *) echo "usage: $0 build | run OUT_DIR MODEL.gguf... | compare OUT_DIR NAME..." >&2; exit 2 ;;
esac
