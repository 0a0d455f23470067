"""Step executables compiled ahead of their first call, from any thread, kept in memory.

Where executables are not kept on disk (runtime/execution/executable_cache.py: the cpu backend), a step function
is still called through executables compiled by `lower(...).compile()` (JAX's persistent cache answers a warm
start there), so that a step shape can be compiled without running it — running a padding batch of 512
prefill tokens through an fp32 1.5B model costs ~15 s on 2 cores, the compile from JAX's cache a few — and
so that step shapes can be compiled by a background thread while the engine serves the others
(runtime/execution/background_compile.py). Both threads may ask for the same executable: the second waits for
the first's compile instead of compiling it again.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import jax

from .executable_cache import ExecutableStore, compile_fresh


def call_key(static: tuple, dynamic: tuple) -> tuple:
    """An executable's key: the static arguments and the shapes and dtypes of the array arguments (the pytrees
    of weights and KV pools keep their abstract values for the executor's life: they are not in the key)."""
    return static, tuple((tuple(a.shape), str(a.dtype)) for a in dynamic if hasattr(a, "shape"))


def abstract_values(tree: Any) -> Any:
    """The tree with each array as its shape and dtype (what compiling needs)."""
    return jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype) if hasattr(a, "dtype") else a, tree)


class CompiledSteps:
    """fn (jitted, `num_static` static arguments first) called through executables compiled once per call
    signature: by compile() ahead of time (arguments may be jax.ShapeDtypeStruct), or at the first call."""

    def __init__(self, fn: Callable, num_static: int, name: str = "step", store: ExecutableStore | None = None):
        self.fn, self.num_static, self.name = fn, num_static, name
        self.store = store  # executables also kept on disk (executable_cache.py step_store), or None
        self.loaded_from_disk = 0  # executables read back from the store instead of traced (tests, logs)
        self.executables: dict[tuple, Any] = {}
        self.compiled_on_call = 0  # executables a call had to wait for (tests, logs)
        self._locks: dict[tuple, threading.Lock] = {}
        self._guard = threading.Lock()

    def __call__(self, *args):
        static, dynamic = args[: self.num_static], args[self.num_static :]
        executable = self.executables.get(call_key(static, dynamic))
        if executable is None:
            started = time.perf_counter()
            executable = self.compile(*args)
            self.compiled_on_call += 1
            seconds = time.perf_counter() - started
            if seconds > 1.0:  # a request waited for it: say why
                print(f"ember: compiled a {self.name} shape on first use in {seconds:.1f}s", file=sys.stderr)
        return executable(*dynamic)

    def compiled(self, *args) -> bool:
        return call_key(args[: self.num_static], args[self.num_static :]) in self.executables

    def compile(self, *args):
        """The executable for these arguments, compiled now unless it is already (or being, by another
        thread: then this waits for it)."""
        key = call_key(args[: self.num_static], args[self.num_static :])
        with self._guard:
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:
            executable = self.executables.get(key)
            if executable is None:
                executable = self.executables[key] = self._load_or_compile(key, args)
        return executable

    def _load_or_compile(self, key: tuple, args: tuple):
        executable = None if self.store is None else self.store.load(key)
        if executable is not None:
            self.loaded_from_disk += 1
            return executable
        executable, fresh = compile_fresh(self.fn.lower(*args))
        if self.store is not None and fresh:
            self.store.save(key, executable)
        return executable

    def __getattr__(self, name: str):  # lower, trace, ...: the jitted function's
        return getattr(self.fn, name)
