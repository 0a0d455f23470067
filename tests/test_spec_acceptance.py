"""The offline acceptance measurement (tools/dev/spec_acceptance.py): its replay of greedy speculation, the
draft-model drafter's KV rollback on a tiny checkpoint, and the committed workloads."""

from __future__ import annotations

import numpy as np
import pytest
from fixture_data import tiny_fixture

from ember.runtime.execution.sequence_runner import SequenceRunner
from ember.runtime.loading.model import load_model
from ember.runtime.speculative.drafter import Draft, DraftContext
from ember.tools.dev.spec_acceptance import GreedyModelDrafter, load_workload, replay, user_message


class ScriptedDrafter:
    """Proposes the given drafts in turn; records the contexts it was shown."""

    def __init__(self, drafts):
        self.drafts, self.seen, self.released = list(drafts), [], []

    def propose(self, context: DraftContext, k: int) -> Draft:
        self.seen.append((tuple(context.output_ids), k))
        return Draft(tuple(self.drafts.pop(0))[:k])

    def release(self, request_id: str) -> None:
        self.released.append(request_id)


def test_replay_accepts_matching_prefixes_and_moves_by_accepted_plus_one():
    output = [10, 11, 12, 13, 14, 15, 16]
    drafter = ScriptedDrafter([[10, 11, 99], [13, 14, 15], [], [16]])
    stats = replay(drafter, "r", [1, 2], output, k=3)
    # step 1 at 0: 2 accepted, then 12; step 2 at 3: all 3 accepted, then 16 ends the output
    assert drafter.seen == [((), 3), ((10, 11, 12), 3)]
    assert (stats.steps, stats.emitted_tokens, stats.num_accepted_tokens) == (2, 7, 5)
    assert stats.accepted_per_position == [2, 2, 1] and drafter.released == ["r"]


def test_replay_never_drafts_past_the_known_output():
    drafter = ScriptedDrafter([[5, 6, 7, 8], [9, 9], []])
    stats = replay(drafter, "r", [1], [5, 6, 7], k=4)
    assert drafter.seen[0] == ((), 2)  # 3 known tokens: at most 2 drafts and the target's own third
    assert stats.emitted_tokens == 3 and stats.steps == 1


@pytest.fixture(scope="module")
def tiny_qwen2():
    return load_model(tiny_fixture("qwen2")[0])


def fresh_greedy(model, tokens, k):
    runner = SequenceRunner(model, len(tokens) + k + 1)
    logits, out = runner.prefill(list(tokens)), []
    for _ in range(k):
        out.append(int(np.argmax(logits)))
        logits = runner.decode(out[-1])
    return tuple(out)


def test_draft_model_drafter_rolls_its_kv_back_to_the_common_prefix(tiny_qwen2):
    prompt = [int(t) for t in tiny_fixture("qwen2")[1]["input_ids"][:12]]
    drafter = GreedyModelDrafter(tiny_qwen2, 64)
    rng = np.random.default_rng(0)
    output: list[int] = []
    # contexts that extend past the cached drafts, diverge from them, and shrink back
    for extend in ([], [3, 4], [7], [9, 9, 9]):
        output = output + extend
        draft = drafter.propose(DraftContext("r", prompt, output), 4)
        assert draft.token_ids == fresh_greedy(tiny_qwen2, prompt + output, 4)
        output = output + [int(t) for t in draft.token_ids[: rng.integers(0, 3)]]
    shorter = output[:2]
    assert drafter.propose(DraftContext("r", prompt, shorter), 3).token_ids == fresh_greedy(
        tiny_qwen2, prompt + shorter, 3
    )


def test_workloads_are_committed_and_render():
    code, free = load_workload("code_editing"), load_workload("free_form")
    assert len(code) >= 20 and len(free) >= 10
    assert len({item["id"] for item in code}) == len(code)
    for item in code:
        message = user_message(item)
        assert message.startswith(item["instruction"]) and item["code"] in message and message.endswith("```")
    assert user_message(free[0]) == free[0]["instruction"]
