"""The engine's adaptive draft lengths: acceptance learned from what each request emitted after its drafts,
long drafts for a well-predicted row at batch 1, none under load when extra tokens cost their full share."""

from __future__ import annotations

from dataclasses import dataclass, field

from ember.runtime.speculative.adaptive_source import AdaptiveDrafts
from ember.runtime.speculative.drafter import Draft


class FixedDrafter:
    def __init__(self, drafts):
        self.drafts, self.released = drafts, []

    def propose(self, context, k):
        return Draft(tuple(self.drafts[:k]))

    def release(self, request_id):
        self.released.append(request_id)


@dataclass
class Req:
    request_id: str
    output_token_ids: list = field(default_factory=list)
    prompt_token_ids: tuple = (1, 2)
    prediction_ids: tuple = ()


def test_acceptance_is_learned_from_the_emitted_tokens():
    source = AdaptiveDrafts(FixedDrafter([7, 8, 9, 10]), 4, verify_token_cost=0.05, draft_token_cost=0.0)
    good, bad = Req("good"), Req("bad")
    for _ in range(4):
        source.plan([good, bad])
        source(good, 4)
        source(bad, 4)
        good.output_token_ids += [7, 8, 9, 10, 11]  # every draft accepted, then the bonus token
        bad.output_token_ids += [3]  # the first draft rejected
    plan = source.plan([good, bad])
    assert source.tracker.alpha("good") > 0.9 > 0.2 > source.tracker.alpha("bad")
    assert plan == {"good": 4, "bad": 0}
    source.release("good")
    assert source.drafter.released == ["good"] and source.tracker.alpha("good") < 0.9  # back to the prior


def test_no_drafts_under_load_when_tokens_cost_their_share():
    light = AdaptiveDrafts(FixedDrafter([1]), 4, verify_token_cost=0.05, draft_token_cost=0.0)
    assert light.plan([Req("a")]) == {"a": 4}  # the prior alpha (2/3) pays for 4 drafts at batch 1
    heavy = AdaptiveDrafts(FixedDrafter([1]), 4, verify_token_cost=1.0, draft_token_cost=0.0)
    rows = [Req(f"r{i}") for i in range(32)]
    assert set(heavy.plan(rows).values()) == {0}
    crowded = AdaptiveDrafts(FixedDrafter([1]), 4, verify_token_cost=0.05, draft_token_cost=0.0)
    assert sum(crowded.plan(rows).values()) < sum(light.plan([Req("a")]).values()) * 32  # fewer per row
