"""Gated activations (references): act(gate) * up."""

import jax
import jax.numpy as jnp

ACTIVATIONS = {
    "silu": jax.nn.silu,
    "gelu_tanh": lambda x: jax.nn.gelu(x, approximate=True),
    "gelu": lambda x: jax.nn.gelu(x, approximate=False),
}


def gated_act(gate, up, *, act):
    return ACTIVATIONS[act](gate) * up


def gated_act_packed(gate_up, *, act):
    # gate_up [N, 2 * ffn]: gate and up projections computed by one packed matmul
    gate, up = jnp.split(gate_up, 2, axis=-1)
    return gated_act(gate, up, act=act)
