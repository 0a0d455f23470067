"""Helpers of the host tier's engine tests (tests/test_host_tier_engine.py, tests/test_hybrid_host_tier.py): a greedy
request's tokens, logprobs (with the top 3) and cached-token count, and the same prompt as a device-cache hit."""

from __future__ import annotations

from engine_support import ByteTokenizer

from ember.runtime.engine.engine import Engine, EngineConfig
from ember.runtime.sampling.params import SamplingParams

TOP = 3


def served(engine, prompt, max_tokens=5, request_id=None):
    """(token ids, [(logprob, top)], cached tokens) of a greedy request."""
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, logprobs=TOP)
    out = engine.submit(prompt, params, request_id=request_id).collect()[0]
    steps = [lp for o in out for lp in o.logprobs]
    return [lp.token_id for lp in steps], [(lp.logprob, lp.top) for lp in steps], out[-1].usage.cached_tokens


def device_hit(model, prompt, config: EngineConfig):
    """served() of `prompt` sent a second time to a fresh engine of `config` (a pool large enough that nothing is
    evicted: the hit comes from the device cache)."""
    engine = Engine(model, ByteTokenizer(), config)
    try:
        served(engine, prompt)
        return served(engine, prompt)
    finally:
        engine.close()
