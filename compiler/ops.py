"""The op vocabulary a spec may use, and the reference implementation behind each op.

Each op says what its parameters are (values, weights, dimensions, literals), how many values it
yields, and how output shapes follow from input shapes. Shapes are tuples of arithmetic strings over
the spec's dimensions plus "N" (tokens in the step). References are plain `jnp` and are what the cpu
target runs; GPU kernels are property-tested against them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

REQUIRED = object()


@dataclass(frozen=True)
class Param:
    name: str
    kind: str  # "value" | "weight" | "dim" | "literal"
    default: Any = REQUIRED


@dataclass(frozen=True)
class OpDef:
    name: str
    params: tuple[Param, ...]
    outputs: int
    shape: Callable[[list[tuple[str, ...]], dict[str, Any], dict[str, tuple[str, ...]]], list[tuple[str, ...]]]
    stateful: bool = False  # reads and writes per-layer state (paged KV, or a slot kind: `slot_state`)
    spec_level: bool = True  # False: introduced by passes only
    # slot-state ops: (attrs, value shapes, node) -> (state kind name, ((array, shape over dims, dtype), ...))
    slot_state: Callable[..., tuple[str, tuple[tuple[str, tuple[str, ...], str], ...]]] | None = None
    state_arrays: tuple[str, ...] = ("k_pool", "v_pool")  # the names the plan gives the layer's state arrays

    def param(self, name: str) -> Param:
        return next(p for p in self.params if p.name == name)


def _weight_rows(weights: dict[str, tuple[str, ...]], key: str) -> str:
    return weights[key][0]


def _paren(text: str) -> str:
    return text if text.replace("_", "").isalnum() else f"({text})"


def _half(total: str) -> str:
    parts = total.split(" + ")
    if len(parts) == 2 and parts[0] == parts[1]:
        return parts[0].strip("()")
    return f"{_paren(total)} // 2"


OPS: dict[str, OpDef] = {}


def _op(name, params, outputs, shape, **kw):
    OPS[name] = OpDef(name, tuple(params), outputs, shape, **kw)


V, W, D, L = "value", "weight", "dim", "literal"

_op("embedding", [Param("ids", V), Param("table", W)], 1, lambda s, a, w: [("N", w["table"][1])])
_op("scale", [Param("x", V), Param("factor", D)], 1, lambda s, a, w: [s[0]])
_op("rms_norm", [Param("x", V), Param("weight", W), Param("eps", D)], 1, lambda s, a, w: [s[0]])
_op(
    "linear",
    [Param("x", V), Param("weight", W), Param("bias", L, False)],
    1,
    lambda s, a, w: [(*s[0][:-1], _weight_rows(w, "weight"))],
)


def _per_head(total: str, heads: str) -> str:
    prefix = f"{heads} * "
    if total.startswith(prefix) and _paren(total[len(prefix) :]) == total[len(prefix) :]:
        return total[len(prefix) :]
    return f"{_paren(total)} // {_paren(heads)}"


_op(
    "split_heads",
    [Param("x", V), Param("heads", D)],
    1,
    lambda s, a, w: [(s[0][0], a["heads"], _per_head(s[0][1], a["heads"]))],
)
_op("gated_act", [Param("gate", V), Param("up", V), Param("act", L)], 1, lambda s, a, w: [s[0]])
_op(
    "rope",
    [
        Param("q", V),
        Param("k", V),
        Param("positions", V),
        Param("theta", D),
        Param("style", L),
        Param("scaling", D, None),
        Param("freq_divisors", W, None),
        Param("rotary_dim", D, None),  # only the first rotary_dim of each head's dims rotate (None: all)
    ],
    2,
    lambda s, a, w: [s[0], s[1]],
)
_op(
    "attention",
    [Param("q", V), Param("k", V), Param("v", V), Param("scale", D), Param("window", D, 0)],
    1,
    lambda s, a, w: [(s[0][0], f"{_paren(s[0][1])} * {_paren(s[0][2])}")],
    stateful=True,
)
_op("add", [Param("x", V), Param("y", V)], 1, lambda s, a, w: [s[0]])
# x[..., :size], x[..., size:] (a fused projection's parts, a head's query and its gate)
_op(
    "split_at",
    [Param("x", V), Param("size", D)],
    2,
    lambda s, a, w: [(*s[0][:-1], str(a["size"])), (*s[0][:-1], f"{_paren(s[0][-1])} - {_paren(str(a['size']))}")],
)
# x * sigmoid(gate), gate read as x's rows ([N, ...] flattened to x's shape, or [N, 1] broadcast)
_op("sigmoid_gate", [Param("x", V), Param("gate", V)], 1, lambda s, a, w: [s[0]])
# RMSNorm of each head's x times silu(gate): x, gate [N, heads * n], weight [n]
_op(
    "gated_rms_norm",
    [Param("x", V), Param("gate", V), Param("weight", W), Param("eps", D), Param("heads", D)],
    1,
    lambda s, a, w: [s[0]],
)
# Mixture-of-Experts MLP: fp32 softmax router, top_k experts (renormalised when `normalize`), stacked weights
_op(
    "moe",
    [
        Param("x", V),
        Param("router", W),
        Param("gate", W),
        Param("up", W),
        Param("down", W),
        Param("top_k", D),
        Param("normalize", D),
        Param("act", L, "silu"),
    ],
    1,
    lambda s, a, w: [s[0]],
)


def _gated_delta_state(attrs, shapes, node):
    """Gated DeltaNet's per-request state: the causal conv's last kernel - 1 inputs over the q/k/v channels,
    and the delta rule's matrix per value head (fp32)."""
    name = lambda key: attrs[key].name  # DimRef
    channels = shapes[node.inputs[0]][-1]
    return "recurrent", (
        ("conv", (f"{name('kernel')} - 1", channels), "float32"),
        ("delta", (name("hv"), name("dk"), name("dv")), "float32"),
    )


# Gated DeltaNet's mixer after its input projections: causal depthwise conv1d over qkv [N, 2 hk dk + hv dv]
# with SiLU and a carried window, q/k L2-normalised, beta = sigmoid(b), g = a_neg softplus(a + dt_bias),
# the gated delta rule per value head -> [N, hv * dv]. State: one slot per request (`recurrent`).
_op(
    "gated_delta",
    [
        Param("qkv", V),
        Param("b", V),
        Param("a", V),
        Param("conv", W),
        Param("a_neg", W),
        Param("dt_bias", W),
        Param("hk", D),
        Param("hv", D),
        Param("dk", D),
        Param("dv", D),
        Param("kernel", D),
    ],
    1,
    lambda s, a, w: [(s[0][0], f"{a['hv']} * {a['dv']}")],
    stateful=True,
    slot_state=_gated_delta_state,
    state_arrays=("conv_state", "delta_state"),
)

# Introduced by passes.
_op(
    "add_rms_norm",
    [Param("x", V), Param("y", V), Param("weight", W), Param("eps", D)],
    2,
    lambda s, a, w: [s[0], s[0]],
    spec_level=False,
)
_op(
    "linear_split",
    [Param("x", V), Param("weight", W), Param("bias", L, False), Param("sizes", L)],
    -1,
    lambda s, a, w: [(*s[0][:-1], str(size.text)) for size in a["sizes"]],
    spec_level=False,
)
_op(
    "gated_act_packed",
    [Param("gate_up", V), Param("act", L)],
    1,
    lambda s, a, w: [(*s[0][:-1], _half(s[0][-1]))],
    spec_level=False,
)
_op(
    "rms_norm_to_proj",
    [Param("x", V), Param("weight", W), Param("reader", W), Param("eps", D)],
    1,
    lambda s, a, w: [s[0]],
    spec_level=False,
)
_op(
    "add_rms_norm_to_proj",
    [Param("x", V), Param("y", V), Param("weight", W), Param("reader", W), Param("eps", D)],
    2,
    lambda s, a, w: [s[0], s[0]],
    spec_level=False,
)
_op(
    "gated_linear",
    [Param("gate_up", V), Param("weight", W), Param("act", L), Param("partials", L, False)],
    1,
    lambda s, a, w: [(*s[0][:-1], _weight_rows(w, "weight"))],
    spec_level=False,
)
_op(
    "gated_mlp",
    [Param("x", V), Param("gate_up", W), Param("down", W), Param("act", L), Param("partials", L, False)],
    1,
    lambda s, a, w: [(*s[0][:-1], _weight_rows(w, "down"))],
    spec_level=False,
)
_op(
    "rope_apply",
    [Param("q", V), Param("k", V), Param("positions", V), Param("inv_freq", V), Param("style", L)],
    2,
    lambda s, a, w: [s[0], s[1]],
    spec_level=False,
)
_op(
    "rope_attention",
    [
        Param("q", V),
        Param("k", V),
        Param("v", V),
        Param("positions", V),
        Param("inv_freq", V),
        Param("window", V),
        Param("state", V),
        Param("style", L),
        Param("scale", D),
    ],
    1,
    lambda s, a, w: [(s[0][0], f"{_paren(s[0][1])} * {_paren(s[0][2])}")],
    stateful=True,
    spec_level=False,
)
_op(
    "rope_attention_to_proj",
    [
        Param("q", V),
        Param("k", V),
        Param("v", V),
        Param("positions", V),
        Param("inv_freq", V),
        Param("window", V),
        Param("state", V),
        Param("reader", W),
        Param("style", L),
        Param("scale", D),
    ],
    1,
    lambda s, a, w: [(s[0][0], f"{_paren(s[0][1])} * {_paren(s[0][2])}")],
    stateful=True,
    spec_level=False,
)
_op("select_rows", [Param("x", V), Param("rows", V)], 1, lambda s, a, w: [("R", *s[0][1:])], spec_level=False)
