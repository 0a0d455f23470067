"""Read the transformers reference fixtures and compare Ember's outputs with them.

numpy/json only (CI has no torch). The fixtures are made by tools/dev/make_tiny_checkpoints.py and
tools/dev/make_real_model_references.py; tests/fixtures/README.md says how.

    ckpt_dir, ref = tiny_fixture("qwen3")    # ref["prefill_logits"]: float32 [40, vocab]
    ckpt_dir, ref = tiny_fixture("qwen3_next")   # the MoE / hybrid families too (HYBRID_TINY_ARCHS)
    gguf_path, described = tiny_gguf("qwen3_next")   # llama.cpp's f32 GGUF + its tensor list
    real = real_reference("gemma-3-270m")    # real["top_ids"]: int32 [T, 128]
    kl = topk_kl(real["top_ids"], real["top_logprobs"], our_logprobs)   # float64 [T]
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

FIXTURES_DIR = Path(__file__).resolve().parent / "fixtures"
TINY_ARCHS = ("llama", "qwen2", "qwen3", "gemma3")
# MoE and hybrid (Gated DeltaNet) families: made by the same script, plus a byte-level tokenizer and,
# except qwen3_moe (whose dense-MLP layer llama.cpp's qwen3moe cannot hold), a GGUF from llama.cpp's converter.
HYBRID_TINY_ARCHS = ("qwen3_moe", "qwen3_next", "qwen3_5", "qwen3_5_moe")
TINY_GGUF_ARCHS = ("qwen3_next", "qwen3_5", "qwen3_5_moe")
# qwen3_moe at 256 wide (2 layers, 4 experts) as a GGUF with Q4_K / Q6_K tensors; no HF weights committed.
KQUANT_DIR = "qwen3_moe_kquant"
# Families whose checkpoints carry seeded random `mtp.*` tensors (no transformers reference for them).
TINY_MTP_ARCHS = ("qwen3_next", "qwen3_5", "qwen3_5_moe")
REAL_MODELS = ("qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct", "gemma-3-270m")
_ROWS_PER_CHUNK = 32  # bounds the float64 temporaries at 32 x vocab when scoring a full distribution


def tiny_fixture(arch: str) -> tuple[Path, dict[str, np.ndarray]]:
    """(checkpoint dir holding config.json + model.safetensors, reference arrays).

    Arrays: input_ids int32 [40], prefill_logits float32 [40, vocab], decode_ids int32 [16],
    decode_logits float32 [16, vocab] (decode step s feeds decode_ids[s] at position 40 + s).
    """
    known = TINY_ARCHS + HYBRID_TINY_ARCHS
    if arch not in known:
        raise KeyError(f"no tiny fixture for {arch!r}; known: {', '.join(known)}")
    checkpoint = FIXTURES_DIR / "tiny" / arch
    with np.load(checkpoint / "reference.npz") as archive:
        arrays = {name: archive[name] for name in archive.files}
    return checkpoint, arrays


def tiny_config(arch: str) -> dict[str, Any]:
    """The tiny checkpoint's config.json (as transformers saved it)."""
    checkpoint, _ = tiny_fixture(arch)
    return json.loads((checkpoint / "config.json").read_text(encoding="utf-8"))


def tiny_gguf(arch: str) -> tuple[Path, dict[str, Any]]:
    """(model.f32.gguf written by llama.cpp's converter, gguf_tensors.json).

    The JSON has "metadata" (every key but the token lists) and "tensors": a list of
    {"name", "ne" (ggml dims, fastest first: a [rows, cols] matrix is ne [cols, rows]), "type"}.
    """
    if arch not in TINY_GGUF_ARCHS:
        raise KeyError(f"no tiny GGUF for {arch!r}; known: {', '.join(TINY_GGUF_ARCHS)}")
    folder = FIXTURES_DIR / "tiny" / arch
    described = json.loads((folder / "gguf_tensors.json").read_text(encoding="utf-8"))
    return folder / "model.f32.gguf", described


def kquant_fixture() -> tuple[Path, dict[str, np.ndarray], dict[str, Any], dict[str, Any]]:
    """(model.q4_k_m.gguf, reference arrays, the HF config.json it was built from, gguf_tensors.json).

    The reference is transformers' fp32 output with the GGUF's dequantized weights, so it is exact
    for the file (same arrays as tiny_fixture's).
    """
    folder = FIXTURES_DIR / "tiny" / KQUANT_DIR
    with np.load(folder / "reference.npz") as archive:
        arrays = {name: archive[name] for name in archive.files}
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    described = json.loads((folder / "gguf_tensors.json").read_text(encoding="utf-8"))
    return folder / "model.q4_k_m.gguf", arrays, config, described


def real_reference(model: str) -> dict[str, Any]:
    """All arrays of tests/fixtures/real/<model>.npz, plus:

    "meta":   the parsed <model>.json (prompt texts, versions, the HF config derived from the GGUF)
    "greedy": list of dicts {prompt_ids, out_ids, margins, kind, text}, one per greedy prompt
    """
    if model not in REAL_MODELS:
        raise KeyError(f"no real reference for {model!r}; known: {', '.join(REAL_MODELS)}")
    real_dir = FIXTURES_DIR / "real"
    with np.load(real_dir / f"{model}.npz") as archive:
        result: dict[str, Any] = {name: archive[name] for name in archive.files}
    meta = json.loads((real_dir / f"{model}.json").read_text(encoding="utf-8"))
    result["meta"] = meta
    result["greedy"] = [
        {
            "prompt_ids": result[f"greedy_prompt_ids_{k}"],
            "out_ids": result[f"greedy_out_{k}"],
            "margins": result[f"greedy_margin_{k}"],
            "kind": prompt["kind"],
            "text": prompt["text"],
        }
        for k, prompt in enumerate(meta["greedy_prompts"])
    ]
    return result


def passage_text() -> str:
    """The passage whose tokens are every real reference's text_ids."""
    return (FIXTURES_DIR / "real" / "passage.txt").read_text(encoding="utf-8")


def _log_normalize(scores: np.ndarray) -> np.ndarray:
    """log_softmax over the last axis in float64 (accepts logits or log-probs)."""
    scores = np.asarray(scores, dtype=np.float64)
    peak = scores.max(axis=-1, keepdims=True)
    return scores - (peak + np.log(np.exp(scores - peak).sum(axis=-1, keepdims=True)))


def _xlogy_ratio(p: np.ndarray, log_p: np.ndarray, log_q: np.ndarray) -> np.ndarray:
    """p * (log p - log q) with the convention 0 * anything = 0."""
    return np.where(p > 0, p * (log_p - log_q), 0.0)


def topk_kl(ref_top_ids: np.ndarray, ref_top_logprobs: np.ndarray, our_logprobs_full: np.ndarray) -> np.ndarray:
    """KL(p_ref || q_ours) per position over K+1 buckets: the reference's top-K ids and "the rest".

    ref_top_ids int [T, K], ref_top_logprobs float [T, K] (log-probs of the full reference
    distribution), our_logprobs_full float [T, V] (log-probs or logits; renormalised here).
    Merging the tail into one bucket can only lower KL (data processing inequality), so the
    result is a lower bound of the full KL. Returns float64 [T].
    """
    ref_top_ids = np.asarray(ref_top_ids)
    ref_log_p = np.asarray(ref_top_logprobs, dtype=np.float64)
    if ref_top_ids.shape != ref_log_p.shape or our_logprobs_full.shape[0] != ref_top_ids.shape[0]:
        raise ValueError(
            f"shape mismatch: ids {ref_top_ids.shape}, logprobs {ref_log_p.shape}, ours {our_logprobs_full.shape}"
        )
    rows = ref_top_ids.shape[0]
    p_top = np.exp(ref_log_p)
    p_rest = np.clip(1.0 - p_top.sum(axis=-1), 0.0, 1.0)  # [T]
    kl = np.empty(rows, dtype=np.float64)
    for start in range(0, rows, _ROWS_PER_CHUNK):
        stop = min(start + _ROWS_PER_CHUNK, rows)
        ours = _log_normalize(our_logprobs_full[start:stop])  # [c, V]
        ids = ref_top_ids[start:stop]
        log_q_top = np.take_along_axis(ours, ids, axis=-1)  # [c, K]
        # Tail mass of ours summed directly over the complement (1 - sum(top) loses digits).
        q_all = np.exp(ours)
        np.put_along_axis(q_all, ids, 0.0, axis=-1)
        q_rest = q_all.sum(axis=-1)
        log_q_rest = np.log(np.maximum(q_rest, np.finfo(np.float64).tiny))
        p_r = p_rest[start:stop]
        log_p_rest = np.log(np.maximum(p_r, np.finfo(np.float64).tiny))
        top_terms = _xlogy_ratio(p_top[start:stop], ref_log_p[start:stop], log_q_top).sum(axis=-1)
        kl[start:stop] = top_terms + _xlogy_ratio(p_r, log_p_rest, log_q_rest)
    return np.maximum(kl, 0.0)  # rounding can leave -1e-17 where the distributions agree


def full_kl(ref_logprobs_full: np.ndarray, our_logprobs_full: np.ndarray) -> np.ndarray:
    """Exact KL(p || q) per row from two full [T, V] score arrays (logits or log-probs)."""
    log_p = _log_normalize(ref_logprobs_full)
    log_q = _log_normalize(our_logprobs_full)
    return _xlogy_ratio(np.exp(log_p), log_p, log_q).sum(axis=-1)


def top1_agreement(ref_argmax: np.ndarray, ours: np.ndarray) -> float:
    """Fraction of positions where our argmax equals the reference's.

    ours: int [T] token ids, or float [T, V] scores (argmax taken here).
    """
    ours = np.asarray(ours)
    our_argmax = ours.argmax(axis=-1) if ours.ndim == 2 else ours
    if our_argmax.shape != np.shape(ref_argmax):
        raise ValueError(f"shape mismatch: ref {np.shape(ref_argmax)}, ours {our_argmax.shape}")
    return float(np.mean(our_argmax == ref_argmax))


def save_synthetic_tokenizer(folder: Path) -> str:
    """An HF tokenizer folder (tokenizer.json) made from the small GPT-2-style test vocabulary of the
    tokenizer fixture (ids beyond it decode to ''): the synthetic models' stand-in. Returns the folder."""
    from ember.runtime.loading.text.tokenizer import Tokenizer

    case = json.loads((FIXTURES_DIR / "tokenizer" / "synthetic.json").read_text())["cases"]["gpt2_qwen2"]
    Tokenizer.from_gguf_metadata(case["metadata"], "test").backend.save(str(folder / "tokenizer.json"))
    return str(folder)
