"""Speculation checked against the clock: the adaptive plan's cost model is an estimate (a verify token's share
of a step, a draft model's decode, a drafting step's own device call), and where it is wrong speculation can
cost more than it brings (on the 2-core CPU a 0.5B draft model accepted 56 of 58 draft tokens and still ran
0.16x plain: its proposals are host-driven device calls, far dearer than the model assumes). The gate measures
what each kind of step really yields, seconds per emitted token, and lets the plan's drafts through only while
drafting steps are not slower per token than plain ones.

A sample is the wall time between two consecutive scheduling steps of decode rows alone (`admit`, called
with the step's rows when the scheduler plans their drafts) over the tokens those rows emitted in between: it
covers the drafting, the verify or plain step(s), the host's reading of the results and, on a target that runs
plain steps ahead, every run-ahead call in between. An interval whose rows changed (a request arrived or left:
a prefill ran in it) is dropped. Each kind's figure is the median of its last RECENT samples (a step that
compiled a shape on first use is an outlier the median ignores, where a mean let one compile close the gate).
While drafting is the slower kind, every step decodes plainly but a drafting probe, first one in PROBE_EVERY
decisions, then half as often after each probe that leaves drafting the slower (up to one in MAX_PROBE_EVERY),
and never so often that the probes' measured extra time exceeds PROBE_BUDGET of plain decoding (up to one in
MAX_COSTLY_PROBE_EVERY): a draft model's probe also catches its KV up on every token since the last, a
prefill of the whole prompt on a request's first probe, which on the 2-core CPU cost ~1 s of a ~7 s answer
per probe; a probe that pays brings the spacing back to PROBE_EVERY;
while drafting pays, one in PROBE_EVERY decodes plainly to keep the plain figure current. Until both kinds have
MIN_SAMPLES, the plan's drafts go through, with plain probes four times as often to learn the baseline. A target
that runs plain steps ahead asks `would_draft` before chaining each call: those questions count as decisions,
so a probe comes due while the engine runs ahead, and the next scheduled step drafts.
"""

from __future__ import annotations

import math
import statistics
import time
from collections import deque
from collections.abc import Callable, Sequence

PROBE_EVERY = 16  # one step in this many takes the other kind, to keep both figures current
MAX_PROBE_EVERY = 256  # the drafting probes' spacing doubles up to this while drafting keeps losing
PROBE_BUDGET = 0.03  # losing drafting probes may cost at most this share of plain decoding's time
MAX_COSTLY_PROBE_EVERY = 4096  # ... which may space them up to this many decisions apart
MIN_SAMPLES = 3  # samples of each kind before the gate closes
RECENT = 9  # samples of each kind kept: their median is the kind's figure


class MeasuredGate:
    def __init__(self, clock: Callable[[], float] = time.perf_counter):
        self.clock = clock
        self.recent: dict[bool, deque[float]] = {True: deque(maxlen=RECENT), False: deque(maxlen=RECENT)}
        self._last: tuple[float, bool, dict[str, int]] | None = None  # (start, drafted, output lengths)
        self._decisions = 0
        self._probe_due = False
        self._closed_spacing = PROBE_EVERY  # decisions between drafting probes while drafting loses

    def admit(self, requests: Sequence, ks: dict[str, int]) -> dict[str, int]:
        """A scheduling step of these decode rows: closes the interval since the previous one, then returns the
        plan's ks, or none where drafting is measured to cost more per token (or a plain probe is due)."""
        now = self.clock()
        lengths = {r.request_id: len(r.output_token_ids) for r in requests}
        self._close(now, lengths)
        drafts = self._decide(any(ks.values()))
        if self._probe_due and drafts:  # a drafting probe: the next one comes later while drafting keeps losing
            self._closed_spacing = max(self._closed_spacing, min(2 * self._closed_spacing, MAX_PROBE_EVERY))
        self._probe_due = False
        self._last = (now, drafts, lengths)
        return ks if drafts else {rid: 0 for rid in ks}

    def would_draft(self, ks: dict[str, int]) -> bool:
        """Whether a step planned now would draft (a run-ahead target asks before chaining a plain call)."""
        return self._decide(any(ks.values()))

    @property
    def samples(self) -> dict[bool, int]:
        return {kind: len(recent) for kind, recent in self.recent.items()}

    @property
    def seconds_per_token(self) -> dict[bool, float]:
        return {kind: statistics.median(recent) if recent else 0.0 for kind, recent in self.recent.items()}

    @property
    def drafting_loses(self) -> bool:
        if min(self.samples.values()) < MIN_SAMPLES:
            return False
        figures = self.seconds_per_token
        return figures[True] > figures[False]

    def _decide(self, planned: bool) -> bool:
        self._decisions += 1
        loses = self.drafting_loses
        if not loses:
            self._closed_spacing = PROBE_EVERY
        spacing = self._closed_spacing if self.samples[False] >= MIN_SAMPLES else PROBE_EVERY // 4
        if self._decisions % spacing == 0:
            self._probe_due = True
        if not planned:
            return False
        return loses if self._probe_due else not loses

    def _close(self, now: float, lengths: dict[str, int]) -> None:
        last, self._last = self._last, None
        if last is None:
            return
        start, drafted, before = last
        if lengths.keys() != before.keys():
            return  # a row arrived or left: a prefill or a finish ran in the interval
        emitted = sum(lengths[rid] - before[rid] for rid in lengths)
        if emitted <= 0:
            return
        rate = (now - start) / emitted
        if drafted and self.recent[False]:
            plain = self.seconds_per_token[False]
            if rate <= plain:
                self._closed_spacing = PROBE_EVERY  # a probe that paid: look again soon
            else:  # what it cost over plain steps' time for its tokens, against a plain step's time
                extra_s, plain_step_s = (rate - plain) * emitted, plain * len(lengths)
                affordable = math.ceil(extra_s / (PROBE_BUDGET * plain_step_s))
                self._closed_spacing = max(self._closed_spacing, min(affordable, MAX_COSTLY_PROBE_EVERY))
        self.recent[drafted].append(rate)
