"""Step shapes compiled ahead without running them, the few a first request takes before ready and the rest on a
background thread: the choice of shapes, one compile per executable across threads, and an engine that serves
while the others compile and gives the tokens a fully precompiled one gives."""

import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from engine_support import GREEDY, ByteTokenizer
from fixture_data import tiny_fixture

from ember.runtime.engine.engine import Engine, EngineConfig
from ember.runtime.execution.background_compile import (
    BackgroundCompiler,
    CompileTask,
    compile_tasks,
    compiled_stand_in,
    ready_first,
)
from ember.runtime.execution.compiled_steps import CompiledSteps
from ember.runtime.execution.step_inputs import StepShape
from ember.runtime.loading.model import load_model
from ember.runtime.sampling.params import SamplingParams


def _shapes():
    decode = [StepShape(b, 0, 8) for b in (1, 4, 16)]
    prefill = [StepShape(b, c, 8) for c in (32, 128, 512) for b in (0, 16)]
    return decode + prefill


def test_ready_first_takes_the_smallest_shape_of_each_kind_that_holds_it():
    shapes = _shapes()
    assert ready_first(shapes, ((1, 0), (0, 128))) == [StepShape(1, 0, 8), StepShape(0, 128, 8)]
    # a 100-token prompt takes the 128 bucket, a 2-row decode the 4 bucket; a duplicate is listed once
    assert ready_first(shapes, ((2, 0), (0, 100), (3, 0))) == [StepShape(4, 0, 8), StepShape(0, 128, 8)]
    assert ready_first(shapes, None) == shapes
    # no shape holds it: the largest of its kind (the prompt runs in chunks); no shape of its kind: none
    assert ready_first(shapes, ((0, 4096),)) == [StepShape(0, 512, 8)]
    assert ready_first([StepShape(1, 0, 8)], ((0, 128),)) == []


def test_compile_tasks_list_the_smallest_shapes_first_greedy_then_sampled():
    shapes = [StepShape(0, 32, 8), StepShape(1, 0, 8)]
    tasks = compile_tasks(shapes)
    assert [(t.shape, t.all_greedy) for t in tasks] == [
        (shapes[1], True),
        (shapes[1], False),
        (shapes[0], True),
        (shapes[0], False),
    ]
    assert tasks[3].describe() == "32 prompt tokens, sampled"
    assert CompileTask(StepShape(16, 128, 8), True).describe() == "128 prompt tokens + 16 decode rows, greedy"


def test_a_step_whose_executable_is_not_compiled_yet_takes_a_compiled_one_that_gives_the_same_tokens():
    d1, d4, d16 = (StepShape(b, 0, 8) for b in (1, 4, 16))
    p32, p128, p512 = (StepShape(0, c, 8) for c in (32, 128, 512))
    compiled = {(d1, False), (p128, False), (p512, True), (p512, False), (d16, True)}
    assert compiled_stand_in(d1, False, compiled) == (d1, False)  # its own
    assert compiled_stand_in(d1, True, compiled) == (d1, False)  # a greedy step on the sampling executable
    assert compiled_stand_in(p32, True, compiled) == (p128, False)  # the smallest shape that holds it
    assert compiled_stand_in(d4, True, compiled) == (d16, True)
    assert compiled_stand_in(d4, False, compiled) == (d4, False)  # none samples: compiled at its first call
    assert compiled_stand_in(StepShape(16, 32, 8), True, compiled) == (StepShape(16, 32, 8), True)  # no mixed one
    assert compiled_stand_in(p32, True, set()) == (p32, True)


class _CountingJit:
    """A jitted function whose lower() calls are counted (each is one compile)."""

    def __init__(self, fn, **kw):
        self.jitted, self.lowered = jax.jit(fn, **kw), 0
        self._lock = threading.Lock()

    def lower(self, *args):
        with self._lock:
            self.lowered += 1
        return self.jitted.lower(*args)


def test_compiled_steps_compile_ahead_from_abstract_values_and_call_without_recompiling():
    counting = _CountingJit(lambda scale, w, x: (x @ w) * scale, static_argnums=0)
    steps = CompiledSteps(counting, 1)
    w = jnp.ones((4, 3), jnp.float32)
    abstract_w = jax.ShapeDtypeStruct(w.shape, w.dtype)
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    # two threads ask for the same executable at once: one compile, both get it
    threads = [threading.Thread(target=steps.compile, args=(2.0, abstract_w, x)) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert counting.lowered == 1 and steps.compiled(2.0, w, x)
    np.testing.assert_allclose(steps(2.0, w, x), (x @ np.ones((4, 3))) * 2.0)
    assert counting.lowered == 1 and steps.compiled_on_call == 0
    steps(3.0, w, x[:1])  # another static value and row count: compiled at its first call
    assert counting.lowered == 2 and steps.compiled_on_call == 1


def test_background_compiler_runs_every_task_and_reports_each(capsys):
    seen = []
    tasks = compile_tasks([StepShape(1, 0, 8), StepShape(0, 32, 8)])
    compiler = BackgroundCompiler(seen.append, tasks).start()
    assert compiler.finished.wait(10)
    assert seen == tasks and compiler.done == 4 and compiler.error is None
    err = capsys.readouterr().err
    assert "compiling 4 more step shapes" in err and "compiled step shape 4/4" in err and "all step shapes" in err


def test_background_compiler_reports_an_error_and_stops():
    def fail(task):
        raise RuntimeError("no memory")

    compiler = BackgroundCompiler(fail, compile_tasks([StepShape(1, 0, 8)])).start()
    assert compiler.finished.wait(10)
    assert compiler.done == 0 and compiler.error == "RuntimeError: no memory"


@pytest.fixture(scope="module")
def qwen3():
    path, _ = tiny_fixture("qwen3")
    return load_model(path)


def _engine(model):
    # one decode bucket (1), prefill buckets 32 and 128: five step shapes, two of them ready (1 row, 128 tokens)
    config = EngineConfig(num_blocks=64, max_model_len=256, max_num_seqs=1, max_batched_tokens=128)
    return Engine(model, ByteTokenizer(), config)


def _generate(engine, prompt):
    outputs = engine.submit(prompt, SamplingParams(max_tokens=6, **GREEDY)).collect()[0]
    return [t for o in outputs for t in o.token_ids]


def test_engine_serves_the_ready_shapes_then_compiles_the_rest_in_the_background(qwen3):
    engine = _engine(qwen3)
    try:
        executor = engine.executor
        engine.precompile(ready_only=True)
        ready = executor.ready_shapes()
        assert [(s.decode_rows, s.prefill_tokens) for s in ready] == [(1, 0), (0, 32), (0, 128)]
        assert len(executor.step_fn.executables) == 3  # the sampling variant of each, none run
        # a greedy 20-token prompt and one-row decode steps on the sampling executables: nothing compiles
        prompt = list(range(3, 23))
        first = _generate(engine, prompt)
        assert len(first) == 6 and executor.step_fn.compiled_on_call == 0
        # the background thread takes what is left: shapes without an executable first, smallest first, then
        # the greedy variants of those the sampling one serves; it waits while a request is in the engine
        busy = threading.Event()
        busy.set()
        background = executor.compile_later(busy=busy.is_set)
        listed = [(t.shape.decode_rows, t.shape.prefill_tokens, t.all_greedy) for t in background.tasks]
        assert listed == [(1, 32, True), (1, 32, False), (1, 128, True), (1, 128, False)] + [
            (1, 0, True),
            (0, 32, True),
            (0, 128, True),
        ]
        assert not background.finished.wait(0.5) and background.done == 0
        busy.clear()
        assert background.finished.wait(300) and background.error is None
        assert background.done == 7 and len(executor.step_fn.executables) == 10
        # the same prompt on the greedy executables: the same tokens
        assert _generate(engine, prompt) == first and executor.step_fn.compiled_on_call == 0
    finally:
        engine.close()


def test_a_step_runs_padded_on_a_larger_compiled_shape_until_its_own_is_compiled(qwen3):
    engine = _engine(qwen3)
    try:
        executor = engine.executor
        shape = {(s.decode_rows, s.prefill_tokens): s for s in executor.shapes()}
        for key in ((1, 0), (0, 128)):  # as a target whose ready shapes are a one-row decode and 128 tokens
            executor.compile_ahead(CompileTask(shape[key], False))
        prompt = list(range(3, 23))
        padded = _generate(engine, prompt)  # 20 tokens in the 128-token shape
        assert executor.step_fn.compiled_on_call == 0 and len(executor.step_fn.executables) == 2
        executor.compile_ahead(CompileTask(shape[(0, 32)], True))
        assert _generate(engine, prompt) == padded and executor.step_fn.compiled_on_call == 0
    finally:
        engine.close()
