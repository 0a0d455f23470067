"""Config problems in a checkpoint fail with one message naming the file and the missing key."""

import json
import shutil

import pytest
from fixture_data import tiny_fixture

from ember.runtime.loading.formats.errors import CheckpointError
from ember.runtime.loading.model import load_model


def _copy(tmp_path, arch="qwen3"):
    src, _ = tiny_fixture(arch)
    dst = tmp_path / arch
    shutil.copytree(src, dst)
    return dst


def _edit_config(folder, edit):
    config = json.loads((folder / "config.json").read_text())
    edit(config)
    (folder / "config.json").write_text(json.dumps(config))


def test_missing_required_key(tmp_path):
    folder = _copy(tmp_path)
    _edit_config(folder, lambda c: c.pop("hidden_size"))
    with pytest.raises(CheckpointError) as err:
        load_model(folder)
    assert str(folder) in str(err.value) and "hidden_size" in str(err.value)


def test_unsupported_architecture(tmp_path):
    folder = _copy(tmp_path)
    _edit_config(folder, lambda c: c.update(architectures=["MambaForCausalLM"]))
    with pytest.raises(CheckpointError, match="'MambaForCausalLM' has no spec"):
        load_model(folder)


def test_tensor_with_wrong_shape(tmp_path):
    folder = _copy(tmp_path)
    _edit_config(folder, lambda c: c.update(intermediate_size=c["intermediate_size"] * 2))
    with pytest.raises(
        CheckpointError, match=r"tensor 'model.layers.0.mlp.\w+_proj.weight' has shape \[.*\], expected"
    ):
        load_model(folder)


def test_optional_default_comes_from_spec(tmp_path):
    """head_dim absent: the spec's default `d // hq` applies (qwen2 fixture has hidden/heads head_dim)."""
    folder = _copy(tmp_path, "qwen2")
    _edit_config(folder, lambda c: c.pop("head_dim", None))
    model = load_model(folder)
    assert model.dims.dh == model.dims.d // model.dims.hq
