"""Speculative decoding on the real models (CPU): the default 1.5B target with the 0.5B draft model, and with
n-gram lookup, gives exactly the target's plain greedy tokens on a code-editing prompt."""

import pytest

from ember.runtime.engine.engine import Engine, EngineConfig
from ember.runtime.loading.model import load_model
from ember.runtime.loading.text.prompting import load_tokenizer, render_chat
from ember.runtime.sampling.params import SamplingParams
from ember.runtime.speculative.config import SpeculativeConfig

pytestmark = [pytest.mark.real_model, pytest.mark.slow]

CODE = "def total(items):\n    t = 0\n    for item in items:\n        t = t + item.price * item.count\n    return t\n"


def _greedy(model, tokenizer, prompt, speculative, max_tokens=24):
    config = EngineConfig(num_blocks=40, max_model_len=512, max_num_seqs=1, max_batched_tokens=256)
    engine = Engine(model, tokenizer, EngineConfig(**{**vars(config), "speculative": speculative}))
    try:
        outs = engine.submit(prompt, SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True))
        tokens = [t for o in outs.collect()[0] for t in o.token_ids]
        return tokens, engine.speculation_stats()
    finally:
        engine.close()


def test_draft_model_and_ngram_speculation_give_plain_greedy_tokens(qwen_gguf, qwen_draft_gguf):
    model = load_model(qwen_gguf)
    tokenizer = load_tokenizer(model.checkpoint)
    message = f"Add type hints to this function. Return the whole function.\n\n```python\n{CODE}```"
    prompt = tokenizer.encode(render_chat(tokenizer, [{"role": "user", "content": message}]), add_special_tokens=False)
    plain, _ = _greedy(model, tokenizer, prompt, None)
    drafted, draft_stats = _greedy(
        model, tokenizer, prompt, SpeculativeConfig("draft", 4, str(qwen_draft_gguf), adaptive=False)
    )
    lookup, _ = _greedy(model, tokenizer, prompt, SpeculativeConfig("ngram", 4, adaptive=False))
    assert drafted == plain and lookup == plain
    assert draft_stats.num_accepted_tokens > 0
