"""The Gated DeltaNet and MoE kernels (compiler/kernels/gated_delta/gpu.py, compiler/kernels/moe/gpu.py) against
their jnp references on the GPU, per call, at the hybrid and MoE checkpoints' shapes: decode steps of 1 … 256
rows, prefill segments of 512 / 4096 tokens, the gated norm, the MoE layer at decode row counts (bf16 experts,
and kept packed in Q4_K_M's mix: Q4_K gate / up, Q6_K down, moe/packed_kernels.py); each kernel figure beside
the bytes it must move (the read roofline: state read and written, weights read once; packed: the chosen
experts' blocks) and the GB/s that makes. Random weights, bf16 activations. Prints a table; --out writes JSON.

  python -m ember.tools.dev.bench_hybrid_kernels [--out FILE] [--quick]

Shapes (their checkpoints' text configs): the MoE hybrid (d 2048, 256 experts top-8 of ffn 512, linear attention
16 key / 32 value heads of 128, conv 4), the MoE-only model (d 2048, 128 experts top-8 of ffn 768), and the dense
hybrid's linear attention (16 / 32 heads of 128, conv 4: the same mixer shapes; its MLP is a dense one).
Timing: each call inside a jitted loop of `iters` calls chained through the recurrent pools (donated, so the
kernels update them in place as in a step), long minus short loop, median of 3.
"""

from __future__ import annotations

import argparse
import json
import time

import jax
import jax.numpy as jnp
import numpy as np

from ember.compiler.batch import StepBatch
from ember.compiler.kernels.gated_delta import gpu as gd_gpu
from ember.compiler.kernels.gguf_gemv.layout import random_gguf_bytes
from ember.compiler.kernels.moe import gpu as moe_gpu
from ember.compiler.kernels.moe.packed import pack_experts
from ember.compiler.kernels.moe.reference import route
from ember.compiler.targets.policy import overriding

MIXERS = {"hybrid (16/32 heads of 128)": dict(hk=16, hv=32, dk=128, dv=128, width=4)}
MOES = {
    "moe hybrid (256 experts top-8, ffn 512)": dict(d=2048, experts=256, top_k=8, f=512),
    "moe (128 experts top-8, ffn 768)": dict(d=2048, experts=128, top_k=8, f=768),
}
BF16 = jnp.bfloat16


def _seconds(run, iters_short=2, iters_long=8, runs=3) -> float:
    """run(iters) -> blocks; seconds per iteration, long minus short loop."""

    def median(iters):
        times = []
        for _ in range(runs):
            start = time.perf_counter()
            run(iters)
            times.append(time.perf_counter() - start)
        return float(np.median(times))

    run(iters_short)
    run(iters_long)  # compile both
    return max(median(iters_long) - median(iters_short), 1e-9) / (iters_long - iters_short)


def _batch(positions, slots, layout):
    b, p, _ = layout
    return StepBatch(
        tokens=None,
        positions=positions,
        slots=None,
        dec_block_tables=None,
        dec_ctx_lens=jnp.ones(b, jnp.int32),
        pre_block_table=jnp.zeros((1, p, 1), jnp.int32),
        logit_rows=None,
        state_slots=slots[None],
    )


def bench_mixer(name: str, shape: dict, layout: tuple[int, int, int], use_kernel: bool) -> dict:
    hk, hv, dk, dv, width = (shape[k] for k in ("hk", "hv", "dk", "dv", "width"))
    decode_rows, segments, seg_len = layout
    n = decode_rows + segments * seg_len
    requests = decode_rows + segments
    c = 2 * hk * dk + hv * dv
    keys = jax.random.split(jax.random.key(n), 4)
    qkv = jax.random.normal(keys[0], (n, c)).astype(BF16)
    b, a = (jax.random.normal(k, (n, hv)).astype(BF16) for k in keys[1:3])
    conv = (jax.random.normal(keys[3], (c, 1, width)) * 0.5).astype(BF16)
    a_neg, dt_bias = -jnp.ones(hv, jnp.float32), -2 * jnp.ones(hv, jnp.float32)
    slots = jnp.concatenate(
        [jnp.arange(decode_rows), jnp.repeat(decode_rows + jnp.arange(segments), max(seg_len, 1))[: n - decode_rows]]
    ).astype(jnp.int32)
    positions = jnp.concatenate([jnp.full(decode_rows, 100), jnp.tile(jnp.arange(seg_len), segments) + 100]).astype(
        jnp.int32
    )
    batch = _batch(positions, slots, layout)
    dims = dict(hk=hk, hv=hv, dk=dk, dv=dv, kernel=width)

    def loop(conv_pool, delta_pool, iters):
        def body(_, carry):
            conv_pool, delta_pool, acc = carry
            with overriding({"gated_delta.triton": use_kernel}):
                out, conv_pool, delta_pool = gd_gpu.gated_delta(
                    qkv, b, a, 0, conv, a_neg, dt_bias, conv_pool, delta_pool, batch, **dims
                )
            return conv_pool, delta_pool, acc + out[-1, 0].astype(jnp.float32)  # keeps o live

        return jax.lax.fori_loop(0, iters, body, (conv_pool, delta_pool, jnp.float32(0)))[:2]

    run_loop = jax.jit(loop, static_argnums=2, donate_argnums=(0, 1))
    pools = [jnp.zeros((requests, width - 1, c), BF16), jnp.zeros((requests, hv, dk, dv), jnp.float32)]

    def run(iters):
        pools[:] = jax.block_until_ready(run_loop(*pools, iters))

    seconds = _seconds(run)
    moved = 2 * requests * hv * dk * dv * 4 + n * (c + hv * dv) * 2  # state read + written, qkv in, o out
    return {"shape": name, "layout": layout, "us": round(seconds * 1e6, 2), "gb_s": round(moved / seconds / 1e9, 1)}


def bench_norm(rows: int, heads: int, n: int, use_kernel: bool) -> dict:
    keys = jax.random.split(jax.random.key(rows), 2)
    x, z = (jax.random.normal(k, (rows, heads * n)).astype(BF16) for k in keys)
    w = jnp.ones(n, BF16)

    def loop(x, iters):
        def body(_, x):
            with overriding({"gated_delta.triton": use_kernel}):
                return gd_gpu.gated_rms_norm_heads(x, z, w, eps=1e-6, heads=heads)

        return jax.lax.fori_loop(0, iters, body, x)

    run_loop = jax.jit(loop, static_argnums=1)
    seconds = _seconds(lambda iters: jax.block_until_ready(run_loop(x, iters)))
    return {"rows": rows, "us": round(seconds * 1e6, 2), "gb_s": round(3 * x.size * 2 / seconds / 1e9, 1)}


def bench_moe(name: str, shape: dict, rows: int, use_kernel: bool) -> dict:
    d, experts, top_k, f = (shape[k] for k in ("d", "experts", "top_k", "f"))
    keys = jax.random.split(jax.random.key(rows + experts), 5)
    router = (jax.random.normal(keys[0], (experts, d)) / np.sqrt(d)).astype(BF16)
    gate, up = ((jax.random.normal(k, (experts, f, d)) / np.sqrt(d)).astype(BF16) for k in keys[1:3])
    down = (jax.random.normal(keys[3], (experts, d, f)) / np.sqrt(f)).astype(BF16)
    x = jax.random.normal(keys[4], (rows, d)).astype(BF16)

    def loop(x, iters):
        def body(_, x):
            with overriding({"moe.triton": use_kernel, "moe.gemv_max_rows": max(rows, 1)}):
                return moe_gpu.moe(x, router, gate, up, down, top_k=top_k, normalize=True).astype(x.dtype)

        return jax.lax.fori_loop(0, iters, body, x)

    run_loop = jax.jit(loop, static_argnums=1)
    seconds = _seconds(lambda iters: jax.block_until_ready(run_loop(x, iters)))
    _, chosen = jax.jit(lambda x: route(x, router, top_k=top_k, normalize=True))(x)
    active = len(np.unique(np.asarray(chosen)))
    moved = active * 3 * f * d * 2 + experts * d * 2  # the chosen experts' weights and the router, once
    return {"shape": name, "rows": rows, "active_experts": active, "us": round(seconds * 1e6, 2),
            "gb_s": round(moved / seconds / 1e9, 1)}  # fmt: skip


def packed_stacks(shape: dict, formats=("q4_k", "q4_k", "q6_k")) -> list:
    """Random packed gate, up [E, f, d] and down [E, d, f] stacks on the device (Q4_K_M's expert mix)."""
    d, experts, f = shape["d"], shape["experts"], shape["f"]
    rng = np.random.default_rng(experts)
    shapes = ((experts, f, d), (experts, f, d), (experts, d, f))
    return [
        jax.device_put(pack_experts(random_gguf_bytes(rng, fmt, (e * o, i), realistic=True), fmt, (e, o, i)))
        for fmt, (e, o, i) in zip(formats, shapes)
    ]


def bench_moe_packed(name: str, shape: dict, rows: int, stacks: list) -> dict:
    """The MoE layer on packed expert stacks (moe/packed_kernels.py up to moe.gemv_max_rows rows): the chosen
    experts' blocks read once is its roofline."""
    d, experts, top_k = shape["d"], shape["experts"], shape["top_k"]
    keys = jax.random.split(jax.random.key(rows + experts), 2)
    router = (jax.random.normal(keys[0], (experts, d)) / np.sqrt(d)).astype(BF16)
    x = (jax.random.normal(keys[1], (rows, d)) * 0.05).astype(BF16)

    def loop(x, iters):
        def body(_, x):
            with overriding({"moe.gemv_max_rows": max(rows, 1)}):
                return moe_gpu.moe(x, router, *stacks, top_k=top_k, normalize=True).astype(x.dtype)

        return jax.lax.fori_loop(0, iters, body, x)

    run_loop = jax.jit(loop, static_argnums=1)
    seconds = _seconds(lambda iters: jax.block_until_ready(run_loop(x, iters)))
    _, chosen = jax.jit(lambda x: route(x, router, top_k=top_k, normalize=True))(x)
    active = len(np.unique(np.asarray(chosen)))
    moved = active * sum(s.nbytes // experts for s in stacks) + experts * d * 2
    return {"shape": name, "formats": [s.format for s in stacks], "rows": rows, "active_experts": active,
            "us": round(seconds * 1e6, 2), "gb_s": round(moved / seconds / 1e9, 1)}  # fmt: skip


def _pair(fn, *args) -> dict:
    """fn(..., use_kernel) for the kernel and the reference, with their ratio."""
    kernel, reference = fn(*args, True), fn(*args, False)
    return {"kernel": kernel, "reference": reference, "speedup": round(reference["us"] / max(kernel["us"], 1e-2), 2)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out")
    parser.add_argument("--quick", action="store_true", help="fewer shapes (a smoke run)")
    parser.add_argument("--tiny", action="store_true", help="toy shapes: the script itself, on any backend")
    parser.add_argument("--parts", nargs="+", choices=("mixer", "moe"), default=("mixer", "moe"))
    args = parser.parse_args()
    decode_rows = (1, 32) if args.quick else (1, 8, 32, 128, 256)
    prefill = ((0, 1, 512),) if args.quick else ((0, 1, 512), (0, 1, 4096), (0, 8, 512))
    mixers, moes = MIXERS, MOES
    if args.tiny:
        decode_rows, prefill = (1, 4), ((2, 1, 16),)
        mixers = {"tiny": dict(hk=1, hv=2, dk=8, dv=8, width=4)}
        moes = {"tiny": dict(d=32, experts=8, top_k=2, f=16), "tiny packed": dict(d=256, experts=4, top_k=2, f=256)}
    mixers, moes = (mixers if "mixer" in args.parts else {}), (moes if "moe" in args.parts else {})
    results = {"device": str(jax.devices()[0]), "mixer": [], "gated_norm": [], "moe": []}
    for name, shape in mixers.items():
        for layout in [(rows, 0, 0) for rows in decode_rows] + list(prefill):
            entry = _pair(bench_mixer, name, shape, layout)
            results["mixer"].append(entry)
            print(f"gated_delta {layout}: kernel {entry['kernel']['us']} us ({entry['kernel']['gb_s']} GB/s), "
                  f"reference {entry['reference']['us']} us, x{entry['speedup']}", flush=True)  # fmt: skip
        for rows in decode_rows:
            entry = _pair(bench_norm, rows, shape["hv"], shape["dv"])
            results["gated_norm"].append(entry)
            print(f"gated_rms_norm rows {rows}: {entry['kernel']['us']} vs {entry['reference']['us']} us", flush=True)
    for name, shape in moes.items():
        stacks = packed_stacks(shape) if shape["d"] % 256 == 0 and shape["f"] % 256 == 0 else None
        for rows in (1,) if args.quick else (1, 4, 16):
            entry = _pair(bench_moe, name, shape, rows)
            if stacks is not None:
                entry["packed"] = bench_moe_packed(name, shape, rows, stacks)
            results["moe"].append(entry)
            packed = f", packed {entry['packed']['us']} us ({entry['packed']['gb_s']} GB/s)" if stacks else ""
            print(f"moe {name} rows {rows}: kernel {entry['kernel']['us']} us ({entry['kernel']['gb_s']} GB/s), "
                  f"reference {entry['reference']['us']} us, x{entry['speedup']}{packed}", flush=True)  # fmt: skip
    if args.out:
        with open(args.out, "w") as handle:
            json.dump(results, handle, indent=1)


if __name__ == "__main__":
    main()
