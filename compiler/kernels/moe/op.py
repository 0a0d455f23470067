"""The `moe` op as a plan calls it: stacked per-expert gate, up and down weights (GGUF's ffn_*_exps layout),
routed through the references in reference.py.

x [N, d]; router [E, d]; gate, up [E, f, d]; down [E, d, f] -> [N, d] in x's dtype.
"""

from __future__ import annotations

import jax.numpy as jnp

from .reference import experts, route


def moe(x, router, gate, up, down, *, top_k: int, normalize: bool, act: str = "silu"):
    weights, chosen = route(x, router, top_k=int(top_k), normalize=bool(normalize))
    gate_up = jnp.concatenate([gate, up], axis=1)  # [E, 2f, d]: gate rows first, as experts() reads them
    return experts(x, weights, chosen, gate_up, down, act=act)
