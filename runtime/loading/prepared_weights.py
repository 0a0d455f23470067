"""The prepared-weights cache: a model's loaded parameters written once to Ember's cache folder and mapped back
on later starts, so a restart skips dequantizing and repacking the checkpoint.

On the cpu backend a loaded parameter is host memory in its final form (fp32 dequantized weights, or int8 codes
and block scales: whatever the kernel policy keeps). One entry is one file, `<cache>/prepared-weights/<name>-<key>
.weights`, holding every leaf of the Params pytree back to back and the tree's shape; reading it maps the file and
hands each leaf to JAX without a copy (`device_put(may_alias=True)` on a 64-byte aligned view), so the load costs
page faults at the first steps instead of seconds of decoding.

The key is everything that shapes the arrays: the checkpoint's identity (path, size, mtime and a hash of its
first MiB), the spec file and the plan's manifest, the kernel policy's weight fields, the activation dtype, the
source of the loading and kernel-layout modules, and the JAX version. A changed checkpoint gets a new key, so an
old entry is never served. A file is written to a temporary name and renamed, so a reader sees a whole entry or
none; one that fails its checks (size, end marker, header, per-leaf checksum samples) is ignored, and the next
load writes it again. Entries are bounded in total bytes (least recently used go first), and a cache folder that
cannot be written only costs a line.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import io
import json
import mmap
import os
import pickle
import shutil
import struct
import sys
import threading
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

MAGIC, END = b"EMBPW001", b"EMBPWEND"
ALIGN = 4096  # each leaf starts on a page: aligned for JAX's zero-copy view, and mapped page by page
SAMPLE = 4096  # bytes at each end of a leaf that its checksum covers (a full checksum would read every byte)
DEFAULT_LIMIT_GIB = 24.0  # total size of the entries kept; EMBER_PREPARED_WEIGHTS_GIB overrides (0: off)
_ROOT = Path(__file__).resolve().parents[2]  # the package root (runtime/loading/ is two levels down)
# the sources whose code decides what the arrays hold: a change to any of them makes every entry stale
_SOURCE_GLOBS = (
    "runtime/loading/*.py",
    "runtime/loading/formats/*.py",
    "compiler/kernels/**/*.py",
    "compiler/weight_transforms.py",
)


class _Leaf:
    """Stands for the index-th array in a stored tree's skeleton."""

    def __init__(self, index: int):
        self.index = index


def limit_bytes() -> int:
    """The bound on the entries' total size, in bytes (0: the cache is off)."""
    configured = os.environ.get("EMBER_PREPARED_WEIGHTS_GIB")
    try:
        gib = float(configured) if configured else DEFAULT_LIMIT_GIB
    except ValueError:
        gib = DEFAULT_LIMIT_GIB
    return max(0, int(gib * 2**30))


def _file_identity(path: Path) -> list:
    stat = path.stat()
    with path.open("rb") as handle:
        head = hashlib.sha256(handle.read(1 << 20)).hexdigest()
    return [str(path.resolve()), stat.st_size, stat.st_mtime_ns, head]


def checkpoint_identity(path: Path) -> list:
    """What says a checkpoint is the same file(s) as before: path, size, mtime and the first MiB's hash of the
    file, or of every file in the folder."""
    path = Path(path)
    if path.is_dir():
        return [_file_identity(p) for p in sorted(path.rglob("*")) if p.is_file()]
    return _file_identity(path)


_source_digest: str | None = None


def source_digest() -> str:
    global _source_digest
    if _source_digest is None:
        digest = hashlib.sha256()
        for pattern in _SOURCE_GLOBS:
            for path in sorted(_ROOT.glob(pattern)):
                digest.update(str(path.relative_to(_ROOT)).encode() + b"\0" + path.read_bytes())
        _source_digest = digest.hexdigest()
    return _source_digest


def entry_key(ckpt_path: Path, spec_path: Path, manifest: dict, weights_policy, dtype, target: str) -> str:
    """The hash naming one entry: every input that shapes the loaded arrays (module docstring)."""
    fields = {
        "format": MAGIC.decode(),
        "checkpoint": checkpoint_identity(ckpt_path),
        "spec": hashlib.sha256(Path(spec_path).read_bytes()).hexdigest(),
        "manifest": hashlib.sha256(json.dumps(manifest, sort_keys=True, default=str).encode()).hexdigest(),
        "weights": dataclasses.asdict(weights_policy),
        "dtype": jnp.dtype(dtype).name,
        "target": target,
        "code": source_digest(),
        "jax": jax.__version__,
    }
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:24]


def _note(message: str) -> None:
    print(f"ember: {message}", file=sys.stderr, flush=True)


def _checksum(data: np.ndarray) -> int:
    """crc32 of a leaf's first and last SAMPLE bytes (uint8, 1-D)."""
    return zlib.crc32(data[-SAMPLE:].tobytes(), zlib.crc32(data[:SAMPLE].tobytes()))


def _host_bytes(leaf) -> np.ndarray:
    """A leaf's bytes (uint8, 1-D; a view of a cpu array where it can be)."""
    return np.ascontiguousarray(np.asarray(leaf)).reshape(-1).view(np.uint8)


class _SkeletonUnpickler(pickle.Unpickler):
    """Rebuilds only Ember's own containers (Params, the weight layouts, _Leaf): a cache file is never a way to
    run anything else."""

    def find_class(self, module: str, name: str):
        if module.split(".")[0] == "ember":
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not one of Ember's classes")


@dataclass
class PreparedWeights:
    """One entry of the cache: its file, and the bound on all entries' bytes (`limit`, 0: the cache is off)."""

    path: Path
    limit: int

    @classmethod
    def for_model(cls, root: Path, name: str, key: str, limit: int | None = None) -> PreparedWeights:
        stem = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:80]
        return cls(Path(root) / f"{stem}-{key}.weights", limit_bytes() if limit is None else limit)

    # ---- reading ----------------------------------------------------------------------------------

    def read(self) -> Any | None:
        """The stored tree with its leaves as device arrays over the mapped file; None when there is no entry,
        or it fails a check (then it is removed, and the caller loads and writes it again)."""
        if self.limit == 0 or not self.path.is_file():
            return None
        try:
            tree = self._read()
        except Exception as error:  # a damaged entry is a cache miss, never a failed load
            _note(f"prepared weights {self.path} unreadable ({type(error).__name__}: {error}); loading afresh")
            self.path.unlink(missing_ok=True)
            return None
        os.utime(self.path)  # its place in the least-recently-used order
        return tree

    def _read(self) -> Any:
        with self.path.open("rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            magic, header_len = struct.unpack("<8sQ", handle.read(16))
            if magic != MAGIC or header_len > size:
                raise ValueError("not a prepared-weights file")
            header = json.loads(handle.read(header_len))
            if header["total"] != size:
                raise ValueError(f"{size} bytes, the header says {header['total']}: incomplete")
            mapped = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_COPY)  # private: nothing writes the file
        if mapped[size - len(END) :] != END:
            raise ValueError("no end marker: incomplete")
        leaves = []
        for entry in header["leaves"]:
            dtype, shape, offset, nbytes = jnp.dtype(entry["dtype"]), tuple(entry["shape"]), entry["at"], entry["n"]
            if offset + nbytes > size - len(END):
                raise ValueError("a leaf runs past the data")
            data = np.frombuffer(mapped, np.uint8, nbytes, offset)
            if _checksum(data) != entry["crc"]:
                raise ValueError(f"leaf at byte {offset} fails its checksum")
            leaves.append(jax.device_put(data.view(dtype).reshape(shape), may_alias=True))
        skeleton = _SkeletonUnpickler(io.BytesIO(base64.b64decode(header["skeleton"]))).load()
        return jax.tree_util.tree_map(lambda leaf: leaves[leaf.index], skeleton)

    # ---- writing ----------------------------------------------------------------------------------

    def write(self, tree: Any) -> bool:
        """Store `tree` (a pytree of arrays); True when the entry was written. Never raises: a folder that
        cannot be written, a full disk or a tree with other leaves only costs a line."""
        if self.limit == 0:
            return False
        started = time.perf_counter()
        try:
            written = self._write(tree)
        except Exception as error:
            _note(f"prepared weights not written to {self.path.parent} ({type(error).__name__}: {error})")
            return False
        if written:
            size = self.path.stat().st_size
            seconds = time.perf_counter() - started
            _note(f"prepared weights written: {self.path} ({size / 1e9:.2f} GB in {seconds:.1f} s)")
        return written

    def _write(self, tree: Any) -> bool:
        arrays: list = []
        index_of: dict[int, int] = {}  # id of an array -> its leaf: a weight shared by two names is stored once

        def to_leaf(value):
            if not isinstance(value, (jax.Array, np.ndarray)):
                raise TypeError(f"a {type(value).__name__} leaf")
            if id(value) not in index_of:
                index_of[id(value)] = len(arrays)
                arrays.append(value)
            return _Leaf(index_of[id(value)])

        skeleton = jax.tree_util.tree_map(to_leaf, tree)
        leaves, offset = [], 0
        for array in arrays:
            nbytes = int(array.size) * array.dtype.itemsize
            leaves.append({"dtype": array.dtype.name, "shape": list(array.shape), "at": offset, "n": nbytes})
            offset += -(-nbytes // ALIGN) * ALIGN
        data_bytes = offset
        if data_bytes + ALIGN > self.limit:
            _note(f"prepared weights not written: {data_bytes / 1e9:.2f} GB is over the cache's bound")
            return False
        skeleton_text = base64.b64encode(pickle.dumps(skeleton, protocol=5)).decode()
        # room for the header before the data: its JSON now, plus what the offsets and checksums filled in later
        # can add (at most 40 digits a leaf)
        start = -(-(16 + len(json.dumps(leaves)) + len(skeleton_text) + 40 * len(leaves) + 256) // ALIGN) * ALIGN
        total = start + data_bytes + len(END)
        root = self.path.parent
        root.mkdir(parents=True, exist_ok=True)
        self._make_room(root, total)
        if shutil.disk_usage(root).free < total + (1 << 30):
            _note(f"prepared weights not written: {total / 1e9:.2f} GB would leave under 1 GiB free in {root}")
            return False
        for leaf, array in zip(leaves, arrays):
            leaf["at"] += start
            leaf["crc"] = _checksum(_host_bytes(array))
        encoded = json.dumps({"leaves": leaves, "skeleton": skeleton_text, "total": total}).encode()
        if 16 + len(encoded) > start:
            raise ValueError("the header outgrew its room")
        _note(f"writing prepared weights ({total / 1e9:.2f} GB) to {self.path}")
        temp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            with temp.open("wb") as out:
                out.write(struct.pack("<8sQ", MAGIC, len(encoded)) + encoded)
                for leaf, array in zip(leaves, arrays):
                    out.seek(leaf["at"])
                    out.write(_host_bytes(array))
                out.seek(total - len(END))
                out.write(END)
            os.replace(temp, self.path)
        finally:
            temp.unlink(missing_ok=True)
        return True

    def _make_room(self, root: Path, incoming: int) -> None:
        """Remove least recently used entries until `incoming` more bytes fit the bound, and temporary files
        that writers which are gone left behind."""
        for temp in root.glob(".*.weights.*.tmp"):
            pid = temp.name.rsplit(".", 2)[-2]
            if pid.isdigit() and not _alive(int(pid)):
                temp.unlink(missing_ok=True)
        entries = sorted(
            (p for p in root.glob("*.weights") if p != self.path), key=lambda p: p.stat().st_mtime, reverse=True
        )
        kept = incoming
        for entry in entries:
            kept += entry.stat().st_size
            if kept > self.limit:
                entry.unlink(missing_ok=True)
                _note(f"prepared weights evicted: {entry.name}")

    def write_in_background(self, tree: Any) -> threading.Thread:
        """write(tree) on a thread (the server turns ready meanwhile); wait_for_writes() joins it."""
        thread = threading.Thread(target=self.write, args=(tree,), name="prepared-weights-writer", daemon=True)
        with _lock:
            _writers.append(thread)
        thread.start()
        return thread


_lock = threading.Lock()
_writers: list[threading.Thread] = []


def wait_for_writes(timeout: float | None = None) -> None:
    """Join the writes started in the background (a test, or a tool that stops right after loading)."""
    with _lock:
        pending = list(_writers)
        _writers.clear()
    for thread in pending:
        thread.join(timeout)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
