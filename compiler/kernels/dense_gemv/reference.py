"""Projections (references): plain, biased, and packed (several weights sharing one input)."""

import jax.numpy as jnp


def linear(x, weight, bias=None):
    # x [N, k], weight [n, k] (rows are outputs, as HF and GGUF store them) -> [N, n]
    y = jnp.einsum("nk,ok->no", x, weight.astype(x.dtype))
    if bias is not None:
        y = y + bias.astype(y.dtype)
    return y


def linear_split(x, weight, bias=None, *, sizes):
    # weight [sum(sizes), k] packs several projections of the same input; returns one output per size
    y = linear(x, weight, bias)
    bounds, total = [], 0
    for size in sizes[:-1]:
        total += size
        bounds.append(total)
    return tuple(jnp.split(y, bounds, axis=-1))


def split_heads(x, *, heads):
    # [N, heads * dh] -> [N, heads, dh]
    return x.reshape(x.shape[0], heads, x.shape[1] // heads)


def merge_heads(x):
    # [N, heads, dh] -> [N, heads * dh]
    return x.reshape(x.shape[0], -1)
