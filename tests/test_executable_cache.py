"""runtime/execution/executable_cache.py: step executables kept on disk, read back by a fresh object without tracing
(toy functions on the CPU backend; a whole engine restarting on a GPU: tests/test_gpu_engine.py)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ember.compiler.targets.policy import KernelPolicy
from ember.runtime.execution import compiled_steps, executable_cache
from ember.runtime.execution.compiled_steps import CompiledSteps
from ember.runtime.execution.executable_cache import CachedStep


def _step(scale, flag, params, kv, x):
    y = params["w"] @ x * scale
    return (y.sum() if flag else y), kv.at[0].add(1.0)


def _jitted():
    return jax.jit(_step, static_argnums=(0, 1), donate_argnums=3)


def _args():
    return {"w": jnp.arange(16.0).reshape(4, 4)}, jnp.zeros((3,)), np.ones((4,), np.float32)


def test_a_fresh_object_reads_the_executable_back_without_tracing(tmp_path):
    params, kv, x = _args()
    first = CachedStep(_jitted(), 2, "model A", tmp_path)
    want, kv = first(2.0, True, params, kv, x)
    assert len(list(tmp_path.glob("*.exe"))) == 1 and first.loaded_from_disk == 0

    fresh = _jitted()
    second = CachedStep(fresh, 2, "model A", tmp_path)
    second.fn = type("NoTracing", (), {"lower": lambda *a: pytest.fail("traced again")})()
    got, kv2 = second(2.0, True, params, kv, x)
    assert second.loaded_from_disk == 1
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    np.testing.assert_array_equal(np.asarray(kv2), [2.0, 0.0, 0.0])
    assert kv.is_deleted()  # the KV argument is still donated


def test_each_signature_and_identity_gets_its_own_executable(tmp_path):
    params, kv, x = _args()
    step = CachedStep(_jitted(), 2, "model A", tmp_path)
    a, kv = step(2.0, True, params, kv, x)
    b, kv = step(2.0, False, params, kv, x)  # another static argument
    c, kv = step(2.0, False, params, kv, np.ones((4, 2), np.float32))  # another shape
    assert np.asarray(b).shape == (4,) and np.asarray(c).shape == (4, 2) and float(a) == float(np.asarray(b).sum())
    other = CachedStep(_jitted(), 2, "model B", tmp_path)  # another model: compiled, not read back
    other(2.0, True, params, kv, x)
    assert other.loaded_from_disk == 0 and len(list(tmp_path.glob("*.exe"))) == 4


def test_an_unreadable_file_is_compiled_again(tmp_path, capsys):
    params, kv, x = _args()
    want, kv = CachedStep(_jitted(), 2, "model A", tmp_path)(2.0, True, params, kv, x)
    (path,) = tmp_path.glob("*.exe")
    path.write_bytes(b"not an executable")
    step = CachedStep(_jitted(), 2, "model A", tmp_path)
    got, kv = step(2.0, True, params, kv, x)
    assert float(got) == float(want) and step.loaded_from_disk == 0
    assert "recompiling a step executable" in capsys.readouterr().err
    assert CachedStep(_jitted(), 2, "model A", tmp_path)(2.0, True, params, kv, x)[0] == want  # rewritten


def test_the_key_follows_the_sources_and_the_xla_settings(monkeypatch):
    before = executable_cache.source_fingerprint()
    monkeypatch.setenv("XLA_FLAGS", "--xla_gpu_autotune_level=0")
    executable_cache.source_fingerprint.cache_clear()
    try:
        assert executable_cache.source_fingerprint() != before
    finally:
        monkeypatch.undo()
        executable_cache.source_fingerprint.cache_clear()
    assert executable_cache.source_fingerprint() == before


def test_the_key_follows_the_kernel_policy(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from ember.compiler.targets import get_target

    monkeypatch.setattr(executable_cache, "cache_directory", lambda: tmp_path)
    monkeypatch.setattr(executable_cache, "KEEP_PLATFORMS", ("cpu",))
    plan_module, policy = SimpleNamespace(), get_target("h200").policy
    key = executable_cache.executor_identity(plan_module, policy, ())
    assert key == executable_cache.executor_identity(plan_module, get_target("h200").policy, ())
    other = policy.overridden({"attention.fused_rope_decode": False})
    assert key != executable_cache.executor_identity(plan_module, other, ())


def test_the_cpu_backend_and_engines_that_do_not_ask_trace_as_before(tmp_path, monkeypatch):
    fn = _jitted()
    monkeypatch.setattr(executable_cache, "cache_directory", lambda: tmp_path)
    identity = lambda: executable_cache.executor_identity(executable_cache, KernelPolicy(), ())  # noqa: E731
    assert executable_cache.cached_step(fn, 2, identity(), "step") is fn  # the cpu backend
    monkeypatch.setattr(executable_cache, "KEEP_PLATFORMS", ("cpu",))
    assert executable_cache.cached_step(fn, 2, None, "step") is fn  # not asked
    assert isinstance(executable_cache.cached_step(fn, 2, identity(), "step"), CachedStep)


def test_the_directory_keeps_its_most_recently_used_files_within_its_bound(tmp_path):
    import os

    for age, name in enumerate(("new", "middle", "old")):
        path = tmp_path / f"{name}.exe"
        path.write_bytes(b"x" * 100)
        os.utime(path, (1_000_000 - age * 10, 1_000_000 - age * 10))
    (tmp_path / "other.txt").write_bytes(b"y" * 1000)  # not an executable: never counted or removed
    executable_cache.evict(tmp_path, 250)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["middle.exe", "new.exe", "other.txt"]
    executable_cache.evict(tmp_path, 1000)
    assert len(list(tmp_path.glob("*.exe"))) == 2


def test_compiled_steps_keep_the_executables_they_compile(tmp_path):
    """The cpu backend's CompiledSteps with a store: what XLA compiled is read back by a fresh object without
    tracing; what JAX's persistent cache answered is not written (XLA:CPU loses functions serializing it again)."""
    params, kv, x = _args()
    store = executable_cache.ExecutableStore("step|model A", tmp_path)
    first = CompiledSteps(_jitted(), 2, store=store)
    want, kv = first(2.0, True, params, kv, x)
    assert len(list(tmp_path.glob("*.exe"))) == 1 and first.loaded_from_disk == 0

    second = CompiledSteps(_jitted(), 2, store=store)
    second.fn = type("NoTracing", (), {"lower": lambda *a: pytest.fail("traced again")})()
    got, kv = second(2.0, True, params, kv, x)
    assert second.loaded_from_disk == 1
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_an_executable_from_jaxs_cache_is_not_kept(tmp_path, monkeypatch):
    monkeypatch.setattr(compiled_steps, "compile_fresh", lambda lowered: (lowered.compile(), False))
    params, kv, x = _args()
    steps = CompiledSteps(_jitted(), 2, store=executable_cache.ExecutableStore("step|model A", tmp_path))
    steps(2.0, True, params, kv, x)
    assert list(tmp_path.glob("*.exe")) == []


def test_compile_fresh_tells_a_compile_from_a_cache_answer():
    lowered = _jitted().lower(2.0, True, *_args())
    assert executable_cache.compile_fresh(lowered)[1]  # XLA compiled it: no cache-hit event in this thread

    class AnsweredByTheCache:  # what JAX's persistent cache reports when it answers a compile
        def compile(self):
            jax.monitoring.record_event("/jax/compilation_cache/cache_hits")
            return "executable"

    assert executable_cache.compile_fresh(AnsweredByTheCache()) == ("executable", False)
