"""Grid-wide handoff inside one Triton launch: the program that arrives last does the follow-up work.

A follow-up that needs every program's output (the split-K attention's combine, a norm over a whole
projection output) used to be its own launch, ~2-3 µs each on the H200 however little it computes
(tools/results/h200_engine_profile_69717b2.json). Here each program stores its share, then takes a ticket
from a counter of its group; the one that draws the last ticket knows every other share is stored and reads
them itself. Programs never wait on each other (no spin: correct whatever the occupancy).

Memory ordering (PTX): every thread's stores are issued before a CTA barrier, then one thread's
acq_rel atomic at GPU scope releases them (cumulative through the barrier); the last program's atomic
acquires every earlier release, and after Triton's broadcast of the ticket (another barrier) its threads'
loads see them. Those loads must skip L1 (cache_modifier ".cg"): a group's shares can share a 128-byte line
with another group's, which a program of that group on the same SM may have cached before this one's writers
finished.

Counters: an int32 buffer of zeros (`counters`), one slot per group. The last program resets its slot, so
the buffer is all zeros again when the launch ends: one buffer serves every launch of a step (XLA sees a
read-only input of zeros, which is what it holds between launches), as long as launches sharing it do not
run concurrently (each consumes the previous one's output: the decode step's chain).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def last_arrival(count_ptr, slot, arrivals):
    """True in the one program of the `arrivals` programs sharing counter `slot` that arrives last (call it
    after the program's stores); that program leaves the counter at 0."""
    tl.debug_barrier()
    ticket = tl.atomic_add(count_ptr + slot, 1, sem="acq_rel", scope="gpu")
    last = ticket == arrivals - 1
    if last:
        tl.atomic_xchg(count_ptr + slot, 0, sem="relaxed", scope="gpu")
    return last


def counters(n: int):
    """n zeroed int32 counters for last_arrival (a fresh jnp.zeros: XLA makes one buffer of identical ones)."""
    import jax.numpy as jnp

    return jnp.zeros((n,), jnp.int32)
