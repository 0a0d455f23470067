"""Shared pieces of the engine tests over the tiny checkpoints."""

from __future__ import annotations

GREEDY = dict(temperature=0.0, ignore_eos=True)


class ByteTokenizer:
    """A stand-in for the tiny checkpoints (which ship no tokenizer): token t decodes to chr(65 + t % 58)."""

    eos_token_ids = ()

    def decode(self, ids, skip_special_tokens=False):
        return "".join(chr(65 + int(t) % 58) for t in ids)


def outputs_of(engine, batch, index):
    """Tokens and (token, logprob, top) of batch[index] when the (prompt, sampling) batch is submitted at once
    to a running engine."""
    return all_outputs_of(engine, batch)[index]


def all_outputs_of(engine, batch):
    """outputs_of's pair for every entry of the batch, submitted at once."""
    streams = [engine.submit(prompt, sampling) for prompt, sampling in batch]
    return [
        (
            [t for o in outputs for t in o.token_ids],
            [(lp.token_id, lp.logprob, lp.top) for o in outputs for lp in (o.logprobs or ())],
        )
        for outputs in (stream.collect()[0] for stream in streams)
    ]


# the widest top-2 logprob gap a bf16 GPU step may round the other way when the same position is computed in
# another layout (a verify segment vs a decode row): a few bf16 steps of a logit
NEAR_TIE = 0.125


def assert_same_up_to_a_near_tie(got: list[int], want: tuple[list[int], list]) -> None:
    """`got` equals want's tokens, or first differs where want's top-2 logprobs were within NEAR_TIE and picked
    want's runner-up there: what a bf16 GPU target's speculative (verify) steps may do against its plain decode
    steps outside deterministic mode. want: outputs_of's (tokens, (token, logprob, top)) of a top_logprobs >= 2
    request."""
    tokens, logprobs = want
    for i, (mine, theirs) in enumerate(zip(got, tokens)):
        if mine != theirs:
            top = logprobs[i][2]
            assert len(top) >= 2 and top[0][1] - top[1][1] <= NEAR_TIE and mine == top[1][0], (i, mine, top)
            return
    assert len(got) == len(tokens)
