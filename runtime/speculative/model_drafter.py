"""The `draft` drafter: a smaller model with the target's tokenizer, run by its own StepExecutor over its own
paged KV inside the engine (docs/speculative.md step 6).

Per request it keeps the draft model's KV and the tokens that KV was computed from. Asked for k drafts, it
rolls its KV back to the longest prefix those tokens share with the request's current ones (the target
rejected what differs), catches up the rest as prefill chunks (the last one gives d_0), then decodes
d_1..d_{k-1} one step each. For a greedy row (or one whose sampling state it is not given) the drafts are the
draft model's greedy picks, verified as point masses. For a sampled row it draws each draft from q, the draft
model's logits through the request's own pipeline (temperature, top-k / top-p / min-p, bias, penalties, at
the draft's step and seed: `draft_sample`), and hands the q rows to the verifier, which accepts with
min(1, p/q) and resamples from max(0, p - q) on a rejection: lossless, with a higher acceptance than point
masses. The engine calls `release` when a request finishes or is preempted (its KV goes back)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from ..execution.background_compile import CompileTask
from ..execution.compiled_steps import CompiledSteps
from ..execution.draft_steps import DraftSteps
from ..execution.step_executor import StepExecutor
from ..loading.model import Model
from ..sampling.params import RowState, SamplingParams
from ..scheduling.scheduled_step import DecodeRow, PrefillChunk, PrefillShapes, ScheduledStep, slots_at
from ..state.kinds import engine_pool_blocks
from ..state.kv_cache import KVCache
from .drafter import Draft, DraftContext
from .row_draws import samples

_GREEDY = SamplingParams(temperature=0.0, max_tokens=1 << 20, ignore_eos=True)


@dataclass
class _Sequence:
    state: dict
    computed: list[int] = field(default_factory=list)  # the tokens whose KV the draft model holds, in order


class ModelDrafter:
    def __init__(self, model: Model, engine_config, target_vocab: int):
        if int(model.dims.vocab) > target_vocab:
            raise ValueError(f"the draft model's vocabulary ({model.dims.vocab}) exceeds the target's ({target_vocab})")
        if model.slot_kinds:
            raise ValueError("a draft model with recurrent state is not supported (its KV could not roll back)")
        self.model = model
        # the draft's own pools, as many blocks as the target's full pool (it holds the same sequences)
        config = replace(engine_config, speculative=None, decode_steps=1, deterministic=False, keep_executables=False)
        self.config = config
        self.kv = KVCache.of(model.paged_kinds, engine_pool_blocks(model.paged_kinds, config), config.block_size)
        entry = model.plan.manifest["entries"]["forward"]
        buckets = tuple(b for b in entry["prefill_buckets"] if b <= config.max_batched_tokens) or (16,)
        self.prefill = PrefillShapes(buckets)
        self.executor = StepExecutor(model, config, self.prefill)
        self.steps = DraftSteps(self.executor)
        self.sequences: dict[str, _Sequence] = {}

    def propose(self, context: DraftContext, k: int) -> Draft:
        tokens = [int(t) for t in context.tokens]
        if k <= 0 or len(tokens) + k > self.config.max_model_len:
            return Draft()
        seq = self.sequences.get(context.request_id)
        if seq is None:
            seq = self.sequences[context.request_id] = _Sequence(self.kv.new_state())
        self._roll_back(seq, tokens)
        row = context.row
        sampled = samples(row)
        if not sampled:
            row = RowState(_GREEDY, 0, context.prompt_ids, context.output_ids)
        row = replace(row, matcher=None)  # q need not follow the grammar: the verifier's p does
        if not self.kv.grow(seq.state, len(tokens) + k - 1):
            return Draft()  # the draft pool is full: no drafts this step
        rid = context.request_id
        # d_0 from the catch-up chunk's last row (the row at its step), then d_1 .. d_{k-1}: k - 1 decodes in one
        # device call, sampled at the row's step + 1 .. + k - 1 with d_0 emitted
        first, q0 = self.steps.draw(self._catch_up(rid, seq, tokens), [row], sampled)
        drafts, probs = [int(first[0])], [q0]
        if k > 1:
            after_first = replace(row, output_ids=(*row.output_ids, drafts[0]), step=row.token_index + 1)
            more, q = self.steps.draw_decodes(self._decodes(seq, rid, drafts[0]), [after_first], k - 1, sampled)
            drafts += [int(t) for t in more[:, 0]]
            seq.computed += drafts[1:-1]  # decode i computed draft i's KV; the last draft is not computed
            probs.append(None if q is None else q[:, 0])
        return Draft(tuple(drafts), np.concatenate(probs) if sampled else None)

    def precompile(self, max_drafts: int) -> None:
        """Compile the draft model's calls ahead: its drafting calls (DraftSteps.precompile) and the full catch-up
        chunk a long prompt's first drafts run before the last one, so no drafting step waits for a compile."""
        self.steps.precompile(max_drafts)
        if isinstance(self.executor.step_fn, CompiledSteps):
            self.executor.compile_ahead(CompileTask(self.steps.shape(0, self.prefill.buckets[-1]), all_greedy=True))

    def release(self, request_id: str) -> None:
        seq = self.sequences.pop(request_id, None)
        if seq is not None:
            self.kv.release(seq.state)

    def _roll_back(self, seq: _Sequence, tokens: list[int]) -> None:
        """Keep the KV of the longest common prefix of what was computed and the request's tokens (at least
        one token is always left to compute: the last known one gives d_0)."""
        keep = 0
        limit = min(len(seq.computed), len(tokens) - 1)
        while keep < limit and seq.computed[keep] == tokens[keep]:
            keep += 1
        del seq.computed[keep:]
        self.kv.shrink(seq.state, keep)

    def _catch_up(self, rid: str, seq: _Sequence, tokens: list[int]) -> ScheduledStep:
        """Compute tokens[len(computed):] in chunks; the last chunk (returned, not run) gives d_0."""
        tables = self.kv.tables(seq.state)
        bs = self.kv.block_size
        largest = self.prefill.buckets[-1]
        while True:
            start = len(seq.computed)
            end = min(len(tokens), start + largest)
            chunk = PrefillChunk(
                rid,
                start,
                tuple(tokens[start:end]),
                tuple(slots_at(tables, p, bs) for p in range(start, end)),
                completes=end == len(tokens),
            )
            step = ScheduledStep((), (chunk,), {rid: tables}, num_kinds=len(self.kv.kinds))
            seq.computed += tokens[start:end]
            if chunk.completes:
                return step
            self.executor.run(step, [])

    def _decodes(self, seq: _Sequence, rid: str, token: int) -> ScheduledStep:
        """The decode step of d_0 (run ahead from there: draft_steps.py), its KV already grown for the rest."""
        tables = self.kv.tables(seq.state)
        position = len(seq.computed)
        decode = DecodeRow(rid, token, position, slots_at(tables, position, self.kv.block_size))
        seq.computed.append(token)
        return ScheduledStep((decode,), (), {rid: tables}, num_kinds=len(self.kv.kinds))
