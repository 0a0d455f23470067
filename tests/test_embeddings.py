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


# ---- the routes, through the real SDKs, against the live tiny server -----------------------------------

TEXTS = ["Hello, world!", "The quick brown fox jumps over the lazy dog."]


@pytest.fixture(scope="module")
def tokenizer(tiny_chat_model):
    from ember.runtime.loading.text.tokenizer import Tokenizer

    return Tokenizer.from_hf_dir(tiny_chat_model)


def test_openai_embeddings_match_the_reference(server, embedder, tokenizer):
    import openai

    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    model = client.models.list().data[0].id
    ids = [tokenizer.encode(t) for t in TEXTS]
    want = embedder.embed(ids)
    reply = client.embeddings.create(model=model, input=TEXTS)  # the SDK asks for base64 and decodes it
    got = np.array([d.embedding for d in reply.data], np.float32)
    np.testing.assert_allclose(got, want, atol=1e-5)
    assert [d.index for d in reply.data] == [0, 1]
    assert reply.usage.prompt_tokens == reply.usage.total_tokens == sum(len(i) for i in ids)
    floats = client.embeddings.create(model=model, input=ids[1], encoding_format="float", dimensions=64)
    np.testing.assert_allclose(floats.data[0].embedding, want[1], atol=1e-5)  # token ids in, same vector
    with pytest.raises(openai.BadRequestError) as caught:
        client.embeddings.create(model=model, input="x", dimensions=32)
    assert caught.value.body["param"] == "dimensions"
    with pytest.raises(openai.BadRequestError) as caught:
        client.embeddings.create(model=model, input=["ok", ""])
    assert caught.value.body["param"] == "input[1]"


def test_ollama_embed_matches_the_reference(server, embedder, tokenizer):
    import ollama

    client = ollama.Client(host=server.url, timeout=300)
    name = client.list().models[0].model
    want = embedder.embed([tokenizer.encode(t) for t in TEXTS])
    reply = client.embed(model=name, input=TEXTS)
    np.testing.assert_allclose(np.array(reply.embeddings, np.float32), want, atol=1e-5)
    assert reply.prompt_eval_count == sum(len(tokenizer.encode(t)) for t in TEXTS)
    legacy = client.embeddings(model=name, prompt=TEXTS[0])
    np.testing.assert_allclose(legacy.embedding, want[0], atol=1e-5)
