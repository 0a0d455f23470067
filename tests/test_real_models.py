"""The real default model, its 0.5B draft model and Gemma 3 270M against transformers (fp32, same GGUF weights):
teacher-forced top-1 agreement >= 0.99 and mean KL <= 1e-3 over >= 256 positions, and identical
greedy continuations of 5 prompts (32 tokens each)."""

import numpy as np
import pytest
from fixture_data import real_reference, top1_agreement, topk_kl

from ember.runtime.execution.sequence_runner import SequenceRunner
from ember.runtime.loading.model import load_model

pytestmark = pytest.mark.real_model

MODELS = {
    "qwen2.5-coder-1.5b-instruct": "qwen_gguf",
    "qwen2.5-coder-0.5b-instruct": "qwen_draft_gguf",
    "gemma-3-270m": "gemma_gguf",
}


@pytest.fixture(scope="module", params=sorted(MODELS))
def loaded(request):
    path = request.getfixturevalue(MODELS[request.param])
    return request.param, load_model(path), real_reference(request.param)


def test_teacher_forced_agreement(loaded):
    name, model, ref = loaded
    ids = ref["text_ids"].tolist()
    assert len(ids) >= 257
    logits = SequenceRunner(model, len(ids)).prefill(ids, all_logits=True)
    agreement = top1_agreement(ref["argmax"], logits)
    kl = topk_kl(ref["top_ids"], ref["top_logprobs"], logits)
    print(f"{name}: top-1 agreement {agreement:.4f}, mean KL {kl.mean():.2e} over {len(ids)} positions")
    assert agreement >= 0.99
    assert kl.mean() <= 1e-3


def test_greedy_continuations_identical(loaded):
    name, model, ref = loaded
    for case in ref["greedy"]:
        prompt = case["prompt_ids"].tolist()
        runner = SequenceRunner(model, len(prompt) + 32)
        logits = runner.prefill(prompt)
        out = []
        for _ in range(32):
            token = int(np.argmax(logits))
            out.append(token)
            if len(out) < 32:
                logits = runner.decode(token)
        assert out == case["out_ids"].tolist(), f"{name}: {case['text']!r}"
