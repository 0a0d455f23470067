"""The deterministic plans' attention (compiler/kernels/attention/invariant.py) on an NVIDIA GPU: a query's
output is the same bits alone, as a decode row beside 31 others, and inside prefill chunks of several lengths
and offsets (one and several segments per launch), at the 1.5B and 8B head shapes; and it agrees with the
reference `_attend`.

  JAX_PLATFORMS=cuda python -m pytest -q -m gpu tests/kernels/attention/test_attention_invariant_gpu.py
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("triton")
if jax.default_backend() != "gpu":
    pytest.skip("needs an NVIDIA GPU (JAX_PLATFORMS=cuda)", allow_module_level=True)

from ember.compiler.kernels.attention.invariant import attend_invariant  # noqa: E402
from ember.compiler.kernels.attention.reference import _attend  # noqa: E402

pytestmark = pytest.mark.gpu
PAGE, WIDTH = 16, 320  # 5,120 keys per table: 3 splits of 2,048


@functools.partial(jax.jit, static_argnames=("num_decode", "scale"))
def _run(q, k_pool, v_pool, dec_tables, pre_tables, positions, window, *, num_decode, scale):
    return attend_invariant(q, k_pool, v_pool, dec_tables, pre_tables, positions, num_decode, window, scale)


@pytest.mark.parametrize("heads", [(12, 2), (32, 8)], ids=["1.5b", "8b"])
@pytest.mark.parametrize("window", [0, 1024])
def test_same_bits_alone_beside_others_and_inside_chunks(heads, window):
    hq, hkv = heads
    dh, rng = 128, np.random.default_rng(hq + window)
    blocks = 8 * WIDTH
    pools = [jnp.asarray(rng.standard_normal((blocks, PAGE, hkv, dh), np.float32), jnp.bfloat16) for _ in range(2)]
    tables = np.stack([rng.permutation(np.arange(1, blocks))[:WIDTH] for _ in range(40)]).astype(np.int32)
    length = 4500  # the probe's sequence: its query at 4,300 spans all three splits
    queries = jnp.asarray(rng.standard_normal((length, hq, dh), np.float32), jnp.bfloat16)
    probe, win = 4300, jnp.int32(window)
    scale = dh**-0.5
    run = lambda q, dec, pre, pos, n: np.asarray(  # noqa: E731
        _run(q, *pools, jnp.asarray(dec), jnp.asarray(pre), jnp.asarray(pos, jnp.int32), win, num_decode=n, scale=scale)
    )
    empty = np.zeros((0, WIDTH), np.int32)
    alone = run(queries[probe : probe + 1], tables[:1], empty, [probe], 1)[0]

    others = rng.integers(0, 5000, 31)
    q = jnp.asarray(rng.standard_normal((32, hq, dh), np.float32), jnp.bfloat16).at[17].set(queries[probe])
    positions = np.concatenate([others[:17], [probe], others[17:]])
    dec = np.concatenate([tables[1:18], tables[:1], tables[18:32]])
    beside = run(q, dec, empty, positions, 32)[17]
    assert np.array_equal(beside, alone), "decode row beside 31 others"

    for start, chunk, segments in ((4290, 16, 1), (3988, 512, 1), (3800, 512, 4), (4280, 64, 8)):
        rows = np.zeros((segments, chunk), np.int32)  # the probe's chunk is segment 1 (or 0), others random
        seg = min(1, segments - 1)
        q = np.asarray(rng.standard_normal((segments, chunk, hq, dh), np.float32)).astype(jnp.bfloat16)
        q[seg] = np.asarray(queries[start : start + chunk])
        for s in range(segments):
            first = start if s == seg else int(rng.integers(0, 4000))
            rows[s] = np.arange(first, first + chunk)
        pre = np.concatenate([tables[2 : 2 + seg], tables[:1], tables[2 + seg : 1 + segments]])
        dec_probe = rng.integers(0, 4000, 3)  # three decode rows first in the step
        got = run(
            jnp.concatenate([jnp.asarray(q[:1, :3]).reshape(3, hq, dh), jnp.asarray(q).reshape(-1, hq, dh)]),
            tables[33:36],
            pre,
            np.concatenate([dec_probe, rows.reshape(-1)]),
            3,
        )
        assert np.array_equal(got[3 + seg * chunk + probe - start], alone), f"chunk of {chunk} from {start}"

    keys = pools[0].astype(jnp.float32)[tables[0]].reshape(-1, hkv, dh)[: probe + 1]
    values = pools[1].astype(jnp.float32)[tables[0]].reshape(-1, hkv, dh)[: probe + 1]
    with jax.default_matmul_precision("highest"):
        expected = _attend(
            queries[probe : probe + 1].astype(jnp.float32)[None], keys[None], values[None],
            jnp.asarray([[probe]]), win, scale,
        )[0, 0]  # fmt: skip
    np.testing.assert_allclose(alone.astype(np.float32), np.asarray(expected), rtol=1e-2, atol=1e-2)
