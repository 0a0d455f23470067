"""The host-side copies of one host tier round trip at the Qwen2.5-1.5B shape, on this machine's CPU: what a
16k-token prompt (1,024 blocks of 16) costs the host when it is spilled and restored. Before 0f1cae8+1 the
gather's host array was layer-major [layers, 2, n, bs, hkv, dh], sliced into one contiguous entry per block and
stacked again into pieces of 64 for the restore (measured here as those numpy copies); now the gather comes
block-major in pieces of block_copies.PIECE rows and the HostTier itself is timed: entries are rows of the pieces
(views), and the restore's pieces are views again (host_tier.stacked). Fresh allocations include their page
faults, as in the engine. bf16 stands as uint16 (the same bytes).

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

from ember.runtime.execution.block_copies import PIECE, _pieces, spans
from ember.runtime.state.host_tier import HostTier, stacked

LAYERS, BLOCK, KV_HEADS, HEAD_DIM = 28, 16, 2, 128  # Qwen2.5-1.5B


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


class _HostCopier:
    """The BlockCopier with the host as the device: a gather's pieces are fresh block-major arrays (as a device
    array's copy to the host would be), a scatter only builds each piece's host array (the transfer's source)."""

    def __init__(self):
        self.sources: list[np.ndarray] = []

    def gather(self, kv, blocks):
        return [np.ones((size, LAYERS, 2, BLOCK, KV_HEADS, HEAD_DIM), np.uint16) for size in _pieces(len(blocks))]

    def scatter(self, kv, blocks, entries):
        self.sources += [stacked(entries[start : start + size]) for start, size in spans(len(blocks))]
        return kv


def _round_trip(n: int) -> dict:
    layer_major = np.ones((LAYERS, 2, n, BLOCK, KV_HEADS, HEAD_DIM), np.uint16)  # the gather's layout before
    entries: list[np.ndarray] = []
    spill = _timed(lambda: entries.extend(np.ascontiguousarray(layer_major[:, :, i]) for i in range(n)))
    restore = _timed(lambda: [np.stack(entries[i : i + PIECE]) for i in range(0, n, PIECE)])
    block_bytes = LAYERS * 2 * BLOCK * KV_HEADS * HEAD_DIM * 2
    tier, copier = HostTier(2 * n * block_bytes, block_bytes, BLOCK), _HostCopier()
    hashes = [i.to_bytes(8, "little") for i in range(n)]
    for block, chain_hash in enumerate(reversed(hashes)):  # evicted tail first, as the pool does
        tier.spill(chain_hash, block)
    tier_spill = _timed(lambda: tier.dispatch(None, copier) or tier.dispatch(None, copier))  # gather, read back

    def tier_restore():
        for block, entry in enumerate(tier.take(hashes)):
            tier.restore(block, entry)
        tier.dispatch(None, copier)

    tier_restore_s = _timed(tier_restore)
    figures = {
        "blocks": n,
        "bytes": int(layer_major.nbytes),
        "layer_major_spill_entry_copies_s": round(spill, 4),
        "layer_major_restore_stacking_s": round(restore, 4),
        "tier_spill_s": round(tier_spill, 4),
        "tier_restore_s": round(tier_restore_s, 4),
        "restore_pieces_as_views": sum(s.base is not None for s in copier.sources),
        "restore_pieces": len(copier.sources),
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
