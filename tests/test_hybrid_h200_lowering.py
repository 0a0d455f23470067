"""The h200 plans of the tiny hybrid / MoE checkpoints traced as for a GPU and lowered for CUDA on CPU: a mixed
step (decode rows and a prefill segment long enough for the chunked kernel) and a decode step launch the Gated
DeltaNet and MoE Triton kernels the target names, once per layer of their kind, with the plan's real arguments
(weights as loaded, the step's batch, the slot pools): what the GPU will run, short of running it."""

from __future__ import annotations

import collections
import re

import jax
import jax.numpy as jnp
import pytest
from fixture_data import tiny_fixture

from ember.compiler.batch import StepBatch
from ember.compiler.kernels.gated_delta import gpu as gated_delta_gpu
from ember.compiler.kernels.moe import gpu as moe_gpu
from ember.runtime.loading.model import load_model


def _batch(decode_rows: int, segment: int, kinds: int, slot_kinds: int | None) -> StepBatch:
    n = decode_rows + segment
    positions = jnp.concatenate([jnp.arange(decode_rows) + 5, jnp.arange(segment)]).astype(jnp.int32)
    slots = jnp.asarray(list(range(decode_rows)) + [decode_rows] * segment, jnp.int32)
    return StepBatch(
        tokens=jnp.zeros(n, jnp.int32),
        positions=positions,
        slots=jnp.zeros((kinds, n), jnp.int32),
        dec_block_tables=jnp.zeros((kinds, decode_rows, 8), jnp.int32),
        dec_ctx_lens=jnp.arange(decode_rows, dtype=jnp.int32) + 6,
        pre_block_table=jnp.zeros((kinds, 1, 8), jnp.int32),
        logit_rows=jnp.arange(decode_rows + 1, dtype=jnp.int32),
        state_slots=None if slot_kinds is None else jnp.broadcast_to(slots, (slot_kinds, n)),
    )


# (decode rows, prefill tokens): a mixed step whose segment >= gated_delta.chunked_min_tokens (64) and whose 72 rows
# > moe.gemv_max_rows (16); a decode step of 4 rows
STEPS = {"mixed": (2, 70), "decode": (4, 0)}


def _launched(arch: str, step: str, deterministic: bool):
    """(layer kinds, kernel name -> launches) of one step of `arch`'s h200 plan lowered for CUDA."""
    path, _ = tiny_fixture(arch)
    model = load_model(path, target="h200")
    plan = model.deterministic_plan() if deterministic else model.plan
    kv = model.new_kv(num_blocks=4, block_size=16, num_slots=3)
    decode_rows, segment = STEPS[step]
    batch = _batch(decode_rows, segment, len(model.paged_kinds), len(model.slot_kinds) or None)
    forward = jax.jit(model.traced(plan.module.forward), static_argnums=0)
    text = forward.trace(model.dims, model.params, kv, batch).lower(lowering_platforms=("cuda",)).as_text()
    return collections.Counter(model.resolved.layer_kinds), collections.Counter(
        re.findall(r'name = "(\w+_kernel)"', text)
    )


@pytest.fixture
def as_for_a_gpu(monkeypatch):
    for module in (gated_delta_gpu, moe_gpu):
        monkeypatch.setattr(module, "triton_available", lambda: True)


@pytest.mark.parametrize("step", list(STEPS))
@pytest.mark.parametrize("arch", ["qwen3_5", "qwen3_5_moe", "qwen3_moe"])
def test_h200_plans_launch_the_hybrid_kernels(arch, step, as_for_a_gpu):
    kinds, launched = _launched(arch, step, deterministic=False)
    decode_rows, segment = STEPS[step]
    mixers = sum(n for kind, n in kinds.items() if "linear_attention" in kind)
    moes = sum(n for kind, n in kinds.items() if "moe" in kind)
    assert launched["gated_delta_recurrent_kernel"] == mixers  # the decode rows
    assert launched["gated_delta_chunked_kernel"] == (mixers if segment else 0)  # the segment
    assert launched["gated_rms_norm_kernel"] == mixers
    moe_kernels = ("moe_grouped_gate_up_kernel", "moe_grouped_down_kernel")
    if decode_rows + segment <= 16:
        moe_kernels = ("moe_router_kernel", "moe_gate_up_kernel", "moe_down_kernel")
    assert all(launched[name] == moes for name in moe_kernels)
    assert sum(launched.values()) == mixers * (3 if segment else 2) + moes * len(moe_kernels)


@pytest.mark.parametrize("arch", ["qwen3_5_moe", pytest.param("qwen3_moe", marks=pytest.mark.slow)])
def test_deterministic_plans_give_prompt_tokens_a_decode_rows_arithmetic(arch, as_for_a_gpu):
    """The mixed step's segment through the recurrent kernel (one launch with the decode rows), its 72 rows
    through the MoE decode kernels: no chunked or grouped form, whose sums differ from a decode row's."""
    kinds, launched = _launched(arch, "mixed", deterministic=True)
    mixers = sum(n for kind, n in kinds.items() if "linear_attention" in kind)
    moes = sum(n for kind, n in kinds.items() if "moe" in kind)
    assert launched["gated_delta_recurrent_kernel"] == mixers and launched["gated_delta_chunked_kernel"] == 0
    assert all(launched[name] == moes for name in ("moe_router_kernel", "moe_gate_up_kernel", "moe_down_kernel"))
    assert not any("grouped" in name for name in launched)
