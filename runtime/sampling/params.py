"""A request's sampling settings on the host, and their packing into the arrays the on-device sampler reads.

`SamplingParams` is what a request asks for (the server translates each protocol into it; omitted fields
take the checkpoint's generation_config defaults through `from_generation_config`). `RowState` is one
sequence about to receive its next token; `pack_batch` turns a list of them into a `SamplingBatch` of
numpy arrays with static shapes (the caller moves them to the device).

Two fields change what a row emits rather than how it samples: `guided` (constrained decoding: the
grammar's allowed-token mask is packed per row, see `ember.runtime.sampling.guided`) and `forced_token_ids`
(teacher-forced scoring: step i emits forced_token_ids[i] and reports the logprobs generation would
have reported for it; the request ends after the last one with "length").
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from ember.compiler.kernels.sampling import GREEDY_EPSILON, SamplingBatch
from ember.runtime.sampling.guided import GuidedDecoding, GuidedMatcher, fill_masks, mask_words

MAX_N = 8  # choices per request
MAX_TOP_LOGPROBS = 20  # as in the OpenAI API
MAX_LOGIT_BIAS = 64  # entries per request; the default number of bias slots a plan packs
MAX_STOP_TOKEN_IDS = 16  # a plan's suppression slots must hold these plus the checkpoint's eos ids
LOGIT_BIAS_LIMIT = 100.0  # |bias| bound of the OpenAI API; -inf is also accepted and bans the token
PENALTY_LIMIT = 2.0  # |presence_penalty|, |frequency_penalty| bound of the OpenAI API
SEED_MODULUS = 2**32  # seeds live in a u32 on device; larger (or negative) seeds are taken modulo this

# generation_config.json keys that give defaults, and the field each fills
MAX_SAMPLING_TEMPERATURE = 1e6  # temperatures above this sample exactly as this one (see pack_batch)
_GENERATION_CONFIG_FIELDS = {
    "temperature": "temperature",
    "top_k": "top_k",
    "top_p": "top_p",
    "min_p": "min_p",
    "repetition_penalty": "repetition_penalty",
    "max_new_tokens": "max_tokens",
}


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0  # 0 = greedy
    top_k: int = 0  # 0 (or -1, vLLM's spelling) = off
    top_p: float = 1.0  # 1 = off
    min_p: float = 0.0  # 0 = off
    repetition_penalty: float = 1.0  # 1 = off; applies to prompt and output tokens
    presence_penalty: float = 0.0  # output tokens only
    frequency_penalty: float = 0.0  # output tokens only
    logit_bias: Mapping[int, float] | None = None  # token id -> added to its logit
    seed: int | None = None  # None: the engine picks one per request (`resolve_seed`)
    max_tokens: int | None = None  # None: up to the context length
    min_tokens: int = 0  # stop/eos ids are suppressed until this many tokens were generated
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None  # None: no logprobs; k: the sampled token's logprob plus the k most likely
    n: int = 1
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    guided: GuidedDecoding | None = None  # constrained decoding: the output follows this grammar
    # teacher-forced scoring: step i emits forced_token_ids[i] instead of sampling; stop strings, stop ids
    # and eos are not applied and the request ends with "length" after the last one
    forced_token_ids: tuple[int, ...] | None = None

    @property
    def is_greedy(self) -> bool:
        return self.temperature < GREEDY_EPSILON  # as the device sampler decides

    @property
    def has_penalties(self) -> bool:
        return self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0

    def validate(self, vocab_size: int) -> None:
        """Raise ValueError naming the first field whose value is out of range."""
        _check(_finite(self.temperature) and self.temperature >= 0, "temperature", self.temperature, "must be >= 0")
        _check(_is_int(self.top_k) and self.top_k >= -1, "top_k", self.top_k, "must be 0 (off) or a positive integer")
        _check(_finite(self.top_p) and 0 < self.top_p <= 1, "top_p", self.top_p, "must be in (0, 1]")
        _check(_finite(self.min_p) and 0 <= self.min_p <= 1, "min_p", self.min_p, "must be in [0, 1]")
        _check(
            _finite(self.repetition_penalty) and self.repetition_penalty > 0,
            "repetition_penalty",
            self.repetition_penalty,
            "must be > 0",
        )
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            _check(
                _finite(value) and abs(value) <= PENALTY_LIMIT,
                name,
                value,
                f"must be in [-{PENALTY_LIMIT:g}, {PENALTY_LIMIT:g}]",
            )
        self._validate_logit_bias(vocab_size)
        _check(self.seed is None or _is_int(self.seed), "seed", self.seed, "must be an integer")
        _check(
            self.max_tokens is None or (_is_int(self.max_tokens) and self.max_tokens >= 1),
            "max_tokens",
            self.max_tokens,
            "must be >= 1",
        )
        _check(_is_int(self.min_tokens) and self.min_tokens >= 0, "min_tokens", self.min_tokens, "must be >= 0")
        _check(
            self.max_tokens is None or self.min_tokens <= self.max_tokens,
            "min_tokens",
            self.min_tokens,
            f"must not exceed max_tokens ({self.max_tokens})",
        )
        _check(all(isinstance(s, str) and s for s in self.stop), "stop", self.stop, "must be non-empty strings")
        _check(
            len(self.stop_token_ids) <= MAX_STOP_TOKEN_IDS,
            "stop_token_ids",
            len(self.stop_token_ids),
            f"at most {MAX_STOP_TOKEN_IDS} ids",
        )
        for token in self.stop_token_ids:
            _check(
                _is_int(token) and 0 <= token < vocab_size, "stop_token_ids", token, f"ids must be in [0, {vocab_size})"
            )
        _check(
            self.logprobs is None or (_is_int(self.logprobs) and 0 <= self.logprobs <= MAX_TOP_LOGPROBS),
            "logprobs",
            self.logprobs,
            f"must be in [0, {MAX_TOP_LOGPROBS}]",
        )
        _check(_is_int(self.n) and 1 <= self.n <= MAX_N, "n", self.n, f"must be in [1, {MAX_N}]")
        self._validate_guided_and_forced(vocab_size)

    def _validate_guided_and_forced(self, vocab_size: int) -> None:
        if self.guided is not None:
            _check(isinstance(self.guided, GuidedDecoding), "guided", self.guided, "must be a GuidedDecoding")
            self.guided.validate()  # ValueError("guided.spec: ...")
        forced = self.forced_token_ids
        if forced is None:
            return
        _check(isinstance(forced, tuple) and len(forced) > 0, "forced_token_ids", forced, "must be a non-empty tuple")
        for token in forced:
            _check(
                _is_int(token) and 0 <= token < vocab_size,
                "forced_token_ids",
                token,
                f"ids must be in [0, {vocab_size})",
            )
        _check(
            self.max_tokens is None or self.max_tokens == len(forced),
            "max_tokens",
            self.max_tokens,
            f"must be omitted or equal the {len(forced)} forced tokens",
        )
        _check(self.guided is None, "guided", self.guided, "cannot be combined with forced_token_ids")
        _check(self.n == 1, "n", self.n, "must be 1 with forced_token_ids")

    def _validate_logit_bias(self, vocab_size: int) -> None:
        bias = self.logit_bias or {}
        _check(len(bias) <= MAX_LOGIT_BIAS, "logit_bias", len(bias), f"at most {MAX_LOGIT_BIAS} entries")
        for token, value in bias.items():
            _check(
                _is_int(token) and 0 <= token < vocab_size,
                "logit_bias",
                token,
                f"token ids must be in [0, {vocab_size})",
            )
            ok = isinstance(value, (int, float)) and (value == -math.inf or abs(value) <= LOGIT_BIAS_LIMIT)
            _check(ok, "logit_bias", value, f"values must be in [-{LOGIT_BIAS_LIMIT:g}, {LOGIT_BIAS_LIMIT:g}] or -inf")

    def suppressed_while_min_tokens(self, eos_token_ids: Sequence[int]) -> tuple[int, ...]:
        """The ids min_tokens holds back: the stop token ids, plus eos unless eos is ignored (as vLLM)."""
        ids = list(self.stop_token_ids) + ([] if self.ignore_eos else list(eos_token_ids))
        return tuple(dict.fromkeys(int(i) for i in ids))

    @classmethod
    def from_generation_config(cls, gen_cfg: Mapping[str, Any] | None, **overrides: Any) -> SamplingParams:
        """Settings with the checkpoint's generation_config.json as defaults for the fields a request omits.

        Only keys the config actually sets count (vLLM's rule; HF's implicit top_k=50 is not invented):
        temperature, top_k, top_p, min_p, repetition_penalty, and max_new_tokens for max_tokens.
        `do_sample: false` makes the default greedy. An override of None means "omitted".
        """
        gen_cfg = gen_cfg or {}
        defaults: dict[str, Any] = {}
        for key, name in _GENERATION_CONFIG_FIELDS.items():
            if gen_cfg.get(key) is not None:
                defaults[name] = _as_field_type(name, gen_cfg[key])
        if gen_cfg.get("do_sample") is False:
            defaults["temperature"] = 0.0
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise TypeError(f"SamplingParams has no field(s) {', '.join(unknown)}")
        defaults.update({name: value for name, value in overrides.items() if value is not None})
        if isinstance(defaults.get("stop"), str):
            defaults["stop"] = (defaults["stop"],)
        for name in ("stop", "stop_token_ids", "forced_token_ids"):
            if name in defaults:
                defaults[name] = tuple(defaults[name])
        return cls(**defaults)


def _as_field_type(name: str, value: Any) -> Any:
    return int(value) if name in ("top_k", "max_tokens") else float(value)


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _check(ok: bool, name: str, value: Any, rule: str) -> None:
    if not ok:
        raise ValueError(f"{name}: {rule}, got {value!r}")


def resolve_seed(params: SamplingParams) -> int:
    """The u32 seed a request uses: its own (modulo 2**32), or a random one chosen once per request."""
    return params.seed % SEED_MODULUS if params.seed is not None else secrets.randbits(32)


def choice_seed(request_seed: int, choice_index: int) -> int:
    """The seed of choice `choice_index` of an n > 1 request: seed + index (as vLLM), wrapped to u32."""
    return (request_seed + choice_index) % SEED_MODULUS


@dataclass(frozen=True)
class RowState:
    """One sequence about to receive a token: what the sampler needs to know about it."""

    params: SamplingParams
    seed: int  # the seed actually used (resolve_seed / choice_seed), fixed for the request's lifetime
    prompt_ids: Sequence[int]
    output_ids: Sequence[int]  # generated so far
    min_tokens_suppress_ids: Sequence[int] = ()  # params.suppressed_while_min_tokens(eos ids)
    step: int | None = None  # index of the token being sampled; None = len(output_ids)
    matcher: GuidedMatcher | None = None  # the choice's grammar state (params.guided), advanced by the engine

    @property
    def token_index(self) -> int:
        return len(self.output_ids) if self.step is None else self.step

    @property
    def forced_token(self) -> int | None:
        """The id this step must emit (params.forced_token_ids), or None to sample."""
        forced = self.params.forced_token_ids
        return int(forced[self.token_index]) if forced is not None and self.token_index < len(forced) else None

    @property
    def min_tokens_in_force(self) -> bool:
        return self.token_index < self.params.min_tokens

    @property
    def history_length(self) -> int:
        """History slots this row needs: prompt + output, or none when no penalty reads it."""
        return len(self.prompt_ids) + len(self.output_ids) if self.params.has_penalties else 0


def history_length_needed(rows: Sequence[RowState]) -> int:
    """The smallest history bucket `pack_batch` accepts for these rows."""
    return max((row.history_length for row in rows), default=0)


def pack_batch(
    rows: Sequence[RowState],
    *,
    vocab_size: int,
    history_bucket: int,
    bias_slots: int = MAX_LOGIT_BIAS,
    suppress_slots: int = 8,
    num_rows: int | None = None,
) -> SamplingBatch:
    """Pack rows into a SamplingBatch of numpy arrays: R = num_rows (default len(rows)); rows past
    len(rows) are inert padding (greedy, no bias, no history, all tokens allowed). Rows with a matcher get
    their grammar's allowed-token mask (computed here, on the caller's thread). Raises ValueError when a
    row does not fit the static slots (history_bucket, bias_slots, suppress_slots)."""
    count = len(rows) if num_rows is None else num_rows
    if count < len(rows):
        raise ValueError(f"num_rows: {count} is fewer than the {len(rows)} rows given")
    batch = _inert_batch(count, history_bucket, bias_slots, suppress_slots, mask_words(vocab_size))
    for r, row in enumerate(rows):
        p = row.params
        # past float32's range a temperature would overflow to inf and turn -inf logits into NaN; far
        # below that, sampling is already uniform over the allowed tokens, so the cap changes nothing
        batch.temperature[r] = min(p.temperature, MAX_SAMPLING_TEMPERATURE)
        batch.top_k[r] = max(p.top_k, 0) if p.top_k < vocab_size else 0  # k >= V keeps everything
        batch.top_p[r] = p.top_p
        batch.min_p[r] = p.min_p
        batch.repetition_penalty[r] = p.repetition_penalty
        batch.presence_penalty[r] = p.presence_penalty
        batch.frequency_penalty[r] = p.frequency_penalty
        batch.seed[r] = row.seed % SEED_MODULUS
        batch.step[r] = row.token_index
        _pack_bias(batch, r, p.logit_bias or {}, bias_slots)
        _pack_history(batch, r, row, history_bucket)
        if row.min_tokens_in_force:
            ids = tuple(dict.fromkeys(row.min_tokens_suppress_ids))
            if len(ids) > suppress_slots:
                raise ValueError(f"row {r}: {len(ids)} ids to suppress exceed the {suppress_slots} suppression slots")
            batch.suppress_ids[r, : len(ids)] = ids
        forced = row.forced_token
        if forced is not None:
            batch.forced_token[r] = forced
            batch.temperature[r] = 0.0  # nothing is drawn: greedy skips the noise (logprobs do not change)
    fill_masks(
        [(row.matcher, r) for r, row in enumerate(rows) if row.matcher is not None], batch.allowed_mask, vocab_size
    )
    return batch


def _inert_batch(rows: int, history: int, bias: int, suppress: int, mask_width: int) -> SamplingBatch:
    return SamplingBatch(
        temperature=np.zeros(rows, np.float32),
        top_k=np.zeros(rows, np.int32),
        top_p=np.ones(rows, np.float32),
        min_p=np.zeros(rows, np.float32),
        repetition_penalty=np.ones(rows, np.float32),
        presence_penalty=np.zeros(rows, np.float32),
        frequency_penalty=np.zeros(rows, np.float32),
        seed=np.zeros(rows, np.uint32),
        step=np.zeros(rows, np.int32),
        bias_ids=np.full((rows, bias), -1, np.int32),
        bias_values=np.zeros((rows, bias), np.float32),
        history_ids=np.full((rows, history), -1, np.int32),
        history_is_output=np.zeros((rows, history), bool),
        suppress_ids=np.full((rows, suppress), -1, np.int32),
        allowed_mask=np.full((rows, mask_width), -1, np.int32),
        forced_token=np.full(rows, -1, np.int32),
    )


def _pack_bias(batch: SamplingBatch, r: int, bias: Mapping[int, float], slots: int) -> None:
    if len(bias) > slots:
        raise ValueError(f"row {r}: logit_bias has {len(bias)} entries, more than the {slots} bias slots")
    ids = [int(token) for token in bias]  # a dict: each id once, so the device add never doubles one
    batch.bias_ids[r, : len(ids)] = ids
    batch.bias_values[r, : len(ids)] = [float(bias[token]) for token in bias]


def _pack_history(batch: SamplingBatch, r: int, row: RowState, bucket: int) -> None:
    if row.history_length == 0:
        return  # no penalty reads the history: leave it empty
    if row.history_length > bucket:
        raise ValueError(f"row {r}: {row.history_length} history tokens exceed the history bucket of {bucket}")
    prompt, output = len(row.prompt_ids), len(row.output_ids)
    batch.history_ids[r, :prompt] = row.prompt_ids
    batch.history_ids[r, prompt : prompt + output] = row.output_ids
    batch.history_is_output[r, prompt : prompt + output] = True
