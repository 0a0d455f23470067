"""Scheduler against a mock plan (no model): budget packing, chunking, prefix hits, preemption,
admission limits, aborts at every state, and a randomized soak.

MockPlan keeps a shadow KV pool of token ids indexed by flat slot. Each step it checks that every slot
it is told to write belongs to that request's own, unshared, uncommitted block, writes the token ids,
then reads each logit row's whole context back through the request's block table and "computes" the
next token from what it read — so a wrong table, slot or shared-block write changes the output.
"""

from __future__ import annotations

import random
from collections import Counter

import numpy as np
import pytest
from scheduler_support import soak

from ember.runtime.scheduling.requests import QueueFullError, Request, RequestStatus, RequestTooLongError
from ember.runtime.scheduling.scheduled_step import PrefillShapes, ScheduledStep
from ember.runtime.scheduling.scheduler import Scheduler
from ember.runtime.state.block_pool import BlockPool
from ember.runtime.state.kinds import window_pool_blocks
from ember.runtime.state.kv_cache import KVCache
from ember.runtime.state.slot_pool import SlotPool

VOCAB = 64
STOP = 0
_WEIGHTS = np.random.default_rng(7).integers(1, 1 << 20, size=4096)


def next_token(context) -> int:
    """The mock model: depends on every token of the context and its position."""
    context = np.asarray(context, np.int64)
    return int((context * _WEIGHTS[: len(context)]).sum() % 1_000_003 % VOCAB)


def generate_alone(prompt: list[int], max_tokens: int, stop=(STOP,)) -> list[int]:
    context, out = list(prompt), []
    while len(out) < max_tokens:
        out.append(next_token(context))
        context.append(out[-1])
        if out[-1] in stop:
            break
    return out


class MockPlan:
    """Shadow pools, one per KV state kind. A sliding kind is checked only inside each query's window (what
    the attention mask lets it read); the full kind over the whole context."""

    def __init__(self, scheduler: Scheduler):
        self.scheduler = scheduler
        kv = scheduler.kv
        self.shadow = {k.name: np.full(kv.pools[k.name].num_blocks * kv.block_size, -1, np.int64) for k in kv.kinds}

    def run(self, plan: ScheduledStep) -> list[int]:
        kv, bs = self.scheduler.kv, self.scheduler.kv.block_size
        assert plan.num_tokens <= self.scheduler.max_batched_tokens and plan.num_kinds == len(kv.kinds)
        writes = [(r.request_id, r.position, r.slots, r.token_id) for r in plan.decodes]
        for c in plan.prefills:
            writes += [(c.request_id, c.start + i, c.slots[i], c.token_ids[i]) for i in range(c.num_tokens)]
        assert all(c.completes for c in plan.prefills[:-1]), "only the last chunk may stop short of its prompt"
        assert len({c.request_id for c in plan.prefills}) == len(plan.prefills)
        for request_id, pos, slots, token in writes:
            for k, kind in enumerate(kv.kinds):
                pool, slot = kv.pools[kind.name], slots[k]
                block = slot // bs
                assert block != 0 and block == plan.block_tables[request_id][k][pos // bs] and slot % bs == pos % bs
                assert pool.ref_count(block) == 1, f"write into shared block {block}"
                assert pool.hash_of(block) is None, f"write into committed block {block}"
                owners = [r.request_id for r in self.scheduler.running if block in r.state[kind.name].block_table]
                assert owners == [request_id], f"block {block} owned by {owners}"
                self.shadow[kind.name][slot] = token
        sampled = []
        rows = [(r.request_id, r.position, True) for r in plan.decodes]
        for c in plan.prefills:  # the chunk's first query reaches furthest back; its last one gives logits
            rows += [(c.request_id, c.start, False), (c.request_id, c.end - 1, c.completes)]
        for request_id, last, logits in rows:
            truth = self.scheduler.get(request_id).all_token_ids[: last + 1]
            for k, kind in enumerate(kv.kinds):
                table = np.asarray(plan.block_tables[request_id][k])
                first = max(0, last - kind.window + 1) if kind.window else 0
                pos = np.arange(first, last + 1)
                context = self.shadow[kind.name][table[pos // bs] * bs + pos % bs]  # the reads attention would do
                assert context.tolist() == truth[first:], f"{request_id} reads a corrupted {kind.name} context"
            if logits:
                sampled.append(next_token(truth))
        self.check_window_holdings(plan)
        assert len(sampled) == len(plan.logit_rows)
        return sampled

    def check_window_holdings(self, plan: ScheduledStep) -> None:
        """A sliding kind holds at most ceil(W / bs) + 1 blocks per decode row, + ceil(C / bs) in a chunk."""
        kv, bs = self.scheduler.kv, self.scheduler.kv.block_size
        chunks = {c.request_id: c.num_tokens for c in plan.prefills}
        for request_id, tables in plan.block_tables.items():
            extra = -(-chunks.get(request_id, 0) // bs)
            for k, kind in enumerate(kv.kinds):
                if kind.window:
                    held = sum(1 for b in tables[k] if b)
                    assert held <= -(-kind.window // bs) + 1 + extra, (request_id, kind.name, tables[k])


def check_invariants(s: Scheduler) -> None:
    s.kv.check_consistency()
    for kind in s.kv.kinds:
        pool = s.kv.pools[kind.name]
        owners = Counter(b for r in s.running for b in r.state[kind.name].block_table if b)
        assert all(pool.ref_count(b) == owners[b] for b in range(1, pool.num_blocks))
        for r in s.running:
            table = r.state[kind.name].block_table
            assert r.num_computed_tokens <= len(table) * pool.block_size
            if kind.window:  # between steps: only what the window still reaches
                assert sum(1 for b in table if b) <= -(-kind.window // pool.block_size) + 1
    assert len(s.running) <= s.max_num_seqs
    for r in s.waiting:
        assert r.status in (RequestStatus.WAITING, RequestStatus.PREEMPTED) and not r.state
        assert r.num_computed_tokens == 0
    for r in s.running:
        assert r.status is RequestStatus.RUNNING and 0 < r.num_tokens_to_compute


def drive(s: Scheduler, mock: MockPlan, max_steps: int = 10_000, on_step=None) -> dict[str, list[int]]:
    """Run until idle; returns the tokens streamed to each request that finished meanwhile."""
    streamed, done = {}, {}
    for _ in range(max_steps):
        if not s.has_work:
            return done
        plan = s.schedule()
        if on_step:
            on_step(plan)
        for out in s.update(plan, mock.run(plan)):
            assert out.request_id not in done, "answered after its end"
            streamed.setdefault(out.request_id, []).extend(out.new_token_ids)
            if out.finish_reason:
                done[out.request_id] = streamed.pop(out.request_id)
        check_invariants(s)
    raise AssertionError("did not drain")


def make(
    num_blocks=64,
    block_size=4,
    max_num_seqs=8,
    budget=32,
    depth=64,
    buckets=(16, 32),
    window=0,
    window_blocks=None,
    segments=(1,),
    segment_max=512,
) -> tuple:
    """window > 0 adds a sliding-window kind "kv_window" (its own pool of window_blocks, default num_blocks)
    beside the full kind, as a model with sliding layers has. segments: chunks one step may carry."""
    kv = BlockPool(num_blocks, block_size)
    if window:
        kv = KVCache(
            {"kv": kv, "kv_window": BlockPool(window_blocks or num_blocks, block_size, kind="kv_window")},
            {"kv_window": window},
        )
    shapes = PrefillShapes(tuple(buckets), tuple(segments), segment_max)
    return (s := Scheduler(kv, max_num_seqs, budget, depth, buckets, prefill_shapes=shapes)), MockPlan(s)


def request(rid: str, prompt, max_tokens=8, stop=(STOP,)) -> Request:
    return Request(rid, list(prompt), max_tokens, frozenset(stop))


def prompt_of(n: int, seed: int) -> list[int]:
    return random.Random(seed).choices(range(1, VOCAB), k=n)


# --- packing, chunking ------------------------------------------------------------------------------
def test_decodes_first_then_one_chunk_fills_the_budget():
    s, mock = make(budget=16, buckets=(64,))
    for i in range(4):
        s.add(request(f"d{i}", prompt_of(3, i), max_tokens=50, stop=()))
    for _ in range(4):  # one admission per step: each short prompt is one chunk
        plan = s.schedule()
        s.update(plan, mock.run(plan))
    s.add(request("long", prompt_of(40, 9), max_tokens=2, stop=()))
    plan = s.schedule()
    assert [r.request_id for r in plan.decodes] == ["d0", "d1", "d2", "d3"]
    (chunk,) = plan.prefills
    assert chunk.request_id == "long" and (chunk.start, chunk.end) == (0, 12)
    assert plan.num_tokens == 16 and plan.logit_rows == (0, 1, 2, 3)  # chunk 0..12 is not the last
    assert plan.decode_token_ids().shape == plan.decode_positions().shape == (4,) and plan.decode_slots().shape == (
        1,
        4,
    )
    d0 = list(plan.block_tables["d0"][0])
    assert plan.decode_block_tables(8)[0, 0].tolist() == d0 + [0] * (8 - len(d0))  # padded with reserved block 0
    tables = plan.prefill_block_tables(2, 4)  # [K, segments, width]: the second segment is padding
    assert tables[0, 0].tolist() == list(plan.block_tables["long"][0]) + [0] and not tables[0, 1].any()
    with pytest.raises(ValueError, match="max_blocks"):
        plan.prefill_block_tables(1, 2)
    s.update(plan, mock.run(plan))
    widths = []
    drive(s, mock, on_step=lambda p: widths.append(p.num_tokens))
    assert max(widths) <= 16


def test_several_short_prompts_are_prefilled_in_one_step_where_the_target_allows():
    s, mock = make(budget=40, buckets=(8, 16, 32), segments=(1, 2, 4), segment_max=16)
    prompts = {f"p{i}": prompt_of(n, i) for i, n in enumerate([5, 9, 3, 7, 2])}
    requests = [request(rid, prompt, max_tokens=6, stop=()) for rid, prompt in prompts.items()]
    for r in requests:
        s.add(r)
    plan = s.schedule()
    # a third chunk would need 4 segments (the next bucket) x 16 (the longest, 9) = 64 > 32, the largest bucket
    assert [c.request_id for c in plan.prefills] == ["p0", "p1"] and all(c.completes for c in plan.prefills)
    assert plan.logit_rows == (4, 13) and plan.logit_request_ids == ("p0", "p1")
    s.update(plan, mock.run(plan))
    plan = s.schedule()  # two decode rows; the other three prompts (4 segments x 8 = 32) join as chunks
    assert [r.request_id for r in plan.decodes] == ["p0", "p1"]
    assert [c.request_id for c in plan.prefills] == ["p2", "p3", "p4"]
    assert plan.logit_rows == (0, 1, 4, 11, 13)
    s.update(plan, mock.run(plan))
    drive(s, mock)
    assert [r.output_token_ids for r in requests] == [generate_alone(p, 6, stop=()) for p in prompts.values()]


def test_only_whole_short_prompts_join_a_chunk():
    s, mock = make(budget=64, buckets=(8, 16, 64), segments=(1, 2, 4), segment_max=16)
    s.add(request("a", prompt_of(6, 1), max_tokens=2, stop=()))
    s.add(request("long", prompt_of(40, 2), max_tokens=2, stop=()))  # longer than a segment may be
    s.add(request("c", prompt_of(4, 3), max_tokens=2, stop=()))
    plan = s.schedule()
    assert [c.request_id for c in plan.prefills] == ["a"]  # FIFO: "c" does not overtake "long"
    s.update(plan, mock.run(plan))
    plan = s.schedule()
    assert [c.request_id for c in plan.prefills] == ["long"]  # alone, as one chunk (the budget left after the decode)
    s.update(plan, mock.run(plan))
    drive(s, mock)


def test_one_chunk_per_step_by_default():
    s, mock = make(budget=64, buckets=(8, 16, 64))
    for i in range(3):
        s.add(request(f"p{i}", prompt_of(4, i), max_tokens=2, stop=()))
    assert len(s.schedule().prefills) == 1


def test_long_prompt_is_chunked_on_block_boundaries_and_only_the_last_chunk_gives_logits():
    s, mock = make(block_size=16, num_blocks=32, budget=40, buckets=(16, 32))
    prompt, chunks = prompt_of(100, 1), []
    s.add(r := request("r", prompt, max_tokens=3, stop=()))
    for _ in range(4):
        plan = s.schedule()
        (chunk,) = plan.prefills
        chunks.append((chunk.start, chunk.end, chunk.completes, plan.logit_rows))
        s.update(plan, mock.run(plan))
    # max chunk = largest bucket (32); 100 = 32 + 32 + 32 + 4
    assert chunks == [(0, 32, False, ()), (32, 64, False, ()), (64, 96, False, ()), (96, 100, True, (3,))]
    drive(s, mock)
    assert r.output_token_ids == generate_alone(prompt, 3, stop=()) and r.status is RequestStatus.FINISHED_LENGTH


def test_non_final_chunk_rounds_down_to_a_block_boundary():
    s, mock = make(block_size=16, num_blocks=32, budget=40, buckets=(64,))
    s.add(request("r", prompt_of(100, 2), max_tokens=1))
    plan = s.schedule()
    assert (plan.prefills[0].start, plan.prefills[0].end) == (0, 32)  # budget 40, cut to 2 whole blocks


# --- prefix cache -------------------------------------------------------------------------------------
@pytest.mark.parametrize("window", [0, 40])
def test_prefix_hit_shares_blocks_advances_computed_and_matches_uncached_output(window):
    s, mock = make(block_size=16, num_blocks=200, budget=256, buckets=(256,), window=window)
    shared = prompt_of(1000, 3)
    a = request("a", shared + [5, 6, 7], max_tokens=6, stop=())
    s.add(a)
    while a.num_tokens_to_compute > 1 or a.num_computed_tokens == 0:  # prefill a, keep it running
        plan = s.schedule()
        s.update(plan, mock.run(plan))
    b_prompt = shared + [9, 9]
    b = request("b", b_prompt, max_tokens=6, stop=())
    s.add(b)
    plan = s.schedule()
    assert b.cached_tokens == 992 and plan.prefills[0].start == 992  # 62 full blocks of the 1000 shared
    assert b.block_table[:62] == a.block_table[:62] and s.pool.ref_count(b.block_table[0]) == 2
    assert s.pool.counters().prefix_hits == 1 and s.pool.counters().reused_tokens == 992
    s.update(plan, mock.run(plan))
    drive(s, mock)
    assert b.output_token_ids == generate_alone(b_prompt, 6, stop=()) and a.cached_tokens == 0
    # a whole-prompt repeat still computes its last token
    c = request("c", b_prompt, max_tokens=6, stop=())
    s.add(c)
    assert drive(s, mock)["c"] == b.output_token_ids and c.cached_tokens == 992
    assert s.pool.free_blocks == s.pool.num_usable_blocks and s.kv.all_free()


def test_prefix_caching_can_be_turned_off():
    s = Scheduler(BlockPool(64, 4), 4, 32, 8, (32,), enable_prefix_caching=False)
    mock = MockPlan(s)
    for rid in ("a", "b"):
        s.add(request(rid, list(range(1, 20)), max_tokens=2))
        drive(s, mock)
    assert s.pool.counters().prefix_hits == 0 and s.get("b") is None


# --- preemption ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("window", [0, 5])
def test_preemption_when_the_pool_runs_dry_then_resume_with_identical_tokens(window):
    s, mock = make(num_blocks=11, block_size=4, budget=64, buckets=(64,), window=window)  # 40 token slots
    prompts = {f"r{i}": prompt_of(9, 10 + i) for i in range(3)}
    s_requests = {rid: request(rid, p, max_tokens=20, stop=()) for rid, p in prompts.items()}
    for r in s_requests.values():
        s.add(r)
    preempted = []
    done = drive(s, mock, on_step=lambda p: preempted.extend(p.preempted))
    assert preempted and s.snapshot().preemptions == len(preempted)
    assert "r0" not in preempted  # the oldest is never the victim while newer ones run
    for rid, p in prompts.items():
        assert done[rid] == generate_alone(p, 20, stop=())
        assert s_requests[rid].cached_tokens == 0  # re-admission hits its own blocks: not a prompt cache hit
    assert s.pool.free_blocks == s.pool.num_usable_blocks


def test_preempted_request_goes_to_the_front_of_the_queue():
    s, mock = make(num_blocks=7, block_size=4, max_num_seqs=2, budget=64, buckets=(64,))  # 24 slots
    s.add(request("a", prompt_of(8, 1), max_tokens=12, stop=()))
    s.add(request("b", prompt_of(8, 2), max_tokens=12, stop=()))
    s.add(request("late", prompt_of(3, 3), max_tokens=1, stop=()))
    for _ in range(50):
        plan = s.schedule()
        s.update(plan, mock.run(plan))
        if plan.preempted:
            break
    assert plan.preempted == ("b",) and [r.request_id for r in s.waiting] == ["b", "late"]
    assert s.get("b").status is RequestStatus.PREEMPTED and s.get("b").output_token_ids
    drive(s, mock)
    assert s.snapshot().finished == 3


# --- admission ----------------------------------------------------------------------------------------
def test_queue_depth_limit_raises_a_distinct_overload_error():
    s, mock = make(depth=2, max_num_seqs=1)
    s.add(request("a", [1, 2, 3]))
    s.add(request("b", [1, 2, 3]))
    assert not s.can_admit()
    with pytest.raises(QueueFullError):
        s.add(request("c", [1, 2, 3]))
    assert not issubclass(QueueFullError, ValueError)  # overload (retry) vs a bad request
    plan = s.schedule()  # admits a: the queue has room again
    s.update(plan, mock.run(plan))
    snap = s.snapshot()
    assert (snap.active, snap.waiting, snap.max_queue_depth) == (1, 1, 2) and s.can_admit(4)
    s.add(request("c", [1, 2, 3]))
    assert not s.can_admit(4 * 1000)  # more blocks than are free
    with pytest.raises(ValueError, match="already active"):
        s.add(request("c", [4]))


def test_requests_that_can_never_fit_are_refused():
    s, _ = make(num_blocks=5, block_size=4)  # 16 slots
    with pytest.raises(RequestTooLongError):
        s.add(request("big", range(1, 14), max_tokens=5))  # 13 + 5 - 1 = 17
    s.add(request("fits", range(1, 14), max_tokens=4))


def test_max_num_seqs_bounds_the_running_set():
    s, mock = make(max_num_seqs=2)
    for i in range(5):
        s.add(request(f"r{i}", prompt_of(5, i), max_tokens=30, stop=()))
    widths = []
    drive(s, mock, on_step=lambda p: widths.append(len(s.running)))
    assert max(widths) == 2


# --- aborts -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("state", ["waiting", "mid_prefill", "decoding", "preempted", "between_steps"])
@pytest.mark.parametrize("window", [0, 5])
def test_abort_at_every_state_frees_everything(state, window):
    s, mock = make(num_blocks=11, block_size=4, budget=8, buckets=(8,), window=window)
    if state == "preempted":
        s.add(request("o", prompt_of(6, 2), max_tokens=25, stop=()))  # older: it preempts the victim
    s.add(victim := request("v", prompt_of(20, 1), max_tokens=20, stop=()))
    conditions = {
        "waiting": lambda: True,
        "mid_prefill": lambda: 0 < victim.num_computed_tokens < victim.num_prompt_tokens,
        "decoding": lambda: len(victim.output_token_ids) >= 2,
        "preempted": lambda: victim.status is RequestStatus.PREEMPTED,
        "between_steps": lambda: len(victim.output_token_ids) >= 1,
    }
    for _ in range(200):
        if conditions[state]():
            break
        plan = s.schedule()
        s.update(plan, mock.run(plan))
    else:
        raise AssertionError(f"never reached {state}")
    plan = s.schedule() if state == "between_steps" else None
    sampled = mock.run(plan) if plan else None  # the step is on the device when the abort arrives
    assert s.abort("v") and victim.status is RequestStatus.FINISHED_ABORTED and not victim.state
    if plan is not None:
        assert "v" in plan.logit_request_ids
        assert all(o.request_id != "v" for o in s.update(plan, sampled))
    check_invariants(s)
    assert not s.abort("v") and not s.abort("nobody")
    drive(s, mock)
    assert s.kv.all_free() and s.snapshot().aborted == 1


# --- another kind of state ----------------------------------------------------------------------------
def test_extra_state_kind_is_owned_and_released_like_kv():
    slots = SlotPool(2, "ssm")  # a fixed-slot state kind (a recurrent layer's state)
    s = Scheduler(BlockPool(11, 4), 4, 16, 16, (16,), extra_state={"ssm": slots})
    mock = MockPlan(s)
    assert not s.prefix_caching  # recurrent state cannot skip tokens
    prompts = {f"r{i}": [1, 2, 3, 4, 5, 6, 7, 8, 9] for i in range(4)}
    for rid, p in prompts.items():
        s.add(request(rid, p, max_tokens=12, stop=()))
    seen = []
    done = drive(s, mock, on_step=lambda p: seen.append(sorted(r.state["ssm"].slot for r in s.running)))
    assert max(len(x) for x in seen) == 2 and all(len(set(x)) == len(x) for x in seen)
    assert slots.all_free() and s.pool.counters().prefix_hits == 0
    assert all(done[rid] == generate_alone(p, 12, stop=()) for rid, p in prompts.items())


# --- soak ---------------------------------------------------------------------------------------------
SOAK_RULE_BLOCKS = window_pool_blocks(6, 4, max_num_seqs=8, max_batched_tokens=24) + 1  # + reserved block 0


@pytest.mark.parametrize(
    "window, window_blocks, segments",
    [(0, None, (1,)), (6, SOAK_RULE_BLOCKS, (1,)), (6, 12, (1,)), (0, None, (1, 2, 4)), (6, 12, (1, 2))],
    ids=["full_only", "sliding_by_rule", "sliding_tight", "full_segments", "sliding_segments"],
)
def test_soak_500_requests_with_aborts_and_preemptions(window, window_blocks, segments):
    """Also with a sliding-window kind of W=6 (not a multiple of the 4-token block) beside the full kind:
    its pool sized by the rule, or so tight that it, not the full pool, forces preemptions; and with several
    prefill chunks per step."""
    rng = random.Random(1234)
    s, mock = make(
        num_blocks=40,
        block_size=4,
        max_num_seqs=8,
        budget=24,
        depth=12,
        buckets=(8, 16),
        window=window,
        window_blocks=window_blocks,
        segments=segments,
        segment_max=8,
    )
    bases = [prompt_of(rng.randint(8, 30), 100 + i) for i in range(6)]
    pending = []
    for i in range(500):
        prompt = (rng.choice(bases) if rng.random() < 0.5 else []) + prompt_of(rng.randint(1, 40), 1000 + i)
        pending.append(Request(f"q{i}", prompt, rng.randint(1, 24), frozenset({STOP})))
    specs = {r.request_id: (list(r.prompt_token_ids), r.max_tokens) for r in pending}
    res = soak(s, mock, pending, rng, check_invariants, max_steps=20_000)
    streamed, finished, aborted = res.streamed, res.finished, res.aborted
    assert set(finished) | aborted == set(specs) and not set(finished) & aborted  # each ended exactly once
    for rid, (prompt, max_tokens) in specs.items():
        expected = generate_alone(prompt, max_tokens)
        if rid in finished:
            assert streamed[rid] == expected, rid
            assert finished[rid] == ("stop" if expected[-1] == STOP else "length")
        else:
            assert streamed[rid] == expected[: len(streamed[rid])], rid  # aborted: a clean prefix
    pool = s.pool
    assert pool.free_blocks == pool.num_usable_blocks == pool.num_blocks - 1  # free + cached-free
    assert s.kv.all_free()  # every kind's pool
    snap = s.snapshot()
    assert snap.finished == len(finished) and snap.aborted == len(aborted)
    # the soak really exercised what it claims to
    assert snap.preemptions > 10 and snap.kv.evictions > 10 and snap.kv.prefix_hits > 10, snap
    assert 20 < len(aborted) < 250 and res.overloads > 0
