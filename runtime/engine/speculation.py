"""The engine's drafter: which configurations may speculate, and the scheduler's DraftSource over a drafter
(runtime/scheduling/speculation.py, runtime/speculative/)."""

from __future__ import annotations

from ..loading.model import Model
from ..scheduling.recurrent_rollback import RecurrentRollback
from ..scheduling.requests import Request
from ..scheduling.speculation import DraftSource
from ..speculative.adaptive_source import AdaptiveDrafts
from ..speculative.config import RUN_AHEAD_CALL_OVERHEAD, VERIFY_TOKEN_COST, SpeculativeConfig
from ..speculative.drafter import Draft, Drafter, draft_context
from ..speculative.ngram import NgramConfig, NgramDrafter
from ..state.kinds import engine_slots, engine_snapshot_slots


def check_speculation(model: Model, speculative: SpeculativeConfig, deterministic: bool) -> None:
    """Refuse what speculation does not support yet, with the reason (ValueError)."""
    if deterministic and not model.policy.deterministic.bucketed:
        raise ValueError(
            f"--speculative cannot be combined with --deterministic on the {model.plan.target} target: its "
            "deterministic steps run in tiles of one fixed shape, where a verify segment's rows take the prefill "
            "tile's kernels and are not proven to give a decode row's logits bits (docs/speculative.md)"
        )
    if deterministic and speculative.method == "mtp":
        raise ValueError(
            "--speculative mtp cannot be combined with --deterministic: its steps also return hidden states, a "
            "different executable from the deterministic decode step's, not proven to give the same bits"
        )
    if speculative.method == "draft" and speculative.draft_model is None:
        raise ValueError("--speculative draft needs a draft model (--draft-model)")
    if speculative.method == "mtp" and not model.has_mtp:
        raise ValueError(
            f"--speculative mtp needs a checkpoint with a multi-token-prediction module ({model.checkpoint.path} "
            "has none, or it was loaded with with_mtp=False)"
        )


def verify_rollback(model: Model, config) -> RecurrentRollback | None:
    """The scheduler's rollback of rejected drafts' recurrent state (plans with slot kinds, when speculating)."""
    if config.speculative is None or not model.slot_kinds:
        return None
    return RecurrentRollback(engine_slots(config) + engine_snapshot_slots(config), [k.name for k in model.slot_kinds])


def make_drafter(speculative: SpeculativeConfig, model: Model, config) -> Drafter:
    """The engine's drafter; a draft model is loaded here (a known name or a path), for the target's target."""
    k = speculative.num_speculative_tokens
    if speculative.method == "ngram":
        return NgramDrafter(NgramConfig(speculative.ngram_min_match, speculative.ngram_max_match, max_drafts=k))
    if speculative.method == "mtp":
        from ..speculative.mtp_drafter import MtpDrafter
        from ..speculative.step_hidden_states import StepHiddenStates

        # the target's hidden states as the engine's own steps return them (the executor's hidden_sink is the
        # store's record: attach_step_hidden_states); sampled rows' drafts come with their q (row_draws.py)
        hidden = StepHiddenStates(int(model.dims.d))
        return MtpDrafter(model, hidden, max_model_len=config.max_model_len)
    from ..loading.known_models import resolve_model
    from ..loading.model import load_model
    from ..speculative.model_drafter import ModelDrafter

    draft = load_model(resolve_model(speculative.draft_model), target=model.plan.target)
    return ModelDrafter(draft, config, int(model.dims.vocab))


def attach_step_hidden_states(drafter: Drafter | None, executor) -> None:
    """Let a drafter that reads the target's hidden states (`StepHiddenStates`) receive every step's."""
    record = getattr(getattr(drafter, "hidden_states", None), "record", None)
    if record is not None and executor.with_hidden:
        executor.hidden_sink = record


def engine_draft_source(
    speculative: SpeculativeConfig, drafter: Drafter, target: str, decode_steps: int
) -> DraftSource:
    """The scheduler's DraftSource: adaptive (a plan per step, runtime/speculative/adaptive_source.py) or k for
    every row. Its `release` hands a request's drafter state back (the scheduler's on_release). decode_steps: the
    executor's plain decode steps per call; above 1 a drafting step costs a call of its own
    (RUN_AHEAD_CALL_OVERHEAD)."""
    if not speculative.adaptive:
        return PlainDrafts(drafter)
    cost = speculative.draft_token_cost
    if cost is None:
        cost = 0.0 if speculative.method == "ngram" else 0.3
    verify_cost = speculative.verify_token_cost
    if verify_cost is None:
        verify_cost = VERIFY_TOKEN_COST.get(target, 0.05)
    call_overhead = RUN_AHEAD_CALL_OVERHEAD.get(target, 0.0) if decode_steps > 1 else 0.0
    return AdaptiveDrafts(drafter, speculative.num_speculative_tokens, verify_cost, cost, call_overhead)


class PlainDrafts:
    """The scheduler's view of a drafter without a plan: (request, most drafts) -> the drafter's Draft.
    row_state (request id -> RowState, set by the engine) lets a model drafter sample as the request does."""

    def __init__(self, drafter: Drafter):
        self.drafter, self.row_state = drafter, None
        self.release = drafter.release

    def __call__(self, request: Request, k: int) -> Draft:
        return self.drafter.propose(draft_context(request, self.row_state), k)


def draft_source(drafter: Drafter) -> DraftSource:
    """The scheduler's view of a drafter: (request, most drafts) -> drafts."""
    return PlainDrafts(drafter)
