"""Fast checks of the fixture helpers and of the committed fixtures' integrity."""

from __future__ import annotations

import numpy as np
import pytest
from fixture_data import (
    REAL_MODELS,
    TINY_ARCHS,
    _log_normalize,
    full_kl,
    passage_text,
    real_reference,
    tiny_fixture,
    top1_agreement,
    topk_kl,
)


def _reference_topk(log_p: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Top-k ids and log-probs, sorted descending, as the fixture scripts store them."""
    ids = np.argsort(-log_p, axis=-1, kind="stable")[:, :k]
    return ids.astype(np.int32), np.take_along_axis(log_p, ids, axis=-1).astype(np.float32)


def _random_logprobs(rng: np.random.Generator, rows: int, vocab: int, scale: float) -> np.ndarray:
    return _log_normalize(rng.normal(0.0, scale, size=(rows, vocab)))


def test_identical_distributions_have_zero_kl() -> None:
    log_p = _random_logprobs(np.random.default_rng(0), 6, 500, 3.0)
    ids, top = _reference_topk(log_p, 128)
    np.testing.assert_allclose(topk_kl(ids, top, log_p), 0.0, atol=1e-6)


def test_logits_and_logprobs_give_the_same_kl() -> None:
    rng = np.random.default_rng(1)
    log_p = _random_logprobs(rng, 4, 300, 2.0)
    logits_q = rng.normal(0.0, 2.0, size=(4, 300)) + 17.0  # unnormalised on purpose
    ids, top = _reference_topk(log_p, 128)
    np.testing.assert_allclose(topk_kl(ids, top, logits_q), topk_kl(ids, top, _log_normalize(logits_q)), rtol=1e-12)


def test_shifted_distribution_has_positive_kl() -> None:
    log_p = _random_logprobs(np.random.default_rng(2), 5, 400, 3.0)
    ids, top = _reference_topk(log_p, 128)
    shifted = log_p.copy()
    shifted[:, ids[:, 0]] -= 1.0  # make each row's reference favourite less likely
    kl = topk_kl(ids, top, shifted)
    assert kl.shape == (5,)
    assert np.all(kl > 1e-3)


def test_tail_bucket_matches_hand_computation() -> None:
    p = np.array([[0.5, 0.3, 0.15, 0.05]])
    q = np.array([[0.4, 0.4, 0.1, 0.1]])
    ids, top = np.array([[0, 1]]), np.log(p[:, :2])
    expected = 0.5 * np.log(0.5 / 0.4) + 0.3 * np.log(0.3 / 0.4) + 0.2 * np.log(0.2 / 0.2)
    np.testing.assert_allclose(topk_kl(ids, top, np.log(q)), [expected], rtol=1e-12)


@pytest.mark.parametrize("seed", range(5))
def test_bucketed_kl_never_exceeds_full_kl(seed: int) -> None:
    rng = np.random.default_rng(seed)
    log_p = _random_logprobs(rng, 8, 1000, 1.0 + seed)
    log_q = _log_normalize(log_p + rng.normal(0.0, 0.5, size=log_p.shape))
    ids, top = _reference_topk(log_p, 128)
    bucketed, exact = topk_kl(ids, top, log_q), full_kl(log_p, log_q)
    assert np.all(bucketed <= exact + 1e-9)
    assert np.all(bucketed > 0)


def test_top1_agreement_counts_matches() -> None:
    ref = np.array([3, 1, 4, 1])
    assert top1_agreement(ref, np.array([3, 1, 0, 1])) == 0.75
    scores = np.zeros((4, 6))
    scores[np.arange(4), ref] = 1.0
    assert top1_agreement(ref, scores) == 1.0


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_tiny_fixture_is_complete_and_greedy(arch: str) -> None:
    checkpoint, ref = tiny_fixture(arch)
    for name in ("config.json", "model.safetensors", "generation_config.json"):
        assert (checkpoint / name).is_file()
    vocab = ref["prefill_logits"].shape[1]
    assert ref["input_ids"].shape == (40,) and ref["input_ids"].dtype == np.int32
    assert ref["prefill_logits"].shape == (40, vocab) and ref["prefill_logits"].dtype == np.float32
    assert ref["decode_ids"].shape == (16,) and ref["decode_logits"].shape == (16, vocab)
    # Decode ids are HF's greedy choices: each is the argmax of the step before.
    chosen = np.concatenate([ref["prefill_logits"][-1:], ref["decode_logits"][:-1]]).argmax(axis=-1)
    np.testing.assert_array_equal(ref["decode_ids"], chosen)
    assert sum(p.stat().st_size for p in checkpoint.iterdir()) < 1_000_000


@pytest.mark.parametrize("model", REAL_MODELS)
def test_real_reference_is_consistent(model: str) -> None:
    ref = real_reference(model)
    tokens, k = ref["top_ids"].shape
    assert tokens == ref["text_ids"].shape[0] >= 300 and k == 128
    assert np.all(np.diff(ref["top_logprobs"], axis=-1) <= 0)  # sorted descending
    np.testing.assert_array_equal(ref["argmax"], ref["top_ids"][:, 0])
    assert np.all(ref["top_ids"] < ref["meta"]["hf_config"]["vocab_size"])
    assert len(ref["greedy"]) == 5
    for prompt in ref["greedy"]:
        assert prompt["out_ids"].shape == (32,) and prompt["margins"].shape == (32,)
        assert prompt["prompt_ids"].ndim == 1 and prompt["prompt_ids"].size > 0
    assert passage_text().startswith("The lighthouse keeper")


@pytest.mark.parametrize("model", REAL_MODELS)
def test_reference_rebuilt_from_its_own_topk_scores_zero(model: str) -> None:
    """Spread each row's tail mass evenly outside the top 128: the bucketed KL must be ~0."""
    ref = real_reference(model)
    ids, top = ref["top_ids"][:8], ref["top_logprobs"][:8].astype(np.float64)
    vocab = ref["meta"]["hf_config"]["vocab_size"]
    tail = np.clip(1.0 - np.exp(top).sum(axis=-1), 1e-30, 1.0)
    ours = np.repeat(np.log(tail / (vocab - ids.shape[1]))[:, None], vocab, axis=1)
    np.put_along_axis(ours, ids, top, axis=-1)
    np.testing.assert_allclose(topk_kl(ids, top, ours), 0.0, atol=1e-6)
    assert topk_kl(ids, top, np.roll(ours, 1, axis=-1)).min() > 0.01
