"""Two processes, one NVIDIA GPU each, joined by jax.distributed (NCCL between them), serving the tiny chat
model: one GPU's greedy answer, a clean SIGTERM, a killed follower failing requests in bounded time
(docs/design.md, "Sharding"). On a machine of at least 2 GPUs:
    python -m pytest -q -m gpu tests/test_multihost_gpu.py
(no JAX in this process: each `ember serve` takes its own GPU.)
"""

from __future__ import annotations

import shutil
import signal
import subprocess

import pytest
from server_support import LiveServer
from test_multihost import ARGS, Group, _chat, _fails_within_the_bound


def _gpu_count() -> int:
    if shutil.which("nvidia-smi") is None:
        return 0
    listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    return sum(line.startswith("GPU ") for line in listed.stdout.splitlines())


if _gpu_count() < 2:
    pytest.skip("needs 2 NVIDIA GPUs", allow_module_level=True)

pytestmark = pytest.mark.gpu
GPU = [
    {"JAX_PLATFORMS": "cuda", "CUDA_VISIBLE_DEVICES": str(i), "XLA_PYTHON_CLIENT_PREALLOCATE": "false"} for i in (0, 1)
]


def test_two_processes_one_gpu_each_serve_one_gpus_greedy_answer_and_stop_on_sigterm(tiny_chat_model):
    alone = LiveServer(tiny_chat_model, *ARGS, env=GPU[0], ready_timeout=300)
    try:
        expected = _chat(alone.url).json()
    finally:
        alone.stop()
    group = Group(tiny_chat_model, envs=(GPU[0], GPU[1]))
    try:
        answer = _chat(group.leader.url)
        assert answer.status_code == 200, group.logs()
        assert answer.json()["choices"][0]["message"] == expected["choices"][0]["message"]
        group.leader.signal(signal.SIGTERM)
        assert group.leader.process.wait(timeout=60) == 0, group.logs()
        assert group.follower.wait(timeout=60) == 0, group.logs()
    finally:
        group.close()


def test_a_killed_follower_on_its_gpu_fails_requests_within_the_bound(tiny_chat_model):
    group = Group(tiny_chat_model, silence_timeout="5", envs=(GPU[0], GPU[1]))
    try:
        _fails_within_the_bound(group, lambda: (group.follower.kill(), group.follower.wait()), served_first=True)
    finally:
        group.close()
