"""Device weight bytes against the checkpoint's tensor bytes (runtime/loading/weight_bytes.py), as `ember serve`'s
startup line and /v1/info report them, on the cpu target: dequantized GGUF weights cost 4 bytes each, the default
int8 blocks ~1.1-1.3, weights kept packed cost their blocks (within 1.05x of the file), dense copies show as a
larger ratio."""

from __future__ import annotations

import httpx
import numpy as np
import pytest
from tiny_configs import TINY_LLAMA

from ember.compiler.spec import spec_for_arch
from ember.compiler.targets import get_target
from ember.runtime.loading.model import load_model
from ember.runtime.loading.synthetic_gguf import synthetic_gguf_checkpoint
from ember.runtime.loading.weight_bytes import WeightBytes, weight_bytes

CONFIG = {**TINY_LLAMA, "tie_word_embeddings": False}
GGUF_FORMATS = ("q4_k", "q6_k", "q8_0", "q5_0")


@pytest.fixture(scope="module")
def checkpoint():
    # Q4_K_M's mix: Q4_K matrices, Q6_K head / some attn_v and ffn_down, F32 norms
    return synthetic_gguf_checkpoint(spec_for_arch("llama"), CONFIG, seed=1)


def _elements(ckpt) -> int:
    return sum(int(np.prod(ckpt.tensor_shape(name))) for name in ckpt._gguf.tensors)


def _policy(**weights):
    return get_target("cpu").policy.overridden({f"weights.{k}": v for k, v in weights.items()})


def test_dequantized_weights_cost_four_bytes_each(checkpoint):
    report = weight_bytes(load_model(checkpoint, target="cpu", precision="exact"))  # every tensor to float32
    assert report.checkpoint == sum(int(info.nbytes) for info in checkpoint._gguf.tensors.values())
    assert report.device == 4 * _elements(checkpoint)
    assert report.ratio > 5  # ~4.5 bits per Q4_K weight in the file


def test_block_layouts_cost_their_bytes_per_weight(checkpoint):
    # the cpu default: Q4_K's codes two per byte + float32 block scales and offsets (0.75 bytes per weight), the
    # other formats' int8 codes + float32 scales (1.125-1.25), norms float32; with every code int8, ~1.25
    elements = _elements(checkpoint)
    default = weight_bytes(load_model(checkpoint, target="cpu"))
    assert 0.75 * elements <= default.device <= 1.0 * elements, default.line()
    int8 = weight_bytes(load_model(checkpoint, target="cpu", kernel_policy=_policy(kept_layout="int8_blocks")))
    assert 1.1 * elements <= int8.device <= 1.4 * elements, int8.line()


def test_packed_weights_stay_within_five_percent_of_the_file(checkpoint):
    kept = weight_bytes(
        load_model(
            checkpoint, target="cpu", kernel_policy=_policy(quantized_formats=GGUF_FORMATS, kept_layout="planes")
        )
    )
    assert kept.checkpoint * 0.99 <= kept.device <= kept.checkpoint * 1.05, kept.line()
    copies = weight_bytes(
        load_model(
            checkpoint,
            target="cpu",
            kernel_policy=_policy(quantized_formats=GGUF_FORMATS, kept_layout="planes", dense_copies=True),
        )
    )
    assert copies.device > 3 * kept.device, copies.line()  # every matrix read whole got a float32 copy too


def test_report_line_and_fields():
    report = WeightBytes(device=4_700_000_000, checkpoint=4_680_000_000)
    assert report.line() == "weights 4.70 GB on the device for 4.68 GB of checkpoint tensors (1.00x)"
    assert report.as_dict() == {"device": 4_700_000_000, "checkpoint": 4_680_000_000, "ratio": 1.0043}


def test_serve_reports_weight_bytes(server):
    info = httpx.get(server.url + "/v1/info", timeout=30).json()["weight_bytes"]
    # the tiny chat model: float32 safetensors loaded as float32 on the cpu target, so the same bytes
    assert info["device"] == info["checkpoint"] > 0 and info["ratio"] == 1.0
    assert f"({info['ratio']:.2f}x)" in server.log() and "GB of checkpoint tensors" in server.log()
