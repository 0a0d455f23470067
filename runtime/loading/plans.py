"""Load the generated plan of an architecture for a target, checking it matches its spec."""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from ...compiler.spec import ModelSpec

GENERATED_DIR = Path(__file__).resolve().parents[2] / "generated"


class PlanError(RuntimeError):
    pass


@dataclass(frozen=True)
class LoadedPlan:
    arch: str
    target: str
    module: ModuleType  # the generated plan.py; module.forward(dims, params, state, batch): state per layer by kind
    manifest: dict


def load_plan(
    spec: ModelSpec, target: str, generated_dir: Path = GENERATED_DIR, variant: str = "default"
) -> LoadedPlan:
    folder = generated_dir / target / spec.arch
    manifest_path, plan_path = folder / "manifest.json", folder / "plan.py"
    if not manifest_path.exists() or not plan_path.exists():
        raise PlanError(
            f"no generated plan for {spec.arch} on {target} in {folder}; "
            f"run `ember compile --spec {spec.path} --target {target}`"
        )
    manifest = json.loads(manifest_path.read_text())
    if manifest.get("spec_sha256") != spec.source_sha256:
        raise PlanError(
            f"{folder} was generated from another version of {spec.path.name}; "
            f"run `ember compile --spec {spec.path} --target {target}`"
        )
    filename = manifest.get("variants", {}).get(variant)
    if filename is None:
        raise PlanError(f"{folder} has no {variant!r} plan; run `ember compile --spec {spec.path} --target {target}`")
    plan_path = folder / filename
    module_name = f"ember.generated.{target}.{spec.arch}.{plan_path.stem}"
    loader_spec = importlib.util.spec_from_file_location(module_name, plan_path)
    module = importlib.util.module_from_spec(loader_spec)
    loader_spec.loader.exec_module(module)
    return LoadedPlan(spec.arch, target, module, manifest)
