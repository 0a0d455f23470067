"""The deterministic projections (compiler/kernels/invariant_matmul/linear.py): which form of a weight a step
multiplies (packed planes up to deterministic.packed_max_rows rows where a dense copy exists, always where none
does; a group's parts under the whole group's config) and that every form gives the same bits as the dense copy."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from ember.compiler.kernels.gguf_gemv import pack, random_gguf_bytes
from ember.compiler.kernels.gguf_gemv.layout import DenseBacked, QuantizedWeight, WeightGroup
from ember.compiler.kernels.gguf_gemv.reference import dequantize
from ember.compiler.kernels.invariant_matmul import linear as invariant_linear
from ember.compiler.kernels.invariant_matmul.config import pick_config

K = 512


def _weight(fmt: str, n: int, seed: int) -> QuantizedWeight:
    return pack(random_gguf_bytes(np.random.default_rng(seed), fmt, (n, K), realistic=True), fmt, (n, K))


def _group() -> WeightGroup:  # q/k in Q4_K, v in Q6_K, as a Q4_K_M checkpoint stores them
    return WeightGroup((_weight("q4_k", 64, 1), _weight("q4_k", 32, 2), _weight("q6_k", 32, 3)))


def _backed(kept) -> DenseBacked:
    return DenseBacked(kept, invariant_linear.dense_weight(kept, jnp.bfloat16))


@pytest.fixture
def calls(monkeypatch):
    """Records (weight form, config) of each invariant_matmul call linear makes."""
    seen = []
    real = invariant_linear.invariant_matmul

    def spy(x, w, out_dtype=None, *, config=None, **kwargs):
        seen.append(("packed" if isinstance(w, QuantizedWeight) else "dense", int(w.shape[0]), config))
        return real(x, w, out_dtype, config=config, **kwargs)

    monkeypatch.setattr(invariant_linear, "invariant_matmul", spy)
    return seen


@pytest.mark.parametrize("rows, form", [(1, "packed"), (8, "packed"), (9, "dense"), (64, "dense")])
def test_a_dense_backed_weight_is_read_packed_up_to_the_policys_rows(calls, kernel_overrides, rows, form):
    kernel_overrides({"deterministic.packed_max_rows": 8})
    x = jnp.ones((rows, K), jnp.bfloat16)
    invariant_linear.linear(x, _backed(_group()))
    whole = pick_config(128, K)
    if form == "packed":
        assert [(f, n) for f, n, _ in calls] == [("packed", 64), ("packed", 32), ("packed", 32)]
    else:
        assert [(f, n) for f, n, _ in calls] == [("dense", 128)]
    assert all(config == whole for _, _, config in calls)  # each part multiplied as its concatenation would be


def test_a_weight_without_a_copy_is_read_packed_at_every_row_count(calls, kernel_overrides):
    kernel_overrides({"deterministic.packed_max_rows": 0})
    invariant_linear.linear(jnp.ones((300, K), jnp.bfloat16), _weight("q6_k", 48, 5))
    assert [(f, n) for f, n, _ in calls] == [("packed", 48)]


def test_every_form_gives_the_dense_copys_bits(kernel_overrides):
    group = _group()
    x = jnp.asarray(np.random.default_rng(9).standard_normal((5, K)), jnp.bfloat16)
    bias = jnp.arange(128, dtype=jnp.bfloat16)
    want = invariant_linear.linear(x, invariant_linear.dense_weight(group, jnp.bfloat16), bias)
    np.testing.assert_array_equal(np.asarray(invariant_linear.linear(x, group, bias)), np.asarray(want))
    for packed_max_rows in (0, 16):
        kernel_overrides({"deterministic.packed_max_rows": packed_max_rows})
        got = invariant_linear.linear(x, _backed(group), bias)
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    parts = invariant_linear.linear_split(x, _backed(group), bias, sizes=(64, 32, 32))
    np.testing.assert_array_equal(np.asarray(jnp.concatenate(parts, axis=1)), np.asarray(want))
    dense = np.asarray(dequantize(group.parts[2]).astype(jnp.bfloat16))
    assert (np.asarray(invariant_linear.dense_weight(group, jnp.bfloat16))[96:] == dense).all()


def test_int8_blocks_take_every_q4_k_q6_k_weight_at_every_row_count(kernel_overrides, monkeypatch):
    """With deterministic.int8_blocks, a Q4_K / Q6_K group (with or without its copy) multiplies through int_invariant
    under the whole group's config at every row count, giving its reference's bits; a group holding another format
    keeps the bf16 matmul at every row count (one path per weight, never both)."""
    from ember.compiler.kernels.int_invariant import config as int_config
    from ember.compiler.kernels.int_invariant.reference import int_invariant_reference

    kernel_overrides({"deterministic.int8_blocks": True, "deterministic.packed_max_rows": 8})
    group = _group()
    whole = int_config.pick_config(128, K)
    seen = []
    real = invariant_linear.int_invariant_parts

    def spy(x, parts, out_dtype=None, *, config=None, **kwargs):
        seen.extend((int(w.shape[0]), config) for w in parts)
        return real(x, parts, out_dtype, config=config, **kwargs)

    monkeypatch.setattr(invariant_linear, "int_invariant_parts", spy)
    x = jnp.asarray(np.random.default_rng(2).standard_normal((20, K)), jnp.bfloat16)
    want = jnp.concatenate([int_invariant_reference(x, part, whole, jnp.bfloat16) for part in group.parts], axis=1)
    for weight in (group, _backed(group)):
        for rows in (1, 20):
            seen.clear()
            got = invariant_linear.linear(x[:rows], weight)
            assert seen == [(64, whole), (32, whole), (32, whole)]
            np.testing.assert_array_equal(np.asarray(got), np.asarray(want[:rows]))
    mixed = WeightGroup((*group.parts[:2], _weight("q8_0", 32, 4)))
    seen.clear()
    for rows in (1, 20):
        invariant_linear.linear(x[:rows], _backed(mixed))
    assert seen == []
