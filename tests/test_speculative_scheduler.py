"""The scheduler's verify segments against a mock model (no device): drafts of random quality give exactly the
tokens of plain decoding, rejected drafts' blocks go back after every step, stops and max_tokens cut the
emitted tokens, prefills carry no drafts, and the KV pool is whole at the end."""

from __future__ import annotations

import random

from test_scheduler import STOP, generate_alone, next_token

from ember.runtime.scheduling.requests import Request
from ember.runtime.scheduling.scheduler import Scheduler
from ember.runtime.state.block_pool import BlockPool


def _verify(step, tokens_of) -> list:
    """The mock target's results: a token per decode/prefill row, the emitted tokens of each verify segment
    (its drafts while they equal the target's pick, then the pick)."""
    out = []
    segments = {v.request_id: v for v in step.verifies}
    for rid in step.logit_request_ids:
        context = tokens_of(rid)
        if rid not in segments:
            out.append(next_token(context))
            continue
        emitted = []
        for draft in (*segments[rid].drafts, None):
            pick = next_token(context + emitted)
            emitted.append(pick)
            if pick != draft:
                break
        out.append(emitted)
    return out


def test_random_drafts_give_plain_tokens_and_blocks_come_back():
    rng = random.Random(4)
    prompts = [[rng.randrange(1, 64) for _ in range(rng.randrange(3, 40))] for _ in range(12)]
    truth = {f"r{i}": generate_alone(p, 40) for i, p in enumerate(prompts)}

    def drafts(request, k):  # right for a random while, then wrong
        done, good = len(request.output_token_ids), rng.randrange(0, k + 1)
        right = truth[request.request_id][done : done + k]
        return [t if i < good else (t + 1) % 64 for i, t in enumerate(right)][: rng.randrange(0, k + 1)]

    pool = BlockPool(40, 4)  # 4 sequences of up to 80 tokens do not fit together: preemptions
    scheduler = Scheduler(pool, 4, 64, 64, (16, 32), draft_source=drafts, num_speculative_tokens=5)
    requests = {}
    for i, prompt in enumerate(prompts):
        requests[f"r{i}"] = Request(f"r{i}", prompt, 40, stop_token_ids=frozenset({STOP}))
        scheduler.add(requests[f"r{i}"])
    verified = 0
    while scheduler.has_work:
        step = scheduler.schedule()
        assert not (step.verifies and step.prefills)
        for segment in step.verifies:
            request = requests[segment.request_id]
            assert len(segment.drafts) <= min(5, request.max_tokens - len(request.output_token_ids) - 1)
        verified += len(step.verifies)
        scheduler.update(step, _verify(step, lambda rid: list(requests[rid].all_token_ids)))
        for segment in step.verifies:  # a rejected draft's blocks went back
            request = requests[segment.request_id]
            if request.state:
                held = len(request.state["kv"].block_table)
                assert (
                    pool.blocks_for(request.num_computed_tokens)
                    <= held
                    <= pool.blocks_for(request.num_computed_tokens + 1)
                )
        pool.check_consistency()
    assert verified > 10 and scheduler.num_preemptions > 0  # drafts met a dry pool and preemption
    for rid, request in requests.items():
        assert request.output_token_ids == truth[rid]
    assert pool.free_blocks == pool.num_usable_blocks


def test_tokens_after_a_stop_or_max_tokens_are_dropped():
    prompt = [5, 9, 13, 2]
    truth = generate_alone(prompt, 12, stop=())
    for stop_at, max_tokens in ((3, 12), (None, 4)):
        stop = frozenset({truth[stop_at]}) if stop_at is not None else frozenset()
        expected = generate_alone(prompt, max_tokens, stop=tuple(stop))
        oracle = lambda request, k: truth[len(request.output_token_ids) :][:k]  # noqa: E731 — every draft right
        pool = BlockPool(32, 4)
        scheduler = Scheduler(pool, 2, 64, 8, (16,), draft_source=oracle, num_speculative_tokens=8)
        request = Request("a", prompt, max_tokens, stop_token_ids=stop)
        scheduler.add(request)
        while scheduler.has_work:
            step = scheduler.schedule()
            scheduler.update(step, _verify(step, lambda rid: list(request.all_token_ids)))
        assert request.output_token_ids == expected
        assert pool.free_blocks == pool.num_usable_blocks
