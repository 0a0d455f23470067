"""How an engine speculates (`ember serve|generate|bench --speculative ...`, docs/speculative.md step 7)."""

from __future__ import annotations

from dataclasses import dataclass

SPECULATIVE_METHODS = ("ngram", "draft", "mtp")  # mtp: the checkpoint's multi-token-prediction module
# a drafted token's verify cost in batch-1 decode steps, per compiler target: the CPU's from the engine run of
# docs/results/cpu_spec_engine_ngram_8e2588f.json (verify steps of 3.5 drafts, mostly padded to 8 rows, cost ~4
# decode steps on the shared 2-core machine: ~0.85 per draft; 0.6 estimates it without the padding); the GPU's
# from the verify step at k = 1..8 on an H100 (docs/results/h100_spec_bench_00f5b81.json: 0.04-0.18 per draft on
# the 1.5B Q4_K_M shape, 0.01-0.10 on the 8B)
VERIFY_TOKEN_COST = {"cpu": 0.6, "h200": 0.1}
# what a step carrying drafts costs beyond its verify, in the same units, on a target whose plain decode steps
# run ahead several per device call: a drafting step is a call of its own (the host schedules, packs and reads
# it), against one run-ahead step. The same H100 run: a one-step call 3.37 ms against a run-ahead step 1.08 ms
# on the 1.5B Q4_K_M shape (+2.1 steps), 7.96 against 5.62 ms on the 8B (+0.4); the default model's figure
RUN_AHEAD_CALL_OVERHEAD = {"h200": 2.1}

# the draft model of a target that names none (--speculative draft without --draft-model)
DEFAULT_DRAFT_MODELS = {"qwen2.5-coder-1.5b-instruct": "qwen2.5-coder-0.5b-instruct"}


@dataclass(frozen=True)
class SpeculativeConfig:
    method: str = "ngram"  # "ngram": prompt lookup and Predicted Outputs; "draft": a draft model
    num_speculative_tokens: int = 4  # k: most drafts per decode row and step
    draft_model: str | None = None  # "draft": a known model name or a checkpoint path (None: the default's)
    ngram_min_match: int = 2
    ngram_max_match: int = 4
    # adaptive k (runtime/speculative/adaptive_source.py): per-request acceptance and a linear step-cost model
    # in units of a batch-1 decode step (an extra verified token costs verify_token_cost of it: None = the
    # target's figure in VERIFY_TOKEN_COST; a drafted token draft_token_cost: None = 0 for lookup, 0.3 for a
    # draft model)
    adaptive: bool = True
    verify_token_cost: float | None = None
    draft_token_cost: float | None = None

    def __post_init__(self) -> None:
        if self.method not in SPECULATIVE_METHODS:
            raise ValueError(f"unknown speculative method {self.method!r} (one of {', '.join(SPECULATIVE_METHODS)})")
        if not 1 <= self.num_speculative_tokens <= 15:
            raise ValueError(f"num_speculative_tokens must be 1..15, got {self.num_speculative_tokens}")


def speculative_config(method: str | None, draft_model: str | None, k: int, target_model: str):
    """The CLI flags' SpeculativeConfig (None when method is None); ValueError for a bad method or k, or a draft
    method without a draft model for a target that has no default one."""
    if method is None:
        return None
    if method == "draft" and draft_model is None:
        draft_model = DEFAULT_DRAFT_MODELS.get(target_model)
        if draft_model is None:
            raise ValueError(f"--speculative draft needs --draft-model: {target_model!r} has no default draft model")
    return SpeculativeConfig(method, num_speculative_tokens=k, draft_model=draft_model)
