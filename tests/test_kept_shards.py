"""Kept quantized weights split over a device mesh along whole blocks (compiler/kernels/kept_shards.py): which axis
of each layout's arrays a split takes, the splits refused for cutting a block, the loader keeping such a weight
whole with one warning line, and the memory check counting one device's share. The projections on split weights
run on simulated devices in tests/test_tensor_parallel.py (a subprocess: JAX's device count is fixed at start)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from fixture_data import kquant_fixture
from jax.sharding import Mesh, PartitionSpec

from ember.compiler.kernels.cpu_gemv.layout import from_quantized
from ember.compiler.kernels.dense_gemv.fp8 import quantize_fp8
from ember.compiler.kernels.gguf_gemv.layout import WeightGroup, pack, random_gguf_bytes
from ember.compiler.kernels.kept_shards import BlockBoundaryError, WeightSplit, leaf_specs, local_weight
from ember.compiler.kernels.moe.packed import pack_experts
from ember.compiler.spec import SPECS_DIR, load_spec
from ember.compiler.targets.mesh import MeshConfig
from ember.runtime.loading.checkpoint import open_checkpoint
from ember.runtime.loading.dims import resolve
from ember.runtime.loading.memory_plan import planned_weight_bytes
from ember.runtime.loading.sharding import Placement

P = PartitionSpec
RNG = np.random.default_rng(0)


def _planes(fmt: str, shape: tuple[int, int]):
    return pack(random_gguf_bytes(RNG, fmt, shape, realistic=True), fmt, shape)


def _axes(specs) -> set[int | None]:
    """The array axis each spec splits (None: whole)."""
    return {next((i for i, name in enumerate(spec) if name), None) for spec in specs}


def test_gguf_planes_split_rows_along_out_and_whole_blocks_along_in():
    w = _planes("q4_k", (64, 512))  # planes [in / 256, out, ...]
    assert _axes(leaf_specs(w, 0, 2, "tp")) == {1}
    assert _axes(leaf_specs(w, 1, 2, "tp")) == {0}
    with pytest.raises(BlockBoundaryError, match="split 4 ways would cut a block of 256"):
        leaf_specs(w, 1, 4, "tp")
    q8 = _planes("q8_0", (64, 128))  # 32-element blocks: 4 ways is one block each, 8 would cut them
    assert _axes(leaf_specs(q8, 1, 4, "tp")) == {0}
    with pytest.raises(BlockBoundaryError, match="cut a block of 32"):
        leaf_specs(q8, 1, 8, "tp")
    with pytest.raises(BlockBoundaryError, match="rows of 64 does not divide by 3"):
        leaf_specs(w, 0, 3, "tp")
    assert local_weight(w._replace(split=WeightSplit(_mesh(), 0)))._replace(planes={}).shape == (64, 512)


def test_a_packed_expert_stack_splits_by_expert_by_rows_or_by_whole_input_blocks():
    experts, out, inner = 4, 32, 512
    raw = random_gguf_bytes(RNG, "q6_k", (experts * out, inner), realistic=True)
    w = pack_experts(raw, "q6_k", (experts, out, inner))  # planes [E, in / 256, out, ...]
    assert [_axes(leaf_specs(w, axis, 2, "tp")) for axis in (0, 1, 2)] == [{0}, {2}, {1}]
    with pytest.raises(BlockBoundaryError):
        leaf_specs(w, 2, 4, "tp")


def test_int8_blocks_split_whole_activation_chunks_and_keep_an_empty_offset_whole():
    q4 = from_quantized(jax.device_put(_planes("q4_k", (32, 256))))  # offsets (the block minimums)
    assert leaf_specs(q4, 1, 8, "tp") == [P(None, "tp")] * 3  # 32 elements a shard: one chunk
    q6 = from_quantized(jax.device_put(_planes("q6_k", (32, 256))))  # 16-element blocks, no offsets
    assert leaf_specs(q6, 0, 2, "tp") == [P("tp", None), P("tp", None), P(None)]
    with pytest.raises(BlockBoundaryError, match="cut a block of 32"):
        leaf_specs(q6, 1, 16, "tp")  # 16 elements a shard would split the kernel's 32-element chunks


def test_fp8_values_split_with_their_scales():
    w = jnp.asarray(RNG.standard_normal((256, 384)), jnp.float32)
    channel, blocks = quantize_fp8(w), quantize_fp8(w, blocked=True)  # scale [256]; scale [2, 3]
    assert leaf_specs(channel, 0, 4, "tp") == [P("tp", None), P("tp")]
    assert leaf_specs(channel, 1, 4, "tp") == [P(None, "tp"), P(None)]  # each shard reads every row's scale
    assert leaf_specs(blocks, 0, 2, "tp") == [P("tp", None), P("tp", None)]
    with pytest.raises(BlockBoundaryError, match="cut a block of 128"):
        leaf_specs(blocks, 0, 4, "tp")
    with pytest.raises(BlockBoundaryError, match="input of 384 split 2 ways would cut a block of 128"):
        leaf_specs(blocks, 1, 2, "tp")  # 3 blocks of 128 columns


def _mesh() -> Mesh:
    return Mesh(np.array(jax.devices()[:1]), ("tp",))


def test_a_weight_that_cannot_split_is_kept_whole_with_one_warning(capsys):
    placement = Placement(MeshConfig(2), _mesh(), {"global": {}, "layer": {"attn_v.weight": 0}}, True)
    group = WeightGroup((jnp.ones((4, 8)), jnp.ones((4, 8))))
    for _ in range(2):  # two layers
        placed = placement.shard(lambda v: v, jnp.float32)("attn_v.weight", True, group)
    assert isinstance(placed, WeightGroup) and placement.kept_whole.keys() == {"attn_v.weight"}
    assert capsys.readouterr().err.count("attn_v.weight kept whole on each device") == 1
    assert "1 weights split (1 kept quantized whole: see the warnings)" in placement.describe()
    q8 = placement.shard(jax.device_put, jnp.float32)("attn_v.weight", True, _planes("q8_0", (8, 64)))
    assert q8.split == WeightSplit(placement.mesh, 0) and q8.dtype == "float32"  # split from the host, marked


def test_the_memory_check_counts_one_devices_share_of_kept_weights():
    path, _, _, _ = kquant_fixture()
    spec, ckpt = load_spec(SPECS_DIR / "qwen3_moe.toml"), open_checkpoint(path)
    resolved = resolve(spec, ckpt)
    manifest = {"global_weights": ["token_embd.weight", "output.weight"], "layer_weights": ["attn_q.weight"]}
    manifest["packed_weights"] = {}
    args = (spec, manifest, ckpt, resolved, "float32", ("q4_k", "q6_k"), False)
    whole = planned_weight_bytes(*args)
    halves = planned_weight_bytes(*args, lambda name, is_global: 2)
    assert whole == 2 * halves and whole < 256 * 256 * 4 * 4  # kept bytes (not fp32), halved
