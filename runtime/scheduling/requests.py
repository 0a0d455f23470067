"""The state of one generation request as the scheduler sees it.

One rule drives everything: the tokens a request still has to run through the model are
`num_tokens - num_computed_tokens`, where `num_tokens` counts the prompt plus every token generated so
far and `num_computed_tokens` counts the tokens whose KV is already in the pool. Chunked prefill
(advance by a chunk), prefix-cache hits (advance by the cached blocks at admission), plain decode
(one token) and preemption (back to 0, everything is recomputed) are all moves of that one counter;
speculative tokens will be too.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Any

from ..state.block_pool import StateAllocation


class RequestStatus(enum.Enum):
    WAITING = "waiting"  # queued, owns no state
    RUNNING = "running"  # admitted: owns state (KV blocks), prefilling or decoding
    PREEMPTED = "preempted"  # was running, its state was taken back; queued again, recomputes on return
    FINISHED_STOPPED = "stop"  # sampled a stop token (the engine also finishes a request on a stop string)
    FINISHED_LENGTH = "length"  # reached max_tokens
    FINISHED_ABORTED = "abort"  # aborted by the client or the server

    @property
    def is_finished(self) -> bool:
        return self in _FINISHED

    @property
    def finish_reason(self) -> str | None:
        """The OpenAI-style reason ("stop", "length", "abort"), None while not finished."""
        return self.value if self.is_finished else None


_FINISHED = frozenset({RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH, RequestStatus.FINISHED_ABORTED})


@dataclass(frozen=True)
class StepOutput:
    """What one step gave one request (the engine streams it)."""

    request_id: str
    new_token_ids: tuple[int, ...]
    finish_reason: str | None  # "stop" | "length" | None; aborts are the caller's own doing, not reported


@dataclass(eq=False)  # identity semantics: two requests are never "equal"
class Request:
    request_id: str
    prompt_token_ids: list[int]
    max_tokens: int  # generated tokens at most (the stop token, if sampled, counts as one)
    stop_token_ids: frozenset[int] = frozenset()  # empty for ignore_eos
    arrival_time: float = field(default_factory=time.monotonic)
    params: Any = None  # sampling settings etc.; opaque to the scheduler, carried for the engine
    prediction_ids: tuple[int, ...] = ()  # Predicted Outputs: the expected output's tokens (a draft source)

    output_token_ids: list[int] = field(default_factory=list, init=False)
    status: RequestStatus = field(default=RequestStatus.WAITING, init=False)
    num_computed_tokens: int = field(default=0, init=False)
    cached_tokens: int = field(default=0, init=False)  # prompt tokens served by the prefix cache (first admission)
    num_preemptions: int = field(default=0, init=False)
    state: dict[str, StateAllocation] = field(default_factory=dict, init=False)  # kind -> allocation, while RUNNING
    _token_ids: list[int] = field(default_factory=list, init=False, repr=False)  # prompt + output

    def __post_init__(self) -> None:
        self.prompt_token_ids = [int(t) for t in self.prompt_token_ids]
        if not self.prompt_token_ids:
            raise ValueError(f"request {self.request_id!r}: the prompt is empty")
        if self.max_tokens < 1:
            raise ValueError(f"request {self.request_id!r}: max_tokens must be >= 1, got {self.max_tokens}")
        self.stop_token_ids = frozenset(int(t) for t in self.stop_token_ids)
        self._token_ids = list(self.prompt_token_ids)

    # --- the one rule -------------------------------------------------------------------------------
    @property
    def num_tokens(self) -> int:
        """Prompt + generated so far."""
        return len(self._token_ids)

    @property
    def num_tokens_to_compute(self) -> int:
        return self.num_tokens - self.num_computed_tokens

    @property
    def all_token_ids(self) -> list[int]:
        """Prompt + output, in order (read-only view by convention: do not mutate)."""
        return self._token_ids

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status.is_finished

    @property
    def peak_context(self) -> int:
        """The most tokens whose KV this request can hold: prompt + max_tokens - 1 (the last sampled token is
        never computed). Its last decode step runs at position peak_context - 1."""
        return self.num_prompt_tokens + self.max_tokens - 1

    @property
    def block_table(self) -> list[int]:
        """The KV blocks of this request (empty unless RUNNING)."""
        kv = self.state.get("kv")
        return kv.block_table if kv is not None else []

    def append_output(self, token_id: int) -> None:
        token_id = int(token_id)
        self.output_token_ids.append(token_id)
        self._token_ids.append(token_id)

    def append_until_stop(self, token_ids) -> tuple[tuple[int, ...], RequestStatus | None]:
        """Append tokens one at a time until one finishes the request: (those appended, the finished status)."""
        taken: list[int] = []
        for token_id in token_ids:
            self.append_output(token_id)
            taken.append(int(token_id))
            if (status := self.stop_reason_after_append()) is not None:
                return tuple(taken), status
        return tuple(taken), None

    def stop_reason_after_append(self) -> RequestStatus | None:
        """The finished status the last appended token causes, if any."""
        if self.output_token_ids and self.output_token_ids[-1] in self.stop_token_ids:
            return RequestStatus.FINISHED_STOPPED
        if len(self.output_token_ids) >= self.max_tokens:
            return RequestStatus.FINISHED_LENGTH
        return None


class QueueFullError(RuntimeError):
    """Overload: the waiting queue is at max depth. The server answers 429/503 at once (not a ValueError:
    the request is fine, the server is busy)."""


class RequestTooLongError(ValueError):
    """The request could never fit the KV pool, even alone (prompt + max_tokens)."""
