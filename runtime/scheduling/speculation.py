"""Speculative decoding in the scheduler (docs/speculative.md, steps 1 and 3): which decode rows carry drafts
and how many, the verify segment a row with drafts becomes, and the KV rollback after its verification.

Drafts come from a `DraftSource` the engine gives the scheduler (a drafter of runtime/speculative/ behind it):
the scheduler knows nothing of where they come from. Policies:
- A step that admits or continues a prefill carries no drafts: verify steps hold only decode rows and verify
  segments, whose layouts are short (L <= 16) and compiled apart from the prefill layouts.
- k per row is capped so that max_tokens is never passed (a verify segment emits up to k + 1 tokens), hence
  never the context either (max_tokens already fits it); teacher-forced rows never draft.
- The drafts' KV is allocated before the step like a decode's; when the pool cannot hold them the row decodes
  plainly (drafts never preempt anyone). After the step the rejected drafts' positions are simply not
  counted, and the blocks past the next step's need go back (`KVCache.shrink`).
- Run-ahead calls (several decode steps per device call, runtime/scheduling/lookahead.py) carry no drafts: while
  the source would draft for any running row, every decode call is scheduled afresh, one step per call, so each
  step asks the source with the latest tokens (`plans_drafts`). An adaptive source that plans no drafts for
  anyone (verification not worth it at this batch) lets run-ahead resume.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..state.kv_cache import KVCache
from .requests import Request
from .scheduled_step import ScheduledStep, VerifySegment, slots_at

# (request, most drafts) -> its drafts (maybe none): token ids, or a proposal with `token_ids` and `probs` (the
# drafts' distributions q [k, V'] of a sampling model drafter, or None: point masses)
DraftSource = Callable[[Request, int], Any]


def draft_lengths(source: DraftSource | None, k: int, waiting, running: Sequence[Request]) -> dict[str, int]:
    """The most drafts of each running request this step: none unless the step holds decode rows alone (no
    prefill waiting or under way); else k each, or what the source's `plan(requests)` says (an adaptive
    source, runtime/speculative/adaptive_source.py), capped at k."""
    if source is None or k <= 0 or waiting or any(r.num_tokens_to_compute != 1 for r in running):
        return {}
    plan = getattr(source, "plan", None)
    if plan is None:
        return {r.request_id: k for r in running}
    return {rid: min(n, k) for rid, n in plan(running).items()}


def plans_drafts(source: DraftSource | None, k: int, running: Sequence[Request]) -> bool:
    """Whether the source would draft for any of `running` at its next step (k each, or its plan's counts)."""
    if source is None or k <= 0 or not running:
        return False
    would_draft = getattr(source, "would_draft", None)
    if would_draft is not None:
        return would_draft(running)
    plan = getattr(source, "plan", None)
    return plan is None or any(n > 0 for n in plan(running).values())


def draft_limit(request: Request, k: int) -> int:
    """The most drafts the request's next decode row may carry (0: decode plainly)."""
    if getattr(request.params, "forced_token_ids", None) is not None:
        return 0
    return max(0, min(k, request.max_tokens - len(request.output_token_ids) - 1))


def take_drafts(kv: KVCache, request: Request, source: DraftSource, k: int) -> tuple[tuple[int, ...], Any]:
    """(drafts, their q rows or None) of `request`'s next decode row, its KV grown for them; ((), None) when
    there are none or no room."""
    k = draft_limit(request, k)
    if k <= 0:
        return (), None
    proposal = source(request, k)
    drafts = tuple(int(t) for t in getattr(proposal, "token_ids", proposal))[:k]
    probs = getattr(proposal, "probs", None)
    if drafts and kv.grow(request.state, request.num_computed_tokens + 1 + len(drafts)):
        return drafts, None if probs is None else probs[: len(drafts)]
    return (), None


def verify_segment(request: Request, drafts: tuple[int, ...], tables, block_size: int, probs=None) -> VerifySegment:
    start = request.num_computed_tokens
    return VerifySegment(
        request.request_id,
        start,
        (request.all_token_ids[start], *drafts),
        tuple(slots_at(tables, p, block_size) for p in range(start, start + 1 + len(drafts))),
        probs,
    )


def settle_verified(kv: KVCache, request: Request) -> None:
    """After a verify step whose emitted tokens were appended: its computed count (tokens after a stop were
    dropped: no further than the last kept one), the prefix cache's commit, and the blocks past what the next
    step needs (its computed tokens + the one it decodes) handed back."""
    request.num_computed_tokens = min(request.num_computed_tokens, request.num_tokens - 1)
    kv.commit(request.state, request.all_token_ids, request.num_computed_tokens)
    kv.shrink(request.state, request.num_computed_tokens + 1)


def emitted_by_row(step: ScheduledStep, sampled: Sequence) -> dict[str, tuple[int, ...]]:
    """Scheduler.update's tokens per logit row: a token, or a verify row's tokens (a tuple or list)."""
    return {
        rid: tuple(int(t) for t in one) if isinstance(one, tuple | list) else (int(one),)
        for rid, one in zip(step.logit_request_ids, sampled)
    }
