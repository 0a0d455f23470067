"""The `moe` op as a plan calls it: stacked per-expert gate, up and down weights (GGUF's ffn_*_exps layout),
routed through the references in reference.py.

x [N, d]; router [E, d]; gate, up [E, f, d]; down [E, d, f] -> [N, d] in x's dtype. An expert stack kept packed
(packed.py) is dequantized to x's dtype first.
"""

from __future__ import annotations

import jax.numpy as jnp

from .packed import dense_experts
from .reference import experts, route


def moe(x, router, gate, up, down, *, top_k: int, normalize: bool, act: str = "silu"):
    gate, up, down = (dense_experts(w, x.dtype) for w in (gate, up, down))  # stacks kept packed (packed.py)
    weights, chosen = route(x, router, top_k=int(top_k), normalize=bool(normalize))
    gate_up = jnp.concatenate([gate, up], axis=1)  # [E, 2f, d]: gate rows first, as experts() reads them
    return experts(x, weights, chosen, gate_up, down, act=act)
