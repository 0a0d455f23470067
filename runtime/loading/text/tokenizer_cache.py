"""A GGUF tokenizer's `tokenizers` pipeline kept in Ember's cache folder, so a restart reads it back instead of
building it from the vocabulary again (building Gemma 3's 262k-token one derives every merge: seconds).

One file per checkpoint, `<cache>/prepared-tokenizers/<name>-<key>.json` (the pipeline's own JSON), keyed by the
checkpoint's identity (prepared_weights.checkpoint_identity), the source of the modules that build it and the
`tokenizers` version. Written to a temporary name and renamed; a file that does not read back is built and
written again; a folder that cannot be written only costs the build.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

import tokenizers
from tokenizers import Tokenizer as BackendTokenizer

from ..prepared_weights import checkpoint_identity

_SOURCES = ("tokenizer_gguf.py", "tokenizer.py", "tokenizer_cache.py")


def tokenizer_key(checkpoint: Path) -> str:
    digest = hashlib.sha256(json.dumps([checkpoint_identity(checkpoint), tokenizers.__version__]).encode())
    for name in _SOURCES:
        digest.update((Path(__file__).parent / name).read_bytes())
    return digest.hexdigest()[:24]


def cached_backend(checkpoint: Path, root: Path, build: Callable[[], BackendTokenizer]) -> BackendTokenizer:
    """The pipeline kept for `checkpoint` under `root`, else build() (then kept there)."""
    path = Path(root) / f"{Path(checkpoint).name}-{tokenizer_key(checkpoint)}.json"
    if path.is_file():
        try:
            return BackendTokenizer.from_str(path.read_text(encoding="utf-8"))
        except Exception as error:  # a damaged file: built and written again
            print(f"ember: cached tokenizer {path} unreadable ({error}); building it", file=sys.stderr)
    backend = build()
    temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temp.write_text(backend.to_str(), encoding="utf-8")
        os.replace(temp, path)
    except OSError as error:
        print(f"ember: tokenizer not cached in {root} ({error})", file=sys.stderr)
        with contextlib.suppress(OSError):
            temp.unlink(missing_ok=True)
    return backend
