"""Several processes serving one model over one global mesh (runtime/multihost/): two `ember serve` processes on
this machine, one CPU device each, joined by jax.distributed with gloo collectives. Process 0 serves HTTP and
schedules; process 1 runs the same step executables from process 0's packed inputs."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest
from server_support import LiveServer

from ember.runtime.multihost.group import GroupConfig, group_from_values
from ember.server.config import ServeConfig

ARGS = ("--max-num-seqs", "2", "--max-batched-tokens", "64", "--ctx", "256", "--no-precompile")
ONE_DEVICE = {"XLA_FLAGS": "--xla_force_host_platform_device_count=1", "JAX_PLATFORMS": "cpu"}
CHAT = {"messages": [{"role": "user", "content": "count"}], "max_tokens": 12, "temperature": 0, "seed": 0}


def _two_free_ports() -> int:
    """A port whose next port is free too (the coordinator's, and the step channel's beside it)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        try:
            with socket.socket() as s:
                s.bind(("127.0.0.1", port + 1))
            return port
        except OSError:
            continue
    raise RuntimeError("no two consecutive free ports")


class Group:
    """A follower subprocess (process 1) and the leader's LiveServer (process 0)."""

    def __init__(self, model, *extra: str, step_timeout: str = "20"):
        port = _two_free_ports()
        group = ["--coordinator", f"127.0.0.1:{port}", "--num-processes", "2", "--tensor-parallel", "2"]
        env = {**os.environ, **ONE_DEVICE, "EMBER_GROUP_STEP_TIMEOUT_S": step_timeout}
        self.follower_log = model.parent / f"follower-{port}.log"
        with open(self.follower_log, "w") as log:
            self.follower = subprocess.Popen(
                [sys.executable, "-m", "ember.tools.cli", "serve", "--model", str(model), *ARGS, *extra, *group]
                + ["--process-id", "1"],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
            )
        try:
            self.leader = LiveServer(model, *ARGS, *extra, *group, "--process-id", "0", env=env, ready_timeout=120)
        except BaseException:
            self.follower.kill()
            self.follower.wait()
            raise

    def logs(self) -> str:
        return f"--- leader\n{self.leader.log()}\n--- follower\n{self.follower_log.read_text()}"

    def close(self) -> None:
        self.leader.stop(timeout=20)
        if self.follower.poll() is None:
            self.follower.kill()
            self.follower.wait()


def _chat(url: str) -> httpx.Response:
    return httpx.post(url + "/v1/chat/completions", json=CHAT, timeout=60)


def test_group_settings_come_together_from_flags_or_the_environment():
    assert ServeConfig().group() is None
    config = ServeConfig(coordinator="10.0.0.1:7000", num_processes=2, process_id=1)
    assert config.group() == GroupConfig("10.0.0.1:7000", 2, 1)
    assert config.group().channel_address == ("10.0.0.1", 7001) and not config.group().is_leader
    with pytest.raises(ValueError, match="--num-processes and --process-id"):
        group_from_values("h:1", 2, None)
    with pytest.raises(ValueError, match="process-id must be in 0..1"):
        GroupConfig("h:1", 2, 2)
    with pytest.raises(ValueError, match="HOST:PORT"):
        GroupConfig("h", 2, 0)


def test_two_processes_serve_one_devices_greedy_tokens_and_stop_on_sigterm(tiny_chat_model):
    alone = LiveServer(tiny_chat_model, *ARGS, env=ONE_DEVICE, ready_timeout=120)
    try:
        expected = _chat(alone.url).json()
    finally:
        alone.stop()
    group = Group(tiny_chat_model)
    try:
        answer = _chat(group.leader.url)
        assert answer.status_code == 200, group.logs()
        body = answer.json()
        assert body["choices"][0]["message"] == expected["choices"][0]["message"]
        assert body["usage"]["completion_tokens"] == expected["usage"]["completion_tokens"] > 0
        group.leader.signal(signal.SIGTERM)
        assert group.leader.process.wait(timeout=30) == 0, group.logs()
        assert group.follower.wait(timeout=30) == 0, group.logs()
    finally:
        group.close()


def test_a_dead_follower_fails_requests_with_a_clear_error_within_the_bound(tiny_chat_model):
    group = Group(tiny_chat_model, step_timeout="5")
    try:
        assert _chat(group.leader.url).status_code == 200, group.logs()
        group.follower.kill()
        group.follower.wait()
        started = time.monotonic()
        answer = _chat(group.leader.url)
        assert time.monotonic() - started < 15
        assert answer.status_code >= 500 and "process group broke" in answer.text, answer.text
        health = httpx.get(group.leader.url + "/health", timeout=5)
        assert health.status_code == 503 and "process 1" in health.json()["error"], health.text
    finally:
        group.close()
