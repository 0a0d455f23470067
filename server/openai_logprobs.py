"""Logprobs in OpenAI's two shapes: chat (`content: [{token, logprob, bytes, top_logprobs}]`) and
completions (`tokens`, `token_logprobs`, `top_logprobs` as {token: logprob}, `text_offset`)."""

from __future__ import annotations

from ..runtime.engine.streams import TokenLogprob


def token_text(tokenizer, token_id: int) -> str:
    """A token's text for logprobs (bytes a token cannot show alone decode with replacement marks)."""
    return tokenizer.decode([token_id])


def _entry(tokenizer, token_id: int, logprob: float) -> dict:
    text = token_text(tokenizer, token_id)
    return {"token": text, "logprob": _finite(logprob), "bytes": list(text.encode("utf-8"))}


def _finite(value: float) -> float:
    return value if value > -1e30 else -9999.0  # JSON has no -inf; OpenAI reports -9999.0 for "impossible"


def chat_logprobs(tokenizer, entries: list[TokenLogprob], top: int) -> dict:
    content = []
    for e in entries:
        item = _entry(tokenizer, e.token_id, e.logprob)
        item["top_logprobs"] = [_entry(tokenizer, i, lp) for i, lp in e.top[:top]]
        content.append(item)
    return {"content": content}


def completion_logprobs(tokenizer, entries: list[TokenLogprob], top: int, text_offset: int = 0) -> dict:
    tokens, token_logprobs, tops, offsets = [], [], [], []
    offset = text_offset
    for e in entries:
        text = token_text(tokenizer, e.token_id)
        tokens.append(text)
        token_logprobs.append(_finite(e.logprob))
        alternatives: dict[str, float] = {}
        for i, lp in e.top[:top]:
            alternatives.setdefault(token_text(tokenizer, i), _finite(lp))
        tops.append(alternatives)
        offsets.append(offset)
        offset += len(text)
    return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": tops, "text_offset": offsets}
