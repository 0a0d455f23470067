"""Single-request text generation: tokenize, prefill, decode with sampling, stream text, stop on EOS."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Iterator

from .loader.tokenizer import IncrementalDetokenizer, Tokenizer
from .model import Model
from .sampler import SamplingParams, choose
from .sequence_runner import SequenceRunner

# Token texts that end a turn across chat formats (llama.cpp treats the same set as end-of-generation).
END_OF_TURN_TEXTS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<end_of_turn>", "<|end|>", "<|eom_id|>")


@dataclass
class GenerationStats:
    prompt_tokens: int = 0
    generated_tokens: int = 0
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    finish_reason: str = ""
    token_ids: list[int] = field(default_factory=list)

    @property
    def decode_tokens_per_second(self) -> float:
        steps = max(self.generated_tokens - 1, 0)  # the first token comes from the prefill
        return steps / self.decode_seconds if self.decode_seconds > 0 else 0.0

    def summary(self) -> str:
        prefill_rate = self.prompt_tokens / self.prefill_seconds if self.prefill_seconds else 0.0
        return (f"prompt tokens: {self.prompt_tokens} ({prefill_rate:.1f} tok/s), generated tokens: "
                f"{self.generated_tokens} ({self.decode_tokens_per_second:.2f} tok/s decode), "
                f"finish: {self.finish_reason}")


def stop_token_ids(tokenizer: Tokenizer, generation_config: dict) -> set[int]:
    ids = set(tokenizer.eos_token_ids)
    extra = generation_config.get("eos_token_id")
    ids.update(extra if isinstance(extra, list) else ([extra] if isinstance(extra, int) else []))
    for text in END_OF_TURN_TEXTS:
        token_id = tokenizer.token_to_id(text)
        if token_id is not None:
            ids.add(token_id)
    return ids


def generate(model: Model, tokenizer: Tokenizer, prompt_ids: list[int], *, max_tokens: int,
             sampling: SamplingParams, stats: GenerationStats | None = None,
             ignore_eos: bool = False) -> Iterator[str]:
    """Yield text pieces as they become final; fill `stats` as it goes."""
    stats = stats if stats is not None else GenerationStats()
    stats.prompt_tokens = len(prompt_ids)
    if not prompt_ids:
        raise ValueError("the prompt is empty")
    max_context = int(model.dims.max_context) if hasattr(model.dims, "max_context") else 1 << 30
    if len(prompt_ids) + max_tokens > max_context:
        raise ValueError(f"prompt ({len(prompt_ids)} tokens) + max tokens ({max_tokens}) exceed the model's "
                         f"context of {max_context} tokens")
    stops = set() if ignore_eos else stop_token_ids(tokenizer, model.checkpoint.generation_config)
    runner = SequenceRunner(model, len(prompt_ids) + max_tokens)
    detok = IncrementalDetokenizer(tokenizer, prompt_ids, skip_special_tokens=True)
    start = time.perf_counter()
    logits = runner.prefill(prompt_ids)
    stats.prefill_seconds = time.perf_counter() - start
    decode_start = time.perf_counter()
    stats.finish_reason = "length"
    for step in range(max_tokens):
        token = choose(logits, sampling, step)
        stats.token_ids.append(token)
        stats.generated_tokens += 1
        if token in stops:
            stats.finish_reason = "stop"
            break
        piece = detok.push(token)
        if piece:
            yield piece
        if step + 1 < max_tokens:
            logits = runner.decode(token)
    stats.decode_seconds = time.perf_counter() - decode_start
    tail = detok.flush()
    if tail:
        yield tail
