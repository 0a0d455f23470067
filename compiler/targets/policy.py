"""The kernel policy: which kernel and which launch config each op takes, decided when a plan is compiled.

One KernelPolicy per target (compiler/targets/<target>.py holds it; manifest.json and the generated plan
record it). The runtime traces each step inside `use_kernel_policy(policy)` with the model's effective
policy (its target's, or an override file's: `ember serve --kernel-policy FILE`), and the ops read
`kernel_policy().<family>.<field>` while they are traced; nothing reads the environment. Outside any
`use_kernel_policy` block (an op called directly, a test) the ops see KernelPolicy(), the GPU defaults.

An override is JSON, nested or dotted (`{"attention": {"fused_rope_decode": false}}` or
`{"attention.fused_rope_decode": false}`); an unknown family or field is an error naming it. The fields
named `config` override fields of that kernel's launch config dataclass (`{"block_n": 8}`), checked when the
kernel is traced. docs/kernel_policy.md: the rule every kernel follows.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ConfigOverride = tuple[tuple[str, int], ...]  # (field, value) pairs over a launch config dataclass


@dataclass(frozen=True)
class QuantGemvPolicy:
    """GGUF-quantized weights (compiler/kernels/gguf_gemv/linear.py, compiler/kernels/gguf_gemv/)."""

    backend: str | None = None  # quant_matmul's: None = "triton" where Triton traces, else "reference"
    gemv_max_rows: int = 16  # rows up to this take the quantized GEMV; above, dequantize + XLA matmul
    # the same bound for the formats on the integer-dot kernel: its row groups read each weight tile once
    # from HBM and again from L2
    dp4a_gemv_max_rows: int = 16
    # rows up to which a weight with a dense copy still takes its quantized GEMV: packed vs copy, 2 streams
    # 1,372.0 vs 1,228.4 tok/s, 4 streams 2,287.6 vs 2,432.3 (H200, 1.5B Q4_K_M: compiler/kernels/gguf_gemv/README.md)
    dense_copy_gemv_max_rows: int = 2
    # steps of more rows than the GEMV serves, on a packed weight with no dense copy (weights.dense_copies off):
    # "dequantize" (the whole weight to the activation dtype inside the step, then XLA's matmul) or "gemm" (the
    # packed blocks dequantized per tile in registers by compiler/kernels/gguf_gemm/, tensor-core MMA), the
    # latter up to gemm_max_rows rows (above: dequantize); tools/dev/bench_quant_gemm.py measures the three forms
    many_rows: str = "dequantize"
    gemm_max_rows: int = 1 << 20
    gemm_config: ConfigOverride = ()  # over the GemmConfig gguf_gemm.pick_gemm_config picks by rows
    # decode (m <= 4) takes the "rows" kernels (gguf_gemv/rows_*.py), not the "split" ones
    # (docs/results/h200_quant_matmul_rows_variant.json, h200_quant_rows_sweep_c32c507.json)
    rows_for_decode: bool = True
    # formats whose decode GEMVs take the integer-dot kernel on int8 activations (gguf_gemv/dp4a.py); () = the
    # float kernels (docs/results/h200_dp4a_ab_plan_alone.json, h200_dp4a_q6_plan_alone_45601a6.json)
    dp4a_formats: tuple[str, ...] = ("q4_k", "q6_k")
    # a Q4_K q+k beside a Q6_K v in one dp4a launch (gguf_gemv/matmul.py quant_matmul_pair_parts;
    # docs/results/h200_plan_alone_pair_81b178b_1.5b.json, _8b.json)
    pair_launch: bool = True
    # a split-K down projection's partials summed by the next norm kernel (carry_split_k_partials;
    # docs/results/h200_plan_alone_partials_f842b9c_1.5b.json, _8b.json)
    split_k_partials: bool = True
    # int8 terms per activation (gguf_gemv/act_quant.py): 2 rounds the first term's residual again, for
    # float-level agreement of decode logits at some speed (docs/results/h200_gpu_suite_678f002_act-terms-2.json)
    act_terms: int = 1


@dataclass(frozen=True)
class Fp8GemvPolicy:
    """FP8 weights (compiler/kernels/dense_gemv/fp8.py, fp8_gemv*.py)."""

    # the Triton GEMV beat XLA's fused fp8 dot by 1.03-1.3x at one row and lost at 8
    # (docs/results/h200_fp8_gemv.json): rows up to max_rows take it
    enabled: bool = True
    max_rows: int = 1
    # one row, `in` a multiple of 4: the word loop (docs/results/h200_fp8_gemv_words_69b267c.json)
    words: bool = True
    config: ConfigOverride = ()  # over the one-row Fp8GemvConfig the rules pick


@dataclass(frozen=True)
class DenseGemvPolicy:
    """bf16 weights at decode rows (compiler/kernels/dense_gemv/dispatch.py, where DENSE_RULES measured it faster)."""

    # the 8B bf16 step's head, q/k/v, o and gate/up at one row (docs/results/h200_dense_gemv_0130688.json)
    enabled: bool = True
    max_rows: int = 1
    max_out: int | None = None  # weights of at least this many rows keep XLA's GEMM (None: any)
    config: ConfigOverride = ()  # over the DenseGemvConfig the rules pick


@dataclass(frozen=True)
class AttentionPolicy:
    """The paged attention kernels (compiler/kernels/attention/)."""

    decode_config: ConfigOverride = ()  # over DecodeAttentionConfig (bench_attention.py --sweep measures)
    # RoPE and the K/V write in one kernel (rope/kv_write.py) where XLA ran ~5 per layer (not measured apart:
    # docs/h200_log.md, "RoPE + K/V write in one kernel")
    fused_rope: bool = True
    # on all-decode steps, RoPE and the K/V write inside the split partials
    # (docs/results/h200_rope_partials_1d774ae.json: 1.161 -> 1.099 ms/step on the 1.5B)
    fused_rope_decode: bool = True
    # the combine also writes the o projection's int8 activations
    # (docs/results/h200_attention_quant_e027e08.json: 1.174 -> 1.153 ms/step on the 1.5B)
    fused_combine_quant: bool = True


@dataclass(frozen=True)
class NormPolicy:
    """RMSNorm kernels (compiler/kernels/norm/kernel.py, norm/quant_kernel.py)."""

    triton: bool = True  # one Triton kernel where XLA ran three (docs/results/h200_norms_ab_a86db15.json)
    # a norm read by one projection also writes its int8 activations
    # (docs/results/h200_fused_norm_quant_cfef150.json)
    fused_quant: bool = True
    # warps per row, for the plain norms and the quantizing ones (one reduction tree, so keep them equal: the
    # same bits): the 8B FP8 step's 63 norms took 130.6 / 125.8 us at 4 / 16 warps
    # (docs/results/h200_plan_alone_fp8_4f6229b.json); the quantizing norms of a 1.5B step 170.6 / 153.6 /
    # 146.0 us at 4 / 8 / 16 (docs/results/h200_norm_quant_warps_71ed1a5.json)
    warps: int = 16
    quant_warps: int = 16


@dataclass(frozen=True)
class SplitPolicy:
    """Packed q/k/v outputs split apart (compiler/kernels/split_columns/kernel.py)."""

    # one Triton kernel where XLA runs three slices (docs/results/h200_plan_alone_split_skip_2212847.json)
    triton: bool = True


@dataclass(frozen=True)
class GatedDeltaPolicy:
    """Gated DeltaNet's mixer and its output norm (compiler/kernels/gated_delta/gpu.py)."""

    # the fused Triton kernels (conv, norms, gates and the delta rule in one launch) where XLA runs the
    # reference's token scan
    triton: bool = True
    # prefill segments of at least this many tokens take the chunked (WY) kernel, in chunks of `chunk` tokens;
    # shorter ones the token-by-token kernel decode rows take (not measured yet: tools/dev/bench_hybrid_kernels.py)
    chunked_min_tokens: int = 64
    chunk: int = 64
    # the chunked kernel's dots: "tf32x3" (fp32's accuracy on tensor cores) or "ieee" (FMA dots, which spilled
    # ~40 KB a thread at the checkpoints' shape: tools/dev/compile_hybrid_kernels.py)
    chunked_precision: str = "tf32x3"


@dataclass(frozen=True)
class MoePolicy:
    """Routed experts (compiler/kernels/moe/gpu.py)."""

    # the fused router and the expert GEMVs reading only the chosen experts, for steps of up to
    # gemv_max_rows rows; more rows the grouped GEMM over the pairs sorted by expert (grouped; off: the
    # reference's ragged matmul). Not measured yet (tools/dev/bench_hybrid_kernels.py)
    triton: bool = True
    gemv_max_rows: int = 16
    grouped: bool = True


CPU_BLOCK_LAYOUTS = ("int8_blocks", "nibble_blocks")  # WeightPolicy.kept_layout values of the cpu kernel's form
KEPT_LAYOUTS = ("planes", *CPU_BLOCK_LAYOUTS)


@dataclass(frozen=True)
class WeightPolicy:
    """What stays packed on the device (runtime/loading/weights.py)."""

    # formats kept packed ("q4_k", "q6_k", "q8_0", "q5_0" of GGUF files, "fp8" of HF FP8 checkpoints);
    # every other tensor is dequantized at load to the activation dtype
    quantized_formats: tuple[str, ...] = ()
    # kept GGUF weights also get a dense copy for steps of more rows (gguf_gemv/layout.py DenseBacked)
    dense_copies: bool = False
    # the copies are left out at load (runtime/loading/model.py) when the weights with them would take more than
    # this share of the device memory free before loading: the rest is the KV cache's, and a model whose copies
    # alone would not fit (a 70B Q4_K_M: ~42 GB packed, ~140 GB of bf16 copies) still loads, packed
    dense_copies_max_share: float = 0.5
    # how kept GGUF weights sit on the device: "planes" (gguf_gemv/layout.py, the GPU kernels' packing),
    # "int8_blocks" (cpu_gemv/layout.py: int8 codes + block scales, the cpu kernel's; docs/results/cpu_matmul_probe.json)
    # or "nibble_blocks" (the same with Q4_K's codes two per byte)
    kept_layout: str = "planes"
    # formats of GGUF expert stacks ([E, out, in] ffn_*_exps) kept packed, as compiler/kernels/moe/packed.py lays
    # them out (no dense copy: a 30B-A3B's experts would need ~57 GB in bf16); others are dequantized at load
    packed_experts: tuple[str, ...] = ()

    def __post_init__(self):
        if not 0.0 < self.dense_copies_max_share <= 1.0:
            raise ValueError(
                f"kernel policy: weights.dense_copies_max_share must be in (0, 1], got {self.dense_copies_max_share!r}"
            )
        if self.kept_layout not in KEPT_LAYOUTS:
            raise ValueError(
                f"kernel policy: weights.kept_layout must be one of {KEPT_LAYOUTS}, got {self.kept_layout!r}"
            )


@dataclass(frozen=True)
class DeterministicPolicy:
    """How the deterministic variant keeps each row's arithmetic independent of the step it runs in
    (docs/kernel_policy.md, "Batch invariance": the rule every deterministic kernel follows)."""

    # True: every kernel of the deterministic plan computes a row the same way at every compiled shape from
    # `min_rows` token rows up, so deterministic steps take the default buckets (decode buckets and logit
    # rows raised to min_rows). False: they run in tiles of one fixed shape, `tile_decode_rows` decode rows
    # + `tile_prefill_tokens` tokens of one prefill chunk, one tile after another
    bucketed: bool = False
    min_rows: int = 1
    # True (bucketed only): deterministic decode runs ahead like default decode (the target's decode_steps per
    # device call), each step compiled as in a one-step call (runtime/execution/engine_step.py `_step_inputs`).
    # False: one decode step per device call
    run_ahead: bool = False
    # the batch-invariant matmul multiplies a GGUF weight that has a dense copy from its packed blocks in steps of
    # up to this many rows and from the copy above (the same bits either way: invariant_matmul/kernel.py); a
    # weight without a copy is always read packed. 0: the copy at every row count
    packed_max_rows: int = 0
    # True: Q4_K / Q6_K weights (kept packed, with or without a copy) multiply through int_invariant/ at every row
    # count (int8 activation blocks, exact integer block sums: a dp4a GEMV for few rows, an int8-MMA GEMM for many,
    # the same bits); groups with any other format keep the matmul above. Off until a GPU has measured it
    # (compiler/kernels/int_invariant/README.md)
    int8_blocks: bool = False
    tile_decode_rows: int = 16
    tile_prefill_tokens: int = 64


@dataclass(frozen=True)
class KernelPolicy:
    """Every kernel family's choices; a target holds one (Target.policy), the runtime traces with it."""

    quant_gemv: QuantGemvPolicy = field(default_factory=QuantGemvPolicy)
    fp8_gemv: Fp8GemvPolicy = field(default_factory=Fp8GemvPolicy)
    dense_gemv: DenseGemvPolicy = field(default_factory=DenseGemvPolicy)
    attention: AttentionPolicy = field(default_factory=AttentionPolicy)
    norms: NormPolicy = field(default_factory=NormPolicy)
    split: SplitPolicy = field(default_factory=SplitPolicy)
    gated_delta: GatedDeltaPolicy = field(default_factory=GatedDeltaPolicy)
    moe: MoePolicy = field(default_factory=MoePolicy)
    weights: WeightPolicy = field(default_factory=WeightPolicy)
    deterministic: DeterministicPolicy = field(default_factory=DeterministicPolicy)

    def to_dict(self) -> dict[str, dict[str, Any]]:
        """Nested plain values (config overrides as objects), as manifest.json records them."""
        return {
            name: {f.name: _plain(f.type, getattr(group, f.name)) for f in dataclasses.fields(group)}
            for name, group in ((family.name, getattr(self, family.name)) for family in dataclasses.fields(self))
        }

    def digest(self) -> str:
        """A stable text of every field (the executable cache's key, the trace wrapper's)."""
        return json.dumps(self.to_dict(), sort_keys=True)

    def overridden(self, overrides: Mapping[str, Any]) -> KernelPolicy:
        """This policy with `overrides` (nested or dotted keys, JSON values) applied; unknown keys refused."""
        families: dict[str, dict[str, Any]] = {}
        for key, value in _dotted(overrides).items():
            family, _, name = key.partition(".")
            if family not in _FAMILIES:
                raise ValueError(f"kernel policy: unknown family {family!r} (known: {', '.join(_FAMILIES)})")
            known = {f.name: f.type for f in dataclasses.fields(_FAMILIES[family])}
            if name not in known:
                raise ValueError(f"kernel policy: unknown field {key!r} (known: {', '.join(sorted(known))})")
            families.setdefault(family, {})[name] = _coerce(key, known[name], value)
        return dataclasses.replace(
            self, **{name: dataclasses.replace(getattr(self, name), **changes) for name, changes in families.items()}
        )


def _plain(kind: str, value: Any) -> Any:
    if kind == "ConfigOverride":
        return dict(value)
    return list(value) if isinstance(value, tuple) else value


_FAMILIES = {f.name: f.default_factory for f in dataclasses.fields(KernelPolicy)}


def _dotted(overrides: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in overrides.items():
        if isinstance(value, Mapping) and not (prefix or "." in key) and key in _FAMILIES:
            flat.update(_dotted(value, f"{key}."))
        else:
            flat[prefix + key] = value
    return flat


def _coerce(key: str, kind: str, value: Any) -> Any:
    """value (a JSON value) as the field's type, or a ValueError naming the key."""
    ok = {
        "bool": isinstance(value, bool),
        "int": isinstance(value, int) and not isinstance(value, bool),
        "int | None": value is None or (isinstance(value, int) and not isinstance(value, bool)),
        "float": isinstance(value, int | float) and not isinstance(value, bool),
        "str": isinstance(value, str),
        "str | None": value is None or isinstance(value, str),
        "tuple[str, ...]": isinstance(value, list | tuple) and all(isinstance(v, str) for v in value),
        "ConfigOverride": isinstance(value, Mapping)
        and all(isinstance(v, int) and not isinstance(v, bool) for v in value.values()),
    }[kind]
    if not ok:
        raise ValueError(f"kernel policy: {key} must be {kind}, got {value!r}")
    if kind == "tuple[str, ...]":
        return tuple(value)
    if kind == "float":
        return float(value)
    return tuple(sorted(value.items())) if kind == "ConfigOverride" else value


def load_policy_file(path: str | Path, base: KernelPolicy) -> KernelPolicy:
    """base with the overrides of the JSON file at `path` (an object: nested or dotted keys)."""
    overrides = json.loads(Path(path).read_text())
    if not isinstance(overrides, dict):
        raise ValueError(f"{path}: a kernel policy file holds a JSON object, got {type(overrides).__name__}")
    try:
        return base.overridden(overrides)
    except ValueError as error:
        raise ValueError(f"{path}: {error}") from None


def parse_assignments(text: str) -> dict[str, Any]:
    """ "family.field=value,family.field=value" (values JSON, commas inside [] / {} kept; a bare word is a
    string) -> dotted overrides: the command-line form of an override (tools/dev/profile_step.py --variants)."""
    overrides: dict[str, Any] = {}
    for item in filter(None, (part.strip() for part in _top_level_split(text))):
        key, sep, raw = item.partition("=")
        if not sep:
            raise ValueError(f"kernel policy: {item!r} is not family.field=value")
        try:
            overrides[key.strip()] = json.loads(raw)
        except json.JSONDecodeError:
            overrides[key.strip()] = raw.strip()
    return overrides


def _top_level_split(text: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        depth += (char in "[{") - (char in "]}")
        if char == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    return parts + [text[start:]]


_ACTIVE: list[KernelPolicy] = []


def kernel_policy() -> KernelPolicy:
    """The policy of the plan being traced (KernelPolicy() outside any use_kernel_policy block)."""
    return _ACTIVE[-1] if _ACTIVE else _DEFAULT


@contextlib.contextmanager
def use_kernel_policy(policy: KernelPolicy) -> Iterator[KernelPolicy]:
    """Trace inside the block with `policy` (jit caches what was traced: a new policy needs a new trace)."""
    _ACTIVE.append(policy)
    try:
        yield policy
    finally:
        _ACTIVE.pop()


@contextlib.contextmanager
def overriding(overrides: Mapping[str, Any]) -> Iterator[KernelPolicy]:
    """use_kernel_policy of the current policy with `overrides` applied (experiments, tests)."""
    with use_kernel_policy(kernel_policy().overridden(overrides)) as policy:
        yield policy


_DEFAULT = KernelPolicy()


@functools.cache
def with_kernel_policy(policy: KernelPolicy, fn: Callable) -> Callable:
    """fn traced inside use_kernel_policy(policy): what a step function jits (one wrapper per policy and fn, so
    jit's cache keeps its hits)."""

    @functools.wraps(fn)
    def traced(*args, **kwargs):
        with use_kernel_policy(policy):
            return fn(*args, **kwargs)

    return traced
