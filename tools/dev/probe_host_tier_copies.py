"""The host-side copies of one host tier round trip at the Qwen2.5-1.5B shape, on this machine's CPU: what a
16k-token prompt (1,024 blocks of 16) costs the host when it is spilled (the gather's host array
[layers, 2, n, bs, hkv, dh] sliced into one contiguous entry per block: runtime/state/host_tier.py `_read_back`)
and restored (entries stacked into pieces of block_copies.SCATTER_PIECE blocks), against the entries taken as
views of a block-major array [n, layers, 2, bs, hkv, dh] (no copy). Fresh allocations include their page faults,
as in the engine. bf16 stands as uint16 (the same bytes).

  .venv/bin/python -m ember.tools.dev.probe_host_tier_copies --out docs/results/host_tier_copies_<machine>.json
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import time
from pathlib import Path

import numpy as np

from ember.runtime.execution.block_copies import SCATTER_PIECE

LAYERS, BLOCK, KV_HEADS, HEAD_DIM = 28, 16, 2, 128  # Qwen2.5-1.5B


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _round_trip(n: int) -> dict:
    layer_major = np.ones((LAYERS, 2, n, BLOCK, KV_HEADS, HEAD_DIM), np.uint16)  # the gather's layout today
    entries: list[np.ndarray] = []
    spill = _timed(lambda: entries.extend(np.ascontiguousarray(layer_major[:, :, i]) for i in range(n)))
    restore = _timed(lambda: [np.stack(entries[i : i + SCATTER_PIECE]) for i in range(0, n, SCATTER_PIECE)])
    block_major = np.ones((n, LAYERS, 2, BLOCK, KV_HEADS, HEAD_DIM), np.uint16)
    views = _timed(lambda: [block_major[i] for i in range(n)])
    figures = {
        "blocks": n,
        "bytes": int(layer_major.nbytes),
        "spill_entry_copies_s": round(spill, 4),
        "restore_stacking_s": round(restore, 4),
        "block_major_views_s": round(views, 6),
    }
    print(json.dumps(figures), flush=True)
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--blocks", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=3, help="round trips in one process (page faults differ)")
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    runs = [_round_trip(args.blocks) for _ in range(args.repeats)]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    if args.out:
        meta = {"machine": platform.processor() or platform.machine(), "commit": commit}
        Path(args.out).write_text(json.dumps({"meta": meta, "runs": runs}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
