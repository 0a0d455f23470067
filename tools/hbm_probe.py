"""HBM bandwidth of this device: the denominator of every roofline fraction the bench reports.

Two probes over a buffer far larger than L2 (60 MB on the H200), both timed on the device's own clock
as a difference: one executable runs the pass `short` and `long` times in a loop whose trip count is a
runtime argument, and (t_long - t_short) / (long - short) is one pass with no dispatch, synchronisation
or first-touch cost in it. A single wall-clock call (what the bench used before) carried those costs and
read 3.3-3.9 TB/s on machines whose GEMVs then streamed 4.3 TB/s.

- copy: x = -x, bytes read + written (METHOD.md's ceiling).
- read: every word read once and summed (a Triton streaming kernel on a GPU, XLA's reduction elsewhere),
  bytes read. A decode step is almost all reads, and reads alone run faster than a copy (no read/write
  turnaround), so the bench's roofline takes the larger of the two: the strictest.
"""

from __future__ import annotations

import functools
import statistics
import time

import jax
import jax.numpy as jnp

from ember.compiler.ops.triton_available import triton_available

READ_BLOCK = 4096  # float32 words per load step of one program (8 warps: 16 words = 4 x 16 B per thread)
READ_WORDS_PER_PROGRAM = 1 << 20  # 4 MiB per program: 1,024 programs over 4 GiB


def _seconds_per_pass(step, x, short: int, long: int, runs: int) -> float:
    """Median-timed seconds of one `step` pass: the loop run `long` and `short` times, differenced."""
    loop = jax.jit(lambda x, n: jax.lax.fori_loop(0, n, lambda _, carry: step(x, carry), step(x, None)))

    def median(n: int) -> float:
        jax.block_until_ready(loop(x, n))  # compile (once) and warm
        samples = []
        for _ in range(runs):
            start = time.perf_counter()
            jax.block_until_ready(loop(x, n))
            samples.append(time.perf_counter() - start)
        return statistics.median(samples)

    return max(median(long) - median(short), 1e-9) / (long - short)


def _negate(x, carry):
    return -(x if carry is None else carry)


def copy_bandwidth(gib: float = 4.0, *, short: int = 2, long: int = 10, runs: int = 5) -> float:
    """GB/s of x = -x over `gib` GiB of float32, bytes read + written."""
    x = jnp.ones((int(gib * 2**30) // 4,), jnp.float32)
    return 2 * x.nbytes / _seconds_per_pass(_negate, x, short, long, runs) / 1e9


def read_bandwidth(gib: float = 4.0, *, short: int = 2, long: int = 10, runs: int = 5) -> float:
    """GB/s of summing `gib` GiB of float32 (a multiple of 4 MiB), bytes read."""
    words = int(gib * 2**30) // 4 // READ_WORDS_PER_PROGRAM * READ_WORDS_PER_PROGRAM
    x = jnp.ones((words,), jnp.float32)
    return x.nbytes / _seconds_per_pass(_summed, x, short, long, runs) / 1e9


def _summed(x, carry):
    """A float32 scalar that depends on every word of x and on the loop's carry (so the pass cannot be
    hoisted out of the loop)."""
    bias = jnp.zeros((), jnp.float32) if carry is None else carry * 0.0
    if triton_available():
        return _triton_sum(x, bias)
    return jnp.sum(x + bias)


def _triton_sum(x, bias):
    from ember.compiler.ops.triton_launch import triton_call

    programs = x.shape[0] // READ_WORDS_PER_PROGRAM
    partials = triton_call(x, bias.reshape(1), kernel=_sum_kernel(), grid=(programs,),
                           out_shape=jax.ShapeDtypeStruct((programs,), jnp.float32), num_warps=8, num_stages=4,
                           WORDS=READ_WORDS_PER_PROGRAM, BLOCK=READ_BLOCK)
    return jnp.sum(partials)


@functools.cache
def _sum_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def sum_words(x_ptr, bias_ptr, out_ptr, WORDS: tl.constexpr, BLOCK: tl.constexpr):
        # x: [programs * WORDS] float32; out: [programs], each its share's sum (+ bias)
        base = tl.program_id(0).to(tl.int64) * WORDS
        acc = tl.zeros([BLOCK], tl.float32)
        for start in range(0, WORDS, BLOCK):
            acc += tl.load(x_ptr + base + start + tl.arange(0, BLOCK))
        tl.store(out_ptr + tl.program_id(0), tl.sum(acc) + tl.load(bias_ptr))

    return sum_words
