"""Engine configuration: the KV pool, batch and queue limits, deterministic mode and run-ahead, and the
sizing of the KV pools from a memory budget or a context length (`sized_config`)."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, replace

import numpy as np

from ..loading.model import Model
from ..scheduling.scheduled_step import PrefillShapes
from ..speculative.config import SpeculativeConfig
from ..state.kinds import engine_pool_blocks, engine_snapshot_slots
from ..state.kv_dtypes import checked_kv_cache_dtype
from ..state.kv_dtypes import kv_dtype as _kv_dtype


@dataclass(frozen=True)
class EngineConfig:
    num_blocks: int = 256  # KV pool size in blocks (block 0 is reserved); a sliding-window kind's is smaller:
    sliding_num_blocks: int | None = None  # None: the sizing rule of runtime/state/kinds.py
    block_size: int = 16
    max_model_len: int = 4096  # longest context of one sequence (prompt + output)
    max_num_seqs: int = 16
    max_batched_tokens: int = 512
    max_queue_depth: int = 256
    max_queue_wait_s: float = 300.0  # bounded wait for KV capacity before a request is refused
    deterministic: bool = False  # batch-invariant plans: same tokens and logprobs alone or under load
    enable_prefix_caching: bool = True
    # decode steps per device call when every running request is decoding plainly (runtime/scheduling/lookahead.py);
    # 1 = one step per call; None = the plan's target's choice (Target.decode_steps). Amortises the host's
    # per-call work over that many tokens.
    decode_steps: int | None = None
    # keep the step executables on disk beside JAX's persistent cache (runtime/execution/executable_cache.py), so that a
    # restart neither traces nor lowers them; `ember serve` turns it on. Off by default: an engine whose traced
    # code is changed by anything but the sources and the kernel policy (a test patching a module) must trace.
    keep_executables: bool = False
    # the KV pools' element type (KV_CACHE_DTYPES): "auto" = the plan's activation dtype; "fp8" (= "fp8_e4m3")
    # stores K and V rounded to float8 e4m3 with no scale (vLLM's --kv-cache-dtype fp8 without calibrated
    # scales): half the bytes of a bf16 pool, so twice the tokens per KV budget and half the KV reads per step
    kv_cache_dtype: str = "auto"
    # slots of each slot state kind (recurrent layers' state, one per running request); None: max_num_seqs.
    # A budget-sized config (sized_config) sets it from what the budget holds beside the KV pools.
    num_slots: int | None = None
    # recurrent-state snapshots the prefix cache keeps for plans with slot state (runtime/state/snapshot_store.py):
    # None = as many as num_slots; 0 = no prefix cache for such plans. And every how many blocks a long prompt is
    # snapshotted besides its last block boundaries (0: only there).
    num_snapshot_slots: int | None = None
    snapshot_interval_blocks: int = 0
    # the prefix cache's host-memory tier (runtime/state/host_tier.py): bytes of host memory that keep KV blocks
    # (and a hybrid plan's recurrent-state snapshots) evicted from the device for later prefix hits; 0 = off. Plans
    # of one full-attention KV kind, with or without slot kinds (host_tier_refusal says why another runs without).
    prefix_cache_host_bytes: int = 0
    # speculative decoding (docs/speculative.md): None = off
    speculative: SpeculativeConfig | None = None

    def __post_init__(self):
        checked_kv_cache_dtype(self.kv_cache_dtype)


def prefill_shapes(entry: dict, config: EngineConfig, tiled: bool = False) -> PrefillShapes:
    """The chunk layouts an engine uses: the plan's prefill buckets up to max_batched_tokens, and its
    several-chunks-per-step segments (one chunk per step when deterministic steps run in fixed tiles)."""
    buckets = tuple(b for b in entry["prefill_buckets"] if b <= config.max_batched_tokens) or (16,)
    segments = (1,) if tiled else tuple(entry.get("prefill_segments", (1,)))
    return PrefillShapes(buckets, segments, int(entry.get("segment_max_tokens", 512)))


def kv_dtype(model: Model, kv_cache_dtype: str = "auto") -> np.dtype:
    """The KV pools' dtype of an engine of `model` (runtime/state/kv_dtypes.py)."""
    return _kv_dtype(model.dtype, kv_cache_dtype)


def kv_bytes_per_block(model: Model, block_size: int, kind: str | None = None, kv_cache_dtype: str = "auto") -> int:
    """K and V of one block over the layers of one KV state kind (every paged layer when kind is None):
    2 * layers_of_kind * block_size * hkv * dh * itemsize (of the kv_cache_dtype)."""
    d = model.dims
    paged = {k.name for k in model.paged_kinds}
    layers = sum(1 for k in model.layer_state_kinds if k in paged and (kind is None or k == kind))
    return 2 * layers * block_size * int(d.hkv) * int(d.dh) * kv_dtype(model, kv_cache_dtype).itemsize


def sized_config(
    model: Model, *, kv_memory_bytes: int | None = None, ctx: int | None = None, **overrides
) -> EngineConfig:
    """An EngineConfig whose KV pools fit a memory budget, or whose full-attention pool holds `ctx` tokens in
    all (`--ctx`). Every kind is accounted for: the budget buys the largest full pool whose sliding-window
    pools, sized by their rule (runtime/state/kinds.py), fit beside it.
    EMBER_DETERMINISTIC=1 in the environment turns deterministic mode on."""
    base = EngineConfig(**overrides)
    if kv_memory_bytes is not None and model.slot_kinds and base.num_slots is None:
        # recurrent-state slots first: one per running request (and as many prefix-cache snapshots, unless their
        # count is set), taking at most half of the budget
        per_seq = max(model.slot_bytes(), 1)
        paired = 2 if base.enable_prefix_caching and base.num_snapshot_slots is None else 1
        slots = max(1, min(base.max_num_seqs, kv_memory_bytes // 2 // (per_seq * paired)))
        base = replace(base, num_slots=int(slots))
        kv_memory_bytes -= (slots + engine_snapshot_slots(base)) * per_seq
    if kv_memory_bytes is not None:
        blocks = _full_blocks_for_budget(model, base, kv_memory_bytes)
    elif ctx is not None:
        blocks = math.ceil(ctx / base.block_size)
    else:
        blocks = base.num_blocks - 1
    if blocks < 1:
        raise ValueError("the KV budget holds no block: raise the memory budget or --ctx")
    return replace(base, num_blocks=int(blocks) + 1, deterministic=base.deterministic or _deterministic_from_env())


def host_tier_refusal(model: Model, config: EngineConfig) -> str | None:
    """Why an engine of this model and config keeps no host tier although one was asked for (None: it keeps one,
    or none was asked for). Sliding-window pools are not tiered (a window's hit needs the blocks of every kind at
    once): such plans run with their device prefix cache alone. A hybrid plan (one full-attention KV kind and slot
    kinds) tiers its KV blocks and its recurrent-state snapshots in one budget."""
    if config.prefix_cache_host_bytes <= 0:
        return None
    if not config.enable_prefix_caching:
        return "the prefix cache is off"
    if len(model.paged_kinds) != 1 or model.paged_kinds[0].window:
        return "the plan has sliding-window KV (only a single full-attention KV kind is tiered)"
    if model.slot_kinds and not engine_snapshot_slots(config):
        return "the plan has recurrent state and keeps no snapshots of it (its prefix cache is off)"
    if config.prefix_cache_host_bytes < kv_bytes_per_block(model, config.block_size, None, config.kv_cache_dtype):
        return "the host budget holds no KV block"
    if model.slot_kinds and config.prefix_cache_host_bytes < model.slot_bytes():
        return "the host budget holds no recurrent-state snapshot"
    return None


def capacity_line(model: Model, config: EngineConfig) -> str:
    """What the state pools hold, for `ember serve`'s startup line: the full KV pool's tokens, and for plans with
    recurrent (slot) state how many sequences fit their slots and what one costs."""
    line = f"KV pool {(config.num_blocks - 1) * config.block_size} tokens"
    if model.slot_kinds:
        from ..state.kinds import engine_slots

        line += f", recurrent state for {engine_slots(config)} sequences ({model.slot_bytes() / 2**20:.2f} MiB each)"
        if engine_snapshot_slots(config):
            line += f" and {engine_snapshot_slots(config)} prefix-cache snapshots"
    if config.prefix_cache_host_bytes > 0:
        refusal = host_tier_refusal(model, config)
        per_block = kv_bytes_per_block(model, config.block_size, None, config.kv_cache_dtype)
        blocks = config.prefix_cache_host_bytes // per_block
        held = f"{blocks * config.block_size} tokens"
        if model.slot_kinds:  # one budget: tokens, or snapshots, or a mix
            held += f", or {config.prefix_cache_host_bytes // model.slot_bytes()} recurrent-state snapshots"
        line += (
            f"; prefix-cache host tier off: {refusal}"
            if refusal
            else f"; prefix-cache host tier {config.prefix_cache_host_bytes / 2**30:.2f} GiB ({held})"
        )
    return line


def _full_blocks_for_budget(model: Model, base: EngineConfig, budget: int) -> int:
    """The most usable full-kind blocks n whose pools of every kind (n, or a sliding kind's rule) fit budget."""
    kinds = model.paged_kinds
    per_block = {k.name: kv_bytes_per_block(model, base.block_size, k.name, base.kv_cache_dtype) for k in kinds}

    def cost(n: int) -> int:
        sizes = engine_pool_blocks(kinds, replace(base, num_blocks=n + 1))
        return sum(per_block[name] * (blocks - 1) for name, blocks in sizes.items())

    lo, hi = 0, budget // max(min(per_block.values()), 1) + 1  # cost(hi) > budget: every block costs bytes
    while lo < hi:  # cost is monotone in n
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if cost(mid) <= budget else (lo, mid - 1)
    return lo


def _deterministic_from_env() -> bool:
    return os.environ.get("EMBER_DETERMINISTIC", "") not in ("", "0", "false")
