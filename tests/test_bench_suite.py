"""The benchmark suite end to end on a 2-layer random model (cpu target), and its report.

The startup section (two fresh processes, each importing JAX and compiling) takes ~40 s on a 2-core
machine: the fast tests run its child in-process; the whole section runs under `-m slow`.
"""

import json

import pytest
from fixture_data import save_synthetic_tokenizer

from ember.tools import bench_markdown, bench_report
from ember.tools.bench_models import SYNTHETIC_SHAPES, kv_bytes_read, parse_synthetic
from ember.tools.bench_suite import SuiteConfig, run_suite

TINY = "synthetic:qwen2-tiny"
CONFIG = SuiteConfig(
    contexts=(16, 40),
    context_decode_tokens=4,
    prefill_lengths=(24,),
    prefill_chunk=32,
    prefill_repeats=1,
    concurrency=(1, 2),
    prompt_tokens=8,
    output_tokens=4,
    ttft_concurrency=2,
    bandwidth_gib=0.01,
)


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    return save_synthetic_tokenizer(tmp_path_factory.mktemp("tok"))


@pytest.fixture(scope="module")
def suite(tmp_path_factory, tokenizer_dir):
    out = tmp_path_factory.mktemp("bench")
    result = run_suite(
        [TINY, "synthetic:llama3-8b-fp8"],
        target="cpu",
        out_dir=out,
        hf=False,
        sections=("context", "prefill", "concurrency", "ttft"),
        tokenizer_dir=tokenizer_dir,
        commit="abc1234",
        config=CONFIG,
    )
    return out, result


def test_the_suite_writes_every_section_for_the_tiny_model(suite):
    out, result = suite
    saved = json.loads((out / "bench.json").read_text())
    assert saved["commit"] == "abc1234" and saved["target"] == "cpu"
    assert saved["sections"] == ["context", "prefill", "concurrency", "ttft"]
    entry = saved["models"][TINY]
    assert entry["status"] == "measured" and entry["dims"]["layers"] == 2
    assert [r["context"] for r in entry["context"]["runs"]] == [16, 40]
    assert [r["prompt_tokens"] for r in entry["prefill"]["runs"]] == [24]
    assert [r["concurrency"] for r in entry["concurrency"]["runs"]] == [1, 2]
    assert set(entry["ttft"]) >= {"ttft_p50_s", "ttft_p99_s"} and entry["ttft"]["concurrency"] == 2
    for section in ("context", "prefill", "concurrency"):
        assert all("error" not in r for r in entry[section]["runs"]), entry[section]
    assert entry["context"]["runs"][0]["decode_tokens"] == 4  # N decode steps after the prompt's prefill
    assert entry["concurrency"]["runs"][1]["steady_decode_tokens"] > 0
    run = entry["concurrency"]["runs"][1]
    assert 0 < run["mean_decode_rows"] <= 2 and run["steady_decode_steps"] * run["mean_decode_rows"] == pytest.approx(
        run["steady_decode_tokens"], abs=run["steady_decode_steps"] * 0.05
    )
    # FP8 projections need a target whose linear op takes them (h200): on cpu the model fails to load, and says why
    assert "no FP8 projections" in json.dumps(saved["models"]["synthetic:llama3-8b-fp8"])


def test_roofline_fractions_come_from_the_measured_rate_and_bandwidth(suite):
    _, result = suite
    measured = result["bandwidth"]  # copy and read, each at the start and the end of the run
    assert len(measured["copy_gb_s"]) == len(measured["read_gb_s"]) == 2
    bandwidth = max(measured["copy_gb_s"] + measured["read_gb_s"])
    assert bandwidth > 0
    entry = result["models"][TINY]
    weights = entry["weight_bytes_per_step"]
    # qwen2-tiny: 2 layers of (64x64 q, 2x 32x64 k/v, 64x64 o, 2x 128x64 gate/up, 64x128 down, biases, norms)
    # in fp32, plus the tied head 151936 x 64; the embedding table (gathered only) is excluded
    assert weights == 4 * (151936 * 64 + 64 + 2 * (64 * 64 + 2 * 32 * 64 + 128 + 64 * 64 + 3 * 128 * 64 + 2 * 64))
    for run in entry["context"]["runs"]:
        kv = 2 * (run["context"] + 2) * 2 * 16 * 2 * 4  # layers x ctx x hkv x dh x (K, V) x fp32
        assert run["bytes_per_step"] == weights + kv and run["bandwidth_gb_s"] == bandwidth
        roofline = bandwidth * 1e9 / run["bytes_per_step"]
        assert run["roofline_fraction"] == pytest.approx(run["decode_tokens_per_s"] / roofline, rel=1e-2)
    for run in entry["concurrency"]["runs"]:
        c = run["concurrency"]
        assert run["roofline_tokens_per_s"] == pytest.approx(c * bandwidth * 1e9 / run["bytes_per_step"], rel=1e-3)
        assert run["roofline_fraction"] == pytest.approx(
            run["decode_tokens_per_s"] / run["roofline_tokens_per_s"], rel=1e-2
        )


def test_the_report_has_the_figures_and_the_issue_targets(suite):
    out, result = suite
    md = (out / "bench.md").read_text()
    assert "## synthetic:qwen2-tiny" in md and "decode batch 1, context 16" in md and "prefill 24 tokens" in md
    assert "aggregate decode, 2 concurrent" in md and "TTFT p50 / p99, 2 concurrent" in md
    assert "no FP8 projections" in md
    import importlib.util

    if importlib.util.find_spec("matplotlib") is not None:
        assert (out / bench_report.PLOT_NAME).stat().st_size > 1000
    else:  # the report degrades to JSON + markdown
        assert not (out / bench_report.PLOT_NAME).exists()


def test_report_targets_ratios_and_merge():
    def piece(model, sections):
        return {
            "commit": "c1",
            "target": "h200",
            "started_at": "t",
            "sections": list(sections),
            "bandwidth": {"copy_gb_s": [4000.0]},
            "models": {model: sections},
            "hf": {},
        }

    runs = [
        {"concurrency": c, "decode_tokens_per_s": tps, "roofline_fraction": 0.5}
        for c, tps in ((1, 260.0), (8, 1100.0), (32, 5000.0))
    ]
    a = piece("synthetic:llama3-8b", {"concurrency": {"runs": runs}, "status": "measured"})
    b = piece(
        "synthetic:llama3-8b",
        {
            "startup": {
                "cold": {"precompile_s": 200, "shapes": 17, "load_s": 3},
                "warm": {"wall_s": 75.0, "load_s": 3, "precompile_s": 50},
            }
        },
    )
    b["hf"] = {
        "llama3-8b": {"runs": [{"batch": 1, "decode_tokens_per_s": 52.0}, {"batch": 32, "decode_tokens_per_s": 1000.0}]}
    }
    merged = bench_report.merge([a, b])
    entry = merged["models"]["synthetic:llama3-8b"]
    assert set(entry) >= {"concurrency", "startup"} and len(merged["pieces"]) == 2
    assert entry["hf_comparison"]["batch_1"]["ratio"] == 5.0 and entry["hf_comparison"]["batch_32"]["ratio"] == 5.0
    rows = {r[0]: r for r in bench_markdown._model_rows("synthetic:llama3-8b", entry)}
    assert rows["aggregate decode, 1 concurrent"][4:6] == [">= 250", "yes"]
    assert rows["aggregate decode, 8 concurrent"][4:6] == [">= 1,200", "no"]
    assert rows["aggregate decode, 32 concurrent"][3].startswith("5.00×")
    assert rows["warm start (cache filled)"][4:6] == ["<= 60", "no"]


def test_synthetic_names_and_kv_bytes():
    assert parse_synthetic("synthetic:llama3-8b-q4_k_m") == ("llama3-8b", "q4_k_m")
    assert parse_synthetic("synthetic:qwen2.5-1.5b") == ("qwen2.5-1.5b", None)
    assert parse_synthetic("synthetic:llama3-8b-fp8") == ("llama3-8b", "fp8")
    assert parse_synthetic("synthetic:llama3-8b-fp8_block") == ("llama3-8b", "fp8_block")
    with pytest.raises(ValueError, match="unknown synthetic shape"):
        parse_synthetic("synthetic:llama3-405b")
    config = SYNTHETIC_SHAPES["llama3-8b"][1]
    assert (
        config["num_hidden_layers"],
        config["hidden_size"],
        config["intermediate_size"],
        config["num_attention_heads"],
        config["num_key_value_heads"],
        config["vocab_size"],
    ) == (32, 4096, 14336, 32, 8, 128256)

    class FakeModel:  # kv_bytes_read needs only the dims, the KV dtype and the layers' state kinds
        class dims:
            hkv, dh = 8, 128

        dtype = "float16"
        layer_state_kinds = ("kv",) * 31 + ("kv_4",)
        paged_kinds = (type("K", (), {"name": "kv", "window": 0}), type("K", (), {"name": "kv_4", "window": 4}))

    assert kv_bytes_read(FakeModel, 100) == (31 * 100 + 4) * 8 * 128 * 2 * 2


def test_quantized_synthetic_models_name_the_missing_module(tokenizer_dir, monkeypatch):
    import sys

    from ember.tools.bench_models import load_bench_model

    monkeypatch.setitem(sys.modules, "ember.runtime.loading.synthetic_gguf", None)  # as in a tree without it
    with pytest.raises(ValueError, match="ember.runtime.loading.synthetic_gguf"):
        load_bench_model("synthetic:qwen2-tiny-q4_k_m", "cpu", tokenizer_dir)
    with pytest.raises(ValueError, match="no FP8 projections"):
        load_bench_model("synthetic:llama3-8b-fp8", "cpu", tokenizer_dir)


def test_a_kernel_policy_file_reaches_the_bench_model(tokenizer_dir, tmp_path):
    from ember.compiler.targets import get_target
    from ember.tools.bench_models import load_bench_model

    path = tmp_path / "policy.json"
    path.write_text(json.dumps({"attention": {"fused_rope_decode": False}}))
    model, _ = load_bench_model(TINY, "h200", tokenizer_dir, str(path))
    assert model.policy == get_target("h200").policy.overridden({"attention.fused_rope_decode": False})
    assert load_bench_model(TINY, "cpu", tokenizer_dir)[0].policy == get_target("cpu").policy


def test_the_startup_child_loads_compiles_and_reports(tokenizer_dir, capsys):
    import dataclasses

    from ember.tools.bench_processes import startup_child
    from ember.tools.bench_suite import Suite

    suite = Suite(
        [TINY], target="cpu", sections=("startup",), out_dir=".", tokenizer_dir=tokenizer_dir, commit="x", config=CONFIG
    )
    engine = dataclasses.asdict(suite.measures.batch_config())
    assert engine["max_num_seqs"] == 2 and engine["max_model_len"] == 12  # the concurrency engine's config
    assert (
        startup_child(
            ["--model", TINY, "--target", "cpu", "--tokenizer", tokenizer_dir, "--engine", json.dumps(engine)]
        )
        == 0
    )
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["shapes"] == 4 and report["load_s"] >= 0 and report["precompile_s"] >= 0  # 2 decode + 2 prefill


@pytest.mark.slow
def test_the_startup_section_runs_a_cold_then_a_warm_process(tmp_path, tokenizer_dir):
    result = run_suite(
        [TINY],
        target="cpu",
        out_dir=tmp_path,
        hf=False,
        sections=("startup",),
        tokenizer_dir=tokenizer_dir,
        commit="x",
        config=CONFIG,
    )
    startup = result["models"][TINY]["startup"]
    assert "error" not in startup["cold"] and "error" not in startup["warm"], startup
    assert startup["cold"]["shapes"] == startup["warm"]["shapes"] == 4
    assert startup["cold_compile_s"] == startup["cold"]["precompile_s"] and startup["warm_start_s"] > 0
    assert "cold compile (empty cache)" in (tmp_path / "bench.md").read_text()


@pytest.mark.parametrize("arch", ["qwen2", "gemma3"])  # tied head + biases; norms stored as 1 + w
def test_device_drawn_synthetic_weights_equal_the_loader_path(arch):
    import jax
    import numpy as np
    from fixture_data import tiny_fixture

    from ember.compiler.spec import spec_for_arch
    from ember.runtime.loading.model import load_model
    from ember.runtime.loading.synthetic import synthetic_checkpoint, synthetic_model

    config = json.loads((tiny_fixture(arch)[0] / "config.json").read_text())
    drawn = synthetic_model(spec_for_arch(arch), config, seed=3)
    loaded = load_model(synthetic_checkpoint(spec_for_arch(arch), config, seed=3))
    assert jax.tree.structure(drawn.params) == jax.tree.structure(loaded.params)
    for a, b in zip(jax.tree.leaves(drawn.params), jax.tree.leaves(loaded.params)):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    other_seed = synthetic_model(spec_for_arch(arch), config, seed=4)
    assert not np.array_equal(
        np.asarray(other_seed.params.layers[0]["ffn_down.weight"]),
        np.asarray(drawn.params.layers[0]["ffn_down.weight"]),
    )


def test_a_failing_measurement_or_model_is_recorded_and_the_suite_goes_on(tmp_path, tokenizer_dir, monkeypatch):
    from ember.tools import bench_sections, bench_suite

    real = bench_sections.single_request

    def failing(engine, prompt, max_tokens):  # the 40-token context "runs out of memory"
        if len(prompt) == 40:
            raise RuntimeError("RESOURCE_EXHAUSTED: out of memory while trying to allocate")
        return real(engine, prompt, max_tokens)

    def load(name, target, tokenizer, kernel_policy):
        if name.endswith("q4_k_m"):
            raise RuntimeError("RESOURCE_EXHAUSTED while loading")
        return real_load(name, target, tokenizer, kernel_policy)

    real_load = bench_suite.load_bench_model
    monkeypatch.setattr(bench_sections, "single_request", failing)
    monkeypatch.setattr(bench_suite, "load_bench_model", load)
    with pytest.raises(ValueError, match="unknown synthetic shape 'qwen2-tiny-nope'"):  # before any measuring
        run_suite(["synthetic:qwen2-tiny-nope"], target="cpu", out_dir=tmp_path, config=CONFIG)
    result = run_suite(
        [TINY + "-q4_k_m", TINY],
        target="cpu",
        out_dir=tmp_path,
        hf=False,
        sections=("context",),
        tokenizer_dir=tokenizer_dir,
        commit="x",
        config=CONFIG,
    )
    assert result["models"][TINY + "-q4_k_m"]["error"] == "load: RuntimeError: RESOURCE_EXHAUSTED while loading"
    runs = result["models"][TINY]["context"]["runs"]
    assert "error" not in runs[0] and runs[0]["decode_tokens_per_s"] > 0
    assert runs[1]["context"] == 40 and "RESOURCE_EXHAUSTED" in runs[1]["error"]
    assert "error: RuntimeError: RESOURCE_EXHAUSTED" in (tmp_path / "bench.md").read_text()


def test_ember_bench_suite_flags_reach_the_suite(monkeypatch, tmp_path):
    from ember.tools import bench_suite
    from ember.tools.cli import main

    seen = {}

    def fake_run_suite(models, **kwargs):
        seen.update(models=models, **kwargs)
        return {"models": {m: {} for m in models}, "wall_s": 0.0}

    monkeypatch.setattr(bench_suite, "run_suite", fake_run_suite)
    assert (
        main(
            [
                "bench",
                "--suite",
                "--out",
                str(tmp_path),
                "--target",
                "h200",
                "--commit",
                "abc",
                "--sections",
                "context",
                "hf",
                "--concurrency",
                "1",
                "32",
                "--contexts",
                "128",
                "--no-hf",
                "--kernel-policy",
                "policy.json",
            ]
        )
        == 0
    )
    assert seen["models"] == bench_suite.DEFAULT_MODELS and seen["sections"] == ["context", "hf"]
    assert seen["hf"] is False and seen["commit"] == "abc" and seen["target"] == "h200"
    config = seen["config"]
    assert config.concurrency == (1, 32) and config.contexts == (128,) and config.output_tokens == 256
    assert config.kernel_policy == "policy.json"
    assert main(["bench", "--suite"]) == 1  # needs --out


def test_lazy_compile_warms_each_concurrency_instead_of_precompiling(tmp_path, tokenizer_dir):
    import dataclasses

    result = run_suite(
        [TINY],
        target="cpu",
        out_dir=tmp_path,
        hf=False,
        sections=("concurrency",),
        tokenizer_dir=tokenizer_dir,
        config=dataclasses.replace(CONFIG, precompile=False),
    )
    section = result["models"][TINY]["concurrency"]
    assert "precompile_s" not in section
    assert [r["concurrency"] for r in section["runs"]] == [1, 2]
    assert all(r["warmup_s"] >= 0 and "error" not in r for r in section["runs"])
