"""Run-ahead plans in the scheduler (runtime/scheduling/run_ahead.py): a chained plan is the same rows `steps`
positions further with KV for them, only while nobody waits and somebody will still be running; plans are
updated in dispatch order; a failed or dropped chained plan leaves the pool consistent."""

from dataclasses import replace

import pytest
from test_scheduler import check_invariants, make, prompt_of, request

from ember.runtime.scheduling.scheduled_step import slots_at

STEPS = 4


def _decoding(s, mock, n_requests=2, max_tokens=40):
    for i in range(n_requests):
        s.add(request(f"r{i}", prompt_of(5, i), max_tokens=max_tokens, stop=()))
    while True:  # prefill until every request is a decode row
        plan = s.schedule()
        if not plan.prefills:
            return plan
        s.update(plan, mock.run(plan))


def _apply(s, mock, plan):
    """What the device does for each step of `plan` (the mock checks every slot it writes and what attention
    reads), then update_ahead; each row's input token is the one sampled at the step before, as on the device."""
    bs = s.pool.block_size
    for step in range(STEPS):
        rows = tuple(
            replace(
                r,
                position=r.position + step,
                token_id=s.get(r.request_id).all_token_ids[r.position + step],
                slots=slots_at(plan.block_tables[r.request_id], r.position + step, bs),
            )
            for r in plan.decodes
        )
        s.update_ahead(plan, step, mock.run(replace(plan, decodes=rows)))


def test_a_chained_plan_is_the_next_steps_with_their_blocks():
    s, mock = make(block_size=4)
    plan = s.extend_decodes(_decoding(s, mock), STEPS)
    chained = s.chain_decodes(plan, STEPS)
    assert [r.request_id for r in chained.decodes] == [r.request_id for r in plan.decodes]
    for row, nxt in zip(plan.decodes, chained.decodes):
        assert nxt.position == row.position + STEPS
        table = chained.block_tables[row.request_id][0]
        assert len(table) * 4 >= nxt.position + STEPS  # blocks for every position the chained call writes
        assert 0 not in table
    with pytest.raises(RuntimeError):
        s.schedule()  # plans in flight: no new plan until they are applied
    with pytest.raises(RuntimeError):
        s.update_ahead(chained, 0, [1, 1])  # not the oldest
    _apply(s, mock, plan)
    _apply(s, mock, chained)
    check_invariants(s)
    assert all(r.num_computed_tokens == row.position + 2 * STEPS for r, row in zip(s.running, plan.decodes))
    s.schedule()  # free to plan again


def test_no_chain_while_a_request_waits_or_when_every_row_ends_in_the_call():
    s, mock = make()
    plan = s.extend_decodes(_decoding(s, mock), STEPS)
    s.add(request("late", prompt_of(3, 9)))
    assert s.chain_decodes(plan, STEPS) is None
    s2, mock2 = make()
    first = _decoding(s2, mock2, max_tokens=5)  # one token from the prefill, 4 decode steps left: all in `plan`
    plan2 = s2.extend_decodes(first, STEPS)
    assert s2.chain_decodes(plan2, STEPS) is None


def test_an_aborted_row_stops_chaining_and_a_dropped_chain_frees_nothing_twice():
    s, mock = make()
    plan = s.extend_decodes(_decoding(s, mock), STEPS)
    chained = s.chain_decodes(plan, STEPS)
    s.discard_ahead(chained)  # the call before it failed
    assert s.drop_failed(plan) and not s.drop_failed(plan)
    for r in list(s.running):
        s.abort(r.request_id)
    check_invariants(s)
    assert s.pool.free_blocks == s.pool.num_usable_blocks
    s3, mock3 = make()
    plan3 = s3.extend_decodes(_decoding(s3, mock3), STEPS)
    s3.abort(plan3.decodes[0].request_id)
    assert s3.chain_decodes(plan3, STEPS) is None  # a row is gone: the host looks at the tokens first


def _prefilled(s, mock, plan):
    """Apply the prefill step `plan` after a call chained behind it: what the device's prefill samples."""
    s.update(plan, mock.run(plan))


def test_a_prefill_that_completes_its_prompts_chains_their_first_decode_call():
    s, mock = make(block_size=4, segments=(1, 2))  # both prompts in one step
    for i in range(2):
        s.add(request(f"r{i}", prompt_of(5 + i, i), max_tokens=20, stop=()))
    plan = s.schedule()
    assert not plan.decodes and all(c.completes for c in plan.prefills)
    chained = s.chain_after_prefill(plan, STEPS)
    assert [r.request_id for r in chained.decodes] == list(plan.logit_request_ids)
    for row, chunk in zip(chained.decodes, plan.prefills):
        assert row.position == chunk.start + chunk.num_tokens  # the token the prefill samples goes here
        assert len(chained.block_tables[row.request_id][0]) * 4 >= row.position + STEPS
    with pytest.raises(RuntimeError):
        s.schedule()  # in flight: the prefill's update and the chained plan's come first
    _prefilled(s, mock, plan)
    again = s.chain_decodes(chained, STEPS)  # the chain goes on from there, before `chained` is applied
    assert again is not None and again.decodes[0].position == chained.decodes[0].position + STEPS
    _apply(s, mock, chained)
    check_invariants(s)
    assert all(r.num_computed_tokens == row.position + STEPS for r, row in zip(s.running, chained.decodes))
    _apply(s, mock, again)
    s.schedule()


def test_no_chain_after_a_prefill_with_decodes_a_partial_chunk_a_waiter_or_a_last_token():
    s, mock = make()
    decoding = _decoding(s, mock, n_requests=1)
    s.update(decoding, mock.run(decoding))
    s.add(request("new", prompt_of(4, 7), max_tokens=20, stop=()))
    mixed = s.schedule()
    assert mixed.decodes and mixed.prefills and s.chain_after_prefill(mixed, STEPS) is None
    s2, _ = make(budget=16)
    s2.add(request("long", prompt_of(40, 1), max_tokens=20, stop=()))
    partial = s2.schedule()
    assert not partial.prefills[0].completes and s2.chain_after_prefill(partial, STEPS) is None
    s3, _ = make()
    s3.add(request("a", prompt_of(5, 2), max_tokens=20, stop=()))
    first = s3.schedule()
    s3.add(request("b", prompt_of(5, 3), max_tokens=20, stop=()))  # arrives while the prefill is planned
    assert s3.chain_after_prefill(first, STEPS) is None
    s4, mock4 = make()
    s4.add(request("one", prompt_of(5, 4), max_tokens=1, stop=()))  # ends with the prefill's token
    only = s4.schedule()
    assert s4.chain_after_prefill(only, STEPS) is None
    s4.update(only, mock4.run(only))
    check_invariants(s4)
    assert s4.pool.free_blocks == s4.pool.num_usable_blocks


def test_a_request_ending_at_its_first_token_skips_the_chained_call_and_frees_its_blocks():
    s, mock = make()
    s.add(request("eos", prompt_of(5, 5), max_tokens=20, stop=()))
    plan = s.schedule()
    chained = s.chain_after_prefill(plan, STEPS)
    s.update(plan, mock.run(plan))
    s.abort("eos")  # as a stop at the first token would: the chained call's rows are skipped
    for step in range(STEPS):
        assert s.update_ahead(chained, step, [1]) == []
    check_invariants(s)
    assert s.pool.free_blocks == s.pool.num_usable_blocks
