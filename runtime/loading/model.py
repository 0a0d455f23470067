"""A loaded model: spec + resolved dims + parameters on device + the plan's jitted forward."""

from __future__ import annotations

import functools
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ...compiler.batch import StepBatch
from ...compiler.kernels.moe.packed import EXPERT_FORMATS
from ...compiler.spec import ModelSpec, all_specs
from ...compiler.targets import Target, get_target, host_cpu
from ...compiler.targets.mesh import SINGLE_DEVICE, MeshConfig
from ...compiler.targets.policy import CPU_BLOCK_LAYOUTS, KernelPolicy, load_policy_file, with_kernel_policy
from ..state.kinds import PagedKind, StateKind, layer_state_kinds, paged_kinds, slot_array_shapes, slot_kinds
from .checkpoint import Checkpoint, open_checkpoint
from .device_values import dense_copier, device_placer
from .dims import Dims, ResolvedModel, resolve
from .formats.errors import CheckpointError
from .known_models import cache_dir
from .memory_plan import GB, check_fits, free_device_bytes, keeps_dense_copies, planned_weight_bytes
from .mtp import MtpParams, load_mtp
from .plans import GENERATED_DIR, LoadedPlan, load_plan
from .prepared_weights import PreparedWeights, entry_key
from .sharding import Placement, constrain_state, make_placement, mesh_plans
from .weights import KEPT_FORMATS, Params, load_params


@dataclass
class Model:
    spec: ModelSpec
    checkpoint: Checkpoint
    resolved: ResolvedModel
    plan: LoadedPlan
    params: Params
    dtype: Any  # activation / KV dtype
    # the kernel policy every step is traced with: the target's, or an override file's (effective_policy)
    policy: KernelPolicy
    generated_dir: Path = GENERATED_DIR  # where the plan was loaded from
    # the checkpoint's multi-token-prediction module (runtime/loading/mtp.py), None when it has none
    mtp: MtpParams | None = None
    # where the arrays live on a device mesh (runtime/loading/sharding.py); None: one device, as always
    placement: Placement | None = None
    _traced: dict = field(default_factory=dict, repr=False)  # (forward, policy) -> its traced wrapper, made once

    @property
    def mesh(self) -> MeshConfig:
        return SINGLE_DEVICE if self.placement is None else self.placement.config

    @property
    def has_mtp(self) -> bool:
        return self.mtp is not None

    @property
    def mtp_layers(self) -> int:
        """How many MTP layers the checkpoint carries (0: none)."""
        return 0 if self.mtp is None else len(self.mtp.layers)

    def traced(self, forward: Callable) -> Callable:
        """A plan's forward that traces inside this model's kernel policy (what a step function jits); on a
        device mesh the state it returns keeps the placement of the state it was given."""
        traced = with_kernel_policy(self.policy, forward)
        if self.placement is None:
            return traced
        key = (forward, self.policy)
        if key not in self._traced:
            constrain = constrain_state(self.placement, self._paged_layers())

            def sharded(dims, params, kv, batch):
                logits, kv = traced(dims, params, kv, batch)
                return logits, constrain(kv)

            self._traced[key] = sharded
        return self._traced[key]

    def _paged_layers(self) -> tuple[bool, ...]:
        slots = {k.name for k in self.slot_kinds}
        return tuple(kind is not None and kind not in slots for kind in self.layer_state_kinds)

    def deterministic_plan(self) -> LoadedPlan:
        """The plan variant with batch-invariant kernels (deterministic mode)."""
        return load_plan(self.spec, self.plan.target, self.generated_dir, variant="deterministic")

    @property
    def dims(self) -> Dims:
        return self.resolved.dims

    @property
    def paged_kinds(self) -> tuple[PagedKind, ...]:
        """The plan's paged KV state kinds (full attention, sliding windows) with this checkpoint's windows."""
        return paged_kinds(self.plan.manifest, self.dims)

    @property
    def slot_kinds(self) -> tuple[StateKind, ...]:
        """The plan's slot state kinds (e.g. a recurrent layer's conv window and delta-rule matrix)."""
        return slot_kinds(self.plan.manifest)

    @property
    def layer_state_kinds(self) -> tuple[str | None, ...]:
        """The state kind of each layer (None: the layer keeps no state)."""
        return layer_state_kinds(self.plan.manifest, self.resolved.layer_kinds)

    def _slot_shapes(self) -> dict[str, dict]:
        """Slot kind name -> its arrays' (shape, dtype) per request (slot_array_shapes)."""
        return {k.name: slot_array_shapes(k, self.dims) for k in self.slot_kinds}

    def slot_bytes(self) -> int:
        """Bytes of one request's slot state over every layer (what one more concurrent sequence costs)."""
        total = 0
        per_kind = self._slot_shapes()
        for kind in self.layer_state_kinds:
            for shape, dtype in per_kind.get(kind, {}).values():
                total += int(np.prod(shape)) * jnp.dtype(dtype).itemsize
        return total

    def new_kv(
        self, num_blocks: int | Mapping[str, int], block_size: int, dtype=None, num_slots: int = 1
    ) -> list[tuple[jax.Array, ...]]:
        """Each layer's state, by its kind: a paged kind's (k, v) pools, each [num_blocks of the kind,
        block_size, hkv, dh] (num_blocks: one count for every kind, or one per kind) in `dtype` (default: the
        activation dtype); a slot kind's arrays, each [num_slots, *shape] in the manifest's dtype; () for a
        layer without state."""
        d = self.dims
        dtype = self.dtype if dtype is None else dtype
        slots = self._slot_shapes()
        # on a device mesh: pools split over their KV heads (or replicated), slot state replicated
        paged_at = None if self.placement is None else self.placement.paged_sharding()
        slot_at = None if self.placement is None else self.placement.sharding()
        pools = []
        for kind in self.layer_state_kinds:
            if kind is None:
                pools.append(())
            elif kind in slots:
                pools.append(
                    tuple(jnp.zeros((num_slots, *shape), dt, device=slot_at) for shape, dt in slots[kind].values())
                )
            else:
                blocks = num_blocks if isinstance(num_blocks, int) else num_blocks[kind]
                shape = (blocks, block_size, d.hkv, d.dh)
                pools.append((jnp.zeros(shape, dtype, device=paged_at), jnp.zeros(shape, dtype, device=paged_at)))
        return pools

    def forward(self, kv, batch: StepBatch):
        """One step. Returns (logits [R, vocab], kv). kv is donated: do not reuse the old one."""
        return _jitted(self.traced(self.plan.module.forward))(self.dims, self.params, kv, batch)


_JIT_CACHE: dict[int, Any] = {}


def _jitted(forward):
    key = id(forward)
    if key not in _JIT_CACHE:
        _JIT_CACHE[key] = jax.jit(forward, static_argnums=0, donate_argnums=2)
    return _JIT_CACHE[key]


def spec_for_checkpoint(ckpt: Checkpoint) -> ModelSpec:
    for spec in all_specs():
        if ckpt.format == "hf" and ckpt.architecture in spec.hf_architectures:
            return spec
        if ckpt.format == "gguf" and ckpt.architecture == spec.gguf_architecture:
            return spec
    known = sorted(
        {a for s in all_specs() for a in (s.hf_architectures if ckpt.format == "hf" else (s.gguf_architecture,))}
    )
    raise CheckpointError(ckpt.path, f"architecture {ckpt.architecture!r} has no spec (supported: {', '.join(known)})")


def enable_compilation_cache() -> None:
    """Keep compiled plans on disk (JAX's persistent cache) so a restart skips XLA compilation. One folder per
    host CPU: JAX's key does not see the CPU's instruction set that XLA:CPU compiled for (targets/host_cpu.py)."""

    if jax.config.jax_compilation_cache_dir is None:
        folder = cache_dir() / "jax-cache" / f"host-{host_cpu.fingerprint()}"
        jax.config.update("jax_compilation_cache_dir", str(folder))
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)


PRECISIONS = ("fast", "exact")
# what "exact" changes in any policy: every weight dequantized at load to the activation dtype (float32 on the cpu
# target: the plans that agree with transformers to 1e-4), so every projection is the reference matmul
EXACT_WEIGHTS = {"weights.quantized_formats": [], "weights.dense_copies": False, "weights.packed_experts": []}


def effective_policy(
    target: str | Target, override: KernelPolicy | str | Path | None = None, precision: str = "fast"
) -> KernelPolicy:
    """The kernel policy a model of `target` runs: `override` itself (a KernelPolicy), the target's with an
    override file's fields (a path: `ember serve --kernel-policy`), or the target's (KernelPolicy() for a
    target this checkout does not describe: every weight dequantized); precision "exact" then keeps no weight
    quantized (EXACT_WEIGHTS; `--precision exact`)."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if isinstance(override, KernelPolicy):
        policy = override
    else:
        described = _described(target)
        policy = described.policy if described else KernelPolicy()
        if override is not None:
            policy = load_policy_file(override, policy)
    if precision == "exact":
        policy = policy.overridden(EXACT_WEIGHTS)
    unknown = [f for f in policy.weights.quantized_formats if f not in KEPT_FORMATS]
    if unknown:
        raise ValueError(
            f"kernel policy: weights.quantized_formats names unknown format(s) {unknown} "
            f"(known: {', '.join(KEPT_FORMATS)})"
        )
    unknown = [f for f in policy.weights.packed_experts if f not in EXPERT_FORMATS]
    if unknown:
        raise ValueError(
            f"kernel policy: weights.packed_experts names unknown format(s) {unknown} "
            f"(known: {', '.join(EXPERT_FORMATS)})"
        )
    return policy


def _described(target: str | Target) -> Target | None:
    """The Target itself, or the one this checkout describes by that name; None for plans generated for a
    target it does not describe."""
    if isinstance(target, Target):
        return target
    try:
        return get_target(target)
    except ValueError:
        return None


def load_model(
    path: str | Path | Checkpoint,
    *,
    target: str | Target = "cpu",
    progress: bool = False,
    generated_dir: Path = GENERATED_DIR,
    activation_dtype: str | None = None,
    kernel_policy: KernelPolicy | str | Path | None = None,
    free_bytes: int | None = None,
    with_mtp: bool = True,
    precision: str = "fast",
    mesh: MeshConfig = SINGLE_DEVICE,
    prepared_cache: bool = False,
) -> Model:
    """A model from a checkpoint path (GGUF file, HF folder) or an opened Checkpoint.
    activation_dtype: run the plan in this dtype instead of its target's (e.g. the cpu target in bfloat16, to
    compare two targets at one precision).

    target: a target name, or a Target (its plan must exist under generated_dir/<name>/); GGUF tensors
    in the target's `quantized_formats` stay quantized on the device (with a dense copy beside them where the
    target keeps `dense_copies`), expert stacks in its `packed_experts` stay packed (no copy), the rest become the plan's activation dtype: the target's kernel policy's
    `weights`, which, like every kernel choice, `kernel_policy` may override (effective_policy).
    free_bytes: the device memory the weights may take (default: what a GPU has free; no check on the host CPU);
    a model whose weights need more fails here, before any tensor is read or allocated (memory_plan.py). Dense
    copies (weights.dense_copies) are left out, with a line on stderr, where the weights with them would take more
    than weights.dense_copies_max_share of it: Model.policy then says dense_copies false.
    with_mtp: load the checkpoint's MTP module when it has one (Model.mtp; one more decoder layer's weights);
    False leaves it on disk (a server that does not speculate with it).
    precision: "fast" (the target's policy) or "exact" (no weight kept quantized: the reference path that
    agrees with transformers; on the cpu target every weight fp32).
    mesh: spread the model over this many devices of the host (runtime/loading/sharding.py): its plans are
    compiled for the mesh and its weights placed split; the one-device mesh is the path above, unchanged.
    prepared_cache: on the cpu backend (one device), map the parameters back from the prepared-weights cache
    when an entry matches, else load them and write one on a background thread (prepared_weights.py)."""
    enable_compilation_cache()
    policy = effective_policy(target, kernel_policy, precision)
    ckpt = path if isinstance(path, Checkpoint) else open_checkpoint(path)
    spec = spec_for_checkpoint(ckpt)
    resolved = resolve(spec, ckpt)
    target_name = target.name if isinstance(target, Target) else target
    if mesh.sharded:
        generated_dir = mesh_plans(spec, target_name, mesh)
    plan = load_plan(spec, target_name, generated_dir)
    placement = make_placement(mesh, plan.manifest, resolved.dims) if mesh.sharded else None
    dtype = jnp.dtype(activation_dtype or plan.manifest["activation_dtype"])
    weights = policy.weights
    # expert stacks stay packed on one device (the mesh's sharding splits float stacks along experts)
    packed_experts = weights.packed_experts if placement is None else ()
    # bytes with / without the copies, each planned at most once (the line below reuses them); a mesh: one device's
    planned = functools.cache(
        lambda copies: planned_weight_bytes(
            spec,
            plan.manifest,
            ckpt,
            resolved,
            dtype,
            weights.quantized_formats,
            copies,
            None if placement is None else placement.shards,
            packed_experts,
            weights.kept_layout,
        )
    )
    free = free_device_bytes() if free_bytes is None else free_bytes
    copies, needed = keeps_dense_copies(planned, weights, free)
    if copies != weights.dense_copies:
        print(
            f"ember: no dense copies of the quantized weights: with them the weights would take "
            f"{planned(True) / GB:.2f} GB, over {weights.dense_copies_max_share:.0%} of the {free / GB:.2f} GB free "
            f"(weights.dense_copies_max_share); steps of many rows read the packed blocks",
            file=sys.stderr,
            flush=True,
        )
        policy = policy.overridden({"weights.dense_copies": False})
    if free is not None:
        check_fits(needed, free, str(ckpt.path))
    place = device_placer(dtype, policy.weights.kept_layout)  # the target's layout for the MTP module's weights too
    prepared = None
    if prepared_cache and placement is None and jax.default_backend() == "cpu":
        key = entry_key(ckpt.path, spec.path, plan.manifest, policy.weights, dtype, target_name)
        prepared = PreparedWeights.for_model(cache_dir() / "prepared-weights", Path(ckpt.path).name, key)
    if policy.weights.kept_layout in CPU_BLOCK_LAYOUTS and policy.weights.quantized_formats:
        # its FFI handler registered now: a warm start loads step executables that call it without tracing the
        # op that would otherwise register it (the first one failed to load and was compiled again)
        from ...compiler.kernels.cpu_gemv import native

        native.available()
    params = _read_prepared(prepared)
    if params is None:
        params = _load_params(spec, plan, ckpt, resolved, place, policy, dtype, packed_experts, placement, progress)
        if prepared is not None and prepared.limit:
            prepared.write_in_background(params)
    mtp = None
    if with_mtp:
        mtp = load_mtp(
            spec,
            plan.manifest,
            ckpt,
            resolved,
            params.constants,
            to_device=place,
            keep_formats=policy.weights.quantized_formats,
        )
    return Model(spec, ckpt, resolved, plan, params, dtype, policy, generated_dir, mtp, placement)


def _read_prepared(prepared: PreparedWeights | None) -> Params | None:
    if prepared is None:
        return None
    started = time.perf_counter()
    params = prepared.read()
    if params is not None:
        seconds = time.perf_counter() - started
        print(f"ember: weights mapped from {prepared.path} in {seconds:.1f} s", file=sys.stderr, flush=True)
    return params


def _load_params(spec, plan, ckpt, resolved, place, policy, dtype, packed_experts, placement, progress) -> Params:
    """The parameters read and converted from the checkpoint (load_params), with a progress bar."""
    bar = None
    if progress:
        from tqdm import tqdm

        total = len(plan.manifest["global_weights"]) + int(resolved.dims.layers)
        bar = tqdm(total=total, desc="loading weights", unit="part", leave=False)
    params = load_params(
        spec,
        plan.manifest,
        ckpt,
        resolved,
        to_device=place,
        progress=bar,
        keep_formats=policy.weights.quantized_formats,
        keep_experts=packed_experts,
        dense_copy=dense_copier(dtype) if policy.weights.dense_copies else None,
        shard=None if placement is None else placement.shard(place, dtype, policy.weights.kept_layout),
    )
    if placement is not None:  # layer constants (RoPE frequencies, windows) on every device
        params = params._replace(constants=placement.replicate(params.constants))
    if bar is not None:
        bar.close()
    return params
