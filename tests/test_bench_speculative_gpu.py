"""tools/dev/bench_speculative_gpu.py's smoke mode: every section end to end on the CPU with a tiny synthetic
model (the draft model replayed with its real drafting cost, the verify step at k = 1, 2, many streams), its
JSON's figures present and every speculative output equal to plain greedy decoding; and its arithmetic."""

from __future__ import annotations

import json

import pytest
from fixture_data import save_synthetic_tokenizer

from ember.tools.dev.bench_speculative_gpu import main
from ember.tools.dev.spec_bench_parts import by_length, modeled


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    return save_synthetic_tokenizer(tmp_path_factory.mktemp("tok"))


def test_the_smoke_run_measures_every_section(tokenizer_dir, tmp_path):
    out = tmp_path / "spec.json"
    assert main(["--smoke", "--tokenizer", tokenizer_dir, "--commit", "abc1234", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["commit"] == "abc1234" and result["greedy_identical"] and not result["skipped"]
    sections = result["sections"]
    assert sections["draft-step"]["plain_decode_step_ms"] > 0 and sections["draft-step"]["proposal_ms"]["2"] > 0
    (verify,) = sections["verify"].values()
    assert verify["plain_step_ms"] > 0 and verify["plain_one_step_call_ms"] > 0 and verify["one_step_identical"]
    for k in ("1", "2"):
        assert verify["k"][k]["verify_step_ms"] > 0 and verify["k"][k]["ratio_to_plain_step"] > 0
        assert verify["k"][k]["ratio_to_one_step_call"] > 0
        assert verify["k"][k]["identical"]
    (run,) = sections["e2e"]["runs"].values()
    assert run["total"]["speedup"] > 0 and run["drafting_free"]["total"]["speedup"] > 0
    assert run["total"]["drafts"] > 0 and run["total"]["accepted_tokens"] <= run["total"]["draft_tokens"]
    assert all(p["identical"] and p["off_reference"] == 0 for p in run["per_prompt"])
    # the draft model's real work is paid in the charged run only
    assert run["total"]["drafting_s"] > 0 and run["drafting_free"]["total"]["drafting_s"] == 0
    streams = sections["aggregate"]["runs"]["2"]
    assert streams["draft"]["identical"] and streams["draft"]["ratio"] > 0


def test_proposal_lengths_and_the_modeled_drafting_cost():
    # drafted_per_position before / after: 3 more drafts of > 0 tokens, 2 of > 1, 1 of > 2
    assert by_length([5, 4], [8, 6, 1]) == {1: 1, 2: 1, 3: 1}
    free = {
        "per_prompt": [{"proposals_by_length": {1: 1, 3: 2}}],
        "total": {"decoded_tokens": 100, "decode_s": 1.0},
    }
    draft_step = {"proposal_ms": {1: 10.0, 3: 20.0}}
    result = modeled(free, draft_step, {"decode_tok_s": 50.0})
    # 1.0 s + (10 + 2 * 20) ms = 1.05 s for 100 tokens
    assert result["draft_s"] == 0.05 and result["decode_tok_s"] == round(100 / 1.05, 2)
    assert result["speedup"] == round(100 / 1.05 / 50, 3)
    assert modeled(free, {"proposal_ms": {1: 10.0}}, {"decode_tok_s": 50.0}) is None  # length 3 not measured
