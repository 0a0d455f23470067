"""What a loaded model's weights cost on the device against what its checkpoint's tensors take: the figure
`ember serve`'s startup line and `/v1/info` report (issue: weights kept quantized should stay within ~1.05x of
the file; dense copies or dequantized formats show as a larger ratio)."""

from __future__ import annotations

from dataclasses import dataclass

import jax


@dataclass(frozen=True)
class WeightBytes:
    device: int  # bytes of every array the model's params hold (kept blocks, dense copies, norms...)
    checkpoint: int  # bytes of the checkpoint's tensors as stored

    @property
    def ratio(self) -> float:
        return self.device / self.checkpoint if self.checkpoint else float("nan")

    def line(self) -> str:
        """'weights 4.70 GB on the device for 4.68 GB of checkpoint tensors (1.00x)'."""
        return (
            f"weights {self.device / 1e9:.2f} GB on the device for {self.checkpoint / 1e9:.2f} GB of checkpoint"
            f" tensors ({self.ratio:.2f}x)"
        )

    def as_dict(self) -> dict:
        return {"device": self.device, "checkpoint": self.checkpoint, "ratio": round(self.ratio, 4)}


def device_weight_bytes(params) -> int:
    """Bytes of every array leaf of a model's global and per-layer weights (QuantizedWeight planes, DenseBacked's
    both forms, ...); the plan's computed constants (RoPE tables) are not weights."""
    unique = {id(leaf): leaf for leaf in jax.tree.leaves((params.globals, params.layers))}  # tied weights: once
    return sum(int(leaf.nbytes) for leaf in unique.values())


def weight_bytes(model) -> WeightBytes:
    """A loaded Model's device weight bytes against its checkpoint's tensor bytes."""
    return WeightBytes(device_weight_bytes(model.params), model.checkpoint.tensor_bytes())
