"""Whether a plan being traced now can launch Triton kernels: the GPU kernel modules' one switch
between their Triton kernels and the jnp twins that run anywhere (how CI exercises GPU plans on CPU)."""

from __future__ import annotations

import jax


def triton_available() -> bool:
    """True when tracing for a GPU and jax-triton imports (read at trace time: jit caches the choice)."""
    if jax.default_backend() != "gpu":
        return False
    try:
        import jax_triton  # noqa: F401  (GPU-only dependency)
    except ImportError:
        return False
    return True
