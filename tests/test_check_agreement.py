"""tools/check_agreement.py on the tiny synthetic shape: the cpu target against itself agrees exactly, and
against the h200 plan (bf16, kernel emulations) it reports a finite KL and an agreement in [0, 1]."""

from __future__ import annotations

import json

from ember.tools import check_agreement


def _run(capsys, target: str) -> dict:
    assert check_agreement.main(["--shape", "qwen2-tiny", "--positions", "12", "--target", target]) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_the_cpu_target_agrees_with_itself_exactly(capsys):
    result = _run(capsys, "cpu")
    assert result["top1_agreement"] == 1.0 and abs(result["mean_kl"]) < 1e-12


def test_the_h200_plan_reports_a_small_difference(capsys):
    result = _run(capsys, "h200")
    assert 0.0 <= result["top1_agreement"] <= 1.0
    assert 0.0 < result["mean_kl"] < 1e-2 and result["reference_median_top1_prob"] > 0
