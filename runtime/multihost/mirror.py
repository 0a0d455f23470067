"""Every process runs the same step executables in the same order: the leader's StepExecutor sends each device
call to the followers before making it, and each follower makes the same call on its own executor.

What travels is what the leader's scheduler decided, never recomputed: the step function's name, its static
arguments (the packed layout, top-K, the greedy switch, a verify width) and the packed int32 input buffer
(runtime/execution/step_io.py). The model, its parameters and the KV pools are each process's own shards of the
same global arrays (the mesh spans every process's devices), so the calls are one SPMD program whose collectives
meet across processes. Only the leader reads results back.

Supported in a group today: steps of one decode step (no run-ahead chaining: a chained call's inputs are the
previous call's results on the device, which a follower would have to name), verify steps, deterministic tiles.
Not yet: recurrent slot state (its snapshot copies), the host tier's block copies, speculative drafting by a draft
model or an MTP module (their own device calls); n-gram drafting is host work and runs.
"""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import replace

import jax

from ..engine.config import EngineConfig, prefill_shapes
from ..execution.deterministic_tiles import fixed_tiles
from ..execution.step_executor import StepExecutor
from ..loading.model import Model
from .channel import FollowerChannel, LeaderChannel
from .group import GroupConfig

# the executor's step functions a follower may be asked to call, with their count of static arguments after dims
MIRRORED = {"step_fn": 3, "verify_fn": 4}


def group_engine_config(model: Model, config: EngineConfig) -> EngineConfig:
    """The engine configuration a group can run (ValueError for what it cannot yet): one decode step per call."""
    if model.slot_kinds:
        raise ValueError("several processes cannot yet serve a model with recurrent state (its slot copies)")
    if config.prefix_cache_host_bytes:
        raise ValueError("several processes cannot yet keep the prefix cache's host tier (its block copies)")
    if config.speculative is not None and config.speculative.method != "ngram":
        raise ValueError(
            f"several processes cannot yet run --speculative {config.speculative.method} (its own device calls)"
        )
    return replace(config, decode_steps=1)


class _MirroredCall:
    """One of the leader's step functions: sends the call to the followers, then makes it here."""

    def __init__(self, name: str, fn, leader: LeaderGroup):
        self.name, self.fn, self.leader = name, fn, leader
        self.num_static = MIRRORED[name]

    def __call__(self, dims, *args):
        static, rest = args[: self.num_static], args[self.num_static :]
        params, kv, host_args = rest[0], rest[1], rest[2:]
        if any(isinstance(a, jax.Array) for a in host_args):  # a follower could not name this process's array
            raise TypeError(f"{self.name}: a call sent to the group's processes takes host arrays only")
        self.leader.channel.send(("call", self.name, static, host_args))
        return self.fn(dims, *static, params, kv, *host_args)


class LeaderGroup:
    """Process 0's side: the channel to the followers, the executor's calls mirrored over it, and a watchdog
    that fails the group when a launched step does not come back within the group's step timeout."""

    def __init__(self, group: GroupConfig):
        self.group = group
        self.channel = LeaderChannel(group.channel_address, group.num_processes - 1, group.silence_timeout_s)
        self._collecting_since: float | None = None
        self._handlers: list = []
        self.channel.on_failure = self._broken
        threading.Thread(target=self._watchdog, name="ember-step-watchdog", daemon=True).start()

    @property
    def failure(self) -> str | None:
        return self.channel.failure

    def on_failure(self, handler) -> None:
        """handler(reason) runs once, on its own thread, when the group breaks."""
        self._handlers.append(handler)
        if self.channel.failure is not None:
            self._broken(self.channel.failure)

    def attach(self, executor: StepExecutor, config: EngineConfig) -> None:
        """Hand the followers the engine configuration, then mirror every device call of `executor`."""
        self.channel.send(("config", config))
        # no longer a CompiledSteps: the executor then precompiles by running padding batches, mirrored (a compile
        # without running would happen on this process only) and compiles nothing in the background
        for name in MIRRORED:
            setattr(executor, name, _MirroredCall(name, getattr(executor, name), self))
        collect = executor.collect

        def watched_collect(in_flight):
            self.channel.check()
            self._collecting_since = time.monotonic()
            try:
                return collect(in_flight)
            finally:
                self._collecting_since = None

        executor.collect = watched_collect

    def close(self) -> None:
        """Tell the followers to exit (they leave their loop and shut jax.distributed down with us)."""
        self.channel.shutdown(("shutdown",))

    def _broken(self, reason: str) -> None:
        for handler in self._handlers:
            threading.Thread(target=handler, args=(reason,), name="ember-group-failed", daemon=True).start()

    def _watchdog(self) -> None:
        while self.channel.failure is None and not self.channel.closed:
            since = self._collecting_since
            if since is not None and time.monotonic() - since > self.group.step_timeout_s:
                self.channel.fail(f"a step did not return within {self.group.step_timeout_s:g}s (a process hung)")
            time.sleep(0.1)


def follow(group: GroupConfig, model: Model) -> int:
    """A follower's life: receive the engine configuration, build the same executor, then run every call the
    leader sends until it says shutdown (0) or its connection closes (1)."""
    channel = FollowerChannel(group.channel_address, group.process_id, group.heartbeat_s)
    message = channel.receive()
    if message is None:
        print("ember: the group's leader closed before sending its configuration", file=sys.stderr, flush=True)
        return 1
    _, config = message
    tiled = fixed_tiles(model.policy.deterministic, config.deterministic) is not None
    executor = StepExecutor(model, config, prefill_shapes(model.plan.manifest["entries"]["forward"], config, tiled))
    print(f"ember: process {group.process_id} follows the leader's steps", file=sys.stderr, flush=True)
    while True:
        message = channel.receive()
        if message is None:
            print("ember: the group's leader is gone; exiting", file=sys.stderr, flush=True)
            return 1
        if message[0] == "shutdown":
            channel.close()
            return 0
        _, name, static, host_args = message
        fn = getattr(executor, name)
        packed, executor.kv = fn(model.dims, *static, model.params, executor.kv, *host_args)
        jax.block_until_ready(packed)  # keep in step with the leader; a failed collective raises here
