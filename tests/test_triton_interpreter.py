"""The Triton kernels themselves (not their jnp emulations) on this CPU: Triton's interpreter runs each kernel
of the h200 plans against its reference through the tools/check_* scripts (decode attention: 134 cases,
prefill attention: 16, quantized GEMV split-K and row-tile variants, the latter for Q4_K, Q6_K and Q8_0, and
Q4_K on int8 activations (dp4a); the RMSNorm kernels; RoPE + the K/V write; the q/k/v split). Each runs in its own process, because
TRITON_INTERPRET must be set before the kernels are decorated. ~2 minutes on 2 cores."""

import subprocess
import sys

import pytest

from ember.compiler.kernels.gguf_gemv.act_quant import act_terms

CHECKS = [
    ("check_quant_kernels", "interpret"),
    ("check_quant_kernels", "rows"),
    ("check_dp4a_kernels", "interpret"),
]
# the int8 activations' producers and the integer-dot GEMV again with the other number of terms (gguf_gemv/act_quant.py)
OTHER_TERMS = [
    ("check_dp4a_kernels", "interpret"),
    ("check_norm_kernels", "interpret"),
]
CASES = [(tool, mode, None) for tool, mode in CHECKS] + [(tool, mode, "other") for tool, mode in OTHER_TERMS]


@pytest.mark.parametrize("tool, mode, terms", CASES, ids=[f"{t}-{m}{'-other-terms' if o else ''}" for t, m, o in CASES])
def test_triton_kernels_match_their_references_in_the_interpreter(tool, mode, terms):
    policy = ["--policy", f"quant_gemv.act_terms={1 if act_terms() == 2 else 2}"] if terms else []
    done = subprocess.run(
        [sys.executable, "-m", f"ember.tools.dev.{tool}", mode, *policy], capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]  # the tools exit 1 on any mismatch
