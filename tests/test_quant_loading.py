"""Loading GGUF weights kept quantized (Target.quantized_formats): a model loaded that way computes the
logits of the dequantizing load within fp32 rounding, on tiny GGUF files written to disk (random
blocks in Q4_K / Q6_K / Q8_0 / Q5_0 / F32, llama's q/k row permutation, tied and untied heads)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import gguf
import jax
import numpy as np
import pytest
from gguf_test_data import write_gguf
from tiny_configs import TINY_LLAMA

from ember.compiler.codegen.emit import generate, write_plan
from ember.compiler.kernels.gguf_gemv import DenseBacked, QuantizedWeight, WeightGroup, dequantize
from ember.compiler.passes.select_kernels import VARIANTS
from ember.compiler.pipeline import compile_graph
from ember.compiler.spec import spec_for_arch
from ember.compiler.targets import get_target
from ember.compiler.targets.policy import KernelPolicy, overriding
from ember.runtime.execution.sequence_runner import SequenceRunner
from ember.runtime.loading.checkpoint import open_checkpoint
from ember.runtime.loading.dims import resolve
from ember.runtime.loading.model import load_model
from ember.runtime.loading.synthetic_gguf import synthetic_gguf_checkpoint
from ember.runtime.loading.weights import WeightLoader

KEPT = ("q4_k", "q6_k", "q8_0")
_QUANT = "ember.compiler.kernels.gguf_gemv.linear"
# the cpu target (fp32 reference ops) with the quantized-weight kernels and every GGUF format kept
CPU_QUANT = dataclasses.replace(
    get_target("cpu"),
    name="cpu_quant",
    # the GPU kernels' layout, through their reference backend (the cpu target's own int8 blocks: cpu_gemv)
    policy=get_target("cpu").policy.overridden({"weights.quantized_formats": KEPT, "weights.kept_layout": "planes"}),
    kernels={
        **get_target("cpu").kernels,
        "linear": f"{_QUANT}:linear",
        "linear_split": f"{_QUANT}:linear_split",
        "embedding": f"{_QUANT}:embedding",
    },
)

MODELS = {
    # tied head (token_embd Q6_K read by the gather and the LM head); layer 1: q Q4_K + k Q5_0 (kept when
    # q5_0 is, else a float part) + v Q6_K; layer 0: gate Q4_K + up Q8_0
    "qwen2": dict(
        config={**TINY_LLAMA, "tie_word_embeddings": True},
        types={"blk.1.attn_k.weight": "Q5_0", "blk.0.ffn_up.weight": "Q8_0"},
    ),
    # untied Q6_K head, q/k rows permuted in the file (unpermute_rotary on raw block rows)
    "llama": dict(config={**TINY_LLAMA, "tie_word_embeddings": False}, types={}),
}


def _write_tiny_gguf(arch: str, path: Path) -> Path:
    ckpt = synthetic_gguf_checkpoint(spec_for_arch(arch), MODELS[arch]["config"], seed=3, types=MODELS[arch]["types"])
    value_types = {str: gguf.GGUFValueType.STRING, int: gguf.GGUFValueType.UINT32, float: gguf.GGUFValueType.FLOAT32}
    metadata = {
        key: (value, value_types[type(value)]) for key, value in ckpt.metadata.items() if key != "general.architecture"
    }
    tensors = {name: (info.ggml_type, ckpt.raw(name), info.shape) for name, info in ckpt._gguf.tensors.items()}
    return write_gguf(path, tensors, metadata, arch=spec_for_arch(arch).gguf_architecture)


@pytest.fixture(scope="module")
def quant_plans(tmp_path_factory) -> Path:
    """Plans of the test-local target, generated into a temporary folder."""
    root = tmp_path_factory.mktemp("generated")
    for arch in MODELS:
        spec = spec_for_arch(arch)
        plans = {v: generate(compile_graph(spec, CPU_QUANT, variant=v), spec, CPU_QUANT, v) for v in VARIANTS}
        write_plan(plans, root / CPU_QUANT.name / arch)
    return root


@pytest.fixture(scope="module", params=list(MODELS))
def tiny_gguf(request, tmp_path_factory) -> tuple[str, Path]:
    return request.param, _write_tiny_gguf(request.param, tmp_path_factory.mktemp("gguf") / f"{request.param}.gguf")


@pytest.mark.parametrize(
    "dense_copies, formats",
    [(False, KEPT), (True, KEPT), (False, KEPT + ("q5_0",))],
    ids=["kept", "kept+dense", "kept+q5_0"],
)
def test_kept_formats_give_the_dequantizing_loads_logits(tiny_gguf, quant_plans, dense_copies, formats):
    arch, path = tiny_gguf
    exact = load_model(path, target="cpu", precision="exact")
    assert all(isinstance(v, np.ndarray) or hasattr(v, "dtype") for v in exact.params.layers[0].values())
    with overriding({"quant_gemv.backend": "reference"}):
        policy = CPU_QUANT.policy.overridden({"weights": {"dense_copies": dense_copies, "quantized_formats": formats}})
        target = dataclasses.replace(CPU_QUANT, policy=policy)
        kept = load_model(path, target=target, generated_dir=quant_plans)
        if dense_copies:
            _check_dense_copies(kept)
        _check_layout(arch, kept, formats)
        tokens = [int(t) for t in np.random.default_rng(0).integers(3, 320, 22)]
        # the exact logits of all 22 positions from one prefill (one compiled shape for the reference)
        want = SequenceRunner(exact, 64).prefill(tokens, all_logits=True)
        runner = SequenceRunner(kept, 64)
        _close(runner.prefill(tokens[:-1], all_logits=True), want[:-1])  # 21 rows: dequantize, or the copies
        _close(runner.decode(tokens[-1]), want[-1])  # 1 row: the GEMV path
    assert kept.deterministic_plan().target == CPU_QUANT.name


def _close(got: np.ndarray, want: np.ndarray) -> None:
    scale = float(np.abs(want).max())
    print(f"max |diff| {np.abs(got - want).max():.3g} of max |logit| {scale:.3g}")
    assert scale > 0.1  # the comparison sees real signal
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * scale)


def _check_dense_copies(model) -> None:
    """Every kept weight a step reads whole is paired with its dequantized copy (bit-equal to dequantizing
    the kept form); the embedding table, only gathered from, is not."""
    layers = model.params.layers
    for name in ("attn_q+attn_k+attn_v.weight", "attn_output.weight", "ffn_gate+ffn_up.weight", "ffn_down.weight"):
        for layer in layers:
            pair = layer[name]
            assert isinstance(pair, DenseBacked) and pair.dense.shape == pair.shape
            parts = pair.kept.parts if isinstance(pair.kept, WeightGroup) else (pair.kept,)
            want = np.concatenate([np.asarray(dequantize(p) if isinstance(p, QuantizedWeight) else p) for p in parts])
            np.testing.assert_array_equal(np.asarray(pair.dense), want)
    assert isinstance(model.params.globals["output.weight"], DenseBacked)
    assert not isinstance(model.params.globals["token_embd.weight"], DenseBacked)
    assert not isinstance(layers[0]["ffn_norm.weight"], DenseBacked)


def _check_layout(arch: str, model, formats: tuple[str, ...]) -> None:
    """What stayed quantized: so the equality above cannot hold by everything being float."""

    def kept(entry):
        return {k: v.kept if isinstance(v, DenseBacked) else v for k, v in entry.items()}

    g, layer0, layer1 = kept(model.params.globals), kept(model.params.layers[0]), kept(model.params.layers[1])
    qkv = "attn_q+attn_k+attn_v.weight"
    assert isinstance(layer0[qkv], QuantizedWeight) and layer0[qkv].format == "q4_k"  # one format: concatenated
    assert isinstance(layer1[qkv], WeightGroup)  # v is Q6_K: a group
    assert isinstance(layer1["ffn_down.weight"], QuantizedWeight) and layer1["ffn_down.weight"].format == "q6_k"
    assert not isinstance(layer0["ffn_norm.weight"], (QuantizedWeight, WeightGroup))
    assert isinstance(g["output.weight"], QuantizedWeight) and g["output.weight"].format == "q6_k"
    if arch == "qwen2":
        assert [p.format if isinstance(p, QuantizedWeight) else "float" for p in layer1[qkv].parts] == [
            "q4_k",
            "q5_0" if "q5_0" in formats else "float",
            "q6_k",
        ]
        assert [p.format for p in layer0["ffn_gate+ffn_up.weight"].parts] == ["q4_k", "q8_0"]
        assert g["token_embd.weight"].format == "q6_k" and g["token_embd.weight"].dtype == "float32"  # tied
    else:  # q and k (both Q4_K) merged into one part beside the Q6_K v: two matmuls, not three
        assert [p.format for p in layer1[qkv].parts] == ["q4_k", "q6_k"]
        assert [p.shape[0] for p in layer1[qkv].parts] == [64 * 4 + 64 * 2, 64 * 2]
        assert g["token_embd.weight"].format == "q4_k"


def test_unpermute_on_raw_block_rows_equals_dequantize_then_unpermute(tmp_path):
    path = _write_tiny_gguf("llama", tmp_path / "llama.gguf")
    spec = spec_for_arch("llama")
    ckpt = open_checkpoint(path)
    loader = WeightLoader(spec, ckpt, resolve(spec, ckpt), keep_formats=KEPT)
    for name in ("blk.0.attn_q.weight", "blk.1.attn_k.weight", "blk.0.attn_v.weight"):
        raw = loader.fetch_raw(name)
        assert raw is not None and raw.shape == ckpt.tensor_shape(name)
        np.testing.assert_array_equal(np.asarray(jax.jit(dequantize)(raw.packed())), loader.fetch(name))
    # the transform moved rows: the file's own row order differs
    q = loader.fetch("blk.0.attn_q.weight")
    assert not np.array_equal(q, ckpt.load("blk.0.attn_q.weight"))


def test_fetch_raw_only_for_kept_matrices(tmp_path):
    path = _write_tiny_gguf("qwen2", tmp_path / "qwen2.gguf")
    spec = spec_for_arch("qwen2")
    ckpt = open_checkpoint(path)
    resolved = resolve(spec, ckpt)
    kept = WeightLoader(spec, ckpt, resolved, keep_formats=KEPT)
    assert kept.fetch_raw("blk.1.attn_k.weight") is None  # Q5_0: no device layout
    assert kept.fetch_raw("blk.0.attn_q.bias") is None  # F32 vector
    assert kept.fetch_raw("output.weight").format == "q6_k"  # tied: follows token_embd
    only_q4 = WeightLoader(spec, ckpt, resolved, keep_formats=("q4_k",))
    assert only_q4.fetch_raw("blk.1.attn_v.weight") is None  # Q6_K, not kept by this target
    assert WeightLoader(spec, ckpt, resolved).fetch_raw("blk.0.attn_q.weight") is None  # cpu: dequantize all
    with pytest.raises(ValueError, match="no device layout"):
        WeightLoader(spec, ckpt, resolved, keep_formats=("q4k",))


def test_the_kernel_policy_chooses_which_weights_stay_packed(tmp_path):
    import json

    from ember.runtime.loading.model import effective_policy

    weights = lambda target, override=None: effective_policy(target, override).weights  # noqa: E731
    # the h200 default: FP8 stays FP8, GGUF blocks stay packed, with dense copies; the cpu's: GGUF blocks as codes
    # (Q4_K's two per byte) + block scales (its native kernel's layout), no copies; precision "exact": nothing kept
    assert weights("h200").quantized_formats == ("fp8", "q4_k", "q6_k", "q8_0", "q5_0", "nvfp4")
    assert weights("h200").dense_copies and weights("h200").kept_layout == "planes"
    assert weights("cpu").quantized_formats == ("q4_k", "q6_k", "q8_0", "q5_0") and not weights("cpu").dense_copies
    assert weights("cpu").kept_layout == "nibble_blocks"
    for target in ("cpu", "h200"):
        exact = effective_policy(target, precision="exact").weights
        assert exact.quantized_formats == () and not exact.dense_copies and exact.packed_experts == ()
    override = tmp_path / "policy.json"
    override.write_text(
        json.dumps({"weights": {"quantized_formats": ["q4_k", "q6_k", "fp8"]}, "weights.dense_copies": False})
    )
    # expert stacks kept packed (moe/packed.py): an opt-in, none by default
    assert weights("h200", override) == type(weights("h200"))(
        quantized_formats=("q4_k", "q6_k", "fp8"), dense_copies=False, kept_layout="planes", packed_experts=()
    )
    override.write_text(json.dumps({"weights.packed_experts": ["q4_k", "fp8"]}))
    with pytest.raises(ValueError, match="packed_experts.*fp8"):
        weights("h200", override)
    override.write_text(json.dumps({"weights.quantized_formats": ["q5_9"]}))
    with pytest.raises(ValueError, match="q5_9"):
        weights("h200", override)
    override.write_text(json.dumps({"weights.dense_copies": "yes"}))
    with pytest.raises(ValueError, match="weights.dense_copies"):
        weights("h200", override)


def test_a_dense_backed_weight_takes_its_kept_form_for_few_rows_and_its_copy_for_more():
    from ember.compiler.kernels.gguf_gemv import linear as linear_quant

    rng = np.random.default_rng(5)
    from ember.compiler.kernels.gguf_gemv import pack, random_gguf_bytes

    w = pack(random_gguf_bytes(rng, "q4_k", (64, 256), realistic=True), "q4_k", (64, 256))
    # a copy that differs from the kept form, so the output shows which one a call read
    pair = DenseBacked(w, np.asarray(dequantize(w)) + 1.0)
    bound = KernelPolicy().quant_gemv.dense_copy_gemv_max_rows
    with overriding({"quant_gemv.backend": "reference"}):
        for rows in (1, bound, bound + 1, 64):
            x = rng.standard_normal((rows, 256)).astype(np.float32)
            got = np.asarray(linear_quant.linear(x, pair))
            want = x @ (np.asarray(pair.dense) if rows > bound else np.asarray(dequantize(w))).T
            np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-3)
            q, k = linear_quant.linear_split(x, pair, sizes=(48, 16))
            np.testing.assert_allclose(np.concatenate([q, k], axis=1), got, rtol=1e-6, atol=1e-6)
    ids = np.array([3, 0, 63], np.int32)
    np.testing.assert_array_equal(np.asarray(linear_quant.embedding(ids, pair)), np.asarray(pair.dense)[ids])
