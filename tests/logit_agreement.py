"""Shared by the GPU agreement tests: how far one run's logits are from a reference run's."""

from __future__ import annotations

import json
import os

import numpy as np


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def _bf16_ulp(x: np.ndarray) -> np.ndarray:
    """The spacing of bfloat16 values at |x| (8 significant bits)."""
    return np.exp2(np.floor(np.log2(np.maximum(np.abs(x), 2.0**-126))) - 7)


def agreement(exact: np.ndarray, fast: np.ndarray) -> dict:
    p_exact, p_fast = _log_softmax(exact), _log_softmax(fast)
    kl = (np.exp(p_exact) * (p_exact - p_fast)).sum(-1)
    top2 = np.sort(exact, axis=-1)[:, -2:]
    margin = top2[:, 1] - top2[:, 0]
    # a near tie: the reference's top two logits within four bf16 steps of each other (the logits are bf16; flips
    # seen at 0, 1 and 3 steps: docs/results/h200_gpu_engine_tests_9af0c7d.json)
    decisive = margin > 4 * _bf16_ulp(top2[:, 1])
    flipped = exact.argmax(-1) != fast.argmax(-1)
    return {
        "top1_agreement": float(1.0 - flipped.mean()),
        "mean_kl": float(kl.mean()),
        "max_kl": float(kl.max()),
        "decisive_positions": int(decisive.sum()),
        "top1_agreement_where_decisive": float(1.0 - flipped[decisive].mean()),
        # how close to a tie the reference's top two logits were where the argmax moved
        "flipped_top2_margins": [round(float(m), 5) for m in margin[flipped]],
    }


def record_gpu_result(key: str, value) -> None:
    """Add value under key to the JSON file EMBER_GPU_RESULTS names (nothing when it is unset)."""
    path = os.environ.get("EMBER_GPU_RESULTS")
    if path:
        data = json.loads(open(path).read()) if os.path.exists(path) else {}
        data[key] = value
        with open(path, "w") as f:
            json.dump(data, f, indent=1)
