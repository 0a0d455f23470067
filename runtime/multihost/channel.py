"""The leader's line to its followers: length-prefixed pickles over one TCP connection per follower.

Why a socket of our own and not a JAX collective (multihost_utils.broadcast_one_to_all): a broadcast is itself a
collective, so a dead follower would hang the leader inside it, the very failure we must bound; a socket tells
the leader at once (EOF, a refused send) and lets followers prove they are alive between steps (heartbeats). The
messages are small (an executable's static arguments and one int32 input buffer), and both ends are the same
Ember build on a trusted network (pickle: never expose the port).

Leader → follower: messages (`send`). Follower → leader: a heartbeat byte every `heartbeat_s`.
"""

from __future__ import annotations

import pickle
import socket
import struct
import threading
import time
from collections.abc import Callable

_HEADER = struct.Struct("!Q")
HEARTBEAT = b"h"


class GroupFailedError(RuntimeError):
    """A process of the group died or stopped answering: the group cannot run another step."""


def _send_message(sock: socket.socket, message) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    sock.sendall(_HEADER.pack(len(data)) + data)


def _read_exact(sock: socket.socket, size: int) -> bytes | None:
    chunks, left = [], size
    while left:
        chunk = sock.recv(min(left, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


class LeaderChannel:
    """Accepts `followers` connections, then sends to all of them; watches their heartbeats. `failure` is the
    first reason the group broke (None while whole); `on_failure` is called once with it, from a watcher thread."""

    def __init__(self, address: tuple[str, int], followers: int, silence_s: float, accept_timeout_s: float = 300.0):
        self.silence_s = silence_s
        self.failure: str | None = None
        self.on_failure: Callable[[str], None] | None = None
        self._lock = threading.Lock()
        self._closed = False
        server = socket.create_server(address)  # the coordinator host: where the followers reach process 0
        server.settimeout(accept_timeout_s)
        self._socks: dict[int, socket.socket] = {}
        try:
            while len(self._socks) < followers:
                try:
                    sock, _ = server.accept()
                except TimeoutError as error:
                    raise GroupFailedError(
                        f"{len(self._socks)} of the group's {followers} other processes connected within "
                        f"{accept_timeout_s:g}s (is every `ember serve --process-id I` started?)"
                    ) from error
                sock.settimeout(None)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                process_id = struct.unpack("!I", _read_exact(sock, 4) or b"\0\0\0\0")[0]
                self._socks[process_id] = sock
        finally:
            server.close()
        self._last_seen = {pid: time.monotonic() for pid in self._socks}
        for pid, sock in self._socks.items():
            threading.Thread(target=self._listen, args=(pid, sock), name=f"ember-follower-{pid}", daemon=True).start()
        threading.Thread(target=self._watch, name="ember-heartbeats", daemon=True).start()

    def send(self, message) -> None:
        """To every follower, in order; GroupFailedError when the group is broken or a send fails."""
        with self._lock:
            self.check()
            for pid, sock in self._socks.items():
                try:
                    _send_message(sock, message)
                except OSError as error:
                    self.fail(f"process {pid} is gone ({type(error).__name__}: {error})")
                    raise GroupFailedError(self.failure) from error

    def check(self) -> None:
        if self.failure is not None:
            raise GroupFailedError(self.failure)

    def fail(self, reason: str) -> None:
        if self.failure is not None or self._closed:
            return
        self.failure = reason
        if self.on_failure is not None:
            self.on_failure(reason)

    @property
    def closed(self) -> bool:
        return self._closed

    def shutdown(self, message) -> None:
        """Send `message` (the followers' last: they close their end on it), then close. Marked closed first:
        a follower hanging up after it is not a failure."""
        with self._lock:
            whole = self.failure is None
            self._closed = True
            for sock in self._socks.values() if whole else ():
                try:
                    _send_message(sock, message)
                except OSError:
                    pass
        self.close()

    def close(self) -> None:
        self._closed = True
        for sock in self._socks.values():
            try:
                sock.close()
            except OSError:
                pass

    def _listen(self, pid: int, sock: socket.socket) -> None:
        while True:
            try:
                data = sock.recv(64)
            except OSError:
                data = b""
            if not data:
                self.fail(f"process {pid} of the group closed its connection (it died or was stopped)")
                return
            self._last_seen[pid] = time.monotonic()

    def _watch(self) -> None:
        while not self._closed and self.failure is None:
            now = time.monotonic()
            for pid, seen in self._last_seen.items():
                if now - seen > self.silence_s:
                    self.fail(f"process {pid} of the group sent no heartbeat for {now - seen:.1f}s")
            time.sleep(min(0.2, self.silence_s / 4))


class FollowerChannel:
    """Connects to the leader (retrying while it starts), sends heartbeats, receives its messages in order."""

    def __init__(self, address: tuple[str, int], process_id: int, heartbeat_s: float, connect_timeout_s: float = 300.0):
        deadline = time.monotonic() + connect_timeout_s
        while True:
            try:
                self._sock = socket.create_connection(address, timeout=5.0)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        self._sock.settimeout(None)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._sock.sendall(struct.pack("!I", process_id))
        self._stop = threading.Event()
        threading.Thread(target=self._beat, args=(heartbeat_s,), name="ember-heartbeat", daemon=True).start()

    def receive(self):
        """The next message; None when the leader's connection closed (or was reset: a killed leader's was)."""
        try:
            header = _read_exact(self._sock, _HEADER.size)
            if header is None:
                return None
            data = _read_exact(self._sock, _HEADER.unpack(header)[0])
        except ConnectionResetError:
            return None
        return None if data is None else pickle.loads(data)

    def close(self) -> None:
        self._stop.set()
        self._sock.close()

    def _beat(self, every_s: float) -> None:
        while not self._stop.wait(every_s):
            try:
                self._sock.sendall(HEARTBEAT)
            except OSError:
                return
