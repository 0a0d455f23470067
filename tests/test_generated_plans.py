"""Generated plans are reproducible and the compiler knows ops, never models."""

import re
from pathlib import Path

import pytest

from ember.compiler.build import GENERATED_DIR, compile_spec
from ember.compiler.spec import SPECS_DIR, known_archs
from ember.compiler.targets import known_targets

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("target", known_targets())
@pytest.mark.parametrize("arch", known_archs())
def test_regenerating_gives_identical_bytes(tmp_path, arch, target):
    written = compile_spec(SPECS_DIR / f"{arch}.toml", target, out_root=tmp_path)
    for path in written:
        committed = GENERATED_DIR / target / arch / path.name
        assert committed.exists(), f"{committed} is not committed: run `ember compile`"
        assert path.read_bytes() == committed.read_bytes(), f"{committed} is stale: run `ember compile`"


@pytest.mark.parametrize("target", known_targets())
def test_every_spec_has_a_committed_plan(target):
    assert sorted(p.name for p in (GENERATED_DIR / target).iterdir() if p.is_dir()) == known_archs()


def test_compiler_and_runtime_name_no_architecture():
    names = {a for a in known_archs()} | {"qwen", "llama", "gemma", "mistral"}
    pattern = re.compile(r"\b(" + "|".join(sorted(names)) + r")\b", re.IGNORECASE)
    offenders = []
    for folder in (
        "compiler",
        "runtime/loading/model.py",
        "runtime/loading/weights.py",
        "runtime/loading/dims.py",
        "runtime/execution/sequence_runner.py",
        "runtime/loading/plans.py",
    ):
        for path in [ROOT / folder] if folder.endswith(".py") else (ROOT / folder).rglob("*"):
            if path.suffix in (".py", ".j2"):
                for number, line in enumerate(path.read_text().splitlines(), 1):
                    if pattern.search(line):
                        offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not offenders, "\n".join(offenders)


def test_ir_dump_writes_every_phase(tmp_path):
    compile_spec(SPECS_DIR / "qwen2.toml", "cpu", out_root=tmp_path / "out", dump_dir=tmp_path / "ir")
    dumps = sorted(p.name for p in (tmp_path / "ir").iterdir())
    assert dumps[0] == "00-lower.ir" and any("pack_parallel_linears" in d for d in dumps)
    assert dumps[-1].endswith("select_kernels.ir")
    packed = (tmp_path / "ir" / next(d for d in dumps if "pack_parallel" in d)).read_text()
    assert "linear_split" in packed and "attn_q+attn_k+attn_v.bias" in packed
    fused = (tmp_path / "ir" / next(d for d in dumps if "fuse_add_rms_norm" in d)).read_text()
    assert "add_rms_norm" in fused
