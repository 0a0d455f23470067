"""Stored Responses (`store: true`, the default) for `previous_response_id` and `GET /v1/responses/{id}`:
in memory, least recently used first out, bounded in entries and in bytes, and kept apart per API key (a
response is visible only to requests that send the key that made it; without keys, all share one space).

Each entry keeps the response object and the conversation as Responses items: the previous response's
items, this request's input items and its output items. A request naming it as previous_response_id
continues from those items (its own `instructions` replace the old ones, as OpenAI's do).
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from dataclasses import dataclass

MAX_ENTRIES = 1024
MAX_BYTES = 64 * 2**20


@dataclass(frozen=True)
class StoredResponse:
    response: dict  # the response object, as GET returns it
    items: list[dict]  # the whole conversation up to and including this response's output items
    size: int  # bytes of both as JSON


class ResponseStore:
    def __init__(self, max_entries: int = MAX_ENTRIES, max_bytes: int = MAX_BYTES):
        self.max_entries, self.max_bytes = max_entries, max_bytes
        self._entries: OrderedDict[tuple[str, str], StoredResponse] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def put(self, owner: str, response: dict, items: list[dict]) -> None:
        size = len(json.dumps(response)) + len(json.dumps(items))
        if size > self.max_bytes:
            return  # larger than the whole store: not kept
        key = (owner, response["id"])
        with self._lock:
            self._drop(key)
            self._entries[key] = StoredResponse(response, items, size)
            self._bytes += size
            while len(self._entries) > self.max_entries or self._bytes > self.max_bytes:
                self._drop(next(iter(self._entries)))

    def get(self, owner: str, response_id: str) -> StoredResponse | None:
        with self._lock:
            entry = self._entries.get((owner, response_id))
            if entry is not None:
                self._entries.move_to_end((owner, response_id))
            return entry

    def delete(self, owner: str, response_id: str) -> bool:
        with self._lock:
            return self._drop((owner, response_id))

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def bytes(self) -> int:
        return self._bytes

    def _drop(self, key: tuple[str, str]) -> bool:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self._bytes -= entry.size
        return entry is not None


def owner_of(request) -> str:
    """Who a request speaks for: a digest of the API key it sent ("" without one)."""
    key = request.headers.get("x-api-key") or ""
    auth = request.headers.get("authorization", "")
    if auth.lower().startswith("bearer "):
        key = auth[7:].strip()
    return hashlib.sha256(key.encode()).hexdigest() if key else ""


def store_of(app) -> ResponseStore:
    store = getattr(app.ctx, "responses", None)
    if store is None:
        store = app.ctx.responses = ResponseStore()
    return store


def input_items(raw) -> list[dict]:
    """A request's `input` as items (a string is one user message)."""
    return [{"type": "message", "role": "user", "content": raw}] if isinstance(raw, str) else list(raw)
