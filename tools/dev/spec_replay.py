"""A replay drafter for measuring speculative decoding where real weights cannot go (the H200 machine: synthetic
models, random weights): it plays back the acceptance a real drafter had with the real target on the CPU.

The CPU measurement (tools/dev/spec_acceptance.py, docs/results/cpu_spec_acceptance_*.json) records per drafter,
workload and k how often a step drafted, how long its drafts were and P(draft i accepted | drafts 0..i-1
accepted). `ReplayProfile` holds those rates. `ReplayDrafter` is a real `Drafter` for greedy requests whose
greedy continuation it was given (`record`: a plain run of the same prompt on the same model): at each proposal
it draws (seeded) whether to draft, how many tokens, and for each position whether the draft is right (the
target's own next token) or wrong (any other token). The engine's real verify then accepts exactly the leading
right drafts; rollback, KV and scheduling are the engine's own code. So the acceptance is the recorded one and
the cost is the real one. A draft model's drafting cost is charged by a `cost_drafter` (the synthetic draft
model's real `ModelDrafter`: its catch-up chunk and k - 1 decodes per proposal, whose tokens are thrown away).

A benchmark tool, not a serving option: it knows the answer in advance. Sampled rows get no drafts.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ember.runtime.speculative.drafter import Draft, DraftContext, Drafter
from ember.runtime.speculative.stats import AcceptanceStats


@dataclass(frozen=True)
class ReplayProfile:
    """One drafter's recorded behaviour as rates (k = len(acceptance)).

    draft_rate: P(a proposal drafts at all) (lookup drafters find nothing at many positions).
    length_survival[i]: P(a draft has more than i tokens | it drafts); [0] == 1, non-increasing.
    acceptance[i]: P(draft i accepted | drafts 0..i-1 accepted and it has a token i).
    """

    draft_rate: float
    length_survival: tuple[float, ...]
    acceptance: tuple[float, ...]
    label: str = ""

    def __post_init__(self) -> None:
        if len(self.length_survival) != len(self.acceptance) or not self.acceptance:
            raise ValueError("length_survival and acceptance need one rate per draft position (at least one)")
        rates = (self.draft_rate, *self.length_survival, *self.acceptance)
        if not all(0.0 <= r <= 1.0 for r in rates):
            raise ValueError(f"rates must lie in [0, 1]: {rates}")

    @property
    def k(self) -> int:
        return len(self.acceptance)

    @classmethod
    def from_counts(cls, counts: dict, label: str = "") -> ReplayProfile:
        """From AcceptanceStats-style counts (steps, num_drafts, drafted / accepted / reached per position)."""
        drafts = counts["num_drafts"]
        drafted, accepted, reached = (
            counts["drafted_per_position"],
            counts["accepted_per_position"],
            counts["reached_per_position"],
        )
        return cls(
            draft_rate=drafts / counts["steps"] if counts["steps"] else 0.0,
            length_survival=tuple(d / drafts if drafts else 0.0 for d in drafted),
            acceptance=tuple(a / r if r else 0.0 for a, r in zip(accepted, reached)),
            label=label,
        )

    @classmethod
    def fixed(cls, k: int, acceptance: float = 0.0, label: str = "") -> ReplayProfile:
        """Always k drafts, each accepted (after the ones before it) with the same rate: 0 = every draft wrong,
        so each verify step emits one token (the verify step's cost at k, alone)."""
        return cls(1.0, (1.0,) * k, (acceptance,) * k, label or f"fixed k={k} acceptance={acceptance}")

    def capped(self, k: int) -> ReplayProfile:
        """The same rates for at most k drafts (a k = 8 recording replayed with k = 4)."""
        return ReplayProfile(self.draft_rate, self.length_survival[:k], self.acceptance[:k], self.label)

    def to_dict(self) -> dict:
        return {
            "label": self.label,
            "k": self.k,
            "draft_rate": round(self.draft_rate, 4),
            "length_survival": [round(r, 4) for r in self.length_survival],
            "acceptance": [round(r, 4) for r in self.acceptance],
        }


def drafter_label(drafter: dict) -> str:
    """A recorded run's drafter as one key: 'ngram' (min_match 2, max_match 4: the engine's default), 'ngram
    min_match=1', ..., or 'draft' (the 0.5B draft model, greedy)."""
    if drafter["kind"] == "ngram":
        extra = [f"{k}={drafter[k]}" for k, default in (("min_match", 2), ("max_match", 4)) if drafter[k] != default]
        return " ".join(["ngram", *extra])
    return drafter["kind"]


def load_profiles(path: str | Path) -> dict[tuple[str, str, int], ReplayProfile]:
    """(workload, drafter_label, k) -> its profile, from a cpu_spec_acceptance JSON's runs (their totals)."""
    recorded = json.loads(Path(path).read_text())
    profiles = {}
    for run in recorded["runs"]:
        label = drafter_label(run["drafter"])
        for result in run["results"]:
            key = (run["workload"], label, int(result["k"]))
            name = f"{run['workload']} / {label} / k={result['k']} (commit {run.get('commit', '?')})"
            profiles[key] = ReplayProfile.from_counts(result["total"], name)
    return profiles


class ReplayDrafter:
    """A `Drafter` replaying a profile against the recorded greedy continuations of its requests' prompts."""

    def __init__(self, profile: ReplayProfile, vocab: int, seed: int = 0, cost_drafter: Drafter | None = None):
        self.profile, self.vocab, self.cost_drafter = profile, vocab, cost_drafter
        self.rng = np.random.default_rng(seed)
        self.references: dict[tuple[int, ...], tuple[int, ...]] = {}  # prompt -> the target's greedy output
        # what was handed to the verifier: drafts and how many of their leading tokens are the target's (the
        # engine's AcceptanceStats must count exactly these, whatever it truncates aside)
        self.intended = AcceptanceStats()
        self.off_reference = 0  # proposals for a context that left its recorded continuation (or has none)
        self.drafting_s = 0.0  # wall seconds inside cost_drafter (the draft model's real work)
        self._followed: dict[str, list] = {}  # request id -> [its reference or None once off it, output checked]

    def reset(self, profile: ReplayProfile, seed: int) -> None:
        """Replay `profile` from a fresh seeded stream (the same seed over the same requests: the same drafts)."""
        self.profile, self.rng = profile, np.random.default_rng(seed)

    def record(self, prompt_ids, output_ids) -> None:
        """The target's greedy output for this prompt (a plain run's, on the same model)."""
        self.references[tuple(int(t) for t in prompt_ids)] = tuple(int(t) for t in output_ids)

    def propose(self, context: DraftContext, k: int) -> Draft:
        row = context.row
        if k <= 0 or (row is not None and not row.params.is_greedy):
            return Draft()
        reference = self._reference(context)
        done = len(context.output_ids)
        if reference is None:
            self.off_reference += 1
            return Draft()
        n = min(self._length(k), len(reference) - done)
        if n <= 0:
            return Draft()
        if self.cost_drafter is not None:  # the draft model's real work for n drafts; its tokens are not used
            begun = time.perf_counter()
            self.cost_drafter.propose(context, n)
            self.drafting_s += time.perf_counter() - begun
        tokens, right = [], 0
        for i in range(n):
            target = reference[done + i]
            if right == i and self.rng.random() < self.profile.acceptance[i]:
                tokens.append(target)
                right += 1
            else:  # wrong: any token but the target's (later drafts after a wrong one are never reached)
                tokens.append((target + 1 + int(self.rng.integers(self.vocab - 1))) % self.vocab)
        self.intended.record(n, right)
        return Draft(tuple(tokens))

    def release(self, request_id: str) -> None:
        self._followed.pop(request_id, None)
        if self.cost_drafter is not None:
            self.cost_drafter.release(request_id)

    def _reference(self, context: DraftContext) -> tuple[int, ...] | None:
        """The request's recorded continuation while its output still follows it, else None. The output is
        checked only past what an earlier proposal checked (a step's host time stays small)."""
        followed = self._followed.get(context.request_id)
        if followed is None:
            reference = self.references.get(tuple(int(t) for t in context.prompt_ids))
            followed = self._followed[context.request_id] = [reference, 0]
        reference, checked = followed
        output = context.output_ids
        if reference is None or len(output) > len(reference) or len(output) < checked:
            followed[0] = None  # no recording, or the output is not the recorded one's continuation
            return None
        if any(int(t) != r for t, r in zip(output[checked:], reference[checked : len(output)])):
            followed[0] = None
            return None
        followed[1] = len(output)
        return reference

    def _length(self, k: int) -> int:
        """How many tokens this proposal drafts: 0 with P(1 - draft_rate), else n with P(survival[n-1] - survival[n])."""
        if self.rng.random() >= self.profile.draft_rate:
            return 0
        u = self.rng.random()
        return min(k, sum(1 for s in self.profile.length_survival if u < s))
