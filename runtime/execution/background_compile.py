"""Which step shapes compile before a server reports ready, and a thread that compiles the others after.

A target's `ready_shapes` (compiler/targets/__init__.py) names the steps a first request takes — a one-row
decode, a prompt of ~128 tokens — as (decode rows, prefill tokens); each is the smallest compiled shape of its
kind that holds them. `ember serve` compiles those (greedy and sampled) before its "serving" line and the
rest in a BackgroundCompiler while it serves, between requests: a step that needs a shape not yet compiled compiles it itself
(or waits for the thread's compile of it: runtime/execution/compiled_steps.py), so nothing fails, it is only
slower the first time. The thread prints one progress line per shape (each takes seconds to tens of seconds
on a small CPU) and a last line when every shape is compiled.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from .step_inputs import StepShape


@dataclass(frozen=True)
class CompileTask:
    shape: StepShape
    all_greedy: bool  # the sampler's greedy-only executable, or the one that samples

    def describe(self) -> str:
        parts = []
        if self.shape.prefill_tokens:
            parts.append(f"{self.shape.prefill_tokens} prompt tokens")
        if self.shape.decode_rows:
            parts.append(f"{self.shape.decode_rows} decode rows")
        return " + ".join(parts) + (", greedy" if self.all_greedy else ", sampled")


def ready_first(shapes: list[StepShape], ready: tuple[tuple[int, int], ...] | None) -> list[StepShape]:
    """The shapes of `shapes` that hold each (decode rows, prefill tokens) of `ready` (the smallest of its kind:
    decode-only for (b, 0), prefill-only for (0, c); the largest of its kind where none holds it: an engine
    whose chunks are shorter runs such a prompt in chunks of it); every shape when `ready` is None."""
    if ready is None:
        return list(shapes)
    chosen: list[StepShape] = []
    for rows, tokens in ready:
        kind = [s for s in shapes if (s.decode_rows > 0) == (rows > 0) and (s.prefill_tokens > 0) == (tokens > 0)]
        fits = [s for s in kind if s.decode_rows >= rows and s.prefill_tokens >= tokens]
        size = lambda s: (s.decode_rows + s.prefill_tokens, s.segments)  # noqa: E731
        best = min(fits, key=size) if fits else max(kind, key=size, default=None)
        if best is not None and best not in chosen:
            chosen.append(best)
    return chosen


def compiled_stand_in(shape: StepShape, greedy: bool, compiled: set[tuple[StepShape, bool]]) -> tuple[StepShape, bool]:
    """The (shape, all_greedy) a step of `shape` runs: its own, or, while that is not compiled yet (the
    background thread has not reached it), a compiled one that gives the same tokens — the sampling variant
    for an all-greedy step (the sampler's general path gives greedy rows the greedy tokens:
    compiler/kernels/sampling.py), else the smallest compiled shape of its kind (decode-only, prefill-only,
    mixed; same segments) that holds it: a padded step costs a fraction of a compile (on 2 cores a 32-token
    prompt padded to 128 runs in ~3 s, compiling its own shape takes ~15 s). `compiled`: the (shape,
    all_greedy) pairs compiled ahead; none: the step's own, compiled at its first call."""
    variants = (greedy, False) if greedy else (False,)
    for variant in variants:
        if (shape, variant) in compiled:
            return shape, variant
    holds = [
        (s, g)
        for s, g in compiled
        if g in variants
        and s.segments == shape.segments
        and not s.verify_width
        and not shape.verify_width
        and (s.decode_rows > 0) == (shape.decode_rows > 0)
        and (s.prefill_tokens > 0) == (shape.prefill_tokens > 0)
        and s.decode_rows >= shape.decode_rows
        and s.prefill_tokens >= shape.prefill_tokens
    ]
    size = lambda pair: (pair[0].decode_rows + pair[0].prefill_tokens, pair[0].decode_rows, pair[1] != greedy)  # noqa: E731
    return min(holds, key=size, default=(shape, greedy))


def compile_tasks(shapes: list[StepShape], variants: tuple[bool, ...] = (True, False)) -> list[CompileTask]:
    """Each shape's sampler variants (all_greedy values: greedy, what benchmarks and tools ask for, then
    sampled, a chat client's default temperature), the smallest shapes first (the likeliest to be met soon)."""
    ordered = sorted(shapes, key=lambda s: (s.decode_rows + s.prefill_tokens, s.decode_rows))
    return [CompileTask(shape, greedy) for shape in ordered for greedy in variants]


def report_compiled(index: int, total: int, task: CompileTask, seconds: float, when: str) -> None:
    """The progress line of one compiled step shape (stderr)."""
    print(
        f"ember: compiled step shape {index + 1}/{total} {when} ({task.describe()}) in {seconds:.1f}s",
        file=sys.stderr,
        flush=True,
    )


class BackgroundCompiler:
    """Runs compile(task) for each task on a daemon thread, with a progress line per task on stderr."""

    def __init__(
        self, compile: Callable[[CompileTask], None], tasks: list[CompileTask], busy: Callable[[], bool] = lambda: False
    ):
        # busy: whether requests are being served; the next compile waits until they are done (a compile and a
        # step share a small CPU's cores: a first request's prompt ran ~4x slower beside one)
        self._compile, self.tasks, self._busy = compile, tasks, busy
        self.done = 0
        self.error: str | None = None
        self._stop = threading.Event()
        self.finished = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ember-background-compile", daemon=True)

    def start(self) -> BackgroundCompiler:
        if self.tasks:
            print(f"ember: compiling {len(self.tasks)} more step shapes in the background", file=sys.stderr, flush=True)
            self._thread.start()
        else:
            self.finished.set()
        return self

    def _run(self) -> None:
        started = time.perf_counter()
        try:
            for task in self.tasks:
                while self._busy() and not self._stop.is_set():
                    self._stop.wait(0.2)
                if self._stop.is_set():
                    return
                begun = time.perf_counter()
                self._compile(task)
                self.done += 1
                report_compiled(self.done - 1, len(self.tasks), task, time.perf_counter() - begun, "in the background")
            print(
                f"ember: all step shapes compiled ({len(self.tasks)} in the background, "
                f"{time.perf_counter() - started:.1f}s)",
                file=sys.stderr,
                flush=True,
            )
        except Exception as error:  # the step that needs the shape compiles it (and reports any error) itself
            self.error = f"{type(error).__name__}: {error}"
            print(f"ember: background compile stopped: {self.error}", file=sys.stderr, flush=True)
        finally:
            self.finished.set()

    def stop(self, timeout: float | None = None) -> None:
        """Compile no further task; wait up to `timeout` (None: as long as it takes) for the one under way."""
        self._stop.set()
        if self._thread.is_alive():
            if self.done < len(self.tasks):
                print("ember: waiting for the step shape being compiled", file=sys.stderr, flush=True)
            self._thread.join(timeout)
