"""What XLA's CPU backend makes of a decode GEMV (and a prefill GEMM) per weight format: the numbers behind
the cpu target's weight policy (compiler/targets/cpu.py, docs/results/cpu_matmul_probe_*.json).

Each variant multiplies x [rows, in] by one weight [out, in] held as:
  f32              fp32 weights (the exact path today)
  bf16_upcast      bf16 weights, upcast to fp32 inside the dot
  bf16_dot         bf16 x bf16 -> fp32 (preferred_element_type)
  i8_chan_upcast   int8 weights, per-output-channel scale, upcast inside the dot, scale after
  i8_blk_dequant   int8 codes + per-32-block scale and offset (a K-quant's lossless form), dequantized to
                   fp32 and dotted (does the dequantization fuse, or is an fp32 copy written per call?)
  i8_blk_reduce    the same codes as a multiply-reduce per block: y[o] = sum_b s[o,b] (x_b . c[o,b]) - m[o,b] sum x_b
  i8_blk_batched   the same as a dot batched over blocks ([n,b,32] x [o,b,32] -> [n,o,b]), then the scales
  u4_blk_reduce    4-bit codes two per byte (uint8), unpacked inside the same multiply-reduce
  native_block_q8  the block form through the cpu target's native kernel (int8 activations, integer dots)
  i8_i8_dot        int8 activations (per-row scale) x int8 per-channel weights -> int32 dot
GB/s is the weight bytes read per call over the time; "fused" says whether the compiled HLO still holds a
dot whose operand is a materialised fp32 [out, in] array.

  .venv/bin/python -m ember.tools.dev.probe_cpu_matmul --rows 1 128 --out docs/results/cpu_matmul_probe.json
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import time

import jax
import jax.numpy as jnp
import numpy as np

from ember.compiler.kernels.cpu_gemv.layout import BlockQ8Weight
from ember.compiler.kernels.cpu_gemv.matmul import block_q8_matmul

SHAPES = {"qkv": (2048, 1536), "o": (1536, 1536), "gate_up": (17920, 1536), "down": (1536, 8960)}
BLOCK = 32


def variants(out: int, inner: int, rng: np.random.Generator) -> dict[str, tuple]:
    """name -> (fn(x, *weights), weights, weight bytes)."""
    w = rng.standard_normal((out, inner), np.float32) * 0.02
    codes = rng.integers(0, 16, (out, inner)).astype(np.int8)
    scale = rng.random((out, inner // BLOCK), np.float32) * 0.01
    offset = rng.random((out, inner // BLOCK), np.float32) * 0.05
    chan = (np.abs(w).max(axis=1) / 127).astype(np.float32)
    w8 = np.round(w / chan[:, None]).astype(np.int8)

    def f32(x, w):
        return jnp.einsum("nk,ok->no", x, w)

    def upcast(x, w):
        return jnp.einsum("nk,ok->no", x, w.astype(jnp.float32))

    def bf16_dot(x, w):
        return jnp.einsum("nk,ok->no", x.astype(jnp.bfloat16), w, preferred_element_type=jnp.float32)

    def chan_upcast(x, w8, chan):
        return jnp.einsum("nk,ok->no", x, w8.astype(jnp.float32)) * chan

    def blk_dequant(x, c, s, m):
        o, k = c.shape
        w = (c.reshape(o, k // BLOCK, BLOCK).astype(jnp.float32) * s[..., None] - m[..., None]).reshape(o, k)
        return jnp.einsum("nk,ok->no", x, w)

    def blk_reduce(x, c, s, m):
        o, k = c.shape
        xb = x.reshape(x.shape[0], 1, k // BLOCK, BLOCK)
        dots = jnp.sum(xb * c.reshape(1, o, k // BLOCK, BLOCK).astype(jnp.float32), axis=-1)  # [n, o, b]
        return jnp.sum(dots * s - xb.sum(-1) * m, axis=-1)

    def blk_batched(x, c, s, m):
        o, k = c.shape
        xb = x.reshape(x.shape[0], k // BLOCK, BLOCK)
        dots = jnp.einsum("nbk,obk->nob", xb, c.reshape(o, k // BLOCK, BLOCK).astype(jnp.float32))
        return jnp.sum(dots * s - xb.sum(-1)[:, None, :] * m, axis=-1)

    def u4_blk_reduce(x, packed, s, m):
        # packed uint8 [o, k/2]: byte j of a 32-block holds element j (low nibble) and j + 16 (high nibble)
        o, half = packed.shape
        k = half * 2
        p = packed.reshape(1, o, k // BLOCK, BLOCK // 2)
        xb = x.reshape(x.shape[0], 1, k // BLOCK, BLOCK)
        low = (p & 15).astype(jnp.float32)
        high = (p >> 4).astype(jnp.float32)
        dots = jnp.sum(xb[..., : BLOCK // 2] * low, axis=-1) + jnp.sum(xb[..., BLOCK // 2 :] * high, axis=-1)
        return jnp.sum(dots * s - xb.sum(-1) * m, axis=-1)

    def native_block_q8(x, c, s, m):
        # the cpu target's kernel (compiler/kernels/cpu_gemv/block_q8.cc): int8 activations per 32, integer dots
        return block_q8_matmul(x, BlockQ8Weight(c, s, m))

    def i8_dot(x, w8, chan):
        xs = jnp.max(jnp.abs(x), axis=1, keepdims=True) / 127
        x8 = jnp.round(x / xs).astype(jnp.int8)
        y = jnp.einsum("nk,ok->no", x8, w8, preferred_element_type=jnp.int32)
        return y.astype(jnp.float32) * xs * chan

    blk = (codes, scale, offset)
    nib = codes.reshape(out, inner // BLOCK, 2, BLOCK // 2).astype(np.uint8)
    packed = (nib[:, :, 0] | (nib[:, :, 1] << 4)).reshape(out, inner // 2)
    return {
        "f32": (f32, (w,), w.nbytes),
        "bf16_upcast": (upcast, (w.astype(jnp.bfloat16),), w.nbytes // 2),
        "bf16_dot": (bf16_dot, (w.astype(jnp.bfloat16),), w.nbytes // 2),
        "i8_chan_upcast": (chan_upcast, (w8, chan), w8.nbytes + chan.nbytes),
        "i8_blk_dequant": (blk_dequant, blk, codes.nbytes + scale.nbytes + offset.nbytes),
        "i8_blk_reduce": (blk_reduce, blk, codes.nbytes + scale.nbytes + offset.nbytes),
        "i8_blk_batched": (blk_batched, blk, codes.nbytes + scale.nbytes + offset.nbytes),
        "u4_blk_reduce": (u4_blk_reduce, (packed, scale, offset), packed.nbytes + scale.nbytes + offset.nbytes),
        "native_block_q8": (native_block_q8, blk, codes.nbytes + scale.nbytes + offset.nbytes),
        "i8_i8_dot": (i8_dot, (w8, chan), w8.nbytes + chan.nbytes),
    }


def materialises_f32_weight(compiled_text: str, out: int, inner: int) -> bool:
    """True when the optimised HLO writes an fp32 [out, in] array outside the dot (the weight's copy)."""
    return any(
        f"f32[{out},{inner}]" in line and " dot(" not in line and "parameter(" not in line
        for line in compiled_text.splitlines()
        if "=" in line
    )


def measure(fn, x, weights, repeats: int) -> tuple[float, str]:
    jitted = jax.jit(fn)
    compiled = jitted.lower(x, *weights).compile()
    text = compiled.as_text()
    jax.block_until_ready(jitted(x, *weights))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(jitted(x, *weights))
        times.append(time.perf_counter() - start)
    # the fastest of the repeats: the machine is shared, and a slower repeat measures the neighbours
    return float(np.min(times)), text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 128])
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES))
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--only", nargs="*", help="variant names (default: all)")
    parser.add_argument("--out", help="JSON file to write")
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    results = []
    for shape in args.shapes:
        out, inner = SHAPES[shape]
        table = variants(out, inner, rng)
        for rows in args.rows:
            x = jnp.asarray(rng.standard_normal((rows, inner), np.float32))
            reference = None
            for name, (fn, weights, nbytes) in table.items():
                if args.only and name not in args.only:
                    continue
                weights = tuple(jnp.asarray(w) for w in weights)
                seconds, text = measure(fn, x, weights, args.repeats)
                row = {
                    "shape": shape,
                    "out": out,
                    "in": inner,
                    "rows": rows,
                    "variant": name,
                    "ms": round(seconds * 1e3, 3),
                    "weight_mb": round(nbytes / 1e6, 2),
                    "gb_s": round(nbytes / seconds / 1e9, 2),
                    "materialises_f32_weight": materialises_f32_weight(text, out, inner),
                }
                if name == "f32":
                    reference = seconds
                row["speedup_vs_f32"] = round(reference / seconds, 2) if reference else None
                results.append(row)
                print(json.dumps(row), flush=True)
    if args.out:
        meta = {
            "machine": platform.processor() or platform.machine(),
            "cpu_flags_avx512": "avx512" in open("/proc/cpuinfo").read(),
            "jax": jax.__version__,
            "commit": subprocess.run(
                ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
            ).stdout.strip(),
            "load_avg_before": open("/proc/loadavg").read().split()[:3],
        }
        with open(args.out, "w") as f:
            json.dump({"meta": meta, "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
