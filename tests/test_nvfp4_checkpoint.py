"""NVFP4 checkpoints in ModelOpt's layout (runtime/loading/nvfp4_checkpoint.py), written from the tiny llama by
tools/dev/make_nvfp4_checkpoint.py: the cpu target dequantizes them, giving exactly the logits of their float
twin; the h200 target keeps them packed (Nvfp4Weight, the jnp reference matmul on CPU) within fp32 rounding
of the twin; the weight bytes on the device are the packed ones; a wrong group size or scale is refused."""

from __future__ import annotations

import json

import numpy as np
import pytest
from fixture_data import tiny_fixture

from ember.compiler.kernels.nvfp4 import Nvfp4Weight
from ember.runtime.execution.sequence_runner import SequenceRunner
from ember.runtime.loading.formats.errors import CheckpointError
from ember.runtime.loading.formats.safetensors_dir import open_hf_checkpoint
from ember.runtime.loading.memory_plan import planned_weight_bytes
from ember.runtime.loading.model import load_model
from ember.runtime.loading.weight_bytes import weight_bytes
from ember.tools.dev.make_nvfp4_checkpoint import write_nvfp4_pair, write_safetensors

TOKENS = list(range(3, 30))


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return write_nvfp4_pair(tiny_fixture("llama")[0], tmp_path_factory.mktemp("nvfp4"))


def _logits(model):
    return SequenceRunner(model, 64).prefill(TOKENS, all_logits=True).astype(np.float32)


def test_cpu_target_dequantizes_to_the_float_twin_exactly(pair):
    nvfp4_dir, plain_dir = pair
    np.testing.assert_array_equal(_logits(load_model(nvfp4_dir, target="cpu")), _logits(load_model(plain_dir)))


def test_h200_target_keeps_the_projections_packed(pair):
    nvfp4_dir, plain_dir = pair
    model = load_model(nvfp4_dir, target="h200", activation_dtype="float32")
    layer = model.params.layers[0]
    projections = {n: w for n, w in layer.items() if not n.endswith("norm.weight")}
    assert projections and all(isinstance(w, Nvfp4Weight) for w in projections.values()), list(layer)
    want = _logits(load_model(plain_dir, target="h200", activation_dtype="float32"))
    got = _logits(model)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    report = weight_bytes(model)  # the packed projections: ~0.56 bytes a weight, the rest float32 as stored
    assert report.device <= 1.05 * report.checkpoint, report.line()
    w = model.policy.weights
    planned = planned_weight_bytes(
        model.spec, model.plan.manifest, model.checkpoint, model.resolved, model.dtype, w.quantized_formats, False
    )
    assert planned == report.device  # what the memory check counted before loading


def _tensors(folder):
    ckpt = open_hf_checkpoint(folder)
    loaders = {"U8": ckpt.load_u8, "F8_E4M3": ckpt.load_fp8}
    tensors = {n: loaders.get(ckpt.entry(n).dtype, ckpt.load)(n) for n in ckpt.tensor_names}
    ckpt.close()
    return tensors


def test_a_misshapen_scale_or_another_group_size_is_refused(pair, tmp_path):
    nvfp4_dir, _ = pair
    broken_dir = tmp_path / "broken"
    broken_dir.mkdir()
    for name in ("config.json", "hf_quant_config.json"):
        (broken_dir / name).write_text((nvfp4_dir / name).read_text())
    tensors = _tensors(nvfp4_dir)
    scale = "model.layers.0.self_attn.q_proj.weight_scale"
    write_safetensors(broken_dir / "model.safetensors", {**tensors, scale: tensors[scale][:, :-1]})
    with pytest.raises(CheckpointError, match="q_proj.weight_scale has shape"):
        load_model(broken_dir, target="cpu")
    write_safetensors(broken_dir / "model.safetensors", tensors)
    config = json.loads((broken_dir / "config.json").read_text())
    config["quantization_config"]["group_size"] = 32
    (broken_dir / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="group_size 32"):
        load_model(broken_dir, target="h200")
