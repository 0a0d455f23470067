"""Compile a spec for a target and write its generated plan (what `ember compile` runs)."""

from __future__ import annotations

from pathlib import Path

from .codegen.emit import generate, write_plan
from .passes.select_kernels import VARIANTS
from .pipeline import compile_graph
from .spec import load_spec
from .targets import get_target
from .targets.mesh import SINGLE_DEVICE, MeshConfig

GENERATED_DIR = Path(__file__).resolve().parent.parent / "generated"


def compile_spec(
    spec_path: str | Path,
    target_name: str,
    out_root: Path = GENERATED_DIR,
    dump_dir: Path | None = None,
    mesh: MeshConfig = SINGLE_DEVICE,
) -> list[Path]:
    """Writes out_root/<target>/<arch>/. A mesh of several devices gets its own plans (no packed parallel
    linears) whose manifest records the mesh and each weight's split: write them to their own out_root."""
    spec = load_spec(spec_path)
    target = get_target(target_name)
    plans = {
        variant: generate(
            compile_graph(
                spec, target, dump_dir=dump_dir if variant == "default" else None, variant=variant, mesh=mesh
            ),
            spec,
            target,
            variant,
            mesh,
        )
        for variant in VARIANTS
    }
    return write_plan(plans, out_root / target.name / spec.arch)
