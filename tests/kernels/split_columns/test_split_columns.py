"""The dense q/k/v split: a GPU trace launches one Triton kernel for the three outputs (not three XLA slices),
anything else keeps split_columns' slices. The kernel's own results: tests/kernels/split_columns/test_split_interpret.py
(interpreter) and on the GPU tests/kernels/split_columns/test_split_columns_gpu.py."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from triton_calls import triton_calls

from ember.compiler.kernels.gguf_gemv import linear as linear_quant
from ember.compiler.kernels.split_columns import kernel as split_columns_gpu

BF16 = jnp.bfloat16


@pytest.fixture
def gpu_trace(monkeypatch):
    monkeypatch.setattr(split_columns_gpu, "triton_available", lambda: True)


@pytest.mark.parametrize("rows", [1, 5])
def test_a_dense_qkv_projection_splits_in_one_launch(gpu_trace, rows):
    x, w = jnp.zeros((rows, 64), BF16), jnp.zeros((4096 + 1024 + 1024, 64), BF16)
    calls = triton_calls(lambda x, w: linear_quant.linear_split(x, w, sizes=(4096, 1024, 1024)), x, w)
    assert [c["name"] for c in calls] == ["split_columns_kernel"]
    assert calls[0]["grid"] == (rows, 6, 1)  # 6,144 columns in tiles of 1,024
    outs = jax.eval_shape(lambda x, w: linear_quant.linear_split(x, w, sizes=(4096, 1024, 1024)), x, w)
    assert [o.shape for o in outs] == [(rows, 4096), (rows, 1024), (rows, 1024)]


def test_off_switch_other_part_counts_and_prefill_rows_keep_the_slices(gpu_trace, kernel_overrides):
    y = jnp.zeros((2, 96), BF16)
    assert triton_calls(lambda y: split_columns_gpu.split_three(y, (32, 64)), y) == []
    prefill = jnp.zeros((split_columns_gpu.MAX_ROWS + 1, 96), BF16)  # a prefill chunk keeps XLA's slices
    assert triton_calls(lambda y: split_columns_gpu.split_three(y, (32, 32, 32)), prefill) == []
    kernel_overrides({"split.triton": False})
    assert triton_calls(lambda y: split_columns_gpu.split_three(y, (32, 32, 32)), y) == []


def test_off_the_gpu_the_split_is_split_columns():
    y = jnp.arange(2 * 12, dtype=jnp.float32).reshape(2, 12)
    got = split_columns_gpu.split_three(y, (4, 6, 2))
    for part, want in zip(got, np.split(np.asarray(y), [4, 10], axis=1)):
        np.testing.assert_array_equal(np.asarray(part), want)
