"""HF FP8 checkpoints (runtime/loading/fp8_checkpoint.py): F8_E4M3 projections with per-tensor, per-channel
(`weight_scale`) or 128 x 128 block (`weight_scale_inv`) scales. A target that keeps "fp8" (h200) holds them as
Fp8Weight; any other dequantizes them, giving exactly the logits of the same checkpoint stored in float."""

import json
import shutil
import struct

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from fixture_data import tiny_fixture

from ember.compiler.kernels.dense_gemv.fp8 import Fp8Weight, quantize_fp8
from ember.compiler.kernels.gguf_gemv.layout import WeightGroup
from ember.runtime.execution.sequence_runner import SequenceRunner
from ember.runtime.loading.formats.errors import CheckpointError
from ember.runtime.loading.formats.safetensors_dir import open_hf_checkpoint
from ember.runtime.loading.model import load_model

_DTYPES = {np.dtype(np.float32): "F32", np.dtype(ml_dtypes.float8_e4m3fn): "F8_E4M3"}


def _write_safetensors(path, tensors: dict[str, np.ndarray]) -> None:
    header, offset, blobs = {}, 0, []
    for name, array in tensors.items():
        data = np.ascontiguousarray(array).tobytes()
        header[name] = {
            "dtype": _DTYPES[array.dtype],
            "shape": list(array.shape),
            "data_offsets": [offset, offset + len(data)],
        }
        offset += len(data)
        blobs.append(data)
    encoded = json.dumps(header).encode()
    encoded += b" " * (-len(encoded) % 8)
    path.write_bytes(struct.pack("<Q", len(encoded)) + encoded + b"".join(blobs))


def _fp8_pair(tmp_path, scheme: str):
    """(FP8 checkpoint dir, float checkpoint dir holding its dequantized weights) from the tiny llama."""
    source, _ = tiny_fixture("llama")
    original = open_hf_checkpoint(source)
    fp8, plain = {}, {}
    for name in original.tensor_names:
        w = original.load(name)
        if not name.endswith("_proj.weight"):
            fp8[name] = plain[name] = w
            continue
        q = quantize_fp8(w, blocked=scheme == "block")
        values, scale = np.asarray(q.values), np.asarray(q.scale, np.float32)
        if scheme == "tensor":  # one scale for the matrix: requantize with the largest
            scale = np.asarray([np.abs(w).max() / 448.0], np.float32)
            values = np.asarray(jnp.asarray(w / scale[0]).astype(jnp.float8_e4m3fn))
        fp8[name] = values
        fp8[name + ("_scale_inv" if scheme == "block" else "_scale")] = scale if scheme != "channel" else scale[:, None]
        out, inner = w.shape
        if scheme == "block":
            full_scale = np.repeat(np.repeat(scale, 128, 0)[:out], 128, 1)[:, :inner]
        else:
            full_scale = scale[:, None] if scheme == "channel" else scale[0]
        plain[name] = (values.astype(np.float32) * full_scale).astype(np.float32)
    dirs = []
    for label, tensors in (("fp8", fp8), ("plain", plain)):
        folder = tmp_path / f"{scheme}-{label}"
        folder.mkdir()
        shutil.copy(source / "config.json", folder / "config.json")
        _write_safetensors(folder / "model.safetensors", tensors)
        dirs.append(folder)
    return dirs


def _logits(path, target):
    tokens = list(range(3, 30))
    return SequenceRunner(load_model(path, target=target), 64).prefill(tokens, all_logits=True).astype(np.float32)


@pytest.mark.parametrize("scheme", ["channel", "tensor", "block"])
def test_fp8_checkpoints_dequantize_exactly_where_fp8_is_not_kept(tmp_path, scheme):
    fp8_dir, plain_dir = _fp8_pair(tmp_path, scheme)
    np.testing.assert_array_equal(_logits(fp8_dir, "cpu"), _logits(plain_dir, "cpu"))


@pytest.mark.parametrize("scheme", ["channel", "block"])
def test_the_h200_target_keeps_them_fp8(tmp_path, scheme):
    fp8_dir, plain_dir = _fp8_pair(tmp_path, scheme)
    model = load_model(fp8_dir, target="h200")
    layer = model.params.layers[0]
    kept = [w for w in layer.values() if isinstance(w, Fp8Weight) or isinstance(w, WeightGroup)]
    assert kept, layer.keys()
    if scheme == "channel":  # every projection, packed q/k/v and gate/up included
        assert all(isinstance(w, Fp8Weight) for name, w in layer.items() if not name.endswith("norm.weight"))
    else:  # 128 x 128 blocks: only matrices of whole 128-row blocks (gate/up, 2 x 128 rows) stay FP8
        assert isinstance(layer["ffn_gate+ffn_up.weight"], Fp8Weight)
        assert layer["ffn_gate+ffn_up.weight"].blocked
        assert not isinstance(layer["attn_output.weight"], Fp8Weight)
    got = SequenceRunner(model, 64).prefill(list(range(3, 30)), all_logits=True).astype(np.float32)
    want = _logits(plain_dir, "cpu")
    assert np.abs(got - want).mean() <= 0.02 * want.std()  # bf16 activations against the fp32 reference


def test_a_missing_or_misshapen_scale_is_a_clear_error(tmp_path):
    fp8_dir, _ = _fp8_pair(tmp_path, "channel")
    ckpt_file = fp8_dir / "model.safetensors"
    original = open_hf_checkpoint(fp8_dir)
    tensors = {
        n: (original.load_fp8(n) if original.entry(n).dtype == "F8_E4M3" else original.load(n))
        for n in original.tensor_names
    }
    original.close()
    scale = "model.layers.0.self_attn.q_proj.weight_scale"
    broken = dict(tensors)
    del broken[scale]
    _write_safetensors(ckpt_file, broken)
    with pytest.raises(CheckpointError, match="has no .*_scale"):
        load_model(fp8_dir, target="cpu")
    broken = dict(tensors)
    broken[scale] = np.ones((3, 2), np.float32)
    _write_safetensors(ckpt_file, broken)
    with pytest.raises(CheckpointError, match="q_proj.weight_scale has shape"):
        load_model(fp8_dir, target="h200")
