"""Check and measure the prefill (chunk) attention kernel (compiler/kernels/attention/prefill_kernel.py).

  python tools/dev/check_prefill_kernels.py interpret        run the kernel in Triton's CPU interpreter against the
                                                        jnp reference (`attention._attend`) at small shapes
  python tools/dev/check_prefill_kernels.py compile          compile it for sm_90 (Triton's bundled LLVM + ptxas),
                                                        no GPU needed: every dtype / head_dim / page / split kind
  python tools/dev/check_prefill_kernels.py bench [--sweep]  on the GPU: µs per call and TFLOP/s of the kernel vs the
                                                        reference at chunk 512 / 4096, prefix 0 / 12k, for
                                                        hq/hkv/dh 12/2/128 and 32/8/128; JSON on stdout
                                                        (--sweep: also every candidate launch config)

The interpreter and compile modes need only triton (/work/venv-triton); bench needs jax on CUDA + jax-triton:
  JAX_PLATFORMS=cuda python tools/dev/check_prefill_kernels.py bench --sweep > prefill_bench.json
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import replace

import numpy as np

from ember.tools.dev.check_quant_kernels import HostBuffer, compile_sm90, patch_interpreter


class IntBuffer(HostBuffer):
    """HostBuffer for int32 arguments (the block table and the chunk info)."""

    def __init__(self, array: np.ndarray) -> None:
        self.array = np.ascontiguousarray(array, dtype=np.int32)
        self.dtype = "i32"


def random_case(rng, *, chunk, num_tokens, start, hq, hkv, dh, page, window, dtype, spare_blocks=2):
    """A sequence whose first start + num_tokens positions are in the pool (garbage elsewhere, block 0
    included), a table of just enough blocks (+1 spare), the chunk's queries and positions (padding 0).
    Sliding windows: blocks wholly before the first query's window are handed back (table entry 0)."""
    width = (start + chunk) // page + 2
    num_blocks = width + spare_blocks
    pool_shape = (num_blocks, page, hkv, dh)
    k_pool = (rng.standard_normal(pool_shape) * 2).astype(dtype)
    v_pool = rng.standard_normal(pool_shape).astype(dtype)
    table = rng.permutation(np.arange(1, num_blocks))[:width].astype(np.int32)
    if window > 0:
        table[: max(0, start - window + 1) // page] = 0
    q = rng.standard_normal((chunk, hq, dh)).astype(dtype)
    positions = np.zeros(chunk, np.int32)
    positions[:num_tokens] = np.arange(start, start + num_tokens)
    return q, k_pool, v_pool, table, positions


def reference_output(q, k_pool, v_pool, table, positions, window, scale):
    import jax.numpy as jnp

    from ember.compiler.kernels.attention.reference import _attend

    f32 = lambda a: jnp.asarray(np.asarray(a, np.float32))
    dh, hkv = q.shape[-1], k_pool.shape[2]
    keys = f32(k_pool)[table].reshape(-1, hkv, dh)
    values = f32(v_pool)[table].reshape(-1, hkv, dh)
    out = _attend(f32(q)[None], keys[None], values[None], jnp.asarray(positions)[None], window, scale)[0]
    return np.asarray(out)


def interpret() -> int:
    os.environ["TRITON_INTERPRET"] = "1"  # before the kernel module is imported
    patch_interpreter()
    import ml_dtypes

    from ember.compiler.kernels.attention.prefill import PrefillAttentionConfig, combine_splits, launch_plan
    from ember.compiler.kernels.attention.prefill_kernel import prefill_attention_kernel

    cases = [  # chunk, valid, start, hq, hkv, dh, page, window, block_m, block_n, splits
        (32, 32, 0, 4, 1, 32, 16, 0, 32, 16, 1),
        (48, 37, 21, 8, 2, 32, 16, 0, 32, 32, 1),  # ragged chunk after a prefix; padding rows
        (48, 37, 21, 12, 2, 16, 16, 0, 64, 16, 1),  # G = 6: tiles cut tokens in the middle of a group
        (32, 30, 70, 8, 1, 32, 32, 24, 16, 16, 1),  # sliding window, dropped blocks, page 32 > BLOCK_N
        (16, 9, 90, 4, 4, 64, 16, 0, 16, 32, 3),  # G = 1, KV splits over a long prefix
        (16, 16, 50, 16, 2, 16, 16, 20, 128, 16, 4),  # window + splits (some empty)
        (32, 0, 0, 4, 2, 16, 16, 0, 32, 16, 1),  # an all-padding chunk: zeros, finite
        (16, 16, 40, 2, 2, 16, 16, 10, 16, 16, 1),  # window edge on a tile's last key (40 - 10 + 1 = 31)
    ]
    failures = 0
    rng = np.random.default_rng(0)
    for dtype in (np.float32, ml_dtypes.bfloat16):
        for chunk, valid, start, hq, hkv, dh, page, window, bm, bn, splits in cases:
            q, k_pool, v_pool, table, positions = random_case(
                rng,
                chunk=chunk,
                num_tokens=valid,
                start=start,
                hq=hq,
                hkv=hkv,
                dh=dh,
                page=page,
                window=window,
                dtype=dtype,
            )
            scale = dh**-0.5
            plan = launch_plan(
                chunk,
                hq,
                hkv,
                dh,
                page,
                len(table),
                scale=scale,
                config=PrefillAttentionConfig(block_m=bm, block_n=bn, kv_splits=splits),
            )
            info = np.array([positions[0], valid, window], np.int32)
            bufs = _output_buffers(plan.splits, chunk, hq, dh, dtype)
            prefill_attention_kernel[plan.grid](
                HostBuffer(q),
                HostBuffer(k_pool),
                HostBuffer(v_pool),
                IntBuffer(table),
                IntBuffer(info),
                *bufs,
                IEEE=dtype == np.float32,
                **plan.meta,
            )
            got = bufs[0].array.astype(np.float32)
            if plan.splits > 1:
                got = np.asarray(combine_splits(got, bufs[1].array, bufs[2].array))
            expected = reference_output(q, k_pool, v_pool, table, positions, window, scale)
            # error relative to max(1, |expected|): bf16 rounds outputs of magnitude ~4 by up to 1.6e-2
            err = float((np.abs(got - expected) / (1 + np.abs(expected)))[:valid].max()) if valid else 0.0
            tol = 2e-5 if dtype == np.float32 else 1e-2
            bad = not (err < tol and np.isfinite(got).all())
            failures += bad
            print(
                f"{'BAD' if bad else 'ok '} {np.dtype(dtype).name:8} C={chunk} valid={valid} start={start} "
                f"hq={hq} hkv={hkv} dh={dh} page={page} window={window} bm={plan.block_m} bn={bn} "
                f"splits={plan.splits} err={err:.1e}",
                flush=True,
            )
    for dtype in (np.float32, ml_dtypes.bfloat16):
        failures += _interpret_segments(
            rng, dtype, launch_plan, combine_splits, PrefillAttentionConfig, prefill_attention_kernel
        )
    return 1 if failures else 0


def _output_buffers(splits: int, rows: int, hq: int, dh: int, dtype) -> list:
    """The kernel's outputs, NaN-filled: out [rows, hq, dh] (one split) or fp32 partials + m / l (splits)."""
    if splits == 1:
        outs = [np.full((rows, hq, dh), np.nan, dtype), np.zeros(1, np.float32), np.zeros(1, np.float32)]
    else:
        outs = [
            np.full((splits, rows, hq, dh), np.nan, np.float32),
            np.full((splits, rows, hq), np.nan, np.float32),
            np.full((splits, rows, hq), np.nan, np.float32),
        ]
    return [HostBuffer(o) for o in outs]


SEGMENT_CASES = [  # per segment (valid, start); shared: chunk, hq, hkv, dh, page, window, block_m, block_n, splits
    (((16, 0), (9, 30), (0, 0)), 16, 8, 2, 32, 16, 0, 32, 16, 1),  # 3 prompts, one ragged, one empty segment
    (((16, 40), (5, 7)), 16, 4, 1, 16, 16, 10, 16, 16, 2),  # sliding window + KV splits
]


def _interpret_segments(rng, dtype, launch_plan, combine_splits, config_cls, kernel) -> int:
    """Several chunks (one per sequence) in one launch: SEGMENTS > 1 over one shared pool."""
    failures = 0
    for segments, chunk, hq, hkv, dh, page, window, bm, bn, splits in SEGMENT_CASES:
        cases = [
            random_case(
                rng,
                chunk=chunk,
                num_tokens=valid,
                start=start,
                hq=hq,
                hkv=hkv,
                dh=dh,
                page=page,
                window=window,
                dtype=dtype,
            )
            for valid, start in segments
        ]
        offsets = np.cumsum([0] + [c[1].shape[0] for c in cases])
        k_pool = np.concatenate([c[1] for c in cases])
        v_pool = np.concatenate([c[2] for c in cases])
        width = max(len(c[3]) for c in cases)
        tables = np.zeros((len(cases), width), np.int32)
        for s, c in enumerate(cases):  # each table into its own part of the pool (block 0 stays block 0)
            tables[s, : len(c[3])] = np.where(c[3] > 0, c[3] + offsets[s], 0)
        q = np.concatenate([c[0] for c in cases])
        positions = np.concatenate([c[4] for c in cases])
        info = np.array([[c[4][0], valid, window] for c, (valid, _) in zip(cases, segments)], np.int32)
        plan = launch_plan(
            chunk,
            hq,
            hkv,
            dh,
            page,
            width,
            scale=dh**-0.5,
            segments=len(cases),
            config=config_cls(block_m=bm, block_n=bn, kv_splits=splits),
        )
        bufs = _output_buffers(plan.splits, len(cases) * chunk, hq, dh, dtype)
        kernel[plan.grid](
            HostBuffer(q),
            HostBuffer(k_pool),
            HostBuffer(v_pool),
            IntBuffer(tables),
            IntBuffer(info),
            *bufs,
            IEEE=dtype == np.float32,
            **plan.meta,
        )
        got = bufs[0].array.astype(np.float32)
        if plan.splits > 1:
            got = np.asarray(combine_splits(got, bufs[1].array, bufs[2].array))
        err = 0.0
        for s, (valid, _) in enumerate(segments):
            if valid:
                expected = reference_output(
                    q[s * chunk : (s + 1) * chunk],
                    k_pool,
                    v_pool,
                    tables[s],
                    positions[s * chunk : (s + 1) * chunk],
                    window,
                    dh**-0.5,
                )
                seg = got[s * chunk : (s + 1) * chunk]
                err = max(err, float((np.abs(seg - expected) / (1 + np.abs(expected)))[:valid].max()))
        tol = 2e-5 if dtype == np.float32 else 1e-2
        bad = not (err < tol and np.isfinite(got).all())
        failures += bad
        print(
            f"{'BAD' if bad else 'ok '} {np.dtype(dtype).name:8} segments={len(cases)} C={chunk} "
            f"hq={hq} hkv={hkv} window={window} splits={plan.splits} err={err:.1e}",
            flush=True,
        )
    return failures


def resource_usage(compiled) -> str:
    """Registers and local memory (spills) per thread, from the cubin (Triton's bundled cuobjdump)."""
    import re
    import subprocess
    import tempfile

    import triton

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        text = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True).stdout
    found = re.search(r"REG:(\d+).*LOCAL:(\d+)", text)
    return f"regs={found.group(1)} local={found.group(2)}" if found else "regs=?"


def compile_all() -> int:
    from ember.compiler.kernels.attention.prefill import launch_plan, pick_config
    from ember.compiler.kernels.attention.prefill_kernel import prefill_attention_kernel as kernel

    failures = 0
    # (chunk, hq, hkv, dh, page, table width, config changes): Qwen2.5-1.5B, Llama-3-8B, Gemma-3-270M shapes
    shapes = [
        (512, 12, 2, 128, 16, 1024, {}),
        (4096, 32, 8, 128, 16, 1024, {}),
        (16, 32, 8, 128, 16, 1024, {}),
        (256, 4, 1, 256, 32, 64, {}),
        (64, 16, 16, 64, 16, 256, {}),
        (4096, 16, 16, 64, 16, 1024, {}),
        (4096, 32, 8, 128, 16, 1024, dict(block_n=128)),  # the largest tiles of the bench sweep
        (4096, 32, 8, 128, 16, 1024, dict(block_n=128, num_stages=2)),
    ]
    for dtype in ("bf16", "fp32"):
        for chunk, hq, hkv, dh, page, width, changes in shapes:
            if changes and dtype == "fp32":  # the sweep's tile variants are bf16 ones
                continue
            config = replace(pick_config(dh, "float32" if dtype == "fp32" else "bfloat16"), **changes)
            plan = launch_plan(chunk, hq, hkv, dh, page, width, scale=dh**-0.5, config=config)
            out_dtype = dtype if plan.splits == 1 else "fp32"
            types = ["*" + dtype, "*" + dtype, "*" + dtype, "*i32", "*i32", "*" + out_dtype, "*fp32", "*fp32"]
            constants = dict(plan.meta, IEEE=dtype == "fp32")
            try:
                compiled = compile_sm90(
                    kernel, types, constants, num_warps=config.num_warps, num_stages=config.num_stages
                )
            except Exception as error:  # report every shape, then fail
                failures += 1
                print(f"FAIL {dtype} C={chunk} {hq}/{hkv}/{dh} page={page} {config}: {error}", flush=True)
                continue
            ptx = compiled.asm["ptx"]
            print(
                f"ok  {dtype} C={chunk:<5} hq/hkv/dh={hq}/{hkv}/{dh} page={page} grid={plan.grid} "
                f"bm={plan.block_m} bn={plan.block_n} warps={config.num_warps} stages={config.num_stages} "
                f"smem={compiled.metadata.shared} {resource_usage(compiled)} "
                f"wgmma={ptx.count('wgmma.mma_async')} mma={ptx.count('mma.sync')} "
                f"cp.async={ptx.count('cp.async.cg') + ptx.count('cp.async.ca')}",
                flush=True,
            )
    return 1 if failures else 0


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("interpret", "compile", "bench"):
        print(__doc__)
        return 2
    if argv[0] == "interpret":
        return interpret()
    if argv[0] == "compile":
        return compile_all()
    from ember.tools.dev.bench_prefill_attention import bench

    print(json.dumps(bench(sweep="--sweep" in argv[1:]), indent=1))
    return 0


if __name__ == "__main__":
    t0 = time.time()
    code = main(sys.argv[1:])
    print(f"# {time.time() - t0:.1f} s", file=sys.stderr)
    sys.exit(code)
