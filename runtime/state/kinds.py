"""The kinds of per-request model state a plan declares, and how big each kind's pool is.

A plan's manifest lists its state kinds ("state"): one paged KV kind per distinct attention kind — "kv"
for layers that see every earlier token, "kv_<window>" for sliding-window layers — and, for models that
have them, fixed-size recurrent-state slots ({"layout": "slot"}). "layer_state" says which kind each
layer kind uses; the checkpoint says which kind each layer is. So a new model adds a kind of state,
not a new engine: the scheduler owns and frees every kind the same way.

Pool sizing rule (sliding kinds). A request keeps only the blocks its window can still reach: when it
runs position p, positions >= p - W + 1, at most ceil(W / block_size) + 1 blocks; the one request in a
prefill chunk of C tokens holds ceil(C / block_size) blocks more. So a sliding kind's pool never needs
more than max_num_seqs * (ceil(W / bs) + 1) + ceil(max_batched_tokens / bs) usable blocks, nor more than
the full kind's pool: that is its size, and the memory it saves goes to the full kind's pool.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .block_pool import BlockPool, StateAllocator


@dataclass(frozen=True)
class StateKind:
    """One kind of per-request model state, from the plan manifest's "state" section."""

    name: str
    paged: bool  # grows with the sequence in blocks (KV), or one fixed-size slot per request (recurrent)
    config: Mapping[str, Any]


@dataclass(frozen=True)
class PagedKind:
    """A paged KV state kind as the runtime uses it: its name and its resolved window."""

    name: str
    window: int  # tokens a query sees, itself included; 0 = every earlier token (full attention)


def state_kinds(manifest: Mapping[str, Any]) -> tuple[StateKind, ...]:
    """The state kinds a plan's manifest declares, paged kinds in their index order first: "kv" or
    {"layout": "paged"} is paged KV; {"layout": "slot"} is fixed-size per-request state (e.g. a
    linear-attention layer's recurrent state)."""
    state = manifest.get("state")
    if not isinstance(state, Mapping) or not state:
        raise ValueError("the plan manifest has no 'state' section (expected e.g. {'kv': {...}})")
    kinds = []
    for name, config in state.items():
        if name == "kv" or config.get("layout") == "paged":
            kinds.append(StateKind(name, True, config))
        elif config.get("layout") == "slot":
            kinds.append(StateKind(name, False, config))
        else:
            raise ValueError(f"state kind {name!r} in the plan manifest is neither 'kv' nor a 'paged' or 'slot' layout")
    return tuple(sorted(kinds, key=lambda k: (not k.paged, k.config.get("index", 0))))


def paged_kinds(manifest: Mapping[str, Any], dims: Any) -> tuple[PagedKind, ...]:
    """The manifest's paged KV kinds, in index order, with windows resolved against the model's dims
    (a checkpoint without a window, or with one <= 0, makes the kind full attention)."""
    out = []
    for kind in state_kinds(manifest):
        if kind.paged:
            window = kind.config.get("window", {"value": 0})
            value = dims[window["dim"]] if "dim" in window else window.get("value", 0)
            out.append(PagedKind(kind.name, max(int(value or 0), 0)))
    return tuple(out)


def layer_state_kinds(manifest: Mapping[str, Any], layer_kinds: Sequence[str]) -> tuple[str | None, ...]:
    """The state kind of every layer (what its stateful op reads and writes; None: the layer keeps none)."""
    mapping = manifest.get("layer_state") or {}
    if not mapping:  # a plan from before state kinds: every layer uses "kv"
        return ("kv",) * len(layer_kinds)
    return tuple(mapping.get(kind) for kind in layer_kinds)


def slot_kinds(manifest: Mapping[str, Any]) -> tuple[StateKind, ...]:
    """The manifest's slot state kinds (fixed-size per-request state), in their index order."""
    return tuple(k for k in state_kinds(manifest) if not k.paged)


def slot_array_shapes(kind: StateKind, dims: Any) -> dict[str, tuple[tuple[int, ...], str]]:
    """Each array of a slot kind: (shape of one slot, evaluated over the model's dims, dtype)."""
    from ...compiler.expr import evaluate

    values = dims.as_dict()
    return {
        name: (tuple(int(evaluate(axis, values)) for axis in spec["shape"]), spec["dtype"])
        for name, spec in kind.config["arrays"].items()
    }


def window_pool_blocks(window: int, block_size: int, max_num_seqs: int, max_batched_tokens: int) -> int:
    """Usable blocks a sliding kind's pool never needs more of (the sizing rule in the module doc)."""
    return max_num_seqs * (math.ceil(window / block_size) + 1) + math.ceil(max_batched_tokens / block_size)


def pool_blocks(
    kinds: Sequence[PagedKind], full_blocks: int, *, block_size: int, max_num_seqs: int, max_batched_tokens: int
) -> dict[str, int]:
    """Blocks (reserved block 0 included) of each kind's pool, given the full kind's: full kinds get
    full_blocks, sliding kinds the sizing rule's count, never more than full_blocks."""
    out = {}
    for kind in kinds:
        usable = full_blocks - 1
        if kind.window:
            usable = min(usable, window_pool_blocks(kind.window, block_size, max_num_seqs, max_batched_tokens))
        out[kind.name] = usable + 1
    return out


def allocators_for(
    kinds: Sequence[StateKind], *, num_blocks: int | Mapping[str, int], block_size: int, num_slots: int = 1
) -> dict[str, StateAllocator]:
    """One allocator per state kind: a BlockPool per paged kind (num_blocks: one count for all, or per
    kind), a SlotPool of num_slots per slot kind (the scheduler's `extra_state`)."""
    from .slot_pool import SlotPool

    allocators: dict[str, StateAllocator] = {}
    for kind in kinds:
        if kind.paged:
            blocks = num_blocks if isinstance(num_blocks, int) else num_blocks[kind.name]
            allocators[kind.name] = BlockPool(blocks, block_size, kind=kind.name)
        else:
            allocators[kind.name] = SlotPool(num_slots, kind.name)
    if not any(kind.paged for kind in kinds):
        raise ValueError("the plan declares no paged KV state (no 'kv' kind)")
    return allocators


def engine_pool_blocks(kinds: Sequence[PagedKind], config: Any) -> dict[str, int]:
    """Each kind's pool size for an EngineConfig: full kinds config.num_blocks; sliding kinds
    config.sliding_num_blocks, or the sizing rule when that is None."""
    sizes = pool_blocks(
        kinds,
        config.num_blocks,
        block_size=config.block_size,
        max_num_seqs=config.max_num_seqs,
        max_batched_tokens=config.max_batched_tokens,
    )
    if getattr(config, "sliding_num_blocks", None) is not None:
        sizes.update({k.name: config.sliding_num_blocks for k in kinds if k.window})
    return sizes


def engine_slots(config: Any) -> int:
    """Slots of each slot state kind for an EngineConfig: config.num_slots, else one per running request."""
    return int(getattr(config, "num_slots", None) or config.max_num_seqs)


def engine_verify_scratch_slots(config: Any) -> int:
    """Scratch slots of speculative decoding (runtime/scheduling/recurrent_rollback.py): one per live slot when the
    engine speculates (a verify step's rows save their state there), after the live and the snapshot slots."""
    return engine_slots(config) if getattr(config, "speculative", None) is not None else 0


def engine_snapshot_slots(config: Any) -> int:
    """Recurrent-state snapshot slots (the prefix cache of plans with slot kinds) for an EngineConfig: none with
    the prefix cache off, else config.num_snapshot_slots, else as many as live slots."""
    if not config.enable_prefix_caching:
        return 0
    count = getattr(config, "num_snapshot_slots", None)
    return int(engine_slots(config) if count is None else count)
