"""Token embedding, constant scaling and row selection (references)."""

import jax.numpy as jnp

from ember.compiler.kernels.split_k import materialized


def embedding(ids, table):
    # ids [N] int32, table [vocab, d] -> [N, d]
    return jnp.take(table, ids, axis=0)


def scale(x, *, factor):
    return x * jnp.asarray(factor, dtype=x.dtype)


def select_rows(x, rows):
    # x [N, d], rows [R] -> [R, d]: only the rows whose logits the step needs
    return jnp.take(x, rows, axis=0)


def add(x, y):
    # y None: nothing to add (a plan with no layer left no residual add: passes/defer_residual_add.py);
    # split-K partials (split_k.py): summed first
    return x if y is None else x + materialized(y)
