"""Per-layer-kind bodies: a spec's [layer_axes] rules, its bodies as IR regions, and what the manifest says."""

from __future__ import annotations

import pytest

from ember.compiler.codegen.emit import generate
from ember.compiler.layer_axes import LayerAxis, body_names, resolve_bodies
from ember.compiler.pipeline import compile_graph
from ember.compiler.spec import SPECS_DIR, SpecError, load_spec
from ember.compiler.targets import get_target

MIXER = LayerAxis("mixer", ("linear_attention", "full_attention"), hf="layer_types", every_dim="interval",
                  every_kind="full_attention")  # fmt: skip
MLP = LayerAxis("mlp", ("dense", "moe"), every_dim="step", every_kind="moe", only_hf="mlp_only", only_kind="dense")


def test_bodies_are_every_combination_of_kinds():
    assert body_names((MIXER, MLP)) == (
        "linear_attention+dense",
        "linear_attention+moe",
        "full_attention+dense",
        "full_attention+moe",
    )


def test_interval_rule_and_listed_layers():
    config = {"mlp_only": [1]}
    bodies = resolve_bodies((MIXER, MLP), 4, config.get, {"interval": 2, "step": 1})
    assert bodies == ("linear_attention+moe", "full_attention+dense", "linear_attention+moe", "full_attention+moe")


def test_config_list_wins_over_the_interval_and_is_checked():
    config = {"layer_types": ["full_attention", "linear_attention", "linear_attention"]}
    assert resolve_bodies((MIXER,), 3, config.get, {"interval": 3}) == (
        "full_attention",
        "linear_attention",
        "linear_attention",
    )
    with pytest.raises(ValueError, match="must list 3 kinds"):
        resolve_bodies((MIXER,), 3, {"layer_types": ["full_attention"]}.get, {})
    with pytest.raises(ValueError, match="must list 2 kinds"):
        resolve_bodies((MIXER,), 2, {"layer_types": ["full_attention", "sliding"]}.get, {})


def test_sparse_step_puts_moe_on_every_nth_layer():
    assert resolve_bodies((MLP,), 4, {}.get, {"step": 2}) == ("dense", "moe", "dense", "moe")


def test_each_body_is_its_own_region_and_the_manifest_lists_its_weights():
    spec = load_spec(SPECS_DIR / "qwen3_moe.toml")
    graph = compile_graph(spec, get_target("cpu"))
    names = [r.name for r in graph.layer_regions()]
    assert names == ["layer:attention+dense", "layer:attention+moe"]
    ops = {r.body: {n.op for n in r.nodes} for r in graph.layer_regions()}
    assert "moe" in ops["attention+moe"] and "moe" not in ops["attention+dense"]
    # passes ran inside every region: q/k/v packed, the residual add deferred, kernels chosen
    for region in graph.layer_regions():
        assert "linear_split" in {n.op for n in region.nodes}
        assert region.nodes[0].op == "add_rms_norm" and all(n.kernel for n in region.nodes)
    manifest = generate(graph, spec, get_target("cpu")).manifest
    assert "ffn_gate_exps.weight" in manifest["body_weights"]["attention+moe"]
    assert "ffn_gate_exps.weight" not in manifest["body_weights"]["attention+dense"]
    assert manifest["layer_state"] == {"attention+dense": "kv", "attention+moe": "kv"}
    assert {c["body"] for c in manifest["layer_constants"].values()} == {"attention+dense", "attention+moe"}


def test_a_block_for_an_undeclared_kind_is_an_error(tmp_path):
    text = (SPECS_DIR / "qwen3_moe.toml").read_text().replace("[layer.dense]", "[layer.dence]")
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(SpecError, match="layer.dence"):
        load_spec(path)


@pytest.mark.parametrize(
    "old, new, where",
    [
        ('every = { dim = "sparse_step", kind = "moe" }', 'every = { dim = "sparse_stpe", kind = "moe" }', "every.dim"),
        ('every = { dim = "sparse_step", kind = "moe" }', 'every = { dim = "sparse_step", kind = "mo" }', "every.kind"),
        ('kinds = ["dense", "moe"]', "kinds = []", "layer_axes.mlp.kinds"),
        (
            "[layer_axes.mixer]",
            '[layer_kinds]\ndefault_period = ["a"]\n[layer_kinds.a]\nx = 1\n[layer_axes.mixer]',
            "layer_kinds",
        ),
    ],
)
def test_axis_errors_name_the_field(tmp_path, old, new, where):
    text = (SPECS_DIR / "qwen3_moe.toml").read_text()
    assert old in text
    path = tmp_path / "bad.toml"
    path.write_text(text.replace(old, new, 1))
    with pytest.raises(SpecError, match=where.replace(".", r"\.")):
        load_spec(path)
