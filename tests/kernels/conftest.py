"""Kernel tests, one folder per family (compiler/kernels/<family>/). Three kinds side by side: plain tests of
the references, plans and lowerings (the main CPU run); `interpret` tests of the Triton kernels themselves in
Triton's CPU interpreter (their own process with TRITON_INTERPRET=1: `./tools/test` starts it, or
`./tools/test --interpret`); `gpu` tests on an NVIDIA GPU."""

from __future__ import annotations

import os

import pytest

INTERPRETING = os.environ.get("TRITON_INTERPRET") == "1"

if INTERPRETING:
    from interpreter import patch_interpreter

    patch_interpreter()


@pytest.fixture(autouse=True)
def _interpreter_matches_marker(request):
    """An `interpret` test needs the interpreter (its kernels would otherwise be compiled for a GPU), and the
    interpreter's process runs nothing else: a clear failure, never a skip."""
    wants = request.node.get_closest_marker("interpret") is not None
    if wants != INTERPRETING:
        pytest.fail(
            "`interpret` tests run alone with TRITON_INTERPRET=1 (./tools/test --interpret); other tests without it"
        )
