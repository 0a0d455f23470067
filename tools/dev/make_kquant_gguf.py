"""A small qwen3_moe GGUF with Q4_K / Q6_K tensors, and transformers' reference for exactly those weights.

Run in the torch environment, after make_tiny_checkpoints.py's families exist (it reuses its code):

    /work/venv311/bin/python tools/dev/make_kquant_gguf.py

K-quants need rows that are multiples of 256, which the 64-wide tiny models lack, so this model
is 256 wide: qwen3_moe, 2 layers (both MoE: 4 experts, top-2, moe_intermediate 256), 4 q / 2 kv
heads of 64, vocab 256. Steps:
  1. seeded random HF model (make_tiny_checkpoints.build_model), saved to a temporary folder;
  2. llama.cpp's converter writes its f32 GGUF (make_hybrid_gguf, same sdist and patch);
  3. matrices are re-encoded by kquants.py with a Q4_K_M-like choice: Q6_K for output.weight,
     attn_v and ffn_down_exps, Q4_K for the other matrices; norms and the router stay F32;
  4. the quantized tensors are dequantized with gguf-py and copied back into the HF model, whose
     fp32 outputs become reference.npz: the reference is for the file's weights exactly.
Writes tests/fixtures/tiny/qwen3_moe_kquant/: model.q4_k_m.gguf, reference.npz, config.json
(the HF config the model was built from) and gguf_tensors.json.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from hybrid_families import write_byte_tokenizer  # sibling scripts (run by path)
from kquants import QUANTIZERS
from make_hybrid_gguf import TINY_DIR, _run_converter, converter_dir, describe_gguf
from make_tiny_checkpoints import (
    TinyFamily,
    build_model,
    check_against_full_forward,
    reference_outputs,
    write_npz_deterministic,
)

ARCH_DIR = "qwen3_moe_kquant"
FILE_TYPE_Q4_K_M = 15  # general.file_type of llama.cpp's "Q4_K_M"
FAMILY = TinyFamily(
    "qwen3_moe",
    "Qwen3MoeForCausalLM",
    "Qwen3MoeConfig",
    dict(
        vocab_size=256,
        hidden_size=256,
        max_position_embeddings=128,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        intermediate_size=256,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=256,
        norm_topk_prob=True,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
    ),
)


def quant_type(name: str, ndim: int) -> str | None:
    """The K-quant for a GGUF tensor, None to keep it F32."""
    if ndim < 2 or name.endswith("ffn_gate_inp.weight"):
        return None
    if name == "output.weight" or name.endswith(("attn_v.weight", "ffn_down_exps.weight")):
        return "Q6_K"
    return "Q4_K"


def _hf_views(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """GGUF name -> the HF tensor (or slice) holding the same numbers, rows in the same order."""
    views = {
        "token_embd.weight": model.model.embed_tokens.weight,
        "output.weight": model.lm_head.weight,
        "output_norm.weight": model.model.norm.weight,
    }
    for i, layer in enumerate(model.model.layers):
        attn, experts = layer.self_attn, layer.mlp.experts
        n_ff = experts.gate_up_proj.shape[1] // 2  # gate_up_proj [E, 2 * n_ff, H]: gate rows first
        views.update(
            {
                f"blk.{i}.attn_q.weight": attn.q_proj.weight,
                f"blk.{i}.attn_k.weight": attn.k_proj.weight,
                f"blk.{i}.attn_v.weight": attn.v_proj.weight,
                f"blk.{i}.attn_output.weight": attn.o_proj.weight,
                f"blk.{i}.attn_q_norm.weight": attn.q_norm.weight,
                f"blk.{i}.attn_k_norm.weight": attn.k_norm.weight,
                f"blk.{i}.attn_norm.weight": layer.input_layernorm.weight,
                f"blk.{i}.ffn_norm.weight": layer.post_attention_layernorm.weight,
                f"blk.{i}.ffn_gate_inp.weight": layer.mlp.gate.weight,
                f"blk.{i}.ffn_gate_exps.weight": experts.gate_up_proj[:, :n_ff],
                f"blk.{i}.ffn_up_exps.weight": experts.gate_up_proj[:, n_ff:],
                f"blk.{i}.ffn_down_exps.weight": experts.down_proj,
            }
        )
    return views


def write_quantized(f32_path: Path, out_path: Path, model: torch.nn.Module) -> dict[str, str]:
    """Re-encode f32_path's matrices into out_path; load the dequantized values into `model`."""
    import gguf  # the converter's gguf-py (on sys.path after the conversion)

    reader = gguf.GGUFReader(f32_path)
    writer = gguf.GGUFWriter(str(out_path), reader.fields["general.architecture"].contents())
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        value = FILE_TYPE_Q4_K_M if field.name == "general.file_type" else field.contents()
        sub_type = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, value, field.types[0], sub_type=sub_type)
    views, types = _hf_views(model), {}
    with torch.no_grad():
        for tensor in reader.tensors:
            data = np.array(tensor.data, dtype=np.float32)  # numpy order [..., rows, cols]
            hf = views[tensor.name]
            assert torch.equal(torch.from_numpy(data).reshape(hf.shape), hf), f"{tensor.name}: mapping is off"
            qtype = quant_type(tensor.name, data.ndim)
            types[tensor.name] = qtype or "F32"
            if qtype is None:
                writer.add_tensor(tensor.name, data)
                continue
            blocks = QUANTIZERS[qtype](data)  # [n_blocks, block bytes]
            raw = blocks.reshape(*data.shape[:-1], -1)  # [..., rows, row bytes]
            writer.add_tensor(tensor.name, raw, raw_dtype=gguf.GGMLQuantizationType[qtype])
            back = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[qtype]).reshape(data.shape)
            error = float(np.abs(back - data).max())
            assert error < 0.1 * float(np.abs(data).max()), f"{tensor.name}: {qtype} round trip error {error}"
            hf.copy_(torch.from_numpy(back).reshape(hf.shape))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return types


def main() -> int:
    torch.set_num_threads(1)
    seed = 1234
    target = TINY_DIR / ARCH_DIR
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    model = build_model(FAMILY, seed)
    with tempfile.TemporaryDirectory() as scratch:
        hf_dir = Path(scratch) / "hf"
        model.save_pretrained(hf_dir, safe_serialization=True)
        write_byte_tokenizer(hf_dir, FAMILY.config["vocab_size"])
        f32 = Path(scratch) / "model.f32.gguf"
        _run_converter(converter_dir(), [str(hf_dir), "--outtype", "f32", "--outfile", str(f32)])
        out = target / "model.q4_k_m.gguf"
        types = write_quantized(f32, out, model)
        shutil.copy(hf_dir / "config.json", target / "config.json")
    ref = reference_outputs(model, FAMILY.config["vocab_size"], seed)
    write_npz_deterministic(target / "reference.npz", ref)
    (target / "gguf_tensors.json").write_text(json.dumps(describe_gguf(out), indent=1) + "\n", encoding="utf-8")
    counts = {t: sum(1 for v in types.values() if v == t) for t in sorted(set(types.values()))}
    print(f"{out.relative_to(TINY_DIR.parents[2])}: {out.stat().st_size} bytes, tensor types {counts}")
    print(
        f"max |logit| {np.abs(ref['prefill_logits']).max():.3g}, "
        f"cache vs full forward {check_against_full_forward(model, ref):.3g}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
