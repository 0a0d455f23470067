"""Probe: does programmatic dependent launch (PDL) shorten a chain of small kernels inside one XLA program?

A chain of CHAIN dependent Pallas Mosaic GPU kernels (TMA copy in, x * 0.5 + 1 on a 64 x 128 f32 tile, TMA
copy out), jitted as one program, timed per link: plain, with `griddepcontrol.wait` at the start (which
marks the custom call `mosaic_gpu.uses_pdl`, so XLA may launch it before its predecessor ends), and with
`griddepcontrol.launch_dependents` too; each again with an XLA fusion (sin) between the kernels ("mix_").
Needs an NVIDIA GPU (Mosaic GPU does not lower without one); run under XLA_FLAGS to compare flag sets
(XLA's own: --xla_gpu_enable_pdl, --xla_gpu_enable_pdl_launch).

    JAX_PLATFORMS=cuda python -m ember.tools.dev.probe_pdl [--out probe.json]

Result on the H200 (docs/results/h200_pdl_probe_579a529.json): no measurable gain.
"""

from __future__ import annotations

import argparse
import json
import time

CHAIN = 64
SHAPE = (64, 128)
VARIANTS = (
    ("plain", False, False),
    ("wait", True, False),
    ("wait+launch", True, True),
    ("plain2", False, False),
    ("wait2", True, False),
)


def tile_kernel(pdl: bool, launch: bool):
    """x [64, 128] f32 -> x * 0.5 + 1, one Mosaic GPU block (one warpgroup)."""
    import jax
    import jax.numpy as jnp
    from jax.experimental.pallas import mosaic_gpu as plgpu

    def body(x_gmem, o_gmem, x_smem, o_smem, barrier):
        if pdl:  # before the first read of the predecessor's output
            plgpu.griddepcontrol_wait()
        plgpu.copy_gmem_to_smem(x_gmem, x_smem, barrier)
        plgpu.barrier_wait(barrier)
        o_smem[...] = x_smem[...] * 0.5 + 1.0
        if launch:
            plgpu.griddepcontrol_launch_dependents()
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(o_smem, o_gmem)
        plgpu.wait_smem_to_gmem(0)

    return plgpu.kernel(
        body,
        out_type=jax.ShapeDtypeStruct(SHAPE, jnp.float32),
        scratch_types=[plgpu.SMEM(SHAPE, jnp.float32), plgpu.SMEM(SHAPE, jnp.float32), plgpu.Barrier()],
    )


def chained(kernel, mix: bool):
    import jax
    import jax.numpy as jnp

    def chain(x):
        for _ in range(CHAIN):
            x = kernel(x)
            if mix:
                x = jnp.sin(x)
        return x

    return jax.jit(chain)


def us_per_link(fn, x, calls: int = 200, repeats: int = 5) -> float:
    """Best of `repeats` runs of `calls` back-to-back calls, per chain link."""
    y = fn(x).block_until_ready()
    best = float("inf")
    for _ in range(repeats):
        begun = time.perf_counter()
        for _ in range(calls):
            y = fn(y)
        y.block_until_ready()
        best = min(best, (time.perf_counter() - begun) / calls)
    return best * 1e6 / CHAIN


def main(argv: list[str] | None = None) -> int:
    import os

    import jax.numpy as jnp

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="JSON file (default: stdout only)")
    args = parser.parse_args(argv)
    x = jnp.ones(SHAPE, jnp.float32)
    want = chained(tile_kernel(False, False), False)(x)
    result = {"xla_flags": os.environ.get("XLA_FLAGS", ""), "chain": CHAIN, "us_per_link": {}}
    for mix in (False, True):
        for name, pdl, launch in VARIANTS:
            fn = chained(tile_kernel(pdl, launch), mix)
            if not mix and not bool(jnp.allclose(fn(x), want)):
                raise AssertionError(f"{name}: the chain's result differs from the plain chain's")
            result["us_per_link"][("mix_" if mix else "") + name] = round(us_per_link(fn, x), 3)
            print(name, "mix" if mix else "", result["us_per_link"], flush=True)
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
