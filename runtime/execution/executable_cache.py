"""Step executables kept on disk by Ember itself, so that a warm start neither traces nor lowers a plan.

JAX's persistent compilation cache (model.enable_compilation_cache) is keyed by the lowered program, so even
when it answers, every step shape is first traced and lowered in Python: on the H200 machine ~1 s per shape
for the 8B plan (Triton kernels are compiled or read from Triton's cache at lowering), which was 36 s of
`ember serve`'s 59-65 s warm start; 39 s with the executables kept here
(docs/results/h200_serve_startup_7c27db8.json).

CachedStep wraps a step function jitted with static arguments and keeps, per call signature, the compiled
executable: in memory, and serialized under the JAX cache directory (`ember-executables/`, at most
MAX_BYTES, least recently used out first) when that cache is on, for engines with
EngineConfig.keep_executables (`ember serve`). A file's name is a digest of everything that decides what
tracing would produce, without tracing:
  - the source of Ember's compiler, runtime, specs and generated plans, the plan module being run, and the
    versions of jax, jaxlib and triton (source_fingerprint);
  - the model's kernel policy (compiler/targets/policy.py: which kernels and configs the step launches) and
    every XLA_* / JAX_* environment variable;
  - the device kind, the abstract values of the arguments fixed for the executor (weights, KV pools), and
    per call the static arguments and the shapes and dtypes of the other arguments.
An unreadable or incompatible file is compiled again and rewritten. Without a JAX cache directory, on the CPU
backend (KEEP_PLATFORMS), or in an engine that does not keep executables, the jitted function is called as
it is. What the key cannot see is a module patched at run time (tests do that): such engines leave
keep_executables off.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import sys
import threading
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import Any

import jax

from ...compiler.targets.policy import KernelPolicy

PACKAGE_PARTS = ("compiler", "runtime", "specs", "generated")  # what a step executable is built from
# where executables are kept: XLA:CPU's serialized executables of a real model lose functions (read back,
# the 1.5B's failed with "NOT_FOUND: Function cosine_bitcast_fusion.27 not found"), so the cpu backend traces
KEEP_PLATFORMS = ("gpu", "cuda", "rocm")
# ...except that an executable XLA:CPU compiled itself serializes and reads back whole (it is the one read back
# from JAX's persistent cache that loses functions when serialized again): on these backends the executors'
# CompiledSteps keep the executables they compile themselves (step_store, compile_fresh), and a warm start reads
# them back without tracing
AHEAD_PLATFORMS = ("cpu",)
ENV_PREFIXES = ("XLA_", "JAX_")
DIRECTORY = "ember-executables"
MAX_BYTES = 8 << 30  # the directory's bound: the least recently used files go first (an 8B model's: ~83 MB)


@lru_cache(maxsize=1)
def source_fingerprint() -> str:
    """sha256 over the package sources that shape a step executable, the library versions and the
    XLA / JAX environment settings."""
    root = Path(__file__).resolve().parents[2]  # the repository root: compiler/, runtime/, ...
    digest = hashlib.sha256()
    for part in PACKAGE_PARTS:
        for path in sorted((root / part).rglob("*")):
            if path.suffix in (".py", ".toml", ".json") and "__pycache__" not in path.parts:
                digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    versions = [jax.__version__, getattr(sys.modules.get("jaxlib"), "__version__", "")]
    try:
        import triton

        versions.append(triton.__version__)
    except ImportError:
        versions.append("no triton")
    digest.update(repr(versions).encode())
    digest.update(repr(sorted((k, v) for k, v in os.environ.items() if k.startswith(ENV_PREFIXES))).encode())
    return digest.hexdigest()


def abstract_digest(*trees: Any) -> str:
    """sha256 of the trees' structure and their leaves' shapes and dtypes."""
    digest = hashlib.sha256()
    for tree in trees:
        leaves, treedef = jax.tree_util.tree_flatten(tree)
        digest.update(str(treedef).encode())
        digest.update(repr([(tuple(leaf.shape), str(leaf.dtype)) for leaf in leaves]).encode())
    return digest.hexdigest()


def cache_directory() -> Path | None:
    """Where executables go: beside JAX's persistent cache, when it is on."""
    base = jax.config.jax_compilation_cache_dir
    return None if base is None else Path(base) / DIRECTORY


class CachedStep:
    """fn (jitted, static arguments first) called as before, through executables compiled once per call
    signature and kept on disk (see the module docstring). `fixed` dynamic arguments after the static ones
    (the weights and KV pools) must keep their abstract values for this object's life: `identity` digests
    them with whatever else the executables depend on (the plan module's source)."""

    def __init__(self, fn: Callable, num_static: int, identity: str, directory: Path):
        self.fn, self.num_static, self.identity = fn, num_static, identity
        self.directory = directory
        self.executables: dict[tuple, Any] = {}
        self.loaded_from_disk = 0  # executables read back instead of traced (tests, logs)

    def __call__(self, *args):
        static, dynamic = args[: self.num_static], args[self.num_static :]
        key = (static, tuple((tuple(a.shape), str(a.dtype)) for a in dynamic if hasattr(a, "shape")))
        executable = self.executables.get(key)
        if executable is None:
            executable = self.executables[key] = self._load_or_compile(key, args)
        return executable(*dynamic)

    def __getattr__(self, name: str):  # lower, trace, ...: the jitted function's
        return getattr(self.fn, name)

    def _path(self, key: tuple) -> Path:
        return ExecutableStore(self.identity, self.directory).path(key)

    def _load_or_compile(self, key: tuple, args: tuple):
        store = ExecutableStore(self.identity, self.directory)
        executable = store.load(key)
        if executable is not None:
            self.loaded_from_disk += 1
            return executable
        executable = self.fn.lower(*args).compile()
        store.save(key, executable)
        return executable


class ExecutableStore:
    """The executables of one step function (`identity`: executor_identity's and a tag) in `directory`, one
    file per call key."""

    def __init__(self, identity: str, directory: Path):
        self.identity, self.directory = identity, directory

    def path(self, key: tuple) -> Path:
        name = hashlib.sha256(f"{source_fingerprint()}|{self.identity}|{key!r}".encode()).hexdigest()
        return self.directory / f"{name}.exe"

    def load(self, key: tuple):
        """The executable kept for `key`, or None (none kept, or one that cannot be read: it is compiled again)."""
        from jax.experimental.serialize_executable import deserialize_and_load

        path = self.path(key)
        if not path.exists():
            return None
        try:
            payload, in_tree, out_tree = pickle.loads(path.read_bytes())
            executable = deserialize_and_load(payload, in_tree, out_tree)
            os.utime(path)  # recently used: evicted last
            return executable
        except Exception as error:  # a truncated or foreign file: compiled again
            print(f"ember: recompiling a step executable ({type(error).__name__}: {error})", file=sys.stderr)
            return None

    def save(self, key: tuple, executable) -> None:
        from jax.experimental.serialize_executable import serialize

        try:
            blob = pickle.dumps(serialize(executable))
            path = self.path(key)
            path.parent.mkdir(parents=True, exist_ok=True)
            partial = path.with_suffix(f".{os.getpid()}.partial")
            partial.write_bytes(blob)
            partial.replace(path)
            evict(self.directory, MAX_BYTES)
        except Exception as error:  # the backend cannot serialize it, or the disk is full: memory only
            print(f"ember: step executable not saved ({type(error).__name__}: {error})", file=sys.stderr)


def evict(directory: Path, max_bytes: int) -> None:
    """Delete the least recently used executables until the directory holds at most max_bytes (files another
    process removes meanwhile are skipped)."""
    files = []
    for path in directory.glob("*.exe"):
        try:
            stat = path.stat()
        except FileNotFoundError:
            continue
        files.append((stat.st_mtime, stat.st_size, path))
    total = sum(size for _, size, _ in files)
    for _, size, path in sorted(files):
        if total <= max_bytes:
            break
        path.unlink(missing_ok=True)
        total -= size


def executor_identity(
    plan_module: Any, policy: KernelPolicy, fixed: tuple, platforms: tuple[str, ...] | None = None
) -> str | None:
    """What an executor's executables depend on besides the sources and the call: the plan module's source, the
    kernel policy it is traced with, the device, and the abstract values of the arguments fixed for its life
    (weights, KV pools). None where executables are not kept: no JAX cache directory, or a backend outside
    `platforms` (default KEEP_PLATFORMS)."""
    device = jax.devices()[0]
    if cache_directory() is None or device.platform not in (KEEP_PLATFORMS if platforms is None else platforms):
        return None
    source = Path(plan_module.__file__).read_bytes() if getattr(plan_module, "__file__", None) else b""
    return "|".join(
        [
            hashlib.sha256(source).hexdigest(),
            hashlib.sha256(policy.digest().encode()).hexdigest(),
            device.platform,
            str(device.device_kind),
            abstract_digest(*fixed),
        ]
    )


def cached_step(fn: Callable, num_static: int, identity: str | None, tag: str) -> Callable:
    """CachedStep for one of an executor's step functions (identity: executor_identity's; tag: what the
    function closes over, e.g. the steps of a run-ahead call); fn itself where identity is None."""
    if identity is None:
        return fn
    return CachedStep(fn, num_static, f"{tag}|{identity}", cache_directory())


def step_store(identity: str | None, tag: str) -> ExecutableStore | None:
    """The store of a CompiledSteps step function (compiled_steps.py; identity: executor_identity's with
    AHEAD_PLATFORMS), None where identity is."""
    return None if identity is None else ExecutableStore(f"{tag}|{identity}", cache_directory())


_thread = threading.local()


def _count_cache_hits(event: str, **_: Any) -> None:
    if event == "/jax/compilation_cache/cache_hits":
        _thread.cache_hits = getattr(_thread, "cache_hits", 0) + 1


jax.monitoring.register_event_listener(_count_cache_hits)


def compile_fresh(lowered: Any) -> tuple[Any, bool]:
    """(lowered.compile(), whether XLA compiled it: False when JAX's persistent cache answered, whose
    executables cannot be serialized again on XLA:CPU, see AHEAD_PLATFORMS)."""
    before = getattr(_thread, "cache_hits", 0)
    executable = lowered.compile()
    return executable, getattr(_thread, "cache_hits", 0) == before
