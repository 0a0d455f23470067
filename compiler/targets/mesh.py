"""The device mesh a plan is compiled for: how many devices one model is spread over on one host.

Tensor parallelism goes through XLA's SPMD partitioner: a plan's weights and state are placed as sharded arrays
on a `jax.sharding.Mesh` with one axis, `MESH_AXIS`, and XLA partitions every step and inserts the collectives
(compiler/sharding.py decides each weight's split from the op that reads it). A mesh of one device is today's
single-device plan, unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

MESH_AXIS = "tp"  # the mesh's one axis: tensor (and, with expert_parallel, expert) parallel


@dataclass(frozen=True)
class MeshConfig:
    tensor_parallel: int = 1  # devices one model is spread over
    # MoE experts split by expert over the mesh (each device holds whole experts) instead of by expert width
    expert_parallel: bool = False

    def __post_init__(self):
        if self.tensor_parallel < 1:
            raise ValueError(f"tensor_parallel must be >= 1, got {self.tensor_parallel}")
        if self.expert_parallel and self.tensor_parallel == 1:
            raise ValueError("expert_parallel needs tensor_parallel > 1 (the experts are split over the mesh)")

    @property
    def sharded(self) -> bool:
        """Whether any array is split: a one-device mesh compiles and places exactly as no mesh."""
        return self.tensor_parallel > 1

    def to_dict(self) -> dict:
        """As the manifest, the startup line and /v1/info record it."""
        return {"tensor_parallel": self.tensor_parallel, "expert_parallel": self.expert_parallel}

    def describe(self) -> str:
        if not self.sharded:
            return "1 device"
        return f"{self.tensor_parallel} devices (tensor parallel{', expert parallel' if self.expert_parallel else ''})"

    def tag(self) -> str:
        """A folder name for the plans compiled for this mesh ("tp4", "tp4-ep")."""
        return f"tp{self.tensor_parallel}" + ("-ep" if self.expert_parallel else "")


SINGLE_DEVICE = MeshConfig()
