"""Build block_q8.cc once per machine (g++, this CPU's instruction set) and register it as an XLA FFI target.

The shared library is cached under the Ember cache (`<cache>/cpu-kernels/<hash>.so`, the hash over the source,
the flags, the jaxlib version and the host CPU: -march=native builds for this CPU only, targets/host_cpu.py), so
a restart loads it in milliseconds; the build (~15 s) happens on the first load of a model that needs it.
Without a C++ compiler (or on a CPU without AVX2 + FMA, where the build stops at the source's #error)
`available()` is False and the cpu target's ops run their jnp form instead (reference.py: the same arithmetic,
several times slower).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import jax
import jaxlib

from ...targets import host_cpu

SOURCE = Path(__file__).with_name("block_q8.cc")
HEADERS = (Path(__file__).with_name("block_q8_vnni.h"),)  # included by SOURCE: part of the cache key
TARGET = "ember_block_q8_matmul"  # int8 codes
NIBBLE_TARGET = "ember_block_q4_matmul"  # codes two per byte
FLAGS = ("-O3", "-march=native", "-std=c++17", "-shared", "-fPIC", "-pthread")


def _cache_dir() -> Path:
    root = os.environ.get("EMBER_CACHE_DIR")
    return Path(root) if root else Path.home() / ".cache" / "ember"


def _compiler() -> str | None:
    return os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")


def library_path() -> Path:
    parts = [
        SOURCE.read_bytes(),
        *(header.read_bytes() for header in HEADERS),
        " ".join(FLAGS).encode(),
        jaxlib.__version__.encode(),
        host_cpu.fingerprint().encode(),
    ]
    key = hashlib.sha256(b"\0".join(parts)).hexdigest()
    return _cache_dir() / "cpu-kernels" / f"block_q8-{key[:16]}.so"


def build() -> Path:
    """The library, compiled unless cached (written to a temporary name, then renamed: concurrent builds are safe)."""
    path = library_path()
    if path.exists():
        return path
    compiler = _compiler()
    if compiler is None:
        raise RuntimeError("no C++ compiler (g++ / clang++) to build the cpu target's kernel")
    path.parent.mkdir(parents=True, exist_ok=True)
    print(f"ember: building the cpu matmul kernel ({path.name}, once per machine)", file=sys.stderr, flush=True)
    with tempfile.NamedTemporaryFile(dir=path.parent, suffix=".so", delete=False) as tmp:
        partial = Path(tmp.name)
    try:
        command = [compiler, *FLAGS, "-w", "-isystem", jax.ffi.include_dir(), str(SOURCE), "-o", str(partial)]
        subprocess.run(command, check=True, capture_output=True, text=True)
        partial.replace(path)
    except subprocess.CalledProcessError as error:
        partial.unlink(missing_ok=True)
        raise RuntimeError(f"building {SOURCE.name} failed:\n{error.stderr[-2000:]}") from None
    return path


@functools.cache
def available() -> bool:
    """True once the kernel is built and registered with XLA (for the CPU platform); False if it cannot be."""
    try:
        library = ctypes.cdll.LoadLibrary(str(build()))
    except (RuntimeError, OSError) as error:
        print(f"ember: the cpu matmul kernel is unavailable ({error}); using its jnp form", file=sys.stderr)
        return False
    jax.ffi.register_ffi_target(TARGET, jax.ffi.pycapsule(library.EmberBlockQ8Matmul), platform="cpu")
    jax.ffi.register_ffi_target(NIBBLE_TARGET, jax.ffi.pycapsule(library.EmberBlockQ4Matmul), platform="cpu")
    return True
