"""A malformed spec fails with an error naming the file, the field and what was expected."""

from pathlib import Path

import pytest

from ember.compiler.spec import SPECS_DIR, SpecError, load_spec

BASE = (SPECS_DIR / "qwen3.toml").read_text()


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "broken.toml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    "mutate, field, expected",
    [
        (
            lambda t: t.replace("rms_norm(x, 'attn_norm', eps)", "rms_nrom(x, 'attn_norm', eps)"),
            "layer.ops[0]",
            "unknown op 'rms_nrom'",
        ),
        (lambda t: t.replace('arch = "qwen3"', "arch = 3"), "arch", "non-empty string"),
        (lambda t: "bogus = 1\n" + t, "bogus", "unknown top-level field"),
        (lambda t: t + "\nbogus = 1\n", "layer.bogus", "unknown field"),
        (lambda t: t.replace("[dims]", "[dimz]"), "dimz", "unknown top-level field"),
        (lambda t: t.replace('shape = "hq * dh, d"', 'shape = "hq * dhh, d"'), "shape", "unknown dimensions ['dhh']"),
        (
            lambda t: t.replace("a = attention(q, k, v, scale=attn_scale)", "a = attention(q, k, v, scale=attn_scale"),
            "layer.ops[6]",
            "not a statement",
        ),
        (
            lambda t: t.replace("a = attention(q, k, v, scale=attn_scale)", "a = __import__('os')"),
            "layer.ops[6]",
            "unknown op '__import__'",
        ),
        (
            lambda t: t.replace('d = { hf = "hidden_size", gguf = "embedding_length" }', 'd = "hidden_size"'),
            "dims.d",
            "expected a table",
        ),
        (lambda t: t.replace("hf_transform", "hf_transform") + "", None, None),
    ],
)
def test_malformed_spec_names_file_field_and_expectation(tmp_path, mutate, field, expected):
    text = mutate(BASE)
    if field is None:  # control: the unmodified spec loads
        assert load_spec(_write(tmp_path, text)).arch == "qwen3"
        return
    with pytest.raises(SpecError) as err:
        load_spec(_write(tmp_path, text))
    message = str(err.value)
    assert str(tmp_path / "broken.toml") in message
    assert field in message
    assert expected in message


def test_invalid_toml(tmp_path):
    with pytest.raises(SpecError, match="expected valid TOML"):
        load_spec(_write(tmp_path, "arch = \n"))


def test_unknown_weight_in_ops_is_reported(tmp_path):
    from ember.compiler.frontend import lower

    text = BASE.replace("linear(a, 'attn_output')", "linear(a, 'attn_out')")
    with pytest.raises(SpecError, match=r"layer.ops\[7\]: weight 'attn_out.weight' is not declared"):
        lower(load_spec(_write(tmp_path, text)))


def test_value_used_before_assignment(tmp_path):
    from ember.compiler.frontend import lower

    text = BASE.replace("h = rms_norm(x, 'attn_norm', eps)", "h = rms_norm(y, 'attn_norm', eps)")
    with pytest.raises(SpecError, match=r"layer.ops\[0\]: value 'y' is used before it is assigned"):
        lower(load_spec(_write(tmp_path, text)))


def test_unknown_transform(tmp_path):
    text = (SPECS_DIR / "gemma3.toml").read_text().replace('hf_transform = "add_one"', 'hf_transform = "add_two"', 1)
    with pytest.raises(SpecError, match="unknown transform 'add_two'"):
        load_spec(_write(tmp_path, text))
