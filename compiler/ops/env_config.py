"""Trace-time overrides of a kernel's launch config for side-by-side measurements.

An environment variable holds "field=value" pairs joined by "/" (e.g. EMBER_DECODE_ATTENTION="num_warps=2/
num_stages=1"); `overridden` returns the frozen config dataclass with those fields replaced (ints; bool fields
take 0 / 1). Unset or empty: the config as given. An unknown field is an error naming the variable.
"""

from __future__ import annotations

import dataclasses
import os


def overridden[Config](config: Config, env: str) -> Config:
    text = os.environ.get(env, "").strip()
    if not text:
        return config
    types = {f.name: f.type for f in dataclasses.fields(config)}
    updates = dict(item.split("=", 1) for item in text.split("/"))
    if not set(updates) <= set(types):
        raise ValueError(f"{env}: unknown fields {sorted(set(updates) - set(types))}")
    return dataclasses.replace(
        config, **{k: bool(int(v)) if types[k] in (bool, "bool") else int(v) for k, v in updates.items()}
    )
