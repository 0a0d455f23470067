"""The MTP module on an NVIDIA GPU: the h200 plan's full-attention body (its kernels, bf16) under the MTP's
pre-fc part gives the cpu target's MTP logits on the tiny Qwen3.5-MoE, fed the same fp32 hidden states, for one
16-row pass and for single-row draft steps.

Run on the GPU machine with both platforms (the cpu target runs on the host's CPU there):
    JAX_PLATFORMS=cuda,cpu python -m pytest -q -m gpu tests/test_mtp_gpu.py
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

if jax.default_backend() != "gpu":
    pytest.skip("needs an NVIDIA GPU (JAX_PLATFORMS=cuda,cpu)", allow_module_level=True)

from fixture_data import tiny_fixture  # noqa: E402

from ember.runtime.execution.hidden_states import Embedder  # noqa: E402
from ember.runtime.loading.model import load_model  # noqa: E402
from ember.runtime.speculative.mtp_forward import MtpSequence  # noqa: E402

pytestmark = pytest.mark.gpu


def _agree(got: np.ndarray, want: np.ndarray) -> None:
    top1 = (got.argmax(axis=-1) == want.argmax(axis=-1)).mean()
    corr = np.corrcoef(got.ravel(), want.ravel())[0, 1]
    assert (
        top1 >= 0.75 and corr >= 0.999
    )  # bf16 vs fp32: the cpu target in bf16 gives 0.94 and 0.99998, (top1, corr, np.abs(got - want).max())


def test_h200_mtp_agrees_with_cpu():
    path, ref = tiny_fixture("qwen3_5_moe")
    with jax.default_device(jax.devices("cpu")[0]):
        cpu = load_model(path)
        tokens = [int(t) for t in ref["input_ids"][:17]]
        hidden = Embedder(cpu).hidden_states(tokens[:-1])
        want, _ = MtpSequence(cpu, 64).run(tokens[1:], 0, hidden)
        want_steps = MtpSequence(cpu, 64)
        want_steps.run(tokens[1:9], 0, hidden[:8])
        want_one = [want_steps.run([t], 8 + i, hidden[8 + i : 9 + i])[0] for i, t in enumerate(tokens[9:])]
    gpu = load_model(path, target="h200")
    assert gpu.has_mtp
    got, _ = MtpSequence(gpu, 64).run(tokens[1:], 0, hidden)
    _agree(got, want)
    steps = MtpSequence(gpu, 64)
    steps.run(tokens[1:9], 0, hidden[:8])
    got_one = [steps.run([t], 8 + i, hidden[8 + i : 9 + i])[0] for i, t in enumerate(tokens[9:])]
    _agree(np.concatenate(got_one), np.concatenate(want_one))


def test_h200_engine_mtp_drafts_from_its_steps_hidden_states():
    """`--speculative mtp` on the h200 plans: greedy output equals plain decoding's (up to a near-tie), and the drafter reads the
    hidden states the steps return (one target call per step, verify steps included; no hidden-state pass)."""
    from engine_support import ByteTokenizer, assert_same_up_to_a_near_tie, outputs_of

    from ember.runtime.engine.engine import Engine, EngineConfig
    from ember.runtime.execution.sequence_runner import SequenceRunner
    from ember.runtime.sampling.params import SamplingParams
    from ember.runtime.speculative.config import SpeculativeConfig

    path, ref = tiny_fixture("qwen3_5_moe")
    model = load_model(path, target="h200")
    base = {"num_blocks": 64, "max_model_len": 256, "max_num_seqs": 2, "max_batched_tokens": 64, "decode_steps": 1}
    prompt = [int(t) for t in ref["input_ids"][:24]]
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True, logprobs=2)

    def tokens(engine):
        return [t for o in engine.submit(prompt, params).collect()[0] for t in o.token_ids]

    plain = Engine(model, ByteTokenizer(), EngineConfig(**base))
    want = outputs_of(plain, [(prompt, params)], 0)
    plain.close()
    spec = SpeculativeConfig("mtp", 3, adaptive=False)
    engine = Engine(model, ByteTokenizer(), EngineConfig(**base, enable_prefix_caching=False, speculative=spec))
    calls, launches = [0], [0]
    executor = engine.executor
    step_fn, verify_fn, launch = executor.step_fn, executor.verify_fn, executor._launch
    executor.step_fn = lambda *a: (calls.__setitem__(0, calls[0] + 1), step_fn(*a))[1]
    executor.verify_fn = lambda *a: (calls.__setitem__(0, calls[0] + 1), verify_fn(*a))[1]
    executor._launch = lambda *a, **kw: (launches.__setitem__(0, launches[0] + 1), launch(*a, **kw))[1]
    runner_prefill, SequenceRunner.prefill = SequenceRunner.prefill, None  # a hidden-state pass would fail
    try:
        got = tokens(engine)
    finally:
        SequenceRunner.prefill = runner_prefill
        engine.close()
    assert_same_up_to_a_near_tie(got, want)  # bf16 verify segments against decode rows (not deterministic mode)
    assert engine.counters.speculation.num_draft_tokens > 0 and calls[0] == launches[0]
