"""Which ops of a plan compute a row the same way whatever the row count (the batch-invariance rule,
docs/kernel_policy.md): for each op, row 0 and row 1 of the output at every row count M against M = 2, bit
for bit. Prints one JSON line per op: {"op", "shape", "equal_to_m2": {M: bool}}.

  python -m ember.tools.dev.probe_batch_invariance [--kernel-policy FILE]

On the cpu target (no GPU) it probes XLA CPU; on the H200 (JAX_PLATFORMS=cuda) XLA's cuBLAS GEMMs and the h200
target's kernels as its kernel policy picks them per row count: the bf16 GEMM, the GGUF Q4_K / Q6_K GEMVs
(rows / dp4a / split variants, dequantize + GEMM above them), the Triton RMSNorm.
"""

from __future__ import annotations

import argparse
import json

import jax
import jax.numpy as jnp
import numpy as np

ROWS = (1, 2, 3, 4, 5, 8, 16, 17, 32, 64, 128, 256, 512)
SHAPES = ((1536, 1536), (256, 1536), (17920, 1536), (1536, 8960))  # (out, in) of the 1.5B's projections


def _probe(name: str, shape, fn, x_all: np.ndarray) -> dict:
    ref = np.asarray(jax.block_until_ready(fn(jnp.asarray(x_all[:2]))))[:2].astype(np.float32)
    equal = {}
    for m in ROWS:
        got = np.asarray(jax.block_until_ready(fn(jnp.asarray(x_all[:m])))).astype(np.float32)
        rows = min(m, 2)
        equal[m] = bool(np.array_equal(got[:rows], ref[:rows]))
    return {"op": name, "shape": list(shape), "platform": jax.devices()[0].platform, "equal_to_m2": equal}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernel-policy", help="JSON override of the h200 kernel policy")
    args = parser.parse_args(argv)
    from ember.compiler.kernels.gguf_gemv import linear as gguf_linear
    from ember.compiler.kernels.gguf_gemv import pack, random_gguf_bytes
    from ember.compiler.kernels.norm import kernel as norm_kernel
    from ember.compiler.targets import get_target
    from ember.compiler.targets.policy import load_policy_file, use_kernel_policy

    policy = get_target("h200").policy
    if args.kernel_policy:
        policy = load_policy_file(args.kernel_policy, policy)
    rng = np.random.default_rng(0)
    with use_kernel_policy(policy):
        for out, inner in SHAPES:
            x = (rng.standard_normal((max(ROWS), inner)) * 0.5).astype(jnp.bfloat16)
            w = jnp.asarray(rng.standard_normal((out, inner)) * 0.02, jnp.bfloat16)
            print(json.dumps(_probe("bf16 x @ w.T", (out, inner), jax.jit(lambda a, w=w: a @ w.T), x)), flush=True)
            for fmt in ("q4_k", "q6_k"):
                q = pack(random_gguf_bytes(rng, fmt, (out, inner), realistic=True), fmt, (out, inner))
                q = jax.device_put(q)
                fn = jax.jit(lambda a, q=q: gguf_linear.linear(a, q))
                print(json.dumps(_probe(f"gguf {fmt} linear", (out, inner), fn, x)), flush=True)
        for hidden in (1536, 4096):
            x = rng.standard_normal((max(ROWS), hidden)).astype(jnp.bfloat16)
            wn = jnp.asarray(rng.uniform(0.5, 1.5, hidden), jnp.bfloat16)
            fn = jax.jit(lambda a, wn=wn: norm_kernel.rms_norm(a, wn, eps=1e-6))
            print(json.dumps(_probe("rms_norm", (hidden,), fn, x)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
