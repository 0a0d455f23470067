"""Tensor parallelism over jax.sharding: the compiler's weight splits (in process), and tiny checkpoints spread
over 2 and 4 simulated host devices giving one device's greedy tokens and logits, also through the engine with
preemption on a sharded pool (a subprocess: JAX's device count is fixed when it starts)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import pytest
from fixture_data import tiny_fixture

from ember.compiler.build import compile_spec
from ember.compiler.pipeline import compile_graph
from ember.compiler.sharding import weight_sharding
from ember.compiler.spec import SPECS_DIR, load_spec
from ember.compiler.targets import get_target
from ember.compiler.targets.mesh import MeshConfig
from ember.runtime.loading.checkpoint import open_checkpoint
from ember.runtime.loading.dims import Dims, resolve
from ember.runtime.loading.memory_plan import planned_weight_bytes
from ember.runtime.loading.sharding import MeshError, device_mesh, split_axes
from ember.server.config import add_serve_arguments, config_from_args
from ember.tools.cli import build_parser, mesh_from_args

CHECK = Path(__file__).parent / "tensor_parallel_check.py"
CPU = get_target("cpu")


def _splits(arch: str, mesh: MeshConfig) -> dict:
    return weight_sharding(compile_graph(load_spec(SPECS_DIR / f"{arch}.toml"), CPU, mesh=mesh), mesh)


def _axes(section: dict) -> dict[str, tuple[int, str]]:
    return {name: (split["axis"], split["divides"]) for name, split in section.items()}


def test_attention_and_mlp_split_column_then_row_and_the_vocabulary_split():
    splits = _splits("qwen2", MeshConfig(2))
    assert _axes(splits["layer"]) == {
        "attn_q.weight": (0, "hq"),
        "attn_q.bias": (0, "hq"),
        "attn_k.weight": (0, "hkv"),
        "attn_k.bias": (0, "hkv"),
        "attn_v.weight": (0, "hkv"),
        "attn_v.bias": (0, "hkv"),
        "attn_output.weight": (1, "hq"),  # row-parallel: XLA all-reduces its partial sums
        "ffn_gate.weight": (0, "ffn"),
        "ffn_up.weight": (0, "ffn"),
        "ffn_down.weight": (1, "ffn"),
    }  # norms: replicated
    assert _axes(splits["global"]) == {"token_embd.weight": (0, "vocab"), "output.weight": (0, "vocab")}


def test_a_recurrent_mixer_keeps_its_projections_whole():
    layer = _splits("qwen3_5", MeshConfig(2))["layer"]
    assert not {"attn_qkv.weight", "attn_gate.weight", "ssm_beta.weight", "ssm_out.weight"} & layer.keys()
    assert layer["attn_q.weight"]["kind"] == "heads" and layer["attn_output.weight"]["axis"] == 1


def test_experts_split_by_expert_or_by_width():
    by_width = _splits("qwen3_moe", MeshConfig(2))["layer"]
    by_expert = _splits("qwen3_moe", MeshConfig(2, expert_parallel=True))["layer"]
    assert _axes({k: v for k, v in by_width.items() if "exps" in k}) == {
        "ffn_gate_exps.weight": (1, "moe_ffn"),
        "ffn_up_exps.weight": (1, "moe_ffn"),
        "ffn_down_exps.weight": (2, "moe_ffn"),
    }
    assert {by_expert[k]["axis"] for k in by_expert if "exps" in k} == {0}
    assert "ffn_gate_inp.weight" not in by_width  # the router stays whole


def test_a_mesh_plan_records_the_mesh_and_keeps_linears_apart(tmp_path):
    spec = SPECS_DIR / "llama.toml"
    one = json.loads(compile_spec(spec, "cpu", out_root=tmp_path / "one")[-1].read_text())
    two = json.loads(compile_spec(spec, "cpu", out_root=tmp_path / "two", mesh=MeshConfig(2))[-1].read_text())
    assert "mesh" not in one and "weight_sharding" not in one and one["packed_weights"]
    assert two["mesh"] == {"tensor_parallel": 2, "expert_parallel": False} and two["packed_weights"] == {}
    assert two["weight_sharding"]["layer"]["attn_output.weight"]["axis"] == 1


def test_the_mesh_must_divide_the_query_heads_and_may_keep_fewer_kv_heads_whole():
    manifest = {"weight_sharding": _splits("qwen2", MeshConfig(4))}
    dims = {"hq": 4, "hkv": 2, "ffn": 128, "vocab": 256}
    axes = split_axes(manifest, Dims(dims), 4)["layer"]
    assert axes["attn_q.weight"] == 0 and "attn_k.weight" not in axes and axes["ffn_down.weight"] == 1
    with pytest.raises(MeshError, match="does not divide the model's 4 heads"):
        split_axes(manifest, Dims(dims), 8)
    with pytest.raises(MeshError, match="does not divide the model's 6 heads"):
        split_axes(manifest, Dims(dims | {"hkv": 6, "hq": 12}), 4)
    odd_vocab = split_axes(manifest, Dims(dims | {"vocab": 257}), 2)["global"]
    assert odd_vocab == {}  # a vocabulary that does not divide: head and embedding kept whole


def test_the_memory_check_counts_one_devices_share_of_split_weights(tmp_path):
    path, _ = tiny_fixture("qwen2")
    spec, ckpt = load_spec(SPECS_DIR / "qwen2.toml"), open_checkpoint(path)
    resolved = resolve(spec, ckpt)
    compile_spec(spec.path, "cpu", out_root=tmp_path, mesh=MeshConfig(2))
    manifest = json.loads((tmp_path / "cpu" / "qwen2" / "manifest.json").read_text())
    whole = planned_weight_bytes(spec, manifest, ckpt, resolved, "float32", (), False)
    split_down = planned_weight_bytes(
        spec,
        manifest,
        ckpt,
        resolved,
        "float32",
        (),
        False,
        lambda name, is_global: 2 * (name == "ffn_down.weight") or 1,
    )
    d = resolved.dims
    assert whole - split_down == d.layers * d.ffn * d.d * 4 // 2  # half of each layer's down projection


def test_expert_parallel_needs_the_mesh_to_divide_the_experts():
    manifest = {"weight_sharding": _splits("qwen3_moe", MeshConfig(4, expert_parallel=True))}
    dims = Dims({"hq": 4, "hkv": 4, "ffn": 64, "vocab": 256, "experts": 8, "moe_ffn": 16})
    assert split_axes(manifest, dims, 4)["layer"]["ffn_down_exps.weight"] == 0
    with pytest.raises(MeshError, match="does not divide the 6 experts"):
        split_axes(manifest, Dims(dims.as_dict() | {"experts": 6}), 4)


def test_more_devices_than_the_host_has_is_an_error():
    with pytest.raises(MeshError, match=f"needs {jax.device_count() + 1} devices"):
        device_mesh(MeshConfig(jax.device_count() + 1))
    with pytest.raises(ValueError, match="expert_parallel needs tensor_parallel > 1"):
        MeshConfig(1, expert_parallel=True)


def _serve_config(argv: list[str], environ: dict[str, str]):
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    return config_from_args(parser.parse_args(argv), environ)


def test_serve_generate_and_bench_take_the_mesh_from_flags_or_the_environment():
    assert _serve_config([], {}).mesh() == MeshConfig()
    assert _serve_config(["--tensor-parallel", "4", "--expert-parallel"], {}).mesh() == MeshConfig(4, True)
    assert _serve_config([], {"EMBER_TENSOR_PARALLEL": "2"}).mesh() == MeshConfig(2)
    with pytest.raises(SystemExit, match="expert_parallel needs tensor_parallel > 1"):
        _serve_config(["--expert-parallel"], {})
    for command in (["generate", "--prompt", "x"], ["bench"]):
        args = build_parser().parse_args([*command, "--tensor-parallel", "2"])
        assert mesh_from_args(args) == MeshConfig(2)


def _run_check(*args: str, timeout: int) -> dict:
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=8")
    done = subprocess.run([sys.executable, str(CHECK), *args], env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _assert_cases(results: dict) -> None:
    for name, result in results.items():
        if name.startswith("case"):
            assert result["tokens_equal"], (name, result)
            assert result["max_logit_diff"] < 1e-4 * max(1.0, result["logit_scale"]), (name, result)
            assert result["weights_split"] > 0 and len(result["devices"]) == int(name.split(":")[1]), (name, result)
            # XLA partitioned the step as split: partial sums all-reduced, no float tensor (a weight) gathered whole
            # (kept int8 blocks too: their native kernel runs per shard inside shard_map)
            collectives = result["decode_collectives"]
            assert collectives["all-reduce"] > 0, (name, result)
            assert collectives["float all-gather"] == 0, (name, result)
            if "kquant" in name:  # kept weights split along whole blocks: each device holds ~1/N of the weights
                devices = int(name.split(":")[1])
                assert result["kept_split"] > 0 and collectives["all-gather"] == 0, (name, result)
                assert result["weight_bytes_share"] < 1.1 / devices, (name, result)
        elif name.startswith("engine"):
            assert result["tokens_equal"] and result["blocks_returned"], (name, result)
        elif name.startswith("deterministic"):
            assert result["run_to_run"] and result["alone_vs_loaded"] and result["tokens"] > 0, (name, result)
        elif name.startswith("speculative"):  # greedy with drafts == greedy without, and drafts were accepted
            assert result["tokens_equal"] and result["accepted"] > 0, (name, result)
        elif name.startswith("layouts"):
            _assert_layouts(name, result)


def _assert_layouts(name: str, result: dict) -> None:
    """A kept layout's weights split over the mesh: the projection per shard equals the whole weight's (a row
    split's partial sums added in another order: float rounding), each device holds 1/N of the codes (an FP8
    per-channel scale stays whole under a row split), a column split needs no collective and a row split one
    all-reduce, no weight is gathered; a split that would cut a GGUF block is refused."""
    devices = int(name.split(":")[1])
    for weight, figures in result["weights"].items():
        assert figures["max_rel_diff"] < 1e-5 and figures["all_gathers"] == 0, (name, weight, figures)
        assert figures["all_reduces"] == int(weight.endswith("axis 1")), (name, weight, figures)
        assert figures["bytes_share"] < 1 / devices + 0.01, (name, weight, figures)
        assert figures["dense_share"] in (None, 1 / devices), (name, weight, figures)  # planes: the dense copy too
        assert figures["batch_invariant"] in (None, True), (name, weight, figures)  # int8 blocks, per shard
    cut = {"q4_k_cut axis 1"} if name.startswith("layouts planes") else set()  # int8 blocks: 32-element blocks
    assert set(result["refused"]) == cut, (name, result)


def test_tiny_models_on_two_and_four_devices_match_one_device():
    """Each family's tiny checkpoint (dense with biases, one KV head, experts by expert, hybrid) and the Q4_K_M
    GGUF kept as int8 blocks split along whole blocks; the engine serving concurrent requests with preemption on
    a pool split over KV heads; deterministic mode bit-exact run to run and alone vs beside other requests on the
    mesh; n-gram speculation's greedy tokens equal to plain decoding's; every kept layout (the h200 target's GGUF
    planes and FP8 on their kernels' reference forms, the cpu target's int8 blocks on its native kernel, batch-
    invariant per shard as deterministic mode needs) split, their projections run per shard."""
    results = _run_check(
        *("--case", "qwen2:2", "--case", "gemma3:4", "--case", "qwen3_moe:4:ep", "--case", "qwen3_5:2"),
        *("--case", "qwen3_moe_kquant:2", "--engine", "qwen3:2", "--deterministic", "qwen3:2"),
        *("--speculative", "qwen3:2", "--mesh-error", "qwen3:8"),
        *("--layouts", "planes:2", "--layouts", "fp8:2", "--layouts", "int8_blocks:2"),
        timeout=400,
    )
    _assert_cases(results)
    dense = results["case qwen2:2"]
    # one all-reduce per attention block and per MLP (row-parallel o and down), one for the split embedding
    assert dense["decode_collectives"]["all-reduce"] == 2 * dense["layers"] + 1, dense
    assert results["engine qwen3:2"]["kv_split"] and results["engine qwen3:2"]["preemptions"] > 0
    assert "does not divide the model's 4 heads" in results["mesh_error qwen3:8"]["error"]


@pytest.mark.slow
def test_every_family_at_two_and_four_devices_deterministic_mode_and_speculation():
    cases = [f"{arch}:{n}" for arch in ("llama", "qwen2", "qwen3", "gemma3", "qwen3_moe", "qwen3_5") for n in (2, 4)]
    cases += ["qwen3_moe:2:ep", "qwen3_5_moe:4:ep", "qwen3_5_moe:2", "qwen3_next:2", "qwen3_moe_kquant:4"]
    args = [a for case in cases for a in ("--case", case)]
    args += ["--engine", "gemma3:4", "--engine", "qwen3_5:2"]
    args += ["--deterministic", "qwen3:4", "--speculative", "qwen3:4", "--speculative-draft", "qwen3:2"]
    args += ["--layouts", "planes:4", "--layouts", "int8_blocks:4", "--layouts", "fp8:4"]
    results = _run_check(*args, timeout=1200)
    _assert_cases(results)
    # the pool replicated (one KV head over 4 devices) under preemption; the hybrid's slot state beside it
    assert results["engine gemma3:4"]["preemptions"] > 0 and not results["engine gemma3:4"]["kv_split"]
