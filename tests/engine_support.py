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
    streams = [engine.submit(prompt, sampling) for prompt, sampling in batch]
    outputs = [stream.collect()[0] for stream in streams][index]
    return (
        [t for o in outputs for t in o.token_ids],
        [(lp.token_id, lp.logprob, lp.top) for o in outputs for lp in (o.logprobs or ())],
    )
