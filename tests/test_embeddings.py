"""Sentence embeddings from the served model's final hidden states (runtime/execution/hidden_states.py),
on the tiny random-weight Qwen2: the hidden states times the output matrix give the model's own logits
(the reference: those logits match transformers in test_tiny_reference), each row is RMS-normalised (the
final norm's weight is ones here), the batched step equals one pass per input, and the pooled vectors
are the L2-normalised means."""

from __future__ import annotations

import numpy as np
import pytest

from ember.runtime.execution.hidden_states import Embedder, mean_pooled
from ember.runtime.execution.sequence_runner import SequenceRunner
from ember.runtime.loading.model import load_model

INPUTS = [[9707, 11, 1879, 0], [785, 3974, 13876, 38835, 34208, 916, 279, 15678, 5562, 13], [40]]


@pytest.fixture(scope="module")
def model(tiny_chat_model):
    return load_model(tiny_chat_model)


@pytest.fixture(scope="module")
def embedder(model):
    return Embedder(model)


def test_hidden_states_project_to_the_models_logits(model, embedder):
    ids = INPUTS[1]
    hidden = embedder.hidden_states(ids)
    assert hidden.shape == (len(ids), model.dims.d)
    logits = SequenceRunner(model, 64).prefill(ids, all_logits=True)
    output = np.asarray(model.params.globals["output.weight"], np.float32)  # [vocab, d]
    np.testing.assert_allclose(hidden @ output.T, logits, atol=2e-4)
    rms = np.sqrt((hidden**2).mean(axis=1))
    np.testing.assert_allclose(rms, 1.0, atol=1e-3)  # after the final RMS norm (weight 1), not before


def test_one_batched_step_equals_one_pass_per_input(embedder):
    batched = embedder.batch_hidden_states(INPUTS)
    for ids, got in zip(INPUTS, batched, strict=True):
        np.testing.assert_allclose(got, embedder.hidden_states(ids), atol=1e-5)


def test_embeddings_are_normalised_means(embedder):
    vectors = embedder.embed(INPUTS)
    assert vectors.shape == (len(INPUTS), embedder.width)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    for ids, vector in zip(INPUTS, vectors, strict=True):
        hidden = embedder.hidden_states(ids)
        mean = hidden.mean(axis=0)
        np.testing.assert_allclose(vector, mean / np.linalg.norm(mean), atol=1e-5)
        np.testing.assert_allclose(mean_pooled(hidden), vector, atol=1e-6)
    assert not np.allclose(vectors[0], vectors[1], atol=1e-2)  # different texts, different vectors


def test_long_input_is_chunked(model):
    embedder = Embedder(model)
    embedder.chunk = 4  # force the long path: 10 tokens in 4-token chunks against one batched step
    short = Embedder(model).batch_hidden_states([INPUTS[1]])[0]
    np.testing.assert_allclose(embedder.embed([INPUTS[1]])[0], mean_pooled(short), atol=1e-5)
