"""Run by tests/test_tensor_parallel.py in a subprocess whose JAX sees several host devices (XLA's device count is
fixed when JAX starts): tiny checkpoints on one device and on meshes of several, compared; one JSON line out.

    XLA_FLAGS=--xla_force_host_platform_device_count=8 JAX_PLATFORMS=cpu \
        python tests/tensor_parallel_check.py --case qwen3:2 --case qwen3_moe:4:ep --engine qwen3:2

--case ARCH:N[:ep] (ARCH a tiny fixture, or qwen3_moe_kquant: its Q4_K_M GGUF kept as int8 blocks): greedy
prefill + decode of the fixture's prompt on one device and on N; the logits' largest difference and whether the
greedy tokens agree. --engine ARCH:N: concurrent greedy requests through an engine
whose KV pool is too small for all of them (preemption) on N devices, each request's tokens vs the one-device
run alone. --speculative ARCH:N: the same with n-gram speculative decoding (verify steps); --speculative-draft
ARCH:N with the checkpoint itself as a one-device draft model. --deterministic
ARCH:N: the deterministic engine on N devices, a request alone twice and beside others, bit for bit.
--mesh-error ARCH:N: the error loading on N devices gives. --layouts LAYOUT:N (planes, int8_blocks, fp8): random
weights of that kept layout split over N devices along each axis, their projection (the layout's kernels per
shard) vs the whole weight's, each device's bytes, the collectives, and the splits refused for cutting a block.
--target T: the plans' target (default cpu).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

from engine_support import GREEDY, ByteTokenizer  # noqa: E402
from fixture_data import KQUANT_DIR as KQUANT  # noqa: E402
from fixture_data import kquant_fixture, tiny_fixture  # noqa: E402

from ember.compiler.kernels import kept_shards  # noqa: E402
from ember.compiler.kernels.cpu_gemv import linear as cpu_linear  # noqa: E402
from ember.compiler.kernels.cpu_gemv.layout import BlockQ8Weight, from_quantized  # noqa: E402
from ember.compiler.kernels.dense_gemv.fp8 import Fp8Weight, quantize_fp8  # noqa: E402
from ember.compiler.kernels.gguf_gemv import linear as kept_linear  # noqa: E402
from ember.compiler.kernels.gguf_gemv.layout import QuantizedWeight, pack, random_gguf_bytes  # noqa: E402
from ember.compiler.targets.cpu import CPU, CPU_INT8_BLOCKS  # noqa: E402
from ember.compiler.targets.mesh import MeshConfig  # noqa: E402
from ember.runtime.engine.engine import Engine, EngineConfig  # noqa: E402
from ember.runtime.execution.sequence_runner import SequenceRunner  # noqa: E402
from ember.runtime.loading.device_values import dense_copier  # noqa: E402
from ember.runtime.loading.model import Model, _jitted, load_model  # noqa: E402
from ember.runtime.sampling.params import SamplingParams  # noqa: E402
from ember.runtime.speculative.config import SpeculativeConfig  # noqa: E402

DECODE = 8
COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "collective-permute", "all-to-all")
_MODELS: dict = {}
TARGET = ["cpu"]  # --target: the plans' target (cpu: the reference ops, on whatever devices JAX has)


def _mesh(text: str) -> tuple[str, MeshConfig]:
    arch, size, *rest = text.split(":")
    return arch, MeshConfig(int(size), rest == ["ep"])


def _fixture(arch: str):
    """(checkpoint, reference arrays, kernel policy): KQUANT is the Q4_K_M GGUF kept as int8 blocks on the cpu
    target (its opt-in CPU_INT8_BLOCKS), as the target's own packed layout on another (h200: planes); on a mesh
    the kept weights split along whole blocks."""
    if arch == KQUANT:
        path, arrays, _, _ = kquant_fixture()
        return path, arrays, dataclasses.replace(CPU.policy, weights=CPU_INT8_BLOCKS) if TARGET[0] == "cpu" else None
    path, arrays = tiny_fixture(arch)
    return path, arrays, None


def _model(arch: str, mesh: MeshConfig):
    if (arch, mesh) not in _MODELS:
        path, _, policy = _fixture(arch)
        _MODELS[arch, mesh] = load_model(path, target=TARGET[0], mesh=mesh, kernel_policy=policy)
    return _MODELS[arch, mesh]


def _greedy(model, prompt: list[int], steps: int) -> tuple[list[int], np.ndarray]:
    """(greedy tokens, logits of the prompt's rows then of each decode step)."""
    runner = SequenceRunner(model, len(prompt) + steps)
    logits = runner.prefill(prompt, all_logits=True)
    rows, tokens = [logits], []
    for _ in range(steps):
        tokens.append(int(np.argmax(rows[-1][-1])))
        rows.append(runner.decode(tokens[-1])[None])
    return tokens, np.concatenate(rows)


def step_collectives(model, kv, batch) -> dict[str, int]:
    """How many of each collective XLA put in the compiled step (the partitioner's work, counted in its HLO)."""
    text = _jitted(model.traced(model.plan.module.forward)).lower(model.dims, model.params, kv, batch).compile()
    text = text.as_text()
    counts = {op: len(re.findall(rf"\s{op}(-start)?\(", text)) for op in COLLECTIVES}
    # float tensors gathered whole (a weight the partitioner had to reassemble); integer ones are routing counts
    counts["float all-gather"] = len(re.findall(r"= \(?b?f\d+\[[^\n]*\sall-gather(-start)?\(", text))
    return counts


def _params_bytes(model) -> tuple[int, int]:
    """(bytes of the model's weights on the device holding the most, kept quantized weights split)."""
    weights = [model.params.globals, *model.params.layers]
    kinds = (BlockQ8Weight, QuantizedWeight, Fp8Weight)
    kept = [w for w in jax.tree.leaves(weights, is_leaf=lambda w: isinstance(w, kinds)) if isinstance(w, kinds)]
    return kept_shards.device_bytes(weights), sum(w.split is not None for w in kept)


def check_case(arch: str, mesh: MeshConfig) -> dict:
    prompt = [int(t) for t in _fixture(arch)[1]["input_ids"]]
    single = _model(arch, MeshConfig())
    want_tokens, want = _greedy(single, prompt, DECODE)
    model = _model(arch, mesh)
    device_bytes, kept_split = _params_bytes(model)
    seen = []  # the decode steps' (kv, batch), to count the collectives of one
    model.forward = lambda kv, batch: seen.append((kv, batch)) or Model.forward(model, kv, batch)
    try:
        tokens, got = _greedy(model, prompt, DECODE)
    finally:
        del model.forward
    return {
        "decode_collectives": step_collectives(model, *seen[-1]),
        "layers": int(model.dims.layers),
        "tokens_equal": tokens == want_tokens,
        "max_logit_diff": float(np.abs(got - want).max()),
        "logit_scale": float(np.abs(want).max()),
        "weights_split": model.placement.split_count(),
        "kept_split": kept_split,  # kept quantized weights split along whole blocks
        "kept_whole": sorted(model.placement.kept_whole),  # ... or left whole: a shard would cut a block
        "weight_bytes_share": device_bytes / _params_bytes(single)[0],  # one device's share of the weights
        "devices": sorted({d.id for leaf in jax.tree.leaves(model.params.layers[0]) for d in leaf.sharding.device_set}),
    }


def _prompts(seed: int, count: int) -> list[tuple[list[int], int]]:
    rng = np.random.default_rng(seed)
    return [
        (rng.integers(3, 250, size=int(rng.integers(20, 60))).tolist(), int(rng.integers(12, 24))) for _ in range(count)
    ]


def check_engine(arch: str, mesh: MeshConfig) -> dict:
    cases = _prompts(1, 5)
    single = _model(arch, MeshConfig())
    alone = [_greedy(single, p, m)[0] for p, m in cases]
    # 13 usable blocks of 16 tokens: five requests of up to ~80 tokens cannot all hold their KV at once
    config = EngineConfig(num_blocks=14, max_model_len=96, max_num_seqs=4, max_batched_tokens=32)
    engine = Engine(_model(arch, mesh), ByteTokenizer(), config)
    try:
        streams = [engine.submit(p, SamplingParams(max_tokens=m, **GREEDY)) for p, m in cases]
        results = [[t for o in s.collect()[0] for t in o.token_ids] for s in streams]
        snapshot = engine.snapshot()
        all_back = engine.pool.free_blocks == engine.pool.num_usable_blocks
    finally:
        engine.close()
    return {
        "tokens_equal": results == alone,
        "preemptions": snapshot["preemptions"],
        "blocks_returned": all_back,
        "kv_split": "tp" in str(engine.executor.kv[0][0].sharding.spec) if engine.executor.kv[0] else None,
    }


def check_deterministic(arch: str, mesh: MeshConfig) -> dict:
    target, *others = _prompts(2, 4)
    params = SamplingParams(max_tokens=target[1], logprobs=2, **GREEDY)
    config = EngineConfig(num_blocks=64, max_model_len=128, max_num_seqs=4, max_batched_tokens=64, deterministic=True)
    engine = Engine(_model(arch, mesh), ByteTokenizer(), config)

    def run(with_others: bool):
        streams = [engine.submit(target[0], params)]
        if with_others:
            streams += [engine.submit(p, SamplingParams(max_tokens=m, **GREEDY)) for p, m in others]
        outputs = [s.collect()[0] for s in streams][0]
        return [(t, lp.logprob, lp.top) for o in outputs for t, lp in zip(o.token_ids, o.logprobs)]

    try:
        first, second, loaded = run(False), run(False), run(True)
    finally:
        engine.close()
    return {"run_to_run": first == second, "alone_vs_loaded": first == loaded, "tokens": len(first)}


def check_speculative(arch: str, mesh: MeshConfig, method: str = "ngram") -> dict:
    """n-gram speculation on the mesh (verify steps): repetitive prompts, so drafts are made and accepted; with
    method "draft", the same checkpoint on one device as the draft model."""
    rng = np.random.default_rng(3)
    cases = [((rng.integers(3, 250, size=6).tolist() * 6)[: int(n)], 16) for n in (24, 31, 36)]
    alone = [_greedy(_model(arch, MeshConfig()), p, m)[0] for p, m in cases]
    draft = str(_fixture(arch)[0]) if method == "draft" else None
    spec = SpeculativeConfig(method, num_speculative_tokens=3, draft_model=draft, adaptive=False)
    config = EngineConfig(num_blocks=64, max_model_len=96, max_num_seqs=4, max_batched_tokens=64, speculative=spec)
    engine = Engine(_model(arch, mesh), ByteTokenizer(), config)
    try:
        streams = [engine.submit(p, SamplingParams(max_tokens=m, **GREEDY)) for p, m in cases]
        results = [[t for o in s.collect()[0] for t in o.token_ids] for s in streams]
        stats = engine.speculation_stats()
    finally:
        engine.close()
    return {"tokens_equal": results == alone, "drafted": stats.num_draft_tokens, "accepted": stats.num_accepted_tokens}


def _layout_weights(layout: str) -> dict[str, object]:
    """{name: weight} of one kept layout: Q4_K, Q6_K and Q8_0 (planes, or as int8 blocks; Q5_0 shares Q8_0's
    32-element blocks, left out for time), FP8 per channel and in 128 x 128 blocks; [out, in] sizes that split 2
    and 4 ways in whole blocks, and a Q4_K of one block per row."""
    rng = np.random.default_rng(7)
    if layout == "fp8":
        w = rng.standard_normal((512, 512)).astype(np.float32) * 0.05
        return {"fp8": quantize_fp8(w), "fp8_block": quantize_fp8(w, blocked=True)}
    # q4_k_cut: one 256-element block per row, which a row split would cut (refused)
    shapes = {"q4_k": (128, 1024), "q6_k": (64, 1024), "q8_0": (128, 128), "q4_k_cut": (64, 256)}
    weights = {
        name: jax.device_put(pack(random_gguf_bytes(rng, name[:4], shape, realistic=True), name[:4], shape))
        for name, shape in shapes.items()
    }
    return {fmt: from_quantized(w) for fmt, w in weights.items()} if layout == "int8_blocks" else weights


def check_layouts(layout: str, mesh: MeshConfig) -> dict:
    """Each weight of the layout split along out (column-parallel) and in (row-parallel) over the mesh: its
    projection of 1 and 24 rows vs the whole weight's (the layout's kernels on each device's blocks), the
    largest share of its bytes one device holds, the collectives of the split projection's HLO."""
    from jax.sharding import Mesh

    devices = Mesh(np.array(jax.devices()[: mesh.tensor_parallel]), ("tp",))
    linear = cpu_linear.linear if layout == "int8_blocks" else kept_linear.linear
    step = jax.jit(linear)
    invariant_step = jax.jit(cpu_linear.linear_invariant)  # the deterministic plans' form
    rng = np.random.default_rng(8)
    out, refused = {}, {}
    for name, weight in _layout_weights(layout).items():
        xs = [jnp.asarray(rng.standard_normal((rows, weight.shape[1])), jnp.float32) for rows in (1, 24)]
        wants = None
        for axis in (1,) if name.endswith("_cut") else (0, 1):
            try:
                split = kept_shards.place_split(weight, kept_shards.WeightSplit(devices, axis))
            except kept_shards.BlockBoundaryError as error:
                refused[f"{name} axis {axis}"] = str(error)
                continue
            wants = wants or [np.asarray(step(x, weight)) for x in xs]
            diffs = []
            for x, want in zip(xs, wants):
                compiled = step.lower(x, split).compile()
                diffs.append(float(np.abs(np.asarray(compiled(x, split)) - want).max() / np.abs(want).max()))
            text = compiled.as_text()
            if layout == "planes":  # the h200 target's dense copy of a kept GGUF weight: split as its blocks are,
                # and equal to the whole weight's copy (the same blocks dequantized: a difference of 0)
                dense = dense_copier(jnp.float32)(split).dense
                diffs.append(
                    float(np.abs(np.asarray(dense) - np.asarray(dense_copier(jnp.float32)(weight).dense)).max())
                )
            invariant = None
            if layout == "int8_blocks":  # deterministic mode's premise: a row's bits do not depend on its batch
                rows, others = xs[1], xs[1].at[:5].set(xs[1][:5] * 3 + 1)
                alone = invariant_step(rows[5:6], split)[0]
                invariant = bool(
                    (invariant_step(rows, split)[5] == alone).all()
                    and (invariant_step(others, split)[5] == alone).all()
                )
            out[f"{name} axis {axis}"] = {
                "max_rel_diff": max(diffs),
                "batch_invariant": invariant,
                "bytes_share": kept_shards.device_bytes(split) / weight.nbytes,
                "dense_share": kept_shards.device_bytes(dense) / dense.nbytes if layout == "planes" else None,
                "all_gathers": len(re.findall(r"\sall-gather(-start)?\(", text)),
                "all_reduces": len(re.findall(r"\sall-reduce(-start)?\(", text)),
            }
    return {"weights": out, "refused": refused}


def check_mesh_error(arch: str, mesh: MeshConfig) -> dict:
    try:
        load_model(tiny_fixture(arch)[0], mesh=mesh)
    except ValueError as error:
        return {"error": str(error)}
    return {"error": None}


def main() -> int:
    parser = argparse.ArgumentParser()
    flags = (
        "--case",
        "--engine",
        "--deterministic",
        "--speculative",
        "--speculative-draft",
        "--mesh-error",
        "--layouts",
    )
    for flag in flags:
        parser.add_argument(flag, action="append", default=[])
    parser.add_argument("--target", default="cpu")
    args = parser.parse_args()
    TARGET[0] = args.target
    checks = {
        "case": check_case,
        "engine": check_engine,
        "deterministic": check_deterministic,
        "speculative": check_speculative,
        "speculative_draft": lambda arch, mesh: check_speculative(arch, mesh, "draft"),
        "mesh_error": check_mesh_error,
        "layouts": check_layouts,
    }
    out = {}
    for kind, check in checks.items():
        for text in getattr(args, kind):
            started = time.perf_counter()
            out[f"{kind} {text}"] = check(*_mesh(text)) | {"seconds": round(time.perf_counter() - started, 1)}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
