"""Sanity probes of the hybrid / MoE tiny models, printed by make_tiny_checkpoints.py (torch env).

transformers' torch GDN prefill (`torch_chunk_gated_delta_rule`) runs in chunks of 64 (its
default, not configurable from the model): the 40-token prompt is one padded chunk. To show that
the reference does not depend on that, the prefill is re-run with the chunk size patched to 16
(three chunks, the inter-chunk state path) and compared. The same wrapper records the decay g.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager

import numpy as np
import torch

PATCHED_CHUNK = 16


@contextmanager
def _patched_chunk_rule(model: torch.nn.Module, chunk_size: int | None, decays: list[torch.Tensor]):
    """Swap the modeling module's chunked GDN for a wrapper that records g (and maybe re-chunks)."""
    module = sys.modules[type(model).__module__]
    original = getattr(module, "torch_chunk_gated_delta_rule", None)
    recurrent = getattr(module, "torch_recurrent_gated_delta_rule", None)
    if original is None:
        yield False
        return

    def chunked(*args, **kwargs):
        decays.append(kwargs["g"].detach().clone())
        if chunk_size is not None:
            kwargs["chunk_size"] = chunk_size
        return original(*args, **kwargs)

    def stepped(*args, **kwargs):
        decays.append(kwargs["g"].detach().clone())
        return recurrent(*args, **kwargs)

    module.torch_chunk_gated_delta_rule = chunked
    module.torch_recurrent_gated_delta_rule = stepped
    try:
        yield True
    finally:
        module.torch_chunk_gated_delta_rule = original
        module.torch_recurrent_gated_delta_rule = recurrent


@torch.no_grad()
def hybrid_stats(model: torch.nn.Module, ref: dict[str, np.ndarray]) -> dict[str, float]:
    prompt = torch.from_numpy(ref["input_ids"].astype(np.int64))[None]
    decays: list[torch.Tensor] = []
    stats: dict[str, float] = {}
    with _patched_chunk_rule(model, PATCHED_CHUNK, decays) as has_gdn:
        if not has_gdn:
            return stats
        rechunked = model(input_ids=prompt, use_cache=False).logits[0].numpy()
    if decays:
        step_decay = torch.cat([d.flatten() for d in decays]).exp()  # exp(g) per token and value head
        stats["gdn_decay_min"] = float(step_decay.min())
        stats["gdn_decay_mean"] = float(step_decay.mean())
        stats["gdn_decay_max"] = float(step_decay.max())
        stats["chunk16_vs_chunk64_prefill"] = float(np.abs(rechunked - ref["prefill_logits"]).max())
    return stats
