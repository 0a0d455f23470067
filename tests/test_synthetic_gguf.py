"""Synthetic GGUF checkpoints (runtime/loading/synthetic_gguf.py): the Q4_K_M type rule reproduces the real
files' per-tensor types exactly, and the checkpoint loads like a GGUF file at the shapes it claims.

tests/fixtures/real/q4_k_m_tensor_types.json holds each real file's tensor -> type list (read from the
files with the `gguf` package's GGUFReader): the test reads the real file where it is cached (and checks the fixture
still equals it), the fixture elsewhere, without downloading anything.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from ember.compiler.spec import spec_for_arch
from ember.runtime.loading.dims import resolve
from ember.runtime.loading.formats.gguf_reader import GGUFFile
from ember.runtime.loading.known_models import cache_dir
from ember.runtime.loading.synthetic_gguf import q4_k_m_types, synthetic_gguf_checkpoint

FIXTURE = Path(__file__).parent / "fixtures" / "real" / "q4_k_m_tensor_types.json"
REAL = json.loads(FIXTURE.read_text())
LLAMA3_8B = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 4096,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "intermediate_size": 14336,
    "vocab_size": 128256,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
}


def _real_types(model: str) -> tuple[dict[str, str], dict[str, tuple[int, ...]] | None]:
    """(tensor -> type name, tensor -> numpy shape or None) from the cached file, else the fixture."""
    path = cache_dir() / "models" / REAL[model]["file"]
    if not path.exists():
        return REAL[model]["types"], None
    with GGUFFile(path) as real:  # Ember's reader: the header only (gguf.GGUFReader takes ~20 s here)
        types = {name: info.type_name for name, info in real.tensors.items()}
        shapes = {name: info.shape for name, info in real.tensors.items()}
    assert types == REAL[model]["types"], "the committed fixture no longer matches the real file"
    return types, shapes


@pytest.mark.parametrize("source", ["cached file", "fixture"])
@pytest.mark.parametrize("model", list(REAL))
def test_q4_k_m_rule_reproduces_the_real_files_types(model, source):
    entry = REAL[model]
    types, shapes = _real_types(model) if source == "cached file" else (entry["types"], None)
    ckpt = synthetic_gguf_checkpoint(spec_for_arch(entry["arch"]), entry["config"], layer_order=entry["layer_order"])
    ours = {name: info.type_name for name, info in ckpt._gguf.tensors.items()}
    assert ours == types
    if shapes is not None:
        assert {name: info.shape for name, info in ckpt._gguf.tensors.items()} == shapes
    # control: the other processing order moves the Q6_K layers, so the check above can fail
    other = "numeric" if entry["layer_order"] == "lexicographic" else "lexicographic"
    moved = synthetic_gguf_checkpoint(spec_for_arch(entry["arch"]), entry["config"], layer_order=other)
    assert {name: info.type_name for name, info in moved._gguf.tensors.items()} != types
    assert Counter(i.type_name for i in moved._gguf.tensors.values()) == Counter(types.values())


def test_q4_k_m_rule_details():
    shapes = {
        "token_embd.weight": (1000, 640),
        "blk.0.attn_v.weight": (256, 640),
        "blk.0.ffn_down.weight": (640, 2048),
        "blk.0.attn_q.weight": (1024, 640),
        "blk.0.attn_norm.weight": (640,),
        "blk.0.attn_q.bias": (1024,),
    }
    types = q4_k_m_types(shapes, 1)
    assert types == {
        "token_embd.weight": "Q8_0",  # tied (no output.weight): the head's rule; 640 is not whole 256-blocks
        "blk.0.attn_v.weight": "Q8_0",  # use_more_bits(0, 1) -> Q6_K, row 640 falls back to Q8_0
        "blk.0.ffn_down.weight": "Q6_K",
        "blk.0.attn_q.weight": "Q5_0",  # Q4_K's fallback
        "blk.0.attn_norm.weight": "F32",
        "blk.0.attn_q.bias": "F32",
    }
    with pytest.raises(ValueError, match="layer_order"):
        q4_k_m_types(shapes, 1, layer_order="random")


def test_an_8b_shape_is_described_without_drawing_it():
    ckpt = synthetic_gguf_checkpoint(spec_for_arch("llama"), LLAMA3_8B)
    tensors = ckpt._gguf.tensors
    counts = Counter(info.type_name for info in tensors.values())
    assert counts == {"Q4_K": 193, "Q6_K": 33, "F32": 65}  # 16 attn_v + 16 ffn_down + output in Q6_K
    assert 4.8e9 < sum(info.nbytes for info in tensors.values()) < 5.0e9
    dims = resolve(spec_for_arch("llama"), ckpt).dims
    assert (dims.d, dims.layers, dims.hq, dims.hkv, dims.ffn, dims.vocab) == (4096, 32, 32, 8, 14336, 128256)


def test_tensors_are_seeded_valid_and_scaled():
    config = {
        "hidden_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 512,
        "vocab_size": 300,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": True,
    }
    spec = spec_for_arch("qwen2")
    ckpt = synthetic_gguf_checkpoint(spec, config, seed=1)
    assert "output.weight" not in ckpt._gguf.tensors and ckpt._gguf.tensors["token_embd.weight"].type_name == "Q6_K"
    again = synthetic_gguf_checkpoint(spec, config, seed=1)
    for name, info in ckpt._gguf.tensors.items():
        raw = ckpt.raw(name)
        assert raw.dtype == np.uint8 and raw.size == info.nbytes
        np.testing.assert_array_equal(raw, again.raw(name))
        values = ckpt.load(name)
        assert values.shape == info.shape and np.isfinite(values).all()
        if len(info.shape) == 2:  # rms ~ 1/sqrt(in), whatever the format
            rms = float(np.sqrt(np.mean(values.astype(np.float64) ** 2)))
            assert 0.7 < rms * np.sqrt(info.shape[1]) < 1.4, (name, info.type_name, rms)
    other_seed = synthetic_gguf_checkpoint(spec, config, seed=2)
    assert not np.array_equal(ckpt.raw("blk.0.attn_q.weight"), other_seed.raw("blk.0.attn_q.weight"))
    with pytest.raises(ValueError, match="no such tensor"):
        synthetic_gguf_checkpoint(spec, config, types={"blk.9.attn_q.weight": "Q8_0"})
    with pytest.raises(ValueError, match="scheme"):
        synthetic_gguf_checkpoint(spec, config, scheme="q2_k")
