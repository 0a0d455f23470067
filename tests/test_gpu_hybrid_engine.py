"""The hybrid (Gated DeltaNet + attention) and MoE families on an NVIDIA GPU through the h200 target's plans,
on each tiny checkpoint: the plans' logits agree with the cpu target's over a prefill and single-row decode
steps (the chunked and the recurrent Gated DeltaNet kernels, the MoE kernels), and deterministic mode gives a
probe request the same tokens and logprobs alone and beside other requests (issue 33's verification).

Run on the GPU machine with both platforms (the cpu target runs on the host's CPU there):
    JAX_PLATFORMS=cuda,cpu python -m pytest -q -m gpu tests/test_gpu_hybrid_engine.py
EMBER_GPU_RESULTS=<file.json> records the measured agreement figures.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

if jax.default_backend() != "gpu":
    pytest.skip("needs an NVIDIA GPU (JAX_PLATFORMS=cuda,cpu)", allow_module_level=True)

from engine_support import ByteTokenizer, outputs_of  # noqa: E402
from fixture_data import HYBRID_TINY_ARCHS, tiny_fixture  # noqa: E402
from logit_agreement import agreement, record_gpu_result  # noqa: E402

from ember.compiler.targets import get_target  # noqa: E402
from ember.runtime.engine.engine import Engine, EngineConfig  # noqa: E402
from ember.runtime.execution.sequence_runner import SequenceRunner  # noqa: E402
from ember.runtime.loading.model import load_model  # noqa: E402
from ember.runtime.sampling.params import SamplingParams  # noqa: E402

pytestmark = pytest.mark.gpu
CAPACITY = 64


def _logits(model, prompt: list[int], decode: list[int]) -> np.ndarray:
    """[len(prompt) + len(decode), vocab] float32: the prompt's prefill logits, then one decode step per token."""
    runner = SequenceRunner(model, CAPACITY)
    rows = [runner.prefill(prompt, all_logits=True).astype(np.float32)]
    rows += [runner.decode(int(t)).astype(np.float32).reshape(1, -1) for t in decode]
    return np.concatenate(rows)


@pytest.mark.parametrize("arch", HYBRID_TINY_ARCHS)
def test_h200_plans_agree_with_the_cpu_target(arch):
    """Against the cpu target in float32, bounded by bfloat16's own noise (the cpu target in bfloat16 against its
    float32, measured in the same test: on these tiny models a routing flip alone moves an MoE's logits, mean KL
    1e-3 to 6e-2 on the CPU): mean KL <= 3x bfloat16's + 1e-3, and top-1 where the reference's top two logits are
    more than four bf16 steps apart >= bfloat16's own less 0.05. A wrong kernel (a state not carried, an expert
    misrouted everywhere) is far outside both."""
    path, ref = tiny_fixture(arch)
    prompt, decode = [int(t) for t in ref["input_ids"]], [int(t) for t in ref["decode_ids"]]
    with jax.default_device(jax.devices("cpu")[0]):
        exact = _logits(load_model(path, target="cpu", activation_dtype="float32"), prompt, decode)
        bf16 = agreement(exact, _logits(load_model(path, target="cpu", activation_dtype="bfloat16"), prompt, decode))
    h200 = agreement(exact, _logits(load_model(path, target="h200"), prompt, decode))
    record_gpu_result(f"h200_vs_cpu_target_{arch}", {"positions": len(exact), "h200": h200, "cpu_bfloat16": bf16})
    assert h200["decisive_positions"] >= len(exact) // 4, h200  # not a vacuous check
    assert h200["mean_kl"] <= 3 * bf16["mean_kl"] + 1e-3, (h200, bf16)
    assert h200["top1_agreement_where_decisive"] >= bf16["top1_agreement_where_decisive"] - 0.05, (h200, bf16)


@pytest.mark.parametrize("arch", ("qwen3_5", "qwen3_5_moe"))
def test_deterministic_mode_is_bit_exact_alone_and_under_load(arch):
    """The probe's greedy and seeded sampled tokens and logprobs are the same bits alone and beside 7 other
    requests of mixed lengths (their prefills join the probe's decode steps), in the target's own
    deterministic mode (its default `deterministic` policy)."""
    path, _ = tiny_fixture(arch)
    model = load_model(path, target="h200", kernel_policy=get_target("h200").policy)
    vocab = int(model.dims.vocab)
    rng = np.random.default_rng(3)
    probe = rng.integers(0, vocab, 90).tolist()
    greedy = dict(temperature=0.0, ignore_eos=True)
    others = [
        (rng.integers(0, vocab, int(n)).tolist(), SamplingParams(max_tokens=int(m), **greedy))
        for n, m in zip(rng.integers(3, 150, 7), rng.integers(5, 30, 7))
    ]
    config = EngineConfig(
        deterministic=True, num_blocks=8 * 16 + 1, max_model_len=256, max_num_seqs=8, max_batched_tokens=128
    )
    engine = Engine(model, ByteTokenizer(), config)
    same = {}
    try:
        for name, sampling in (
            ("greedy", SamplingParams(max_tokens=20, logprobs=3, **greedy)),
            ("sampled", SamplingParams(temperature=0.8, top_p=0.9, seed=5, ignore_eos=True, max_tokens=20, logprobs=3)),
        ):
            alone = outputs_of(engine, [(probe, sampling)], 0)
            loaded = outputs_of(engine, [others[0], (probe, sampling), *others[1:]], 1)
            assert len(alone[0]) == 20
            same[name] = loaded == alone
    finally:
        engine.close()
    record_gpu_result(f"deterministic_alone_vs_loaded_{arch}", same)
    assert all(same.values()), same
