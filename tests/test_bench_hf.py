"""tools/bench_hf.py (the HF transformers baseline) without torch: its arguments, its figures, and how the
suite runs it and merges what it writes. A real run on a tiny model needs torch (`-m slow`, if present)."""

import json
import os
import shutil
import stat
import sys
from pathlib import Path

import pytest

from ember.tools import bench_hf
from ember.tools.bench_processes import measure_hf, run_child


def test_arguments_have_the_suite_defaults_and_reject_nonsense():
    args = bench_hf.parse_args(["--config", "c.json"])
    assert (args.batch, args.prompt_tokens, args.new_tokens, args.compile, args.device, args.dtype) == (
        [1, 32],
        256,
        256,
        "auto",
        "cuda",
        "bfloat16",
    )
    for bad in (["--batch", "0"], ["--new-tokens", "1"], ["--compile", "max"], ["--repeats", "0"]):
        with pytest.raises(SystemExit):
            bench_hf.parse_args(["--config", "c.json", *bad])


def test_decode_rate_counts_the_steps_after_the_first_token():
    # first token at 1.0 s (end of prefill), then 4 steps of 10 ms at batch 8
    figures = bench_hf.decode_rate([1.0, 1.01, 1.02, 1.03, 1.04], batch=8)
    assert figures["decode_steps"] == 4 and figures["ms_per_step"] == pytest.approx(10.0)
    assert figures["decode_tokens_per_s"] == pytest.approx(800.0)
    with pytest.raises(ValueError):
        bench_hf.decode_rate([1.0], batch=1)
    best = bench_hf.best_run([{"decode_tokens_per_s": 5.0, "x": 1}, {"decode_tokens_per_s": 7.0, "x": 2}])
    assert best["x"] == 2 and best["all_decode_tokens_per_s"] == [5.0, 7.0]


def _fake_python(tmp_path: Path, runs: list[dict]) -> str:
    """An executable standing in for `python bench_hf.py ... --out FILE`: writes a canned result there."""
    script = tmp_path / "fake-python"
    result = {"torch": "fake", "transformers": "fake", "compile": "forward", "runs": runs}
    script.write_text(f"""#!{sys.executable}
import json, sys
args = sys.argv[1:]
assert args[0].endswith("bench_hf.py"), args
config = json.load(open(args[args.index("--config") + 1]))
out = dict({json.dumps(result)}, seen_model_type=config["model_type"], seen_batch=args[args.index("--batch") + 1:args.index("--prompt-tokens")])
open(args[args.index("--out") + 1], "w").write(json.dumps(out))
""")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return str(script)


def test_the_suite_runs_the_hf_child_and_reads_its_file(tmp_path):
    python = _fake_python(tmp_path, [{"batch": 1, "decode_tokens_per_s": 50.0}])
    got = measure_hf(
        {"model_type": "llama"},
        batches=(1, 32),
        prompt_tokens=256,
        new_tokens=256,
        device="cuda",
        compile_mode="forward",
        python=python,
        timeout=30,
    )
    assert got["seen_model_type"] == "llama" and got["seen_batch"] == ["1", "32"] and got["wall_s"] >= 0
    failed = run_child([sys.executable, "-c", "import sys; sys.exit('no torch here')"], {}, 30)
    assert failed["error"].startswith("exit 1") and "no torch here" in failed["error"]


def test_the_hf_section_lands_in_the_suite_json_with_ratios(tmp_path):
    from dataclasses import replace

    from test_bench_suite import CONFIG, TINY

    from ember.tools.bench_report import attach_hf_ratios
    from ember.tools.bench_suite import run_suite

    python = _fake_python(
        tmp_path,
        [
            {"batch": 1, "decode_tokens_per_s": 50.0, "decode_rows": 1, "bytes_per_step": 10**9},
            {"batch": 2, "error": "OOM"},
        ],
    )
    result = run_suite(
        [TINY],
        target="cpu",
        sections=("hf",),
        out_dir=tmp_path / "out",
        commit="x",
        config=replace(CONFIG, hf_python=python, hf_device="cpu"),
    )
    hf = result["hf"]["qwen2-tiny"]
    assert hf["shape"] == "qwen2-tiny" and hf["seen_model_type"] == "qwen2" and hf["runs"][1]["error"] == "OOM"
    bandwidth = max(result["bandwidth"]["copy_gb_s"] + result["bandwidth"]["read_gb_s"])  # the same roofline rule
    assert hf["runs"][0]["roofline_fraction"] == pytest.approx(50.0 / (bandwidth * 1e9 / 1e9), rel=1e-3)
    result["models"][TINY]["concurrency"] = {"runs": [{"concurrency": 1, "decode_tokens_per_s": 100.0}]}
    assert attach_hf_ratios(result)["models"][TINY]["hf_comparison"]["batch_1"]["ratio"] == 2.0
    assert "batch 2: error: OOM" in (tmp_path / "out" / "bench.md").read_text()


TORCH_PYTHON = os.environ.get("EMBER_TORCH_PYTHON", "/work/venv311/bin/python")


@pytest.mark.slow
@pytest.mark.skipif(not shutil.which(TORCH_PYTHON), reason="no Python with torch + transformers")
def test_a_real_tiny_hf_run_on_cpu(tmp_path):
    from ember.tools.bench_models import SYNTHETIC_SHAPES

    config = {
        **SYNTHETIC_SHAPES["llama3-8b"][1],
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "intermediate_size": 128,
        "vocab_size": 1000,
    }
    got = measure_hf(
        config,
        batches=(1, 2),
        prompt_tokens=8,
        new_tokens=4,
        device="cpu",
        compile_mode="none",
        python=TORCH_PYTHON,
        timeout=300,
    )
    assert "error" not in got, got
    assert [r["batch"] for r in got["runs"]] == [1, 2] and all(r["decode_steps"] == 3 for r in got["runs"])
    assert got["parameters"] > 0 and got["compile"] == "none"
    weights = (got["parameters"] - 1000 * 64) * 2  # bf16, without the untied input embedding
    kv = 2 * (8 + 2) * 2 * 16 * 2 * 2  # layers x (prompt + new / 2) x hkv x dh x (K, V) x bf16
    assert [r["bytes_per_step"] for r in got["runs"]] == [weights + kv, weights + 2 * kv]
    json.dumps(got)
