"""Shared pieces of the engine tests over the tiny checkpoints."""

from __future__ import annotations

GREEDY = dict(temperature=0.0, ignore_eos=True)


class ByteTokenizer:
    """A stand-in for the tiny checkpoints (which ship no tokenizer): token t decodes to chr(65 + t % 58)."""

    eos_token_ids = ()

    def decode(self, ids, skip_special_tokens=False):
        return "".join(chr(65 + int(t) % 58) for t in ids)
