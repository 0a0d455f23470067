"""The multi-token-prediction (MTP) module of checkpoints that carry one (Qwen3-Next, Qwen3.5, Qwen3.5-MoE):
its weights, loaded beside the target's parameters when present.

An MTP module predicts the token after next from the target's final-norm hidden state h_t and the embedding of
the token at t + 1:

    x = fc(concat(rms_norm(embed(token), enorm), rms_norm(h_t, hnorm)))    fc: [d, 2d]
    x = one full-attention decoder layer (the target's own layer body: attention + dense MLP or MoE)
    logits = head(rms_norm(x, norm))                                        head: the target's output matrix

Names: HF keeps it under `mtp.` (mtp.fc, mtp.pre_fc_norm_embedding, mtp.pre_fc_norm_hidden, mtp.norm and
mtp.layers.<j>.* named like model.layers.<i>.*); llama.cpp's GGUF appends it as block `layers + j` (blk.N.* with
the decoder layer's usual names, plus blk.N.nextn.eh_proj / enorm / hnorm / shared_head_norm). The decoder layer's
weights are fetched through the spec's own weight table (its HF names with `model.layers.{i}.` read as
`mtp.layers.{j}.`), so they are packed and transformed exactly as a target layer of the same body; the MTP's
norms take the final norm's HF transform (zero-centred norms get their + 1 like every norm of the family).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...compiler.weight_transforms import apply_transform
from .checkpoint import Checkpoint
from .dims import ResolvedModel
from .formats.errors import CheckpointError
from .weights import RawWeight, WeightLoader, _body_weights, _combine

# logical name -> (HF tensor, GGUF tensor relative to blk.N.); the three norms are [d], fc is [d, 2d]
MTP_GLOBALS = {
    "fc.weight": ("mtp.fc.weight", "nextn.eh_proj.weight"),
    "enorm.weight": ("mtp.pre_fc_norm_embedding.weight", "nextn.enorm.weight"),
    "hnorm.weight": ("mtp.pre_fc_norm_hidden.weight", "nextn.hnorm.weight"),
    "norm.weight": ("mtp.norm.weight", "nextn.shared_head_norm.weight"),
}
NORM_TRANSFORM_OF = "output_norm.weight"  # the MTP norms are transformed like the final norm
MIXER_KIND = "full_attention"  # every MTP decoder layer is a full-attention layer


@dataclass(frozen=True)
class MtpParams:
    """One MTP decoder layer's parameters (the MTP modules of a checkpoint: one per entry of `layers`).

    globals: fc.weight [d, 2d], enorm / hnorm / norm.weight [d]
    layers: per MTP layer, its body's packed weights (the plan's names: 'attn_q+attn_k+attn_v.weight', ...)
    constants: per MTP layer, the layer constants of the target's full-attention layer of the same body
        (RoPE inverse frequencies, window 0, its KV state kind's index)
    bodies: per MTP layer, its body name in the plan's LAYER_BODIES ('full_attention+moe', ...)
    """

    globals: dict[str, Any]
    layers: tuple[dict[str, Any], ...]
    constants: tuple[dict[str, Any], ...]
    bodies: tuple[str, ...]


class MtpCheckpointView:
    """The checkpoint as a WeightLoader reads it for MTP layer j = i - layers: the HF tensor
    model.layers.{i}.X is read as mtp.layers.{j}.X (GGUF needs no renaming: its MTP block is blk.{i})."""

    def __init__(self, ckpt: Checkpoint, layers: int):
        self._ckpt, self._layers = ckpt, layers

    def _rename(self, name: str) -> str:
        match = _HF_LAYER_NAME.match(name)
        if self._ckpt.format != "hf" or match is None:
            return name
        return f"mtp.layers.{int(match.group(1)) - self._layers}.{match.group(2)}"

    def __getattr__(self, attr: str):
        value = getattr(self._ckpt, attr)
        if not callable(value):
            return value
        return lambda name=None, *args, **kwargs: (
            value(self._rename(name), *args, **kwargs) if isinstance(name, str) else value(*args, **kwargs)
        )


_HF_LAYER_NAME = re.compile(r"^model\.layers\.(\d+)\.(.+)$")


def mtp_layer_count(ckpt: Checkpoint, resolved: ResolvedModel) -> int:
    """How many MTP layers the checkpoint carries (0: none)."""
    layers = int(resolved.dims["layers"])
    if ckpt.format == "hf":
        count = 0
        while ckpt.has_tensor(f"mtp.layers.{count}.input_layernorm.weight"):
            count += 1
        return count if count and ckpt.has_tensor("mtp.fc.weight") else 0
    count = 0
    while ckpt.has_tensor(f"blk.{layers + count}.nextn.eh_proj.weight"):
        count += 1
    return count


def load_mtp(
    spec, manifest: dict, ckpt: Checkpoint, resolved: ResolvedModel, target_constants, to_device, keep_formats=()
):
    """The checkpoint's MtpParams (device values placed by `to_device`), or None when it has no MTP module.
    target_constants: the target's per-layer constants (Params.constants), whose full-attention layer lends
    the MTP layer its constants."""
    count = mtp_layer_count(ckpt, resolved)
    if not count:
        return None
    loader = WeightLoader(spec, MtpCheckpointView(ckpt, int(resolved.dims["layers"])), resolved, keep_formats)
    layers = int(resolved.dims["layers"])
    packed = manifest["packed_weights"]
    norm_entry = spec.weights[NORM_TRANSFORM_OF]

    def fetch_global(logical: str) -> np.ndarray:
        hf, gguf = MTP_GLOBALS[logical]
        name = hf if ckpt.format == "hf" else f"blk.{layers}.{gguf}"
        if not ckpt.has_tensor(name):
            raise CheckpointError(ckpt.path, f"missing MTP tensor {name!r}")
        tensor = np.asarray(ckpt.load(name), np.float32)
        if logical != "fc.weight" and ckpt.format == "hf" and norm_entry.hf_transform:
            tensor = apply_transform(norm_entry.hf_transform, tensor, loader.dims)
        return np.ascontiguousarray(tensor, np.float32)

    globals_ = {name: to_device(fetch_global(name)) for name in MTP_GLOBALS}
    mlp = "moe" if _present(loader, f"blk.{layers}.ffn_gate_inp.weight") else "dense"
    bodies, per_layer, constants = [], [], []
    for j in range(count):
        body = f"{MIXER_KIND}+{mlp}" if "+" in resolved.layer_kinds[0] else MIXER_KIND
        donor = next((i for i, kind in enumerate(resolved.layer_kinds) if kind == body), None)
        if donor is None:  # no target layer of this body: borrow a full-attention layer's constants
            donor = next(i for i, kind in enumerate(resolved.layer_kinds) if kind.startswith(MIXER_KIND))
        index = layers + j
        weights = {}
        for name in _mtp_body_weights(manifest, resolved, body):
            if name in packed:
                value = _combine([loader.fetch_kept(f"blk.{index}.{part}") for part in packed[name]])
            else:
                value = loader.fetch_kept(f"blk.{index}.{name}")
                value = value.packed() if isinstance(value, RawWeight) else value
            weights[name] = to_device(value)
        bodies.append(body)
        per_layer.append(weights)
        constants.append(target_constants[donor])
    return MtpParams(globals_, tuple(per_layer), tuple(constants), tuple(bodies))


def _mtp_body_weights(manifest: dict, resolved: ResolvedModel, body: str) -> list[str]:
    bodies = manifest.get("body_weights")
    return bodies[body] if bodies else _body_weights(manifest, resolved, 0)


def _present(loader: WeightLoader, logical: str) -> bool:
    try:
        return loader.locate(logical) is not None
    except CheckpointError:
        return False
