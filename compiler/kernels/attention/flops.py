"""The work a prefill chunk's attention must do: what benchmarks divide by."""

from __future__ import annotations


def useful_flops(num_tokens: int, start: int, window: int, hq: int, head_dim: int) -> int:
    """2 matmuls x 2 flops per (query, visible key, head, dim): the work a perfect kernel does."""
    total = 0
    for p in range(start, start + num_tokens):
        total += min(p + 1, window) if window > 0 else p + 1
    return 4 * total * hq * head_dim
