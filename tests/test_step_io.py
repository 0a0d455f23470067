"""The one-buffer host/device transfer of a step's inputs and outputs is lossless."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from ember.compiler.kernels.sampling import SampleResult
from ember.runtime.execution.step_io import pack_arrays, pack_result, unpack_arrays, unpack_result

DTYPES = [np.int32, np.float32, np.uint32, np.bool_]


def _random_array(rng: np.random.Generator, dtype, shape) -> np.ndarray:
    if dtype is np.bool_:
        return rng.random(shape) < 0.5
    if dtype is np.float32:  # any bit pattern that is a float, specials included
        values = rng.standard_normal(shape).astype(np.float32) * 1e30
        values.reshape(-1)[:3] = [np.inf, -np.inf, -0.0][: values.size]
        return values
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from(DTYPES), st.lists(st.integers(0, 5), max_size=3)), max_size=6),
    st.integers(0, 2**32 - 1),
)
def test_unpacked_inputs_equal_the_packed_arrays_bit_for_bit(specs, seed):
    rng = np.random.default_rng(seed)
    arrays = [_random_array(rng, dtype, tuple(shape)) for dtype, shape in specs]
    buffer, layout = pack_arrays(arrays)
    assert buffer.dtype == np.int32 and buffer.size == layout.words
    unpacked = jax.jit(unpack_arrays, static_argnums=1)(buffer, layout)
    for got, want in zip(unpacked, arrays, strict=True):
        got = np.asarray(got)
        assert got.dtype == want.dtype and got.shape == want.shape
        assert got.tobytes() == want.tobytes()  # bitwise: NaN payloads, -0.0 and infinities survive


def test_pack_arrays_rejects_an_unsupported_dtype():
    try:
        pack_arrays([np.zeros(3, np.float64)])
    except TypeError as error:
        assert "float64" in str(error)
    else:
        raise AssertionError("float64 was packed")


def test_the_step_result_comes_back_from_one_array():
    rng = np.random.default_rng(0)
    r, k = 5, 4
    result = SampleResult(
        tokens=jnp.asarray(rng.integers(0, 150000, r), jnp.int32),
        logprob=jnp.asarray(-rng.random(r) * 30, jnp.float32),
        top_ids=jnp.asarray(rng.integers(0, 150000, (r, k)), jnp.int32),
        top_logprobs=jnp.asarray(
            np.concatenate([-rng.random((r, k - 1)), np.full((r, 1), -np.inf)], axis=1), jnp.float32
        ),
    )
    packed = np.asarray(jax.jit(pack_result)(result))
    assert packed.shape == (r, 2 + 2 * k) and packed.dtype == np.int32
    for got, want in zip(unpack_result(packed), result, strict=True):
        assert np.asarray(want).tobytes() == got.tobytes()
