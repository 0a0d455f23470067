"""Tokenizer and chat template for a loaded checkpoint."""

from __future__ import annotations

import functools
from pathlib import Path

from ..checkpoint import Checkpoint
from ..formats.errors import CheckpointError
from .tokenizer import Tokenizer
from .tokenizer_cache import cached_backend


def load_tokenizer(ckpt: Checkpoint, cache_root: Path | None = None) -> Tokenizer:
    """The checkpoint's tokenizer; cache_root: keep a GGUF's built pipeline there for the next start
    (tokenizer_cache.py)."""
    if ckpt.format == "gguf":
        cache = None if cache_root is None else functools.partial(cached_backend, ckpt.path, cache_root)
        return Tokenizer.from_gguf_metadata(ckpt.metadata, source=str(ckpt.path), cache=cache)
    return Tokenizer.from_hf_dir(ckpt.path)


# Token texts that end a turn across chat formats (llama.cpp treats the same set as end-of-generation).
END_OF_TURN_TEXTS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<end_of_turn>", "<|end|>", "<|eom_id|>")


def end_of_generation_ids(tokenizer: Tokenizer, generation_config: dict) -> frozenset[int]:
    """EOS ids: the tokenizer's, generation_config.json's, and the end-of-turn tokens the vocab has."""
    ids = set(tokenizer.eos_token_ids)
    extra = generation_config.get("eos_token_id")
    ids.update(extra if isinstance(extra, list) else ([extra] if isinstance(extra, int) else []))
    for text in END_OF_TURN_TEXTS:
        token_id = tokenizer.token_to_id(text)
        if token_id is not None:
            ids.add(token_id)
    return frozenset(ids)


def render_chat(tokenizer: Tokenizer, messages: list[dict], **template_kwargs) -> str:
    if not tokenizer.chat_template:
        raise CheckpointError(
            tokenizer.source if hasattr(tokenizer, "source") else "model",
            "has no chat template (a base model?): use a plain prompt without --chat",
        )
    from .chat_template import ChatTemplate

    template = ChatTemplate(
        tokenizer.chat_template, bos_token=tokenizer.bos_token, eos_token=tokenizer.eos_token, origin="model"
    )
    return template.render(messages, add_generation_prompt=True, **template_kwargs)
