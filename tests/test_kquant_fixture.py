"""The K-quant qwen3_moe GGUF fixture: Q4_K / Q6_K tensors llama.cpp's layout, a reference for exactly its weights."""

import gguf
import numpy as np
from fixture_data import kquant_fixture


def test_reference_is_a_greedy_chain():
    _, ref, _, _ = kquant_fixture()
    assert ref["prefill_logits"].shape == (40, 256) and ref["decode_logits"].shape == (16, 256)
    assert np.isfinite(ref["prefill_logits"]).all() and np.isfinite(ref["decode_logits"]).all()
    assert 1.0 < np.abs(ref["prefill_logits"]).max() < 30.0
    assert ref["decode_ids"][0] == ref["prefill_logits"][-1].argmax()
    np.testing.assert_array_equal(ref["decode_ids"][1:], ref["decode_logits"][:-1].argmax(axis=-1))


def test_gguf_holds_k_quants_and_stacked_experts():
    path, _, config, described = kquant_fixture()
    assert path.stat().st_size < 3_000_000
    reader = gguf.GGUFReader(path)
    types = {t.name: t.tensor_type.name for t in reader.tensors}
    assert [(t["name"], t["type"]) for t in described["tensors"]] == list(types.items())
    assert types["output.weight"] == "Q6_K" and types["token_embd.weight"] == "Q4_K"
    for layer in range(config["num_hidden_layers"]):
        assert types[f"blk.{layer}.ffn_gate_exps.weight"] == "Q4_K"
        assert types[f"blk.{layer}.ffn_up_exps.weight"] == "Q4_K"
        assert types[f"blk.{layer}.ffn_down_exps.weight"] == "Q6_K"
        assert types[f"blk.{layer}.attn_v.weight"] == "Q6_K"
        assert types[f"blk.{layer}.ffn_gate_inp.weight"] == "F32"
    shapes = {t["name"]: t["ne"] for t in described["tensors"]}
    hidden, n_ff, experts = config["hidden_size"], config["moe_intermediate_size"], config["num_local_experts"]
    assert shapes["blk.0.ffn_gate_exps.weight"] == [hidden, n_ff, experts]
    assert shapes["blk.0.ffn_down_exps.weight"] == [n_ff, hidden, experts]
    meta = described["metadata"]
    assert meta["general.architecture"] == "qwen3moe"
    assert (meta["qwen3moe.expert_count"], meta["qwen3moe.expert_used_count"]) == (experts, 2)
    assert meta["qwen3moe.expert_feed_forward_length"] == n_ff


def test_k_quant_tensors_dequantize_to_sane_weights():
    path, _, _, _ = kquant_fixture()
    for tensor in gguf.GGUFReader(path).tensors:
        if tensor.tensor_type.name in ("Q4_K", "Q6_K"):
            values = gguf.quants.dequantize(np.asarray(tensor.data), tensor.tensor_type)
            assert np.isfinite(values).all()
            assert 0.1 < values.std() < 0.2  # drawn ~ N(0, 0.15) before quantizing
