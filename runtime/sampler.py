"""Next-token choice from logits: greedy at temperature 0, else seeded sampling with top-k / top-p.

Runs on device as one jitted function; the key is derived from (seed, step) so a seed reproduces.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import jax
import jax.numpy as jnp


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0
    top_k: int = 0  # 0 = off
    top_p: float = 1.0
    seed: int = 0


@partial(jax.jit, static_argnames=("top_k",))
def _sample(logits, key, temperature, top_p, *, top_k):
    # logits [vocab] float32
    scaled = logits.astype(jnp.float32) / jnp.maximum(temperature, 1e-6)
    if top_k:
        kth = jax.lax.top_k(scaled, top_k)[0][-1]
        scaled = jnp.where(scaled < kth, -jnp.inf, scaled)
    order = jnp.argsort(-scaled)
    sorted_probs = jax.nn.softmax(scaled[order])
    before = jnp.cumsum(sorted_probs) - sorted_probs  # mass strictly above each token
    keep_sorted = before < top_p
    keep = jnp.zeros_like(keep_sorted).at[order].set(keep_sorted)
    scaled = jnp.where(keep, scaled, -jnp.inf)
    return jax.random.categorical(key, scaled)


def choose(logits, params: SamplingParams, step: int) -> int:
    if params.temperature <= 0:
        return int(jnp.argmax(logits))
    key = jax.random.fold_in(jax.random.PRNGKey(params.seed), step)
    return int(_sample(jnp.asarray(logits), key, params.temperature, params.top_p, top_k=params.top_k))
