"""The one error type every loader raises for a bad checkpoint, tokenizer or template."""

from __future__ import annotations

from pathlib import Path


class CheckpointError(Exception):
    """A checkpoint file (or folder) is unreadable, inconsistent or unsupported.

    The message always names the file and the problem, so the CLI can print it
    as a single line instead of a traceback.
    """

    def __init__(self, path: str | Path, problem: str):
        self.path = str(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")
