"""How an engine speculates (`ember serve|generate|bench --speculative ...`, docs/speculative.md step 7)."""

from __future__ import annotations

from dataclasses import dataclass

SPECULATIVE_METHODS = ("ngram", "draft")  # "mtp": the MTP plan's drafter, when it exists


@dataclass(frozen=True)
class SpeculativeConfig:
    method: str = "ngram"  # "ngram": prompt lookup and Predicted Outputs; "draft": a draft model
    num_speculative_tokens: int = 4  # k: most drafts per decode row and step
    draft_model: str | None = None  # "draft": a known model name or a checkpoint path (None: the default's)
    ngram_min_match: int = 2
    ngram_max_match: int = 4

    def __post_init__(self) -> None:
        if self.method not in SPECULATIVE_METHODS:
            raise ValueError(f"unknown speculative method {self.method!r} (one of {', '.join(SPECULATIVE_METHODS)})")
        if not 1 <= self.num_speculative_tokens <= 15:
            raise ValueError(f"num_speculative_tokens must be 1..15, got {self.num_speculative_tokens}")
