#!/usr/bin/env bash
# What Ember runs on the H200 device machine (the `device` tool: the working tree is the current folder,
# results go to $OUT, packed into $OUT/results-<sections>.tgz at the end; each call at most 10 minutes):
#   tools/dev/h200_run.sh tests      GPU kernel + engine tests (hypothesis statistics), JAX on cuda and cpu
#   tools/dev/h200_run.sh hybrid-kernels  Gated DeltaNet / MoE kernel GPU tests, then tools/dev/bench_hybrid_kernels.py
#   tools/dev/h200_run.sh det-ops    per-op row-count invariance of a deterministic step's ops (norms, RoPE, sampler)
#   tools/dev/h200_run.sh quant-gemm the many-rows quantized GEMM against the dense bf16 copy (bench_quant_gemm)
#   tools/dev/h200_run.sh gpu-suite  every GPU test file at once, WORKERS pytest-xdist processes sharing the GPU; the
#                                counts as JSON (tools/dev/gpu_test_counts.py)
#   tools/dev/h200_run.sh kernels-quick  RoPE / norm kernel GPU tests (a failure turns the kernel off), Q4_K GEMV tests
#   tools/dev/h200_run.sh invariant-matmul the batch-invariant matmul: GPU test, invariance and time against cuBLAS
#   tools/dev/h200_run.sh invariant-packed the batch-invariant matmul on packed GGUF weights: bits and time vs dense, default
#   tools/dev/h200_run.sh invariant-sweep the batch-invariant matmul's launch configs per row count (FORM dense / packed)
#   tools/dev/h200_run.sh int-invariant the integer-sum invariant matmul: GPU test, then bits and time vs dense, default
#   tools/dev/h200_run.sh det-bench  default vs deterministic engine figures (MODELS, STREAMS, PROMPT)
#   tools/dev/h200_run.sh engine-tests   GPU engine tests: h200 vs cpu agreement, deterministic mode, quantized model
#   tools/dev/h200_run.sh real-weights   h200 vs cpu agreement on the real checkpoints cut small (.gpu/real/<name>.gguf)
#   tools/dev/h200_run.sh quick-1.5b / quick-8b-q4  batch 1 (CONTEXTS, default 128) and a few stream counts, Q4_K_M
#   tools/dev/h200_run.sh quick-70b-q4 Llama-3-70B Q4_K_M without dense copies: batch 1, 8-64 streams, prefill 4k
#   tools/dev/h200_run.sh suite-8b   bench suite, Llama-3-8B shape: bf16 and FP8 (per-channel)
#   tools/dev/h200_run.sh quick-8b / quick-8b-fp8  the bf16 / FP8 8B at batch 1 (CONTEXTS) and STREAMS8 streams
#   tools/dev/h200_run.sh fp8-check  FP8 GEMV GPU tests, then the 8B FP8 step alone: byte vs word loop
#   tools/dev/h200_run.sh dense-check the dense bf16 GEMV: GPU tests (kernels, 8B decode vs XLA), then the 8B step alone A/B/A/B
#   tools/dev/h200_run.sh suite-8b-q4 bench suite, Llama-3-8B shape, Q4_K_M kept quantized
#   tools/dev/h200_run.sh suite-1.5b bench suite, Qwen2.5-1.5B Q4_K_M kept quantized (no startup: startup-1.5b)
#   tools/dev/h200_run.sh suite-1.5b-dequant  the same 1.5B Q4_K_M file on the h200 default (GGUF dequantized at load)
#   tools/dev/h200_run.sh batch1-8b  batch-1 decode at every context, Llama-3-8B shape bf16 and FP8
#   tools/dev/h200_run.sh startup-8b cold compile and warm start of the 8B engine (fresh processes)
#   tools/dev/h200_run.sh startup-calls one startup child of the 8B engine per call, caches kept in .gpu-cache/
#   tools/dev/h200_run.sh serve-startup `ember serve` on a synthetic 8B Q4_K_M GGUF file: cold, then warm starts
#   tools/dev/h200_run.sh llamacpp   llama.cpp built from .whl/llama.cpp-trimmed.tar.xz, same layouts
#   tools/dev/h200_run.sh hf         HF transformers (static cache + torch.compile), batch 1 and 32
#   tools/dev/h200_run.sh hf-ratio   HF transformers and Ember's engine on one shape (MODEL) in one suite run: the ratio
#   tools/dev/h200_run.sh rows       quantized GEMV GPU tests, then the rows kernels' config sweep (q4_k, q6_k; m = 1)
#   tools/dev/h200_run.sh gemv-graphs the rows kernels' configs timed inside CUDA graphs (tools/dev/tune_gemv_graphs.py)
#   tools/dev/h200_run.sh dp4a-ab    Q4_K on int8 activations: GPU tests, then the batch-1 step with and without it
#   tools/dev/h200_run.sh dp4a-q6    Q6_K on the dp4a kernel: GPU tests, plan-alone A/B, batch-1 decode (1.5B)
#   tools/dev/h200_run.sh fused-check the fused decode launches: GPU tests, quantized model test, batch-1 step alone
#   tools/dev/h200_run.sh plan-alone the batch-1 step alone per model (MODELS), A/B over kernel policy VARIANTS
#   tools/dev/h200_run.sh kv-fp8     8B bf16 batch-1 decode at long contexts, KV pools bf16 then FP8 (CONTEXTS)
#   tools/dev/h200_run.sh engine-profile the batch-1 engine under the profiler (idle gaps), then the plan alone
#   tools/dev/h200_run.sh combine-check decode attention GPU tests, then the batch-1 step without / with the attention's int8 output
#   tools/dev/h200_run.sh rope-check RoPE-fused decode partials: GPU test, then the batch-1 step without / with them
#   tools/dev/h200_run.sh dp4a-rows  16 / 32 streams, the dp4a GEMV up to 64 rows vs its default bound
#   tools/dev/h200_run.sh norms-ab   RMSNorm kernels: GPU test, then the batch-1 step with and without them
#   tools/dev/h200_run.sh profile    where a batch-1 decode step's time goes: 1.5B Q4_K_M and 8B bf16
#   tools/dev/h200_run.sh spec-bench speculative decoding (tools/dev/bench_speculative_gpu.py): verify step cost at k = 0..8,
#                                the 0.5B draft's step, batch-1 speedup replaying the CPU's acceptance, 8 / 32 / 128 streams
#   tools/dev/h200_run.sh xla-flags  the batch-1 decode step (plan alone) under XLA fusion flag sets, 1.5B Q4_K_M and 8B
# Once per checkout, here (both ignored; the device tool's run carries them: carry [".whl", ".gpu"]):
#   python3.12 -m pip download --no-deps gguf llguidance -d .whl      wheels the device image lacks
#   (serve-startup also needs sanic's: python3.12 -m pip download --no-deps --only-binary=:all: --python-version 3.12
#    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 -d .whl sanic==25.12.1
#    sanic-routing==23.12.0 tracerite==2.6.5 html5tagger==2.0.0 httptools==0.9.0 websockets==17.4 ujson aiofiles
#    "multidict<7" uvloop "jsonschema>=4.20" jsonschema-specifications referencing rpds-py attrs prometheus-client,
#    with --platform manylinux2014_x86_64 added: the server's imports the image lacks)
#   python -m ember.tools.dev.make_bench_tokenizer .gpu/tok               the synthetic models' stand-in tokenizer
#   the real checkpoints cut small (gpu-suite, real-weights; one at a time fits the 64 MiB the tree may carry):
#     python -m ember.tools.dev.truncate_gguf <qwen2.5-coder-1.5b-instruct GGUF> --layers 1 --vocab 8192 \
#       --out .gpu/real/qwen2.5-coder-1.5b-instruct.gguf
#     python -m ember.tools.dev.truncate_gguf <gemma-3-270m GGUF> --layers 12 --vocab 8192 --out .gpu/real/gemma-3-270m.gguf
#   (the GGUF paths: python -c "from ember.runtime.loading.known_models import resolve_model as r; print(r('<name>'))")
#   the GGUF files (llamacpp, serve-startup) need a BPE tokenizer.json: the default model's, written by
#   python -c "from ember.runtime.loading.checkpoint import open_checkpoint as o; from ember.runtime.loading.text.prompting import \
#     load_tokenizer as t; t(o('<the default model's GGUF>')).backend.save('.gpu/bpe-tok/tokenizer.json')"
#   (llamacpp: tools/dev/trim_llamacpp_source.sh .whl/llama.cpp-trimmed.tar.xz)
# Several sections run in order: tools/dev/h200_run.sh rows profile
# COMMIT=<sha> names the commit the figures belong to (the copy's git metadata is stale); TAG=<suffix> names
# the quick sections' folders and the archive apart, for a second run of the same section in one call.
# What $OUT holds comes back as $OUT/results.tgz (PACK=0: the files themselves).
# Kernel choices are the h200 kernel policy's (compiler/targets/policy.py, docs/kernel_policy.md): POLICY holds
# family.field=value overrides (comma-separated) over it for a section's runs, VARIANTS the A/B's sides.
set -uo pipefail
[ $# -gt 0 ] || { echo "usage: $0 SECTION..." >&2; exit 2; }
commit=${COMMIT:-unknown}
out=${OUT:?OUT must be set}
# Ember from source on the image's own packages; wheels the image lacks (gguf, llguidance) from .whl/
mkdir -p /tmp/site /tmp/pkg/ember
pip install -q --no-deps --target /tmp/site .whl/*.whl >/dev/null 2>&1
for d in compiler runtime tools specs generated server; do ln -sfn "$PWD/$d" "/tmp/pkg/ember/$d"; done
export PYTHONPATH=/tmp/site:/tmp/pkg PYTHONUNBUFFERED=1 JAX_PLATFORMS=${JAX_PLATFORMS:-cuda}
GGUF_PACKED='weights.quantized_formats=["q4_k","q6_k","q8_0"]'  # GGUF blocks kept packed (with dense copies)
OFF=""  # overrides a failed GPU test adds for the later sections (its kernel off)
policy_file() {  # policy_file [FAMILY.FIELD=VALUE,...] -> a JSON override file with OFF and those fields
    local file="$out/policy-$(echo "$OFF,${1:-}" | md5sum | cut -c1-10).json"
    python3 -c "import json, sys; from ember.compiler.targets.policy import parse_assignments as p; \
json.dump(p(sys.argv[1]), open(sys.argv[2], 'w'))" "$OFF,${1:-}" "$file" && echo "$file"
}
suite() {  # suite OUTDIR DEADLINE_S MODEL... (extra flags in SUITE_FLAGS); a section started before the
    # deadline gets up to 60 s more (bench_suite.remaining_timeout), so the kill comes 90 s after it
    local dir=$1 deadline=$2; shift 2
    timeout $((deadline + 90)) python3 -m ember.tools.cli bench --suite --target h200 --tokenizer .gpu/tok \
        --out "$out/$dir" --commit "$commit" --models "$@" --lazy-compile --deadline-s "$deadline" \
        --kernel-policy "$(policy_file "${POLICY:-}")" ${SUITE_FLAGS:-} > "$out/$dir.log" 2>&1
    grep -h "decode\|prefill\|TTFT\|error" "$out/$dir/bench.md" 2>/dev/null | head -40
}
plan_alone() {  # profile_step --plan-only per synthetic model in MODELS, one engine per VARIANTS entry (MAXLEN:
    # the engine's max_model_len, default prompt + output; CONTEXT: the decode rows' context, default padding rows)
    for model in ${MODELS:-qwen2.5-1.5b-q4_k_m}; do
        JAX_PLATFORMS=cuda timeout ${PLAN_S:-150} python3 -m ember.tools.dev.profile_step \
            --kernel-policy "$(policy_file "$GGUF_PACKED")" \
            --model synthetic:$model --tokenizer .gpu/tok --concurrency ${CONCURRENCY:-1} --plan-only \
            ${MAXLEN:+--max-model-len $MAXLEN} ${CONTEXT:+--context $CONTEXT} ${VARIANTS:+--variants $VARIANTS} > "$out/plan_alone_$model.json" 2> "$out/plan_alone_$model.log" \
            || tail -n 3 "$out/plan_alone_$model.log"
        grep -h "variant\|multi_async\|profiled_" "$out/plan_alone_$model.json"
    done
}
real_files() {  # EMBER_TRUNCATED_GGUF for tests/test_gpu_engine_real_weights.py: name=path per .gpu/real/<name>.gguf
    local f items=()
    for f in .gpu/real/*.gguf; do [ -e "$f" ] && items+=("$(basename "$f" .gguf)=$f"); done
    (IFS=,; echo "${items[*]}")
}
for section in "$@"; do
case $section in
tests)
    export JAX_PLATFORMS=cuda,cpu  # the agreement test compares with the cpu target on the CPU backend
    timeout 330 python -m pytest -q -m gpu tests/kernels/attention/test_attention_gpu.py tests/kernels/attention/test_attention_prefill_gpu.py \
        tests/kernels/gguf_gemv/test_quant_matmul_gpu.py tests/kernels/norm/test_norm_kernels_gpu.py tests/kernels/rope/test_rope_write_gpu.py tests/kernels/split_columns/test_split_columns_gpu.py tests/kernels/dense_gemv/test_dense_gemv_gpu.py -p no:cacheprovider \
        --hypothesis-show-statistics > "$out/gpu_kernel_tests.log" 2>&1
    timeout 240 python -m pytest -q -m gpu tests/test_gpu_engine.py tests/test_quant_model_gpu.py \
        -p no:cacheprovider > "$out/gpu_engine_tests.log" 2>&1
    tail -n 5 "$out"/gpu_*.log ;;
hybrid-kernels)  # Gated DeltaNet and MoE kernels: GPU tests, then kernel vs reference at the checkpoints' shapes
    export JAX_PLATFORMS=cuda,cpu
    timeout ${HYB_TEST_S:-240} python -m pytest -q -m gpu tests/kernels/gated_delta/test_gated_delta_gpu.py \
        tests/kernels/moe/test_moe_gpu.py tests/kernels/moe/test_moe_packed_gpu.py -p no:cacheprovider -rfE \
        > "$out/gpu_hybrid_kernel_tests.log" 2>&1
    tail -n 5 "$out/gpu_hybrid_kernel_tests.log"
    timeout ${HYB_BENCH_S:-300} python -m ember.tools.dev.bench_hybrid_kernels ${BENCH_FLAGS:-} --out "$out/hybrid_kernels_$commit.json" ;;
det-ops)  # which op of a deterministic step rounds a row by the rows beside it (tests/test_deterministic_ops_gpu.py)
    JAX_PLATFORMS=cuda timeout ${DET_OPS_S:-150} python -m pytest -q -m gpu tests/test_deterministic_ops_gpu.py \
        -p no:cacheprovider -rfE > "$out/gpu_deterministic_ops.log" 2>&1; tail -n 15 "$out/gpu_deterministic_ops.log" ;;
quant-gemm)  # the many-rows GEMM over packed GGUF blocks vs the dense bf16 copy and in-step dequantization
    timeout ${GEMM_S:-200} python3 -m ember.tools.dev.bench_quant_gemm ${GEMM_FLAGS:-} --out "$out/quant_gemm_$commit.json" \
        2>&1 | tee "$out/quant_gemm.log" | grep -v Warning | tail -n 40 ;;
gpu-suite)  # (GPU_FILES: these test files only) needs pytest-xdist and execnet wheels in .whl/ (python3.12 -m pip download --no-deps pytest-xdist execnet)
    export JAX_PLATFORMS=cuda,cpu XLA_PYTHON_CLIENT_PREALLOCATE=false  # workers share the GPU's memory
    EMBER_TRUNCATED_GGUF=$(real_files) EMBER_GPU_RESULTS="$out/gpu_engine_tests.json" timeout ${SUITE_TEST_S:-540} \
        python -m pytest -q -m gpu ${GPU_FILES:-tests/*_gpu.py tests/kernels/*/*_gpu.py tests/test_gpu_engine.py tests/test_gpu_engine_real_weights.py} -n ${WORKERS:-8} -p no:cacheprovider --hypothesis-show-statistics \
        -rfE --junitxml="$out/gpu_suite.xml" > "$out/gpu_suite.log" 2>&1
    python3 -m ember.tools.dev.gpu_test_counts --junit "$out/gpu_suite.xml" --log "$out/gpu_suite.log" \
        --commit "$commit" --out "$out/gpu_suite_counts.json"
    tail -n 15 "$out/gpu_suite.log"; python3 -c "import json; print(json.load(open('$out/gpu_suite_counts.json'))['totals'])" ;;
kernels-quick)  # the RoPE and norm kernels' GPU tests (a failure turns that kernel off for later sections),
    # then the quantized GEMV GPU tests of Q4_K for as long as QUANT_TEST_S allows
    export JAX_PLATFORMS=cuda,cpu
    for t in rope_write norm_kernels; do
        timeout 100 python -m pytest -q -m gpu tests/test_${t}_gpu.py -p no:cacheprovider > "$out/gpu_$t.log" 2>&1 \
            || { echo "$t GPU test failed: its kernel is off below"; [ $t = rope_write ] && OFF="$OFF,attention.fused_rope=false"; \
                 [ $t = norm_kernels ] && OFF="$OFF,norms.triton=false"; }
        tail -n 1 "$out/gpu_$t.log"
    done
    timeout ${QUANT_TEST_S:-60} python -m pytest -q -m gpu tests/kernels/gguf_gemv/test_quant_matmul_gpu.py -k q4_k -p no:cacheprovider \
        > "$out/gpu_quant_q4_k.log" 2>&1; tail -c 300 "$out/gpu_quant_q4_k.log"; echo ;;
invariant-matmul)  # the batch-invariant matmul: GPU test, then invariance and time against cuBLAS per projection
    timeout 200 python -m pytest -q -m gpu tests/kernels/invariant_matmul/test_invariant_matmul_gpu.py -p no:cacheprovider \
        > "$out/gpu_invariant_matmul.log" 2>&1; tail -n 3 "$out/gpu_invariant_matmul.log"
    timeout ${BENCH_S:-300} python3 -m ember.tools.dev.bench_invariant_matmul --out "$out/invariant_matmul_$commit.json" \
        2>&1 | tee "$out/invariant_matmul.log" | grep -v Warning ;;
invariant-packed)  # the batch-invariant matmul reading packed GGUF weights: GPU test, then bits and time per call
    # against the same kernel over the dense copy and against the default path (BENCH_FLAGS: the script's flags)
    timeout ${TEST_S:-200} python -m pytest -q -m gpu tests/kernels/invariant_matmul/test_invariant_matmul_gpu.py -p no:cacheprovider \
        -rfE > "$out/gpu_invariant_matmul.log" 2>&1; tail -n 5 "$out/gpu_invariant_matmul.log"
    timeout ${BENCH_S:-300} python3 -m ember.tools.dev.bench_invariant_packed ${BENCH_FLAGS:-} --out "$out/invariant_packed_$commit.json" \
        2>&1 | tee "$out/invariant_packed.log" | grep -v Warning ;;
invariant-sweep)  # launch configs of the batch-invariant matmul per row count (FORM packed or dense, ROWS, SHAPES):
    # time per call and whether each keeps the default config's bits (a row's bits followed k_split alone at f5e4933)
    timeout ${BENCH_S:-400} python3 -m ember.tools.dev.sweep_invariant_packed --form ${FORM:-dense} --rows ${ROWS:-1 8 64} \
        --shapes ${SHAPES:-1.5b} --out "$out/invariant_sweep_${FORM:-dense}_$commit.json" 2>&1 | grep -v Warning ;;
int-invariant)  # the integer-sum invariant matmul (compiler/kernels/int_invariant/): GPU test (GEMV = GEMM bits at every
    # row count), then bits and time per call against the dense invariant matmul and the default path (BENCH_FLAGS)
    JAX_PLATFORMS=cuda,cpu timeout ${TEST_S:-240} python -m pytest -q -m gpu tests/kernels/int_invariant/test_int_invariant_gpu.py -p no:cacheprovider \
        -rfE > "$out/gpu_int_invariant.log" 2>&1; tail -n 8 "$out/gpu_int_invariant.log"
    timeout ${BENCH_S:-300} python3 -m ember.tools.dev.bench_int_invariant ${BENCH_FLAGS:-} --out "$out/int_invariant_$commit.json" \
        2>&1 | tee "$out/int_invariant.log" | grep -v Warning ;;
det-bench)  # default vs deterministic through the engine (ember bench, JSON per run): MODELS at STREAMS, PROMPT tokens
    # (POLICY=deterministic.int8_blocks=true: a policy field over both modes; MODES=deterministic: that mode alone)
    for model in ${MODELS:-qwen2.5-1.5b-q4_k_m llama3-8b}; do
        for mode in ${MODES:-default deterministic}; do
            name="det_bench_${model}_p${PROMPT:-256}_$mode"
            timeout ${DET_S:-240} python3 -m ember.tools.cli bench --model synthetic:$model --tokenizer .gpu/tok --target h200 \
                --concurrency ${STREAMS:-1 8 32 128} --prompt-tokens ${PROMPT:-256} --output-tokens ${OUTPUT:-128} \
                $([ $mode = deterministic ] && echo --deterministic) --kernel-policy "$(policy_file "$GGUF_PACKED,${POLICY:-}")" \
                > "$out/$name.json" 2> "$out/$name.log" || tail -n 3 "$out/$name.log"
            python3 -c "import json, sys; d = json.load(open(sys.argv[1])); print(sys.argv[2], [(r['concurrency'], \
r['decode_tokens_per_s'], r['ttft_p50_s']) for r in d['runs']])" "$out/$name.json" "$name" 2>/dev/null
        done
    done ;;
engine-tests)  # h200 vs cpu target agreement, deterministic bit-exactness, quantized model (figures: JSON)
    JAX_PLATFORMS=cuda,cpu EMBER_GPU_RESULTS="$out/gpu_engine_tests.json" timeout ${ENGINE_TEST_S:-240} \
        python -m pytest -q -m gpu tests/test_gpu_engine.py tests/test_quant_model_gpu.py -p no:cacheprovider \
        > "$out/gpu_engine_tests.log" 2>&1; tail -n 3 "$out/gpu_engine_tests.log"; cat "$out/gpu_engine_tests.json" ;;
real-weights)  # the h200 target vs the cpu target on each real checkpoint cut small in .gpu/real/ (figures: JSON)
    JAX_PLATFORMS=cuda,cpu EMBER_TRUNCATED_GGUF=$(real_files) EMBER_GPU_RESULTS="$out/gpu_real_weights.json" \
        timeout ${ENGINE_TEST_S:-300} python -m pytest -q -m gpu tests/test_gpu_engine_real_weights.py -p no:cacheprovider \
        > "$out/gpu_real_weights.log" 2>&1; tail -n 5 "$out/gpu_real_weights.log"; cat "$out/gpu_real_weights.json" ;;
quick-1.5b)  # 1.5B Q4_K_M kept quantized: batch 1 at CONTEXTS (128), STREAMS (1 / 8 / 32) streams
    POLICY="$GGUF_PACKED" SUITE_FLAGS="--no-hf --sections context concurrency --contexts ${CONTEXTS:-128} \
        --context-decode-tokens 128 --concurrency ${STREAMS:-1 8 32}" suite quick15${TAG:-} ${DEADLINE:-90} synthetic:qwen2.5-1.5b-q4_k_m ;;
quick-8b-q4)  # 8B Q4_K_M kept quantized: batch 1 at CONTEXTS (128), STREAMS8 (8 / 32) streams
    POLICY="$GGUF_PACKED" SUITE_FLAGS="--no-hf --sections context concurrency --contexts ${CONTEXTS:-128} \
        --context-decode-tokens 128 --concurrency ${STREAMS8:-8 32}" suite quick8b-q4${TAG:-} ${DEADLINE8:-110} synthetic:llama3-8b-q4_k_m ;;
quick-70b-q4)  # Llama-3-70B Q4_K_M on one GPU, kept packed without dense copies (with them ~181 GB: the loader leaves
    # them out, weights.dense_copies_max_share): batch 1 at CONTEXTS (128 4096), STREAMS70 (8 32 64), prefill of 4,096
    POLICY="$GGUF_PACKED" SUITE_FLAGS="--no-hf --sections context prefill concurrency --contexts ${CONTEXTS:-128 4096} \
        --context-decode-tokens 64 --prefill-lengths 4096 --concurrency ${STREAMS70:-8 32 64}" \
        suite quick70b-q4${TAG:-} ${DEADLINE70:-400} synthetic:llama3-70b-q4_k_m ;;
fp8-check)  # the FP8 GEMV's GPU tests (every loop, the parts and gate/up epilogue kernels), then the 8B FP8
    # step alone with the byte loop vs the word loop (fp8_gemv.words)
    export JAX_PLATFORMS=cuda,cpu
    timeout ${FP8_TEST_S:-200} python -m pytest -q -m gpu tests/kernels/dense_gemv/test_fp8_gemv_gpu.py -p no:cacheprovider \
        > "$out/gpu_fp8_gemv_tests.log" 2>&1
    tail -n 3 "$out/gpu_fp8_gemv_tests.log"
    JAX_PLATFORMS=cuda timeout ${PLAN_S:-150} python3 -m ember.tools.dev.profile_step --model synthetic:llama3-8b-fp8 \
        --tokenizer .gpu/tok --concurrency 1 --plan-only --kernel-policy "$(policy_file)" \
        --variants fp8_gemv.words=false fp8_gemv.words=true \
        > "$out/plan_alone_fp8.json" 2> "$out/plan_alone_fp8.log" || tail -n 3 "$out/plan_alone_fp8.log"
    grep -h "variant\|multi_async\|profiled_" "$out/plan_alone_fp8.json" ;;
dense-check)  # the dense bf16 GEMV's GPU tests (kernels, then 48 decode steps of the 8B against XLA's GEMMs),
    # then the 8B bf16 step alone with it and without it, A/B/A/B (bench geometry: max_model_len 16,528, context 128)
    export JAX_PLATFORMS=cuda,cpu
    timeout ${DENSE_TEST_S:-200} python -m pytest -q -s -m gpu tests/kernels/dense_gemv/test_dense_gemv_gpu.py -p no:cacheprovider \
        > "$out/gpu_dense_gemv_tests.log" 2>&1
    grep -h "dense GEMV vs XLA" "$out/gpu_dense_gemv_tests.log"; tail -n 1 "$out/gpu_dense_gemv_tests.log"
    JAX_PLATFORMS=cuda timeout ${PLAN_S:-200} python3 -m ember.tools.dev.profile_step --model synthetic:llama3-8b \
        --tokenizer .gpu/tok --concurrency 1 --plan-only --max-model-len 16528 --context 128 \
        --kernel-policy "$(policy_file)" --variants dense_gemv.enabled=true dense_gemv.enabled=false \
        dense_gemv.enabled=true dense_gemv.enabled=false \
        > "$out/plan_alone_dense.json" 2> "$out/plan_alone_dense.log" || tail -n 3 "$out/plan_alone_dense.log"
    grep -h "variant\|multi_async" "$out/plan_alone_dense.json" ;;
quick-8b)  # 8B bf16: batch 1 at CONTEXTS (128), STREAMS8 (8 / 32) streams
    SUITE_FLAGS="--no-hf --sections context concurrency --contexts ${CONTEXTS:-128} --context-decode-tokens 128 \
        --concurrency ${STREAMS8:-8 32}" suite quick8b${TAG:-} ${DEADLINE8:-110} synthetic:llama3-8b ;;
quick-8b-fp8)  # 8B FP8 (per-channel): batch 1 at CONTEXTS (128), STREAMS8 (32) streams
    SUITE_FLAGS="--no-hf --sections context concurrency --contexts ${CONTEXTS:-128} --context-decode-tokens 128 \
        --concurrency ${STREAMS8:-32}" suite quick8b-fp8${TAG:-} ${DEADLINE8:-110} synthetic:llama3-8b-fp8 ;;
suite-8b)
    SUITE_FLAGS="--no-hf --sections context prefill concurrency ttft --concurrency 1 8 32 128 256" \
        suite suite8b 270 synthetic:llama3-8b
    SUITE_FLAGS="--no-hf --sections context prefill concurrency --concurrency 1 32 128" \
        suite suite8b-fp8 240 synthetic:llama3-8b-fp8 ;;
suite-8b-q4)
    POLICY="$GGUF_PACKED" SUITE_FLAGS="--no-hf --sections context prefill concurrency \
        --context-decode-tokens 128 --concurrency 1 32 128" suite suite8b-q4 ${DEADLINE:-240} synthetic:llama3-8b-q4_k_m ;;
suite-1.5b)
    POLICY="$GGUF_PACKED" SUITE_FLAGS="--no-hf --sections context prefill concurrency ttft \
        --context-decode-tokens 128 --concurrency 1 8 32 128 256" suite suite15 ${DEADLINE:-300} synthetic:qwen2.5-1.5b-q4_k_m ;;
suite-1.5b-dequant)  # GGUF weights dequantized to bf16 at load (README, Decisions)
    POLICY='weights.quantized_formats=[]' SUITE_FLAGS="--no-hf --sections context concurrency --contexts ${CONTEXTS:-128 4096} \
        --context-decode-tokens 128 --concurrency ${STREAMS:-1 8 32 128}" suite suite15-dequant ${DEADLINE:-200} \
        synthetic:qwen2.5-1.5b-q4_k_m ;;
startup-1.5b)
    POLICY="$GGUF_PACKED" SUITE_FLAGS="--no-hf --sections startup --concurrency 1 8 32 128 256" \
        suite startup15 ${DEADLINE:-240} synthetic:qwen2.5-1.5b-q4_k_m ;;
kv-fp8)  # batch-1 decode of the 8B bf16 on KV pools of its activation dtype, then on FP8 (e4m3) pools, one run
    for kv in auto fp8; do
        SUITE_FLAGS="--no-hf --sections context --context-decode-tokens 128 --contexts ${CONTEXTS:-4096 16384 32768} \
            --kv-cache-dtype $kv" suite kv-$kv ${DEADLINE:-100} synthetic:llama3-8b
    done ;;
batch1-8b)
    SUITE_FLAGS="--no-hf --sections context --context-decode-tokens 128" suite batch1-8b ${DEADLINE:-100} synthetic:llama3-8b
    [ -n "${SKIP_FP8:-}" ] || SUITE_FLAGS="--no-hf --sections context --context-decode-tokens 128" \
        suite batch1-8b-fp8 ${DEADLINE:-100} synthetic:llama3-8b-fp8 ;;
startup-8b)
    SUITE_FLAGS="--no-hf --sections startup --concurrency 1 8 32" suite startup8b ${DEADLINE:-300} synthetic:llama3-8b ;;
startup-calls)  # the startup section's child (the suite's 8B engine at 1 / 8 / 32 streams) when the cold
    # compile outlasts one call: the JAX and Triton caches live in .gpu-cache/ (ignored, so a warm device machine
    # keeps it between calls); a child killed mid-compile leaves the plans it compiled cached and the next call's
    # child compiles the rest; the first child to finish after that is the cold compile's end, the next one the
    # warm start (fresh process, every plan cached)
    mkdir -p .gpu-cache; export JAX_COMPILATION_CACHE_DIR=$PWD/.gpu-cache TRITON_CACHE_DIR=$PWD/.gpu-cache/triton
    n=$(ls .gpu-cache/child-*.log 2>/dev/null | wc -l)
    begun=$(date +%s.%N)
    timeout ${STARTUP_S:-540} python3 -m ember.tools.bench_processes startup-child --model synthetic:${STARTUP_MODEL:-llama3-8b} \
        --target h200 --tokenizer .gpu/tok --kernel-policy "$(policy_file)" --engine '{"num_blocks": 1057, "max_model_len": 512, "max_num_seqs": 32,
        "max_batched_tokens": 4096, "enable_prefix_caching": false}' > .gpu-cache/child-$n.log 2>&1
    rc=$?
    echo "{\"child\": $n, \"rc\": $rc, \"wall_s\": $(python3 -c "import time; print(round(time.time() - $begun, 1))"), \"result\": $(tail -n 1 .gpu-cache/child-$n.log | grep '^{' || echo null)}" \
        | tee "$out/startup-child-$n.json"
    cp .gpu-cache/child-$n.log "$out/" ;;
serve-startup)  # `ember serve` itself on the 8B Q4_K_M shape (SERVE_MODEL): the synthetic model written as a GGUF
    # file (.gpu-cache/, kept on a warm machine), then fresh `ember serve` processes timed from start to the
    # "Ember is serving" line: the first with empty JAX / Triton caches (cold), the rest warm (SERVE_RUNS, 2)
    mkdir -p .gpu-cache/serve; export JAX_COMPILATION_CACHE_DIR=$PWD/.gpu-cache/serve TRITON_CACHE_DIR=$PWD/.gpu-cache/serve/triton
    gguf=$(timeout 300 python3 -c "from pathlib import Path; from ember.tools.dev.llamacpp_bench import gguf_file; \
        print(gguf_file('synthetic:${SERVE_MODEL:-llama3-8b-q4_k_m}', Path('.gpu-cache'), Path('.gpu/bpe-tok'))[0])" | tail -n 1)
    [ -f "$gguf" ] || { echo "no GGUF file written (needs .gpu/bpe-tok, see the header)"; exit 1; }
    for run in $(seq 0 ${SERVE_RUNS:-2}); do
        begun=$(date +%s.%N)
        python3 -m ember.tools.cli serve --model "$gguf" --target h200 --kernel-policy "$(policy_file "$GGUF_PACKED")" \
            --port $((8180 + run)) > "$out/serve-$run.log" 2>&1 &
        pid=$!
        for _ in $(seq 1 ${SERVE_WAIT_S:-400}); do
            grep -q "Ember is serving\|ember: error" "$out/serve-$run.log" && break
            kill -0 $pid 2>/dev/null || break; sleep 1
        done
        ready=$(python3 -c "import time; print(round(time.time() - $begun, 1))")
        ok=$(curl -s -m 60 http://127.0.0.1:$((8180 + run))/v1/completions -H 'Content-Type: application/json' \
            -d '{"prompt": "1 2 3", "max_tokens": 4, "temperature": 0}' | head -c 200)
        kill $pid; wait $pid 2>/dev/null
        echo "{\"run\": $run, \"ready_s\": $ready, \"serving\": $(grep -c "Ember is serving" "$out/serve-$run.log"), \"line\": \"$(grep -o "loaded in.*compiled in [0-9.]*s" "$out/serve-$run.log")\", \"completion\": $(python3 -c "import json,sys; print(json.dumps(sys.argv[1]))" "$ok")}" \
            | tee "$out/serve-startup-$run.json"
    done ;;
llamacpp)
    timeout 560 python3 -m ember.tools.dev.llamacpp_bench --src .whl/llama.cpp-trimmed.tar.xz --tokenizer .gpu/bpe-tok \
        --models synthetic:qwen2.5-1.5b-q4_k_m synthetic:llama3-8b synthetic:llama3-8b-q4_k_m \
        --out "$out/llamacpp" --commit "$commit" > "$out/llamacpp.log" 2>&1
    cat "$out/llamacpp/llamacpp.md" 2>/dev/null || tail -n 20 "$out/llamacpp.log" ;;
hf)
    SUITE_FLAGS="--sections hf" suite suite-hf 520 synthetic:llama3-8b synthetic:qwen2.5-1.5b-q4_k_m ;;
hf-ratio)  # one suite run: HF on MODEL's shape (bf16), then Ember's engine at 1 and 32 streams (GGUF kept quantized)
    model=${MODEL:-qwen2.5-1.5b-q4_k_m}
    POLICY="$GGUF_PACKED" SUITE_FLAGS="--sections concurrency hf --concurrency ${STREAMS:-1 32}" \
        suite hf-$model ${DEADLINE:-480} synthetic:$model ;;
gemv-graphs)
    JAX_PLATFORMS=cpu OUT=$out/gemv timeout $((${GEMV_BUDGET_S:-420} + 120)) python3 -m ember.tools.dev.tune_gemv_graphs --commit "$commit" \
        --budget-s ${GEMV_BUDGET_S:-420} ${GEMV_FLAGS:-} > "$out/gemv_graphs.log" 2>&1
    tail -n 25 "$out/gemv_graphs.log" ;;
rows)
    timeout ${ROWS_TEST_S:-150} python -m pytest -q -m gpu tests/kernels/gguf_gemv/test_quant_matmul_gpu.py -p no:cacheprovider \
        --hypothesis-show-statistics > "$out/gpu_quant_tests.log" 2>&1
    tail -n 3 "$out/gpu_quant_tests.log"
    OUT=$out/rows timeout $((${ROWS_SWEEP_S:-150} + 60)) python3 -m ember.tools.dev.bench_quant_matmul --rows-sweep \
        --formats q4_k q6_k --m 1 --runs 20 --budget-s ${ROWS_SWEEP_S:-150} > "$out/rows_sweep.log" 2>&1
    grep -E "^(q4_k|q6_k|budget|rows sweep)" "$out/rows_sweep.log" | head -30 ;;
norms-ab)  # the RMSNorm kernels' GPU test, then the batch-1 step (plan alone) with them and with XLA's norms
    timeout 120 python -m pytest -q -m gpu tests/kernels/norm/test_norm_kernels_gpu.py -p no:cacheprovider \
        > "$out/gpu_norm_tests.log" 2>&1; tail -n 2 "$out/gpu_norm_tests.log"
    for norms in true false; do
        timeout 120 python3 -m ember.tools.dev.profile_step --kernel-policy "$(policy_file "$GGUF_PACKED,norms.triton=$norms")" \
            --model synthetic:${MODEL:-qwen2.5-1.5b-q4_k_m} --tokenizer .gpu/tok --concurrency 1 --plan-only \
            > "$out/norms_$norms.json" 2> "$out/norms_$norms.log" || tail -n 3 "$out/norms_$norms.log"
        echo "norms.triton=$norms"; grep -h "async\|sync\|profiled_" "$out/norms_$norms.json"
    done ;;
dp4a-ab)  # the int8-activation Q4_K kernel: its GPU tests, then the batch-1 step (plan alone) with and without it
    JAX_PLATFORMS=cuda,cpu timeout ${QUANT_TEST_S:-90} python -m pytest -q -m gpu tests/kernels/gguf_gemv/test_quant_matmul_gpu.py \
        -k "dp4a or q4_k" -p no:cacheprovider > "$out/gpu_dp4a_tests.log" 2>&1; tail -c 400 "$out/gpu_dp4a_tests.log"; echo
    for dp4a in '["q4_k","q6_k"]' '[]'; do
        name=$(echo "$dp4a" | tr -d '[]",'); name=${name:-none}
        timeout 120 python3 -m ember.tools.dev.profile_step \
            --kernel-policy "$(policy_file "$GGUF_PACKED,quant_gemv.dp4a_formats=$dp4a")" \
            --model synthetic:${MODEL:-qwen2.5-1.5b-q4_k_m} --tokenizer .gpu/tok --concurrency ${CONCURRENCY:-1} \
            --plan-only > "$out/dp4a_$name.json" 2> "$out/dp4a_$name.log" || tail -n 3 "$out/dp4a_$name.log"
        echo "quant_gemv.dp4a_formats=$dp4a"; grep -h "async\|sync\|profiled_" "$out/dp4a_$name.json"
    done ;;
dp4a-q6)  # Q6_K on the dp4a kernel: GPU tests, the batch-1 step (plan alone) with Q6_K on dp4a or on its float
    # kernel (Q4_K on dp4a in both), then batch-1 decode at context 128 through the engine
    JAX_PLATFORMS=cuda,cpu timeout ${QUANT_TEST_S:-60} python -m pytest -q -m gpu tests/kernels/gguf_gemv/test_quant_matmul_gpu.py \
        -k "dp4a or q6_k" -p no:cacheprovider > "$out/gpu_dp4a_q6_tests.log" 2>&1; tail -c 300 "$out/gpu_dp4a_q6_tests.log"; echo
    for formats in '["q4_k","q6_k"]' '["q4_k"]'; do
        name=$(echo "$formats" | tr -d '[]"' | tr , +)
        timeout 100 python3 -m ember.tools.dev.profile_step \
            --kernel-policy "$(policy_file "$GGUF_PACKED,quant_gemv.dp4a_formats=$formats")" \
            --model synthetic:qwen2.5-1.5b-q4_k_m --tokenizer .gpu/tok --concurrency 1 --plan-only \
            > "$out/dp4a_$name.json" 2> "$out/dp4a_$name.log" || tail -n 3 "$out/dp4a_$name.log"
        echo "quant_gemv.dp4a_formats=$formats"; grep -h "multi_async\|profiled_" "$out/dp4a_$name.json"
    done
    POLICY="$GGUF_PACKED" SUITE_FLAGS="--no-hf --sections context --contexts 128 \
        --context-decode-tokens 128" suite batch1-15 ${DEADLINE:-45} synthetic:qwen2.5-1.5b-q4_k_m ;;
fused-check)  # the fused decode launches (norms writing int8 activations: norms.fused_quant, the default;
    # q/k/v parts with their bias; the SiLU-gated quantizer): their GPU tests (a failed norm test turns that
    # fusion off below), the whole
    # quantized model's Triton-vs-reference test, then the batch-1 step (plan alone, MODELS) with and without it
    export JAX_PLATFORMS=cuda,cpu
    fused=1
    timeout 90 python -m pytest -q -m gpu tests/kernels/norm/test_norm_kernels_gpu.py -k int8 -p no:cacheprovider \
        > "$out/gpu_norm_quant_tests.log" 2>&1 || { echo "norm + quantize GPU test failed: fusion off below";
                                                   fused=0; OFF="$OFF,norms.fused_quant=false"; }
    tail -n 1 "$out/gpu_norm_quant_tests.log"
    timeout ${QUANT_TEST_S:-90} python -m pytest -q -m gpu tests/kernels/gguf_gemv/test_quant_matmul_gpu.py -k "parts or silu_gated" \
        -p no:cacheprovider > "$out/gpu_fused_tests.log" 2>&1; tail -n 2 "$out/gpu_fused_tests.log"
    timeout ${ENGINE_TEST_S:-120} python -m pytest -q -m gpu tests/test_quant_model_gpu.py -p no:cacheprovider \
        > "$out/gpu_quant_model.log" 2>&1; tail -n 2 "$out/gpu_quant_model.log"
    if [ $fused = 1 ]; then VARIANTS="norms.fused_quant=false norms.fused_quant=true" plan_alone
    else plan_alone; fi ;;
combine-check)  # the decode attention GPU tests, then the batch-1 step alone at the bench's table width
    # (max_model_len 16,528: 65 splits) without and with the combine writing the o projection's int8 activations
    # (attention.fused_combine_quant, on by default; a failed test turns it off for later sections)
    export JAX_PLATFORMS=cuda,cpu
    EMBER_ATTENTION_GPU_EXAMPLES=${EXAMPLES:-15} timeout ${ATTN_TEST_S:-150} python -m pytest -q -m gpu \
        tests/kernels/attention/test_attention_gpu.py -p no:cacheprovider > "$out/gpu_attention_tests.log" 2>&1 \
        && fused=1 || { fused=0; OFF="$OFF,attention.fused_combine_quant=false"; \
                        echo "attention GPU tests failed: the attention's int8 output is off"; }
    tail -n 1 "$out/gpu_attention_tests.log"
    export JAX_PLATFORMS=cuda
    [ $fused = 1 ] && MAXLEN=16528 \
        VARIANTS="attention.fused_combine_quant=false attention.fused_combine_quant=true" plan_alone ;;
rope-check)  # RoPE + K/V write inside the decode partials (attention.fused_rope_decode): its GPU test, then the
    # batch-1 step alone at the bench's table width without / with it (MODELS)
    export JAX_PLATFORMS=cuda,cpu
    timeout ${ATTN_TEST_S:-90} python -m pytest -q -m gpu tests/kernels/attention/test_attention_gpu.py -k rope_inside \
        -p no:cacheprovider > "$out/gpu_rope_partials_tests.log" 2>&1 \
        && fused=1 || { fused=0; OFF="$OFF,attention.fused_rope_decode=false"; \
                        echo "RoPE-fused partials GPU test failed: no A/B"; }
    tail -n 1 "$out/gpu_rope_partials_tests.log"
    export JAX_PLATFORMS=cuda
    [ $fused = 1 ] && MAXLEN=16528 \
        VARIANTS="attention.fused_rope_decode=false attention.fused_rope_decode=true" plan_alone ;;
plan-alone)  # the batch-1 step alone (MODELS; VARIANTS: kernel policy overrides A/B'd over the same weights)
    plan_alone ;;
engine-profile)  # the batch-1 engine under the profiler as the bench runs it (max_model_len 16,528, 128 -> 129
    # tokens): wall vs device time per step, where the GPU sat idle, then the plan alone at that table width
    # (DETERMINISTIC=1: the engine in deterministic mode)
    for model in ${MODELS:-qwen2.5-1.5b-q4_k_m}; do
        JAX_PLATFORMS=cuda timeout ${PLAN_S:-150} python3 -m ember.tools.dev.profile_step \
            --kernel-policy "$(policy_file "$GGUF_PACKED")" \
            --model synthetic:$model --tokenizer .gpu/tok --concurrency 1 --max-model-len 16528 --prompt-tokens 128 \
            --output-tokens 129 ${VARIANTS:+--variants $VARIANTS} ${DETERMINISTIC:+--deterministic} > "$out/engine_$model.json" 2> "$out/engine_$model.log" \
            || tail -n 3 "$out/engine_$model.log"
        grep -h "variant\|unprofiled_output\|device_ms_per_step\|idle_ms\|span_ms\|multi_async\|profiled_" "$out/engine_$model.json"
    done ;;
dp4a-rows)  # 16 / 32 streams with the dp4a GEMV taking up to 64 rows vs the default bound (MODEL: 1.5B Q4_K_M)
    for rows in 64 16; do
        POLICY="$GGUF_PACKED,quant_gemv.dp4a_gemv_max_rows=$rows" SUITE_FLAGS="--no-hf --sections concurrency \
            --concurrency ${CONCURRENCY:-16 32}" suite rows$rows ${DEADLINE:-60} synthetic:${MODEL:-qwen2.5-1.5b-q4_k_m}
    done ;;
profile)
    timeout 150 python3 -m ember.tools.dev.profile_step --kernel-policy "$(policy_file "$GGUF_PACKED")" \
        --model synthetic:qwen2.5-1.5b-q4_k_m --tokenizer .gpu/tok --concurrency 1 > "$out/profile15.json" 2> "$out/profile15.log"
    timeout 200 python3 -m ember.tools.dev.profile_step --kernel-policy "$(policy_file)" --model synthetic:llama3-8b --tokenizer .gpu/tok \
        --concurrency 1 > "$out/profile8b.json" 2> "$out/profile8b.log"
    grep -h "tok_s\|per_step" "$out"/profile*.json ;;
spec-bench)  # speculative decoding on synthetic models with the CPU-recorded acceptance replayed: SPEC_BUDGET_S (400)
    # bounds every section together (compile included; a section started in time may overrun: the kill comes 150 s
    # later and the JSON holds what was measured); SPEC_SECTIONS picks some of draft-step e2e verify aggregate;
    # SPEC_FLAGS adds flags (e.g. --verify-models synthetic:llama3-8b-q4_k_m). Compiled executables are kept in
    # .gpu-cache/spec for a later call on the same machine. Exit status 1: a speculative output differed from plain.
    mkdir -p .gpu-cache/spec; export JAX_COMPILATION_CACHE_DIR=$PWD/.gpu-cache/spec
    timeout $((${SPEC_BUDGET_S:-400} + 150)) python3 -m ember.tools.dev.bench_speculative_gpu --target h200 \
        --tokenizer .gpu/tok --kernel-policy "$(policy_file "$GGUF_PACKED")" --commit "$commit" \
        --out "$out/spec_bench_$commit.json" --budget-s ${SPEC_BUDGET_S:-400} ${SPEC_SECTIONS:+--sections $SPEC_SECTIONS} \
        ${SPEC_FLAGS:-} > "$out/spec_bench.log" 2>&1
    echo "spec-bench exit $?"; tail -n 3 "$out/spec_bench.log"
    python3 -c "import json, sys; r = json.load(open(sys.argv[1])); s = r['sections']
print('greedy identical:', r['greedy_identical'], 'skipped:', r['skipped'], 'section_s:', r.get('section_s'))
for m, v in s.get('verify', {}).items(): print('verify', m, v.get('plain_step_ms'), {k: e['ratio_to_plain_step'] for k, e in v['k'].items()})
d = s.get('draft-step', {}); print('draft step', d.get('plain_decode_step_ms'), d.get('proposal_ms'))
for n, e in s.get('e2e', {}).get('runs', {}).items(): print('e2e', n, e['total']['speedup'], (e.get('modeled') or {}).get('speedup'))
for c, e in s.get('aggregate', {}).get('runs', {}).items(): print('streams', c, {k: v.get('ratio') for k, v in e.items() if k != 'plain'})" \
        "$out/spec_bench_$commit.json" ;;
xla-flags)  # XLA_VARIANTS: ';'-separated flag sets (default below); MODELS: synthetic names
    IFS=';' read -ra variants <<< "${XLA_VARIANTS:-;--legacy_command_buffer_custom_call_targets=__gpu\$xla.gpu.triton;--xla_gpu_experimental_enable_command_buffer_on_thunks=true}"
    i=0
    for flags in "${variants[@]}"; do
        i=$((i + 1))
        for model in ${MODELS:-qwen2.5-1.5b-q4_k_m llama3-8b}; do
            XLA_FLAGS="$flags" timeout 100 python3 -m ember.tools.dev.profile_step \
                --kernel-policy "$(policy_file "$GGUF_PACKED")" --model synthetic:$model --tokenizer .gpu/tok --concurrency ${CONCURRENCY:-1} --plan-only \
                > "$out/flags$i-$model.json" 2> "$out/flags$i-$model.log" || tail -n 3 "$out/flags$i-$model.log"
        done
        echo "flags $i: $flags"; grep -h "async\|sync\|profiled_" "$out/flags$i"-*.json
    done ;;
*)
    echo "unknown section $section" >&2; exit 2 ;;
esac
done
# The device tool returns only a few files per call: what this run wrote goes back as one archive,
# results-<sections>.tgz (earlier runs' archives in the same call are left as they are; PACK=0 keeps the files)
if [ "${PACK:-1}" = 1 ]; then
    archive="results-$(echo "$*" | tr ' ' '_')${TAG:-}.tgz"  # the device tool refuses names with '+'
    new=$(cd "$out" && ls -A | grep -v '^results-.*\.tgz$')
    if [ -n "$new" ]; then
        (cd "$out" && tar czf "/tmp/$archive" $new && rm -rf $new && mv "/tmp/$archive" "$archive")
    fi
fi
