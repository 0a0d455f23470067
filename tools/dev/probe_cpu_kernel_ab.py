"""The cpu target's int8-block kernel against an earlier version of itself and XLA's fp32 GEMV, per projection
shape of the 1.5B default model, interleaved in one process (the machine is shared: each repeat times every
variant once in turn, the figure is the fastest repeat). The earlier kernel is built from `git show
REV:compiler/kernels/cpu_gemv/block_q8.cc` under its own FFI target name.

  .venv/bin/python -m ember.tools.dev.probe_cpu_kernel_ab --old 251efd1 --rows 1 5 \\
      --out docs/results/cpu_kernel_ab.json
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from ember.compiler.kernels.cpu_gemv import native
from ember.compiler.kernels.cpu_gemv.layout import BlockQ8Weight, _pack_nibbles
from ember.compiler.kernels.cpu_gemv.matmul import block_q8_matmul

# name -> (out, in, block, offsets, nibbles): the 1.5B Q4_K_M's projections (Q4_K: blocks of 32 with offsets, its
# codes two per byte as the cpu target keeps them; Q6_K: blocks of 16, no offsets: half the layers' v and down, and
# the output head)
SHAPES = {
    "qkv_q4k": (2048, 1536, 32, True, True),
    "o_q4k": (1536, 1536, 32, True, True),
    "gate_up_q4k": (17920, 1536, 32, True, True),
    "down_q4k": (1536, 8960, 32, True, True),
    "down_q6k": (1536, 8960, 16, False, False),
    "head_q6k": (151936, 1536, 16, False, False),
}
OLD_TARGET = "ember_block_q8_matmul_old"


def build_old(rev: str) -> str:
    """Build block_q8.cc as of `rev` and register it as OLD_TARGET."""
    source = subprocess.run(
        ["git", "show", f"{rev}:compiler/kernels/cpu_gemv/block_q8.cc"], capture_output=True, text=True, check=True
    ).stdout
    workdir = Path(tempfile.mkdtemp(prefix="ember-old-kernel-"))
    (workdir / "old.cc").write_text(source)
    for header in native.HEADERS:  # the headers it includes, as of `rev` (absent before they existed)
        found = subprocess.run(
            ["git", "show", f"{rev}:compiler/kernels/cpu_gemv/{header.name}"], capture_output=True, text=True
        )
        if found.returncode == 0:
            (workdir / header.name).write_text(found.stdout)
    command = [native._compiler(), *native.FLAGS, "-w", "-isystem", jax.ffi.include_dir()]
    subprocess.run([*command, str(workdir / "old.cc"), "-o", str(workdir / "old.so")], check=True)
    library = ctypes.cdll.LoadLibrary(str(workdir / "old.so"))
    jax.ffi.register_ffi_target(OLD_TARGET, jax.ffi.pycapsule(library.EmberBlockQ8Matmul), platform="cpu")
    jax.ffi.register_ffi_target(OLD_TARGET + "_q4", jax.ffi.pycapsule(library.EmberBlockQ4Matmul), platform="cpu")
    return OLD_TARGET


def variants(out: int, inner: int, block: int, offsets: bool, nibbles: bool, rng: np.random.Generator) -> dict:
    codes = (rng.integers(0, 16, (out, inner)) if nibbles else rng.integers(-32, 32, (out, inner))).astype(np.int8)
    scale = (rng.random((out, inner // block), np.float32) * 0.01).astype(np.float32)
    offset = (rng.random((out, inner // block), np.float32) * 0.05) if offsets else np.zeros((0,), np.float32)
    kept = _pack_nibbles(jnp.asarray(codes)) if nibbles else jnp.asarray(codes)
    w = BlockQ8Weight(kept, jnp.asarray(scale), jnp.asarray(offset.astype(np.float32)))
    dense = jnp.asarray(np.asarray(codes, np.float32) * 0.01)

    def old(x, w):
        shape = jax.ShapeDtypeStruct((x.shape[0], w.shape[0]), jnp.float32)
        target = OLD_TARGET + "_q4" if w.nibbles else OLD_TARGET
        return jax.ffi.ffi_call(target, shape)(x, w.codes, w.scale, w.offset)

    return {
        "xla_f32": (lambda x, d: jnp.einsum("nk,ok->no", x, d), dense),
        "old_kernel": (old, w),
        "new_kernel": (block_q8_matmul, w),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--old", required=True, help="git revision of the earlier kernel")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 5])
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES))
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--out", help="JSON file to write")
    args = parser.parse_args(argv)
    assert native.available()
    build_old(args.old)
    rng = np.random.default_rng(0)
    results = []
    load_before = os.getloadavg()
    for shape in args.shapes:
        out, inner, block, offsets, nibbles = SHAPES[shape]
        table = variants(out, inner, block, offsets, nibbles, rng)
        for rows in args.rows:
            x = jnp.asarray(rng.standard_normal((rows, inner), np.float32))
            jitted = {name: jax.jit(fn) for name, (fn, _) in table.items()}
            for name, (_, weight) in table.items():
                jax.block_until_ready(jitted[name](x, weight))
            times: dict[str, list[float]] = {name: [] for name in table}
            for _ in range(args.repeats):
                for name, (_, weight) in table.items():
                    start = time.perf_counter()
                    jax.block_until_ready(jitted[name](x, weight))
                    times[name].append(time.perf_counter() - start)
            row = {"shape": shape, "out": out, "in": inner, "block": block, "nibbles": nibbles, "rows": rows}
            row.update({f"{name}_ms": round(min(t) * 1e3, 3) for name, t in times.items()})
            row["gmac_s_new"] = round(out * inner * rows / min(times["new_kernel"]) / 1e9, 2)
            results.append(row)
            print(json.dumps(row), flush=True)
    if args.out:
        meta = {
            "jax": jax.__version__,
            "old": args.old,
            "commit": subprocess.run(
                ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
            ).stdout.strip(),
            "load_avg_before": [round(v, 2) for v in load_before],
            "load_avg_after": [round(v, 2) for v in os.getloadavg()],
            "repeats": args.repeats,
        }
        Path(args.out).write_text(json.dumps({"meta": meta, "results": results}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
