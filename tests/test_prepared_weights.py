"""The prepared-weights cache (runtime/loading/prepared_weights.py) on tiny GGUF files: a second load maps the
first one's arrays back bit for bit, in the cpu target's fp32 layout and in its int8-block layout; a changed
checkpoint is not served from an old entry; a damaged entry is ignored and written again; a cache folder that
cannot be written does not fail the load; the entries stay under their bound."""

from __future__ import annotations

import dataclasses
import io
import pickle
import struct
from pathlib import Path

import gguf
import jax
import numpy as np
import pytest
from gguf_test_data import write_gguf
from tiny_configs import TINY_LLAMA

from ember.compiler.spec import spec_for_arch
from ember.compiler.targets.cpu import CPU, CPU_FP32_WEIGHTS, CPU_INT8_BLOCKS, CPU_NIBBLE_BLOCKS
from ember.runtime.loading import prepared_weights
from ember.runtime.loading.model import load_model
from ember.runtime.loading.prepared_weights import PreparedWeights, wait_for_writes
from ember.runtime.loading.synthetic_gguf import synthetic_gguf_checkpoint

# every weight fp32 (`--precision exact`), and the block layouts (GGUF blocks kept as codes + scales; the default
# has Q4_K's codes two per byte)
POLICIES = {
    "fp32": dataclasses.replace(CPU.policy, weights=CPU_FP32_WEIGHTS),
    "int8_blocks": dataclasses.replace(CPU.policy, weights=CPU_INT8_BLOCKS),
    "nibble_blocks": dataclasses.replace(CPU.policy, weights=CPU_NIBBLE_BLOCKS),
}
# formats both layouts keep or dequantize: Q4_K, Q6_K (the tied embedding), Q8_0, Q5_0
TYPES = {"blk.1.attn_k.weight": "Q5_0", "blk.0.ffn_up.weight": "Q8_0"}


def _write_tiny_gguf(path: Path, seed: int) -> Path:
    spec = spec_for_arch("qwen2")
    ckpt = synthetic_gguf_checkpoint(spec, {**TINY_LLAMA, "tie_word_embeddings": True}, seed=seed, types=TYPES)
    value_types = {str: gguf.GGUFValueType.STRING, int: gguf.GGUFValueType.UINT32, float: gguf.GGUFValueType.FLOAT32}
    metadata = {k: (v, value_types[type(v)]) for k, v in ckpt.metadata.items() if k != "general.architecture"}
    tensors = {name: (info.ggml_type, ckpt.raw(name), info.shape) for name, info in ckpt._gguf.tensors.items()}
    return write_gguf(path, tensors, metadata, arch=spec.gguf_architecture)


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("EMBER_PREPARED_WEIGHTS_GIB", raising=False)
    return tmp_path / "cache" / "prepared-weights"


def _load(path: Path, layout: str, cached: bool = True):
    model = load_model(path, target="cpu", kernel_policy=POLICIES[layout], prepared_cache=cached)
    wait_for_writes()
    return model.params


def _same_bits(a, b) -> bool:
    leaves_a, tree_a = jax.tree_util.tree_flatten(a)
    leaves_b, tree_b = jax.tree_util.tree_flatten(b)
    return tree_a == tree_b and all(
        x.dtype == y.dtype
        and x.shape == y.shape
        and np.array_equal(np.asarray(x).reshape(-1).view(np.uint8), np.asarray(y).reshape(-1).view(np.uint8))
        for x, y in zip(leaves_a, leaves_b)
    )


def _entries(cache: Path) -> list[Path]:
    return sorted(cache.glob("*.weights"))


@pytest.mark.parametrize("layout", list(POLICIES))
def test_a_second_load_maps_the_first_ones_arrays(tmp_path, cache, capsys, layout):
    path = _write_tiny_gguf(tmp_path / "tiny.gguf", seed=3)
    fresh = _load(path, layout, cached=False)
    assert not cache.exists()  # off unless asked for
    first = _load(path, layout)
    assert "prepared weights written" in capsys.readouterr().err
    assert len(_entries(cache)) == 1
    second = _load(path, layout)
    assert "weights mapped from" in capsys.readouterr().err
    assert _same_bits(first, fresh) and _same_bits(second, fresh)
    # the tied LM head and the embedding table share one array after a fresh load, and after a mapped one
    assert len({id(x) for x in jax.tree_util.tree_leaves(second)}) == len(
        {id(x) for x in jax.tree_util.tree_leaves(fresh)}
    )
    if layout != "fp32":  # the kept layout itself came back, not floats (nibble pairs as uint8)
        code_dtype = np.uint8 if layout == "nibble_blocks" else np.int8
        assert any(leaf.dtype == code_dtype for leaf in jax.tree_util.tree_leaves(second))


def test_the_two_layouts_are_two_entries(tmp_path, cache):
    path = _write_tiny_gguf(tmp_path / "tiny.gguf", seed=3)
    _load(path, "fp32")
    _load(path, "int8_blocks")
    assert len(_entries(cache)) == 2


def test_a_changed_checkpoint_is_not_served_from_an_old_entry(tmp_path, cache, capsys):
    path = _write_tiny_gguf(tmp_path / "tiny.gguf", seed=3)
    old = _load(path, "fp32")
    _write_tiny_gguf(path, seed=4)  # same path and size, other weights
    changed = _load(path, "fp32")
    assert "weights mapped from" not in capsys.readouterr().err
    assert _same_bits(changed, _load(path, "fp32", cached=False))
    assert not _same_bits(changed, old)


@pytest.mark.parametrize("damage", ["truncated", "header", "leaf bytes"])
def test_a_damaged_entry_is_ignored_and_written_again(tmp_path, cache, capsys, damage):
    path = _write_tiny_gguf(tmp_path / "tiny.gguf", seed=3)
    fresh = _load(path, "fp32")
    (entry,) = _entries(cache)
    data = bytearray(entry.read_bytes())
    if damage == "truncated":
        data = data[: len(data) // 2]
    elif damage == "header":
        data[20:40] = b"\xff" * 20
    else:  # the first bytes of the first leaf (its data starts after the header, on a page)
        (header_len,) = struct.unpack_from("<Q", data, 8)
        start = -(-(16 + header_len) // prepared_weights.ALIGN) * prepared_weights.ALIGN
        data[start : start + 8] = bytes(255 - b for b in data[start : start + 8])
    entry.write_bytes(bytes(data))
    again = _load(path, "fp32")
    err = capsys.readouterr().err
    assert "unreadable" in err and "prepared weights written" in err
    assert _same_bits(again, fresh)
    assert _same_bits(PreparedWeights(entry, 1 << 40).read(), fresh)  # the rewritten entry reads back


def test_an_unwritable_cache_folder_does_not_fail_the_load(tmp_path, monkeypatch, capsys):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the cache folder would be")
    monkeypatch.setenv("EMBER_CACHE_DIR", str(blocker))
    path = _write_tiny_gguf(tmp_path / "tiny.gguf", seed=3)
    params = _load(path, "fp32")
    assert "prepared weights not written" in capsys.readouterr().err
    assert _same_bits(params, _load(path, "fp32", cached=False))


def test_entries_stay_under_their_bound(tmp_path, cache, monkeypatch):
    path = _write_tiny_gguf(tmp_path / "tiny.gguf", seed=3)
    _load(path, "fp32")
    (fp32,) = _entries(cache)
    fp32_bytes = fp32.stat().st_size
    fp32.unlink()
    _load(path, "int8_blocks")
    (int8,) = _entries(cache)
    # room for either entry, not both: writing the fp32 one again evicts the int8 one (the least recently used)
    monkeypatch.setenv("EMBER_PREPARED_WEIGHTS_GIB", str((fp32_bytes + int8.stat().st_size - 1) / 2**30))
    _load(path, "fp32")
    assert _entries(cache) == [fp32]
    monkeypatch.setenv("EMBER_PREPARED_WEIGHTS_GIB", "0")  # off: nothing read, nothing written
    fp32.unlink()
    _load(path, "fp32")
    assert _entries(cache) == []


def test_an_entry_cannot_name_other_code(tmp_path):
    class Evil:
        def __reduce__(self):
            return (print, ("ran",))

    with pytest.raises(pickle.UnpicklingError):
        prepared_weights._SkeletonUnpickler(io.BytesIO(pickle.dumps(Evil()))).load()
