"""The kernel policy (compiler/targets/policy.py): one per target, overridable by a JSON file, read by the ops
at trace time."""

from __future__ import annotations

import ast
import json

import pytest

from ember.compiler.build import GENERATED_DIR
from ember.compiler.spec import known_archs
from ember.compiler.targets import get_target, known_targets
from ember.compiler.targets.policy import (
    KernelPolicy,
    kernel_policy,
    load_policy_file,
    overriding,
    parse_assignments,
    use_kernel_policy,
    with_kernel_policy,
)


def test_the_h200_policy_is_the_gpu_defaults_with_its_weights():
    h200 = get_target("h200").policy
    assert h200.quant_gemv == KernelPolicy().quant_gemv and h200.attention == KernelPolicy().attention
    assert (
        h200.weights.quantized_formats == ("fp8", "q4_k", "q6_k", "q8_0", "q5_0", "nvfp4") and h200.weights.dense_copies
    )
    cpu = get_target("cpu").policy
    assert cpu.quant_gemv.backend == "reference" and not cpu.norms.triton and not cpu.fp8_gemv.enabled


def test_to_dict_round_trips_through_an_override_file(tmp_path):
    policy = KernelPolicy().overridden({"fp8_gemv.config": {"block_n": 8}, "quant_gemv.dp4a_formats": ["q4_k"]})
    path = tmp_path / "policy.json"
    path.write_text(json.dumps(policy.to_dict()))
    assert load_policy_file(path, get_target("cpu").policy) == policy
    assert policy.to_dict()["fp8_gemv"]["config"] == {"block_n": 8}


def test_nested_and_dotted_keys_say_the_same():
    nested = KernelPolicy().overridden({"attention": {"fused_rope_decode": False}})
    assert nested == KernelPolicy().overridden({"attention.fused_rope_decode": False})
    assert not nested.attention.fused_rope_decode and nested.attention.fused_rope


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"attentoin.fused_rope": False}, "unknown family 'attentoin'"),
        ({"attention.fused_rop": False}, "unknown field 'attention.fused_rop'"),
        ({"attention": {"fused_rop": False}}, "unknown field 'attention.fused_rop'"),
        ({"norms.warps": "16"}, "norms.warps must be int"),
        ({"norms.triton": 0}, "norms.triton must be bool"),
        ({"dense_gemv.config": {"block_n": True}}, "dense_gemv.config must be ConfigOverride"),
    ],
)
def test_unknown_keys_and_wrong_types_are_refused(overrides, message, tmp_path):
    with pytest.raises(ValueError, match=message):
        KernelPolicy().overridden(overrides)
    path = tmp_path / "policy.json"
    path.write_text(json.dumps(overrides))
    with pytest.raises(ValueError, match=str(path)):
        load_policy_file(path, KernelPolicy())


def test_command_line_assignments():
    assert parse_assignments("attention.fused_rope_decode=false, norms.warps=4,quant_gemv.backend=triton") == {
        "attention.fused_rope_decode": False,
        "norms.warps": 4,
        "quant_gemv.backend": "triton",
    }
    kept = parse_assignments('weights.quantized_formats=["q4_k","q6_k"],fp8_gemv.config={"block_n":8,"split_k":2}')
    assert kept == {"weights.quantized_formats": ["q4_k", "q6_k"], "fp8_gemv.config": {"block_n": 8, "split_k": 2}}
    with pytest.raises(ValueError, match="family.field=value"):
        parse_assignments("attention.fused_rope_decode")


def test_ops_see_the_policy_of_the_trace_they_are_in():
    assert kernel_policy() == KernelPolicy()
    off = KernelPolicy().overridden({"norms.triton": False})
    with use_kernel_policy(off):
        assert kernel_policy() is off
        with overriding({"norms.warps": 4}):
            assert not kernel_policy().norms.triton and kernel_policy().norms.warps == 4
        assert kernel_policy() is off
    assert kernel_policy() == KernelPolicy()
    seen = with_kernel_policy(off, lambda: kernel_policy())
    assert seen() is off and with_kernel_policy(off, seen.__wrapped__) is seen  # one wrapper per policy and fn


@pytest.mark.parametrize("target", known_targets())
def test_the_generated_plans_record_their_targets_policy(target):
    for arch in known_archs():
        folder = GENERATED_DIR / target / arch
        manifest = json.loads((folder / "manifest.json").read_text())
        assert KernelPolicy().overridden(manifest["kernel_policy"]) == get_target(target).policy
        for variant in manifest["variants"].values():
            tree = ast.parse((folder / variant).read_text())
            (literal,) = [
                node.value
                for node in tree.body
                if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "KERNEL_POLICY"
            ]
            assert ast.literal_eval(literal) == manifest["kernel_policy"]
