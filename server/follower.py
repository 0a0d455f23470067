"""`ember serve --process-id I` for I > 0: no HTTP server; load the same model onto this process's part of the
global mesh and run every step process 0 sends (runtime/multihost/mirror.py) until it says shutdown."""

from __future__ import annotations

import os
import sys

from .config import ServeConfig


def follow_leader(config: ServeConfig, group) -> int:
    from ..runtime.loading.known_models import resolve_model
    from ..runtime.loading.model import load_model
    from ..runtime.multihost.mirror import follow

    try:
        model = load_model(
            resolve_model(config.model, progress=False),
            target=config.target,
            kernel_policy=config.kernel_policy,
            precision=config.precision,
            mesh=config.mesh(),
        )
        code = follow(group, model)
    except Exception as error:  # noqa: BLE001 — whatever it was, the leader sees our connection close
        print(f"ember: error: process {group.process_id}: {type(error).__name__}: {error}", file=sys.stderr)
        code = 1
    return leave_group(code)


def leave_group(code: int) -> int:
    """Leave jax.distributed: its shutdown is a barrier of every process, which a clean stop passes; after a
    failure a peer may be gone, so exit at once instead of waiting for it."""
    if code != 0:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    import jax

    jax.distributed.shutdown()
    return 0
