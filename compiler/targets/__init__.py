"""Targets: what hardware a plan is for, and which kernel implements each op there.

A target is data plus one rule, `kernel_for(node, graph)`. Model code never branches on hardware:
a new GPU is a new target here, choosing kernels (e.g. by weight format or batch bucket).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..ir import Graph, Node
from .policy import KernelPolicy


@dataclass(frozen=True)
class Target:
    name: str
    description: str
    kernels: dict[str, str] = field(default_factory=dict)  # op -> "module:function"
    # Overrides for the deterministic variant: kernels whose reductions do not depend on the batch.
    deterministic_kernels: dict[str, str] = field(default_factory=dict)
    activation_dtype: str = "float32"
    decode_buckets: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)
    prefill_buckets: tuple[int, ...] = (16, 32, 64, 128, 256, 512, 1024, 2048)
    # prefill chunks one step may carry (runtime/scheduling/scheduled_step.py PrefillShapes): (1,) = one per step; more lets a
    # burst of short prompts (each <= segment_max_tokens) be admitted together
    prefill_segments: tuple[int, ...] = (1,)
    segment_max_tokens: int = 512
    # which kernel and launch config each op takes, and which weights stay packed (policy.py): recorded in
    # manifest.json and the generated plan, entered around every trace of a step
    policy: KernelPolicy = field(default_factory=KernelPolicy)
    # decode steps per device call when the engine may run ahead (runtime/scheduling/lookahead.py): where the host's
    # per-call work is large next to a step (a GPU), several steps share it
    decode_steps: int = 1
    # the prefix cache's host tier when `ember serve` is not told its size: this many times the device KV pool's
    # bytes, at most a quarter of the host's available memory (server/config.py `host_tier_bytes`); 0: off (where
    # the device's memory is the host's, a copy to the host frees nothing)
    host_tier_ratio: float = 0.0
    # the step shapes an `ember serve` compiles before it reports ready, as (decode rows, prefill tokens) of a
    # decode-only and a prefill-only step (each the smallest bucket that holds it), greedy and sampled; the
    # others compile in the background once it serves, or at their first step. None: every shape before ready
    ready_shapes: tuple[tuple[int, int], ...] | None = None

    def names_kernel(self, op: str, variant: str = "default") -> bool:
        """Whether the variant's kernel table names `op` itself: fusion passes introduce a fused op only then
        (the deterministic variant fuses nothing its own table does not list)."""
        return op in (self.deterministic_kernels if variant == "deterministic" else self.kernels)

    def kernel_for(self, node: Node, graph: Graph, variant: str = "default") -> str:
        if variant == "deterministic" and node.op in self.deterministic_kernels:
            return self.deterministic_kernels[node.op]
        try:
            return self.kernels[node.op]
        except KeyError:
            raise ValueError(f"target {self.name!r} has no kernel for op {node.op!r}") from None


def known_targets() -> tuple[str, ...]:
    return ("cpu", "h200")


def get_target(name: str) -> Target:
    from .cpu import CPU
    from .h200 import H200

    targets = {t.name: t for t in (CPU, H200)}
    if name not in targets:
        raise ValueError(f"unknown target {name!r} (known: {', '.join(sorted(targets))})")
    return targets[name]
