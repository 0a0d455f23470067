"""Whether a plan being traced now can launch Triton kernels: the GPU kernel modules' one switch
between their Triton kernels and the jnp twins that run anywhere (how CI exercises GPU plans on CPU)."""

from __future__ import annotations

import jax


def triton_available() -> bool:
    """True when tracing for a GPU and Triton imports (read at trace time: jit caches the choice). Kernels
    launch through triton/launch.py (XLA's own Triton pipeline), so Triton is all they need."""
    if jax.default_backend() != "gpu":
        return False
    try:
        import triton  # noqa: F401  (GPU-only dependency)
    except ImportError:
        return False
    return True
