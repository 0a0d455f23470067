"""Tokenizer and chat template for a loaded checkpoint."""

from __future__ import annotations

from .checkpoint import Checkpoint
from .loader.errors import CheckpointError
from .loader.tokenizer import Tokenizer


def load_tokenizer(ckpt: Checkpoint) -> Tokenizer:
    if ckpt.format == "gguf":
        return Tokenizer.from_gguf_metadata(ckpt.metadata, source=str(ckpt.path))
    return Tokenizer.from_hf_dir(ckpt.path)


def render_chat(tokenizer: Tokenizer, messages: list[dict], **template_kwargs) -> str:
    if not tokenizer.chat_template:
        raise CheckpointError(tokenizer.source if hasattr(tokenizer, "source") else "model",
                              "has no chat template (a base model?): use a plain prompt without --chat")
    from .loader.chat_template import ChatTemplate

    template = ChatTemplate(tokenizer.chat_template, bos_token=tokenizer.bos_token,
                            eos_token=tokenizer.eos_token, origin="model")
    return template.render(messages, add_generation_prompt=True, **template_kwargs)
