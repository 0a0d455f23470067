"""HBM bandwidth of this device: the denominator of every roofline fraction the bench reports.

Two passes over a buffer far larger than L2 (60 MB on the H200), each timed as a difference: one
executable runs the pass `short` and `long` times in a loop whose trip count is a runtime argument, and
(t_long - t_short) / (long - short) is one pass with no dispatch, synchronisation or first-touch cost in
it. A single wall-clock call (what the bench used before 2026-12) carried those costs: on one H200 it read
3,708-3,885 GB/s where this copy read 4,146-4,201 and PyTorch's copy timed with CUDA events 4,202-4,284
(`docs/results/h200_hbm_probe_e0c7f7c.json`).

- copy: x = -x, bytes read + written (METHOD.md's ceiling).
- read: every word of x summed by XLA's reduction, bytes read: 4,447-4,472 GB/s on that H200 (a Triton
  streaming sum read 3,944-4,151). A decode step is almost all reads, and reads alone run faster than a
  copy (no read/write turnaround), so the bench's roofline takes the larger of the two: the strictest.
"""

from __future__ import annotations

import statistics
import time

import jax
import jax.numpy as jnp


def median_run_seconds(run, runs: int) -> float:
    """Median wall seconds of run() (which waits for the device), after 3 warm-up runs."""
    for _ in range(3):
        run()
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        run()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def pass_loop(step):
    """jit((x, n) -> `step` applied n + 1 times): a loop whose trip count is a runtime argument. The pass must
    depend on its carry (None on the first pass), or XLA hoists it out of the loop."""
    return jax.jit(lambda x, n: jax.lax.fori_loop(0, n, lambda _, carry: step(x, carry), step(x, None)))


def _seconds_per_pass(step, x, short: int, long: int, runs: int, *, attempts: int = 4) -> float:
    """Seconds of one `step(x, carry)` pass: the loop's median time at `long` and `short` passes, differenced.
    On a noisy host the difference can vanish or go negative (a bandwidth of 1e7 GB/s, or a division by zero):
    a difference under a tenth of the short loop's time is retried with `long` doubled, and after `attempts`
    the long loop's time over its passes stands in (launch overhead included: a bandwidth too low, not too high)."""
    loop = pass_loop(step)
    median = lambda n: median_run_seconds(lambda: jax.block_until_ready(loop(x, n)), runs)  # noqa: E731
    for attempt in range(attempts):
        if attempt:
            long *= 2
        short_s, long_s = median(short), median(long)
        if long_s - short_s > 0.1 * short_s:
            return (long_s - short_s) / (long - short)
    return long_s / (long + 1)


def _negate(x, carry):
    return -(x if carry is None else carry)


def _sum(x, carry):
    return jnp.sum(x if carry is None else x + carry * 0.0)  # carry * 0.0 is not folded (NaN, inf)


def copy_bandwidth(gib: float = 4.0, *, short: int = 2, long: int = 10, runs: int = 5) -> float:
    """GB/s of x = -x over `gib` GiB of float32, bytes read + written."""
    x = jnp.ones((int(gib * 2**30) // 4,), jnp.float32)
    return 2 * x.nbytes / _seconds_per_pass(_negate, x, short, long, runs) / 1e9


def read_bandwidth(gib: float = 4.0, *, short: int = 2, long: int = 10, runs: int = 5) -> float:
    """GB/s of summing `gib` GiB of float32, bytes read."""
    x = jnp.ones((int(gib * 2**30) // 4,), jnp.float32)
    return x.nbytes / _seconds_per_pass(_sum, x, short, long, runs) / 1e9


def measure(gib: float = 4.0) -> dict[str, float]:
    """{"copy_gb_s", "read_gb_s"}, each rounded to 0.1 GB/s."""
    return {"copy_gb_s": round(copy_bandwidth(gib), 1), "read_gb_s": round(read_bandwidth(gib), 1)}


METHOD = (
    "loop-count difference inside one executable (2 vs 10 passes, median of 5 each) over {gib} GiB "
    "float32: copy x = -x (bytes read + written) and XLA's sum (bytes read); rooflines use the highest "
    "figure of either"
)
