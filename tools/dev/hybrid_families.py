"""The MoE and hybrid (Gated DeltaNet + gated attention) tiny families, for make_tiny_checkpoints.py.

Imported by path as a sibling of that script (Python 3.11 env with torch). Holds what differs
from the dense families: the configs, the weight draws that keep the GDN recurrence sane, the
MTP block written by hand (transformers drops `mtp.*`), and a 256-entry byte-level tokenizer so
that llama.cpp's converter can run on the folders.

GDN decay per step is exp(g) with g = -exp(A_log) * softplus(a + dt_bias) (a = in_proj_a(x)).
With A = exp(A_log) ~ U(0.5, 2) and dt_bias ~ U(-3, -1), exp(g) sits mostly in 0.6..0.97: the
state carries over tens of tokens, neither frozen (g ~ 0) nor wiped every step (g << -1).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from synthetic_tokenizer_fixture import gpt2_alphabet  # sibling script (run by path)

CONV_STD = 0.5  # depthwise conv taps: the conv output feeds silu, then q/k are l2-normalised
_COMMON = dict(
    vocab_size=256,
    hidden_size=64,
    max_position_embeddings=128,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
    rms_norm_eps=1e-6,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
)
# GDN dims: 2 key heads / 4 value heads (the real 16/32 ratio), head dims 16.
_LINEAR = dict(
    linear_conv_kernel_dim=4,
    linear_key_head_dim=16,
    linear_value_head_dim=16,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
)
_MOE = dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=16)


def hybrid_family_specs() -> list[dict[str, Any]]:
    """Keyword arguments of make_tiny_checkpoints.TinyFamily, one dict per family."""
    partial_rope = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25}
    return [
        dict(
            arch="qwen3_moe",
            model_class="Qwen3MoeForCausalLM",
            hybrid=True,
            config_class="Qwen3MoeConfig",
            config=dict(
                _COMMON,
                **_MOE,
                num_hidden_layers=3,
                intermediate_size=64,  # the dense MLP of layer 1
                mlp_only_layers=[1],
                decoder_sparse_step=1,
                norm_topk_prob=True,
                tie_word_embeddings=False,
                rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
            ),
        ),
        dict(
            arch="qwen3_next",
            model_class="Qwen3NextForCausalLM",
            hybrid=True,
            config_class="Qwen3NextConfig",
            config=dict(
                _COMMON,
                **_LINEAR,
                **_MOE,
                num_hidden_layers=4,
                full_attention_interval=4,  # layers 0-2 linear_attention, layer 3 full_attention
                intermediate_size=64,
                shared_expert_intermediate_size=32,
                decoder_sparse_step=1,
                norm_topk_prob=True,
                tie_word_embeddings=False,
                rope_parameters=partial_rope,
                mtp_num_hidden_layers=1,
            ),
            offset_norm=True,
            mtp_layers=1,
        ),
        dict(
            arch="qwen3_5",
            model_class="Qwen3_5ForCausalLM",
            hybrid=True,
            config_class="Qwen3_5TextConfig",
            config=dict(
                _COMMON,
                **_LINEAR,
                num_hidden_layers=4,
                full_attention_interval=4,
                intermediate_size=64,
                tie_word_embeddings=True,
                # mrope with text-only positions (all three sections equal) is plain rope.
                rope_parameters=dict(partial_rope, mrope_section=[2, 1, 1], mrope_interleaved=True),
                mtp_num_hidden_layers=1,
            ),
            offset_norm=True,
            mtp_layers=1,
        ),
        dict(
            arch="qwen3_5_moe",
            model_class="Qwen3_5MoeForCausalLM",
            hybrid=True,
            config_class="Qwen3_5MoeTextConfig",
            config=dict(
                _COMMON,
                **_LINEAR,
                **_MOE,
                num_hidden_layers=4,
                full_attention_interval=4,
                shared_expert_intermediate_size=32,
                tie_word_embeddings=False,
                rope_parameters=dict(partial_rope, mrope_section=[2, 1, 1], mrope_interleaved=True),
                mtp_num_hidden_layers=1,
            ),
            offset_norm=True,
            mtp_layers=1,
        ),
    ]


def hybrid_init(name: str, shape: torch.Size, generator: torch.Generator) -> torch.Tensor | None:
    """Values for the GDN parameters that need their own scale; None: use the default draw."""
    if name.endswith("linear_attn.A_log"):
        return torch.log(torch.rand(shape, generator=generator) * 1.5 + 0.5)  # A ~ U(0.5, 2)
    if name.endswith("linear_attn.dt_bias"):
        return torch.rand(shape, generator=generator) * 2.0 - 3.0  # U(-3, -1)
    if name.endswith("linear_attn.conv1d.weight"):
        return torch.randn(shape, generator=generator) * CONV_STD
    if name.endswith("linear_attn.norm.weight"):
        # The gated norm scales by w (not 1 + w), unlike every other norm of these families.
        return torch.rand(shape, generator=generator) + 0.5
    return None


def add_mtp_weights(target: Path, layers: int, seed: int, weight_std: float) -> list[str]:
    """Append seeded random `mtp.*` tensors to target/model.safetensors; returns their names.

    Names follow the real Qwen3-Next / Qwen3.5 checkpoints: mtp.fc.weight [H, 2H] (applied to
    cat(norm(embedding), norm(hidden))), mtp.pre_fc_norm_embedding.weight, mtp.pre_fc_norm_hidden.weight,
    mtp.norm.weight [H] (zero-centred, like the model's norms), and mtp.layers.<i>.* shaped like
    the model's last full-attention decoder layer as saved (same per-expert or fused layout).
    """
    path = target / "model.safetensors"
    tensors = load_file(path)
    config = json.loads((target / "config.json").read_text())
    hidden = config["hidden_size"]
    template_layer = max(i for i, kind in enumerate(config["layer_types"]) if kind == "full_attention")
    prefix = next(k.split("layers.")[0] for k in tensors if ".layers." in k)  # "model." or "model.language_model."
    template = f"{prefix}layers.{template_layer}."
    shapes: dict[str, tuple[int, ...]] = {
        "mtp.fc.weight": (hidden, 2 * hidden),
        "mtp.pre_fc_norm_embedding.weight": (hidden,),
        "mtp.pre_fc_norm_hidden.weight": (hidden,),
        "mtp.norm.weight": (hidden,),
    }
    for name, value in tensors.items():
        if name.startswith(template):
            for index in range(layers):
                shapes[f"mtp.layers.{index}.{name[len(template) :]}"] = tuple(value.shape)
    generator = torch.Generator().manual_seed(seed + 7)
    for name in sorted(shapes):
        if name.endswith("norm.weight"):
            values = torch.rand(shapes[name], generator=generator) - 0.5  # zero-centred: scale 1 + w
        else:
            values = torch.randn(shapes[name], generator=generator) * weight_std
        tensors[name] = values.to(torch.float32).contiguous()
    save_file(tensors, path, metadata={"format": "pt"})
    path.chmod(0o644)  # save_file creates 0600
    return sorted(shapes)


def write_byte_tokenizer(target: Path, vocab_size: int) -> None:
    """A byte-level BPE with one token per byte (id = byte value) and no merges.

    Exactly `vocab_size` (256) entries, so it matches the config; ids 0/1/2 (bytes 0x00..0x02)
    double as pad/bos/eos, as the config says. Only llama.cpp's converter needs it.
    """
    alphabet = gpt2_alphabet()
    assert len(alphabet) == vocab_size == 256
    vocab = {alphabet[byte]: byte for byte in range(256)}
    tokenizer = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": True},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": True},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": [],
        },
    }
    config = {
        "tokenizer_class": "TokenizersBackend",
        "model_max_length": 128,
        # Qwen3.5's tokenizer class (picked from model_type) defaults unk to a new "<|endoftext|>" id 256.
        "unk_token": alphabet[0],
        "pad_token": alphabet[0],
        "bos_token": alphabet[1],
        "eos_token": alphabet[2],
        "add_bos_token": False,
    }
    (target / "tokenizer.json").write_text(json.dumps(tokenizer, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    (target / "tokenizer_config.json").write_text(
        json.dumps(config, indent=1, ensure_ascii=False) + "\n", encoding="utf-8"
    )
