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
from server_support import SERVER_ARGS, LiveServer

from ember.runtime.multihost.group import GroupConfig, group_from_values
from ember.server.config import ServeConfig

# the session's one-process `server` fixture's engine settings (its answer is the reference), compiled lazily
ARGS = (*SERVER_ARGS, "--no-precompile")
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

    def __init__(
        self, model, *extra: str, silence_timeout: str = "10", envs: tuple[dict, dict] = (ONE_DEVICE, ONE_DEVICE)
    ):
        """envs: process 0's and process 1's environment (their devices)."""
        port = _two_free_ports()
        group = ["--coordinator", f"127.0.0.1:{port}", "--num-processes", "2", "--tensor-parallel", "2"]
        env = {**os.environ, "EMBER_GROUP_SILENCE_TIMEOUT_S": silence_timeout}
        self.follower_log = model.parent / f"follower-{port}.log"
        with open(self.follower_log, "w") as log:
            self.follower = subprocess.Popen(
                [sys.executable, "-m", "ember.tools.cli", "serve", "--model", str(model), *ARGS, *extra, *group]
                + ["--process-id", "1"],
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**env, **envs[1]},
            )
        try:
            self.leader = LiveServer(
                model, *ARGS, *extra, *group, "--process-id", "0", env={**env, **envs[0]}, ready_timeout=120
            )
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


def test_two_processes_serve_one_devices_greedy_tokens_and_stop_on_sigterm(server, tiny_chat_model):
    expected = _chat(server.url).json()
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


def _fails_within_the_bound(group: Group, stop_follower, *, served_first: bool) -> None:
    """After stop_follower(), the next request ends with the group's error within the silence timeout (+ slack),
    /health says why, and process 0 stays up to say it. served_first: a request is served before (its step
    shapes compiled, so the next step waits inside a collective rather than in a compile)."""
    if served_first:
        assert _chat(group.leader.url).status_code == 200, group.logs()
    stop_follower()
    started = time.monotonic()
    answer = _chat(group.leader.url)
    assert time.monotonic() - started < 15, group.logs()
    assert answer.status_code >= 500 and "process group broke" in answer.text, answer.text
    health = httpx.get(group.leader.url + "/health", timeout=5)
    assert health.status_code == 503 and "process 1" in health.json()["error"], health.text
    assert group.leader.process.poll() is None


def test_a_dead_follower_fails_requests_with_a_clear_error_within_the_bound(tiny_chat_model):
    group = Group(tiny_chat_model, silence_timeout="5")
    try:
        # no request first: CI time (the slow test below serves one before stopping its follower)
        _fails_within_the_bound(group, lambda: (group.follower.kill(), group.follower.wait()), served_first=False)
    finally:
        group.close()


@pytest.mark.slow
def test_a_hung_follower_fails_requests_within_the_bound(tiny_chat_model):
    """A stopped follower keeps its sockets open: no error reaches process 0, whose step would wait inside the
    collective forever; its silence (no heartbeat) fails the group instead."""
    group = Group(tiny_chat_model, silence_timeout="5")
    try:
        _fails_within_the_bound(group, lambda: group.follower.send_signal(signal.SIGSTOP), served_first=True)
    finally:
        group.follower.send_signal(signal.SIGCONT)
        group.close()


def test_the_channel_delivers_in_order_and_reports_a_closed_or_silent_follower():
    import threading

    from ember.runtime.multihost.channel import FollowerChannel, GroupFailedError, LeaderChannel

    port = _two_free_ports()
    followers: list[FollowerChannel] = []
    # follower 1 beats every 0.05 s; follower 2 never does (its heartbeat period is longer than the test)
    starters = [
        threading.Thread(
            target=lambda pid=pid, beat=beat: followers.append(FollowerChannel(("127.0.0.1", port), pid, beat))
        )
        for pid, beat in ((1, 0.05), (2, 60.0))
    ]
    for thread in starters:
        thread.start()
    leader = LeaderChannel(("127.0.0.1", port), 2, silence_s=1.0)
    for thread in starters:
        thread.join()
    reasons: list[str] = []
    leader.on_failure = reasons.append
    leader.send(("call", "step_fn", (1, 2), (b"x",)))
    leader.send(("shutdown",))
    for follower in followers:
        assert follower.receive() == ("call", "step_fn", (1, 2), (b"x",))
        assert follower.receive() == ("shutdown",)
    deadline = time.monotonic() + 5
    while not reasons and time.monotonic() < deadline:
        time.sleep(0.05)
    assert reasons == [leader.failure] and "process 2" in leader.failure and "no heartbeat" in leader.failure
    with pytest.raises(GroupFailedError, match="process 2"):
        leader.send(("shutdown",))
    leader.close()
    for follower in followers:
        follower.close()


def test_a_follower_that_closes_its_connection_breaks_the_group_at_once():
    import threading

    from ember.runtime.multihost.channel import FollowerChannel, LeaderChannel

    port = _two_free_ports()
    followers: list[FollowerChannel] = []
    starter = threading.Thread(target=lambda: followers.append(FollowerChannel(("127.0.0.1", port), 1, 0.05)))
    starter.start()
    leader = LeaderChannel(("127.0.0.1", port), 1, silence_s=30.0)
    starter.join()
    followers[0].close()
    deadline = time.monotonic() + 2
    while leader.failure is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert leader.failure is not None and "process 1" in leader.failure and "closed its connection" in leader.failure
    leader.close()


def test_a_step_that_does_not_return_within_the_bound_breaks_the_group():
    """The watchdog: a collect still waiting after the step timeout (a collective that never ends while every
    process still beats) fails the group, and every later call is refused before it reaches the device."""
    import threading
    from types import SimpleNamespace

    from ember.runtime.multihost.channel import FollowerChannel, GroupFailedError
    from ember.runtime.multihost.mirror import LeaderGroup

    port = _two_free_ports()
    followers: list[FollowerChannel] = []
    starter = threading.Thread(target=lambda: followers.append(FollowerChannel(("127.0.0.1", port + 1), 1, 0.05)))
    starter.start()
    leader = LeaderGroup(GroupConfig(f"127.0.0.1:{port}", 2, 0, silence_timeout_s=30.0, step_timeout_s=0.5))
    starter.join()
    calls: list = []
    executor = SimpleNamespace(
        step_fn=lambda dims, *args: calls.append(args) or ("packed", "kv"),
        verify_fn=None,
        collect=lambda in_flight: time.sleep(2.0) or ["sampled"],
    )
    reasons: list[str] = []
    leader.on_failure(reasons.append)
    leader.attach(executor, "engine config")
    assert followers[0].receive() == ("config", "engine config")
    assert executor.step_fn("dims", "layout", 0, True, "params", "kv", b"inputs") == ("packed", "kv")
    assert followers[0].receive() == ("call", "step_fn", ("layout", 0, True), (b"inputs",))
    started = time.monotonic()
    executor.collect("in flight")  # returns after 2 s; the watchdog fired at 0.5 s
    time.sleep(0.2)
    assert reasons and "did not return within" in reasons[0] and time.monotonic() - started < 3
    with pytest.raises(GroupFailedError, match="did not return"):
        executor.step_fn("dims", "layout", 0, True, "params", "kv", b"inputs")
    assert len(calls) == 1
    leader.close()
    followers[0].close()


def test_a_group_runs_one_decode_step_per_call_and_refuses_what_it_cannot_mirror_yet():
    from types import SimpleNamespace

    from ember.runtime.engine.config import EngineConfig
    from ember.runtime.multihost.mirror import group_engine_config
    from ember.runtime.speculative.config import SpeculativeConfig

    dense = SimpleNamespace(slot_kinds=())
    assert group_engine_config(dense, EngineConfig(decode_steps=8)).decode_steps == 1
    ngram = EngineConfig(speculative=SpeculativeConfig("ngram"))
    assert group_engine_config(dense, ngram).speculative == ngram.speculative
    with pytest.raises(ValueError, match="recurrent state"):
        group_engine_config(SimpleNamespace(slot_kinds=("mamba",)), EngineConfig())
    with pytest.raises(ValueError, match="host tier"):
        group_engine_config(dense, EngineConfig(prefix_cache_host_bytes=1 << 20))
    with pytest.raises(ValueError, match="--speculative mtp"):
        group_engine_config(dense, EngineConfig(speculative=SpeculativeConfig("mtp")))


@pytest.mark.slow
def test_a_follower_exits_when_its_leader_dies(tiny_chat_model):
    group = Group(tiny_chat_model)
    try:
        group.leader.process.kill()
        code = group.follower.wait(timeout=15)
        # our channel sees the leader gone (exit 1), unless JAX's coordination client, whose service lived in the
        # leader, aborts the process first (SIGABRT): both react to the same dead socket, so either may win
        assert code in (1, -signal.SIGABRT), group.logs()
        if code == 1:
            assert "leader is gone" in group.follower_log.read_text()
    finally:
        group.close()


def test_followers_hanging_up_on_shutdown_is_not_a_failure():
    """The followers close their end as soon as they read `shutdown`; process 0 must not take that for a death
    (it would exit 1 instead of 0)."""
    import threading

    from ember.runtime.multihost.channel import FollowerChannel, LeaderChannel

    port = _two_free_ports()
    followers: list[FollowerChannel] = []
    starter = threading.Thread(target=lambda: followers.append(FollowerChannel(("127.0.0.1", port), 1, 0.05)))
    starter.start()
    leader = LeaderChannel(("127.0.0.1", port), 1, silence_s=30.0)
    starter.join()

    def follow():
        assert followers[0].receive() == ("shutdown",)
        followers[0].close()

    follower = threading.Thread(target=follow)
    follower.start()
    leader.shutdown(("shutdown",))
    follower.join()
    time.sleep(0.3)
    assert leader.failure is None
