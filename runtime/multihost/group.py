"""A process group: several processes (one per host, or several on one machine) joined by jax.distributed so the
device mesh spans every process's devices (runtime/loading/sharding.py takes `jax.devices()`, the global list).

Process 0 (the leader) runs the scheduler and the server; the others (followers) only run the same step
executables in the same order (runtime/multihost/mirror.py), fed through a channel of our own
(runtime/multihost/channel.py) beside JAX's coordinator. `initialize` must run before anything else touches JAX.
"""

from __future__ import annotations

from dataclasses import dataclass

_A_DAY = 24 * 3600


@dataclass(frozen=True)
class GroupConfig:
    coordinator: str  # HOST:PORT of process 0 (jax.distributed's coordinator; the step channel takes PORT + 1)
    num_processes: int
    process_id: int
    # a follower silent this long (dead, stopped, its host gone) fails the group
    silence_timeout_s: float = 10.0
    # a step not back after this long fails the group (a collective that never ends with every process alive);
    # long: it covers compiling a step shape met for the first time, on every process
    step_timeout_s: float = 300.0
    heartbeat_s: float = 0.5  # how often a follower says it is alive

    def __post_init__(self):
        host, _, port = self.coordinator.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"--coordinator must be HOST:PORT, got {self.coordinator!r}")
        if self.num_processes < 2:
            raise ValueError(f"--num-processes must be at least 2 with --coordinator, got {self.num_processes}")
        if not 0 <= self.process_id < self.num_processes:
            raise ValueError(f"--process-id must be in 0..{self.num_processes - 1}, got {self.process_id}")

    @property
    def is_leader(self) -> bool:
        return self.process_id == 0

    @property
    def channel_address(self) -> tuple[str, int]:
        """Where the leader listens for its followers: the coordinator's host, the next port."""
        host, _, port = self.coordinator.rpartition(":")
        return host, int(port) + 1


def group_from_values(
    coordinator: str | None,
    num_processes: int | None,
    process_id: int | None,
    silence_timeout_s: float = 10.0,
    step_timeout_s: float = 300.0,
) -> GroupConfig | None:
    """None when no coordinator is given (one process); else all three are needed."""
    if coordinator is None:
        if num_processes not in (None, 1) or process_id not in (None, 0):
            raise ValueError("--num-processes / --process-id need --coordinator HOST:PORT")
        return None
    if num_processes is None or process_id is None:
        raise ValueError("--coordinator needs --num-processes and --process-id")
    return GroupConfig(coordinator, num_processes, process_id, silence_timeout_s, step_timeout_s)


def initialize(group: GroupConfig) -> None:
    """jax.distributed.initialize, before any other use of JAX. On the CPU, collectives go through gloo (XLA's
    host platform has none of its own across processes)."""
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")  # only the CPU backend reads it
    jax.distributed.initialize(
        coordinator_address=group.coordinator,
        num_processes=group.num_processes,
        process_id=group.process_id,
        # JAX's own heartbeat would end every process some time after one dies; ours (the step channel's) bounds
        # that, and process 0 must live on to answer 503 with the reason
        heartbeat_timeout_seconds=_A_DAY,
    )


def check_mesh(group: GroupConfig, tensor_parallel: int) -> None:
    """The mesh of a group is every process's devices: a smaller one would leave some processes outside every
    step (ValueError naming the count to give)."""
    import jax

    if tensor_parallel != jax.device_count():
        raise ValueError(
            f"--tensor-parallel {tensor_parallel}: the group's {group.num_processes} processes hold "
            f"{jax.device_count()} devices ({jax.local_device_count()} here) and the mesh spans them all: "
            f"give --tensor-parallel {jax.device_count()} to every process"
        )
