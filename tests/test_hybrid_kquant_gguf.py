"""A K-quant GGUF of a Gated DeltaNet family (qwen3_5: three recurrent layers to one gated full-attention layer)
loads and runs: Q4_K / Q6_K / Q8_0 / Q5_0 matrices in llama.cpp's layout give the logits of the same file with
every tensor dequantized to f32 by the gguf package's reference dequantization (whose f32 path is exact against
transformers: tests/test_hybrid_reference.py).

The tiny f32 fixture is 64 wide, too narrow for K-quant rows (256-element super-blocks), so the file is built
here at width 256: the fixture's tensor names per layer (what llama.cpp's converter writes for this family,
the MTP block left out), quantized matrices drawn by runtime/loading/synthetic_gguf.py (llama.cpp's Q4_K_M
type rule, realistic scales), and small f32 vectors (norms near 1, negative decay rates)."""

import json

import gguf
import numpy as np
from fixture_data import tiny_gguf

from ember.compiler.spec import spec_for_arch
from ember.runtime.execution.sequence_runner import SequenceRunner
from ember.runtime.loading.model import load_model
from ember.runtime.loading.synthetic_gguf import synthetic_gguf_checkpoint

WIDTH = dict(hidden_size=256, intermediate_size=256, head_dim=64, linear_key_head_dim=64, linear_value_head_dim=64)
# one tensor in Q8_0 (a format the Q4_K_M rule picks only for narrow rows), and one in Q5_0
TYPES = {"blk.1.ffn_down.weight": "Q8_0", "blk.2.attn_gate.weight": "Q5_0"}


def _tensors(fixture_names):
    """name -> (ggml type, raw bytes as gguf-py takes them, f32 values) for each tensor of the wide file."""
    _, described = tiny_gguf("qwen3_5")
    config = json.loads((tiny_gguf("qwen3_5")[0].parent / "config.json").read_text()) | WIDTH
    source = synthetic_gguf_checkpoint(spec_for_arch("qwen3_5"), config, types=TYPES, seed=3)._gguf
    rng = np.random.default_rng(4)
    out = {}
    for name in fixture_names:
        drawn = name if name in source.tensors else name.rsplit(".", 1)[0] + ".weight"
        if not drawn.endswith(".weight") or drawn not in source.tensors:
            drawn = name + ".weight"
        info = source.tensors[drawn]
        qtype = gguf.GGMLQuantizationType(info.ggml_type)
        if len(info.shape) == 2 and qtype not in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
            raw = source.raw(drawn).reshape(info.shape[0], -1)
            out[name] = (qtype, raw, gguf.quants.dequantize(raw, qtype).reshape(info.shape))
            continue
        if name.endswith("ssm_a"):  # -exp(A_log): decays in (0, 1)
            values = -rng.uniform(0.5, 1.5, info.shape)
        elif len(info.shape) == 1:
            values = (
                1.0 + 0.1 * rng.standard_normal(info.shape) if "norm" in name else 0.1 * rng.standard_normal(info.shape)
            )
        else:
            values = 0.3 * rng.standard_normal(info.shape)
        values = values.astype(np.float32)
        out[name] = (gguf.GGMLQuantizationType.F32, values, values)
    return out, described["metadata"]


def _write(path, metadata, tensors, *, dequantized):
    writer = gguf.GGUFWriter(str(path), metadata["general.architecture"])
    for key, value in metadata.items():
        if key.startswith(("general.architecture", "tokenizer.", "GGUF.")):
            continue
        if isinstance(value, bool):
            writer.add_bool(key, value)
        elif isinstance(value, str):
            writer.add_string(key, value)
        elif isinstance(value, float):
            writer.add_float32(key, value)
        elif isinstance(value, list):
            writer.add_array(key, value)
        else:
            writer.add_uint32(key, int(value))
    for name, (qtype, raw, values) in tensors.items():
        if dequantized or qtype == gguf.GGMLQuantizationType.F32:
            writer.add_tensor(name, np.ascontiguousarray(values, np.float32))
        else:
            writer.add_tensor(name, raw, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _logits(path, prompt):
    """Every prompt position's logits [len(prompt), vocab] (one prefill: the recurrent state carried through)."""
    return np.asarray(SequenceRunner(load_model(path), 64).prefill(prompt, all_logits=True))


def test_a_k_quant_hybrid_gguf_gives_the_logits_of_its_dequantized_copy(tmp_path):
    _, described = tiny_gguf("qwen3_5")
    names = [t["name"] for t in described["tensors"] if not t["name"].startswith("blk.4.")]  # blk.4: MTP
    tensors, metadata = _tensors(names)
    wide = dict(metadata)
    wide.update(
        {
            "qwen35.block_count": 4,
            "qwen35.nextn_predict_layers": 0,
            "qwen35.embedding_length": 256,
            "qwen35.feed_forward_length": 256,
            "qwen35.attention.key_length": 64,
            "qwen35.attention.value_length": 64,
            "qwen35.rope.dimension_count": 16,
            "qwen35.ssm.state_size": 64,
            "qwen35.ssm.inner_size": 256,
            "qwen35.attention.recurrent_layers": [True, True, True, False],
        }
    )
    types = {t.name for t, _, _ in tensors.values()}
    assert {"Q4_K", "Q6_K", "Q8_0", "Q5_0"} <= types
    _write(quantized := tmp_path / "model.q4_k_m.gguf", wide, tensors, dequantized=False)
    _write(reference := tmp_path / "model.f32.gguf", wide, tensors, dequantized=True)
    rng = np.random.default_rng(0)
    prompt = rng.integers(3, 250, size=25).tolist()
    got, want = _logits(quantized, prompt), _logits(reference, prompt)
    assert np.isfinite(want).all() and 0.5 < np.abs(want).max() < 100
    np.testing.assert_allclose(got, want, atol=1e-4 * np.abs(want).max(), rtol=0)
