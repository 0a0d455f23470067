"""Fill-in-the-middle prompts built from the served model's own special tokens.

A code model trained for FIM knows three marker tokens: the text before the hole follows the prefix
marker, the text after it follows the suffix marker, and the model writes the middle after the middle
marker (the "PSM" order). Repo-level models add a repository-name marker and a file separator, so other
files of the project can come first as context:

    <|repo_name|>{repo}\\n<|file_sep|>{path}\\n{text}\\n ... <|fim_prefix|>{prefix}<|fim_suffix|>{suffix}<|fim_middle|>

The markers are looked up in the tokenizer's vocabulary by the spellings code models use (Qwen2.5-Coder's
`<|fim_prefix|>`, StarCoder's `<fim_prefix>`); a model without them cannot do FIM and requests get a 400.
Each piece of text is tokenized on its own and the marker ids are placed between them, so a marker
spelled inside the user's code stays text.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .errors import bad_request

# (prefix, suffix, middle, repo name, file separator, padding) spellings, one family per row
_SPELLINGS = (
    ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|repo_name|>", "<|file_sep|>", "<|fim_pad|>"),
    ("<fim_prefix>", "<fim_suffix>", "<fim_middle>", "<repo_name>", "<file_sep>", "<fim_pad>"),
)
DEFAULT_REPO_NAME = "repo"


@dataclass(frozen=True)
class FimTokens:
    prefix: int
    suffix: int
    middle: int
    repo_name: int | None  # repo-level context markers, when the vocabulary has them
    file_sep: int | None
    pad: int | None

    @property
    def stop_ids(self) -> tuple[int, ...]:
        """Markers that end a middle: a model done with the hole may start the next file or pad."""
        return tuple(i for i in (self.file_sep, self.pad, self.prefix, self.suffix, self.middle) if i is not None)


def detect_fim_tokens(tokenizer) -> FimTokens | None:
    """The model's FIM markers, or None when its vocabulary lacks any of prefix/suffix/middle."""
    for prefix, suffix, middle, repo, sep, pad in _SPELLINGS:
        ids = [tokenizer.token_to_id(t) for t in (prefix, suffix, middle)]
        if all(i is not None for i in ids):
            return FimTokens(*ids, tokenizer.token_to_id(repo), tokenizer.token_to_id(sep), tokenizer.token_to_id(pad))
    return None


@dataclass(frozen=True)
class ExtraFile:
    filename: str
    text: str


def require_fim(service, param: str) -> FimTokens:
    fim = getattr(service, "fim_tokens", None)
    if fim is None:
        raise bad_request(
            f"the served model {service.model_name} has no fill-in-the-middle tokens "
            "(<|fim_prefix|>, <|fim_suffix|>, <|fim_middle|>): it cannot complete between a prefix and a suffix",
            param,
        )
    return fim


def fim_prompt_ids(
    tokenizer,
    fim: FimTokens,
    prefix: str,
    suffix: str,
    *,
    extra_files: Sequence[ExtraFile] = (),
    repo_name: str = DEFAULT_REPO_NAME,
    middle_start: str = "",
) -> list[int]:
    """The PSM prompt's token ids; `middle_start` is text already typed in the hole (it follows the middle
    marker, and the model continues it)."""

    def text(value: str) -> list[int]:
        return tokenizer.encode(value, add_special_tokens=False) if value else []

    ids: list[int] = [tokenizer.bos_token_id] if tokenizer.add_bos and tokenizer.bos_token_id is not None else []
    if extra_files:
        if fim.file_sep is None:
            raise bad_request(
                "the served model has no file separator token: input_extra is not supported", "input_extra"
            )
        if fim.repo_name is not None:
            ids += [fim.repo_name, *text(repo_name + "\n")]
        for extra in extra_files:
            ids += [fim.file_sep, *text(f"{extra.filename}\n{extra.text}\n")]
        ids.append(fim.file_sep)  # the file being edited, unnamed
        ids += text("\n")
    ids += [fim.prefix, *text(prefix), fim.suffix, *text(suffix), fim.middle, *text(middle_start)]
    return ids


def extra_files_field(value, param: str = "input_extra") -> list[ExtraFile]:
    """llama-server's `input_extra`: [{"filename": str, "text": str}, ...]."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise bad_request(f"{param} must be an array of {{filename, text}} objects", param)
    files = []
    for i, item in enumerate(value):
        if not isinstance(item, dict) or not isinstance(item.get("text", ""), str):
            raise bad_request("each entry must be an object with string filename and text", f"{param}[{i}]")
        filename = item.get("filename", "")
        if not isinstance(filename, str):
            raise bad_request("filename must be a string", f"{param}[{i}].filename")
        files.append(ExtraFile(filename, item.get("text", "")))
    return files


def with_fim_stops(fields: dict, fim: FimTokens) -> dict:
    """Request fields that also stop at the FIM markers (the model's eos already stops it); a list, as
    both a request body and SamplingParams' defaults take it."""
    given = list(fields.get("stop_token_ids") or ())
    return {**fields, "stop_token_ids": list(dict.fromkeys((*given, *fim.stop_ids)))}
