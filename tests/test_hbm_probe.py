"""The bandwidth probes behind every roofline fraction: each pass stays inside the timed loop (XLA would
otherwise hoist a loop-invariant pass and the figure would be the loop's overhead), and the figures are
the bytes a pass moves over its time."""

import re

import jax.numpy as jnp
import pytest

from ember.tools import hbm_probe

GIB = 1 / 16  # 64 MiB: more than this machine's caches, fast on 2 cores


def _ops_in_loop_body(step) -> str:
    """The compiled HLO text of the loop's body and of every computation it calls, transitively."""
    hlo = hbm_probe.pass_loop(step).lower(jnp.ones((1024,), jnp.float32), 3).compile().as_text()
    computations = {}
    for block in hlo.split("\n\n"):
        header = re.match(r"\s*(?:ENTRY\s+)?%?([\w.\-]+)", block)
        if header:
            computations[header.group(1)] = block
    pending, seen = re.findall(r"body=%?([\w.\-]+)", hlo), set()
    while pending:
        name = pending.pop()
        if name not in seen and name in computations:
            seen.add(name)
            pending += re.findall(r"(?:calls|to_apply)=%?([\w.\-]+)", computations[name])
    assert seen, hlo
    return "\n".join(computations[name] for name in seen)


@pytest.mark.parametrize("step, op", [(hbm_probe._sum, "reduce("), (hbm_probe._negate, "negate(")])
def test_each_pass_runs_inside_the_loop(step, op):
    assert op in _ops_in_loop_body(step)


def test_figures_are_bytes_over_time_of_one_pass(monkeypatch):
    seen = []

    def fake_seconds(step, x, short, long, runs):
        seen.append((step, x.nbytes, short, long))
        return 0.5

    monkeypatch.setattr(hbm_probe, "_seconds_per_pass", fake_seconds)
    measured = hbm_probe.measure(GIB)
    nbytes = int(GIB * 2**30)
    assert measured == {"copy_gb_s": round(2 * nbytes / 0.5 / 1e9, 1), "read_gb_s": round(nbytes / 0.5 / 1e9, 1)}
    assert [(s, n) for s, n, *_ in seen] == [(hbm_probe._negate, nbytes), (hbm_probe._sum, nbytes)]


def test_measured_on_this_machine_is_a_memory_speed():
    measured = hbm_probe.measure(GIB)
    # a hoisted pass reads as ~1e9 GB/s; no CPU memory system streams 64 MiB at 2 TB/s
    assert 0.1 < measured["copy_gb_s"] < 2000 and 0.1 < measured["read_gb_s"] < 2000


def _timed_by(monkeypatch, seconds_at):
    """The probe's loop and timer replaced: a loop of n passes takes seconds_at(n); returns the n timed, in order."""
    timed = []
    monkeypatch.setattr(hbm_probe, "pass_loop", lambda step: lambda x, n: timed.append(n) or x)
    monkeypatch.setattr(hbm_probe, "median_run_seconds", lambda run, runs: (run(), seconds_at(timed[-1]))[1])
    return timed


def test_a_vanished_difference_is_timed_again_with_a_longer_loop(monkeypatch):
    # the first long loop reads as fast as the short one (noise); the retry at twice the passes is clean
    timed = _timed_by(monkeypatch, lambda n: 1.0 + (0.0 if n == 10 else 0.01 * (n + 1)))
    seconds = hbm_probe._seconds_per_pass(hbm_probe._negate, jnp.ones(4), 2, 10, 5)
    assert timed == [2, 10, 2, 20] and seconds == pytest.approx(0.01)


def test_noise_throughout_falls_back_to_the_long_loop_over_its_passes(monkeypatch):
    timed = _timed_by(monkeypatch, lambda n: 1.0)
    seconds = hbm_probe._seconds_per_pass(hbm_probe._negate, jnp.ones(4), 2, 10, 5)
    assert timed == [2, 10, 2, 20, 2, 40, 2, 80] and seconds == pytest.approx(1.0 / 81)
