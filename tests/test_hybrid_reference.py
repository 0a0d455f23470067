"""The MoE and hybrid (Gated DeltaNet) specs on tiny random checkpoints give transformers' fp32 logits within 1e-4
over a 40-token prefill and 16 decode steps: whole, in prefill chunks whose lengths are not multiples of the
delta-rule chunk (the recurrent state carried across chunks in its slot), and from the llama.cpp GGUF of the same
checkpoint."""

import numpy as np
import pytest
from fixture_data import HYBRID_TINY_ARCHS, TINY_GGUF_ARCHS, tiny_config, tiny_fixture, tiny_gguf

from ember.runtime.execution.sequence_runner import SequenceRunner
from ember.runtime.loading.model import load_model

TOLERANCE = 1e-4
RECURRENT = ("qwen3_next", "qwen3_5", "qwen3_5_moe")


def _run(model, ref, chunk=None, decode_steps=16):
    runner = SequenceRunner(model, 64, prefill_chunk=chunk)
    prefill = runner.prefill(ref["input_ids"].tolist(), all_logits=True)
    decode = [runner.decode(int(t)) for t in ref["decode_ids"][:decode_steps]]
    return prefill, np.stack(decode)


@pytest.mark.parametrize("arch", HYBRID_TINY_ARCHS)
def test_prefill_and_decode_match_transformers(arch):
    path, ref = tiny_fixture(arch)
    model = load_model(path, precision="exact")
    assert model.spec.arch == arch
    prefill, decode = _run(model, ref)
    assert np.abs(prefill - ref["prefill_logits"]).max() <= TOLERANCE
    assert np.abs(decode - ref["decode_logits"]).max() <= TOLERANCE


@pytest.mark.parametrize("arch", RECURRENT)
def test_chunked_prefill_carries_the_recurrent_state(arch):
    """Chunks of 7 tokens (7, 7, ..., 5): each chunk starts from the state its predecessor left in the slot."""
    path, ref = tiny_fixture(arch)
    model = load_model(path, precision="exact")
    assert model.slot_kinds and model.slot_kinds[0].name == "recurrent"
    prefill, decode = _run(model, ref, chunk=7, decode_steps=4)
    assert np.abs(prefill - ref["prefill_logits"]).max() <= TOLERANCE
    assert np.abs(decode - ref["decode_logits"][:4]).max() <= TOLERANCE


def test_the_recurrent_state_matters():
    """Control: a runner whose slot is wiped between chunks no longer matches (so the test above can fail)."""
    path, ref = tiny_fixture("qwen3_next")
    model = load_model(path, precision="exact")
    runner = SequenceRunner(model, 64, prefill_chunk=20)
    ids = ref["input_ids"].tolist()
    runner.prefill(ids[:20], all_logits=True)
    runner.kv = [
        tuple(np.zeros_like(a) for a in state) if kind == "recurrent" else state
        for kind, state in zip(model.layer_state_kinds, runner.kv)
    ]
    second = runner.prefill(ids[20:], all_logits=True)
    assert np.abs(second - ref["prefill_logits"][20:]).max() > 1e-2


@pytest.mark.parametrize("arch", TINY_GGUF_ARCHS)
def test_gguf_gives_the_safetensors_logits(arch):
    path, ref = tiny_fixture(arch)
    gguf_path, _ = tiny_gguf(arch)
    model = load_model(gguf_path, precision="exact")
    # GGUF's block_count counts the MTP block too: the plan runs the model's own layers
    assert model.spec.arch == arch and int(model.dims.layers) == tiny_config(arch)["num_hidden_layers"]
    prefill, decode = _run(model, ref, decode_steps=4)
    assert np.abs(prefill - ref["prefill_logits"]).max() <= TOLERANCE
    assert np.abs(decode - ref["decode_logits"][:4]).max() <= TOLERANCE
