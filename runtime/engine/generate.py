"""Single-request text generation on the engine (what `ember generate` runs)."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from dataclasses import dataclass

from ..loading.model import Model
from ..sampling.params import SamplingParams
from ..speculative.config import SpeculativeConfig
from ..speculative.stats import AcceptanceStats
from .engine import Engine, EngineConfig
from .streams import Usage


@dataclass
class GenerationStats:
    usage: Usage | None = None
    finish_reason: str = ""
    wall_s: float = 0.0
    speculation: AcceptanceStats | None = None  # when the engine speculated

    def summary(self) -> str:
        u = self.usage
        if u is None:
            return "no output"
        decode_tokens = max(u.completion_tokens - 1, 0)  # the first token comes with the prefill
        decode_rate = decode_tokens / u.decode_s if u.decode_s > 0 else 0.0
        return (
            f"prompt tokens: {u.prompt_tokens} (ttft {u.ttft_s:.2f}s), generated tokens: "
            f"{u.completion_tokens} ({decode_rate:.2f} tok/s decode), finish: {self.finish_reason}"
        ) + (
            f", speculation: {s.num_accepted_tokens}/{s.num_draft_tokens} drafts accepted, "
            f"mean acceptance length {s.mean_acceptance_length:.2f}"
            if (s := self.speculation) is not None
            else ""
        )


def engine_for_one_request(
    model: Model, tokenizer, eos_ids: frozenset[int], context: int, speculative: SpeculativeConfig | None = None
) -> Engine:
    block_size = 16
    config = EngineConfig(
        num_blocks=math.ceil(context / block_size) + 2,
        block_size=block_size,
        max_model_len=context,
        max_num_seqs=1,
        max_batched_tokens=512,
        speculative=speculative,
    )
    return Engine(model, tokenizer, config, stop_token_ids=eos_ids)


def generate(
    model: Model,
    tokenizer,
    prompt_ids: list[int],
    params: SamplingParams,
    *,
    eos_ids: frozenset[int],
    stats: GenerationStats | None = None,
    speculative: SpeculativeConfig | None = None,
) -> Iterator[str]:
    """Yield the text of one completion as it becomes final; fill `stats` at the end."""
    stats = stats if stats is not None else GenerationStats()
    max_context = int(getattr(model.dims, "max_context", 1 << 30))
    max_tokens = params.max_tokens or (max_context - len(prompt_ids))
    if len(prompt_ids) + max_tokens > max_context:
        raise ValueError(
            f"prompt ({len(prompt_ids)} tokens) + max tokens ({max_tokens}) exceed the model's "
            f"context of {max_context} tokens"
        )
    engine = engine_for_one_request(model, tokenizer, eos_ids, len(prompt_ids) + max_tokens, speculative)
    start = time.perf_counter()
    try:
        for output in engine.submit(prompt_ids, params):
            if output.text:
                yield output.text
            if output.finish_reason is not None:
                stats.finish_reason = output.finish_reason
            if output.usage is not None:
                stats.usage = output.usage
    finally:
        if speculative is not None:
            stats.speculation = engine.speculation_stats()
        engine.close()
        stats.wall_s = time.perf_counter() - start
