"""Build tiny random HF checkpoints and their transformers reference outputs.

Run in the torch environment (Python 3.11, torch CPU, transformers):

    /work/venv311/bin/python tools/dev/make_tiny_checkpoints.py [--out tests/fixtures/tiny] [--arch llama ...]

For each family it writes tests/fixtures/tiny/<arch>/ with config.json, model.safetensors,
generation_config.json (from save_pretrained) and reference.npz:

    input_ids      int32   [40]         seeded random prompt
    prefill_logits float32 [40, vocab]  one forward over the prompt
    decode_ids     int32   [16]         tokens fed one at a time after the prompt (HF greedy choices)
    decode_logits  float32 [16, vocab]  logits of each decode step, computed with the KV cache

Every weight is drawn from a seeded torch.Generator in sorted-name order (not from HF's
initialiser), so re-running gives identical bytes. Norm weights are random (not the
identity) so that a norm bug shows up in the logits.
"""

from __future__ import annotations

import argparse
import io
import shutil
import sys
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import transformers
from hybrid_families import add_mtp_weights, hybrid_family_specs, hybrid_init, write_byte_tokenizer  # sibling script
from hybrid_probes import hybrid_stats

PROMPT_LEN = 40
DECODE_STEPS = 16
WEIGHT_STD = 0.15  # large enough that logits are O(1..10), not a flat ~0 distribution
REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUT = REPO_ROOT / "tests" / "fixtures" / "tiny"
# A fixed zip timestamp: numpy's own savez stamps the wall clock, which breaks byte equality.
_ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)


def write_npz_deterministic(path: Path, arrays: dict[str, np.ndarray], compress: bool = True) -> None:
    """Write an .npz that np.load reads, with identical bytes for identical arrays."""
    method = zipfile.ZIP_DEFLATED if compress else zipfile.ZIP_STORED
    with zipfile.ZipFile(path, "w", compression=method) as archive:
        for name in sorted(arrays):
            buffer = io.BytesIO()
            np.lib.format.write_array(buffer, np.ascontiguousarray(arrays[name]), allow_pickle=False)
            info = zipfile.ZipInfo(f"{name}.npy", date_time=_ZIP_EPOCH)
            info.compress_type = method
            info.external_attr = 0o644 << 16
            archive.writestr(info, buffer.getvalue())


@dataclass(frozen=True)
class TinyFamily:
    arch: str
    model_class: str  # name in the transformers namespace
    config_class: str
    config: dict[str, Any]
    # True where norm weights are stored as w with the scale (1 + w) (Gemma, Qwen3-Next, Qwen3.5); else scale = w.
    offset_norm: bool = False
    # MTP decoder layers written as seeded random `mtp.*` tensors (transformers has no MTP module).
    mtp_layers: int = 0
    # The MoE / hybrid families (hybrid_families.py): a byte tokenizer for llama.cpp's converter, GDN probes.
    hybrid: bool = False


def _families() -> list[TinyFamily]:
    common = dict(
        vocab_size=256, hidden_size=64, max_position_embeddings=128, bos_token_id=1, eos_token_id=2, pad_token_id=0
    )
    return [
        TinyFamily(
            "llama",
            "LlamaForCausalLM",
            "LlamaConfig",
            dict(
                common,
                intermediate_size=128,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=2,
                rms_norm_eps=1e-5,
                tie_word_embeddings=False,
                # head_dim 16, theta 5e5: with original_max_position_embeddings 64 the 8 rope
                # frequencies fall in all three llama3 bands (kept, smoothed, divided by factor).
                rope_parameters={
                    "rope_type": "llama3",
                    "rope_theta": 500000.0,
                    "factor": 8.0,
                    "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 64,
                },
            ),
        ),
        TinyFamily(
            "qwen2",
            "Qwen2ForCausalLM",
            "Qwen2Config",
            dict(
                common,
                intermediate_size=128,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=2,
                rms_norm_eps=1e-6,
                tie_word_embeddings=True,
                rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
            ),
        ),
        TinyFamily(
            "qwen3",
            "Qwen3ForCausalLM",
            "Qwen3Config",
            dict(
                common,
                intermediate_size=128,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=2,
                head_dim=32,
                rms_norm_eps=1e-6,
                tie_word_embeddings=False,
                rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
            ),
        ),
        TinyFamily(
            "gemma3",
            "Gemma3ForCausalLM",
            "Gemma3TextConfig",
            dict(
                common,
                intermediate_size=64,
                num_hidden_layers=6,
                num_attention_heads=4,
                num_key_value_heads=1,
                head_dim=32,
                query_pre_attn_scalar=24,
                rms_norm_eps=1e-6,
                tie_word_embeddings=True,
                hidden_activation="gelu_pytorch_tanh",
                sliding_window=8,
                layer_types=["sliding_attention"] * 5 + ["full_attention"],
                rope_parameters={
                    "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                    "full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
                },
                final_logit_softcapping=None,
                attn_logit_softcapping=None,
            ),
            offset_norm=True,
        ),
        *(TinyFamily(**spec) for spec in hybrid_family_specs()),
    ]


def _is_norm(name: str) -> bool:
    return name.endswith("norm.weight")


def randomize_weights(model: torch.nn.Module, family: TinyFamily, seed: int) -> None:
    """Overwrite every parameter from one seeded generator, in sorted-name order.

    Matrices and biases ~ N(0, WEIGHT_STD). Norm weights: scale w ~ U(0.5, 1.5) for plain
    RMSNorm; for Gemma's (1 + w) norm, w ~ U(-0.5, 0.5) so the +1 offset matters.
    """
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in sorted(model.named_parameters(), key=lambda item: item[0]):
            special = hybrid_init(name, param.shape, generator)
            if special is not None:
                values = special
            elif _is_norm(name):
                values = torch.rand(param.shape, generator=generator)
                values = values - 0.5 if family.offset_norm else values + 0.5
            else:
                values = torch.randn(param.shape, generator=generator) * WEIGHT_STD
            param.copy_(values.to(param.dtype))


def build_model(family: TinyFamily, seed: int) -> torch.nn.Module:
    config_class = getattr(transformers, family.config_class)
    config = config_class(**family.config)
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = getattr(transformers, family.model_class)(config).to(torch.float32)
    model.eval()
    randomize_weights(model, family, seed)
    if config.tie_word_embeddings:
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    return model


@torch.no_grad()
def reference_outputs(model: torch.nn.Module, vocab: int, seed: int) -> dict[str, np.ndarray]:
    """Prefill logits over a seeded prompt, then 16 greedy decode steps with the KV cache."""
    generator = torch.Generator().manual_seed(seed + 1)
    # Skip ids 0..2 (pad/bos/eos) so no special-token handling can change the reference.
    prompt = torch.randint(3, vocab, (1, PROMPT_LEN), generator=generator)
    out = model(input_ids=prompt, use_cache=True)
    prefill_logits = out.logits[0].float()  # [40, vocab]
    cache = out.cache
    next_token = int(prefill_logits[-1].argmax())
    decode_ids, decode_logits = [], []
    for step in range(DECODE_STEPS):
        position = PROMPT_LEN + step
        step_out = model(
            input_ids=torch.tensor([[next_token]]), cache=cache, use_cache=True, cache_position=torch.tensor([position])
        )
        cache = step_out.cache
        logits = step_out.logits[0, -1].float()  # [vocab]
        decode_ids.append(next_token)
        decode_logits.append(logits)
        next_token = int(logits.argmax())
    return {
        "input_ids": prompt[0].to(torch.int32).numpy(),
        "prefill_logits": prefill_logits.numpy().astype(np.float32),
        "decode_ids": np.asarray(decode_ids, dtype=np.int32),
        "decode_logits": torch.stack(decode_logits).numpy().astype(np.float32),
    }


@torch.no_grad()
def check_against_full_forward(model: torch.nn.Module, ref: dict[str, np.ndarray]) -> float:
    """Max |cached decode logits - one uncached forward over prompt+decode ids| (sanity only)."""
    full = np.concatenate([ref["input_ids"], ref["decode_ids"]]).astype(np.int64)
    logits = model(input_ids=torch.from_numpy(full)[None], use_cache=False).logits[0].numpy()
    # Decode step s consumes token PROMPT_LEN + s, so its logits sit at that position.
    return float(np.abs(logits[PROMPT_LEN:] - ref["decode_logits"]).max())


def top2_margin(logits: np.ndarray) -> float:
    """Smallest gap between the best and second-best logit over rows (greedy fragility)."""
    top2 = np.sort(logits, axis=-1)[:, -2:]
    return float((top2[:, 1] - top2[:, 0]).min())


def llama3_band_counts(config: dict[str, Any]) -> tuple[int, int, int]:
    """(kept, smoothed, scaled) counts of rope frequencies under llama3 scaling."""
    rope = config["rope_parameters"]
    head_dim = config["hidden_size"] // config["num_attention_heads"]
    inv_freq = rope["rope_theta"] ** (-np.arange(0, head_dim, 2) / head_dim)
    wavelen = 2 * np.pi / inv_freq
    low = rope["original_max_position_embeddings"] / rope["low_freq_factor"]
    high = rope["original_max_position_embeddings"] / rope["high_freq_factor"]
    kept = int((wavelen < high).sum())
    scaled = int((wavelen > low).sum())
    return kept, len(wavelen) - kept - scaled, scaled


def make_family(family: TinyFamily, out_root: Path, seed: int) -> dict[str, float]:
    target = out_root / family.arch
    if target.exists():
        shutil.rmtree(target)
    model = build_model(family, seed)
    model.save_pretrained(target, safe_serialization=True)
    if family.mtp_layers:
        add_mtp_weights(target, family.mtp_layers, seed, WEIGHT_STD)
    if family.hybrid:
        write_byte_tokenizer(target, family.config["vocab_size"])
    ref = reference_outputs(model, family.config["vocab_size"], seed)
    write_npz_deterministic(target / "reference.npz", ref)
    size = sum(p.stat().st_size for p in target.iterdir())
    assert size < 1_500_000, f"{family.arch}: {size} bytes on disk, over the 1.5 MB budget"
    extra = hybrid_stats(model, ref) if family.hybrid else {}
    return {
        **extra,
        "max_abs_prefill_logit": float(np.abs(ref["prefill_logits"]).max()),
        "max_abs_decode_logit": float(np.abs(ref["decode_logits"]).max()),
        "min_top2_margin_decode": top2_margin(ref["decode_logits"]),
        "cache_vs_full_forward": check_against_full_forward(model, ref),
        "bytes": float(size),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--arch", action="append", help="only these families (repeatable)")
    parser.add_argument("--seed", type=int, default=1234)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # one thread: identical reduction order on every re-run
    families = [f for f in _families() if not args.arch or f.arch in args.arch]
    args.out.mkdir(parents=True, exist_ok=True)
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    for family in families:
        if family.arch == "llama":
            print("  llama3 rope bands (kept, smoothed, scaled):", llama3_band_counts(family.config))
        start = time.perf_counter()
        stats = make_family(family, args.out, args.seed)
        elapsed = time.perf_counter() - start
        summary = ", ".join(f"{k}={v:.4g}" for k, v in stats.items())
        print(f"{family.arch}: {summary} ({elapsed:.1f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
