"""The `draft` drafter: a smaller model with the target's tokenizer, run by its own StepExecutor over its own
paged KV inside the engine (docs/speculative.md step 6).

Per request it keeps the draft model's KV and the tokens that KV was computed from. Asked for k drafts, it
rolls its KV back to the longest prefix those tokens share with the request's current ones (the target
rejected what differs), catches up the rest as prefill chunks (the last one gives d_0), then decodes
d_1..d_{k-1} one step each. Drafts are the draft model's greedy picks: a deterministic proposal, verified as a
point mass, which keeps rejection sampling exact for sampled rows too (their acceptance is lower than with the
draft's own distributions q, the later refinement). The engine calls `release` when a request finishes or is
preempted (its KV goes back)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ..execution.step_executor import StepExecutor
from ..loading.model import Model
from ..sampling.params import RowState, SamplingParams
from ..scheduling.scheduled_step import DecodeRow, PrefillChunk, PrefillShapes, ScheduledStep, slots_at
from ..state.kinds import engine_pool_blocks
from ..state.kv_cache import KVCache
from .drafter import Draft, DraftContext

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
        self.sequences: dict[str, _Sequence] = {}

    def propose(self, context: DraftContext, k: int) -> Draft:
        tokens = [int(t) for t in context.tokens]
        if k <= 0 or len(tokens) + k > self.config.max_model_len:
            return Draft()
        seq = self.sequences.get(context.request_id)
        if seq is None:
            seq = self.sequences[context.request_id] = _Sequence(self.kv.new_state())
        self._roll_back(seq, tokens)
        row = RowState(_GREEDY, 0, context.prompt_ids, context.output_ids)
        if not self.kv.grow(seq.state, len(tokens) + k - 1):
            return Draft()  # the draft pool is full: no drafts this step
        drafts = [self._catch_up(context.request_id, seq, tokens, row)]
        for _ in range(k - 1):
            drafts.append(self._decode(context.request_id, seq, drafts[-1], row))
        return Draft(tuple(drafts))

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

    def _catch_up(self, rid: str, seq: _Sequence, tokens: list[int], row: RowState) -> int:
        """Compute tokens[len(computed):] in chunks; the last chunk's logits give d_0."""
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
            results = self.executor.run(step, [row] if chunk.completes else [])
            seq.computed += tokens[start:end]
            if chunk.completes:
                return results[rid].token

    def _decode(self, rid: str, seq: _Sequence, token: int, row: RowState) -> int:
        tables = self.kv.tables(seq.state)
        position = len(seq.computed)
        decode = DecodeRow(rid, token, position, slots_at(tables, position, self.kv.block_size))
        step = ScheduledStep((decode,), (), {rid: tables}, num_kinds=len(self.kv.kinds))
        seq.computed.append(token)
        return self.executor.run(step, [row])[rid].token
