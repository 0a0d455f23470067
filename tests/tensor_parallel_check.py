"""Run by tests/test_tensor_parallel.py in a subprocess whose JAX sees several host devices (XLA's device count is
fixed when JAX starts): tiny checkpoints on one device and on meshes of several, compared; one JSON line out.

    XLA_FLAGS=--xla_force_host_platform_device_count=8 JAX_PLATFORMS=cpu \
        python tests/tensor_parallel_check.py --case qwen3:2 --case qwen3_moe:4:ep --engine qwen3:2

--case ARCH:N[:ep] (ARCH a tiny fixture, or qwen3_moe_kquant: its Q4_K_M GGUF kept as int8 blocks): greedy
prefill + decode of the fixture's prompt on one device and on N; the logits' largest difference and whether the
greedy tokens agree. --engine ARCH:N: concurrent greedy requests through an engine
whose KV pool is too small for all of them (preemption) on N devices, each request's tokens vs the one-device
run alone. --speculative ARCH:N: the same with n-gram speculative decoding (verify steps). --deterministic
ARCH:N: the deterministic engine on N devices, a request alone twice and beside others, bit for bit.
--mesh-error ARCH:N: the error loading on N devices gives. --target T: the plans' target (default cpu).
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
import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

from engine_support import GREEDY, ByteTokenizer  # noqa: E402
from fixture_data import KQUANT_DIR as KQUANT  # noqa: E402
from fixture_data import kquant_fixture, tiny_fixture  # noqa: E402

from ember.compiler.targets.cpu import CPU, CPU_INT8_BLOCKS  # noqa: E402
from ember.compiler.targets.mesh import MeshConfig  # noqa: E402
from ember.runtime.engine.engine import Engine, EngineConfig  # noqa: E402
from ember.runtime.execution.sequence_runner import SequenceRunner  # noqa: E402
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
    """(checkpoint, reference arrays, kernel policy): KQUANT is the Q4_K_M GGUF kept as int8 blocks (the cpu
    target's opt-in CPU_INT8_BLOCKS: kept quantized weights, replicated on a mesh)."""
    if arch == KQUANT:
        path, arrays, _, _ = kquant_fixture()
        return path, arrays, dataclasses.replace(CPU.policy, weights=CPU_INT8_BLOCKS)
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


def check_case(arch: str, mesh: MeshConfig) -> dict:
    prompt = [int(t) for t in _fixture(arch)[1]["input_ids"]]
    want_tokens, want = _greedy(_model(arch, MeshConfig()), prompt, DECODE)
    model = _model(arch, mesh)
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


def check_speculative(arch: str, mesh: MeshConfig) -> dict:
    """n-gram speculation on the mesh (verify steps): repetitive prompts, so drafts are made and accepted."""
    rng = np.random.default_rng(3)
    cases = [((rng.integers(3, 250, size=6).tolist() * 6)[: int(n)], 16) for n in (24, 31, 36)]
    alone = [_greedy(_model(arch, MeshConfig()), p, m)[0] for p, m in cases]
    spec = SpeculativeConfig("ngram", num_speculative_tokens=3, adaptive=False)
    config = EngineConfig(num_blocks=64, max_model_len=96, max_num_seqs=4, max_batched_tokens=64, speculative=spec)
    engine = Engine(_model(arch, mesh), ByteTokenizer(), config)
    try:
        streams = [engine.submit(p, SamplingParams(max_tokens=m, **GREEDY)) for p, m in cases]
        results = [[t for o in s.collect()[0] for t in o.token_ids] for s in streams]
        stats = engine.speculation_stats()
    finally:
        engine.close()
    return {"tokens_equal": results == alone, "drafted": stats.num_draft_tokens, "accepted": stats.num_accepted_tokens}


def check_mesh_error(arch: str, mesh: MeshConfig) -> dict:
    try:
        load_model(tiny_fixture(arch)[0], mesh=mesh)
    except ValueError as error:
        return {"error": str(error)}
    return {"error": None}


def main() -> int:
    parser = argparse.ArgumentParser()
    for flag in ("--case", "--engine", "--deterministic", "--speculative", "--mesh-error"):
        parser.add_argument(flag, action="append", default=[])
    parser.add_argument("--target", default="cpu")
    args = parser.parse_args()
    TARGET[0] = args.target
    checks = {
        "case": check_case,
        "engine": check_engine,
        "deterministic": check_deterministic,
        "speculative": check_speculative,
        "mesh_error": check_mesh_error,
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
