"""open_hf_checkpoint on folders written with the safetensors package, and broken folders."""

from __future__ import annotations

import json
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.numpy import load_file, save_file

from ember.runtime.loading.formats.errors import CheckpointError
from ember.runtime.loading.formats.safetensors_dir import INDEX_FILE, open_hf_checkpoint

CONFIG = {"architectures": ["Qwen2ForCausalLM"], "hidden_size": 8, "num_hidden_layers": 1}


def make_tensors(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "model.embed_tokens.weight": rng.standard_normal((6, 8)).astype(ml_dtypes.bfloat16),
        "model.layers.0.self_attn.q_proj.weight": rng.standard_normal((8, 8)).astype(np.float16),
        "model.layers.0.self_attn.q_proj.bias": rng.standard_normal(8).astype(np.float32),
        "model.norm.weight": rng.standard_normal(8).astype(np.float64),
        "lm_head.weight": rng.standard_normal((6, 8)).astype(ml_dtypes.bfloat16),
    }


def write_folder(
    folder: Path, tensors: dict[str, np.ndarray], *, shards: int = 1, generation_config: dict | None = None
) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(CONFIG))
    if generation_config is not None:
        (folder / "generation_config.json").write_text(json.dumps(generation_config))
    if shards == 1:
        save_file(tensors, str(folder / "model.safetensors"))
        return folder
    names = list(tensors)
    weight_map = {}
    for i in range(shards):
        shard = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: tensors[n] for n in names[i::shards]}
        save_file(part, str(folder / shard))
        weight_map.update(dict.fromkeys(part, shard))
    (folder / INDEX_FILE).write_text(json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map}))
    return folder


def assert_loads_as_float32(checkpoint, tensors: dict[str, np.ndarray]) -> None:
    assert set(checkpoint.tensor_names) == set(tensors)
    for name, expected in tensors.items():
        loaded = checkpoint.load(name)
        assert loaded.dtype == np.float32 and loaded.shape == expected.shape
        np.testing.assert_array_equal(loaded, expected.astype(np.float32))  # bf16/f16 widen exactly


def test_single_file_checkpoint(tmp_path: Path) -> None:
    tensors = make_tensors()
    checkpoint = open_hf_checkpoint(write_folder(tmp_path / "m", tensors))
    assert checkpoint.config == CONFIG and checkpoint.generation_config == {}
    assert checkpoint.path == tmp_path / "m"
    assert_loads_as_float32(checkpoint, tensors)
    assert checkpoint.entry("model.embed_tokens.weight").dtype == "BF16"


def test_loads_agree_with_the_safetensors_package(tmp_path: Path) -> None:
    folder = write_folder(tmp_path / "m", make_tensors(1))
    reference = load_file(str(folder / "model.safetensors"))
    checkpoint = open_hf_checkpoint(folder)
    for name, value in reference.items():
        np.testing.assert_array_equal(checkpoint.load(name), value.astype(np.float32))


@pytest.mark.parametrize("shards", [2, 3])
def test_sharded_checkpoint_follows_the_index(tmp_path: Path, shards: int) -> None:
    tensors = make_tensors(2)
    folder = write_folder(tmp_path / "m", tensors, shards=shards, generation_config={"eos_token_id": [1, 2]})
    checkpoint = open_hf_checkpoint(folder)
    assert checkpoint.generation_config == {"eos_token_id": [1, 2]}
    index = json.loads((folder / INDEX_FILE).read_text())
    assert checkpoint.tensor_names == tuple(index["weight_map"])
    assert_loads_as_float32(checkpoint, tensors)


def test_loaded_arrays_are_independent_of_the_file(tmp_path: Path) -> None:
    tensors = {"w": np.arange(6, dtype=np.float32).reshape(2, 3)}
    checkpoint = open_hf_checkpoint(write_folder(tmp_path / "m", tensors))
    loaded = checkpoint.load("w")
    loaded[0, 0] = 99.0  # writable, and the next load still sees the file's value
    assert checkpoint.load("w")[0, 0] == 0.0
    checkpoint.close()
    np.testing.assert_array_equal(checkpoint.load("w"), tensors["w"])  # maps again after close


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    shapes=st.lists(st.lists(st.integers(0, 5), min_size=0, max_size=3), min_size=1, max_size=5),
    dtypes=st.lists(st.sampled_from([np.float32, np.float16, ml_dtypes.bfloat16, np.float64]), min_size=5, max_size=5),
    seed=st.integers(0, 2**32 - 1),
)
def test_random_tensors_round_trip(tmp_path_factory: pytest.TempPathFactory, shapes, dtypes, seed: int) -> None:
    rng = np.random.default_rng(seed)
    tensors = {f"t{i}": rng.standard_normal(shape).astype(dtypes[i]).reshape(shape) for i, shape in enumerate(shapes)}
    folder = write_folder(tmp_path_factory.mktemp("rt"), tensors)
    assert_loads_as_float32(open_hf_checkpoint(folder), tensors)


def test_non_float_tensor_and_unknown_name_are_errors(tmp_path: Path) -> None:
    folder = write_folder(tmp_path / "m", {"ids": np.arange(4, dtype=np.int64), "w": np.ones(2, np.float32)})
    checkpoint = open_hf_checkpoint(folder)
    with pytest.raises(
        CheckpointError, match=r"model\.safetensors: tensor 'ids' has dtype I64, which does not load as float32"
    ):
        checkpoint.load("ids")
    with pytest.raises(CheckpointError, match=r"no tensor named 'nope'"):
        checkpoint.load("nope")


# -- broken folders -------------------------------------------------------------------


def expect_error(folder: Path, file_name: str, problem: str) -> None:
    with pytest.raises(CheckpointError) as excinfo:
        open_hf_checkpoint(folder)
    assert excinfo.value.path == str(folder / file_name if file_name else folder)
    assert problem in excinfo.value.problem, excinfo.value.problem


def test_missing_config_is_named(tmp_path: Path) -> None:
    folder = write_folder(tmp_path / "m", make_tensors())
    (folder / "config.json").unlink()
    expect_error(folder, "config.json", "missing")


def test_invalid_config_is_named(tmp_path: Path) -> None:
    folder = write_folder(tmp_path / "m", make_tensors())
    (folder / "config.json").write_text("{'hidden_size': 8")
    expect_error(folder, "config.json", "not valid JSON")
    (folder / "config.json").write_text("[1, 2]")
    expect_error(folder, "config.json", "must hold a JSON object")


def test_invalid_generation_config_is_named(tmp_path: Path) -> None:
    folder = write_folder(tmp_path / "m", make_tensors(), generation_config={})
    (folder / "generation_config.json").write_text("{")
    expect_error(folder, "generation_config.json", "not valid JSON")


def test_folder_without_weights(tmp_path: Path) -> None:
    folder = write_folder(tmp_path / "m", make_tensors())
    (folder / "model.safetensors").unlink()
    expect_error(folder, "", "has neither model.safetensors nor model.safetensors.index.json")


def test_path_that_is_not_a_folder(tmp_path: Path) -> None:
    expect_error(tmp_path / "absent", "", "not a directory")


def test_index_naming_a_missing_shard(tmp_path: Path) -> None:
    folder = write_folder(tmp_path / "m", make_tensors(), shards=2)
    (folder / "model-00002-of-00002.safetensors").unlink()
    expect_error(folder, INDEX_FILE, "names shard 'model-00002-of-00002.safetensors', which is missing")


def test_index_pointing_outside_the_folder(tmp_path: Path) -> None:
    folder = write_folder(tmp_path / "m", make_tensors(), shards=2)
    index = json.loads((folder / INDEX_FILE).read_text())
    first = next(iter(index["weight_map"]))
    index["weight_map"][first] = "../elsewhere.safetensors"
    (folder / INDEX_FILE).write_text(json.dumps(index))
    expect_error(folder, INDEX_FILE, "which is not a file name in the folder")


def test_index_without_weight_map(tmp_path: Path) -> None:
    folder = write_folder(tmp_path / "m", make_tensors(), shards=2)
    (folder / INDEX_FILE).write_text(json.dumps({"metadata": {}}))
    expect_error(folder, INDEX_FILE, "has no weight_map")
    (folder / INDEX_FILE).write_text("not json")
    expect_error(folder, INDEX_FILE, "not valid JSON")


def test_index_placing_a_tensor_in_the_wrong_shard(tmp_path: Path) -> None:
    folder = write_folder(tmp_path / "m", make_tensors(), shards=2)
    index = json.loads((folder / INDEX_FILE).read_text())
    assert index["weight_map"]["lm_head.weight"] == "model-00001-of-00002.safetensors"
    index["weight_map"]["lm_head.weight"] = "model-00002-of-00002.safetensors"
    (folder / INDEX_FILE).write_text(json.dumps(index))
    expect_error(folder, "model-00002-of-00002.safetensors", "has no tensor 'lm_head.weight'")


def test_corrupt_shard_is_named(tmp_path: Path) -> None:
    folder = write_folder(tmp_path / "m", make_tensors(), shards=2)
    shard = folder / "model-00001-of-00002.safetensors"
    shard.write_bytes(shard.read_bytes()[:20])
    expect_error(folder, shard.name, "header length")
