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


def split_at(x, *, size):
    # x [..., n] -> (x[..., :size], x[..., size:])
    return x[..., :size], x[..., size:]


def sigmoid_gate(x, gate):
    # x [N, ...] times sigmoid(gate) read as x's rows: gate [N, ...] of x's size, or [N, 1] (one gate per row)
    g = gate.reshape(gate.shape[0], -1)
    g = g if g.shape[-1] == 1 else g.reshape(x.shape)
    return (x.astype(jnp.float32) * jax.nn.sigmoid(g.astype(jnp.float32))).astype(x.dtype)
