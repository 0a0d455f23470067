"""The measured gate over the adaptive plan (runtime/speculative/measured_gate.py): drafts go through while
drafting steps yield tokens no slower than plain ones, are held back once they are measured slower (with
drafting probes ever further apart to notice a change), and plain probes keep the baseline current; intervals
across a prefill are not counted."""

from __future__ import annotations

from dataclasses import dataclass, field

from ember.runtime.speculative.measured_gate import (
    MAX_PROBE_EVERY,
    MIN_SAMPLES,
    PROBE_BUDGET,
    PROBE_EVERY,
    MeasuredGate,
)


@dataclass
class Req:
    request_id: str
    output_token_ids: list = field(default_factory=list)


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def run(gate, clock, rows, steps, plain_s, drafting_s, drafted_tokens):
    """`steps` scheduling steps with a plan of 4 drafts per row; a drafting step takes drafting_s and emits
    drafted_tokens per row, a plain one plain_s and one token. Returns how many steps drafted."""
    drafted = 0
    for _ in range(steps):
        ks = gate.admit(rows, {r.request_id: 4 for r in rows})
        drafts = any(ks.values())
        drafted += drafts
        clock.now += drafting_s if drafts else plain_s
        for r in rows:
            r.output_token_ids += [1] * (drafted_tokens if drafts else 1)
    return drafted


def test_drafts_go_through_while_drafting_pays_with_plain_probes():
    clock = Clock()
    gate = MeasuredGate(clock)
    drafted = run(gate, clock, [Req("a")], 200, plain_s=0.05, drafting_s=0.08, drafted_tokens=3)
    assert not gate.drafting_loses and min(gate.samples.values()) >= MIN_SAMPLES
    assert abs(gate.seconds_per_token[True] - 0.08 / 3) < 1e-9 and abs(gate.seconds_per_token[False] - 0.05) < 1e-9
    assert 200 - 200 // 4 <= drafted < 200  # plain probes only: ~1 step in PROBE_EVERY


def test_drafting_that_costs_more_per_token_is_held_back_with_drafting_probes():
    clock = Clock()
    gate = MeasuredGate(clock)  # a draft model that is right but slow: 3 tokens in 8 plain steps' time
    drafted = run(gate, clock, [Req("a")], 400, plain_s=0.05, drafting_s=0.4, drafted_tokens=3)
    assert gate.drafting_loses
    assert drafted <= 6 + 4 * MIN_SAMPLES  # learning, then drafting probes ever further apart (16, 32, 64, ...)
    more = run(gate, clock, [Req("a")], 1000, plain_s=0.05, drafting_s=0.4, drafted_tokens=3)
    assert more <= 1000 // MAX_PROBE_EVERY + 2
    # the same gate notices when drafting becomes cheap (e.g. the load changed): a probe that pays looks again soon
    late = run(gate, clock, [Req("a")], 600, plain_s=0.05, drafting_s=0.06, drafted_tokens=3)
    assert not gate.drafting_loses and late > 300


def test_costly_drafting_probes_are_spaced_to_cost_a_small_share_of_decoding():
    """A draft model's probe catches its KV up first (a prefill of the prompt on a request's first probe): here 2 s
    for 3 tokens against 0.05 s a plain token. Once the gate has closed, the probes' extra time stays within the
    budget's share of the plain decoding time, not one probe per MAX_PROBE_EVERY steps (~13% here)."""
    clock = Clock()
    gate = MeasuredGate(clock)
    run(gate, clock, [Req("a")], 100, plain_s=0.05, drafting_s=2.0, drafted_tokens=3)  # learns, closes, backs off
    assert gate.drafting_loses
    steps = 8000
    probes = run(gate, clock, [Req("a")], steps, plain_s=0.05, drafting_s=2.0, drafted_tokens=3)
    extra_s = probes * (2.0 - 3 * 0.05)
    assert 1 <= probes and extra_s <= 1.5 * PROBE_BUDGET * steps * 0.05, (probes, extra_s)


def test_a_compile_stall_does_not_close_the_gate():
    clock = Clock()
    gate = MeasuredGate(clock)
    run(gate, clock, [Req("a")], 40, plain_s=0.05, drafting_s=0.08, drafted_tokens=3)
    gate.admit([Req("a")], {"a": 4})
    gate.recent[True].append(5.0)  # a drafting step that compiled its verify shape first
    assert not gate.drafting_loses


def test_an_interval_across_a_prefill_is_not_a_sample():
    clock = Clock()
    gate = MeasuredGate(clock)
    a, b = Req("a"), Req("b")
    gate.admit([a], {"a": 4})
    clock.now += 5.0  # a long prefill of b ran here
    a.output_token_ids += [1, 2, 3]
    b.output_token_ids += [9]
    gate.admit([a, b], {"a": 4, "b": 4})
    assert gate.samples == {True: 0, False: 0}


def test_a_run_ahead_target_asks_and_a_probe_comes_due_while_it_runs_ahead():
    clock = Clock()
    gate = MeasuredGate(clock)
    gate.recent[True].extend([0.3] * MIN_SAMPLES)  # drafting loses
    gate.recent[False].extend([0.1] * MIN_SAMPLES)
    a, drafted = Req("a"), 0
    for _ in range(2 * PROBE_EVERY):
        if gate.would_draft({"a": 4}):  # the engine schedules a step instead of chaining a run-ahead call
            drafted += any(gate.admit([a], {"a": 4}).values())
    assert 1 <= drafted <= 2  # mostly "run ahead plainly", a drafting probe when one is due
    assert gate.would_draft({"a": 0}) is False  # nothing planned: never
