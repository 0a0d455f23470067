"""The prefix cache's host tier on an NVIDIA GPU (h200 target, random weights at the Qwen2.5-1.5B shape): a 16k-token
prompt evicted from a pool that holds one such prompt comes back from host memory with the bits of a device-cache
hit, and its time to first token against the same prompt recomputed (an engine without the tier). Records the
figures under EMBER_GPU_RESULTS.

Run on the GPU machine:
    JAX_PLATFORMS=cuda,cpu EMBER_GPU_RESULTS=/tmp/host_tier.json python -m pytest -q -m gpu tests/test_gpu_host_tier.py
"""

from __future__ import annotations

import statistics

import jax
import numpy as np
import pytest

if jax.default_backend() != "gpu":
    pytest.skip("needs an NVIDIA GPU (JAX_PLATFORMS=cuda,cpu)", allow_module_level=True)

from logit_agreement import record_gpu_result  # noqa: E402

from ember.compiler.spec import spec_for_arch  # noqa: E402
from ember.runtime.engine.engine import Engine, EngineConfig, kv_bytes_per_block  # noqa: E402
from ember.runtime.loading.model import load_model  # noqa: E402
from ember.runtime.loading.synthetic import synthetic_checkpoint  # noqa: E402
from ember.runtime.sampling.params import SamplingParams  # noqa: E402
from ember.tools.bench_models import SYNTHETIC_SHAPES  # noqa: E402

pytestmark = pytest.mark.gpu
SHAPE = "qwen2.5-1.5b"
PROMPT = 16_384 + 9  # a hit resumes at 16,384: 1,024 blocks restored
BLOCK = 16
ROUNDS = 4


class _Detokenizer:
    eos_token_ids = ()

    def decode(self, ids, skip_special_tokens=False):
        return " ".join(str(int(t)) for t in ids)


def _served(engine, prompt):
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True, logprobs=3)
    out = engine.submit(prompt, params).collect()[0]
    usage = out[-1].usage
    steps = [(lp.token_id, lp.logprob, lp.top) for o in out for lp in o.logprobs]
    return steps, usage.cached_tokens, usage.ttft_s


def test_a_16k_prompt_evicted_to_host_comes_back_bit_exact_and_sooner_than_recomputed():
    arch, config = SYNTHETIC_SHAPES[SHAPE]
    model = load_model(synthetic_checkpoint(spec_for_arch(arch), config), target="h200")
    vocab = int(model.dims.vocab)
    rng = np.random.default_rng(3)
    prompts = [rng.integers(0, vocab, PROMPT).tolist() for _ in range(2)]  # served in turn: each evicts the other
    num_blocks = -(-(PROMPT + 8) // BLOCK) + 2  # one prompt with its output (+ the reserved block and one spare)
    host = 3 * kv_bytes_per_block(model, BLOCK) * num_blocks  # both prompts fit on the host
    settings = dict(
        num_blocks=num_blocks, block_size=BLOCK, max_model_len=PROMPT + 8, max_num_seqs=4, max_batched_tokens=4096
    )
    figures = {}
    tiered = Engine(model, _Detokenizer(), EngineConfig(prefix_cache_host_bytes=host, **settings))
    try:
        first = _served(tiered, prompts[0])
        device_hit = _served(tiered, prompts[0])  # still on the device
        runs = [_served(tiered, prompts[(i + 1) % 2]) for i in range(2 * ROUNDS + 1)]  # P1 cold, then restores
        restored = [r for i, r in enumerate(runs) if i > 0]
        counters = tiered.host_tier.counters()
    finally:
        tiered.close()
    plain = Engine(model, _Detokenizer(), EngineConfig(**settings))
    try:
        recomputed = [_served(plain, prompts[i % 2]) for i in range(2 * ROUNDS + 1)][1:]
    finally:
        plain.close()
    assert device_hit[1] == 16_384 and all(r[1] == 16_384 for r in restored), [r[1] for r in restored]
    assert all(r[1] <= 2 * BLOCK for r in recomputed)  # the pool keeps at most a block or two of the other's head
    p0_restored = [r for i, r in enumerate(runs) if i % 2 == 1]
    assert all(r[0] == device_hit[0] for r in p0_restored)  # the same bits as the device-cache hit
    figures = {
        "model": f"synthetic:{SHAPE}",
        "prompt_tokens": PROMPT,
        "first_cold_ttft_s_compiling": first[2],  # its steps compile here
        "device_hit_ttft_s": device_hit[2],
        "host_restore_ttft_s": statistics.median(r[2] for r in restored[1:]),  # the first restore compiles copies
        "recomputed_ttft_s": statistics.median(r[2] for r in recomputed[1:]),
        "restored_blocks": counters.restored_blocks,
        "offloaded_blocks": counters.offloaded_blocks,
    }
    record_gpu_result("host_tier_16k_ttft", figures)
    assert figures["host_restore_ttft_s"] < figures["recomputed_ttft_s"], figures
