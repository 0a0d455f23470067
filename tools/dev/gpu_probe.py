"""A first look at the reference plans on a GPU (run by hand on the device machine; JSON to stdout).

Measures HBM copy bandwidth, then batch-1 decode of the Qwen2.5-1.5B shape with random weights through
the cpu target's reference plans (XLA only, no Ember kernels yet) in fp32 and bf16, reported against
the bandwidth roofline measured in the same run. This is the baseline the h200 target must beat.
"""

from __future__ import annotations

import json
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from ember.tools.bench_models import SYNTHETIC_SHAPES
from ember.tools.hbm_probe import copy_bandwidth


def decode_rate(model, steps: int = 64) -> dict:
    from ember.runtime.execution.sequence_runner import SequenceRunner

    runner = SequenceRunner(model, 128 + 2 * steps + 8)
    logits = runner.prefill(list(range(100, 228)))
    token = int(np.argmax(logits))
    for _ in range(4):  # compile + warm
        token = int(np.argmax(runner.decode(token)))
    start = time.perf_counter()
    for _ in range(steps):
        token = int(np.argmax(runner.decode(token)))
    seconds = (time.perf_counter() - start) / steps
    weight_bytes = sum(a.nbytes for group in (model.params.globals, *model.params.layers) for a in group.values())
    return {
        "ms_per_token": round(seconds * 1e3, 3),
        "tokens_per_s": round(1 / seconds, 1),
        "weight_bytes": weight_bytes,
    }


def main() -> int:
    from ember.compiler.spec import spec_for_arch
    from ember.runtime.loading.model import load_model
    from ember.runtime.loading.synthetic import synthetic_checkpoint

    result = {"devices": [str(d) for d in jax.devices()], "jax": jax.__version__}
    bandwidth = copy_bandwidth()
    result["copy_bandwidth_gb_s"] = round(bandwidth, 1)
    arch, config = SYNTHETIC_SHAPES["qwen2.5-1.5b"]
    model = load_model(synthetic_checkpoint(spec_for_arch(arch), config))
    for dtype in ("float32", "bfloat16"):
        if dtype == "bfloat16":
            model.params = jax.tree.map(lambda a: a.astype(jnp.bfloat16) if a.dtype == jnp.float32 else a, model.params)
            model.dtype = jnp.bfloat16
        rate = decode_rate(model)
        roofline = bandwidth * 1e9 / rate["weight_bytes"]
        rate["roofline_tokens_per_s"] = round(roofline, 1)
        rate["fraction_of_roofline"] = round(rate["tokens_per_s"] / roofline, 3)
        result[f"qwen2.5-1.5b-shape {dtype} batch-1 decode (reference plans, XLA)"] = rate
    json.dump(result, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
