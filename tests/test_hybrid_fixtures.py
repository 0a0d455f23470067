"""The MoE / hybrid tiny fixtures are present and self-consistent (numpy, safetensors and gguf only: no torch).

What Ember's specs and loaders will read is pinned here: the config keys, the checkpoint's tensor
names and shapes (MTP included), and how llama.cpp's converter laid the same weights out in GGUF.
"""

import json

import gguf
import numpy as np
import pytest
from fixture_data import HYBRID_TINY_ARCHS, TINY_GGUF_ARCHS, TINY_MTP_ARCHS, tiny_config, tiny_fixture, tiny_gguf
from safetensors.numpy import load_file

PROMPT, DECODE, VOCAB = 40, 16, 256
GDN_ARCHS = ("qwen3_next", "qwen3_5", "qwen3_5_moe")


def _weights(arch):
    checkpoint, _ = tiny_fixture(arch)
    return load_file(checkpoint / "model.safetensors")


def _gguf_arrays(arch):
    path, _ = tiny_gguf(arch)
    return {t.name: np.asarray(t.data) for t in gguf.GGUFReader(path).tensors}  # numpy order: [rows, cols]


@pytest.mark.parametrize("arch", HYBRID_TINY_ARCHS)
def test_reference_arrays_are_well_formed(arch):
    checkpoint, ref = tiny_fixture(arch)
    assert ref["input_ids"].shape == (PROMPT,) and ref["input_ids"].dtype == np.int32
    assert ref["prefill_logits"].shape == (PROMPT, VOCAB) and ref["prefill_logits"].dtype == np.float32
    assert ref["decode_ids"].shape == (DECODE,) and ref["decode_logits"].shape == (DECODE, VOCAB)
    assert ref["input_ids"].min() >= 3 and ref["input_ids"].max() < VOCAB
    for name in ("prefill_logits", "decode_logits"):
        assert np.isfinite(ref[name]).all()
        # O(1..10): neither a flat ~0 distribution nor saturated
        assert 1.0 < np.abs(ref[name]).max() < 30.0
        assert ref[name].std(axis=-1).min() > 0.1
    # Greedy chain: each fed token is the argmax of the previous row.
    assert ref["decode_ids"][0] == ref["prefill_logits"][-1].argmax()
    np.testing.assert_array_equal(ref["decode_ids"][1:], ref["decode_logits"][:-1].argmax(axis=-1))
    size = sum(p.stat().st_size for p in checkpoint.iterdir() if not p.name.endswith(".gguf"))
    assert size < 1_500_000


def _sparse_layers(config):
    return [
        i
        for i in range(config["num_hidden_layers"])
        if i not in config.get("mlp_only_layers", []) and (i + 1) % config.get("decoder_sparse_step", 1) == 0
    ]


def test_qwen3_moe_has_both_mlp_kinds():
    config = tiny_config("qwen3_moe")
    assert config["architectures"] == ["Qwen3MoeForCausalLM"]
    # transformers 5.24 saves Qwen3MoeConfig's expert count as num_local_experts (real Qwen3-MoE
    # config.json files say num_experts): a loader must accept both.
    assert "num_experts" not in config
    assert (config["num_local_experts"], config["num_experts_per_tok"], config["norm_topk_prob"]) == (8, 2, True)
    assert _sparse_layers(config) == [0, 2] and config["mlp_only_layers"] == [1]
    weights = _weights("qwen3_moe")
    assert weights["model.layers.0.mlp.experts.7.gate_proj.weight"].shape == (config["moe_intermediate_size"], 64)
    assert weights["model.layers.1.mlp.gate_proj.weight"].shape == (config["intermediate_size"], 64)
    assert not any("shared_expert" in name for name in weights)


@pytest.mark.parametrize("arch", GDN_ARCHS)
def test_hybrid_configs_mix_both_layer_kinds(arch):
    config = tiny_config(arch)
    assert config["layer_types"] == ["linear_attention"] * 3 + ["full_attention"]
    assert config["linear_num_value_heads"] == 2 * config["linear_num_key_heads"]
    assert config["linear_conv_kernel_dim"] == 4
    assert config["rope_parameters"]["partial_rotary_factor"] == 0.25
    assert config["mtp_num_hidden_layers"] == 1
    if arch != "qwen3_5":
        assert config["num_experts"] == 8 and config["shared_expert_intermediate_size"] > 0
        assert _sparse_layers(config) == [0, 1, 2, 3]


@pytest.mark.parametrize("arch", GDN_ARCHS)
def test_gdn_and_gated_attention_shapes(arch):
    config, weights = tiny_config(arch), _weights(arch)
    hidden, heads, head_dim = config["hidden_size"], config["num_attention_heads"], config["head_dim"]
    key_dim = config["linear_num_key_heads"] * config["linear_key_head_dim"]
    value_dim = config["linear_num_value_heads"] * config["linear_value_head_dim"]
    gdn = "model.layers.0.linear_attn."
    if arch == "qwen3_next":  # fused, interleaved per key head
        assert weights[gdn + "in_proj_qkvz.weight"].shape == (2 * key_dim + 2 * value_dim, hidden)
        assert weights[gdn + "in_proj_ba.weight"].shape == (2 * config["linear_num_value_heads"], hidden)
    else:  # flat
        assert weights[gdn + "in_proj_qkv.weight"].shape == (2 * key_dim + value_dim, hidden)
        assert weights[gdn + "in_proj_z.weight"].shape == (value_dim, hidden)
        assert weights[gdn + "in_proj_b.weight"].shape == (config["linear_num_value_heads"], hidden)
    assert weights[gdn + "conv1d.weight"].shape == (2 * key_dim + value_dim, 1, 4)
    # The GDN decay stays meaningful: A = exp(A_log) in (0.5, 2), dt_bias in (-3, -1).
    assert np.all((np.exp(weights[gdn + "A_log"]) > 0.5) & (np.exp(weights[gdn + "A_log"]) < 2.0))
    assert np.all((weights[gdn + "dt_bias"] > -3.0) & (weights[gdn + "dt_bias"] < -1.0))
    # Gated attention: q_proj carries a per-head gate next to each head's query.
    assert weights["model.layers.3.self_attn.q_proj.weight"].shape == (2 * heads * head_dim, hidden)


@pytest.mark.parametrize("arch", TINY_MTP_ARCHS)
def test_mtp_block_is_in_the_checkpoint(arch):
    config, weights = tiny_config(arch), _weights(arch)
    hidden = config["hidden_size"]
    assert weights["mtp.fc.weight"].shape == (hidden, 2 * hidden)
    for norm in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
        assert weights[f"mtp.{norm}.weight"].shape == (hidden,)
    layer = {name[len("mtp.layers.0.") :] for name in weights if name.startswith("mtp.layers.0.")}
    full = {name[len("model.layers.3.") :] for name in weights if name.startswith("model.layers.3.")}
    assert layer == full  # one decoder layer shaped like the model's full-attention layer


@pytest.mark.parametrize("arch", TINY_GGUF_ARCHS)
def test_gguf_listing_matches_the_file(arch):
    path, described = tiny_gguf(arch)
    reader = gguf.GGUFReader(path)
    listed = [(t["name"], t["ne"], t["type"]) for t in described["tensors"]]
    assert listed == [(t.name, [int(n) for n in t.shape], t.tensor_type.name) for t in reader.tensors]
    config, prefix = tiny_config(arch), described["metadata"]["general.architecture"]
    assert described["metadata"][f"{prefix}.block_count"] == config["num_hidden_layers"] + 1  # + the MTP layer
    assert described["metadata"][f"{prefix}.nextn_predict_layers"] == 1
    assert all(t["type"] == "F32" for t in described["tensors"])


@pytest.mark.parametrize("arch", TINY_GGUF_ARCHS)
def test_gguf_norms_and_decay_as_the_converter_writes_them(arch):
    weights, tensors, config = _weights(arch), _gguf_arrays(arch), tiny_config(arch)
    # Zero-centred norms get the +1 baked in; the GDN gated norm (ssm_norm) does not.
    np.testing.assert_allclose(tensors["blk.0.attn_norm.weight"], 1 + weights["model.layers.0.input_layernorm.weight"])
    np.testing.assert_allclose(
        tensors["blk.3.attn_q_norm.weight"], 1 + weights["model.layers.3.self_attn.q_norm.weight"]
    )
    np.testing.assert_array_equal(tensors["blk.0.ssm_norm.weight"], weights["model.layers.0.linear_attn.norm.weight"])
    minus_a = -np.exp(weights["model.layers.0.linear_attn.A_log"])
    if arch != "qwen3_next":
        # qwen35*: value heads go from grouped by key head [k0v0 k0v1 k1v0 k1v1] to tiled [k0v0 k1v0 k0v1 k1v1].
        minus_a = minus_a.reshape(config["linear_num_key_heads"], -1).T.reshape(-1)
    np.testing.assert_allclose(tensors["blk.0.ssm_a"], minus_a, rtol=1e-6)


def test_gguf_qwen3_next_splits_qkvz_per_key_head():
    config, weights, tensors = tiny_config("qwen3_next"), _weights("qwen3_next"), _gguf_arrays("qwen3_next")
    k_heads, dk, dv = config["linear_num_key_heads"], config["linear_key_head_dim"], config["linear_value_head_dim"]
    v_per_k = config["linear_num_value_heads"] // k_heads
    fused = weights["model.layers.0.linear_attn.in_proj_qkvz.weight"].reshape(k_heads, 2 * dk + 2 * v_per_k * dv, -1)
    q, k, v, z = np.split(fused, [dk, 2 * dk, 2 * dk + v_per_k * dv], axis=1)
    qkv = np.concatenate([part.reshape(-1, fused.shape[-1]) for part in (q, k, v)])
    np.testing.assert_array_equal(tensors["blk.0.attn_qkv.weight"], qkv)
    np.testing.assert_array_equal(tensors["blk.0.attn_gate.weight"], z.reshape(-1, fused.shape[-1]))
    # in_proj_ba stays fused as ssm_ba ([b, a] per key head).
    np.testing.assert_array_equal(
        tensors["blk.0.ssm_ba.weight"], weights["model.layers.0.linear_attn.in_proj_ba.weight"]
    )


@pytest.mark.parametrize("arch", ("qwen3_next", "qwen3_5_moe"))
def test_gguf_stacks_experts(arch):
    weights, tensors = _weights(arch), _gguf_arrays(arch)
    for gguf_name, hf_name in (("gate", "gate_proj"), ("up", "up_proj"), ("down", "down_proj")):
        stacked = tensors[f"blk.1.ffn_{gguf_name}_exps.weight"]  # [experts, rows, cols]
        assert stacked.shape[0] == 8
        for expert in (0, 5):
            np.testing.assert_array_equal(
                stacked[expert], weights[f"model.layers.1.mlp.experts.{expert}.{hf_name}.weight"]
            )
    np.testing.assert_array_equal(tensors["blk.1.ffn_gate_inp.weight"], weights["model.layers.1.mlp.gate.weight"])
    gate = weights["model.layers.1.mlp.shared_expert_gate.weight"]
    np.testing.assert_array_equal(tensors["blk.1.ffn_gate_inp_shexp.weight"].reshape(gate.shape), gate)


def test_byte_tokenizer_matches_the_vocab():
    for arch in HYBRID_TINY_ARCHS:
        checkpoint, _ = tiny_fixture(arch)
        vocab = json.loads((checkpoint / "tokenizer.json").read_text(encoding="utf-8"))["model"]["vocab"]
        assert sorted(vocab.values()) == list(range(tiny_config(arch)["vocab_size"]))
