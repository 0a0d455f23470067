"""The benchmark tools' models and what a decode step of them reads.

Model names: a known model, or random weights at real shapes (`synthetic:<shape>[-<format>]`) for machines that
cannot hold the real checkpoint. Bytes one decode step reads (weights, KV), for the bandwidth rooflines of
`ember bench --suite` (tools/bench_suite.py).
"""

from __future__ import annotations

from ..compiler.spec import gathered_only_weights

# Random weights at real shapes (`--model synthetic:<shape>[-<format>]`), for machines that cannot hold the real
# checkpoint; the tokenizer (only used to detokenize) comes from `--tokenizer DIR` (an HF folder). Configs use
# HF config.json keys (model_type included, so tools/bench_hf.py builds the same shape in transformers).
SYNTHETIC_PREFIX = "synthetic:"
_QWEN2 = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "rms_norm_eps": 1e-6,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
}
SYNTHETIC_SHAPES = {
    "qwen2.5-1.5b": (
        "qwen2",
        {
            **_QWEN2,
            "hidden_size": 1536,
            "num_hidden_layers": 28,
            "num_attention_heads": 12,
            "num_key_value_heads": 2,
            "intermediate_size": 8960,
            "vocab_size": 151936,
            "max_position_embeddings": 32768,
            "tie_word_embeddings": True,
        },
    ),
    # Qwen2.5(-Coder)-0.5B's shape: the default model's draft model (speculative decoding). Its rows of 896 are
    # not whole 256-blocks, so `-q4_k_m` falls back to Q5_0 / Q8_0 there, as the real file does
    "qwen2.5-0.5b": (
        "qwen2",
        {
            **_QWEN2,
            "hidden_size": 896,
            "num_hidden_layers": 24,
            "num_attention_heads": 14,
            "num_key_value_heads": 2,
            "intermediate_size": 4864,
            "vocab_size": 151936,
            "max_position_embeddings": 32768,
            "tie_word_embeddings": True,
        },
    ),
    # Llama-3-8B's shape; Llama 3.1's rope scaling and context length, so contexts to 32k are in range
    "llama3-8b": (
        "llama",
        {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "hidden_size": 4096,
            "num_hidden_layers": 32,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "head_dim": 128,
            "intermediate_size": 14336,
            "vocab_size": 128256,
            "rms_norm_eps": 1e-5,
            "max_position_embeddings": 131072,
            "tie_word_embeddings": False,
            "rope_parameters": {
                "rope_type": "llama3",
                "rope_theta": 500000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192,
            },
        },
    ),
    # a few-MB model of the same family, for smoke tests of the bench tools on any machine
    "qwen2-tiny": (
        "qwen2",
        {
            **_QWEN2,
            "hidden_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "intermediate_size": 128,
            "vocab_size": 151936,
            "max_position_embeddings": 4096,
            "tie_word_embeddings": True,
        },
    ),
}
# Llama-3-70B (issue 34's one-GPU model): the 8B's family at 80 layers of d 8,192, ffn 28,672, 64 / 8 heads; its
# Q4_K_M layout is 42.5 GB, 181.5 GB with bf16 copies (tests/test_memory_plan.py), so it loads without them
SYNTHETIC_SHAPES["llama3-70b"] = (
    "llama",
    {
        **SYNTHETIC_SHAPES["llama3-8b"][1],
        "hidden_size": 8192,
        "num_hidden_layers": 80,
        "num_attention_heads": 64,
        "intermediate_size": 28672,
    },
)
# `<shape>-<format>`: weights in a quantized checkpoint layout (random values, the real block layout), made by
# ember.runtime.loading.synthetic_gguf; without a suffix, float weights in the target's activation dtype.
# `-fp8` / `-fp8_block`: the layers' projections in FP8 e4m3 with per-channel / 128 x 128 block scales
# (compiler/kernels/dense_gemv/fp8.py), drawn by ember.runtime.loading.synthetic on targets whose projections take them.
QUANTIZED_FORMATS = ("q4_k_m", "fp8", "fp8_block")


def parse_synthetic(name: str) -> tuple[str, str | None]:
    """'synthetic:llama3-8b-q4_k_m' -> ('llama3-8b', 'q4_k_m'); 'synthetic:llama3-8b' -> ('llama3-8b', None)."""
    rest = name[len(SYNTHETIC_PREFIX) :] if name.startswith(SYNTHETIC_PREFIX) else name
    for fmt in QUANTIZED_FORMATS:
        if rest.endswith(f"-{fmt}") and rest[: -len(fmt) - 1] in SYNTHETIC_SHAPES:
            return rest[: -len(fmt) - 1], fmt
    if rest not in SYNTHETIC_SHAPES:
        known = [*SYNTHETIC_SHAPES, *(f"{s}-{f}" for s in SYNTHETIC_SHAPES for f in QUANTIZED_FORMATS)]
        raise ValueError(f"unknown synthetic shape {rest!r} (known: {', '.join(known)})")
    return rest, None


def _synthetic_model(name: str, target: str, tokenizer_dir: str | None, kernel_policy: str | None):
    from ..compiler.spec import spec_for_arch
    from ..runtime.loading.model import load_model
    from ..runtime.loading.synthetic import synthetic_model
    from ..runtime.loading.text.tokenizer import Tokenizer

    shape, fmt = parse_synthetic(name)
    if tokenizer_dir is None:
        raise ValueError("a synthetic model needs --tokenizer DIR (an HF folder with tokenizer.json)")
    arch, config = SYNTHETIC_SHAPES[shape]
    spec = spec_for_arch(arch)
    if fmt is None or fmt.startswith("fp8"):
        model = synthetic_model(spec, config, target=target, weight_format=fmt, kernel_policy=kernel_policy)
    else:
        try:
            from ..runtime.loading.synthetic_gguf import synthetic_gguf_checkpoint
        except ImportError as error:
            raise ValueError(
                f"{name} needs ember.runtime.loading.synthetic_gguf (synthetic GGUF checkpoints in the "
                f"{fmt} layout), which this tree does not have: {error}"
            ) from None
        checkpoint = synthetic_gguf_checkpoint(spec, config, scheme=fmt, seed=0)
        model = load_model(checkpoint, target=target, kernel_policy=kernel_policy)
    return model, Tokenizer.from_hf_dir(tokenizer_dir)


def load_bench_model(
    model_name: str,
    target: str,
    tokenizer_dir: str | None = None,
    kernel_policy: str | None = None,
    precision: str = "fast",
    mesh=None,
):
    """(Model, Tokenizer) for a known model name or `synthetic:<shape>[-<format>]`; kernel_policy: a JSON file
    of overrides over the target's kernel policy (compiler/targets/policy.py); precision and mesh (a
    MeshConfig; None: one device): load_model's (known models only)."""
    from ..compiler.targets.mesh import SINGLE_DEVICE
    from ..runtime.loading.known_models import resolve_model
    from ..runtime.loading.model import load_model
    from ..runtime.loading.text.prompting import load_tokenizer

    mesh = SINGLE_DEVICE if mesh is None else mesh
    if model_name.startswith(SYNTHETIC_PREFIX):
        if mesh.sharded:
            raise ValueError("synthetic models are built on one device: --tensor-parallel needs a checkpoint")
        return _synthetic_model(model_name, target, tokenizer_dir, kernel_policy)
    model = load_model(
        resolve_model(model_name, progress=True),
        target=target,
        progress=True,
        kernel_policy=kernel_policy,
        precision=precision,
        mesh=mesh,
    )
    return model, load_tokenizer(model.checkpoint)


def weight_bytes_per_step(model, rows: int = 1) -> int:
    """Bytes of weights one decode step of `rows` rows reads: every weight array the plan holds on the device
    (quantized blocks at their packed size), except an embedding table it only gathers a few rows from; of a
    weight with a dense copy, the form a step of that many rows reads (linear_quant.form_for_rows). A tied
    head has its own array under the head's name, so it counts; an array shared by two names counts once."""
    import jax

    from ..compiler.kernels.gguf_gemv.linear import form_for_rows

    gathered = gathered_only_weights(model.spec)
    seen: dict[int, int] = {}
    groups = [{k: v for k, v in model.params.globals.items() if k.split(".")[0] not in gathered}, *model.params.layers]
    for group in groups:
        for leaf in jax.tree.leaves({k: form_for_rows(rows, v) for k, v in group.items()}):
            seen[id(leaf)] = int(leaf.nbytes)
    return sum(seen.values())


def kv_bytes_read(model, context: int, kv_cache_dtype: str = "auto") -> int:
    """K and V bytes one decode step of one sequence reads at `context` tokens: per layer
    min(context, its window) x hkv x dh x 2 x itemsize (of the KV pools' dtype)."""
    from ..runtime.engine.config import kv_dtype

    d = model.dims
    windows = {kind.name: kind.window for kind in model.paged_kinds}
    per_token = int(d.hkv) * int(d.dh) * 2 * kv_dtype(model, kv_cache_dtype).itemsize
    # paged layers only: a recurrent layer reads its fixed-size slot, whatever the context
    return sum(min(context, windows[k] or context) * per_token for k in model.layer_state_kinds if k in windows)
