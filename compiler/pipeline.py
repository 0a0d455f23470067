"""The compiler pipeline: a spec in, a graph ready for code generation out, in numbered phases.

Each phase is a pure function Graph -> Graph. `dump_dir` writes the IR after every phase
(`00-lower.ir`, `01-infer_shapes.ir`, ...) for reading what a pass did.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from .frontend import lower
from .ir import Graph
from .passes.assign_state_kinds import assign_state_kinds
from .passes.carry_split_k_partials import carry_split_k_partials
from .passes.defer_residual_add import defer_residual_add
from .passes.fuse_add_rms_norm import fuse_add_rms_norm
from .passes.fuse_gated_linear import fuse_gated_linear
from .passes.fuse_gated_mlp import fuse_gated_mlp
from .passes.fuse_norm_into_projection import FUSED as FUSED_INTO_PROJECTION
from .passes.fuse_norm_into_projection import fuse_norm_into_projection
from .passes.fuse_rope_attention import fuse_rope_attention
from .passes.hoist_layer_constants import hoist_layer_constants
from .passes.infer_shapes import infer_shapes
from .passes.pack_parallel_linears import pack_parallel_linears
from .passes.select_kernels import select_kernels
from .spec import ModelSpec
from .targets import Target
from .targets.mesh import SINGLE_DEVICE, MeshConfig

COMPILER_VERSION = "0.1.0"


def phases(
    target: Target, variant: str = "default", mesh: MeshConfig = SINGLE_DEVICE
) -> list[tuple[str, Callable[[Graph], Graph]]]:
    """mesh: a plan spread over several devices keeps parallel linears apart (a packed q/k/v weight split along
    its rows would hand each device a slice of q and none of v: compiler/sharding.py splits each one)."""
    return [
        ("infer_shapes", infer_shapes),
        ("assign_state_kinds", assign_state_kinds),
        ("hoist_layer_constants", hoist_layer_constants),
        ("pack_parallel_linears", pack_parallel_linears if not mesh.sharded else lambda g: g),
        ("defer_residual_add", defer_residual_add),
        ("fuse_add_rms_norm", fuse_add_rms_norm),
        (
            "fuse_rope_attention",
            lambda g: fuse_rope_attention(g) if target.names_kernel("rope_attention", variant) else g,
        ),
        ("fuse_gated_linear", lambda g: fuse_gated_linear(g) if target.names_kernel("gated_linear", variant) else g),
        (
            "fuse_norm_into_projection",
            lambda g: fuse_norm_into_projection(
                g, frozenset(op for op, _ in FUSED_INTO_PROJECTION.values() if target.names_kernel(op, variant))
            ),
        ),
        ("carry_split_k_partials", carry_split_k_partials),
        ("fuse_gated_mlp", lambda g: fuse_gated_mlp(g) if target.names_kernel("gated_mlp", variant) else g),
        ("reinfer_shapes", infer_shapes),
        ("select_kernels", lambda g: select_kernels(g, target, variant)),
    ]


def compile_graph(
    spec: ModelSpec,
    target: Target,
    dump_dir: Path | None = None,
    variant: str = "default",
    mesh: MeshConfig = SINGLE_DEVICE,
) -> Graph:
    graph = lower(spec)
    _dump(dump_dir, 0, "lower", graph)
    for number, (name, run) in enumerate(phases(target, variant, mesh), start=1):
        graph = run(graph)
        _dump(dump_dir, number, name, graph)
    return graph


def _dump(dump_dir: Path | None, number: int, name: str, graph: Graph) -> None:
    if dump_dir is not None:
        dump_dir.mkdir(parents=True, exist_ok=True)
        (dump_dir / f"{number:02d}-{name}.ir").write_text(graph.dump())
