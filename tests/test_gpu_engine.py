"""The engine on an NVIDIA GPU: the h200 target agrees with the cpu target on the same weights, and
deterministic mode is bit-exact alone vs under load. Random weights at the Qwen2.5-1.5B shape.

Run on the GPU machine with both platforms (the cpu target runs on the host's CPU there):
    JAX_PLATFORMS=cuda,cpu python -m pytest -q -m gpu tests/test_gpu_engine.py
EMBER_GPU_RESULTS=<file.json> records the measured agreement figures.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

if jax.default_backend() != "gpu":
    pytest.skip("needs an NVIDIA GPU (JAX_PLATFORMS=cuda,cpu)", allow_module_level=True)

from logit_agreement import agreement, record_gpu_result  # noqa: E402

from ember.compiler.spec import spec_for_arch  # noqa: E402
from ember.runtime.engine.engine import Engine, EngineConfig  # noqa: E402
from ember.runtime.execution.sequence_runner import SequenceRunner  # noqa: E402
from ember.runtime.loading.model import load_model  # noqa: E402
from ember.runtime.loading.synthetic import synthetic_checkpoint  # noqa: E402
from ember.runtime.sampling.params import SamplingParams  # noqa: E402
from ember.tools.bench_models import SYNTHETIC_SHAPES  # noqa: E402

pytestmark = pytest.mark.gpu
SHAPE = "qwen2.5-1.5b"
POSITIONS = 256


class _Detokenizer:
    eos_token_ids = ()

    def decode(self, ids, skip_special_tokens=False):
        return " ".join(str(int(t)) for t in ids)


def _checkpoint():
    arch, config = SYNTHETIC_SHAPES[SHAPE]
    return synthetic_checkpoint(spec_for_arch(arch), config)


def test_h200_plans_on_the_gpu_agree_with_the_cpu_target():
    """The two targets at one precision (the cpu target run in bfloat16 on the same weights), and the h200 plans
    against the cpu target's float32 too. Random weights make near ties: the median gap between the top two
    logits is 0.16 at logit std 1.0, and bf16 logits near 4 are 0.03125 apart. So the raw top-1 agreement is
    recorded, not asserted: at 488ea03 the cpu target in bfloat16 itself agrees with its float32 on 0.9375 of
    the positions (KL 3.0e-4), and every argmax the h200 plans moved against the bfloat16 cpu target (0.9375)
    sat on a tie or one bf16 step (docs/results/h200_gpu_agreement_8aa26ae.json); in a later run one sat 3 steps
    apart. Asserted: KL <= 1e-3 against both, and top-1 >= 0.99 where the reference's top two logits are more
    than four bf16 steps apart (a wrong kernel moves decisive argmaxes too)."""
    tokens = np.random.default_rng(7).integers(0, SYNTHETIC_SHAPES[SHAPE][1]["vocab_size"], POSITIONS).tolist()
    with jax.default_device(jax.devices("cpu")[0]):
        references = {
            dtype: SequenceRunner(load_model(_checkpoint(), target="cpu", activation_dtype=dtype), POSITIONS)
            .prefill(tokens, all_logits=True)
            .astype(np.float32)
            for dtype in ("bfloat16", "float32")
        }
    gpu_model = load_model(_checkpoint(), target="h200")
    fast = SequenceRunner(gpu_model, POSITIONS).prefill(tokens, all_logits=True).astype(np.float32)
    same_precision = agreement(references["bfloat16"], fast)
    vs_float32 = agreement(references["float32"], fast)
    record_gpu_result(
        "h200_vs_cpu_target",
        {
            "model": f"synthetic:{SHAPE}",
            "positions": POSITIONS,
            "cpu_target_bfloat16": same_precision,
            "cpu_target_float32": vs_float32,
        },
    )
    assert same_precision["mean_kl"] <= 1e-3 and vs_float32["mean_kl"] <= 1e-3, (same_precision, vs_float32)
    assert same_precision["decisive_positions"] >= POSITIONS // 2, same_precision  # not a vacuous check
    assert same_precision["top1_agreement_where_decisive"] >= 0.99, same_precision


def test_deterministic_mode_is_bit_exact_alone_and_under_load():
    model = load_model(_checkpoint(), target="h200")
    config = EngineConfig(
        num_blocks=8 * 40 + 1,
        max_model_len=600,
        max_num_seqs=8,
        max_batched_tokens=256,
        deterministic=True,
        enable_prefix_caching=False,
    )
    rng = np.random.default_rng(11)
    vocab = int(model.dims.vocab)
    probe = rng.integers(0, vocab, 200).tolist()
    params = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=48, logprobs=3)
    others = [
        (rng.integers(0, vocab, n).tolist(), SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=m))
        for n, m in ((17, 60), (333, 20), (90, 70), (5, 40), (250, 33), (128, 64), (61, 50))
    ]

    def run(batch, index):  # the outputs of batch[index]
        engine = Engine(model, _Detokenizer(), config)
        try:
            streams = [engine.submit(p, sp) for p, sp in batch]
            outs = [s.collect() for s in streams]
        finally:
            engine.close()
        probe_outputs = outs[index][0]
        return (
            [t for o in probe_outputs for t in o.token_ids],
            [(lp.token_id, lp.logprob, lp.top) for o in probe_outputs for lp in (o.logprobs or ())],
        )

    alone = run([(probe, params)], 0)
    loaded = run([others[0], (probe, params), *others[1:]], 1)
    record_gpu_result(
        "deterministic_alone_vs_loaded",
        {"model": f"synthetic:{SHAPE}", "tokens": len(alone[0]), "identical": alone == loaded},
    )
    assert len(alone[0]) == 48
    assert loaded == alone


def test_an_engine_keeping_executables_restarts_without_tracing(tmp_path):
    """Two engines over one model with keep_executables (what `ember serve` sets): the second one's
    precompile reads every step executable back from disk (runtime/execution/executable_cache.py: none traced), and
    both generate the same greedy tokens."""
    from ember.runtime.execution.executable_cache import CachedStep

    model = load_model(_checkpoint(), target="h200")
    config = EngineConfig(
        num_blocks=64,
        max_model_len=256,
        max_num_seqs=2,
        max_batched_tokens=64,
        keep_executables=True,
        enable_prefix_caching=False,
    )
    previous = jax.config.jax_compilation_cache_dir
    jax.config.update("jax_compilation_cache_dir", str(tmp_path))
    outputs, loaded, shapes = [], [], 0
    try:
        for _ in range(2):
            engine = Engine(model, _Detokenizer(), config)
            try:
                engine.precompile()
                prompt = np.random.default_rng(5).integers(0, int(model.dims.vocab), 40).tolist()
                stream = engine.submit(prompt, SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True))
                outputs.append([t for o in stream.collect()[0] for t in o.token_ids])
                functions = (engine.executor.step_fn, engine.executor.multi_step_fn)
                assert all(isinstance(fn, CachedStep) for fn in functions if fn is not None)
                loaded.append(sum(fn.loaded_from_disk for fn in functions if fn is not None))
                shapes = len(engine.executor.shapes())
            finally:
                engine.close()
    finally:
        jax.config.update("jax_compilation_cache_dir", previous)
    assert loaded[0] == 0 and loaded[1] >= shapes
    assert outputs[0] == outputs[1] and len(outputs[0]) == 24
