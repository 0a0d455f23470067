"""A kernel policy's override of a kernel's launch config, for side-by-side measurements.

The policy holds (field, value) pairs (compiler/targets/policy.py ConfigOverride, e.g. fp8_gemv.config
{"block_n": 8, "prefetch": 0}); `overridden` returns the frozen config dataclass with those fields replaced
(ints; bool fields take 0 / 1). No pairs: the config as given. An unknown field is an error naming the policy
field.
"""

from __future__ import annotations

import dataclasses


def overridden[Config](config: Config, pairs: tuple[tuple[str, int], ...], name: str) -> Config:
    if not pairs:
        return config
    types = {f.name: f.type for f in dataclasses.fields(config)}
    updates = dict(pairs)
    if not set(updates) <= set(types):
        raise ValueError(f"kernel policy: {name} has unknown fields {sorted(set(updates) - set(types))}")
    return dataclasses.replace(
        config, **{k: bool(int(v)) if types[k] in (bool, "bool") else int(v) for k, v in updates.items()}
    )
